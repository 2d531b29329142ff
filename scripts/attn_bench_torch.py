#!/usr/bin/env python3
"""attn_bench_torch.py — torch's varlen attention on the shapes of bench/attn_bench.c,
printing the same table, for the same-run comparison BENCHMARKS.md reports (same run, same GPU).

    python3 scripts/attn_bench_torch.py [reps]      (default 20 calls per timed trial)

Which torch path runs is printed in the header:
  - torch.nn.attention.varlen.varlen_attn (FlashAttention-2 kernels inside torch),
    causal through is_causal=True or window_size=(-1, 0), whichever this torch's
    signature has; GQA natively (enable_gqa=True where the signature has it, else
    k/v with 8 heads passed as they are, which the flash kernels accept). If that
    call rejects 8 kv heads, k/v are expanded to 32 heads once, outside the timing
    (named "varlen_attn, kv expanded"; the backward then also sums dk/dv per head).
  - without varlen_attn: scaled_dot_product_attention per document (is_causal,
    enable_gqa), named "sdpa per document".
Shapes, FLOP counts, the mix generator and the timing protocol (median of 5 trials
of `reps` calls after 3 warm-up calls, CUDA events) match attn_bench.c.
"""
import inspect
import math
import sys

import torch

WARMUP, TRIALS = 3, 5


def lcg_uniform(state):
    state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
    return state, ((state >> 11) + 0.5) / 9007199254740992.0


def mix_lengths(T):
    """attn_bench.c's mix_lengths: log-normal (median 600, sigma 1) in [16, 4096], filling T."""
    state, lens, used = 20261129, [], 0
    while used < T:
        state, u1 = lcg_uniform(state)
        state, u2 = lcg_uniform(state)
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)
        n = int(math.floor(600.0 * math.exp(z) + 0.5))
        n = min(max(n, 16), 4096, T - used)
        lens.append(n)
        used += n
    return lens


def shapes():
    out = []
    for D in (64, 128):
        for name, L in (("1k", 1024), ("4k", 4096), ("16k", 16384)):
            out.append((name, 32, 8, D, [L] * (32768 // L)))
    out.append(("mix", 16, 8, 128, mix_lengths(16384)))
    return out


def make_attn():
    """Returns (name, f(q, k, v, cu, max_len) -> out)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    if varlen_attn is None:
        def sdpa_docs(q, k, v, cu, max_len):
            outs = []
            bounds = cu.tolist()
            for a, b in zip(bounds[:-1], bounds[1:]):
                qd, kd, vd = (x[a:b].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
                o = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=True)
                outs.append(o.squeeze(0).transpose(0, 1))
            return torch.cat(outs)
        return "sdpa per document", sdpa_docs
    params = inspect.signature(varlen_attn).parameters
    kw = {}
    if "is_causal" in params:
        kw["is_causal"] = True
    elif "window_size" in params:
        kw["window_size"] = (-1, 0)
    else:
        sys.exit("varlen_attn has neither is_causal nor window_size: cannot ask for causal attention")
    if "enable_gqa" in params:
        kw["enable_gqa"] = True
    causal = ", ".join(f"{k}={v}" for k, v in kw.items())

    def f(q, k, v, cu, max_len):
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)
    return f"torch.nn.attention.varlen.varlen_attn({causal})", f


def time_ms(fn, reps):
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(TRIALS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return sorted(times)[TRIALS // 2]


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    if not torch.cuda.is_available():
        print("attn_bench_torch: skipped: no CUDA GPU")
        return
    name, attn = make_attn()
    gen = torch.Generator(device="cuda").manual_seed(7)
    print(f"# torch {torch.__version__}, {name}, causal, bf16, {reps} calls per trial, median of {TRIALS} trials")
    print("# TFLOP/s: fwd 4 * sum(S^2/2) * nq * D per call, bwd 2.5x that")
    print(f"{'docs':<5} {'D':>4} {'heads':>6} {'T':>6} {'n':>5} {'fwd_ms':>8} {'fwd_TF':>8} {'bwd_ms':>8} {'bwd_TF':>8}")
    for label, nq, nkv, D, lens in shapes():
        T = sum(lens)
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
        max_len = max(lens)
        # q, k, v as column slices of one fused qkv, as in attn_bench.c.
        qkv = torch.rand(T, nq + 2 * nkv, D, device="cuda", generator=gen, dtype=torch.float32) * 2 - 1
        qkv = qkv.to(torch.bfloat16).requires_grad_(True)
        q, k, v = qkv[:, :nq], qkv[:, nq:nq + nkv], qkv[:, nq + nkv:]
        kv_note = ""
        try:
            out = attn(q, k, v, cu, max_len)
        except RuntimeError:
            rep = nq // nkv
            k, v = (x.repeat_interleave(rep, dim=1) for x in (k, v))
            out = attn(q, k, v, cu, max_len)
            kv_note = "  (kv expanded)"
        dout = torch.rand_like(out) * 2 - 1

        def fwd():
            with torch.no_grad():
                attn(q, k, v, cu, max_len)

        def bwd():
            torch.autograd.grad(out, qkv, dout, retain_graph=True)

        tf, tb = time_ms(fwd, reps), time_ms(bwd, reps)
        flops = 2.0 * 2.0 * sum(L * L / 2.0 for L in lens) * nq * D
        print(f"{label:<5} {D:>4} {nq:>3}/{nkv:<2} {T:>6} {len(lens):>5} {tf:>8.3f} {flops / tf * 1e-9:>8.1f} "
              f"{tb:>8.3f} {2.5 * flops / tb * 1e-9:>8.1f}{kv_note}", flush=True)
        del qkv, q, k, v, out, dout


if __name__ == "__main__":
    main()
