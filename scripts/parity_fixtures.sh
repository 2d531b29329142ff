#!/usr/bin/env bash
# parity_fixtures.sh — how the committed CPU parity fixtures tests/fixtures/NAME/
# (NAME = parity_llama, parity_qwen3, parity_qwen3_moe, parity_gpt_oss, parity_mixtral, parity_qwen3_5,
# parity_qwen3_5_moe, parity_qwen3_next, parity_gpt_oss_mxfp4; the 4-bit and FP8 ones below)
# are made, in two halves:
#
#   bash scripts/parity_fixtures.sh local [NAME...]   # here, needs build/ctune or $CTUNE (no torch)
#       model/     random bf16 weights: ctune init --config NAME/config.json --seed 3
#                  (parity_gpt_oss_mxfp4: --quantize mxfp4, its experts in MXFP4 as the
#                  Hub's gpt-oss checkpoints, the rest bf16; docs/mxfp4.md)
#       docs.jsonl 6 token-id documents (5-40 tokens, ids < 64, a -100 prompt prefix)
#       data/      ctune prepare of docs.jsonl (train.shard)
#       adapter/   ctune's adapter after 3 high-lr steps of NAME/train.yaml
#                  (output_dir NAME/run), so that LoRA B is non-zero; run/ removed
#
#   bash scripts/parity_fixtures.sh hf [NAME...]      # on a machine with torch + transformers + peft
#       expected.safetensors   HF + PEFT loss and LoRA gradients of docs.jsonl at
#                              model/ + adapter/ (scripts/hf_parity.py grads, fp32 CPU;
#                              the Gated DeltaNet ones in fp64: see hf_parity.py --dtype float64;
#                              parity_gpt_oss_mxfp4's model loaded with Mxfp4Config(dequantize=True))
#                              (FP8 fixtures: below)
#
# 4-bit fixtures (bitsandbytes QLoRA bases), each made from a base fixture above,
# whose docs.jsonl, data/ and adapter/ it copies (so remake the base first):
#   parity_qwen3_nf4         parity_qwen3's model as HF + bitsandbytes 0.50.2 quantize
#                            and save it on the CPU: NF4, double quant, blocksize 64
#   parity_llama_fp4         parity_llama's, FP4 without double quant
#   parity_qwen3_nf4_onload  parity_qwen3's bf16 model; train.yaml sets
#                            model_quantization: nf4 (ctune quantizes on load),
#                            HF quantizes on load too (hf_parity.py --quantize nf4)
# Their local half copies the base's files (and the bf16 model for _onload); their
# hf half writes model/ (hf_parity.py quantize) and expected.safetensors (fp32 CPU:
# bnb's CPU quantizer is the one bnb uses there, and ctune's quant4 matches it bit
# for bit). Without bitsandbytes the hf half skips them, unless they are named.
#
# FP8 fixtures (E4M3 bases in 128x128 blocks, docs/fp8.md):
#   parity_qwen3_fp8         NAME/config.json: parity_qwen3's widened so that every
#                            projection fills whole blocks (H 256, D 128, 2 heads,
#                            1 KV head, I 384); model/ by ctune init --seed 3
#                            --quantize fp8, parity_qwen3's documents and shard, its
#                            own adapter (3 steps of NAME/train.yaml, as above)
#   parity_qwen3_fp8_onload  parity_qwen3_fp8's model in bf16 (ctune init --seed 3,
#                            no --quantize), documents, shard and adapter; train.yaml
#                            sets base_precision: fp8 (ctune quantizes on load)
# Their hf half is the grads above (fp32 CPU): parity_qwen3_fp8 loaded with
# FineGrainedFP8Config(dequantize=True), the _onload one with hf_parity.py
# --quantize fp8 (fp8_quantize_blocks' arithmetic, not transformers' on-load
# quantizer: see hf_parity.py). The two expected.safetensors are then identical.
#
# NAMEs default to all fixtures. Each half regenerates its outputs from scratch;
# commit the results together. The hf half fails (hf_parity.py exits 3) when
# PEFT leaves any adapter tensor unloaded. tests/fixtures/random_parity/ holds
# generated configs made the same way, in one step where torch is installed:
# scripts/random_parity.py --fixtures tests/fixtures/random_parity. A fixture's documents depend only on its place in
# ALL (the seed), so remaking one fixture leaves the others' inputs as they were.
set -euo pipefail
cd "$(dirname "$0")/.."
ALL="parity_llama parity_qwen3 parity_qwen3_moe parity_gpt_oss parity_mixtral parity_qwen3_5 parity_qwen3_5_moe parity_qwen3_next parity_gpt_oss_mxfp4"
QUANT4="parity_qwen3_nf4 parity_llama_fp4 parity_qwen3_nf4_onload"
FP8="parity_qwen3_fp8 parity_qwen3_fp8_onload"
PYTHON=${PYTHON:-python3}
CTUNE=${CTUNE:-build/ctune}
select_names() { # the names after the mode, checked against ALL
    local n
    NAMED=$#
    NAMES=${*:-$ALL $QUANT4 $FP8}
    for n in $NAMES; do
        case " $ALL $QUANT4 $FP8 " in *" $n "*) ;; *) echo "unknown fixture '$n' (known: $ALL $QUANT4 $FP8)" >&2; exit 2 ;; esac
    done
}
is_quant4() { case " $QUANT4 " in *" $1 "*) return 0 ;; esac; return 1; }
is_fp8() { case " $FP8 " in *" $1 "*) return 0 ;; esac; return 1; }
base_of() { # a 4-bit fixture -> the fixture it is made from
    case $1 in parity_llama_*) echo parity_llama ;; *) echo parity_qwen3 ;; esac
}

# a 4-bit fixture's local half: the base's documents, shard and adapter (and bf16 model)
local_quant4() { # NAME
    local d=tests/fixtures/$1 b
    b=tests/fixtures/$(base_of "$1")
    [ -f "$d/train.yaml" ] || { echo "$d/train.yaml is missing" >&2; exit 2; }
    for f in docs.jsonl data adapter model; do
        [ -e "$b/$f" ] || { echo "$b/$f is missing: make $(base_of "$1") first" >&2; exit 2; }
    done
    echo "== $d (from $b)"
    rm -rf "$d/model" "$d/data" "$d/adapter" "$d/run" "$d/docs.jsonl" "$d/expected.safetensors"
    cp -r "$b/docs.jsonl" "$b/data" "$b/adapter" "$d/"
    case $1 in *_onload) cp -r "$b/model" "$d/model" ;; esac
}

# a 4-bit fixture's hf half: the bitsandbytes checkpoint, then HF + PEFT on it in fp32
hf_quant4() { # NAME
    local d=tests/fixtures/$1 b q=()
    b=tests/fixtures/$(base_of "$1")
    echo "== $d"
    case $1 in
        *_onload) q=(--quantize nf4) ;;
        *_nf4) "$PYTHON" scripts/hf_parity.py quantize --model "$b/model" --out "$d/model" --quant-type nf4 \
                   --double-quant --device cpu ;;
        *_fp4) "$PYTHON" scripts/hf_parity.py quantize --model "$b/model" --out "$d/model" --quant-type fp4 \
                   --no-double-quant --device cpu ;;
    esac
    rm -f "$d/model/generation_config.json"
    "$PYTHON" scripts/hf_parity.py grads --model "$d/model" "${q[@]}" --adapter "$d/adapter" \
        --docs "$d/docs.jsonl" --out "$d/expected.safetensors" --device cpu --dtype float32
}
# an FP8 fixture's local half: its model, the documents and shard of parity_qwen3
# (parity_qwen3_fp8) or of parity_qwen3_fp8 with its adapter (_onload)
local_fp8() { # NAME
    local d=tests/fixtures/$1 b=tests/fixtures/parity_qwen3 cfg=tests/fixtures/parity_qwen3_fp8/config.json f
    local q=(--quantize fp8) from=(docs.jsonl data)
    case $1 in *_onload) b=tests/fixtures/parity_qwen3_fp8 q=() from+=(adapter) ;; esac
    for f in "$cfg" "$d/train.yaml"; do [ -f "$f" ] || { echo "$f is missing" >&2; exit 2; }; done
    for f in "${from[@]}"; do
        [ -e "$b/$f" ] || { echo "$b/$f is missing: make $(basename "$b") first" >&2; exit 2; }
    done
    echo "== $d (from $b)"
    rm -rf "$d/model" "$d/data" "$d/adapter" "$d/run" "$d/docs.jsonl" "$d/expected.safetensors"
    "$CTUNE" init --config "$cfg" --out "$d/model" --seed 3 "${q[@]}"
    for f in "${from[@]}"; do cp -r "$b/$f" "$d/"; done
    case $1 in *_onload) return ;; esac
    "$CTUNE" train "$d/train.yaml"
    [ -f "$d/run/final/adapter_model.safetensors" ] || { echo "$d/run/final has no adapter" >&2; exit 1; }
    cp -r "$d/run/final" "$d/adapter"
    rm -rf "$d/run"
}

seed_of() { # NAME -> 11 + its index in ALL
    local i=0 n
    for n in $ALL; do
        [ "$n" = "$1" ] && { echo $((11 + i)); return; }
        i=$((i + 1))
    done
}

# 6 documents, deterministic from SEED (a 64-bit LCG: no dependence on Python's random).
write_docs() { # SEED OUT
    "$PYTHON" - "$1" "$2" <<'EOF'
import json, sys
state = int(sys.argv[1])
def rnd(n):  # uniform-ish integer in [0, n)
    global state
    state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
    return (state >> 33) % n
with open(sys.argv[2], "w") as f:
    for _ in range(6):
        length = 5 + rnd(36)                    # 5..40 tokens
        ids = [rnd(64) for _ in range(length)]  # token ids < 64
        prompt = 1 + rnd(length // 2)           # 1..length/2 prompt tokens, never predicted
        labels = [-100] * prompt + ids[prompt:]
        f.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
EOF
}

local_half() {
    for name in $NAMES; do
        if is_quant4 "$name"; then local_quant4 "$name"; continue; fi
        [ -x "$CTUNE" ] || { echo "$CTUNE is missing: run make first" >&2; exit 2; }
        if is_fp8 "$name"; then local_fp8 "$name"; continue; fi
        d=tests/fixtures/$name
        for f in config.json train.yaml; do
            [ -f "$d/$f" ] || { echo "$d/$f is missing" >&2; exit 2; }
        done
        echo "== $d"
        rm -rf "$d/model" "$d/data" "$d/adapter" "$d/run" "$d/docs.jsonl"
        q=()
        case $name in *_mxfp4) q=(--quantize mxfp4) ;; esac
        "$CTUNE" init --config "$d/config.json" --out "$d/model" --seed 3 "${q[@]}"
        write_docs "$(seed_of "$name")" "$d/docs.jsonl"
        "$CTUNE" prepare --in "$d/docs.jsonl" --out "$d/data" --vocab-size 64
        "$CTUNE" train "$d/train.yaml"
        [ -f "$d/run/final/adapter_model.safetensors" ] || { echo "$d/run/final has no adapter" >&2; exit 1; }
        cp -r "$d/run/final" "$d/adapter"
        rm -rf "$d/run"
    done
    echo "done; now run 'bash scripts/parity_fixtures.sh hf $NAMES' where torch, transformers and peft are installed"
}

hf_half() {
    local bnb=1
    "$PYTHON" -c "import bitsandbytes" 2>/dev/null || bnb=0
    for name in $NAMES; do
        if is_quant4 "$name"; then
            if [ $bnb = 1 ]; then
                hf_quant4 "$name"
            elif [ "$NAMED" -gt 0 ]; then
                echo "$name needs bitsandbytes (0.50.2), which $PYTHON cannot import" >&2; exit 2
            else
                echo "== tests/fixtures/$name skipped: $PYTHON cannot import bitsandbytes"
            fi
            continue
        fi
        d=tests/fixtures/$name
        for f in model adapter docs.jsonl; do
            [ -e "$d/$f" ] || { echo "$d/$f is missing: run the local half first" >&2; exit 2; }
        done
        echo "== $d"
        dtype=float32
        # the Gated DeltaNet hybrids' gradients are ill-conditioned: HF's fp32 is
        # farther from the truth than ctune's, so those fixtures are judged against fp64
        case $name in parity_qwen3_5* | parity_qwen3_next) dtype=float64 ;; esac
        q=()
        case $name in *_fp8_onload) q=(--quantize fp8) ;; esac
        "$PYTHON" scripts/hf_parity.py grads --model "$d/model" "${q[@]}" --adapter "$d/adapter" \
            --docs "$d/docs.jsonl" --out "$d/expected.safetensors" --device cpu --dtype $dtype
    done
}

mode=${1:-}
[ $# -gt 0 ] && shift
select_names "$@"
case "$mode" in
    local) local_half ;;
    hf) hf_half ;;
    *) echo "usage: bash scripts/parity_fixtures.sh local|hf [NAME...]" >&2; exit 2 ;;
esac
