#!/usr/bin/env bash
# bench_gdn.sh — ctune on a Gated DeltaNet hybrid cut to a few layers, the setup of
# the GDN benchmark in BENCHMARKS.md: LoRA r16 on q, k, v, o, the MLP, in_proj_qkv,
# in_proj_z and out_proj; 16k tokens per step of the bench length mix
# (scripts/make_bench_data.py); gradient checkpointing on. The HF + PEFT side of the
# same comparison (transformers' torch GDN path, same shape, same targets) is run
# by the peer harness in the same device call.
#   SHAPE=qwen3.5-27b LAYERS=8 STEPS=20 WARMUP=5 MODELS=/dev/shm/ctune-models bash scripts/bench_gdn.sh
# Writes $OUT/bench_gdn.jsonl (run_record.py's line) and prints it.
set -u
OUT=${OUT:-runs/bench-gdn}
B=${BUILD:-build}
SHAPE=${SHAPE:-qwen3.5-27b}
LAYERS=${LAYERS:-8}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-5}
MODELS=${MODELS:-/dev/shm/ctune-models}
mkdir -p "$OUT" "$MODELS"
cfg=$OUT/$SHAPE-$LAYERS.json
python3 - "configs/models/$SHAPE/config.json" "$LAYERS" "$cfg" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); n = int(sys.argv[2])
t = c.get("text_config", c)
t["num_hidden_layers"] = n
t["layer_types"] = t["layer_types"][:n]
json.dump(c, open(sys.argv[3], "w"), indent=1)
PY
model=$MODELS/$SHAPE-$LAYERS
[ -f "$model/config.json" ] || "$B/ctune" init --config "$cfg" --out "$model" --seed 0 >"$OUT/init.log" 2>&1 \
    || { tail -n 3 "$OUT/init.log"; exit 1; }
vocab=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('text_config', c)['vocab_size'])" "$cfg")
data=$MODELS/data-$SHAPE
if [ ! -f "$data/train.shard" ]; then
    python3 scripts/make_bench_data.py --vocab "$vocab" --tokens $((16384 * (STEPS + 10))) --out "$OUT/data.jsonl"
    "$B/ctune" prepare --in "$OUT/data.jsonl" --out "$data" --vocab-size "$vocab" >/dev/null
fi
gflop=$(python3 scripts/flops.py "$cfg" "$data/train.shard")
run=$OUT/ctune-$SHAPE-$LAYERS
rm -rf "$run"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$OUT/mem.log" 2>/dev/null & MEMPID=$!
"$B/ctune" train configs/qwen3-0.6b.yaml --set model="$model" --set output_dir="$run" \
    --set "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,in_proj_qkv,in_proj_z,out_proj]" \
    --set "data.train_files=[$data/train.shard]" --set training.max_steps="$STEPS" \
    --set memory.gradient_checkpointing=true --set training.warmup_steps=2 --set training.logging_steps=1 >"$run.log" 2>&1
rc=$?
kill $MEMPID 2>/dev/null; wait $MEMPID 2>/dev/null
peak=$(sort -n "$OUT/mem.log" | tail -n 1 | awk '{printf "%.2f", $1/1024}')
python3 scripts/run_record.py "$run" "$run.log" "$rc" "$WARMUP" "$peak" \
    "{\"shape\": \"$SHAPE-${LAYERS}l\", \"system\": \"ctune ckpt\", \"gflop_per_token\": $gflop}" | tee -a "$OUT/bench_gdn.jsonl"
python3 - "$OUT/bench_gdn.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
t = r.get("tokens_per_s")
if t: print(f"{r['shape']}: {t:.0f} tokens/s, MFU {100 * r['gflop_per_token'] * t / 790e3:.1f}%, peak {r.get('peak_gib_smi')} GiB")
PY
exit $rc
