/* elementwise.cu — SwiGLU forward and backward, add, copy_2d: bf16 in and out,
 * fp32 math. SwiGLU gu (T, 2I) = [gate | up], h (T, I).
 *
 * Every access is 16 bytes (8 bf16) per thread, coalesced across the warp, so
 * the row widths (I, cols) and strides must be multiples of 8 and the pointers
 * 16-byte aligned; the launchers assert it, and cuda_check_model
 * (backend_cuda.cu) refuses at load a model whose intermediate size is not a
 * multiple of 8. */
#include "ct_cuda.cuh"

// ---- kernels ----

__global__ void swiglu_fwd_kernel(bf16 *h, const bf16 *gu, int T, int I)
{
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (size_t)T * I) return;
    size_t t = idx / I, i = idx % I;
    float g[8], u[8];
    load8(g, gu + t * 2 * I + i);
    load8(u, gu + t * 2 * I + I + i);
#pragma unroll
    for (int j = 0; j < 8; j++) g[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    store8(h + idx, g);
}

/* d silu(g)/dg = sig(g) (1 + g (1 - sig(g))). */
__global__ void swiglu_bwd_kernel(bf16 *dgu, const bf16 *dh, const bf16 *gu, int T, int I)
{
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (size_t)T * I) return;
    size_t t = idx / I, i = idx % I;
    float g[8], u[8], d[8], dg[8], du[8];
    load8(g, gu + t * 2 * I + i);
    load8(u, gu + t * 2 * I + I + i);
    load8(d, dh + idx);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float sig = 1.0f / (1.0f + expf(-g[j]));
        dg[j] = d[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
        du[j] = d[j] * g[j] * sig;
    }
    store8(dgu + t * 2 * I + i, dg);
    store8(dgu + t * 2 * I + I + i, du);
}

__global__ void add_kernel(bf16 *y, const bf16 *x, size_t n)
{
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx + 8 <= n) {
        float a[8], b[8];
        load8(a, y + idx);
        load8(b, x + idx);
#pragma unroll
        for (int j = 0; j < 8; j++) a[j] += b[j];
        store8(y + idx, a);
    } else {
        for (size_t i = idx; i < n; i++)
            y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + __bfloat162float(x[i]));
    }
}

__global__ void copy_2d_kernel(bf16 *dst, int lddst, const bf16 *src, int ldsrc, int rows, int cols)
{
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (size_t)rows * cols) return;
    size_t r = idx / cols, i = idx % cols;
    *(uint4 *)(dst + r * lddst + i) = *(const uint4 *)(src + r * ldsrc + i);
}

// ---- launchers ----

void cuda_swiglu_fwd(ct_backend *be, void *h, const void *gu, int T, int I)
{
    check_vec8("swiglu_fwd", h, I, I);
    check_vec8("swiglu_fwd", gu, 2 * I, I);
    size_t n8 = (size_t)T * I / 8;
    if (n8 == 0) return;
    swiglu_fwd_kernel<<<grid_for(n8, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)h, (const bf16 *)gu, T, I);
    LAUNCH_CHECK();
}

void cuda_swiglu_bwd(ct_backend *be, void *dgu, const void *dh, const void *gu, int T, int I)
{
    check_vec8("swiglu_bwd", dgu, 2 * I, I);
    check_vec8("swiglu_bwd", dh, I, I);
    check_vec8("swiglu_bwd", gu, 2 * I, I);
    size_t n8 = (size_t)T * I / 8;
    if (n8 == 0) return;
    swiglu_bwd_kernel<<<grid_for(n8, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)dgu, (const bf16 *)dh, (const bf16 *)gu, T, I);
    LAUNCH_CHECK();
}

void cuda_add(ct_backend *be, void *y, const void *x, size_t n)
{
    CT_ASSERT(aligned16(y) && aligned16(x), "add: pointers must be 16-byte aligned");
    if (n == 0) return;
    add_kernel<<<grid_for((n + 7) / 8, 256), 256, 0, ctx_of(be)->stream>>>((bf16 *)y, (const bf16 *)x, n);
    LAUNCH_CHECK();
}

void cuda_copy_2d(ct_backend *be, void *dst, int lddst, const void *src, int ldsrc, int rows, int cols)
{
    check_vec8("copy_2d", dst, lddst, cols);
    check_vec8("copy_2d", src, ldsrc, cols);
    size_t n8 = (size_t)rows * cols / 8;
    if (n8 == 0) return;
    copy_2d_kernel<<<grid_for(n8, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)dst, lddst, (const bf16 *)src, ldsrc, rows, cols);
    LAUNCH_CHECK();
}
