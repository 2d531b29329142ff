/* fp8.cu — FP8 E4M3 kernels (contract: fp8.cuh; the format: src/formats/fp8.h).
 *
 * fp8_dequant_blocks_bf16: one thread per 8 consecutive elements of the dense
 * weight (flat index, so any cols works): one 8-byte load of codes, one
 * 16-byte store of bf16. Codes go through the hardware E4M3 -> f16 convert
 * (exact: every code is an f16 value), the product with the block's scale is
 * one fp32 multiply, rounded once to bf16, as on the CPU.
 *
 * fp8_quant_rows: a half-warp per (row, 128-column group), 8 bf16 per lane in
 * one 16-byte load; the group max by 4 xor-shuffles within the half; the
 * scale by the CPU's formula; x / scale as x * (1 / scale), equal because
 * both are the one rounding of x * 2^-k (1 / scale is a normal power of two,
 * or 0 for an infinite scale, as x / inf is 0). The encode is the hardware
 * fp32 -> E4M3 convert (round to nearest even) after a saturating clamp, NaN
 * set to 0x7f: exactly what fp8_quantize_rows stores.
 *
 * fp8_transpose: 64x64-byte tiles through shared memory (row pitch 68 bytes,
 * 2-way bank conflicts at most on the column reads); full tiles move in
 * 16-byte loads and stores when rows and cols allow, edge tiles byte by byte.
 * A one-time pass per weight, not tuned further. */
#include "ct_cuda.cuh"
#include "fp8.cuh"

#include <cuda_fp8.h>

extern "C" {
#include "fp8.h"
}

#define DQ_THREADS 256
#define QR_THREADS 256                 /* 16 groups per block, a half-warp each */
#define QR_GROUPS (QR_THREADS / 16)
#define TR_TILE 64
#define TR_PITCH (TR_TILE + 4)
#define TR_THREADS 256

// ---- kernels ----

/* Two E4M3 codes to fp32 (a in the low byte of the pair). */
__device__ __forceinline__ float2 e4m3x2_decode(uint16_t pair)
{
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pair, __NV_E4M3);
    return __half22float2(__half2(h));
}

/* fp8_e4m3_encode of a and b, a in the low byte, NaN always 0x7f (as
 * fp8_quantize_rows stores it). */
__device__ __forceinline__ uint32_t e4m3x2_encode(float a, float b)
{
    float ca = fabsf(a) > FP8_E4M3_MAX ? copysignf(FP8_E4M3_MAX, a) : a;   /* NaN compares false: stays */
    float cb = fabsf(b) > FP8_E4M3_MAX ? copysignf(FP8_E4M3_MAX, b) : b;
    uint32_t r = __nv_cvt_float2_to_fp8x2(make_float2(ca, cb), __NV_SATFINITE, __NV_E4M3);
    if (isnan(a)) r = (r & 0xff00u) | 0x7fu;
    if (isnan(b)) r = (r & 0x00ffu) | 0x7f00u;
    return r;
}

/* fp8_quantize_rows' scale of a group with max amax (never NaN: fmaxf drops NaN). */
__device__ __forceinline__ float row_scale(float amax)
{
    if (!(amax > 0.0f)) return 1.0f;
    uint32_t bits = (__float_as_uint(__fdiv_rn(amax, FP8_E4M3_MAX)) + 0x007fffffu) & 0x7f800000u;
    return __uint_as_float(bits ? bits : 0x00800000u);
}

__global__ void fp8_dequant_blocks_kernel(bf16 *y, const uint8_t *q, const float *scale_inv, size_t gc, size_t rows,
                                          size_t cols, size_t chunks)
{
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= chunks) return;
    size_t n = rows * cols, i0 = k * 8;
    size_t r = i0 / cols, c = i0 % cols;
    bool whole = i0 + 8 <= n;
    uint2 raw = make_uint2(0, 0);
    if (whole) {
        raw = *(const uint2 *)(q + i0);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t b = i0 + j < n ? (uint32_t)q[i0 + j] << (8 * (j % 4)) : 0u;
            if (j < 4) raw.x |= b; else raw.y |= b;
        }
    }
    uint32_t words[2] = {raw.x, raw.y};
    float v[8];
#pragma unroll
    for (int p = 0; p < 4; p++) {
        float2 d = e4m3x2_decode((uint16_t)(words[p / 2] >> (16 * (p % 2))));
        v[2 * p] = d.x;
        v[2 * p + 1] = d.y;
    }
    __align__(16) bf16 out[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        bool in = i0 + j < n;   /* past the end (tail only): any scale in bounds */
        out[j] = __float2bfloat16_rn(__fmul_rn(v[j], scale_inv[in ? (r / FP8_BLOCK) * gc + c / FP8_BLOCK : 0]));
        if (++c == cols) { c = 0; r++; }
    }
    if (whole) {
        *(uint4 *)(y + i0) = *(const uint4 *)out;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (i0 + j < n) y[i0 + j] = out[j];
    }
}

__global__ void fp8_quant_rows_kernel(uint8_t *q, int ldq, float *scale, int ld_scale, const bf16 *x, int ldx, int T,
                                      int K, int G)
{
    long long gid = (long long)blockIdx.x * QR_GROUPS + threadIdx.x / 16;
    int lane = threadIdx.x % 16;
    bool live = gid < (long long)T * G;
    int t = live ? (int)(gid / G) : 0, g = live ? (int)(gid % G) : 0;
    int c = g * FP8_BLOCK + lane * 8;
    bool mine = live && c < K;
    float v[8];
    float amax = 0.0f;
    if (mine) {
        uint4 raw = *(const uint4 *)(x + (size_t)t * ldx + c);
        const bf16 *h = (const bf16 *)&raw;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            v[j] = __bfloat162float(h[j]);
            amax = fmaxf(amax, fabsf(v[j]));
        }
    }
    /* every lane takes part: the shuffles span the whole warp */
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float s = row_scale(amax);
    if (live && lane == 0) scale[fp8_row_scale_index((size_t)g, (size_t)t, (size_t)ld_scale)] = s;
    if (!mine) return;
    float inv = __frcp_rn(s);
    uint32_t lo = e4m3x2_encode(v[0] * inv, v[1] * inv) | e4m3x2_encode(v[2] * inv, v[3] * inv) << 16;
    uint32_t hi = e4m3x2_encode(v[4] * inv, v[5] * inv) | e4m3x2_encode(v[6] * inv, v[7] * inv) << 16;
    *(uint2 *)(q + (size_t)t * ldq + c) = make_uint2(lo, hi);
}

__global__ void fp8_transpose_kernel(uint8_t *qt, const uint8_t *q, size_t rows, size_t cols, bool vec)
{
    __shared__ __align__(16) uint8_t tile[TR_TILE][TR_PITCH];
    size_t r0 = (size_t)blockIdx.y * TR_TILE, c0 = (size_t)blockIdx.x * TR_TILE;
    int t = threadIdx.x;
    if (vec && r0 + TR_TILE <= rows && c0 + TR_TILE <= cols) {
        int row = t / 4, part = t % 4;    /* load: 16 bytes of source row r0 + row */
        uint4 v = *(const uint4 *)(q + (r0 + row) * cols + c0 + 16 * part);
        uint32_t *dst = (uint32_t *)&tile[row][16 * part];
        dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
        __syncthreads();
        __align__(16) uint8_t out[16];    /* store: 16 bytes of output row c0 + row */
#pragma unroll
        for (int i = 0; i < 16; i++) out[i] = tile[16 * part + i][row];
        *(uint4 *)(qt + (c0 + row) * rows + r0 + 16 * part) = *(const uint4 *)out;
        return;
    }
    for (int i = t; i < TR_TILE * TR_TILE; i += TR_THREADS) {
        size_t r = r0 + i / TR_TILE, c = c0 + i % TR_TILE;
        if (r < rows && c < cols) tile[i / TR_TILE][i % TR_TILE] = q[r * cols + c];
    }
    __syncthreads();
    for (int i = t; i < TR_TILE * TR_TILE; i += TR_THREADS) {
        size_t c = c0 + i / TR_TILE, r = r0 + i % TR_TILE;
        if (r < rows && c < cols) qt[c * rows + r] = tile[i % TR_TILE][i / TR_TILE];
    }
}

/* st (cols/128 block rows, ldt) from s (rows/128 block rows, lds); padding 0. */
__global__ void fp8_transpose_scales_kernel(float *st, const float *s, size_t nbr, size_t nbc, size_t lds, size_t ldt)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nbc * ldt) return;
    size_t cb = i / ldt, rb = i % ldt;
    st[i] = rb < nbr ? s[rb * lds + cb] : 0.0f;
}

// ---- launchers ----

void fp8_dequant_blocks_bf16(bf16 *y, const uint8_t *q, const float *scale_inv, size_t ld_scale, size_t rows,
                             size_t cols, cudaStream_t stream)
{
    CT_ASSERT((uintptr_t)y % 16 == 0 && (uintptr_t)q % 8 == 0, "fp8_dequant_blocks_bf16: y needs 16-byte, q 8-byte "
              "alignment");
    CT_ASSERT(ld_scale >= fp8_blocks(cols), "fp8_dequant_blocks_bf16: ld_scale %zu < %zu blocks", ld_scale,
              fp8_blocks(cols));
    size_t chunks = (rows * cols + 7) / 8;
    if (chunks == 0) return;
    fp8_dequant_blocks_kernel<<<grid_for(chunks, DQ_THREADS), DQ_THREADS, 0, stream>>>(y, q, scale_inv, ld_scale, rows,
                                                                                       cols, chunks);
    LAUNCH_CHECK();
}

void fp8_transpose_scales_dev(float *st, const float *s, size_t rows, size_t cols, cudaStream_t stream)
{
    size_t nbr = fp8_blocks(rows), nbc = fp8_blocks(cols), ldt = fp8_weight_scale_ld(rows);
    size_t n = nbc * ldt;
    if (n == 0) return;
    fp8_transpose_scales_kernel<<<grid_for(n, 256), 256, 0, stream>>>(st, s, nbr, nbc, fp8_weight_scale_ld(cols), ldt);
    LAUNCH_CHECK();
}

void fp8_quant_rows(uint8_t *q, int ldq, float *scale, int ld_scale, const bf16 *x, int ldx, int T, int K,
                    cudaStream_t stream)
{
    CT_ASSERT(T >= 0 && K >= 0 && K % 8 == 0 && ldx % 8 == 0 && ldq % 8 == 0 && ldx >= K && ldq >= K && ld_scale >= T,
              "fp8_quant_rows: T %d, K %d, ldx %d, ldq %d, ld_scale %d", T, K, ldx, ldq, ld_scale);
    CT_ASSERT((uintptr_t)x % 16 == 0 && (uintptr_t)q % 8 == 0, "fp8_quant_rows: x needs 16-byte, q 8-byte alignment");
    int G = (int)fp8_blocks((size_t)K);
    size_t groups = (size_t)T * (size_t)G;
    if (groups == 0) return;
    fp8_quant_rows_kernel<<<grid_for(groups, QR_GROUPS), QR_THREADS, 0, stream>>>(q, ldq, scale, ld_scale, x, ldx, T,
                                                                                 K, G);
    LAUNCH_CHECK();
}

void fp8_transpose(uint8_t *qt, const uint8_t *q, size_t rows, size_t cols, cudaStream_t stream)
{
    if (rows == 0 || cols == 0) return;
    size_t gy = (rows + TR_TILE - 1) / TR_TILE;
    CT_ASSERT(gy <= 65535, "fp8_transpose: %zu rows exceed the grid (%d tiles of %d)", rows, 65535, TR_TILE);
    bool vec = rows % 16 == 0 && cols % 16 == 0 && (uintptr_t)q % 16 == 0 && (uintptr_t)qt % 16 == 0;
    dim3 grid((unsigned)((cols + TR_TILE - 1) / TR_TILE), (unsigned)gy);
    fp8_transpose_kernel<<<grid, TR_THREADS, 0, stream>>>(qt, q, rows, cols, vec);
    LAUNCH_CHECK();
}

// ---- backend ops ----

static void cuda_dequant_fp8(ct_backend *be, void *y, const uint8_t *q, const float *scale, size_t rows, size_t cols)
{
    fp8_dequant_blocks_bf16((bf16 *)y, q, scale, fp8_weight_scale_ld(cols), rows, cols, ctx_of(be)->stream);
}

/* x (T, K) bf16 -> E4M3 (T, K) dense and its scales (ceil(K/128), T), carved from sc. */
static void quantize_input(cuda_ctx *c, scratch_carver *sc, const bf16 *x, int ldx, int T, int K, uint8_t **q,
                           float **scale)
{
    *q = (uint8_t *)scratch_take(sc, (size_t)T * (size_t)K);
    *scale = (float *)scratch_take(sc, fp8_blocks((size_t)K) * (size_t)T * sizeof(float));
    fp8_quant_rows(*q, K, *scale, T, x, ldx, T, K, c->stream);
}

static size_t input_bytes(int T, int K)
{
    return scratch_round((size_t)T * (size_t)K) + scratch_round(fp8_blocks((size_t)K) * (size_t)T * sizeof(float));
}

static int round8(int n) { return (n + 7) / 8 * 8; }

/* The scratch of fp8_gemm_rows (src/model/memory_plan.c counts the same). */
static size_t rows_bytes(int T, int K, int N)
{
    return input_bytes(T & ~3, K) + input_bytes(4, K) + scratch_round((size_t)4 * (size_t)round8(N) * sizeof(bf16));
}

/* y (T, N) (+ c_in, which may be y) (+ bias) = fp8(x (T, K)) @ W^T, W (N, K)
 * E4M3 with its block grid. cuBLASLt's block-scaled product runs only for a
 * multiple of 4 rows (gemm.cu), so the first T & ~3 rows go straight into y
 * and the last 1-3 through a 4-row product in scratch whose spare rows are
 * zero: packed batches have any token count. */
static void fp8_gemm_rows(cuda_ctx *c, scratch_carver *sc, bf16 *y, int ldy, const bf16 *c_in, const bf16 *x,
                          int ldx, int T, int K, const uint8_t *w, const float *w_scale, int N, const bf16 *bias)
{
    int T4 = T & ~3, tail = T - T4;
    if (T4 > 0) {
        uint8_t *x8;
        float *xs;
        quantize_input(c, sc, x, ldx, T4, K, &x8, &xs);
        gemm_fp8(c, y, ldy, c_in, x8, K, xs, w, K, w_scale, T4, N, K, bias);
    }
    if (tail == 0) return;
    int ldt = round8(N);
    uint8_t *x8 = (uint8_t *)scratch_take(sc, (size_t)4 * (size_t)K);
    float *xs = (float *)scratch_take(sc, fp8_blocks((size_t)K) * 4 * sizeof(float));
    bf16 *yt = (bf16 *)scratch_take(sc, (size_t)4 * (size_t)ldt * sizeof(bf16));
    CUDA_CHECK(cudaMemsetAsync(x8, 0, (size_t)4 * (size_t)K, c->stream));
    CUDA_CHECK(cudaMemsetAsync(xs, 0, fp8_blocks((size_t)K) * 4 * sizeof(float), c->stream));
    fp8_quant_rows(x8, K, xs, 4, x + (size_t)T4 * ldx, ldx, tail, K, c->stream);
    if (c_in) {
        CUDA_CHECK(cudaMemsetAsync(yt, 0, (size_t)4 * (size_t)ldt * sizeof(bf16), c->stream));
        CUDA_CHECK(cudaMemcpy2DAsync(yt, (size_t)ldt * sizeof(bf16), c_in + (size_t)T4 * ldy, (size_t)ldy * sizeof(bf16),
                                     (size_t)N * sizeof(bf16), (size_t)tail, cudaMemcpyDeviceToDevice, c->stream));
    }
    gemm_fp8(c, yt, ldt, c_in ? yt : NULL, x8, K, xs, w, K, w_scale, 4, N, K, bias);
    CUDA_CHECK(cudaMemcpy2DAsync(y + (size_t)T4 * ldy, (size_t)ldy * sizeof(bf16), yt, (size_t)ldt * sizeof(bf16),
                                 (size_t)N * sizeof(bf16), (size_t)tail, cudaMemcpyDeviceToDevice, c->stream));
}

static void cuda_linear_fwd_fp8(ct_backend *be, void *y, int ldy, const void *c_in, const void *x, int ldx,
                                const uint8_t *q, const float *scale, const void *bias, int T, int in, int out)
{
    cuda_ctx *c = ctx_of(be);
    if (T == 0) return;
    scratch_carver sc = {(char *)cuda_scratch(c, rows_bytes(T, in, out)), 0};
    fp8_gemm_rows(c, &sc, (bf16 *)y, ldy, (const bf16 *)c_in, (const bf16 *)x, ldx, T, in, q, scale, out,
                  (const bf16 *)bias);
}

/* dx = dy @ W = dy @ (W^T)^T: W^T (in, out) and its grid are built in scratch
 * for each call, a pass over 1 byte per weight, small next to the GEMM's
 * T-fold reuse of it, and no second copy of the base held. */
static void cuda_linear_bwd_input_fp8(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, const uint8_t *q,
                                      const float *scale, int T, int in, int out, int accumulate)
{
    cuda_ctx *c = ctx_of(be);
    if (T == 0) return;
    size_t wt = scratch_round((size_t)in * (size_t)out);
    size_t st_bytes = scratch_round(fp8_blocks((size_t)in) * fp8_weight_scale_ld((size_t)out) * sizeof(float));
    scratch_carver sc = {(char *)cuda_scratch(c, wt + st_bytes + rows_bytes(T, out, in)), 0};
    uint8_t *qt = (uint8_t *)scratch_take(&sc, (size_t)in * (size_t)out);
    float *st = (float *)scratch_take(&sc, fp8_blocks((size_t)in) * fp8_weight_scale_ld((size_t)out) * sizeof(float));
    fp8_transpose(qt, q, (size_t)out, (size_t)in, c->stream);
    fp8_transpose_scales_dev(st, scale, (size_t)out, (size_t)in, c->stream);
    fp8_gemm_rows(c, &sc, (bf16 *)dx, lddx, accumulate ? (const bf16 *)dx : NULL, (const bf16 *)dy, lddy, T, out, qt,
                  st, in, NULL);
}

void cuda_fill_fp8_ops(ct_backend *be)
{
    be->dequant_fp8 = cuda_dequant_fp8;
    be->linear_fwd_fp8 = cuda_linear_fwd_fp8;
    be->linear_bwd_input_fp8 = cuda_linear_bwd_input_fp8;
}
