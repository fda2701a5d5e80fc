"""Driver of benches/encoder_vs_sentence_transformers.sh (run that script: it builds, converts
and then calls this).

Engines, all on CPU in one run: PyTorch sentence-transformers (fp32), anemone's fp32 reference
(`embed MODEL_DIR`) and anemone's MIL executor on the fp16 bundle (`embed BUNDLE`).

1. Per-input latency by bucket: inputs whose token count lands in each bundle bucket (32/128/512);
   every engine embeds them one at a time after a warm-up pass; p50/p95 over the inputs. Load
   time (model/bundle open) is measured and reported apart, never inside a latency.
2. Throughput: 1,000 sentences (mixed lengths, all ≤ 128 tokens) in one call, load excluded.
   sentence-transformers batches them (its default batch size 32); anemone runs one input at a
   time (grouped by bucket; no batching yet), so this compares what each does by default.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WORDS = (
    "the a river city light model vector search quiet engine north paper table garden small "
    "language fast neural winter train music number code reader market morning bridge window "
    "question answer system data simple green careful history"
).split()


def sentence(i, n_words):
    return " ".join(WORDS[(i * 7 + k * 13 + k * k) % len(WORDS)] for k in range(n_words)).capitalize() + "."


def by_bucket_inputs(tok, buckets, per_bucket):
    """`per_bucket` sentences whose token count falls in each bucket (above the previous one)."""
    out = {}
    lo = 0
    for b in buckets:
        chosen = []
        i = 0
        # aim at the middle-upper part of the bucket
        target = lo + max(1, (b - lo) * 3 // 4)
        while len(chosen) < per_bucket and i < 10 * per_bucket + 100:
            words = max(1, target - 2 - (i % 5))
            s = sentence(i, words)
            n = len(tok(s)["input_ids"])
            while n > b and words > 1:
                words -= 1
                s = sentence(i, words)
                n = len(tok(s)["input_ids"])
            if lo < n <= b:
                chosen.append(s)
            i += 1
        out[b] = chosen
        lo = b
    return out


def pct(xs, p):
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def anemone(binary, model, texts, warmup, precision="fp16"):
    path = "/tmp/anemone-bench-inputs.%d.txt" % os.getpid()
    with open(path, "w") as f:
        f.write("\n".join(texts) + "\n")
    cmd = [binary, "embed", str(model), "--file", path, "--json", "--warmup", str(warmup),
           "--precision", precision]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    os.unlink(path)
    doc = json.loads(out)
    return doc


def st_per_input(st, texts, warmup):
    for _ in range(warmup):
        for t in texts:
            st.encode([t])
    lat = []
    for t in texts:
        start = time.perf_counter()
        st.encode([t])
        lat.append((time.perf_counter() - start) * 1e3)
    return lat


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--anemone", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--buckets", default="32,128,512")
    ap.add_argument("--per-bucket", type=int, default=20)
    ap.add_argument("--throughput", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import torch
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(a.threads)
    start = time.perf_counter()
    st = SentenceTransformer(a.model, device="cpu")
    st_load = (time.perf_counter() - start) * 1e3
    st.max_seq_length = 512
    tok = st.tokenizer
    buckets = [int(b) for b in a.buckets.split(",")]
    inputs = by_bucket_inputs(tok, buckets, a.per_bucket)
    rows = []
    report = {
        "torch_threads": a.threads,
        "torch": torch.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "load_ms": {"sentence-transformers": st_load},
        "latency": rows,
    }
    for b in buckets:
        texts = inputs[b]
        if not texts:
            continue
        tokens = [len(tok(t)["input_ids"]) for t in texts]
        row = {"bucket": b, "inputs": len(texts), "tokens_min": min(tokens), "tokens_max": max(tokens)}
        lat = st_per_input(st, texts, 1)
        row["sentence-transformers"] = {"p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95)}
        for name, model in [("executor fp16", a.bundle), ("reference fp32", a.model)]:
            doc = anemone(a.anemone, model, texts, 1)
            lat = [i["latency_ms"] for i in doc["inputs"]]
            got = {i["bucket"] for i in doc["inputs"]}
            if name.startswith("executor") and got != {b}:
                sys.exit(f"bucket {b}: inputs ran in buckets {got}")
            row[name] = {"p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95)}
            report["load_ms"][name] = doc["timing"]["load_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)

    # throughput
    texts = [sentence(i, 4 + (i * 37) % 40) for i in range(a.throughput)]
    start = time.perf_counter()
    st.encode(texts, batch_size=32)
    st_s = time.perf_counter() - start
    thr = {"sentences": len(texts), "sentence-transformers (batch 32)": len(texts) / st_s}
    for name, model in [("executor fp16", a.bundle), ("reference fp32", a.model)]:
        doc = anemone(a.anemone, model, texts, 0)
        thr[name + " (batch 1)"] = len(texts) / (doc["timing"]["run_ms"] / 1e3)
    report["throughput_per_s"] = thr
    print(json.dumps(thr), flush=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
