/* attention.cu — varlen causal GQA flash attention, forward and backward.
 *
 * Layouts: q (T, nq, D), k and v (T, nkv, D), out and dout (T, nq, D), each with
 * its own token stride (ld*, elements; q/k/v are column slices of the fused qkv).
 * Documents are [cu_seqlens[d], cu_seqlens[d+1]), read from device memory; lse
 * (T, nq) fp32 holds the natural-log log-sum-exp of the scaled logits including
 * the sink logit when sinks != NULL, so that exp(s - lse) is the probability the
 * forward used. Query head h reads kv head h / (nq / nkv). Key j is visible from
 * query i (positions inside the document) iff j <= i and, when window > 0,
 * j > i - window. No T x T tensor exists: softmax is computed online per tile.
 *
 * Rows past cu_seqlens[n_docs] (padding) get zero outputs, lse and gradients.
 *
 * Grid: x = document, y = 64-row tile of max_seqlen, z = head. Tiles past a
 * document's end exit at once. Documents go on x because a packed batch of short
 * samples can hold more than 65535 of them.
 *
 * Forward (FlashAttention-2 schedule): a block of 4 warps owns 64 queries, each
 * warp 16 rows; it walks the 64-key tiles its rows can see. Q K^T and P V are
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate) fed by ldmatrix from shared
 * memory (rows padded by 16 bytes: conflict-free ldmatrix); P is re-packed from
 * the accumulator registers into A fragments without touching shared memory.
 * Softmax runs in base 2 (exp2 of logits pre-scaled by scale * log2 e).
 *
 * Backward: delta_i = sum_d dout_i out_i first; then two kernels, both
 * deterministic (no atomics): dq walks the key tiles of a query tile; dk/dv walks,
 * for each of the nq/nkv query heads of a kv head, the 32-query tiles that see a
 * 64-key tile. This recomputes Q K^T and dO V^T once more than FlashAttention-2's
 * single pass with atomic dq, and buys bit-identical gradients run to run (the
 * tests that switch recompute/offload on and off compare gradients exactly).
 *
 * This is the first, correctness-first version: plain global loads (no cp.async
 * pipelining), mma.sync rather than Hopper's wgmma/TMA, masks evaluated on every
 * tile, and a grid that includes empty tiles. Later: TMA + wgmma (FA3 schedule),
 * producer/consumer warps, a host-built tile list (the loader knows cu_seqlens). */
#include "ct_cuda.cuh"

#define THREADS 128        /* 4 warps */
#define TILE 64            /* queries per fwd/dq block; keys per tile and per dk/dv block */
#define BWD_QTILE 32       /* queries per inner step of the dk/dv kernel */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// ---- kernels ----

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

/* Shared-memory row stride: 16 bytes of padding make the 8 rows an ldmatrix
 * reads fall in distinct banks. */
template <int D> struct Smem { static constexpr int ROW = D + 8; };

/* rows x D tile from global (row r at g + r*ld) into shared s; rows >= valid are 0. */
template <int D>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *g, size_t ld, int rows, int valid)
{
    constexpr int CH = D / 8;
    for (int c = threadIdx.x; c < rows * CH; c += THREADS) {
        int r = c / CH, k = (c % CH) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < valid) v = *(const uint4 *)(g + (size_t)r * ld + k);
        *(uint4 *)(s + r * Smem<D>::ROW + k) = v;
    }
}

/* A fragment (16 rows x 16 cols at (row0, col0)) of a row-major shared tile. */
template <int D>
__device__ __forceinline__ void ldsm_a(uint32_t a[4], const bf16 *s, int row0, int col0)
{
    int lane = threadIdx.x % 32;
    ldsm_x4(a, s + (row0 + (lane % 16)) * Smem<D>::ROW + col0 + (lane / 16) * 8);
}

/* B fragments of two n-tiles (8 rows each) for one 16-wide k-step, where the
 * shared tile holds B^T: rows = n (keys/queries), cols = k (head dims).
 * r[0], r[1] -> n-tile at row0; r[2], r[3] -> n-tile at row0 + 8. */
template <int D>
__device__ __forceinline__ void ldsm_bt(uint32_t r[4], const bf16 *s, int row0, int col0)
{
    int lane = threadIdx.x % 32;
    ldsm_x4(r, s + (row0 + (lane & 7) + ((lane >> 4) << 3)) * Smem<D>::ROW + col0 + ((lane >> 3) & 1) * 8);
}

/* B fragments of two n-tiles (8 cols each, at col0 and col0 + 8) for the k-step of
 * 16 rows at row0, where the shared tile holds B itself: rows = k, cols = n. */
template <int D>
__device__ __forceinline__ void ldsm_b(uint32_t r[4], const bf16 *s, int row0, int col0)
{
    int lane = threadIdx.x % 32;
    ldsm_x4_t(r, s + (row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * Smem<D>::ROW + col0 + (lane >> 4) * 8);
}

__device__ __forceinline__ bool visible(int i, int j, int len, int window)
{
    return j <= i && i < len && (window <= 0 || j > i - window);
}

template <int D>
__global__ void __launch_bounds__(THREADS)
attn_fwd_kernel(bf16 *out, int ldo, float *lse, const bf16 *q, int ldq, const bf16 *k, int ldk,
                const bf16 *v, int ldv, const int32_t *cu_seqlens, int nq, int group,
                float scale_log2, int window, const float *sinks)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Qs = (bf16 *)smem_raw, *Ks = Qs + TILE * Smem<D>::ROW, *Vs = Ks + TILE * Smem<D>::ROW;
    const int doc = blockIdx.x, h = blockIdx.z, kvh = h / group;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TILE; /* longest tiles first */
    const int start = cu_seqlens[doc], len = cu_seqlens[doc + 1] - start;
    if (q0 >= len) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    load_tile<D>(Qs, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, TILE, min(TILE, len - q0));
    __syncthreads();
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) ldsm_a<D>(qf[kk], Qs, warp * 16, kk * 16);

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    /* Rows r = 0 (row g) and 1 (row g + 8) of this lane; the sink is a logit with
     * no value row, so it starts the running max and (once per row) the sum. */
    const int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
    float m[2], l[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        m[r] = sinks ? sinks[h] * LOG2E : -INFINITY;
        l[r] = sinks && (lane % 4) == 0 ? 1.0f : 0.0f;
    }

    const int kmin = window > 0 ? max(0, q0 - window + 1) : 0;
    const int kend = min(len, q0 + TILE);
    for (int k0 = kmin / TILE * TILE; k0 < kend; k0 += TILE) {
        __syncthreads(); /* the previous tile is consumed */
        load_tile<D>(Ks, k + (size_t)(start + k0) * ldk + (size_t)kvh * D, ldk, TILE, min(TILE, len - k0));
        load_tile<D>(Vs, v + (size_t)(start + k0) * ldv + (size_t)kvh * D, ldv, TILE, min(TILE, len - k0));
        __syncthreads();

        float s[TILE / 8][4];
#pragma unroll
        for (int i = 0; i < TILE / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int j = 0; j < TILE / 16; j++) {
                uint32_t b[4];
                ldsm_bt<D>(b, Ks, j * 16, kk * 16);
                mma16816(s[2 * j], qf[kk], b[0], b[1]);
                mma16816(s[2 * j + 1], qf[kk], b[2], b[3]);
            }
        }

        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < TILE / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + nt * 8 + 2 * (lane % 4) + (e & 1);
                float x = visible(row[e / 2], key, len, window) ? s[nt][e] * scale_log2 : -INFINITY;
                s[nt][e] = x;
                mx[e / 2] = fmaxf(mx[e / 2], x);
            }
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
        for (int nt = 0; nt < TILE / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(s[nt][e] - mref[e / 2]);
                s[nt][e] = p;
                l[e / 2] += p;
            }
        }
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            o[i][0] *= alpha[0];
            o[i][1] *= alpha[0];
            o[i][2] *= alpha[1];
            o[i][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++) {
            uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int j = 0; j < D / 16; j++) {
                uint32_t b[4];
                ldsm_b<D>(b, Vs, kk * 16, j * 16);
                mma16816(o[2 * j], a, b[0], b[1]);
                mma16816(o[2 * j + 1], a, b[2], b[3]);
            }
        }
    }

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
        for (int i = 0; i < D / 8; i++)
            *(__nv_bfloat162 *)(orow + i * 8) = __floats2bfloat162_rn(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
        if (lane % 4 == 0) lse[t * nq + h] = (m[r] + log2f(l[r])) * LN2;
    }
}

/* delta (T, nq) = rowsum(dout * out), one warp per (token, head). */
template <int D>
__global__ void attn_delta_kernel(float *delta, const bf16 *dout, int lddo, const bf16 *out, int ldo,
                                  int T, int nq)
{
    size_t w = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (w >= (size_t)T * nq) return;
    size_t t = w / nq, h = w % nq;
    float acc = 0.0f;
    for (int i = lane * 8; i < D; i += 256) {
        float a[8], b[8];
        load8(a, dout + t * lddo + h * D + i);
        load8(b, out + t * ldo + h * D + i);
#pragma unroll
        for (int j = 0; j < 8; j++) acc += a[j] * b[j];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) delta[w] = acc;
}

/* dq for one 64-query tile: dS = P (dP - delta), dq = scale * dS K. */
template <int D>
__global__ void __launch_bounds__(THREADS)
attn_bwd_dq_kernel(bf16 *dq, int lddq, const bf16 *dout, int lddo, const float *lse,
                   const float *delta, const bf16 *q, int ldq, const bf16 *k, int ldk,
                   const bf16 *v, int ldv, const int32_t *cu_seqlens, int nq, int group,
                   float scale, float scale_log2, int window)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Qs = (bf16 *)smem_raw, *dOs = Qs + TILE * Smem<D>::ROW;
    bf16 *Ks = dOs + TILE * Smem<D>::ROW, *Vs = Ks + TILE * Smem<D>::ROW;
    const int doc = blockIdx.x, h = blockIdx.z, kvh = h / group;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TILE;
    const int start = cu_seqlens[doc], len = cu_seqlens[doc + 1] - start;
    if (q0 >= len) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    load_tile<D>(Qs, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, TILE, min(TILE, len - q0));
    load_tile<D>(dOs, dout + (size_t)(start + q0) * lddo + (size_t)h * D, lddo, TILE, min(TILE, len - q0));
    const int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
    float lse2[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        size_t t = (size_t)start + row[r];
        lse2[r] = row[r] < len ? lse[t * nq + h] * LOG2E : 0.0f;
        dl[r] = row[r] < len ? delta[t * nq + h] : 0.0f;
    }
    float acc[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

    const int kmin = window > 0 ? max(0, q0 - window + 1) : 0;
    const int kend = min(len, q0 + TILE);
    for (int k0 = kmin / TILE * TILE; k0 < kend; k0 += TILE) {
        __syncthreads();
        load_tile<D>(Ks, k + (size_t)(start + k0) * ldk + (size_t)kvh * D, ldk, TILE, min(TILE, len - k0));
        load_tile<D>(Vs, v + (size_t)(start + k0) * ldv + (size_t)kvh * D, ldv, TILE, min(TILE, len - k0));
        __syncthreads();

        float s[TILE / 8][4], dp[TILE / 8][4];
#pragma unroll
        for (int i = 0; i < TILE / 8; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t qa[4], da[4];
            ldsm_a<D>(qa, Qs, warp * 16, kk * 16);
            ldsm_a<D>(da, dOs, warp * 16, kk * 16);
#pragma unroll
            for (int j = 0; j < TILE / 16; j++) {
                uint32_t b[4];
                ldsm_bt<D>(b, Ks, j * 16, kk * 16);
                mma16816(s[2 * j], qa, b[0], b[1]);
                mma16816(s[2 * j + 1], qa, b[2], b[3]);
                ldsm_bt<D>(b, Vs, j * 16, kk * 16);
                mma16816(dp[2 * j], da, b[0], b[1]);
                mma16816(dp[2 * j + 1], da, b[2], b[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < TILE / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + nt * 8 + 2 * (lane % 4) + (e & 1);
                float p = visible(row[e / 2], key, len, window) ? exp2f(s[nt][e] * scale_log2 - lse2[e / 2]) : 0.0f;
                s[nt][e] = p * (dp[nt][e] - dl[e / 2]);
            }
        }
#pragma unroll
        for (int kk = 0; kk < TILE / 16; kk++) {
            uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int j = 0; j < D / 16; j++) {
                uint32_t b[4];
                ldsm_b<D>(b, Ks, kk * 16, j * 16);
                mma16816(acc[2 * j], a, b[0], b[1]);
                mma16816(acc[2 * j + 1], a, b[2], b[3]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row[r] >= len) continue;
        bf16 *drow = dq + ((size_t)start + row[r]) * lddq + (size_t)h * D + 2 * (lane % 4);
#pragma unroll
        for (int i = 0; i < D / 8; i++)
            *(__nv_bfloat162 *)(drow + i * 8) = __floats2bfloat162_rn(acc[i][2 * r] * scale, acc[i][2 * r + 1] * scale);
    }
}

/* dk, dv for one 64-key tile of one kv head, summed over its query heads:
 * dv = P^T dO, dk = scale * dS^T Q, with P^T and dS^T computed key-major. */
template <int D>
__global__ void __launch_bounds__(THREADS)
attn_bwd_dkdv_kernel(bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo,
                     const float *lse, const float *delta, const bf16 *q, int ldq, const bf16 *k,
                     int ldk, const bf16 *v, int ldv, const int32_t *cu_seqlens, int nq, int group,
                     float scale, float scale_log2, int window)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Ks = (bf16 *)smem_raw, *Vs = Ks + TILE * Smem<D>::ROW;
    bf16 *Qs = Vs + TILE * Smem<D>::ROW, *dOs = Qs + BWD_QTILE * Smem<D>::ROW;
    float *lse2_s = (float *)(dOs + BWD_QTILE * Smem<D>::ROW), *dl_s = lse2_s + BWD_QTILE;
    const int doc = blockIdx.x, kvh = blockIdx.z;
    const int k0 = blockIdx.y * TILE;
    const int start = cu_seqlens[doc], len = cu_seqlens[doc + 1] - start;
    if (k0 >= len) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    load_tile<D>(Ks, k + (size_t)(start + k0) * ldk + (size_t)kvh * D, ldk, TILE, min(TILE, len - k0));
    load_tile<D>(Vs, v + (size_t)(start + k0) * ldv + (size_t)kvh * D, ldv, TILE, min(TILE, len - k0));
    const int key[2] = {k0 + warp * 16 + lane / 4, k0 + warp * 16 + lane / 4 + 8};
    float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
        dka[i][0] = dka[i][1] = dka[i][2] = dka[i][3] = dva[i][0] = dva[i][1] = dva[i][2] = dva[i][3] = 0.0f;

    /* Queries that see some key of this tile: i >= k0 and i < k0 + TILE - 1 + window. */
    const int qend = window > 0 ? min(len, k0 + TILE - 1 + window) : len;
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        for (int q0 = k0; q0 < qend; q0 += BWD_QTILE) {
            __syncthreads(); /* the previous query tile is consumed (and K, V are loaded) */
            load_tile<D>(Qs, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, BWD_QTILE, min(BWD_QTILE, len - q0));
            load_tile<D>(dOs, dout + (size_t)(start + q0) * lddo + (size_t)h * D, lddo, BWD_QTILE, min(BWD_QTILE, len - q0));
            if (threadIdx.x < BWD_QTILE) {
                int i = q0 + threadIdx.x;
                size_t t = (size_t)start + i;
                lse2_s[threadIdx.x] = i < len ? lse[t * nq + h] * LOG2E : 0.0f;
                dl_s[threadIdx.x] = i < len ? delta[t * nq + h] : 0.0f;
            }
            __syncthreads();

            float s[BWD_QTILE / 8][4], dp[BWD_QTILE / 8][4];
#pragma unroll
            for (int i = 0; i < BWD_QTILE / 8; i++)
                s[i][0] = s[i][1] = s[i][2] = s[i][3] = dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t ka[4], va[4];
                ldsm_a<D>(ka, Ks, warp * 16, kk * 16);
                ldsm_a<D>(va, Vs, warp * 16, kk * 16);
#pragma unroll
                for (int j = 0; j < BWD_QTILE / 16; j++) {
                    uint32_t b[4];
                    ldsm_bt<D>(b, Qs, j * 16, kk * 16);
                    mma16816(s[2 * j], ka, b[0], b[1]);
                    mma16816(s[2 * j + 1], ka, b[2], b[3]);
                    ldsm_bt<D>(b, dOs, j * 16, kk * 16);
                    mma16816(dp[2 * j], va, b[0], b[1]);
                    mma16816(dp[2 * j + 1], va, b[2], b[3]);
                }
            }
            /* s holds S^T (keys x queries): element e of n-tile nt is key key[e/2],
             * query q0 + nt*8 + 2*(lane%4) + (e&1). Now P^T -> s, dS^T -> dp. */
#pragma unroll
            for (int nt = 0; nt < BWD_QTILE / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int qi = nt * 8 + 2 * (lane % 4) + (e & 1);
                    float p = visible(q0 + qi, key[e / 2], len, window) ? exp2f(s[nt][e] * scale_log2 - lse2_s[qi]) : 0.0f;
                    s[nt][e] = p;
                    dp[nt][e] = p * (dp[nt][e] - dl_s[qi]);
                }
            }
#pragma unroll
            for (int kk = 0; kk < BWD_QTILE / 16; kk++) {
                uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                  pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
                uint32_t da[4] = {pack_bf16(dp[2 * kk][0], dp[2 * kk][1]), pack_bf16(dp[2 * kk][2], dp[2 * kk][3]),
                                  pack_bf16(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                                  pack_bf16(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
                for (int j = 0; j < D / 16; j++) {
                    uint32_t b[4];
                    ldsm_b<D>(b, dOs, kk * 16, j * 16);
                    mma16816(dva[2 * j], pa, b[0], b[1]);
                    mma16816(dva[2 * j + 1], pa, b[2], b[3]);
                    ldsm_b<D>(b, Qs, kk * 16, j * 16);
                    mma16816(dka[2 * j], da, b[0], b[1]);
                    mma16816(dka[2 * j + 1], da, b[2], b[3]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (key[r] >= len) continue;
        size_t t = (size_t)start + key[r];
        bf16 *krow = dk + t * lddk + (size_t)kvh * D + 2 * (lane % 4);
        bf16 *vrow = dv + t * lddv + (size_t)kvh * D + 2 * (lane % 4);
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            *(__nv_bfloat162 *)(krow + i * 8) = __floats2bfloat162_rn(dka[i][2 * r] * scale, dka[i][2 * r + 1] * scale);
            *(__nv_bfloat162 *)(vrow + i * 8) = __floats2bfloat162_rn(dva[i][2 * r], dva[i][2 * r + 1]);
        }
    }
}

/* Rows past cu_seqlens[n_docs] belong to no document: their outputs (and lse)
 * are zero, as the CPU reference defines. The end is only known on the device,
 * so each block of TAIL_ROWS rows checks it and nearly all exit at once. */
#define TAIL_ROWS 16
struct tail_zero {
    bf16 *p[3];       /* up to three (T, cols) bf16 outputs; NULL when unused */
    int ld[3], cols[3];
    float *f;         /* (T, fcols) fp32 output (lse) or NULL */
    int fcols;
};

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

static void zero_tail(cudaStream_t st, const tail_zero &z, const int32_t *cu_seqlens, int n_docs, int T)
{
    zero_tail_kernel<<<grid_for((size_t)T, TAIL_ROWS), 128, 0, st>>>(z, cu_seqlens, n_docs, T);
    LAUNCH_CHECK();
}

template <int D> static size_t fwd_smem() { return (size_t)3 * TILE * Smem<D>::ROW * 2; }
template <int D> static size_t dq_smem() { return (size_t)4 * TILE * Smem<D>::ROW * 2; }
template <int D> static size_t dkdv_smem()
{
    return (size_t)(2 * TILE + 2 * BWD_QTILE) * Smem<D>::ROW * 2 + 2 * BWD_QTILE * sizeof(float);
}

template <int D> static void attention_init_d()
{
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_smem<D>()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem<D>()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dkdv_smem<D>()));
}

/* Raises the shared-memory limit of every instantiation once (more than 48 KB
 * needs an explicit opt-in). */
void attention_init(void)
{
    attention_init_d<32>();
    attention_init_d<64>();
    attention_init_d<128>();
}

static void check_args(const char *op, int D, int nq, int nkv, int max_seqlen,
                       const void *const *ptrs, const int *lds, int n)
{
    CT_ASSERT(D == 32 || D == 64 || D == 128, "%s: head_dim %d is not supported (32, 64, 128 are)", op, D);
    CT_ASSERT(nkv > 0 && nq % nkv == 0, "%s: nq=%d is not a multiple of nkv=%d", op, nq, nkv);
    CT_ASSERT(ct_ceil_div((size_t)max_seqlen, TILE) <= 65535, "%s: max_seqlen %d is too long for the grid", op, max_seqlen);
    for (int i = 0; i < n; i++)
        CT_ASSERT(aligned16(ptrs[i]) && lds[i] % 8 == 0,
                  "%s: operand %d must be 16-byte aligned with a stride multiple of 8 (stride %d)", op, i, lds[i]);
}

template <int D>
static void fwd_launch(cudaStream_t st, bf16 *out, int ldo, float *lse, const bf16 *q, int ldq,
                       const bf16 *k, int ldk, const bf16 *v, int ldv, const int32_t *cu, int n_docs,
                       int max_seqlen, int nq, int nkv, float scale, int window, const float *sinks)
{
    dim3 grid(n_docs, (unsigned)ct_ceil_div((size_t)max_seqlen, TILE), nq);
    attn_fwd_kernel<D><<<grid, THREADS, fwd_smem<D>(), st>>>(out, ldo, lse, q, ldq, k, ldk, v, ldv, cu, nq,
                                                           nq / nkv, scale * LOG2E, window, sinks);
    LAUNCH_CHECK();
}

void cuda_attention_fwd(ct_backend *be, void *out, int ldo, float *lse, const void *q, int ldq,
                        const void *k, int ldk, const void *v, int ldv, const int32_t *cu_seqlens,
                        int n_docs, int max_seqlen, int T, int nq, int nkv, int D, float scale,
                        int window, const float *sinks)
{
    const void *ptrs[] = {out, q, k, v};
    const int lds[] = {ldo, ldq, ldk, ldv};
    check_args("attention_fwd", D, nq, nkv, max_seqlen, ptrs, lds, 4);
    if (T == 0) return;
    cudaStream_t st = ctx_of(be)->stream;
    tail_zero z = {{(bf16 *)out, NULL, NULL}, {ldo, 0, 0}, {nq * D, 0, 0}, lse, nq};
    zero_tail(st, z, cu_seqlens, n_docs, T);
    if (n_docs == 0 || max_seqlen == 0) return;
    bf16 *o = (bf16 *)out;
    const bf16 *qb = (const bf16 *)q, *kb = (const bf16 *)k, *vb = (const bf16 *)v;
    if (D == 32) fwd_launch<32>(st, o, ldo, lse, qb, ldq, kb, ldk, vb, ldv, cu_seqlens, n_docs, max_seqlen, nq, nkv, scale, window, sinks);
    else if (D == 64) fwd_launch<64>(st, o, ldo, lse, qb, ldq, kb, ldk, vb, ldv, cu_seqlens, n_docs, max_seqlen, nq, nkv, scale, window, sinks);
    else fwd_launch<128>(st, o, ldo, lse, qb, ldq, kb, ldk, vb, ldv, cu_seqlens, n_docs, max_seqlen, nq, nkv, scale, window, sinks);
}

template <int D>
static void bwd_launch(cudaStream_t st, float *delta, bf16 *dq, int lddq, bf16 *dk, int lddk, bf16 *dv,
                       int lddv, const bf16 *dout, int lddo, const bf16 *out, int ldo, const float *lse,
                       const bf16 *q, int ldq, const bf16 *k, int ldk, const bf16 *v, int ldv,
                       const int32_t *cu, int n_docs, int max_seqlen, int T, int nq, int nkv, float scale,
                       int window)
{
    size_t rows = (size_t)T * nq;
    attn_delta_kernel<D><<<grid_for(rows, 8), 256, 0, st>>>(delta, dout, lddo, out, ldo, T, nq);
    LAUNCH_CHECK();
    unsigned tiles = (unsigned)ct_ceil_div((size_t)max_seqlen, TILE);
    dim3 gq(n_docs, tiles, nq);
    attn_bwd_dq_kernel<D><<<gq, THREADS, dq_smem<D>(), st>>>(dq, lddq, dout, lddo, lse, delta, q, ldq, k, ldk,
                                                           v, ldv, cu, nq, nq / nkv, scale, scale * LOG2E, window);
    LAUNCH_CHECK();
    dim3 gk(n_docs, tiles, nkv);
    attn_bwd_dkdv_kernel<D><<<gk, THREADS, dkdv_smem<D>(), st>>>(dk, lddk, dv, lddv, dout, lddo, lse, delta, q,
                                                               ldq, k, ldk, v, ldv, cu, nq, nq / nkv, scale,
                                                               scale * LOG2E, window);
    LAUNCH_CHECK();
}

void cuda_attention_bwd(ct_backend *be, void *dq, int lddq, void *dk, int lddk, void *dv, int lddv,
                        const void *dout, int lddo, const void *out, int ldo, const float *lse,
                        const void *q, int ldq, const void *k, int ldk, const void *v, int ldv,
                        const int32_t *cu_seqlens, int n_docs, int max_seqlen, int T, int nq,
                        int nkv, int D, float scale, int window, const float *sinks)
{
    const void *ptrs[] = {dq, dk, dv, dout, out, q, k, v};
    const int lds[] = {lddq, lddk, lddv, lddo, ldo, ldq, ldk, ldv};
    check_args("attention_bwd", D, nq, nkv, max_seqlen, ptrs, lds, 8);
    if (T == 0) return;
    cuda_ctx *c = ctx_of(be);
    tail_zero z = {{(bf16 *)dq, (bf16 *)dk, (bf16 *)dv}, {lddq, lddk, lddv}, {nq * D, nkv * D, nkv * D}, NULL, 0};
    zero_tail(c->stream, z, cu_seqlens, n_docs, T);
    if (n_docs == 0 || max_seqlen == 0) return;
    /* The sinks enter backward only through lse (they have no value rows and are
     * frozen), so they are not read here. */
    float *delta = (float *)cuda_scratch(c, (size_t)T * nq * sizeof(float));
    bf16 *a = (bf16 *)dq, *b = (bf16 *)dk, *cc = (bf16 *)dv;
    const bf16 *go = (const bf16 *)dout, *o = (const bf16 *)out;
    const bf16 *qb = (const bf16 *)q, *kb = (const bf16 *)k, *vb = (const bf16 *)v;
    if (D == 32) bwd_launch<32>(c->stream, delta, a, lddq, b, lddk, cc, lddv, go, lddo, o, ldo, lse, qb, ldq, kb, ldk, vb, ldv, cu_seqlens, n_docs, max_seqlen, T, nq, nkv, scale, window);
    else if (D == 64) bwd_launch<64>(c->stream, delta, a, lddq, b, lddk, cc, lddv, go, lddo, o, ldo, lse, qb, ldq, kb, ldk, vb, ldv, cu_seqlens, n_docs, max_seqlen, T, nq, nkv, scale, window);
    else bwd_launch<128>(c->stream, delta, a, lddq, b, lddk, cc, lddv, go, lddo, o, ldo, lse, qb, ldq, kb, ldk, vb, ldv, cu_seqlens, n_docs, max_seqlen, T, nq, nkv, scale, window);
}
