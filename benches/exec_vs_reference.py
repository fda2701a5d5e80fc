"""Driver of benches/exec_vs_reference.sh (run that script, which builds and converts first).

For each model: PyTorch fp32 (transformers, loaded from the same GGUF with `gguf_file=`) runs
prefill + a KV-cached greedy loop; anemone runs `generate … --prompt-ids … --force-ids <torch's
greedy ids> --json` (teacher forcing: every engine does exactly the same work) on the GGUF (fp32
reference forward) and on the bundles (executor: fp32 bundle in fp32 mode, fp16 bundle in fp16
mode). Prefill tok/s = prompt tokens / prefill time; decode tok/s counts the 31 single-token steps
after the prefill. Best of --repeats.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

MODELS = [
    ("SmolLM2-135M", "smollm2", "smollm2-135m-instruct.Q4_1.gguf"),
    ("Qwen2.5-Coder-0.5B", "qwen2.5", "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf"),
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
        start = time.perf_counter()
        out = model(torch.tensor([prompt_ids]), use_cache=True)
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


def anemone_run(binary, model, prompt_ids, forced, threads, extra):
    csv = lambda ids: ",".join(map(str, ids))
    start = time.perf_counter()
    out = subprocess.run(
        [str(binary), "generate", str(model), "--prompt-ids", csv(prompt_ids), "--force-ids",
         csv(forced), "--threads", str(threads), "--json", *extra],
        check=True, capture_output=True, text=True,
    )
    wall = time.perf_counter() - start
    report = json.loads(out.stdout)
    return report["prefill_tok_s"], report["decode_tok_s"], wall


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--models", required=True)
    parser.add_argument("--bundles", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    models_dir, bundles = pathlib.Path(args.models), pathlib.Path(args.bundles)
    rows = []
    for label, short, file in MODELS:
        tok = AutoTokenizer.from_pretrained(str(models_dir), gguf_file=file)
        prompt_ids = tok(PROMPT_TEXT).input_ids[: args.prompt_tokens]
        assert len(prompt_ids) == args.prompt_tokens, "prompt text too short"
        print(f"{label}: PyTorch fp32…", file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(
            str(models_dir), gguf_file=file, dtype=torch.float32
        ).eval()
        best = (0.0, 0.0)
        for _ in range(args.repeats):
            generated, p, d = torch_run(model, prompt_ids, args.new_tokens)
            best = (max(best[0], p), max(best[1], d))
        del model
        rows.append(dict(model=label, engine="PyTorch fp32 (eager)", prefill=best[0], decode=best[1]))
        engines = [
            ("anemone reference fp32", models_dir / file, []),
            ("anemone executor, fp32 bundle, fp32", bundles / f"{short}-fp32", ["--precision", "fp32"]),
            ("anemone executor, fp16 bundle, fp16", bundles / f"{short}-fp16", ["--precision", "fp16"]),
        ]
        for engine, path, extra in engines:
            print(f"{label}: {engine}…", file=sys.stderr)
            best = (0.0, 0.0, float("inf"))
            for _ in range(args.repeats):
                p, d, wall = anemone_run(args.binary, path, prompt_ids, generated, args.threads, extra)
                best = (max(best[0], p), max(best[1], d), min(best[2], wall))
            rows.append(dict(model=label, engine=engine, prefill=best[0], decode=best[1], wall=best[2]))

    print(f"\n{args.threads} threads, {args.prompt_tokens}-token prompt, {args.new_tokens} teacher-forced "
          f"greedy tokens; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"best of {args.repeats}")
    print("| model | engine | prefill tok/s | decode tok/s | process wall s (load + run) |")
    print("|---|---|---|---|---|")
    for r in rows:
        wall = f"{r['wall']:.1f}" if "wall" in r else "–"
        print(f"| {r['model']} | {r['engine']} | {r['prefill']:.0f} | {r['decode']:.1f} | {wall} |")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
