#!/usr/bin/env python3
"""A Phi-3 GGUF written by llama.cpp's own converter from the random-init `phi3_longrope` oracle
checkpoint (fused qkv / gate-up, partial rotary 0.75, LongRoPE factor tensors), and llama.cpp's
logits on the checkpoint's oracle prompt, for anemone's GGUF import test.

Two steps, two Pythons (llama.cpp's converter lives in the llama-cpp-python source
distribution: `pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36`, unpack,
`vendor/llama.cpp`):

    # 1. convert (torch, sentencepiece, numpy; e.g. the transformers venv)
    python tools/oracle/make_phi3_gguf_fixture.py convert LLAMA_CPP_DIR
    # 2. llama.cpp's logits (llama-cpp-python)
    python tools/oracle/make_phi3_gguf_fixture.py logits

Writes tests/fixtures/gguf/phi3_longrope.gguf (f32) and phi3_longrope.llamacpp.json. The
checkpoint has no tokenizer; a 299-piece SentencePiece model (plus `<|endoftext|>`) is trained on a fixed text so the
converter (which requires `tokenizer.model`) has one. Its ids are not used: the test feeds the
oracle's prompt ids.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "fixtures" / "oracle" / "phi3_longrope"
OUT = REPO / "tests" / "fixtures" / "gguf"
GGUF = OUT / "phi3_longrope.gguf"
LOGITS = OUT / "phi3_longrope.llamacpp.json"
TEXT = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.\n"
) * 40


def convert(llama_cpp: Path) -> None:
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "phi3"
        shutil.copytree(SOURCE, model)
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text(TEXT)
        vocab = json.loads((SOURCE / "config.json").read_text())["vocab_size"]
        # the last id is Phi-3's `<|endoftext|>` (llama.cpp requires it in a model named Phi3)
        (model / "added_tokens.json").write_text(json.dumps({"<|endoftext|>": vocab - 1}))
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(model / "tokenizer"), vocab_size=vocab - 1,
            model_type="bpe", byte_fallback=True, character_coverage=1.0,
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        )
        OUT.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(model),
             "--outtype", "f32", "--outfile", str(GGUF)],
            check=True,
        )
    print(f"wrote {GGUF} ({GGUF.stat().st_size} bytes)")


def logits() -> None:
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    oracle = json.loads((SOURCE / "oracle.json").read_text())
    ids = oracle["prompt_ids"] + oracle["greedy_ids"]
    # n_ctx 256 > original_max_position_embeddings 4: llama.cpp uses the long factors, as
    # transformers does for sequences past 4 tokens
    # f32 K/V cache (type 0): llama.cpp's default fp16 cache moves these logits by 2e-2
    llm = Llama(model_path=str(GGUF), n_ctx=256, n_threads=1, logits_all=True, verbose=False,
                type_k=0, type_v=0)
    llm.eval(ids)
    rows = [np.array(llm.scores[i], dtype=np.float64).tolist() for i in range(len(ids))]
    LOGITS.write_text(json.dumps({
        "model": GGUF.name,
        "model_sha256": hashlib.sha256(GGUF.read_bytes()).hexdigest(),
        "llama_cpp_python": llama_cpp.__version__,
        "kv_cache": "f32",
        "ids": ids,
        "logits": rows,
    }) + "\n")
    print(f"wrote {LOGITS}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["convert"]:
        convert(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["logits"]:
        logits()
    else:
        raise SystemExit(__doc__)
