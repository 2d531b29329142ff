# crash.test.sh — the trainer killed with SIGKILL at random moments, many times,
# half of them while a checkpoint is being written: every restart must resume
# from the newest complete checkpoint, and the run must end with exactly the
# adapter (and AdamW moments, and logged losses) of a run never interrupted.
# Sourced helpers: tests/lib.sh. Under the sanitizers (CTUNE_SANITIZED=1, set by
# `make test-asan`) the trainer is ~10x slower, so fewer steps and kills.
source "$(dirname "$0")/lib.sh"

if [ -n "${CTUNE_SANITIZED:-}" ]; then STEPS=8 KILLS=4; else STEPS=24 KILLS=15; fi

MODEL=$(mktemp -d)/tiny
"$CTUNE" init --config "$ROOT/configs/models/tiny/config.json" --out "$MODEL" --seed 1 >/dev/null

# Every step saves a checkpoint (save_steps 1) and only the newest two are kept,
# so kills also land in the deletion of old ones.
args() {
    ARGS=("$ROOT/configs/tiny.yaml" --set model="$MODEL" --set output_dir="$1"
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set data.eval_files=
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.logging_steps=1
        --set training.eval_steps=0 --set training.save_steps=1 --set training.save_total_limit=2
        --set training.warmup_steps=2 --set training.max_steps=$STEPS --set training.resume_from_checkpoint=auto)
}
train() {
    args "$1"; shift
    "$CTUNE" train "${ARGS[@]}" "$@"
}

# The newest step among run/checkpoint-N (and a checkpoint-N.old moved aside by
# a save), or 0: what a restart must resume from.
newest_checkpoint() {
    local best=0 d n
    for d in run/checkpoint-*; do
        [ -d "$d" ] || continue
        n=${d#run/checkpoint-}
        n=${n%.old}
        case $n in *[!0-9]*|'') continue ;; esac
        [ "$n" -gt "$best" ] && best=$n
    done
    echo "$best"
}

# Waits until a checkpoint write is in progress (a checkpoint-N.tmp folder
# exists) or the run ends; gives up after ~20 s.
wait_for_save() {
    local i
    for ((i = 0; i < 20000; i++)); do
        compgen -G 'run/checkpoint-*.tmp' >/dev/null && return 0
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.001
    done
}

every_kill_resumes_from_the_last_complete_checkpoint_and_ends_bit_identical() {
    train ref 2>log_ref || { cat log_ref; false; }
    RANDOM=7   # the kill moments are random but the same on every CI run
    local k mid_save=0 resumes=0 want
    for ((k = 1; k <= KILLS; k++)); do
        want=$(newest_checkpoint)
        # not through train(): $! must be ctune itself, not a subshell around it
        args run
        "$CTUNE" train "${ARGS[@]}" 2>"log.$k" &
        local pid=$!
        if ((k % 2 == 0)); then
            wait_for_save "$pid"
        else
            sleep "$(printf '0.%03d' $((RANDOM % 1000)))"
        fi
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        compgen -G 'run/checkpoint-*.tmp' >/dev/null && mid_save=$((mid_save + 1))
        # where this restart said it resumed from, if it lived that long
        local said
        said=$(grep -o 'resumed from run/checkpoint-[0-9]*' "log.$k" || true)
        if [ "$want" -gt 0 ] && [ -n "$said" ]; then
            [ "$said" = "resumed from run/checkpoint-$want" ] || { echo "kill $k: $said, expected checkpoint-$want"; false; }
            resumes=$((resumes + 1))
        fi
    done
    want=$(newest_checkpoint)
    train run 2>log.last || { cat log.last; false; }
    [ "$want" -eq 0 ] || grep -q "resumed from run/checkpoint-$want" log.last
    # kills never leave a checkpoint that resume would have to skip
    if grep 'note: skipping' log.*; then false; fi
    echo "$KILLS kills, $mid_save during a checkpoint write, $resumes restarts checked"
    [ "$mid_save" -gt 0 ]
    cmp ref/final/adapter_model.safetensors run/final/adapter_model.safetensors
    # the AdamW moments (the trainer state's last 2 x 4 x 155648 bytes)
    cmp <(tail -c 1245184 ref/checkpoint-$STEPS/trainer_state.safetensors) \
        <(tail -c 1245184 run/checkpoint-$STEPS/trainer_state.safetensors)
    # every loss logged by any of the restarts is the uninterrupted run's (lines
    # cut short by a kill are not JSON and are left out)
    grep '}$' run/metrics.jsonl | sed 's/, "tokens_per_second.*//' | sort -u >got
    grep '}$' ref/metrics.jsonl | sed 's/, "tokens_per_second.*//' | sort -u >want
    comm -23 got want >extra
    [ ! -s extra ] || { echo "logged losses the uninterrupted run never logged:"; head extra; false; }
}

corrupt_newest_checkpoint_is_skipped_with_a_note() {
    train run --set training.max_steps=3 2>log || { cat log; false; }
    # change one byte of the newest adapter (its header's opening '{'): the CRC no longer matches
    printf 'Z' | dd of=run/checkpoint-3/adapter_model.safetensors bs=1 seek=8 conv=notrunc 2>/dev/null
    train run --set training.max_steps=4 2>log2 || { cat log2; false; }
    grep -q 'note: skipping run/checkpoint-3: .*adapter_model.safetensors: CRC32' log2
    grep -q 'resumed from run/checkpoint-2' log2
}

checkpoint_without_manifest_is_incomplete() {
    train run --set training.max_steps=2 2>log || { cat log; false; }
    rm run/checkpoint-2/manifest.json
    train run --set training.max_steps=3 2>log2 || { cat log2; false; }
    grep -q 'note: skipping run/checkpoint-2: .*no manifest.json' log2
    grep -q 'resumed from run/checkpoint-1' log2
    # an explicit resume_from_checkpoint is refused, naming the folder
    rm run/checkpoint-3/manifest.json
    expect_exit 2 train run2 --set training.resume_from_checkpoint=run/checkpoint-3 --set training.max_steps=4
    grep -q 'run/checkpoint-3: no manifest.json' err.txt
}

run_test every_kill_resumes_from_the_last_complete_checkpoint_and_ends_bit_identical
run_test corrupt_newest_checkpoint_is_skipped_with_a_note
run_test checkpoint_without_manifest_is_incomplete
rm -rf "$(dirname "$MODEL")"
summary
