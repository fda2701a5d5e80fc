#!/usr/bin/env python3
"""LoRA oracle fixtures: random-init PEFT adapters on the committed oracle checkpoints, merged by
PEFT's `merge_and_unload`, and what transformers computes with the merged model.

Per adapter, under <out>/<name>/:

    adapter_config.json, adapter_model.safetensors   (PEFT save_pretrained of the adapter)
    oracle.json   {"base", "prompt_ids", "greedy_ids", "peft", "transformers", "torch", ...}
    logits.npy    f32 [steps, vocab]; row i = logits (merged model) that chose greedy_ids[i]

The base is tests/fixtures/oracle/<base>/ (made by make_fixtures.py). Usage (by hand; CI never
runs this, the outputs are committed):

    python tools/oracle/make_lora_fixtures.py            # -> tests/fixtures/lora/
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (greedy decoding and margin rules shared with the base fixtures)

REPO = Path(__file__).resolve().parents[2]
BASES = REPO / "tests" / "fixtures" / "oracle"
DEFAULT_OUT = REPO / "tests" / "fixtures" / "lora"


@dataclass
class Spec:
    name: str
    base: str
    seed: int
    r: int
    alpha: float
    target_modules: list[str] | str
    use_rslora: bool = False
    # Written as true after saving: PEFT treats it as false for nn.Linear targets (with a warning).
    fan_in_fan_out: bool = False


COMMITTED = [
    # every projection and the (untied) LM head
    Spec("llama_gqa4_all", "llama_gqa4", 11, r=4, alpha=8.0,
         target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                         "down_proj", "lm_head"]),
    # rank-stabilised scaling, targets as a regular expression, a QK-norm base
    Spec("qwen3_gqa4_rslora_regex", "qwen3_gqa4", 12, r=8, alpha=16.0,
         target_modules=r".*\.(q_proj|v_proj|down_proj)", use_rslora=True),
    # a base with Q/K/V biases, a subset of modules, fan_in_fan_out as written by some trainers
    Spec("qwen2_mha_subset", "qwen2_mha", 13, r=2, alpha=4.0,
         target_modules=["k_proj", "o_proj", "up_proj"], fan_in_fan_out=True),
    # Phi-3's fused projections: one adapter on qkv_proj and on gate_up_proj each
    Spec("phi3_fused", "phi3_partial_rotary", 14, r=4, alpha=8.0,
         target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
]


@torch.no_grad()
def randomize_adapter(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if "lora_" in name:
            param.copy_(torch.randn(param.shape, generator=gen) * 0.2)


def make_one(spec: Spec, out_root: Path) -> dict:
    base_dir = BASES / spec.base
    base_oracle = json.loads((base_dir / "oracle.json").read_text())
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        target_modules=spec.target_modules,
        use_rslora=spec.use_rslora,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    randomize_adapter(peft_model, spec.seed)
    out = out_root / spec.name
    if out.exists():
        shutil.rmtree(out)
    peft_model.save_pretrained(out, safe_serialization=True)
    # the base path PEFT records is this machine's; keep the committed file machine-independent
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    adapter_config["base_model_name_or_path"] = f"tests/fixtures/oracle/{spec.base}"
    if spec.fan_in_fan_out:
        adapter_config["fan_in_fan_out"] = True
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")

    # what the committed files mean to PEFT: load them back onto a fresh base, then merge
    fresh = AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    merged = peft.PeftModel.from_pretrained(fresh, out).merge_and_unload().eval()

    vocab = merged.config.vocab_size
    rng = random.Random(spec.seed)
    candidates = [base_oracle["prompt_ids"]] + [
        [rng.randrange(4, vocab) for _ in range(mf.PROMPT_LEN)] for _ in range(200)
    ]
    for attempt, prompt_ids in enumerate(candidates):
        ids, logits = mf.greedy(merged, torch.tensor([prompt_ids]))
        margin = mf.min_margin(logits)
        if margin >= mf.MIN_MARGIN and len(set(ids)) >= mf.MIN_DISTINCT:
            break
    else:
        raise RuntimeError(f"{spec.name}: no prompt with a clear greedy margin")
    np.save(out / "logits.npy", logits.astype(np.float32))
    # how far the adapter moved the model: the base's logits on the same prompt
    base_model = AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        base_last = base_model(torch.tensor([prompt_ids])).logits[0, -1].numpy()
    oracle = {
        "base": spec.base,
        "prompt_ids": prompt_ids,
        "greedy_ids": ids,
        "peft": peft.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "seed": spec.seed,
        "prompt_attempts": attempt + 1,
        "min_top1_top2_margin": margin,
        "max_abs_logit_change_first_step": float(np.abs(logits[0] - base_last).max()),
    }
    (out / "oracle.json").write_text(json.dumps(oracle, indent=2) + "\n")
    return oracle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in COMMITTED:
        o = make_one(spec, args.out)
        print(
            f"{spec.name:28s} base={spec.base:12s} r={spec.r} alpha={spec.alpha} "
            f"rslora={spec.use_rslora} margin={o['min_top1_top2_margin']:.3f} "
            f"max|Δlogit|={o['max_abs_logit_change_first_step']:.2f}"
        )


if __name__ == "__main__":
    main()
