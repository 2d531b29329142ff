/* linear_lora.cu — the frozen linear layers and their LoRA adapters (PEFT semantics).
 *
 * linear:   y (T,out) (=|+=) x (T,in) @ W^T + bias      one cuBLASLt call, bias in the epilogue
 * LoRA fwd: u = drop(x) @ A^T (T,R) ; y += scale * u @ B^T
 * LoRA bwd: g = dy @ B (T,R) ; dB += scale dy^T u ; dA += scale g^T drop(x) ;
 *           dx += scale * drop'(g @ A)
 * A (R,in) and B (out,R) are fp32 masters; each call first rounds them to bf16
 * copies in scratch (R*(in+out) elements: negligible) so every product is a
 * bf16 tensor-core GEMM with fp32 accumulation. u and g are kept in bf16 (T,R)
 * scratch for the same reason; dA and dB accumulate in fp32 (beta = 1).
 *
 * Dropout (p > 0) materialises drop(x) as a (T,in) bf16 scratch: cuBLAS cannot
 * mask its operand, and dropout is off by default (lora_dropout: 0.0), so the
 * common path pays nothing. The mask is ct_hash_uniform(seed, t*in + i) >= p,
 * the same bits as the CPU backend. drop' in backward reuses that scratch for
 * scale * g @ A, then one kernel masks it into dx.
 * Later: a fused skinny GEMM that applies the mask while loading x would remove
 * the (T,in) scratch and one pass over x.
 *
 * Modules that share x (q, k, v; gate, up) run as one LoRA of rank n R without
 * dropout (lora_fwd_cols, lora_bwd_cols): A stacked (n R, in) and B block-diagonal
 * over the columns they span, so x is read, and y or dx read-modified-written,
 * once for all of them; the zero blocks add exact zeros. Each module's dB is
 * still its own GEMM over its own columns of dy; dA is one GEMM into fp32
 * scratch, added to each module's dA. */
#include "ct_cuda.cuh"

// ---- kernels ----

__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
}

/* xd (T,in) = x * mask / (1-p), 8 elements per thread (in % 8 == 0). */
__global__ void dropout_kernel(bf16 *xd, const bf16 *x, int ldx, int T, int in, float p,
                               float inv_keep, uint64_t seed)
{
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (size_t)T * in) return;
    size_t t = idx / in, i = idx % in;
    float f[8];
    load8(f, x + t * ldx + i);
#pragma unroll
    for (int j = 0; j < 8; j++)
        f[j] = ct_hash_uniform_dev(seed, idx + j) >= p ? f[j] * inv_keep : 0.0f;
    store8(xd + idx, f);
}

/* dx (T,in) += gA * mask / (1-p); gA is (T,in) dense. */
__global__ void dropout_add_kernel(bf16 *dx, int lddx, const bf16 *gA, int T, int in, float p,
                                   float inv_keep, uint64_t seed)
{
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (size_t)T * in) return;
    size_t t = idx / in, i = idx % in;
    float g[8], d[8];
    load8(g, gA + idx);
    load8(d, dx + t * lddx + i);
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (ct_hash_uniform_dev(seed, idx + j) >= p) d[j] += g[j] * inv_keep;
    store8(dx + t * lddx + i, d);
}

/* dst[i] += src[i] (fp32). */
__global__ void f32_add_kernel(float *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

// ---- launchers ----

void cuda_linear_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const void *W,
                     const void *bias, int T, int in, int out, int accumulate)
{
    gemm(ctx_of(be), y, CUDA_R_16BF, ldy, x, ldx, false, W, in, true,
         T, out, in, 1.0f, accumulate ? 1.0f : 0.0f, (const bf16 *)bias);
}

void cuda_linear_fwd_residual(ct_backend *be, void *y, int ldy, const void *res, const void *x, int ldx,
                              const void *W, const void *bias, int T, int in, int out)
{
    CT_ASSERT(res != y, "linear_fwd_residual: res must not alias y");
    gemm_from(ctx_of(be), y, res, CUDA_R_16BF, ldy, x, ldx, false, W, in, true, T, out, in, 1.0f, 1.0f,
              (const bf16 *)bias);
}

void cuda_linear_bwd_input(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                           const void *W, int T, int in, int out, int accumulate)
{
    gemm(ctx_of(be), dx, CUDA_R_16BF, lddx, dy, lddy, false, W, in, false,
         T, in, out, 1.0f, accumulate ? 1.0f : 0.0f, NULL);
}

/* The scratch one LoRA call needs: bf16 A, B, u, g, and drop(x) when p > 0. */
struct lora_scratch {
    bf16 *A, *B, *u, *g, *xd;
};

static lora_scratch lora_prepare(cuda_ctx *c, const float *A, const float *B, int T, int in,
                                 int out, int R, float p)
{
    size_t nA = (size_t)R * in, nB = (size_t)out * R, nTR = (size_t)T * R;
    size_t nxd = p > 0.0f ? (size_t)T * in : 0;
    size_t bytes = scratch_round(nA * 2) + scratch_round(nB * 2) + 2 * scratch_round(nTR * 2) +
                   scratch_round(nxd * 2);
    scratch_carver sc = {(char *)cuda_scratch(c, bytes), 0};
    lora_scratch s;
    s.A = (bf16 *)scratch_take(&sc, nA * 2);
    s.B = (bf16 *)scratch_take(&sc, nB * 2);
    s.u = (bf16 *)scratch_take(&sc, nTR * 2);
    s.g = (bf16 *)scratch_take(&sc, nTR * 2);
    s.xd = nxd ? (bf16 *)scratch_take(&sc, nxd * 2) : NULL;
    f32_to_bf16_kernel<<<grid_for(nA, 256), 256, 0, c->stream>>>(s.A, A, nA);
    LAUNCH_CHECK();
    f32_to_bf16_kernel<<<grid_for(nB, 256), 256, 0, c->stream>>>(s.B, B, nB);
    LAUNCH_CHECK();
    return s;
}

/* drop(x) into s->xd when p > 0; returns the operand to use and its stride. */
static const bf16 *lora_input(cuda_ctx *c, const lora_scratch *s, const bf16 *x, int ldx, int *ld,
                              int T, int in, float p, uint64_t seed)
{
    *ld = ldx;
    if (p <= 0.0f) return x;
    CT_ASSERT(in % 8 == 0 && ldx % 8 == 0 && aligned16(x),
              "lora dropout: in=%d and ldx=%d must be multiples of 8, x 16-byte aligned", in, ldx);
    size_t n8 = (size_t)T * in / 8;
    dropout_kernel<<<grid_for(n8, 256), 256, 0, c->stream>>>(s->xd, x, ldx, T, in, p,
                                                             1.0f / (1.0f - p), seed);
    LAUNCH_CHECK();
    *ld = in;
    return s->xd;
}

void cuda_lora_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const float *A,
                   const float *B, int T, int in, int out, int R, float scale, float dropout_p,
                   uint64_t dropout_seed, void *u_keep, int ldu)
{
    cuda_ctx *c = ctx_of(be);
    if (T == 0) return;
    lora_scratch s = lora_prepare(c, A, B, T, in, out, R, dropout_p);
    int ldxd;
    const bf16 *xd = lora_input(c, &s, (const bf16 *)x, ldx, &ldxd, T, in, dropout_p, dropout_seed);
    bf16 *u = u_keep ? (bf16 *)u_keep : s.u;
    int ld = u_keep ? ldu : R;
    gemm(c, u, CUDA_R_16BF, ld, xd, ldxd, false, s.A, in, true, T, R, in, 1.0f, 0.0f, NULL);
    gemm(c, y, CUDA_R_16BF, ldy, u, ld, false, s.B, R, true, T, out, R, scale, 1.0f, NULL);
}

void cuda_lora_bwd(ct_backend *be, void *dx, int lddx, float *dA, float *dB, const void *dy,
                   int lddy, const void *x, int ldx, const float *A, const float *B, int T, int in,
                   int out, int R, float scale, float dropout_p, uint64_t dropout_seed, const void *u_kept,
                   int ldu)
{
    cuda_ctx *c = ctx_of(be);
    if (T == 0) return;
    lora_scratch s = lora_prepare(c, A, B, T, in, out, R, dropout_p);
    int ldxd;
    const bf16 *xd = lora_input(c, &s, (const bf16 *)x, ldx, &ldxd, T, in, dropout_p, dropout_seed);
    const bf16 *u = u_kept ? (const bf16 *)u_kept : s.u;
    int ld = u_kept ? ldu : R;
    if (!u_kept) gemm(c, s.u, CUDA_R_16BF, R, xd, ldxd, false, s.A, in, true, T, R, in, 1.0f, 0.0f, NULL);
    gemm(c, s.g, CUDA_R_16BF, R, dy, lddy, false, s.B, R, false, T, R, out, 1.0f, 0.0f, NULL);
    gemm(c, dB, CUDA_R_32F, R, dy, lddy, true, u, ld, false, out, R, T, scale, 1.0f, NULL);
    gemm(c, dA, CUDA_R_32F, in, s.g, R, true, xd, ldxd, false, R, in, T, scale, 1.0f, NULL);
    if (!dx) return;
    if (dropout_p <= 0.0f) {
        gemm(c, dx, CUDA_R_16BF, lddx, s.g, R, false, s.A, in, false, T, in, R, scale, 1.0f, NULL);
        return;
    }
    CT_ASSERT(lddx % 8 == 0 && aligned16(dx), "lora dropout: lddx=%d must be a multiple of 8", lddx);
    /* xd is no longer needed: it now holds scale * g @ A before masking. */
    gemm(c, s.xd, CUDA_R_16BF, in, s.g, R, false, s.A, in, false, T, in, R, scale, 0.0f, NULL);
    size_t n8 = (size_t)T * in / 8;
    dropout_add_kernel<<<grid_for(n8, 256), 256, 0, c->stream>>>((bf16 *)dx, lddx, s.xd, T, in,
                                                                 dropout_p, 1.0f / (1.0f - dropout_p),
                                                                 dropout_seed);
    LAUNCH_CHECK();
}

/* The modules of one lora_fwd_cols / lora_bwd_cols call as one LoRA: the columns
 * they span from the first one's col0, and the stacked bf16 operands. */
struct stacked_lora {
    int col0, span, RP;
    bf16 *A, *Bt, *u, *g; /* A (RP,in), Bt (RP,span), u and g (T,RP) */
    float *dA;            /* (RP,in) fp32, backward only */
};

static stacked_lora lora_stack_prepare(cuda_ctx *c, const ct_lora_cols *lora, int n, int T, int in, int R,
                                     bool backward)
{
    CT_ASSERT(n >= 1 && n <= CT_LORA_COLS_MAX, "lora_cols: %d modules", n);
    stacked_lora st;
    st.col0 = lora[0].col0;
    st.span = lora[n - 1].col0 + lora[n - 1].cols - st.col0;
    st.RP = (n * R + 7) / 8 * 8; /* cuBLAS: 16-byte aligned rows of u and g */
    ct_lora_cols rel[CT_LORA_COLS_MAX];
    for (int q = 0; q < n; q++) {
        CT_ASSERT(q == 0 || lora[q].col0 >= lora[q - 1].col0 + lora[q - 1].cols,
                  "lora_cols: module %d's columns overlap or precede module %d's", q, q - 1);
        rel[q] = lora[q];
        rel[q].col0 -= st.col0;
    }
    size_t nA = (size_t)st.RP * in, nB = (size_t)st.RP * st.span, nTR = (size_t)T * st.RP;
    size_t bytes = scratch_round(nA * 2) + scratch_round(nB * 2) + 2 * scratch_round(nTR * 2) +
                   (backward ? scratch_round(nA * 4) : 0);
    scratch_carver sc = {(char *)cuda_scratch(c, bytes), 0};
    st.A = (bf16 *)scratch_take(&sc, nA * 2);
    st.Bt = (bf16 *)scratch_take(&sc, nB * 2);
    st.u = (bf16 *)scratch_take(&sc, nTR * 2);
    st.g = (bf16 *)scratch_take(&sc, nTR * 2);
    st.dA = backward ? (float *)scratch_take(&sc, nA * 4) : NULL;
    lora_convert_cols(c->stream, st.A, NULL, st.Bt, rel, n, 1, R, st.RP, in, st.span);
    return st;
}

void cuda_lora_fwd_cols(ct_backend *be, void *y, int ldy, const void *x, int ldx, int T, int in,
                        const ct_lora_cols *lora, int n_lora, int R, float scale, void *u_keep, int ldu)
{
    cuda_ctx *c = ctx_of(be);
    if (T == 0) return;
    stacked_lora st = lora_stack_prepare(c, lora, n_lora, T, in, R, false);
    bf16 *ys = (bf16 *)y + st.col0, *u = u_keep ? (bf16 *)u_keep : st.u;
    int ld = u_keep ? ldu : st.RP;
    CT_ASSERT(!u_keep || ldu >= st.RP, "lora_fwd_cols: ldu %d < %d", ldu, st.RP);
    gemm(c, u, CUDA_R_16BF, ld, x, ldx, false, st.A, in, true, T, st.RP, in, 1.0f, 0.0f, NULL);
    gemm(c, ys, CUDA_R_16BF, ldy, u, ld, false, st.Bt, st.span, false, T, st.span, st.RP, scale, 1.0f, NULL);
}

void cuda_lora_bwd_cols(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, const void *x, int ldx,
                        int T, int in, const ct_lora_cols *lora, int n_lora, int R, float scale, const void *u_kept,
                        int ldu)
{
    cuda_ctx *c = ctx_of(be);
    if (T == 0) return;
    stacked_lora st = lora_stack_prepare(c, lora, n_lora, T, in, R, true);
    const bf16 *dys = (const bf16 *)dy + st.col0, *u = u_kept ? (const bf16 *)u_kept : st.u;
    int ld = u_kept ? ldu : st.RP;
    CT_ASSERT(!u_kept || ldu >= st.RP, "lora_bwd_cols: ldu %d < %d", ldu, st.RP);
    if (!u_kept) gemm(c, st.u, CUDA_R_16BF, st.RP, x, ldx, false, st.A, in, true, T, st.RP, in, 1.0f, 0.0f, NULL);
    gemm(c, st.g, CUDA_R_16BF, st.RP, dys, lddy, false, st.Bt, st.span, true, T, st.RP, st.span, 1.0f, 0.0f, NULL);
    for (int q = 0; q < n_lora; q++)
        gemm(c, lora[q].dB, CUDA_R_32F, R, (const bf16 *)dy + lora[q].col0, lddy, true, u + q * R, ld,
             false, lora[q].cols, R, T, scale, 1.0f, NULL);
    gemm(c, st.dA, CUDA_R_32F, in, st.g, st.RP, true, x, ldx, false, st.RP, in, T, scale, 0.0f, NULL);
    size_t nA = (size_t)R * in;
    for (int q = 0; q < n_lora; q++) {
        f32_add_kernel<<<grid_for(nA, 256), 256, 0, c->stream>>>(lora[q].dA, st.dA + q * nA, nA);
        LAUNCH_CHECK();
    }
    if (dx) gemm(c, dx, CUDA_R_16BF, lddx, st.g, st.RP, false, st.A, in, false, T, in, st.RP, scale, 1.0f, NULL);
}
