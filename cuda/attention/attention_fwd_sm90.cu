/* attention_fwd_sm90.cu — the varlen causal GQA flash-attention forward on Hopper's
 * warpgroup MMA (wgmma.cuh). Same contract as attention.cu's mma.sync forward
 * (layouts, visibility, GQA, sinks, lse in natural log including the sink, rows
 * past a document's end not written, padding rows zeroed by the caller): see
 * attention.cu's header. Built for D = 64, where kernel_choice.cu runs it for
 * documents averaging under 2048 tokens; the design and figures below also cover
 * D = 128, where it ran until the TMA kernel (attention_fwd_sm90_2wg.cu) replaced it.
 *
 * Schedule. Grid and work list are the mma.sync forward's (block b: work-list entry
 * b / nq, head b % nq). One warpgroup (128 threads) owns 64 queries of one head,
 * warp w rows 16 w .. 16 w + 15, and walks the 64-key tiles its rows can see:
 *   S = Q K^T   wgmma m64n64k16, Q and K both from shared memory (both K-major:
 *               rows run along D), D / 16 steps;
 *   online softmax on S's accumulator registers, in base 2 exactly as the mma.sync
 *               forward (logits scaled by scale * log2 e, masks only on tiles that
 *               straddle the diagonal, the window's edge or the document's end);
 *   O += P V    wgmma m64nDk16 with P from registers (S's accumulator layout is the
 *               A-fragment layout, wgmma.cuh) and V (keys x D, D contiguous) from
 *               shared memory as an MN-major B (the transpose bit), 4 steps.
 * Inside the warpgroup the two products overlap with the softmax, as in
 * FlashAttention-3's intra-warpgroup pipelining: iteration i issues S_i, then
 * P_{i-1} V_{i-1}, waits for S_i alone, runs tile i's softmax while the tensor
 * cores work on P_{i-1} V_{i-1}, then waits for that and rescales O by tile i's
 * correction (O then holds tiles < i at tile i's running max, as P_i will). The
 * last P V runs after the loop. Two blocks per multiprocessor overlap one block's
 * softmax with the other's products as well.
 *
 * Shared memory. Q (64 x D), K in 2 stages, V in 3, each tile as D / 64 panels of
 * 64 rows x 128 bytes in the 128-byte swizzle, 1024-byte aligned. V needs a third
 * stage because V_i is read by the product issued in iteration i + 1: the copy of
 * tile i + 1, queued at the top of iteration i, must not land on V_{i-1}, which
 * that same iteration reads. Copies are 16-byte cp.async one tile ahead, rows
 * past the document's end zero-filled. One barrier per iteration, after the copy
 * wait and the proxy fence: past it, tile i is visible to wgmma and every warp has
 * retired iteration i - 1's products, so K stage (i + 1) % 2 and V stage
 * (i + 1) % 3 are free for tile i + 1.
 *
 * Resources (ptxas, sm_90a, CUDA 13): D = 128: 214 registers, 97 KB shared, 2
 * blocks (8 warps) per multiprocessor; D = 64: 151 registers, 49 KB, 3 blocks; no
 * spills, and no wgmma serialized by ptxas (it says so when it must, C7510/C7515).
 * The same loop fed by TMA from a producer warpgroup, with two consumer
 * warpgroups on 128-query tiles: attention_fwd_sm90_2wg.cu (wgmma2).
 * Measurements: docs/kernels/attention.md. */
#include "attention.cuh"
#include "wgmma.cuh"

namespace sm90 {
/* Q + 2 K stages + 3 V stages, + slack to align the base to 1024 bytes. */
template <int D> constexpr size_t smem_bytes() { return 6 * (size_t)sw_tile_bytes<D, TILE>() + 1024; }
}

// ---- kernels ----

template <int D>
__global__ void __launch_bounds__(THREADS, 2)
attn_fwd_sm90_kernel(bf16 *out, int ldo, float *lse, const bf16 *q, int ldq, const bf16 *k, int ldk,
                     const bf16 *v, int ldv, const int4 *tiles, int nq, int group, float scale_log2,
                     int window, const float *sinks)
{
    static_assert(D == 64 || D == 128, "wgmma forward: D = 64 or 128");
    constexpr uint32_t TB = sw_tile_bytes<D, TILE>();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t sq = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t sk = sq + TB, sv = sk + 2 * TB; /* K: 2 stages, V: 3 */
    const auto [h, start, len, tile] = work_entry_of(tiles, nq);
    const int kvh = h / group;
    if (len == 0) return;
    const int q0 = ((len + TILE - 1) / TILE - 1 - tile) * TILE; /* longest tiles first */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    const auto [kmin, n] = key_tiles(q0, len, window);
    const bf16 *kb = k + (size_t)start * ldk + (size_t)kvh * D, *vb = v + (size_t)start * ldv + (size_t)kvh * D;
    load_rows_sw<D, TILE>(sq, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, min(TILE, len - q0));
    load_rows_sw<D, TILE>(sk, kb + (size_t)kmin * ldk, ldk, min(TILE, len - kmin));
    load_rows_sw<D, TILE>(sv, vb + (size_t)kmin * ldv, ldv, min(TILE, len - kmin));
    cp_async_commit();

    /* Accumulators (wgmma.cuh): s[4 j + 2 r + e] and o[4 j + 2 r + e] are row
     * row[r], column 8 j + 2 (lane % 4) + e, as the mma.sync forward's s[j][2 r + e]. */
    float s[32], o[D / 2];
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.0f;
    uint32_t p[TILE / 16][4]; /* P of the previous key tile: bf16 A fragments, one per 16 keys */
    const int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
    float m[2], l[2];
    softmax_init(m, l, sinks, h);

    for (int it = 0; it < n; it++) {
        const int k0 = kmin + it * TILE;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads(); /* tile it is visible to wgmma; iteration it - 1's products are retired */
        if (it + 1 < n) {
            const int kn = k0 + TILE;
            load_rows_sw<D, TILE>(sk + ((it + 1) & 1) * TB, kb + (size_t)kn * ldk, ldk, min(TILE, len - kn));
            load_rows_sw<D, TILE>(sv + ((it + 1) % 3) * TB, vb + (size_t)kn * ldv, ldv, min(TILE, len - kn));
            cp_async_commit();
        }

        abt_issue<D, TILE>(s, sq, sk + (it & 1) * TB);
        if (it > 0) {
            ab_issue<D, TILE>(o, p, sv + ((it - 1) % 3) * TB);
            wgmma_wait<1>(); /* S only: P_{it-1} V_{it-1} keeps running */
        } else {
            wgmma_wait<0>();
        }
        wgmma_acc_fence(s);

        if (needs_mask(q0, TILE, k0, len, window)) mask_tile<false>(s, row, k0, len, window);
        float mx[2] = {-INFINITY, -INFINITY};
        scale_row_max(s, scale_log2, mx);
        float alpha[2], mref[2];
#pragma unroll
        for (int r = 0; r < 2; r++) mref[r] = softmax_rescale(m[r], l[r], alpha[r], mx[r]);
        exp_row_sum(s, mref, l);

        wgmma_wait<0>(); /* P_{it-1} V_{it-1} is in o, and p is free */
        wgmma_acc_fence(o);
        acc_scale_rows(o, alpha);
        pack_frags<TILE>(p, s);
    }
    ab_issue<D, TILE>(o, p, sv + ((n - 1) % 3) * TB);
    wgmma_wait<0>();
    wgmma_acc_fence(o);

    fwd_store<D>(out, ldo, lse, nq, h, start, len, row, o, m, l);
}

// ---- launchers ----

/* Raises the kernel's shared-memory limit (more than 48 KB needs an opt-in). */
void attn_fwd_sm90_init(void)
{
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_sm90_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)sm90::smem_bytes<64>()));
}

/* The forward over the work list tiles (slots entries, attn_build_tiles), as
 * attention.cu's fwd_launch; the caller checked the arguments and zeroes the
 * padding rows. */
void attn_fwd_sm90(bf16 *out, int ldo, float *lse, const bf16 *q, int ldq, const bf16 *k, int ldk,
                   const bf16 *v, int ldv, const int4 *tiles, size_t slots, int nq, int nkv, int D,
                   float scale, int window, const float *sinks, cudaStream_t st)
{
    CT_ASSERT(D == 64, "attention_fwd (wgmma): head_dim %d is not 64", D);
    attn_fwd_sm90_kernel<64><<<(unsigned)(slots * nq), THREADS, sm90::smem_bytes<64>(), st>>>(
        out, ldo, lse, q, ldq, k, ldk, v, ldv, tiles, nq, nq / nkv, scale * LOG2E, window, sinks);
    LAUNCH_CHECK();
}
