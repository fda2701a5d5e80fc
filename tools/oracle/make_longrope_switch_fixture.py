#!/usr/bin/env python3
"""Oracle fixture for LongRoPE's per-call factor choice: tests/fixtures/oracle/phi3_longrope_switch.

transformers picks LongRoPE's factors per forward call by `seq_len = max(position_ids) + 1`: the
long ones when it exceeds `original_max_position_embeddings` (here 12), the short ones otherwise;
cached keys keep the rotation they were computed with. In `generate` the prompt is one call and
every decode step another; and Phi-3's `generate` drops its cache at the first call past the
threshold, re-encoding the whole sequence with the long factors (so every step equals a no-cache
recompute of its prefix, checked here). This random-init Phi-3 (partial rotation, LongRoPE) is
written with:

    oracle.json        the standard fields for the main case, a 5-token prompt (short factors)
                       whose 12 greedy tokens cross the threshold (the step at position 12
                       re-encodes positions 0..12 with the long ones), plus `cases`: every case's prompt, greedy ids and
                       logits file, among them `long_prompt`, a 16-token prompt (long factors
                       for all of it) with 4 greedy tokens
    logits.npy         the main case's logits (the standard layout of make_fixtures.py)
    logits_<case>.npy  each further case's logits [steps, vocab]
    hidden_states.npy  the main prompt's residual stream (make_fixtures.py's layout)

Each case's `kept_short_keys_max_abs_diff` records how far a replay that keeps the short-rotated
cached keys past the switch is from `generate`: the re-encoding matters (0 for `long_prompt`).

Usage (run by hand with transformers; CI never runs this, the outputs are committed):
    python tools/oracle/make_longrope_switch_fixture.py
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import ARCHS, DEFAULT_OUT, MIN_DISTINCT, MIN_MARGIN, Spec, build_config, init_weights, min_margin, residual_stream  # noqa: E402

NAME = "phi3_longrope_switch"
ORIGINAL = 12
SPEC = Spec(NAME, "phi3", 404, hidden=32, intermediate=48, layers=2, heads=2, kv_heads=2,
            vocab=300, rope_theta=10_000.0, tied=False, rms_eps=1e-5, eos=2,
            extra={"partial_rotary_factor": 0.75, "original_max_position_embeddings": ORIGINAL,
                   "pad_token_id": 0,
                   "rope_scaling": {"type": "longrope",
                                    "short_factor": [1.0, 1.2, 1.1, 1.5, 1.4, 2.0],
                                    "long_factor": [2.0, 5.0, 9.0, 16.0, 30.0, 60.0]}})
# (name, prompt length, new tokens): below the threshold then crossing it; above it from the start
CASES = [("short_prompt_crossing", 5, 12), ("long_prompt", 16, 4)]


@torch.no_grad()
def generate(model, prompt: torch.Tensor, new_tokens: int) -> tuple[list[int], np.ndarray]:
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    ids = out.sequences[0, prompt.shape[1]:].tolist()
    logits = torch.stack([step[0] for step in out.logits]).float().numpy()
    assert [int(row.argmax()) for row in logits] == ids
    return ids, logits


@torch.no_grad()
def check(model, prompt: torch.Tensor, ids: list[int], logits: np.ndarray) -> float:
    """Every step equals a no-cache recompute of its whole prefix (Phi-3's generate re-encodes
    the sequence at the switch); returns how far a replay that keeps the short-rotated cached
    keys past the switch (one call per step on a DynamicCache) is from generate."""
    seq = prompt
    for step, token in enumerate(ids):
        full = model(seq, use_cache=False).logits[0, -1].float().numpy()
        np.testing.assert_allclose(full, logits[step], rtol=0, atol=1e-4)
        seq = torch.cat([seq, torch.tensor([[token]])], dim=1)
    cache = transformers.DynamicCache(config=model.config)
    out = model(prompt, past_key_values=cache, use_cache=True)
    rows = [out.logits[0, -1]]
    for token in ids[:-1]:
        out = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        rows.append(out.logits[0, -1])
    return float(np.abs(torch.stack(rows).numpy() - logits).max())


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(SPEC.seed)
    config = build_config(SPEC)
    _, model_cls = ARCHS[SPEC.arch]
    model = model_cls(config).to(torch.float32).eval()
    init_weights(model, SPEC.seed)
    rng = random.Random(SPEC.seed)
    cases = []
    for name, prompt_len, new_tokens in CASES:
        for attempt in range(200):
            prompt_ids = [rng.randrange(4, SPEC.vocab) for _ in range(prompt_len)]
            prompt = torch.tensor([prompt_ids])
            ids, logits = generate(model, prompt, new_tokens)
            margin = min_margin(logits)
            if margin >= MIN_MARGIN and 2 not in ids and len(set(ids)) >= min(MIN_DISTINCT, new_tokens):
                break
        else:
            raise RuntimeError(f"{name}: no prompt with margin >= {MIN_MARGIN} in 200 tries")
        kept = check(model, prompt, ids, logits)
        cases.append(dict(name=name, prompt_ids=prompt_ids, greedy_ids=ids, logits=logits,
                          margin=margin, attempts=attempt + 1, kept=kept,
                          prompt=prompt))
        print(f"{name}: prompt {prompt_len}, {new_tokens} new, margin {margin:.3f}, "
              f"keeping short-rotated keys would differ by {kept:.3f}")
    main_case = cases[0]
    assert main_case["kept"] > 1e-2, "the re-encoding should matter for the crossing case"
    hidden = residual_stream(model, main_case["prompt"])

    out = DEFAULT_OUT / NAME
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=SPEC.eos, do_sample=False)
    model.save_pretrained(out, safe_serialization=True)
    np.save(out / "logits.npy", main_case["logits"].astype(np.float32))
    np.save(out / "hidden_states.npy", hidden.astype(np.float32))
    for case in cases[1:]:
        np.save(out / f"logits_{case['name']}.npy", case["logits"].astype(np.float32))
    oracle = {
        "prompt_ids": main_case["prompt_ids"],
        "greedy_ids": main_case["greedy_ids"],
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "architecture": SPEC.arch,
        "seed": SPEC.seed,
        "prompt_attempts": main_case["attempts"],
        "min_top1_top2_margin": main_case["margin"],
        "max_abs_logit": float(np.abs(main_case["logits"]).max()),
        "max_abs_hidden": float(np.abs(hidden).max()),
        "original_max_position_embeddings": ORIGINAL,
        "cases": [
            {
                "name": c["name"],
                "prompt_ids": c["prompt_ids"],
                "greedy_ids": c["greedy_ids"],
                "logits": "logits.npy" if c is main_case else f"logits_{c['name']}.npy",
                "min_top1_top2_margin": c["margin"],
                "kept_short_keys_max_abs_diff": c["kept"],
            }
            for c in cases
        ],
    }
    (out / "oracle.json").write_text(json.dumps(oracle, indent=2) + "\n")


if __name__ == "__main__":
    main()
