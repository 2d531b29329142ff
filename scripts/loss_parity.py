#!/usr/bin/env python3
"""loss_parity.py — two ctune runs of the same batches held against each other,
step by step: the relative difference of the logged losses (one record per
step, logging_steps 1), its maximum over the steps, and a verdict against a
bound. Used for a quantized base against the bf16 run it approximates
(scripts/gpu_check.sh, section fp8), where HF has no counterpart to replay.

    python3 scripts/loss_parity.py REF/metrics.jsonl RUN/metrics.jsonl --tol 2e-2 [--steps 50]
    python3 scripts/loss_parity.py REF/metrics.jsonl RUN/metrics.jsonl --tol 1e-2 --eval

With --eval the last evaluation of the two runs is compared instead (the
held-out loss at the end of training, for a run long enough to learn).
Prints one line per 10 steps and `PASS ...` or `FAIL ...` last; exits 0 on
PASS, 1 on FAIL, 2 when the files do not hold the steps asked for."""
import argparse
import json
import math
import sys


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r and "step" in r and "eval_loss" not in r:
                out[int(r["step"])] = float(r["loss"])
    return out


def last_eval(path):
    last = None
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "eval_loss" in r:
                last = (int(r["step"]), float(r["eval_loss"]))
    return last


def compare_eval(a):
    ref, run = last_eval(a.ref), last_eval(a.run)
    if ref is None or run is None or ref[0] != run[0]:
        print(f"loss_parity: no common last evaluation in {a.ref} ({ref}) and {a.run} ({run})", file=sys.stderr)
        return 2
    d = abs(run[1] - ref[1]) / abs(ref[1]) if ref[1] != 0 else math.inf
    verdict = "PASS" if d <= a.tol else "FAIL"  # a NaN fails
    print(f"{verdict} eval loss at step {ref[0]}: ref {ref[1]:.5f}  run {run[1]:.5f}  rel {d:.2e} (bound {a.tol:g})")
    return 0 if verdict == "PASS" else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("--tol", type=float, required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--eval", action="store_true", help="compare the last eval_loss instead")
    a = ap.parse_args()
    if a.eval:
        return compare_eval(a)
    ref, run = losses(a.ref), losses(a.run)
    steps = list(range(1, a.steps + 1))
    missing = [s for s in steps if s not in ref or s not in run]
    if missing:
        print(f"loss_parity: step {missing[0]} missing from {a.ref if missing[0] not in ref else a.run}", file=sys.stderr)
        return 2
    worst, at = 0.0, 1
    for s in steps:
        d = abs(run[s] - ref[s]) / abs(ref[s]) if ref[s] != 0 else math.inf
        if not d <= worst:  # NaN-proof: a NaN difference is the worst
            worst, at = d, s
        if s % 10 == 0:
            print(f"step {s:3d}  ref {ref[s]:.6f}  run {run[s]:.6f}  rel {d:.2e}")
    verdict = "PASS" if worst <= a.tol else "FAIL"
    print(f"{verdict} loss parity: max relative difference {worst:.3e} at step {at} (bound {a.tol:g}, {a.steps} steps)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
