#!/usr/bin/env bash
# Memory benchmark (issue: checkpointing, offload, memory plan, long context), on
# the GPU machine. Part 1, the llama3.1-8b shape at 16k and 64k tokens per
# micro-batch: step time and peak VRAM with no checkpointing, checkpointing,
# offload with one staging buffer and with two. Part 2, long context: the
# memory plan (--dry-run) of one 524288-token sequence on the full-depth 8B and
# qwen3-0.6b shapes, and the largest micro-batch each plan accepts; then one
# measured optimizer step on one 524288-token sequence with the 8B shape cut to
# LAYERS layers (a full-depth step costs ~3e17 attention FLOPs: tens of minutes).
# Part 3 (fulldepth): one optimizer step of 524288 tokens per micro-batch on the
# full 32-layer 8B shape, packed from the bench shards' documents (up to 4096
# tokens each). Activations, offload and chunking take the same memory as for one
# 524288-token sequence (attention keeps O(T) state: q, k, v, out, lse); only
# the attention FLOPs differ, which is what makes this step minutes, not an hour.
# Part 4 (qlora70b, not in the default PARTS): the llama3.1-70b shape at full depth
# in 4 bits: `ctune init --quantize nf4` writes the folder (37 GB) to MODELS_70B
# (default /tmp: host memory stays free for the offloaded inputs), STEPS steps at
# 16k tokens per step, the plan of one 131072-token sequence, and one measured
# optimizer step on it. About 10 minutes on the H200 machine.
#   STEPS=6 WARMUP=2 LAYERS=2 PARTS="modes long fulldepth" bash scripts/bench_memory.sh
# Writes $OUT/memory.jsonl and prints a table. Peak VRAM: the most nvidia-smi
# reported in use while the run ran (100 ms samples; includes the CUDA context).
set -u
OUT=${OUT:-runs/bench-memory}
B=${BUILD:-build}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
LAYERS=${LAYERS:-2}
PARTS=${PARTS:-"modes long fulldepth"}
LONG=524288
mkdir -p "$OUT"
: >"$OUT/memory.jsonl"
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
peak_start() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$OUT/mem.log" 2>/dev/null & MEMPID=$!; }
peak_stop() { kill $MEMPID 2>/dev/null; wait $MEMPID 2>/dev/null; sort -n "$OUT/mem.log" | tail -n 1 | awk '{printf "%.2f", $1/1024}'; }

model=models/llama3.1-8b
[ -f "$model/config.json" ] || "$B/ctune" init --config configs/models/llama3.1-8b/config.json --out "$model" --seed 0 >/dev/null
data=data/bench-llama3.1-8b
if [ ! -f "$data/train.shard" ]; then
    python3 scripts/make_bench_data.py --vocab 128256 --tokens $((65536 * (STEPS + 4))) --out "$OUT/llama.jsonl"
    "$B/ctune" prepare --in "$OUT/llama.jsonl" --out "$data" --vocab-size 128256 >/dev/null
fi

# record NAME RUN_DIR LOG RC PEAK WARMUP EXTRA_JSON
record() {
    python3 scripts/run_record.py "$2" "$3" "$4" "$6" "$5" \
        "$(python3 -c 'import json, sys; print(json.dumps({"run": sys.argv[1], **json.loads(sys.argv[2])}))' "$1" "$7")" \
        >>"$OUT/memory.jsonl"
}

if has modes; then
    for tpmb in 16384 65536; do
        for mode in nockpt ckpt offload1 offload2; do
            args="--set memory.gradient_checkpointing=true --set memory.activation_offload=off"
            case $mode in
                nockpt) args="--set memory.gradient_checkpointing=false --set memory.activation_offload=off" ;;
                offload1) args="--set memory.activation_offload=on --set memory.offload_buffers=1" ;;
                offload2) args="--set memory.activation_offload=on --set memory.offload_buffers=2" ;;
            esac
            run=$OUT/llama-$tpmb-$mode
            rm -rf "$run"
            peak_start
            "$B/ctune" train configs/llama3.1-8b.yaml --set model="$model" --set output_dir="$run" \
                --set "data.train_files=[$data/train.shard]" --set "data.eval_files=[]" \
                --set data.tokens_per_micro_batch=$tpmb --set training.max_steps="$STEPS" \
                --set training.warmup_steps=1 --set training.logging_steps=1 --set training.save_steps=0 \
                --set training.eval_steps=0 $args >"$run.log" 2>&1
            rc=$?
            record "llama3.1-8b $tpmb $mode" "$run" "$run.log" $rc "$(peak_stop)" "$WARMUP" \
                "{\"tokens_per_micro_batch\": $tpmb, \"mode\": \"$mode\"}"
        done
    done
fi

if has long; then
    # one document of LONG tokens, for each vocabulary
    for v in 128256 151936; do
        d=data/bench-long-$v
        [ -f "$d/train.shard" ] || {
            python3 -c "import json,random; r=random.Random(3); print(json.dumps({'input_ids': [r.randrange($v) for _ in range($LONG)]}))" >"$OUT/long-$v.jsonl"
            "$B/ctune" prepare --in "$OUT/long-$v.jsonl" --out "$d" --vocab-size $v --eval-fraction 0 >/dev/null; }
    done
    for shape in llama3.1-8b qwen3-0.6b; do
        m=models/$shape v=128256 cfg=configs/llama3.1-8b.yaml
        [ $shape = qwen3-0.6b ] && v=151936 cfg=configs/qwen3-0.6b.yaml
        [ -f "$m/config.json" ] || "$B/ctune" init --config configs/models/$shape/config.json --out "$m" --seed 0 >/dev/null
        common="--set model=$m --set data.train_files=[data/bench-long-$v/train.shard] --set data.eval_files=[]
                --set data.max_length=$LONG --set training.max_steps=1 --set training.warmup_steps=1"
        "$B/ctune" train $cfg $common --set data.tokens_per_micro_batch=$LONG --set output_dir=$OUT/dry \
            --dry-run >"$OUT/plan-$shape-$LONG.log" 2>&1
        rc=$?
        # the largest micro-batch the plan accepts: ask for far more and read the refusal
        "$B/ctune" train $cfg $common --set data.tokens_per_micro_batch=$((LONG * 64)) --set output_dir=$OUT/dry \
            --dry-run >"$OUT/plan-$shape-max.log" 2>&1
        max=$(grep -o 'tokens_per_micro_batch that fits is [0-9]*' "$OUT/plan-$shape-max.log" | grep -o '[0-9]*$')
        total=$(grep -o 'total on the device *[0-9.]* GiB' "$OUT/plan-$shape-$LONG.log" | grep -o '[0-9.]* GiB')
        off=$(grep -o 'inputs of layers 0-[0-9]*' "$OUT/plan-$shape-$LONG.log" | grep -o '[0-9]*$')
        echo "{\"run\": \"plan $shape $LONG\", \"rc\": $rc, \"plan_device\": \"$total\", \"offloaded_up_to_layer\": \"${off:-none}\", \"max_tokens_per_micro_batch\": ${max:-null}}" >>"$OUT/memory.jsonl"
    done
    # one measured step: the 8B shape cut to LAYERS layers, one LONG-token sequence, offload on
    cut=models/llama3.1-8b-${LAYERS}l
    if [ ! -f "$cut/config.json" ]; then
        mkdir -p "$OUT/cutcfg"
        python3 -c "import json; c=json.load(open('configs/models/llama3.1-8b/config.json')); c['num_hidden_layers']=$LAYERS; json.dump(c, open('$OUT/cutcfg/config.json','w'))"
        "$B/ctune" init --config "$OUT/cutcfg/config.json" --out "$cut" --seed 0 >/dev/null
    fi
    run=$OUT/long-8b-${LAYERS}l
    rm -rf "$run"
    peak_start
    t0=$(date +%s)
    "$B/ctune" train configs/llama3.1-8b.yaml --set model=$cut --set output_dir=$run \
        --set "data.train_files=[data/bench-long-128256/train.shard]" --set "data.eval_files=[]" \
        --set data.max_length=$LONG --set data.tokens_per_micro_batch=$LONG --set training.max_steps=1 \
        --set training.warmup_steps=1 --set training.save_steps=0 --set training.eval_steps=0 \
        --set memory.activation_offload=on >"$run.log" 2>&1
    rc=$?
    record "llama3.1-8b ${LAYERS} layers, one $LONG-token sequence, offload on" "$run" "$run.log" $rc "$(peak_stop)" 0 \
        "{\"wall_s\": $(( $(date +%s) - t0 ))}"
fi

if has fulldepth; then
    run=$OUT/fulldepth-8b-$LONG
    rm -rf "$run"
    peak_start
    t0=$(date +%s)
    "$B/ctune" train configs/llama3.1-8b.yaml --set model=$model --set output_dir=$run \
        --set "data.train_files=[$data/train.shard]" --set "data.eval_files=[]" \
        --set data.tokens_per_micro_batch=$LONG --set training.max_steps=1 \
        --set training.warmup_steps=1 --set training.save_steps=0 --set training.eval_steps=0 >"$run.log" 2>&1
    rc=$?
    record "llama3.1-8b 32 layers, $LONG tokens of documents, offload auto" "$run" "$run.log" $rc "$(peak_stop)" 0 \
        "{\"wall_s\": $(( $(date +%s) - t0 ))}"
    grep -A9 "memory plan" "$run.log"
fi

if has qlora70b; then
    m70=${MODELS_70B:-/tmp}/llama3.1-70b-nf4 L70=131072
    if [ ! -f "$m70/config.json" ]; then
        t0=$(date +%s)
        "$B/ctune" init --config configs/models/llama3.1-70b/config.json --out "$m70" --seed 0 --quantize nf4 \
            >"$OUT/init-70b.log" 2>&1 || { echo "bench_memory: init of $m70 failed (see $OUT/init-70b.log)"; exit 1; }
        echo "{\"run\": \"llama3.1-70b ctune init --quantize nf4\", \"wall_s\": $(( $(date +%s) - t0 ))}" >>"$OUT/memory.jsonl"
    fi
    d=data/bench-long-128256-$L70
    [ -f "$d/train.shard" ] || {
        python3 -c "import json,random; r=random.Random(3); [print(json.dumps({'input_ids': [r.randrange(128256) for _ in range($L70)]})) for _ in range(2)]" >"$OUT/long70.jsonl"
        "$B/ctune" prepare --in "$OUT/long70.jsonl" --out "$d" --vocab-size 128256 --eval-fraction 0 >/dev/null; }
    run=$OUT/llama70b-nf4-16k
    rm -rf "$run"
    peak_start
    "$B/ctune" train configs/llama3.1-8b.yaml --set model="$m70" --set output_dir="$run" \
        --set "data.train_files=[$data/train.shard]" --set "data.eval_files=[]" --set training.max_steps="$STEPS" \
        --set training.warmup_steps=1 --set training.logging_steps=1 --set training.save_steps=0 \
        --set training.eval_steps=0 >"$run.log" 2>&1
    rc=$?
    record "llama3.1-70b nf4, 16384 tokens per step" "$run" "$run.log" $rc "$(peak_stop)" "$WARMUP" "{}"
    common="--set model=$m70 --set data.train_files=[$d/train.shard] --set data.eval_files=[]
            --set data.max_length=$L70 --set data.tokens_per_micro_batch=$L70 --set training.max_steps=1
            --set training.warmup_steps=0 --set training.logging_steps=1 --set training.save_steps=0 --set training.eval_steps=0"
    "$B/ctune" train configs/llama3.1-8b.yaml $common --set output_dir=$OUT/dry --dry-run >"$OUT/plan-70b-$L70.log" 2>&1
    echo "{\"run\": \"plan llama3.1-70b nf4 $L70\", \"rc\": $?}" >>"$OUT/memory.jsonl"
    grep -A9 "memory plan" "$OUT/plan-70b-$L70.log"
    run=$OUT/llama70b-nf4-$L70
    rm -rf "$run"
    peak_start
    t0=$(date +%s)
    "$B/ctune" train configs/llama3.1-8b.yaml $common --set output_dir=$run >"$run.log" 2>&1
    rc=$?
    record "llama3.1-70b nf4, one $L70-token sequence" "$run" "$run.log" $rc "$(peak_stop)" 0 \
        "{\"wall_s\": $(( $(date +%s) - t0 ))}"
fi

python3 - "$OUT/memory.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    name = r.pop("run")
    t = r.get("tokens_per_s")
    step = f"{r['tokens_per_micro_batch'] / t:.2f} s/step" if t and r.get("tokens_per_micro_batch") else ""
    print(f"{name:<58} " + " ".join(f"{k}={v}" for k, v in r.items() if v is not None and k != "warmup") + " " + step)
PY
# a wrong first step must not hide in the warm-up that the timing drops (run_record.py)
first_step_failed() { grep -q '"first_step_ok": false' "$OUT/memory.jsonl" && echo "bench: FAIL: a run's first step disagrees with the steps after it (its error above)"; }
first_step_failed && exit 1
exit 0
