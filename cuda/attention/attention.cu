/* attention.cu — varlen causal GQA flash attention: the mma.sync forward, the work
 * list, the padding rows and the choice of kernels; attention_bwd.cu holds the
 * backward, attention.cuh what every attention file shares. This comment is the
 * contract of all of them; docs/kernels/attention.md has the design in detail,
 * the measurements and the history.
 *
 * Layouts: q (T, nq, D), k and v (T, nkv, D), out and dout (T, nq, D), each with
 * its own token stride (ld*, elements; q/k/v are column slices of the fused qkv).
 * Documents are [cu_seqlens[d], cu_seqlens[d+1]), read from device memory; lse
 * (T, nq) fp32 holds the natural-log log-sum-exp of the scaled logits including
 * the sink logit when sinks != NULL, so that exp(s - lse) is the probability the
 * forward used. Query head h reads kv head h / (nq / nkv). Key j is visible from
 * query i (positions inside the document) iff j <= i and, when window > 0,
 * j > i - window. No T x T tensor exists: softmax is computed online per tile.
 * Rows past cu_seqlens[n_docs] (padding) get zero outputs, lse and gradients.
 *
 * Work list: documents are cut into 64-row tiles (128-row for the two-warpgroup
 * kernels) that never cross a document. A one-block kernel scans cu_seqlens on
 * the device into one (start, len, tile index) entry per tile; block b of the
 * 1-D grid takes entry b / heads and head b % heads, so the heads of a tile run
 * together, the longest tiles of a document first. The host sizes the list from
 * T, n_docs and max_seqlen only (no sync); surplus entries have len 0.
 *
 * Kernels (chosen per call by kernel_choice.cu): D = 32 runs mma.sync (this
 * file's forward, attention_bwd.cu's backward), and so does D = 256, with
 * 32-key steps in the forward and dq and dk/dv on separate warps in the
 * backward (attn_bwd_dkdv_split_kernel). The forward runs
 * attention_fwd_sm90_2wg.cu (TMA producer, two consumer warpgroups, 128-query
 * tiles) at D = 128, and at D = 64 when documents average 2048 tokens or more,
 * else attention_fwd_sm90.cu (one warpgroup, 64 queries); the backward runs dq
 * and dk/dv on two warpgroups per 128-row tile at D = 128
 * (attention_bwd_dq_2wg.cu, attention_bwd_dkdv_2wg.cu) and on one
 * (attention_bwd_sm90.cu) at D = 64. Every backward is delta = rowsum(dout * out)
 * and then dq and dk/dv as two kernels without atomics: gradients are
 * bit-identical run to run. */
#include "attention.cuh"
#include "kernel_choice.cuh"

#define TAIL_ROWS 16       /* rows per block of the padding-rows kernel */
#define TILES_THREADS 1024 /* the work-list kernel's one block */

// ---- kernels ----

/* The work list (see the header): tiles[t] = {start, len, tile index in its
 * document, 0} for t < the tile count, {0, 0, 0, 0} up to n_slots, with tiles of
 * ROWS queries. tile_off (n_docs + 1) receives each document's first tile. One block. */
template <int ROWS>
__global__ void __launch_bounds__(TILES_THREADS)
attn_tiles_kernel(int4 *tiles, int *tile_off, const int32_t *cu_seqlens, int n_docs, int n_slots)
{
    __shared__ int warp_sum[TILES_THREADS / 32];
    __shared__ int carry;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int d0 = 0; d0 < n_docs; d0 += TILES_THREADS) {
        int d = d0 + threadIdx.x;
        int n = d < n_docs ? (cu_seqlens[d + 1] - cu_seqlens[d] + ROWS - 1) / ROWS : 0;
        int x = n; /* inclusive scan: lanes, then warps */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) warp_sum[warp] = x;
        __syncthreads();
        if (warp == 0) {
            int w = warp_sum[lane];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, w, o);
                if (lane >= o) w += y;
            }
            warp_sum[lane] = w;
        }
        __syncthreads();
        int incl = carry + x + (warp > 0 ? warp_sum[warp - 1] : 0);
        if (d < n_docs) tile_off[d] = incl - n;
        __syncthreads(); /* carry and warp_sum are read */
        if (threadIdx.x == TILES_THREADS - 1) carry = incl;
        __syncthreads();
    }
    const int total = carry;
    /* __syncthreads above made every tile_off store visible to the whole block. */
    for (int t = threadIdx.x; t < n_slots; t += TILES_THREADS) {
        int4 e = make_int4(0, 0, 0, 0);
        if (t < total) {
            int lo = 0, hi = n_docs - 1; /* the last d with tile_off[d] <= t: it has tiles */
            while (lo < hi) {
                int mid = (lo + hi + 1) / 2;
                if (tile_off[mid] <= t) lo = mid; else hi = mid - 1;
            }
            int s = cu_seqlens[lo];
            e = make_int4(s, cu_seqlens[lo + 1] - s, t - tile_off[lo], 0);
        }
        tiles[t] = e;
    }
}

template <int D>
__global__ void __launch_bounds__(THREADS)
attn_fwd_kernel(bf16 *out, int ldo, float *lse, const bf16 *q, int ldq, const bf16 *k, int ldk,
                const bf16 *v, int ldv, const int4 *tiles, int nq, int group,
                float scale_log2, int window, const float *sinks)
{
    constexpr int KT = Cfg<D>::KT, TS = TILE * Cfg<D>::ROW, KS = KT * Cfg<D>::ROW;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Qs = (bf16 *)smem_raw, *Ks = Qs + TS, *Vs = Ks + 2 * KS; /* K, V: two stages each */
    const auto [h, start, len, tile] = work_entry_of(tiles, nq);
    const int kvh = h / group;
    if (len == 0) return;
    const int q0 = ((len + TILE - 1) / TILE - 1 - tile) * TILE; /* longest tiles first */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    const auto [kmin, n] = key_tiles<TILE, KT>(q0, len, window);
    const bf16 *kb = k + (size_t)start * ldk + (size_t)kvh * D, *vb = v + (size_t)start * ldv + (size_t)kvh * D;
    load_tile_async<D, TILE>(Qs, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, min(TILE, len - q0));
    cp_async_commit();
    load_tile_async<D, KT>(Ks, kb + (size_t)kmin * ldk, ldk, min(KT, len - kmin));
    load_tile_async<D, KT>(Vs, vb + (size_t)kmin * ldv, ldv, min(KT, len - kmin));
    cp_async_commit();
    cp_async_wait<1>(); /* Q has landed */
    __syncthreads();
    /* Q's A fragments stay in registers up to D = 128; at 256 they are 64 more
     * than fit beside O (ptxas spills), so every key tile reads them again. */
    constexpr bool Q_IN_REGS = D <= 128;
    uint32_t qf[Q_IN_REGS ? D / 16 : 1][4];
    if constexpr (Q_IN_REGS) {
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) ldsm_a<D>(qf[kk], Qs, warp * 16, kk * 16);
    }

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    /* Rows r = 0 (row g) and 1 (row g + 8) of this lane. */
    const int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
    float m[2], l[2];
    softmax_init(m, l, sinks, h);

    for (int it = 0; it < n; it++) {
        const int k0 = kmin + it * KT;
        const bf16 *Kc = Ks + (it & 1) * KS, *Vc = Vs + (it & 1) * KS;
        kv_prefetch<D, KT>(Ks + ((it + 1) & 1) * KS, Vs + ((it + 1) & 1) * KS, kb, ldk, vb, ldv, it + 1 < n,
                           k0 + KT, len);
        __syncthreads(); /* stage it & 1 has landed for every thread's copies */

        float s[KT / 8][4];
#pragma unroll
        for (int i = 0; i < KT / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t a[4];
            if constexpr (Q_IN_REGS) a[0] = qf[kk][0], a[1] = qf[kk][1], a[2] = qf[kk][2], a[3] = qf[kk][3];
            else ldsm_a<D>(a, Qs, warp * 16, kk * 16);
#pragma unroll
            for (int j = 0; j < KT / 16; j++) {
                uint32_t b[4];
                ldsm_bt<D>(b, Kc, j * 16, kk * 16);
                mma16816(s[2 * j], a, b[0], b[1]);
                mma16816(s[2 * j + 1], a, b[2], b[3]);
            }
        }
        /* mask_tile, written out: through the helper ptxas schedules this kernel
         * differently (the other kernels call it). */
        if (needs_mask<KT>(q0, TILE, k0, len, window)) {
#pragma unroll
            for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!visible(row[e / 2], k0 + nt * 8 + 2 * (lane % 4) + (e & 1), len, window))
                        s[nt][e] = -INFINITY;
        }

        float mx[2] = {-INFINITY, -INFINITY};
        scale_row_max(s, scale_log2, mx);
        float alpha[2], mref[2];
#pragma unroll
        for (int r = 0; r < 2; r++) mref[r] = softmax_rescale(m[r], l[r], alpha[r], mx[r]);
        exp_row_sum(s, mref, l);
        acc_scale_rows(o, alpha);
        mma_pb<D, KT>(o, s, Vc);
        __syncthreads(); /* stage it & 1 is consumed: the next prefetch may overwrite it */
    }

    fwd_store<D>(out, ldo, lse, nq, h, start, len, row, o, m, l);
}

/* Rows past cu_seqlens[n_docs] belong to no document: their outputs (and lse)
 * are zero, as the CPU reference defines. The end is only known on the device,
 * so each block of TAIL_ROWS rows checks it and nearly all exit at once. */
__global__ void zero_tail_kernel(tail_zero z, const int32_t *cu_seqlens, int n_docs, int T)
{
    int end = cu_seqlens[n_docs];
    int r0 = blockIdx.x * TAIL_ROWS, r1 = min(T, r0 + TAIL_ROWS);
    for (int r = max(r0, end); r < r1; r++) {
        for (int i = 0; i < 3; i++) {
            if (!z.p[i]) continue;
            for (int c = threadIdx.x * 8; c < z.cols[i]; c += blockDim.x * 8)
                *(uint4 *)(z.p[i] + (size_t)r * z.ld[i] + c) = make_uint4(0, 0, 0, 0);
        }
        if (z.f)
            for (int c = threadIdx.x; c < z.fcols; c += blockDim.x) z.f[(size_t)r * z.fcols + c] = 0.0f;
    }
}

// ---- launchers ----

void attn_zero_tail(cudaStream_t st, const tail_zero &z, const int32_t *cu_seqlens, int n_docs, int T)
{
    zero_tail_kernel<<<grid_for((size_t)T, TAIL_ROWS), 128, 0, st>>>(z, cu_seqlens, n_docs, T);
    LAUNCH_CHECK();
}

/* Entries of the work list: at least the number of tiles, from host sizes only.
 * sum_d ceil(len_d / R) <= (sum_d len_d + (R - 1) n_docs) / R <= (T + (R - 1) n_docs) / R,
 * and <= n_docs ceil(max_seqlen / R), for R = rows. */
size_t attn_tile_slots(int T, int n_docs, int max_seqlen, int rows)
{
    size_t a = ((size_t)T + (size_t)(rows - 1) * n_docs) / rows;
    size_t b = (size_t)n_docs * ct_ceil_div((size_t)max_seqlen, rows);
    return a < b ? a : b;
}

/* Carves the work list out of scratch and fills it (two small allocations of
 * the carver: tile_off and tiles). */
const int4 *attn_build_tiles(cudaStream_t st, scratch_carver *sc, const int32_t *cu, int n_docs,
                               size_t slots, int rows)
{
    CT_ASSERT(rows == TILE || rows == 2 * TILE, "attention work list: %d-row tiles (64 or 128 are built)", rows);
    int *tile_off = (int *)scratch_take(sc, ((size_t)n_docs + 1) * sizeof(int));
    int4 *tiles = (int4 *)scratch_take(sc, slots * sizeof(int4));
    if (rows == TILE) attn_tiles_kernel<TILE><<<1, TILES_THREADS, 0, st>>>(tiles, tile_off, cu, n_docs, (int)slots);
    else attn_tiles_kernel<2 * TILE><<<1, TILES_THREADS, 0, st>>>(tiles, tile_off, cu, n_docs, (int)slots);
    LAUNCH_CHECK();
    return tiles;
}
size_t attn_tiles_bytes(int n_docs, size_t slots)
{
    return scratch_round(((size_t)n_docs + 1) * sizeof(int)) + scratch_round(slots * sizeof(int4));
}

/* Q, then two stages of K and of V. */
template <int D> static size_t fwd_smem() { return (size_t)(TILE + 4 * Cfg<D>::KT) * Cfg<D>::ROW * 2; }

/* Raises the shared-memory limit of every attention kernel (more than 48 KB
 * needs an explicit opt-in). The mma.sync forward is built for D = 32 and 256. */
void attention_init(void)
{
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fwd_smem<32>()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fwd_smem<256>()));
    attn_fwd_sm90_init();
    attn_fwd_sm90_2wg_init();
    attention_bwd_init();
}

/* Also checks that the 1-D grid of the largest launch (slots x nq blocks) fits. */
void attn_check_args(const char *op, int D, int nq, int nkv, int T, int n_docs, int max_seqlen,
                       const void *const *ptrs, const int *lds, int n)
{
    CT_ASSERT(D == 32 || D == 64 || D == 128 || D == 256, "%s: head_dim %d is not supported (32, 64, 128, 256 are)",
              op, D);
    CT_ASSERT(nkv > 0 && nq % nkv == 0, "%s: nq=%d is not a multiple of nkv=%d", op, nq, nkv);
    CT_ASSERT(n_docs >= 0 && max_seqlen >= 0, "%s: n_docs %d, max_seqlen %d", op, n_docs, max_seqlen);
    CT_ASSERT(attn_tile_slots(T, n_docs, max_seqlen, TILE) * nq <= 0x7fffffffu,
              "%s: %d tokens x %d heads is too large for the grid", op, T, nq);
    for (int i = 0; i < n; i++)
        CT_ASSERT(aligned16(ptrs[i]) && lds[i] % 8 == 0,
                  "%s: operand %d must be 16-byte aligned with a stride multiple of 8 (stride %d)", op, i, lds[i]);
}

/* The mma.sync forward (D = 32 or 256) over the work list tiles (slots entries). */
static void fwd_mma(bf16 *out, int ldo, float *lse, const bf16 *q, int ldq, const bf16 *k, int ldk,
                    const bf16 *v, int ldv, const int4 *tiles, size_t slots, int nq, int nkv, int D, float scale,
                    int window, const float *sinks, cudaStream_t st)
{
    CT_ASSERT(D == 32 || D == 256, "attention_fwd (mma.sync): head_dim %d is not 32 or 256", D);
    if (D == 32)
        attn_fwd_kernel<32><<<(unsigned)(slots * nq), THREADS, fwd_smem<32>(), st>>>(
            out, ldo, lse, q, ldq, k, ldk, v, ldv, tiles, nq, nq / nkv, scale * LOG2E, window, sinks);
    else
        attn_fwd_kernel<256><<<(unsigned)(slots * nq), THREADS, fwd_smem<256>(), st>>>(
            out, ldo, lse, q, ldq, k, ldk, v, ldv, tiles, nq, nq / nkv, scale * LOG2E, window, sinks);
    LAUNCH_CHECK();
}

void cuda_attention_fwd(ct_backend *be, void *out, int ldo, float *lse, const void *q, int ldq,
                        const void *k, int ldk, const void *v, int ldv, const int32_t *cu_seqlens,
                        int n_docs, int max_seqlen, int T, int nq, int nkv, int D, float scale,
                        int window, const float *sinks)
{
    const void *ptrs[] = {out, q, k, v};
    const int lds[] = {ldo, ldq, ldk, ldv};
    attn_check_args("attention_fwd", D, nq, nkv, T, n_docs, max_seqlen, ptrs, lds, 4);
    if (T == 0) return;
    cuda_ctx *c = ctx_of(be);
    cudaStream_t st = c->stream;
    tail_zero z = {{(bf16 *)out, NULL, NULL}, {ldo, 0, 0}, {nq * D, 0, 0}, lse, nq};
    attn_zero_tail(st, z, cu_seqlens, n_docs, T);
    const attn_fwd_choice kind = choose_attn_fwd(c->options.attn_fwd, D, T, n_docs);
    const int rows = kind == ATTN_FWD_TMA ? 2 * TILE : TILE; /* queries per work-list tile */
    size_t slots = attn_tile_slots(T, n_docs, max_seqlen, rows);
    if (slots == 0) return;
    scratch_carver sc = {(char *)cuda_scratch(c, attn_tiles_bytes(n_docs, slots)), 0};
    const int4 *tiles = attn_build_tiles(st, &sc, cu_seqlens, n_docs, slots, rows);
    bf16 *o = (bf16 *)out;
    const bf16 *qb = (const bf16 *)q, *kb = (const bf16 *)k, *vb = (const bf16 *)v;
    if (kind == ATTN_FWD_TMA)
        attn_fwd_sm90_2wg(o, ldo, lse, qb, ldq, kb, ldk, vb, ldv, tiles, slots, T, nq, nkv, D, scale, window, sinks,
                          st);
    else if (kind == ATTN_FWD_WGMMA)
        attn_fwd_sm90(o, ldo, lse, qb, ldq, kb, ldk, vb, ldv, tiles, slots, nq, nkv, D, scale, window, sinks, st);
    else
        fwd_mma(o, ldo, lse, qb, ldq, kb, ldk, vb, ldv, tiles, slots, nq, nkv, D, scale, window, sinks, st);
}
