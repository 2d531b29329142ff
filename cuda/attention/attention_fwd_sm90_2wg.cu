/* attention_fwd_sm90_2wg.cu — the varlen causal GQA flash-attention forward on
 * Hopper in FlashAttention-3's warp-specialized form: TMA loads from a producer
 * warpgroup, two consumer warpgroups on wgmma sharing every K/V tile. Same
 * contract as attention.cu's forwards (layouts, visibility, GQA, sinks, lse in
 * natural log including the sink, rows past a document's end not written, padding
 * rows zeroed by the caller): see attention.cu's header. kernel_choice.cu runs it
 * at D = 128, and at D = 64 for documents averaging 2048 tokens or more.
 *
 * Schedule. The work list has 128-query tiles (attn_build_tiles with rows 128,
 * longest tiles of a document first); block b takes entry b / nq and head b % nq.
 * A block is three warpgroups (384 threads, one block per multiprocessor):
 *   warpgroup 0, the producer, gives registers back (setmaxnreg.dec to 24) and one
 *     thread issues every load as TMA boxes (hopper_sync.cuh): the block's Q once,
 *     then K and V tiles of 128 keys into STAGES-deep rings;
 *   warpgroups 1 and 2, the consumers (setmaxnreg.inc to 240), own queries
 *     [q0, q0 + 64) and [q0 + 64, q0 + 128), walk the same key tiles (those the
 *     block's last query sees, from the window's lower edge of its first), and run
 *     attention_fwd_sm90.cu's loop on them: S = Q K^T (wgmma m64n128k16, both from
 *     shared memory), the online softmax on S's registers (masks only where
 *     needs_mask says), O += P V (m64nDk16, P from registers), with P_{i-1} V_{i-1}
 *     in flight during tile i's softmax.
 * Synchronization is by mbarriers: full_k[s] / full_v[s] complete when the TMA
 * bytes of stage s have landed (one producer arrival + transaction bytes),
 * empty_k[s] / empty_v[s] when all 256 consumer threads have retired the wgmma
 * that read it (K after S_i, V after P_i V_i); the i-th use of a stage waits for
 * phase parity (i / STAGES) & 1. The consumers take turns issuing their products
 * (ping-pong over named barriers 1 and 2, FlashAttention-3's inter-warpgroup
 * overlap): one warpgroup's softmax runs while the other's products occupy the
 * tensor cores. A consumer hands its turn over once its S has landed (an
 * arrive between the issue and the wait would make ptxas serialize the wgmma),
 * so the other's products queue behind its P V.
 *
 * Documents. The tensor maps span all T rows of q, k and v (host sizes: the
 * documents' ends are on the device), so a tile that crosses a document's end
 * reads the next document's rows (or zeros past T). They never count: such a key
 * tile always takes the mask (a key past len is above the diagonal of every
 * query inside the document, and a query past len is masked outright), so its
 * logits are -inf and its P exactly 0; rows of such query tiles are never stored.
 * What the mma.sync and wgmma forwards zero-fill, this one multiplies by P = 0:
 * the same result unless those foreign V rows hold Inf or NaN.
 *
 * Shared memory (1024-byte aligned, 128-byte swizzle as wgmma.cuh, which TMA's
 * SWIZZLE_128B writes): Q as two 64 x D tiles (one per consumer), STAGES K and V
 * tiles of 128 x D (D / 64 panels of 128 rows x 128 bytes), then the mbarriers.
 * D = 128: 32 + 2 x 2 x 32 KB = 160 KB; D = 64: 80 KB.
 *
 * Resources (ptxas and nvdisasm, sm_90a, CUDA 13): the block is launched at 168
 * registers a thread (384 threads, one block per multiprocessor: 24 + 2 x 240 =
 * 3 x 168, so the consumers' setmaxnreg.inc is served by the producer's .dec);
 * the SASS has the consumers' code use registers up to R205 (D = 128) and R180
 * (D = 64), the producer's up to R13. No spills, no wgmma serialized (C7510/C7514/C7515). Shared
 * memory 161 KB at D = 128 (a third stage would fit: 225 KB) and 81 KB at D = 64.
 * The default at D = 128 (and at D = 64 for long documents: attention.cu's
 * fwd_kind_for). Measurements: docs/kernels/attention.md. */
#include "attention.cuh"
#include "hopper_sync.cuh"
#include "wgmma.cuh"

#include <cstdio>

namespace sm90_2wg {
constexpr int QROWS = 2 * TILE;            /* queries per block: two consumers of 64 */
constexpr int KEYS = 128;                  /* keys per K/V tile */
constexpr int STAGES = 2;                  /* K and V ring depth */
constexpr int BLOCK = 3 * THREADS;         /* producer + two consumer warpgroups */
constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240; /* 24 + 2 x 240 = 3 x 168: what the block holds */
constexpr int BAR_TURN = 1;                /* named barriers BAR_TURN + c: consumer c may issue */

/* Bytes of one consumer's Q tile and of one K or V stage. */
template <int D> __host__ __device__ constexpr uint32_t q_bytes() { return sw_tile_bytes<D, TILE>(); }
template <int D> __host__ __device__ constexpr uint32_t kv_bytes() { return sw_tile_bytes<D, KEYS>(); }
/* Q, the K and V rings, the 4 STAGES + 1 mbarriers, + slack to align the base to 1024 bytes. */
template <int D> constexpr size_t smem_bytes()
{
    return 2 * (size_t)q_bytes<D>() + 2 * STAGES * (size_t)kv_bytes<D>() + 8 * (4 * STAGES + 1) + 1024;
}

/* The block's mbarriers, 8 bytes each from base: full_k, empty_k, full_v, empty_v
 * (STAGES each), then full_q. */
struct bars {
    uint32_t base;
    __device__ uint32_t full_k(int s) const { return base + 8 * s; }
    __device__ uint32_t empty_k(int s) const { return base + 8 * (STAGES + s); }
    __device__ uint32_t full_v(int s) const { return base + 8 * (2 * STAGES + s); }
    __device__ uint32_t empty_v(int s) const { return base + 8 * (3 * STAGES + s); }
    __device__ uint32_t full_q() const { return base + 8 * 4 * STAGES; }
};
}

// ---- kernels ----

/* The producer thread: the block's Q (rows qrow..qrow + 127 of head h, one box per
 * consumer and 64-column panel), then K and V tiles it = 0 .. n - 1 (rows krow +
 * 128 it, kv head kvh), each into ring stage it % STAGES once the consumers have
 * emptied it. */
template <int D>
__device__ __forceinline__ void fwd_2wg_produce(const CUtensorMap *tq, const CUtensorMap *tk, const CUtensorMap *tv,
                                                uint32_t sq, uint32_t sk, uint32_t sv, sm90_2wg::bars b, int h,
                                                int kvh, int qrow, int krow, int n)
{
    using namespace sm90_2wg;
    mbar_arrive_expect_tx(b.full_q(), 2 * q_bytes<D>());
#pragma unroll
    for (int c = 0; c < 2; c++)
#pragma unroll
        for (int pn = 0; pn < D / 64; pn++)
            tma_load_2d(sq + c * q_bytes<D>() + pn * sw_panel<TILE>(), tq, h * D + 64 * pn, qrow + c * TILE,
                        b.full_q());
    for (int it = 0; it < n; it++) {
        const int s = it % STAGES, row = krow + it * KEYS;
        const uint32_t parity = ((it / STAGES) & 1) ^ 1; /* the previous use's release */
        if (it >= STAGES) mbar_wait(b.empty_k(s), parity);
        mbar_arrive_expect_tx(b.full_k(s), kv_bytes<D>());
#pragma unroll
        for (int pn = 0; pn < D / 64; pn++)
            tma_load_2d(sk + s * kv_bytes<D>() + pn * sw_panel<KEYS>(), tk, kvh * D + 64 * pn, row, b.full_k(s));
        if (it >= STAGES) mbar_wait(b.empty_v(s), parity);
        mbar_arrive_expect_tx(b.full_v(s), kv_bytes<D>());
#pragma unroll
        for (int pn = 0; pn < D / 64; pn++)
            tma_load_2d(sv + s * kv_bytes<D>() + pn * sw_panel<KEYS>(), tv, kvh * D + 64 * pn, row, b.full_v(s));
    }
}

/* Consumer c (0 or 1): queries [q0 + 64 c, q0 + 64 c + 64) of head h against the
 * n key tiles from kmin; writes out and lse for its rows inside the document. */
template <int D>
__device__ __forceinline__ void fwd_2wg_consume(bf16 *out, int ldo, float *lse, int nq, int h, int start, int len,
                                                int q0, int kmin, int n, int c, float scale_log2, int window,
                                                const float *sinks, uint32_t sq, uint32_t sk, uint32_t sv,
                                                sm90_2wg::bars b)
{
    using namespace sm90_2wg;
    constexpr uint32_t KB = kv_bytes<D>();
    const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    const int qs = q0 + c * TILE;
    const uint32_t sqc = sq + c * q_bytes<D>();

    /* Accumulators as attention_fwd_sm90.cu's: s[4 j + 2 r + e] and o[4 j + 2 r + e]
     * are row row[r], column 8 j + 2 (lane % 4) + e. */
    float s[KEYS / 2], o[D / 2];
#pragma unroll
    for (int i = 0; i < KEYS / 2; i++) s[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.0f;
    uint32_t p[KEYS / 16][4]; /* P of the previous key tile: bf16 A fragments, one per 16 keys */
    const int row[2] = {qs + warp * 16 + lane / 4, qs + warp * 16 + lane / 4 + 8};
    float m[2], l[2];
    softmax_init(m, l, sinks, h);

    if (c == 1) bar_arrive<2 * THREADS>(BAR_TURN); /* consumer 0 issues first */
    mbar_wait(b.full_q(), 0);
    for (int it = 0; it < n; it++) {
        const int k0 = kmin + it * KEYS, st = it % STAGES, pst = (it + STAGES - 1) % STAGES;
        bar_sync<2 * THREADS>(BAR_TURN + c);
        mbar_wait(b.full_k(st), (it / STAGES) & 1);
        abt_issue<D, KEYS>(s, sqc, sk + st * KB);
        if (it > 0) {
            mbar_wait(b.full_v(pst), ((it - 1) / STAGES) & 1);
            ab_issue<D, KEYS>(o, p, sv + pst * KB);
            wgmma_wait<1>(); /* S only: P_{it-1} V_{it-1} keeps running */
        } else {
            wgmma_wait<0>();
        }
        wgmma_acc_fence(s);
        /* The other consumer's turn (consumer 1's last turn has no taker). Handed
         * over once S is in registers: a bar.arrive between the issue and the wait
         * makes ptxas serialize the wgmma (C7514). */
        if (c == 0 || it + 1 < n) bar_arrive<2 * THREADS>(BAR_TURN + 1 - c);
        mbar_arrive(b.empty_k(st));

        if (needs_mask<KEYS>(qs, TILE, k0, len, window)) mask_tile<false>(s, row, k0, len, window);
        float mx[2] = {-INFINITY, -INFINITY};
        scale_row_max(s, scale_log2, mx);
        float alpha[2], mref[2];
#pragma unroll
        for (int r = 0; r < 2; r++) mref[r] = softmax_rescale(m[r], l[r], alpha[r], mx[r]);
        exp_row_sum(s, mref, l);

        wgmma_wait<0>(); /* P_{it-1} V_{it-1} is in o, and p and V stage pst are free */
        wgmma_acc_fence(o);
        if (it > 0) mbar_arrive(b.empty_v(pst));
        acc_scale_rows(o, alpha);
        pack_frags<KEYS>(p, s);
    }
    const int lst = (n - 1) % STAGES;
    mbar_wait(b.full_v(lst), ((n - 1) / STAGES) & 1);
    ab_issue<D, KEYS>(o, p, sv + lst * KB);
    wgmma_wait<0>();
    wgmma_acc_fence(o);

    fwd_store<D>(out, ldo, lse, nq, h, start, len, row, o, m, l);
}

template <int D>
__global__ void __launch_bounds__(sm90_2wg::BLOCK, 1)
attn_fwd_sm90_2wg_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                         const __grid_constant__ CUtensorMap tv, bf16 *out, int ldo, float *lse,
                         const int4 *tiles, int nq, int group, float scale_log2, int window, const float *sinks)
{
    using namespace sm90_2wg;
    static_assert(D == 64 || D == 128, "wgmma2 forward: D = 64 or 128");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t sq = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t sk = sq + 2 * q_bytes<D>(), sv = sk + STAGES * kv_bytes<D>();
    const bars b = {sv + STAGES * kv_bytes<D>()};
    const auto [h, start, len, tile] = work_entry_of(tiles, nq);
    if (len == 0) return;
    const int q0 = ((len + QROWS - 1) / QROWS - 1 - tile) * QROWS; /* longest tiles first */
    const auto [kmin, n] = key_tiles<QROWS, KEYS>(q0, len, window);

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(b.full_k(s), 1);
            mbar_init(b.full_v(s), 1);
            mbar_init(b.empty_k(s), 2 * THREADS);
            mbar_init(b.empty_v(s), 2 * THREADS);
        }
        mbar_init(b.full_q(), 1);
        mbar_init_fence();
    }
    __syncthreads();

    const int wg = threadIdx.x / THREADS;
    if (wg == 0) {
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0)
            fwd_2wg_produce<D>(&tq, &tk, &tv, sq, sk, sv, b, h, h / group, start + q0, start + kmin, n);
    } else {
        regs_inc<CONSUMER_REGS>();
        fwd_2wg_consume<D>(out, ldo, lse, nq, h, start, len, q0, kmin, n, wg - 1, scale_log2, window, sinks, sq,
                           sk, sv, b);
    }
}

// ---- launchers ----

template <int D> static void fwd_2wg_init_d()
{
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_sm90_2wg_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)sm90_2wg::smem_bytes<D>()));
}

/* Raises both instantiations' shared-memory limit and fetches the tensor-map
 * encoder (so that a driver without one fails here, not mid-training). */
void attn_fwd_sm90_2wg_init(void)
{
    fwd_2wg_init_d<64>();
    fwd_2wg_init_d<128>();
    (void)tensor_map_encoder();
}

/* A TMA map over the (T, cols) bf16 matrix at base (token stride ld elements):
 * boxes of 64 columns (128 bytes, one swizzled panel row) x box_rows rows,
 * written to shared memory in the 128-byte swizzle; elements past T read as 0. */
static CUtensorMap tile_map(const bf16 *base, int cols, int T, int ld, int box_rows)
{
    const cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)T}, stride[1] = {(cuuint64_t)ld * sizeof(bf16)};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
    return tensor_map_bf16(base, 2, dim, stride, box);
}

/* The forward over the work list tiles (slots entries of 128 queries,
 * attn_build_tiles with rows 128), as attention_fwd_sm90.cu's launch; T sizes
 * the tensor maps. The caller checked the arguments (16-byte alignment, strides
 * a multiple of 8: what TMA needs too) and zeroes the padding rows. */
void attn_fwd_sm90_2wg(bf16 *out, int ldo, float *lse, const bf16 *q, int ldq, const bf16 *k, int ldk,
                       const bf16 *v, int ldv, const int4 *tiles, size_t slots, int T, int nq, int nkv, int D,
                       float scale, int window, const float *sinks, cudaStream_t st)
{
    CT_ASSERT(D == 64 || D == 128, "attention_fwd (wgmma2): head_dim %d is not 64 or 128", D);
    const CUtensorMap tq = tile_map(q, nq * D, T, ldq, TILE);
    const CUtensorMap tk = tile_map(k, nkv * D, T, ldk, sm90_2wg::KEYS);
    const CUtensorMap tv = tile_map(v, nkv * D, T, ldv, sm90_2wg::KEYS);
    const unsigned grid = (unsigned)(slots * nq);
    if (D == 64)
        attn_fwd_sm90_2wg_kernel<64><<<grid, sm90_2wg::BLOCK, sm90_2wg::smem_bytes<64>(), st>>>(
            tq, tk, tv, out, ldo, lse, tiles, nq, nq / nkv, scale * LOG2E, window, sinks);
    else
        attn_fwd_sm90_2wg_kernel<128><<<grid, sm90_2wg::BLOCK, sm90_2wg::smem_bytes<128>(), st>>>(
            tq, tk, tv, out, ldo, lse, tiles, nq, nq / nkv, scale * LOG2E, window, sinks);
    LAUNCH_CHECK();
}
