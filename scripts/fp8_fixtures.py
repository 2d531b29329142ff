"""fp8_fixtures.py — the expected outputs of tests/test_fp8.c (CI has no
Python and uses the stored files).

    /work/venv-hf/bin/python scripts/fp8_fixtures.py [--dir DIR]   # torch, transformers 5.17

Writes DIR/cases.safetensors (default DIR tests/fixtures/fp8):
  table             F32 [256]      torch's float8_e4m3fn value of every byte
  encode.x          F32 [N]        structured encoder inputs: every code value,
                                   every midpoint between neighbouring values
                                   (ties) and the floats either side of both,
                                   both signs; zeros, fp32 subnormals, values
                                   beyond 448, the infinities and NaNs
  encode.q          U8 [N]         x.clamp(-448, 448).to(torch.float8_e4m3fn)
  random.hash       U32 [25]       the same cast of RANDOM_COUNT fp32 values
                                   drawn from ctune's RNG (random_inputs), as
                                   FNV-1a hashes of each 4096 codes
  weight.q          U8 [136, 200]  transformers' Fp8Quantize of the bf16 weight
  weight.scale_inv  F32 [2, 2]     that weight_inputs makes, zero-padded to
                                   256x256 (5.17 leaves a partial-block weight
                                   unquantized), cropped back
  weight.y_hash     U32 [1]        FNV-1a of the bf16 bytes of transformers'
                                   Fp8Dequantize of those, cropped
  scales.amax       F32 [64]       bf16 block maxima of many magnitudes, and
  scales.scale_inv  F32 [64]       transformers' scale_inv of a (128, 64 * 128)
                                   weight holding one of them per block
                                   (scales_case): 1 / ((1 / amax) * 448) as
                                   torch rounds it, not amax / 448 in many
  onload.q_hash     U32 [1]        FNV-1a of the E4M3 bytes, and the
  onload.scale_inv  F32 [1, 2]     scale_inv, of a (128, 256) weight (block_
                                   values(ONLOAD_SEED)) that from_pretrained
                                   quantized on load (tiny_model)
and DIR/tiny_qwen3.json: a 1-layer Qwen3 (every Linear 128-multiple) loaded
with FineGrainedFP8Config(weight_block_size=(128, 128)) and saved: every
tensor's name, dtype and shape, and config.json's quantization_config text.

transformers will not quantize without a GPU; validate_environment is patched
out, which changes nothing else of the arithmetic (Fp8Quantize runs on the CPU).
What from_pretrained runs on a bf16 weight is Fp8Quantize of the weight after
an unscaled cast to float8_e4m3fn (core_model_loading casts every tensor to
its parameter's dtype, FP8Linear's weight being float8_e4m3fn, before the
quantize op): tiny_model asserts both that and that it differs from
Fp8Quantize of the bf16 weight, so a transformers that fixes it fails here.
"""
import argparse
import json
import os
import tempfile

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, FineGrainedFP8Config, Qwen3Config, Qwen3ForCausalLM
from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

RANDOM_SEED, RANDOM_COUNT, HASH_CHUNK = 8, 100000, 4096
WEIGHT_SEED, WEIGHT_ROWS, WEIGHT_COLS = 27, 136, 200
ONLOAD_SEED = 28
M64 = (1 << 64) - 1


class Rng:
    """ctune's ct_rng: xoshiro256** seeded by splitmix64 (src/common/common.c)."""

    def __init__(self, seed):
        x, self.s = seed, []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & M64
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
            self.s.append(z ^ (z >> 31))

    def u64(self):
        s = self.s
        rotl = lambda v, k: ((v << k) | (v >> (64 - k))) & M64
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result


def fnv1a(data):
    h = 0x811C9DC5
    for b in bytes(data):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def to_e4m3(x):
    """The cast under test: clamp to the E4M3 range, then torch's cast."""
    return torch.from_numpy(x).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def structured_inputs(table):
    mags = np.sort(np.unique(np.abs(table[np.isfinite(table)]))).astype(np.float32)
    assert mags.size == 127 and mags[-1] == 448.0
    mids = ((mags[:-1].astype(np.float64) + mags[1:]) / 2).astype(np.float32)
    assert np.all(mids.astype(np.float64) == (mags[:-1].astype(np.float64) + mags[1:]) / 2), "inexact midpoint"
    inf = np.float32(np.inf)
    pos = np.concatenate([mags, np.nextafter(mags, inf), np.nextafter(mags, -inf)[1:],
                          mids, np.nextafter(mids, inf), np.nextafter(mids, -inf),
                          [1e-45, 1e-40, 1.1754942e-38, 2.0 ** -10, 2.0 ** -11, 3 * 2.0 ** -11,
                           448.0001, 460.0, 464.0, np.nextafter(np.float32(464), inf), 479.99, 480.0, 1e10,
                           np.finfo(np.float32).max, inf]]).astype(np.float32)
    x = np.concatenate([pos, -pos, [np.nan, -np.nan]]).astype(np.float32)
    assert np.signbit(x[-1]) and not np.signbit(x[-2])
    return x


def random_inputs():
    """RANDOM_COUNT fp32 values: a random sign, exponent 2^-16..2^10 (below
    E4M3's subnormals to beyond 448), random mantissa; one in 8 has its low 20
    mantissa bits set to 0x80000, a tie at E4M3's normal precision."""
    rng, bits = Rng(RANDOM_SEED), np.empty(RANDOM_COUNT, dtype=np.uint32)
    for i in range(RANDOM_COUNT):
        u = rng.u64()
        e = 111 + (u >> 32) % 27
        m = u & 0x7FFFFF
        if (u >> 24) & 7 == 0:
            m = (m & ~0xFFFFF) | 0x80000
        bits[i] = ((u >> 63) << 31) | (e << 23) | m
    return bits.view(np.float32)


def block_values(seed, rows, cols, exps):
    """rows x cols bf16 values, row-major, one draw u each: v = ((u >> 39) -
    2^24) * 2^-24 in [-1, 1) (exact in fp32), times 2^exps[block] (a block
    missing from exps is zeros, -0.0 at every third element), rounded to bf16."""
    rng = Rng(seed)
    x = np.empty((rows, cols), dtype=np.float32)
    for r in range(rows):
        for c in range(cols):
            u = rng.u64()
            v = np.float32(((u >> 39) - (1 << 24)) * 2.0 ** -24)
            k = exps.get((r // 128, c // 128))
            x[r, c] = np.float32(-0.0 if (r * cols + c) % 3 == 0 else 0.0) if k is None else v * np.float32(2.0 ** k)
    return torch.from_numpy(x).to(torch.bfloat16)


def weight_inputs():
    """The partial-block weight: 2^-5 in block [0, 0], 2^3 in [0, 1], 2^-100 in
    [1, 1], zeros in [1, 0]."""
    return block_values(WEIGHT_SEED, WEIGHT_ROWS, WEIGHT_COLS, {(0, 0): -5, (0, 1): 3, (1, 1): -100})


class Stub:
    quantization_config = FineGrainedFP8Config(weight_block_size=(128, 128))


def weight_case():
    w = weight_inputs()
    padded = torch.zeros(256, 256, dtype=torch.bfloat16)
    padded[:WEIGHT_ROWS, :WEIGHT_COLS] = w
    out = Fp8Quantize(Stub())._quantize_one("w.weight", padded)
    q, s = out["w.weight"], out["w.weight_scale_inv"]
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and tuple(s.shape) == (2, 2), (q.dtype, s.shape)
    assert s[1, 0].item() == 1.0, "the zero block keeps scale_inv 1"
    y = Fp8Dequantize(Stub())._dequantize_one(q, s, output_dtype=torch.bfloat16)[:WEIGHT_ROWS, :WEIGHT_COLS]
    qc = q.view(torch.uint8)[:WEIGHT_ROWS, :WEIGHT_COLS].contiguous()
    assert (qc[128:, :128] == 0x80).sum() > 0, "the -0.0 of the zero block"
    y_hash = fnv1a(y.contiguous().view(torch.int16).numpy().tobytes())
    return {"weight.q": qc, "weight.scale_inv": s.contiguous(),
            "weight.y_hash": torch.tensor([y_hash], dtype=torch.int64).to(torch.uint32)}


def scales_case(rng):
    n = 64
    amax = torch.from_numpy((rng.uniform(1, 2, n) * 2.0 ** rng.integers(-30, 20, n)).astype(np.float32))
    amax = amax.to(torch.bfloat16).float()
    w = torch.zeros(128, n * 128, dtype=torch.float32)
    for i in range(n):
        w[i % 128, i * 128 + (i * 37) % 128] = amax[i] if i % 2 == 0 else -amax[i]
    out = Fp8Quantize(Stub())._quantize_one("w.weight", w.to(torch.bfloat16))
    inv = out["w.weight_scale_inv"].reshape(n)
    assert (inv != amax / 448.0).sum() >= 10, "too few blocks tell transformers' scale_inv from amax / 448"
    return {"scales.amax": amax, "scales.scale_inv": inv.contiguous()}


def tiny_model(tmp):
    """The tiny Qwen3, its down_proj (128, 256) replaced by block_values(
    ONLOAD_SEED, 2^-5 and 2^-8 blocks), loaded quantized and saved by
    transformers. Returns the JSON fixture and the on-load tensors of
    down_proj. The on-load bytes are checked to be Fp8Quantize's of the weight
    first cast to E4M3 unscaled (the loader casts to the FP8Linear's dtype
    before the quantize op runs), and to differ from Fp8Quantize's of the bf16
    weight itself."""
    FineGrainedFP8HfQuantizer.validate_environment = lambda self, *a, **k: None
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False)
    m = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    w = block_values(ONLOAD_SEED, 128, 256, {(0, 0): -5, (0, 1): -8})
    with torch.no_grad():
        m.model.layers[0].mlp.down_proj.weight.copy_(w)
    src, dst = os.path.join(tmp, "bf16"), os.path.join(tmp, "fp8")
    m.save_pretrained(src)
    q = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16,
                                             quantization_config=FineGrainedFP8Config(weight_block_size=(128, 128)))
    q.save_pretrained(dst)
    name = "model.layers.0.mlp.down_proj.weight"
    precast = Fp8Quantize(Stub())._quantize_one(name, w.to(torch.float8_e4m3fn))
    direct = Fp8Quantize(Stub())._quantize_one(name, w)
    tensors = []
    with safe_open(os.path.join(dst, "model.safetensors"), "pt") as f:
        got_q, got_s = f.get_tensor(name).view(torch.uint8), f.get_tensor(name + "_scale_inv")
        assert torch.equal(got_q, precast[name].view(torch.uint8)) and torch.equal(got_s, precast[name + "_scale_inv"])
        assert not torch.equal(got_q, direct[name].view(torch.uint8)), "transformers no longer pre-casts"
        for k in sorted(f.keys()):
            sl = f.get_slice(k)
            tensors.append([k, sl.get_dtype(), list(sl.get_shape())])
    text = open(os.path.join(dst, "config.json")).read()
    key = '"quantization_config": '
    start = text.index(key) + len(key)
    end = text.index("\n  }", start) + 4
    fixture = {"made_by": f"scripts/fp8_fixtures.py: torch {torch.__version__}, transformers "
                          f"{transformers.__version__}", "tensors": tensors, "quantization_config": text[start:end]}
    return fixture, {"onload.q_hash": torch.tensor([fnv1a(got_q.numpy().tobytes())], dtype=torch.int64).to(torch.uint32),
                     "onload.scale_inv": got_s.contiguous()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="tests/fixtures/fp8")
    args = ap.parse_args()
    table = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    x = structured_inputs(table)
    codes = to_e4m3(random_inputs())
    hashes = [fnv1a(codes[i:i + HASH_CHUNK].tobytes()) for i in range(0, RANDOM_COUNT, HASH_CHUNK)]
    tensors = {"table": torch.from_numpy(table), "encode.x": torch.from_numpy(x),
               "encode.q": torch.from_numpy(to_e4m3(x)),
               "random.hash": torch.tensor(hashes, dtype=torch.int64).to(torch.uint32)}
    tensors.update(weight_case())
    tensors.update(scales_case(np.random.default_rng(27)))
    with tempfile.TemporaryDirectory() as tmp:
        tiny, onload = tiny_model(tmp)
    tensors.update(onload)
    os.makedirs(args.dir, exist_ok=True)
    meta = {"made_by": f"scripts/fp8_fixtures.py: torch {torch.__version__}, transformers {transformers.__version__}"}
    path = os.path.join(args.dir, "cases.safetensors")
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)
    jpath = os.path.join(args.dir, "tiny_qwen3.json")
    with open(jpath, "w") as f:
        f.write(f'{{\n "made_by": {json.dumps(tiny["made_by"])},\n')
        f.write(f' "quantization_config": {json.dumps(tiny["quantization_config"])},\n')
        f.write(' "tensors": [\n' + ",\n".join("  " + json.dumps(t) for t in tiny["tensors"]) + "\n ]\n}\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes), {jpath} ({os.path.getsize(jpath)} bytes)")


if __name__ == "__main__":
    main()
