#!/usr/bin/env python3
"""dequant_gpu_check.py - the GPU half of "ctune decodes 4-bit weights bit for bit
as bitsandbytes and transformers do" (run on the H200 with bitsandbytes
importable; tests/test_cuda_quant4 is the other half: ctune's CUDA decode equals
bf16(code * scale) computed in fp32, the CPU's value).

For random weights, quantized on the GPU by bitsandbytes' quantize_4bit (NF4 and
FP4, with and without double quantization, blocksizes 64 and 128), checks that
bitsandbytes' own dequantize_4bit to bf16 on the GPU equals bf16(code[q] *
absmax) with absmax decoded in fp32 as bnb's quant_state describes (the 8-bit
absmax times its nested absmax, plus the offset, as separate fp32 operations)
and the product formed in fp32: the value ctune's kernel writes. And that
transformers' MXFP4 decode (convert_moe_packed_tensors) equals bf16(lut * 2^(s-127)).
Prints one line per case and exits 1 on any mismatch.
    python3 scripts/dequant_gpu_check.py
"""
import sys

import torch


def nibbles_high_first(packed, n):
    p = packed.reshape(-1)
    q = torch.stack([p >> 4, p & 0xF], dim=1).reshape(-1)
    return q[:n].long()


def check_bnb():
    import bitsandbytes.functional as F
    bad = 0
    torch.manual_seed(0)
    for qt in ("nf4", "fp4"):
        for dq in (False, True):
            for bs in (64, 128):
                w = (torch.randn(1536, 1024, device="cuda") * 0.05).to(torch.bfloat16)
                packed, st = F.quantize_4bit(w, blocksize=bs, compress_statistics=dq, quant_type=qt)
                got = F.dequantize_4bit(packed, st, quant_type=qt).to(torch.bfloat16)
                if dq:
                    a2 = st.state2
                    absmax = a2.code[st.absmax.long()] * a2.absmax.repeat_interleave(a2.blocksize)[: st.absmax.numel()]
                    absmax = absmax + st.offset
                else:
                    absmax = st.absmax.float()
                q = nibbles_high_first(packed, w.numel())
                code = st.code.float().clone()
                if qt == "fp4":
                    code[8] = -0.0  # bnb's kernels decode code 8 as -0.0 (its code book says +0.0); so does ctune
                want = (code[q] * absmax.float().repeat_interleave(bs)[: w.numel()]).to(torch.bfloat16)
                diff = (got.reshape(-1).view(torch.int16) != want.view(torch.int16)).sum().item()
                bad += diff != 0
                print(f"bnb {qt} double_quant={dq} blocksize={bs}: {diff} of {w.numel()} bf16 values differ")
    return bad


def check_mxfp4():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    torch.manual_seed(1)
    E, rows, K = 4, 96, 256
    blocks = torch.randint(0, 256, (E, rows, K // 32, 16), dtype=torch.uint8, device="cuda")
    scales = torch.randint(0, 253, (E, rows, K // 32), dtype=torch.uint8, device="cuda")
    got = convert_moe_packed_tensors(blocks, scales).transpose(1, 2).contiguous()  # back to [E, rows, K]
    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], device="cuda")
    b = blocks.reshape(E, rows, -1).long()
    q = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(E, rows, K)
    s = torch.pow(2.0, scales.float() - 127).repeat_interleave(32, dim=-1)
    want = (lut[q] * s).to(torch.bfloat16)
    diff = (got.view(torch.int16) != want.view(torch.int16)).sum().item()
    print(f"mxfp4 (transformers convert_moe_packed_tensors): {diff} of {want.numel()} bf16 values differ")
    return diff != 0


if __name__ == "__main__":
    bad = check_bnb() + check_mxfp4()
    print("dequant_gpu_check:", "FAIL" if bad else "all equal")
    sys.exit(1 if bad else 0)
