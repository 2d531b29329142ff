/* moe_rows.cu — the mixture-of-experts ops on whole rows in expert order: token
 * rows gathered into that order and scattered (weighted, summed) back out of it,
 * the scatter's backward, the routing weights' gradient from an expert's input
 * gradient, gpt_oss's clamped SwiGLU and the expert activation's backward with
 * that gradient fused in. Where the rows go (routing, the permutation) is
 * moe_route.cu's. Contracts: backend.h, "mixture of experts"; the oracle is
 * backend_cpu_moe.c.
 *
 * Layouts: x, y, dy (T,H) bf16 with a row stride; xe, ye, dye (n = T*K, H) bf16 in
 * expert order; gu, dgu (n,2I) as [gate | up] halves for SwiGLU and interleaved
 * (gate 2i, up 2i + 1) for the clamped SwiGLU, h, dh (n,I); w and dw
 * (T*K) fp32 by slot s = t*K + k; row_slot and slot_row (n) int32, moe_permute's.
 *
 * Gather, scatter and the scatter backward move whole rows with 16-byte
 * accesses (8 bf16 per lane, coalesced along the row), so H and the strides must
 * be multiples of 8 and the pointers 16-byte aligned: the launchers assert it, as
 * the dense memory-bound ops do (cuda_check_model refuses other hidden sizes at load).
 * Scatter sums a token's K rows in fp32, k ascending, and rounds once; the
 * scatter backward writes dye and the dot product dw in one pass per slot.
 *
 * Every kernel is one warp per row (or token) or 8 outputs per thread: no launch
 * waits for the host or depends on E. */
#include "ct_cuda.cuh"

#define MOE_WARPS 8 /* warps per block in the warp-per-row kernels */
#define FULL_MASK 0xffffffffu

// ---- kernels ----

static __device__ __forceinline__ float moe_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

/* One warp per expert-ordered row: xe[r] = x[row_slot[r] / K]. */
static __global__ void moe_gather_kernel(bf16 *__restrict__ xe, const bf16 *__restrict__ x, int ldx,
                                         const int32_t *__restrict__ row_slot, int n, int K, int H)
{
    size_t r = (size_t)blockIdx.x * MOE_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= (size_t)n) return;
    const bf16 *src = x + (size_t)(row_slot[r] / K) * ldx;
    bf16 *dst = xe + r * H;
#pragma unroll 4
    for (int i = lane * 8; i < H; i += 256) *(uint4 *)(dst + i) = *(const uint4 *)(src + i);
}

/* One warp per token: y[t] = res[t] + sum over k ascending of w[s] *
 * ye[slot_row[s]], s = t*K + k, in fp32, rounded once (res may be y itself or NULL:
 * neither is __restrict__). */
static __global__ void moe_scatter_kernel(bf16 *y, int ldy, const bf16 *__restrict__ ye,
                                          const int32_t *__restrict__ slot_row, const float *__restrict__ w,
                                          int T, int K, int H, const bf16 *res, int ldres)
{
    size_t t = (size_t)blockIdx.x * MOE_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (t >= (size_t)T) return;
    const int32_t *rows = slot_row + t * K;
    const float *wt = w ? w + t * K : NULL;
    bf16 *yr = y + t * ldy;
    const bf16 *rr = res ? res + t * ldres : NULL;
    for (int i = lane * 8; i < H; i += 256) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll 4
        for (int k = 0; k < K; k++) {
            float v[8], wk = wt ? wt[k] : 1.0f;
            load8(v, ye + (size_t)rows[k] * H + i);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] += wk * v[j];
        }
        if (rr) {
            float o[8];
            load8(o, rr + i);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] = o[j] + acc[j];
        }
        store8(yr + i, acc);
    }
}

/* One warp per slot s (t = s / K, r = slot_row[s]): dye[r] = w[s] * dy[t] and
 * dw[s] = dy[t] . ye[r]. */
static __global__ void moe_scatter_bwd_kernel(bf16 *__restrict__ dye, float *__restrict__ dw,
                                              const bf16 *__restrict__ dy, int lddy, const bf16 *__restrict__ ye,
                                              const bf16 *__restrict__ bias, const int32_t *__restrict__ idx,
                                              const int32_t *__restrict__ slot_row, const float *__restrict__ w,
                                              int n, int K, int H)
{
    size_t s = (size_t)blockIdx.x * MOE_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (s >= (size_t)n) return;
    size_t r = (size_t)slot_row[s];
    /* what dw dots dy with: the expert's output row, or (ye NULL) its bias row, or nothing */
    const bf16 *d = dy + (s / K) * lddy, *v = ye ? ye + r * H : bias ? bias + (size_t)idx[s] * H : NULL;
    bf16 *o = dye + r * H;
    float ws = w ? w[s] : 1.0f, dot = 0.0f;
#pragma unroll 4 /* several chunks' loads in flight (the pointers are __restrict__) */
    for (int i = lane * 8; i < H; i += 256) {
        float a[8], b[8];
        load8(a, d + i);
        if (v) load8(b, v + i);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (v) dot += a[j] * b[j];
            a[j] *= ws;
        }
        store8(o + i, a);
    }
    dot = moe_warp_sum(dot);
    if (lane == 0) dw[s] = dot;
}

/* One warp per row: dw[row_slot[r]] += (dh[r] . h[r]) / w (backend.h). */
static __global__ void moe_weight_grad_kernel(float *__restrict__ dw, const bf16 *__restrict__ dh,
                                              const bf16 *__restrict__ h, const float *__restrict__ w,
                                              const int32_t *__restrict__ row_slot, int n, int I)
{
    size_t r = (size_t)blockIdx.x * MOE_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= (size_t)n) return;
    const int s = row_slot[r];
    const float ws = w[s];
    if (ws == 0.0f) return;
    const bf16 *a = dh + r * I, *b = h + r * I;
    float dot = 0.0f;
    for (int i = lane * 8; i < I; i += 256) {
        float x[8], y[8];
        load8(x, a + i);
        load8(y, b + i);
#pragma unroll
        for (int j = 0; j < 8; j++) dot += x[j] * y[j];
    }
    dot = moe_warp_sum(dot);
    if (lane == 0) dw[s] += dot / ws;
}

static __device__ __forceinline__ float clamped_swiglu(float graw, float uraw, float alpha, float limit)
{
    float g = fminf(graw, limit), u = fminf(fmaxf(uraw, -limit), limit);
    return (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
}

/* 8 outputs per thread: h[r, i..i+8) from the 16 interleaved values gu[r, 2i..2i+16). */
static __global__ void moe_clamped_swiglu_fwd_kernel(bf16 *__restrict__ h, const bf16 *__restrict__ gu, int n,
                                                     int I, float alpha, float limit)
{
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (size_t)n * I) return;
    size_t r = idx / I, i = idx % I;
    const bf16 *src = gu + r * 2 * I + 2 * i;
    float a[8], b[8], o[8];
    load8(a, src);
    load8(b, src + 8);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        o[j] = clamped_swiglu(a[2 * j], a[2 * j + 1], alpha, limit);
        o[4 + j] = clamped_swiglu(b[2 * j], b[2 * j + 1], alpha, limit);
    }
    store8(h + idx, o);
}

/* With sg = sigmoid(alpha g): d(g sg)/dg = sg + alpha g sg (1 - sg). A clamp
 * blocks the gradient only strictly past its limit, as torch.clamp does. */
static __device__ __forceinline__ void clamped_swiglu_grad(float *dg, float *du, float d, float graw, float uraw,
                                                           float alpha, float limit)
{
    float g = fminf(graw, limit), u = fminf(fmaxf(uraw, -limit), limit);
    float sg = 1.0f / (1.0f + expf(-alpha * g));
    *dg = graw <= limit ? d * (u + 1.0f) * (sg + alpha * g * sg * (1.0f - sg)) : 0.0f;
    *du = uraw >= -limit && uraw <= limit ? d * g * sg : 0.0f;
}

static __global__ void moe_clamped_swiglu_bwd_kernel(bf16 *__restrict__ dgu, const bf16 *__restrict__ dh,
                                                     const bf16 *__restrict__ gu, int n, int I, float alpha,
                                                     float limit)
{
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (size_t)n * I) return;
    size_t r = idx / I, i = idx % I;
    const bf16 *src = gu + r * 2 * I + 2 * i;
    bf16 *dst = dgu + r * 2 * I + 2 * i;
    float a[8], b[8], d[8], da[8], db[8];
    load8(a, src);
    load8(b, src + 8);
    load8(d, dh + idx);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        clamped_swiglu_grad(&da[2 * j], &da[2 * j + 1], d[j], a[2 * j], a[2 * j + 1], alpha, limit);
        clamped_swiglu_grad(&db[2 * j], &db[2 * j + 1], d[4 + j], b[2 * j], b[2 * j + 1], alpha, limit);
    }
    store8(dst, da);
    store8(dst + 8, db);
}

/* One warp per row: dgu as swiglu_bwd_kernel (elementwise.cu) or the clamped
 * kernel above compute it, and dw[row_slot[r]] += (dh . h) / w with h recomputed
 * in fp32 from the same gu values (the forward's formulas). */
template <bool CLAMPED>
static __global__ void moe_act_bwd_kernel(bf16 *__restrict__ dgu, float *__restrict__ dw, const bf16 *__restrict__ dh,
                                          const bf16 *__restrict__ gu, const float *__restrict__ w,
                                          const int32_t *__restrict__ row_slot, int n, int I, float alpha,
                                          float limit)
{
    const size_t r = (size_t)blockIdx.x * MOE_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= (size_t)n) return;
    const bf16 *src = gu + r * 2 * I, *dr = dh + r * I;
    bf16 *dst = dgu + r * 2 * I;
    float dot = 0.0f;
    for (int i = lane * 8; i < I; i += 256) {
        float d[8];
        load8(d, dr + i);
        if (!CLAMPED) { /* gate at [0, I), up at [I, 2I) */
            float g[8], u[8], dg[8], du[8];
            load8(g, src + i);
            load8(u, src + I + i);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float sig = 1.0f / (1.0f + expf(-g[j]));
                dg[j] = d[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
                du[j] = d[j] * g[j] * sig;
                dot += d[j] * (g[j] / (1.0f + expf(-g[j])) * u[j]);
            }
            store8(dst + i, dg);
            store8(dst + I + i, du);
        } else { /* interleaved: gate 2i, up 2i + 1 */
            float a[8], b[8], da[8], db[8];
            load8(a, src + 2 * i);
            load8(b, src + 2 * i + 8);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                clamped_swiglu_grad(&da[2 * j], &da[2 * j + 1], d[j], a[2 * j], a[2 * j + 1], alpha, limit);
                clamped_swiglu_grad(&db[2 * j], &db[2 * j + 1], d[4 + j], b[2 * j], b[2 * j + 1], alpha, limit);
                dot += d[j] * clamped_swiglu(a[2 * j], a[2 * j + 1], alpha, limit) +
                       d[4 + j] * clamped_swiglu(b[2 * j], b[2 * j + 1], alpha, limit);
            }
            store8(dst + 2 * i, da);
            store8(dst + 2 * i + 8, db);
        }
    }
    dot = moe_warp_sum(dot);
    const int s = row_slot[r];
    if (lane == 0 && w[s] != 0.0f) dw[s] += dot / w[s];
}

// ---- launchers ----

static void cuda_moe_gather(ct_backend *be, void *xe, const void *x, int ldx, const int32_t *row_slot,
                            int T, int K, int H)
{
    check_vec8("moe_gather", xe, H, H);
    check_vec8("moe_gather", x, ldx, H);
    size_t n = (size_t)T * K;
    if (n == 0) return;
    moe_gather_kernel<<<grid_for(n, MOE_WARPS), MOE_WARPS * 32, 0, ctx_of(be)->stream>>>(
        (bf16 *)xe, (const bf16 *)x, ldx, row_slot, (int)n, K, H);
    LAUNCH_CHECK();
}

static void cuda_moe_scatter(ct_backend *be, void *y, int ldy, const void *ye, const int32_t *slot_row,
                             const float *w, int T, int K, int H, const void *res, int ldres)
{
    check_vec8("moe_scatter", y, ldy, H);
    check_vec8("moe_scatter", ye, H, H);
    if (res) check_vec8("moe_scatter", res, ldres, H);
    if (T <= 0) return;
    moe_scatter_kernel<<<grid_for(T, MOE_WARPS), MOE_WARPS * 32, 0, ctx_of(be)->stream>>>(
        (bf16 *)y, ldy, (const bf16 *)ye, slot_row, w, T, K, H, (const bf16 *)res, ldres);
    LAUNCH_CHECK();
}

/* row_slot is not needed: dye[slot_row[s]] = w[s] dy[s/K] covers every row once. */
static void cuda_moe_scatter_bwd(ct_backend *be, void *dye, float *dw, const void *dy, int lddy,
                                 const void *ye, const void *bias, const int32_t *idx, const int32_t *row_slot,
                                 const int32_t *slot_row, const float *w, int T, int K, int H)
{
    (void)row_slot;
    check_vec8("moe_scatter_bwd", dye, H, H);
    check_vec8("moe_scatter_bwd", dy, lddy, H);
    if (ye) check_vec8("moe_scatter_bwd", ye, H, H);
    else if (bias) check_vec8("moe_scatter_bwd", bias, H, H);
    size_t n = (size_t)T * K;
    if (n == 0) return;
    moe_scatter_bwd_kernel<<<grid_for(n, MOE_WARPS), MOE_WARPS * 32, 0, ctx_of(be)->stream>>>(
        (bf16 *)dye, dw, (const bf16 *)dy, lddy, (const bf16 *)ye, (const bf16 *)bias, idx, slot_row, w, (int)n, K,
        H);
    LAUNCH_CHECK();
}

static void cuda_moe_weight_grad(ct_backend *be, float *dw, const void *dh, const void *h, const float *w,
                                 const int32_t *row_slot, int n, int I)
{
    check_vec8("moe_weight_grad", dh, I, I);
    check_vec8("moe_weight_grad", h, I, I);
    if (n <= 0) return;
    moe_weight_grad_kernel<<<grid_for((size_t)n, MOE_WARPS), MOE_WARPS * 32, 0, ctx_of(be)->stream>>>(
        dw, (const bf16 *)dh, (const bf16 *)h, w, row_slot, n, I);
    LAUNCH_CHECK();
}

static void cuda_moe_clamped_swiglu_fwd(ct_backend *be, void *h, const void *gu, int n, int I,
                                        float alpha, float limit)
{
    check_vec8("moe_clamped_swiglu_fwd", h, I, I);
    check_vec8("moe_clamped_swiglu_fwd", gu, 2 * I, 2 * I);
    size_t n8 = (size_t)n * I / 8;
    if (n8 == 0) return;
    moe_clamped_swiglu_fwd_kernel<<<grid_for(n8, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)h, (const bf16 *)gu, n, I, alpha, limit);
    LAUNCH_CHECK();
}

static void cuda_moe_clamped_swiglu_bwd(ct_backend *be, void *dgu, const void *dh, const void *gu, int n,
                                        int I, float alpha, float limit)
{
    check_vec8("moe_clamped_swiglu_bwd", dgu, 2 * I, 2 * I);
    check_vec8("moe_clamped_swiglu_bwd", dh, I, I);
    check_vec8("moe_clamped_swiglu_bwd", gu, 2 * I, 2 * I);
    size_t n8 = (size_t)n * I / 8;
    if (n8 == 0) return;
    moe_clamped_swiglu_bwd_kernel<<<grid_for(n8, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)dgu, (const bf16 *)dh, (const bf16 *)gu, n, I, alpha, limit);
    LAUNCH_CHECK();
}

static void cuda_moe_act_bwd(ct_backend *be, void *dgu, float *dw, const void *dh, const void *gu, const float *w,
                             const int32_t *row_slot, int n, int I, int clamped, float alpha, float limit)
{
    check_vec8("moe_act_bwd", dgu, 2 * I, 2 * I);
    check_vec8("moe_act_bwd", dh, I, I);
    check_vec8("moe_act_bwd", gu, 2 * I, 2 * I);
    if (n <= 0) return;
    const dim3 grid(grid_for((size_t)n, MOE_WARPS)), block(MOE_WARPS * 32);
    if (clamped)
        moe_act_bwd_kernel<true><<<grid, block, 0, ctx_of(be)->stream>>>((bf16 *)dgu, dw, (const bf16 *)dh,
                                                                          (const bf16 *)gu, w, row_slot, n, I, alpha,
                                                                          limit);
    else
        moe_act_bwd_kernel<false><<<grid, block, 0, ctx_of(be)->stream>>>((bf16 *)dgu, dw, (const bf16 *)dh,
                                                                           (const bf16 *)gu, w, row_slot, n, I,
                                                                           alpha, limit);
    LAUNCH_CHECK();
}

void cuda_fill_moe_rows_ops(ct_backend *be)
{
    be->moe_gather = cuda_moe_gather;
    be->moe_scatter = cuda_moe_scatter;
    be->moe_scatter_bwd = cuda_moe_scatter_bwd;
    be->moe_weight_grad = cuda_moe_weight_grad;
    be->moe_act_bwd = cuda_moe_act_bwd;
    be->moe_clamped_swiglu_fwd = cuda_moe_clamped_swiglu_fwd;
    be->moe_clamped_swiglu_bwd = cuda_moe_clamped_swiglu_bwd;
}
