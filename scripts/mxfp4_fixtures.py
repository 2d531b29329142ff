"""mxfp4_fixtures.py — the expected outputs of tests/test_mxfp4.c (CI has no
Python and uses the stored files).

    /work/venv-hf/bin/python scripts/mxfp4_fixtures.py [--dir DIR]   # torch, transformers 5.17

Writes DIR/cases.safetensors (default DIR tests/fixtures/mxfp4):
  dequant.blocks  U8 [2, 32, 4, 16]  random bytes: every code in both nibbles,
                  -0 (8) and +-6 (7, 15) among them
  dequant.scales  U8 [2, 32, 4]      every scale byte 0..252 once, then 127,
                  127, 252, shuffled
  dequant.y       BF16 [2, 32, 128]  transformers' convert_moe_packed_tensors
                  of the two (bf16 [E, K, rows]), transposed back to ctune's
                  [E, rows, K]
  quant.x         F32 [24, 64]       inputs for the encoder: a typical init,
                  blocks of +0 and of -0, every code midpoint (ties) and its
                  float neighbours at exact and rounded-up scales, subnormals,
                  values near the largest scale (252), and blocks of mixed
                  magnitude
  quant.blocks    U8 [24, 2, 16]     the reference quantizer's codes of quant.x
  quant.scales    U8 [24, 2]         and its scale bytes
Metadata made_by: the versions used, and which quantizer made quant.*.

The reference quantizer is triton_kernels' downcast_to_mxfp_torch (what
transformers' quantize_to_mxfp4 calls): used when importable. It is not on a
CPU-only machine, so this script carries the same rule in numpy (ref_quantize
below) and checks the two agree whenever both exist.
"""
import argparse
import os

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

MIDPOINTS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def ref_quantize(x):
    """x F32 [R, K] -> (blocks U8 [R, K/32, 16], scales U8 [R, K/32]).

    Scale: fp32(max|x| / 6) rounded up to a power of two by carrying into the
    exponent field; that field is the scale byte (0 for a block of zeros, whose
    multiplier is then 0). Codes: the scaled value keeps its sign, an exponent
    clamped to E2M1's range with the mantissa shifted right for the values
    below 1 (E2M1's subnormals), one guard bit below E2M1's mantissa bit, then
    (bits + 1) >> 1: round to nearest, ties away from zero; at most 7 (6.0)."""
    R, K = x.shape
    xb = x.astype(np.float32).reshape(R, K // 32, 32)
    d = (np.abs(xb).max(-1, keepdims=True) / np.float32(6.0)).astype(np.float32)
    ebits = (d.view(np.uint32).astype(np.int64) + 0x7FFFFF) & 0x7F800000
    scale = ebits.astype(np.uint32).view(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(scale == 0, np.float32(0), np.float32(1) / scale).astype(np.float32)
    q = (xb * inv).astype(np.float32).view(np.uint32).astype(np.int64)
    sign, e, m = q >> 31, (q >> 23) & 0xFF, q & 0x7FFFFF
    m = np.where(e < 127, (0x400000 | (m >> 1)) >> np.clip(126 - e, 0, 40), m)
    e2 = np.maximum(e, 126) - 126
    mag = np.minimum((((e2 << 2) | (m >> 21)) + 1) >> 1, 7)
    codes = ((sign << 3) | mag).astype(np.uint8).reshape(R, K // 32, 32)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.astype(np.uint8), (ebits[..., 0] >> 23).astype(np.uint8)


def triton_quantize(x):
    """The reference itself, or None where triton_kernels is not installed."""
    try:
        from triton_kernels.numerics_details.mxfp import downcast_to_mxfp_torch
    except ImportError:
        return None
    w, s = downcast_to_mxfp_torch(torch.from_numpy(x), torch.uint8, axis=1)
    R, K = x.shape
    return w.numpy().reshape(R, K // 32, 16), s.numpy()


def dequant_case(rng):
    E, rows, G = 2, 32, 4
    blocks = rng.integers(0, 256, size=(E, rows, G, 16), dtype=np.uint8)
    blocks[0, 0, 0, :4] = [0x88, 0x77, 0xFF, 0x87]
    scales = np.concatenate([np.arange(253), [127, 127, 252]]).astype(np.uint8)
    rng.shuffle(scales)
    scales = scales.reshape(E, rows, G)
    tb, ts = torch.from_numpy(blocks), torch.from_numpy(scales)
    y = convert_moe_packed_tensors(tb, ts)                   # bf16 [E, K, rows]
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (E, G * 32, rows), y.shape
    assert torch.isfinite(y.float()).all()
    return {"dequant.blocks": tb, "dequant.scales": ts, "dequant.y": y.transpose(1, 2).contiguous()}


def ties_block(k, sign):
    """32 values at scale 2^k with max exactly 6 * 2^k: each midpoint and the
    floats either side, signed."""
    mids = np.array(MIDPOINTS, dtype=np.float32)
    v = np.concatenate([[6.0], mids, np.nextafter(mids, np.float32(9)), np.nextafter(mids, np.float32(-9)),
                        [0.0, 5.5, 6.0, 4.5, 3.0, 0.1, 0.5, 1.0, 1.5, 2.0]]).astype(np.float32)
    assert v.size == 32, v.size
    return (sign * v * np.float32(2.0) ** k).astype(np.float32)


def quant_inputs(rng):
    rows = []
    rows.append(rng.standard_normal(64) * 0.02)                        # a typical init
    rows.append(np.concatenate([np.zeros(32), -np.zeros(32)]))          # +0 and -0 blocks
    rows.append(np.concatenate([ties_block(0, 1), ties_block(-3, -1)]))
    rows.append(np.concatenate([ties_block(-10, 1), ties_block(7, -1)]))
    # max a little above 6 * 2^k: the scale rounds up to 2^(k+1)
    b = ties_block(2, 1)
    b[0] = np.nextafter(np.float32(24.0), np.float32(99))
    rows.append(np.concatenate([b, -b]))
    # subnormal fp32 inputs, and a block whose scale is a subnormal fp32
    rows.append(np.concatenate([rng.standard_normal(32) * 1e-41, rng.standard_normal(32) * 1e-38]))
    # near the largest scale byte: max |x| = 6 * 2^125 exactly, and just below
    top = np.float32(6.0) * np.float32(2.0) ** 125
    b1 = (rng.uniform(-1, 1, 32) * top).astype(np.float32)
    b1[5] = top
    b2 = (rng.uniform(-1, 1, 32) * np.nextafter(top, np.float32(0))).astype(np.float32)
    rows.append(np.concatenate([b1, b2]))
    for i in range(17):                                                 # mixed magnitudes
        mag = 2.0 ** rng.uniform(-30, 30, size=2).repeat(32)
        rows.append(rng.standard_normal(64) * mag)
    x = np.stack(rows).astype(np.float32)
    assert x.shape == (24, 64) and np.isfinite(x).all()
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="tests/fixtures/mxfp4")
    args = ap.parse_args()
    rng = np.random.default_rng(26)
    tensors = dequant_case(rng)
    x = quant_inputs(rng)
    blocks, scales = ref_quantize(x)
    assert scales.max() <= 252 and scales[1, 0] == 0 and scales[1, 1] == 0
    made = "numpy ref_quantize (triton_kernels not installed)"
    theirs = triton_quantize(x)
    if theirs is not None:
        assert np.array_equal(theirs[0], blocks) and np.array_equal(theirs[1], scales), "ref_quantize differs"
        made = "triton_kernels downcast_to_mxfp_torch (ref_quantize agrees)"
    tensors.update({"quant.x": torch.from_numpy(x), "quant.blocks": torch.from_numpy(blocks),
                    "quant.scales": torch.from_numpy(scales)})
    os.makedirs(args.dir, exist_ok=True)
    meta = {"made_by": f"scripts/mxfp4_fixtures.py: torch {torch.__version__}, transformers "
                       f"{transformers.__version__}, quant.* by {made}"}
    path = os.path.join(args.dir, "cases.safetensors")
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)
    print(f"wrote {path} ({os.path.getsize(path)} bytes); quant.* by {made}")


if __name__ == "__main__":
    main()
