#!/usr/bin/env bash
# anemone-compress vs coremltools 9 on one Qwen3-0.6B-shaped decoder block (15.7M weights:
# q 2048×1024, k/v 1024×1024, o 1024×2048, gate/up 3072×1024, down 1024×3072; N(0, 0.02),
# numpy seed 0, the same float32 values for both tools). Schemes: int8 per output channel,
# 4-bit and 8-bit k-means with 32 output channels per LUT. Prints JSON lines and a table.
#
# coremltools is timed on its per-tensor functions (optimize._utils.compute_qparams,
# palettize_weights.blockwise_compress): the algorithm without the graph passes around it, the
# fairer side for coremltools (int8 is also timed through linear_quantize_weights on an
# mlprogram). Its k-means uses scikit-learn unless the kmeans1d package is importable, in which
# case fp16 groups of >= 10000 values go to kmeans1d; both paths are run.
#
# Env: BLOCKS (default 1; e.g. 28 = the whole Qwen3-0.6B model: distinct weights per block,
# seeds 0..BLOCKS-1, compressed one block at a time; coremltools' api path, its kmeans1d path
# and, unless SKIP_SLOW=0, its 8-bit runs are skipped for more than one block), OUT (results dir, default
# target/compress-bench, or target/compress-bench-<BLOCKS> for BLOCKS > 1), BENCH_VENV (python venv with
# coremltools + scikit-learn + kmeans1d; made from the system python3 if missing),
# CT_WORKERS (coremltools num_kmeans_workers, default 1 = its default), SKIP_SLOW=1 (skip the
# coremltools 8-bit runs, 5–15 min each), ANEMONE_OPTIMAL8=1 (also run the exact DP at 8 bits).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BLOCKS="${BLOCKS:-1}"
if [ "$BLOCKS" -gt 1 ]; then
  OUT="${OUT:-$ROOT/target/compress-bench-$BLOCKS}"
  SKIP_SLOW="${SKIP_SLOW:-1}"
else
  OUT="${OUT:-$ROOT/target/compress-bench}"
fi
BENCH_VENV="${BENCH_VENV:-$ROOT/target/compress-bench-venv}"
CT_WORKERS="${CT_WORKERS:-1}"
mkdir -p "$OUT/weights"
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"

if [ ! -x "$BENCH_VENV/bin/python" ]; then
  python3 -m venv --system-site-packages "$BENCH_VENV"
fi
PY="$BENCH_VENV/bin/python"
if ! "$PY" -c "import coremltools, sklearn, kmeans1d" 2>/dev/null; then
  "$PY" -m pip install -q scikit-learn kmeans1d
fi

"$PY" - "$OUT/weights" "$BLOCKS" <<'PYEOF'
import os
import sys
import numpy as np
out, blocks = sys.argv[1], int(sys.argv[2])
for b in range(blocks):
    # one block: DIR itself (seed 0, as before); several: DIR/block-NN with seed NN
    d = out if blocks == 1 else os.path.join(out, f"block-{b:02d}")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(b)
    for name, o, i in [("q_proj", 2048, 1024), ("k_proj", 1024, 1024), ("v_proj", 1024, 1024),
                       ("o_proj", 1024, 2048), ("gate_proj", 3072, 1024), ("up_proj", 3072, 1024),
                       ("down_proj", 1024, 3072)]:
        path = f"{d}/{name}.f32"
        if not os.path.exists(path):
            (rng.standard_normal((o, i), dtype=np.float32) * 0.02).astype("<f4").tofile(path)
PYEOF

(cd "$ROOT" && cargo build --release -q -p anemone-compress --example compress_bench)
BENCH="$ROOT/target/release/examples/compress_bench"
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

run_ct() {
  "$PY" "$ROOT/benches/compress_coremltools.py" "$OUT/weights" "$@" 2>/dev/null | grep '^{' | tee -a "$RESULTS"
}

# anemone: default k-means (Lloyd from a coarse exact seed), then the exact DP
"$BENCH" "$OUT/weights" int8 int8:symmetric lut4 lut8 | tee -a "$RESULTS"
"$BENCH" "$OUT/weights" --algorithm optimal lut4 | tee -a "$RESULTS"
if [ "${ANEMONE_OPTIMAL8:-0}" = 1 ]; then
  "$BENCH" "$OUT/weights" --algorithm optimal lut8 | tee -a "$RESULTS"
fi

run_ct int8
if [ "$BLOCKS" -eq 1 ]; then run_ct int8 --api; fi
run_ct lut4 --workers "$CT_WORKERS"
if [ "$BLOCKS" -eq 1 ]; then run_ct lut4 --kmeans1d --workers "$CT_WORKERS"; fi
if [ "${SKIP_SLOW:-0}" != 1 ]; then
  run_ct lut8 --workers "$CT_WORKERS"
  run_ct lut8 --kmeans1d --workers "$CT_WORKERS"
fi

"$PY" "$ROOT/benches/compress_table.py" "$RESULTS"
