#!/usr/bin/env python3
"""Greedy transformers outputs on the real GGUF models, for anemone's real-weight tests.

Loads each GGUF with transformers' own GGUF loader (dequantized to float32), encodes each prompt
with transformers' tokenizer exactly as `generate` would see it (`tokenizer(text).input_ids`),
runs greedy decoding for 16 tokens and writes

    tests/fixtures/real/<model>.json          4 prompts (used by the tests)
    tests/fixtures/real/<model>.holdout.json  3 further prompts (kept for a later gate)

Usage (run by hand; CI never runs this):
    python tools/oracle/make_real_fixtures.py [--models-dir models] [--only smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
NEW_TOKENS = 16
TOP_K = 5
# Prompts were chosen so that no greedy step has a top-1/top-2 margin below ~0.05 where that was
# easy to find (margins are recorded per step; see README).

MODELS = {
    "smollm2-135m-instruct": {
        "gguf": "smollm2-135m-instruct.Q4_1.gguf",
        "prompts": [
            "The capital of France is",
            "Once upon a time",
            "Here is a recipe for pancakes:",
            "Water boils at a temperature of",
        ],
        "holdout": [
            "The largest planet in our solar system is",
            "The sun rises in the",
            "In 1969, the first humans",
        ],
    },
    "qwen2.5-coder-0.5b-instruct": {
        "gguf": "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf",
        "prompts": [
            "The capital of France is",
            "def fibonacci(n):",
            "# Read a CSV file with pandas and print the first rows\nimport pandas as pd\n",
            "A linked list is a data structure that",
        ],
        "holdout": [
            "def is_prime(n: int) -> bool:",
            "fn main() {\n    let v = vec![1, 2, 3];\n",
            "The quick brown fox",
        ],
    },
}


@torch.no_grad()
def run_prompt(model, tokenizer, text: str) -> dict:
    encoded = tokenizer(text, return_tensors="pt")
    prompt = encoded.input_ids
    start = time.perf_counter()
    out = model.generate(
        prompt,
        attention_mask=encoded.attention_mask,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
    )
    seconds = time.perf_counter() - start
    prompt_ids = prompt[0].tolist()
    greedy_ids = out.sequences[0, len(prompt_ids):].tolist()
    steps = []
    for step, logits in enumerate(out.logits):
        row = logits[0].float()
        values, ids = torch.topk(row, TOP_K)
        assert int(ids[0]) == greedy_ids[step], "top-1 is not the greedy token"
        steps.append({
            "top_ids": ids.tolist(),
            "top_logits": [round(float(v), 5) for v in values],
            "margin": round(float(values[0] - values[1]), 5),
        })
    return {
        "prompt": text,
        "prompt_ids": prompt_ids,
        "greedy_ids": greedy_ids,
        "text": tokenizer.decode(greedy_ids),
        "stopped_at_eos": len(greedy_ids) < NEW_TOKENS,
        "steps": steps,
        "seconds": round(seconds, 2),
    }


def write(path: Path, header: dict, prompts: list[dict]) -> None:
    path.write_text(json.dumps({**header, "prompts": prompts}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path.relative_to(REPO)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--models-dir", type=Path, default=REPO / "models")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "real")
    parser.add_argument("--only", choices=sorted(MODELS), action="append")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    for name in args.only or MODELS:
        spec = MODELS[name]
        start = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(args.models_dir, gguf_file=spec["gguf"])
        model = AutoModelForCausalLM.from_pretrained(
            args.models_dir, gguf_file=spec["gguf"], dtype=torch.float32
        ).eval()
        load_seconds = time.perf_counter() - start
        probe = tokenizer("Hi").input_ids
        header = {
            "model": name,
            "gguf": spec["gguf"],
            "transformers": transformers.__version__,
            "torch": torch.__version__.split("+")[0],
            "dtype": "float32 (GGUF dequantized by transformers)",
            "new_tokens": NEW_TOKENS,
            "prompt_encoding": "tokenizer(text).input_ids, as generate sees it",
            "adds_bos": bool(tokenizer.bos_token_id is not None and probe[0] == tokenizer.bos_token_id),
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "generation_eos_token_id": model.generation_config.eos_token_id,
            "load_seconds": round(load_seconds, 1),
        }
        print(f"{name}: loaded in {load_seconds:.1f}s, adds_bos={header['adds_bos']}")
        for key, suffix in [("prompts", ""), ("holdout", ".holdout")]:
            results = []
            for text in spec[key]:
                result = run_prompt(model, tokenizer, text)
                print(f"  {result['seconds']:6.2f}s {text!r} -> {result['text']!r} "
                      f"(min margin {min(s['margin'] for s in result['steps']):.3f})")
                results.append(result)
            write(args.out / f"{name}{suffix}.json", header, results)


if __name__ == "__main__":
    main()
