/* attention_bwd_dq_2wg.cu — dq of the varlen causal GQA flash-attention backward
 * at D = 128 on two warpgroups per block (kernel_choice.cu: the only dq at
 * D = 128). Same contract as attention_bwd_sm90.cu's dq kernel: delta and
 * lse2 head-major (nq, T) from attn_delta_kernel, the same masks, window and
 * sinks (through lse only), dS rounded to bf16 before dq += dS K, the keys summed
 * in ascending order, no atomics; rows past a document's end are not stored.
 * Measurements: docs/kernels/attention.md.
 *
 * Why: attention_bwd_sm90.cu's dq runs one warpgroup per 64-query tile, and every
 * block copies its own K and V tiles: 32 KB per 64 x 64 tile pair, for three
 * products. Its S = Q K^T and dP = dO V^T are m64n64k16 with both operands in
 * shared memory (4 KB read per 32 clocks of tensor work: at shared memory's 128
 * bytes a clock). Here a block owns a 128-query tile x head (the 128-row work list,
 * as the dk/dv 2wg kernel) and two warpgroups split its queries, 64 each; both
 * read every K and V stage, copied once, so the copy traffic per query halves.
 * Steps are 128 keys: S and dP are m64n128k16 (6 KB read per 64 clocks), and a
 * step costs one barrier for four times the work of the one-warpgroup kernel's.
 *
 * Warpgroup w (threads [128 w, 128 w + 128)) owns queries q0 + 64 w .. + 63 and
 * walks the 128-key tiles the block's last query sees (from the window's lower
 * edge of its first query, rounded down to 128):
 *   S  = Q_w K^T    SS m64n128k16, K rows K-major;
 *   dP = dO_w V^T   SS m64n128k16, V rows K-major;
 *   P  = exp2(S scale log2 e - lse2), dS = P (dP - delta), rows in registers;
 *   dq += dS K      RS m64n128k16 in two halves of 64 keys (dS_lo K_lo, then
 *                   dS_hi K_hi): dS's accumulators repacked as A fragments, K as
 *                   an MN-major B (the transpose bit).
 * Key tiles above warpgroup 0's diagonal (the block's last one) or below warpgroup
 * 1's window give P = 0 and add exact zeros: both warpgroups run every step (one
 * barrier per step) and no step branches on its wgmma.
 *
 * Overlap inside a warpgroup: a step issues the previous step's dq += dS_hi K_hi
 * (an empty group at step 0), S and dP; computes P once the first two are done
 * (dS_hi's fragments are then free), while dP runs; computes dS of the first 64
 * keys, packs it and issues dq += dS_lo K_lo; computes and packs dS of the last
 * 64 keys while it runs, and waits for it. So no wgmma is in flight across the
 * loop's back edge (ptxas serializes every wgmma otherwise, C7515), the wait
 * counts are the same in every step (C7514), and dS_hi's fragments carry to the
 * next step in registers: its product runs while the warpgroup crosses the
 * barrier and queues the next copy. (ptxas sinks most of P's exp2 below the wait
 * for dP, as it does in attention_bwd_sm90.cu's dq.) Across warpgroups: the other
 * warpgroup's products fill the tensor cores while one computes P or dS or waits
 * at the barrier.
 *
 * Registers (per thread, 255 at most: 256 threads, one block per multiprocessor):
 * dq 64, S 64, dP 64 (always live: wgmma's accumulators are read-write operands),
 * plus dS_hi's fragments 16 while the step's products are issued, or dS_lo's 16
 * while S's and dP's first halves die into them. Issuing dq += dS_hi K_hi after S
 * and dP instead (so that it ran during P) kept dS_hi's 16 live through P and
 * spilled two 64-bit addresses into the loop (255 registers, 32 bytes).
 *
 * Shared memory (1024-byte aligned, 128-byte swizzle as wgmma.cuh): Q and dO as
 * two 64-row tiles each (one per warpgroup, 64-row panels: wgmma's A), copied once;
 * K in 3 stages and V in 2 of 128 rows each (two panels of 128 rows: an N = 128 B),
 * copied one step ahead with 16-byte cp.async by all 256 threads (rows past the
 * document's end zero-filled) right after the step's barrier. The copy issued in
 * step i fills K stage (i + 1) % 3, last read by step i - 2's tile through dq +=
 * dS_hi K_hi issued in step i - 1, and V stage (i + 1) % 2, last read by step i -
 * 1's dP: both retired in both warpgroups before step i's barrier. One cp.async
 * group per step at most; wait_group 0 at the top of each step.
 * 4 x 16 KB (Q, dO) + 5 x 32 KB (K, V) + 1 KB alignment slack = 225 KB of the
 * 227 KB a block may take: no room for a third V or fourth K stage.
 *
 * Resources (ptxas, sm_90a, CUDA 13): 251 registers, no spills, no wgmma
 * serialized (no C7510/C7514/C7515), 225 KB dynamic shared memory: one block (8
 * warps) per multiprocessor, as the one-warpgroup dq's two blocks of 4. */
#include "attention.cuh"
#include "wgmma.cuh"

#define DQ2_QUERIES 128 /* queries per block: 64 per warpgroup */
#define DQ2_KEYS 128    /* keys per step */
#define DQ2_KSTAGES 3   /* K is read by dq += dS_hi K_hi one step after its copy's step */
#define DQ2_VSTAGES 2

namespace dq2 {
constexpr int D = 128;
constexpr uint32_t QB = sw_tile_bytes<D, TILE>();     /* one warpgroup's 64 rows of Q or dO */
constexpr uint32_t KB = sw_tile_bytes<D, DQ2_KEYS>(); /* one stage of K or V */
constexpr uint32_t HALF = DQ2_KEYS / 2 * 128;         /* keys 64.. inside a 128-row panel */
/* Q and dO (two tiles each), the K and V stages, + slack to align the base to 1024 bytes. */
constexpr size_t smem() { return 4 * (size_t)QB + (DQ2_KSTAGES + DQ2_VSTAGES) * (size_t)KB + 1024; }
static_assert(smem() <= 227 * 1024, "dq 2wg: more shared memory than a block may take");
}

// ---- kernels ----

/* The bf16 A fragments of columns [64 half, 64 half + 64) of a 64 x 128 wgmma
 * accumulator tile (pack_frags of one half). */
static __device__ __forceinline__ void pack_half(uint32_t (&a)[4][4], const float (&d)[64], int half)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            a[kk][r] = pack_bf16(d[32 * half + 8 * kk + 2 * r], d[32 * half + 8 * kk + 2 * r + 1]);
}

/* dS = P (dP - delta) for accumulator elements [32 half, 32 half + 32): keys
 * 64 half .. + 63 of the step. dp holds dP, s holds P. */
static __device__ __forceinline__ void ds_half(float (&dp)[64], const float (&s)[64], const float (&dl)[2], int half)
{
#pragma unroll
    for (int i = 32 * half; i < 32 * half + 32; i++) dp[i] = s[i] * (dp[i] - dl[(i >> 1) & 1]);
}

/* dq for one 128-query tile of one head: dS = P (dP - delta), dq = scale * dS K.
 * Accumulators (wgmma.cuh): s[4 j + 2 r + e] is row row[r], key k0 + 8 j +
 * 2 (lane % 4) + e. */
__global__ void __launch_bounds__(WG2_THREADS, 1)
attn_bwd_dq_2wg_kernel(bf16 *dq, int lddq, const bf16 *dout, int lddo, const float *lse2, const float *delta,
                       const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv, const int4 *tiles,
                       int T, int nq, int group, float scale, float scale_log2, int window)
{
    constexpr int D = dq2::D, KN = DQ2_KEYS;
    constexpr uint32_t QB = dq2::QB, KB = dq2::KB;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t sq = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t sdo = sq + 2 * QB, sk = sdo + 2 * QB, sv = sk + DQ2_KSTAGES * KB;
    const auto [h, start, len, tile] = work_entry_of(tiles, nq);
    const int kvh = h / group;
    if (len == 0) return;
    const int q0 = ((len + DQ2_QUERIES - 1) / DQ2_QUERIES - 1 - tile) * DQ2_QUERIES; /* longest tiles first */
    /* wg through a shuffle from lane 0: ptxas then knows it is warp-uniform and keeps
     * the Q and dO descriptors in uniform registers (as the dk/dv 2wg kernel). */
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
    const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    const int qw = q0 + wg * TILE; /* this warpgroup's first query */

    const auto [kmin, n] = key_tiles<DQ2_QUERIES, KN>(q0, len, window);
    const bf16 *kb = k + (size_t)start * ldk + (size_t)kvh * D, *vb = v + (size_t)start * ldv + (size_t)kvh * D;
    /* The block's 128 rows from q0 < len: rows past len zero-filled from row q0, so
     * warpgroup 1 of a tile that ends inside its first half reads no foreign row. */
    const int qvalid = min(DQ2_QUERIES, len - q0);
    load_tiles_sw<DQ2_QUERIES>(sq, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, qvalid);
    load_tiles_sw<DQ2_QUERIES>(sdo, dout + (size_t)(start + q0) * lddo + (size_t)h * D, lddo, qvalid);
    load_tiles_sw<KN, KN>(sk, kb + (size_t)kmin * ldk, ldk, min(KN, len - kmin));
    load_tiles_sw<KN, KN>(sv, vb + (size_t)kmin * ldv, ldv, min(KN, len - kmin));
    cp_async_commit();

    const uint32_t sqw = sq + wg * QB, sdow = sdo + wg * QB;
    const int row[2] = {qw + warp * 16 + lane / 4, qw + warp * 16 + lane / 4 + 8};
    float lse2r[2], dl[2];
    load_row_stats(lse2r, dl, lse2, delta, h, T, start, row, len);
    float s[KN / 2], dp[KN / 2], acc[D / 2];
#pragma unroll
    for (int i = 0; i < KN / 2; i++) s[i] = dp[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 2; i++) acc[i] = 0.0f;
    uint32_t dsl[4][4], dsh[4][4]; /* dS of a step's keys 0..63 and 64..127 as bf16 A fragments */

    for (int it = 0; it < n; it++) {
        const int k0 = kmin + it * KN;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads(); /* tile it is visible to wgmma; every product issued so far is retired */
        if (it + 1 < n) {
            const int kn = k0 + KN, valid = min(KN, len - kn);
            load_tiles_sw<KN, KN>(sk + ((it + 1) % DQ2_KSTAGES) * KB, kb + (size_t)kn * ldk, ldk, valid);
            load_tiles_sw<KN, KN>(sv + ((it + 1) % DQ2_VSTAGES) * KB, vb + (size_t)kn * ldv, ldv, valid);
            cp_async_commit();
        }
        const uint32_t skc = sk + (it % DQ2_KSTAGES) * KB;
        if (it > 0) ab_issue_inc<D, KN / 2, KN>(acc, dsh, sk + ((it - 1) % DQ2_KSTAGES) * KB + dq2::HALF);
        else empty_group();
        abt_issue_inc<D, KN>(s, sqw, skc);
        abt_issue_inc<D, KN>(dp, sdow, sv + (it % DQ2_VSTAGES) * KB);
        wgmma_wait<1>(); /* dq += dS_hi K_hi of step it - 1, then S: dsh is free; dP keeps running */
        wgmma_acc_fence(s);

        if (needs_mask<KN>(qw, TILE, k0, len, window)) mask_tile<false>(s, row, k0, len, window);
#pragma unroll
        for (int i = 0; i < KN / 2; i++) s[i] = exp2f(s[i] * scale_log2 - lse2r[(i >> 1) & 1]); /* masked: 0 */

        wgmma_wait<0>(); /* dP */
        wgmma_acc_fence(dp);
        ds_half(dp, s, dl, 0);
        pack_half(dsl, dp, 0);
        ab_issue_inc<D, KN / 2, KN>(acc, dsl, skc);
        ds_half(dp, s, dl, 1);
        pack_half(dsh, dp, 1);
        wgmma_wait<0>(); /* dS_lo K_lo: nothing in flight across the back edge */
    }
    ab_issue_inc<D, KN / 2, KN>(acc, dsh, sk + ((n - 1) % DQ2_KSTAGES) * KB + dq2::HALF);
    wgmma_wait<0>();
    wgmma_acc_fence(acc);
    dq_store<D>(dq, lddq, h, start, len, row, acc, scale);
}

// ---- launchers ----

/* Raises the kernel's shared-memory limit (more than 48 KB needs an opt-in) and
 * asks for the largest carveout: the block's 225 KB leave almost nothing to L1. */
void attn_bwd_dq_2wg_init(void)
{
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_2wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dq2::smem()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_2wg_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
}

void attn_bwd_dq_2wg(bf16 *dq, int lddq, const bf16 *dout, int lddo, const float *lse2, const float *delta,
                     const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv, const int4 *tiles2,
                     size_t slots2, int T, int nq, int nkv, float scale, int window, cudaStream_t st)
{
    CT_ASSERT(nkv > 0 && nq % nkv == 0, "attention_bwd (wgmma2 dq): nq=%d is not a multiple of nkv=%d", nq, nkv);
    attn_bwd_dq_2wg_kernel<<<(unsigned)(slots2 * nq), WG2_THREADS, dq2::smem(), st>>>(
        dq, lddq, dout, lddo, lse2, delta, q, ldq, k, ldk, v, ldv, tiles2, T, nq, nq / nkv, scale, scale * LOG2E,
        window);
    LAUNCH_CHECK();
}
