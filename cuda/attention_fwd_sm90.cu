/* attention_fwd_sm90.cu — the varlen causal GQA flash-attention forward on Hopper's
 * warpgroup MMA (wgmma.cuh). Same contract as attention.cu's mma.sync forward
 * (layouts, visibility, GQA, sinks, lse in natural log including the sink, rows
 * past a document's end not written, padding rows zeroed by the caller): see
 * attention.cu's header. CTUNE_ATTN_FWD=wgmma selects it for D = 64 and 128
 * (attention.cu's dispatch; D = 32 always runs mma.sync).
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
 * On the H200 (2026-11-30) every attention test passes and hd128 4k documents
 * run at 344 TFLOP/s (mma.sync: 242; bench/attn_bench.c). Later: TMA
 * copies from a producer warp, 128-query tiles (two consumer warpgroups sharing
 * K/V), ping-pong scheduling between warpgroups. */
#include "attention.cuh"
#include "wgmma.cuh"

namespace sm90 {
constexpr uint32_t PANEL = TILE * 128; /* 64 rows x 64 columns: one swizzled panel */
template <int D> __host__ __device__ constexpr uint32_t tile_bytes() { return (uint32_t)TILE * D * 2; }
/* Q + 2 K stages + 3 V stages, + slack to align the base to 1024 bytes. */
template <int D> constexpr size_t smem_bytes() { return 6 * (size_t)tile_bytes<D>() + 1024; }
}

// ---- kernels ----

/* 64 x D tile from global (row r at g + r*ld) into the swizzled panels at shared
 * address s, asynchronously; rows >= valid (valid >= 1) are zero-filled. 16-byte
 * chunk c of row r goes to panel c / 8 at swz(r, c % 8). */
template <int D>
__device__ __forceinline__ void load_tile_sw(uint32_t s, const bf16 *g, size_t ld, int valid)
{
    constexpr int CH = D / 8, N = TILE * CH;
    static_assert(N % THREADS == 0, "tile chunks must divide evenly over the block");
#pragma unroll
    for (int it = 0; it < N / THREADS; it++) {
        const int c = it * THREADS + threadIdx.x, r = c / CH, ch = c % CH;
        const bool ok = r < valid;
        cp_async16_s(s + (ch / 8) * sm90::PANEL + swz(r, ch % 8), g + (size_t)(ok ? r : 0) * ld + ch * 8, ok);
    }
}

/* Issues s = Q K^T for one key tile as one wgmma group. Step ks covers head dims
 * [16 ks, 16 ks + 16): panel ks / 4, 32 bytes per step into the 128-byte rows.
 * Both issue functions start with a fence: the softmax wrote s, o and p since
 * the last products (without it in the branch that issues P V, ptxas injects
 * one itself and says so, C7519). */
template <int D>
__device__ __forceinline__ void qk_issue(float (&s)[32], uint32_t sq, uint32_t sk)
{
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const uint32_t off = (ks / 4) * sm90::PANEL + (ks % 4) * 32;
        wgmma_m64n64k16_ss<false>(s, wgmma_desc(sq + off, 16, 1024), wgmma_desc(sk + off, 16, 1024), ks > 0);
    }
    wgmma_commit();
}

/* Issues o += P V for one key tile as one wgmma group. Step kk covers keys
 * [16 kk, 16 kk + 16): P's fragment p[kk], V's rows from 16 kk (2048 bytes per
 * step), its D columns in D / 64 panels (LBO = one panel). */
template <int D>
__device__ __forceinline__ void pv_issue(float (&o)[D / 2], const uint32_t (&p)[TILE / 16][4], uint32_t sv)
{
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < TILE / 16; kk++) {
        const uint64_t db = wgmma_desc(sv + kk * 16 * 128, sm90::PANEL, 1024);
        if constexpr (D == 128) wgmma_m64n128k16_rs<true>(o, p[kk], db, 1);
        else wgmma_m64n64k16_rs<true>(o, p[kk], db, 1);
    }
    wgmma_commit();
}

template <int D>
__global__ void __launch_bounds__(THREADS, 2)
attn_fwd_sm90_kernel(bf16 *out, int ldo, float *lse, const bf16 *q, int ldq, const bf16 *k, int ldk,
                     const bf16 *v, int ldv, const int4 *tiles, int nq, int group, float scale_log2,
                     int window, const float *sinks)
{
    static_assert(D == 64 || D == 128, "wgmma forward: D = 64 or 128");
    constexpr uint32_t TB = sm90::tile_bytes<D>();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t sq = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t sk = sq + TB, sv = sk + 2 * TB; /* K: 2 stages, V: 3 */
    const int h = blockIdx.x % nq, kvh = h / group;
    const int4 tl = tiles[blockIdx.x / nq];
    const int start = tl.x, len = tl.y;
    if (len == 0) return;
    const int q0 = ((len + TILE - 1) / TILE - 1 - tl.z) * TILE; /* longest tiles first */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    const int kmin = window > 0 ? max(0, q0 - window + 1) / TILE * TILE : 0;
    const int kend = min(len, q0 + TILE);
    const int n = (kend - kmin + TILE - 1) / TILE;
    const bf16 *kb = k + (size_t)start * ldk + (size_t)kvh * D, *vb = v + (size_t)start * ldv + (size_t)kvh * D;
    load_tile_sw<D>(sq, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, min(TILE, len - q0));
    load_tile_sw<D>(sk, kb + (size_t)kmin * ldk, ldk, min(TILE, len - kmin));
    load_tile_sw<D>(sv, vb + (size_t)kmin * ldv, ldv, min(TILE, len - kmin));
    cp_async_commit();

    /* Accumulators (wgmma.cuh): s[4 j + 2 r + e] and o[4 j + 2 r + e] are row
     * row[r], column 8 j + 2 (lane % 4) + e, as the mma.sync forward's s[j][2 r + e]. */
    float s[32], o[D / 2];
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.0f;
    uint32_t p[TILE / 16][4]; /* P of the previous key tile: bf16 A fragments, one per 16 keys */
    /* The sink is a logit with no value row: it starts the running max and (once
     * per row) the sum. */
    const int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
    float m[2], l[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        m[r] = sinks ? sinks[h] * LOG2E : -INFINITY;
        l[r] = sinks && (lane % 4) == 0 ? 1.0f : 0.0f;
    }

    for (int it = 0; it < n; it++) {
        const int k0 = kmin + it * TILE;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads(); /* tile it is visible to wgmma; iteration it - 1's products are retired */
        if (it + 1 < n) {
            const int kn = k0 + TILE;
            load_tile_sw<D>(sk + ((it + 1) & 1) * TB, kb + (size_t)kn * ldk, ldk, min(TILE, len - kn));
            load_tile_sw<D>(sv + ((it + 1) % 3) * TB, vb + (size_t)kn * ldv, ldv, min(TILE, len - kn));
            cp_async_commit();
        }

        qk_issue<D>(s, sq, sk + (it & 1) * TB);
        if (it > 0) {
            pv_issue<D>(o, p, sv + ((it - 1) % 3) * TB);
            wgmma_wait<1>(); /* S only: P_{it-1} V_{it-1} keeps running */
        } else {
            wgmma_wait<0>();
        }
        wgmma_acc_fence(s);

        if (needs_mask(q0, TILE, k0, len, window)) {
#pragma unroll
            for (int j = 0; j < TILE / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!visible(row[e / 2], k0 + j * 8 + 2 * (lane % 4) + (e & 1), len, window))
                        s[4 * j + e] = -INFINITY;
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < 32; i++) {
            s[i] *= scale_log2;
            mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
        }
        float alpha[2], mref[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mn = fmaxf(m[r], mx[r]);
            /* A row that has seen nothing yet keeps m = -inf: exponentiate against 0
             * so that -inf - -inf never makes a NaN. */
            mref[r] = mn == -INFINITY ? 0.0f : mn;
            alpha[r] = exp2f(m[r] - mref[r]);
            m[r] = mn;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int i = 0; i < 32; i++) {
            s[i] = exp2f(s[i] - mref[(i >> 1) & 1]);
            l[(i >> 1) & 1] += s[i];
        }

        wgmma_wait<0>(); /* P_{it-1} V_{it-1} is in o, and p is free */
        wgmma_acc_fence(o);
#pragma unroll
        for (int i = 0; i < D / 2; i++) o[i] *= alpha[(i >> 1) & 1];
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++)
#pragma unroll
            for (int r = 0; r < 4; r++) p[kk][r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
    }
    pv_issue<D>(o, p, sv + ((n - 1) % 3) * TB);
    wgmma_wait<0>();
    wgmma_acc_fence(o);

#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row[r] >= len) continue;
        size_t t = (size_t)start + row[r];
        float inv = 1.0f / l[r];
        bf16 *orow = out + t * ldo + (size_t)h * D + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            *(__nv_bfloat162 *)(orow + j * 8) =
                __floats2bfloat162_rn(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
        if (lane % 4 == 0) lse[t * nq + h] = (m[r] + log2f(l[r])) * LN2;
    }
}

// ---- launchers ----

template <int D> static void fwd_sm90_init_d()
{
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_sm90_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)sm90::smem_bytes<D>()));
}

/* Raises both instantiations' shared-memory limit (more than 48 KB needs an opt-in). */
void attn_fwd_sm90_init(void)
{
    fwd_sm90_init_d<64>();
    fwd_sm90_init_d<128>();
}

/* The forward over the work list tiles (slots entries, attn_build_tiles), as
 * attention.cu's fwd_launch; the caller checked the arguments and zeroes the
 * padding rows. */
void attn_fwd_sm90(bf16 *out, int ldo, float *lse, const bf16 *q, int ldq, const bf16 *k, int ldk,
                   const bf16 *v, int ldv, const int4 *tiles, size_t slots, int nq, int nkv, int D,
                   float scale, int window, const float *sinks, cudaStream_t st)
{
    CT_ASSERT(D == 64 || D == 128, "attention_fwd (wgmma): head_dim %d is not 64 or 128", D);
    const unsigned grid = (unsigned)(slots * nq);
    if (D == 64)
        attn_fwd_sm90_kernel<64><<<grid, THREADS, sm90::smem_bytes<64>(), st>>>(
            out, ldo, lse, q, ldq, k, ldk, v, ldv, tiles, nq, nq / nkv, scale * LOG2E, window, sinks);
    else
        attn_fwd_sm90_kernel<128><<<grid, THREADS, sm90::smem_bytes<128>(), st>>>(
            out, ldo, lse, q, ldq, k, ldk, v, ldv, tiles, nq, nq / nkv, scale * LOG2E, window, sinks);
    LAUNCH_CHECK();
}
