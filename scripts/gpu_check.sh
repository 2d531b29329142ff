#!/usr/bin/env bash
# GPU checks in one go (for the device machine): CUDA kernels against the CPU
# backend, the tiny model trained on CUDA vs CPU, and a first throughput figure
# on the qwen3-0.6b shape. Logs go to $OUT (default /tmp/gpu_check).
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
B=${BUILD:-build}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== CUDA kernels vs CPU"
timeout 300 "$B/tests/test_backend_cuda" >"$OUT/cuda_tests.log" 2>&1
grep -E "^(FAIL|     |#summary)" "$OUT/cuda_tests.log" | head -40

echo "== tiny model: 8 steps on CPU and on CUDA"
W=/tmp/gc; rm -rf $W; mkdir -p $W
"$B/ctune" init --config configs/models/tiny/config.json --out $W/tiny --seed 0 >/dev/null
for dev in cpu cuda; do
    "$B/ctune" train configs/tiny.yaml --set model=$W/tiny --set output_dir=$W/run-$dev --set device=$dev \
        --set training.max_steps=8 --set training.warmup_steps=2 --set training.logging_steps=1 \
        --set training.eval_steps=8 --set training.resume_from_checkpoint=false >"$OUT/tiny-$dev.log" 2>&1
    echo "$dev rc=$?"
done
paste <(grep -o '"loss": [0-9.]*' $W/run-cpu/metrics.jsonl) <(grep -o '"loss": [0-9.]*' $W/run-cuda/metrics.jsonl)
tail -n 3 "$OUT/tiny-cuda.log"

if [ "${SKIP_BENCH:-0}" = 0 ]; then
    echo "== qwen3-0.6b shape, 16k tokens/step"
    "$B/ctune" init --config configs/models/qwen3-0.6b/config.json --out models/qwen3-0.6b --seed 0 >/dev/null
    python3 scripts/make_bench_data.py --vocab 151936 --tokens 1200000 --out $W/bench.jsonl
    "$B/ctune" prepare --in $W/bench.jsonl --out data/bench-qwen3 --vocab-size 151936 >/dev/null
    timeout 300 "$B/ctune" train configs/qwen3-0.6b.yaml --set training.max_steps=15 --set output_dir=$W/q3 \
        >"$OUT/qwen3.log" 2>&1
    echo "rc=$?"; tail -n 6 "$OUT/qwen3.log"
fi
