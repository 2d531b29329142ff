/* attention_bwd_dkdv_2wg.cu — dk/dv of the varlen causal GQA flash-attention
 * backward at D = 128 on two warpgroups per block (kernel_choice.cu: the only dk/dv
 * there; dk/dv at D = 64 is attention_bwd_sm90.cu's, and dq at D = 128 is
 * attention_bwd_dq_2wg.cu's). Same contract as that file's
 * dk/dv kernel: delta and lse2 head-major (nq, T) from attn_delta_kernel, the same
 * masks, window and sinks (through lse only), P and dS rounded to bf16 before
 * their products, dk = scale * dS^T Q and dv = P^T dO summed over the group's
 * query heads in a fixed order (heads, then queries ascending), no atomics.
 *
 * Why: attention_bwd_sm90.cu's dk/dv at D = 128 runs one warpgroup per 64-key
 * tile with 32-query steps, because dk and dv take 64 registers each per thread.
 * Its S^T = K Q^T and dP^T = V dO^T are m64n32 products with both operands in
 * shared memory: per k-step 3 KB read for 16 clocks of tensor work (if shared
 * memory feeds wgmma 128 bytes per clock, 24 clocks of reads), and each block
 * copies its own Q and dO. Here a block owns a 128-key tile x kv head (the 128-row
 * work list) and two warpgroups split its keys, 64 each (FlashAttention-3's split
 * for this shape); both read the same stages of Q, dO, lse2 and delta, copied
 * once, so the copy traffic per key halves. With 256 threads and one block per
 * multiprocessor each thread may hold 255 registers, which pays for 64-query
 * steps: m64n64 products (4 KB read for 32 clocks of tensor work) and half as many
 * steps and barriers per key. Per thread: dk, dv 64 each; S^T, dP^T 32 each; P^T
 * and dS^T as bf16 A fragments, 16 each, never live together.
 *
 * Warpgroup w (threads [128 w, 128 w + 128)) owns keys k0 + 64 w .. + 63 and runs
 * attention_bwd_sm90.cu's per-warpgroup algorithm on them, key-major:
 *   S^T  = K_w Q^T    SS m64n64k16, K_w its 64-key tile, Q rows K-major;
 *   dP^T = V_w dO^T   SS;
 *   P^T  = exp2(S^T scale log2 e - lse2[query]);  dv += P^T dO   RS m64n128k16;
 *   dS^T = P^T (dP^T - delta[query]);             dk += dS^T Q   RS.
 * A step's queries fully above the diagonal of warpgroup 1's keys (the first step
 * of each head) give P = 0 and add exact zeros: both warpgroups run every step
 * (one barrier per step) and no step branches on its wgmma.
 *
 * Overlap inside a warpgroup: a step issues S^T, the previous step's dk += dS^T Q
 * (an empty group at step 0) and dP^T; computes P^T once S^T is done, while the
 * other two run; waits for the dk product only before packing P^T (P^T's
 * fragments take dS^T's registers), issues dv, computes dS^T while dv runs, and
 * waits for dv before packing dS^T. So no wgmma is in flight across the loop's
 * back edge (with dk in flight there, ptxas serialized every wgmma, C7515), the
 * wait counts are the same in every step (a branch on them does the same, C7514),
 * and at most dk, dv, S^T, dP^T and one set of fragments are live: 208 registers.
 * Across warpgroups: the other warpgroup's products fill the tensor cores while
 * one computes P^T or dS^T or waits at the barrier.
 *
 * Shared memory, tiles as in attention_bwd_sm90.cu (64-row tiles of two 128-byte
 * swizzled panels, 1024-byte aligned): K and V as two 64-key tiles each (one per
 * warpgroup), copied once; Q, dO (64 rows) and lse2, delta (64 floats) in 4
 * stages, copied two steps ahead with 16-byte cp.async by all 256 threads (rows
 * past the document's end zero-filled), at the end of a step, where the fewest
 * registers are live (issued before the products, the copies' addresses spilled).
 * The copy issued in step i fills stage (i + 2) % 4, last read by step i - 2's
 * products: its dv retired in step i - 2, its dk in step i - 1, in both
 * warpgroups before the barrier of step i. One cp.async group per step, empty
 * when nothing is left to copy, so that the wait counts hold to the end.
 *
 * Rows past the document: keys past len are masked in every step that holds one
 * (needs_mask), and their dk/dv are not stored; the caller zeroes the padding
 * rows past the last document.
 *
 * Resources (ptxas, sm_90a, CUDA 13): 255 registers, 8 bytes of spill outside the
 * loop (none inside), 195 KB shared: one block (8 warps) per multiprocessor, as
 * the registers allow anyway. Measurements: docs/kernels/attention.md. */
#include "attention.cuh"
#include "wgmma.cuh"

#define WG2_KEYS 128    /* keys per block: 64 per warpgroup */
#define WG2_QT 64       /* queries per step */
#define WG2_STAGES 4    /* of Q, dO, lse2 and delta: copied two steps ahead */

namespace wg2 {
constexpr int D = 128;
constexpr uint32_t TB = sw_tile_bytes<D, TILE>(); /* one 64-row tile: K or V of a warpgroup, or a stage of Q or dO */
/* K and V (two tiles each), WG2_STAGES stages of Q and dO and of lse2 and delta
 * (WG2_QT floats each), + slack to align the base to 1024 bytes. */
constexpr size_t smem()
{
    return (4 + 2 * WG2_STAGES) * (size_t)TB + 2 * WG2_STAGES * (size_t)WG2_QT * sizeof(float) + 1024;
}
}

// ---- kernels ----

/* dk, dv for one 128-key tile of one kv head, summed over its query heads. The
 * (head, query step) steps run as one sequence so that the pipeline crosses head
 * boundaries. Accumulators (wgmma.cuh): s[4 j + 2 r + e] is key key[r], query
 * q0 + 8 j + 2 (lane % 4) + e. */
__global__ void __launch_bounds__(WG2_THREADS, 1)
attn_bwd_dkdv_2wg_kernel(bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo, const float *lse2,
                         const float *delta, const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv,
                         const int4 *tiles, int T, int nkv, int group, float scale, float scale_log2, int window)
{
    constexpr int D = wg2::D, QT = WG2_QT;
    constexpr uint32_t TB = wg2::TB;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sk = (raw + 1023u) & ~1023u, sv = sk + 2 * TB; /* two 64-key tiles each */
    const uint32_t sq = sv + 2 * TB, sdo = sq + WG2_STAGES * TB; /* WG2_STAGES stages each */
    float *lse2_s = (float *)(smem_raw + (sdo + WG2_STAGES * TB - raw)); /* (WG2_STAGES, QT) */
    float *dl_s = lse2_s + WG2_STAGES * QT;                               /* (WG2_STAGES, QT) */
    const work_entry w = work_entry_of(tiles, nkv); /* no structured binding: issue() captures these */
    const int kvh = w.head, start = w.start, len = w.len;
    if (len == 0) return;
    const int k0 = w.tile * WG2_KEYS;
    /* wg through a shuffle from lane 0: ptxas then knows it is warp-uniform and keeps
     * the K and V descriptors in uniform registers (31 fewer R2UR per step). */
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
    const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    const int kw = k0 + wg * TILE; /* this warpgroup's first key */

    /* Queries that see some key of this tile: i >= k0 and i < k0 + WG2_KEYS - 1 + window. */
    const int qend = window > 0 ? min(len, k0 + WG2_KEYS - 1 + window) : len;
    const int nqt = (qend - k0 + QT - 1) / QT, nsteps = nqt * group;
    auto issue = [&](int step, int stage) {
        const int h = kvh * group + step / nqt, q0 = k0 + (step % nqt) * QT, valid = min(QT, len - q0);
        load_tiles_sw<QT>(sq + stage * TB, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, valid);
        load_tiles_sw<QT>(sdo + stage * TB, dout + (size_t)(start + q0) * lddo + (size_t)h * D, lddo, valid);
        load_step_stats<QT>(lse2_s, dl_s, stage, lse2, delta, h, T, start, q0, valid);
    };
    load_tiles_sw<WG2_KEYS>(sk, k + (size_t)(start + k0) * ldk + (size_t)kvh * D, ldk, min(WG2_KEYS, len - k0));
    load_tiles_sw<WG2_KEYS>(sv, v + (size_t)(start + k0) * ldv + (size_t)kvh * D, ldv, min(WG2_KEYS, len - k0));
    issue(0, 0);
    cp_async_commit();
    if (nsteps > 1) issue(1, 1);
    cp_async_commit(); /* possibly empty: one group per step keeps the wait counts */

    const uint32_t skw = sk + wg * TB, svw = sv + wg * TB;
    const int key[2] = {kw + warp * 16 + lane / 4, kw + warp * 16 + lane / 4 + 8};
    float s[QT / 2], dp[QT / 2], dka[D / 2], dva[D / 2];
#pragma unroll
    for (int i = 0; i < QT / 2; i++) s[i] = dp[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 2; i++) dka[i] = dva[i] = 0.0f;
    uint32_t pf[QT / 16][4], dsf[QT / 16][4]; /* P^T, and dS^T of the previous step, as bf16 A fragments */

    for (int step = 0; step < nsteps; step++) {
        const int stage = step % WG2_STAGES, q0 = k0 + (step % nqt) * QT;
        cp_async_wait<1>(); /* this step's copy; the next one's may still run */
        fence_proxy_async();
        __syncthreads(); /* this stage (at step 0, K and V too) is visible; every product but dk is retired */
        const uint32_t sqc = sq + stage * TB, sdoc = sdo + stage * TB;
        const float *lse2c = lse2_s + stage * QT, *dlc = dl_s + stage * QT;
        abt_issue_inc<D, QT>(s, skw, sqc);
        if (step > 0) ab_issue_inc<D, QT>(dka, dsf, sq + ((step - 1) % WG2_STAGES) * TB);
        else empty_group();
        abt_issue_inc<D, QT>(dp, svw, sdoc);
        wgmma_wait<2>(); /* S^T only: dk += dS^T_{step-1} Q_{step-1} and dP^T keep running */
        wgmma_acc_fence(s);

        if (needs_mask(q0, QT, kw, len, window)) mask_tile<true>(s, key, q0, len, window);
#pragma unroll
        for (int i = 0; i < QT / 2; i++)
            s[i] = exp2f(s[i] * scale_log2 - lse2c[(i / 4) * 8 + 2 * (lane % 4) + (i & 1)]); /* masked: 0 */
        wgmma_wait<1>(); /* the dk product: dsf is free; dP^T keeps running */
        pack_frags<QT>(pf, s);
        ab_issue_inc<D, QT>(dva, pf, sdoc);

        wgmma_wait<1>(); /* dP^T; dv keeps running */
        wgmma_acc_fence(dp);
#pragma unroll
        for (int i = 0; i < QT / 2; i++) dp[i] = s[i] * (dp[i] - dlc[(i / 4) * 8 + 2 * (lane % 4) + (i & 1)]);
        wgmma_wait<0>(); /* dv: pf is free */
        pack_frags<QT>(dsf, dp);
        /* Two steps ahead, here where the fewest registers are live: stage (step + 2) % 4
         * was last read by step - 2's products, retired before this step's barrier. */
        if (step + 2 < nsteps) issue(step + 2, (step + 2) % WG2_STAGES);
        cp_async_commit();
    }
    ab_issue_inc<D, QT>(dka, dsf, sq + ((nsteps - 1) % WG2_STAGES) * TB);
    wgmma_wait<0>();
    wgmma_acc_fence(dka);
    wgmma_acc_fence(dva);
    dkdv_store<D>(dk, lddk, dv, lddv, kvh, start, len, key, dka, dva, scale);
}

// ---- launchers ----

/* Raises the kernel's shared-memory limit (more than 48 KB needs an opt-in) and
 * asks for the largest carveout: the block's 195 KB leave little to L1. */
void attn_bwd_dkdv_2wg_init(void)
{
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_2wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)wg2::smem()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_2wg_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
}

void attn_bwd_dkdv_2wg(bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo, const float *lse2,
                       const float *delta, const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv,
                       const int4 *tiles2, size_t slots2, int T, int nq, int nkv, float scale, int window,
                       cudaStream_t st)
{
    CT_ASSERT(nkv > 0 && nq % nkv == 0, "attention_bwd (wgmma2): nq=%d is not a multiple of nkv=%d", nq, nkv);
    attn_bwd_dkdv_2wg_kernel<<<(unsigned)(slots2 * nkv), WG2_THREADS, wg2::smem(), st>>>(
        dk, lddk, dv, lddv, dout, lddo, lse2, delta, q, ldq, k, ldk, v, ldv, tiles2, T, nkv, nq / nkv, scale,
        scale * LOG2E, window);
    LAUNCH_CHECK();
}
