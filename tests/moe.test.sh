# moe.test.sh — mixture-of-experts models end to end on the CPU: the tiny
# qwen3_moe, mixtral and gpt_oss shapes of configs/models, random weights from
# ctune init, a few steps on the bundled data. Sourced helpers: tests/lib.sh.
source "$(dirname "$0")/lib.sh"

MODELS=$(mktemp -d)
for m in tiny-moe tiny-mixtral tiny-gpt-oss; do
    "$CTUNE" init --config "$ROOT/configs/models/$m/config.json" --out "$MODELS/$m" --seed 1 >/dev/null
done

moe_run() { # MODEL OUT [--set ...]
    local model=$1 out=$2; shift 2
    "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model="$MODELS/$model" --set output_dir="$out" \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set "data.eval_files=[$ROOT/data/arith/eval.shard]" \
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.logging_steps=1 \
        --set training.eval_steps=0 --set training.save_total_limit=0 --set training.resume_from_checkpoint=auto \
        --set training.warmup_steps=2 --set lora.r=8 "$@"
}

# Loss of step 1 and of step N from metrics.jsonl must fall by at least 0.3.
loss_falls() { # RUN N
    local first last
    first=$(grep '"step": 1,' "$1/metrics.jsonl" | sed 's/.*"loss": \([0-9.]*\).*/\1/')
    last=$(grep "\"step\": $2," "$1/metrics.jsonl" | grep '"loss"' | sed 's/.*"loss": \([0-9.]*\).*/\1/')
    echo "loss step 1: $first, step $2: $last"
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }'
}

train_lowers_the_loss() { # MODEL
    moe_run "$1" run --set training.max_steps=20 --set training.learning_rate=5e-3 2>log || { cat log; false; }
    loss_falls run 20
}

# Resuming from a checkpoint reloads the adapter (lora_load_peft) and the
# optimizer: the final adapter equals an uninterrupted run's.
resume_is_bit_identical() { # MODEL
    moe_run "$1" full --set training.max_steps=4 --set training.save_steps=2 2>log_full || { cat log_full; false; }
    mkdir -p part && cp -r full/checkpoint-2 part/
    moe_run "$1" part --set training.max_steps=4 --set training.save_steps=2 2>log_part || { cat log_part; false; }
    grep -q "resumed from part/checkpoint-2" log_part
    cmp full/final/adapter_model.safetensors part/final/adapter_model.safetensors
}

qwen3_moe_trains_and_resumes_bit_identically() {
    train_lowers_the_loss tiny-moe
    resume_is_bit_identical tiny-moe
}
mixtral_trains_and_resumes_bit_identically() {
    train_lowers_the_loss tiny-mixtral
    grep -q '"w1"' run/final/adapter_config.json
    resume_is_bit_identical tiny-mixtral
}
gpt_oss_trains_and_resumes_bit_identically() {
    train_lowers_the_loss tiny-gpt-oss
    grep -q '"mlp.experts.gate_up_proj"' run/final/adapter_config.json
    resume_is_bit_identical tiny-gpt-oss
}

qwen3_moe_adapter_changes_the_eval_loss() {
    moe_run tiny-moe run --set training.max_steps=3 --set training.learning_rate=5e-3 2>log || { cat log; false; }
    "$CTUNE" eval run/config.yaml --adapter run/final >with.txt
    "$CTUNE" eval run/config.yaml >base.txt
    cat with.txt base.txt
    ! cmp -s <(sed 's/(.*//' with.txt) <(sed 's/(.*//' base.txt)
}

run_test qwen3_moe_trains_and_resumes_bit_identically
run_test mixtral_trains_and_resumes_bit_identically
run_test gpt_oss_trains_and_resumes_bit_identically
router_aux_loss_is_logged_when_on() {
    moe_run tiny-mixtral run --set training.max_steps=2 --set training.router_aux_loss=true
    [ "$(grep -c '"aux_loss": 0\.[0-9]' run/metrics.jsonl)" -ge 1 ]
    moe_run tiny-mixtral off --set training.max_steps=2
    ! grep -q aux_loss off/metrics.jsonl
}

# The CLI end to end: a trained gpt_oss adapter merges into a model folder, and
# generate decodes base + adapter and the merged model (the decoder and the
# merge are held to the graph by test_generate.c and test_merge.c, the GPU
# decoder to the CPU's by test_generate.c on a GPU).
gpt_oss_adapter_merges_and_generates() {
    moe_run tiny-gpt-oss run --set training.max_steps=3 --set training.learning_rate=5e-3 2>log || { cat log; false; }
    "$CTUNE" merge --model "$MODELS/tiny-gpt-oss" --adapter run/final --out merged 2>log || { cat log; false; }
    [ -f merged/model.safetensors ] && [ -f merged/config.json ]
    "$CTUNE" generate --model "$MODELS/tiny-gpt-oss" --adapter run/final --prompt-ids 1,2,3 --max-new-tokens 4 \
        --ids >ids.txt 2>err.txt || { cat err.txt; false; }
    [ "$(wc -w <ids.txt)" -eq 4 ]
    "$CTUNE" generate --model merged --prompt-ids 1,2,3 --max-new-tokens 4 --device cpu >/dev/null
}

run_test qwen3_moe_adapter_changes_the_eval_loss
run_test router_aux_loss_is_logged_when_on
run_test gpt_oss_adapter_merges_and_generates
rm -rf "$MODELS"
summary
