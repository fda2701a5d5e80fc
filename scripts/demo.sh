#!/usr/bin/env bash
# The main job on a real model, from a fresh machine: fetch SmolLM2-135M-Instruct, build anemone,
# convert the model to an ANE bundle, gate the bundle against the fp32 reference, and generate
# text from the bundle (run by anemone's MIL executor in fp16, as the ANE computes; on a Mac the
# same bundle is what Core ML loads).
#
# Usage: scripts/demo.sh [OUT_DIR]   (default: out/)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-out}"
scripts/fetch-models.sh models --only smollm2
cargo build --release --bin anemone
anemone=target/release/anemone
model=models/smollm2-135m-instruct.Q4_1.gguf
bundle="$out/smollm2.bundle"
mkdir -p "$out"

echo "== convert $model -> $bundle"
"$anemone" convert "$model" --out "$bundle" --force
echo "== inspect (lint + hashes; full report in $out/inspect.txt)"
"$anemone" inspect "$bundle" --strict > "$out/inspect.txt"
head -n 20 "$out/inspect.txt"
echo "== gate: bundle (fp16 executor) vs fp32 reference"
"$anemone" gate "$bundle" --reference "$model" --plot "$out/smollm2-gate.svg"
echo "== generate from the bundle"
"$anemone" generate "$bundle" --prompt "The capital of France is" --max-tokens 16 --temperature 0
echo
"$anemone" generate "$bundle" --chat --prompt "Name three colors of the rainbow." --max-tokens 40 --temperature 0
echo
