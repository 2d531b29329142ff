#!/usr/bin/env bash
# GPU checks in one go (run on the device machine from the repo root, after
# `make tests` here and carrying build/). Sections (env GPU_SECTIONS, default all):
#   kernels   CUDA kernels against the CPU backend (tests/test_backend_cuda), and
#             KV-cache decoding on the GPU, dense and MoE, against the CPU
#             (tests/test_generate; generate refuses MoE off the CPU until it passes)
#   fixtures  HF + PEFT expected loss/gradients for tests/fixtures (fp32 CPU), then
#             tests/test_hf_parity against them
#   parity50  50 training steps, ctune on CUDA (bf16) vs HF + PEFT replaying the
#             same batches (bf16), tiny and qwen3-0.6b shapes: max relative loss diff;
#             fails past tolerances set with margin over the bf16 drift measured
#             (BENCHMARKS.md), and a control run (HF at 1.3x the learning rate)
#             must fail them
#   parity50moe  the same on tiny qwen3_moe and gpt_oss models (experts adapted), and on
#             tiny qwen3_moe at widths 256 (the grouped GEMMs with the expert LoRA fused in)
#   parity50gdn  the same on tiny qwen3_5 (the multimodal wrapper), qwen3_5_moe and
#             qwen3_next, the Gated DeltaNet hybrids (HF runs its torch GDN path)
#   qlora     the same 50-step parity on 4-bit frozen bases (QLoRA): tiny llama and the
#             qwen3-0.6b shape quantized by HF + bitsandbytes on the GPU (NF4 with double
#             quant; tiny also FP4) and loaded by both, and tiny quantized on load
#             (ctune model_quantization: nf4, HF hf_parity.py --quantize nf4); HF runs
#             bnb's dequantize-to-bf16 then F.linear, as ctune does, so the dense bounds
#             apply; a control (HF at 1.3x the learning rate) must fail them. Needs the
#             bitsandbytes wheel (scripts/bnb_wheel.sh, carried as .devpeers/whl), installed
#             into /tmp/bnb-site; the fixtures section installs it too, for the 4-bit fixtures.
#             Also tiny gpt_oss with MXFP4 experts (ctune init --quantize mxfp4; HF loads it
#             with Mxfp4Config(dequantize=True) to bf16), which needs no bitsandbytes
#   mxfp4     only that gpt_oss MXFP4 run of the qlora section
#   fp8       FP8 bases: the kernels and the FP8 GEMMs against the CPU (tests/test_cuda_fp8,
#             test_cuda_fp8_linear), and 50 steps of base_precision fp8 against the bf16 base on
#             the qwen3-0.6b shape and data/arith (the loss within 2e-2 relative at every step,
#             scripts/loss_parity.py), with a control at 5x the learning rate that must fail;
#             then 300 steps of each with evaluation: the held-out loss at the end within 1e-2.
#             On random tokens the loss stays near ln(vocab) whatever the weights do, so
#             the control passed too: the runs learn a real (if tiny) task instead.
#             Work folders under $F8_DIR (default /tmp), each model removed after use
#   fp8big    the 50-step parity on the Llama-3.1-8B shape (a 16 GB random-weight folder);
#             2026-12-03 it failed the 2e-2 bound (5.1e-2 at step 33, docs/fp8.md)
#   dist      several ranks on the one GPU at hand (docs/multi-gpu.md): NCCL loaded and its
#             all-reduce with one rank (tests/test_cuda_nccl), two ranks sharing the GPU
#             (gradients summed through the host) against one rank accumulating the same
#             micro-batches (loss within 1e-3 at every one of 50 steps), and two NCCL ranks
#             on one GPU failing with an error rather than hanging
#   sanitize  compute-sanitizer memcheck (2 steps) and racecheck (1 step) of training
#             on the qwen3-0.6b shape cut to 2 layers (head_dim 128: the wgmma
#             attention kernels; the tiny models' head_dim 32 runs mma.sync), with
#             checkpointing and offload on, and on tiny qwen3 (head_dim 32)
#   firststep the first optimizer step and the first eval at 16k / 32k / 64k / 256k
#             tokens per micro-batch, checkpointing off and on, against the CPU
#             backend and across checkpointing (scripts/first_step_check.sh), the
#             batch upload into fresh memory (tests/test_cuda_upload)
#   firststep-sanitize  compute-sanitizer memcheck, initcheck and racecheck over such
#             steps (the small model of first_step_check.sh)
#   faults    the non-finite skip on the GPU: a NaN injected into step 3's gradient
#             (CTUNE_INJECT_NAN_STEP) leaves step 3's adapter equal to step 2's,
#             step 4 trains again, and metrics.jsonl counts the skip
#   random    scripts/random_parity.py --device cuda: RANDOM_N (default 40) random
#             configs of every family, ctune's CUDA backend (bf16) against HF + PEFT
#             in fp32, each case held to three times HF's own bf16 error
#   bench     scripts/bench.sh (ctune vs HF + PEFT, qwen3-0.6b shape)
# Logs and results go to $OUT.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
B=${BUILD:-build}
SECTIONS=${GPU_SECTIONS:-"kernels firststep firststep-sanitize faults fixtures random parity50 parity50moe parity50gdn qlora sanitize bench"}
FAILED=() # the checks that failed; the script's exit status is their count
has() { case " $SECTIONS " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# bnb_site: bitsandbytes importable by python3, from the carried wheel
# (scripts/bnb_wheel.sh; BNB_WHEELS, default .devpeers/whl) installed into
# /tmp/bnb-site and put on PYTHONPATH; non-zero, saying why, when it cannot be
bnb_site() {
    python3 -c "import bitsandbytes" 2>/dev/null && return 0
    local whl
    whl=$(ls "${BNB_WHEELS:-.devpeers/whl}"/bitsandbytes-0.50.2-*.whl 2>/dev/null | head -n 1)
    if [ -z "$whl" ]; then
        echo "no bitsandbytes wheel in ${BNB_WHEELS:-.devpeers/whl}: run scripts/bnb_wheel.sh and carry that folder"
        return 1
    fi
    timeout 120 python3 -m pip install -q --no-index --no-deps --target /tmp/bnb-site "$whl" \
        >"$OUT/bnb-pip.log" 2>&1 || { echo "pip install of $whl failed"; tail -n 3 "$OUT/bnb-pip.log"; return 1; }
    export PYTHONPATH=/tmp/bnb-site${PYTHONPATH:+:$PYTHONPATH}
    python3 -c "import bitsandbytes" 2>"$OUT/bnb-import.log" || { echo "bitsandbytes does not import"; tail -n 3 "$OUT/bnb-import.log"; return 1; }
}

if has kernels; then
    echo "== kernels"
    timeout 300 "$B/tests/test_backend_cuda" >"$OUT/cuda_tests.log" 2>&1 || FAILED+=(kernels)
    grep -E "^(FAIL|     |#summary)" "$OUT/cuda_tests.log" | cut -c1-220 | head -30
    timeout 120 "$B/tests/test_generate" >"$OUT/generate_tests.log" 2>&1 || FAILED+=(generate)
    grep -E "^(FAIL|skip|     |#summary)" "$OUT/generate_tests.log" | cut -c1-220 | head -12
fi

# firststep_sanitize TOOL T CKPT: one training step of first_step_check.sh's small
# model at T tokens per micro-batch under compute-sanitizer
firststep_sanitize() {
    local tool=$1 T=$2 ck=$3 W=${FIRST_STEP_WORK:-/tmp/first-step-work} log
    log=$OUT/san-first-$tool-$T-ck$ck.log
    # initcheck and racecheck report accesses inside cuBLASLt's own kernels (the
    # split-K reduction reading its workspace; shared memory of the warp-
    # specialized nvjet GEMMs, whose mbarrier synchronisation racecheck does not
    # model): initcheck leaves those kernels out; racecheck checks them all (with
    # them left out it fails with an internal error, "failed to handle a hardware
    # exception") and passes when every hazard it reports lies in cuBLASLt's
    local opts=(--error-exitcode 9)
    [ "$tool" = initcheck ] && opts+=(--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=splitKreduce)
    [ "$tool" = racecheck ] && opts+=(--print-limit 1000000)
    timeout -k 10 ${SAN_TIMEOUT:-300} compute-sanitizer --tool "$tool" "${opts[@]}" "$B/ctune" train configs/qwen3-0.6b.yaml \
        --set model=$W/small --set output_dir=/tmp/san-first-$tool --set device=cuda \
        --set "data.train_files=[$W/mix512/train.shard]" --set "data.eval_files=[$W/eval512/train.shard]" \
        --set data.tokens_per_micro_batch=$T --set data.max_length=$T --set memory.gradient_checkpointing=$ck \
        --set training.max_steps=1 --set training.warmup_steps=0 --set training.eval_steps=1 \
        --set training.save_steps=0 --set training.resume_from_checkpoint=false >"$log" 2>&1
    local rc=$? summary
    # a timeout stops compute-sanitizer, not always the program under it, which
    # would hold the GPU for the runs after it
    pkill -9 -f "$B/ctune train" 2>/dev/null
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1)
    echo "first step $tool T=$T ckpt $ck: rc $rc $summary"
    if [ "$tool" = racecheck ] && [ $rc = 9 ] && grep -q "^done: 1 steps" "$log"; then
        local ours
        ours=$(grep -E "^=========     (Read|Write) Thread" "$log" | grep -vcE " at (nvjet_|void cublasLt::)")
        echo "  hazards outside cuBLASLt's kernels: $ours"
        [ "$ours" = 0 ] && return
    fi
    [ $rc = 0 ] || FAILED+=("first step $tool $T $ck")
}

if has firststep; then
    echo "== first step"
    timeout 120 "$B/tests/test_cuda_upload" >"$OUT/upload_tests.log" 2>&1 || FAILED+=(upload)
    grep -E "^(ok|FAIL|skip|     )" "$OUT/upload_tests.log" | cut -c1-200
    OUT=$OUT/firststep BUILD=$B timeout 1200 bash scripts/first_step_check.sh >"$OUT/firststep.log" 2>&1 \
        || FAILED+=(firststep)
    grep -E "^(FAIL|ok|==|first_step_check|run )" "$OUT/firststep.log" | cut -c1-160
fi

if has firststep-sanitize; then
    echo "== first step under compute-sanitizer"
    [ -f "${FIRST_STEP_WORK:-/tmp/first-step-work}/small/config.json" ] || \
        OUT=$OUT/firststep BUILD=$B SIZES="" BIG_SIZES="" bash scripts/first_step_check.sh >/dev/null 2>&1
    # initcheck and racecheck are slow (a 32k-token step under initcheck took over 5 minutes)
    [ "${SAN_SKIP_MEMCHECK:-0}" = 1 ] || { firststep_sanitize memcheck 32768 false; firststep_sanitize memcheck 65536 true; }
    for tool in ${SAN_TOOLS:-initcheck racecheck}; do
        for ck in ${SAN_CKPT:-false true}; do firststep_sanitize $tool 16384 $ck; done
    done
fi

if has faults; then
    echo "== non-finite skip on the GPU"
    FW=/tmp/gpu-faults
    rm -rf $FW; mkdir -p $FW
    "$B/ctune" init --config configs/models/tiny/config.json --out $FW/tiny --seed 1 >/dev/null
    CTUNE_INJECT_NAN_STEP=3 "$B/ctune" train configs/tiny.yaml --set model=$FW/tiny --set output_dir=$FW/run \
        --set device=cuda --set "data.train_files=[data/arith/train.shard]" --set data.eval_files= \
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 --set training.logging_steps=1 \
        --set training.eval_steps=0 --set training.save_steps=1 --set training.save_total_limit=0 \
        --set training.warmup_steps=1 --set training.max_steps=4 --set training.resume_from_checkpoint=false \
        >"$OUT/faults-nan.log" 2>&1
    ck=$FW/run/checkpoint
    why=""
    cmp -s $ck-2/adapter_model.safetensors $ck-3/adapter_model.safetensors || why="$why step 3 changed the adapter;"
    cmp -s $ck-3/adapter_model.safetensors $ck-4/adapter_model.safetensors && why="$why step 4 did not train;"
    grep '"step": 3,' $FW/run/metrics.jsonl 2>/dev/null | grep -q '"nonfinite_skipped": 1' || why="$why no skip logged;"
    if [ -z "$why" ]; then echo "ok   NaN at step 3 skipped on cuda"; else echo "FAIL NaN skip on cuda:$why"; tail -n 3 "$OUT/faults-nan.log"; FAILED+=(faults-nan); fi
fi

if has fixtures; then
    echo "== HF fixtures"
    bnb_site || echo "  the 4-bit fixtures keep their committed expectations"
    # a failed regeneration would leave the committed expectations to test against
    bash scripts/parity_fixtures.sh hf >"$OUT/fixtures.log" 2>&1 || { tail -n 5 "$OUT/fixtures.log"; FAILED+=(fixtures-hf); }
    for n in llama qwen3; do cp tests/fixtures/parity_$n/expected.safetensors "$OUT/expected_$n.safetensors"; done
    grep -i "loss" "$OUT/fixtures.log" | head -4
    "$B/tests/test_hf_parity" >"$OUT/hf_parity_tests.log" 2>&1 || FAILED+=(fixtures)
    cut -c1-200 "$OUT/hf_parity_tests.log" | tail -n 8
fi

if has random; then
    echo "== random configs on the GPU"
    timeout ${RANDOM_TIMEOUT:-900} python3 scripts/random_parity.py --device cuda --n ${RANDOM_N:-40} \
        --seed ${RANDOM_SEED:-1} --build "$B" --out /tmp/gpu-random >"$OUT/random.log" 2>&1 || FAILED+=(random)
    grep -E " FAIL |passed" "$OUT/random.log" | cut -c1-300 | tail -n 12
    [ -d /tmp/gpu-random/failed ] && tar czf "$OUT/random_failed.tgz" -C /tmp/gpu-random failed 2>/dev/null
fi

# parity50 NAME MODEL_CONFIG RUN_CONFIG TRAIN_SHARD TOKENS_PER_MICRO_BATCH LR TOL_FIRST TOL_LOSS [HF_LR]
# P50_QUANT (environment, optional) makes the frozen base 4-bit: nf4 / fp4 has HF +
# bitsandbytes quantize the initialised model on the GPU (nf4 with double quant, fp4
# without) and save it, the folder both then train on; onload-nf4 keeps the bf16 folder
# and has both quantize it on load (ctune model_quantization: nf4, hf_parity.py
# --quantize nf4); mxfp4 has ctune init write gpt_oss's experts in MXFP4, the folder
# both train on (HF dequantizes it to bf16 on load). TOL_FIRST bounds the first step's
# relative loss and grad-norm difference (same weights, same batch: rounding only);
# TOL_LOSS every logged step's relative loss difference (bf16 rounding compounds
# through 50 optimizer steps). HF_LR (default LR) replays HF at another learning
# rate: the control that must fail.
parity50() {
    local name=$1 mcfg=$2 rcfg=$3 shard=$4 tpmb=$5 lr=$6 tol_first=$7 tol_loss=$8 hf_lr=${9:-$6} W=/tmp/p50-$1
    rm -rf $W; mkdir -p $W
    local model=$W/model cq=() hq=() iq=()
    [ "${P50_QUANT:-}" = mxfp4 ] && iq=(--quantize mxfp4)
    "$B/ctune" init --config "$mcfg" --out $W/model --seed 5 "${iq[@]}" >/dev/null \
        || { echo "init failed"; FAILED+=("parity50 $name"); return; }
    case ${P50_QUANT:-} in
        "" | mxfp4) ;;
        nf4 | fp4)
            local dq=--double-quant
            [ "$P50_QUANT" = fp4 ] && dq=--no-double-quant
            model=$W/model4
            python3 scripts/hf_parity.py quantize --model $W/model --out $model --quant-type $P50_QUANT $dq \
                --device cuda >"$OUT/p50-$name-quantize.log" 2>&1 \
                || { echo "quantize failed"; tail -n 5 "$OUT/p50-$name-quantize.log"; FAILED+=("parity50 $name"); return; }
            tail -n 1 "$OUT/p50-$name-quantize.log" ;;
        onload-nf4) cq=(--set model_quantization=nf4); hq=(--quantize nf4) ;;
        *) echo "P50_QUANT=$P50_QUANT: unknown"; FAILED+=("parity50 $name"); return ;;
    esac
    CTUNE_TRACE=$W "$B/ctune" train "$rcfg" --set model=$model "${cq[@]}" --set output_dir=$W/run --set device=cuda \
        --set "data.train_files=[$shard]" --set "data.eval_files=[]" --set data.tokens_per_micro_batch=$tpmb \
        --set training.max_steps=50 --set training.warmup_steps=5 --set training.logging_steps=1 \
        --set training.learning_rate=$lr --set training.lr_scheduler_type=cosine --set training.eval_steps=0 \
        --set training.save_steps=0 --set training.resume_from_checkpoint=false >"$OUT/p50-$name-ctune.log" 2>&1 \
        || { echo "ctune failed"; tail -n 5 "$OUT/p50-$name-ctune.log"; FAILED+=("parity50 $name"); return; }
    timeout 400 python3 scripts/hf_parity.py train --model $model "${hq[@]}" --adapter $W/initial_adapter --shards "$shard" \
        --trace $W/batches.jsonl --metrics $W/run/metrics.jsonl --lr $hf_lr --scheduler cosine --warmup 5 --steps 50 \
        --device cuda --dtype bfloat16 --tol-first "$tol_first" --tol-loss "$tol_loss" \
        --out "$OUT/parity50-$name.json" >"$OUT/p50-$name-hf.log" 2>&1
    local rc=$?
    tail -n 4 "$OUT/p50-$name-hf.log"
    if [ "$hf_lr" != "$lr" ]; then
        # a crash also exits 1: only the verdict line counts as the control failing
        if [ $rc = 1 ] && grep -q "^FAIL parity:" "$OUT/p50-$name-hf.log"; then
            echo "control $name: failed as it must"
        else
            echo "control $name: rc $rc without a FAIL verdict, expected one"; FAILED+=("control $name")
        fi
    elif [ $rc != 0 ]; then
        FAILED+=("parity50 $name")
    fi
}

if has parity50; then
    echo "== 50-step parity, tiny"
    parity50 tiny configs/models/tiny/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 1e-2 1e-2
    echo "== control: HF replaying at 1.3x the learning rate must fail"
    parity50 tiny_control configs/models/tiny/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 1e-2 1e-2 2.6e-3
    echo "== 50-step parity, qwen3-0.6b shape"
    python3 scripts/make_bench_data.py --vocab 151936 --tokens 400000 --out /tmp/p50q.jsonl --seed 1
    "$B/ctune" prepare --in /tmp/p50q.jsonl --out /tmp/p50q --vocab-size 151936 >/dev/null
    parity50 qwen3 configs/models/qwen3-0.6b/config.json configs/qwen3-0.6b.yaml /tmp/p50q/train.shard 4096 2e-4 1e-2 5e-3
fi

if has parity50moe; then
    echo "== 50-step parity, tiny qwen3_moe"
    parity50 qwen3_moe configs/models/tiny-moe/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 2e-2 6e-2
    echo "== 50-step parity, tiny gpt_oss"
    parity50 gpt_oss configs/models/tiny-gpt-oss/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 2e-2 2e-2
    # hidden and expert widths of 256: every expert LoRA module starts on a 256-column
    # tile, so the grouped GEMMs run with the LoRA fused in (the tiny models' 64 and
    # 128 take the unfused sequence), as the full-size models do
    echo "== 50-step parity, tiny qwen3_moe at widths 256 (fused expert LoRA)"
    python3 -c "import json; c=json.load(open('configs/models/tiny-moe/config.json')); c['hidden_size']=256; c['moe_intermediate_size']=256; json.dump(c, open('/tmp/tiny-moe-256.json','w'))"
    parity50 qwen3_moe_256 /tmp/tiny-moe-256.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 2e-2 0.1
fi

if has parity50gdn; then
    # first-step bound 4e-2 on qwen3_5: HF's bf16 grad norm is the one that drifts
    # there (step 1: fp32 4.975, ctune bf16 4.916, HF bf16 4.807; BENCHMARKS.md)
    echo "== 50-step parity, tiny qwen3_5 (Gated DeltaNet hybrid, multimodal wrapper)"
    parity50 qwen3_5 configs/models/tiny-qwen3_5/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 4e-2 2e-2
    echo "== 50-step parity, tiny qwen3_5_moe (GDN hybrid, shared expert)"
    parity50 qwen3_5_moe configs/models/tiny-qwen3_5-moe/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 2e-2 6e-2
    # first-step bound 4e-2 as for qwen3_5, for the same reason: step 1 grad norm fp32 6.134
    # (ctune CPU, and HF fp32 on the GPU to 2e-6), ctune bf16 5.966, HF bf16 5.763 (BENCHMARKS.md)
    echo "== 50-step parity, tiny qwen3_next (GDN hybrid, grouped projections, shared expert)"
    parity50 qwen3_next configs/models/tiny-qwen3-next/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 4e-2 6e-2
fi

if has qlora || has mxfp4; then
    # tiny-gpt-oss's hidden 128 and intermediate 64 fill whole 32-element MXFP4 blocks;
    # parity50moe's gpt_oss bounds: the experts' bf16 values are those of a bf16 base
    echo "== 50-step parity, tiny gpt_oss, MXFP4 experts (HF: Mxfp4Config(dequantize=True))"
    P50_QUANT=mxfp4 parity50 gpt_oss_mxfp4 configs/models/tiny-gpt-oss/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 2e-2 2e-2
    grep -h "^mxfp4 base:" "$OUT/p50-gpt_oss_mxfp4-hf.log" 2>/dev/null || { echo "HF did not confirm the dequantized experts"; FAILED+=("parity50 gpt_oss_mxfp4 dequantize"); }
fi
if has qlora; then
    echo "== QLoRA: 50-step parity on 4-bit bases (bitsandbytes)"
    if bnb_site; then
        # the dense sections' bounds: both sides dequantize to bf16, then run bf16 GEMMs
        echo "== 50-step parity, tiny llama, NF4 (double quant) base"
        P50_QUANT=nf4 parity50 qlora_nf4 configs/models/tiny/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 1e-2 1e-2
        echo "== control: HF replaying at 1.3x the learning rate must fail"
        P50_QUANT=nf4 parity50 qlora_nf4_control configs/models/tiny/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 1e-2 1e-2 2.6e-3
        echo "== 50-step parity, tiny llama, FP4 base"
        P50_QUANT=fp4 parity50 qlora_fp4 configs/models/tiny/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 1e-2 1e-2
        echo "== 50-step parity, tiny llama quantized on load (model_quantization: nf4)"
        P50_QUANT=onload-nf4 parity50 qlora_onload configs/models/tiny/config.json configs/tiny.yaml data/arith/train.shard 2048 2e-3 1e-2 1e-2
        echo "== 50-step parity, qwen3-0.6b shape, NF4 (double quant) base"
        [ -f /tmp/p50q/train.shard ] || {
            python3 scripts/make_bench_data.py --vocab 151936 --tokens 400000 --out /tmp/p50q.jsonl --seed 1
            "$B/ctune" prepare --in /tmp/p50q.jsonl --out /tmp/p50q --vocab-size 151936 >/dev/null
        }
        P50_QUANT=nf4 parity50 qlora_qwen3 configs/models/qwen3-0.6b/config.json configs/qwen3-0.6b.yaml /tmp/p50q/train.shard 4096 2e-4 1e-2 5e-3
    else
        FAILED+=(qlora-bitsandbytes)
    fi
fi

# fp8_vs_bf16 NAME CONFIG.json RUN.yaml TOKENS LR TOL STEPS [LR_FP8]: STEPS steps of ctune on
# data/arith with the bf16 base and the same with base_precision fp8 (the FP8 GEMMs), same
# batches; the loss may differ by TOL (relative) at every step, or with STEPS above 50 the
# final eval loss. With LR_FP8 the FP8 run is a control at another learning rate, which must
# fail the bound.
F8_DIR=${F8_DIR:-/tmp}
fp8_vs_bf16() {
    local name=$1 mcfg=$2 rcfg=$3 tpmb=$4 lr=$5 tol=$6 steps=$7 lr8=${8:-$5} W=$F8_DIR/f8-$1
    rm -rf $W; mkdir -p $W
    "$B/ctune" init --config "$mcfg" --out $W/model --seed 5 >/dev/null || { FAILED+=("fp8 $name init"); return; }
    local prec lrr evals="[]" every=0 how="--steps $steps"
    [ "$steps" -gt 50 ] && { evals="[data/arith/eval.shard]"; every=$steps; how=--eval; }
    for prec in auto fp8; do
        lrr=$lr; [ $prec = fp8 ] && lrr=$lr8
        "$B/ctune" train "$rcfg" --set model=$W/model --set base_precision=$prec --set output_dir=$W/run-$prec \
            --set device=cuda --set "data.train_files=[data/arith/train.shard]" --set "data.eval_files=$evals" \
            --set data.tokens_per_micro_batch=$tpmb --set training.max_steps=$steps --set training.warmup_steps=5 \
            --set training.logging_steps=1 --set training.learning_rate=$lrr --set training.lr_scheduler_type=cosine \
            --set training.eval_steps=$every --set training.save_steps=0 --set training.resume_from_checkpoint=false \
            >"$OUT/f8-$name-$prec.log" 2>&1 || { tail -n 5 "$OUT/f8-$name-$prec.log"; FAILED+=("fp8 $name $prec")
                                                  rm -rf $W/model; return; }
    done
    rm -rf $W/model
    grep -h "^base:" "$OUT/f8-$name-fp8.log"
    python3 scripts/loss_parity.py $W/run-auto/metrics.jsonl $W/run-fp8/metrics.jsonl --tol "$tol" $how \
        >"$OUT/f8-$name-parity.log" 2>&1
    local rc=$?
    tail -n 2 "$OUT/f8-$name-parity.log"
    if [ "$lr8" != "$lr" ]; then
        [ $rc = 1 ] && echo "control $name: failed as it must" || { echo "control $name: rc $rc"; FAILED+=("control $name"); }
    elif [ $rc != 0 ]; then
        FAILED+=("fp8 $name")
    fi
}

if has fp8; then
    echo "== FP8 kernels and GEMMs against the CPU"
    for t in test_cuda_fp8 test_cuda_fp8_linear; do
        "$B/tests/$t" >"$OUT/$t.log" 2>&1 || FAILED+=("$t")
        grep -E "^# (fwd|bwd)|^FAIL|#summary" "$OUT/$t.log" | tail -n 12
    done
    q06=configs/models/qwen3-0.6b/config.json
    echo "== 50 steps, qwen3-0.6b shape: base_precision fp8 against the bf16 base"
    fp8_vs_bf16 qwen3 $q06 configs/qwen3-0.6b.yaml 4096 2e-4 2e-2 50
    echo "== control: the FP8 run at 5x the learning rate must fail"
    fp8_vs_bf16 qwen3_control $q06 configs/qwen3-0.6b.yaml 4096 2e-4 2e-2 50 1e-3
    echo "== 300 steps, qwen3-0.6b shape: the final eval loss of both"
    fp8_vs_bf16 qwen3_eval300 $q06 configs/qwen3-0.6b.yaml 4096 2e-4 1e-2 300
fi
if has fp8big; then
    echo "== 50 steps, llama3.1-8b shape: base_precision fp8 against the bf16 base"
    fp8_vs_bf16 llama8b configs/models/llama3.1-8b/config.json configs/qwen3-0.6b.yaml 4096 2e-4 2e-2 50
fi

# nccl_lib_dir: the folder of a libnccl.so.2 (torch's nvidia-nccl wheel, else the system's)
nccl_lib_dir() {
    python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null \
        || dirname "$(find / -name libnccl.so.2 -not -path '*/proc/*' 2>/dev/null | head -n 1)"
}

# dist_pair NAME CONFIG.json RUN.yaml TOKENS LR: 50 steps of one rank accumulating 2
# micro-batches, then 2 ranks (launched as torchrun would, both on GPU 0, gradients
# summed through rank 0's host) taking one each; the losses must agree to 1e-3.
dist_pair() {
    local name=$1 mcfg=$2 rcfg=$3 tpmb=$4 lr=$5 W=/tmp/dist-$1
    rm -rf $W; mkdir -p $W
    "$B/ctune" init --config "$mcfg" --out $W/model --seed 5 >/dev/null || { FAILED+=("dist $name init"); return; }
    local args=(train "$rcfg" --set model=$W/model --set device=cuda --set "data.train_files=[data/arith/train.shard]"
                --set "data.eval_files=[]" --set data.tokens_per_micro_batch=$tpmb --set training.max_steps=50
                --set training.warmup_steps=5 --set training.logging_steps=1 --set training.learning_rate=$lr
                --set training.lr_scheduler_type=cosine --set training.eval_steps=0 --set training.save_steps=0
                --set training.gradient_accumulation_steps=2 --set training.resume_from_checkpoint=false)
    "$B/ctune" "${args[@]}" --set output_dir=$W/one >"$OUT/dist-$name-one.log" 2>&1 || { tail -n 3 "$OUT/dist-$name-one.log"; FAILED+=("dist $name one"); return; }
    local port=$((29000 + RANDOM % 1000))
    CTUNE_DIST_HOST_REDUCE=1 RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$B/ctune" "${args[@]}" --set output_dir=$W/two >"$OUT/dist-$name-r1.log" 2>&1 &
    local pid=$!
    CTUNE_DIST_HOST_REDUCE=1 RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$B/ctune" "${args[@]}" --set output_dir=$W/two >"$OUT/dist-$name-two.log" 2>&1 || FAILED+=("dist $name two")
    wait $pid || FAILED+=("dist $name rank 1")
    grep -h "tok/s" "$OUT/dist-$name-one.log" "$OUT/dist-$name-two.log" | tail -n 1
    python3 scripts/loss_parity.py $W/one/metrics.jsonl $W/two/metrics.jsonl --tol 1e-3 --steps 50 \
        >"$OUT/dist-$name-parity.log" 2>&1 || FAILED+=("dist $name parity")
    tail -n 1 "$OUT/dist-$name-parity.log"
    rm -rf $W/model
}

if has dist; then
    echo "== several ranks on one GPU"
    export LD_LIBRARY_PATH=$(nccl_lib_dir)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    timeout 120 "$B/tests/test_cuda_nccl" >"$OUT/nccl_tests.log" 2>&1 || FAILED+=(nccl)
    grep -E "^(ok|FAIL|skip|     |#summary)" "$OUT/nccl_tests.log" | cut -c1-200
    dist_pair tiny configs/models/tiny/config.json configs/tiny.yaml 2048 2e-3
    dist_pair qwen3 configs/models/qwen3-0.6b/config.json configs/qwen3-0.6b.yaml 4096 2e-4
    # --gpus 2 with one GPU, and two NCCL ranks put on the same GPU (which NCCL refuses):
    # each must stop with an error, not hang
    W=/tmp/dist-tiny; "$B/ctune" init --config configs/models/tiny/config.json --out $W/model --seed 5 >/dev/null
    targs=(train configs/tiny.yaml --set model=$W/model --set device=cuda --set "data.train_files=[data/arith/train.shard]"
           --set "data.eval_files=[]" --set training.max_steps=5 --set training.warmup_steps=1
           --set training.gradient_accumulation_steps=2
           --set distributed.timeout_seconds=60)
    t0=$(date +%s)
    timeout 300 "$B/ctune" "${targs[@]}" --gpus 2 --set output_dir=$W/gpus2 >"$OUT/dist-gpus2.log" 2>&1
    rc=$?
    echo "--gpus 2 on one GPU: rc $rc after $(( $(date +%s) - t0 )) s"; grep -m 2 "rank 1" "$OUT/dist-gpus2.log" | cut -c1-240
    [ $rc != 0 ] && [ $rc != 124 ] || FAILED+=("dist gpus2 (rc $rc)")
    t0=$(date +%s); port=$((30000 + RANDOM % 1000))
    RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 300 \
        "$B/ctune" "${targs[@]}" --set output_dir=$W/nccl2 >"$OUT/dist-nccl2-r1.log" 2>&1 &
    pid=$!
    RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 300 \
        "$B/ctune" "${targs[@]}" --set output_dir=$W/nccl2 >"$OUT/dist-nccl2.log" 2>&1
    rc=$?; wait $pid; rc1=$?
    echo "two NCCL ranks on one GPU: rc $rc / $rc1 after $(( $(date +%s) - t0 )) s"
    grep -h -m 2 -E "error|NCCL" "$OUT/dist-nccl2.log" "$OUT/dist-nccl2-r1.log" | cut -c1-240
    [ $rc != 124 ] && [ $rc1 != 124 ] || FAILED+=("dist nccl2 hangs")
fi

# sanitize_run NAME TOOL STEPS MODEL_DIR: a short training run under compute-sanitizer
sanitize_run() {
    local name=$1 tool=$2 steps=$3 model=$4
    timeout 600 compute-sanitizer --tool "$tool" --error-exitcode 9 "$B/ctune" train configs/tiny.yaml \
        --set model="$model" --set output_dir=/tmp/san-$name-$tool --set device=cuda \
        --set training.max_steps=$steps --set training.warmup_steps=1 --set training.eval_steps=0 \
        --set data.tokens_per_micro_batch=2048 --set data.max_length=1024 \
        --set memory.gradient_checkpointing=true --set memory.activation_offload=on >"$OUT/san-$name-$tool.log" 2>&1
    local rc=$? summary
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$name-$tool.log" | tail -n 1)
    echo "$name $tool: rc $rc $summary"
    [ $rc = 0 ] && return
    # 9: the tool found errors; any other status (a crash, the timeout) fails too,
    # except racecheck stopping the program after a summary of 0 hazards (seen on
    # every run so far, cause not found: docs/kernels/attention.md), which is reported instead
    if [ $rc != 9 ] && [ "$tool" = racecheck ] && [[ $summary == *"RACECHECK SUMMARY: 0 hazards"* ]]; then
        echo "  racecheck stopped the program after 0 hazards (rc $rc): reported, not failed"
        return
    fi
    FAILED+=("sanitize $name $tool")
}

if has sanitize; then
    echo "== compute-sanitizer"
    python3 -c "import json; c=json.load(open('configs/models/qwen3-0.6b/config.json')); c['num_hidden_layers']=2; json.dump(c, open('/tmp/q2.json','w'))"
    "$B/ctune" init --config /tmp/q2.json --out /tmp/san-q2 --seed 1 >/dev/null
    "$B/ctune" init --config configs/models/tiny-qwen3/config.json --out /tmp/san-tq --seed 1 >/dev/null
    for m in q2 tq; do
        sanitize_run $m memcheck 2 /tmp/san-$m
        sanitize_run $m racecheck 1 /tmp/san-$m
    done
fi

if has bench; then
    echo "== bench"
    OUT=$OUT/bench bash scripts/bench.sh
    cp "$OUT/bench/bench.jsonl" "$OUT/bench.jsonl" 2>/dev/null
fi

if [ ${#FAILED[@]} -gt 0 ]; then
    echo "gpu_check: FAILED: ${FAILED[*]}"
else
    echo "gpu_check: every check that ran passed"
fi
exit ${#FAILED[@]}
