/* attention_bwd_sm90.cu — the varlen causal GQA flash-attention backward (dq, then
 * dk/dv) on Hopper's warpgroup MMA (wgmma.cuh). Same contract as attention_bwd.cu's
 * mma.sync kernels: the same work list, grids, masks, delta and lse2 (head-major
 * (nq, T), written first by attn_delta_kernel), sinks entering only through lse,
 * the same fp32 -> bf16 roundings (P for dv, dS for dq and dk) and a fixed sum
 * order, so results are deterministic without atomics; see attention.cu's header.
 * Both kernels are built for and run at D = 64 (kernel_choice.cu): D = 128 runs
 * attention_bwd_dq_2wg.cu's dq and attention_bwd_dkdv_2wg.cu's dk/dv, D = 32
 * mma.sync. The design and figures below also cover D = 128, where these kernels
 * ran until the two-warpgroup ones replaced them (docs/kernels/attention.md).
 *
 * dq: one warpgroup per 64-query tile x head, walking the key tiles it sees:
 *   S  = Q K^T    SS, K rows as a K-major B (as the forward's Q K^T);
 *   dP = dO V^T   SS, V rows as a K-major B;
 *   P  = exp2(S scale log2 e - lse2), dS = P (dP - delta), rows from registers;
 *   dq += dS K    RS: dS's accumulators repacked as A fragments (wgmma.cuh), K
 *                 (keys x D) as an MN-major B (the transpose bit, as the forward's V).
 * dk/dv: one warpgroup per 64-key tile x kv head, walking for each query head of
 * the group the QT-query steps that see the tile (QT = Cfg<D>::QT: 64 at D = 64,
 * 32 at D = 128), key-major throughout so that keys are wgmma's M:
 *   S^T  = K Q^T     SS (m64nQTk16), Q rows K-major;
 *   dP^T = V dO^T    SS, dO rows K-major;
 *   P^T  = exp2(S^T scale log2 e - lse2[query]): lse and delta vary along columns
 *                    now, staged in shared memory with each step's Q and dO;
 *   dv += P^T dO     RS, dO (queries x D) MN-major;
 *   dS^T = P^T (dP^T - delta[query]);  dk += dS^T Q   RS, Q MN-major.
 * At D = 128 the accumulators dk and dv take 64 registers each per thread; 64-query
 * steps would add 2 x 32 for S^T and dP^T plus their fragments and leave nothing
 * for addresses (and 6 stages of 16 KB would allow one block per multiprocessor),
 * hence 32-query steps, as the mma.sync kernel. attention_bwd_dkdv_2wg.cu lifts
 * that limit with two warpgroups per 128-key tile, sharing the Q and dO stages,
 * and 64-query steps (m64n64 products) in 255 registers.
 *
 * Overlap inside the warpgroup (FlashAttention-3's idea, our two-kernel split):
 * each step issues S and dP, then the previous step's last product (dq += dS K;
 * dk += dS^T Q), and waits for S alone: P is computed while the tensor cores run
 * dP and that product (in dk/dv, dv += P^T dO is issued next and runs during dS).
 * The last product of the last step runs after the loop. Every wgmma is retired
 * by the end of its step, and the first step commits an empty group in place of
 * the missing product, so the wait counts are the same on every path (with a
 * branch on them ptxas serializes all wgmma, C7514).
 *
 * Shared memory, each tile as D / 64 panels of rows x 128 bytes in the 128-byte
 * swizzle, 1024-byte aligned, copied with 16-byte cp.async one step ahead (rows
 * past the document's end zero-filled). A stage read by a product issued in the
 * next step must not be the one that step's copy fills: dq keeps K in 3 stages
 * (dq += dS_{i-1} K_{i-1} is issued in step i) and V in 2; dk/dv keeps Q (and,
 * for uniform indexing, dO, lse2 and delta) in 3 stages, K and V once. One
 * barrier per step, after the copy wait and the proxy fence, as in the forward.
 *
 * Resources (ptxas, sm_90a, CUDA 13; no spills, no serialized wgmma):
 *   dq    D = 64:  185 registers, 57 KB, 2 blocks per multiprocessor (registers);
 *         D = 128: 248 registers, 113 KB shared, 2 blocks (exactly the 228 KB,
 *                  hence the max-shared carveout);
 *   dk/dv D = 64:  220 registers, 66.5 KB, 2 blocks (registers);
 *         D = 128: 226 registers, 81.75 KB, 2 blocks.
 * Measurements: docs/kernels/attention.md. */
#include "attention.cuh"
#include "wgmma.cuh"

namespace sm90b {
/* dq: Q, dO, 3 K stages, 2 V stages; dk/dv: K, V, 3 stages of Q, dO (QT rows) and
 * of lse2, delta (QT floats); + slack to align the base to 1024 bytes. */
template <int D> constexpr size_t dq_smem() { return 7 * (size_t)sw_tile_bytes<D, TILE>() + 1024; }
template <int D> constexpr size_t dkdv_smem()
{
    return 2 * (size_t)sw_tile_bytes<D, TILE>() + 6 * (size_t)sw_tile_bytes<D, Cfg<D>::QT>() +
           6 * (size_t)Cfg<D>::QT * sizeof(float) + 1024;
}
}

// ---- kernels ----

/* dq for one 64-query tile of one head: dS = P (dP - delta), dq = scale * dS K.
 * Accumulators (wgmma.cuh): s[4 j + 2 r + e] is row row[r], key k0 + 8 j +
 * 2 (lane % 4) + e, as the mma.sync kernel's s[j][2 r + e]. */
template <int D>
__global__ void __launch_bounds__(THREADS, 2)
attn_bwd_dq_sm90_kernel(bf16 *dq, int lddq, const bf16 *dout, int lddo, const float *lse2,
                        const float *delta, const bf16 *q, int ldq, const bf16 *k, int ldk,
                        const bf16 *v, int ldv, const int4 *tiles, int T, int nq, int group,
                        float scale, float scale_log2, int window)
{
    static_assert(D == 64 || D == 128, "wgmma backward: D = 64 or 128");
    constexpr uint32_t TB = sw_tile_bytes<D, TILE>();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t sq = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t sdo = sq + TB, sk = sdo + TB, sv = sk + 3 * TB; /* K: 3 stages, V: 2 */
    const auto [h, start, len, tile] = work_entry_of(tiles, nq);
    const int kvh = h / group;
    if (len == 0) return;
    const int q0 = ((len + TILE - 1) / TILE - 1 - tile) * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    const auto [kmin, n] = key_tiles(q0, len, window);
    const bf16 *kb = k + (size_t)start * ldk + (size_t)kvh * D, *vb = v + (size_t)start * ldv + (size_t)kvh * D;
    load_rows_sw<D, TILE>(sq, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, min(TILE, len - q0));
    load_rows_sw<D, TILE>(sdo, dout + (size_t)(start + q0) * lddo + (size_t)h * D, lddo, min(TILE, len - q0));
    load_rows_sw<D, TILE>(sk, kb + (size_t)kmin * ldk, ldk, min(TILE, len - kmin));
    load_rows_sw<D, TILE>(sv, vb + (size_t)kmin * ldv, ldv, min(TILE, len - kmin));
    cp_async_commit();

    const int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
    float lse2r[2], dl[2];
    load_row_stats(lse2r, dl, lse2, delta, h, T, start, row, len);
    float s[32], dp[32], acc[D / 2];
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = dp[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 2; i++) acc[i] = 0.0f;
    uint32_t ds[TILE / 16][4]; /* dS of the previous key tile as bf16 A fragments */

    for (int it = 0; it < n; it++) {
        const int k0 = kmin + it * TILE;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads(); /* tile it is visible to wgmma; every product issued so far is retired */
        if (it + 1 < n) {
            const int kn = k0 + TILE;
            load_rows_sw<D, TILE>(sk + ((it + 1) % 3) * TB, kb + (size_t)kn * ldk, ldk, min(TILE, len - kn));
            load_rows_sw<D, TILE>(sv + ((it + 1) & 1) * TB, vb + (size_t)kn * ldv, ldv, min(TILE, len - kn));
            cp_async_commit();
        }
        abt_issue<D, TILE>(s, sq, sk + (it % 3) * TB);
        abt_issue<D, TILE>(dp, sdo, sv + (it & 1) * TB);
        if (it > 0) ab_issue<D, TILE>(acc, ds, sk + ((it - 1) % 3) * TB);
        else empty_group();
        wgmma_wait<2>(); /* S only: dP and dq += dS_{it-1} K_{it-1} keep running */
        wgmma_acc_fence(s);

        if (needs_mask(q0, TILE, k0, len, window)) mask_tile<false>(s, row, k0, len, window);
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] = exp2f(s[i] * scale_log2 - lse2r[(i >> 1) & 1]); /* masked: 0 */

        wgmma_wait<1>(); /* dP; the dq product keeps running */
        wgmma_acc_fence(dp);
#pragma unroll
        for (int i = 0; i < 32; i++) dp[i] = s[i] * (dp[i] - dl[(i >> 1) & 1]);
        wgmma_wait<0>(); /* ds is free */
        pack_frags<TILE>(ds, dp);
    }
    ab_issue<D, TILE>(acc, ds, sk + ((n - 1) % 3) * TB);
    wgmma_wait<0>();
    wgmma_acc_fence(acc);
    dq_store<D>(dq, lddq, h, start, len, row, acc, scale);
}

/* dk, dv for one 64-key tile of one kv head, summed over its query heads: dv =
 * P^T dO, dk = scale * dS^T Q. The (head, query step) steps run as one sequence so
 * that the pipeline crosses head boundaries; the sum order (heads, then queries
 * ascending) is fixed. Accumulators: s[4 j + 2 r + e] is key key[r], query q0 +
 * 8 j + 2 (lane % 4) + e. */
template <int D>
__global__ void __launch_bounds__(THREADS, 2)
attn_bwd_dkdv_sm90_kernel(bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo,
                          const float *lse2, const float *delta, const bf16 *q, int ldq, const bf16 *k,
                          int ldk, const bf16 *v, int ldv, const int4 *tiles, int T, int nkv, int group,
                          float scale, float scale_log2, int window)
{
    static_assert(D == 64 || D == 128, "wgmma backward: D = 64 or 128");
    constexpr int QT = Cfg<D>::QT;
    constexpr uint32_t TB = sw_tile_bytes<D, TILE>(), QB = sw_tile_bytes<D, QT>();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sk = (raw + 1023u) & ~1023u, sv = sk + TB;
    const uint32_t sq = sv + TB, sdo = sq + 3 * QB; /* 3 stages each */
    float *lse2_s = (float *)(smem_raw + (sdo + 3 * QB - raw)), *dl_s = lse2_s + 3 * QT; /* (3, QT) each */
    const work_entry w = work_entry_of(tiles, nkv); /* no structured binding: issue() captures these */
    const int kvh = w.head, start = w.start, len = w.len;
    if (len == 0) return;
    const int k0 = w.tile * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    /* Queries that see some key of this tile: i >= k0 and i < k0 + TILE - 1 + window. */
    const int qend = window > 0 ? min(len, k0 + TILE - 1 + window) : len;
    const int nqt = (qend - k0 + QT - 1) / QT, nsteps = nqt * group;
    auto issue = [&](int step, int stage) {
        const int h = kvh * group + step / nqt, q0 = k0 + (step % nqt) * QT, valid = min(QT, len - q0);
        load_rows_sw<D, QT>(sq + stage * QB, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, valid);
        load_rows_sw<D, QT>(sdo + stage * QB, dout + (size_t)(start + q0) * lddo + (size_t)h * D, lddo, valid);
        load_step_stats<QT>(lse2_s, dl_s, stage, lse2, delta, h, T, start, q0, valid);
    };
    load_rows_sw<D, TILE>(sk, k + (size_t)(start + k0) * ldk + (size_t)kvh * D, ldk, min(TILE, len - k0));
    load_rows_sw<D, TILE>(sv, v + (size_t)(start + k0) * ldv + (size_t)kvh * D, ldv, min(TILE, len - k0));
    issue(0, 0);
    cp_async_commit();

    const int key[2] = {k0 + warp * 16 + lane / 4, k0 + warp * 16 + lane / 4 + 8};
    float s[QT / 2], dp[QT / 2], dka[D / 2], dva[D / 2];
#pragma unroll
    for (int i = 0; i < QT / 2; i++) s[i] = dp[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 2; i++) dka[i] = dva[i] = 0.0f;
    uint32_t pf[QT / 16][4], dsf[QT / 16][4]; /* P^T, and dS^T of the previous step, as bf16 A fragments */

    for (int step = 0; step < nsteps; step++) {
        const int stage = step % 3, q0 = k0 + (step % nqt) * QT;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads(); /* this stage (at step 0, K and V too) is visible; every product so far is retired */
        if (step + 1 < nsteps) {
            issue(step + 1, (step + 1) % 3);
            cp_async_commit();
        }
        const uint32_t sdoc = sdo + stage * QB;
        const float *lse2c = lse2_s + stage * QT, *dlc = dl_s + stage * QT;
        abt_issue<D, QT>(s, sk, sq + stage * QB);
        abt_issue<D, QT>(dp, sv, sdoc);
        if (step > 0) ab_issue<D, QT>(dka, dsf, sq + ((step - 1) % 3) * QB);
        else empty_group();
        wgmma_wait<2>(); /* S^T only: dP^T and dk += dS^T_{step-1} Q_{step-1} keep running */
        wgmma_acc_fence(s);

        if (needs_mask(q0, QT, k0, len, window)) mask_tile<true>(s, key, q0, len, window);
#pragma unroll
        for (int i = 0; i < QT / 2; i++)
            s[i] = exp2f(s[i] * scale_log2 - lse2c[(i / 4) * 8 + 2 * (lane % 4) + (i & 1)]); /* masked: 0 */
        pack_frags<QT>(pf, s);
        ab_issue<D, QT>(dva, pf, sdoc);

        wgmma_wait<2>(); /* dP^T; the dk and dv products keep running */
        wgmma_acc_fence(dp);
#pragma unroll
        for (int i = 0; i < QT / 2; i++) dp[i] = s[i] * (dp[i] - dlc[(i / 4) * 8 + 2 * (lane % 4) + (i & 1)]);
        wgmma_wait<0>(); /* pf and dsf are free */
        pack_frags<QT>(dsf, dp);
    }
    ab_issue<D, QT>(dka, dsf, sq + ((nsteps - 1) % 3) * QB);
    wgmma_wait<0>();
    wgmma_acc_fence(dka);
    wgmma_acc_fence(dva);
    dkdv_store<D>(dk, lddk, dv, lddv, kvh, start, len, key, dka, dva, scale);
}

// ---- launchers ----

/* Raises the kernels' shared-memory limits (more than 48 KB needs an opt-in). */
void attn_bwd_sm90_init(void)
{
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_sm90_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)sm90b::dq_smem<64>()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_sm90_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)sm90b::dkdv_smem<64>()));
    /* As at D = 128, where two dq blocks need all 228 KB of the multiprocessor as shared memory. */
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_sm90_kernel<64>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
}

/* dq over the work list tiles (slots entries, 64-row tiles), after attn_delta_kernel. */
void attn_bwd_dq_sm90(bf16 *dq, int lddq, const bf16 *dout, int lddo, const float *lse2, const float *delta,
                      const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv, const int4 *tiles,
                      size_t slots, int T, int nq, int nkv, int D, float scale, int window, cudaStream_t st)
{
    CT_ASSERT(D == 64, "attention_bwd (wgmma): head_dim %d is not 64", D);
    attn_bwd_dq_sm90_kernel<64><<<(unsigned)(slots * nq), THREADS, sm90b::dq_smem<64>(), st>>>(
        dq, lddq, dout, lddo, lse2, delta, q, ldq, k, ldk, v, ldv, tiles, T, nq, nq / nkv, scale, scale * LOG2E,
        window);
    LAUNCH_CHECK();
}

/* dk, dv over the same work list, after attn_delta_kernel (independent of dq). */
void attn_bwd_dkdv_sm90(bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo, const float *lse2,
                        const float *delta, const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv,
                        const int4 *tiles, size_t slots, int T, int nq, int nkv, int D, float scale, int window,
                        cudaStream_t st)
{
    CT_ASSERT(D == 64, "attention_bwd (wgmma): head_dim %d is not 64", D);
    attn_bwd_dkdv_sm90_kernel<64><<<(unsigned)(slots * nkv), THREADS, sm90b::dkdv_smem<64>(), st>>>(
        dk, lddk, dv, lddv, dout, lddo, lse2, delta, q, ldq, k, ldk, v, ldv, tiles, T, nkv, nq / nkv, scale,
        scale * LOG2E, window);
    LAUNCH_CHECK();
}
