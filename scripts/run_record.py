#!/usr/bin/env python3
"""run_record.py — one JSON line for a ctune training run, as the benchmark scripts
(bench.sh, bench_moe.sh, bench_memory.sh) append them to their .jsonl files.

    python3 scripts/run_record.py RUN_DIR LOG RC WARMUP PEAK_GIB [EXTRA_JSON]

tokens_per_s is the median over the logged steps after WARMUP (PERF.md's
protocol; RUN_DIR/metrics.jsonl), host_syncs_per_step is what the run's log
reports, error is the log's last "ctune..." line when RC is not 0, and the fields
of EXTRA_JSON (shape, system, ...) lead the line.
"""
import json
import re
import statistics
import sys


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
    d = dict(extra)
    d.update({"rc": int(rc), "tokens_per_s": round(statistics.median(tps), 1) if tps else None,
              "steps_timed": len(tps), "warmup": int(warmup), "peak_gib_smi": float(peak or 0),
              "host_syncs_per_step": float(syncs[0]) if syncs else None, "error": err[0][:200] if err else None})
    print(json.dumps(d))


if __name__ == "__main__":
    main()
