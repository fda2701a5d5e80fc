#!/usr/bin/env bash
# Benchmark (not a test): anemone's executor and fp32 reference against llama.cpp at equal
# precision (F16 / F32 GGUFs dequantized from the same quantized files), interleaved, best of N.
# Builds the GGUFs and bundles itself in a temporary directory and removes it afterwards.
#
# Usage: PYTHON=/path/to/venv/bin/python benches/exec_vs_llamacpp.sh [--repeats N] [--only NAME] [--quantized] [--json]
#   --quantized: also llama.cpp Q8_0 / Q4_0 against anemone int8 / int4 bundles (blocks of 32).
#   PYTHON: a Python with llama-cpp-python and gguf; ANEMONE_MODELS: where the GGUFs are
#   (default models/); TMPDIR: where the ~8 GB of temporary GGUFs and bundles go.
set -euo pipefail
cd "$(dirname "$0")/.."
models=${ANEMONE_MODELS:-$PWD/models}
python=${PYTHON:-python3}
cargo build --release -q -p anemone
work=$(mktemp -d "${TMPDIR:-/tmp}/exec-vs-llamacpp.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$python" benches/exec_vs_llamacpp.py --binary target/release/anemone --models "$models" \
  --workdir "$work" "$@"
