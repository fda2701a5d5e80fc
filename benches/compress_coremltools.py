"""coremltools side of benches/compress_vs_coremltools.sh: times coremltools 9's own compression
functions on one Qwen3-0.6B-shaped block and reports the reconstruction error, one JSON object per
line.

Usage: compress_coremltools.py DIR SCHEME [--kmeans1d] [--workers N] [--api]
  DIR      holds <name>.f32 (little-endian float32 [out, in]) written by the shell script, or
           block-NN/ subdirectories holding them (each block compressed in turn, times summed)
  SCHEME   int8 | lut4 | lut8   (int8 per output channel, symmetric; lutN k-means, 32 output
           channels per LUT)
  --kmeans1d  let coremltools use the kmeans1d package (it does so for fp16 groups of >= 10000
           values when kmeans1d is importable); without it coremltools uses scikit-learn KMeans
           (k-means++, n_init=1, tol=1e-2), which is what a default install does
  --workers N  coremltools' num_kmeans_workers (a process pool over groups)
  --api    time the public API (linear_quantize_weights / palettize_weights) on an mlprogram
           holding the block instead of the per-tensor functions it calls

The weights are rounded to fp16 first, as they are in a converted fp16 model; the error is measured
against the original float32 values, like anemone's.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

BLOCK = [
    ("q_proj", 2048, 1024),
    ("k_proj", 1024, 1024),
    ("v_proj", 1024, 1024),
    ("o_proj", 1024, 2048),
    ("gate_proj", 3072, 1024),
    ("up_proj", 3072, 1024),
    ("down_proj", 1024, 3072),
]


def load(dir_):
    return {
        name: np.fromfile(os.path.join(dir_, f"{name}.f32"), dtype="<f4").reshape(o, i)
        for name, o, i in BLOCK
    }


def core(weights, scheme, workers):
    """Per-tensor compression with coremltools' functions on the fp16 weights. Returns the
    seconds and CPU seconds of the compression alone, and {name: reconstruction}."""
    from coremltools.optimize import _utils as optimize_utils
    from coremltools.optimize.coreml._quantization_passes import palettize_weights

    fp16 = {name: w.astype(np.float16) for name, w in weights.items()}
    params = {}
    start, cpu_start = time.perf_counter(), cpu_time()
    for name, w in fp16.items():
        if scheme == "int8":
            params[name] = optimize_utils.compute_qparams(
                w, nbits=8, signed=True, quantization_mode="LINEAR_SYMMETRIC",
                dtype=np.int8, block_sizes=[1, 0],
            )
        else:
            params[name] = palettize_weights.blockwise_compress(
                w, "KMEANS", int(scheme[3:]), block_sizes=[32, 0], num_kmeans_workers=workers
            )
    seconds, cpu = time.perf_counter() - start, cpu_time() - cpu_start
    out = {}
    for name, p in params.items():
        if scheme == "int8":
            q, scale, _ = p
            out[name] = (q.astype(np.float16) * scale.astype(np.float16)).astype(np.float32)
        else:
            out[name] = optimize_utils.lut_to_dense(p.indices, p.lut, p.vector_axis).astype(np.float32)
    return out, seconds, cpu


def api(weights, scheme, workers):
    """The public API on an iOS18 mlprogram (linear ops over const fp16 weights)."""
    import coremltools as ct
    import coremltools.optimize as cto
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    dims = [1024, 2048, 3072]
    assert sorted({i for _, _, i in BLOCK}) == dims
    specs = [mb.TensorSpec((1, d), dtype=types.fp16) for d in dims]

    @mb.program(input_specs=specs, opset_version=ct.target.iOS18)
    def prog(x1024, x2048, x3072):
        by_dim = {1024: x1024, 2048: x2048, 3072: x3072}
        return tuple(
            mb.linear(x=by_dim[i], weight=mb.const(val=weights[n].astype(np.float16), name=f"{n}_weight"), name=n)
            for n, _, i in BLOCK
        )

    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                       compute_precision=ct.precision.FLOAT16, skip_model_load=True)
    start, cpu_start = time.perf_counter(), cpu_time()
    if scheme == "int8":
        cfg = cto.coreml.OptimizationConfig(global_config=cto.coreml.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", granularity="per_channel"))
        model = cto.coreml.linear_quantize_weights(model, cfg)
    else:
        cfg = cto.coreml.OptimizationConfig(global_config=cto.coreml.OpPalettizerConfig(
            mode="kmeans", nbits=int(scheme[3:]), granularity="per_grouped_channel", group_size=32,
            num_kmeans_workers=workers))
        model = cto.coreml.palettize_weights(model, cfg)
    seconds, cpu = time.perf_counter() - start, cpu_time() - cpu_start
    out = {}
    for op in model._mil_program.functions["main"].operations:
        if op.op_type == "linear":
            src = op.weight.op
            assert src.op_type.startswith("constexpr_"), src.op_type
            out[op.name] = np.asarray(src.materialized_val_inference(), dtype=np.float32)
    return out, seconds, cpu


def cpu_time():
    """CPU seconds of this process and its finished children (the k-means worker pool)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("scheme", choices=["int8", "lut4", "lut6", "lut8"])
    ap.add_argument("--kmeans1d", action="store_true")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--api", action="store_true")
    args = ap.parse_args()

    from coremltools.models.neural_network import quantization_utils

    if args.scheme != "int8":
        if args.kmeans1d and not quantization_utils._HAS_KMEANS1D:
            sys.exit("--kmeans1d: the kmeans1d package is not importable")
        quantization_utils._HAS_KMEANS1D = args.kmeans1d

    blocks = sorted(
        os.path.join(args.dir, d) for d in os.listdir(args.dir)
        if d.startswith("block-") and os.path.isdir(os.path.join(args.dir, d))
    ) or [args.dir]
    if args.api and len(blocks) > 1:
        sys.exit("--api times one block only")
    seconds = cpu = err2 = ref2 = max_abs = 0.0
    for block in blocks:
        # one block in memory at a time; only the compression is timed
        weights = load(block)
        if args.api:
            recon, s, c = api(weights, args.scheme, args.workers)
        else:
            recon, s, c = core(weights, args.scheme, args.workers)
        seconds, cpu = seconds + s, cpu + c
        for n in weights:
            diff = weights[n].astype(np.float64) - recon[n]
            err2 += float((diff ** 2).sum())
            ref2 += float((weights[n].astype(np.float64) ** 2).sum())
            max_abs = max(max_abs, float(np.abs(diff).max()))
    kmeans = "-" if args.scheme == "int8" else ("kmeans1d" if args.kmeans1d else "sklearn")
    print(json.dumps({
        "tool": "coremltools", "scheme": args.scheme, "path": "api" if args.api else "core",
        "kmeans": kmeans, "workers": args.workers, "blocks": len(blocks), "seconds": seconds,
        "cpu_seconds": cpu,
        "relative_rms": (err2 / ref2) ** 0.5, "max_abs": max_abs,
    }), flush=True)


if __name__ == "__main__":
    main()
