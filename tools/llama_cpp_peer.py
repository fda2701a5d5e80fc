"""llama.cpp (through llama-cpp-python) as the peer of anemone's benchmarks.

Imported by `benches/exec_vs_llamacpp.py`, and embedded in the `anemone` binary, which runs it
as `python -c <this file> serve ...` for `anemone bench --llama-cpp`:

  serve --src GGUF --type f16|f32|q8_0|q4_0|as-is --workdir DIR --threads N --context C

writes the GGUF llama.cpp runs into DIR (every tensor of GGUF dequantized to F16/F32 with `gguf`,
or quantized by llama.cpp itself from that F16 file; `as-is` runs GGUF unchanged), loads it, prints
one JSON line `{"ready": ..., "gguf": ..., "load_s": ...}`, then answers each JSON line
`{"prompt": [ids], "forced": [ids]}` on stdin with `{"prefill_s": s, "token_s": [s, ...]}`:
the prompt evaluated at once (its last logits read), then each forced token alone. An error
is answered with `{"error": "..."}`. Needs `pip install llama-cpp-python gguf numpy`.
"""

import argparse
import json
import pathlib
import resource
import sys
import time


def dequantized_gguf(src: pathlib.Path, dst: pathlib.Path, dtype: str) -> None:
    """Writes `src` with every tensor dequantized: 2-D+ tensors as `dtype` (F16/F32), 1-D F32."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    file_type = {"F16": gguf.LlamaFileType.MOSTLY_F16, "F32": gguf.LlamaFileType.ALL_F32}[dtype]
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(file_type)
            continue
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), val_type, sub_type=sub_type)
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if values.ndim >= 2 and dtype == "F16":
            writer.add_tensor(t.name, values.astype(np.float16), raw_dtype=gguf.GGMLQuantizationType.F16)
        else:
            writer.add_tensor(t.name, values, raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_quantized_gguf(src: pathlib.Path, dst: pathlib.Path, kind: str, threads: int) -> None:
    """Writes `src` (an F16 GGUF) quantized by llama.cpp itself to Q8_0 or Q4_0."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
                    "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}[kind]
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama.cpp could not quantize {src} to {kind} (code {rc})")


def prepared_gguf(src: pathlib.Path, kind: str, workdir: pathlib.Path, threads: int) -> pathlib.Path:
    """The GGUF of `src` at `kind` (F16, F32, Q8_0, Q4_0 or AS-IS), written under `workdir`."""
    kind = kind.upper()
    if kind == "AS-IS":
        return src
    if kind in ("F16", "F32"):
        dst = workdir / f"{src.stem}.{kind}.gguf"
        dequantized_gguf(src, dst, kind)
        return dst
    if kind in ("Q8_0", "Q4_0"):
        f16 = prepared_gguf(src, "F16", workdir, threads)
        dst = workdir / f"{src.stem}.{kind}.gguf"
        llama_quantized_gguf(f16, dst, kind, threads)
        f16.unlink()
        return dst
    raise SystemExit(f"unknown GGUF type {kind!r}: f16, f32, q8_0, q4_0 or as-is")


class LlamaEngine:
    def __init__(self, path, threads, context):
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_ctx=context, n_batch=context, n_ubatch=context,
                         n_threads=threads, n_threads_batch=threads, verbose=False)

    def last_logits(self):
        """The logits of the last evaluated token, read from the context itself: since 0.3.x,
        `Llama.eval` fills `Llama.scores` only with `logits_all=True` (they stay zero otherwise,
        so an argmax of them is always token 0)."""
        import llama_cpp
        import numpy as np

        ptr = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),))

    def greedy(self, prompt, n):
        import numpy as np

        self.llm.reset()
        self.llm.eval(prompt)
        out = []
        for _ in range(n):
            tok = int(np.argmax(self.last_logits()))
            out.append(tok)
            self.llm.eval([tok])
        return out

    def timed_steps(self, prompt, forced):
        """Seconds of the prompt's evaluation and of each forced token's."""
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(prompt)
        _ = self.last_logits()[0]
        prefill_s = time.perf_counter() - t0
        token_s = []
        for tok in forced:
            t = time.perf_counter()
            self.llm.eval([tok])
            _ = self.last_logits()[0]
            token_s.append(time.perf_counter() - t)
        return prefill_s, token_s

    def timed(self, prompt, forced):
        """(prefill tok/s, decode tok/s) of one run."""
        prefill_s, token_s = self.timed_steps(prompt, forced)
        return len(prompt) / prefill_s, len(forced) / sum(token_s)


def serve(args) -> None:
    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError as e:
        print(json.dumps({"error": f"{e}; install with: pip install llama-cpp-python gguf numpy"}),
              flush=True)
        return
    t0 = time.perf_counter()
    path = prepared_gguf(pathlib.Path(args.src), args.type, pathlib.Path(args.workdir), args.threads)
    prepare_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine = LlamaEngine(path, args.threads, args.context)
    load_s = time.perf_counter() - t0
    print(json.dumps({"ready": True, "gguf": str(path), "prepare_s": prepare_s, "load_s": load_s,
                      "llama_cpp_version": getattr(llama_cpp, "__version__", "?")}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            prefill_s, token_s = engine.timed_steps(request["prompt"], request["forced"])
            # ru_maxrss is KiB on Linux, bytes on macOS
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            rss_bytes = rss if sys.platform == "darwin" else rss * 1024
            reply = {"prefill_s": prefill_s, "token_s": token_s, "peak_rss_bytes": rss_bytes}
        except Exception as e:  # a bad request is answered, the peer keeps serving
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="llama_cpp_peer")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--src", required=True)
    s.add_argument("--type", required=True)
    s.add_argument("--workdir", required=True)
    s.add_argument("--threads", type=int, required=True)
    s.add_argument("--context", type=int, required=True)
    args = p.parse_args()
    serve(args)


if __name__ == "__main__":
    main()
