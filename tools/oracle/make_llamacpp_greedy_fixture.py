#!/usr/bin/env python3
"""llama.cpp's greedy continuations of a real GGUF (llama-cpp-python), step by step with the
top logits of each step, for anemone's real-model test against GGUF's reference implementation.

    python tools/oracle/make_llamacpp_greedy_fixture.py models/gemma-3-270m-q4_k_m.gguf \
        tests/fixtures/real/gemma3-270m.llamacpp.json

Prompts are tokenized by llama.cpp (BOS added); every step feeds one token and records the
top 8 (id, logit) pairs, so a test can compare ids where the top-1/top-2 margin is wide enough
for two implementations' rounding to agree.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]
STEPS = 16
TOP = 8


def main() -> None:
    model, out = Path(sys.argv[1]), Path(sys.argv[2])
    llm = Llama(model_path=str(model), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    cases = []
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        steps = []
        for _ in range(STEPS):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            top = np.argsort(-logits)[:TOP]
            steps.append({"top": [[int(i), float(logits[i])] for i in top]})
            llm.eval([int(top[0])])
        cases.append({
            "prompt": prompt,
            "prompt_ids": ids,
            "greedy_ids": [s["top"][0][0] for s in steps],
            "steps": steps,
        })
        print(prompt, "->", repr(llm.detokenize([s["top"][0][0] for s in steps]).decode(errors="replace")))
    out.write_text(json.dumps({
        "model": model.name,
        "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
        "llama_cpp_python": llama_cpp.__version__,
        "cases": cases,
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
