#!/usr/bin/env bash
# compare_builds.sh BUILD_A BUILD_B — trains the same models on the same data with
# two builds of ctune and checks that every logged loss, grad norm and eval loss
# is identical to the last printed digit: the check for a change that must not
# change behaviour (a refactor, a kernel that only moved). One case per kernel
# path the automatic choice takes on the GPU (DEVICE=cuda, the default):
#
#   tiny-d32       configs/models/tiny (head_dim 32: the mma.sync attention)
#   d64-short      2 layers, head_dim 64, ~600-token documents (one-warpgroup wgmma)
#   d64-long       the same model, documents averaging > 2048 tokens (the TMA forward)
#   d128           qwen3-0.6b cut to 2 layers (TMA forward, two-warpgroup backward)
#   d128-chunks    the same at 32768 tokens: the MLP in two chunks of 16384
#   d128-offload   the same with every layer input offloaded to host memory
#   moe-256        tiny-moe at widths 256 (TMA grouped GEMMs, expert LoRA fused)
#   moe-dropout    tiny-moe with LoRA dropout (the expert LoRA apart from the GEMM)
#   gpt-oss        tiny-gpt-oss (clamped SwiGLU, sinks, sliding layers)
#   qwen3-next     tiny-qwen3-next (Gated DeltaNet and gated attention layers, MoE)
#
# DEVICE=cpu runs tiny-d32, moe-dropout, gpt-oss and qwen3-next on the CPU backend.
#   bash scripts/compare_builds.sh /tmp/before build      # OUT=/tmp/cmp STEPS=6
# Exit status: the number of cases that differ.
set -u
A=${1:?usage: compare_builds.sh BUILD_A BUILD_B}
B=${2:?usage: compare_builds.sh BUILD_A BUILD_B}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/compare-builds}
STEPS=${STEPS:-6}
mkdir -p "$OUT"
W=$OUT/work
mkdir -p "$W"

# model NAME CONFIG_JSON [PY_EDIT]: a random model from a config, edited by PY_EDIT (c is the dict)
model() {
    local name=$1 cfg=$2 edit=${3:-}
    [ -f "$W/$name/model.safetensors" ] && return
    python3 -c "import json, sys; c = json.load(open(sys.argv[1])); $edit
json.dump(c, open(sys.argv[2], 'w'))" "$cfg" "$W/$name.json"
    "$A/ctune" init --config "$W/$name.json" --out "$W/$name" --seed 7 >/dev/null
}
# data NAME VOCAB MEDIAN MAX_LEN [TOKENS]: bench-mix token data
data() {
    [ -f "$W/$1/train.shard" ] && return
    python3 scripts/make_bench_data.py --vocab "$2" --tokens "${5:-200000}" --median "$3" --max-len "$4" --seed 3 \
        --out "$W/$1.jsonl" && "$A/ctune" prepare --in "$W/$1.jsonl" --out "$W/$1" --vocab-size "$2" >/dev/null
}
# run TAG BUILD CASE MODEL DATA TPMB [--set ...]: STEPS steps, then an eval on DATA-eval;
# the logged numbers in OUT/CASE.TAG.txt
run() {
    local tag=$1 b=$2 case=$3 m=$4 d=$5 t=$6
    shift 6
    rm -rf "$W/run-$case-$tag"
    "$b/ctune" train configs/tiny.yaml --set model="$W/$m" --set output_dir="$W/run-$case-$tag" \
        --set device="$DEVICE" --set "data.train_files=[$W/$d/train.shard]" --set "data.eval_files=[$W/$d-eval/train.shard]" \
        --set data.tokens_per_micro_batch="$t" --set data.max_length="$t" --set training.max_steps="$STEPS" \
        --set training.logging_steps=1 --set training.eval_steps="$STEPS" --set training.warmup_steps=1 \
        --set training.save_steps=0 --set training.resume_from_checkpoint=false "$@" \
        >"$OUT/$case.$tag.log" 2>&1 || { echo "  $case: $b/ctune exited $? (see $OUT/$case.$tag.log)"; return 1; }
    python3 - "$W/run-$case-$tag/metrics.jsonl" >"$OUT/$case.$tag.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(" ".join(f"{k}={r[k]!r}" for k in ("step", "loss", "grad_norm", "eval_loss") if k in r))
PY
}
DIFFER=0
check() { # CASE MODEL DATA TPMB [--set ...]
    local case=$1
    if run a "$A" "$@" && run b "$B" "$@" && cmp -s "$OUT/$case.a.txt" "$OUT/$case.b.txt" && [ -s "$OUT/$case.a.txt" ]; then
        printf '%-12s identical (%s records; last: %s)\n' "$case" "$(wc -l <"$OUT/$case.a.txt")" "$(tail -n 1 "$OUT/$case.a.txt")"
    else
        printf '%-12s DIFFER\n' "$case"; diff "$OUT/$case.a.txt" "$OUT/$case.b.txt" 2>/dev/null | head -n 6
        DIFFER=$((DIFFER + 1))
    fi
}

model tiny configs/models/tiny/config.json
model moe configs/models/tiny-moe/config.json
model gptoss configs/models/tiny-gpt-oss/config.json
model q3next configs/models/tiny-qwen3-next/config.json
data d384 384 300 1024
data d384-eval 384 300 1024 8000
if [ "$DEVICE" = cuda ]; then
    model d64 configs/models/tiny/config.json "c.update(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=64, intermediate_size=1024, num_hidden_layers=2, vocab_size=4096, tie_word_embeddings=False)"
    model d128 configs/models/qwen3-0.6b/config.json "c.update(num_hidden_layers=2)"
    model moe256 configs/models/tiny-moe/config.json "c.update(hidden_size=256, moe_intermediate_size=256)"
    data d4096s 4096 600 4096
    data d4096l 4096 3500 8192
    data d151936 151936 600 4096 400000
    for d in d4096s d4096l d151936; do
        data $d-eval "${d//[a-z]/}" 600 4096 40000
    done
    check tiny-d32 tiny d384 4096
    check d64-short d64 d4096s 16384
    check d64-long d64 d4096l 16384
    check d128 d128 d151936 16384
    check d128-chunks d128 d151936 32768
    check d128-offload d128 d151936 16384 --set memory.activation_offload=on
    check moe-256 moe256 d384 4096
    check moe-dropout moe d384 4096 --set lora.lora_dropout=0.1
    check gpt-oss gptoss d384 4096
    check qwen3-next q3next d384 4096
else
    check tiny-d32 tiny d384 1024
    check moe-dropout moe d384 1024 --set lora.lora_dropout=0.1
    check gpt-oss gptoss d384 1024
    check qwen3-next q3next d384 1024
fi
echo "compare_builds: $DIFFER case(s) differ"
exit $DIFFER
