/* moe_shared_gate.cu — a shared expert's output scaled by a scalar gate per
 * token (qwen3_5_moe, qwen3_next; backend.h: moe_shared_gate_fwd / _bwd):
 *   forward   y[t, 0:H] += a_t s[t, 0:H],   a_t = sigmoid(g[t])
 *   backward  ds[t, 0:H] = a_t dy[t, 0:H] ; dg[t] = a_t (1 - a_t) (dy[t] . s[t])
 * bf16 act in and out, fp32 math, each output rounded once; the oracle is
 * src/backend/backend_cpu_moe.c.
 *
 * Layouts: y, s, dy, ds (T, H) row-major, each with its own row stride; g and
 * dg (T) with strides ldg and lddg (the graph's gate is a (T, 1) GEMM output:
 * stride 1), read and written one element per token.
 *
 * One warp per token row with 16-byte accesses (8 bf16 per lane, coalesced
 * along the row), as the other row ops of moe_rows.cu: H and the row strides
 * must be multiples of 8 and the pointers 16-byte aligned (the launchers assert
 * it; cuda_check_model refuses other hidden sizes at load). The backward reads
 * dy and s once for both outputs. Its dot product is each lane's chunks in
 * order, then a fixed xor-shuffle tree: no atomics, so dg is bit-reproducible. */
#include "ct_cuda.cuh"

#define GATE_WARPS 8 /* warps (token rows) per block */

// ---- kernels ----

static __device__ __forceinline__ float gate_sigmoid(const bf16 *g, size_t at)
{
    return 1.0f / (1.0f + expf(-__bfloat162float(g[at])));
}

/* Each lane reads and rewrites only its own chunks of y. */
static __global__ void moe_shared_gate_fwd_kernel(bf16 *y, int ldy, const bf16 *s, int lds, const bf16 *g, int ldg,
                                                  int T, int H)
{
    const size_t t = (size_t)blockIdx.x * GATE_WARPS + threadIdx.x / 32;
    if (t >= (size_t)T) return;
    const int lane = threadIdx.x % 32;
    const float a = gate_sigmoid(g, t * ldg);
    bf16 *yr = y + t * ldy;
    const bf16 *sr = s + t * lds;
    for (int i = lane * 8; i < H; i += 256) {
        float yf[8], sf[8];
        load8(yf, yr + i);
        load8(sf, sr + i);
#pragma unroll
        for (int j = 0; j < 8; j++) yf[j] += a * sf[j];
        store8(yr + i, yf);
    }
}

/* ds may alias dy: each lane reads a chunk of dy before it writes that chunk of ds. */
static __global__ void moe_shared_gate_bwd_kernel(bf16 *ds, int ldds, bf16 *dg, int lddg, const bf16 *dy, int lddy,
                                                  const bf16 *s, int lds, const bf16 *g, int ldg, int T, int H)
{
    const size_t t = (size_t)blockIdx.x * GATE_WARPS + threadIdx.x / 32;
    if (t >= (size_t)T) return;
    const int lane = threadIdx.x % 32;
    const float a = gate_sigmoid(g, t * ldg);
    const bf16 *dyr = dy + t * lddy, *sr = s + t * lds;
    bf16 *dsr = ds + t * ldds;
    float dot = 0.0f;
    for (int i = lane * 8; i < H; i += 256) {
        float df[8], sf[8];
        load8(df, dyr + i);
        load8(sf, sr + i);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            dot += df[j] * sf[j];
            df[j] *= a;
        }
        store8(dsr + i, df);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (lane == 0) dg[t * lddg] = __float2bfloat16_rn(a * (1.0f - a) * dot);
}

// ---- launchers ----

static void cuda_moe_shared_gate_fwd(ct_backend *be, void *y, int ldy, const void *s, int lds, const void *g, int ldg,
                                     int T, int H)
{
    check_vec8("moe_shared_gate_fwd", y, ldy, H);
    check_vec8("moe_shared_gate_fwd", s, lds, H);
    CT_ASSERT(T >= 0 && ldg >= 1, "moe_shared_gate_fwd: T %d must be >= 0 and the gate stride %d >= 1", T, ldg);
    if (T == 0) return;
    moe_shared_gate_fwd_kernel<<<grid_for((size_t)T, GATE_WARPS), GATE_WARPS * 32, 0, ctx_of(be)->stream>>>(
        (bf16 *)y, ldy, (const bf16 *)s, lds, (const bf16 *)g, ldg, T, H);
    LAUNCH_CHECK();
}

static void cuda_moe_shared_gate_bwd(ct_backend *be, void *ds, int ldds, void *dg, int lddg, const void *dy, int lddy,
                                     const void *s, int lds, const void *g, int ldg, int T, int H)
{
    check_vec8("moe_shared_gate_bwd", ds, ldds, H);
    check_vec8("moe_shared_gate_bwd", dy, lddy, H);
    check_vec8("moe_shared_gate_bwd", s, lds, H);
    CT_ASSERT(T >= 0 && ldg >= 1 && lddg >= 1,
              "moe_shared_gate_bwd: T %d must be >= 0 and the gate strides %d, %d >= 1", T, ldg, lddg);
    if (T == 0) return;
    moe_shared_gate_bwd_kernel<<<grid_for((size_t)T, GATE_WARPS), GATE_WARPS * 32, 0, ctx_of(be)->stream>>>(
        (bf16 *)ds, ldds, (bf16 *)dg, lddg, (const bf16 *)dy, lddy, (const bf16 *)s, lds, (const bf16 *)g, ldg, T,
        H);
    LAUNCH_CHECK();
}

void cuda_fill_moe_shared_gate_ops(ct_backend *be)
{
    be->moe_shared_gate_fwd = cuda_moe_shared_gate_fwd;
    be->moe_shared_gate_bwd = cuda_moe_shared_gate_bwd;
}
