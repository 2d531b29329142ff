#!/usr/bin/env bash
# gdn_grad_norms.sh — ctune's side of gpu_check.sh's parity50gdn (the tiny Gated
# DeltaNet hybrids, seed 5, data/arith, 2048 tokens per step, lr 2e-3, 50 steps) for
# one or more builds, to set each build's step-1 grad norm and losses beside the
# fp32 reference (DEVICE cpu) rather than beside HF's bf16, which drifts 3-6% on
# these models (BENCHMARKS.md).
#   bash scripts/gdn_grad_norms.sh cpu build                  # fp32 reference
#   bash scripts/gdn_grad_norms.sh cuda /tmp/old /tmp/new     # on the GPU machine
# Prints per model and build: step:loss/grad_norm at steps 1, 2, 10, 50.
set -u
[ $# -ge 2 ] || { echo "usage: $0 cpu|cuda BUILD_DIR..." >&2; exit 2; }
dev=$1; shift
for b in "$@"; do [ -x "$b/ctune" ] || { echo "$0: $b/ctune is missing" >&2; exit 2; }; done
for b in "$@"; do
  for m in qwen3_5:tiny-qwen3_5 qwen3_5_moe:tiny-qwen3_5-moe qwen3_next:tiny-qwen3-next; do
    n=${m%%:*}; d=${m#*:}; W=/tmp/p50x-$n-$(basename $b); rm -rf $W; mkdir -p $W
    $b/ctune init --config configs/models/$d/config.json --out $W/model --seed 5 >/dev/null || { echo "$n init failed"; continue; }
    $b/ctune train configs/tiny.yaml --set model=$W/model --set output_dir=$W/run --set device=$dev \
        --set "data.train_files=[data/arith/train.shard]" --set "data.eval_files=[]" --set data.tokens_per_micro_batch=2048 \
        --set training.max_steps=50 --set training.warmup_steps=5 --set training.logging_steps=1 \
        --set training.learning_rate=2e-3 --set training.lr_scheduler_type=cosine --set training.eval_steps=0 \
        --set training.save_steps=0 --set training.resume_from_checkpoint=false > $W/log 2>&1 || { echo "$n train failed"; tail -2 $W/log; continue; }
    python3 - $W/run/metrics.jsonl $n $(basename $b) <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
by = {r.get("step"): r for r in rows}
print(sys.argv[2], sys.argv[3], " ".join(f"s{s}:{by[s]['loss']:.6f}/{by[s].get('grad_norm', float('nan')):.5f}" for s in (1, 2, 10, 50) if s in by))
PY
  done
done
