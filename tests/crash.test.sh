# crash.test.sh — the trainer killed with SIGKILL at random moments, many times,
# a third of them while a checkpoint is being written (scripts/kill_soak.sh):
# every restart must resume from the newest complete checkpoint, and the run
# must end with exactly the adapter, AdamW moments and metrics records of a run
# never interrupted; and what kills and bad disks leave behind (corrupt or
# incomplete checkpoints, stale .tmp/.deleting folders).
# Sourced helpers: tests/lib.sh. Under the sanitizers (CTUNE_SANITIZED=1, set by
# `make test-asan`) the trainer is ~10x slower, so fewer kills.
source "$(dirname "$0")/lib.sh"

if [ -n "${CTUNE_SANITIZED:-}" ]; then KILLS=4; else KILLS=12; fi

MODEL=$(mktemp -d)/tiny
"$CTUNE" init --config "$ROOT/configs/models/tiny/config.json" --out "$MODEL" --seed 1 >/dev/null

# Every step saves a checkpoint (save_steps 1) and only the newest two are kept.
train() {
    local out=$1; shift
    "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model="$MODEL" --set output_dir="$out" \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set data.eval_files= \
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.logging_steps=1 \
        --set training.eval_steps=0 --set training.save_steps=1 --set training.save_total_limit=2 \
        --set training.warmup_steps=2 --set training.resume_from_checkpoint=auto "$@"
}

# scripts/kill_soak.sh is the soak itself (run it with 100 kills by hand); here
# a short one. It fails unless the final adapter, the AdamW moments and every
# metrics record equal an uninterrupted run's, with one record per logged step.
every_kill_resumes_from_the_last_complete_checkpoint_and_ends_bit_identical() {
    CTUNE="$CTUNE" WORK=$PWD/soak SEED=7 bash "$ROOT/scripts/kill_soak.sh" "$KILLS" >soak.out 2>&1 ||
        { tail -n 30 soak.out; false; }
    cat soak.out
    grep -q "kill_soak: passed: $KILLS kills" soak.out
}

corrupt_newest_checkpoint_is_skipped_with_a_note() {
    train run --set training.max_steps=3 2>log || { cat log; false; }
    # change one byte of the newest adapter (its header's opening '{'): the CRC no longer matches
    printf 'Z' | dd of=run/checkpoint-3/adapter_model.safetensors bs=1 seek=8 conv=notrunc 2>/dev/null
    train run --set training.max_steps=3 2>log2 || { cat log2; false; }
    grep -q 'note: skipping run/checkpoint-3: .*adapter_model.safetensors: CRC32' log2
    grep -q 'resumed from run/checkpoint-2' log2
}

checkpoint_without_manifest_is_incomplete() {
    train run --set training.max_steps=2 2>log || { cat log; false; }
    rm run/checkpoint-2/manifest.json
    train run --set training.max_steps=2 2>log2 || { cat log2; false; }
    grep -q 'note: skipping run/checkpoint-2: .*no manifest.json' log2
    grep -q 'resumed from run/checkpoint-1' log2
    # an explicit resume_from_checkpoint is refused, naming the folder
    rm run/checkpoint-2/manifest.json
    expect_exit 2 train run2 --set training.resume_from_checkpoint=run/checkpoint-2 --set training.max_steps=2
    grep -q 'run/checkpoint-2: no manifest.json' err.txt
}

resume_from_a_checkpoint_that_does_not_exist_says_so() {
    expect_exit 2 train run --set training.resume_from_checkpoint=/nonexistent/checkpoint-5 --set training.max_steps=2
    grep -q 'training.resume_from_checkpoint: /nonexistent/checkpoint-5: does not exist' err.txt
    if grep -q 'incomplete' err.txt; then false; fi
    echo data >file
    expect_exit 2 train run --set training.resume_from_checkpoint=file --set training.max_steps=2
    grep -q 'file: not a folder' err.txt
}

# A kill between a rotation's rename and its removal leaves checkpoint-N.deleting,
# one during a save checkpoint-N.tmp: the next start removes both.
folders_a_kill_leaves_behind_are_removed_on_start() {
    train run --set training.max_steps=2 2>log || { cat log; false; }
    cp -r run/checkpoint-1 run/checkpoint-7.deleting
    cp -r run/checkpoint-1 run/checkpoint-8.old.deleting
    mkdir run/checkpoint-9.tmp && echo partial >run/checkpoint-9.tmp/adapter_model.safetensors
    mkdir run/checkpoint-notes.tmp # not a name a save makes: left alone
    train run --set training.max_steps=2 2>log2 || { cat log2; false; }
    [ ! -e run/checkpoint-7.deleting ] && [ ! -e run/checkpoint-8.old.deleting ] && [ ! -e run/checkpoint-9.tmp ]
    [ -d run/checkpoint-notes.tmp ]
    grep -q 'note: removed run/checkpoint-7.deleting' log2
}

run_test every_kill_resumes_from_the_last_complete_checkpoint_and_ends_bit_identical
run_test corrupt_newest_checkpoint_is_skipped_with_a_note
run_test checkpoint_without_manifest_is_incomplete
run_test resume_from_a_checkpoint_that_does_not_exist_says_so
run_test folders_a_kill_leaves_behind_are_removed_on_start
rm -rf "$(dirname "$MODEL")"
summary
