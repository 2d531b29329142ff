# hf_merge.test.sh — HF transformers + PEFT judge `ctune merge`: for the tiny
# llama, qwen3_moe (all sparse, and with a dense layer), mixtral, gpt_oss,
# qwen3_5 and qwen3_next (all sparse, and with a dense layer) models, a few
# training steps on the CPU, a merge, then scripts/hf_merge_check.py: the
# `ctune init` folder and the merged one load in plain HF with no tensor
# missing or unexpected, and the merged one gives PEFT's base + adapter logits
# to bf16 rounding (qwen3_next: into its grouped in_proj_qkvz / in_proj_ba, whose
# LoRA B ctune keeps in HF's row order on disk). Needs torch, transformers
# and peft in $HF_PYTHON (default python3); skipped without them (CI has none).
# Sourced helpers: tests/lib.sh.
source "$(dirname "$0")/lib.sh"

PY=${HF_PYTHON:-python3}
MODELS=$(mktemp -d)

merge_matches_peft() { # MODEL [CONFIG.json]
    local model=$1 config=${2:-$ROOT/configs/models/$1/config.json}
    "$CTUNE" init --config "$config" --out "$MODELS/$model" --seed 3 >/dev/null
    "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model="$MODELS/$model" --set output_dir=run \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set data.eval_files= \
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.max_steps=4 \
        --set training.warmup_steps=1 --set training.learning_rate=5e-3 --set training.save_steps=0 \
        --set training.eval_steps=0 2>log || { cat log; false; }
    "$CTUNE" merge --model "$MODELS/$model" --adapter run/final --out merged 2>log || { cat log; false; }
    "$PY" "$ROOT/scripts/hf_merge_check.py" --model "$MODELS/$model" --adapter run/final --merged merged \
        >check.txt 2>err.txt || { cat check.txt; tail -5 err.txt; false; }
    cat check.txt
    grep -q PASS check.txt
}

llama_merge_matches_peft() { merge_matches_peft tiny; }
qwen3_moe_merge_matches_peft() { merge_matches_peft tiny-moe; }
mixtral_merge_matches_peft() { merge_matches_peft tiny-mixtral; }
gpt_oss_merge_matches_peft() { merge_matches_peft tiny-gpt-oss; }
# layer 1 dense: its MLP LoRA is named as target_parameters, which PEFT must load and merge too
qwen3_moe_with_a_dense_layer_merge_matches_peft() {
    sed 's/"mlp_only_layers": \[\]/"mlp_only_layers": [1]/' "$ROOT/configs/models/tiny-moe/config.json" >dense.json
    grep -q '"mlp_only_layers": \[1\]' dense.json
    merge_matches_peft tiny-moe-dense "$PWD/dense.json"
    grep -q '"mlp.gate_proj.weight"' run/final/adapter_config.json
}

qwen3_5_merge_matches_peft() { merge_matches_peft tiny-qwen3_5-text; }
qwen3_next_merge_matches_peft() {
    merge_matches_peft tiny-qwen3-next
    grep -q '"in_proj_qkvz"' run/final/adapter_config.json
}
# as qwen3_moe's: PEFT's v5 conversion takes the names gate/up/down_proj from a dense layer
qwen3_next_with_a_dense_layer_merge_matches_peft() {
    sed 's/"mlp_only_layers": \[\]/"mlp_only_layers": [1]/' "$ROOT/configs/models/tiny-qwen3-next/config.json" >dense.json
    grep -q '"mlp_only_layers": \[1\]' dense.json
    merge_matches_peft tiny-qwen3-next-dense "$PWD/dense.json"
    grep -q '"mlp.gate_proj.weight"' run/final/adapter_config.json
}

tests=(llama_merge_matches_peft qwen3_moe_merge_matches_peft qwen3_moe_with_a_dense_layer_merge_matches_peft
       mixtral_merge_matches_peft gpt_oss_merge_matches_peft qwen3_5_merge_matches_peft qwen3_next_merge_matches_peft
       qwen3_next_with_a_dense_layer_merge_matches_peft)
if "$PY" -c "import torch, transformers, peft" 2>/dev/null; then
    for t in "${tests[@]}"; do run_test "$t"; done
else
    for t in "${tests[@]}"; do skip_test "$t" "skipped: no torch, transformers and peft in $PY (set HF_PYTHON)"; done
fi
rm -rf "$MODELS"
summary
