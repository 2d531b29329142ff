# tools.test.sh — the commands around training, end to end on the CPU: sweep.sh
# and `ctune summary`, loss.svg, `ctune merge` (round trip through `ctune eval`),
# `ctune inspect` on checkpoints, `ctune generate`, and SIGINT/SIGTERM during
# `ctune train`. One small sweep of
# two tiny runs is shared by the tests that only read runs.
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

WORK=$(mktemp -d)
MODEL=$WORK/tiny
"$CTUNE" init --config "$ROOT/configs/models/tiny/config.json" --out "$MODEL" --seed 1 >/dev/null
# 16 held-out chats: a quick eval set
head -n 16 "$ROOT/data/arith/chat_eval.jsonl" >"$WORK/eval.jsonl"
python3 "$ROOT/scripts/prepare_data.py" --in "$WORK/eval.jsonl" --out "$WORK/data" --tokenizer bytes \
    --split-name eval --ctune "$CTUNE" >/dev/null 2>&1
COMMON=(--set model="$MODEL" --set "data.train_files=[$ROOT/data/arith/train.shard]"
        --set "data.eval_files=[$WORK/data/eval.shard]" --set data.tokens_per_micro_batch=256
        --set data.max_length=256 --set training.logging_steps=1 --set training.warmup_steps=1
        --set training.learning_rate=5e-3)
SWEEP=$WORK/sweep
CTUNE="$CTUNE" bash "$ROOT/scripts/sweep.sh" "$ROOT/configs/tiny.yaml" "$SWEEP" lora.r=4,8 -- "${COMMON[@]}" \
    --set training.max_steps=6 --set training.eval_steps=3 --set training.save_steps=3 >"$WORK/sweep.out" 2>&1

sweep_runs_each_combination_in_its_own_folder() {
    cat "$WORK/sweep.out"
    [ -f "$SWEEP/r-4/final/adapter_config.json" ] && [ -f "$SWEEP/r-8/final/adapter_config.json" ]
    grep -q '"r": 8' "$SWEEP/r-8/final/adapter_config.json"
    [ "$(wc -l <"$SWEEP/summary.csv")" -eq 3 ]
}

summary_prints_a_row_per_run_and_writes_csv() {
    "$CTUNE" summary "$SWEEP/r-4" "$SWEEP/r-8/" "$SWEEP/summary.csv" >table.txt
    cat table.txt
    grep -q '^run  *steps  *train_loss  *eval_loss' table.txt
    grep -q "r-4 *6 " table.txt && grep -q "r-8 *6 " table.txt
    head -n 1 summary.csv | grep -q '^run,steps,train_loss,eval_loss,tokens_per_s,wall_time_s,peak_mem_gib$'
    # every run has a final train and eval loss
    [ "$(awk -F, 'NR > 1 && $3 != "" && $4 != ""' summary.csv | wc -l)" -eq 2 ]
    "$CTUNE" summary --out other.csv "$SWEEP/r-4" >/dev/null && [ "$(wc -l <other.csv)" -eq 2 ]
    expect_exit 2 "$CTUNE" summary "$WORK/data"
}

loss_svg_is_well_formed_xml_with_train_eval_and_lr() {
    python3 - "$SWEEP/r-8/loss.svg" <<'PY'
import sys, xml.dom.minidom
doc = xml.dom.minidom.parse(sys.argv[1])
assert doc.documentElement.tagName == "svg"
assert len(doc.getElementsByTagName("polyline")) == 3, "train, eval and lr lines"
assert len(doc.getElementsByTagName("circle")) == 2, "evals at steps 3 and 6"
PY
}

merge_round_trip_gives_the_eval_loss_of_base_plus_adapter() {
    "$CTUNE" merge --model "$MODEL" --adapter "$SWEEP/r-8/final" --out merged >merge.out
    [ -f merged/config.json ] && [ -f merged/model.safetensors ]
    ev() { "$CTUNE" eval "$ROOT/configs/tiny.yaml" "${COMMON[@]}" --set output_dir=x "$@" | sed 's/.*loss \([0-9.]*\) .*/\1/'; }
    base=$(ev) with=$(ev --adapter "$SWEEP/r-8/final") merged=$(ev --set model="$PWD/merged")
    echo "eval loss: base $base, base + adapter $with, merged $merged"
    # the adapter matters, and the merged model reproduces it to bf16 rounding
    awk -v b="$base" -v w="$with" -v m="$merged" 'BEGIN {
        d = m - w; if (d < 0) d = -d; a = b - w; if (a < 0) a = -a
        exit !(a > 0.05 && d < 2e-3 * w) }'
    expect_exit 2 "$CTUNE" merge --model "$MODEL" --adapter "$SWEEP/r-8/final" --out merged
}

inspect_verifies_a_checkpoint_against_its_manifest() {
    cp -r "$(ls -d "$SWEEP"/r-4/checkpoint-* | tail -n 1)" ck
    expect_exit 0 "$CTUNE" inspect ck
    grep -q '^manifest: ok' out.txt && grep -q -- '--- trainer_state.json' out.txt
    # one changed byte in the adapter weights: its CRC32 no longer matches the manifest
    printf '\377' | dd of=ck/adapter_model.safetensors bs=1 seek=200 conv=notrunc 2>/dev/null
    expect_exit 2 "$CTUNE" inspect ck
    grep -q 'ck/adapter_model.safetensors: CRC32 .*(corrupt)' err.txt
    rm ck/manifest.json
    expect_exit 2 "$CTUNE" inspect ck
    grep -q 'manifest.json' err.txt
    # final/ is an adapter folder: nothing to verify, and it says so
    expect_exit 0 "$CTUNE" inspect "$SWEEP/r-4/final"
    grep -q '^manifest: none' out.txt
}

generate_is_deterministic_for_a_seed() {
    gen() { "$CTUNE" generate --model "$MODEL" --adapter "$SWEEP/r-8/final" --prompt "What is 2 plus 3?" \
            --max-new-tokens 24 --device cpu "$@" 2>/dev/null; }
    gen --temperature 0.9 --top-p 0.95 --seed 7 --ids >a.txt
    gen --temperature 0.9 --top-p 0.95 --seed 7 --ids >b.txt
    cmp a.txt b.txt && [ -s a.txt ]
    gen >g1.txt && gen >g2.txt && cmp g1.txt g2.txt
    # a seed changes sampling, and never greedy decoding
    gen --temperature 0.9 --top-p 0.95 --seed 8 --ids >c.txt
    ! cmp -s a.txt c.txt
    gen --seed 8 >g3.txt && cmp g1.txt g3.txt
    "$CTUNE" generate --model "$MODEL" --prompt-ids 257,117,115,101,114,10 --max-new-tokens 5 --ids \
        --device cpu >ids.txt 2>err.txt
    [ "$(wc -w <ids.txt)" -ge 1 ] && grep -q 'generate: 6 prompt tokens' err.txt
}

generate_refuses_text_prompts_without_the_byte_tokenizer() {
    sed 's/"vocab_size": 384/"vocab_size": 512/' "$ROOT/configs/models/tiny/config.json" >config.json
    "$CTUNE" init --config config.json --out m512 >/dev/null
    expect_exit 2 "$CTUNE" generate --model m512 --prompt "hi" --device cpu
    grep -q -- '--prompt-ids' err.txt
    expect_exit 2 "$CTUNE" generate --model m512 --prompt-ids 1,x,3 --device cpu
    expect_exit 2 "$CTUNE" generate --model m512 --prompt-ids 600 --device cpu
}

# Starts a 12-step run in the background (pid in $run_pid) and waits (up to 300 s:
# sanitizer builds on a loaded 2-core machine are slow) for step $1.
start_run() {
    local at=$1; shift
    "$CTUNE" train "$ROOT/configs/tiny.yaml" "${COMMON[@]}" --set output_dir=run --set training.max_steps=12 \
        --set training.eval_steps=0 --set training.save_steps=0 "$@" 2>train.log &
    run_pid=$!
    for _ in $(seq 3000); do
        grep -q "\"step\": $at," run/metrics.jsonl 2>/dev/null && return 0
        kill -0 $run_pid 2>/dev/null || break
        sleep 0.1
    done
    echo "step $at never came"; cat train.log; return 1
}

sigint_saves_a_checkpoint_and_resume_finishes() {
    start_run 2
    kill -INT $run_pid
    rc=0; wait $run_pid || rc=$?
    cat train.log
    [ $rc -eq 130 ]
    grep -q 'interrupted by SIGINT after step' train.log
    ls -d run/checkpoint-* && [ ! -d run/final ]
    "$CTUNE" train "$ROOT/configs/tiny.yaml" "${COMMON[@]}" --set output_dir=run --set training.max_steps=12 \
        --set training.eval_steps=0 --set training.save_steps=0 2>resume.log
    grep -q 'resumed from run/checkpoint-' resume.log && [ -f run/final/adapter_model.safetensors ]
    grep -q '"step": 12,' run/metrics.jsonl
}

sigterm_exits_143_with_a_checkpoint() {
    start_run 1
    kill -TERM $run_pid
    rc=0; wait $run_pid || rc=$?
    [ $rc -eq 143 ] && grep -q 'interrupted by SIGTERM' train.log && ls -d run/checkpoint-*
}

a_second_sigint_aborts_without_saving() {
    # 16 micro-batches per step: the second signal lands while the first step runs
    start_run 1 --set training.gradient_accumulation_steps=16
    kill -INT $run_pid
    sleep 0.2
    kill -INT $run_pid
    rc=0; wait $run_pid || rc=$?
    cat train.log
    [ $rc -eq 130 ] && grep -q 'aborting without saving' train.log
    ! ls -d run/checkpoint-* 2>/dev/null
}

run_test sweep_runs_each_combination_in_its_own_folder
run_test summary_prints_a_row_per_run_and_writes_csv
run_test loss_svg_is_well_formed_xml_with_train_eval_and_lr
run_test merge_round_trip_gives_the_eval_loss_of_base_plus_adapter
run_test inspect_verifies_a_checkpoint_against_its_manifest
run_test generate_is_deterministic_for_a_seed
run_test generate_refuses_text_prompts_without_the_byte_tokenizer
run_test sigint_saves_a_checkpoint_and_resume_finishes
run_test sigterm_exits_143_with_a_checkpoint
run_test a_second_sigint_aborts_without_saving
rm -rf "$WORK"
summary
