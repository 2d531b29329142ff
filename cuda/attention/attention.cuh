/* attention.cuh — what the attention kernels share: attention.cu (work list,
 * padding rows, mma.sync forward), attention_bwd.cu (mma.sync backward) and the
 * wgmma kernels (attention_fwd_sm90.cu, attention_bwd_sm90.cu,
 * attention_bwd_dkdv_2wg.cu, attention_bwd_dq_2wg.cu). Tile sizes, the
 * mma.sync / ldmatrix / cp.async helpers, the mask, the online softmax, the
 * epilogues and the wgmma tile helpers live here once, as __forceinline__
 * functions, and the launch helpers both directions call. attention.cu's header
 * comment describes the kernels. The helpers were folded out of kernels
 * validated on the H200 and leave each kernel's SASS byte-identical; where a
 * helper would change it (ptxas schedules differently) the kernel keeps its
 * own copy, and says so. */
#ifndef CT_ATTENTION_CUH
#define CT_ATTENTION_CUH

#include "ct_cuda.cuh"
#include "wgmma.cuh"

#define THREADS 128        /* 4 warps */
#define TILE 64            /* queries per fwd/dq block; keys per tile and per dk/dv block */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* Shared-memory row stride: 16 bytes of padding make the 8 rows an ldmatrix
 * reads fall in distinct banks. QT: queries per dk/dv step (see the header).
 * KT: keys per step of the mma.sync forward and dq; 32 at D = 256, where 64-key
 * steps spill (S, and dP in dq, beside the 128 registers of O or dq) and the
 * forward's stages would take 165 KB (one block per multiprocessor, not two). */
template <int D> struct Cfg {
    static constexpr int ROW = D + 8;
    static constexpr int QT = D == 128 ? 32 : 64;
    static constexpr int KT = D == 256 ? 32 : TILE;
};

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/* c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col). */
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* Asynchronous global -> shared copies (bypassing registers). With valid false
 * nothing is read (src-size 0) and the destination is zero-filled; the source
 * must still be a mapped address, so callers pass a row that exists. */
__device__ __forceinline__ void cp_async16(void *s, const void *g, bool valid)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(a), "l"(g), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(void *s, const void *g, bool valid)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(a), "l"(g), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
/* The head of a STAGES-deep cp.async pipeline over KT steps: load(stage, step)
 * for steps 0 .. STAGES-2, one commit group each, empty past KT so that the
 * loop's cp_async_wait<STAGES - 2>() counts hold however short the loop is. */
template <int STAGES, class Load> __device__ __forceinline__ void cp_async_prologue(Load &&load, int KT)
{
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < KT) load(s, s);
        cp_async_commit();
    }
}

/* ROWS x D tile from global (row r at g + r*ld) into shared s, asynchronously,
 * by the NT threads of the block; rows >= valid (valid >= 1) are zero-filled. */
template <int D, int ROWS, int NT = THREADS>
__device__ __forceinline__ void load_tile_async(bf16 *s, const bf16 *g, size_t ld, int valid)
{
    constexpr int CH = D / 8, N = ROWS * CH;
    static_assert(N % NT == 0, "tile chunks must divide evenly over the block");
#pragma unroll
    for (int it = 0; it < N / NT; it++) {
        int c = it * NT + threadIdx.x, r = c / CH, k = (c % CH) * 8;
        bool ok = r < valid;
        cp_async16(s + r * Cfg<D>::ROW + k, g + (size_t)(ok ? r : 0) * ld + k, ok);
    }
}

/* The mma.sync forward's and dq's K/V pipeline at the top of a key tile: while
 * tiles remain (more), queues tile kn's K and V rows (KT each; kb, vb: the
 * document's first row) into the free stage Kn, Vn and waits for all but that
 * copy; at the last tile waits for all. Either way this thread's copies of the
 * current tile have landed; the caller's barrier makes them every thread's. */
template <int D, int KT = TILE>
__device__ __forceinline__ void kv_prefetch(bf16 *Kn, bf16 *Vn, const bf16 *kb, int ldk, const bf16 *vb, int ldv,
                                            bool more, int kn, int len)
{
    if (more) {
        load_tile_async<D, KT>(Kn, kb + (size_t)kn * ldk, ldk, min(KT, len - kn));
        load_tile_async<D, KT>(Vn, vb + (size_t)kn * ldv, ldv, min(KT, len - kn));
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}

/* A fragment (16 rows x 16 cols at (row0, col0)) of a row-major shared tile. */
template <int D>
__device__ __forceinline__ void ldsm_a(uint32_t a[4], const bf16 *s, int row0, int col0)
{
    int lane = threadIdx.x % 32;
    ldsm_x4(a, s + (row0 + (lane % 16)) * Cfg<D>::ROW + col0 + (lane / 16) * 8);
}

/* B fragments of two n-tiles (8 rows each) for one 16-wide k-step, where the
 * shared tile holds B^T: rows = n (keys/queries), cols = k (head dims).
 * r[0], r[1] -> n-tile at row0; r[2], r[3] -> n-tile at row0 + 8. */
template <int D>
__device__ __forceinline__ void ldsm_bt(uint32_t r[4], const bf16 *s, int row0, int col0)
{
    int lane = threadIdx.x % 32;
    ldsm_x4(r, s + (row0 + (lane & 7) + ((lane >> 4) << 3)) * Cfg<D>::ROW + col0 + ((lane >> 3) & 1) * 8);
}

/* B fragments of two n-tiles (8 cols each, at col0 and col0 + 8) for the k-step of
 * 16 rows at row0, where the shared tile holds B itself: rows = k, cols = n. */
template <int D>
__device__ __forceinline__ void ldsm_b(uint32_t r[4], const bf16 *s, int row0, int col0)
{
    int lane = threadIdx.x % 32;
    ldsm_x4_t(r, s + (row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * Cfg<D>::ROW + col0 + (lane >> 4) * 8);
}

__device__ __forceinline__ bool visible(int i, int j, int len, int window)
{
    return j <= i && i < len && (window <= 0 || j > i - window);
}

/* Whether queries [q0, q0 + nqr) against keys [k0, k0 + KN) need the mask:
 * some pair is above the diagonal, below the window, or a query is past len. */
template <int KN = TILE>
__device__ __forceinline__ bool needs_mask(int q0, int nqr, int k0, int len, int window)
{
    return k0 + KN - 1 > q0 || (window > 0 && k0 + window <= q0 + nqr - 1) || q0 + nqr > len;
}

/* This block's work-list entry: the 1-D grid gives block b entry b / heads and
 * head b % heads (attention.cu's header). Returns the head, the document's start
 * and len (0: no work) and the tile's index in the document. */
struct work_entry { int head, start, len, tile; };
__device__ __forceinline__ work_entry work_entry_of(const int4 *tiles, int heads)
{
    const int head = blockIdx.x % heads;
    const int4 tl = tiles[blockIdx.x / heads];
    return {head, tl.x, tl.y, tl.z};
}

/* The KN-key tiles that queries [q0, q0 + QN) of a document of len see: n tiles
 * from kmin (the window's lower edge rounded down to a tile) to the one holding
 * the diagonal or the document's end. */
struct key_range { int kmin, n; };
template <int QN = TILE, int KN = TILE>
__device__ __forceinline__ key_range key_tiles(int q0, int len, int window)
{
    const int kmin = window > 0 ? max(0, q0 - window + 1) / KN * KN : 0;
    const int kend = min(len, q0 + QN);
    return {kmin, (kend - kmin + KN - 1) / KN};
}

// ---- mma.sync products (attention.cu, attention_bwd.cu) ----

/* The mma.sync kernels' two products per tile, for this warp's 16 rows. s = A1 B1^T
 * and dp = A2 B2^T (S = Q K^T with dP = dO V^T, or their transposes in dk/dv): A1
 * and A2 are shared tiles whose rows 16 warp .. 16 warp + 15 this warp multiplies,
 * B1 and B2 N x D shared tiles (rows = n); both products share the k-steps. */
template <int D, int N>
__device__ __forceinline__ void mma_abt_pair(float (&s)[N / 8][4], float (&dp)[N / 8][4], const bf16 *A1,
                                             const bf16 *A2, const bf16 *B1, const bf16 *B2, int warp)
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a1[4], a2[4];
        ldsm_a<D>(a1, A1, warp * 16, kk * 16);
        ldsm_a<D>(a2, A2, warp * 16, kk * 16);
#pragma unroll
        for (int j = 0; j < N / 16; j++) {
            uint32_t b[4];
            ldsm_bt<D>(b, B1, j * 16, kk * 16);
            mma16816(s[2 * j], a1, b[0], b[1]);
            mma16816(s[2 * j + 1], a1, b[2], b[3]);
            ldsm_bt<D>(b, B2, j * 16, kk * 16);
            mma16816(dp[2 * j], a2, b[0], b[1]);
            mma16816(dp[2 * j + 1], a2, b[2], b[3]);
        }
    }
}

/* mma_abt_pair's first product alone, s = A B^T (s zeroed by the caller). */
template <int D, int N>
__device__ __forceinline__ void mma_abt(float (&s)[N / 8][4], const bf16 *A, const bf16 *B, int warp)
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[4];
        ldsm_a<D>(a, A, warp * 16, kk * 16);
#pragma unroll
        for (int j = 0; j < N / 16; j++) {
            uint32_t b[4];
            ldsm_bt<D>(b, B, j * 16, kk * 16);
            mma16816(s[2 * j], a, b[0], b[1]);
            mma16816(s[2 * j + 1], a, b[2], b[3]);
        }
    }
}

/* acc += P B (O += P V, dq += dS K): P this warp's 16 x KR accumulator tile, packed
 * to bf16 A fragments in registers (no trip through shared memory); B a KR x D
 * shared tile (rows = k). */
template <int D, int KR>
__device__ __forceinline__ void mma_pb(float (&acc)[D / 8][4], const float (&p)[KR / 8][4], const bf16 *B)
{
#pragma unroll
    for (int kk = 0; kk < KR / 16; kk++) {
        uint32_t a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                         pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                         pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int j = 0; j < D / 16; j++) {
            uint32_t b[4];
            ldsm_b<D>(b, B, kk * 16, j * 16);
            mma16816(acc[2 * j], a, b[0], b[1]);
            mma16816(acc[2 * j + 1], a, b[2], b[3]);
        }
    }
}

// ---- accumulator tiles: mask, online softmax, epilogues (all kernels) ----

/* Accumulator tiles in both register layouts, mma.sync's float[NT][4] and wgmma's
 * flat float[4 NT] (wgmma.cuh): in both, element e of n-tile j is row
 * 16 warp + lane / 4 + 8 (e / 2) of the tile (this lane's rows[e / 2]) and column
 * 8 j + 2 (lane % 4) + (e & 1), so one helper serves both kinds of kernel. */
template <int NT> __device__ __forceinline__ float &acc_el(float (&a)[NT][4], int j, int e) { return a[j][e]; }
template <int N> __device__ __forceinline__ float &acc_el(float (&a)[N], int j, int e) { return a[4 * j + e]; }
template <int NT> __device__ __forceinline__ float acc_el(const float (&a)[NT][4], int j, int e) { return a[j][e]; }
template <int N> __device__ __forceinline__ float acc_el(const float (&a)[N], int j, int e) { return a[4 * j + e]; }
/* n-tiles (8 columns each) of an accumulator tile of type A. */
template <class A> __host__ __device__ constexpr int acc_tiles() { return (int)(sizeof(A) / (4 * sizeof(float))); }

/* Sets the logits of the pairs visible() rejects to -inf (exp2 then makes them 0).
 * Columns start at c0; KEY_ROWS: rows are keys and columns queries (dk/dv's S^T),
 * else rows are queries. Callers run it only where needs_mask says so. */
template <bool KEY_ROWS, class A>
__device__ __forceinline__ void mask_tile(A &s, const int (&rows)[2], int c0, int len, int window)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < acc_tiles<A>(); j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = c0 + j * 8 + 2 * (lane % 4) + (e & 1);
            if (!(KEY_ROWS ? visible(col, rows[e / 2], len, window) : visible(rows[e / 2], col, len, window)))
                acc_el(s, j, e) = -INFINITY;
        }
}

/* The forward's running max m and sum l (base 2) of this lane's two rows before
 * the first key tile: the sink is a logit with no value row, so it starts m and
 * (once per row, in the row's first lane) l. */
__device__ __forceinline__ void softmax_init(float (&m)[2], float (&l)[2], const float *sinks, int h)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        m[r] = sinks ? sinks[h] * LOG2E : -INFINITY;
        l[r] = sinks && (lane % 4) == 0 ? 1.0f : 0.0f;
    }
}

/* s *= scale_log2 (the logits in base 2), and mx[r] = the max of mx[r] and this
 * lane's part of row r. */
template <class A> __device__ __forceinline__ void scale_row_max(A &s, float scale_log2, float (&mx)[2])
{
#pragma unroll
    for (int j = 0; j < acc_tiles<A>(); j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            acc_el(s, j, e) *= scale_log2;
            mx[e / 2] = fmaxf(mx[e / 2], acc_el(s, j, e));
        }
    }
}

/* The online softmax's statistics of one row after a key tile whose row max in
 * this lane is mx: reduces mx over the row's 4 lanes, raises the running max m,
 * multiplies the running sum l by alpha = exp2(m_old - m_new) and returns the max
 * to exponentiate against. A row that has seen nothing yet keeps m = -inf and
 * gets 0 there, so that -inf - -inf never makes a NaN. (The tile's loops are
 * scale_row_max and exp_row_sum, and the kernel holds mx, alpha and mref: one
 * helper with arrays of its own changes the mma.sync forward's SASS.) */
__device__ __forceinline__ float softmax_rescale(float &m, float &l, float &alpha, float mx)
{
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    float mn = fmaxf(m, mx);
    float mref = mn == -INFINITY ? 0.0f : mn;
    alpha = exp2f(m - mref);
    m = mn;
    l *= alpha;
    return mref;
}

/* s = P = exp2(s - mref of its row), added to the running sums l. */
template <class A> __device__ __forceinline__ void exp_row_sum(A &s, const float (&mref)[2], float (&l)[2])
{
#pragma unroll
    for (int j = 0; j < acc_tiles<A>(); j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = exp2f(acc_el(s, j, e) - mref[e / 2]);
            acc_el(s, j, e) = p;
            l[e / 2] += p;
        }
    }
}

/* o *= alpha of its row: the output rescaled to the running max softmax_rescale raised. */
template <class A> __device__ __forceinline__ void acc_scale_rows(A &o, const float (&alpha)[2])
{
#pragma unroll
    for (int j = 0; j < acc_tiles<A>(); j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc_el(o, j, e) *= alpha[e / 2];
}

/* dq's lse2 and delta of this lane's two query rows (head h, head-major (nq, T));
 * 0 for rows past len, whose dq is never stored. */
__device__ __forceinline__ void load_row_stats(float (&lse2r)[2], float (&dl)[2], const float *lse2,
                                               const float *delta, int h, int T, int start, const int (&row)[2],
                                               int len)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        size_t t = (size_t)h * T + start + row[r];
        lse2r[r] = row[r] < len ? lse2[t] : 0.0f;
        dl[r] = row[r] < len ? delta[t] : 0.0f;
    }
}

/* dk/dv's copy of one step's lse2 and delta (QT queries from q0, head h) into stage
 * `stage` of lse2_s and dl_s ((stages, QT) each), asynchronously: threads
 * [0, QT) copy lse2, [QT, 2 QT) delta; queries >= valid are zero-filled. */
template <int QT>
__device__ __forceinline__ void load_step_stats(float *lse2_s, float *dl_s, int stage, const float *lse2,
                                                const float *delta, int h, int T, int start, int q0, int valid)
{
    if (threadIdx.x < 2 * QT) {
        const int i = threadIdx.x % QT;
        const bool ok = i < valid;
        const float *src = (threadIdx.x < QT ? lse2 : delta) + (size_t)h * T + start + q0 + (ok ? i : 0);
        cp_async4((threadIdx.x < QT ? lse2_s : dl_s) + stage * QT + i, src, ok);
    }
}

/* The forward's end: sums l over each row's 4 lanes, then for the rows inside the
 * document writes out = o / l (bf16, head h's D columns) and, from the row's
 * first lane, lse = (m + log2 l) ln 2. Rows past len are left to the caller. */
template <int D, class A>
__device__ __forceinline__ void fwd_store(bf16 *out, int ldo, float *lse, int nq, int h, int start, int len,
                                          const int (&row)[2], const A &o, const float (&m)[2], float (&l)[2])
{
    const int lane = threadIdx.x % 32;
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
                __floats2bfloat162_rn(acc_el(o, j, 2 * r) * inv, acc_el(o, j, 2 * r + 1) * inv);
        if (lane % 4 == 0) lse[t * nq + h] = (m[r] + log2f(l[r])) * LN2;
    }
}

/* dq = scale * acc for the rows inside the document (bf16, head h's D columns);
 * also dk and dv of the D = 256 dk/dv kernel, one per warp (rows = keys there). */
template <int D, class A>
__device__ __forceinline__ void dq_store(bf16 *dq, int lddq, int h, int start, int len, const int (&row)[2],
                                         const A &acc, float scale)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row[r] >= len) continue;
        bf16 *drow = dq + ((size_t)start + row[r]) * lddq + (size_t)h * D + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            *(__nv_bfloat162 *)(drow + j * 8) =
                __floats2bfloat162_rn(acc_el(acc, j, 2 * r) * scale, acc_el(acc, j, 2 * r + 1) * scale);
    }
}

/* dk = scale * dka and dv = dva for the keys inside the document (bf16, kv head
 * kvh's D columns), one dk pair then one dv pair at a time. */
template <int D, class A>
__device__ __forceinline__ void dkdv_store(bf16 *dk, int lddk, bf16 *dv, int lddv, int kvh, int start, int len,
                                           const int (&key)[2], const A &dka, const A &dva, float scale)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (key[r] >= len) continue;
        size_t t = (size_t)start + key[r];
        bf16 *krow = dk + t * lddk + (size_t)kvh * D + 2 * (lane % 4);
        bf16 *vrow = dv + t * lddv + (size_t)kvh * D + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            *(__nv_bfloat162 *)(krow + j * 8) =
                __floats2bfloat162_rn(acc_el(dka, j, 2 * r) * scale, acc_el(dka, j, 2 * r + 1) * scale);
            *(__nv_bfloat162 *)(vrow + j * 8) =
                __floats2bfloat162_rn(acc_el(dva, j, 2 * r), acc_el(dva, j, 2 * r + 1));
        }
    }
}

// ---- wgmma tiles and products (attention_fwd_sm90.cu, attention_bwd_sm90.cu) ----

/* Shared-memory tiles are D / 64 panels of ROWS rows x 128 bytes in the 128-byte
 * swizzle (wgmma.cuh), 1024-byte aligned. Bytes of one panel of a ROWS-row tile,
 * and of a ROWS x D tile: */
template <int ROWS> __host__ __device__ constexpr uint32_t sw_panel() { return (uint32_t)ROWS * 128; }
template <int D, int ROWS> __host__ __device__ constexpr uint32_t sw_tile_bytes() { return (uint32_t)ROWS * D * 2; }

/* ROWS x D tile from global (row r at g + r*ld) into the swizzled panels at shared
 * address s, asynchronously; rows >= valid (valid >= 1) are zero-filled. 16-byte
 * chunk c of row r goes to panel c / 8 at swz(r, c % 8). */
template <int D, int ROWS>
__device__ __forceinline__ void load_rows_sw(uint32_t s, const bf16 *g, size_t ld, int valid)
{
    constexpr int CH = D / 8, N = ROWS * CH;
    static_assert(N % THREADS == 0, "tile chunks must divide evenly over the block");
#pragma unroll
    for (int it = 0; it < N / THREADS; it++) {
        const int c = it * THREADS + threadIdx.x, r = c / CH, ch = c % CH;
        const bool ok = r < valid;
        cp_async16_s(s + (ch / 8) * sw_panel<ROWS>() + swz(r, ch % 8), g + (size_t)(ok ? r : 0) * ld + ch * 8, ok);
    }
}

/* Issues d = A B^T as one wgmma group (S = Q K^T and its kin): A a 64 x D tile at
 * sa, B an N x D tile at sb, both rows along D (K-major). Step ks covers D columns
 * [16 ks, 16 ks + 16): panel ks / 4, 32 bytes per step into the 128-byte rows.
 * Both issue functions start with a fence: it orders the thread's earlier writes
 * of d (and of a) before the products (without it, in a branch that issues one,
 * ptxas injects one itself and says so, C7519). */
template <int D, int N>
__device__ __forceinline__ void abt_issue(float (&d)[N / 2], uint32_t sa, uint32_t sb)
{
    static_assert(N == 32 || N == 64 || N == 128, "abt_issue: N = 32, 64 or 128");
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const uint64_t da = wgmma_desc(sa + (ks / 4) * sw_panel<TILE>() + (ks % 4) * 32, 16, 1024);
        const uint64_t db = wgmma_desc(sb + (ks / 4) * sw_panel<N>() + (ks % 4) * 32, 16, 1024);
        if constexpr (N == 128) wgmma_m64n128k16_ss<false>(d, da, db, ks > 0);
        else if constexpr (N == 64) wgmma_m64n64k16_ss<false>(d, da, db, ks > 0);
        else wgmma_m64n32k16_ss<false>(d, da, db, ks > 0);
    }
    wgmma_commit();
}

/* The bf16 A fragments of a 64 x N wgmma accumulator tile, one per 16 columns
 * (wgmma.cuh: columns [16 kk, 16 kk + 16) are d[8 kk .. 8 kk + 7] in pairs). */
template <int N> __device__ __forceinline__ void pack_frags(uint32_t (&a)[N / 16][4], const float (&d)[N / 2])
{
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) a[kk][r] = pack_bf16(d[8 * kk + 2 * r], d[8 * kk + 2 * r + 1]);
}

/* Issues acc += A B as one wgmma group (O += P V and its kin): A (64 x KR) as bf16
 * fragments a, one per 16 columns (pack_frags); B a KR x D tile at sb (D
 * contiguous: MN-major, the transpose bit). Step kk covers B's rows from 16 kk
 * (2048 bytes per step), its D columns in D / 64 panels of KR rows (LBO = one panel). */
template <int D, int KR>
__device__ __forceinline__ void ab_issue(float (&acc)[D / 2], const uint32_t (&a)[KR / 16][4], uint32_t sb)
{
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KR / 16; kk++) {
        const uint64_t db = wgmma_desc(sb + kk * 16 * 128, sw_panel<KR>(), 1024);
        if constexpr (D == 128) wgmma_m64n128k16_rs<true>(acc, a[kk], db, 1);
        else wgmma_m64n64k16_rs<true>(acc, a[kk], db, 1);
    }
    wgmma_commit();
}

/* Commits an empty wgmma group in place of a product a loop's first step lacks,
 * so that every step has the same wait counts: a branch on which waits to use
 * makes ptxas serialize every wgmma (C7514). The fence spares ptxas injecting
 * one (C7519). */
static __device__ __forceinline__ void empty_group()
{
    wgmma_fence();
    wgmma_commit();
}

// ---- two-warpgroup blocks at D = 128 (attention_bwd_dkdv_2wg.cu, attention_bwd_dq_2wg.cu) ----

#define WG2_THREADS 256 /* two warpgroups */

/* ROWS x 128 rows from global (row r at g + r*ld) into ROWS / TROWS consecutive
 * TROWS-row swizzled tiles at shared address s (row r in tile r / TROWS, each
 * tile two panels of TROWS rows, as load_rows_sw lays out one), asynchronously,
 * by all WG2_THREADS threads; rows >= valid (valid >= 1) are zero-filled from row
 * 0's address, which exists. Thread t copies chunk t % 16 of rows t / 16 + 16 i:
 * the rows share their swizzle phase (r % 8), so one base address and a stride
 * serve every copy (fewer registers live in the loop). */
template <int ROWS, int TROWS = TILE>
__device__ __forceinline__ void load_tiles_sw(uint32_t s, const bf16 *g, size_t ld, int valid)
{
    constexpr int D = 128, CH = D / 8, RPI = WG2_THREADS / CH; /* 16-byte chunks per row; rows per pass */
    static_assert(ROWS % TROWS == 0 && TROWS % RPI == 0 && RPI % 8 == 0, "whole tiles, one swizzle phase");
    int t = threadIdx.x;
    asm volatile("" : "+r"(t)); /* derive the addresses here: hoisted out of the loop, they spill */
    const int r0 = t / CH, ch = t % CH;
    const uint32_t d0 = s + (ch / 8) * sw_panel<TROWS>() + swz(r0, ch % 8);
    const bf16 *p = g + (size_t)r0 * ld + ch * 8;
#pragma unroll
    for (int i = 0; i < ROWS / RPI; i++) {
        const int r = r0 + i * RPI;
        const bool ok = r < valid;
        cp_async16_s(d0 + (r / TROWS) * sw_tile_bytes<D, TROWS>() + (i % (TROWS / RPI)) * RPI * 128,
                     ok ? p + (size_t)i * RPI * ld : g + ch * 8, ok);
    }
}

/* abt_issue and ab_issue above, each k-step's descriptor the first one plus the
 * step's byte offset / 16: a descriptor's address field is the shared address /
 * 16 in 14 bits, and base + offset stays below 256 KB, so the sum never carries
 * out of the field. ptxas then spends about 8 fewer instructions per wgmma (910
 * against 1092 per step in the dk/dv kernel). Separate so that the validated
 * one-warpgroup kernels' SASS stays as it is.
 * abt_issue_inc: d = A B^T, A a 64 x D tile at sa (64-row panels), B an N x D
 * tile at sb (N-row panels). */
template <int D, int N>
__device__ __forceinline__ void abt_issue_inc(float (&d)[N / 2], uint32_t sa, uint32_t sb)
{
    static_assert(N == 64 || N == 128, "abt_issue_inc: N = 64 or 128");
    wgmma_fence();
    const uint64_t da0 = wgmma_desc(sa, 16, 1024), db0 = wgmma_desc(sb, 16, 1024);
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const uint64_t da = da0 + (((ks / 4) * sw_panel<TILE>() + (ks % 4) * 32) >> 4);
        const uint64_t db = db0 + (((ks / 4) * sw_panel<N>() + (ks % 4) * 32) >> 4);
        if constexpr (N == 128) wgmma_m64n128k16_ss<false>(d, da, db, ks > 0);
        else wgmma_m64n64k16_ss<false>(d, da, db, ks > 0);
    }
    wgmma_commit();
}

/* ab_issue_inc: acc += A B, A (64 x KR) as bf16 fragments, B KR rows x D at sb
 * (MN-major) inside a tile of PR-row panels (PR >= KR: B may be a slice of
 * rows of a taller tile; LBO = one panel). */
template <int D, int KR, int PR = KR>
__device__ __forceinline__ void ab_issue_inc(float (&acc)[D / 2], const uint32_t (&a)[KR / 16][4], uint32_t sb)
{
    static_assert(D == 128 && PR >= KR, "ab_issue_inc: D = 128, B inside one panel's rows");
    wgmma_fence();
    const uint64_t db0 = wgmma_desc(sb, sw_panel<PR>(), 1024);
#pragma unroll
    for (int kk = 0; kk < KR / 16; kk++) wgmma_m64n128k16_rs<true>(acc, a[kk], db0 + ((kk * 16 * 128) >> 4), 1);
    wgmma_commit();
}

// ---- host side ----

/* The outputs whose padding rows (past cu_seqlens[n_docs]) are zeroed. */
struct tail_zero {
    bf16 *p[3];       /* up to three (T, cols) bf16 outputs; NULL when unused */
    int ld[3], cols[3];
    float *f;         /* (T, fcols) fp32 output (lse) or NULL */
    int fcols;
};

/* Zeroes rows [cu_seqlens[n_docs], T) of the outputs in z (device-side end). */
void attn_zero_tail(cudaStream_t st, const tail_zero &z, const int32_t *cu_seqlens, int n_docs, int T);
/* Entries of the work list of rows-row tiles for these host sizes (>= the number
 * of tiles). 64-row tiles (TILE) for every kernel but the two-warpgroup forward and
 * dk/dv, which take 128. */
size_t attn_tile_slots(int T, int n_docs, int max_seqlen, int rows);
/* Scratch bytes the work list takes, and the list itself, built on stream st out
 * of scratch carved by sc: {start, len, tile index, 0} per tile of rows (64 or
 * 128) rows (see attention.cu). */
size_t attn_tiles_bytes(int n_docs, size_t slots);
const int4 *attn_build_tiles(cudaStream_t st, scratch_carver *sc, const int32_t *cu, int n_docs, size_t slots,
                             int rows);
/* Asserts the shapes, strides and alignment both directions need. */
void attn_check_args(const char *op, int D, int nq, int nkv, int T, int n_docs, int max_seqlen,
                     const void *const *ptrs, const int *lds, int n);
/* attention_bwd.cu: raises the backward kernels' shared-memory limits (once per
 * backend created, from attention_init). */
void attention_bwd_init(void);

/* attention_fwd_sm90.cu: the one-warpgroup wgmma forward (D = 64) and its shared-memory opt-in. */
void attn_fwd_sm90(bf16 *out, int ldo, float *lse, const bf16 *q, int ldq, const bf16 *k, int ldk,
                   const bf16 *v, int ldv, const int4 *tiles, size_t slots, int nq, int nkv, int D,
                   float scale, int window, const float *sinks, cudaStream_t st);
void attn_fwd_sm90_init(void);

/* attention_fwd_sm90_2wg.cu: the warp-specialized wgmma forward (D = 64 or 128)
 * over a work list of 128-query tiles (attn_build_tiles with rows 128), and its
 * one-time setup (shared-memory opt-in, the driver's tensor-map encoder). */
void attn_fwd_sm90_2wg(bf16 *out, int ldo, float *lse, const bf16 *q, int ldq, const bf16 *k, int ldk,
                       const bf16 *v, int ldv, const int4 *tiles, size_t slots, int T, int nq, int nkv, int D,
                       float scale, int window, const float *sinks, cudaStream_t st);
void attn_fwd_sm90_2wg_init(void);

/* attention_bwd_sm90.cu: the one-warpgroup wgmma dq and dk/dv kernels (D = 64) after
 * attn_delta_kernel filled delta and lse2 ((nq, T) each), and their shared-memory
 * opt-in. Arguments as attention_bwd.cu's mma.sync launch; tiles is the 64-row
 * work list (slots entries). */
void attn_bwd_dq_sm90(bf16 *dq, int lddq, const bf16 *dout, int lddo, const float *lse2, const float *delta,
                      const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv, const int4 *tiles,
                      size_t slots, int T, int nq, int nkv, int D, float scale, int window, cudaStream_t st);
void attn_bwd_dkdv_sm90(bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo, const float *lse2,
                        const float *delta, const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv,
                        const int4 *tiles, size_t slots, int T, int nq, int nkv, int D, float scale, int window,
                        cudaStream_t st);
void attn_bwd_sm90_init(void);

/* attention_bwd_dkdv_2wg.cu: dk/dv at D = 128 on two warpgroups per 128-key tile,
 * as attn_bwd_dkdv_sm90 but on the 128-row work list (tiles2, slots2 entries),
 * and its shared-memory opt-in. */
void attn_bwd_dkdv_2wg(bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo, const float *lse2,
                       const float *delta, const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv,
                       const int4 *tiles2, size_t slots2, int T, int nq, int nkv, float scale, int window,
                       cudaStream_t st);
void attn_bwd_dkdv_2wg_init(void);

/* attention_bwd_dq_2wg.cu: dq at D = 128 on two warpgroups per 128-query tile
 * sharing every K/V stage, as attn_bwd_dq_sm90 but on the 128-row work list
 * (tiles2, slots2 entries), and its shared-memory opt-in. */
void attn_bwd_dq_2wg(bf16 *dq, int lddq, const bf16 *dout, int lddo, const float *lse2, const float *delta,
                     const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv, const int4 *tiles2,
                     size_t slots2, int T, int nq, int nkv, float scale, int window, cudaStream_t st);
void attn_bwd_dq_2wg_init(void);

#endif
