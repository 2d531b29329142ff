/* moe_gemm_tiles.cuh — the tile plumbing of the cp.async + wgmma grouped GEMM (v2),
 * which moe_gemm_fused_lora.cu's fused kernel runs on and whose raster, B descriptors
 * and epilogue the TMA kernel (moe_gemm_tma.cu) shares: the row addressing
 * through the gather, the tile raster, the cp.async copies of one k-step into a
 * 128-byte-swizzled stage, and the epilogue.
 *
 * v2's design: block tile 128x256x64, two warpgroups of 64x256 (wgmma.m64n256k16,
 * both operands from shared memory through descriptors, fp32 accumulators in 128
 * registers per thread), 1 block per SM. Copies are cp.async (a tile's rows are
 * scattered by the gather and cut by the expert, which TMA's boxes cannot
 * express) into the layout the descriptors read: chunk c of row r at r*128 +
 * ((c ^ r%8) * 16), 1024-byte-aligned stages. Row tiles are rastered in groups
 * of 8 (the column tiles of 8 row tiles run together) so that the x rows and W_e
 * stay in L2. The epilogue stores 16 bytes at a time after an in-quad transpose
 * of the accumulators (wg_epilogue). v2's own grouped GEMM, replaced on every
 * call by the TMA kernel, is described in docs/kernels/moe_gemm.md. */
#ifndef CT_MOE_GEMM_V2_CUH
#define CT_MOE_GEMM_V2_CUH

#include "moe_gemm.cuh"
#include "wgmma.cuh"

/* Row r (< rows) of tile t's input, at column c: through gather when there is one. */
__device__ __forceinline__ const bf16 *gemm_row(const gemm_args &p, const row_tile &t, int r, int c)
{
    const size_t row = p.gather ? (size_t)(p.gather[t.m0 + r] / p.topk) : (size_t)(t.m0 + r);
    return p.x + row * p.ldx + c;
}

/* v2: block tile 128x256x64, two warpgroups (one per 64 rows, each the full 256
 * columns with m64n256k16), cp.async into 128-byte-swizzled stages (the stage
 * count is the kernel's). */
namespace wg {
constexpr int NTHREADS = 256, BM = 128, BN = 256, BK = 64, GROUP = 8;
constexpr int ROW_BYTES = BK * 2;                       /* one swizzled row: 128 bytes, 8 chunks */
constexpr int A_BYTES = BM * ROW_BYTES, B_BYTES = BN * ROW_BYTES, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int ACH = BM * BK / 8 / NTHREADS, BCH = BN * BK / 8 / NTHREADS; /* 16-byte chunks per thread */
constexpr int NN_PANEL = BK * ROW_BYTES;                /* NN: B as 4 panels of 64 columns x BK rows */
}

/* B's descriptor for 16-deep step ks of a k-step staged at sb: NT, W's rows
 * K-major (128-byte swizzled, as the A tile); NN, 4 MN-major panels of 64 columns.
 * The v2, fused-LoRA and TMA kernels all read their stages this way. */
template <bool NN> __device__ __forceinline__ uint64_t wg_b_desc(uint32_t sb, int ks)
{
    return NN ? wgmma_desc(sb + ks * 16 * wg::ROW_BYTES, wg::NN_PANEL, 1024) : wgmma_desc(sb + ks * 32, 16, 1024);
}

/* Row tile and column tile of a tile index: row tiles rastered in groups of GROUP
 * (the column tiles of GROUP row tiles run together). */
__device__ __forceinline__ void tile_coords(int tile, int n_rt, int n_ct, int group_rows, int &rt, int &ct)
{
    const int per_group = group_rows * n_ct, group = tile / per_group, first = group * group_rows;
    const int rows_g = min(group_rows, n_rt - first), local = tile - group * per_group;
    rt = first + local % rows_g;
    ct = local / rows_g;
}

/* What one thread loads for one tile of the forward (NT: x rows and W_e rows both
 * run along K): its input rows (NULL past the tile's rows), and its W chunks. */
struct wg_loads {
    const bf16 *a[wg::ACH]; /* input row (tid/8 + 32 i) at column 8 (tid%8) */
    const bf16 *b;          /* W_e row n0 + tid/8 at column 8 (tid%8) */
    uint32_t b_ok;          /* bit i = row n0 + tid/8 + 32 i < N */
};

__device__ __forceinline__ void wg_loads_init(wg_loads &l, const gemm_args &p, const row_tile &t, int n0)
{
    using namespace wg;
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < ACH; i++) {
        const int r = (tid >> 3) + 32 * i;
        l.a[i] = r < t.rows ? gemm_row(p, t, r, (tid & 7) * 8) : NULL;
    }
    const bf16 *w = p.W + (size_t)t.e * p.N * p.K;
    l.b = w + (size_t)(n0 + (tid >> 3)) * p.K + (tid & 7) * 8;
    l.b_ok = 0;
#pragma unroll
    for (int i = 0; i < BCH; i++) l.b_ok |= (uint32_t)(n0 + (tid >> 3) + 32 * i < p.N) << i;
}

/* Queues the cp.async copies of k-step kt of a tile into the stage at s (shared
 * address); chunks past the rows, N or K are zero-filled. */
__device__ __forceinline__ void wg_load_stage(const wg_loads &l, const gemm_args &p, uint32_t s, int kt)
{
    using namespace wg;
    const int tid = threadIdx.x, k0 = kt * BK, c = tid & 7;
#pragma unroll
    for (int i = 0; i < ACH; i++) {
        const bool ok = l.a[i] && k0 + c * 8 < p.K;
        cp_async16_s(s + swz((tid >> 3) + 32 * i, c), ok ? l.a[i] + k0 : p.x, ok);
    }
    const uint32_t sb = s + A_BYTES;
#pragma unroll
    for (int i = 0; i < BCH; i++) {
        const bool ok = (l.b_ok >> i & 1) && k0 + c * 8 < p.K;
        cp_async16_s(sb + swz((tid >> 3) + 32 * i, c), ok ? l.b + (size_t)32 * i * p.K + k0 : p.W, ok);
    }
}

__device__ __forceinline__ float2 shfl_xor2(float2 v, int m)
{
    return make_float2(__shfl_xor_sync(0xffffffffu, v.x, m), __shfl_xor_sync(0xffffffffu, v.y, m));
}

/* y rows of this warpgroup (tile rows 64 wgi .. 64 wgi + 63; tile row r is y row
 * row0 + r, stored only when row_lo <= r < row_hi) of expert `expert` at columns
 * n0..n0+255 (< N) from the accumulators: + bias (+ the old y) in fp32, rounded
 * once. Accumulator layout (per warp, as mma.sync's C): d[4j + 2h + q] is
 * row 16 warp + lane/4 + 8h, column 8j + 2 (lane%4) + q, so a quad holds 2 columns
 * of each 8-column tile. Two butterfly exchanges (lanes xor 1, then xor 2) give
 * lane q of the quad all 8 columns of tile 4m + q instead: one 16-byte store per
 * lane and row where 4-byte stores would take four times the instructions (with 1
 * block per SM, nothing else runs on the SM while this one stores). */
__device__ __forceinline__ void wg_epilogue(const gemm_args &p, const float (&d)[128], int expert, int row0,
                                            int row_lo, int row_hi, int n0, int wgi)
{
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, tq = lane & 3;
    const bool odd = tq & 1, hi = tq & 2;
    const bf16 *bias = p.bias ? p.bias + (size_t)expert * p.N : NULL;
#pragma unroll
    for (int m = 0; m < 8; m++) {
        float2 b[4]; /* bias at this lane's columns of tiles 4m .. 4m+3 */
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            const int col = n0 + (4 * m + jj) * 8 + 2 * tq;
            b[jj] = bias && col < p.N ? __bfloat1622float2(*(const __nv_bfloat162 *)(bias + col))
                                      : make_float2(0.0f, 0.0f);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float2 e[4];
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
                e[jj] = make_float2(d[4 * (4 * m + jj) + 2 * h] + b[jj].x, d[4 * (4 * m + jj) + 2 * h + 1] + b[jj].y);
            /* xor 1: even lanes trade tiles 1 and 3 for their odd partner's 0 and 2 */
            const float2 r01 = shfl_xor2(odd ? e[0] : e[1], 1), r23 = shfl_xor2(odd ? e[2] : e[3], 1);
            if (odd) {
                e[0] = r01;
                e[2] = r23;
            } else {
                e[1] = r01;
                e[3] = r23;
            }
            /* xor 2: now e[s] is column pair s of tile 4m + tq */
            const float2 r0 = shfl_xor2(hi ? e[0] : e[2], 2), r1 = shfl_xor2(hi ? e[1] : e[3], 2);
            if (hi) {
                e[0] = r0;
                e[1] = r1;
            } else {
                e[2] = r0;
                e[3] = r1;
            }
            const int r = wgi * 64 + warp * 16 + g + 8 * h, col = n0 + 32 * m + 8 * tq;
            if (r < row_lo || r >= row_hi || col >= p.N) continue; /* N % 8 == 0: all 8 columns or none */
            bf16 *dst = p.y + (size_t)(row0 + r) * p.ldy + col;
            float f[8] = {e[0].x, e[0].y, e[1].x, e[1].y, e[2].x, e[2].y, e[3].x, e[3].y};
            if (p.accumulate) {
                float o[8];
                load8(o, dst);
#pragma unroll
                for (int i = 0; i < 8; i++) f[i] += o[i];
            }
            store8(dst, f);
        }
    }
}

#endif
