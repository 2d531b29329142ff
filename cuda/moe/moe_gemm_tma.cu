/* moe_gemm_tma.cu — the grouped expert GEMM of every call (moe_gemm.cu's ops, and
 * moe_gemm_fused_lora.cu's up to rank 32) in the warp-specialized form of
 * attention_fwd_sm90_2wg.cu: a producer warpgroup loads every operand with TMA
 * into an mbarrier-guarded ring, two consumer warpgroups multiply. It covers
 * moe_linear_fwd, moe_linear_bwd_input and, with the expert LoRA fused in
 * (moe_gemm_fused_lora.cuh's u product and epilogue term), moe_linear_lora_fwd and
 * moe_linear_lora_bwd_input at padded ranks RP = 16 and 32 (moe_gemm_tma_fuses;
 * RP = 64 runs moe_gemm_fused_lora.cu's cp.async kernel). Rows, gather and tile
 * schedule: moe_gemm.cuh. docs/kernels/moe_gemm.md has the design
 * in detail (the fused LoRA's slices, rows and experts, the mbarrier phases, the
 * budgets) and the measurements.
 *
 * Block: 384 threads, one block per multiprocessor, persistent over the tile list
 * (128 x 256 tiles, row tiles rastered in groups of 8, as v2).
 *   warpgroup 0, the producer (setmaxnreg.dec to 40; 56 when it gathers): one
 *     thread walks the block's tiles and k-steps and, once a stage is empty, issues
 *     its boxes: A (128 rows x 64 columns of x or dy), B (W_e: NT one 256 x 64 box,
 *     NN four 64 x 64 panels), with fused LoRA the A_e slice. A gathered forward
 *     (token rows through the routing; sm_90 TMA has no row gather) has the whole
 *     warpgroup copy x's rows with cp.async into the same swizzled layout and
 *     signal the stage with cp.async.mbarrier.arrive.noinc.
 *   warpgroups 1 and 2, the consumers (setmaxnreg.inc to 232; 224), own tile rows
 *     [0, 64) and [64, 128): per step four wgmma.m64n256k16 from shared memory,
 *     the previous step's stage released once its group retired, and after a
 *     tile's last step the results stored from the accumulators (wg_epilogue).
 * Loads run up to STAGES steps ahead across tiles. Consumer 1 starts LAG = 1
 * k-steps behind consumer 0, so each consumer's stores overlap the other's MMAs;
 * the fused LoRA's two B^T slice buffers allow a stagger of one tile at most.
 * A tile's A box ends at the tile's last row, so no box reaches past row n (which
 * only the device knows); the rows before the tile's first are computed, never
 * stored. W's 3-D maps (in, out, E) zero-fill a box past an expert's edge.
 * Resources (ptxas, CUDA 13, sm_90a): 168 registers, no spills, no serialized
 * wgmma; 193 / 217 / 189 KB of shared memory at RP = 0 / 16 / 32. */
#include "moe_gemm_fused_lora.cuh"
#include "hopper_sync.cuh"

#include <climits>
#include <cstdio>

namespace tma {
constexpr int BM = 128, BN = 256, BK = 64, GROUP = 8;
constexpr int BLOCK = 3 * 128;                         /* producer + two consumer warpgroups */
constexpr int CONSUMERS = 2 * 128;                     /* consumer threads: empty[s]'s arrivals */
constexpr int LAG = 1;                                 /* k-steps consumer 1 starts behind consumer 0 */
constexpr int BAR_LAG = 1;                             /* named barrier of the stagger */
constexpr uint32_t ROW_BYTES = BK * 2;                 /* one swizzled row: 128 bytes */
constexpr uint32_t A_BYTES = BM * ROW_BYTES, B_BYTES = BN * ROW_BYTES;
constexpr uint32_t NN_PANEL = BK * ROW_BYTES;          /* NN: B as 4 panels of 64 columns x BK rows */
/* Registers: producer + 2 consumers = 3 x 168 (the launch bound). A gathering
 * producer holds its 8 rows' indices. */
template <bool GATHER> __host__ __device__ constexpr int producer_regs() { return GATHER ? 56 : 40; }
template <bool GATHER> __host__ __device__ constexpr int consumer_regs() { return GATHER ? 224 : 232; }
/* Per rank padding RP (0: no LoRA): the ring's depth and a stage (x, W, A_e). */
template <int RP> __host__ __device__ constexpr int stages() { return RP <= 16 ? 4 : 3; }
template <int RP> __host__ __device__ constexpr uint32_t stage_bytes() { return A_BYTES + B_BYTES + RP * ROW_BYTES; }
/* one Bu slice buffer */
template <int RP> __host__ __device__ constexpr uint32_t slice_bytes() { return RP * BN * 2; }
template <int RP> __host__ __device__ constexpr size_t smem_bytes()
{
    return (size_t)stages<RP>() * stage_bytes<RP>() + 2 * slice_bytes<RP>() + (2 * stages<RP>() + 4) * 8 + 1024;
}

/* The ring's stages, the B^T slices, then the mbarriers, 8 bytes each. */
template <int RP> struct ring {
    uint32_t smem0;
    __device__ uint32_t stage(int s) const { return smem0 + s * stage_bytes<RP>(); }
    __device__ uint32_t slice(int b) const { return smem0 + stages<RP>() * stage_bytes<RP>() + b * slice_bytes<RP>(); }
    __device__ uint32_t bars() const { return slice(2); }
    __device__ uint32_t full(int s) const { return bars() + 8 * s; }
    __device__ uint32_t empty(int s) const { return bars() + 8 * (stages<RP>() + s); }
    __device__ uint32_t bfull(int b) const { return bars() + 8 * (2 * stages<RP>() + b); }
    __device__ uint32_t bempty(int b) const { return bars() + 8 * (2 * stages<RP>() + 2 + b); }
};
}

/* Everything a launch needs; the maps must live in parameter space (__grid_constant__). */
struct tma_params {
    CUtensorMap a, b;                         /* x (or dy) unless gathered; W */
    CUtensorMap g, l;                         /* bwd_input's LoRA k-step: g, the stacked A */
    CUtensorMap la[FUSED_LORA_MODULES];       /* fused LoRA: Au_q as (K, RP, E) */
    CUtensorMap lb[FUSED_LORA_MODULES];       /* fused LoRA: Bu_q as (cols, RP, E) */
    gemm_args p;
    fused_lora f;                             /* n_mod 0: no fused LoRA */
    int lora_steps;                           /* 1: bwd_input's LoRA k-step (tma_lora) */
};

// ---- kernels ----

/* The LoRA module of a tile (-1 without fused LoRA or outside every module). */
template <int RP> __device__ __forceinline__ int tile_lora(const fused_lora &f, int n0)
{
    return RP > 0 ? lora_tile_module(f.col0, f.cols, f.n_mod, n0) : -1;
}

/* cp.async.mbarrier.arrive.noinc: one arrival on bar once this thread's earlier
 * cp.async copies have landed (counted in the barrier's expected arrivals). */
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}

/* The producer warpgroup: every k-step of the block's tiles into the ring. Thread
 * 0 waits for free stages and issues the TMA boxes; with GATHER all 128 threads
 * wait and copy x's rows. */
template <bool NN, int RP, bool GATHER>
__device__ __forceinline__ void tma_produce(const tma_params &P, const moe_sched &sch, tma::ring<RP> rg, int n_rt,
                                            int n_ct, int total, int KT)
{
    using namespace tma;
    const gemm_args &p = P.p;
    const int pt = threadIdx.x; /* 0..127 */
    int i = 0, j = 0;           /* the block's step; its tiles with a LoRA module */
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        int rt, ct;
        tile_coords(tile, n_rt, n_ct, GROUP, rt, ct);
        const row_tile t = sched_find(sch, p.E, BM, INT_MIN, INT_MAX, rt);
        const int a0 = t.m0 + t.rows - BM, n0 = ct * BN, lo = BM - t.rows; /* the A box ends at the tile's last row */
        const int q = tile_lora<RP>(P.f, n0);
        if (RP > 0 && q >= 0) { /* the tile's B^T slice */
            const int b = j & 1;
            if (pt == 0) {
                if (j >= 2) mbar_wait(rg.bempty(b), ((j >> 1) & 1) ^ 1);
                mbar_arrive_expect_tx(rg.bfull(b), slice_bytes<RP>());
                for (int pn = 0; pn < BN / 64; pn++)
                    tma_load_3d(rg.slice(b) + pn * lora_b_panel<RP>(), &P.lb[q], n0 - P.f.col0[q] + 64 * pn, 0, t.e,
                                rg.bfull(b));
            }
            j++;
        }
        int src[GATHER ? BM / 16 : 1]; /* GATHER: x rows of tile rows pt/8 + 16 r, -1 before lo */
        if (GATHER) {
#pragma unroll
            for (int r = 0; r < BM / 16; r++) {
                const int row = pt / 8 + 16 * r;
                src[r] = row >= lo ? p.gather[a0 + row] / p.topk : -1;
            }
        }
        /* NN: panels holding a column < N (the rest are never stored, so never loaded). */
        const int panels = NN ? min(BN / 64, (p.N - n0 + 63) / 64) : 0;
        const uint32_t bytes = (GATHER ? 0 : A_BYTES) + (NN ? panels * NN_PANEL : B_BYTES) +
                               (q >= 0 ? RP * ROW_BYTES : 0);
        for (int kt = 0; kt < KT + P.lora_steps; kt++, i++) {
            const int s = i % stages<RP>();
            if (i >= stages<RP>()) mbar_wait(rg.empty(s), ((i / stages<RP>()) & 1) ^ 1);
            const uint32_t sa = rg.stage(s), sb = sa + A_BYTES;
            if (pt == 0) {
                if (NN && kt == KT) { /* the LoRA k-step (NN only): g's 64 columns, the stacked A's 64 rows */
                    mbar_arrive_expect_tx(rg.full(s), A_BYTES + panels * NN_PANEL);
                    tma_load_2d(sa, &P.g, 0, a0, rg.full(s));
                    for (int pn = 0; pn < panels; pn++)
                        tma_load_3d(sb + pn * NN_PANEL, &P.l, n0 + 64 * pn, 0, t.e, rg.full(s));
                    continue;
                }
                mbar_arrive_expect_tx(rg.full(s), bytes);
                if (!GATHER) tma_load_2d(sa, &P.a, kt * BK, a0, rg.full(s));
                if (!NN) {
                    tma_load_3d(sb, &P.b, kt * BK, n0, t.e, rg.full(s));
                } else {
                    for (int pn = 0; pn < panels; pn++)
                        tma_load_3d(sb + pn * NN_PANEL, &P.b, n0 + 64 * pn, kt * BK, t.e, rg.full(s));
                }
                if (RP > 0 && q >= 0) tma_load_3d(sb + B_BYTES, &P.la[q], kt * BK, 0, t.e, rg.full(s));
            }
            if (GATHER) {
                const int c = pt & 7, k = kt * BK + 8 * c;
#pragma unroll
                for (int r = 0; r < BM / 16; r++) {
                    const int row = pt / 8 + 16 * r;
                    const bool ok = src[r] >= 0 && k < p.K;
                    cp_async16_s(sa + swz(row, c), ok ? p.x + (size_t)src[r] * p.ldx + k : p.x, ok);
                }
                cp_async_mbar_arrive(rg.full(s));
            }
        }
    }
}

/* Consumer c (0 or 1): tile rows [64 c, 64 c + 64) of every tile of the block. */
template <bool NN, int RP, bool GATHER>
__device__ __forceinline__ void tma_consume(const tma_params &P, const moe_sched &sch, tma::ring<RP> rg, int n_rt,
                                            int n_ct, int total, int KT, int c)
{
    using namespace tma;
    const gemm_args &p = P.p;
    const int mine = (int)blockIdx.x < total ? (total - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int steps = mine * KT, lag_step = min(LAG, steps - 1);
    float acc[128], u[RP > 0 ? RP / 2 : 1];
#pragma unroll
    for (int k = 0; k < 128; k++) acc[k] = 0.0f;
#pragma unroll
    for (int k = 0; k < (RP > 0 ? RP / 2 : 1); k++) u[k] = 0.0f;
    if (c == 1 && steps > 0) bar_sync<CONSUMERS>(BAR_LAG);
    int i = 0, j = 0; /* the block's step and LoRA tile, as the producer's */
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        int rt, ct;
        tile_coords(tile, n_rt, n_ct, GROUP, rt, ct);
        const row_tile t = sched_find(sch, p.E, BM, INT_MIN, INT_MAX, rt);
        const int a0 = t.m0 + t.rows - BM, n0 = ct * BN, lo = BM - t.rows; /* tile rows >= lo are stored */
        const int q = tile_lora<RP>(P.f, n0);
        const bool live = 64 * c + 63 >= lo;
        for (int kt = 0; kt < KT; kt++, i++) {
            const int s = i % stages<RP>();
            mbar_wait(rg.full(s), (i / stages<RP>()) & 1);
            if (GATHER) fence_proxy_async();
            if (live) {
                const uint32_t sa = rg.stage(s) + c * 64 * ROW_BYTES, sb = rg.stage(s) + A_BYTES;
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < BK / 16; ks++) {
                    const uint64_t da = wgmma_desc(sa + ks * 32, 16, 1024);
                    wgmma_m64n256k16_ss<NN>(acc, da, wg_b_desc<NN>(sb, ks), kt > 0 || ks > 0);
                    /* u in every tile (A_e's slice is loaded only for a module's tiles;
                     * elsewhere u is unused): a wgmma under a condition would make ptxas
                     * serialize all of them */
                    if constexpr (RP > 0)
                        lora_u_mma<RP>(u, da, wgmma_desc(sb + B_BYTES + ks * 32, 16, 1024), kt > 0 || ks > 0);
                }
                wgmma_commit();
            }
            wgmma_wait<1>(); /* step i - 1's group retired: its stage is free */
            if (kt > 0) mbar_arrive(rg.empty((i - 1) % stages<RP>()));
            if (c == 0 && i == lag_step) bar_arrive<CONSUMERS>(BAR_LAG);
        }
        wgmma_wait<0>();
        mbar_arrive(rg.empty((i - 1) % stages<RP>())); /* the tile's last step */
        wgmma_acc_fence(acc);
        if constexpr (RP > 0) {
            wgmma_acc_fence(u);
            if (q >= 0) {
                const int b = j & 1;
                if (live) {
                    mbar_wait(rg.bfull(b), (j >> 1) & 1);
                    if (P.f.u && n0 == P.f.col0[q]) /* one column tile stores */
                        lora_store_u<RP>(P.f.u, P.f.ldu, q * P.f.R, P.f.ucols, u, a0, lo, BM, c);
                    lora_add<RP>(acc, u, rg.slice(b), P.f.scale);
                }
                mbar_arrive(rg.bempty(b));
                j++;
            }
        }
        if (live) wg_epilogue(p, acc, t.e, a0, lo, BM, n0, c);
    }
}

template <bool NN, int RP, bool GATHER>
__global__ void __launch_bounds__(tma::BLOCK, 1) moe_gemm_tma_kernel(const __grid_constant__ tma_params P)
{
    using namespace tma;
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ moe_sched sch;
    const ring<RP> rg = {((uint32_t)__cvta_generic_to_shared(dyn_smem) + 1023u) & ~1023u};
    const gemm_args &p = P.p;
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages<RP>(); s++) {
            mbar_init(rg.full(s), GATHER ? 1 + 128 : 1);
            mbar_init(rg.empty(s), CONSUMERS);
        }
        for (int b = 0; b < 2; b++) {
            mbar_init(rg.bfull(b), 1);
            mbar_init(rg.bempty(b), CONSUMERS);
        }
        mbar_init_fence();
    }
    sched_load(sch, p.offsets, p.E); /* its block barrier also publishes the mbarriers */
    const int n_rt = sched_tiles(sch, p.E, BM, INT_MIN, INT_MAX);
    const int n_ct = (p.N + BN - 1) / BN, total = n_rt * n_ct, KT = (p.K + BK - 1) / BK;

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        regs_dec<producer_regs<GATHER>()>();
        if (GATHER || threadIdx.x == 0) tma_produce<NN, RP, GATHER>(P, sch, rg, n_rt, n_ct, total, KT);
    } else {
        regs_inc<consumer_regs<GATHER>()>();
        tma_consume<NN, RP, GATHER>(P, sch, rg, n_rt, n_ct, total, KT + P.lora_steps, wg - 1);
    }
}

// ---- launchers ----

template <bool NN, int RP, bool GATHER> static int setup()
{
    static_assert(tma::producer_regs<GATHER>() + 2 * tma::consumer_regs<GATHER>() == 3 * 168, "register split");
    return kernel_setup((const void *)moe_gemm_tma_kernel<NN, RP, GATHER>, tma::BLOCK, tma::smem_bytes<RP>());
}

void moe_gemm_tma_init(cuda_ctx *c)
{
    moe_occupancy &o = c->occupancy; /* 1 block per SM each, checked by kernel_setup */
    o.tma_nt = setup<false, 0, false>();
    o.tma_nn = setup<true, 0, false>();
    o.tma_nt_gather = setup<false, 0, true>();
    o.tma_fused[0][0] = setup<false, 16, false>();
    o.tma_fused[0][1] = setup<false, 16, true>();
    o.tma_fused[0][2] = setup<true, 16, false>();
    o.tma_fused[1][0] = setup<false, 32, false>();
    o.tma_fused[1][1] = setup<false, 32, true>();
    o.tma_fused[1][2] = setup<true, 32, false>();
    (void)tensor_map_encoder(); /* a driver without one fails here, not mid-training */
}

bool moe_gemm_tma_fuses(int RP) { return RP == 16 || RP == 32; }

/* The maps of x (unless gathered) and W. */
static void base_maps(tma_params &P, bool nn)
{
    using namespace tma;
    const gemm_args &p = P.p;
    /* A: (rows, K) at stride ldx; INT_MAX rows, an extent no box reaches (each ends
     * at its tile's last row, < n). A gathered x is copied by cp.async instead. */
    const cuuint64_t a_dim[2] = {(cuuint64_t)p.K, (cuuint64_t)INT_MAX}, a_stride[1] = {(cuuint64_t)p.ldx * 2};
    const cuuint32_t a_box[2] = {BK, BM};
    if (!p.gather) P.a = tensor_map_bf16(p.x, 2, a_dim, a_stride, a_box);
    /* W (E, out, in) as 3-D: NT (K, N, E) in boxes of 64 x 256 (k, n); NN (N, K, E)
     * in panels of 64 x 64 (n, k). */
    const cuuint64_t w_dim_nt[3] = {(cuuint64_t)p.K, (cuuint64_t)p.N, (cuuint64_t)p.E};
    const cuuint64_t w_dim_nn[3] = {(cuuint64_t)p.N, (cuuint64_t)p.K, (cuuint64_t)p.E};
    const cuuint64_t w_stride[2] = {(cuuint64_t)(nn ? p.N : p.K) * 2, (cuuint64_t)p.N * p.K * 2};
    const cuuint32_t b_box_nt[3] = {BK, BN, 1}, b_box_nn[3] = {64, BK, 1};
    P.b = tensor_map_bf16(p.W, 3, nn ? w_dim_nn : w_dim_nt, w_stride, nn ? b_box_nn : b_box_nt);
}

template <bool NN, int RP, bool GATHER> static void launch(const tma_params &P, int occ, int num_sms, cudaStream_t st)
{
    CT_ASSERT(occ > 0, "moe_gemm_tma: moe_gemm_tma_init was not called");
    moe_gemm_tma_kernel<NN, RP, GATHER><<<occ * num_sms, tma::BLOCK, tma::smem_bytes<RP>(), st>>>(P);
    LAUNCH_CHECK();
}

void moe_gemm_tma(const cuda_ctx *c, const gemm_args &p, bool nn, const tma_lora *lora)
{
    using namespace tma;
    CT_ASSERT(!nn || !p.gather, "moe_gemm_tma: bwd_input has no gather");
    CT_ASSERT(!lora || (nn && lora->ldg >= 64 && lora->ldg % 8 == 0),
              "moe_gemm_tma: the LoRA k-step needs bwd_input and g rows of >= 64 columns (ldg %d)",
              lora ? lora->ldg : 0);
    tma_params P = {};
    P.p = p;
    base_maps(P, nn);
    /* The LoRA k-step: g as A (64 columns, the box's width, at stride ldg), the
     * stacked A (E, 64, in) as NN panels (in, 64, E): boxes never leave them, and
     * their zero columns / rows past the ranks add nothing. */
    if (lora) {
        const cuuint64_t g_dim[2] = {64, (cuuint64_t)INT_MAX}, g_stride[1] = {(cuuint64_t)lora->ldg * 2};
        const cuuint32_t g_box[2] = {BK, BM}, l_box[3] = {64, BK, 1};
        P.g = tensor_map_bf16(lora->g, 2, g_dim, g_stride, g_box);
        const cuuint64_t l_dim[3] = {(cuuint64_t)p.N, 64, (cuuint64_t)p.E};
        const cuuint64_t l_stride[2] = {(cuuint64_t)p.N * 2, (cuuint64_t)p.N * 64 * 2};
        P.l = tensor_map_bf16(lora->A, 3, l_dim, l_stride, l_box);
        P.lora_steps = 1;
    }
    const moe_occupancy &o = c->occupancy;
    if (nn) launch<true, 0, false>(P, o.tma_nn, c->num_sms, c->stream);
    else if (p.gather) launch<false, 0, true>(P, o.tma_nt_gather, c->num_sms, c->stream);
    else launch<false, 0, false>(P, o.tma_nt, c->num_sms, c->stream);
}

void moe_gemm_tma_lora(const cuda_ctx *c, const gemm_args &p, bool nn, const fused_lora &f)
{
    CT_ASSERT(moe_gemm_tma_fuses(f.RP) && f.n_mod >= 1 && f.n_mod <= FUSED_LORA_MODULES && !(nn && p.gather),
              "moe_gemm_tma_lora: %d modules at padded rank %d (nn %d, gather %d)", f.n_mod, f.RP, nn, !!p.gather);
    tma_params P = {};
    P.p = p;
    P.f = f;
    base_maps(P, nn);
    /* Au_q (E, RP, K) as (K, RP, E) and Bu_q (E, RP, cols) as (cols, RP, E), in
     * boxes of 64 x RP: zero-filled past K and past the module's columns. */
    const cuuint32_t box[3] = {64, (cuuint32_t)f.RP, 1};
    for (int q = 0; q < f.n_mod; q++) {
        const cuuint64_t a_dim[3] = {(cuuint64_t)p.K, (cuuint64_t)f.RP, (cuuint64_t)p.E};
        const cuuint64_t a_stride[2] = {(cuuint64_t)p.K * 2, (cuuint64_t)f.RP * p.K * 2};
        P.la[q] = tensor_map_bf16(f.Au[q], 3, a_dim, a_stride, box);
        const cuuint64_t b_dim[3] = {(cuuint64_t)f.cols[q], (cuuint64_t)f.RP, (cuuint64_t)p.E};
        const cuuint64_t b_stride[2] = {(cuuint64_t)f.cols[q] * 2, (cuuint64_t)f.RP * f.cols[q] * 2};
        P.lb[q] = tensor_map_bf16(f.Bu[q], 3, b_dim, b_stride, box);
    }
    const int r = f.RP == 16 ? 0 : 1, kind = nn ? 2 : p.gather ? 1 : 0;
    const int occ = c->occupancy.tma_fused[r][kind], sms = c->num_sms;
    cudaStream_t st = c->stream;
    if (f.RP == 16 && kind == 0) launch<false, 16, false>(P, occ, sms, st);
    else if (f.RP == 16 && kind == 1) launch<false, 16, true>(P, occ, sms, st);
    else if (f.RP == 16) launch<true, 16, false>(P, occ, sms, st);
    else if (kind == 0) launch<false, 32, false>(P, occ, sms, st);
    else if (kind == 1) launch<false, 32, true>(P, occ, sms, st);
    else launch<true, 32, false>(P, occ, sms, st);
}
