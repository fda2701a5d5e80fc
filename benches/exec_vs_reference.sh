#!/usr/bin/env bash
# Benchmark (not a test): the MIL executor running converted bundles (fp32 bundle in fp32 mode,
# fp16 bundle in fp16 mode) against the fp32 reference forward and PyTorch, on the same machine
# in the same run: 64-token prompt, 32 teacher-forced greedy tokens, 2 threads, release build.
#
# Usage: PYTHON=/path/to/venv/bin/python benches/exec_vs_reference.sh [--repeats N] [--json]
#   PYTHON: a Python with torch + transformers + gguf (tools/oracle/requirements.txt);
#   ANEMONE_MODELS: where the models are (default models/); OUT: bundle dir (default
#   target/exec-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
models=${ANEMONE_MODELS:-$PWD/models}
out=${OUT:-target/exec-bench}
python=${PYTHON:-python3}
cargo build --release -q -p anemone
bin=target/release/anemone
mkdir -p "$out"
for entry in smollm2:smollm2-135m-instruct.Q4_1.gguf qwen2.5:qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf; do
  name=${entry%%:*}
  gguf=$models/${entry#*:}
  [ -f "$gguf" ] || { echo "$gguf is missing: run scripts/fetch-models.sh" >&2; exit 1; }
  for precision in fp16 fp32; do
    if [ ! -f "$out/$name-$precision/anemone.json" ]; then
      "$bin" convert "$gguf" --out "$out/$name-$precision" --precision "$precision" --force >&2
    fi
  done
done
exec "$python" benches/exec_vs_reference.py --binary "$bin" --models "$models" --bundles "$out" "$@"
