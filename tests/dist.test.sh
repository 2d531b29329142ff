# dist.test.sh — data-parallel training on the CPU backend (dist.h): N ranks,
# started by `ctune train --gpus N` or by a launcher's environment, give the
# step of one process accumulating the same micro-batches; a rank that dies or
# hangs stops the others with a message naming it, the last checkpoint stays
# valid and resumes, also with another number of ranks; bad launcher input is
# an input error. Sourced helpers: tests/lib.sh.
source "$(dirname "$0")/lib.sh"

# two processes on this machine's cores: one OpenMP thread each (the CPU GEMM's
# sums do not depend on the thread count)
export OMP_NUM_THREADS=1
MODEL=$(mktemp -d)/tiny
"$CTUNE" init --config "$ROOT/configs/models/tiny/config.json" --out "$MODEL" --seed 1 >/dev/null

# train OUT [ARGS...]: 4 steps of the tiny model on the CPU, 2 micro-batches of at
# most 128 tokens per step, logging every step.
train() {
    local out=$1; shift
    $EXEC "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model="$MODEL" --set output_dir="$out" --set device=cpu \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set data.eval_files= \
        --set data.tokens_per_micro_batch=128 --set data.max_length=128 --set training.logging_steps=1 \
        --set training.gradient_accumulation_steps=2 --set training.eval_steps=0 --set training.save_steps=2 \
        --set training.save_total_limit=0 --set training.warmup_steps=1 --set training.max_steps=4 \
        --set training.resume_from_checkpoint=auto --set distributed.timeout_seconds=20 "$@"
}

# Under the sanitizers a micro-batch takes seconds: the hang test's timeout must
# stay above that
if [ -n "${CTUNE_SANITIZED:-}" ]; then HANG_TIMEOUT=20; else HANG_TIMEOUT=5; fi

# the loss and grad norm of every step, as metrics.jsonl writes them
steps_of() { python3 -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if 'loss' in r: print(r['step'], r['loss'], r['grad_norm'])" "$1"; }

free_port() { python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

same_adapter() { cmp "$1/final/adapter_model.safetensors" "$2/final/adapter_model.safetensors"; }

two_ranks_equal_one_rank_accumulating_bit_for_bit() {
    # one KC block of the CPU GEMM per micro-batch (<= 256 tokens): the sum over
    # ranks adds each micro-batch's gradient whole, as accumulation does
    train one >log1 2>&1 || { cat log1; false; }
    train two --gpus 2 >log2 2>&1 || { cat log2; false; }
    grep -q "ranks: 2" log2
    [ "$(steps_of one/metrics.jsonl)" = "$(steps_of two/metrics.jsonl)" ] || { steps_of one/metrics.jsonl; steps_of two/metrics.jsonl; false; }
    [ "$(steps_of two/metrics.jsonl | wc -l)" = 4 ]   # rank 0 alone writes metrics
    same_adapter one two
    [ -f two/rank-1.log ]
}

two_ranks_with_several_micro_batches_each_match_within_1e-5() {
    # 384 tokens: two blocks of the CPU GEMM's sum, so the order of the sums differs
    local more=(--set training.gradient_accumulation_steps=4 --set data.tokens_per_micro_batch=384
                --set data.max_length=384)
    train one "${more[@]}" >log1 2>&1 || { cat log1; false; }
    train two "${more[@]}" --gpus 2 >log2 2>&1 || { cat log2; false; }
    python3 - one/metrics.jsonl two/metrics.jsonl <<'PY'
import json, math, sys
a, b = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    d = abs(x["loss"] - y["loss"]) / abs(x["loss"])
    assert math.isfinite(d) and d <= 1e-5, (x, y, d)
print("max", max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b)))
PY
}

a_launchers_environment_runs_the_same_step() {
    train one >log1 2>&1 || { cat log1; false; }
    local port; port=$(free_port)
    RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port train env >log_r1 2>&1 &
    local pid=$!
    RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port train env >log_r0 2>&1 || { cat log_r0 log_r1; false; }
    wait $pid || { cat log_r1; false; }
    grep -q "launched by torchrun" log_r0
    same_adapter one env
}

resume_with_another_number_of_ranks() {
    train one >log1 2>&1 || { cat log1; false; }
    train two --gpus 2 >log2 2>&1 || { cat log2; false; }
    mkdir -p run && cp -r two/checkpoint-2 two/config.yaml run/
    train run >log3 2>&1 || { cat log3; false; }      # steps 3 and 4 on one rank
    grep -q "resumed from" log3
    same_adapter one run
    mkdir -p run2 && cp -r one/checkpoint-2 one/config.yaml run2/
    train run2 --gpus 2 >log4 2>&1 || { cat log4; false; }   # and the other way round
    same_adapter one run2
}

a_rank_that_exits_stops_the_others_and_the_checkpoint_resumes() {
    local t0=$SECONDS rc=0
    CTUNE_INJECT_RANK_FAULT=1:3:exit train run --gpus 2 >log 2>&1 || rc=$?
    [ $rc = 3 ] || { echo "rc $rc"; cat log; false; }
    [ $((SECONDS - t0)) -lt 60 ]
    grep -q "rank 1 (pid [0-9]*) exited with status 3" log || { cat log; false; }
    [ -d run/checkpoint-2 ] && [ ! -d run/checkpoint-4 ] && [ ! -d run/final ]
    train run --gpus 2 >log2 2>&1 || { cat log2; false; }
    grep -q "resumed from .*checkpoint-2" log2
    train one >log1 2>&1 || { cat log1; false; }
    same_adapter one run
}

a_rank_that_hangs_is_stopped_within_the_timeout() {
    local t0=$SECONDS rc=0
    CTUNE_INJECT_RANK_FAULT=1:3:hang train run --gpus 2 --set distributed.timeout_seconds=$HANG_TIMEOUT >log 2>&1 || rc=$?
    [ $rc != 0 ] || { cat log; false; }
    [ $((SECONDS - t0)) -lt $((12 * HANG_TIMEOUT)) ] || { echo "took $((SECONDS - t0)) s"; false; }
    # rank 1's watchdog ends it; rank 0, waiting on it, hears of it at once
    grep -q "rank 1: no progress for $HANG_TIMEOUT s" log || { cat log; false; }
    grep -q "ctune: rank 1 (pid [0-9]*) exited with status 1" log || { cat log; false; }
    [ -d run/checkpoint-2 ]
    ! pgrep -f "output_dir=run " >/dev/null   # no rank left behind
}

sigterm_stops_every_rank_after_the_same_step() {
    EXEC=exec train run --gpus 2 --set training.max_steps=400 --set training.save_steps=0 >log 2>&1 &
    local pid=$! i
    for i in $(seq 200); do [ -s run/metrics.jsonl ] && break; sleep 0.1; done
    kill -TERM $pid
    local rc=0; wait $pid || rc=$?
    [ $rc = 143 ] || { echo "rc $rc"; cat log; false; }
    grep -q "interrupted by SIGTERM after step" log || { cat log; false; }
    local step; step=$(ls -d run/checkpoint-* | sed 's/.*-//')
    [ -n "$step" ] && [ "$step" -lt 400 ]
    [ "$(grep -c "rank [01]: interrupted by SIGTERM after step $step;" log)" = 2 ] || { cat log; false; }
}

evaluation_is_dealt_over_the_ranks_and_summed() {
    python3 "$ROOT/scripts/make_bench_data.py" --vocab 384 --tokens 1500 --median 100 --max-len 128 --out e.jsonl
    "$CTUNE" prepare --in e.jsonl --out evald --vocab-size 384 --eval-fraction 0 >/dev/null
    local ev=(--set "data.eval_files=[evald/train.shard]" --set training.eval_steps=2)
    train one "${ev[@]}" >log1 2>&1 || { cat log1; false; }
    train two "${ev[@]}" --gpus 2 >log2 2>&1 || { cat log2; false; }
    python3 - one/metrics.jsonl two/metrics.jsonl <<'PY'
import json, math, sys
a, b = ([(r["step"], r["eval_loss"], r.get("eval_tokens")) for r in map(json.loads, open(p)) if "eval_loss" in r]
        for p in sys.argv[1:])
assert len(a) == len(b) == 2, (a, b)   # steps 2 and 4, once each: rank 0 alone writes
for (s1, l1, n1), (s2, l2, n2) in zip(a, b):
    assert s1 == s2 and n1 == n2, (a, b)
    assert math.isfinite(l1) and abs(l1 - l2) <= 1e-6 * abs(l1), (l1, l2)
PY
}

bad_launcher_environments_are_input_errors() {
    RANK=2 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 expect_exit 2 train run
    grep -q "RANK=2" err.txt
    RANK=0 WORLD_SIZE=2 expect_exit 2 train run
    grep -q "MASTER_ADDR is not set" err.txt
    RANK=0 WORLD_SIZE=two expect_exit 2 train run
    grep -q "WORLD_SIZE=two" err.txt
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=99999 expect_exit 2 train run
    grep -q "MASTER_PORT=99999" err.txt
    CTUNE_INJECT_RANK_FAULT=1:x expect_exit 2 train run --gpus 2
    grep -q "CTUNE_INJECT_RANK_FAULT" err.txt
}

an_allocations_task_count_outside_srun_is_one_process() {
    SLURM_NTASKS=4 SLURM_PROCID=0 SLURM_LOCALID=0 train run --set training.max_steps=1 --set training.warmup_steps=0 \
        --set training.save_steps=0 >log 2>&1 || { cat log; false; }
    ! grep -q "ranks:" log
    [ -d run/final ]
}

bad_gpus_options_are_usage_errors() {
    expect_exit 2 train run --gpus 0
    expect_exit 2 train run --gpus two
    expect_exit 2 train run --gpus 4            # 2 micro-batches a step for 4 ranks
    grep -q "gradient_accumulation_steps is 2" err.txt
    WORLD_SIZE=2 RANK=0 expect_exit 2 train run --gpus 2
    grep -q "under a launcher" err.txt
    [ ! -d run/checkpoint-2 ]
}

run_test two_ranks_equal_one_rank_accumulating_bit_for_bit
run_test two_ranks_with_several_micro_batches_each_match_within_1e-5
run_test a_launchers_environment_runs_the_same_step
run_test resume_with_another_number_of_ranks
run_test a_rank_that_exits_stops_the_others_and_the_checkpoint_resumes
run_test a_rank_that_hangs_is_stopped_within_the_timeout
run_test sigterm_stops_every_rank_after_the_same_step
run_test evaluation_is_dealt_over_the_ranks_and_summed
run_test bad_launcher_environments_are_input_errors
run_test an_allocations_task_count_outside_srun_is_one_process
run_test bad_gpus_options_are_usage_errors
summary
