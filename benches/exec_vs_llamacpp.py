"""Benchmark (not a test): anemone's MIL executor and fp32 reference against llama.cpp at equal
precision, in one run on one machine.

For each real model (SmolLM2-135M Q4_1, Qwen2.5-0.5B Q4_K_M GGUFs) this builds, under --workdir:
an F16 and an F32 GGUF (every tensor of the quantized file dequantized with `gguf`, so all
engines hold the same weights), and anemone fp16 and fp32 bundles (`anemone convert`). Then,
interleaved round by round (best of --repeats): llama.cpp (llama-cpp-python) on the F16 and F32
GGUFs, anemone's executor on the fp16 and fp32 bundles and its fp32 reference on the checkpoint.
Every engine prefills the same --prompt-tokens prompt and then decodes --new-tokens tokens
(llama.cpp teacher-forced along its F32 greedy path, anemone along its own greedy path: the same
work a token), and every run is warm: llama.cpp's engines are loaded once and run greedy before
the rounds, anemone's figures are `anemone bench --json` timings of one run after an untimed one
in the same process. anemone's peak resident memory is that of one `anemone generate` of the
same prompt and forced tokens (`/usr/bin/time`, in the first round). Prints the ratio table
(anemone / llama.cpp at equal precision; ≥ 1.00× means as fast or faster).
"""

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
from llama_cpp_peer import LlamaEngine, dequantized_gguf, llama_quantized_gguf  # noqa: E402

MODELS = [
    ("SmolLM2-135M", "smollm2-135m-instruct.Q4_1.gguf"),
    ("Qwen2.5-0.5B", "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf"),
]
PROMPT_TEXT = (
    "The history of computing is a story of abstraction layered upon abstraction. Early machines "
    "were programmed by rewiring plugboards, then by punching cards, then by writing assembly "
    "language that a program translated into numbers. Each step hid a layer of detail so that "
    "people could think about larger problems, and each step was resisted by experts who "
    "believed that the new tools produced slower code than careful hand work."
)


def csv(ids):
    return ",".join(map(str, ids))


def anemone_run(binary, model, prompt, new_tokens, threads):
    """Prefill and decode tok/s of one timed run after one untimed warm-up in the same process
    (`anemone bench`), as llama.cpp's engines run warm: they are loaded once and run greedy
    before the rounds. A fresh process's first prompt can run on memory just read from disk,
    which a VM's host may still be faulting in (see the README's session 25)."""
    backend = ["--backend", "executor"] if model.is_dir() else []
    cmd = [str(binary), "bench", str(model), *backend, "--prompt-ids", csv(prompt), "--gen",
           str(new_tokens + 1), "--warmup", "1", "--runs", "1", "--threads", str(threads),
           "--json", "--no-verify"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    report = json.loads(out.stdout)
    huge = report.get("file_huge_mapped_bytes")
    if huge is not None and model.is_dir():
        # weights in 4 KiB pages decode slower (TLB misses; README sessions 21–22)
        print(f"  {model.name}: {huge / 2**20:.0f} of {bundle_weight_bytes(model) / 2**20:.0f} "
              f"MiB of weights mapped in huge pages", file=sys.stderr)
    result = report["results"][0]
    return result["prefill_tok_s"], result["decode_tok_s"]


def anemone_peak_rss(binary, model, prompt, forced, threads):
    """Peak resident MiB of one `anemone generate` (load, the prompt, the forced tokens), the
    command a user runs."""
    with tempfile.NamedTemporaryFile("r") as rss:
        cmd = ["/usr/bin/time", "-f", "%M %R %F", "-o", rss.name, str(binary), "generate",
               str(model), "--prompt-ids", csv(prompt), "--force-ids", csv(forced), "--threads",
               str(threads), "--json", "--no-verify"]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        peak_kib, minor, major = map(int, rss.read().strip().splitlines()[-1].split())
    print(f"  {pathlib.Path(model).name}: peak RSS {peak_kib / 1024:.0f} MiB, {minor} minor / "
          f"{major} major page faults", file=sys.stderr)
    return peak_kib / 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", required=True)
    p.add_argument("--models", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", help="run one model (a substring of its name)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quantized", action="store_true",
                   help="also llama.cpp Q8_0/Q4_0 (quantized by llama.cpp from the F16 GGUF) against "
                        "anemone int8/int4 bundles (symmetric, blocks of 32, from the same F16 GGUF), "
                        "and anemone LUT-8/LUT-4 bundles (k-means palettes, 32 rows a palette) and a "
                        "grid int8 bundle (the source GGUF's grids kept in 8 bits) against the fp16 "
                        "bundle")
    args = p.parse_args()
    work = pathlib.Path(args.workdir)
    binary = pathlib.Path(args.binary).resolve()
    rows = []
    load_before = os.getloadavg()
    for name, file in MODELS:
        if args.only and args.only.lower() not in name.lower():
            continue
        src = pathlib.Path(args.models) / file
        ggufs = {}
        for dtype in ("F16", "F32"):
            ggufs[dtype] = work / f"{src.stem}.{dtype}.gguf"
            if not ggufs[dtype].exists():
                print(f"writing {ggufs[dtype].name}", file=sys.stderr)
                dequantized_gguf(src, ggufs[dtype], dtype)
        bundles = {}
        for precision in ("fp16", "fp32"):
            bundles[precision] = work / f"{src.stem}.{precision}.bundle"
            if not bundles[precision].exists():
                print(f"converting {bundles[precision].name}", file=sys.stderr)
                subprocess.run([str(binary), "convert", str(src), "--out", str(bundles[precision]),
                                "--precision", precision], check=True, capture_output=True)
        if args.quantized:
            for kind in ("Q8_0", "Q4_0"):
                ggufs[kind] = work / f"{src.stem}.{kind}.gguf"
                if not ggufs[kind].exists():
                    print(f"quantizing {ggufs[kind].name} (llama.cpp)", file=sys.stderr)
                    llama_quantized_gguf(ggufs["F16"], ggufs[kind], kind, args.threads)
            for bits in ("int8", "int4"):
                bundles[bits] = work / f"{src.stem}.{bits}.bundle"
                if not bundles[bits].exists():
                    print(f"converting {bundles[bits].name}", file=sys.stderr)
                    subprocess.run([str(binary), "convert", str(ggufs["F16"]), "--out",
                                    str(bundles[bits]), "--quantize", bits, "--block-size", "32",
                                    "--linear-mode", "symmetric"], check=True, capture_output=True)
            # the source GGUF's own grids kept in 8 bits (a Q4_1 / Q4_K block: 16 levels)
            bundles["grid int8"] = work / f"{src.stem}.grid-int8.bundle"
            if not bundles["grid int8"].exists():
                print(f"converting {bundles['grid int8'].name}", file=sys.stderr)
                subprocess.run([str(binary), "convert", str(src), "--out", str(bundles["grid int8"]),
                                "--quantize", "int8", "--block-size", "32"],
                               check=True, capture_output=True)
            for bits in ("8", "4"):
                bundles[f"lut{bits}"] = work / f"{src.stem}.lut{bits}.bundle"
                if not bundles[f"lut{bits}"].exists():
                    print(f"converting {bundles[f'lut{bits}'].name}", file=sys.stderr)
                    subprocess.run([str(binary), "convert", str(ggufs["F16"]), "--out",
                                    str(bundles[f"lut{bits}"]), "--palettize", bits],
                                   check=True, capture_output=True)
        # the GGUFs and bundles just written are flushed to disk first: the kernel's writeback
        # would otherwise share the cores with the first rounds
        os.sync()
        llama = {d: LlamaEngine(g, args.threads, 512) for d, g in ggufs.items()}
        prompt = llama["F32"].llm.tokenize(PROMPT_TEXT.encode(), add_bos=False)[: args.prompt_tokens]
        assert len(prompt) == args.prompt_tokens, "prompt text too short"
        forced = llama["F32"].greedy(prompt, args.new_tokens)
        # (label, a llama.cpp engine or what anemone runs)
        engines = [
            ("llama.cpp F16", llama["F16"]),
            ("llama.cpp F32", llama["F32"]),
            ("anemone executor, fp16 bundle", bundles["fp16"]),
            ("anemone executor, fp32 bundle", bundles["fp32"]),
            ("anemone reference, fp32", src),
        ]
        if args.quantized:
            engines += [("llama.cpp Q8_0", llama["Q8_0"]), ("llama.cpp Q4_0", llama["Q4_0"])]
            engines += [(f"anemone executor, {kind} bundle", bundles[kind])
                        for kind in ("int8", "int4", "grid int8", "lut8", "lut4")]
        best = {}
        for round_ in range(args.repeats):
            for label, engine in engines:
                rss = None
                if isinstance(engine, LlamaEngine):
                    pf, dc = engine.timed(prompt, forced)
                else:
                    pf, dc = anemone_run(binary, engine, prompt, len(forced), args.threads)
                    if round_ == 0:
                        rss = anemone_peak_rss(binary, engine, prompt, forced, args.threads)
                print(f"{name} round {round_ + 1}: {label}: prefill {pf:.1f} / decode {dc:.2f} "
                      f"tok/s", file=sys.stderr)
                b = best.setdefault(label, [0.0, 0.0, rss])
                b[0], b[1] = max(b[0], pf), max(b[1], dc)
        del llama
        peers = {"anemone executor, fp16 bundle": "llama.cpp F16",
                 "anemone executor, fp32 bundle": "llama.cpp F32",
                 "anemone reference, fp32": "llama.cpp F32",
                 "anemone executor, int8 bundle": "llama.cpp Q8_0",
                 "anemone executor, int4 bundle": "llama.cpp Q4_0",
                 # no llama.cpp peer holds palettes, or a source's grids in 8 bits: against
                 # anemone's own fp16 bundle
                 "anemone executor, grid int8 bundle": "anemone executor, fp16 bundle",
                 "anemone executor, lut8 bundle": "anemone executor, fp16 bundle",
                 "anemone executor, lut4 bundle": "anemone executor, fp16 bundle"}
        weight_bytes = {f"anemone executor, {kind} bundle": bundle_weight_bytes(bundle)
                        for kind, bundle in bundles.items()}
        kv_bytes = {f"anemone executor, {kind} bundle": bundle_kv_bytes(bundle)
                    for kind, bundle in bundles.items()}
        for label, (pf, dc, rss) in best.items():
            peer = peers.get(label)
            ratio = ""
            if peer:
                lp, ld, _ = best[peer]
                short = "the fp16 bundle" if peer.startswith("anemone") else peer.split()[-1]
                ratio = f"{pf / lp:.2f}× / {dc / ld:.2f}× of {short} ({lp:.0f} / {ld:.1f})"
            rows.append({"model": name, "engine": label, "prefill_tok_s": pf, "decode_tok_s": dc,
                         "peak_rss_mib": rss, "weight_mib": weight_bytes.get(label, 0) / 2**20,
                         "kv_mib": kv_bytes.get(label, 0) / 2**20,
                         "ratio": ratio})
    load_after = os.getloadavg()
    print(f"\n{args.threads} threads, {args.prompt_tokens}-token prompt, {args.new_tokens} decoded "
          f"tokens (llama.cpp teacher-forced along its F32 greedy path, anemone greedy), each run "
          f"warm (llama.cpp loaded once, anemone after one untimed run in its process), best of "
          f"{args.repeats} interleaved rounds; peak RSS of one `anemone generate`; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after\n")
    print("| model | engine | prefill tok/s | decode tok/s | peak RSS MiB (weights MiB) | RSS / (weights + KV) | ratio to llama.cpp at equal precision, LUT and grid int8 to the fp16 bundle (prefill / decode) |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        mem, per_byte = "", ""
        if r["peak_rss_mib"] is not None:
            mem = f"{r['peak_rss_mib']:.0f}"
            if r["weight_mib"]:
                mem += f" ({r['weight_mib']:.0f})"
                per_byte = f"{r['peak_rss_mib'] / (r['weight_mib'] + r['kv_mib']):.2f}×"
        print(f"| {r['model']} | {r['engine']} | {r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f} | {mem} | {per_byte} | {r['ratio']} |")
    if args.json:
        print(json.dumps(rows, indent=1))


def bundle_weight_bytes(bundle: pathlib.Path) -> int:
    """Bytes of a bundle's weights: every package's weight files and the host tensors."""
    total = (bundle / "host.safetensors").stat().st_size
    for f in (bundle / "chunks").rglob("*"):
        if f.is_file() and "weights" in f.parts:
            total += f.stat().st_size
    return total


def bundle_kv_bytes(bundle: pathlib.Path) -> int:
    """Bytes of a bundle's KV state at its declared dtypes: every state of every chunk's decode
    function (prefill shares them), as the manifest records it."""
    manifest = json.loads((bundle / "anemone.json").read_text())
    size = {"fp16": 2, "fp32": 4}
    total = 0
    for chunk in manifest["chunks"]:
        decode = next(f for f in chunk["functions"] if f["name"] == "decode")
        total += sum(math.prod(s["shape"]) * size[s["dtype"]] for s in decode["states"])
    return total


if __name__ == "__main__":
    main()
