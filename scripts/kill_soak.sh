#!/usr/bin/env bash
# kill_soak.sh N — SIGKILL the tiny training run N times and check that it ends
# exactly where an uninterrupted run does.
#
#   scripts/kill_soak.sh 100          (CTUNE=build/ctune by default)
#
# The run is configs/tiny.yaml on the CPU with a random tiny model, small
# micro-batches, a checkpoint every step (the newest two kept, so kills also land
# in the rotation) and a metrics record every LOG_STEPS steps (so logging
# windows span checkpoints). Each start is killed: at a random moment (startup,
# resume, a step), while a checkpoint is being written, or just after a record
# was logged, in turn; the next start must resume from the newest complete
# checkpoint. After N kills that landed, a last start runs to the end, and then:
#   - final/adapter_model.safetensors and the AdamW moments of the last
#     checkpoint equal the uninterrupted run's, bit for bit (cmp);
#   - metrics.jsonl holds exactly one record per logged step, each equal to the
#     uninterrupted run's (all but tokens_per_second and elapsed, which are time);
#   - no start skipped a checkpoint, and no checkpoint-*.tmp or *.deleting is left.
# Kill moments come from SEED, and adapt to the machine: the random ones are
# drawn over the startup time plus two steps, as measured by the reference run.
# Env: CTUNE, STEPS (default N + 12: a start gains about a step at most, so the
# kills land before the end), LOG_STEPS (3), SEED (7), WORK (a folder kept
# afterwards; default a temporary one, removed when the soak passes).
# Exit 0 when every check passes; the last line says what was checked and how long it took.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${1:?usage: scripts/kill_soak.sh N (kills that must land)}
CTUNE=${CTUNE:-$ROOT/build/ctune}
case $CTUNE in /*) ;; *) CTUNE=$PWD/$CTUNE ;; esac
STEPS=${STEPS:-$((N + 12))}
LOG_STEPS=${LOG_STEPS:-3}
RANDOM=${SEED:-7}
keep=${WORK:+1}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
cd "$WORK"
t0=$(date +%s.%N)
fail() { echo "kill_soak: FAIL: $*" >&2; echo "kill_soak: the runs are in $WORK" >&2; exit 1; }

"$CTUNE" init --config "$ROOT/configs/models/tiny/config.json" --out model --seed 1 >/dev/null
args() {
    ARGS=("$ROOT/configs/tiny.yaml" --set model="$WORK/model" --set output_dir="$1" --set device=cpu
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set data.eval_files=
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.logging_steps=$LOG_STEPS
        --set training.eval_steps=0 --set training.save_steps=1 --set training.save_total_limit=2
        --set training.warmup_steps=2 --set training.max_steps=$STEPS --set training.resume_from_checkpoint=auto)
}

# The newest step among run/checkpoint-N (and a checkpoint-N.old moved aside by
# a save), or 0: what a start must resume from.
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

# wait_until PID CMD...: polls CMD every millisecond until it succeeds (status
# 0), or PID exits or ~30 s pass (status 1).
wait_until() {
    local pid=$1 i; shift
    for ((i = 0; i < 30000; i++)); do
        "$@" && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.001
    done
    return 1
}
saving() { compgen -G 'run/checkpoint-*.tmp' >/dev/null; }
# past setup, so past the removal of a .tmp an earlier kill left
started() { grep -qs '^ctune: ' "$1"; }
logged() { grep -qs '^step ' "$1"; }
# a uniform draw in [0, $1) seconds, printed for sleep
draw() { awk -v r=$RANDOM -v span="$1" 'BEGIN { printf "%.3f", r / 32768 * span }'; }

# The uninterrupted reference, timed: startup S and seconds per step P set the kill moments.
args ref
r0=$(date +%s.%N)
"$CTUNE" train "${ARGS[@]}" >ref.log 2>&1 || { cat ref.log; fail "the reference run failed"; }
r1=$(date +%s.%N)
run_s=$(grep '"step"' ref/metrics.jsonl | tail -n 1 | sed 's/.*"elapsed": \([0-9.]*\).*/\1/')
read -r S P < <(awk -v a="$r0" -v b="$r1" -v e="$run_s" -v n="$STEPS" 'BEGIN { print b - a - e, e / n }')
n_params=$(sed -n 's/.* \([0-9]*\) LoRA parameters.*/\1/p' ref.log)

landed=0 mid_save=0 checked=0
for ((k = 1; landed < N; k++)); do
    want=$(newest_checkpoint)
    args run
    "$CTUNE" train "${ARGS[@]}" >"log.$k" 2>&1 &
    pid=$!
    case $((k % 3)) in
        1) sleep "$(draw "$(awk -v s="$S" -v p="$P" 'BEGIN { print s + 2 * p }')")" ;;
        2) wait_until "$pid" started "log.$k" && wait_until "$pid" saving || true ;;
        0) wait_until "$pid" logged "log.$k" || true; sleep "$(draw "$P")" ;;
    esac
    kill -9 "$pid" 2>/dev/null || true
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    [ "$rc" -eq 137 ] || { cat "log.$k"; fail "start $k exited with $rc before it was killed (raise STEPS if it finished)"; }
    landed=$((landed + 1))
    if started "log.$k" && saving; then mid_save=$((mid_save + 1)); fi
    said=$(grep -os 'resumed from run/checkpoint-[0-9]*' "log.$k" || true)
    if [ "$want" -gt 0 ] && [ -n "$said" ]; then
        [ "$said" = "resumed from run/checkpoint-$want" ] || fail "start $k: $said, expected checkpoint-$want"
        checked=$((checked + 1))
    fi
done

want=$(newest_checkpoint)
args run
"$CTUNE" train "${ARGS[@]}" >log.last 2>&1 || { cat log.last; fail "the last start failed"; }
[ "$want" -eq 0 ] || grep -q "resumed from run/checkpoint-$want" log.last || fail "the last start did not resume from checkpoint-$want"
if grep -H 'note: skipping' log.*; then fail "a start skipped a checkpoint a kill had left"; fi
if compgen -G 'run/*.tmp' >/dev/null || compgen -G 'run/*.deleting' >/dev/null; then ls run; fail "stale folders left"; fi
[ "$N" -lt 2 ] || [ "$mid_save" -gt 0 ] || fail "no kill landed during a checkpoint write"
cmp ref/final/adapter_model.safetensors run/final/adapter_model.safetensors || fail "final adapters differ"
moments=$((8 * n_params)) # exp_avg and exp_avg_sq, fp32: the file's last bytes
cmp <(tail -c "$moments" "ref/checkpoint-$STEPS/trainer_state.safetensors") \
    <(tail -c "$moments" "run/checkpoint-$STEPS/trainer_state.safetensors") || fail "AdamW moments differ"
untimed() { sed -E 's/, "tokens_per_second": [^,}]*//; s/, "elapsed": [^,}]*//' "$1"; }
untimed ref/metrics.jsonl >want.jsonl
untimed run/metrics.jsonl >got.jsonl
diff want.jsonl got.jsonl >metrics.diff || { head -n 20 metrics.diff; fail "metrics.jsonl differs from the uninterrupted run's"; }
records=$(wc -l <got.jsonl)
[ "$records" -eq "$(grep -c '"step"' got.jsonl)" ] && [ "$(cut -d, -f1 got.jsonl | sort | uniq -d | wc -l)" -eq 0 ] ||
    fail "metrics.jsonl repeats a step"
t1=$(date +%s.%N)
[ -n "$keep" ] || { cd /; rm -rf "$WORK"; }
awk -v n="$landed" -v m="$mid_save" -v c="$checked" -v r="$records" -v s="$STEPS" -v a="$t0" -v b="$t1" 'BEGIN {
    printf "kill_soak: passed: %d kills (%d during a checkpoint write), %d restarts resumed from the newest checkpoint; ", n, m, c
    printf "after %d steps the adapter, the AdamW moments and the %d metrics records equal the uninterrupted run'"'"'s (%.0f s)\n", s, r, b - a }'
