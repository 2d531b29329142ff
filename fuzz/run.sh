#!/usr/bin/env bash
# fuzz/run.sh TARGET... — runs each built libFuzzer target (build-fuzz/fuzz_NAME)
# for FUZZ_SECONDS on a corpus seeded from the repo's own files, then prints one
# table row per target: executions, seconds, corpus size, findings.
# Crashing inputs land in build-fuzz/crashes/NAME/; copy each into
# tests/fuzz_regressions/NAME/ once fixed, so CI replays it for good.
set -u
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-60}
out=build-fuzz
found=0

# join OUT DIR NAME...: the files NAME... of folder DIR as one input of a
# folder reader (fuzz_adapter, fuzz_checkpoint), FUZZ_FILE_SEP (fuzz/fuzz.h)
# between them.
join() {
    local out=$1 dir=$2 sep='' n
    shift 2
    : >"$out"
    for n in "$@"; do
        printf "$sep" >>"$out"
        cat "$dir/$n" >>"$out"
        sep='\n--ctune-fuzz-file--\n'
    done
}

# seed_NAME DIR: copies the repo files that are valid inputs of NAME into DIR.
seed() {
    local name=$1 dir=$2 d
    mkdir -p "$dir"
    case $name in
    adapter)
        for d in tests/fixtures/*/adapter; do
            join "$dir/$(echo "$d" | tr / _)" "$d" adapter_config.json adapter_model.safetensors
        done
        files=() ;;
    checkpoint)
        for d in fuzz/seeds/checkpoint/*/; do
            join "$dir/checkpoint_$(basename "$d")" "$d" trainer_state.safetensors adapter_model.safetensors manifest.json
        done
        files=() ;;
    config) files=(configs/*.yaml tests/fixtures/*/train.yaml) ;;
    json) files=(configs/models/*/config.json tests/fixtures/*/adapter/adapter_config.json) ;;
    model_config) files=(configs/models/*/config.json tests/fixtures/*/config.json) ;;
    safetensors) files=(tests/fixtures/*/adapter/*.safetensors tests/fixtures/*/model/*.safetensors) ;;
    # real quantized files under the 64 KB -max_len (bnb NF4 and FP4, MXFP4 experts, FP8 cases)
    quant) files=(tests/fixtures/{parity_qwen3_nf4,parity_llama_fp4,parity_gpt_oss_mxfp4}/model/model.safetensors
                  tests/fixtures/fp8/cases.safetensors tests/fixtures/mxfp4/cases.safetensors
                  tests/fixtures/quant4/linear4bit.safetensors) ;;
    shard) files=(tests/fixtures/*/data/*.shard) ;;
    tokenizer) files=(tests/fixtures/tokenizer/fuzz_seeds/*) ;;
    chat_template) files=(tests/fixtures/chat_templates/*.jinja tests/fixtures/chat_templates/fuzz_seeds/*) ;;
    *) files=() ;;
    esac
    local f
    for f in "${files[@]}"; do cp "$f" "$dir/$(echo "$f" | tr / _)"; done
    # inputs that once crashed a target are seeds too
    [ -d "tests/fuzz_regressions/$name" ] && cp tests/fuzz_regressions/"$name"/* "$dir"/ 2>/dev/null
    return 0
}

printf '%-14s %12s %8s %8s %9s\n' target executions seconds corpus findings
for name in "$@"; do
    bin=$out/fuzz_$name
    corpus=$out/corpus/$name
    crashes=$out/crashes/$name
    seed "$name" "$corpus"
    mkdir -p "$crashes"
    before=$(find "$crashes" -type f | wc -l)   # earlier runs' findings stay until copied away
    log=$out/fuzz_$name.log
    # -max_len: safetensors seeds (quant's too) are up to ~47 KB; configs are small, and longer
    # YAML or JSON inputs only slow a target down without reaching new code.
    # Size-dependent costs are still reached: fuzz_config repeats an input that
    # starts with byte 0x01 up to 64 KiB (a seed in tests/fuzz_regressions/config/
    # is one), and its 10 s -timeout (25 s for the others) catches a slow one.
    # Adapter and checkpoint inputs hold two or three files (up to ~62 KB).
    case $name in safetensors|shard|adapter|checkpoint|quant) max_len=65536 ;; *) max_len=8192 ;; esac
    timeout=25; [ "$name" = config ] && timeout=10
    dict=(); [ -f "fuzz/$name.dict" ] && dict=(-dict="fuzz/$name.dict")
    start=$SECONDS   # a finding stops the target early: the row gives the seconds it really ran
    "$bin" "${dict[@]}" -max_total_time="$secs" -max_len=$max_len -timeout=$timeout -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$crashes/" "$corpus" >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    n=$(( $(find "$crashes" -type f | wc -l) - before ))
    [ "$rc" -ne 0 ] && [ "$n" -eq 0 ] && n=1
    found=$((found + n))
    printf '%-14s %12s %8s %8s %9s\n' "$name" "${execs:-?}" "$((SECONDS - start))" "$(ls "$corpus" | wc -l)" "$n"
    [ "$n" -gt 0 ] && { echo "  see $log and $crashes/"; grep -m3 -E 'ERROR|runtime error|invariant' "$log" | sed 's/^/  /'; }
done
[ "$found" -eq 0 ]
