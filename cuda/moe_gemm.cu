/* moe_gemm.cu — the grouped expert GEMMs of mixture-of-experts layers (backend.h,
 * "mixture of experts"): one launch serves every expert. The expert LoRA over the
 * same rows is moe_lora.cu; the row layout, the gather and the tile schedule both
 * files share are described in moe_gemm.cuh.
 *   moe_linear_fwd        y[r] (=|+=) x_r @ W_e^T + bias_e   W (E,out,in), bias (E,out)
 *   moe_linear_bwd_input  dx[r] (=|+=) dy[r] @ W_e
 * The input rows x_r of moe_linear_fwd are x[r], or with gather x[gather[r] / K].
 *
 * GEMM (v1). Block tile 128x128x32, 4 warps of 64x64 (4 ldmatrix.x4 per operand
 * for 32 mma per 16-deep step), mma.sync m16n8k16 (bf16 in, fp32 accumulators),
 * a 4-stage cp.async pipeline, shared rows padded by 16 bytes (conflict-free
 * ldmatrix), 2 blocks per SM (225 registers, 88 KB shared each). Forward is "NT"
 * (x rows and W_e rows both run along in); bwd_input is "NN" (W_e (out,in) is
 * reduced over out: (32,128) slabs read with ldmatrix.trans). Row tiles are
 * rastered in groups of 8 (the column tiles of 8 row tiles run together) so that
 * the x rows and W_e stay in L2. A partial row tile (an expert's last) skips the
 * ldmatrix and mma of its empty 16-row slices, which matters when experts get few
 * rows. Epilogue: fp32 acc + bias (+ the old y), rounded once. 64x64 warp tiles
 * rather than 8 warps of 64x32: those need 6 ldmatrix per 16 mma, which by
 * estimate puts shared-memory bandwidth level with mma.sync's throughput.
 * Measurements of all three versions: docs/kernels/moe_gemm.md.
 *
 * GEMM (v2). Hopper's warpgroup MMA: block tile 128x256x64, two
 * warpgroups of 64x256 (wgmma.m64n256k16, both operands from shared memory through
 * descriptors, fp32 accumulators in 128 registers per thread), 1 block per SM.
 * Copies stay cp.async (a tile's rows are scattered by the gather and cut by the
 * expert, which TMA's boxes cannot express) into the 128-byte-swizzled layout the
 * descriptors read: chunk c of row r at r*128 + ((c ^ r%8) * 16), 1024-byte-aligned
 * stages. NN keeps W_e's (k, n) layout as 4 panels of 64 columns and lets wgmma
 * transpose (MN-major B). 4 stages, loads 2 k-steps ahead, one wgmma group in
 * flight while the next loads are queued; a warpgroup with no rows in a tile (an
 * expert's last, at most 64 rows) skips its MMAs. CTUNE_MOE_GEMM=old|new|tma (read
 * when a backend is created) picks v1, v2 or moe_gemm_tma.cu's warp-specialized
 * TMA kernel (v3, the default; it copies gathered rows with cp.async);
 * bench/moe_gemm_bench.c times all three.
 * Epilogue: 16-byte stores after an in-quad transpose of the accumulators (see
 * wg_epilogue, moe_gemm_v2.cuh, which moe_gemm_lora.cu and moe_gemm_tma.cu share).
 * TMA loads, warp specialization and a staggered epilogue are moe_gemm_tma.cu's;
 * 2-CTA clusters with W multicast were tried on it and were slower
 * (docs/kernels/moe_gemm.md). */
#include "moe_gemm_v2.cuh"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

/* Blocks per SM of each kernel, measured once by cuda_fill_moe_gemm_ops: the
 * persistent grids are this times the SM count. */
static struct {
    int gemm_nt, gemm_nn, wgmma_nt, wgmma_nn;
} occupancy;

// ---- kernels ----

/* ---- grouped GEMM, v1: mma.sync ---- */

namespace gm {
constexpr int NTHREADS = 128, BM = 128, BN = 128, BK = 32, STAGES = 4, GROUP = 8;
constexpr int WM = 64, WN = 64, MI = WM / 16, NI = WN / 8; /* warps: 2 (rows) x 2 (columns) */
constexpr int LDA = BK + 8, A_ELEMS = BM * LDA;
constexpr int CH = BM * BK / 8 / NTHREADS; /* 16-byte chunks per thread per operand and stage */
template <bool NN> __host__ __device__ constexpr int ldb() { return NN ? BN + 8 : BK + 8; }
template <bool NN> __host__ __device__ constexpr int stage_elems() { return A_ELEMS + (NN ? BK : BN) * ldb<NN>(); }
template <bool NN> constexpr size_t smem_bytes() { return (size_t)STAGES * stage_elems<NN>() * sizeof(bf16); }
}

/* One 128x128 output tile of expert t.e at columns n0. FULL: all 128 rows exist. */
template <bool NN, bool FULL>
__device__ __forceinline__ void gemm_tile(const gemm_args &p, bf16 *smem, const row_tile &t, int n0)
{
    using namespace gm;
    constexpr int LDB = ldb<NN>(), STAGE = stage_elems<NN>();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
    const bf16 *w = p.W + (size_t)t.e * p.N * p.K;
    /* 16-row slices of this warp that hold rows (the rest skip ldmatrix and mma). */
    const int live = FULL ? MI : min(MI, max(0, (t.rows - wm * WM + 15) / 16));

    /* Chunk i of this thread: input row ar + 32 i at column akc (a_src[i], NULL past
     * the tile's rows); W (NT) row n0 + ar + 32 i at column akc, or (NN) row bk + 8 i
     * at column n0 + bnc. */
    const int ar = tid >> 2, akc = (tid & 3) * 8, bk = tid >> 4, bnc = (tid & 15) * 8;
    const bf16 *a_src[CH];
#pragma unroll
    for (int i = 0; i < CH; i++) a_src[i] = FULL || ar + 32 * i < t.rows ? gemm_row(p, t, ar + 32 * i, akc) : NULL;
    const bf16 *b_src = NN ? w + (size_t)bk * p.N + n0 + bnc : w + (size_t)(n0 + ar) * p.K + akc;
    const size_t b_step = NN ? (size_t)8 * p.N : (size_t)32 * p.K;
    const bool bn_ok = NN ? n0 + bnc < p.N : true;
    auto load = [&](int stage, int kt) {
        bf16 *s = smem + stage * STAGE;
        const int k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < CH; i++) {
            const bool ok = a_src[i] && k0 + akc < p.K;
            cp_async16(s + (ar + 32 * i) * LDA + akc, ok ? a_src[i] + k0 : p.x, ok);
        }
#pragma unroll
        for (int i = 0; i < CH; i++) {
            if (!NN) {
                const bool ok = n0 + ar + 32 * i < p.N && k0 + akc < p.K;
                cp_async16(s + A_ELEMS + (ar + 32 * i) * LDB + akc, ok ? b_src + i * b_step + k0 : w, ok);
            } else {
                const bool ok = bn_ok && k0 + bk + 8 * i < p.K;
                cp_async16(s + A_ELEMS + (bk + 8 * i) * LDB + bnc, ok ? b_src + i * b_step + (size_t)k0 * p.N : w, ok);
            }
        }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[mi][ni][j] = 0.0f;

    const int KT = (p.K + BK - 1) / BK;
    cp_async_prologue<STAGES>(load, KT);
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* stage kt landed; stage kt-1 is free (everyone computed it) */
        if (kt + STAGES - 1 < KT) load((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        cp_async_commit();
        const bf16 *sa = smem + (kt % STAGES) * STAGE, *sb = sa + A_ELEMS;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t a[MI][4], b[NI][2];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
                if (mi < live) ldsm_x4(a[mi], sa + (wm * WM + mi * 16 + (lane & 15)) * LDA + kk + (lane >> 4) * 8);
#pragma unroll
            for (int nj = 0; nj < NI / 2; nj++) {
                uint32_t r[4];
                if (!NN)
                    ldsm_x4(r, sb + (wn * WN + nj * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDB + kk +
                                   ((lane >> 3) & 1) * 8);
                else
                    ldsm_x4_t(r, sb + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * LDB + wn * WN + nj * 16 +
                                     (lane >> 4) * 8);
                b[2 * nj][0] = r[0];
                b[2 * nj][1] = r[1];
                b[2 * nj + 1][0] = r[2];
                b[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                if (mi >= live) continue;
#pragma unroll
                for (int ni = 0; ni < NI; ni++) mma16816(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
            }
        }
    }
    cp_async_wait<0>();

    const bf16 *bias = p.bias ? p.bias + (size_t)t.e * p.N : NULL;
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) {
        const int col = n0 + wn * WN + ni * 8 + 2 * tq;
        if (col >= p.N) continue; /* N % 8 == 0: col + 1 < N too */
        float b0 = 0.0f, b1 = 0.0f;
        if (bias) {
            float2 bb = __bfloat1622float2(*(const __nv_bfloat162 *)(bias + col));
            b0 = bb.x;
            b1 = bb.y;
        }
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = wm * WM + mi * 16 + g + 8 * h;
                if (!FULL && r >= t.rows) continue;
                __nv_bfloat162 *dst = (__nv_bfloat162 *)(p.y + (size_t)(t.m0 + r) * p.ldy + col);
                float v0 = acc[mi][ni][2 * h] + b0, v1 = acc[mi][ni][2 * h + 1] + b1;
                if (p.accumulate) {
                    float2 o = __bfloat1622float2(*dst);
                    v0 += o.x;
                    v1 += o.y;
                }
                *dst = __floats2bfloat162_rn(v0, v1);
            }
    }
    __syncthreads(); /* the next tile's prologue overwrites the stages */
}

template <bool NN>
__global__ void __launch_bounds__(gm::NTHREADS, 2) moe_gemm_kernel(gemm_args p)
{
    using namespace gm;
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ moe_sched sch;
    bf16 *smem = (bf16 *)dyn_smem;
    sched_load(sch, p.offsets, p.E);
    const int n_rt = sched_tiles(sch, p.E, BM, INT_MIN, INT_MAX);
    const int n_ct = (p.N + BN - 1) / BN, per_group = GROUP * n_ct, total = n_rt * n_ct;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        const int group = tile / per_group, first = group * GROUP, rows_g = min(GROUP, n_rt - first);
        const int local = tile - group * per_group, rt = first + local % rows_g, ct = local / rows_g;
        const row_tile t = sched_find(sch, p.E, BM, INT_MIN, INT_MAX, rt);
        if (t.rows == BM) gemm_tile<NN, true>(p, smem, t, ct * BN);
        else gemm_tile<NN, false>(p, smem, t, ct * BN);
    }
}

/* ---- grouped GEMM, v2: wgmma ----
 * Block tile 128x256x64, two warpgroups (one per 64 rows, each the full 256 columns
 * with m64n256k16), cp.async into 128-byte-swizzled stages, 4 stages with loads 2
 * steps ahead (see moe_wgmma_kernel), 1 block per SM. Its arguments, constants,
 * loads and epilogue are in moe_gemm_v2.cuh (moe_gemm_lora.cu reuses them). */

/* Persistent: block b takes tiles b, b + grid, ...; their k-steps form one stream
 * (step s = k-step s % KT of the block's tile s / KT), loaded AHEAD steps ahead,
 * across tile boundaries, so the next tile's first loads fly during this tile's
 * last steps and epilogue. Step s: wait for its stage, barrier, issue its wgmmas
 * (async), queue the loads of step s + AHEAD into the stage step s - 2 used, then
 * wait until at most one wgmma group (step s's) is in flight. The barrier of step
 * s comes after every warpgroup waited on step s - 2's wgmmas, hence the stage is
 * free. A warpgroup whose 64 rows are all past the tile's rows (an expert's last,
 * partial tile) skips its wgmmas and stores. Tiles and k-steps are two nested
 * loops, not one flat loop over steps: with the epilogue inside the step loop,
 * ptxas inserts a wait for all wgmmas at every step (C7517), which serializes them. */
template <bool NN>
__global__ void __launch_bounds__(wg::NTHREADS, 1) moe_wgmma_kernel(gemm_args p)
{
    using namespace wg;
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ moe_sched sch;
    const uint32_t smem0 = ((uint32_t)__cvta_generic_to_shared(dyn_smem) + 1023u) & ~1023u;
    const int wgi = threadIdx.x >> 7;
    sched_load(sch, p.offsets, p.E);
    const int n_rt = sched_tiles(sch, p.E, BM, INT_MIN, INT_MAX);
    const int n_ct = (p.N + BN - 1) / BN, total = n_rt * n_ct, KT = (p.K + BK - 1) / BK;
    const int mine = (int)blockIdx.x < total ? (total - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int steps = mine * KT; /* of this block */

    wg_loads<NN> ld;
    int l_step = 0, l_kt = 0, l_tile = blockIdx.x;
    auto load_next = [&]() { /* step l_step into its stage, then one commit group (empty past the end) */
        if (l_step < steps) {
            if (l_kt == 0) {
                int rt, ct;
                tile_coords(l_tile, n_rt, n_ct, GROUP, rt, ct);
                wg_loads_init<NN>(ld, p, sched_find(sch, p.E, BM, INT_MIN, INT_MAX, rt), ct * BN);
            }
            wg_load_stage<NN>(ld, p, smem0 + (l_step % STAGES) * STAGE_BYTES, l_kt);
            l_step++;
            if (++l_kt == KT) {
                l_kt = 0;
                l_tile += gridDim.x;
            }
        }
        cp_async_commit();
    };

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < AHEAD; i++) load_next();
    int s = 0; /* this block's step */
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        int rt, ct;
        tile_coords(tile, n_rt, n_ct, GROUP, rt, ct);
        const row_tile t = sched_find(sch, p.E, BM, INT_MIN, INT_MAX, rt);
        const int n0 = ct * BN;
        const bool live = wgi * 64 < t.rows;
        for (int kt = 0; kt < KT; kt++, s++) {
            cp_async_wait<AHEAD - 1>();
            fence_proxy_async();
            __syncthreads();
            if (live) {
                const uint32_t sa = smem0 + (s % STAGES) * STAGE_BYTES + wgi * 64 * ROW_BYTES;
                const uint32_t sb = smem0 + (s % STAGES) * STAGE_BYTES + A_BYTES;
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < BK / 16; ks++) {
                    const uint64_t da = wgmma_desc(sa + ks * 32, 16, 1024);
                    wgmma_m64n256k16_ss<NN>(acc, da, wg_b_desc<NN>(sb, ks), kt > 0 || ks > 0);
                }
                wgmma_commit();
            }
            load_next();
            wgmma_wait<1>();
        }
        wgmma_wait<0>();
        wgmma_acc_fence(acc);
        if (live) wg_epilogue(p, acc, t.e, t.m0, 0, t.rows, n0, wgi);
    }
    cp_async_wait<0>();
}

// ---- launchers ----

void moe_gemm_check(const char *op, const void *y, int ldy, const void *x, int ldx, const void *W, const void *bias,
                    int E, int in, int out)
{
    CT_ASSERT(E >= 1 && E <= MOE_MAX_E, "%s: E = %d experts (1..%d are supported)", op, E, MOE_MAX_E);
    CT_ASSERT(in > 0 && out > 0 && in % 8 == 0 && out % 8 == 0,
              "%s: in = %d and out = %d must be positive multiples of 8 (16-byte rows)", op, in, out);
    CT_ASSERT(ldx % 8 == 0 && ldy % 8 == 0 && aligned16(x) && aligned16(y) && aligned16(W),
              "%s: operands must be 16-byte aligned with row strides multiple of 8 (ldx %d, ldy %d)", op, ldx, ldy);
    CT_ASSERT(!bias || ((uintptr_t)bias & 3) == 0, "%s: bias must be 4-byte aligned", op);
}

/* V 1: mma.sync (moe_gemm_kernel); V 2: wgmma (moe_wgmma_kernel); V 3: TMA
 * (moe_gemm_tma.cu; a gathered x is copied there by its producer warpgroup). */
template <int V> static void moe_gemm_launch(ct_backend *be, bool nn, const gemm_args &p)
{
    cuda_ctx *c = ctx_of(be);
    if (V == 3) {
        moe_gemm_tma(p, nn, NULL, c->num_sms, c->stream);
        return;
    }
    if (V >= 2 && nn)
        moe_wgmma_kernel<true><<<occupancy.wgmma_nn * c->num_sms, wg::NTHREADS, wg::smem_bytes(), c->stream>>>(p);
    else if (V >= 2)
        moe_wgmma_kernel<false><<<occupancy.wgmma_nt * c->num_sms, wg::NTHREADS, wg::smem_bytes(), c->stream>>>(p);
    else if (nn)
        moe_gemm_kernel<true><<<occupancy.gemm_nn * c->num_sms, gm::NTHREADS, gm::smem_bytes<true>(), c->stream>>>(p);
    else
        moe_gemm_kernel<false><<<occupancy.gemm_nt * c->num_sms, gm::NTHREADS, gm::smem_bytes<false>(), c->stream>>>(
            p);
    LAUNCH_CHECK();
}

template <int V>
static void cuda_moe_linear_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const int32_t *gather,
                                int K, const void *W, const void *bias, const int32_t *offsets, int E, int in, int out,
                                int accumulate)
{
    moe_gemm_check("moe_linear_fwd", y, ldy, x, ldx, W, bias, E, in, out);
    CT_ASSERT(!gather || K >= 1, "moe_linear_fwd: K = %d experts per token with a gather", K);
    gemm_args p = {(bf16 *)y, (const bf16 *)x, gather, (const bf16 *)W, (const bf16 *)bias, offsets,
                   ldy, ldx, gather ? K : 1, E, out, in, accumulate};
    moe_gemm_launch<V>(be, false, p);
}

template <int V>
static void cuda_moe_linear_bwd_input(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                                      const void *W, const int32_t *offsets, int E, int in, int out,
                                      int accumulate)
{
    moe_gemm_check("moe_linear_bwd_input", dx, lddx, dy, lddy, W, NULL, E, in, out);
    gemm_args p = {(bf16 *)dx, (const bf16 *)dy, NULL, (const bf16 *)W, NULL, offsets, lddx, lddy, 1, E, in, out,
                   accumulate};
    moe_gemm_launch<V>(be, true, p);
}

/* The stacked, scaled A of moe_linear_lora_bwd_input when g comes from
 * moe_lora_g: dst (E, rows, in) bf16, row q R + k of expert e = scale * A_q[e, k,
 * :], rows from n R on zero. One thread per (expert, column): each row's element,
 * coalesced across columns. */
struct lora_stack {
    const float *A[2];
    int n;
};

__global__ void lora_stack_kernel(bf16 *dst, lora_stack ls, int E, int R, int rows, int in, float scale)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < E * in; i += gridDim.x * blockDim.x) {
        const int e = i / in, c = i - e * in;
        bf16 *d = dst + (size_t)e * rows * in + c;
        for (int k = 0; k < rows; k++) {
            const int q = k / R;
            const float a = q < ls.n ? scale * ls.A[q][((size_t)e * R + k % R) * in + c] : 0.0f;
            d[(size_t)k * in] = __float2bfloat16_rn(a);
        }
    }
}

static int grid_cap(size_t threads) { return grid_for(threads, 256) < 8192 ? grid_for(threads, 256) : 8192; }

/* Whether g is computed inside the TMA GEMM (every column tile of dx recomputes
 * its rows' g: extra MMAs in proportion to the input width) rather than by
 * moe_lora_g (one more pass over dy). Measured on the H200 (bench/moe_layer_bench,
 * one MoE layer forward + backward): qwen3-30b-a3b (in 2048 at 32 ranks and 768
 * at 16) 6.33 ms with moe_lora_g, 6.18 with g in the GEMM; gpt-oss-20b (in 2880
 * at 16 ranks, both projections) 13.90 ms with moe_lora_g, 14.48 in the GEMM. */
#define MOE_G_IN_GEMM_MAX_IN 2048
static bool g_in_gemm(int in, int RP) { return moe_gemm_tma_fuses(RP) && in <= MOE_G_IN_GEMM_MAX_IN; }

/* dx = dy W_e + scale * g [A_1,e; A_2,e] with g = dy [B_1,e; B_2,e] (backend.h).
 * V 3 where g_in_gemm: one TMA GEMM computes g beside the product
 * (moe_gemm_tma_lora, the modules as one LoRA of rank RP: Au = the stacked B^T, Bu
 * = the stacked A, from lora_convert_cols), adds its term before the
 * epilogue and stores g. Else g by moe_lora_g, then V 3: the TMA GEMM with the
 * term as one more k-step; V 1, 2: the grouped GEMM and a second one, g (scale A). */
template <int V>
static void cuda_moe_linear_lora_bwd_input(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                                           const void *W, const int32_t *offsets, int E, int in, int out,
                                           int accumulate, void *g, int ldg, const ct_lora_cols *lora,
                                           int n_lora, int R, float scale)
{
    const char *op = "moe_linear_lora_bwd_input";
    moe_gemm_check(op, dx, lddx, dy, lddy, W, NULL, E, in, out);
    CT_ASSERT(n_lora >= 1 && n_lora <= 2 && R >= 1 && n_lora * R <= 64,
              "%s: %d LoRA modules of rank %d (1..2 modules, 64 ranks in all are supported)", op, n_lora, R);
    CT_ASSERT(ldg >= 64 && ldg % 8 == 0 && aligned16(g), "%s: g needs a 16-byte aligned row stride >= 64 (%d)", op,
              ldg);
    cuda_ctx *c = ctx_of(be);
    const int RP = moe_u_cols(n_lora, R);
    gemm_args p = {(bf16 *)dx, (const bf16 *)dy, NULL, (const bf16 *)W, NULL, offsets, lddx, lddy, 1, E, in, out,
                   accumulate};
    if (V == 3 && g_in_gemm(in, RP)) {
        const size_t nA = (size_t)E * RP * in, nB = (size_t)E * RP * out;
        scratch_carver sc = {(char *)cuda_scratch(c, scratch_round(nA * 2) + scratch_round(nB * 2)), 0};
        bf16 *Ap = (bf16 *)scratch_take(&sc, nA * 2), *Bt = (bf16 *)scratch_take(&sc, nB * 2);
        lora_convert_cols(c->stream, Ap, NULL, Bt, lora, n_lora, E, R, RP, in, out);
        fused_lora f = {};
        f.Au[0] = Bt;
        f.Bu[0] = Ap;
        f.col0[0] = 0;
        f.cols[0] = in;
        f.n_mod = 1;
        f.R = RP;
        f.RP = RP;
        f.ucols = RP; /* g's padded ranks too (zero: Bt's are), as moe_lora_bwd_cols reads them */
        f.ldu = ldg;
        f.scale = scale;
        f.u = (bf16 *)g;
        moe_gemm_tma_lora(p, true, f, c->num_sms, c->stream);
        return;
    }
    moe_lora_g(be, g, ldg, dy, lddy, out, offsets, E, in, lora, n_lora, R);
    const int rows = V == 3 ? 64 : RP; /* the k-step reads 64 columns of g; the second GEMM RP */
    const size_t nA = (size_t)E * rows * in;
    bf16 *A = (bf16 *)cuda_scratch(c, nA * sizeof(bf16));
    lora_stack ls = {{lora[0].A, n_lora > 1 ? lora[1].A : NULL}, n_lora};
    lora_stack_kernel<<<grid_cap((size_t)E * in), 256, 0, c->stream>>>(A, ls, E, R, rows, in, scale);
    LAUNCH_CHECK();
    if (V == 3) {
        const tma_lora tl = {(const bf16 *)g, A, ldg};
        moe_gemm_tma(p, true, &tl, c->num_sms, c->stream);
        return;
    }
    moe_gemm_launch<V>(be, true, p);
    const gemm_args pa = {(bf16 *)dx, (const bf16 *)g, NULL, A, NULL, offsets, lddx, ldg, 1, E, in, RP, 1};
    moe_gemm_launch<V>(be, true, pa);
}

/* The grouped GEMM version a new backend uses: CTUNE_MOE_GEMM=tma (v3, the
 * default: 1.3-1.5x v2 on the non-gathered calls on the H200), new (v2 for every
 * call) or old (v1), read when a backend is created (cuda_fill_moe_gemm_ops and
 * cuda_fill_moe_gemm_lora_ops); anything else is refused by name. */
int moe_gemm_version(void)
{
    const char *v = getenv("CTUNE_MOE_GEMM");
    if (!v || !*v || !strcmp(v, "tma")) return 3;
    if (!strcmp(v, "new")) return 2;
    if (!strcmp(v, "old")) return 1;
    fprintf(stderr, "ctune: CTUNE_MOE_GEMM=%s is not tma, new or old\n"
                    "HINT: unset it (the default is tma), or set new for the cp.async wgmma grouped GEMM or old for\n"
                    "      the mma.sync one\n", v);
    exit(CT_ERR_INPUT);
}

void cuda_fill_moe_gemm_ops(ct_backend *be)
{
    occupancy.gemm_nt = kernel_setup((const void *)moe_gemm_kernel<false>, gm::NTHREADS, gm::smem_bytes<false>());
    occupancy.gemm_nn = kernel_setup((const void *)moe_gemm_kernel<true>, gm::NTHREADS, gm::smem_bytes<true>());
    occupancy.wgmma_nt = kernel_setup((const void *)moe_wgmma_kernel<false>, wg::NTHREADS, wg::smem_bytes());
    occupancy.wgmma_nn = kernel_setup((const void *)moe_wgmma_kernel<true>, wg::NTHREADS, wg::smem_bytes());
    const int v = moe_gemm_version();
    if (v == 3) moe_gemm_tma_init();
    be->moe_linear_fwd = v == 3 ? cuda_moe_linear_fwd<3> : v == 2 ? cuda_moe_linear_fwd<2> : cuda_moe_linear_fwd<1>;
    be->moe_linear_bwd_input = v == 3   ? cuda_moe_linear_bwd_input<3>
                               : v == 2 ? cuda_moe_linear_bwd_input<2>
                                        : cuda_moe_linear_bwd_input<1>;
    be->moe_linear_lora_bwd_input = v == 3   ? cuda_moe_linear_lora_bwd_input<3>
                                    : v == 2 ? cuda_moe_linear_lora_bwd_input<2>
                                             : cuda_moe_linear_lora_bwd_input<1>;
}
