#!/usr/bin/env bash
# Compressed bundles of the real models side by side: for SmolLM2-135M and Qwen2.5-Coder-0.5B,
# convert fp16, int8 (default auto mode: the GGUF's own grids) and int8 symmetric per channel,
# int4 (blocks of 32: source grids where they fit 16 levels, symmetric elsewhere), `source`
# (per tensor int4 or int8, the narrowest holding the GGUF's grids), LUT8 (k-means,
# 32 and 8 rows per LUT), LUT6 and LUT4 (k-means, 16 rows per LUT) and one mixed config
# (attention int8, MLP LUT6), then
# `anemone gate` every bundle of a model in one run (teacher-forced against the fp32 reference,
# fp16 executor, default prompts, --steps 8, default thresholds). Prints a markdown table:
# bundle size on disk, conversion wall time, top-1 agreement (near-ties excepted), mean/min
# logits cosine, min per-chunk cosine, gate verdict, and the manifest's mean/worst relative RMS.
#
# Env: ANEMONE_MODELS (default <repo>/models), OUT (default target/compress-table),
# STEPS (default 8), THREADS (gate threads, default all cores), MODELS (space-separated subset
# of "smollm2 qwen2.5"), ONLY (comma-separated subset of the variant names), KEEP_BUNDLES=1
# (keep the bundles; by default each model's are deleted once gated). Release build.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODELS_DIR="${ANEMONE_MODELS:-$ROOT/models}"
OUT="${OUT:-$ROOT/target/compress-table}"
STEPS="${STEPS:-8}"
MODELS="${MODELS:-smollm2 qwen2.5}"
mkdir -p "$OUT"

(cd "$ROOT" && cargo build --release -q -p anemone)
BIN="$ROOT/target/release/anemone"

cat > "$OUT/mixed.json" <<'EOF'
{ "rules": [
    { "pattern": "*.self_attn.*", "scheme": "int8" },
    { "pattern": "*.mlp.*", "scheme": "lut6:kmeans:group=16" } ] }
EOF

# name|flags
VARIANTS=(
  "fp16|"
  "int8|--quantize int8"
  "int8-symmetric|--quantize int8 --linear-mode symmetric"
  "int4-b32|--quantize int4 --block-size 32"
  "source|--quantize source"
  "lut8-g32|--palettize 8 --group-size 32"
  "lut8-g8|--palettize 8 --group-size 8"
  "lut6-g16|--palettize 6 --group-size 16"
  "lut4-g16|--palettize 4 --group-size 16"
  "mixed|--compress-config $OUT/mixed.json"
)

model_file() {
  case "$1" in
    smollm2) echo "$MODELS_DIR/smollm2-135m-instruct.Q4_1.gguf" ;;
    qwen2.5) echo "$MODELS_DIR/qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf" ;;
    *) echo "unknown model $1" >&2; exit 2 ;;
  esac
}

RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for model in $MODELS; do
  src="$(model_file "$model")"
  bundles=()
  for v in "${VARIANTS[@]}"; do
    name="${v%%|*}"
    flags="${v#*|}"
    if [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$name,"* ]]; then continue; fi
    bundle="$OUT/$model-$name.bundle"
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    "$BIN" convert "$src" --out "$bundle" --force --json $flags > "$OUT/$model-$name.convert.json"
    end=$(date +%s.%N)
    bytes=$(du -sb "$bundle" | cut -f1)
    python3 - "$model" "$name" "$bundle" "$bytes" "$start" "$end" >> "$RESULTS" <<'PY'
import json, sys
model, name, bundle, size, start, end = sys.argv[1:]
m = json.load(open(f"{bundle}/anemone.json"))
tensors = (m.get("compression") or {}).get("tensors", [])
errs = [t["error"]["relative_rms"] for t in tensors if t.get("error")]
applied = sorted({t["scheme"] for t in tensors if t.get("scheme")})
print(json.dumps({"kind": "convert", "model": model, "variant": name, "bundle": bundle,
                  "bytes": int(size), "seconds": float(end) - float(start),
                  "applied": applied,
                  "mean_rel_rms": sum(errs) / len(errs) if errs else 0.0,
                  "worst_rel_rms": max(errs) if errs else 0.0}))
PY
    echo "converted $model $name: $bytes bytes" >&2
    bundles+=("$bundle")
  done
  # exit status 1 = some variant failed the gate; the table says which
  "$BIN" gate "${bundles[@]}" --reference "$src" --steps "$STEPS" --precision fp16 \
    ${THREADS:+--threads "$THREADS"} --json > "$OUT/$model.gate.json" || true
  python3 - "$model" "$OUT/$model.gate.json" >> "$RESULTS" <<'PY'
import json, sys
model, path = sys.argv[1:]
for r in json.load(open(path))["reports"]:
    s = r["summary"]
    print(json.dumps({"kind": "gate", "model": model, "bundle": r["bundle"],
                      "passed": r["passed"], "top1": s["top1_agreement"],
                      "counted": s["counted_steps"], "near_ties": s["near_tie_steps"],
                      "mean_cos": s["mean_cosine"], "min_cos": s["min_cosine"],
                      "min_chunk_cos": s["min_chunk_cosine"],
                      "failures": [f["at"] + ": " + f["message"] for f in r["failures"]][:2]}))
PY
  echo "gated $model" >&2
  # a full run writes ~10 GB of bundles; keep them only when asked
  if [ "${KEEP_BUNDLES:-0}" != 1 ]; then rm -rf "${bundles[@]}"; fi
done

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
gates = {r["bundle"]: r for r in rows if r["kind"] == "gate"}
print("| model | variant | schemes applied | bundle MB | vs fp16 | convert s | top-1 | mean cos | min cos "
      "| min chunk cos | gate | weight rRMS mean / worst |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
base = {}
for r in rows:
    if r["kind"] != "convert":
        continue
    base.setdefault(r["model"], r["bytes"])
    g = gates.get(r["bundle"])
    gate = ("pass" if g["passed"] else "FAIL") if g else "-"
    top1 = f'{g["top1"]:.3f} ({g["counted"]})' if g else "-"
    fmt = lambda k: f"{g[k]:.5f}" if g else "-"
    err = (f'{r["mean_rel_rms"]:.4f} / {r["worst_rel_rms"]:.4f}'
           if r["worst_rel_rms"] else "-")
    applied = ", ".join(r.get("applied", [])) or "-"
    print(f'| {r["model"]} | {r["variant"]} | {applied} | {r["bytes"] / 1e6:.1f} | '
          f'{r["bytes"] / base[r["model"]]:.2f} | {r["seconds"]:.1f} | {top1} | '
          f'{fmt("mean_cos")} | {fmt("min_cos")} | {fmt("min_chunk_cos")} | {gate} | {err} |')
PY
