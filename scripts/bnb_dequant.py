#!/usr/bin/env python3
"""bnb_dequant.py - a bitsandbytes 4-bit checkpoint as a plain fp32 model folder,
decoded by hand from its safetensors (no bitsandbytes), to cross-check the 4-bit
parity fixtures:

    python3 scripts/bnb_dequant.py Q_DIR OUT_DIR

Each Linear4bit weight (a tensor NAME with NAME.quant_state.bitsandbytes__nf4 or
__fp4, QUANT.md 1.4) becomes the F32 tensor quant_map[q] * absmax[block], q
the nibbles (the even element in the high one) and, with double quant, absmax
= nested_quant_map[u8] * nested_absmax[block / 256] + nested_offset, in fp32
as bitsandbytes computes it; every other tensor is cast to F32. config.json
loses its quantization_config. Then hf_parity.py grads on OUT_DIR must give
what it gives on Q_DIR (docs/testing-qlora.md), and test_hf_parity on a case
folder holding OUT_DIR as model/ checks ctune on the same weights.
Needs torch and safetensors; exit 2 on a file it cannot read.
"""
import json
import os
import sys


def die(path, msg):
    print(f"{path}: {msg}", file=sys.stderr)
    sys.exit(2)


def dequantize(t, name, path):
    import torch
    blob = [k for k in t if k.startswith(name + ".quant_state.bitsandbytes__")]
    try:
        qs = json.loads(bytes(t[blob[0]].tolist()).decode("utf-8"))
        shape, bs = [int(d) for d in qs["shape"]], int(qs["blocksize"])
        qmap = t[name + ".quant_map"].float()
    except (KeyError, ValueError, TypeError) as e:
        die(path, f"{name}: bad quant state ({e})")
    n = 1
    for d in shape:
        n *= d
    codes = t[name].reshape(-1).to(torch.uint8)
    if codes.numel() != (n + 1) // 2 or qmap.numel() != 16:
        die(path, f"{name}: {codes.numel()} bytes / {qmap.numel()} codes for shape {shape}")
    q = torch.stack([codes >> 4, codes & 15], 1).reshape(-1)[:n].long()
    nblocks = (n + bs - 1) // bs
    if name + ".nested_absmax" in t:
        q8 = t[name + ".absmax"].reshape(-1).long()
        nested = t[name + ".nested_absmax"].float().repeat_interleave(256)[:nblocks]
        absmax = t[name + ".nested_quant_map"].float()[q8] * nested + float(qs["nested_offset"])
    else:
        absmax = t[name + ".absmax"].float().reshape(-1)
    if absmax.numel() != nblocks:
        die(path, f"{name}: {absmax.numel()} absmax values for {nblocks} blocks")
    return (qmap[q] * absmax.repeat_interleave(bs)[:n]).reshape(shape).contiguous()


def main():
    if len(sys.argv) != 3:
        print("usage: python3 scripts/bnb_dequant.py Q_DIR OUT_DIR", file=sys.stderr)
        return 2
    src, dst = sys.argv[1:]
    from safetensors.torch import load_file, save_file
    path = os.path.join(src, "model.safetensors")
    try:
        t = load_file(path)
    except Exception as e:  # noqa: BLE001 - reported as bad input
        die(path, f"cannot read: {e}")
    quantized = {k[: k.index(".quant_state.")] for k in t if ".quant_state.bitsandbytes__" in k}
    if not quantized:
        die(path, "no Linear4bit weight (no *.quant_state.bitsandbytes__nf4/fp4 tensor)")
    out = {}
    for k, v in t.items():
        if k in quantized:
            out[k] = dequantize(t, k, path)
        elif not any(k.startswith(w + ".") for w in quantized):
            out[k] = v.float()
    cfg_path = os.path.join(src, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        die(cfg_path, f"cannot read: {e}")
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float32"
    cfg.pop("dtype", None)
    os.makedirs(dst, exist_ok=True)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"{src} -> {dst}: {len(quantized)} Linear4bit weights decoded to F32, {len(out)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
