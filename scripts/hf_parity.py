#!/usr/bin/env python3
"""hf_parity.py - the HF transformers + PEFT reference that judges ctune.

Needs torch, transformers, peft and safetensors (no network; bitsandbytes for
bitsandbytes 4-bit bases, nothing more for MXFP4 and FP8 ones). Two modes, grads and
train, and a helper, quantize (below):

  grads: loss and LoRA gradients of one batch, for the committed CPU fixtures
    python3 scripts/hf_parity.py grads --model DIR --adapter DIR --docs DOCS.jsonl \\
        --out EXPECTED.safetensors [--device cpu|cuda] [--dtype float32|bfloat16|float64] [--quantize nf4|fp4|fp8]
  DOCS.jsonl: one {"input_ids": [...], "labels": [...]} per line (labels -100 =
  ignored, else the token; "loss_mask" 0/1 instead of labels, or neither = all).
  Each document runs alone (batch 1, positions 0..T-1); the target of position t
  is labels[t+1]; loss = sum of per-target CE over all documents / all targets.
  Writes "loss" (F32 [1]) and every LoRA gradient under its PEFT saved name
  (base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight), fp32.

  --dtype float64 runs the model, the adapter and the loss in fp64 throughout,
  the model file's own fp32 casts too: its source (modeling_MODEL.py) is
  recompiled with torch.float32 / .float() read as fp64 (the gated delta rule,
  the conv, the norms, RoPE and softmax all cast to fp32 internally), and the
  default dtype is fp64. The reference of parity_qwen3_5: the Gated DeltaNet
  hybrid's gradients are ill-conditioned enough that HF's own fp32 run is
  2-4.5e-4 (L2, relative) from fp64 (its chunked delta rule forms
  exp(cumsum_i - cumsum_j) over 64-token chunks), farther than ctune's fp32
  (<= 1.9e-4); rounding only the delta rule's inputs and output (and their
  gradients) to fp32 once, in an fp64 run, already moves them by up to 6e-5.
  The gradients are written as fp32 all the same.

  Mixture-of-experts adapters (qwen3_moe, mixtral) are saved per expert
  (...mlp.experts.E.gate_proj.lora_A.weight; mixtral ...block_sparse_moe.experts.E.w1).
  transformers v4 has those modules and the gradients carry those names as they
  are. transformers v5 fuses the experts into nn.Parameters and PEFT converts the
  adapter on load (peft/utils/transformers_weight_conversion.py): each layer gets
  ...mlp.experts.base_layer.lora_A/B (gate_up_proj: A [E*2r, H] = per expert the
  gate then the up A; B [2I, 2r*E], column j*E + e, block-diagonal: gate rows
  with ranks 0..r-1, up rows with ranks r..2r-1, zeros elsewhere; rank 2r and
  alpha 2*alpha keep the scale) and ...mlp.experts.lora_A/B (down_proj: A [E*r, I],
  B [H, r*E], column j*E + e). The gradients of those fused parameters are split
  back into the per-expert names (the off-diagonal blocks are not parameters of
  the per-expert adapter: their gradients are dropped in grads mode and zeroed
  before each optimizer step in train mode, so those entries stay 0). Which
  fused parameter a wrapper holds is read from PEFT's ParamWrapper.parameter_name.
  gpt_oss adapters are in the target_parameters format already (its experts are
  parameters in every transformers version) and keep their names. Checked with
  torch 2.11, transformers 5.17.0 and peft 0.21.0 (tests/fixtures/parity_qwen3_moe,
  parity_mixtral, parity_gpt_oss agree with ctune to <= 3e-5).

  train: replays a ctune run step by step and compares the per-step losses
    python3 scripts/hf_parity.py train --model DIR --adapter INIT_ADAPTER_DIR \\
        --shards S1 [S2...] --trace BATCHES.jsonl --metrics METRICS.jsonl \\
        --lr LR --scheduler cosine|linear|constant --warmup W --steps N \\
        [--weight-decay 0] [--beta1 0.9] [--beta2 0.999] [--eps 1e-8] \\
        [--max-grad-norm 1.0] [--device cuda] [--dtype bfloat16|float32] \\
        [--run-steps K] [--out RESULT.json] [--quantize nf4|fp4|fp8]
  --shards in the order ctune opened them (global document ids follow it);
  BATCHES.jsonl is ctune's CTUNE_TRACE output, one line per optimizer step:
  {"step": k, "micro_batches": [[[doc_id, length], ...], ...]}. --steps N is the
  run's total steps (it shapes the lr schedule); --run-steps K replays only the
  first K. Each step: sum of CE over the targets of every document (each alone,
  its first `length` tokens; target of t = token[t+1] where mask[t+1] == 1) /
  the step's targets; backward; clip_grad_norm_; torch AdamW; LambdaLR from
  transformers.optimization. METRICS.jsonl is ctune's metrics (lines with
  "eval_loss" are skipped); a logged loss averages the steps since the previous
  logged one, and is compared the same way (use logging_steps: 1 for per-step).
  Prints a table and the max relative difference |ctune - hf| / |hf|; exits 0
  whatever the difference (the caller judges), 2 on malformed input.

  4-bit bases (bitsandbytes QLoRA; needs bitsandbytes, 0.50.2 checked). A
  --model folder whose config.json has quantization_config (quant_method
  bitsandbytes, load_in_4bit) is loaded by HF as it is: every Linear4bit keeps
  the folder's codes and absmax (NF4 or FP4, double quant or not). Its
  bnb_4bit_compute_dtype is replaced by the mode's --dtype (float32 for the CPU
  fixtures, bfloat16 on the GPU): passing a BitsAndBytesConfig does not do it
  (from_pretrained keeps the folder's quantization_config then), so the
  folder's model config goes in with that one key changed. bnb's backward
  dequantizes to quant_state.dtype (the dtype the weight was quantized from,
  bfloat16 in a saved checkpoint) while its forward dequantizes to the input's
  dtype, so in float32 the input gradient would go through bf16-rounded weights
  (4.4e-3 off in the gradients of parity_qwen3_nf4): quant_state.dtype is set to
  the mode's dtype, and then both passes use code * absmax in fp32, equal bit
  for bit to a plain fp32 model holding those weights (what ctune's CPU
  backend computes). In bfloat16 both passes dequantize to bf16 and run a bf16
  GEMM (ctune's CUDA backend); on CUDA bnb's fused small-M GEMM kernels (M <=
  1536 rows) are turned off so that every GEMM takes that dequantize-then-
  F.linear path, as ctune does. Each q/k/v/o/gate/up/down must be a Linear4bit
  (else exit 2). PEFT's prepare_model_for_kbit_training is not called: it
  freezes the base (PEFT does so anyway), turns on gradient checkpointing
  (a recompute: the same math) and upcasts every non-4-bit fp16/bf16 parameter
  (norms, embeddings, lm_head) to fp32. In float32 that upcast is a no-op; in
  bfloat16 it would run the norms, embeddings and head in fp32 where ctune keeps
  them as stored (bf16), so it would change the math the check compares.
  The LoRA weights stay fp32 either way (autocast_adapter_dtype).
  --quantize nf4|fp4 loads a bf16 folder and quantizes it on load instead
  (BitsAndBytesConfig load_in_4bit, that type, double quant for nf4, bnb's
  blocksize 64, quant storage uint8): the reference of ctune's
  model_quantization. On the CPU that is bnb's CPU quantizer (the torch op
  quantize_4bit and its C++ quantize_blockwise), which ctune's quant4 matches
  bit for bit; on CUDA bnb's own kernel, which may round a tie otherwise.

  MXFP4 bases (gpt-oss; docs/mxfp4.md). A --model folder whose config.json has
  quantization_config quant_method mxfp4 (gpt_oss only; ctune init --quantize
  mxfp4 writes one, as the Hub's checkpoints are) is loaded with
  quantization_config=Mxfp4Config(dequantize=True), in both modes:
  transformers decodes each expert stack (NAME_blocks, NAME_scales) to bf16
  code * 2^(s - 127) and the model runs as a plain one, cast to --dtype (exact:
  every such value is a bf16 value; float32 for the CPU fixtures, bfloat16 on
  CUDA). Without dequantize, transformers would swap in Mxfp4GptOssExperts and
  the triton kernels of the `kernels` package where it finds them (and fall
  back, with a warning, where not: neither machine has them, but that is luck,
  not a contract). dequantize=True is a loading attribute, so it overrides the
  folder's config. After loading, every stack the folder holds as NAME_blocks
  must be a plain GptOssExperts parameter in --dtype (no triton mlp_forward)
  equal bit for bit to the folder's bytes decoded here by hand, low nibble
  first (exit 2 otherwise); the line "mxfp4 base: N expert stacks ..." on
  stderr says it was. --quantize on such a folder is an error (exit 2).
  Checked with transformers 5.17.0: tests/fixtures/parity_gpt_oss_mxfp4 agrees
  with ctune to 1.4e-5.

  FP8 bases (E4M3 in 128x128 blocks; docs/fp8.md). A --model folder whose
  config.json has quantization_config quant_method fp8 (ctune init --quantize
  fp8 and ctune quantize --type fp8 write one, as save_pretrained writes an
  FP8Linear) is loaded with quantization_config=FineGrainedFP8Config(
  dequantize=True), in both modes: transformers' Fp8Dequantize decodes each
  weight into a plain nn.Linear of the parameter's dtype, decode(q) *
  scale_inv as one fp32 product (exact in float32, what ctune's CPU backend
  computes before each GEMM). Without dequantize it would keep FP8Linear and
  its FP8 GEMMs on a GPU (and dequantize on a machine without one). After
  loading, every F8_E4M3 weight of the folder must be a plain nn.Linear
  parameter in --dtype equal bit for bit to the folder's codes and scales
  decoded by hand, and no scale_inv may remain (exit 2 otherwise; the line "fp8
  base: N weights ..." on stderr says it was). 5.17's Fp8Dequantize takes the
  block size from the scale grid (rows / grid rows), which is wrong for a
  partial block, so a weight whose dims are not multiples of 128 exits 2.
  --quantize fp8 loads a bf16 folder and quantizes each q/k/v/o/gate/up/down
  weight of the layers here, with the arithmetic of ctune's fp8_quantize_blocks
  (per block amax, scale = (1 / amax) * 448 in fp32, scale_inv = 1 / scale,
  q = e4m3(clamp(x * scale)); a block of zeros keeps scale_inv 1), and runs
  the decoded weights: the reference of ctune's base_precision: fp8. HF's own
  on-load quantizer cannot be that reference: on a machine without a GPU
  FineGrainedFP8Config() refuses to quantize (and with dequantize=True loads
  the bf16 weights as they are), and on a GPU 5.17's loader casts each bf16
  weight to E4M3 unscaled before Fp8Quantize runs (docs/fp8.md), which loses
  most bits of small weights. Each weight's codes and scales are checked bit
  for bit against transformers' Fp8Quantize._quantize_one on the same fp32
  weight, and their decode against Fp8Dequantize._dequantize_one: HF's
  arithmetic without the loader's cast. A model with experts or other linear
  weights in its layers exits 2 (not modelled). Checked with transformers
  5.17.0: tests/fixtures/parity_qwen3_fp8 and parity_qwen3_fp8_onload.

  quantize: writes a bf16 --model quantized by bitsandbytes, as HF saves it
    python3 scripts/hf_parity.py quantize --model DIR --out DIR4 \\
        [--quant-type nf4|fp4] [--double-quant|--no-double-quant] [--device cpu|cuda]
  (save_pretrained of the 4-bit model: the Linear4bit tensors of QUANT.md 1.4 and
  config.json's quantization_config, compute dtype bfloat16).

  The model runs with eager attention and, on transformers v5, eager experts
  (the default grouped_mm wants 16-byte row strides, which tiny widths lack).
  Both modes first check that PEFT loaded the whole adapter: every tensor of
  adapter_model.safetensors must be a LoRA parameter holding the file's values,
  and PEFT must have made no LoRA parameter that the file lacks (PEFT leaves a
  module it does not target plain, silently). Otherwise they exit 3, listing
  the tensors.
"""
import argparse
import json
import math
import os
import re
import struct
import sys
import zlib
from array import array


def die(path, msg):
    print(f"{path}: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- input files

def read_jsonl(path):
    """Yields (line number, object) for every non-blank line; exit 2 on bad JSON."""
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        die(path, f"cannot open: {e.strerror}")
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                die(path, f"line {n}: bad JSON ({e.msg})")
            if not isinstance(obj, dict):
                die(path, f"line {n}: expected a JSON object")
            yield n, obj


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def read_docs(path):
    """DOCS.jsonl -> list of (input_ids, targets) with targets[t] = label of t+1 or -100."""
    docs = []
    for n, o in read_jsonl(path):
        ids = o.get("input_ids")
        if not isinstance(ids, list) or not ids or not all(is_int(t) and t >= 0 for t in ids):
            die(path, f"line {n}: input_ids must be a non-empty list of token ids")
        if "labels" in o:
            labels = o["labels"]
            if not isinstance(labels, list) or len(labels) != len(ids) or not all(is_int(t) for t in labels):
                die(path, f"line {n}: labels must be {len(ids)} integers")
        elif "loss_mask" in o:
            m = o["loss_mask"]
            if not isinstance(m, list) or len(m) != len(ids) or not all(v in (0, 1) for v in m):
                die(path, f"line {n}: loss_mask must be {len(ids)} values 0/1")
            labels = [t if v else -100 for t, v in zip(ids, m)]
        else:
            labels = list(ids)
        docs.append((ids, labels[1:] + [-100]))
    if not docs:
        die(path, "no documents")
    return docs


def read_shard(path):
    """A ctune shard (docs/SHARDS.md) -> (offsets, tokens, mask), fully checked."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        die(path, f"cannot open: {e.strerror}")
    if len(data) < 64:
        die(path, "not a shard (shorter than the 64-byte header)")
    magic, ver, tb, D, N, maxid, pcrc = struct.unpack_from("<8sIIQQII", data, 0)
    (hcrc,) = struct.unpack_from("<I", data, 60)
    if magic != b"CTSHARD\0":
        die(path, "not a shard (bad magic)")
    if ver != 1 or tb != 4:
        die(path, f"unsupported shard version {ver} / token_bytes {tb}")
    if zlib.crc32(data[:60]) != hcrc:
        die(path, "header CRC mismatch")
    size = 64 + 8 * (D + 1) + 5 * N
    if D < 1 or len(data) != size + (-size % 8):
        die(path, f"size {len(data)} does not match {D} documents and {N} tokens")
    if zlib.crc32(data[64:]) != pcrc:
        die(path, "payload CRC mismatch")
    offs, toks = array("Q"), array("I")
    if offs.itemsize != 8 or toks.itemsize != 4:
        die(path, "this Python's array sizes do not fit the format")
    offs.frombytes(data[64:64 + 8 * (D + 1)])
    toks.frombytes(data[64 + 8 * (D + 1):64 + 8 * (D + 1) + 4 * N])
    if sys.byteorder == "big":
        offs.byteswap()
        toks.byteswap()
    mask = data[64 + 8 * (D + 1) + 4 * N:size]
    if offs[0] != 0 or offs[D] != N or any(offs[i] >= offs[i + 1] for i in range(D)):
        die(path, "bad document offsets")
    return offs, toks, mask


def load_documents(paths):
    """Global document list over the shards in the given order: (tokens, mask, start, end)."""
    docs = []
    for p in paths:
        offs, toks, mask = read_shard(p)
        docs += [(toks, mask, offs[d], offs[d + 1]) for d in range(len(offs) - 1)]
    return docs


def read_trace(path, docs):
    """BATCHES.jsonl -> {step: [(doc_id, length), ...]} (micro-batches flattened)."""
    steps = {}
    for n, o in read_jsonl(path):
        k, mbs = o.get("step"), o.get("micro_batches")
        if not is_int(k) or k < 1 or not isinstance(mbs, list):
            die(path, f"line {n}: expected {{\"step\": k >= 1, \"micro_batches\": [...]}}")
        flat = []
        for mb in mbs:
            if not isinstance(mb, list):
                die(path, f"line {n}: a micro-batch must be a list of [doc_id, length]")
            for e in mb:
                if not (isinstance(e, list) and len(e) == 2 and is_int(e[0]) and is_int(e[1])):
                    die(path, f"line {n}: bad entry {e!r} (expected [doc_id, length])")
                d, length = e
                if not 0 <= d < len(docs):
                    die(path, f"line {n}: document {d} out of range ({len(docs)} documents in the shards)")
                if not 1 <= length <= docs[d][3] - docs[d][2]:
                    die(path, f"line {n}: length {length} of document {d} is not in [1, {docs[d][3] - docs[d][2]}]")
                flat.append((d, length))
        steps[k] = flat  # a repeated step (a resumed run) replays the same batches: last one wins
    if not steps:
        die(path, "no steps")
    for k in range(1, len(steps) + 1):
        if k not in steps:
            die(path, f"step {k} is missing (steps must run 1..K)")
    return steps


def read_metrics(path):
    """METRICS.jsonl -> {step: record} for training lines (eval lines skipped)."""
    out = {}
    for n, o in read_jsonl(path):
        if "eval_loss" in o or "step" not in o or "loss" not in o:
            continue
        if not is_int(o["step"]) or not isinstance(o["loss"], (int, float)):
            die(path, f"line {n}: step must be an integer and loss a number")
        out[o["step"]] = o
    if not out:
        die(path, "no training lines (with step and loss)")
    return out


# ---------------------------------------------------------------- the model

def fp64_model_source(model_dir):
    """Recompile the model's modeling_*.py with its fp32 casts made fp64 (--dtype
    float64), so that the classes from_pretrained builds compute in fp64 inside
    too; returns how many casts were changed."""
    import importlib
    import torch
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    cfg = AutoConfig.from_pretrained(model_dir)
    cls = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[cfg.model_type]
    mod = None
    for name in (cfg.model_type, cfg.model_type.rsplit("_", 1)[0]):  # qwen3_5_text lives in qwen3_5
        try:
            m = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except ImportError:
            continue
        if hasattr(m, cls):
            mod = m
            break
    if mod is None:
        die(model_dir, f"no transformers module defines {cls}")
    src = open(mod.__file__).read()
    casts = ("torch.float32", "torch.float64"), (".float()", ".double()"), ("dtype=torch.float)", "dtype=torch.float64)")
    n = sum(src.count(a) for a, _ in casts)
    for a, b in casts:
        src = src.replace(a, b)
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)  # the same module, its classes redefined
    torch.set_default_dtype(torch.float64)
    return n


def load_model(args):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from peft import PeftModel
    for d in (args.model, args.adapter):
        if not os.path.isdir(d):
            die(d, "not a directory")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[args.dtype]
    mx = mxfp4_config(args)
    f8 = fp8_config(args)
    f8_load = fp8_on_load(args)
    qcfg = None if mx is not None or f8 is not None or f8_load else bnb_config(args, dtype)
    if dtype == torch.float64:
        n = fp64_model_source(args.model)
        print(f"float64: {n} fp32 casts of the model's source read as fp64", file=sys.stderr)
    try:
        torch.set_float32_matmul_precision("highest")  # no TF32 in the fp32 reference
    except Exception:
        pass
    # eager attention, and eager experts (v5's default grouped_mm needs 16-byte row strides)
    impl = {"attn_implementation": "eager"}
    if int(transformers.__version__.split(".")[0]) >= 5:
        impl["experts_implementation"] = "eager"
    if qcfg is not None:  # a 4-bit model is placed by device_map and cannot be cast or moved after
        impl["device_map"] = {"": args.device}
        impl["config" if getattr(args, "quantize", None) is None else "quantization_config"] = qcfg
    if mx is not None or f8 is not None:  # their loading attribute dequantize overrides the folder's config
        impl["quantization_config"] = mx if mx is not None else f8
    try:
        base = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, **impl)
    except TypeError:  # transformers < 4.56 knows only torch_dtype
        base = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=dtype, **impl)
    if qcfg is None:
        base.to(dtype)  # exact either way: the checkpoint's bf16 values fit fp32 exactly
    else:
        bnb_prepare(base, args, dtype)
    if mx is not None:
        mxfp4_check(base, args, dtype)
    if f8 is not None:
        fp8_check(base, args, dtype)
    if f8_load:
        fp8_quantize_layers(base, args, dtype)
    # autocast_adapter_dtype=True keeps the LoRA weights fp32 on a bf16 base, as ctune does
    model = PeftModel.from_pretrained(base, args.adapter, is_trainable=True, autocast_adapter_dtype=True)
    if qcfg is None:  # on a 4-bit base PEFT puts the LoRA weights on the base's device itself
        model.to(args.device)
    if dtype == torch.float64:
        model.to(dtype)  # the LoRA weights too (their bf16/fp32 values are exact in fp64)
    model.train()
    zeroed = 0
    for m in model.modules():  # train mode, but no dropout anywhere
        if isinstance(m, torch.nn.Dropout) and m.p != 0:
            m.p, zeroed = 0.0, zeroed + 1
        for attr in ("attention_dropout", "dropout"):
            v = getattr(m, attr, None)
            if isinstance(v, float) and v != 0:
                setattr(m, attr, 0.0)
                zeroed += 1
    if zeroed:
        print(f"warning: set {zeroed} non-zero dropout probabilities to 0 (ctune may have used dropout)",
              file=sys.stderr)
    params = []  # (saved name, parameter)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if "lora_" not in name:
            print(f"warning: trainable non-LoRA parameter {name}", file=sys.stderr)
        if p.dtype not in (torch.float32, dtype):  # ctune keeps every LoRA weight in fp32 (fp64 stays fp64)
            p.data = p.data.float()
        params.append((re.sub(r"\.default(?=\.|$)", "", name), p))
    if not params:
        die(args.adapter, "PEFT made no trainable parameters from this adapter")
    model.ctune_fused = fused_experts(model, args.adapter, params)
    check_loaded(args.adapter, model, params)
    return model, params


# ---------------------------------------------------------------- 4-bit bases

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def folder_quantization(model_dir):
    """config.json's quantization_config of a model folder (None for a plain
    one); exit 2 when config.json cannot be read."""
    cfg_path = os.path.join(model_dir, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        die(cfg_path, f"cannot read: {e}")
    if not isinstance(cfg, dict):
        die(cfg_path, "not a JSON object")
    return cfg.get("quantization_config")


def bnb_config(args, dtype):
    """How to load --model 4-bit, or None for a plain model: --quantize's
    BitsAndBytesConfig, or the folder's model config whose quantization_config
    (quant_method bitsandbytes, 4-bit) has bnb_4bit_compute_dtype replaced by
    the mode's dtype. Exit 2 on a config this reference does not model."""
    cfg_path = os.path.join(args.model, "config.json")
    q = folder_quantization(args.model)
    quantize = getattr(args, "quantize", None)
    if q is None and not quantize:
        return None
    if q is not None and quantize:
        die(args.model, f"--quantize {quantize}: the folder is quantized already")
    import torch
    if dtype not in (torch.float32, torch.bfloat16):
        die(args.model, "a 4-bit base runs in float32 or bfloat16 only (--dtype)")
    from transformers import BitsAndBytesConfig
    if quantize:  # ctune's model_quantization: nf4 / fp4 (bnb's Linear4bit blocksize is 64)
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quantize,
                                  bnb_4bit_use_double_quant=quantize == "nf4",
                                  bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage="uint8")
    if not isinstance(q, dict) or q.get("quant_method") != "bitsandbytes":
        die(cfg_path, f"quantization_config: quant_method {q.get('quant_method') if isinstance(q, dict) else q!r} "
                      "is not bitsandbytes")
    if not (q.get("load_in_4bit") or q.get("_load_in_4bit")):
        die(cfg_path, "quantization_config: only bitsandbytes 4-bit (load_in_4bit) is modelled")
    if q.get("bnb_4bit_quant_storage", "uint8") != "uint8":
        die(cfg_path, f"quantization_config: bnb_4bit_quant_storage {q['bnb_4bit_quant_storage']!r} is not uint8")
    # from_pretrained ignores a quantization_config argument when the folder has
    # one: the folder's goes in through the model config, its compute dtype replaced
    from transformers import AutoConfig
    mcfg = AutoConfig.from_pretrained(args.model)
    mcfg.quantization_config = dict(q, bnb_4bit_compute_dtype=str(dtype).replace("torch.", ""))
    return mcfg


def bnb_prepare(base, args, dtype):
    """After loading a 4-bit base: every Linear4bit dequantizes to the mode's
    dtype in both passes, each q/k/v/o/gate/up/down is a Linear4bit, and, on
    CUDA, bnb's fused small-M GEMM kernels are off (see the module docstring)."""
    import bitsandbytes as bnb
    import torch
    n4, plain = 0, []
    for name, mod in base.named_modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            if mod.compute_dtype != dtype:
                die(args.model, f"{name}: bitsandbytes computes in {mod.compute_dtype}, not {dtype}")
            mod.weight.quant_state.dtype = dtype  # what backward's dequantize_4bit returns
            n4 += 1
        elif isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LINEAR_NAMES:
            plain.append(name)
    if plain or not n4:
        die(args.model, f"{len(plain)} projections are not Linear4bit ({', '.join(plain[:4])}"
                        f"{' ...' if len(plain) > 4 else ''}); {n4} are")
    if str(args.device).startswith("cuda"):
        try:
            from bitsandbytes.backends.cuda import ops as bnb_cuda_ops
            bnb_cuda_ops._gemm_4bit_custom_max_m = 0  # every GEMM: dequantize to bf16, then F.linear
        except (ImportError, AttributeError) as e:
            print(f"warning: cannot turn bnb's fused 4-bit GEMMs off ({e})", file=sys.stderr)
    qs = next(m.weight.quant_state for m in base.modules() if isinstance(m, bnb.nn.Linear4bit))
    print(f"4-bit base: {n4} Linear4bit ({qs.quant_type}, blocksize {qs.blocksize}, "
          f"double quant {bool(qs.nested)}), dequantized to {dtype}", file=sys.stderr)


# ---------------------------------------------------------------- MXFP4 bases

MXFP4_CODES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def mxfp4_config(args):
    """Mxfp4Config(dequantize=True) for a --model folder whose quantization_config
    has quant_method mxfp4 (gpt-oss experts), else None. Exit 2 with --quantize
    (the folder is quantized already) or on a model other than gpt_oss."""
    q = folder_quantization(args.model)
    if not isinstance(q, dict) or q.get("quant_method") != "mxfp4":
        return None
    if getattr(args, "quantize", None):
        die(args.model, f"--quantize {args.quantize}: the folder is quantized already (mxfp4)")
    from transformers import AutoConfig, Mxfp4Config
    if AutoConfig.from_pretrained(args.model).model_type != "gpt_oss":
        die(args.model, "quantization_config: mxfp4 is modelled for gpt_oss only")
    return Mxfp4Config(dequantize=True)


def mxfp4_decode(blocks, scales):
    """A [E, rows, K/32, 16] U8 block tensor and its [E, rows, K/32] scales, decoded
    by the rule of docs/mxfp4.md (low nibble first, code * 2^(s - 127)) in fp64,
    as transformers holds it: [E, K, rows]."""
    import torch
    lut = torch.tensor(MXFP4_CODES, dtype=torch.float64)
    b = blocks.to(torch.uint8).long()
    v = torch.stack([lut[b & 15], lut[b >> 4]], -1).reshape(*scales.shape, 32)
    v = v * torch.pow(2.0, scales.double() - 127)[..., None]
    return v.reshape(scales.shape[0], scales.shape[1], -1).transpose(1, 2)


def mxfp4_check(base, args, dtype):
    """After loading an MXFP4 folder, that transformers did dequantize it (see
    the module docstring): every expert stack the folder holds as NAME_blocks is
    a plain GptOssExperts parameter in the mode's dtype (no Mxfp4GptOssExperts,
    no triton mlp_forward) equal bit for bit to the folder's blocks and scales
    decoded by hand (mxfp4_decode). Exit 2 otherwise."""
    import glob
    import torch
    from safetensors import safe_open
    files = sorted(glob.glob(os.path.join(args.model, "*.safetensors")))
    if not files:
        die(args.model, "no .safetensors files")
    mods = dict(base.named_modules())
    params = dict(base.named_parameters())
    n = 0
    for path in files:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                if not key.endswith("_blocks"):
                    continue
                name = key[: -len("_blocks")]
                owner = name.rsplit(".", 1)[0]
                mod, mlp = mods.get(owner), mods.get(owner.rsplit(".", 1)[0])
                if type(mod).__name__ != "GptOssExperts" or (mlp is not None and "forward" in vars(mlp)):
                    die(args.model, f"{owner} is {type(mod).__name__}, not a dequantized GptOssExperts: "
                                    "transformers kept MXFP4 (triton kernels)")
                p = params.get(name)
                if p is None or p.dtype != dtype:
                    die(args.model, f"{name}: {'missing' if p is None else p.dtype} after dequantizing, "
                                    f"expected a {dtype} parameter")
                try:
                    want = mxfp4_decode(f.get_tensor(key), f.get_tensor(name + "_scales"))
                except Exception as e:  # noqa: BLE001 - reported as bad input
                    die(path, f"{key}: cannot decode ({e})")
                if tuple(want.shape) != tuple(p.shape) or not torch.equal(p.detach().double().cpu(), want):
                    die(args.model, f"{name}: transformers' dequantized {list(p.shape)} differs from the "
                                    f"folder's MXFP4 decoded by hand {list(want.shape)}")
                n += 1
    if not n:
        die(args.model, "quantization_config says mxfp4 but no tensor is stored as NAME_blocks")
    print(f"mxfp4 base: {n} expert stacks dequantized by transformers (Mxfp4Config(dequantize=True)), "
          f"{dtype}, equal to the folder's decode bit for bit", file=sys.stderr)


# ---------------------------------------------------------------- FP8 bases

FP8_BLOCK = 128  # weight block rows and columns (docs/fp8.md)
FP8_MAX = 448.0  # the largest E4M3 value


def fp8_config(args):
    """FineGrainedFP8Config(dequantize=True) for a --model folder whose
    quantization_config has quant_method fp8, else None. Exit 2 with --quantize
    (the folder is quantized already) or on blocks other than 128x128 with
    float scales."""
    q = folder_quantization(args.model)
    if not isinstance(q, dict) or q.get("quant_method") != "fp8":
        return None
    if getattr(args, "quantize", None):
        die(args.model, f"--quantize {args.quantize}: the folder is quantized already (fp8)")
    if list(q.get("weight_block_size") or []) != [FP8_BLOCK, FP8_BLOCK] or q.get("scale_fmt", "float") != "float":
        die(os.path.join(args.model, "config.json"),
            "quantization_config: only fp8 with 128x128 blocks and float scales is modelled")
    from transformers import FineGrainedFP8Config
    return FineGrainedFP8Config(dequantize=True)


def fp8_on_load(args):
    """True for --quantize fp8; exit 2 when the folder is quantized already."""
    if getattr(args, "quantize", None) != "fp8":
        return False
    q = folder_quantization(args.model)
    if q is not None:
        die(args.model, f"--quantize fp8: the folder is quantized already "
                        f"({q.get('quant_method') if isinstance(q, dict) else q!r})")
    return True


def fp8_decode(q, scale_inv):
    """An F8_E4M3 weight [rows, cols] and its scale_inv [ceil(rows/128),
    ceil(cols/128)] decoded by the rule of docs/fp8.md: decode(q) * scale_inv
    of its 128x128 block, one fp32 product."""
    import torch
    rows, cols = q.shape
    s = scale_inv.float().repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)
    return q.to(torch.float32) * s[:rows, :cols]


def fp8_pad(x):
    """x [rows, cols] fp32 zero-padded to whole 128x128 blocks."""
    import torch
    rows, cols = x.shape
    b = FP8_BLOCK
    xp = torch.zeros(-(-rows // b) * b, -(-cols // b) * b, dtype=torch.float32)
    xp[:rows, :cols] = x
    return xp


def fp8_quantize(name, x):
    """x [rows, cols] fp32 -> (q F8_E4M3 [rows, cols], scale_inv F32 [ceil(rows/128),
    ceil(cols/128)]) with the arithmetic of ctune's fp8_quantize_blocks, that of
    transformers' Fp8Quantize._quantize_one: per 128x128 block (a partial one as
    if zero-padded) amax = max |x|, scale = (1 / amax) * 448 in fp32 (torch's
    448 / amax), 1 for a block of zeros, scale_inv = 1 / scale, q =
    e4m3(clamp(x * scale, -448, 448)). Exit 2 on what ctune refuses: a
    non-finite x, a block whose scale overflows fp32."""
    import torch
    if not torch.isfinite(x).all():
        die(name, "a non-finite weight cannot be quantized to FP8")
    rows, cols = x.shape
    xp = fp8_pad(x)
    R, C = xp.shape[0] // FP8_BLOCK, xp.shape[1] // FP8_BLOCK
    blocks = xp.view(R, FP8_BLOCK, C, FP8_BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax.reciprocal() * FP8_MAX, torch.ones_like(amax))
    if not torch.isfinite(scale).all():
        die(name, "a block's max |x| is so small that its FP8 scale overflows fp32")
    q = (blocks * scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(R * FP8_BLOCK, C * FP8_BLOCK)[:rows, :cols].contiguous(), scale.reciprocal()


def fp8_check_against_hf(name, x, q, scale_inv):
    """fp8_quantize's q and scale_inv for x, and their decode, against
    transformers' own Fp8Quantize._quantize_one and Fp8Dequantize._dequantize_one
    on x zero-padded to whole blocks (5.17 quantizes no partial block), bit for
    bit. Exit 2 where they differ."""
    import types
    import torch
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize
    hq = types.SimpleNamespace(quantization_config=FineGrainedFP8Config())
    xp = fp8_pad(x)
    out = Fp8Quantize(hq)._quantize_one("w.weight", xp)
    hf_q, hf_s = out["w.weight"], out["w.weight_scale_inv"]
    rows, cols = x.shape
    if not (torch.equal(hf_q[:rows, :cols].view(torch.uint8), q.view(torch.uint8)) and torch.equal(hf_s, scale_inv)):
        die(name, "FP8 codes or scales differ from transformers' Fp8Quantize on the same fp32 weight")
    hf_w = Fp8Dequantize(hq)._dequantize_one(hf_q, hf_s, output_dtype=torch.float32)[:rows, :cols]
    if not torch.equal(hf_w, fp8_decode(q, scale_inv)):
        die(name, "the FP8 decode differs from transformers' Fp8Dequantize")


def fp8_quantize_layers(base, args, dtype):
    """--quantize fp8: each q/k/v/o/gate/up/down weight of the layers replaced by
    its FP8 quantization (fp8_quantize, checked against transformers' op),
    decoded, in the mode's dtype. Exit 2 on a model with experts or other
    linear weights in its layers (not modelled)."""
    import torch
    n, other = 0, []
    for name, mod in base.named_modules():
        if ".layers." not in name:
            continue
        if name.endswith(".experts"):
            die(args.model, f"--quantize fp8: {name}: experts are not modelled")
        if not isinstance(mod, torch.nn.Linear):
            continue
        if name.rsplit(".", 1)[-1] not in LINEAR_NAMES:
            other.append(name)
            continue
        x = mod.weight.detach().float().cpu()
        q, s = fp8_quantize(name, x)
        fp8_check_against_hf(name, x, q, s)
        mod.weight.data = fp8_decode(q, s).to(dtype).to(mod.weight.device)
        n += 1
    if other or not n:
        die(args.model, f"--quantize fp8: {len(other)} linear weights of the layers are not modelled "
                        f"({', '.join(other[:4])}{' ...' if len(other) > 4 else ''}); {n} are")
    print(f"fp8 base: {n} weights quantized here as ctune's fp8_quantize_blocks does, equal to transformers' "
          f"Fp8Quantize on the fp32 weights bit for bit, decoded to {dtype}", file=sys.stderr)


def fp8_check(base, args, dtype):
    """After loading an FP8 folder, that transformers did dequantize it (see the
    module docstring): every F8_E4M3 weight of the folder is a plain nn.Linear
    parameter in the mode's dtype equal bit for bit to the folder's codes and
    scales decoded by hand (fp8_decode). Exit 2 otherwise, and on a weight whose
    dims are not multiples of 128 (transformers 5.17's Fp8Dequantize takes the
    block size from the grid, rows / grid rows, wrong for partial blocks)."""
    import glob
    import torch
    from safetensors import safe_open
    files = sorted(glob.glob(os.path.join(args.model, "*.safetensors")))
    if not files:
        die(args.model, "no .safetensors files")
    mods = dict(base.named_modules())
    params = dict(base.named_parameters())
    n = 0
    for path in files:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                if f.get_slice(key).get_dtype() != "F8_E4M3":
                    continue
                t = f.get_tensor(key)
                if t.ndim != 2 or t.shape[0] % FP8_BLOCK or t.shape[1] % FP8_BLOCK:
                    die(path, f"{key} {list(t.shape)}: transformers 5.17 dequantizes partial 128x128 blocks "
                              "with the wrong block size; use dims that are multiples of 128")
                owner = key.rsplit(".", 1)[0]
                if type(mods.get(owner)) is not torch.nn.Linear:
                    die(args.model, f"{owner} is {type(mods.get(owner)).__name__}, not a dequantized nn.Linear")
                p = params.get(key)
                if p is None or p.dtype != dtype:
                    die(args.model, f"{key}: {'missing' if p is None else p.dtype} after dequantizing, "
                                    f"expected a {dtype} parameter")
                try:
                    s = f.get_tensor(key + "_scale_inv")
                except Exception as e:  # noqa: BLE001 - reported as bad input
                    die(path, f"{key}_scale_inv: cannot read ({e})")
                if tuple(s.shape) != (t.shape[0] // FP8_BLOCK, t.shape[1] // FP8_BLOCK):
                    die(path, f"{key}_scale_inv {list(s.shape)} is not the 128x128 grid of {list(t.shape)}")
                if not torch.equal(p.detach().cpu(), fp8_decode(t, s).to(dtype)):
                    die(args.model, f"{key}: transformers' dequantized weight differs from the folder's FP8 "
                                    "decoded by hand")
                n += 1
    if not n:
        die(args.model, "quantization_config says fp8 but no tensor is F8_E4M3")
    if any(k.endswith("_scale_inv") for k in params):
        die(args.model, "scale_inv parameters remain after dequantizing")
    print(f"fp8 base: {n} weights dequantized by transformers (FineGrainedFP8Config(dequantize=True)), "
          f"{dtype}, equal to the folder's decode bit for bit", file=sys.stderr)


def cmd_quantize(args):
    """Writes --model quantized by bitsandbytes (HF save_pretrained of the 4-bit
    model) to --out: the checkpoint format ctune loads (QUANT.md 1.4)."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    if not os.path.isdir(args.model):
        die(args.model, "not a directory")
    qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=args.quant_type,
                            bnb_4bit_use_double_quant=args.double_quant,
                            bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage="uint8")
    base = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, quantization_config=qc,
                                                device_map={"": args.device})
    import bitsandbytes as bnb
    n4 = sum(isinstance(m, bnb.nn.Linear4bit) for m in base.modules())
    base.save_pretrained(args.out)
    print(f"{args.model} -> {args.out}: {n4} Linear4bit ({args.quant_type}, double quant {args.double_quant}, "
          f"quantized on {args.device})")
    return 0


def fused_experts(model, adapter_dir, params):
    """{saved name of a fused v5 expert LoRA parameter: (kind, A|B, layer)}, kind
    gate_up_proj or down_proj, read from the ParamWrapper that owns it. Names the
    adapter file holds as they are (gpt_oss's target_parameters) stay fused."""
    saved = adapter_keys(adapter_dir) or set()
    wrappers = {}
    for mname, mod in model.named_modules():
        pn = getattr(mod, "parameter_name", None)
        if isinstance(pn, str):
            wrappers[re.sub(r"\.default(?=\.|$)", "", mname)] = pn.rsplit(".", 1)[-1]
    out = {}
    for name, _ in params:
        m = re.match(r"^(.*\.layers\.(\d+)\.\w+\.experts(?:\.base_layer)?)\.lora_([AB])\.weight$", name)
        if not m or name in saved:
            continue
        kind = wrappers.get(m.group(1))
        if kind not in ("gate_up_proj", "down_proj"):
            die(adapter_dir, f"cannot tell which expert parameter {name} adapts (PEFT wrapper: {kind!r})")
        out[name] = (kind, m.group(3), int(m.group(2)))
    return out


def expert_names(model_type):
    """(block, gate, up, down) of the per-expert saved names."""
    if model_type == "mixtral":
        return "block_sparse_moe", "w1", "w3", "w2"
    return "mlp", "gate_proj", "up_proj", "down_proj"


def ctune_grads(model, params):
    """{saved per-expert name: gradient (fp32, cpu)}: plain parameters as they are,
    fused v5 expert parameters split back per expert (see the module docstring)."""
    import torch
    return split_fused(model, [(n, p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in params])


def split_fused(model, named):
    """[(saved name, tensor shaped like that parameter)] -> {saved per-expert name:
    tensor (fp32, cpu)}: ctune_grads for any tensors (the weights themselves too)."""
    cfg = model.get_base_model().config
    E = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    block, gate, up, down = expert_names(cfg.model_type)
    out = {}
    for name, g in named:
        g = g.detach().float().cpu()
        if name not in model.ctune_fused:
            out[name] = g.contiguous()
            continue
        kind, ab, layer = model.ctune_fused[name]
        pre = f"base_model.model.model.layers.{layer}.{block}.experts"
        branches = [gate, up] if kind == "gate_up_proj" else [down]
        nb = len(branches)
        if ab == "A":  # [E * nb*r, in]: expert-major rows, per expert the branches in order
            rr = g.shape[0] // E
            v = g.view(E, nb, rr // nb, g.shape[1])
            for e in range(E):
                for b, br in enumerate(branches):
                    out[f"{pre}.{e}.{br}.lora_A.weight"] = v[e, b].contiguous()
        else:  # [nb*out, nb*r*E]: column j*E + e; branch b owns rows b*out.. and ranks b*r..
            rr = g.shape[1] // E
            r, o = rr // nb, g.shape[0] // nb
            v = g.view(g.shape[0], rr, E)
            for e in range(E):
                for b, br in enumerate(branches):
                    out[f"{pre}.{e}.{br}.lora_B.weight"] = v[b * o:(b + 1) * o, b * r:(b + 1) * r, e].contiguous()
    return out


def mask_fused_grads(model, params):
    """Zeroes the gradients of the off-diagonal blocks of fused gate_up lora_B."""
    import torch
    cfg = model.get_base_model().config
    E = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    for name, p in params:
        spec = model.ctune_fused.get(name)
        if not spec or spec[0] != "gate_up_proj" or spec[1] != "B" or p.grad is None:
            continue
        rows, rr = p.shape[0], p.shape[1] // E
        keep = torch.zeros(rows, rr, 1, dtype=p.grad.dtype, device=p.grad.device)
        keep[: rows // 2, : rr // 2] = 1
        keep[rows // 2:, rr // 2:] = 1
        p.grad.mul_(keep.expand(rows, rr, E).reshape(rows, rr * E))


def adapter_keys(adapter_dir):
    """The tensor names of the adapter file, or None (with a warning) if unreadable."""
    from safetensors import safe_open
    path = os.path.join(adapter_dir, "adapter_model.safetensors")
    try:
        with safe_open(path, framework="pt") as f:
            return set(f.keys())
    except Exception as e:  # noqa: BLE001 - only a diagnostic
        print(f"warning: cannot list {path}: {e}", file=sys.stderr)
        return None


def adapter_tensors(adapter_dir):
    """{name: tensor} of the adapter file; exit 2 if it cannot be read."""
    from safetensors.torch import load_file
    path = os.path.join(adapter_dir, "adapter_model.safetensors")
    try:
        return load_file(path)
    except Exception as e:  # noqa: BLE001 - reported as bad input
        die(path, f"cannot read: {e}")


def check_loaded(adapter_dir, model, params):
    """Every tensor of the adapter file must be a LoRA parameter of the PEFT model
    holding exactly the file's values (after PEFT's v5 conversion, split back as
    ctune_grads does), and PEFT must have made no LoRA parameter the file lacks:
    PeftModel.from_pretrained leaves a module it does not target plain, with no
    error, and then trains fewer modules than ctune. Exits 3 naming the tensors."""
    import torch
    saved = adapter_tensors(adapter_dir)
    loaded = split_fused(model, [(n, p.data) for n, p in params])
    differ = [k for k in saved if k in loaded and not torch.equal(loaded[k], saved[k].float())]
    model.ctune_loaded = judge_loaded(adapter_dir, set(saved), set(loaded), differ)


def judge_loaded(adapter_dir, saved, loaded, differ):
    """check_loaded's verdict on name sets: len(saved), or exit 3 listing the
    tensors PEFT did not load, loaded with other values, or made on its own."""
    missing = sorted(saved - loaded)
    extra = sorted(loaded - saved)
    problems = [(f"{len(missing)} of the adapter's {len(saved)} tensors were not loaded by PEFT", missing),
                (f"{len(differ)} tensors were loaded with other values than the file's", sorted(differ)),
                (f"PEFT made {len(extra)} LoRA parameters that the adapter file lacks", extra)]
    bad = [(what, ks) for what, ks in problems if ks]
    for what, ks in bad:
        print(f"{adapter_dir}: {what}:", file=sys.stderr)
        for k in ks[:20]:
            print(f"  {k}", file=sys.stderr)
        if len(ks) > 20:
            print(f"  ... and {len(ks) - 20} more", file=sys.stderr)
    if bad:
        sys.exit(3)
    return len(saved)


def ce_sum(model, ids, targets, device):
    """Sum of CE over the targets (-100 = none) of one document run alone; None if none."""
    import torch
    import torch.nn.functional as F
    rows = [t for t, y in enumerate(targets) if y != -100]
    if not rows:
        return None
    x = torch.tensor([ids], dtype=torch.long, device=device)
    pos = torch.arange(len(ids), dtype=torch.long, device=device)[None]
    logits = model(input_ids=x, position_ids=pos, use_cache=False).logits[0]
    r = torch.tensor(rows, dtype=torch.long, device=device)
    y = torch.tensor([targets[t] for t in rows], dtype=torch.long, device=device)
    return F.cross_entropy(logits[r].to(torch.promote_types(logits.dtype, torch.float32)), y, reduction="sum")


def grad_norm(params):
    sq = sum(float(p.grad.detach().double().pow(2).sum()) for _, p in params if p.grad is not None)
    return math.sqrt(sq)


# ---------------------------------------------------------------- modes

def docs_grads(model, params, docs, device):
    """Loss and LoRA gradients of DOCS (read_docs) as one step: {"loss": F32 [1],
    saved name: gradient}, and the gradient norm. None if no document has a target."""
    import torch
    total = sum(sum(1 for y in tg if y != -100) for _, tg in docs)
    if total == 0:
        return None, 0.0
    for _, p in params:
        p.grad = None
    loss_sum = 0.0
    for ids, tg in docs:  # per-document backward of ce/total == backward of (sum ce)/total
        ce = ce_sum(model, ids, tg, device)
        if ce is not None:
            (ce / total).backward()
            loss_sum += float(ce.detach().double())
    mask_fused_grads(model, params)
    out = {"loss": torch.tensor([loss_sum / total], dtype=torch.float32)}
    out.update(ctune_grads(model, params))
    return out, grad_norm(params)


def cmd_grads(args):
    from safetensors.torch import save_file
    docs = read_docs(args.docs)
    if not any(y != -100 for _, tg in docs for y in tg):
        die(args.docs, "no targets in any document")
    model, params = load_model(args)
    out, norm = docs_grads(model, params, docs, args.device)
    save_file(out, args.out, metadata={"format": "pt"})
    total = sum(sum(1 for y in tg if y != -100) for _, tg in docs)
    print(f"loss {float(out['loss'][0]):.8f} over {total} targets in {len(docs)} documents; "
          f"{len(out) - 1} gradient tensors (norm {norm:.6g}) -> {args.out}")


def doc_inputs(doc, length):
    """First `length` tokens of a shard document and its targets (next token where masked in)."""
    toks, mask, a, _ = doc
    ids = list(toks[a:a + length])
    tg = [ids[t + 1] if mask[a + t + 1] else -100 for t in range(length - 1)] + [-100]
    return ids, tg


def cmd_train(args):
    import torch
    from transformers import optimization as opt
    docs = load_documents(args.shards)
    trace = read_trace(args.trace, docs)
    metrics = read_metrics(args.metrics)
    n_run = min(len(trace), args.steps, args.run_steps or args.steps)
    if len(trace) < min(args.steps, args.run_steps or args.steps):
        print(f"note: the trace holds {len(trace)} steps; replaying those", file=sys.stderr)
    model, params = load_model(args)
    plist = [p for _, p in params]
    optim = torch.optim.AdamW(plist, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                              weight_decay=args.weight_decay)
    if args.scheduler == "cosine":
        sched = opt.get_cosine_schedule_with_warmup(optim, args.warmup, args.steps)
    elif args.scheduler == "linear":
        sched = opt.get_linear_schedule_with_warmup(optim, args.warmup, args.steps)
    else:
        sched = opt.get_constant_schedule_with_warmup(optim, args.warmup)
    hist = {}  # step -> (ce sum, targets, pre-clip grad norm, lr)
    for step in range(1, n_run + 1):
        inputs = [doc_inputs(docs[d], length) for d, length in trace[step]]
        total = sum(sum(1 for y in tg if y != -100) for _, tg in inputs)
        optim.zero_grad(set_to_none=True)
        s = 0.0
        for ids, tg in inputs:
            ce = ce_sum(model, ids, tg, args.device)
            if ce is not None:
                (ce / total).backward()
                s += float(ce.detach().double())
        for p in plist:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        mask_fused_grads(model, params)
        norm = grad_norm(params)
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(plist, args.max_grad_norm)
        lr = sched.get_last_lr()[0]
        optim.step()
        sched.step()
        hist[step] = (s, total, norm, lr)
        print(f"step {step:5d}  loss {s / max(total, 1):.6f}  grad_norm {norm:.5g}  lr {lr:.6g}  targets {total}",
              flush=True)
    return compare(args, metrics, hist, n_run)


def rel(a, b):
    return abs(a - b) / abs(b) if b != 0 else abs(a - b)


def compare(args, metrics, hist, n_run):
    logged = sorted(metrics)
    rows, prev = [], 0
    for k in logged:
        if k > n_run:
            break
        window = range(prev + 1, k + 1)  # ctune's logged loss covers the steps since the last log
        prev = k
        s, t = sum(hist[j][0] for j in window), sum(hist[j][1] for j in window)
        m = metrics[k]
        hf = s / t if t else float("nan")
        rows.append((k, float(m["loss"]), hf, m.get("grad_norm"), hist[k][2], m.get("lr"), hist[k][3]))
    if not rows:
        die(args.metrics, f"no logged step within the {n_run} replayed steps")
    print(f"\n{'step':>6} {'ctune':>12} {'hf':>12} {'rel diff':>10}   {'gnorm ctune':>11} {'gnorm hf':>11} {'rel':>9}")
    gn_diffs, lr_bad = [], []
    for k, c, h, gc, gh, lc, lh in rows:
        gtxt = ""
        if isinstance(gc, (int, float)):
            gn_diffs.append(rel(gc, gh))
            gtxt = f"   {gc:11.5g} {gh:11.5g} {gn_diffs[-1]:9.2e}"
        print(f"{k:6d} {c:12.6f} {h:12.6f} {rel(c, h):10.3e}{gtxt}")
        if isinstance(lc, (int, float)) and rel(lc, lh) > 1e-5:
            lr_bad.append((k, lc, lh))
    diffs = [rel(c, h) for _, c, h, *_ in rows]
    mx = max(diffs)
    mxg = max(gn_diffs) if gn_diffs else None
    print(f"max rel diff (loss) {mx:.3e} over {len(rows)} steps" +
          (f"; max rel diff (grad norm) {mxg:.3e}" if mxg is not None else ""))
    for k, lc, lh in lr_bad[:3]:
        print(f"warning: step {k}: ctune lr {lc:.6g} but hf lr {lh:.6g} "
              "(check --lr/--scheduler/--warmup/--steps)", file=sys.stderr)
    failed = verdict(args, rows, diffs)
    if args.out:
        res = {"steps": [r[0] for r in rows], "ctune": [r[1] for r in rows], "hf": [r[2] for r in rows],
               "max_rel_diff": mx, "ctune_grad_norm": [r[3] for r in rows], "hf_grad_norm": [r[4] for r in rows],
               "max_rel_diff_grad_norm": mxg,
               "hf_step_loss": [hist[j][0] / max(hist[j][1], 1) for j in range(1, n_run + 1)]}
        res["failed"] = failed
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    return 1 if failed else 0


def verdict(args, rows, diffs):
    """PASS/FAIL against --tol-first and --tol-loss (each optional); returns the
    failed checks. The first logged step compares one forward and backward on the
    same weights and batch, so only rounding separates the two; later steps add up
    bf16 rounding through the optimizer, hence the looser bound over all steps."""
    checks = []
    if args.tol_first is not None:
        k, _, _, gc, gh = rows[0][:5]
        checks.append((f"step {k} loss", diffs[0], args.tol_first))
        if isinstance(gc, (int, float)):  # the first step's own grad norm, not the first one logged
            checks.append((f"step {k} grad norm", rel(gc, gh), args.tol_first))
    if args.tol_loss is not None:
        checks.append((f"loss over {len(rows)} steps", max(diffs, key=lambda d: math.inf if d != d else d),
                       args.tol_loss))
    failed = [f"{what} rel diff {d:.3e} > {tol:g}" for what, d, tol in checks if not d <= tol]  # NaN fails
    if checks:
        print("FAIL parity: " + "; ".join(failed) if failed else
              "PASS parity: " + "; ".join(f"{what} {d:.2e} <= {tol:g}" for what, d, tol in checks))
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="mode", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", required=True, help="HF model folder")
    common.add_argument("--adapter", required=True, help="PEFT adapter folder")
    common.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    common.add_argument("--quantize", choices=["nf4", "fp4", "fp8"], default=None,
                        help="quantize the bf16 --model on load: nf4/fp4 with bitsandbytes (nf4: double quant), "
                             "fp8 as ctune's base_precision: fp8 does (see above)")
    g = sub.add_parser("grads", parents=[common])
    g.add_argument("--docs", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float64"], default="float32",
                   help="float64: fp64 throughout, the model source's fp32 casts too (see above)")
    t = sub.add_parser("train", parents=[common])
    t.add_argument("--shards", nargs="+", required=True)
    t.add_argument("--trace", required=True)
    t.add_argument("--metrics", required=True)
    t.add_argument("--lr", type=float, required=True)
    t.add_argument("--scheduler", choices=["cosine", "linear", "constant"], required=True)
    t.add_argument("--warmup", type=int, required=True)
    t.add_argument("--steps", type=int, required=True, help="total steps of the ctune run (lr schedule)")
    t.add_argument("--run-steps", type=int, default=0, help="replay only the first K steps")
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--beta1", type=float, default=0.9)
    t.add_argument("--beta2", type=float, default=0.999)
    t.add_argument("--eps", type=float, default=1e-8)
    t.add_argument("--max-grad-norm", type=float, default=1.0)
    t.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    t.add_argument("--out", default=None, help="RESULT.json")
    t.add_argument("--tol-first", type=float, default=None,
                   help="fail (exit 1) when the first logged step's loss or grad norm differs by more (relative)")
    t.add_argument("--tol-loss", type=float, default=None,
                   help="fail (exit 1) when any logged step's loss differs by more (relative)")
    q = sub.add_parser("quantize")
    q.add_argument("--model", required=True, help="bf16 HF model folder")
    q.add_argument("--out", required=True, help="folder for the 4-bit checkpoint")
    q.add_argument("--quant-type", choices=["nf4", "fp4"], default="nf4")
    q.add_argument("--double-quant", action=argparse.BooleanOptionalAction, default=True)
    q.add_argument("--device", default=None, help="where bitsandbytes quantizes: cpu or cuda")
    args = ap.parse_args()
    if args.mode == "train" and (args.steps < 1 or args.warmup < 0 or args.run_steps < 0):
        ap.error("--steps must be >= 1, --warmup and --run-steps >= 0")
    import torch
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    return {"grads": cmd_grads, "train": cmd_train, "quantize": cmd_quantize}[args.mode](args) or 0


if __name__ == "__main__":
    sys.exit(main())
