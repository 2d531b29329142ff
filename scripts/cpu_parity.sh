#!/usr/bin/env bash
# cpu_parity.sh — 50 training steps of the tiny models on ctune's CPU backend
# (fp32), replayed step by step by HF transformers + PEFT in fp32 on the CPU
# (scripts/hf_parity.py train: same weights, same batches, same AdamW and
# schedule). Both sides are fp32, so the bounds are tight: 1e-4 on the first
# step's loss and grad norm, 1e-3 on every step's loss. A control replays HF at
# 1.3x the learning rate and must fail. gpu_check.sh's parity50 does the same for
# the CUDA backend in bf16.
#
#   HF_PYTHON=/path/to/python bash scripts/cpu_parity.sh [NAME...]
#
# NAME: tiny qwen3_moe qwen3_moe_dense mixtral gpt_oss control (default all; ~4
# minutes each on 2 cores). qwen3_moe_dense is tiny-moe with layer 1 dense
# (mlp_only_layers [1]): its dense MLP LoRA is what PEFT left unloaded before
# ctune named it as target_parameters (hf_parity.py now exits 3 on any tensor
# PEFT does not load). Needs build/ctune (BUILD= for another build folder) and torch,
# transformers and peft in HF_PYTHON (default python3). Work files go to
# OUT (default /tmp/ctune-cpu-parity). Prints a line per run, then exits with
# the number of failed checks.
set -u
cd "$(dirname "$0")/.."
PY=${HF_PYTHON:-python3}
B=${BUILD:-build}
OUT=${OUT:-/tmp/ctune-cpu-parity}
"$PY" -c "import torch, transformers, peft" 2>/dev/null ||
    { echo "cpu_parity: $PY lacks torch, transformers or peft (set HF_PYTHON)" >&2; exit 2; }
[ -x "$B/ctune" ] || { echo "cpu_parity: $B/ctune is missing (make first)" >&2; exit 2; }
failed=0

# parity NAME MODEL_CONFIG [HF_LR]
parity() {
    local name=$1 mcfg=$2 lr=2e-3 hf_lr=${3:-2e-3} W=$OUT/$1
    rm -rf "$W"; mkdir -p "$W"
    "$B/ctune" init --config "$mcfg" --out "$W/model" --seed 5 >/dev/null
    CTUNE_TRACE=$W "$B/ctune" train configs/tiny.yaml --set model="$W/model" --set output_dir="$W/run" \
        --set device=cpu --set "data.train_files=[data/arith/train.shard]" --set "data.eval_files=[]" \
        --set data.tokens_per_micro_batch=2048 --set training.max_steps=50 --set training.warmup_steps=5 \
        --set training.logging_steps=1 --set training.learning_rate=$lr --set training.lr_scheduler_type=cosine \
        --set training.eval_steps=0 --set training.save_steps=0 --set training.resume_from_checkpoint=false \
        >"$W/ctune.log" 2>&1 || { echo "$name: ctune failed (see $W/ctune.log)"; failed=$((failed + 1)); return; }
    "$PY" scripts/hf_parity.py train --model "$W/model" --adapter "$W/initial_adapter" \
        --shards data/arith/train.shard --trace "$W/batches.jsonl" --metrics "$W/run/metrics.jsonl" --lr $hf_lr \
        --scheduler cosine --warmup 5 --steps 50 --device cpu --dtype float32 --tol-first 1e-4 --tol-loss 1e-3 \
        --out "$W/result.json" >"$W/hf.log" 2>&1
    local rc=$? verdict
    verdict=$(grep -E '^(PASS|FAIL) parity' "$W/hf.log" | tail -n 1)
    if [ "$hf_lr" != "$lr" ]; then # the control: only hf_parity's FAIL verdict counts (a crash exits 1 too)
        if [ $rc = 1 ] && [ "${verdict#FAIL}" != "$verdict" ]; then
            echo "$name (HF at lr $hf_lr): failed as it must: $verdict"
        else
            echo "$name: rc $rc without a FAIL verdict, expected one (see $W/hf.log)"; failed=$((failed + 1))
        fi
    else
        echo "$name: ${verdict:-no verdict, rc $rc (see $W/hf.log)}"
        [ $rc = 0 ] || failed=$((failed + 1))
    fi
}

for name in "${@:-tiny qwen3_moe qwen3_moe_dense mixtral gpt_oss control}"; do
    for n in $name; do
        case $n in
        tiny) parity tiny configs/models/tiny/config.json ;;
        qwen3_moe) parity qwen3_moe configs/models/tiny-moe/config.json ;;
        qwen3_moe_dense)
            mkdir -p "$OUT"
            sed 's/"mlp_only_layers": \[\]/"mlp_only_layers": [1]/' configs/models/tiny-moe/config.json \
                >"$OUT/qwen3_moe_dense.json"
            grep -q '"mlp_only_layers": \[1\]' "$OUT/qwen3_moe_dense.json" ||
                { echo "cpu_parity: configs/models/tiny-moe/config.json has no empty mlp_only_layers" >&2; exit 2; }
            parity qwen3_moe_dense "$OUT/qwen3_moe_dense.json" ;;
        mixtral) parity mixtral configs/models/tiny-mixtral/config.json ;;
        gpt_oss) parity gpt_oss configs/models/tiny-gpt-oss/config.json ;;
        control) parity control configs/models/tiny-gpt-oss/config.json 2.6e-3 ;;
        *) echo "cpu_parity: unknown run '$n' (tiny qwen3_moe qwen3_moe_dense mixtral gpt_oss control)" >&2; exit 2 ;;
        esac
    done
done
echo "$failed failed"
exit $failed
