/* gdn_pointwise.cu — the element- and row-wise ops of the Gated DeltaNet hybrids
 * (backend.h, "Gated DeltaNet"): the causal conv1d + SiLU and its input
 * gradient, the decay and write gates, the gated RMSNorm of a GDN layer's output
 * and the sigmoid output gate of a gated full-attention layer. bf16 act in and
 * out, fp32 math, g and beta (and their gradients) fp32; the oracle is
 * src/backend/backend_cpu_gdn.c. The delta rule itself is not here.
 *
 * The conv: one thread per (token, channel), so consecutive threads read
 * consecutive channels of a token row (coalesced); a tap reads the row d tokens
 * back, which the previous warps just read (L1/L2). The backward recomputes
 * the W pre-activations it needs (W^2 multiply-adds a thread, W <= 8) instead of
 * storing them. Document starts come from the batch positions: the tap at
 * distance d counts only when d <= pos[t], exactly the CPU's rule.
 *
 * The gated RMSNorm: one warp per (token, head) row of D elements, the sum of
 * squares in fp32 (the CPU sums in double: results agree to fp32 rounding). */
#include "ct_cuda.cuh"

#define ROW_WARPS 8 /* warps per block in the warp-per-row kernels */

__device__ __forceinline__ float sigmoid_dev(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_dev(float x) { return x * sigmoid_dev(x); }
/* d silu(x)/dx = s (1 + x (1 - s)), s = sigmoid(x) */
__device__ __forceinline__ float silu_grad_dev(float x)
{
    float s = sigmoid_dev(x);
    return s * (1.0f + x * (1.0f - s));
}
/* torch's softplus (threshold 20) */
__device__ __forceinline__ float softplus_dev(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float bf(const bf16 *p) { return __bfloat162float(*p); }

__device__ __forceinline__ float warp_sum_dev(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- kernels ----

/* The conv's pre-activation at (t, c): the taps the forward counts. */
__device__ __forceinline__ float conv_pre_dev(const bf16 *x, int ldx, const bf16 *w, const int32_t *pos,
                                              int t, int c, int W)
{
    float s = 0.0f;
    int p = pos[t];
    for (int j = 0; j < W; j++) {
        int d = W - 1 - j;
        if (d <= p) s += bf(w + (size_t)c * W + j) * bf(x + (size_t)(t - d) * ldx + c);
    }
    return s;
}

__global__ void gdn_conv_fwd_kernel(bf16 *y, int ldy, const bf16 *x, int ldx, const bf16 *w, const int32_t *pos,
                                    int T, int C, int W)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    int t = (int)(i / C), c = (int)(i % C);
    y[(size_t)t * ldy + c] = __float2bfloat16_rn(silu_dev(conv_pre_dev(x, ldx, w, pos, t, c, W)));
}

__global__ void gdn_conv_bwd_kernel(bf16 *dx, int lddx, const bf16 *dy, int lddy, const bf16 *x, int ldx,
                                    const bf16 *w, const int32_t *pos, int T, int C, int W)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    int t = (int)(i / C), c = (int)(i % C);
    float s = 0.0f;
    for (int d = 0; d < W && t + d < T; d++) {
        if (d > pos[t + d]) continue;
        float dp = bf(dy + (size_t)(t + d) * lddy + c) * silu_grad_dev(conv_pre_dev(x, ldx, w, pos, t + d, c, W));
        s += bf(w + (size_t)c * W + W - 1 - d) * dp;
    }
    dx[(size_t)t * lddx + c] = __float2bfloat16_rn(s);
}

__global__ void gdn_gates_fwd_kernel(float *g, float *beta, const bf16 *a, int lda, const bf16 *b, int ldb,
                                     const float *A_log, const float *dt_bias, int T, int Hv)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * Hv) return;
    int t = (int)(i / Hv), h = (int)(i % Hv);
    beta[i] = sigmoid_dev(bf(b + (size_t)t * ldb + h));
    g[i] = -expf(A_log[h]) * softplus_dev(bf(a + (size_t)t * lda + h) + dt_bias[h]);
}

__global__ void gdn_gates_bwd_kernel(bf16 *da, int ldda, bf16 *db, int lddb, const float *dg, const float *dbeta,
                                     const bf16 *a, int lda, const bf16 *b, int ldb, const float *A_log,
                                     const float *dt_bias, int T, int Hv)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * Hv) return;
    int t = (int)(i / Hv), h = (int)(i % Hv);
    float xa = bf(a + (size_t)t * lda + h) + dt_bias[h];
    float dsoft = xa > 20.0f ? 1.0f : sigmoid_dev(xa);
    da[(size_t)t * ldda + h] = __float2bfloat16_rn(dg[i] * -expf(A_log[h]) * dsoft);
    float be = sigmoid_dev(bf(b + (size_t)t * ldb + h));
    db[(size_t)t * lddb + h] = __float2bfloat16_rn(dbeta[i] * be * (1.0f - be));
}

/* One warp per (t, h) row of D elements. y may alias x or z: each lane reads
 * exactly the elements it later writes. */
__global__ void gated_rmsnorm_fwd_kernel(bf16 *y, int ldy, const bf16 *x, int ldx, const bf16 *z, int ldz,
                                         const bf16 *w, int T, int nh, int D, float eps)
{
    size_t row = (size_t)blockIdx.x * ROW_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)T * nh) return;
    size_t t = row / nh, h = row % nh;
    const bf16 *xr = x + t * ldx + h * D, *zr = z + t * ldz + h * D;
    bf16 *yr = y + t * ldy + h * D;
    float ss = 0.0f;
    for (int i = lane; i < D; i += 32) {
        float v = bf(xr + i);
        ss += v * v;
    }
    float r = rsqrtf(warp_sum_dev(ss) / D + eps);
    for (int i = lane; i < D; i += 32)
        yr[i] = __float2bfloat16_rn(bf(w + i) * (bf(xr + i) * r) * silu_dev(bf(zr + i)));
}

/* dn = dy w silu(z); dx = r dn - x r^3 / D * sum(dn x); dz = dy w (x r) silu'(z). */
__global__ void gated_rmsnorm_bwd_kernel(bf16 *dx, int lddx, bf16 *dz, int lddz, const bf16 *dy, int lddy,
                                         const bf16 *x, int ldx, const bf16 *z, int ldz, const bf16 *w,
                                         int T, int nh, int D, float eps)
{
    size_t row = (size_t)blockIdx.x * ROW_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)T * nh) return;
    size_t t = row / nh, h = row % nh;
    const bf16 *xr = x + t * ldx + h * D, *zr = z + t * ldz + h * D, *dyr = dy + t * lddy + h * D;
    float ss = 0.0f, dot = 0.0f;
    for (int i = lane; i < D; i += 32) {
        float v = bf(xr + i), dn = bf(dyr + i) * bf(w + i) * silu_dev(bf(zr + i));
        ss += v * v;
        dot += dn * v;
    }
    ss = warp_sum_dev(ss);
    dot = warp_sum_dev(dot);
    float r = rsqrtf(ss / D + eps), k = r * r * r / D * dot;
    for (int i = lane; i < D; i += 32) {
        float v = bf(xr + i), zz = bf(zr + i), dyw = bf(dyr + i) * bf(w + i);
        dx[t * lddx + h * D + i] = __float2bfloat16_rn(r * dyw * silu_dev(zz) - v * k);
        dz[t * lddz + h * D + i] = __float2bfloat16_rn(dyw * v * r * silu_grad_dev(zz));
    }
}

__global__ void sigmoid_gate_fwd_kernel(bf16 *y, int ldy, const bf16 *x, int ldx, const bf16 *gate, int ldg,
                                        int hsg, int T, int nh, int D)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * nh * D) return;
    size_t t = i / ((size_t)nh * D), hd = i % ((size_t)nh * D), h = hd / D, d = hd % D;
    float s = sigmoid_dev(bf(gate + t * ldg + h * hsg + d));
    y[t * ldy + hd] = __float2bfloat16_rn(bf(x + t * ldx + hd) * s);
}

__global__ void sigmoid_gate_bwd_kernel(bf16 *dx, int lddx, bf16 *dgate, int lddg, const bf16 *dy, int lddy,
                                        const bf16 *x, int ldx, const bf16 *gate, int ldg, int hsg, int T, int nh,
                                        int D)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * nh * D) return;
    size_t t = i / ((size_t)nh * D), hd = i % ((size_t)nh * D), h = hd / D, d = hd % D;
    float s = sigmoid_dev(bf(gate + t * ldg + h * hsg + d)), g = bf(dy + t * lddy + hd);
    float xv = bf(x + t * ldx + hd);
    dgate[t * lddg + h * hsg + d] = __float2bfloat16_rn(g * xv * s * (1.0f - s));
    dx[t * lddx + hd] = __float2bfloat16_rn(g * s); /* after dy's read: dx may alias dy */
}

// ---- launchers ----

static void check_conv(const char *op, int W)
{
    CT_ASSERT(W >= 1 && W <= 8, "%s: width %d is not in 1..8", op, W);
}

void cuda_gdn_conv_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const void *w,
                       const int32_t *pos, int T, int C, int W)
{
    check_conv("gdn_conv_fwd", W);
    size_t n = (size_t)T * C;
    if (n == 0) return;
    gdn_conv_fwd_kernel<<<grid_for(n, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)y, ldy, (const bf16 *)x, ldx, (const bf16 *)w, pos, T, C, W);
    LAUNCH_CHECK();
}

void cuda_gdn_conv_bwd(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, const void *x, int ldx,
                       const void *w, const int32_t *pos, int T, int C, int W)
{
    check_conv("gdn_conv_bwd", W);
    size_t n = (size_t)T * C;
    if (n == 0) return;
    gdn_conv_bwd_kernel<<<grid_for(n, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)dx, lddx, (const bf16 *)dy, lddy, (const bf16 *)x, ldx, (const bf16 *)w, pos, T, C, W);
    LAUNCH_CHECK();
}

void cuda_gdn_gates_fwd(ct_backend *be, float *g, float *beta, const void *a, int lda, const void *b, int ldb,
                        const float *A_log, const float *dt_bias, int T, int Hv)
{
    size_t n = (size_t)T * Hv;
    if (n == 0) return;
    gdn_gates_fwd_kernel<<<grid_for(n, 256), 256, 0, ctx_of(be)->stream>>>(
        g, beta, (const bf16 *)a, lda, (const bf16 *)b, ldb, A_log, dt_bias, T, Hv);
    LAUNCH_CHECK();
}

void cuda_gdn_gates_bwd(ct_backend *be, void *da, int ldda, void *db, int lddb, const float *dg, const float *dbeta,
                        const void *a, int lda, const void *b, int ldb, const float *A_log, const float *dt_bias,
                        int T, int Hv)
{
    size_t n = (size_t)T * Hv;
    if (n == 0) return;
    gdn_gates_bwd_kernel<<<grid_for(n, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)da, ldda, (bf16 *)db, lddb, dg, dbeta, (const bf16 *)a, lda, (const bf16 *)b, ldb, A_log,
        dt_bias, T, Hv);
    LAUNCH_CHECK();
}

void cuda_gated_rmsnorm_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const void *z, int ldz,
                            const void *w, int T, int nh, int D, float eps)
{
    size_t rows = (size_t)T * nh;
    if (rows == 0) return;
    gated_rmsnorm_fwd_kernel<<<grid_for(rows, ROW_WARPS), ROW_WARPS * 32, 0, ctx_of(be)->stream>>>(
        (bf16 *)y, ldy, (const bf16 *)x, ldx, (const bf16 *)z, ldz, (const bf16 *)w, T, nh, D, eps);
    LAUNCH_CHECK();
}

void cuda_gated_rmsnorm_bwd(ct_backend *be, void *dx, int lddx, void *dz, int lddz, const void *dy, int lddy,
                            const void *x, int ldx, const void *z, int ldz, const void *w, int T, int nh, int D,
                            float eps)
{
    size_t rows = (size_t)T * nh;
    if (rows == 0) return;
    gated_rmsnorm_bwd_kernel<<<grid_for(rows, ROW_WARPS), ROW_WARPS * 32, 0, ctx_of(be)->stream>>>(
        (bf16 *)dx, lddx, (bf16 *)dz, lddz, (const bf16 *)dy, lddy, (const bf16 *)x, ldx, (const bf16 *)z, ldz,
        (const bf16 *)w, T, nh, D, eps);
    LAUNCH_CHECK();
}

void cuda_sigmoid_gate_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const void *gate, int ldg,
                           int hsg, int T, int nh, int D)
{
    size_t n = (size_t)T * nh * D;
    if (n == 0) return;
    sigmoid_gate_fwd_kernel<<<grid_for(n, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)y, ldy, (const bf16 *)x, ldx, (const bf16 *)gate, ldg, hsg, T, nh, D);
    LAUNCH_CHECK();
}

void cuda_sigmoid_gate_bwd(ct_backend *be, void *dx, int lddx, void *dgate, int lddg, const void *dy, int lddy,
                           const void *x, int ldx, const void *gate, int ldg, int hsg, int T, int nh, int D)
{
    size_t n = (size_t)T * nh * D;
    if (n == 0) return;
    sigmoid_gate_bwd_kernel<<<grid_for(n, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)dx, lddx, (bf16 *)dgate, lddg, (const bf16 *)dy, lddy, (const bf16 *)x, ldx, (const bf16 *)gate,
        ldg, hsg, T, nh, D);
    LAUNCH_CHECK();
}

void cuda_fill_gdn_pointwise_ops(ct_backend *be)
{
    be->gdn_conv_fwd = cuda_gdn_conv_fwd;
    be->gdn_conv_bwd = cuda_gdn_conv_bwd;
    be->gdn_gates_fwd = cuda_gdn_gates_fwd;
    be->gdn_gates_bwd = cuda_gdn_gates_bwd;
    be->gated_rmsnorm_fwd = cuda_gated_rmsnorm_fwd;
    be->gated_rmsnorm_bwd = cuda_gated_rmsnorm_bwd;
    be->sigmoid_gate_fwd = cuda_sigmoid_gate_fwd;
    be->sigmoid_gate_bwd = cuda_sigmoid_gate_bwd;
}
