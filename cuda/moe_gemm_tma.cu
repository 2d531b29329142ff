/* moe_gemm_tma.cu — the grouped expert GEMM (moe_gemm.cu's ops, CTUNE_MOE_GEMM=tma)
 * in the warp-specialized form of attention_fwd_sm90_2wg.cu: a producer warpgroup
 * loads every operand with TMA into an mbarrier-guarded ring, two consumer
 * warpgroups multiply. It covers moe_linear_fwd without a gather and
 * moe_linear_bwd_input; a gathered forward scatters a tile's rows over x, which a
 * 2-D box cannot follow (sm_90 has no TMA gather), so moe_gemm.cu sends those
 * calls to v2. The default since it was measured on the H200 (1.3-1.5x v2).
 *
 * Why. v2 (moe_wgmma_kernel) reaches 410-465 TFLOP/s on qwen3-30b-a3b's shapes
 * where one dense cuBLAS GEMM of the same size reaches 700-800: its MMA warps also
 * issue the cp.async copies and meet at a block barrier every k-step, and no MMA
 * runs while a tile's results are stored.
 *
 * Block: 384 threads, one block per multiprocessor, persistent over the tile list
 * of moe_gemm.cuh (128 x 256 tiles, row tiles rastered in groups of 8 as v2).
 *   warpgroup 0, the producer, gives registers back (setmaxnreg.dec to 40); one
 *     thread walks the block's tiles and k-steps and, per step, waits until the
 *     stage is empty, announces its bytes and issues the boxes: A (128 rows x 64
 *     columns of x or dy) and B (W_e: NT one 256 x 64 box, NN four 64 x 64
 *     panels).
 *   warpgroups 1 and 2, the consumers (setmaxnreg.inc to 232), own tile rows
 *     [0, 64) and [64, 128): per step they wait for the stage, issue four
 *     wgmma.m64n256k16 (both operands from shared memory, as v2), retire the
 *     previous step's group and release its stage; after a tile's last step they
 *     store their 64 x 256 results straight from the accumulators (wg_epilogue).
 * Overlap. Loads run up to STAGES steps ahead of the MMAs, across tiles, so the
 * next tile's operands land during this tile's last steps and stores. The epilogue
 * overlaps MMAs by a stagger: consumer 1 starts once consumer 0's first LAG
 * k-steps have finished (named barrier BAR_LAG, once per block). The consumers
 * then run LAG steps apart; when consumer 0 stores a tile, consumer 1 still has
 * LAG steps of MMAs to run alone, and when consumer 1 stores, consumer 0 is
 * already on the next tile. The stagger costs consumer 0 LAG stages of look-ahead
 * (a stage is refilled only once both consumers released it). LAG = 1 (about
 * 512 cycles of MMAs alone, of the order of one epilogue) is a guess to measure.
 *
 * Rows and experts. A tile is rows [m0, m0 + rows) of one expert, rows <= 128; the
 * expert's end is only on the device and the last expert's end is n, which the
 * host never learns, so the tensor map of A cannot clip at either. Choice: the A
 * box of a tile ends at the tile's last row (it starts at a0 = m0 + rows - 128),
 * so no box ever reaches past row n; tile row r of the box is y row a0 + r, and
 * rows r < 128 - rows (the previous tile's or expert's rows, or negative
 * coordinates, which TMA zero-fills) are computed but never stored. One host map
 * then serves every tile, with a nominal extent of INT_MAX rows (offsets are int32)
 * that no box reaches. The alternative, per-tile (or per-expert) maps clipped at
 * the expert's end, needs device-side tensormap.replace into global memory with
 * proxy fences per tile, and a map workspace: more to get wrong, no fewer MMAs.
 * A consumer whose 64 rows all lie before the tile's first row (rows <= 64 for
 * consumer 0) skips its MMAs and stores, but still waits for and releases every
 * stage, so the ring's phases stay in step. W's maps are 3-D (in, out, E): a box
 * past N or K within an expert is zero-filled instead of reading the next
 * expert's W. NN panels wholly past N are not loaded (their columns are not
 * stored); every other box counts its full bytes, zero-filled parts included.
 *
 * Synchronization (mbarriers, hopper_sync.cuh). full[s]: 1 arrival (the
 * producer's arrive.expect_tx) + the stage's TMA bytes. empty[s]: 256 arrivals
 * (every consumer thread, after the wgmma that read the stage retired). Step i of
 * the block uses stage i % STAGES; its full wait is for parity (i / STAGES) & 1,
 * the producer's empty wait (i >= STAGES) for parity ((i / STAGES) & 1) ^ 1, the
 * consumers' release of step i - 1 of the use before. Both roles walk the same
 * steps (tiles blockIdx.x, + gridDim.x, ..., KT steps each).
 *
 * Budgets. Shared memory: STAGES = 4 stages of 48 KB (A 16 KB, B 32 KB; 1024-byte
 * aligned, 128-byte swizzle, v2's layout, which TMA's SWIZZLE_128B writes) + 8
 * mbarriers + 1 KB alignment slack = 193 KB dynamic, + the 8 KB schedule: 201 KB
 * of 227. Registers: launched at 168 a thread (384 threads, one block per
 * multiprocessor); 40 + 2 x 232 = 3 x 168, so the producer's .dec serves the
 * consumers' .inc. A consumer holds 128 fp32 accumulators.
 * ptxas and cuobjdump (CUDA 13, sm_90a), both instantiations: 168 registers, no
 * spills, no wgmma serialization warning (C7510/C7514/C7515); the consumers' code
 * uses registers up to R172 (of 232), the producer's up to R6 (of 40); one
 * WARPGROUP.DEPBAR per k-step (the wait for the previous group) and one per tile;
 * 197,696 bytes of dynamic and 8,208 of static shared memory. */
#include "moe_gemm_v2.cuh"
#include "hopper_sync.cuh"

#include <climits>
#include <cstdio>

namespace tma {
constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4, GROUP = 8;
constexpr int BLOCK = 3 * 128;                         /* producer + two consumer warpgroups */
constexpr int CONSUMERS = 2 * 128;                     /* consumer threads: empty[s]'s arrivals */
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232; /* 40 + 2 x 232 = 3 x 168 */
constexpr int LAG = 1;                                 /* k-steps consumer 1 starts behind consumer 0 */
constexpr int BAR_LAG = 1;                             /* named barrier of the stagger */
constexpr uint32_t ROW_BYTES = BK * 2;                 /* one swizzled row: 128 bytes */
constexpr uint32_t A_BYTES = BM * ROW_BYTES, B_BYTES = BN * ROW_BYTES, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr uint32_t NN_PANEL = BK * ROW_BYTES;          /* NN: B as 4 panels of 64 columns x BK rows */
constexpr size_t smem_bytes() { return (size_t)STAGES * STAGE_BYTES + 2 * STAGES * 8 + 1024; }

/* The ring's mbarriers, 8 bytes each after the stages. */
struct ring {
    uint32_t base;
    __device__ uint32_t full(int s) const { return base + 8 * s; }
    __device__ uint32_t empty(int s) const { return base + 8 * (STAGES + s); }
};
}

/* Blocks per SM (1, checked by kernel_setup) of each instantiation. */
static int occupancy_nt, occupancy_nn;

// ---- kernels ----

/* The producer thread: every k-step of the block's tiles into the ring. */
template <bool NN>
__device__ __forceinline__ void tma_produce(const CUtensorMap *ta, const CUtensorMap *tb, const CUtensorMap *tg,
                                            const CUtensorMap *tl, const moe_sched &sch, const gemm_args &p,
                                            uint32_t smem0, tma::ring rg, int n_rt, int n_ct, int total, int KT,
                                            int lora_steps)
{
    using namespace tma;
    int i = 0; /* the block's step */
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        int rt, ct;
        tile_coords(tile, n_rt, n_ct, GROUP, rt, ct);
        const row_tile t = sched_find(sch, p.E, BM, INT_MIN, INT_MAX, rt);
        const int a0 = t.m0 + t.rows - BM, n0 = ct * BN; /* the A box ends at the tile's last row */
        /* NN: panels holding a column < N (the rest are never stored, so never loaded). */
        const int panels = NN ? min(BN / 64, (p.N - n0 + 63) / 64) : 0;
        const uint32_t bytes = NN ? A_BYTES + panels * NN_PANEL : STAGE_BYTES;
        for (int kt = 0; kt < KT + lora_steps; kt++, i++) {
            const int s = i % STAGES;
            if (i >= STAGES) mbar_wait(rg.empty(s), ((i / STAGES) & 1) ^ 1);
            mbar_arrive_expect_tx(rg.full(s), bytes);
            const uint32_t sa = smem0 + s * STAGE_BYTES, sb = sa + A_BYTES;
            if (kt == KT) { /* the LoRA step (NN only): g's 64 columns, A's 64 rows */
                tma_load_2d(sa, tg, 0, a0, rg.full(s));
                for (int pn = 0; pn < panels; pn++)
                    tma_load_3d(sb + pn * NN_PANEL, tl, n0 + 64 * pn, 0, t.e, rg.full(s));
                continue;
            }
            tma_load_2d(sa, ta, kt * BK, a0, rg.full(s));
            if (!NN) {
                tma_load_3d(sb, tb, kt * BK, n0, t.e, rg.full(s));
            } else {
                for (int pn = 0; pn < panels; pn++)
                    tma_load_3d(sb + pn * NN_PANEL, tb, n0 + 64 * pn, kt * BK, t.e, rg.full(s));
            }
        }
    }
}

/* Consumer c (0 or 1): tile rows [64 c, 64 c + 64) of every tile of the block. */
template <bool NN>
__device__ __forceinline__ void tma_consume(const moe_sched &sch, const gemm_args &p, uint32_t smem0, tma::ring rg,
                                            int n_rt, int n_ct, int total, int KT, int c)
{
    using namespace tma;
    const int mine = (int)blockIdx.x < total ? (total - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int steps = mine * KT, lag_step = min(LAG, steps - 1);
    float acc[128];
#pragma unroll
    for (int j = 0; j < 128; j++) acc[j] = 0.0f;
    if (c == 1 && steps > 0) bar_sync<CONSUMERS>(BAR_LAG);
    int i = 0; /* the block's step, as the producer's */
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        int rt, ct;
        tile_coords(tile, n_rt, n_ct, GROUP, rt, ct);
        const row_tile t = sched_find(sch, p.E, BM, INT_MIN, INT_MAX, rt);
        const int a0 = t.m0 + t.rows - BM, n0 = ct * BN, lo = BM - t.rows; /* tile rows >= lo are stored */
        const bool live = 64 * c + 63 >= lo;
        for (int kt = 0; kt < KT; kt++, i++) {
            const int s = i % STAGES;
            mbar_wait(rg.full(s), (i / STAGES) & 1);
            if (live) {
                const uint32_t sa = smem0 + s * STAGE_BYTES + c * 64 * ROW_BYTES;
                const uint32_t sb = smem0 + s * STAGE_BYTES + A_BYTES;
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < BK / 16; ks++) {
                    const uint64_t da = wgmma_desc(sa + ks * 32, 16, 1024);
                    const uint64_t db = NN ? wgmma_desc(sb + ks * 16 * ROW_BYTES, NN_PANEL, 1024)
                                           : wgmma_desc(sb + ks * 32, 16, 1024);
                    wgmma_m64n256k16_ss<NN>(acc, da, db, kt > 0 || ks > 0);
                }
                wgmma_commit();
            }
            wgmma_wait<1>(); /* step i - 1's group retired: its stage is free */
            if (kt > 0) mbar_arrive(rg.empty((i - 1) % STAGES));
            if (c == 0 && i == lag_step) bar_arrive<CONSUMERS>(BAR_LAG);
        }
        wgmma_wait<0>();
        mbar_arrive(rg.empty((i - 1) % STAGES)); /* the tile's last step */
        wgmma_acc_fence(acc);
        if (live) wg_epilogue(p, acc, t.e, a0, lo, BM, n0, c);
    }
}

/* lora_steps (0 or 1, nn only): one more k-step per tile from tg (g) and tl (the
 * stacked A), the LoRA input-gradient term; tg and tl are unused without it. */
template <bool NN>
__global__ void __launch_bounds__(tma::BLOCK, 1)
moe_gemm_tma_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                    const __grid_constant__ CUtensorMap tg, const __grid_constant__ CUtensorMap tl, gemm_args p,
                    int lora_steps)
{
    using namespace tma;
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ moe_sched sch;
    const uint32_t smem0 = ((uint32_t)__cvta_generic_to_shared(dyn_smem) + 1023u) & ~1023u;
    const ring rg = {smem0 + STAGES * STAGE_BYTES};
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(rg.full(s), 1);
            mbar_init(rg.empty(s), CONSUMERS);
        }
        mbar_init_fence();
    }
    sched_load(sch, p.offsets, p.E); /* its block barrier also publishes the mbarriers */
    const int n_rt = sched_tiles(sch, p.E, BM, INT_MIN, INT_MAX);
    const int n_ct = (p.N + BN - 1) / BN, total = n_rt * n_ct, KT = (p.K + BK - 1) / BK;

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) tma_produce<NN>(&ta, &tb, &tg, &tl, sch, p, smem0, rg, n_rt, n_ct, total, KT, lora_steps);
    } else {
        regs_inc<CONSUMER_REGS>();
        tma_consume<NN>(sch, p, smem0, rg, n_rt, n_ct, total, KT + lora_steps, wg - 1);
    }
}

// ---- launchers ----

void moe_gemm_tma_init(void)
{
    occupancy_nt = kernel_setup((const void *)moe_gemm_tma_kernel<false>, tma::BLOCK, tma::smem_bytes());
    occupancy_nn = kernel_setup((const void *)moe_gemm_tma_kernel<true>, tma::BLOCK, tma::smem_bytes());
    (void)tensor_map_encoder(); /* a driver without one fails here, not mid-training */
}

void moe_gemm_tma(const gemm_args &p, bool nn, const tma_lora *lora, int num_sms, cudaStream_t st)
{
    using namespace tma;
    CT_ASSERT(!p.gather, "moe_gemm_tma: a gathered input needs the cp.async kernel (v2)");
    CT_ASSERT(occupancy_nt > 0, "moe_gemm_tma: moe_gemm_tma_init was not called");
    CT_ASSERT(!lora || (nn && lora->ldg >= 64 && lora->ldg % 8 == 0),
              "moe_gemm_tma: the LoRA step needs bwd_input and g rows of >= 64 columns (ldg %d)", lora ? lora->ldg : 0);
    /* A: (rows, K) at stride ldx; INT_MAX rows, an extent no box reaches (each ends
     * at its tile's last row, < n). */
    const cuuint64_t a_dim[2] = {(cuuint64_t)p.K, (cuuint64_t)INT_MAX}, a_stride[1] = {(cuuint64_t)p.ldx * 2};
    const cuuint32_t a_box[2] = {BK, BM};
    const CUtensorMap ta = tensor_map_bf16(p.x, 2, a_dim, a_stride, a_box);
    /* W (E, out, in) as 3-D: NT (K, N, E) in boxes of 64 x 256 (k, n); NN (N, K, E)
     * in panels of 64 x 64 (n, k). */
    const cuuint64_t w_dim_nt[3] = {(cuuint64_t)p.K, (cuuint64_t)p.N, (cuuint64_t)p.E};
    const cuuint64_t w_dim_nn[3] = {(cuuint64_t)p.N, (cuuint64_t)p.K, (cuuint64_t)p.E};
    const cuuint64_t w_stride[2] = {(cuuint64_t)(nn ? p.N : p.K) * 2, (cuuint64_t)p.N * p.K * 2};
    const cuuint32_t b_box_nt[3] = {BK, BN, 1}, b_box_nn[3] = {64, BK, 1};
    const CUtensorMap tb = tensor_map_bf16(p.W, 3, nn ? w_dim_nn : w_dim_nt, w_stride, nn ? b_box_nn : b_box_nt);
    /* The LoRA step: g as A (64 columns, the box's width, at stride ldg), the
     * stacked A (E, 64, in) as NN panels (in, 64, E): boxes never leave them, and
     * their zero columns / rows past the ranks add nothing. */
    CUtensorMap tg = ta, tl = tb;
    if (lora) {
        const cuuint64_t g_dim[2] = {64, (cuuint64_t)INT_MAX}, g_stride[1] = {(cuuint64_t)lora->ldg * 2};
        tg = tensor_map_bf16(lora->g, 2, g_dim, g_stride, a_box);
        const cuuint64_t l_dim[3] = {(cuuint64_t)p.N, 64, (cuuint64_t)p.E};
        const cuuint64_t l_stride[2] = {(cuuint64_t)p.N * 2, (cuuint64_t)p.N * 64 * 2};
        tl = tensor_map_bf16(lora->A, 3, l_dim, l_stride, b_box_nn);
    }
    const int lora_steps = lora ? 1 : 0;
    if (nn)
        moe_gemm_tma_kernel<true><<<occupancy_nn * num_sms, BLOCK, smem_bytes(), st>>>(ta, tb, tg, tl, p, lora_steps);
    else
        moe_gemm_tma_kernel<false><<<occupancy_nt * num_sms, BLOCK, smem_bytes(), st>>>(ta, tb, tg, tl, p, 0);
    LAUNCH_CHECK();
}
