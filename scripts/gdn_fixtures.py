"""gdn_fixtures.py — the HF reference values of tests/test_gdn_cpu.c: the Gated
DeltaNet ops of Qwen3.5 / Qwen3-Next as transformers computes them, forward and
autograd backward, on random inputs from a fixed seed. CI has no Python and uses
the stored files.

    /work/venv-hf/bin/python scripts/gdn_fixtures.py [--dir DIR]

(any Python with torch and transformers >= 5 with models/qwen3_5). Writes, under
--dir (default tests/fixtures/gdn): conv.bin, gates.bin, delta.bin,
gated_norm.bin, sigmoid_gate.bin. Each file is a list of records
    name: 16 bytes ASCII, NUL padded | count: int32 LE | count float32 LE
and starts with a record "dims" holding the sizes (and documents) the C test
expects; the test refuses a file whose dims differ from its own. The record
names and orders are in the writers below; gradients are of L = sum(dy * y).

Which HF code computes what (transformers.models.qwen3_5.modeling_qwen3_5):
  - conv: causal_conv1d_fn (the torch path: F.conv1d with padding W-1, sliced to
    the sequence, then silu), in float64, once per document: HF's torch path has
    no document boundaries, so packing is done by running each document alone.
  - gates: the two lines of Qwen3_5GatedDeltaNet.forward, verbatim, in float32
    (HF forces .float()).
  - delta rule: torch_chunk_gated_delta_rule with use_qk_l2norm_in_kernel=True,
    once per document, its source run with float64 in place of float32 (the
    algorithm untouched), so the reference is far more exact than the fp32 op
    under test. The script also checks that HF's own float32 chunk and recurrent
    functions agree with it, and prints their errors.
  - gated norm: Qwen3_5RMSNormGated, float32, weight random (not 1) so that w
    is tested.
  - sigmoid gate: Qwen3_5Attention.forward's q_proj split (view (.., nh, 2D),
    chunk) and attn_output * torch.sigmoid(gate), float32.
The script refuses to run when fla or causal_conv1d is importable: HF would then
dispatch to those kernels instead of its torch code.
"""
import argparse
import importlib.util
import inspect
import os
import struct
import sys

import torch
import torch.nn.functional as F

if importlib.util.find_spec("fla") or importlib.util.find_spec("causal_conv1d"):
    sys.exit("gdn_fixtures.py: fla or causal_conv1d is installed; HF would use them, not its torch path")

from transformers.models.qwen3_5 import modeling_qwen3_5 as q35  # noqa: E402

SEED = 1234

# Sizes: keep in step with tests/test_gdn_cpu.c.
CONV_DOCS = [1, 2, 5, 12]           # shorter and longer than W
CONV_C, CONV_W = 8, 4
GATE_T, GATE_HV = 16, 4
DELTA_DOCS = [1, 63, 64, 65, 7]     # around HF's 64-token chunk
DELTA_HK, DELTA_HV, DELTA_DK, DELTA_DV = 2, 4, 8, 6
NORM_T, NORM_NH, NORM_D = 8, 3, 16
NORM_EPS = 1e-6
SG_T, SG_NH, SG_D = 6, 3, 8


def write(path, records):
    with open(path, "wb") as f:
        for name, t in records:
            a = t.detach().to(torch.float32).contiguous().reshape(-1)
            f.write(name.encode().ljust(16, b"\0"))
            f.write(struct.pack("<i", a.numel()))
            f.write(a.numpy().astype("<f4").tobytes())
    print(f"{path}: {os.path.getsize(path)} bytes")


def dims(*v):
    return ("dims", torch.tensor(v, dtype=torch.float64))


def conv(d):
    T, C, W = sum(CONV_DOCS), CONV_C, CONV_W
    x = torch.randn(T, C, dtype=torch.float64, requires_grad=True)
    w = (0.5 * torch.randn(C, W, dtype=torch.float64))
    dy = torch.randn(T, C, dtype=torch.float64)
    ys, s = [], 0
    for n in CONV_DOCS:
        xd = x[s:s + n].t().unsqueeze(0)  # (1, C, n): HF's mixed_qkv.transpose(1, 2)
        ys.append(q35.causal_conv1d_fn(xd, w, None, activation="silu")[0].t())
        s += n
    y = torch.cat(ys)
    (dx,) = torch.autograd.grad((y * dy).sum(), x)
    write(os.path.join(d, "conv.bin"), [dims(T, C, W, len(CONV_DOCS), *CONV_DOCS),
                                        ("x", x), ("w", w), ("y", y), ("dy", dy), ("dx", dx)])


def gates(d):
    T, Hv = GATE_T, GATE_HV
    # a spans softplus's x > 20 branch (a + dt_bias up to ~25) and its far negative side.
    a = torch.cat([4 * torch.randn(T - 2, Hv), torch.full((1, Hv), 22.0), torch.full((1, Hv), -25.0)])
    a.requires_grad_(True)
    b = (3 * torch.randn(T, Hv)).requires_grad_(True)
    A_log = torch.log(torch.empty(Hv).uniform_(0.01, 16))  # HF's init
    dt_bias = torch.randn(Hv)
    beta = b.sigmoid()
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    dg, dbeta = torch.randn(T, Hv), torch.randn(T, Hv)
    da, db = torch.autograd.grad((g * dg).sum() + (beta * dbeta).sum(), (a, b))
    write(os.path.join(d, "gates.bin"), [dims(T, Hv), ("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias),
                                         ("g", g), ("beta", beta), ("dg", dg), ("dbeta", dbeta),
                                         ("da", da), ("db", db)])


def chunk_rule(dtype):
    """HF's torch_chunk_gated_delta_rule, computing in `dtype` instead of float32."""
    if dtype == torch.float32:
        return q35.torch_chunk_gated_delta_rule
    src = inspect.getsource(q35.torch_chunk_gated_delta_rule.__wrapped__
                            if hasattr(q35.torch_chunk_gated_delta_rule, "__wrapped__")
                            else q35.torch_chunk_gated_delta_rule)
    src = "\n".join(l for l in src.splitlines() if not l.startswith("@"))
    assert src.count("torch.float32") >= 1
    src = src.replace("torch.float32", "torch.float64")
    ns = dict(vars(q35))
    exec(src, ns)
    return ns["torch_chunk_gated_delta_rule"]


def delta_run(fn, q, k, v, g, beta, **kw):
    """fn per document (HF's torch paths ignore cu_seqlens), GVA by repeat_interleave as the layer does."""
    r = DELTA_HV // DELTA_HK
    outs, s = [], 0
    for n in DELTA_DOCS:
        sl = slice(s, s + n)
        qd = q[sl].unsqueeze(0).repeat_interleave(r, dim=2)
        kd = k[sl].unsqueeze(0).repeat_interleave(r, dim=2)
        o, _ = fn(qd, kd, v[sl].unsqueeze(0), g=g[sl].unsqueeze(0), beta=beta[sl].unsqueeze(0),
                  use_qk_l2norm_in_kernel=True, **kw)
        outs.append(o[0])
        s += n
    return torch.cat(outs)


def delta(d):
    T, Hk, Hv, Dk, Dv = sum(DELTA_DOCS), DELTA_HK, DELTA_HV, DELTA_DK, DELTA_DV
    f64 = torch.float64
    q = torch.randn(T, Hk, Dk, dtype=f64, requires_grad=True)
    k = torch.randn(T, Hk, Dk, dtype=f64, requires_grad=True)
    v = torch.randn(T, Hv, Dv, dtype=f64, requires_grad=True)
    # Per head decays from ~0.999 (long memory) to ~0.02 per token, through HF's gate formula.
    a = torch.randn(T, Hv, dtype=f64)
    A_log = torch.log(torch.tensor([0.05, 0.3, 1.0, 4.0], dtype=f64))
    dt_bias = torch.tensor([-4.0, -1.0, 0.0, 1.0], dtype=f64)
    g = (-A_log.exp() * F.softplus(a + dt_bias)).detach().requires_grad_(True)
    beta = torch.sigmoid(2 * torch.randn(T, Hv, dtype=f64)).requires_grad_(True)
    dout = torch.randn(T, Hv, Dv, dtype=f64)
    o = delta_run(chunk_rule(f64), q, k, v, g, beta)
    grads = torch.autograd.grad((o * dout).sum(), (q, k, v, g, beta))
    with torch.no_grad():
        ins32 = [t.float() for t in (q, k, v, g, beta)]
        for name, fn in (("chunk fp32", q35.torch_chunk_gated_delta_rule),
                         ("recurrent fp32", q35.torch_recurrent_gated_delta_rule)):
            o32 = delta_run(fn, *ins32).double()
            print(f"delta: HF {name} vs fp64: max |diff| / max |o| = {((o32 - o).abs().max() / o.abs().max()):.3g}")
            assert torch.allclose(o32, o, rtol=1e-4, atol=1e-5 * o.abs().max().item())
    write(os.path.join(d, "delta.bin"),
          [dims(T, Hk, Hv, Dk, Dv, len(DELTA_DOCS), *DELTA_DOCS),
           ("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("o", o), ("dout", dout),
           ("dq", grads[0]), ("dk", grads[1]), ("dv", grads[2]), ("dg", grads[3]), ("dbeta", grads[4])])


def gated_norm(d):
    T, nh, D = NORM_T, NORM_NH, NORM_D
    norm = q35.Qwen3_5RMSNormGated(D, eps=NORM_EPS)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(D))
    norm.weight.requires_grad_(False)
    x = torch.randn(T, nh, D, requires_grad=True)
    z = (2 * torch.randn(T, nh, D)).requires_grad_(True)
    y = norm(x.reshape(-1, D), z.reshape(-1, D)).reshape(T, nh, D)  # as the layer reshapes
    dy = torch.randn(T, nh, D)
    dx, dz = torch.autograd.grad((y * dy).sum(), (x, z))
    write(os.path.join(d, "gated_norm.bin"), [dims(T, nh, D), ("x", x), ("z", z), ("w", norm.weight), ("y", y),
                                              ("dy", dy), ("dx", dx), ("dz", dz)])


def sigmoid_gate(d):
    T, nh, D = SG_T, SG_NH, SG_D
    qproj = (2 * torch.randn(T, nh * 2 * D)).requires_grad_(True)  # q_proj's output, per head [query | gate]
    query, gate = torch.chunk(qproj.view(T, -1, D * 2), 2, dim=-1)
    gate = gate.reshape(T, -1)
    x = torch.randn(T, nh * D, requires_grad=True)  # the attention output, flattened over heads
    y = x * torch.sigmoid(gate)
    dy = torch.randn(T, nh * D)
    dx, dqproj = torch.autograd.grad((y * dy).sum(), (x, qproj))
    # dqproj's query halves are 0 (only the gate halves feed y): dgate as the op lays it out.
    write(os.path.join(d, "sigmoid_gate.bin"), [dims(T, nh, D), ("qproj", qproj), ("x", x), ("y", y), ("dy", dy),
                                                ("dx", dx), ("dqproj", dqproj)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "gdn"))
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    torch.manual_seed(SEED)
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for fn in (conv, gates, delta, gated_norm, sigmoid_gate):
        fn(args.dir)


if __name__ == "__main__":
    main()
