#!/usr/bin/env bash
# Encoder latency/throughput: anemone (MIL executor on an fp16 bundle, fp32 reference) vs
# PyTorch sentence-transformers on all-MiniLM-L6-v2, same machine, same run.
#
#   benches/encoder_vs_sentence_transformers.sh [RESULTS_JSON]
#
# Env: ANEMONE_MODELS (default models/), BENCH_PYTHON (a Python with torch and
# sentence-transformers; default python3), PER_BUCKET (20), THROUGHPUT (1000), THREADS (1:
# torch threads; anemone's executor and reference run on one thread per input).
# Builds the release binary, converts the bundle into a temp dir (deleted at exit), records the
# machine load before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=${ANEMONE_MODELS:-models}
MODEL="$MODELS/all-minilm-l6-v2"
PY=${BENCH_PYTHON:-python3}
OUT=${1:-benches/encoder_vs_sentence_transformers.results.json}
[ -d "$MODEL" ] || { echo "missing $MODEL (scripts/fetch-models.sh)" >&2; exit 1; }
cargo build --release -q -p anemone
BIN=${CARGO_TARGET_DIR:-target}/release/anemone
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$BIN" convert "$MODEL" --out "$TMP/minilm.bundle" --lengths 32,128,512 >/dev/null
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
LOAD_BEFORE=$(cut -d' ' -f1 /proc/loadavg)
"$PY" benches/encoder_vs_sentence_transformers.py --anemone "$BIN" --model "$MODEL" \
  --bundle "$TMP/minilm.bundle" --per-bucket "${PER_BUCKET:-20}" \
  --throughput "${THROUGHPUT:-1000}" --threads "${THREADS:-1}" --out "$OUT"
LOAD_AFTER=$(cut -d' ' -f1 /proc/loadavg)
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$OUT" "$LOAD_BEFORE" "$LOAD_AFTER" "$(nproc)" <<'PYEOF'
import json, sys
path, before, after, cores = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
doc = json.load(open(path))
doc["machine"] = {"cores": cores, "load1_before": before, "load1_after": after}
json.dump(doc, open(path, "w"), indent=2)
st = "sentence-transformers"
print(f"\n| bucket | tokens | {st} p50/p95 ms | executor fp16 p50/p95 ms | reference fp32 p50/p95 ms | executor/ST p50 | reference/ST p50 |")
print("|---|---|---|---|---|---|---|")
for r in doc["latency"]:
    s, e, f = r[st], r["executor fp16"], r["reference fp32"]
    print(f"| {r['bucket']} | {r['tokens_min']}–{r['tokens_max']} | {s['p50_ms']:.1f} / {s['p95_ms']:.1f} | "
          f"{e['p50_ms']:.1f} / {e['p95_ms']:.1f} | {f['p50_ms']:.1f} / {f['p95_ms']:.1f} | "
          f"{e['p50_ms']/s['p50_ms']:.2f}× | {f['p50_ms']/s['p50_ms']:.2f}× |")
print("\nload (ms):", {k: round(v) for k, v in doc["load_ms"].items()})
print("throughput (sentences/s):", {k: (round(v, 1) if isinstance(v, float) else v) for k, v in doc["throughput_per_s"].items()})
print(f"machine: {cores} cores, load1 {before} → {after}")
PYEOF
