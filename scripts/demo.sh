#!/usr/bin/env bash
# The quick start (make demo): a random-weight tiny model learns arithmetic word
# problems from the bundled data on the CPU in a few minutes.
#   1. writes models/tiny (random bf16 weights from configs/models/tiny/config.json)
#   2. trains configs/tiny.yaml into runs/tiny (a fresh run each time)
#   3. compares the eval loss of the base model and of the trained adapter
set -euo pipefail
cd "$(dirname "$0")/.."
ctune=${CTUNE:-build/ctune}
if [ ! -f models/tiny/model.safetensors ]; then
    $ctune init --config configs/models/tiny/config.json --out models/tiny --seed 0
fi
if [ ! -f data/arith/train.shard ]; then
    echo "data/arith/train.shard is missing; rebuilding it (see data/README.md)"
    python3 scripts/prepare_data.py --in data/arith/chat_train.jsonl --tokenizer bytes --out data/arith --split-name train --vocab-size 384
    python3 scripts/prepare_data.py --in data/arith/chat_eval.jsonl --tokenizer bytes --out data/arith --split-name eval --vocab-size 384
fi
echo "== training configs/tiny.yaml into runs/tiny (previous demo run removed)"
rm -rf runs/tiny
$ctune train configs/tiny.yaml --set training.resume_from_checkpoint=false
echo "== eval loss before and after"
$ctune eval configs/tiny.yaml
$ctune eval configs/tiny.yaml --adapter runs/tiny/final
echo "== done: adapter in runs/tiny/final, metrics in runs/tiny/metrics.jsonl"
