# train.test.sh — the trainer end to end on the CPU: a tiny random model, a few
# steps on the bundled data. Sourced helpers: tests/lib.sh.
source "$(dirname "$0")/lib.sh"

# A small, fast variant of configs/tiny.yaml (short micro-batches, few steps).
small_run() {
    local out=$1; shift
    "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model="$MODEL" --set output_dir="$out" \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set "data.eval_files=[$ROOT/data/arith/eval.shard]" \
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.logging_steps=1 \
        --set training.eval_steps=0 --set training.save_total_limit=0 --set training.resume_from_checkpoint=auto \
        --set training.warmup_steps=2 "$@"
}

MODEL=$(mktemp -d)/tiny
"$CTUNE" init --config "$ROOT/configs/models/tiny/config.json" --out "$MODEL" --seed 1 >/dev/null

resume_continues_bit_identically() {
    small_run full --set training.max_steps=6 --set training.save_steps=3 2>log_full || { cat log_full; false; }
    [ -d full/checkpoint-3 ] && [ -d full/checkpoint-6 ] && [ -f full/final/adapter_model.safetensors ]
    # A run that stopped after step 3: its output folder holds only checkpoint-3.
    mkdir -p part && cp -r full/checkpoint-3 part/
    small_run part --set training.max_steps=6 --set training.save_steps=3 2>log_part || { cat log_part; false; }
    grep -q "resumed from part/checkpoint-3" log_part
    cmp full/final/adapter_model.safetensors part/final/adapter_model.safetensors
    # AdamW moments: the file's last 2 x 4 x 155648 bytes (F32 tensors come after the
    # 8-byte counters and the wall-clock stats, which legitimately differ).
    cmp <(tail -c 1245184 full/checkpoint-6/trainer_state.safetensors) \
        <(tail -c 1245184 part/checkpoint-6/trainer_state.safetensors)
    # the logged losses of steps 4..6 agree to every printed digit
    diff <(grep '"step": [456],' full/metrics.jsonl | sed 's/"tokens_per_second.*//') \
         <(grep '"step": [456],' part/metrics.jsonl | sed 's/"tokens_per_second.*//')
}

training_lowers_the_loss_and_writes_the_run_folder() {
    small_run run --set training.max_steps=30 --set training.learning_rate=3e-3 --set training.eval_steps=30 2>log || { cat log; false; }
    [ -f run/config.yaml ] && [ -f run/metrics.jsonl ] && [ -f run/final/adapter_config.json ]
    first=$(grep '"step": 1,' run/metrics.jsonl | sed 's/.*"loss": \([0-9.]*\).*/\1/')
    last=$(grep '"step": 30,' run/metrics.jsonl | grep '"loss"' | sed 's/.*"loss": \([0-9.]*\).*/\1/')
    echo "loss step 1: $first, step 30: $last"
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }'
    grep -q '"eval_loss"' run/metrics.jsonl
    # the resolved config reads back
    "$CTUNE" train run/config.yaml --print-config >/dev/null
}

save_total_limit_keeps_the_newest_checkpoints() {
    small_run run --set training.max_steps=4 --set training.save_steps=1 --set training.save_total_limit=2 2>log || { cat log; false; }
    [ "$(ls -d run/checkpoint-* | wc -l)" -eq 2 ] && [ -d run/checkpoint-4 ] && [ -d run/checkpoint-3 ]
}

bad_config_is_an_input_error_naming_the_line() {
    printf 'model: m\noutput_dir: o\nlora:\n  rank: 8\n' >bad.yaml
    expect_exit 2 "$CTUNE" train bad.yaml
    grep -q 'bad.yaml:4:' err.txt
}

bad_override_is_an_input_error() {
    expect_exit 2 "$CTUNE" train "$ROOT/configs/tiny.yaml" --set training.max_steps=ten
    grep -q -- '--set training.max_steps=ten' err.txt
}

missing_model_folder_is_an_input_error() {
    expect_exit 2 "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model=/nonexistent/model --set output_dir=o
    grep -q '/nonexistent/model' err.txt
}

eval_reports_loss_for_base_and_adapter() {
    small_run run --set training.max_steps=2 2>log || { cat log; false; }
    "$CTUNE" eval "$ROOT/configs/tiny.yaml" --set model="$MODEL" --set "data.eval_files=[$ROOT/data/arith/eval.shard]" \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set output_dir=x --adapter run/final >out.txt
    grep -q 'perplexity' out.txt
}

eval_takes_model_and_data_without_a_config() {
    small_run run --set training.max_steps=2 2>log || { cat log; false; }
    "$CTUNE" eval --model "$MODEL" --adapter run/final --data "$ROOT/data/arith/eval.shard" --device cpu >with.txt
    "$CTUNE" eval --model "$MODEL" --data "$ROOT/data/arith/eval.shard" --device cpu >base.txt
    grep -q 'run/final' with.txt && grep -q 'base model' base.txt
    expect_exit 2 "$CTUNE" eval --model "$MODEL"
    grep -q -- '--data missing' err.txt
}

training_and_eval_without_packing_run_one_document_per_micro_batch() {
    small_run run --set training.max_steps=2 --set data.packing=false --set training.eval_steps=2 2>log || { cat log; false; }
    grep -q '"eval_loss"' run/metrics.jsonl
}

shard_without_target_tokens_is_an_input_error_naming_it() {
    printf '{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 0, 0]}\n{"input_ids": [5, 6, 7], "loss_mask": [0, 0, 0]}\n' \
        >masked.jsonl
    "$CTUNE" prepare --in masked.jsonl --out masked --eval-fraction 0 >/dev/null
    expect_exit 2 small_run run --set training.max_steps=2 --set "data.train_files=[masked/train.shard]"
    grep -q 'masked/train.shard: no target tokens: the loss mask of all 2 documents is 0' err.txt
    expect_exit 2 small_run run --set training.max_steps=2 --set "data.eval_files=[masked/train.shard]"
    grep -q 'masked/train.shard: no target tokens: .*data.eval_files' err.txt
    # labels everywhere, but max_length 1 leaves no token to predict one from
    expect_exit 2 small_run run --set training.max_steps=2 --set data.max_length=1
    grep -q 'train.shard: no target tokens within data.max_length 1' err.txt
    expect_exit 2 "$CTUNE" eval --model "$MODEL" --data masked/train.shard --device cpu
    grep -q 'masked/train.shard: no target tokens' err.txt
    [ ! -e run/final ]
}

dynamic_rope_document_past_max_positions_is_an_input_error() {
    # transformers rescales a dynamic rope past max_position_embeddings; ctune refuses such a document
    python3 -c "
import json; c = json.load(open('$ROOT/configs/models/tiny/config.json'))
c.update(max_position_embeddings=16, rope_scaling={'rope_type': 'dynamic', 'factor': 2.0})
json.dump(c, open('config.json', 'w'))"
    "$CTUNE" init --config config.json --out dyn --seed 1 >/dev/null
    printf '{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]}\n{"input_ids": [5, 6, 7]}\n' >long.jsonl
    "$CTUNE" prepare --in long.jsonl --out long --eval-fraction 0 >/dev/null
    expect_exit 2 small_run run --set model=dyn --set training.max_steps=2 --set "data.train_files=[long/train.shard]" \
        --set data.eval_files=
    grep -q 'long/train.shard: document 0 has 17 tokens, more than max_position_embeddings 16 of a model with rope_type dynamic' err.txt
    # within max_position_embeddings (here cut by data.max_length) it trains
    small_run run --set model=dyn --set training.max_steps=2 --set "data.train_files=[long/train.shard]" \
        --set data.eval_files= --set data.max_length=16 >/dev/null 2>log || { cat log; false; }
    [ -f run/final/adapter_model.safetensors ]
}

eval_without_eval_files_is_an_input_error() {
    expect_exit 2 "$CTUNE" eval "$ROOT/configs/tiny.yaml" --set model="$MODEL" --set data.eval_files= --set output_dir=x
    grep -q 'data.eval_files is empty: nothing to evaluate' err.txt
    if grep -q perplexity out.txt; then false; fi
}

run_test resume_continues_bit_identically
run_test shard_without_target_tokens_is_an_input_error_naming_it
run_test eval_without_eval_files_is_an_input_error
run_test dynamic_rope_document_past_max_positions_is_an_input_error
run_test training_and_eval_without_packing_run_one_document_per_micro_batch
run_test training_lowers_the_loss_and_writes_the_run_folder
run_test save_total_limit_keeps_the_newest_checkpoints
run_test bad_config_is_an_input_error_naming_the_line
run_test bad_override_is_an_input_error
run_test missing_model_folder_is_an_input_error
run_test eval_reports_loss_for_base_and_adapter
run_test eval_takes_model_and_data_without_a_config
rm -rf "$(dirname "$MODEL")"
summary
