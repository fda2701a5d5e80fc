#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) on stable Rust through fuzz/src/bin/drive.rs,
# a seeded mutator over fuzz/corpus/TARGET/ that catches panics (inputs saved under
# fuzz/artifacts/). With nightly and cargo-fuzz: `cd fuzz && cargo fuzz run --features libfuzzer gguf`.
# Usage: scripts/fuzz.sh [SECONDS] [SEED] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-60}"
seed="${2:-1}"
shift $(( $# > 2 ? 2 : $# ))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(gguf safetensors mlmodel weight_bin manifest)
fi
cargo build --release --bin drive
driver="${CARGO_TARGET_DIR:-target}/release/drive"
status=0
for t in "${targets[@]}"; do
  "$driver" "$t" "$seconds" "$seed" || status=1
done
exit $status
