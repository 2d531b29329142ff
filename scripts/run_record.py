#!/usr/bin/env python3
"""run_record.py — one JSON line for a ctune training run, as the benchmark scripts
(bench.sh, bench_moe.sh, bench_memory.sh) append them to their .jsonl files.

    python3 scripts/run_record.py RUN_DIR LOG RC WARMUP PEAK_GIB [EXTRA_JSON]

tokens_per_s is the median over the logged steps after WARMUP (BENCHMARKS.md's
protocol; RUN_DIR/metrics.jsonl), host_syncs_per_step is what the run's log
reports, error is the log's last "ctune..." line when RC is not 0, and the fields
of EXTRA_JSON (shape, system, ...) lead the line.

The first step is checked too, since the timing drops it: its loss must agree
with the next logged steps' median within 2% and its grad norm must be non-zero
and within 2x of step 2's (a few small LoRA steps barely move either; a first
step that ran on wrong data once gave ln(vocab) and a grad norm of 0). A run
that fails it gets first_step_ok false and an error, and the line is printed
to stderr too; the benchmark scripts exit non-zero on it.
"""
import json
import re
import statistics
import sys


def first_step_problem(rows):
    """None if step 1 agrees with the steps after it (or too few were logged)."""
    by_step = {r["step"]: r for r in rows}
    later = [by_step[s]["loss"] for s in sorted(by_step) if 2 <= s <= 6]
    if 1 not in by_step or 2 not in by_step or not later:
        return None
    first, second = by_step[1], by_step[2]
    ref = statistics.median(later)
    g1, g2 = first.get("grad_norm", 0.0), second.get("grad_norm", 0.0)
    loss_ok = abs(first["loss"] - ref) <= 0.02 * abs(ref)
    gnorm_ok = g1 > 0 and g2 > 0 and 0.5 <= g1 / g2 <= 2.0
    if loss_ok and gnorm_ok:
        return None
    return (f"first step disagrees with the next ones: loss {first['loss']:.4f} vs median {ref:.4f} of steps 2.., "
            f"grad norm {g1:.4g} vs {g2:.4g} at step 2 (a wrong first step: run scripts/first_step_check.sh)")


def main():
    if len(sys.argv) not in (6, 7):
        sys.exit("usage: python3 scripts/run_record.py RUN_DIR LOG RC WARMUP PEAK_GIB [EXTRA_JSON]")
    run, log, rc, warmup, peak = sys.argv[1:6]
    extra = json.loads(sys.argv[6]) if len(sys.argv) == 7 else {}
    try:
        rows = [json.loads(line) for line in open(run + "/metrics.jsonl") if '"loss"' in line]
    except OSError:
        rows = []
    tps = [r["tokens_per_second"] for r in rows if r["step"] > int(warmup)]
    try:
        text = open(log).read()
    except OSError:
        text = ""
    syncs = re.findall(r"host syncs per step: ([0-9.]+)", text)
    err = [line for line in text.splitlines() if line.startswith("ctune")][-1:] if rc != "0" else []
    problem = first_step_problem(rows)
    if problem:
        print(f"run_record: {run}: FAIL {problem}", file=sys.stderr)
    d = dict(extra)
    d.update({"rc": int(rc), "tokens_per_s": round(statistics.median(tps), 1) if tps else None,
              "steps_timed": len(tps), "warmup": int(warmup), "peak_gib_smi": float(peak or 0),
              "host_syncs_per_step": float(syncs[0]) if syncs else None, "error": err[0][:200] if err else problem,
              "first_step_ok": problem is None})
    print(json.dumps(d))


if __name__ == "__main__":
    main()
