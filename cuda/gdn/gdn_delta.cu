/* gdn_delta.cu — the gated delta rule of a Gated DeltaNet layer, forward and
 * backward (backend.h, gdn_delta_fwd / gdn_delta_bwd), in chunks of 64 tokens
 * that never span two documents. The oracle is the CPU's token loop
 * (src/backend/backend_cpu_gdn.c); docs/kernels/gdn.md derives every formula.
 *
 * Per (document, value head) with q, k L2-normed (q also scaled), chunk of L <= 64
 * tokens, state S0 (Dk x Dv, fp32) at its start, and γ_i the chunk-local
 * inclusive cumsum of g (so every exponent below, γ_i - γ_j with j <= i, γ_i and
 * γ_L - γ_j, is <= 0: it is formed before exp and never factored as e^a e^-b):
 *   M_ij = e^(γ_i - γ_j) for j <= i, else 0 ;  A_ij = β_i M_ij (k_i . k_j), j < i
 *   T = (I + A)^-1 ;  W = T diag(β e^γ) K ;  U' = T diag(β) V
 *   u = U' - W S0                               (the tokens' writes, "v_new")
 *   o_i = e^γ_i S0^T q_i + sum_{j<=i} M_ij (q_i . k_j) u_j
 *   S_L = e^γ_L S0 + sum_j e^(γ_L - γ_j) k_j u_j^T
 * which is the token recurrence (S = e^g S; u = β (v - S^T k); S += k u^T;
 * o = S^T q) regrouped. The backward is its exact derivative with the chunk
 * end's state gradient dS_L carried from the next chunk:
 *   du_j = sum_{i>=j} M_ij (q_i . k_j) do_i + e^(γ_L - γ_j) dS_L^T k_j ; db = T^T du
 *   dS0 = e^γ_L dS_L + sum_i e^γ_i q_i do_i^T - sum_i β_i e^γ_i k_i db_i^T
 * and the per-token dq, dk, dv, dβ, dγ of one chunk given S0, dS_L, u and db.
 *
 * Passes (every one deterministic: fixed-order sums, no atomics):
 *   chunks     one block: the (start, length) table of every chunk, documents cut
 *              at 64 tokens, and each document's first chunk;
 *   normalize  q, k L2-normed into fp32 (T, Hk, Dk), one warp per row;
 *   prep       per (chunk, value head): γ, M (q.k), M (k.k), the solve T by
 *              forward substitution, W and U' (fp32);
 *   scan       per (document, value head, 32 state columns): the only
 *              sequential loop, over the document's chunks: stores each chunk's
 *              S0 and its u;
 *   output     per (chunk, value head, 32 columns): o, rounded once to bf16.
 * The backward reruns normalize, prep and scan (nothing is saved between the two
 * calls), then:
 *   scan_bwd   per (document, value head, 32 columns), chunks in reverse: stores
 *              each chunk's dS_L and db;
 *   grads      per (chunk, value head, 32 columns): dv, and the 32 columns' share
 *              of dq, dk, dβ, dγ;
 *   finish     dγ summed over column tiles and turned into dg (reverse cumsum in
 *              the chunk), dβ summed; dq, dk summed over column tiles and the
 *              value heads of each key head, then through the L2 norm, to bf16.
 * Everything between passes is fp32 scratch (cuda_scratch), proportional to T
 * whatever the documents (states only for chunks that have one, the chunk
 * matrices by token row; memory_plan.c counts the same): at Hv 48, Dk = Dv = 128
 * and 16k tokens about 7.3 GB for the backward.
 *
 * The products inside a chunk are fp32 on the CUDA cores, register-tiled (Tile:
 * each thread a 4 x 8 or smaller block of the output); no tensor cores yet.
 * Dk 32, 64 or 128, Dv a multiple of 32. */
#include "ct_cuda.cuh"

#define CHUNK 64     /* tokens per chunk */
#define VT 32        /* state columns per block of the column-tiled passes */
#define THREADS 256
#define L2NORM_EPS 1e-6f

// ---- kernels ----

/* Exclusive prefix sum of x over the block's threads in thread order, plus the
 * running total in *carry (updated after every thread has read it). */
__device__ __forceinline__ int block_scan(int x, int *warp_sum, int *carry)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int v = x; /* inclusive scan: lanes, then warps */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    if (lane == 31) warp_sum[warp] = v;
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
    int incl = *carry + v + (warp > 0 ? warp_sum[warp - 1] : 0);
    __syncthreads(); /* carry and warp_sum are read */
    if (threadIdx.x == blockDim.x - 1) *carry = incl;
    __syncthreads();
    return incl - x;
}

/* chunks[c] = {first token, length, state slot, state-gradient slot} for c < the
 * chunk count, zeros up to n_slots; chunk_off (n_docs + 1): each document's first
 * chunk, then the total. Only a chunk after a document's first has a start state
 * to store (slot -1: the state is 0) and only one before its last an end-state
 * gradient (slot -1: 0), so both need at most T / CHUNK slots. One block. */
__global__ void __launch_bounds__(1024)
delta_chunks_kernel(int4 *chunks, int *chunk_off, const int32_t *cu, int n_docs, int n_slots)
{
    __shared__ int warp_sum[32];
    __shared__ int carry[2];
    if (threadIdx.x < 2) carry[threadIdx.x] = 0;
    __syncthreads();
    for (int d0 = 0; d0 < n_docs; d0 += 1024) {
        int d = d0 + threadIdx.x;
        int n = d < n_docs ? (cu[d + 1] - cu[d] + CHUNK - 1) / CHUNK : 0;
        int off = block_scan(n, warp_sum, &carry[0]);
        int soff = block_scan(n > 0 ? n - 1 : 0, warp_sum, &carry[1]);
        if (d < n_docs) {
            int s = cu[d], len = cu[d + 1] - s;
            chunk_off[d] = off;
            for (int i = 0; i < n; i++)
                chunks[off + i] = make_int4(s + i * CHUNK, min(CHUNK, len - i * CHUNK), i > 0 ? soff + i - 1 : -1,
                                            i < n - 1 ? soff + i : -1);
        }
    }
    const int total = carry[0];
    if (threadIdx.x == 0) chunk_off[n_docs] = total;
    for (int c = total + threadIdx.x; c < n_slots; c += 1024) chunks[c] = make_int4(0, 0, -1, -1);
}

__device__ __forceinline__ float warp_sum_f(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* qn = q r scale, kn = k r (r = (sum x^2 + eps)^-1/2), (T, Hk, DK) fp32; one warp per
 * (token, key head), tokens past the last document skipped. */
template <int DK>
__global__ void __launch_bounds__(THREADS)
delta_normalize_kernel(float *qn, float *kn, const bf16 *q, int ldq, const bf16 *k, int ldk,
                       const int32_t *cu, int n_docs, int T, int Hk, float scale)
{
    size_t row = (size_t)blockIdx.x * (THREADS / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= (size_t)T * Hk) return;
    int t = (int)(row / Hk), kh = (int)(row % Hk);
    if (t >= cu[n_docs]) return;
    const bf16 *src[2] = {q + (size_t)t * ldq + (size_t)kh * DK, k + (size_t)t * ldk + (size_t)kh * DK};
    float *dst[2] = {qn + row * DK, kn + row * DK};
    const float mul[2] = {scale, 1.0f};
    for (int w = 0; w < 2; w++) {
        float x[DK / 32], ss = 0.0f;
#pragma unroll
        for (int i = 0; i < DK / 32; i++) {
            x[i] = __bfloat162float(src[w][lane + 32 * i]);
            ss += x[i] * x[i];
        }
        float r = rsqrtf(warp_sum_f(ss) + L2NORM_EPS) * mul[w];
#pragma unroll
        for (int i = 0; i < DK / 32; i++) dst[w][lane + 32 * i] = x[i] * r;
    }
}

/* Rows [0, L) of a (rows, cols) fp32 matrix with row stride ld into shared memory
 * with row stride sld, rows [L, CHUNK) zero. */
__device__ __forceinline__ void load_rows(float *dst, int sld, const float *src, size_t ld, int L, int cols)
{
    for (int e = threadIdx.x; e < CHUNK * cols; e += THREADS) {
        int i = e / cols, c = e % cols;
        dst[i * sld + c] = i < L ? src[(size_t)i * ld + c] : 0.0f;
    }
}
__device__ __forceinline__ void load_rows_bf16(float *dst, int sld, const bf16 *src, size_t ld, int L, int cols)
{
    for (int e = threadIdx.x; e < CHUNK * cols; e += THREADS) {
        int i = e / cols, c = e % cols;
        dst[i * sld + c] = i < L ? __bfloat162float(src[(size_t)i * ld + c]) : 0.0f;
    }
}

/* A chunk's (CHUNK, CHUNK) matrices are stored by token row: row i of the chunk
 * that starts at t0 is row (t0 + i, h) of a (T, Hv, CHUNK) array, so their size
 * follows T, not the number of chunks. Rows past L are not stored (read as 0). */
__device__ __forceinline__ size_t mat_row(int t0, int i, int Hv, int h)
{
    return ((size_t)(t0 + i) * Hv + h) * CHUNK;
}
__device__ __forceinline__ void load_mat(float *dst, int sld, const float *src, int t0, int L, int Hv, int h)
{
    for (int p = threadIdx.x; p < CHUNK * CHUNK; p += THREADS) {
        int i = p / CHUNK, j = p % CHUNK;
        dst[i * sld + j] = i < L ? src[mat_row(t0, i, Hv, h) + j] : 0.0f;
    }
}
/* A chunk's (DK, VT) state tile from slot `slot` of a (slots, Hv, DK, Dv) array,
 * or zeros for slot -1. */
__device__ __forceinline__ void load_state(float *dst, int sld, const float *src, int slot, int Hv, int h, int DK,
                                           int Dv, int c0)
{
    const float *p = slot >= 0 ? src + ((size_t)slot * Hv + h) * DK * Dv + c0 : nullptr;
    for (int e = threadIdx.x; e < DK * VT; e += THREADS)
        dst[(e / VT) * sld + e % VT] = p ? p[(size_t)(e / VT) * Dv + e % VT] : 0.0f;
}

/* Shared-memory strides: one float of padding per row keeps column walks off a
 * single bank. */
template <int DK> struct Lay {
    static constexpr int KP = DK + 1;    /* (CHUNK, DK) rows */
    static constexpr int CP = CHUNK + 1; /* (CHUNK, CHUNK) rows */
    static constexpr int VP = VT + 1;    /* (CHUNK, VT) and (DK, VT) rows */
};

/* The chunk's gates: gs = γ (inclusive cumsum of g inside the chunk), bs = β, both
 * zero past L. Thread 0 sums in token order, as the recurrence multiplies. */
__device__ __forceinline__ void load_gates(float *gs, float *bs, const float *g, const float *beta, int t0, int L,
                                           int Hv, int h)
{
    if (threadIdx.x < CHUNK) {
        int i = threadIdx.x;
        gs[i] = i < L ? g[(size_t)(t0 + i) * Hv + h] : 0.0f;
        bs[i] = i < L ? beta[(size_t)(t0 + i) * Hv + h] : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i = 1; i < L; i++) gs[i] += gs[i - 1];
    __syncthreads();
}

/* A register tile of a (TR RM) x (TC RN) product held across the block: thread
 * (tr, tc) = (tid / TC, tid % TC) owns rows tr + TR i and columns tc + TC j, so the
 * lanes of a warp walk consecutive columns and share rows (shared-memory
 * broadcasts), and every operand a thread loads feeds RM or RN multiply-adds. */
template <int TR, int TC, int RM, int RN> struct Tile {
    static_assert(TR * TC == THREADS, "a tile spans the block");
    float acc[RM][RN];
    int tr, tc;
    __device__ Tile() : tr(threadIdx.x / TC), tc(threadIdx.x % TC)
    {
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < RN; j++) acc[i][j] = 0.0f;
    }
    __device__ int row(int i) const { return tr + TR * i; }
    __device__ int col(int j) const { return tc + TC * j; }
    /* acc += sum_{k < K} A(row, k) B(k, col), A(r, k) = A[r sar + k sak], B(k, c) =
     * B[k sbk + c sbc]: the strides say which operand is read transposed. */
    __device__ void mma(const float *A, int sar, int sak, const float *B, int sbk, int sbc, int K)
    {
        for (int k = 0; k < K; k++) {
            float a[RM], b[RN];
#pragma unroll
            for (int i = 0; i < RM; i++) a[i] = A[row(i) * sar + k * sak];
#pragma unroll
            for (int j = 0; j < RN; j++) b[j] = B[k * sbk + col(j) * sbc];
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int j = 0; j < RN; j++) acc[i][j] += a[i] * b[j];
        }
    }
    /* Row i's sum over the TC threads of its row (RN columns each), fixed order. */
    __device__ float row_sum(int i, const float *w, int sw) const
    {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < RN; j++) s += acc[i][j] * w[col(j) * sw];
#pragma unroll
        for (int o = 1; o < TC; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        return s;
    }
};

/* prep, one block per (chunk, value head): Tm = (I + A)^-1, QKM_ij = M_ij (q_i.k_j)
 * (j <= i), KKM_ij = M_ij (k_i.k_j) (j < i), each (CHUNK, CHUNK) per (chunk, head) by token row;
 * W (T, Hv, DK) and U' (T, Hv, Dv) at the chunk's token rows; gam (T, Hv) = γ. */
template <int DK>
__global__ void __launch_bounds__(THREADS)
delta_prep_kernel(float *Tm, float *QKM, float *KKM, float *Wb, float *Ub, float *gam, const float *qn,
                  const float *kn, const bf16 *v, int ldv, const float *g, const float *beta, const int4 *chunks,
                  int Hk, int Hv, int Dv)
{
    using Ly = Lay<DK>;
    const int c = blockIdx.x / Hv, h = blockIdx.x % Hv, kh = h / (Hv / Hk);
    const int4 ch = chunks[c];
    const int t0 = ch.x, L = ch.y;
    if (L == 0) return;
    extern __shared__ float sm[];
    float *Qs = sm, *Ks = Qs + CHUNK * Ly::KP, *As = Ks + CHUNK * Ly::KP, *Ts = As + CHUNK * Ly::CP;
    float *Vs = Ts + CHUNK * Ly::CP, *gs = Vs + CHUNK * Ly::VP, *bs = gs + CHUNK;
    const int tid = threadIdx.x;
    load_rows(Qs, Ly::KP, qn + ((size_t)t0 * Hk + kh) * DK, (size_t)Hk * DK, L, DK);
    load_rows(Ks, Ly::KP, kn + ((size_t)t0 * Hk + kh) * DK, (size_t)Hk * DK, L, DK);
    load_gates(gs, bs, g, beta, t0, L, Hv, h); /* syncs */
    {
        Tile<16, 16, 4, 4> qk, kk;
        qk.mma(Qs, Ly::KP, 1, Ks, 1, Ly::KP, DK);
        kk.mma(Ks, Ly::KP, 1, Ks, 1, Ly::KP, DK);
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int i = qk.row(a), j = qk.col(b);
                float m = (j <= i && i < L) ? expf(gs[i] - gs[j]) : 0.0f;
                float x = m * qk.acc[a][b], y = j < i ? m * kk.acc[a][b] : 0.0f;
                if (i < L) {
                    QKM[mat_row(t0, i, Hv, h) + j] = x;
                    KKM[mat_row(t0, i, Hv, h) + j] = y;
                }
                As[i * Ly::CP + j] = bs[i] * y;
                Ts[i * Ly::CP + j] = i == j ? 1.0f : 0.0f;
            }
    }
    __syncthreads();
    /* Forward substitution, row by row: T_i = e_i - sum_{j<i} A_ij T_j. Four
     * threads per column share the sum over j (fixed order: stride 4, then a
     * two-step shuffle). */
    for (int i = 1; i < L; i++) {
        int col = tid / 4, part = tid % 4;
        float s = 0.0f;
        if (col < i)
            for (int j = col + part; j < i; j += 4) s += As[i * Ly::CP + j] * Ts[j * Ly::CP + col];
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (col < i && part == 0) Ts[i * Ly::CP + col] = -s;
        __syncthreads();
    }
    for (int p = tid; p < L * CHUNK; p += THREADS) Tm[mat_row(t0, p / CHUNK, Hv, h) + p % CHUNK] = Ts[(p / CHUNK) * Ly::CP + p % CHUNK];
    /* W = T (β e^γ K): K's rows scaled in place first. */
    for (int e = tid; e < CHUNK * DK; e += THREADS) Ks[(e / DK) * Ly::KP + e % DK] *= bs[e / DK] * expf(gs[e / DK]);
    __syncthreads();
    {
        Tile<16, 16, 4, DK / 16> w;
        w.mma(Ts, Ly::CP, 1, Ks, Ly::KP, 1, CHUNK);
#pragma unroll
        for (int a = 0; a < 4; a++)
            if (w.row(a) < L)
#pragma unroll
                for (int b = 0; b < DK / 16; b++) Wb[((size_t)(t0 + w.row(a)) * Hv + h) * DK + w.col(b)] = w.acc[a][b];
    }
    /* U' = T (β V), VT columns at a time. */
    for (int c0 = 0; c0 < Dv; c0 += VT) {
        __syncthreads();
        load_rows_bf16(Vs, Ly::VP, v + (size_t)t0 * ldv + (size_t)h * Dv + c0, (size_t)ldv, L, VT);
        __syncthreads();
        for (int e = tid; e < CHUNK * VT; e += THREADS) Vs[(e / VT) * Ly::VP + e % VT] *= bs[e / VT];
        __syncthreads();
        Tile<32, 8, 2, 4> u;
        u.mma(Ts, Ly::CP, 1, Vs, Ly::VP, 1, CHUNK);
#pragma unroll
        for (int a = 0; a < 2; a++)
            if (u.row(a) < L)
#pragma unroll
                for (int b = 0; b < 4; b++) Ub[((size_t)(t0 + u.row(a)) * Hv + h) * Dv + c0 + u.col(b)] = u.acc[a][b];
    }
    if (tid < L) gam[(size_t)(t0 + tid) * Hv + h] = gs[tid];
}

/* scan, one block per (document, value head, column tile): state columns
 * [c0, c0 + VT) of S through the document's chunks; Hbuf (states, Hv, DK, Dv) gets
 * each chunk's S0 (in its slot, when it has one), Un (T, Hv, Dv) its u. */
template <int DK>
__global__ void __launch_bounds__(THREADS)
delta_scan_kernel(float *Hbuf, float *Un, const float *Wb, const float *Ub, const float *kn, const float *gam,
                  const int4 *chunks, const int *chunk_off, int Hk, int Hv, int Dv)
{
    using Ly = Lay<DK>;
    const int ntile = Dv / VT;
    const int d = blockIdx.x / (Hv * ntile), h = (blockIdx.x / ntile) % Hv, c0 = (blockIdx.x % ntile) * VT;
    const int kh = h / (Hv / Hk), tid = threadIdx.x;
    extern __shared__ float sm[];
    float *Ws = sm, *Ks = Ws + CHUNK * Ly::KP, *Hs = Ks + CHUNK * Ly::KP, *Vs = Hs + DK * Ly::VP;
    float *gs = Vs + CHUNK * Ly::VP;
    for (int e = tid; e < DK * VT; e += THREADS) Hs[(e / VT) * Ly::VP + e % VT] = 0.0f;
    for (int ci = chunk_off[d]; ci < chunk_off[d + 1]; ci++) {
        const int4 ch = chunks[ci];
        const int t0 = ch.x, L = ch.y;
        __syncthreads(); /* Hs final, the previous chunk's reads of Ws/Ks/Vs done */
        if (ch.z >= 0) { /* the first chunk's S0 is 0 and has no slot */
            float *H0 = Hbuf + ((size_t)ch.z * Hv + h) * DK * Dv + c0;
            for (int e = tid; e < DK * VT; e += THREADS) H0[(size_t)(e / VT) * Dv + e % VT] = Hs[(e / VT) * Ly::VP + e % VT];
        }
        load_rows(Ws, Ly::KP, Wb + ((size_t)t0 * Hv + h) * DK, (size_t)Hv * DK, L, DK);
        load_rows(Ks, Ly::KP, kn + ((size_t)t0 * Hk + kh) * DK, (size_t)Hk * DK, L, DK);
        if (tid < CHUNK) gs[tid] = tid < L ? gam[(size_t)(t0 + tid) * Hv + h] : 0.0f;
        __syncthreads();
        const float gL = gs[L - 1];
        {   /* u = U' - W S0; Vs keeps e^(γ_L - γ_i) u_i for the state update */
            Tile<32, 8, 2, 4> u;
            u.mma(Ws, Ly::KP, 1, Hs, Ly::VP, 1, DK);
#pragma unroll
            for (int a = 0; a < 2; a++) {
                int i = u.row(a);
                float dec = i < L ? expf(gL - gs[i]) : 0.0f;
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    float x = 0.0f;
                    if (i < L) {
                        size_t r = ((size_t)(t0 + i) * Hv + h) * Dv + c0 + u.col(b);
                        x = Ub[r] - u.acc[a][b];
                        Un[r] = x;
                    }
                    Vs[i * Ly::VP + u.col(b)] = dec * x;
                }
            }
        }
        __syncthreads();
        {   /* S_L = e^γ_L S0 + K^T (decayed u) */
            Tile<32, 8, DK / 32, 4> s;
            s.mma(Ks, 1, Ly::KP, Vs, Ly::VP, 1, CHUNK);
            const float aL = expf(gL);
#pragma unroll
            for (int a = 0; a < DK / 32; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    float *p = Hs + s.row(a) * Ly::VP + s.col(b);
                    *p = aL * *p + s.acc[a][b];
                }
        }
    }
}

/* output, one block per (chunk, value head, column tile):
 * o_i = e^γ_i S0^T q_i + sum_{j<=i} QKM_ij u_j, rounded once to bf16. */
template <int DK>
__global__ void __launch_bounds__(THREADS)
delta_output_kernel(bf16 *o, int ldo, const float *Hbuf, const float *Un, const float *QKM, const float *qn,
                    const float *gam, const int4 *chunks, int Hk, int Hv, int Dv)
{
    using Ly = Lay<DK>;
    const int ntile = Dv / VT;
    const int c = blockIdx.x / (Hv * ntile), h = (blockIdx.x / ntile) % Hv, c0 = (blockIdx.x % ntile) * VT;
    const int4 ch = chunks[c];
    const int t0 = ch.x, L = ch.y;
    if (L == 0) return;
    const int kh = h / (Hv / Hk), tid = threadIdx.x;
    extern __shared__ float sm[];
    float *Qs = sm, *Hs = Qs + CHUNK * Ly::KP, *Ps = Hs + DK * Ly::VP, *Vs = Ps + CHUNK * Ly::CP;
    float *gs = Vs + CHUNK * Ly::VP;
    load_rows(Qs, Ly::KP, qn + ((size_t)t0 * Hk + kh) * DK, (size_t)Hk * DK, L, DK);
    load_state(Hs, Ly::VP, Hbuf, ch.z, Hv, h, DK, Dv, c0);
    load_mat(Ps, Ly::CP, QKM, t0, L, Hv, h);
    load_rows(Vs, Ly::VP, Un + ((size_t)t0 * Hv + h) * Dv + c0, (size_t)Hv * Dv, L, VT);
    if (tid < CHUNK) gs[tid] = tid < L ? gam[(size_t)(t0 + tid) * Hv + h] : 0.0f;
    __syncthreads();
    Tile<32, 8, 2, 4> out;
    out.mma(Qs, Ly::KP, 1, Hs, Ly::VP, 1, DK);
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) out.acc[a][b] *= expf(gs[out.row(a)]);
    out.mma(Ps, Ly::CP, 1, Vs, Ly::VP, 1, CHUNK);
#pragma unroll
    for (int a = 0; a < 2; a++)
        if (out.row(a) < L)
#pragma unroll
            for (int b = 0; b < 4; b++)
                o[(size_t)(t0 + out.row(a)) * ldo + (size_t)h * Dv + c0 + out.col(b)] = __float2bfloat16(out.acc[a][b]);
}

/* scan_bwd, one block per (document, value head, column tile), the document's
 * chunks in reverse: dHbuf (states, Hv, DK, Dv) gets each chunk's dS_L (in its slot), DB (T, Hv, Dv)
 * its db; the carried dS goes to the previous chunk's end. */
template <int DK>
__global__ void __launch_bounds__(THREADS)
delta_scan_bwd_kernel(float *dHbuf, float *DB, const bf16 *dout, int lddo, const float *Tm, const float *QKM,
                      const float *qn, const float *kn, const float *gam, const float *beta, const int4 *chunks,
                      const int *chunk_off, int Hk, int Hv, int Dv)
{
    using Ly = Lay<DK>;
    const int ntile = Dv / VT;
    const int d = blockIdx.x / (Hv * ntile), h = (blockIdx.x / ntile) % Hv, c0 = (blockIdx.x % ntile) * VT;
    const int kh = h / (Hv / Hk), tid = threadIdx.x;
    extern __shared__ float sm[];
    float *Qs = sm, *Ks = Qs + CHUNK * Ly::KP, *Ps = Ks + CHUNK * Ly::KP, *Ts = Ps + CHUNK * Ly::CP;
    float *dH = Ts + CHUNK * Ly::CP, *dO = dH + DK * Ly::VP, *du = dO + CHUNK * Ly::VP, *db = du + CHUNK * Ly::VP;
    float *gs = db + CHUNK * Ly::VP, *bs = gs + CHUNK;
    for (int e = tid; e < DK * VT; e += THREADS) dH[(e / VT) * Ly::VP + e % VT] = 0.0f;
    for (int ci = chunk_off[d + 1] - 1; ci >= chunk_off[d]; ci--) {
        const int4 ch = chunks[ci];
        const int t0 = ch.x, L = ch.y;
        __syncthreads();
        if (ch.w >= 0) { /* the last chunk's dS_L is 0 and has no slot */
            float *dH0 = dHbuf + ((size_t)ch.w * Hv + h) * DK * Dv + c0;
            for (int e = tid; e < DK * VT; e += THREADS) dH0[(size_t)(e / VT) * Dv + e % VT] = dH[(e / VT) * Ly::VP + e % VT];
        }
        load_rows(Qs, Ly::KP, qn + ((size_t)t0 * Hk + kh) * DK, (size_t)Hk * DK, L, DK);
        load_rows(Ks, Ly::KP, kn + ((size_t)t0 * Hk + kh) * DK, (size_t)Hk * DK, L, DK);
        load_mat(Ps, Ly::CP, QKM, t0, L, Hv, h);
        load_mat(Ts, Ly::CP, Tm, t0, L, Hv, h);
        load_rows_bf16(dO, Ly::VP, dout + (size_t)t0 * lddo + (size_t)h * Dv + c0, (size_t)lddo, L, VT);
        if (tid < CHUNK) {
            gs[tid] = tid < L ? gam[(size_t)(t0 + tid) * Hv + h] : 0.0f;
            bs[tid] = tid < L ? beta[(size_t)(t0 + tid) * Hv + h] : 0.0f;
        }
        __syncthreads();
        const float gL = gs[L - 1];
        /* Qs rows scaled by e^γ for the state gradient */
        for (int e = tid; e < CHUNK * DK; e += THREADS) Qs[(e / DK) * Ly::KP + e % DK] *= expf(gs[e / DK]);
        {   /* du = e^(γ_L - γ) K dS_L + QKM^T do */
            Tile<32, 8, 2, 4> t;
            t.mma(Ks, Ly::KP, 1, dH, Ly::VP, 1, DK);
#pragma unroll
            for (int a = 0; a < 2; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) t.acc[a][b] *= t.row(a) < L ? expf(gL - gs[t.row(a)]) : 0.0f;
            t.mma(Ps, 1, Ly::CP, dO, Ly::VP, 1, CHUNK);
#pragma unroll
            for (int a = 0; a < 2; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) du[t.row(a) * Ly::VP + t.col(b)] = t.row(a) < L ? t.acc[a][b] : 0.0f;
        }
        __syncthreads();
        {   /* db = T^T du; db keeps -β e^γ db for the state gradient */
            Tile<32, 8, 2, 4> t;
            t.mma(Ts, 1, Ly::CP, du, Ly::VP, 1, CHUNK);
#pragma unroll
            for (int a = 0; a < 2; a++) {
                int j = t.row(a);
                float sc = j < L ? -bs[j] * expf(gs[j]) : 0.0f;
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    if (j < L) DB[((size_t)(t0 + j) * Hv + h) * Dv + c0 + t.col(b)] = t.acc[a][b];
                    db[j * Ly::VP + t.col(b)] = sc * t.acc[a][b];
                }
            }
        }
        __syncthreads();
        {   /* dS0 = e^γ_L dS_L + (e^γ Q)^T do - (β e^γ K)^T db */
            Tile<32, 8, DK / 32, 4> s;
            s.mma(Qs, 1, Ly::KP, dO, Ly::VP, 1, CHUNK);
            s.mma(Ks, 1, Ly::KP, db, Ly::VP, 1, CHUNK);
            const float aL = expf(gL);
#pragma unroll
            for (int a = 0; a < DK / 32; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    float *p = dH + s.row(a) * Ly::VP + s.col(b);
                    *p = aL * *p + s.acc[a][b];
                }
        }
    }
}

/* Sum over the block in a fixed order (warps, then warp 0); every thread gets it. */
__device__ __forceinline__ float block_sum(float v, float *red)
{
    v = warp_sum_f(v);
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < THREADS / 32; w++) s += red[w];
    return s;
}

/* grads, one block per (chunk, value head, column tile): dv (bf16, complete), and
 * this tile's share of dqn, dkn (tile, T, Hv, DK) and dγ, dβ (tile, T, Hv), from
 * S0 (Hbuf), dS_L (dHbuf), u (Un) and db (DB) of the chunk. */
template <int DK>
__global__ void __launch_bounds__(THREADS)
delta_grads_kernel(bf16 *dv, int lddv, float *dqp, float *dkp, float *dgp, float *dbp, const bf16 *dout, int lddo,
                   const bf16 *v, int ldv, const float *Hbuf, const float *dHbuf, const float *Un, const float *DB,
                   const float *QKM, const float *KKM, const float *qn, const float *kn, const float *gam,
                   const float *beta, const int4 *chunks, int T, int Hk, int Hv, int Dv)
{
    using Ly = Lay<DK>;
    const int ntile = Dv / VT;
    const int c = blockIdx.x / (Hv * ntile), h = (blockIdx.x / ntile) % Hv, tile = blockIdx.x % ntile;
    const int c0 = tile * VT;
    const int4 ch = chunks[c];
    const int t0 = ch.x, L = ch.y;
    if (L == 0) return;
    const int kh = h / (Hv / Hk), tid = threadIdx.x;
    extern __shared__ float sm[];
    float *Qs = sm, *Ks = Qs + CHUNK * Ly::KP;
    float *Xs = Ks + CHUNK * Ly::KP, *KKs = Xs + CHUNK * Ly::CP, *DU = KKs + CHUNK * Ly::CP, *DA = DU + CHUNK * Ly::CP;
    float *Hs = DA + CHUNK * Ly::CP, *dHs = Hs + DK * Ly::VP;
    float *us = dHs + DK * Ly::VP, *dOs = us + CHUNK * Ly::VP, *dbs = dOs + CHUNK * Ly::VP, *vs = dbs + CHUNK * Ly::VP;
    float *gs = vs + CHUNK * Ly::VP, *bs = gs + CHUNK, *dgam = bs + CHUNK, *red = dgam + CHUNK;

    load_rows(Qs, Ly::KP, qn + ((size_t)t0 * Hk + kh) * DK, (size_t)Hk * DK, L, DK);
    load_rows(Ks, Ly::KP, kn + ((size_t)t0 * Hk + kh) * DK, (size_t)Hk * DK, L, DK);
    load_mat(Xs, Ly::CP, QKM, t0, L, Hv, h);
    load_mat(KKs, Ly::CP, KKM, t0, L, Hv, h);
    load_state(Hs, Ly::VP, Hbuf, ch.z, Hv, h, DK, Dv, c0);
    load_state(dHs, Ly::VP, dHbuf, ch.w, Hv, h, DK, Dv, c0);
    const size_t roff = ((size_t)t0 * Hv + h) * Dv + c0;
    load_rows(us, Ly::VP, Un + roff, (size_t)Hv * Dv, L, VT);
    load_rows(dbs, Ly::VP, DB + roff, (size_t)Hv * Dv, L, VT);
    load_rows_bf16(dOs, Ly::VP, dout + (size_t)t0 * lddo + (size_t)h * Dv + c0, (size_t)lddo, L, VT);
    load_rows_bf16(vs, Ly::VP, v + (size_t)t0 * ldv + (size_t)h * Dv + c0, (size_t)ldv, L, VT);
    if (tid < CHUNK) {
        gs[tid] = tid < L ? gam[(size_t)(t0 + tid) * Hv + h] : 0.0f;
        bs[tid] = tid < L ? beta[(size_t)(t0 + tid) * Hv + h] : 0.0f;
    }
    __syncthreads();
    const float gL = gs[L - 1];

    {   /* DU_ij = do_i . u_j (j <= i), DA_ij = -db_i . u_j (j < i): the gradients of
         * the pair terms of o and of A, this tile's columns. */
        Tile<16, 16, 4, 4> pu, pa;
        pu.mma(dOs, Ly::VP, 1, us, 1, Ly::VP, VT);
        pa.mma(dbs, Ly::VP, 1, us, 1, Ly::VP, VT);
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int i = pu.row(a), j = pu.col(b);
                DU[i * Ly::CP + j] = (j <= i && i < L) ? pu.acc[a][b] : 0.0f;
                DA[i * Ly::CP + j] = (j < i && i < L) ? -pa.acc[a][b] : 0.0f;
            }
    }
    {   /* dβ_j = db_j . (v_j - e^γ_j S0^T k_j - sum_{l<j} KKM_jl u_l) ; dv_j = β_j db_j. */
        Tile<32, 8, 2, 4> sk, su;
        sk.mma(Ks, Ly::KP, 1, Hs, Ly::VP, 1, DK);
        su.mma(KKs, Ly::CP, 1, us, Ly::VP, 1, CHUNK);
#pragma unroll
        for (int a = 0; a < 2; a++) {
            int j = sk.row(a);
            float e = expf(gs[j]);
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int cc = sk.col(b);
                sk.acc[a][b] = vs[j * Ly::VP + cc] - e * sk.acc[a][b] - su.acc[a][b];
                if (j < L)
                    dv[(size_t)(t0 + j) * lddv + (size_t)h * Dv + c0 + cc] = __float2bfloat16(bs[j] * dbs[j * Ly::VP + cc]);
            }
            float s = sk.row_sum(a, dbs + j * Ly::VP, 1);
            if (sk.tc == 0 && j < L) dbp[((size_t)tile * T + t0 + j) * Hv + h] = s;
        }
    }
    __syncthreads();
    /* Per pair: X = QKM DU + β_i KKM DA (the pair's share of dγ: + to γ_i, - to γ_j),
     * then DU := M DU and DA := β_i M DA, the weights of the k, q rows in dq and dk. */
    for (int p = tid; p < CHUNK * CHUNK; p += THREADS) {
        int i = p / CHUNK, j = p % CHUNK, e = i * Ly::CP + j;
        float m = (j <= i && i < L) ? expf(gs[i] - gs[j]) : 0.0f;
        float x = Xs[e] * DU[e] + bs[i] * KKs[e] * DA[e];
        Xs[e] = x;
        DU[e] *= m;
        DA[e] *= bs[i] * m;
    }
    __syncthreads();
    if (tid < CHUNK) {
        float rs = 0.0f, cs = 0.0f;
        for (int j = 0; j < CHUNK; j++) {
            rs += Xs[tid * Ly::CP + j];
            cs += Xs[j * Ly::CP + tid];
        }
        dgam[tid] = rs - cs;
    }
    __syncthreads();
    /* Xs := DA + DA^T, the symmetric weight of the k rows in dk. */
    for (int p = tid; p < CHUNK * CHUNK; p += THREADS) {
        int i = p / CHUNK, j = p % CHUNK;
        Xs[i * Ly::CP + j] = DA[i * Ly::CP + j] + DA[j * Ly::CP + i];
    }
    __syncthreads();
    /* dq = e^γ S0 do + DU K ; dk = -β e^γ S0 db + e^(γ_L - γ) dS_L u + DU^T Q + (DA + DA^T) K,
     * with each token's dγ terms: + q.(e^γ S0 do) + k.(-β e^γ S0 db) - k.(e^(γ_L - γ) dS_L u),
     * and the last token's + sum_j k_j.(e^(γ_L - γ_j) dS_L u_j). */
    using QT = Tile<16, 16, 4, DK / 16>;
    float gi[4] = {0.0f, 0.0f, 0.0f, 0.0f}, qsum = 0.0f;
    {
        QT t;
        t.mma(dOs, Ly::VP, 1, Hs, 1, Ly::VP, VT);
#pragma unroll
        for (int a = 0; a < 4; a++) {
            float e = expf(gs[t.row(a)]);
#pragma unroll
            for (int b = 0; b < DK / 16; b++) t.acc[a][b] *= e;
            gi[a] += t.row_sum(a, Qs + t.row(a) * Ly::KP, 1);
        }
        t.mma(DU, Ly::CP, 1, Ks, Ly::KP, 1, CHUNK);
#pragma unroll
        for (int a = 0; a < 4; a++)
            if (t.row(a) < L) {
                float *p = dqp + (((size_t)tile * T + t0 + t.row(a)) * Hv + h) * DK;
#pragma unroll
                for (int b = 0; b < DK / 16; b++) p[t.col(b)] = t.acc[a][b];
            }
    }
    {
        QT y, z;
        y.mma(dbs, Ly::VP, 1, Hs, 1, Ly::VP, VT);
        z.mma(us, Ly::VP, 1, dHs, 1, Ly::VP, VT);
#pragma unroll
        for (int a = 0; a < 4; a++) {
            int i = y.row(a);
            float sy = -bs[i] * expf(gs[i]), sz = i < L ? expf(gL - gs[i]) : 0.0f;
#pragma unroll
            for (int b = 0; b < DK / 16; b++) {
                y.acc[a][b] *= sy;
                z.acc[a][b] *= sz;
            }
            float kz = z.row_sum(a, Ks + i * Ly::KP, 1);
            gi[a] += y.row_sum(a, Ks + i * Ly::KP, 1) - kz;
            qsum += y.tc == 0 ? kz : 0.0f;
#pragma unroll
            for (int b = 0; b < DK / 16; b++) y.acc[a][b] += z.acc[a][b];
        }
        y.mma(DU, 1, Ly::CP, Qs, Ly::KP, 1, CHUNK);
        y.mma(Xs, Ly::CP, 1, Ks, Ly::KP, 1, CHUNK);
#pragma unroll
        for (int a = 0; a < 4; a++)
            if (y.row(a) < L) {
                float *p = dkp + (((size_t)tile * T + t0 + y.row(a)) * Hv + h) * DK;
#pragma unroll
                for (int b = 0; b < DK / 16; b++) p[y.col(b)] = y.acc[a][b];
            }
    }
    /* The chunk end's terms, all on γ_L: e^γ_L <S0, dS_L> + sum_j e^(γ_L - γ_j) k_j . (dS_L u_j). */
    float hd = 0.0f;
    for (int e = tid; e < DK * VT; e += THREADS) hd += Hs[(e / VT) * Ly::VP + e % VT] * dHs[(e / VT) * Ly::VP + e % VT];
    float endsum = block_sum(qsum, red) + expf(gL) * block_sum(hd, red);
    const int tr = tid / 16, tc = tid % 16;
#pragma unroll
    for (int a = 0; a < 4; a++) {
        int i = tr + 16 * a;
        if (tc == 0 && i < L) {
            float dgi = dgam[i] + gi[a] + (i == L - 1 ? endsum : 0.0f);
            dgp[((size_t)tile * T + t0 + i) * Hv + h] = dgi;
        }
    }
}

/* finish_gates, one block of CHUNK threads per (chunk, value head): dβ and dγ summed
 * over the ntile column tiles, dg = the reverse cumsum of dγ inside the chunk. */
__global__ void __launch_bounds__(CHUNK)
delta_finish_gates_kernel(float *dg, float *dbeta, const float *dgp, const float *dbp, const int4 *chunks, int T,
                          int Hv, int ntile)
{
    __shared__ float s[CHUNK];
    const int c = blockIdx.x / Hv, h = blockIdx.x % Hv, i = threadIdx.x;
    const int4 ch = chunks[c];
    const int t0 = ch.x, L = ch.y;
    if (L == 0) return;
    float a = 0.0f, b = 0.0f;
    if (i < L)
        for (int tile = 0; tile < ntile; tile++) {
            size_t r = ((size_t)tile * T + t0 + i) * Hv + h;
            a += dgp[r];
            b += dbp[r];
        }
    s[i] = a;
    __syncthreads();
    if (i == 0)
        for (int j = L - 2; j >= 0; j--) s[j] += s[j + 1];
    __syncthreads();
    if (i < L) {
        dg[(size_t)(t0 + i) * Hv + h] = s[i];
        dbeta[(size_t)(t0 + i) * Hv + h] = b;
    }
}

/* finish_qk, one warp per (token, key head): dqn, dkn summed over the column tiles
 * and the key head's value heads, then the L2 norm's backward
 * dx = mul (r dy - r^3 (x . dy) x) on the raw bf16 row, to bf16. */
template <int DK>
__global__ void __launch_bounds__(THREADS)
delta_finish_qk_kernel(bf16 *dq, int lddq, bf16 *dk, int lddk, const float *dqp, const float *dkp, const bf16 *q,
                       int ldq, const bf16 *k, int ldk, const int32_t *cu, int n_docs, int T, int Hk, int Hv,
                       int ntile, float scale)
{
    size_t row = (size_t)blockIdx.x * (THREADS / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32, group = Hv / Hk;
    if (row >= (size_t)T * Hk) return;
    int t = (int)(row / Hk), kh = (int)(row % Hk);
    if (t >= cu[n_docs]) return;
    const float *part[2] = {dqp, dkp};
    const bf16 *src[2] = {q + (size_t)t * ldq + (size_t)kh * DK, k + (size_t)t * ldk + (size_t)kh * DK};
    bf16 *dst[2] = {dq + (size_t)t * lddq + (size_t)kh * DK, dk + (size_t)t * lddk + (size_t)kh * DK};
    const float mul[2] = {scale, 1.0f};
    for (int w = 0; w < 2; w++) {
        float dy[DK / 32], x[DK / 32], ss = 0.0f, xdy = 0.0f;
#pragma unroll
        for (int e = 0; e < DK / 32; e++) dy[e] = 0.0f;
        for (int tile = 0; tile < ntile; tile++)
            for (int j = 0; j < group; j++) {
                const float *p = part[w] + (((size_t)tile * T + t) * Hv + kh * group + j) * DK;
#pragma unroll
                for (int e = 0; e < DK / 32; e++) dy[e] += p[lane + 32 * e];
            }
#pragma unroll
        for (int e = 0; e < DK / 32; e++) {
            x[e] = __bfloat162float(src[w][lane + 32 * e]);
            ss += x[e] * x[e];
            xdy += x[e] * dy[e];
        }
        ss = warp_sum_f(ss);
        xdy = warp_sum_f(xdy);
        float r = rsqrtf(ss + L2NORM_EPS);
#pragma unroll
        for (int e = 0; e < DK / 32; e++)
            dst[w][lane + 32 * e] = __float2bfloat16(mul[w] * (r * dy[e] - r * r * r * xdy * x[e]));
    }
}

// ---- launchers ----

template <int DK> static size_t prep_smem()
{
    using Ly = Lay<DK>;
    return sizeof(float) * (2 * CHUNK * Ly::KP + 2 * CHUNK * Ly::CP + CHUNK * Ly::VP + 2 * CHUNK);
}
template <int DK> static size_t scan_smem()
{
    using Ly = Lay<DK>;
    return sizeof(float) * (2 * CHUNK * Ly::KP + DK * Ly::VP + CHUNK * Ly::VP + 2 * CHUNK);
}
template <int DK> static size_t output_smem()
{
    using Ly = Lay<DK>;
    return sizeof(float) * (CHUNK * Ly::KP + DK * Ly::VP + CHUNK * Ly::CP + CHUNK * Ly::VP + CHUNK);
}
template <int DK> static size_t scan_bwd_smem()
{
    using Ly = Lay<DK>;
    return sizeof(float) * (2 * CHUNK * Ly::KP + 2 * CHUNK * Ly::CP + DK * Ly::VP + 3 * CHUNK * Ly::VP + 2 * CHUNK);
}
template <int DK> static size_t grads_smem()
{
    using Ly = Lay<DK>;
    return sizeof(float) *
           (2 * CHUNK * Ly::KP + 4 * CHUNK * Ly::CP + 2 * DK * Ly::VP + 4 * CHUNK * Ly::VP + 3 * CHUNK + THREADS / 32);
}

template <int DK> static void delta_init_dk()
{
    CUDA_CHECK(cudaFuncSetAttribute(delta_prep_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prep_smem<DK>()));
    CUDA_CHECK(cudaFuncSetAttribute(delta_scan_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)scan_smem<DK>()));
    CUDA_CHECK(cudaFuncSetAttribute(delta_output_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)output_smem<DK>()));
    CUDA_CHECK(cudaFuncSetAttribute(delta_scan_bwd_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)scan_bwd_smem<DK>()));
    CUDA_CHECK(cudaFuncSetAttribute(delta_grads_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)grads_smem<DK>()));
}

/* The scratch both passes share (fp32 unless noted), carved in this order. */
struct delta_bufs {
    int4 *chunks;         /* (slots) */
    int *chunk_off;       /* (n_docs + 1) */
    float *qn, *kn;       /* (T, Hk, Dk) */
    float *Tm, *QKM, *KKM; /* (T, Hv, CHUNK): chunk matrices by token row */
    float *W;             /* (T, Hv, Dk) */
    float *U, *Un;        /* (T, Hv, Dv): U', then u */
    float *gam;           /* (T, Hv) */
    float *H;             /* (T / CHUNK, Hv, Dk, Dv): S0 of each chunk after a document's first */
    /* backward only */
    float *dH;            /* (T / CHUNK, Hv, Dk, Dv): dS_L of each chunk before a document's last */
    float *DB;            /* (T, Hv, Dv) */
    float *dqp, *dkp;     /* (ntile, T, Hv, Dk) */
    float *dgp, *dbp;     /* (ntile, T, Hv) */
};

struct delta_dims {
    int T, n_docs, slots, Hk, Hv, Dk, Dv, ntile;
};

static size_t delta_carve(delta_bufs *b, char *base, const delta_dims &d, bool bwd)
{
    size_t used = 0; /* base NULL: only measure */
    auto take = [&](size_t bytes) -> void * {
        void *p = base ? base + used : nullptr;
        used += scratch_round(bytes);
        return p;
    };
    size_t T = d.T, slots = d.slots, Hv = d.Hv, Dk = d.Dk, Dv = d.Dv, F = sizeof(float);
    /* chunk matrices by token row; states only for chunks that have one (<= T / CHUNK) */
    size_t mats = T * Hv * CHUNK * F, states = (T / CHUNK > 0 ? T / CHUNK : 1) * Hv * Dk * Dv * F;
#define TAKE(p, bytes) (b->p = (decltype(b->p))take(bytes))
    TAKE(chunks, slots * sizeof(int4));
    TAKE(chunk_off, ((size_t)d.n_docs + 1) * sizeof(int));
    TAKE(qn, T * d.Hk * Dk * F);
    TAKE(kn, T * d.Hk * Dk * F);
    TAKE(Tm, mats);
    TAKE(QKM, mats);
    TAKE(KKM, mats);
    TAKE(W, T * Hv * Dk * F);
    TAKE(U, T * Hv * Dv * F);
    TAKE(Un, T * Hv * Dv * F);
    TAKE(gam, T * Hv * F);
    TAKE(H, states);
    if (bwd) {
        TAKE(dH, states);
        TAKE(DB, T * Hv * Dv * F);
        TAKE(dqp, d.ntile * T * Hv * Dk * F);
        TAKE(dkp, d.ntile * T * Hv * Dk * F);
        TAKE(dgp, d.ntile * T * Hv * F);
        TAKE(dbp, d.ntile * T * Hv * F);
    }
#undef TAKE
    return used;
}

/* The passes both calls run: chunks, normalize, prep, scan. */
template <int DK>
static void delta_forward_passes(cudaStream_t st, const delta_bufs &b, const delta_dims &d, const bf16 *q, int ldq,
                                 const bf16 *k, int ldk, const bf16 *v, int ldv, const float *g, const float *beta,
                                 const int32_t *cu, float scale)
{
    delta_chunks_kernel<<<1, 1024, 0, st>>>(b.chunks, b.chunk_off, cu, d.n_docs, d.slots);
    LAUNCH_CHECK();
    delta_normalize_kernel<DK><<<grid_for((size_t)d.T * d.Hk, THREADS / 32), THREADS, 0, st>>>(
        b.qn, b.kn, q, ldq, k, ldk, cu, d.n_docs, d.T, d.Hk, scale);
    LAUNCH_CHECK();
    delta_prep_kernel<DK><<<(unsigned)((size_t)d.slots * d.Hv), THREADS, prep_smem<DK>(), st>>>(
        b.Tm, b.QKM, b.KKM, b.W, b.U, b.gam, b.qn, b.kn, v, ldv, g, beta, b.chunks, d.Hk, d.Hv, d.Dv);
    LAUNCH_CHECK();
    delta_scan_kernel<DK><<<(unsigned)((size_t)d.n_docs * d.Hv * d.ntile), THREADS, scan_smem<DK>(), st>>>(
        b.H, b.Un, b.W, b.U, b.kn, b.gam, b.chunks, b.chunk_off, d.Hk, d.Hv, d.Dv);
    LAUNCH_CHECK();
}

static delta_dims delta_check(const char *op, int T, int n_docs, int Hk, int Hv, int Dk, int Dv)
{
    CT_ASSERT(Hk > 0 && Hv % Hk == 0, "%s: Hv %d is not a multiple of Hk %d", op, Hv, Hk);
    CT_ASSERT(Dk == 32 || Dk == 64 || Dk == 128, "%s: key head dim %d is not supported (32, 64, 128 are)", op, Dk);
    CT_ASSERT(Dv > 0 && Dv % VT == 0, "%s: value head dim %d is not a multiple of %d", op, Dv, VT);
    CT_ASSERT(T >= 0 && n_docs >= 0, "%s: T %d, n_docs %d", op, T, n_docs);
    delta_dims d;
    d.T = T; d.n_docs = n_docs; d.Hk = Hk; d.Hv = Hv; d.Dk = Dk; d.Dv = Dv; d.ntile = Dv / VT;
    /* Each document adds at most one partial chunk to the T / CHUNK full ones. */
    d.slots = T / CHUNK + n_docs;
    CT_ASSERT((size_t)d.slots * Hv * d.ntile <= 0x7fffffffu, "%s: %d tokens x %d heads is too large for the grid",
              op, T, Hv);
    return d;
}

template <int DK>
static void delta_fwd_dk(cuda_ctx *c, const delta_dims &d, bf16 *o, int ldo, const bf16 *q, int ldq, const bf16 *k,
                         int ldk, const bf16 *v, int ldv, const float *g, const float *beta, const int32_t *cu,
                         float scale)
{
    delta_bufs b;
    size_t bytes = delta_carve(&b, nullptr, d, false);
    delta_carve(&b, (char *)cuda_scratch(c, bytes), d, false);
    cudaStream_t st = c->stream;
    delta_forward_passes<DK>(st, b, d, q, ldq, k, ldk, v, ldv, g, beta, cu, scale);
    delta_output_kernel<DK><<<(unsigned)((size_t)d.slots * d.Hv * d.ntile), THREADS, output_smem<DK>(), st>>>(
        o, ldo, b.H, b.Un, b.QKM, b.qn, b.gam, b.chunks, d.Hk, d.Hv, d.Dv);
    LAUNCH_CHECK();
}

template <int DK>
static void delta_bwd_dk(cuda_ctx *c, const delta_dims &d, bf16 *dq, int lddq, bf16 *dk, int lddk, bf16 *dv,
                         int lddv, float *dg, float *dbeta, const bf16 *dout, int lddo, const bf16 *q, int ldq,
                         const bf16 *k, int ldk, const bf16 *v, int ldv, const float *g, const float *beta,
                         const int32_t *cu, float scale)
{
    delta_bufs b;
    size_t bytes = delta_carve(&b, nullptr, d, true);
    delta_carve(&b, (char *)cuda_scratch(c, bytes), d, true);
    cudaStream_t st = c->stream;
    delta_forward_passes<DK>(st, b, d, q, ldq, k, ldk, v, ldv, g, beta, cu, scale);
    const unsigned tiles = (unsigned)((size_t)d.slots * d.Hv * d.ntile);
    delta_scan_bwd_kernel<DK><<<(unsigned)((size_t)d.n_docs * d.Hv * d.ntile), THREADS, scan_bwd_smem<DK>(), st>>>(
        b.dH, b.DB, dout, lddo, b.Tm, b.QKM, b.qn, b.kn, b.gam, beta, b.chunks, b.chunk_off, d.Hk, d.Hv, d.Dv);
    LAUNCH_CHECK();
    delta_grads_kernel<DK><<<tiles, THREADS, grads_smem<DK>(), st>>>(
        dv, lddv, b.dqp, b.dkp, b.dgp, b.dbp, dout, lddo, v, ldv, b.H, b.dH, b.Un, b.DB, b.QKM, b.KKM, b.qn, b.kn,
        b.gam, beta, b.chunks, d.T, d.Hk, d.Hv, d.Dv);
    LAUNCH_CHECK();
    delta_finish_gates_kernel<<<(unsigned)((size_t)d.slots * d.Hv), CHUNK, 0, st>>>(dg, dbeta, b.dgp, b.dbp, b.chunks,
                                                                                    d.T, d.Hv, d.ntile);
    LAUNCH_CHECK();
    delta_finish_qk_kernel<DK><<<grid_for((size_t)d.T * d.Hk, THREADS / 32), THREADS, 0, st>>>(
        dq, lddq, dk, lddk, b.dqp, b.dkp, q, ldq, k, ldk, cu, d.n_docs, d.T, d.Hk, d.Hv, d.ntile, scale);
    LAUNCH_CHECK();
}

static void cuda_gdn_delta_fwd(ct_backend *be, void *o, int ldo, const void *q, int ldq, const void *k, int ldk,
                               const void *v, int ldv, const float *g, const float *beta, const int32_t *cu_seqlens,
                               int n_docs, int T, int Hk, int Hv, int Dk, int Dv, float scale)
{
    delta_dims d = delta_check("gdn_delta_fwd", T, n_docs, Hk, Hv, Dk, Dv);
    if (T == 0 || n_docs == 0) return;
    cuda_ctx *c = ctx_of(be);
    bf16 *ob = (bf16 *)o;
    const bf16 *qb = (const bf16 *)q, *kb = (const bf16 *)k, *vb = (const bf16 *)v;
    if (Dk == 32) delta_fwd_dk<32>(c, d, ob, ldo, qb, ldq, kb, ldk, vb, ldv, g, beta, cu_seqlens, scale);
    else if (Dk == 64) delta_fwd_dk<64>(c, d, ob, ldo, qb, ldq, kb, ldk, vb, ldv, g, beta, cu_seqlens, scale);
    else delta_fwd_dk<128>(c, d, ob, ldo, qb, ldq, kb, ldk, vb, ldv, g, beta, cu_seqlens, scale);
}

static void cuda_gdn_delta_bwd(ct_backend *be, void *dq, int lddq, void *dk, int lddk, void *dv, int lddv, float *dg,
                               float *dbeta, const void *dout, int lddo, const void *q, int ldq, const void *k,
                               int ldk, const void *v, int ldv, const float *g, const float *beta,
                               const int32_t *cu_seqlens, int n_docs, int T, int Hk, int Hv, int Dk, int Dv,
                               float scale)
{
    delta_dims d = delta_check("gdn_delta_bwd", T, n_docs, Hk, Hv, Dk, Dv);
    if (T == 0 || n_docs == 0) return;
    cuda_ctx *c = ctx_of(be);
    bf16 *dqb = (bf16 *)dq, *dkb = (bf16 *)dk, *dvb = (bf16 *)dv;
    const bf16 *dob = (const bf16 *)dout, *qb = (const bf16 *)q, *kb = (const bf16 *)k, *vb = (const bf16 *)v;
#define DELTA_BWD(DK)                                                                                              \
    delta_bwd_dk<DK>(c, d, dqb, lddq, dkb, lddk, dvb, lddv, dg, dbeta, dob, lddo, qb, ldq, kb, ldk, vb, ldv, g, beta, \
                     cu_seqlens, scale)
    if (Dk == 32) DELTA_BWD(32);
    else if (Dk == 64) DELTA_BWD(64);
    else DELTA_BWD(128);
#undef DELTA_BWD
}

void cuda_fill_gdn_delta_ops(ct_backend *be)
{
    delta_init_dk<32>();
    delta_init_dk<64>();
    delta_init_dk<128>();
    be->gdn_delta_fwd = cuda_gdn_delta_fwd;
    be->gdn_delta_bwd = cuda_gdn_delta_bwd;
}
