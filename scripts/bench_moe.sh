#!/usr/bin/env bash
# MoE benchmark (the protocol in BENCHMARKS.md) on the GPU machine: ctune vs HF transformers +
# PEFT training the same adapter (ctune's initial adapter, experts included) on
# the same shards, for the qwen3-30b-a3b and gpt-oss-20b shapes cut to fewer
# layers (SPECS "shape:layers"): the full models are 61 and 42 GB of bf16 on a
# 64 GB disk. Every layer of a shape is the same size, so tokens/s over the
# layers scale as 1/layers, apart from the embedding and LM head.
#   SPECS="qwen3-30b-a3b:12 gpt-oss-20b:8" STEPS=12 WARMUP=4 bash scripts/bench_moe.sh
# MODELS (default models/) is where the cut models are written: a full-depth
# qwen3-30b-a3b (57 GiB) does not fit the GPU machine's disk but may fit a
# tmpfs (MODELS=/dev/shm, if it has the room; check `df -h /dev/shm`).
# CTUNE_MODES (default "ckpt"; any of ckpt, nockpt, ckpt-auto) picks ctune's
# activation checkpointing (ckpt-auto: memory.checkpoint_layers auto); a mode with
# "-mxfp4" appended (ckpt-mxfp4, ckpt-auto-mxfp4) trains from a folder whose experts
# `ctune init --quantize mxfp4` stored in MXFP4, as gpt-oss ships; HF=0 skips
# the HF runs. LORA_TARGETS (e.g. "q_proj,k_proj,v_proj,o_proj") overrides the
# config's lora.target_modules for ctune's runs (and labels them). HF trains packed via position_ids with sdpa and no checkpointing
# (its fastest setting that fits); gpt_oss has only eager
# attention in transformers 5.17, whose packed row would keep a T x T probability
# matrix per head and layer for backward (64 heads x 16384^2 x 2 bytes = 34 GB a
# layer), so there HF runs padded batches of PADDED_BATCH (2) rows, checkpointed.
# Writes $OUT/moe.jsonl and prints a table; then (unless MICRO=0) the per-layer
# breakdown (bench/moe_layer_bench) and the grouped GEMM microbenchmark
# (bench/moe_gemm_bench).
set -u
OUT=${OUT:-runs/bench-moe}
B=${BUILD:-build}
SPECS=${SPECS:-"qwen3-30b-a3b:12 gpt-oss-20b:8"}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-4}
TPMB=${TPMB:-16384}
CTUNE_MODES=${CTUNE_MODES:-ckpt}
HF=${HF:-1}
PADDED_BATCH=${PADDED_BATCH:-2}
MODELS=${MODELS:-models}
LORA_TARGETS=${LORA_TARGETS:-}
MICRO=${MICRO:-1}
mkdir -p "$OUT"
: >"$OUT/moe.jsonl"
peak_start() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$OUT/mem.log" 2>/dev/null & MEMPID=$!; }
peak_stop() { kill $MEMPID 2>/dev/null; wait $MEMPID 2>/dev/null; sort -n "$OUT/mem.log" | tail -n 1 | awk '{printf "%.2f", $1/1024}'; }

for spec in $SPECS; do
    shape=${spec%:*} layers=${spec#*:}
    vocab=$(python3 -c "import json; print(json.load(open('configs/models/$shape/config.json'))['vocab_size'])")
    model=$MODELS/$shape-${layers}l
    if [ ! -f "$model/config.json" ]; then
        mkdir -p "$OUT/cfg-$shape"
        python3 - "$shape" "$layers" "$OUT/cfg-$shape/config.json" <<'PY'
import json, sys
shape, layers, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = json.load(open(f"configs/models/{shape}/config.json"))
c["num_hidden_layers"] = layers
if "layer_types" in c:
    c["layer_types"] = c["layer_types"][:layers]
json.dump(c, open(out, "w"), indent=1)
PY
        "$B/ctune" init --config "$OUT/cfg-$shape/config.json" --out "$model" --seed 0 >/dev/null
    fi
    data=data/bench-moe-$vocab
    if [ ! -f "$data/train.shard" ]; then
        python3 scripts/make_bench_data.py --vocab "$vocab" --tokens $((TPMB * (STEPS + 6))) --out "$OUT/data-$vocab.jsonl"
        "$B/ctune" prepare --in "$OUT/data-$vocab.jsonl" --out "$data" --vocab-size "$vocab" >/dev/null
    fi
    for cmode in $CTUNE_MODES; do
    base=${cmode%-mxfp4} m=$model
    ck=true cl=all; [ "$base" = nockpt ] && ck=false; [ "$base" = ckpt-auto ] && cl=auto
    if [ "$base" != "$cmode" ]; then
        m=$model-mxfp4
        [ -f "$m/config.json" ] || "$B/ctune" init --config "$model/config.json" --out "$m" --seed 0 \
            --quantize mxfp4 >/dev/null
    fi
    run=$OUT/ctune-$shape-$cmode
    rm -rf "$run" "$OUT/trace-$shape"
    peak_start
    CTUNE_TRACE=$OUT/trace-$shape "$B/ctune" train configs/$shape.yaml --set model="$m" --set output_dir="$run" \
        --set "data.train_files=[$data/train.shard]" --set "data.eval_files=[]" --set data.tokens_per_micro_batch=$TPMB \
        --set training.max_steps="$STEPS" --set training.warmup_steps=2 --set training.logging_steps=1 \
        --set training.save_steps=0 --set training.eval_steps=0 --set memory.gradient_checkpointing=$ck --set memory.checkpoint_layers=$cl \
        ${LORA_TARGETS:+--set "lora.target_modules=[$LORA_TARGETS]"} >"$run.log" 2>&1
    rc=$?
    peak=$(peak_stop)
    python3 scripts/run_record.py "$run" "$run.log" "$rc" "$WARMUP" "$peak" \
        "{\"shape\": \"$shape ($layers layers)\", \"system\": \"ctune $cmode${LORA_TARGETS:+ LoRA $LORA_TARGETS}\"}" >>"$OUT/moe.jsonl"
    done
    [ "$HF" = 1 ] || continue
    hfmode="--mode packed"
    case $shape in gpt-oss*) hfmode="--mode padded --batch $PADDED_BATCH --checkpointing" ;; esac
    peak_start
    timeout 900 python3 scripts/hf_bench.py --model "$model" --shards "$data/train.shard" --steps "$STEPS" \
        --warmup "$WARMUP" $hfmode --tokens-per-step $TPMB --adapter "$OUT/trace-$shape/initial_adapter" \
        >"$OUT/hf-$shape.log" 2>&1
    rc=$?
    peak=$(peak_stop)
    line=$(grep '^{' "$OUT/hf-$shape.log" | tail -n 1)
    [ -n "$line" ] || line="{\"system\": \"hf+peft\", \"rc\": $rc, \"error\": \"$(tail -n 1 "$OUT/hf-$shape.log" | tr -d '"\\' | cut -c1-160)\"}"
    python3 -c "import json,sys; d=json.loads(sys.argv[1]); d.update(shape=sys.argv[2], peak_gib_smi=float(sys.argv[3] or 0)); print(json.dumps(d))" \
        "$line" "$shape ($layers layers)" "$peak" >>"$OUT/moe.jsonl"
done
python3 - "$OUT/moe.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
hf = {r["shape"]: r.get("tokens_per_s") for r in rows if r["system"].startswith("hf")}
print(f"{'shape':<26} {'system':<24} {'tok/s':>9} {'peak GiB':>9} {'syncs/step':>10} {'vs HF':>7}")
for r in rows:
    t = r.get("tokens_per_s")
    ratio = f"{t / hf[r['shape']]:.2f}x" if t and hf.get(r["shape"]) else "-"
    err = "" if t else " " + str(r.get("error", "failed"))[:70]
    print(f"{r['shape']:<26} {r['system']:<24} {str(t):>9} {r.get('peak_gib_smi', 0):>9} "
          f"{str(r.get('host_syncs_per_step', '') or ''):>10} {ratio:>7}{err}")
PY
# a wrong first step must not hide in the warm-up that the timing drops (run_record.py)
first_step_failed() { grep -q '"first_step_ok": false' "$OUT/moe.jsonl" && echo "bench: FAIL: a run's first step disagrees with the steps after it (its error above)"; }
first_step_failed && exit 1
[ "$MICRO" = 1 ] || exit 0
echo "== one MoE layer (T=16384): where the time goes"
"$B/bench/moe_layer_bench" 10
echo "== grouped GEMM"
"$B/bench/moe_gemm_bench" 10
