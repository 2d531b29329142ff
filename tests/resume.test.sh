# resume.test.sh — what a resume accepts: the config it is resumed under
# against the one its checkpoint's run had (resume_check.h), the trainer state
# read back (counters in range, finite weights and moments), and metrics.jsonl
# continued with one record per step, equal to an uninterrupted run's.
# Sourced helpers: tests/lib.sh.
source "$(dirname "$0")/lib.sh"

MODEL=$(mktemp -d)/tiny
"$CTUNE" init --config "$ROOT/configs/models/tiny/config.json" --out "$MODEL" --seed 1 >/dev/null

# A short run that checkpoints every 2 steps and logs every step.
train() {
    local out=$1; shift
    "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model="$MODEL" --set output_dir="$out" \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set data.eval_files= \
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.logging_steps=1 \
        --set training.eval_steps=0 --set training.save_steps=2 --set training.save_total_limit=0 \
        --set training.warmup_steps=1 --set training.max_steps=4 --set training.resume_from_checkpoint=auto "$@"
}

# A run folder that stopped after step 2: checkpoint-2 of a finished 4-step run.
stopped_at_2() {
    train full 2>log_full || { cat log_full; false; }
    mkdir -p run && cp -r full/checkpoint-2 run/ && cp full/config.yaml run/
}

# poke DIR FILE TENSOR INDEX VALUE: sets one element of a safetensors tensor in
# DIR/FILE and rewrites DIR/manifest.json to match, as a careful editor would.
poke() {
    python3 - "$@" <<'PY'
import json, struct, sys, zlib
d, name, tensor, index, value = sys.argv[1:]
path = f"{d}/{name}"
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
t = json.loads(raw[8:8 + n])[tensor]
fmt = {"F32": "<f", "F64": "<d", "I64": "<q"}[t["dtype"]]
at = 8 + n + t["data_offsets"][0] + int(index) * struct.calcsize(fmt)
struct.pack_into(fmt, raw, at, float(value) if fmt != "<q" else int(value))
open(path, "wb").write(raw)
m = json.load(open(f"{d}/manifest.json"))
for f in m["files"]:
    if f["name"] == name:
        f["size"], f["crc32"] = len(raw), zlib.crc32(raw)
json.dump(m, open(f"{d}/manifest.json", "w"))
PY
}

changes_that_do_not_affect_the_math_are_reported_and_resume() {
    stopped_at_2
    train run --set training.logging_steps=2 --set training.save_total_limit=3 2>log || { cat log; false; }
    grep -q 'resume: training.logging_steps changed 1 -> 2' log
    grep -q 'resume: training.save_total_limit changed 0 -> 3' log
    grep -q 'resumed from run/checkpoint-2' log
    cmp full/final/adapter_model.safetensors run/final/adapter_model.safetensors
    # the run's first config stays; the resumed one is kept beside it
    cmp full/config.yaml run/config.yaml
    grep -q 'logging_steps: 2' run/config.resume-2.yaml
}

each_key_the_math_depends_on_is_refused_naming_it_and_the_checkpoint() {
    stopped_at_2
    local set key
    for set in training.learning_rate=1e-3 lora.lora_alpha=8 lora.use_rslora=true training.seed=1 \
        training.gradient_accumulation_steps=2 data.tokens_per_micro_batch=512 training.warmup_steps=2 \
        training.lr_scheduler_type=linear "data.train_files=[$ROOT/data/arith/eval.shard]"; do
        key=${set%%=*}
        expect_exit 2 train run --set "$set"
        grep -q "resume: $key changed" err.txt || { echo "no note for $key"; cat err.txt; false; }
        grep -q "ctune train: run/checkpoint-2: cannot resume: .*$key" err.txt || { cat err.txt; false; }
        [ "$(grep -c '^ctune train:' err.txt)" -eq 1 ]
    done
    # nothing was written: the refused run left the folder as it was
    [ ! -e run/metrics.jsonl ] && [ ! -e run/config.resume-2.yaml ]
}

changed_rank_is_refused_before_the_adapter_is_read() {
    stopped_at_2
    expect_exit 2 train run --set lora.r=8
    grep -q 'run/checkpoint-2: cannot resume: lora.r changed, so its adapter does not fit' err.txt
    if grep -q 'shape' err.txt; then cat err.txt; false; fi
}

a_finished_run_is_not_extended_by_a_longer_cosine_schedule() {
    train full 2>log || { cat log; false; }
    expect_exit 2 train full --set training.max_steps=8
    grep -q 'cannot resume: training.max_steps/num_train_epochs' err.txt
    grep -q 'the run now has 8 steps, the checkpoint.s run had 4' err.txt
    [ ! -e full/checkpoint-8 ]
}

a_constant_learning_rate_continues_into_more_steps() {
    train full --set training.lr_scheduler_type=constant 2>log || { cat log; false; }
    train full --set training.lr_scheduler_type=constant --set training.max_steps=6 2>log2 || { cat log2; false; }
    grep -q 'resumed from full/checkpoint-4' log2 && [ -d full/checkpoint-6 ]
}

# The data is compared by content: a copy of the same shard elsewhere is the
# same data; a shard rewritten in place is not.
data_is_compared_by_content_not_by_path() {
    cp "$ROOT/data/arith/train.shard" moved.shard
    train full --set "data.train_files=[moved.shard]" 2>log || { cat log; false; }
    mkdir -p run && cp -r full/checkpoint-2 run/
    train run --set "data.train_files=[$ROOT/data/arith/train.shard]" 2>log2 || { cat log2; false; }
    grep -q 'resume: data.train_files changed' log2
    cmp full/final/adapter_model.safetensors run/final/adapter_model.safetensors
    rm -rf run/final run/checkpoint-4
    cp "$ROOT/data/arith/eval.shard" moved.shard
    expect_exit 2 train run --set "data.train_files=[moved.shard]"
    grep -q "cannot resume: data.train_files (contents)" err.txt
}

edited_counters_are_an_input_error_naming_the_field() {
    stopped_at_2
    local bad
    for bad in 1000000000000 2147483655 -3; do
        rm -rf run/checkpoint-2 && cp -r full/checkpoint-2 run/
        poke run/checkpoint-2 trainer_state.safetensors counters 0 "$bad"
        expect_exit 2 train run
        grep -q "run/checkpoint-2/trainer_state.safetensors: counters: step is $bad (expected 0 .. 2147483646" err.txt ||
            { cat err.txt; false; }
    done
    rm -rf run/checkpoint-2 && cp -r full/checkpoint-2 run/
    poke run/checkpoint-2 trainer_state.safetensors counters 2 5000 # epoch
    expect_exit 2 train run
    grep -q 'counters: epoch is 5000' err.txt
    rm -rf run/checkpoint-2 && cp -r full/checkpoint-2 run/
    poke run/checkpoint-2 trainer_state.safetensors log_window 4 1e30 # tokens in the window
    expect_exit 2 train run
    grep -q 'log_window: tokens is 1e+30' err.txt
}

nonfinite_or_negative_state_is_an_input_error_naming_the_tensor() {
    stopped_at_2
    local case tensor file value want
    for case in "trainer_state.safetensors exp_avg_sq -1 exp_avg_sq: .* is -1 (expected finite values >= 0" \
                "trainer_state.safetensors exp_avg_sq nan exp_avg_sq: .* is nan" \
                "trainer_state.safetensors exp_avg inf exp_avg: .* is inf" \
                "adapter_model.safetensors base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight nan layers.1.self_attn.v_proj.lora_B.weight element 3 is nan"; do
        read -r file tensor value want <<<"$case"
        rm -rf run/checkpoint-2 && cp -r full/checkpoint-2 run/
        poke run/checkpoint-2 "$file" "$tensor" 3 "$value"
        expect_exit 2 train run
        grep -q "run/checkpoint-2/$file: .*$want" err.txt || { echo "want: $want"; cat err.txt; false; }
    done
    [ ! -d run/final ]
}

# Logged every 3 steps, saved every 2: the window of step 3's record spans the
# checkpoint at step 2. The resumed run logs what the uninterrupted one does,
# and a metrics.jsonl that a kill left ahead of the checkpoint (the records of
# steps 3 and 6, a line cut short) is cut back to it first.
resumed_metrics_equal_an_uninterrupted_runs_one_record_per_step() {
    train full --set training.logging_steps=3 --set training.max_steps=6 2>log_full || { cat log_full; false; }
    mkdir -p run && cp -r full/checkpoint-2 run/ && cp full/config.yaml run/
    cp full/metrics.jsonl run/metrics.jsonl
    printf '{"step": 5, "loss": 1.2' >>run/metrics.jsonl
    train run --set training.logging_steps=3 --set training.max_steps=6 2>log || { cat log; false; }
    untimed() { sed -E 's/, "tokens_per_second": [^,}]*//; s/, "elapsed": [^,}]*//' "$1"; }
    diff <(untimed full/metrics.jsonl) <(untimed run/metrics.jsonl)
    [ "$(wc -l <run/metrics.jsonl)" -eq 2 ]
}

run_test changes_that_do_not_affect_the_math_are_reported_and_resume
run_test each_key_the_math_depends_on_is_refused_naming_it_and_the_checkpoint
run_test changed_rank_is_refused_before_the_adapter_is_read
run_test a_finished_run_is_not_extended_by_a_longer_cosine_schedule
run_test a_constant_learning_rate_continues_into_more_steps
run_test data_is_compared_by_content_not_by_path
run_test edited_counters_are_an_input_error_naming_the_field
run_test nonfinite_or_negative_state_is_an_input_error_naming_the_tensor
run_test resumed_metrics_equal_an_uninterrupted_runs_one_record_per_step
rm -rf "$(dirname "$MODEL")"
summary
