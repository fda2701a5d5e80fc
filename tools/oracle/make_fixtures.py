#!/usr/bin/env python3
"""Oracle fixtures from Hugging Face transformers for anemone's fp32 reference forward.

Builds tiny random-init Llama / Qwen2 / Qwen3 checkpoints with transformers, runs a fixed prompt
through them in float32 with eager attention, and writes per checkpoint:

    <out>/<name>/config.json, generation_config.json, model.safetensors   (save_pretrained, f32)
    <out>/<name>/oracle.json        {"prompt_ids", "greedy_ids", "transformers", "torch", ...}
    <out>/<name>/logits.npy         f32 [steps, vocab]; row i = logits that chose greedy_ids[i]
    <out>/<name>/hidden_states.npy  f32 [num_layers + 1, prompt_len, hidden]; entry 0 = embeddings,
                                    entry i = raw residual stream after decoder layer i-1 (no final
                                    norm, unlike transformers' output_hidden_states[-1])

Usage (run by hand; CI never runs this, the outputs are committed):
    python tools/oracle/make_fixtures.py                      # -> tests/fixtures/oracle/
    python tools/oracle/make_fixtures.py --holdout /tmp/holdout   # unseen seeds and shapes
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "oracle"
PROMPT_LEN = 7
NEW_TOKENS = 8
# A greedy step whose top-1/top-2 logit gap is below this could flip under 1e-4-level float
# differences between implementations; such prompts are rejected and another one is drawn.
MIN_MARGIN = 0.05
MIN_DISTINCT = 5

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "phi3": (Phi3Config, Phi3ForCausalLM),
}


@dataclass
class Spec:
    name: str
    arch: str
    seed: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    rope_theta: float
    tied: bool
    head_dim: int | None = None  # None: hidden // heads
    rms_eps: float = 1e-6
    # Further config fields (`attention_bias`: Llama/Qwen3 biases on q/k/v and o_proj).
    extra: dict = field(default_factory=dict)
    eos: int | list[int] | None = None  # written to generation_config.json
    # save_pretrained's max_shard_size: set, the checkpoint is written as several shards plus
    # model.safetensors.index.json (exercises the sharded import on transformers' own output).
    max_shard_size: str | None = None


# The committed set: at least two per architecture, covering MHA, 2:1, 3:1 and 4:1 GQA, explicit
# Qwen3 head_dim != hidden / heads, several rope thetas, tied and untied embeddings, 2-3 layers.
COMMITTED = [
    Spec("qwen3_gqa2_headdim24", "qwen3", 101, hidden=64, intermediate=96, layers=2, heads=4,
         kv_heads=2, head_dim=24, vocab=320, rope_theta=1_000_000.0, tied=False, eos=[2, 319]),
    Spec("qwen3_mha_tied", "qwen3", 102, hidden=48, intermediate=96, layers=3, heads=3,
         kv_heads=3, head_dim=16, vocab=320, rope_theta=10_000.0, tied=True, eos=2),
    Spec("qwen3_gqa4", "qwen3", 103, hidden=64, intermediate=80, layers=2, heads=8,
         kv_heads=2, head_dim=12, vocab=360, rope_theta=50_000.0, tied=False, eos=2),
    Spec("llama_gqa4", "llama", 201, hidden=64, intermediate=96, layers=2, heads=8, kv_heads=2,
         vocab=340, rope_theta=10_000.0, tied=False, rms_eps=1e-5, eos=2),
    Spec("llama_mha_tied", "llama", 202, hidden=32, intermediate=64, layers=3, heads=4,
         kv_heads=4, vocab=520, rope_theta=500_000.0, tied=True, rms_eps=1e-5, eos=[2, 519],
         max_shard_size="80KB"),
    Spec("qwen2_gqa3_tied", "qwen2", 301, hidden=96, intermediate=96, layers=2, heads=6,
         kv_heads=2, vocab=320, rope_theta=1_000_000.0, tied=True, eos=[2, 319]),
    Spec("qwen2_mha", "qwen2", 302, hidden=48, intermediate=96, layers=3, heads=4, kv_heads=4,
         vocab=400, rope_theta=10_000.0, tied=False, eos=2),
    # attention_bias: true (q/k/v and o_proj biases) on the families that read the field
    Spec("llama_attn_bias", "llama", 203, hidden=48, intermediate=64, layers=2, heads=6,
         kv_heads=2, vocab=300, rope_theta=10_000.0, tied=False, rms_eps=1e-5, eos=2,
         extra={"attention_bias": True}),
    Spec("qwen3_attn_bias", "qwen3", 104, hidden=32, intermediate=64, layers=2, heads=4,
         kv_heads=2, head_dim=16, vocab=300, rope_theta=1_000_000.0, tied=True, eos=2,
         extra={"attention_bias": True}),
    # Phi-3: fused qkv_proj / gate_up_proj; partial rotation; LongRoPE with the long factors in
    # use (original_max_position_embeddings 4 < every sequence) and attention factor
    # sqrt(1 + ln(256/4) / ln 4) = 2
    Spec("phi3_partial_rotary", "phi3", 401, hidden=64, intermediate=96, layers=2, heads=4,
         kv_heads=2, vocab=320, rope_theta=10_000.0, tied=False, rms_eps=1e-5, eos=2,
         extra={"partial_rotary_factor": 0.5, "pad_token_id": 0}),
    Spec("phi3_longrope", "phi3", 402, hidden=64, intermediate=80, layers=2, heads=4,
         kv_heads=4, vocab=300, rope_theta=10_000.0, tied=False, rms_eps=1e-5, eos=2,
         extra={"partial_rotary_factor": 0.75, "original_max_position_embeddings": 4,
                "pad_token_id": 0,
                "rope_scaling": {"type": "longrope",
                                 "short_factor": [1.0, 1.1, 1.3, 1.2, 1.6, 2.0],
                                 "long_factor": [1.5, 2.5, 4.0, 7.0, 9.0, 12.0]}}),
    # Phi-3's sliding_window on every layer, 3 < the 7-token prompt: each position sees itself
    # and the 2 before it
    Spec("phi3_sliding_window", "phi3", 403, hidden=48, intermediate=64, layers=2, heads=4,
         kv_heads=2, vocab=300, rope_theta=10_000.0, tied=False, rms_eps=1e-5, eos=2,
         extra={"sliding_window": 3, "pad_token_id": 0}),
]


def holdout_specs(seed: int) -> list[Spec]:
    """A different seed/shape mix: two per architecture, drawn from `seed`."""
    rng = random.Random(seed)
    specs = []
    for arch in ["llama", "qwen2", "qwen3"] * 2:
        heads = rng.choice([2, 4, 6, 8])
        kv_heads = rng.choice([d for d in [1, 2, heads // 2, heads] if d >= 1 and heads % d == 0])
        head_dim = rng.choice([8, 12, 16])
        hidden = head_dim * heads
        explicit_head_dim = None
        if arch == "qwen3" and rng.random() < 0.7:
            explicit_head_dim = rng.choice([d for d in [8, 12, 20, 24] if d != head_dim])
        if not 32 <= hidden <= 96:
            hidden = rng.choice([32, 48, 64, 96])
            hidden -= hidden % heads
        spec = Spec(
            name=f"holdout_{arch}_{len(specs)}",
            arch=arch,
            seed=seed * 1000 + len(specs),
            hidden=hidden,
            intermediate=rng.choice([2, 3]) * hidden + rng.choice([0, 16]),
            layers=rng.choice([2, 3]),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=explicit_head_dim,
            vocab=rng.randrange(300, 601),
            rope_theta=rng.choice([10_000.0, 100_000.0, 1_000_000.0, 500_000.0]),
            tied=rng.random() < 0.5,
            rms_eps=rng.choice([1e-6, 1e-5]),
            eos=2,
        )
        specs.append(spec)
    return specs


def build_config(spec: Spec):
    config_cls, _ = ARCHS[spec.arch]
    kwargs = dict(
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        vocab_size=spec.vocab,
        rope_theta=spec.rope_theta,
        rms_norm_eps=spec.rms_eps,
        tie_word_embeddings=spec.tied,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=spec.eos if isinstance(spec.eos, int) else (spec.eos or [None])[0],
        attn_implementation="eager",
        dtype=torch.float32,
    )
    # Qwen3Config defaults head_dim to 128, not hidden / heads: always pass it explicitly.
    kwargs["head_dim"] = spec.head_dim or spec.hidden // spec.heads
    kwargs.update(spec.extra)
    return config_cls(**kwargs)


@torch.no_grad()
def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Larger-than-default init so logits are well separated: linear weights N(0, 0.2),
    embeddings N(0, 0.5), biases N(0, 0.2), RMSNorm weights 1 + U(-0.1, 0.1)."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("norm.weight"):
            param.copy_(1.0 + (torch.rand(param.shape, generator=gen) * 0.2 - 0.1))
        elif "embed_tokens" in name:
            param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
        elif name.endswith(".bias"):
            param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        elif name.endswith(".weight"):
            param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        else:
            raise ValueError(f"unexpected parameter {name}")


@torch.no_grad()
def residual_stream(model, prompt: torch.Tensor) -> np.ndarray:
    """[num_layers + 1, prompt_len, hidden]: embeddings, then each decoder layer's raw output."""
    captured: list[torch.Tensor] = []

    def hook(_module, _inputs, output):
        captured.append((output[0] if isinstance(output, tuple) else output).detach().clone())

    handles = [layer.register_forward_hook(hook) for layer in model.model.layers]
    try:
        out = model(prompt, output_hidden_states=True, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    embeds = model.model.embed_tokens(prompt)
    stack = torch.stack([embeds[0]] + [h[0] for h in captured]).float().numpy()
    # Cross-check against transformers' own hidden states (all but the last, which is normed).
    reference = out.hidden_states
    assert len(reference) == len(captured) + 1
    for i in range(len(captured)):
        np.testing.assert_allclose(stack[i], reference[i][0].numpy(), rtol=0, atol=1e-5)
    normed = model.model.norm(captured[-1])[0].numpy()
    np.testing.assert_allclose(normed, reference[-1][0].numpy(), rtol=0, atol=1e-5)
    return stack


@torch.no_grad()
def greedy(model, prompt: torch.Tensor) -> tuple[list[int], np.ndarray]:
    """Greedy NEW_TOKENS tokens with transformers' generate (KV cache), EOS disabled."""
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    ids = out.sequences[0, prompt.shape[1]:].tolist()
    logits = torch.stack([step[0] for step in out.logits]).float().numpy()
    assert logits.shape == (NEW_TOKENS, model.config.vocab_size), logits.shape
    assert [int(row.argmax()) for row in logits] == ids, "logits rows do not choose greedy ids"
    # Independent check without the cache: full recompute of every prefix.
    seq = prompt
    for step, token in enumerate(ids):
        full = model(seq, use_cache=False).logits[0, -1].float().numpy()
        np.testing.assert_allclose(full, logits[step], rtol=0, atol=1e-4)
        seq = torch.cat([seq, torch.tensor([[token]])], dim=1)
    return ids, logits


def min_margin(logits: np.ndarray) -> float:
    top2 = np.sort(logits, axis=1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).min())


def make_one(spec: Spec, out_root: Path) -> dict:
    torch.manual_seed(spec.seed)
    config = build_config(spec)
    _, model_cls = ARCHS[spec.arch]
    model = model_cls(config).to(torch.float32).eval()
    init_weights(model, spec.seed)
    if spec.tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    eos_ids = set([spec.eos] if isinstance(spec.eos, int) else (spec.eos or []))
    rng = random.Random(spec.seed)
    for attempt in range(200):
        # Ids 0..3 are left to specials (bos=1, eos=2) so prompts look like ordinary text ids.
        prompt_ids = [rng.randrange(4, spec.vocab) for _ in range(PROMPT_LEN)]
        prompt = torch.tensor([prompt_ids])
        ids, logits = greedy(model, prompt)
        margin = min_margin(logits)
        # Require a varied continuation: a model that repeats one token tests little of the cache.
        if margin >= MIN_MARGIN and not eos_ids.intersection(ids) and len(set(ids)) >= MIN_DISTINCT:
            break
    else:
        raise RuntimeError(f"{spec.name}: no prompt with margin >= {MIN_MARGIN} and {MIN_DISTINCT} distinct ids in 200 tries")
    hidden = residual_stream(model, prompt)

    out = out_root / spec.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.generation_config = GenerationConfig(
        bos_token_id=1, eos_token_id=spec.eos, do_sample=False
    )
    if spec.max_shard_size:
        model.save_pretrained(out, safe_serialization=True, max_shard_size=spec.max_shard_size)
        assert (out / "model.safetensors.index.json").is_file(), "expected a sharded save"
    else:
        model.save_pretrained(out, safe_serialization=True)
        assert (out / "model.safetensors").is_file()
    np.save(out / "logits.npy", logits.astype(np.float32))
    np.save(out / "hidden_states.npy", hidden.astype(np.float32))
    oracle = {
        "prompt_ids": prompt_ids,
        "greedy_ids": ids,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "architecture": spec.arch,
        "seed": spec.seed,
        "prompt_attempts": attempt + 1,
        "min_top1_top2_margin": margin,
        "max_abs_logit": float(np.abs(logits).max()),
        "max_abs_hidden": float(np.abs(hidden).max()),
    }
    (out / "oracle.json").write_text(json.dumps(oracle, indent=2) + "\n")
    return oracle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="committed fixtures dir")
    parser.add_argument("--holdout", type=Path, help="write a holdout set (unseen shapes) here instead")
    parser.add_argument("--holdout-seed", type=int, default=7919)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="make only these fixtures")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    if args.holdout is not None:
        specs, out_root = holdout_specs(args.holdout_seed), args.holdout
    else:
        specs, out_root = COMMITTED, args.out
    if args.only:
        unknown = set(args.only) - {s.name for s in specs}
        if unknown:
            raise SystemExit(f"unknown fixture(s): {', '.join(sorted(unknown))}")
        specs = [s for s in specs if s.name in args.only]
    out_root.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        start = time.perf_counter()
        oracle = make_one(spec, out_root)
        print(
            f"{spec.name:28s} {spec.arch:6s} L={spec.layers} H={spec.hidden} heads={spec.heads}/"
            f"{spec.kv_heads} hd={spec.head_dim or spec.hidden // spec.heads} V={spec.vocab} "
            f"tied={spec.tied} margin={oracle['min_top1_top2_margin']:.3f} "
            f"|logit|max={oracle['max_abs_logit']:.1f} ({time.perf_counter() - start:.1f}s)"
        )


if __name__ == "__main__":
    main()
