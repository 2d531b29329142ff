/* moe_route.cu — the mixture-of-experts ops that decide where rows go: routing
 * (top-K of the router logits), the stable permutation into expert order, the
 * router's backward and the load-balancing statistics. The ops that move and
 * transform the rows themselves are moe_rows.cu's. Contracts: backend.h,
 * "mixture of experts"; the oracle is backend_cpu_moe.c.
 *
 * Layouts: logits and dlogits (T,E) bf16; topk_idx (T,K) int32, topk_w and dw
 * (T,K) fp32 (slot s = t*K + k); counts (E), offsets (E+1), row_slot and slot_row
 * (n = T*K) int32.
 *
 * Nothing here waits for the host or reads a count on it, and no launch count
 * depends on E (grid sizes may):
 *   moe_route     1 kernel           one warp per token
 *   moe_count     1 memset + 1       shared-memory histogram per chunk, atomics into counts
 *   moe_offsets   1                  one block scans the E counts
 *   moe_permute   3                  chunk histograms, per-expert scan, in-order ranking
 * so one layer's routing is 6 kernels and a memset whatever E.
 *
 * Routing. Lane l of a token's warp holds experts l, l+32, ... in registers (E <=
 * 256: the kernels are instantiated for 1, 2, 4 and 8 per lane). Probabilities
 * are computed as the CPU computes them: fp32 max, exp and sum in double, each p
 * rounded to fp32. So both backends rank the same fp32 numbers (up to one double
 * ulp of exp, which moves an fp32 rounding about once in 2^29) and an exact tie
 * is a tie on both. Top-K is K rounds of a warp argmax under (larger key, else
 * lower expert): the CPU's selection scan with its strict '>'. A round is two
 * redux.sync reductions over the keys mapped to integers in the same order
 * (moe_key_order): the largest key, then the lowest expert holding it. NaN keys
 * compare as -inf, so the order stays total and every lane agrees on each round's
 * winner.
 *
 * Permutation. Slots are cut into chunks of PERM_CHUNK consecutive slots:
 *   1. hist[e][c] = slots of expert e in chunk c;
 *   2. one block per expert turns hist[e][*] into offsets[e] + its exclusive scan
 *      over chunks: the first row of e that chunk c fills;
 *   3. one block per chunk walks its slots in order, a tile of 256 at a time: a
 *      slot's row is the chunk's cursor for its expert, plus the slots of that
 *      expert in earlier warps of the tile (per-warp counts in shared memory),
 *      plus the lanes before it in its own warp (__match_any_sync); then the
 *      cursors advance by the tile's counts.
 * Each step keeps slot order within an expert, so the permutation is the CPU's,
 * bit for bit. An expert id outside [0, E) (moe_route never makes one; the CPU
 * asserts) is skipped rather than written out of bounds.
 *
 * Statistics. moe_prob_sum adds each block's per-expert sums (double) to a
 * scratch row, then one block per expert adds the rows in a fixed order:
 * reproducible bit for bit, no float atomics. */
#include "ct_cuda.cuh"

#define MOE_MAX_E 256      /* experts per token a routing warp holds (8 per lane) */
#define MOE_MAX_K 32       /* one lane per chosen expert */
#define MOE_WARPS 8        /* warps per block in the warp-per-token kernels */
#define PERM_THREADS 256   /* the permutation's tile: slots ranked per step */
#define PERM_CHUNK 1024    /* slots per chunk (4 tiles) */
#define SCAN_THREADS 256
#define PROB_BLOCKS_PER_SM 2
#define FULL_MASK 0xffffffffu

static void moe_check_experts(const char *op, int E)
{
    CT_ASSERT(E >= 1 && E <= MOE_MAX_E, "%s: E = %d experts; the CUDA backend supports 1..%d",
              op, E, MOE_MAX_E);
}

// ---- kernels ----

static __device__ __forceinline__ float moe_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

static __device__ __forceinline__ double moe_warp_sum_d(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

/* A key as an unsigned integer in the same order, for redux.sync's max: NaN
 * ranks as -inf and -0 as +0 (they compare equal as floats, and an equal key
 * goes to the lower expert). Every real key maps above 0, which means "none". */
static __device__ __forceinline__ unsigned moe_key_order(float x)
{
    if (isnan(x)) x = -INFINITY;
    if (x == 0.0f) x = 0.0f;
    const unsigned b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

/* p = softmax of one logits row, expert lane + 32*i in p[i] (0 past E); the CPU's
 * softmax_row: fp32 max, exp and sum in double, rounded to fp32. */
template <int V>
static __device__ __forceinline__ void moe_warp_softmax(float p[V], const bf16 *row, int E, int lane)
{
    float l[V], mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < V; i++) {
        int j = lane + 32 * i;
        l[i] = j < E ? __bfloat162float(row[j]) : -INFINITY;
        mx = fmaxf(mx, l[i]);
    }
    mx = moe_warp_max(mx);
    double e[V], s = 0.0;
#pragma unroll
    for (int i = 0; i < V; i++) {
        e[i] = lane + 32 * i < E ? exp((double)l[i] - (double)mx) : 0.0;
        s += e[i];
    }
    s = moe_warp_sum_d(s);
#pragma unroll
    for (int i = 0; i < V; i++) p[i] = (float)(e[i] / s);
}

/* One warp per token; V = experts per lane. Lane k keeps round k's winner. */
template <int V>
static __global__ void moe_route_kernel(int32_t *__restrict__ topk_idx, float *__restrict__ topk_w,
                                        const bf16 *__restrict__ logits, int T, int E, int K, ct_moe_rule rule)
{
    int t = blockIdx.x * MOE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= T) return;
    const bf16 *row = logits + (size_t)t * E;
    float key[V];
    if (rule == CT_MOE_TOPK_SOFTMAX) {
#pragma unroll
        for (int i = 0; i < V; i++) {
            int j = lane + 32 * i;
            key[i] = j < E ? __bfloat162float(row[j]) : -INFINITY;
        }
    } else {
        moe_warp_softmax<V>(key, row, E, lane);
    }
    unsigned ord[V]; /* the keys in redux order; 0 once chosen or past E */
#pragma unroll
    for (int i = 0; i < V; i++) ord[i] = lane + 32 * i < E ? moe_key_order(key[i]) : 0u;
    int my_idx = 0;
    float my_key = 0.0f, first = 0.0f, key_sum = 0.0f;
    double my_e = 0.0, e_sum = 0.0;
    for (int k = 0; k < K; k++) {
        /* the lane's best: largest order, the lowest i among equals (lower expert) */
        unsigned lo = 0u;
        int li = 0;
#pragma unroll
        for (int i = 0; i < V; i++)
            if (ord[i] > lo) {
                lo = ord[i];
                li = i;
            }
        /* the warp's: the largest order, then the lowest expert holding it */
        const unsigned top = __reduce_max_sync(FULL_MASK, lo);
        const int bi = (int)__reduce_min_sync(FULL_MASK, lo == top ? (unsigned)(lane + 32 * li) : 0xffffffffu);
        float mine = key[0];
#pragma unroll
        for (int i = 1; i < V; i++)
            if (li == i) mine = key[i];
        const float bk = __shfl_sync(FULL_MASK, mine, bi & 31); /* the winner's key itself (NaN stays NaN) */
        if ((bi & 31) == lane) {
#pragma unroll
            for (int i = 0; i < V; i++)
                if (i == (bi >> 5)) ord[i] = 0u;
        }
        if (k == 0) first = bk;
        if (lane == k) {
            my_idx = bi;
            my_key = bk;
        }
        if (rule == CT_MOE_TOPK_SOFTMAX) { /* the CPU's order: k ascending, relative to the largest */
            double e = exp((double)bk - (double)first);
            e_sum += e;
            if (lane == k) my_e = e;
        }
        key_sum += bk; /* fp32, k ascending: torch's sum of the top-K weights */
    }
    if (lane < K) {
        float w = rule == CT_MOE_TOPK_SOFTMAX        ? (float)(my_e / e_sum)
                : rule == CT_MOE_SOFTMAX_TOPK_NORM   ? my_key / key_sum
                                                     : my_key;
        topk_idx[(size_t)t * K + lane] = my_idx;
        topk_w[(size_t)t * K + lane] = w;
    }
}

/* Exclusive scan of v over a block of SCAN_THREADS threads (all must call);
 * *total = the block's sum. */
static __device__ __forceinline__ int moe_block_exclusive_scan(int v, int *total)
{
    __shared__ int warp_tot[SCAN_THREADS / 32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_tot[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < SCAN_THREADS / 32 ? warp_tot[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(FULL_MASK, w, o);
            if (lane >= o) w += y;
        }
        if (lane < SCAN_THREADS / 32) warp_tot[lane] = w;
    }
    __syncthreads();
    int before = warp > 0 ? warp_tot[warp - 1] : 0;
    *total = warp_tot[SCAN_THREADS / 32 - 1];
    __syncthreads(); /* warp_tot is rewritten by the next call */
    return before + x - v;
}

/* Histogram of chunk blockIdx.x's slots: stored to hist[e * n_chunks + c] for
 * every e, or added into counts when hist is NULL. */
static __global__ void moe_hist_kernel(int32_t *__restrict__ hist, int32_t *__restrict__ counts,
                                       const int32_t *__restrict__ idx, int n, int E, int n_chunks)
{
    __shared__ int h[MOE_MAX_E];
    for (int e = threadIdx.x; e < E; e += blockDim.x) h[e] = 0;
    __syncthreads();
    int s0 = (int)blockIdx.x * PERM_CHUNK, s1 = min(n, s0 + PERM_CHUNK);
    for (int s = s0 + threadIdx.x; s < s1; s += blockDim.x) {
        int e = idx[s];
        if ((unsigned)e < (unsigned)E) atomicAdd(&h[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        if (hist) hist[(size_t)e * n_chunks + blockIdx.x] = h[e];
        else if (h[e]) atomicAdd(&counts[e], h[e]);
    }
}

/* offsets[0..E) = exclusive scan of counts, offsets[E] = total. One block. */
static __global__ void moe_offsets_kernel(int32_t *__restrict__ offsets, const int32_t *__restrict__ counts, int E)
{
    int running = 0;
    for (int e0 = 0; e0 < E; e0 += SCAN_THREADS) {
        int e = e0 + threadIdx.x, total;
        int v = e < E ? counts[e] : 0;
        int ex = moe_block_exclusive_scan(v, &total);
        if (e < E) offsets[e] = running + ex;
        running += total;
    }
    if (threadIdx.x == 0) offsets[E] = running;
}

/* Block e: hist[e][c] := offsets[e] + sum of hist[e][c'] for c' < c (in place). */
static __global__ void moe_chunk_scan_kernel(int32_t *__restrict__ hist, const int32_t *__restrict__ offsets,
                                             int n_chunks)
{
    int32_t *row = hist + (size_t)blockIdx.x * n_chunks;
    int running = offsets[blockIdx.x];
    for (int c0 = 0; c0 < n_chunks; c0 += SCAN_THREADS) {
        int c = c0 + threadIdx.x, total;
        int v = c < n_chunks ? row[c] : 0;
        int ex = moe_block_exclusive_scan(v, &total);
        if (c < n_chunks) row[c] = running + ex;
        running += total;
    }
}

/* Block c ranks the slots of chunk c in slot order; base[e * n_chunks + c] is
 * the first row of expert e that this chunk fills. */
static __global__ void __launch_bounds__(PERM_THREADS)
moe_rank_kernel(int32_t *__restrict__ row_slot, int32_t *__restrict__ slot_row,
                const int32_t *__restrict__ idx, const int32_t *__restrict__ base, int n, int E, int n_chunks)
{
    constexpr int W = PERM_THREADS / 32;
    __shared__ int cursor[MOE_MAX_E];
    __shared__ int wcnt[W][MOE_MAX_E]; /* this tile's slots of expert e in warp w */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int e = threadIdx.x; e < E; e += PERM_THREADS) {
        cursor[e] = base[(size_t)e * n_chunks + blockIdx.x];
#pragma unroll
        for (int w = 0; w < W; w++) wcnt[w][e] = 0;
    }
    __syncthreads();
    unsigned lanes_before = (1u << lane) - 1;
    int chunk = blockIdx.x, end = min(n, (chunk + 1) * PERM_CHUNK);
    for (int s0 = chunk * PERM_CHUNK; s0 < end; s0 += PERM_THREADS) {
        int s = s0 + threadIdx.x;
        int e = s < n ? idx[s] : -1;
        bool valid = (unsigned)e < (unsigned)E;
        if (!valid) e = -1;
        unsigned peers = __match_any_sync(FULL_MASK, e);
        int before = __popc(peers & lanes_before);
        if (valid && before == 0) wcnt[warp][e] = __popc(peers);
        __syncthreads();
        int r = 0;
        if (valid) {
            r = cursor[e] + before;
            for (int w = 0; w < warp; w++) r += wcnt[w][e];
        }
        __syncthreads();
        for (int x = threadIdx.x; x < E; x += PERM_THREADS) {
            int add = 0;
#pragma unroll
            for (int w = 0; w < W; w++) {
                add += wcnt[w][x];
                wcnt[w][x] = 0;
            }
            cursor[x] += add;
        }
        __syncthreads();
        if (valid) {
            row_slot[r] = s;
            slot_row[s] = r;
        }
    }
}

/* One warp per token: the router backward (backend.h), the CPU's arithmetic. */
template <int V>
static __global__ void moe_route_bwd_kernel(bf16 *__restrict__ dlogits, const float *__restrict__ dw,
                                            const bf16 *__restrict__ logits, const int32_t *__restrict__ topk_idx,
                                            const float *__restrict__ topk_w, const float *__restrict__ aux,
                                            int T, int E, int K, ct_moe_rule rule)
{
    int t = blockIdx.x * MOE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= T) return;
    const float *g = dw + (size_t)t * K, *w = topk_w + (size_t)t * K;
    const int32_t *id = topk_idx + (size_t)t * K;
    double c = 0.0;
    for (int k = 0; k < K; k++) c += (double)g[k] * w[k];
    float p[V], d[V];
#pragma unroll
    for (int i = 0; i < V; i++) p[i] = 0.0f;
    if (rule == CT_MOE_SOFTMAX_TOPK || aux) moe_warp_softmax<V>(p, logits + (size_t)t * E, E, lane);
#pragma unroll
    for (int i = 0; i < V; i++) d[i] = rule == CT_MOE_SOFTMAX_TOPK ? (float)(-p[i] * c) : 0.0f;
    for (int k = 0; k < K; k++) {
        int j = id[k];
#pragma unroll
        for (int i = 0; i < V; i++) {
            if (lane + 32 * i != j) continue;
            if (rule == CT_MOE_SOFTMAX_TOPK) d[i] += p[i] * g[k];
            else d[i] = (float)(w[k] * (g[k] - c));
        }
    }
    if (aux) {
        double ap = 0.0;
#pragma unroll
        for (int i = 0; i < V; i++)
            if (lane + 32 * i < E) ap += (double)aux[lane + 32 * i] * p[i];
        ap = moe_warp_sum_d(ap);
#pragma unroll
        for (int i = 0; i < V; i++)
            if (lane + 32 * i < E) d[i] += (float)(p[i] * (aux[lane + 32 * i] - ap));
    }
    bf16 *out = dlogits + (size_t)t * E;
#pragma unroll
    for (int i = 0; i < V; i++)
        if (lane + 32 * i < E) out[lane + 32 * i] = __float2bfloat16_rn(d[i]);
}

/* Block b: partial[b * E + e] = sum of softmax(logits[t])[e] over the tokens its
 * warps visit (warp w of block b takes t = b*MOE_WARPS + w + m * gridDim.x*MOE_WARPS),
 * in double, warps added in order. */
template <int V>
static __global__ void moe_prob_partial_kernel(double *__restrict__ partial, const bf16 *__restrict__ logits,
                                               int T, int E)
{
    __shared__ double part[MOE_WARPS][MOE_MAX_E];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    double acc[V];
#pragma unroll
    for (int i = 0; i < V; i++) acc[i] = 0.0;
    for (int t = blockIdx.x * MOE_WARPS + warp; t < T; t += gridDim.x * MOE_WARPS) {
        float p[V];
        moe_warp_softmax<V>(p, logits + (size_t)t * E, E, lane);
#pragma unroll
        for (int i = 0; i < V; i++) acc[i] += p[i];
    }
#pragma unroll
    for (int i = 0; i < V; i++)
        if (lane + 32 * i < E) part[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        double s = 0.0;
        for (int w = 0; w < MOE_WARPS; w++) s += part[w][e];
        partial[(size_t)blockIdx.x * E + e] = s;
    }
}

/* Block e: prob_sum[e] += sum over b of partial[b * E + e] (a fixed tree). */
static __global__ void moe_prob_final_kernel(float *__restrict__ prob_sum, const double *__restrict__ partial,
                                             int n_blocks, int E)
{
    __shared__ double sh[SCAN_THREADS];
    int e = blockIdx.x;
    double s = 0.0;
    for (int b = threadIdx.x; b < n_blocks; b += SCAN_THREADS) s += partial[(size_t)b * E + e];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int half = SCAN_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) sh[threadIdx.x] += sh[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) prob_sum[e] += (float)sh[0];
}

/* One block: the Switch loss and its gradient wrt the probabilities (backend.h). */
static __global__ void moe_aux_loss_kernel(float *__restrict__ loss, float *__restrict__ aux_grad,
                                           const int32_t *__restrict__ counts, const float *__restrict__ prob_sum,
                                           int n_layers, int T, int E, float coef)
{
    __shared__ double sh[SCAN_THREADS];
    double N = (double)n_layers * T, part = 0.0;
    for (int e = threadIdx.x; e < E; e += SCAN_THREADS) {
        double c = 0.0, P = 0.0;
        for (int l = 0; l < n_layers; l++) {
            c += counts[(size_t)l * E + e];
            P += prob_sum[(size_t)l * E + e];
        }
        part += (c / N) * (P / N);
        aux_grad[e] = (float)(coef * E * c / (N * N));
    }
    sh[threadIdx.x] = part;
    __syncthreads();
    for (int half = SCAN_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) sh[threadIdx.x] += sh[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) loss[0] += (float)(coef * E * sh[0]);
}

// ---- launchers ----

/* Experts per lane of a routing warp: 1, 2, 4 or 8. */
static int lanes_per_expert_row(int E) { return E <= 32 ? 1 : E <= 64 ? 2 : E <= 128 ? 4 : 8; }

#define MOE_DISPATCH_V(E, KERNEL, GRID, BLOCK, STREAM, ...) do { \
    switch (lanes_per_expert_row(E)) { \
    case 1: KERNEL<1><<<GRID, BLOCK, 0, STREAM>>>(__VA_ARGS__); break; \
    case 2: KERNEL<2><<<GRID, BLOCK, 0, STREAM>>>(__VA_ARGS__); break; \
    case 4: KERNEL<4><<<GRID, BLOCK, 0, STREAM>>>(__VA_ARGS__); break; \
    default: KERNEL<8><<<GRID, BLOCK, 0, STREAM>>>(__VA_ARGS__); break; \
    } \
    LAUNCH_CHECK(); } while (0)

static void cuda_moe_route(ct_backend *be, int32_t *topk_idx, float *topk_w, const void *logits,
                           int T, int E, int K, ct_moe_rule rule)
{
    moe_check_experts("moe_route", E);
    CT_ASSERT(K >= 1 && K <= E && K <= MOE_MAX_K, "moe_route: K = %d must be in [1, min(E = %d, %d)]",
              K, E, MOE_MAX_K);
    if (T <= 0) return;
    MOE_DISPATCH_V(E, moe_route_kernel, grid_for(T, MOE_WARPS), MOE_WARPS * 32, ctx_of(be)->stream,
                   topk_idx, topk_w, (const bf16 *)logits, T, E, K, rule);
}

static void cuda_moe_count(ct_backend *be, int32_t *counts, const int32_t *idx, int n, int E)
{
    moe_check_experts("moe_count", E);
    cudaStream_t s = ctx_of(be)->stream;
    CUDA_CHECK(cudaMemsetAsync(counts, 0, (size_t)E * sizeof(int32_t), s));
    if (n <= 0) return;
    moe_hist_kernel<<<grid_for(n, PERM_CHUNK), PERM_THREADS, 0, s>>>(NULL, counts, idx, n, E, 0);
    LAUNCH_CHECK();
}

static void cuda_moe_offsets(ct_backend *be, int32_t *offsets, const int32_t *counts, int E)
{
    moe_check_experts("moe_offsets", E);
    moe_offsets_kernel<<<1, SCAN_THREADS, 0, ctx_of(be)->stream>>>(offsets, counts, E);
    LAUNCH_CHECK();
}

static void cuda_moe_permute(ct_backend *be, int32_t *row_slot, int32_t *slot_row, const int32_t *idx,
                             const int32_t *offsets, int n, int E)
{
    moe_check_experts("moe_permute", E);
    if (n <= 0) return;
    cuda_ctx *c = ctx_of(be);
    int n_chunks = (int)grid_for(n, PERM_CHUNK);
    int32_t *hist = (int32_t *)cuda_scratch(c, (size_t)E * n_chunks * sizeof(int32_t));
    moe_hist_kernel<<<n_chunks, PERM_THREADS, 0, c->stream>>>(hist, NULL, idx, n, E, n_chunks);
    LAUNCH_CHECK();
    moe_chunk_scan_kernel<<<E, SCAN_THREADS, 0, c->stream>>>(hist, offsets, n_chunks);
    LAUNCH_CHECK();
    moe_rank_kernel<<<n_chunks, PERM_THREADS, 0, c->stream>>>(row_slot, slot_row, idx, hist, n, E, n_chunks);
    LAUNCH_CHECK();
}

static void cuda_moe_route_bwd(ct_backend *be, void *dlogits, const float *dw, const void *logits,
                               const int32_t *topk_idx, const float *topk_w, const float *aux,
                               int T, int E, int K, ct_moe_rule rule)
{
    moe_check_experts("moe_route_bwd", E);
    CT_ASSERT(K >= 1 && K <= E, "moe_route_bwd: K = %d must be in [1, E = %d]", K, E);
    if (T <= 0) return;
    MOE_DISPATCH_V(E, moe_route_bwd_kernel, grid_for(T, MOE_WARPS), MOE_WARPS * 32, ctx_of(be)->stream,
                   (bf16 *)dlogits, dw, (const bf16 *)logits, topk_idx, topk_w, aux, T, E, K, rule);
}

static void cuda_moe_prob_sum(ct_backend *be, float *prob_sum, const void *logits, int T, int E)
{
    moe_check_experts("moe_prob_sum", E);
    if (T <= 0) return;
    cuda_ctx *c = ctx_of(be);
    unsigned n_blocks = grid_for(T, MOE_WARPS);
    if (n_blocks > (unsigned)(PROB_BLOCKS_PER_SM * c->num_sms)) n_blocks = PROB_BLOCKS_PER_SM * c->num_sms;
    double *partial = (double *)cuda_scratch(c, (size_t)n_blocks * E * sizeof(double));
    MOE_DISPATCH_V(E, moe_prob_partial_kernel, n_blocks, MOE_WARPS * 32, c->stream,
                   partial, (const bf16 *)logits, T, E);
    moe_prob_final_kernel<<<E, SCAN_THREADS, 0, c->stream>>>(prob_sum, partial, (int)n_blocks, E);
    LAUNCH_CHECK();
}

static void cuda_moe_aux_loss(ct_backend *be, float *loss, float *aux_grad, const int32_t *counts,
                              const float *prob_sum, int n_layers, int T, int E, float coef)
{
    CT_ASSERT(E >= 1 && n_layers >= 1 && T >= 1, "moe_aux_loss: E = %d, n_layers = %d, T = %d must be >= 1",
              E, n_layers, T);
    moe_aux_loss_kernel<<<1, SCAN_THREADS, 0, ctx_of(be)->stream>>>(loss, aux_grad, counts, prob_sum,
                                                                     n_layers, T, E, coef);
    LAUNCH_CHECK();
}

void cuda_fill_moe_route_ops(ct_backend *be)
{
    be->moe_route = cuda_moe_route;
    be->moe_count = cuda_moe_count;
    be->moe_offsets = cuda_moe_offsets;
    be->moe_permute = cuda_moe_permute;
    be->moe_route_bwd = cuda_moe_route_bwd;
    be->moe_prob_sum = cuda_moe_prob_sum;
    be->moe_aux_loss = cuda_moe_aux_loss;
}
