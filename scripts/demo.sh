#!/usr/bin/env bash
# The main job on a real model, from a fresh machine: fetch SmolLM2-135M-Instruct, build anemone,
# and generate text with it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-models.sh models --only smollm2
cargo build --release --bin anemone
model=models/smollm2-135m-instruct.Q4_1.gguf
echo "== generate (fp32 reference)"
target/release/anemone generate "$model" --prompt "The capital of France is" --max-tokens 16 --temperature 0
