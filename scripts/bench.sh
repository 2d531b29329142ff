#!/usr/bin/env bash
# make bench: ctune vs HF transformers + PEFT on the same random-weight model
# and the same shards (the protocol in BENCHMARKS.md), on the GPU machine. For each shape:
# ctune (median tokens/s over the steps after warm-up, from metrics.jsonl) and
# the HF baselines; peak VRAM is the most the GPU reported in use while each ran
# (nvidia-smi, sampled every 100 ms; includes the CUDA context).
#   SHAPES="qwen3-0.6b llama3.1-8b" STEPS=30 WARMUP=5 bash scripts/bench.sh
# Writes $OUT/bench.jsonl (one line per run) and prints a table; then the dense
# LoRA microbenchmark (bench/lora_bench).
set -u
OUT=${OUT:-runs/bench}
B=${BUILD:-build}
SHAPES=${SHAPES:-qwen3-0.6b}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-5}
HF_MODES=${HF_MODES-"packed packed-ckpt"}  # set empty for none
GPU_MEMORY_LIMIT=${GPU_MEMORY_LIMIT:-}      # GiB: ctune's runs plan under memory.gpu_memory_limit (empty: none)
CTUNE_MODES=${CTUNE_MODES-"ckpt nockpt"} # any of ckpt, nockpt, ckpt-auto (checkpoint_layers auto), ckpt-nf4 (QLoRA:
                                         # model_quantization nf4, double quant, quantized on load;
                                         # also nockpt-nf4 and ckpt-auto-nf4), ckpt-fp8 / nockpt-fp8
                                         # (base_precision fp8, quantized on load),
                                         # ckpt-stored-nf4 / ckpt-mxfp4 (a folder ctune init --quantize wrote:
                                         # models/SHAPE-nf4, models/SHAPE-mxfp4 for gpt_oss's experts)
mkdir -p "$OUT"
: >"$OUT/bench.jsonl"

peak_start() {
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$OUT/mem.log" 2>/dev/null & MEMPID=$!
    # SM clock and board power while the GPU is busy: whether a step runs at the clock the kernels were timed at
    nvidia-smi --query-gpu=utilization.gpu,clocks.sm,power.draw --format=csv,noheader,nounits -lms 200 \
        >"$OUT/clocks.log" 2>/dev/null & CLKPID=$!
}
peak_stop() {
    kill $MEMPID $CLKPID 2>/dev/null; wait $MEMPID $CLKPID 2>/dev/null
    sort -n "$OUT/mem.log" | tail -n 1 | awk '{printf "%.2f", $1/1024}'
}
# {"sm_mhz_busy": median SM clock, "power_w_busy": median power} over the samples at >= 90% utilization
clocks_json() {
    python3 - "$OUT/clocks.log" <<'PY'
import json, statistics, sys
busy = []
for line in open(sys.argv[1]):
    try:
        util, mhz, watts = (float(v) for v in line.split(","))
    except ValueError:
        continue
    if util >= 90:
        busy.append((mhz, watts))
print(json.dumps({"sm_mhz_busy": statistics.median(m for m, _ in busy) if busy else None,
                  "power_w_busy": statistics.median(w for _, w in busy) if busy else None}))
PY
}

for shape in $SHAPES; do
    model=models/$shape
    vocab=$(python3 -c "import json; print(json.load(open('configs/models/$shape/config.json'))['vocab_size'])")
    [ -f "$model/config.json" ] || "$B/ctune" init --config "configs/models/$shape/config.json" --out "$model" --seed 0 >/dev/null
    data=data/bench-$shape
    if [ ! -f "$data/train.shard" ]; then
        python3 scripts/make_bench_data.py --vocab "$vocab" --tokens $((16384 * (STEPS + 10))) --out "$OUT/$shape.jsonl"
        "$B/ctune" prepare --in "$OUT/$shape.jsonl" --out "$data" --vocab-size "$vocab" >/dev/null
    fi
    gflop=$(python3 scripts/flops.py "configs/models/$shape/config.json" "$data/train.shard")
    for cmode in $CTUNE_MODES; do
    ck=true cl=all q=none; [ "$cmode" = nockpt ] && ck=false; [ "$cmode" = ckpt-auto ] && cl=auto
    bp=auto
    case $cmode in ckpt-nf4 | nockpt-nf4 | ckpt-auto-nf4) q=nf4 ;; ckpt-fp8 | nockpt-fp8) bp=fp8 ;; esac
    case $cmode in nockpt*) ck=false ;; ckpt-auto*) cl=auto ;; esac
    m=$model
    case $cmode in
        ckpt-stored-nf4 | ckpt-mxfp4)
            fmt=${cmode#ckpt-}; fmt=${fmt#stored-}; m=$model-$fmt
            [ -f "$m/config.json" ] || "$B/ctune" init --config "configs/models/$shape/config.json" --out "$m" --seed 0 \
                --quantize "$fmt" >/dev/null ;;
    esac
    run=$OUT/ctune-$shape-$cmode
    rm -rf "$run"
    peak_start
    "$B/ctune" train configs/qwen3-0.6b.yaml --set model="$m" --set output_dir="$run" \
        --set "data.train_files=[$data/train.shard]" --set training.max_steps="$STEPS" \
        --set memory.gradient_checkpointing=$ck --set memory.checkpoint_layers=$cl --set model_quantization=$q \
        --set base_precision=$bp ${GPU_MEMORY_LIMIT:+--set memory.gpu_memory_limit=$GPU_MEMORY_LIMIT} \
        --set training.warmup_steps=2 --set training.logging_steps=1 >"$run.log" 2>&1
    rc=$?
    peak=$(peak_stop)
    clocks=$(clocks_json 2>/dev/null)
    [ -n "$clocks" ] || clocks='{"sm_mhz_busy": null, "power_w_busy": null}'
    python3 scripts/run_record.py "$run" "$run.log" "$rc" "$WARMUP" "$peak" \
        "{\"shape\": \"$shape\", \"system\": \"ctune $cmode\", \"gflop_per_token\": $gflop, ${clocks:1:-1}}" \
        >>"$OUT/bench.jsonl"
    done
    for mode in $HF_MODES; do
        args="--mode ${mode%-ckpt}"
        [ "${mode%-ckpt}" != "$mode" ] && args="$args --checkpointing"
        peak_start
        timeout 900 python3 scripts/hf_bench.py --model "$model" --shards "$data/train.shard" --steps "$STEPS" \
            --warmup "$WARMUP" $args >"$OUT/hf-$shape-$mode.log" 2>&1
        rc=$?
        peak=$(peak_stop)
        line=$(grep '^{' "$OUT/hf-$shape-$mode.log" | tail -n 1)
        [ -n "$line" ] || line="{\"system\": \"hf+peft $mode\", \"rc\": $rc, \"error\": \"$(tail -n 1 "$OUT/hf-$shape-$mode.log" | tr -d '"\\' | cut -c1-120)\"}"
        python3 -c "import json,sys; d=json.loads(sys.argv[1]); d.update(shape=sys.argv[2], peak_gib_smi=float(sys.argv[3] or 0), gflop_per_token=float(sys.argv[4])); print(json.dumps(d))" \
            "$line" "$shape" "$peak" "$gflop" >>"$OUT/bench.jsonl"
    done
done
python3 - "$OUT/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = {r["shape"]: r.get("tokens_per_s") for r in rows if r["system"] == "hf+peft packed sdpa"}
print(f"{'shape':<14} {'system':<26} {'tok/s':>9} {'MFU':>6} {'peak GiB':>9} {'syncs/step':>10} {'vs HF packed':>12}"
      f" {'busy MHz':>8} {'busy W':>6}")
for r in rows:
    t = r.get("tokens_per_s")
    mfu = f"{100 * r['gflop_per_token'] * t / 790e3:.1f}%" if t and r.get("gflop_per_token") else "-"
    ratio = f"{t / base[r['shape']]:.2f}x" if t and base.get(r["shape"]) else "-"
    err = "" if t else " " + str(r.get("error", "failed"))[:60]
    print(f"{r['shape']:<14} {r['system']:<26} {str(t):>9} {mfu:>6} {r.get('peak_gib_smi', 0):>9} "
          f"{str(r.get('host_syncs_per_step', '')):>10} {ratio:>12} {str(r.get('sm_mhz_busy') or '-'):>8}"
          f" {str(r.get('power_w_busy') or '-'):>6}{err}")
PY
echo "== dense LoRA of modules sharing an input: one at a time vs stacked (T=16384)"
if [ -x "$B/bench/lora_bench" ]; then "$B/bench/lora_bench" 10; else echo "skipped: $B/bench/lora_bench not built (make bench)"; fi
# a wrong first step must not hide in the warm-up that the timing drops (run_record.py)
first_step_failed() { grep -q '"first_step_ok": false' "$OUT/bench.jsonl" && echo "bench: FAIL: a run's first step disagrees with the steps after it (its error above)"; }
first_step_failed && exit 1
exit 0
