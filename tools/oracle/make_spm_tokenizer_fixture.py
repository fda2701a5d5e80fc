#!/usr/bin/env python3
"""Expected token ids of Gemma 3's SentencePiece GGUF vocabulary from llama.cpp's own tokenizer
(llama-cpp-python, `vocab_only`), for anemone's SPM GGUF tokenizer test.

    python tools/oracle/make_spm_tokenizer_fixture.py models/gemma-3-270m-q4_k_m.gguf
        -> tests/fixtures/real/gemma3_spm_tokenizer.json

Ids are with the file's BOS (add_bos_token) and with special tokens parsed, which is how anemone
encodes prompts (chat templates write `<start_of_turn>`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import llama_cpp
from llama_cpp import Llama

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "fixtures" / "real" / "gemma3_spm_tokenizer.json"

TEXTS = [
    "Hello world",
    "The capital of France is",
    " leading space",
    "trailing space ",
    "two  spaces, three   spaces,      six",
    "tabs\tand\t\ttabs",
    "new\nline\n\nparagraph\n\n\n",
    "  \n  mixed \t\n whitespace",
    "emoji: 😀🎉👩‍👩‍👧 done",
    "中文测试：你好，世界！",
    "日本語のテキストと한국어",
    "unknown bytes: \U0010fffd\U000e0100 \u0378",
    "Ünïcödé àccents ñ ß",
    "code: fn main() { println!(\"{}\", 1 + 2); }",
    "numbers 1234567890 3.14159 -42",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "",
    "a",
    "▁already▁escaped",
]


def main() -> None:
    model = Path(sys.argv[1])
    llm = Llama(model_path=str(model), vocab_only=True, verbose=False)
    cases = []
    for text in TEXTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        cases.append({"text": text, "ids": ids})
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    out = {
        "model": model.name,
        "model_sha256": sha,
        "llama_cpp_python": llama_cpp.__version__,
        "add_bos": True,
        "special": True,
        "cases": cases,
    }
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases -> {OUT}")


if __name__ == "__main__":
    main()
