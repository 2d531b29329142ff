"""quant4_fixtures.py — the expected outputs of tests/test_quant4.c, made by the
real bitsandbytes on the CPU (CI has no Python and uses the stored files).

    /work/venv-hf/bin/pip install bitsandbytes==0.50.2   # torch 2.11 CPU, safetensors
    /work/venv-hf/bin/python scripts/quant4_fixtures.py [--dir DIR]

Writes, under --dir (default tests/fixtures/quant4):
  cases.safetensors   for each CASES entry NAME (quant type, blocksize, double
                      quant, input): NAME.packed (U8, bnb's packed codes),
                      NAME.absmax (F32, first-level absmax), NAME.y (F32, bnb's
                      dequantize_4bit) and, with double quant, NAME.q8 (U8),
                      NAME.nested_absmax (F32), NAME.offset (F32 [1]) and
                      NAME.absmax_decoded (F32, bnb's dequantize_blockwise +
                      offset, the absmax dequantize_4bit uses). Inputs: x.small
                      (F32 [7, 150]), x.ties (F32 [197]: a zero block, 1.0 with
                      every code midpoint and its neighbours, a short zero
                      block), x.divide (F32 [105]: values that tell x * (1/absmax)
                      from x / absmax), x.large (BF16 [16741], 262 blocks of
                      64: two nested blocks); the large case stores y as BF16 (bnb's own bf16
                      output) to stay small. x.dynamic (F32 [700], values at
                      the edges of bnb's 8-bit grid) with dynamic.q8 and
                      dynamic.absmax: bnb's quantize_blockwise(x, blocksize=256).
                      Metadata made_by: the versions used.
  linear4bit.safetensors  the state_dicts of two bnb.nn.Linear4bit modules as
                      they save them (HF save_pretrained writes the same keys):
                      model.layers.0.mlp.down_proj (nf4, double quant, bf16,
                      [24, 100]), model.layers.0.self_attn.q_proj (fp4, blocksize
                      128, fp32, [16, 70]) with biases, and a plain BF16
                      model.embed_tokens.weight.
  linear4bit_expected.safetensors  each quantized weight dequantized by bnb
                      to float32, under the weight's name.

The CPU bnb kernels are torch ops (quantize_4bit, dequantize_4bit of an odd last
dimension) and bnb's C++ library (quantize_blockwise, dequantize_4bit): the
ones a checkpoint made on a CPU comes from. torch's absmax.mean() depends on
the CPU's vector width; the fixtures were made on AVX2 (recorded in metadata).
"""
import argparse
import os

import bitsandbytes as bnb
import bitsandbytes.functional as F
import numpy as np
import safetensors
import torch
from safetensors.torch import save_file

# (name, quant_type, blocksize, double_quant, input)
CASES = [
    ("nf4.bs64", "nf4", 64, False, "small"),
    ("nf4.bs64.dq", "nf4", 64, True, "small"),
    ("nf4.bs128", "nf4", 128, False, "small"),
    ("nf4.bs128.dq", "nf4", 128, True, "small"),
    ("fp4.bs64", "fp4", 64, False, "small"),
    ("fp4.bs64.dq", "fp4", 64, True, "small"),
    ("fp4.bs128", "fp4", 128, False, "small"),
    ("fp4.bs128.dq", "fp4", 128, True, "small"),
    ("nf4.ties", "nf4", 64, False, "ties"),
    ("fp4.ties.dq", "fp4", 64, True, "ties"),
    ("nf4.divide", "nf4", 64, False, "divide"),
    ("fp4.divide", "fp4", 64, False, "divide"),
    ("nf4.large.dq", "nf4", 64, True, "large"),
]


def code_bounds(qt):
    code = torch.sort(F.get_4bit_type(qt, device="cpu"))[0]
    return (code[:-1] + code[1:]) / 2


def ties_input():
    """197 values in blocks of 64: zeros; two blocks that start with 1.0 (so
    absmax is 1 and x / absmax is exact) holding every NF4 and FP4 midpoint and
    the floats either side; a short block of zeros (bnb stores its absmax
    clamped to 1e-38)."""
    mids = torch.tensor(sorted(set(code_bounds("nf4").tolist() + code_bounds("fp4").tolist())))
    vals = torch.cat([mids, torch.nextafter(mids, torch.full_like(mids, 2.0)),
                      torch.nextafter(mids, torch.full_like(mids, -2.0))])
    assert vals.numel() <= 126, vals.numel()
    blocks = torch.zeros(2, 64)
    blocks[:, 0] = 1.0
    blocks[:, 1:].reshape(-1)[: vals.numel()] = vals
    return torch.cat([torch.zeros(64), blocks.reshape(-1), torch.zeros(5)])


def straddlers(bounds, scale, count):
    """Up to COUNT floats x near scale * bounds where x * (1/scale) and
    x / scale fall on different sides of a bound: they tell bnb's multiply
    (full blocks) from its divide (the short block)."""
    s = np.float32(scale)
    inv = np.float32(1) / s
    out = []
    for b in np.asarray(bounds, np.float32):
        x = np.float32(b * s)
        for _ in range(64):
            m, d = x * inv, x / s
            if (m <= b) != (d <= b):
                out.append(x)
            x = np.nextafter(x, np.float32(np.inf))
        x = np.float32(b * s)
        for _ in range(64):
            x = np.nextafter(x, np.float32(-np.inf))
            m, d = x * inv, x / s
            if (m <= b) != (d <= b):
                out.append(x)
    out = [v for v in out if abs(v) < scale]
    assert len(out) >= 8, len(out)
    return torch.tensor(out[:count], dtype=torch.float32)


def divide_input():
    """105 values: a block of 64 and a short block of 41, each starting with 3.0
    and holding straddlers of the NF4 and FP4 midpoints, so a full block must
    multiply by 1/absmax and the short one divide, as bnb does."""
    bounds = torch.cat([code_bounds("nf4"), code_bounds("fp4")])
    full = torch.cat([torch.tensor([3.0]), straddlers(bounds, 3.0, 63)])
    tail = torch.cat([torch.tensor([3.0]), straddlers(bounds.flip(0), 3.0, 40)])
    full = torch.cat([full, torch.zeros(64 - full.numel())])
    tail = torch.cat([tail, torch.zeros(41 - tail.numel())])
    return torch.cat([full, tail])


def dynamic_input():
    """700 values for bnb's 8-bit quantize_blockwise (blocks of 256): two
    blocks starting with 1.0 whose values sit at the edges of its 65536-point
    grid where the table's code changes (there the nearest map value and bnb's
    differ); a short block starting with 3.0 of values whose x * (1/3) and
    x / 3 get different codes from the table."""
    dmap = F.create_dynamic_map().numpy()
    grid = (np.arange(65536, dtype=np.float32) / np.float32(65535) * np.float32(2) - np.float32(1))
    near = np.abs(grid[:, None] - dmap[None, :]).argmin(1)  # a tie takes the lower index, as in bnb
    edges = np.nonzero(near[1:] != near[:-1])[0] + 1
    vals = []
    for k in edges:
        b = np.float32((k - 0.5) / 32767.5 - 1)
        vals += [b, np.nextafter(b, np.float32(2)), np.nextafter(b, np.float32(-2))]
    vals = torch.tensor(vals[:510], dtype=torch.float32)
    blocks = torch.zeros(2, 256)
    blocks[:, 0] = 1.0
    blocks[:, 1:].reshape(-1)[: vals.numel()] = vals
    idx = lambda v: int(np.floor(((v + np.float32(1)) * np.float32(0.5)) * np.float32(65535) + np.float32(0.5)))
    three, third = np.float32(3), np.float32(1) / np.float32(3)
    pick = []
    for k in edges:
        for sign in (1, -1):
            x = np.float32(((k - 0.5) / 32767.5 - 1) * 3)
            for _ in range(48):
                if near[idx(x * third)] != near[idx(x / three)] and abs(x) < 3:
                    pick.append(x)
                x = np.nextafter(x, np.float32(sign * 9))
    pick = pick[:187]
    assert len(pick) >= 20, len(pick)
    tail = torch.cat([torch.tensor([3.0]), torch.tensor(pick, dtype=torch.float32)])
    return torch.cat([blocks.reshape(-1), tail, torch.zeros(188 - tail.numel())])


def inputs():
    g = torch.Generator().manual_seed(4)
    small = torch.randn(7, 150, generator=g) * 0.05
    small[1, 10:90] = 0.0  # covers a whole block of 64 (elements 160..223)
    small[3] *= 40.0       # rows of a different scale
    large = (torch.randn(262 * 64 - 27, generator=g) * 0.02).to(torch.bfloat16)
    large[5000:6000] *= 8
    return {"small": small, "ties": ties_input(), "divide": divide_input(), "large": large}


def decoded_absmax(state):
    """The fp32 absmax dequantize_4bit uses (bnb functional.dequantize_4bit)."""
    if state.nested:
        a = F.dequantize_blockwise(state.absmax, state.state2)
        a += state.offset
        return a.float()
    return state.absmax


def case_tensors(name, qt, bs, dq, x):
    packed, state = F.quantize_4bit(x, blocksize=bs, compress_statistics=False, quant_type=qt)
    out = {f"{name}.packed": packed.reshape(-1).contiguous(), f"{name}.absmax": state.absmax.contiguous()}
    if dq:
        packed_dq, state = F.quantize_4bit(x, blocksize=bs, compress_statistics=True, quant_type=qt)
        assert torch.equal(packed_dq, packed)
        out[f"{name}.q8"] = state.absmax.contiguous()
        out[f"{name}.nested_absmax"] = state.state2.absmax.contiguous()
        out[f"{name}.offset"] = state.offset.reshape(1).float()
        out[f"{name}.absmax_decoded"] = decoded_absmax(state).contiguous()
        assert torch.equal(state.state2.code, F.create_dynamic_map())
    y = F.dequantize_4bit(packed, state)  # in x's dtype, as bnb returns it
    out[f"{name}.y"] = y.reshape(-1).contiguous()
    return out


def linear4bit(prefix, n_in, n_out, qt, bs, dq, dtype, g):
    lin = bnb.nn.Linear4bit(n_in, n_out, bias=True, compress_statistics=dq, quant_type=qt,
                            compute_dtype=dtype, quant_storage=torch.uint8)
    with torch.no_grad():
        lin.weight.data = (torch.randn(n_out, n_in, generator=g) * 0.1).to(dtype)
        lin.bias.data = (torch.randn(n_out, generator=g) * 0.1).to(dtype)
    lin.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, blocksize=bs,
                                   compress_statistics=dq, quant_type=qt)
    lin = lin.to("cpu")
    assert lin.weight.bnb_quantized
    sd = {f"{prefix}.{k}": v.contiguous() for k, v in lin.state_dict().items()}
    st = lin.weight.quant_state
    y = torch.ops.bitsandbytes.dequantize_4bit(lin.weight.data, decoded_absmax(st), st.blocksize,
                                               st.quant_type, st.shape, torch.float32)
    return sd, {f"{prefix}.weight": y.contiguous()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="tests/fixtures/quant4")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    torch.set_num_threads(1)
    # one key: safetensors writes metadata in hash order, and the files should
    # be byte-identical from run to run
    meta = {"made_by": f"bitsandbytes {bnb.__version__}, torch {torch.__version__} "
                       f"({torch.backends.cpu.get_cpu_capability()}), safetensors {safetensors.__version__}"}

    xs = inputs()
    tensors = {f"x.{k}": v.reshape(-1).contiguous() for k, v in xs.items()}
    for name, qt, bs, dq, src in CASES:
        tensors.update(case_tensors(name, qt, bs, dq, xs[src]))
    xd = dynamic_input()
    q8, state = F.quantize_blockwise(xd, blocksize=256)
    tensors.update({"x.dynamic": xd, "dynamic.q8": q8, "dynamic.absmax": state.absmax})
    save_file(tensors, os.path.join(args.dir, "cases.safetensors"), metadata=meta)

    g = torch.Generator().manual_seed(5)
    sd, expected = {}, {}
    for spec in [("model.layers.0.mlp.down_proj", 100, 24, "nf4", 64, True, torch.bfloat16),
                 ("model.layers.0.self_attn.q_proj", 70, 16, "fp4", 128, False, torch.float32)]:
        s, e = linear4bit(*spec, g)
        sd.update(s)
        expected.update(e)
    sd["model.embed_tokens.weight"] = (torch.randn(8, 100, generator=g) * 0.1).to(torch.bfloat16)
    save_file(sd, os.path.join(args.dir, "linear4bit.safetensors"), metadata={"format": "pt"})
    save_file(expected, os.path.join(args.dir, "linear4bit_expected.safetensors"), metadata=meta)
    total = sum(os.path.getsize(os.path.join(args.dir, f)) for f in os.listdir(args.dir))
    print(f"wrote {args.dir}: {total} bytes")


if __name__ == "__main__":
    main()
