/* moe_expert_lora.cu — the expert LoRA of mixture-of-experts layers (backend.h, "mixture
 * of experts"): one launch serves every expert. The row layout, the gather and the
 * tile schedule it shares with the grouped GEMMs (moe_gemm.cu) are described in
 * moe_gemm.cuh.
 *   moe_lora_fwd / _bwd   lora_fwd / lora_bwd (linear_lora.cu) over each expert's rows, with
 *                         A (E,R,in), B (E,out,R) fp32 and the seed ct_hash64(seed, e)
 * The input rows x_r of both ops are x[r], or with gather x[gather[r] / K].
 *
 * With n unknown, no (n, .) tensor may live in scratch, so u = drop(x) A^T and
 * g = dy B exist per 128-row tile only: each warp computes 16 rows x R (R padded
 * to RP = 16, 32 or 64) with mma over a cp.async pipeline, rounds them to bf16 as
 * linear_lora.cu does, and feeds its accumulators back as mma A operands: y += scale u B^T
 * (forward), dx += scale drop'(g A) (backward), reading B and A^T fragments
 * straight from L1/L2. Dropout masks x in shared memory between the copy and the
 * ldmatrix (p > 0 only), with the index (row within the expert) * in + column.
 * The weight gradients dB_e += scale dy_e^T u_e and dA_e += scale g_e^T drop(x_e)
 * reduce over rows, so u and g must outlive their tile: backward is one
 * cooperative kernel that walks the rows in chunks of `cap` rows (u and g of one
 * chunk fit 8 MB of scratch) and per chunk runs phase A (row tiles: u, g into
 * scratch, dx) and, after a grid barrier, phase B (one work item per expert and
 * 128 columns of dB or dA^T, summing over that expert's rows of the chunk in row
 * order; items dealt to the blocks largest expert first, in snake order). Each
 * output element has one owner and a fixed summation order: the gradients are
 * bit-identical run to run, without atomics. fp32 masters are
 * rounded to padded bf16 copies first (A, A^T, B, B^T as needed; E*RP*(in+out)
 * elements; lora_convert.cu). */
#include "moe_gemm.cuh"

#include <climits>
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

// ---- kernels ----

namespace lr {
constexpr int NTHREADS = 256, BM = 128, BK = 64, STAGES = 3, LDX = BK + 8; /* row tiles: 16 rows per warp */
/* weight gradients: 64 rows x 128 columns per stage (16 KB of the reduced operand;
 * with 3 stages and 2 blocks per SM ~64 KB of loads in flight per SM, about what
 * the H200's latency x bandwidth asks for; at 32 rows it was half that, and the
 * pass takes an estimated ~0.8 ms per qwen3-30b-a3b layer, memory floor ~0.45).
 * Rows are still summed in order: the results are the 32-row version's bit for
 * bit. The stages fit in the shared memory phase A already takes. */
constexpr int BR = 64, BNB = 128, LDP = BNB + 8;
constexpr size_t CAP_BYTES = (size_t)8 << 20;     /* u and g of one backward chunk */
template <int RP> constexpr size_t smem_bytes()
{
    static_assert((size_t)STAGES * BR * (LDP + RP + 8) <= (size_t)STAGES * (BM + RP) * LDX,
                  "phase B's stages must fit in phase A's shared memory (occupancy: 2 blocks per SM)");
    return sizeof(bf16) * ((size_t)STAGES * (BM + RP) * LDX > (size_t)STAGES * BR * (LDP + RP + 8)
                               ? (size_t)STAGES * (BM + RP) * LDX : (size_t)STAGES * BR * (LDP + RP + 8));
}
}

/* Bit-exact port of ct_hash64 (common.c): the per-expert dropout seed. */
__device__ __forceinline__ uint64_t ct_hash64_dev(uint64_t seed, uint64_t index)
{
    uint64_t z = (seed ^ (index * 0xd1b54a32d192ed03ull)) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Dropout of one operand: element (r, c) of a tile keeps iff
 * ct_hash_uniform(seed, (row0 + r) * width + c) >= p, scaled by inv_keep. */
struct drop_t {
    float p, inv_keep; /* p <= 0: no dropout */
    uint64_t seed;     /* the expert's: ct_hash64(dropout_seed, e) */
    int row0, width;   /* row0: the tile's first row within the expert; width: in */
};

/* Masks the 8 elements at s (shared), tile row r, columns c..c+7. */
__device__ __forceinline__ void drop8(bf16 *s, const drop_t &d, int r, int c)
{
    float f[8];
    load8(f, s);
    const uint64_t i0 = (uint64_t)(d.row0 + r) * (uint64_t)d.width + (uint64_t)c;
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = ct_hash_uniform_dev(d.seed, i0 + j) >= d.p ? f[j] * d.inv_keep : 0.0f;
    store8(s, f);
}

/* acc = this warp's 16 rows of X @ W^T: X (rows, K) at row stride ldx (the block's
 * 8 warps cover 128 rows), W (RP, K) dense bf16. d.p > 0 masks X (columns are X's).
 * gidx non-NULL: row r is X[gidx[r] / topk] (X then points at the token rows). */
template <int RP>
__device__ void lora_skinny(float (&acc)[RP / 8][4], bf16 *smem, const bf16 *X, int ldx, const int32_t *gidx,
                            int topk, int rows, const bf16 *W, int K, const drop_t &d)
{
    using namespace lr;
    constexpr int STAGE = (BM + RP) * LDX, XCH = BM * BK / 8 / NTHREADS, WCH = RP * BK / 8;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int j = 0; j < RP / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    int xrow[XCH]; /* X row of this thread's chunks (-1 past rows): indices, not pointers, for registers */
#pragma unroll
    for (int i = 0; i < XCH; i++) {
        const int r = (tid + i * NTHREADS) >> 3;
        xrow[i] = r >= rows ? -1 : gidx ? gidx[r] / topk : r;
    }
    auto load = [&](int stage, int kt) {
        bf16 *s = smem + stage * STAGE;
        const int k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < XCH; i++) {
            const int c = tid + i * NTHREADS, r = c >> 3, kc = (c & 7) * 8;
            const bool ok = xrow[i] >= 0 && k0 + kc < K;
            cp_async16(s + r * LDX + kc, ok ? X + (size_t)xrow[i] * ldx + k0 + kc : X, ok);
        }
        for (int c = tid; c < WCH; c += NTHREADS) {
            const int r = c >> 3, kc = (c & 7) * 8;
            const bool ok = k0 + kc < K;
            cp_async16(s + (BM + r) * LDX + kc, ok ? W + (size_t)r * K + k0 + kc : W, ok);
        }
    };
    const int KT = (K + BK - 1) / BK;
    cp_async_prologue<STAGES>(load, KT);
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<STAGES - 2>();
        bf16 *s = smem + (kt % STAGES) * STAGE;
        if (d.p > 0.0f) { /* this thread's own chunks: complete after its wait */
#pragma unroll
            for (int i = 0; i < XCH; i++) {
                const int c = tid + i * NTHREADS, r = c >> 3, kc = (c & 7) * 8;
                if (r < rows && kt * BK + kc < K) drop8(s + r * LDX + kc, d, r, kt * BK + kc);
            }
        }
        __syncthreads();
        if (kt + STAGES - 1 < KT) load((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        cp_async_commit();
        if (warp * 16 < rows) {
#pragma unroll
            for (int kk = 0; kk < BK; kk += 16) {
                uint32_t a[4];
                ldsm_x4(a, s + (warp * 16 + (lane & 15)) * LDX + kk + (lane >> 4) * 8);
#pragma unroll
                for (int j = 0; j < RP / 16; j++) {
                    uint32_t b[4];
                    ldsm_x4(b, s + (BM + j * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDX + kk + ((lane >> 3) & 1) * 8);
                    mma16816(acc[2 * j], a, b[0], b[1]);
                    mma16816(acc[2 * j + 1], a, b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads(); /* the stages are reused by the next call */
}

/* The 16 x RP accumulators rounded to bf16 as mma A fragments (k = rank): the
 * C layout of n-tiles 2j and 2j+1 is the A layout of k-step j. */
template <int RP>
__device__ __forceinline__ void lora_pack(uint32_t (&a)[RP / 16][4], const float (&acc)[RP / 8][4])
{
#pragma unroll
    for (int j = 0; j < RP / 16; j++) {
        a[j][0] = pack_bf16(acc[2 * j][0], acc[2 * j][1]);
        a[j][1] = pack_bf16(acc[2 * j][2], acc[2 * j][3]);
        a[j][2] = pack_bf16(acc[2 * j + 1][0], acc[2 * j + 1][1]);
        a[j][3] = pack_bf16(acc[2 * j + 1][2], acc[2 * j + 1][3]);
    }
}

/* S (rows, RP) bf16 at row stride lds = this warp's packed rows (rows < `rows` only). */
template <int RP>
__device__ __forceinline__ void lora_store_rows(bf16 *S, int lds, const uint32_t (&a)[RP / 16][4], int rows)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int j = 0; j < RP / 16; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (g + 8 * h < rows) {
                bf16 *row = S + (size_t)(g + 8 * h) * lds + j * 16 + 2 * tq;
                *(uint32_t *)row = a[j][h];
                *(uint32_t *)(row + 8) = a[j][2 + h];
            }
}

/* Y[r, 0:N] += scale * d(U @ Wt^T) for this warp's rows r < rows: U (16, RP) as A
 * fragments, Wt (N, RP) dense bf16 read as B fragments from L1/L2. d.p > 0 masks
 * the product (columns are Y's). Each step of 8 NJ columns loads all of this
 * lane's 2 NJ pairs of Y before the products and stores them after: the compiler
 * cannot move a load of Y above a store to Y (they might alias), so a load-add-
 * store per pair would leave one load in flight per warp, and this read-modify-
 * write is the op's main memory traffic. NJ: 64 columns per step, 32 at RP = 64,
 * whose u fragments leave too few registers for 64 (ptxas spills). */
template <int RP>
__device__ void lora_expand(bf16 *Y, int ldy, int rows, const uint32_t (&u)[RP / 16][4], const bf16 *Wt,
                            int N, float scale, const drop_t &d)
{
    constexpr int NJ = RP >= 64 ? 4 : 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    for (int n0 = 0; n0 < N; n0 += 8 * NJ) {
        __nv_bfloat162 old[NJ][2];
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int col = n0 + j * 8 + 2 * tq;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = g + 8 * h;
                old[j][h] = col < N && r < rows ? *(const __nv_bfloat162 *)(Y + (size_t)r * ldy + col)
                                                : __floats2bfloat162_rn(0.0f, 0.0f);
            }
        }
        float acc[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
            const int n = n0 + j * 8 + g;
            const bool ok = n < N;
            const unsigned int *w = (const unsigned int *)(Wt + (size_t)(ok ? n : 0) * RP + 2 * tq);
#pragma unroll
            for (int ks = 0; ks < RP / 16; ks++) {
                uint32_t b0 = ok ? __ldg(w + ks * 8) : 0u, b1 = ok ? __ldg(w + ks * 8 + 4) : 0u;
                mma16816(acc[j], u[ks], b0, b1);
            }
        }
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int col = n0 + j * 8 + 2 * tq;
            if (col >= N) continue;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = g + 8 * h;
                if (r >= rows) continue;
                float v0 = scale * acc[j][2 * h], v1 = scale * acc[j][2 * h + 1];
                if (d.p > 0.0f) {
                    const uint64_t i0 = (uint64_t)(d.row0 + r) * (uint64_t)d.width + (uint64_t)col;
                    v0 = ct_hash_uniform_dev(d.seed, i0) >= d.p ? v0 * d.inv_keep : 0.0f;
                    v1 = ct_hash_uniform_dev(d.seed, i0 + 1) >= d.p ? v1 * d.inv_keep : 0.0f;
                }
                const float2 o = __bfloat1622float2(old[j][h]);
                *(__nv_bfloat162 *)(Y + (size_t)r * ldy + col) = __floats2bfloat162_rn(o.x + v0, o.y + v1);
            }
        }
    }
}

/* acc = P[0:nrows, n0 + 16 warp + (0..15)]^T @ Q[0:nrows, 0:RP] (this warp's 16
 * columns of P; the block covers 128): P rows at row stride ldp with ncols
 * columns, Q (nrows, RP) bf16 at row stride ldq. d.p > 0 masks P. Rows are summed in order.
 * gidx non-NULL: row r of P is P[gidx[r] / topk] (P then points at the token rows). */
template <int RP>
__device__ void lora_wgrad(float (&acc)[RP / 8][4], bf16 *smem, const bf16 *P, int ldp, const int32_t *gidx,
                           int topk, int ncols, int n0, const bf16 *Q, int ldq, int nrows, const drop_t &d)
{
    using namespace lr;
    constexpr int LDQ = RP + 8, STAGE = BR * (LDP + LDQ), PCH = BR * BNB / 8 / NTHREADS, QCH = BR * RP / 8;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int j = 0; j < RP / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    /* With gather, P's row of step kt's row r is gidx[kt BR + r] / topk. The indices
     * travel by cp.async into a ring IDX_AHEAD steps deep, so no copy waits on an
     * index load: a register load one step ahead left the gathered variant stalled
     * on the scoreboard (ncu: 3.5 warps per issue against 1.7 without gather).
     * Iteration kt fetches step kt + IDX_AHEAD and copies step kt + STAGES - 1; its
     * wait has completed iteration kt - STAGES + 1's group, so that group's fetch
     * must be the step copied now: IDX_AHEAD = 2 STAGES - 2. */
    constexpr int IDX_AHEAD = 2 * STAGES - 2;
    __shared__ int32_t idx_ring[IDX_AHEAD][BR];
    auto fetch_idx = [&](int kt) {
        if (tid < BR) {
            const int r = kt * BR + tid;
            cp_async4(&idx_ring[kt % IDX_AHEAD][tid], gidx + (r < nrows ? r : 0), r < nrows);
        }
    };
    auto load = [&](int stage, int kt) {
        bf16 *s = smem + stage * STAGE;
        const int r0 = kt * BR;
#pragma unroll
        for (int i = 0; i < PCH; i++) {
            const int c = tid + i * NTHREADS, r = c >> 4, cc = (c & 15) * 8;
            const int src = r0 + r >= nrows ? -1 : gidx ? idx_ring[kt % IDX_AHEAD][r] / topk : r0 + r;
            const bool ok = src >= 0 && n0 + cc < ncols;
            cp_async16(s + r * LDP + cc, ok ? P + (size_t)src * ldp + n0 + cc : P, ok);
        }
        for (int c = tid; c < QCH; c += NTHREADS) {
            const int r = c / (RP / 8), qc = (c % (RP / 8)) * 8;
            const bool ok = r0 + r < nrows;
            cp_async16(s + BR * LDP + r * LDQ + qc, ok ? Q + (size_t)(r0 + r) * ldq + qc : Q, ok);
        }
    };
    const int KT = (nrows + BR - 1) / BR;
    if (gidx) { /* the first IDX_AHEAD steps' indices, waited for before any copy */
        for (int st = 0; st < IDX_AHEAD && st < KT; st++) fetch_idx(st);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
    }
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < KT) load(st, st);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<STAGES - 2>();
        bf16 *s = smem + (kt % STAGES) * STAGE;
        if (d.p > 0.0f) {
#pragma unroll
            for (int i = 0; i < PCH; i++) {
                const int c = tid + i * NTHREADS, r = c >> 4, cc = (c & 15) * 8;
                if (kt * BR + r < nrows && n0 + cc < ncols) drop8(s + r * LDP + cc, d, kt * BR + r, n0 + cc);
            }
        }
        __syncthreads();
        /* After the wait and barrier above step kt + STAGES - 1's indices have landed
         * for every thread; the slot refilled here (step kt's) was read STAGES - 1
         * iterations ago. */
        if (kt + STAGES - 1 < KT) load((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        if (gidx && kt + IDX_AHEAD < KT) fetch_idx(kt + IDX_AHEAD);
        cp_async_commit();
        if (n0 + warp * 16 < ncols) {
#pragma unroll
            for (int kk = 0; kk < BR; kk += 16) {
                uint32_t a[4]; /* A = P^T: rows of the fragment are P's columns */
                ldsm_x4_t(a, s + (kk + (lane & 7) + (lane >> 4) * 8) * LDP + warp * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int j = 0; j < RP / 16; j++) {
                    uint32_t b[4];
                    ldsm_x4_t(b, s + BR * LDP + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * LDQ + j * 16 +
                                     (lane >> 4) * 8);
                    mma16816(acc[2 * j], a, b[0], b[1]);
                    mma16816(acc[2 * j + 1], a, b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();
}

/* Where one module's weight gradients go: dA (E, R, in), dB (E, cols, R) fp32,
 * accumulated; the module owns dy's columns [col0, col0 + cols). */
struct lora_grads {
    float *dA, *dB;
    int col0, cols;
};

struct lora_args {
    bf16 *y;                 /* forward: y; backward: dx (or NULL); row stride ldy */
    const bf16 *x, *dy;      /* row strides ldx, lddy; dy backward only */
    const int32_t *gather;   /* (n) or NULL: row r of x is x[gather[r] / topk] (token rows) */
    const bf16 *Ap, *At;     /* (E, RP, in), (E, in, RP): A rounded and padded with zero ranks */
    const bf16 *Bp, *Bt;     /* (E, out, RP), (E, RP, out) */
    lora_grads mod[2];       /* backward: the modules' gradients and dy columns */
    int n_mod;               /* modules (ranks q R .. q R + R - 1 are module q's) */
    bf16 *us, *gs;           /* (cap, RP) each: u and g of one backward chunk */
    const bf16 *g_in;        /* backward: (n, ldg) or NULL: g from moe_linear_lora_bwd_input, not recomputed */
    bf16 *g_out;             /* backward: (n, ldg) or NULL: g of every row written (moe_lora_g) */
    int ldg;
    bool wgrad;              /* backward: phase B (dA, dB); false: phase A alone (moe_lora_g) */
    const bf16 *u_in;        /* backward: (n, ldu) or NULL: u from the fused forward, not recomputed */
    int ldu;
    const int32_t *offsets;
    int ldy, ldx, lddy, topk, E, in, out, R, cap;
    float scale, p;
    uint64_t seed;
};

/* x as lora_skinny / lora_wgrad take it from row `row` on: the row pointer without
 * gather, the token rows (and gather from `row`) with it. */
__device__ __forceinline__ const bf16 *lora_x(const lora_args &a, int row)
{
    return a.gather ? a.x : a.x + (size_t)row * a.ldx;
}
__device__ __forceinline__ const int32_t *lora_gidx(const lora_args &a, int row)
{
    return a.gather ? a.gather + row : NULL;
}

__device__ __forceinline__ drop_t lora_drop(const lora_args &a, const moe_sched &s, int e, int row)
{
    drop_t d;
    d.p = a.p;
    d.inv_keep = 1.0f / (1.0f - a.p);
    d.seed = a.p > 0.0f ? ct_hash64_dev(a.seed, (uint64_t)e) : 0;
    d.row0 = row - s.offs[e];
    d.width = a.in;
    return d;
}

/* y += scale * (drop(x) A_e^T) B_e^T over 128-row tiles. */
template <int RP>
__global__ void __launch_bounds__(lr::NTHREADS, 2) moe_lora_fwd_kernel(lora_args a)
{
    using namespace lr;
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ moe_sched sch;
    bf16 *smem = (bf16 *)dyn_smem;
    const int warp = threadIdx.x >> 5;
    sched_load(sch, a.offsets, a.E);
    const int n_rt = sched_tiles(sch, a.E, BM, INT_MIN, INT_MAX);
    for (int rt = blockIdx.x; rt < n_rt; rt += gridDim.x) {
        const row_tile t = sched_find(sch, a.E, BM, INT_MIN, INT_MAX, rt);
        const drop_t d = lora_drop(a, sch, t.e, t.m0);
        float acc[RP / 8][4];
        lora_skinny<RP>(acc, smem, lora_x(a, t.m0), a.ldx, lora_gidx(a, t.m0), a.topk, t.rows,
                        a.Ap + (size_t)t.e * RP * a.in, a.in, d);
        if (warp * 16 >= t.rows) continue;
        uint32_t u[RP / 16][4];
        lora_pack<RP>(u, acc);
        const drop_t none = {0.0f, 1.0f, 0, 0, 0};
        lora_expand<RP>(a.y + (size_t)(t.m0 + warp * 16) * a.ldy, a.ldy, t.rows - warp * 16, u,
                        a.Bp + (size_t)t.e * a.out * RP, a.out, a.scale, none);
    }
}

/* The gradient element of expert e that phase B's product at (m, rank k) feeds,
 * or NULL when it feeds none: dB (is_b; m a column of dy) belongs to the module
 * that owns column m, and only that module's ranks of it; dA (m a column of x) to
 * the module of rank k. Ranks past n_mod * R are padding. */
__device__ __forceinline__ float *grad_at(const lora_args &a, bool is_b, int e, int m, int k)
{
    if (is_b) {
        const int q = a.n_mod > 1 && m >= a.mod[1].col0 ? 1 : 0, c = m - a.mod[q].col0, kk = k - q * a.R;
        if (c < 0 || c >= a.mod[q].cols || kk < 0 || kk >= a.R) return NULL;
        return a.mod[q].dB + ((size_t)e * a.mod[q].cols + c) * a.R + kk;
    }
    const int q = k / a.R;
    if (q >= a.n_mod) return NULL;
    return a.mod[q].dA + ((size_t)e * a.R + k % a.R) * a.in + m;
}

/* Backward, cooperative: per chunk of cap rows, phase A (row tiles: u, g, dx) and
 * phase B (dB and dA^T, 128 columns per work item), a grid barrier between them. */
template <int RP>
__global__ void __launch_bounds__(lr::NTHREADS, 2) moe_lora_bwd_kernel(lora_args a)
{
    using namespace lr;
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ moe_sched sch;
    __shared__ short wg_order[MOE_MAX_E]; /* phase B: experts by rows in the chunk, most first */
    bf16 *smem = (bf16 *)dyn_smem;
    cg::grid_group grid = cg::this_grid();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const drop_t none = {0.0f, 1.0f, 0, 0, 0};
    sched_load(sch, a.offsets, a.E);
    const int lo = sch.offs[0], hi = sch.offs[a.E];
    const int nb_out = (a.out + BNB - 1) / BNB, nb = nb_out + (a.in + BNB - 1) / BNB;
    const bool need_u = !a.u_in && a.wgrad;          /* phase A's products: u for dB, g unless it came in */
    const bool phase_a = need_u || !a.g_in || a.y;    /* else u and g come in: one chunk, no grid barriers */
    for (int c0 = lo; c0 < hi; c0 += a.cap) {
        const int c1 = a.cap >= hi - c0 ? hi : c0 + a.cap;
        const int n_rt = phase_a ? sched_tiles(sch, a.E, BM, c0, c1) : 0;
        for (int rt = blockIdx.x; rt < n_rt; rt += gridDim.x) {
            const row_tile t = sched_find(sch, a.E, BM, c0, c1, rt);
            const drop_t d = lora_drop(a, sch, t.e, t.m0);
            const int rows_w = t.rows - warp * 16; /* this warp's rows */
            float acc[RP / 8][4];
            uint32_t f[RP / 16][4];
            if (need_u) { /* u = drop(x) A^T, for phase B's dB */
                lora_skinny<RP>(acc, smem, lora_x(a, t.m0), a.ldx, lora_gidx(a, t.m0), a.topk, t.rows,
                                a.Ap + (size_t)t.e * RP * a.in, a.in, d);
                lora_pack<RP>(f, acc);
                if (rows_w > 0) lora_store_rows<RP>(a.us + (size_t)(t.m0 - c0 + warp * 16) * RP, RP, f, rows_w);
            }
            if (a.g_in) continue; /* then dx is NULL: nothing needs g here */
            lora_skinny<RP>(acc, smem, a.dy + (size_t)t.m0 * a.lddy, a.lddy, NULL, 1, t.rows,
                            a.Bt + (size_t)t.e * RP * a.out, a.out, none);
            lora_pack<RP>(f, acc);
            if (rows_w > 0) {
                if (a.wgrad) lora_store_rows<RP>(a.gs + (size_t)(t.m0 - c0 + warp * 16) * RP, RP, f, rows_w);
                if (a.g_out) { /* RP columns of g, then zeros to ldg: the GEMM's LoRA k-step reads all of them */
                    bf16 *gr = a.g_out + (size_t)(t.m0 + warp * 16) * a.ldg;
                    lora_store_rows<RP>(gr, a.ldg, f, rows_w);
                    const int zc = (a.ldg - RP) / 8; /* 16-byte chunks per row past RP */
                    for (int i = lane; i < 16 * zc; i += 32)
                        if (i / zc < rows_w) *(uint4 *)(gr + (size_t)(i / zc) * a.ldg + RP + (i % zc) * 8) = uint4{};
                }
                if (a.y) {
                    drop_t dw = d;
                    dw.row0 += warp * 16;
                    lora_expand<RP>(a.y + (size_t)(t.m0 + warp * 16) * a.ldy, a.ldy, rows_w, f,
                                    a.At + (size_t)t.e * a.in * RP, a.in, a.scale, dw);
                }
            }
        }
        if (!a.wgrad) continue; /* moe_lora_g: g is out, no weight gradients */
        if (phase_a) grid.sync(); /* u and g of the whole chunk are in scratch */
        /* Phase B's items are dealt largest expert first, in snake order (even rounds
         * in block order, odd rounds reversed): the blocks that took a round's largest
         * items take the next round's smallest. Against expert-major round robin this
         * took the RP = 32 call from 730 to 605 us on qwen3-30b-a3b (docs/perf-log.md,
         * 2026-11-30, ninth session).
         * Each item's sum is unchanged, so results are bit-identical. The rank of
         * expert t counts experts with more rows, or as many and a lower id: E
         * reads of the schedule per expert, E ceil(E / 256) per thread and chunk
         * (128 at E = 128; 4096 at MOE_MAX_E, where a sort would do better). */
        for (int t = threadIdx.x; t < a.E; t += blockDim.x) {
            const int rt = max(0, min(sch.offs[t + 1], c1) - max(sch.offs[t], c0));
            int rank = 0;
            for (int e = 0; e < a.E; e++) {
                const int re = max(0, min(sch.offs[e + 1], c1) - max(sch.offs[e], c0));
                rank += re > rt || (re == rt && e < t);
            }
            wg_order[rank] = (short)t;
        }
        __syncthreads();
        const int n_items = a.E * nb, G = gridDim.x;
        for (int round = 0; round * G < n_items; round++) {
            const int it = round * G + (round & 1 ? G - 1 - (int)blockIdx.x : (int)blockIdx.x);
            if (it >= n_items) continue;
            const int e = wg_order[it / nb], j = it % nb;
            const int ra = max(sch.offs[e], c0), rb = min(sch.offs[e + 1], c1);
            if (ra >= rb) continue;
            const bool is_b = j < nb_out;
            const int n0 = (is_b ? j : j - nb_out) * BNB, ncols = is_b ? a.out : a.in;
            float acc[RP / 8][4];
            if (is_b)
                lora_wgrad<RP>(acc, smem, a.dy + (size_t)ra * a.lddy, a.lddy, NULL, 1, a.out, n0,
                               a.u_in ? a.u_in + (size_t)ra * a.ldu : a.us + (size_t)(ra - c0) * RP,
                               a.u_in ? a.ldu : RP, rb - ra, none);
            else
                lora_wgrad<RP>(acc, smem, lora_x(a, ra), a.ldx, lora_gidx(a, ra), a.topk, a.in, n0,
                               a.g_in ? a.g_in + (size_t)ra * a.ldg : a.gs + (size_t)(ra - c0) * RP,
                               a.g_in ? a.ldg : RP, rb - ra, lora_drop(a, sch, e, ra));
            /* the old values of JG rank groups loaded before their first store (the
             * compiler may not move a load past a store through another float
             * pointer): one wait per JG groups, not one per element */
            constexpr int JG = RP / 8 < 2 ? RP / 8 : 2;
#pragma unroll
            for (int j0 = 0; j0 < RP / 8; j0 += JG) {
                float *dst[JG * 4], old[JG * 4];
#pragma unroll
                for (int jj = 0; jj < JG; jj++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int q = 0; q < 2; q++) {
                            const int m = n0 + warp * 16 + g + 8 * h, k = (j0 + jj) * 8 + 2 * tq + q;
                            dst[(2 * jj + h) * 2 + q] = m < ncols ? grad_at(a, is_b, e, m, k) : NULL;
                        }
#pragma unroll
                for (int i = 0; i < JG * 4; i++) old[i] = dst[i] ? *dst[i] : 0.0f;
#pragma unroll
                for (int i = 0; i < JG * 4; i++) /* i = 4 jj + 2 h + q, as dst was filled */
                    if (dst[i]) *dst[i] = old[i] + a.scale * acc[j0 + i / 4][i % 4];
            }
        }
        if (c1 < hi) grid.sync(); /* phase B is done with the chunk's u and g (and wg_order) */
    }
}

// ---- launchers ----

static int rank_slot(int R) { return R <= 16 ? 0 : R <= 32 ? 1 : 2; }

/* Shapes, strides and alignment; the padded bf16 masters carved from scratch and
 * converted: of one module on all of y's (dy's) columns, or (backward) of n_mod
 * modules on column ranges as one LoRA of rank n_mod * R. Unless !convert: a
 * backward given u and g and no dx (moe_lora_bwd_cols after the fused forward and
 * moe_linear_lora_bwd_input) runs no phase A, so reads neither the copies nor the
 * u and g scratch (Ap, At, Bt, us and gs stay NULL). */
static lora_args lora_prepare(ct_backend *be, const char *op, bool bwd, bool convert, void *y, int ldy,
                              const void *x, int ldx, const int32_t *gather, int K, const void *dy, int lddy,
                              const ct_lora_cols *mods, int n_mod, const int32_t *offsets, int E, int in, int out,
                              int R, float scale, float p, uint64_t seed, int *RP)
{
    cuda_ctx *c = ctx_of(be);
    CT_ASSERT(E >= 1 && E <= MOE_MAX_E, "%s: E = %d experts (1..%d are supported)", op, E, MOE_MAX_E);
    CT_ASSERT(!gather || K >= 1, "%s: K = %d experts per token with a gather", op, K);
    CT_ASSERT(R >= 1 && R * n_mod <= 64, "%s: LoRA rank %d x %d modules is not supported (1..64 in all are)", op, R,
              n_mod);
    const bool whole = n_mod == 1 && mods[0].col0 == 0 && mods[0].cols == out;
    bool ranges = bwd && n_mod >= 1 && n_mod <= 2;
    for (int q = 0; ranges && q < n_mod; q++)
        ranges = mods[q].cols > 0 && mods[q].col0 >= (q ? mods[q - 1].col0 + mods[q - 1].cols : 0) &&
                 mods[q].col0 + mods[q].cols <= out;
    CT_ASSERT(whole || ranges,
              "%s: LoRA modules must cover out = %d columns, or (backward) be one or two in column order within it",
              op, out);
    CT_ASSERT(in > 0 && out > 0 && in % 8 == 0 && out % 8 == 0,
              "%s: in = %d and out = %d must be positive multiples of 8 (16-byte rows)", op, in, out);
    CT_ASSERT(ldx % 8 == 0 && ldy % 8 == 0 && (!bwd || lddy % 8 == 0) && aligned16(x) &&
              (!y || aligned16(y)) && (!bwd || aligned16(dy)),
              "%s: operands must be 16-byte aligned with row strides multiple of 8 (ldx %d, ldy %d, lddy %d)",
              op, ldx, ldy, lddy);
    CT_ASSERT(convert || (bwd && !y), "%s: only a backward without dx can skip the masters' conversion", op);
    const int rp = 16 << rank_slot(n_mod * R);
    const int cap = (int)(lr::CAP_BYTES / (2 * sizeof(bf16) * rp));
    lora_args a = {};
    bf16 *Ap = NULL, *At = NULL, *Bx = NULL; /* Bx: Bp forward, Bt backward */
    if (convert) {
        const size_t nA = (size_t)E * rp * in, nB = (size_t)E * rp * out, nug = bwd ? (size_t)cap * rp : 0;
        size_t bytes = scratch_round(nA * 2) * (bwd ? 2 : 1) + scratch_round(nB * 2) + 2 * scratch_round(nug * 2);
        scratch_carver sc = {(char *)cuda_scratch(c, bytes), 0};
        Ap = (bf16 *)scratch_take(&sc, nA * 2);
        At = bwd ? (bf16 *)scratch_take(&sc, nA * 2) : NULL;
        Bx = (bf16 *)scratch_take(&sc, nB * 2);
        a.us = bwd ? (bf16 *)scratch_take(&sc, nug * 2) : NULL;
        a.gs = bwd ? (bf16 *)scratch_take(&sc, nug * 2) : NULL;
        if (whole) {
            const size_t columns = (size_t)E * (in + out); /* the convert's threads */
            const int blocks = grid_for(columns, 256) < 8192 ? grid_for(columns, 256) : 8192;
            lora_convert_kernel<<<blocks, 256, 0, c->stream>>>(Ap, At, bwd ? NULL : Bx, bwd ? Bx : NULL, mods[0].A,
                                                               mods[0].B, E, R, rp, in, out);
            LAUNCH_CHECK();
        } else {
            lora_convert_cols(c->stream, Ap, At, Bx, mods, n_mod, E, R, rp, in, out);
        }
    }
    a.y = (bf16 *)y;
    a.x = (const bf16 *)x;
    a.gather = gather;
    a.topk = gather ? K : 1;
    a.dy = (const bf16 *)dy;
    a.Ap = Ap;
    a.At = At;
    a.Bp = bwd ? NULL : Bx;
    a.Bt = bwd ? Bx : NULL;
    a.offsets = offsets;
    a.ldy = ldy;
    a.ldx = ldx;
    a.lddy = lddy;
    a.E = E;
    a.in = in;
    a.out = out;
    a.R = R;
    a.n_mod = n_mod;
    for (int q = 0; q < n_mod; q++) a.mod[q] = {mods[q].dA, mods[q].dB, mods[q].col0, mods[q].cols};
    a.cap = cap;
    a.wgrad = bwd;
    a.scale = scale;
    a.p = p;
    a.seed = seed;
    *RP = rp;
    return a;
}

template <int RP> static void lora_fwd_launch(cuda_ctx *c, const lora_args &a)
{
    moe_lora_fwd_kernel<RP><<<c->occupancy.lora_fwd[rank_slot(RP)] * c->num_sms, lr::NTHREADS,
                              lr::smem_bytes<RP>(), c->stream>>>(a);
    LAUNCH_CHECK();
}

template <int RP> static void lora_bwd_launch(cuda_ctx *c, const lora_args &a)
{
    lora_args args = a;
    void *params[] = {&args};
    CUDA_CHECK(cudaLaunchCooperativeKernel((const void *)moe_lora_bwd_kernel<RP>,
                                           dim3(c->occupancy.lora_bwd[rank_slot(RP)] * c->num_sms),
                                           dim3(lr::NTHREADS), params, lr::smem_bytes<RP>(), c->stream));
}

static void lora_bwd_run(cuda_ctx *c, const lora_args &a, int RP)
{
    if (RP == 16) lora_bwd_launch<16>(c, a);
    else if (RP == 32) lora_bwd_launch<32>(c, a);
    else lora_bwd_launch<64>(c, a);
}

static void cuda_moe_lora_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const int32_t *gather,
                              int K, const float *A, const float *B, const int32_t *offsets, int E, int in, int out,
                              int R, float scale, float dropout_p, uint64_t dropout_seed)
{
    int RP;
    const ct_lora_cols mod = {A, B, 0, out, NULL, NULL};
    lora_args a = lora_prepare(be, "moe_lora_fwd", false, true, y, ldy, x, ldx, gather, K, NULL, 8, &mod, 1, offsets,
                               E, in, out, R, scale, dropout_p, dropout_seed, &RP);
    cuda_ctx *c = ctx_of(be);
    if (RP == 16) lora_fwd_launch<16>(c, a);
    else if (RP == 32) lora_fwd_launch<32>(c, a);
    else lora_fwd_launch<64>(c, a);
}

static void cuda_moe_lora_bwd(ct_backend *be, void *dx, int lddx, float *dA, float *dB, const void *dy, int lddy,
                              const void *x, int ldx, const int32_t *gather, int K, const float *A, const float *B,
                              const int32_t *offsets, int E, int in, int out, int R, float scale, float dropout_p,
                              uint64_t dropout_seed)
{
    int RP;
    const ct_lora_cols mod = {A, B, 0, out, dA, dB};
    lora_args a = lora_prepare(be, "moe_lora_bwd", true, true, dx, dx ? lddx : 8, x, ldx, gather, K, dy, lddy, &mod,
                               1, offsets, E, in, out, R, scale, dropout_p, dropout_seed, &RP);
    lora_bwd_run(ctx_of(be), a, RP);
}

/* Two modules sharing x as one LoRA of rank 2R (lora_prepare's conversion, phase
 * B's grad_at): x is read and dx read-modified-written once, not twice. Past rank
 * 64 in all, or for one module, the modules run one by one. With u and g given
 * (the fused forward's u, moe_linear_lora_bwd_input's g) only phase B runs: one
 * pass of weight gradients over dy, x, u and g, without grid barriers. */
static void cuda_moe_lora_bwd_cols(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, int out,
                                   const void *x, int ldx, const int32_t *gather, int K, const int32_t *offsets,
                                   int E, int in, const ct_lora_cols *lora, int n_lora, int R, float scale,
                                   const void *g, int ldg, const void *u, int ldu)
{
    CT_ASSERT(n_lora >= 1 && n_lora <= 2, "moe_lora_bwd_cols: %d LoRA modules (1..2 are supported)", n_lora);
    CT_ASSERT(!g || (!dx && n_lora * R <= 64 && ldg >= moe_u_cols(n_lora, R) && ldg % 8 == 0 && aligned16(g)),
              "moe_lora_bwd_cols: g needs dx NULL, %d <= 64 ranks in all and a 16-byte aligned ldg >= %d (%d)",
              n_lora * R, moe_u_cols(n_lora, R), ldg);
    if (!g && (n_lora == 1 || n_lora * R > 64)) {
        for (int q = 0; q < n_lora; q++)
            cuda_moe_lora_bwd(be, dx, lddx, lora[q].dA, lora[q].dB, (const bf16 *)dy + lora[q].col0, lddy, x, ldx,
                              gather, K, lora[q].A, lora[q].B, offsets, E, in, lora[q].cols, R, scale, 0.0f, 0);
        return;
    }
    /* one module on all of dy's columns keeps the one-module layout; else (or a
     * module on part of them) the modules' ranks side by side */
    int RP;
    lora_args a = lora_prepare(be, "moe_lora_bwd_cols", true, !(u && g && !dx), dx, dx ? lddx : 8, x, ldx, gather, K,
                               dy, lddy, lora, n_lora, offsets, E, in, out, R, scale, 0.0f, 0, &RP);
    CT_ASSERT(!u || (ldu >= RP && ldu % 8 == 0 && aligned16(u)),
              "moe_lora_bwd_cols: u needs a 16-byte aligned row stride >= %d (ldu %d)", RP, ldu);
    a.u_in = (const bf16 *)u;
    a.ldu = ldu;
    a.g_in = (const bf16 *)g;
    a.ldg = ldg;
    if (u && g) a.cap = INT_MAX; /* no phase A: every row in one chunk */
    lora_bwd_run(ctx_of(be), a, RP);
}

/* g alone (moe_gemm.cuh): phase A of the backward without u, dx or phase B. */
void moe_lora_g(ct_backend *be, void *g, int ldg, const void *dy, int lddy, int out, const int32_t *offsets, int E,
                int in, const ct_lora_cols *lora, int n_lora, int R)
{
    CT_ASSERT(n_lora >= 1 && n_lora <= 2 && n_lora * R <= 64 && ldg >= 64 && ldg % 8 == 0 && aligned16(g),
              "moe_lora_g: %d modules of rank %d (64 ranks in all) into a 16-byte aligned g of >= 64 columns (%d)",
              n_lora, R, ldg);
    int RP;
    lora_args a = lora_prepare(be, "moe_lora_g", true, true, NULL, 8, NULL, 8, NULL, 1, dy, lddy, lora, n_lora, offsets,
                               E, in, out, R, 1.0f, 0.0f, 0, &RP);
    a.g_out = (bf16 *)g;
    a.ldg = ldg;
    a.wgrad = false;
    lora_bwd_run(ctx_of(be), a, RP);
}

/* The kernels' blocks per SM: the persistent grid (and the cooperative one, which
 * must all be resident) is this times the SM count. */
template <int RP> static void lora_setup(moe_occupancy &o)
{
    const int i = rank_slot(RP);
    o.lora_fwd[i] = kernel_setup((const void *)moe_lora_fwd_kernel<RP>, lr::NTHREADS, lr::smem_bytes<RP>());
    o.lora_bwd[i] = kernel_setup((const void *)moe_lora_bwd_kernel<RP>, lr::NTHREADS, lr::smem_bytes<RP>());
}

void cuda_fill_moe_lora_ops(ct_backend *be)
{
    moe_occupancy &o = ctx_of(be)->occupancy;
    lora_setup<16>(o);
    lora_setup<32>(o);
    lora_setup<64>(o);
    be->moe_lora_fwd = cuda_moe_lora_fwd;
    be->moe_lora_bwd = cuda_moe_lora_bwd;
    be->moe_lora_bwd_cols = cuda_moe_lora_bwd_cols;
}
