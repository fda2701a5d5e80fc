#!/usr/bin/env bash
# Convert benchmark: anemone vs coremltools on a Qwen3-0.6B-shaped random checkpoint (28 layers,
# hidden 1024, 16/8 heads, head_dim 128, intermediate 3072, vocab 151936, bf16 safetensors),
# context 512, one layer per chunk, decode + prefill(64) functions per chunk, fp16.
# Prints wall time and peak RSS (/usr/bin/time -v) of both, side by side, and writes JSON.
#
# Usage: benches/convert_vs_coremltools.sh [WORK_DIR]
#   WORK_DIR (default ${TMPDIR:-/tmp}/anemone-convert-bench) holds the checkpoint and outputs;
#   never inside the repository.
#   ANEMONE_BENCH_PYTHON: a python with torch, transformers and coremltools (default python3).
#   ANEMONE_BENCH_LAYERS: convert only the first N blocks on the coremltools side (default all).
#   ANEMONE_BIN: an already built release anemone binary (default: build target/release/anemone).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-${TMPDIR:-/tmp}/anemone-convert-bench}"
PY="${ANEMONE_BENCH_PYTHON:-python3}"
CKPT="$WORK/qwen3-0.6b-random"
mkdir -p "$WORK"

if [ ! -f "$CKPT/model.safetensors" ]; then
  echo "== making the random checkpoint in $CKPT"
  "$PY" benches/convert_make_checkpoint.py "$CKPT"
fi

if [ -z "${ANEMONE_BIN:-}" ]; then
  echo "== building anemone (release)"
  cargo build --release -p anemone --quiet
  ANEMONE_BIN=target/release/anemone
fi

field() { # field FILE "Label" -> value after the last ': '
  grep -F "$2" "$1" | sed 's/.*: //'
}
seconds() { # h:mm:ss or m:ss.ss -> seconds
  awk -F: '{ if (NF == 3) print $1 * 3600 + $2 * 60 + $3; else print $1 * 60 + $2 }'
}

echo "== anemone convert"
rm -rf "$WORK/anemone.bundle"
/usr/bin/time -v -o "$WORK/anemone.time" "$ANEMONE_BIN" convert "$CKPT" \
  --out "$WORK/anemone.bundle" --context 512 --prefill-len 64 --layers-per-chunk 1
echo "== coremltools (torch.jit.trace + ct.convert per block, decode + prefill merged)"
rm -rf "$WORK/coremltools.out"
/usr/bin/time -v -o "$WORK/coremltools.time" "$PY" benches/convert_coremltools_blocks.py \
  "$CKPT" "$WORK/coremltools.out" 512 64 ${ANEMONE_BENCH_LAYERS:-} 2>&1 | grep -E '^(block|coremltools|loaded)'

a_wall=$(field "$WORK/anemone.time" "Elapsed (wall clock)" | seconds)
c_wall=$(field "$WORK/coremltools.time" "Elapsed (wall clock)" | seconds)
cpu() { # user + system seconds
  awk -F': ' '/User time|System time/ { s += $2 } END { printf "%.1f", s }' "$1"
}
a_cpu=$(cpu "$WORK/anemone.time")
c_cpu=$(cpu "$WORK/coremltools.time")
a_rss=$(field "$WORK/anemone.time" "Maximum resident set size")
c_rss=$(field "$WORK/coremltools.time" "Maximum resident set size")
a_bytes=$(du -sb "$WORK/anemone.bundle" | cut -f1)
c_bytes=$(du -sb "$WORK/coremltools.out" | cut -f1)
ratio=$(awk -v a="$a_wall" -v c="$c_wall" 'BEGIN { printf "%.1f", c / a }')

cpu_ratio=$(awk -v a="$a_cpu" -v c="$c_cpu" 'BEGIN { printf "%.1f", c / a }')
printf '\n%-12s %10s %10s %14s %12s\n' tool "wall (s)" "CPU (s)" "peak RSS (MB)" "output (MB)"
printf '%-12s %10.1f %10.1f %14.0f %12.0f\n' anemone "$a_wall" "$a_cpu" "$((a_rss / 1024))" "$((a_bytes / 1000000))"
printf '%-12s %10.1f %10.1f %14.0f %12.0f\n' coremltools "$c_wall" "$c_cpu" "$((c_rss / 1024))" "$((c_bytes / 1000000))"
echo "anemone is ${ratio}x faster in wall time, ${cpu_ratio}x in CPU time (goal >= 20x; peak RSS goal <= 2048 MB)"
echo "(anemone's output also holds host.safetensors: the embedding; coremltools' holds the blocks only)"
cat > "$WORK/convert_bench.json" <<JSON
{"anemone": {"wall_s": $a_wall, "cpu_s": $a_cpu, "peak_rss_kb": $a_rss, "bytes": $a_bytes},
 "coremltools": {"wall_s": $c_wall, "cpu_s": $c_cpu, "peak_rss_kb": $c_rss, "bytes": $c_bytes},
 "speedup_wall": $ratio, "speedup_cpu": $cpu_ratio, "coremltools_layers": "${ANEMONE_BENCH_LAYERS:-all}"}
JSON
echo "wrote $WORK/convert_bench.json"
