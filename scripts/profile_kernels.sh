#!/usr/bin/env bash
# Where a training step's GPU time goes, by kernel (Nsight Compute durations;
# ncu serialises kernels, so this is GPU time per kernel, not wall time).
#   bash scripts/profile_kernels.sh CONFIG [SKIP] [COUNT] [--set k=v ...]
# Skips the first SKIP launches (warm-up) and times the next COUNT; prints the
# kernels by total time. Needs ncu (Nsight Compute) and a GPU.
set -u
cfg=$1; skip=${2:-6000}; count=${3:-5000}; shift 3
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip "$skip" --launch-count "$count" \
    build/ctune train "$cfg" --set output_dir=/tmp/prof-run --set training.resume_from_checkpoint=false "$@" \
    >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("no ncu rows")
head = rows[0]
ki, vi, ui = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
tot, cnt = collections.Counter(), collections.Counter()
for r in rows[1:]:
    try:
        v = float(r[vi].replace(",", ""))
    except ValueError:
        continue
    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(r[ui], 1e-6)
    name = r[ki].split("(")[0][:70]
    tot[name] += v * scale
    cnt[name] += 1
all_ms = sum(tot.values())
print(f"{len(rows) - 1} kernels, {all_ms:.1f} ms of GPU time")
for name, ms in tot.most_common(25):
    print(f"{ms:9.2f} ms {100 * ms / all_ms:5.1f}% {cnt[name]:6d}x  {name}")
PY
