#!/usr/bin/env python3
"""fla_delta_bench.py: flash-linear-attention's chunked gated delta rule at the
shapes of bench/gdn_bench.c, to set ctune's kernels beside it in one device call.

    PYTHONPATH=/tmp/fla-site python3 scripts/fla_delta_bench.py [reps]

Shapes: the Gated DeltaNet layers of Qwen3.5-27B (16 key / 48 value heads) and
Qwen3.5-35B-A3B (16 / 32), head dims 128, 16384 tokens as documents of 4096 or
16384 tokens (cu_seqlens). The inputs match gdn_bench's: q, k, v bf16 with q and
k L2-normed inside the kernel (as ctune's gdn_delta_fwd normalizes them), g in
[-1, 0) fp32, beta in (0.02, 0.98). A call is `chunk_gated_delta_rule` (forward),
then, where this fla and Triton allow it, the backward of its output. Time: host
clock around `reps` queued calls and a synchronize, the median of 5 trials after
3 warm-up calls (Triton's autotuning happens in those). Prints gdn_bench's
columns; a backward that fails prints why, in one line.
"""
import sys
import time

import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule

SHAPES = [("27b", 16, 48, 128, 16384, 4096), ("27b", 16, 48, 128, 16384, 16384),
          ("35b-a3b", 16, 32, 128, 16384, 4096), ("35b-a3b", 16, 32, 128, 16384, 16384)]


def timed(fn, reps):
    trials = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        trials.append((time.perf_counter() - t) / reps * 1e3)
    return sorted(trials)[2]


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    dev = "cuda"
    print(f"fla {getattr(sys.modules.get('fla'), '__version__', '?')}, torch {torch.__version__}")
    print("shape      Hk/Hv    D      T    doc    fwd ms    bwd ms")
    for name, hk, hv, d, T, doc in SHAPES:
        gen = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(1, T, hk, d, device=dev, dtype=torch.bfloat16, generator=gen)
        k = torch.randn(1, T, hk, d, device=dev, dtype=torch.bfloat16, generator=gen)
        v = torch.randn(1, T, hv, d, device=dev, dtype=torch.bfloat16, generator=gen)
        g = -torch.rand(1, T, hv, device=dev, dtype=torch.float32, generator=gen)
        beta = (0.02 + 0.96 * torch.rand(1, T, hv, device=dev, generator=gen)).to(torch.bfloat16)
        cu = torch.arange(0, T + 1, doc, device=dev, dtype=torch.long)

        def fwd():
            return chunk_gated_delta_rule(q, k, v, g, beta, scale=d ** -0.5, cu_seqlens=cu,
                                          use_qk_l2norm_in_kernel=True, output_final_state=False)[0]

        for _ in range(3):
            fwd()
        f_ms = timed(fwd, reps)
        b_ms = "-"
        try:
            qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
            gg, bg = g.detach().requires_grad_(True), beta.detach().requires_grad_(True)
            do = torch.randn_like(v)

            def fwd_bwd():
                o = chunk_gated_delta_rule(qg, kg, vg, gg, bg, scale=d ** -0.5, cu_seqlens=cu,
                                           use_qk_l2norm_in_kernel=True, output_final_state=False)[0]
                o.backward(do)

            for _ in range(3):
                fwd_bwd()
            b_ms = f"{timed(fwd_bwd, reps) - f_ms:9.3f}"
        except Exception as e:  # fla refuses or fails the backward on some Triton versions
            b_ms = "failed: " + str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        print(f"{name:<9} {hk:3d}/{hv:<4d} {d:4d} {T:6d} {doc:6d} {f_ms:9.3f} {b_ms}", flush=True)


if __name__ == "__main__":
    main()
