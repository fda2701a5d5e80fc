#!/usr/bin/env python3
"""Oracle fixture `gemma3_multimodal`: a tiny random-init `Gemma3ForConditionalGeneration`
(`model_type` gemma3: `text_config`, a 1-layer SigLIP vision tower, the projector) whose language
model is the `gemma3_sliding_gqa2` fixture's, saved by transformers (tensors under
`model.language_model.*`). anemone converts its text decoder; the vision tower is not read.

The conditional model's text-only logits on the text fixture's prompt and continuation are
checked equal to that fixture's (same weights, same computation), and its oracle files are
copied, so every oracle test runs the multimodal layout against transformers' numbers.

    python tools/oracle/make_gemma_multimodal_fixture.py    # -> tests/fixtures/oracle/
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

import make_fixtures as base
import make_gemma_fixtures as gemma

TEXT = "gemma3_sliding_gqa2"
NAME = "gemma3_multimodal"


def main() -> None:
    torch.set_num_threads(1)
    spec = next(s for s in gemma.SPECS if s["name"] == TEXT)
    text = gemma.build(spec)
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                num_attention_heads=2, image_size=28, patch_size=14)
    config = Gemma3Config(text_config=text.config.to_dict(), vision_config=vision.to_dict(),
                          mm_tokens_per_image=4, boi_token_index=297, eoi_token_index=298,
                          image_token_index=299, attn_implementation="eager",
                          dtype=torch.float32)
    model = Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
    model.model.language_model.load_state_dict(text.model.state_dict())
    if not spec["tied"]:
        model.lm_head.weight.data.copy_(text.lm_head.weight.data)

    src = base.DEFAULT_OUT / TEXT
    oracle = json.loads((src / "oracle.json").read_text())
    ids = torch.tensor([oracle["prompt_ids"] + oracle["greedy_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0].numpy()
    want = np.load(src / "logits.npy")
    p = len(oracle["prompt_ids"])
    got = logits[p - 1:p - 1 + len(oracle["greedy_ids"])]
    diff = float(np.abs(got - want).max())
    assert diff < 1e-5, f"the conditional model's text logits differ from {TEXT}'s by {diff}"

    out = base.DEFAULT_OUT / NAME
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    for f in ["oracle.json", "logits.npy", "hidden_states.npy", "generation_config.json"]:
        if (src / f).exists():
            shutil.copy(src / f, out / f)
    print(f"wrote {out} (text logits equal {TEXT}'s within {diff:.1e})")


if __name__ == "__main__":
    main()
