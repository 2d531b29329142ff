# faults.test.sh — injected faults and what the trainer does about them: a
# non-finite gradient (the CTUNE_INJECT_NAN_STEP test hook), an update that
# overflows (a learning rate beyond fp32), an output_dir that cannot be
# written, and a disk that fills up during a save or a merge (RLIMIT_FSIZE).
# Sourced helpers: tests/lib.sh.
source "$(dirname "$0")/lib.sh"

MODEL=$(mktemp -d)/tiny
"$CTUNE" init --config "$ROOT/configs/models/tiny/config.json" --out "$MODEL" --seed 1 >/dev/null

train() {
    local out=$1; shift
    "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model="$MODEL" --set output_dir="$out" \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set data.eval_files= \
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.logging_steps=1 \
        --set training.eval_steps=0 --set training.save_steps=1 --set training.save_total_limit=0 \
        --set training.warmup_steps=1 "$@"
}

# AdamW moments: the last 2 x 4 x 155648 bytes of trainer_state.safetensors.
moments() { tail -c 1245184 "$1/trainer_state.safetensors"; }

nan_gradient_skips_the_update_and_is_logged() {
    CTUNE_INJECT_NAN_STEP=3 train run --set training.max_steps=4 2>log || { cat log; false; }
    # step 3 changed nothing: its adapter and moments are step 2's
    cmp run/checkpoint-2/adapter_model.safetensors run/checkpoint-3/adapter_model.safetensors
    cmp <(moments run/checkpoint-2) <(moments run/checkpoint-3)
    if cmp -s run/checkpoint-3/adapter_model.safetensors run/checkpoint-4/adapter_model.safetensors; then false; fi
    grep '"step": 3,' run/metrics.jsonl | grep -q '"grad_norm": null.*"nonfinite_skipped": 1'
    [ "$(grep -c nonfinite_skipped run/metrics.jsonl)" -eq 1 ]
    grep -q 'skipped 1 non-finite' log
}

nonfinite_steps_in_a_row_stop_the_run_with_a_checkpoint() {
    # logging every 10 steps: the skips are read from the device ring every 4
    # steps (max_nonfinite_steps), and the run stops at the read that sees 4 in a row
    expect_exit 1 env CTUNE_INJECT_NAN_STEP=3-100 "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model="$MODEL" \
        --set output_dir=run --set "data.train_files=[$ROOT/data/arith/train.shard]" --set data.eval_files= \
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.logging_steps=10 \
        --set training.eval_steps=0 --set training.save_steps=2 --set training.save_total_limit=0 \
        --set training.warmup_steps=1 --set training.max_steps=20 --set training.max_nonfinite_steps=4
    grep -q 'training stopped at step 8: 6 steps in a row (from step 3) had a non-finite loss or gradient' err.txt
    grep -q 'checkpoint-8 holds the weights from before them' err.txt
    # the weights saved are those of step 2, the last finite one
    cmp run/checkpoint-2/adapter_model.safetensors run/checkpoint-8/adapter_model.safetensors
    [ ! -d run/final ]
    # rerun (the fault gone): it resumes from the stop and trains on, the streak counted afresh
    "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model="$MODEL" \
        --set output_dir=run --set "data.train_files=[$ROOT/data/arith/train.shard]" --set data.eval_files= \
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.logging_steps=10 \
        --set training.eval_steps=0 --set training.save_steps=2 --set training.save_total_limit=0 \
        --set training.warmup_steps=1 --set training.max_steps=20 --set training.max_nonfinite_steps=4 2>log2 ||
        { cat log2; false; }
    grep -q 'resumed from run/checkpoint-8' log2 && [ -f run/final/adapter_model.safetensors ]
}

bad_inject_hook_value_is_an_input_error() {
    CTUNE_INJECT_NAN_STEP=x expect_exit 2 train run --set training.max_steps=2
    grep -q 'CTUNE_INJECT_NAN_STEP=x' err.txt
}

output_dir_that_cannot_be_created_fails_before_step_1() {
    echo data >file
    expect_exit 2 train file/run --set training.max_steps=2
    grep -q 'output_dir file/run: cannot be created' err.txt
    if grep -q 'step 1/' err.txt; then false; fi
    expect_exit 2 train /proc/ctune-test-run --set training.max_steps=2
    grep -q 'output_dir /proc/ctune-test-run' err.txt
}

output_dir_that_cannot_be_written_fails_before_step_1() {
    # /proc/self exists and is a folder, but no file can be created in it (root included)
    expect_exit 2 train /proc/self --set training.max_steps=2
    grep -q 'output_dir /proc/self: not writable' err.txt
    if grep -q 'step 1/' err.txt; then false; fi
}

# learning_rate 1e39 is a finite double but inf as the fp32 the update uses:
# the gradient is finite, the update is not, and AdamW applies it.
overflowing_update_stops_the_run_without_saving_its_weights() {
    expect_exit 1 train run --set training.max_steps=4 --set training.learning_rate=1e39
    grep -q 'training stopped at step 2: the optimizer update of step 2 left non-finite LoRA weights' err.txt
    grep -q 'run/checkpoint-1 holds the last good state' err.txt
    [ -d run/checkpoint-1 ] && [ ! -e run/checkpoint-2 ] && [ ! -e run/final ]
    # logging every 10 steps, the guard has not read the device yet when step 2 saves: the save checks for itself
    expect_exit 1 train run2 --set training.max_steps=4 --set training.learning_rate=1e39 --set training.logging_steps=10
    grep -q 'checkpoint at step 2 not saved: the LoRA weights are not finite after the optimizer update (.* is nan' err.txt
    [ ! -e run2/checkpoint-2 ] && [ ! -e run2/checkpoint-2.tmp ] && [ ! -e run2/final ]
}

full_disk_during_a_save_keeps_the_previous_checkpoint() {
    # a run that stopped after step 2
    train run --set training.max_steps=4 2>log || { cat log; false; }
    rm -rf run/checkpoint-3 run/checkpoint-4 run/final
    # Files over 1000 KiB now fail with EFBIG, as on a full disk: the adapter
    # (615 KiB) is written, the trainer state (1216 KiB) is not.
    local rc=0
    (trap '' XFSZ; ulimit -f 1000; train run --set training.max_steps=4) 2>err.txt || rc=$?
    [ "$rc" -eq 1 ] || { echo "exit $rc"; cat err.txt; false; }
    grep -q 'checkpoint at step 3 not saved: .*File too large' err.txt
    grep -q 'are untouched' err.txt
    [ ! -e run/checkpoint-3 ] && [ ! -e run/checkpoint-3.tmp ]
    # with room again, the run resumes from the intact checkpoint-2
    train run --set training.max_steps=4 2>log2 || { cat log2; false; }
    grep -q 'resumed from run/checkpoint-2' log2
}

full_disk_during_a_merge_leaves_no_output_folder() {
    train run --set training.max_steps=1 2>log || { cat log; false; }
    # The merged tiny model is 1.6 MiB: with files capped at 1000 KiB its write fails.
    local rc=0
    (trap '' XFSZ; ulimit -f 1000; "$CTUNE" merge --model "$MODEL" --adapter run/final --out merged) 2>err.txt || rc=$?
    [ "$rc" -eq 1 ] || { echo "exit $rc"; cat err.txt; false; }
    grep -q 'File too large' err.txt
    [ ! -e merged ] && [ ! -e merged.partial ]
    # with room again, the same command completes
    "$CTUNE" merge --model "$MODEL" --adapter run/final --out merged 2>log2 || { cat log2; false; }
    [ -f merged/model.safetensors ] && [ -f merged/config.json ] && [ ! -e merged.partial ]
}

token_id_beyond_the_models_vocab_is_an_input_error() {
    # the bundled data uses ids up to 258; a model with 200 rows cannot embed them
    sed 's/"vocab_size": 384/"vocab_size": 200/' "$ROOT/configs/models/tiny/config.json" >small.json
    "$CTUNE" init --config small.json --out small --seed 1 >/dev/null
    expect_exit 2 "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model=small --set output_dir=run \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set data.eval_files= --set training.max_steps=10
    grep -q "train.shard: document [0-9]* has token id [0-9]* >= vocab_size 200" err.txt
}

run_test nan_gradient_skips_the_update_and_is_logged
run_test nonfinite_steps_in_a_row_stop_the_run_with_a_checkpoint
run_test overflowing_update_stops_the_run_without_saving_its_weights
run_test bad_inject_hook_value_is_an_input_error
run_test output_dir_that_cannot_be_created_fails_before_step_1
run_test output_dir_that_cannot_be_written_fails_before_step_1
run_test full_disk_during_a_save_keeps_the_previous_checkpoint
run_test full_disk_during_a_merge_leaves_no_output_folder
run_test token_id_beyond_the_models_vocab_is_an_input_error
rm -rf "$(dirname "$MODEL")"
summary
