#!/usr/bin/env python3
"""Checks anemone against transformers on checkpoints the tests have never seen.

    python tools/oracle/make_fixtures.py --holdout /tmp/holdout --holdout-seed 777
    python tools/oracle/check_holdout.py /tmp/holdout target/release/anemone            # reference
    python tools/oracle/check_holdout.py /tmp/holdout target/release/anemone --bundle   # fp32 bundle

For every holdout model: runs `anemone generate DIR --prompt-ids … --temperature 0 --json
--dump-logits` (with --bundle: first `anemone convert --precision fp32`, then generate from the
bundle with the executor in fp32) and requires the greedy ids to equal transformers' and the
max abs logit error to be <= 1e-3. Needs only numpy. Exit 1 on any mismatch.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

TOLERANCE = 1e-3


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    bundle = "--bundle" in sys.argv
    if len(args) != 2:
        sys.exit(__doc__)
    root, binary = args
    ok = True
    with tempfile.TemporaryDirectory() as scratch:
        for name in sorted(os.listdir(root)):
            model = os.path.join(root, name)
            oracle = json.load(open(os.path.join(model, "oracle.json")))
            reference = np.load(os.path.join(model, "logits.npy"))
            target = model
            if bundle:
                target = os.path.join(scratch, name + ".bundle")
                subprocess.run([binary, "convert", model, "--out", target, "--precision", "fp32",
                                "--context", "64", "--prefill-len", "8"], check=True,
                               capture_output=True)
            logits_path = os.path.join(scratch, name + ".npy")
            command = [binary, "generate", target,
                       "--prompt-ids", ",".join(map(str, oracle["prompt_ids"])),
                       "--max-tokens", str(len(oracle["greedy_ids"])), "--temperature", "0",
                       "--json", "--dump-logits", logits_path]
            if bundle:
                command += ["--precision", "fp32"]
            run = subprocess.run(command, capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{name}: anemone failed: {run.stderr[-500:]}")
                ok = False
                continue
            report = json.loads(run.stdout.strip().splitlines()[-1])
            ours = np.load(logits_path)
            if ours.shape != reference.shape:
                print(f"{name}: logits shape {ours.shape}, transformers {reference.shape}")
                ok = False
                continue
            diff = np.abs(ours - reference)
            step, token = np.unravel_index(diff.argmax(), diff.shape)
            same = report["generated_ids"] == oracle["greedy_ids"]
            print(f"{name:28s} ids_equal={same} max_abs_logit_err={diff.max():.2e} "
                  f"(step {step}, token {token})")
            ok &= same and diff.max() <= TOLERANCE
    print("ALL OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
