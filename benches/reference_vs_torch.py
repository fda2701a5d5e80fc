"""Benchmark (not a test): the fp32 reference forward of `anemone generate` against PyTorch
transformers fp32 on the same machine, same thread count, same prompt and same tokens.

For each model: a 64-token prompt, 32 greedy tokens, 2 threads. PyTorch loads the model from the
same GGUF (`gguf_file=`, dequantized to fp32) and runs prefill + a manual KV-cached greedy loop;
anemone runs `generate --prompt-ids … --force-ids <torch's greedy ids> --json` (teacher forcing, so
both do exactly the same work) and reports prefill/decode tok/s. Decode tok/s counts the 31
single-token steps after the prefill on both sides. Best of --repeats runs each.

Run from the workspace root with the oracle venv (torch + transformers + gguf):
    /work/cache/oracle-venv/bin/python benches/reference_vs_torch.py [--models DIR] [--json]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = [
    ("SmolLM2-135M", "smollm2-135m-instruct.Q4_1.gguf"),
    ("Qwen2.5-Coder-0.5B", "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf"),
]
PROMPT_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based inks and a wooden screw press into a system that could "
    "produce books faster and more cheaply than ever before. Within a few decades, presses had "
    "spread to hundreds of European cities, and the number of books in circulation grew from "
    "thousands to millions. Scholars argue about the consequences, but most agree that"
)


def torch_run(model, prompt_ids, new_tokens):
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        start = time.perf_counter()
        out = model(ids, use_cache=True)
        prefill = time.perf_counter() - start
        past = out.past_key_values
        token = int(out.logits[0, -1].argmax())
        generated = [token]
        start = time.perf_counter()
        for _ in range(new_tokens - 1):
            out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = int(out.logits[0, -1].argmax())
            generated.append(token)
        decode = time.perf_counter() - start
    return generated, len(prompt_ids) / prefill, (new_tokens - 1) / decode


def anemone_run(binary, gguf, prompt_ids, forced, threads):
    csv = lambda ids: ",".join(map(str, ids))
    out = subprocess.run(
        [str(binary), "generate", str(gguf), "--prompt-ids", csv(prompt_ids), "--force-ids",
         csv(forced), "--threads", str(threads), "--json"],
        check=True, capture_output=True, text=True,
    )
    report = json.loads(out.stdout)
    return report["prefill_tok_s"], report["decode_tok_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=os.environ.get("ANEMONE_MODELS", ROOT / "models"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--binary", help="a built anemone binary (default: cargo build --release)")
    args = parser.parse_args()

    if args.binary:
        binary = pathlib.Path(args.binary)
    else:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "anemone"], cwd=ROOT, check=True)
        binary = ROOT / "target" / "release" / "anemone"

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    models_dir = pathlib.Path(args.models)
    rows = []
    for label, file in MODELS:
        gguf = models_dir / file
        if not gguf.is_file():
            sys.exit(f"{gguf} is missing: run scripts/fetch-models.sh")
        tok = AutoTokenizer.from_pretrained(str(models_dir), gguf_file=file)
        prompt_ids = tok(PROMPT_TEXT).input_ids[: args.prompt_tokens]
        assert len(prompt_ids) == args.prompt_tokens, "prompt text too short"
        print(f"{label}: loading PyTorch fp32 from the GGUF…", file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(
            str(models_dir), gguf_file=file, dtype=torch.float32
        ).eval()
        torch_prefill = torch_decode = 0.0
        for _ in range(args.repeats):
            generated, p, d = torch_run(model, prompt_ids, args.new_tokens)
            torch_prefill, torch_decode = max(torch_prefill, p), max(torch_decode, d)
        del model
        print(f"{label}: running anemone…", file=sys.stderr)
        ours_prefill = ours_decode = 0.0
        for _ in range(args.repeats):
            p, d = anemone_run(binary, gguf, prompt_ids, generated, args.threads)
            ours_prefill, ours_decode = max(ours_prefill, p), max(ours_decode, d)
        rows.append(
            dict(model=label, ours_decode=ours_decode, torch_decode=torch_decode,
                 ours_prefill=ours_prefill, torch_prefill=torch_prefill)
        )

    print(f"\nfp32, {args.threads} threads, {args.prompt_tokens}-token prompt, "
          f"{args.new_tokens} greedy tokens; torch {torch.__version__}, "
          f"transformers {transformers.__version__}; best of {args.repeats}")
    print(f"| model | anemone decode tok/s | PyTorch decode tok/s | ratio "
          f"| anemone prefill tok/s | PyTorch prefill tok/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['ours_decode']:.1f} | {r['torch_decode']:.1f} | "
              f"{r['ours_decode'] / r['torch_decode']:.2f}× | {r['ours_prefill']:.0f} | "
              f"{r['torch_prefill']:.0f} | {r['ours_prefill'] / r['torch_prefill']:.2f}× |")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
