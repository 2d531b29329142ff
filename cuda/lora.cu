/* lora.cu — the frozen linear layers and their LoRA adapters (PEFT semantics).
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
 * the (T,in) scratch and one pass over x. */
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
                   uint64_t dropout_seed)
{
    cuda_ctx *c = ctx_of(be);
    if (T == 0) return;
    lora_scratch s = lora_prepare(c, A, B, T, in, out, R, dropout_p);
    int ldxd;
    const bf16 *xd = lora_input(c, &s, (const bf16 *)x, ldx, &ldxd, T, in, dropout_p, dropout_seed);
    gemm(c, s.u, CUDA_R_16BF, R, xd, ldxd, false, s.A, in, true, T, R, in, 1.0f, 0.0f, NULL);
    gemm(c, y, CUDA_R_16BF, ldy, s.u, R, false, s.B, R, true, T, out, R, scale, 1.0f, NULL);
}

void cuda_lora_bwd(ct_backend *be, void *dx, int lddx, float *dA, float *dB, const void *dy,
                   int lddy, const void *x, int ldx, const float *A, const float *B, int T, int in,
                   int out, int R, float scale, float dropout_p, uint64_t dropout_seed)
{
    cuda_ctx *c = ctx_of(be);
    if (T == 0) return;
    lora_scratch s = lora_prepare(c, A, B, T, in, out, R, dropout_p);
    int ldxd;
    const bf16 *xd = lora_input(c, &s, (const bf16 *)x, ldx, &ldxd, T, in, dropout_p, dropout_seed);
    gemm(c, s.u, CUDA_R_16BF, R, xd, ldxd, false, s.A, in, true, T, R, in, 1.0f, 0.0f, NULL);
    gemm(c, s.g, CUDA_R_16BF, R, dy, lddy, false, s.B, R, false, T, R, out, 1.0f, 0.0f, NULL);
    gemm(c, dB, CUDA_R_32F, R, dy, lddy, true, s.u, R, false, out, R, T, scale, 1.0f, NULL);
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
