# init.test.sh — `ctune init` writes a loadable random model; `ctune inspect`
# checks it. Run by tests/run_tests.sh with $CTUNE set.
. tests/lib.sh
TINY=$ROOT/configs/models/tiny/config.json

init_tiny_writes_config_and_weights() {
    "$CTUNE" init --config "$TINY" --out m >log.txt
    test -f m/config.json && test -f m/model.safetensors
    cmp m/config.json "$TINY"              # byte copy: HF reads exactly the input
    grep -q "836736 parameters" log.txt
}

inspect_reports_weights_ok() {
    "$CTUNE" init --config "$TINY" --out m >/dev/null
    "$CTUNE" inspect m >out.txt
    grep -q "weights: ok (38 tensors" out.txt
    grep -q "architecture    llama" out.txt
}

same_seed_gives_identical_bytes() {
    "$CTUNE" init --config "$TINY" --out a --seed 7 >/dev/null
    "$CTUNE" init --config "$TINY" --out b --seed 7 >/dev/null
    cmp a/model.safetensors b/model.safetensors
}

different_seed_gives_different_bytes() {
    "$CTUNE" init --config "$TINY" --out a --seed 1 >/dev/null
    "$CTUNE" init --config "$TINY" --out b --seed 2 >/dev/null
    ! cmp -s a/model.safetensors b/model.safetensors
}

config_folder_is_accepted_as_config() {
    "$CTUNE" init --config "$ROOT/configs/models/tiny-moe" --out m >/dev/null
    "$CTUNE" inspect m | grep -q "weights: ok"
}

missing_config_exits_2() {
    expect_exit 2 "$CTUNE" init --config does-not-exist.json --out m
    grep -q "does-not-exist.json" err.txt
}

missing_out_is_a_usage_error() {
    expect_exit 2 "$CTUNE" init --config "$TINY"
    grep -q "usage:" err.txt
}

unsupported_model_type_exits_2_with_message() {
    sed 's/"llama"/"bert"/' "$TINY" >bert.json
    expect_exit 2 "$CTUNE" init --config bert.json --out m
    grep -q "model_type 'bert' is not supported (supported: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, gpt_oss, qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text, qwen3_next)" err.txt
    test ! -e m/config.json
}

existing_model_is_not_overwritten() {
    "$CTUNE" init --config "$TINY" --out m --seed 1 >/dev/null
    cp m/model.safetensors before.safetensors
    expect_exit 2 "$CTUNE" init --config "$TINY" --out m --seed 2
    grep -q "refusing to overwrite" err.txt
    cmp m/model.safetensors before.safetensors
}

small_shard_limit_writes_index_and_same_tensors() {
    "$CTUNE" init --config "$TINY" --out one >/dev/null
    "$CTUNE" init --config "$TINY" --out many --max-shard-bytes 200000 >/dev/null
    test -f many/model.safetensors.index.json
    test ! -e many/model.safetensors
    test "$(ls many/model-0000*-of-*.safetensors | wc -l)" -gt 1
    grep -q '"total_size":1673472' many/model.safetensors.index.json
    "$CTUNE" inspect many | grep -q "weights: ok (38 tensors"
}

# The Gated DeltaNet hybrids: init writes them, inspect reads them, train, eval and generate run them.
GDN_MODELS="tiny-qwen3_5 tiny-qwen3_5-text tiny-qwen3_5-moe tiny-qwen3-next"

gdn_families_init_and_inspect_ok() {
    for name in $GDN_MODELS; do
        "$CTUNE" init --config "$ROOT/configs/models/$name" --out "$name" >/dev/null
        "$CTUNE" inspect "$name" >"$name.txt"
        grep -q "weights: ok" "$name.txt"
        grep -q "Gated DeltaNet" "$name.txt"
    done
    grep -q "under model.language_model. (multimodal wrapper" tiny-qwen3_5.txt
    grep -q "grouped qkvz/ba projections" tiny-qwen3-next.txt
    grep -q "gated shared expert 64" tiny-qwen3_5-moe.txt
}

# ctune's decoder runs every GDN family on the CPU (conv and delta-rule states
# carried per layer), a prompt of ids and a chat prompt; eval --generate shares it.
gdn_families_generate_on_the_cpu() {
    for name in $GDN_MODELS; do
        "$CTUNE" init --config "$ROOT/configs/models/$name" --out "$name" >/dev/null
        expect_exit 0 "$CTUNE" generate --model "$name" --prompt-ids 1,2,3 --max-new-tokens 5 --device cpu --ids
        test "$(wc -w <out.txt)" -eq 5
        grep -q "3 prompt tokens, 5 new tokens" err.txt
        expect_exit 0 "$CTUNE" generate --model "$name" --prompt "hi" --max-new-tokens 5 --device cpu
    done
    printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}\n' >ev.jsonl
    expect_exit 0 "$CTUNE" eval --model tiny-qwen3_5 --generate ev.jsonl --max-new-tokens 4 --device cpu
    grep -q "exact match: 0/1" out.txt
}

# qwen3_next trains on the CPU (its grouped in_proj_qkvz / in_proj_ba adapted,
# as PEFT names them), its adapter evaluates and generates, and merge writes the grouped weights.
qwen3_next_trains_evaluates_and_merges() {
    "$CTUNE" init --config "$ROOT/configs/models/tiny-qwen3-next" --out n --seed 3 >/dev/null
    "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model=n --set output_dir=run --set device=cpu \
        --set training.max_steps=2 --set training.warmup_steps=0 --set training.eval_steps=0 \
        --set training.save_steps=0 --set data.tokens_per_micro_batch=256 --set data.max_length=256 \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set "data.eval_files=[]" >train.txt 2>&1
    grep -q '"in_proj_qkvz"' run/final/adapter_config.json
    grep -q '"in_proj_ba"' run/final/adapter_config.json
    "$CTUNE" eval "$ROOT/configs/tiny.yaml" --set model=n --set device=cpu --adapter run/final \
        --set "data.eval_files=[$ROOT/data/arith/eval.shard]" >eval.txt 2>&1
    grep -q "eval: loss" eval.txt
    expect_exit 0 "$CTUNE" generate --model n --adapter run/final --prompt-ids 1,2,3 --max-new-tokens 4 --device cpu --ids
    test "$(wc -w <out.txt)" -eq 4
    "$CTUNE" merge --model n --adapter run/final --out merged >merge.txt 2>&1
    grep -q "merged .* LoRA modules" merge.txt
    "$CTUNE" inspect merged | grep -q "weights: ok"
    ! cmp -s n/model.safetensors merged/model.safetensors
}

# a projection of the other GDN layout is named, not silently dropped
gdn_projection_of_the_other_layout_is_an_input_error() {
    "$CTUNE" init --config "$ROOT/configs/models/tiny-qwen3-next" --out n >/dev/null
    expect_exit 2 "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model=n --set output_dir=run --set device=cpu \
        --set "lora.target_modules=[q_proj,in_proj_qkv]" --set "data.train_files=[$ROOT/data/arith/train.shard]" \
        --set "data.eval_files=[]"
    grep -q "lora.target_modules: in_proj_qkv: model_type qwen3_next has no such projection (its linear_attn has in_proj_qkvz, in_proj_ba and out_proj)" err.txt
}

# A qwen3_5 wrapper trains on the CPU, and merge finds its weights under model.language_model.
gdn_wrapper_trains_and_merges() {
    "$CTUNE" init --config "$ROOT/configs/models/tiny-qwen3_5" --out w --seed 3 >/dev/null
    "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model=w --set output_dir=run --set device=cpu \
        --set training.max_steps=2 --set training.warmup_steps=0 --set training.eval_steps=0 \
        --set training.save_steps=0 --set data.tokens_per_micro_batch=256 --set data.max_length=256 \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set "data.eval_files=[]" >train.txt 2>&1
    test -f run/final/adapter_model.safetensors
    "$CTUNE" merge --model w --adapter run/final --out merged >merge.txt 2>&1
    grep -q "merged .* LoRA modules" merge.txt
    "$CTUNE" inspect merged | grep -q "weights: ok"
    ! cmp -s w/model.safetensors merged/model.safetensors
}

run_test init_tiny_writes_config_and_weights
run_test inspect_reports_weights_ok
run_test same_seed_gives_identical_bytes
run_test different_seed_gives_different_bytes
run_test config_folder_is_accepted_as_config
run_test missing_config_exits_2
run_test missing_out_is_a_usage_error
run_test unsupported_model_type_exits_2_with_message
run_test existing_model_is_not_overwritten
run_test small_shard_limit_writes_index_and_same_tensors
run_test gdn_families_init_and_inspect_ok
run_test gdn_families_generate_on_the_cpu
run_test qwen3_next_trains_evaluates_and_merges
run_test gdn_projection_of_the_other_layout_is_an_input_error
run_test gdn_wrapper_trains_and_merges
summary
