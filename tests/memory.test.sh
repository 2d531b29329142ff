# memory.test.sh — the memory plan from the command line: --dry-run, offload
# on the CPU backend (its copies are immediate, so the losses must equal a run
# without offload to every printed digit), the pageable-memory fallback, a
# config that asks for offload without checkpointing, checkpoint_layers auto
# (the same losses, no layer recomputed when memory allows), and micro-batches
# too large for the host: refused (exit 2) with the largest that fits, which
# then passes its dry run. Helpers: tests/lib.sh.
source "$(dirname "$0")/lib.sh"

# The CPU plan has the least of MemAvailable and what `ulimit -v` / `ulimit -d`
# leave; a small data limit (-d: -v would also count the address space of the
# CUDA libraries a GPU build maps) keeps the largest micro-batch that fits
# cheap to dry-run. ASan's shadow memory counts against it, so under the
# sanitizers these tests cannot run.
LIMIT_KIB=$((640 * 1024))

MODEL=$(mktemp -d)/tiny
"$CTUNE" init --config "$ROOT/configs/models/tiny/config.json" --out "$MODEL" --seed 1 >/dev/null

run_tiny() {
    local out=$1; shift
    "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model="$MODEL" --set output_dir="$out" --set device=cpu \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set "data.eval_files=[]" \
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.logging_steps=1 \
        --set training.save_total_limit=0 --set training.max_steps=3 --set training.warmup_steps=1 "$@"
}

dry_run_prints_the_plan_and_writes_nothing() {
    run_tiny out --dry-run >log 2>&1 || { cat log; false; }
    grep -q "memory plan (cpu, 256 tokens per micro-batch)" log
    grep -q "saved layer inputs" log && grep -q "layer working set" log && grep -q "total (host memory)" log
    grep -q "dry run: the plan fits" log
    [ ! -e out ]
}

offload_on_trains_to_the_same_losses() {
    run_tiny plain --set memory.activation_offload=off >log1 2>&1 || { cat log1; false; }
    run_tiny off --set memory.activation_offload=on >log2 2>&1 || { cat log2; false; }
    grep -q "offload staging" log2 && grep -q "inputs of layers 0-3 in host memory" log2
    diff <(sed 's/"tokens_per_second.*//' plain/metrics.jsonl) <(sed 's/"tokens_per_second.*//' off/metrics.jsonl)
}

pageable_fallback_warns_and_trains() {
    CTUNE_INJECT_PIN_FAIL=1 run_tiny out --set memory.activation_offload=on >log 2>&1 || { cat log; false; }
    grep -q "warning: page-locked host memory for offloaded activations could not be had" log
    [ -f out/final/adapter_model.safetensors ]
}

auto_checkpoint_layers_keeps_every_layer_when_memory_allows() {
    run_tiny plain >log1 2>&1 || { cat log1; false; }
    run_tiny kept --set memory.checkpoint_layers=auto >log2 2>&1 || { cat log2; false; }
    grep -q "layers 0-3 keep their intermediates; none is recomputed" log2
    diff <(sed 's/"tokens_per_second.*//' plain/metrics.jsonl) <(sed 's/"tokens_per_second.*//' kept/metrics.jsonl)
}

bad_checkpoint_layers_value_is_named() {
    expect_exit 2 run_tiny out --set memory.checkpoint_layers=some
    grep -q "memory.checkpoint_layers" err.txt && grep -q "all or auto" err.txt
}

offload_without_checkpointing_is_a_config_error() {
    expect_exit 2 run_tiny out --set memory.activation_offload=on --set memory.gradient_checkpointing=false
    grep -q -- "--set memory.activation_offload=on: memory.activation_offload: on needs memory.gradient_checkpointing: true" err.txt
    grep -q "; memory.gradient_checkpointing comes from --set memory.gradient_checkpointing=false" err.txt
    [ "$(wc -l < err.txt)" -eq 1 ]
}

largest_that_fits() { sed -n 's/.*the largest data.tokens_per_micro_batch that fits is \([0-9]*\).*/\1/p' err.txt; }

micro_batch_that_fits_nowhere_names_the_largest_that_does() {
    (ulimit -d $LIMIT_KIB; expect_exit 2 run_tiny out --dry-run --set data.tokens_per_micro_batch=2147483647)
    grep -q "memory plan: 2147483647 tokens per micro-batch need .* GiB of cpu memory" err.txt
    [ "$(wc -l < err.txt)" -eq 1 ]
    local n
    n=$(largest_that_fits)
    [ -n "$n" ] && [ "$n" -ge 256 ] && [ "$n" -lt 2147483647 ] || { cat err.txt; false; }
    (ulimit -d $LIMIT_KIB; run_tiny out --dry-run --set data.tokens_per_micro_batch="$n") >log 2>&1 || { cat log; false; }
    grep -q "dry run: the plan fits" log
    (ulimit -d $LIMIT_KIB; expect_exit 2 run_tiny out --dry-run --set data.tokens_per_micro_batch=$((n + 1)))
    grep -q "that fits is $n\$" err.txt
    [ ! -e out ]
}

cpu_plan_over_host_memory_is_refused_not_allocated() {
    # 4.4 GiB: the plan used to pass on the CPU and the allocation then failed (exit 1)
    (ulimit -d $LIMIT_KIB; expect_exit 2 run_tiny out --dry-run --set data.tokens_per_micro_batch=400000)
    grep -q "memory plan: 400000 tokens per micro-batch" err.txt && [ -n "$(largest_that_fits)" ]
    # offload on the CPU moves layer inputs within the same memory: it adds staging, never room
    (ulimit -d $LIMIT_KIB; expect_exit 2 run_tiny out --dry-run --set data.tokens_per_micro_batch=400000 \
        --set memory.activation_offload=on)
    local n
    n=$(largest_that_fits)
    [ -n "$n" ] || { cat err.txt; false; }
    (ulimit -d $LIMIT_KIB; run_tiny out --dry-run --set data.tokens_per_micro_batch="$n" \
        --set memory.activation_offload=on) >log 2>&1 || { cat log; false; }
    grep -q "offload staging" log && grep -q "dry run: the plan fits" log
}

run_test dry_run_prints_the_plan_and_writes_nothing
run_test offload_on_trains_to_the_same_losses
run_test pageable_fallback_warns_and_trains
run_test offload_without_checkpointing_is_a_config_error
run_test auto_checkpoint_layers_keeps_every_layer_when_memory_allows
run_test bad_checkpoint_layers_value_is_named
if [ -n "${CTUNE_SANITIZED:-}" ]; then
    skip_test micro_batch_that_fits_nowhere_names_the_largest_that_does "ulimit -d under ASan"
    skip_test cpu_plan_over_host_memory_is_refused_not_allocated "ulimit -d under ASan"
else
    run_test micro_batch_that_fits_nowhere_names_the_largest_that_does
    run_test cpu_plan_over_host_memory_is_refused_not_allocated
fi
rm -rf "$(dirname "$MODEL")"
summary
