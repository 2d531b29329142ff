#!/usr/bin/env python3
"""check_bnb_folder.py - transformers + bitsandbytes judge a ctune 4-bit folder.

    python3 scripts/check_bnb_folder.py DIR BF16DIR

DIR is what `ctune quantize --model BF16DIR` (or `ctune init --quantize`)
wrote; BF16DIR the bf16 folder it came from. On the CPU, with bitsandbytes'
CPU kernels and compute dtype float32, it checks:
  (a) DIR loads with AutoModelForCausalLM with no tensor missing, unexpected
      or mismatched, and its bnb Linear4bit modules are exactly those HF makes
      when it quantizes BF16DIR on load (BitsAndBytesConfig);
  (b) each Linear4bit's packed codes, absmax (with double quant: the 8-bit
      absmax, nested absmax and offset) equal, bit for bit, what
      bitsandbytes.functional.quantize_4bit gives for the bf16 weight of
      BF16DIR, and its dequantized weight equals bnb's;
  (c) logits of a few token sequences equal those of BF16DIR quantized on
      load (blocksize 64 only: BitsAndBytesConfig has no blocksize), and
      every tensor HF then saves equals DIR's byte for byte (quant_state JSON
      included).
torch runs on one thread: with more, its fp32 mean of more than 32768 absmax
values (the double-quantization offset) is summed in pieces and may round
differently in the last bit. Prints one line per check and PASS (exit 0);
FAIL lines and exit 1; bad input exit 2. Needs torch, transformers, bitsandbytes and safetensors (no
network).
"""
import glob
import json
import os
import sys
import tempfile


def die(msg):
    print(f"check_bnb_folder: {msg}", file=sys.stderr)
    sys.exit(2)


def tensors(folder):
    from safetensors import safe_open
    out = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        with safe_open(f, "pt") as s:
            for k in s.keys():
                out[k] = s.get_tensor(k)
    return out


def load(path, qconfig=None):
    """The model at path in bf16 as HF loads it, and what its loading info lists as missing or unexpected."""
    import torch
    from transformers import AutoModelForCausalLM
    kw = {"quantization_config": qconfig} if qconfig is not None else {}
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cpu",
                                                       attn_implementation="eager", output_loading_info=True, **kw)
    bad = {k: info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)}
    return model.eval(), bad


def linear4bit(model):
    import bitsandbytes as bnb
    return {name: m for name, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}


def to_fp32(model):
    """Every bf16 parameter to fp32 and each Linear4bit to fp32 compute (its weight dequantized to fp32)."""
    import torch
    for p in model.parameters():
        if p.dtype == torch.bfloat16:
            p.data = p.data.float()
    for b in model.buffers():
        if b.dtype == torch.bfloat16:
            b.data = b.data.float()
    for m in linear4bit(model).values():
        m.compute_dtype = torch.float32
        m.weight.quant_state.dtype = torch.float32


def logits(model, vocab):
    import torch
    seqs = [[(7 * i + 3) % vocab for i in range(12)], [(31 * i + 11) % vocab for i in range(40)]]
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([s])).logits.float().reshape(-1) for s in seqs])


def same_bytes(a, b):
    import torch
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


def main():
    if len(sys.argv) != 3:
        die("usage: check_bnb_folder.py DIR BF16DIR")
    qdir, bdir = sys.argv[1], sys.argv[2]
    for d in (qdir, bdir):
        if not os.path.isfile(os.path.join(d, "config.json")):
            die(f"{d}: no config.json")
    qc = json.load(open(os.path.join(qdir, "config.json"))).get("quantization_config")
    if not qc or qc.get("quant_method") != "bitsandbytes" or not qc.get("load_in_4bit"):
        die(f"{qdir}: config.json has no bitsandbytes 4-bit quantization_config")
    import torch
    import bitsandbytes.functional as F
    from transformers import BitsAndBytesConfig
    # torch splits absmax.mean() (double quantization's offset) over threads
    # past 32768 blocks, which moves its last bit; ctune sums as one thread does
    torch.set_num_threads(1)
    fails = []

    def check(ok, line):
        print(("ok   " if ok else "FAIL ") + line)
        if not ok:
            fails.append(line)

    model, bad = load(qdir)
    check(not bad, f"(a) {qdir} loads cleanly{'' if not bad else ': ' + str(bad)}")
    mods = linear4bit(model)
    bcfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=qc["bnb_4bit_quant_type"],
                              bnb_4bit_use_double_quant=qc["bnb_4bit_use_double_quant"],
                              bnb_4bit_compute_dtype=torch.bfloat16)
    ref, bad = load(bdir, bcfg)
    ref_mods = linear4bit(ref)
    check(not bad and set(mods) == set(ref_mods),
          f"(a) {len(mods)} Linear4bit modules, the same as HF quantizing on load ({len(ref_mods)})"
          + (f": only ctune {sorted(set(mods) - set(ref_mods))[:3]}, only HF {sorted(set(ref_mods) - set(mods))[:3]}"
             if set(mods) != set(ref_mods) else ""))

    bf16, qt = tensors(bdir), tensors(qdir)
    states = sorted(k for k in qt if ".quant_state.bitsandbytes__" in k)
    wrong, blocksizes = [], set()
    for skey in states:
        key = skey[:skey.index(".quant_state.")]
        if key not in bf16:
            wrong.append(f"{key} is not in {bdir}")
            continue
        parts = {k[len(key) + 1:]: v for k, v in qt.items() if k.startswith(key + ".")}
        qs = F.QuantState.from_dict(parts, device=torch.device("cpu"))
        blocksizes.add(qs.blocksize)
        packed, state = F.quantize_4bit(bf16[key].to(torch.bfloat16), blocksize=qs.blocksize,
                                        compress_statistics=qs.nested, quant_type=qs.quant_type)
        ok = same_bytes(qt[key].reshape(-1), packed.reshape(-1))
        if qs.nested:
            ok = ok and same_bytes(qs.absmax, state.absmax) and same_bytes(qs.state2.absmax, state.state2.absmax)
            ok = ok and float(qs.offset) == float(state.offset)
        else:
            ok = ok and same_bytes(qs.absmax, state.absmax)
        ok = ok and torch.equal(F.dequantize_4bit(qt[key], qs).float(), F.dequantize_4bit(packed, state).float())
        if not ok:
            wrong.append(key)
    check(not wrong and len(states) == len(mods),
          f"(b) {len(states)} weights: codes, absmax and nested stats equal bnb's quantize_4bit" + (f": {wrong[:3]}" if wrong else ""))
    kept = [k for k in qt if not k.startswith(tuple(s[:s.index(".quant_state.")] for s in states)) and k in bf16]
    wrong = [k for k in kept if not torch.equal(qt[k], bf16[k].to(torch.bfloat16))]
    check(not wrong and kept, f"(b) the {len(kept)} tensors kept in bf16 equal BF16DIR's" + (f": {wrong[:3]}" if wrong else ""))

    if blocksizes - {64}:
        print(f"skip (c): blocksize {sorted(blocksizes)} (HF quantizes on load with 64 only)")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            ref.save_pretrained(tmp)
            saved = tensors(tmp)
        diff = sorted(k for k in set(saved) | set(qt) if k not in saved or k not in qt or not same_bytes(saved[k], qt[k]))
        check(not diff, f"(c) {len(qt)} tensors equal HF's save_pretrained byte for byte" + (f": {diff[:3]}" if diff else ""))
        to_fp32(model)
        to_fp32(ref)
        vocab = model.config.get_text_config().vocab_size
        a, b = logits(model, vocab), logits(ref, vocab)
        check(torch.equal(a, b) and bool(torch.isfinite(a).all()),
              f"(c) fp32 logits equal HF quantizing on load (max |diff| {(a - b).abs().max().item():.3g})")
    print("FAIL" if fails else "PASS")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
