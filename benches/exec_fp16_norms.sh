#!/usr/bin/env bash
# The fp16 question, answered with numbers (issue 4, item 5): for each real model, fp16 bundles
# with every --norm form and an fp32 bundle, each gated in the executor's fp16 and fp32 modes
# against the fp32 reference; one JSON report, one per-layer cosine plot and one markdown table
# per model.
#
# Usage: benches/exec_fp16_norms.sh [OUT_DIR]   (default target/fp16-norms; ANEMONE_MODELS overrides
#        where the models are; STEPS=16 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
models=${ANEMONE_MODELS:-$PWD/models}
out=${1:-target/fp16-norms}
steps=${STEPS:-16}
mkdir -p "$out"
cargo build --release -q -p anemone
bin=target/release/anemone

for entry in smollm2:smollm2-135m-instruct.Q4_1.gguf qwen2.5-coder:qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf; do
  name=${entry%%:*}
  gguf=$models/${entry#*:}
  [ -f "$gguf" ] || { echo "$gguf is missing: run scripts/fetch-models.sh" >&2; exit 1; }
  bundles=()
  for norm in naive layernorm-trick max-scaled; do
    b=$out/$name-fp16-$norm
    "$bin" convert "$gguf" --out "$b" --precision fp16 --norm "$norm" --context 256 --force >&2
    bundles+=("$b")
  done
  b=$out/$name-fp32
  "$bin" convert "$gguf" --out "$b" --precision fp32 --context 256 --force >&2
  bundles+=("$b")
  status=0
  "$bin" gate "${bundles[@]}" --reference "$gguf" --steps "$steps" --precision fp16,fp32 \
    --json --plot "$out/$name-cosine-vs-depth.svg" > "$out/$name-gate.json" || status=$?
  echo "$name: gate exit status $status (1 = some variant failed a threshold)" >&2
  python3 - "$out/$name-gate.json" > "$out/$name-table.md" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
print("| bundle | executor | top-1 (margin ≥ 0.5) | near-tie flips | logits cos min | logits cos mean | KL max | max abs err | chunk cos min (at layer) | max abs act | gate |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in report["reports"]:
    s = r["summary"]
    worst = min(r["chunks"], key=lambda c: c["min_cosine"])
    bundle = f"{r['bundle_precision']}, {r['norm']}" if r["bundle_precision"] == "fp16" else "fp32"
    print(f"| {bundle} | {r['backend'].removeprefix('executor-')} | {s['top1_agreement']:.3f} ({s['counted_steps']} steps) "
          f"| {s['near_tie_disagreements']}/{s['near_tie_steps']} | {s['min_cosine']:.6f} | {s['mean_cosine']:.6f} "
          f"| {s['max_kl']:.2e} | {s['max_abs_error']:.3f} | {worst['min_cosine']:.6f} ({worst['first_layer'] + worst['layer_count'] - 1}) "
          f"| {s['max_abs_activation']:.0f} | {'pass' if r['passed'] else 'FAIL'} |")
PY
  cat "$out/$name-table.md"
done
