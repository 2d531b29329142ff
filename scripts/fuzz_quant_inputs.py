"""fuzz_quant_inputs.py — the hand-made inputs of fuzz/fuzz_quant.c in
tests/fuzz_regressions/quant/ (replayed by tests/test_fuzz_regressions.c and
copied into the fuzz corpus by fuzz/run.sh). Python's standard library only.

    python3 scripts/fuzz_quant_inputs.py [--dir DIR]

Each file is one .safetensors file:
  nf4_state_claims_65536x65536_over_8_bytes   a quant_state whose shape needs
      2 GiB of packed codes beside a 16-element weight (refused before
      anything is sized from the claim)
  nf4_state_shape_overflows_size_t            shape [2^62, 8]: the element
      count overflows (refused)
  fp8_weights_f32_bf16_scales_and_a_nan_code  an FP8 weight [16, 136] with F32
      scales, one with BF16 scales, and one holding the NaN code 0x7f (refused)
  mxfp4_experts_and_a_quantization_config     MXFP4 experts [2, 3, 64] and, in
      the metadata, the official gpt-oss quantization_config and a config.json
      text, so the mutations start from the config readers' formats
  mxfp4_pattern_of_40_starred_atoms_that_fail  modules_to_not_convert
      [".*" x 40 + "z"] beside an expert tensor: backtracking took exponential
      time on it (mxfp4_converts)
  names_with_a_newline                        a quant_state, an FP8 weight and
      MXFP4 blocks whose names hold "\n": the readers' messages name them,
      and they were two lines (st_open refuses such names now)
  strings_with_a_newline                      a quant_state whose quant_type is
      "fp4\nnf4" and a quantization_config whose quant_method is "mx\nfp4":
      both were quoted raw in two-line messages
"""
import argparse
import json
import os
import random
import struct

NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def safetensors(tensors, metadata=None):
    """tensors: (name, dtype, shape, bytes) in file order."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def nf4_weight(name, shape, numel):
    state = json.dumps({"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": shape}).encode()
    nblocks = (numel + 63) // 64
    return [(name, "U8", [(numel + 1) // 2, 1], bytes(range((numel + 1) // 2))),
            (name + ".absmax", "F32", [nblocks], f32([0.5] * nblocks)),
            (name + ".quant_map", "F32", [16], f32(NF4)),
            (name + ".quant_state.bitsandbytes__nf4", "U8", [len(state)], state)]


def fp8_weight(name, rows, cols, g, scale_dtype, nan=False):
    q = bytearray(g.choice([b for b in range(256) if b & 0x7f != 0x7f]) for _ in range(rows * cols))
    if nan:
        q[rows * cols // 2] = 0x7f
    grid = ((rows + 127) // 128) * ((cols + 127) // 128)
    scales = [g.uniform(1e-4, 1e-2) for _ in range(grid)]
    if scale_dtype == "BF16":
        raw = b"".join(struct.pack("<f", s)[2:] for s in scales)   # the high half of each fp32
    else:
        raw = f32(scales)
    return [(name, "F8_E4M3", [rows, cols], bytes(q)),
            (name + "_scale_inv", scale_dtype, [(rows + 127) // 128, (cols + 127) // 128], raw)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="tests/fuzz_regressions/quant")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    g = random.Random(31)
    w = "model.layers.0.self_attn.q_proj.weight"
    files = {}
    state = nf4_weight(w, [65536, 65536], 16)
    files["nf4_state_claims_65536x65536_over_8_bytes"] = safetensors(state)
    state = nf4_weight(w, [1 << 62, 8], 16)
    files["nf4_state_shape_overflows_size_t"] = safetensors(state)
    files["fp8_weights_f32_bf16_scales_and_a_nan_code"] = safetensors(
        fp8_weight("model.layers.0.mlp.down_proj.weight", 16, 136, g, "F32")
        + fp8_weight("model.layers.0.mlp.up_proj.weight", 16, 136, g, "BF16")
        + fp8_weight("model.layers.0.mlp.gate_proj.weight", 8, 16, g, "F32", nan=True))
    base = "model.layers.0.mlp.experts.gate_up_proj"
    E, rows, K = 2, 3, 64
    qc = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                     "lm_head"], "quant_method": "mxfp4"}
    config = {"model_type": "gpt_oss", "hidden_size": 64, "num_local_experts": 2}
    files["mxfp4_experts_and_a_quantization_config"] = safetensors(
        [(base + "_blocks", "U8", [E, rows, K // 32, 16], bytes(g.randrange(256) for _ in range(E * rows * K // 2))),
         (base + "_scales", "U8", [E, rows, K // 32], bytes(g.randrange(100, 140) for _ in range(E * rows * K // 32)))],
        {"quantization_config": json.dumps(qc), "config": json.dumps(config, indent=2) + "\n"})
    qc = {"modules_to_not_convert": [".*" * 40 + "z"], "quant_method": "mxfp4"}
    files["mxfp4_pattern_of_40_starred_atoms_that_fail"] = safetensors(
        [(base + "_blocks", "U8", [1, 1, 1, 16], bytes(16)), (base + "_scales", "U8", [1, 1, 1], bytes([127]))],
        {"quantization_config": json.dumps(qc)})
    files["names_with_a_newline"] = safetensors(
        [("a\nb.quant_state.bitsandbytes__nf4", "U8", [2], b"{}"), ("a\nb", "F8_E4M3", [1, 2], bytes(2)),
         ("c\nd_blocks", "U8", [1, 1, 1, 16], bytes(16))])
    state = json.dumps({"quant_type": "fp4\nnf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 4]}).encode()
    files["strings_with_a_newline"] = safetensors(
        [(w + ".quant_state.bitsandbytes__fp4", "U8", [len(state)], state)],
        {"quantization_config": json.dumps({"quant_method": "mx\nfp4"})})
    for name, b in files.items():
        with open(os.path.join(args.dir, name + ".safetensors"), "wb") as f:
            f.write(b)


if __name__ == "__main__":
    main()
