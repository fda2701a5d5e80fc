"""Markdown table from the JSON lines of benches/compress_vs_coremltools.sh: for each scheme,
every anemone and coremltools row with time, relative RMS error, and the speed-up and error
ratio of anemone's default against each coremltools row."""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
SCHEMES = {"int8": "int8", "int8:symmetric": "int8", "lut4:kmeans:group=32": "lut4",
           "lut8:kmeans:group=32": "lut8"}


def label(r):
    if r["tool"] == "anemone":
        alg = "exact DP" if r["algorithm"] == "Optimal" else "Lloyd, coarse exact seed"
        if r["scheme"].startswith("int8"):
            # int8 = auto: samples each tensor for a source grid first (none in Gaussian weights)
            alg = "symmetric" if r["scheme"] == "int8:symmetric" else "auto → symmetric"
        return f"anemone ({alg}, {r['threads']} threads)"
    what = r["path"] + ("" if r["kmeans"] == "-" else f", {r['kmeans']}")
    return f"coremltools ({what}, {r['workers']} worker{'s' if r['workers'] > 1 else ''})"


blocks = max(r.get("blocks", 1) for r in rows)
print(f"{blocks} Qwen3-0.6B-shaped block(s), {blocks * 15.73:.0f}M weights\n")
print("| scheme | tool | wall s | CPU s | relative RMS | anemone speed-up (wall, CPU) | anemone error / theirs |")
print("|---|---|---:|---:|---:|---:|---:|")
for scheme in ["int8", "lut4", "lut8"]:
    mine = [r for r in rows if r["tool"] == "anemone" and SCHEMES.get(r["scheme"]) == scheme]
    default = next((r for r in mine if r["algorithm"] != "Optimal"), None)
    for r in mine + [r for r in rows if r["tool"] == "coremltools" and r["scheme"] == scheme]:
        if r["tool"] == "coremltools" and default:
            ratio = (f"{r['seconds'] / default['seconds']:.0f}×, "
                     f"{r.get('cpu_seconds', float('nan')) / default.get('cpu_seconds', float('nan')):.0f}×")
            err = f"{default['relative_rms'] / r['relative_rms']:.4f}"
        else:
            ratio = err = ""
        cpu = r.get("cpu_seconds", float("nan"))
        print(f"| {scheme} | {label(r)} | {r['seconds']:.2f} | {cpu:.2f} | {r['relative_rms']:.6f} | {ratio} | {err} |")
