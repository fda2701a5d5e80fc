#!/usr/bin/env python3
"""Oracle fixtures for the Gemma 3 family: tiny random-init `Gemma3ForCausalLM` checkpoints
(`model_type` gemma3_text) with interleaved sliding-window and global layers, written in the same
layout as make_fixtures.py (config.json, model.safetensors, oracle.json, logits.npy,
hidden_states.npy) so every oracle test picks them up.

The windows are smaller than prompt + continuation, so the sliding mask is exercised;
`query_pre_attn_scalar` differs from head_dim and the local/global RoPE bases differ, so a mix-up
of either shows in the logits.

Usage (run by hand; the outputs are committed):
    python tools/oracle/make_gemma_fixtures.py            # -> tests/fixtures/oracle/
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

import make_fixtures as base

# Embeddings are multiplied by sqrt(hidden) and each block adds a normed (so O(1)) update: with
# make_fixtures.py's N(0, 0.5) the last token's embedding dominates the residual stream and a
# tied model just repeats it. A smaller draw keeps the blocks in charge.
EMBED_STD = 0.15

SPECS = [
    # name, seed, hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, window,
    # layer_types, query_pre_attn_scalar, tied
    dict(name="gemma3_sliding_gqa2", seed=401, hidden=64, intermediate=96, layers=3, heads=4,
         kv_heads=2, head_dim=16, vocab=300, window=4,
         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
         query_pre_attn_scalar=24, tied=True, eos=1),
    dict(name="gemma3_mqa_untied", seed=402, hidden=48, intermediate=64, layers=4, heads=2,
         kv_heads=1, head_dim=32, vocab=320, window=3,
         layer_types=["sliding_attention", "sliding_attention", "sliding_attention",
                      "full_attention"],
         query_pre_attn_scalar=32, tied=False, eos=[1, 319]),
]


def build(spec: dict) -> Gemma3ForCausalLM:
    config = Gemma3TextConfig(
        hidden_size=spec["hidden"],
        intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        head_dim=spec["head_dim"],
        vocab_size=spec["vocab"],
        sliding_window=spec["window"],
        layer_types=spec["layer_types"],
        query_pre_attn_scalar=spec["query_pre_attn_scalar"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        rms_norm_eps=1e-6,
        tie_word_embeddings=spec["tied"],
        max_position_embeddings=256,
        bos_token_id=2,
        eos_token_id=spec["eos"] if isinstance(spec["eos"], int) else spec["eos"][0],
        pad_token_id=0,
        attn_implementation="eager",
        dtype=torch.float32,
    )
    model = Gemma3ForCausalLM(config).to(torch.float32).eval()
    init_weights(model, spec["seed"])
    return model


@torch.no_grad()
def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Like make_fixtures.init_weights, but Gemma's RMSNorm multiplies by (1 + w): w ~ U(-0.1, 0.1)
    keeps the effective scale near 1 as there."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("feedforward_layernorm.weight") or name.endswith("post_attention_layernorm.weight"):
            # the post-norms set how much each block adds: (1 + w) in 2..3
            param.copy_(1.0 + torch.rand(param.shape, generator=gen))
        elif name.endswith("norm.weight"):
            param.copy_(torch.rand(param.shape, generator=gen) * 0.2 - 0.1)
        elif "embed_tokens" in name:
            param.copy_(torch.randn(param.shape, generator=gen) * EMBED_STD)
        elif name.endswith(".weight"):
            param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        else:
            raise ValueError(f"unexpected parameter {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, default=base.DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for spec in SPECS:
        start = time.perf_counter()
        # make_one builds through ARCHS; register a builder for this spec and reuse the rest
        s = base.Spec(spec["name"], "gemma3", spec["seed"], hidden=spec["hidden"],
                      intermediate=spec["intermediate"], layers=spec["layers"], heads=spec["heads"],
                      kv_heads=spec["kv_heads"], vocab=spec["vocab"], rope_theta=1_000_000.0,
                      tied=spec["tied"], head_dim=spec["head_dim"], eos=spec["eos"])
        base.ARCHS["gemma3"] = (None, lambda _config, spec=spec: build(spec))
        base.build_config = lambda _s: None
        base.init_weights = lambda _model, _seed: None
        oracle = base.make_one(s, args.out)
        print(f"{spec['name']:24s} margin={oracle['min_top1_top2_margin']:.3f} "
              f"|logit|max={oracle['max_abs_logit']:.1f} ({time.perf_counter() - start:.1f}s)")


if __name__ == "__main__":
    main()
