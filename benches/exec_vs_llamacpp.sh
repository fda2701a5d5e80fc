#!/usr/bin/env bash
# Benchmark (not a test): anemone's executor and fp32 reference against llama.cpp at equal
# precision (F16 / F32 GGUFs dequantized from the same quantized files), interleaved, best of N.
# Builds the GGUFs and bundles itself in a temporary directory and removes it afterwards.
#
# Usage: PYTHON=/path/to/venv/bin/python benches/exec_vs_llamacpp.sh [--repeats N] [--only NAME] [--quantized] [--json]
#   --quantized: also llama.cpp Q8_0 / Q4_0 against anemone int8 / int4 bundles (blocks of 32).
#   PYTHON: a Python with llama-cpp-python and gguf; ANEMONE_MODELS: where the GGUFs are
#   (default models/); TMPDIR: where the ~8 GB of temporary GGUFs and bundles go.
#   On a CPU with AMX (Sapphire Rapids and later), --quantized needs a llama-cpp-python built
#   without ggml's AMX path: with it (a native build on such a CPU), 0.3.36 segfaults in
#   ggml_backend_amx_mul_mat on the first Q8_0 / Q4_0 decode. Build one into its own venv with
#   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
#   -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
#   -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
#   pip install llama-cpp-python==0.3.36 gguf numpy --no-cache-dir (the build measured in the
#   README) and pass that venv's python as PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
models=${ANEMONE_MODELS:-$PWD/models}
python=${PYTHON:-python3}
cargo build --release -q -p anemone
work=$(mktemp -d "${TMPDIR:-/tmp}/exec-vs-llamacpp.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$python" benches/exec_vs_llamacpp.py --binary target/release/anemone --models "$models" \
  --workdir "$work" "$@"
