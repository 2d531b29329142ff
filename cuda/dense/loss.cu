/* loss.cu — chunked LM head + cross-entropy over the rows that have targets.
 *
 * Per chunk of up to CE_ROWS rows (the (n, V) logits never exist at once):
 *   xg (C,H) bf16      = x[rows[c0 .. c0+C)]                 gather kernel
 *   logits (C,V) fp32  = xg @ W^T                            cuBLASLt, fp32 output
 *   row_loss[i]        = logsumexp(logits_i) - logits_i[target_i]
 *   dlog (C,V) bf16    = grad_scale * (softmax(logits_i) - onehot)   one block per row
 *   dxg (C,H) bf16     = dlog @ W ; dx[rows[i]] = dxg[i]      cuBLASLt + scatter kernel
 * then loss_sum[0] += sum(row_loss) by one block in a fixed order (double), so
 * the loss is reproducible run to run. Logits stay fp32: in bf16 a logit of ~20
 * carries an error of ~0.06, larger than the loss differences that matter.
 *
 * Where V % 4 == 0 and a row's eighth fits in shared memory, ce_row_cluster_kernel
 * replaces ce_row_kernel: a cluster of CE_CLUSTER blocks per row, each holding
 * its slice of the row in shared memory from one pass over the logits, the
 * slices' (max, sum of exp) merged through distributed shared memory, the
 * gradient written from shared memory: the fp32 logits are read once instead of
 * twice (at V = 151936 each chunk's 233 MB do not stay in L2 between the passes).
 *
 * CE_ROWS bounds the fp32 logits to ~256 MiB (432 rows at V = 151936), large
 * enough that each chunk's GEMM runs near peak. The chunk's row count is padded
 * to a multiple of 64 (pad rows of xg are zero, their outputs unused) so that the
 * GEMM plan cache sees a handful of shapes, not one per remainder. */
#include "ct_cuda.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define CE_LOGIT_BYTES ((size_t)256 << 20)
#define CE_THREADS 512
#define CE_PAD 64
#define CE_CLUSTER 8                           /* blocks per row in ce_row_cluster_kernel */
#define CE_CLUSTER_SMEM ((size_t)200 << 10)    /* its largest slice of a row, bytes */
#define CE_LOADS 4                             /* its first pass's 16-byte loads in flight per thread */
/* Rows per chunk at most: ce_row_cluster_kernel puts a chunk's rows on grid.y,
 * whose limit is 65535 (reached by small vocabularies: V <= 1024 fits 65536 rows
 * in the logits' bytes). */
#define CE_MAX_CHUNK (65535 / CE_PAD * CE_PAD)

// ---- kernels ----

/* xg[i] = x[rows[c0 + i]] for i < nc; zero for nc <= i < npad. */
__global__ void gather_rows_kernel(bf16 *xg, const bf16 *x, const int32_t *rows, int nc, int npad, int H)
{
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (size_t)npad * H) return;
    size_t i = idx / H, j = idx % H;
    uint4 v = make_uint4(0, 0, 0, 0);
    if ((int)i < nc) v = *(const uint4 *)(x + (size_t)rows[i] * H + j);
    *(uint4 *)(xg + idx) = v;
}

__global__ void scatter_rows_kernel(bf16 *dx, const bf16 *dxg, const int32_t *rows, int nc, int H)
{
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (size_t)nc * H) return;
    size_t i = idx / H, j = idx % H;
    *(uint4 *)(dx + (size_t)rows[i] * H + j) = *(const uint4 *)(dxg + idx);
}

/* Online (max, sum of exp) pairs merge associatively. */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    float mn = fmaxf(m, m2);
    if (mn == -INFINITY) return;
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

/* (max, sum of exp) of this block's values, merged over the block: every thread gets it. */
__device__ __forceinline__ float2 block_lse_pair(float m, float s)
{
    __shared__ float sm[CE_THREADS / 32], ss[CE_THREADS / 32];
    __shared__ float2 out;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sm[warp] = m;
        ss[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = sm[0], S = ss[0];
        for (int w = 1; w < CE_THREADS / 32; w++) lse_merge(M, S, sm[w], ss[w]);
        out = make_float2(M, S);
    }
    __syncthreads();
    return out;
}

/* One block per row: loss, and the bf16 gradient of the logits when dlog != NULL. */
__global__ void __launch_bounds__(CE_THREADS) ce_row_kernel(bf16 *dlog, float *row_loss,
                                                            const float *logits,
                                                            const int32_t *targets, int V,
                                                            float grad_scale)
{
    __shared__ float lse_sh;
    size_t r = blockIdx.x;
    const float *l = logits + r * V;
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < V; j += CE_THREADS) {
        float v = l[j];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    const float2 ms = block_lse_pair(m, s);
    if (threadIdx.x == 0) {
        float lse = ms.x + logf(ms.y);
        lse_sh = lse;
        row_loss[r] = lse - l[targets[r]];
    }
    __syncthreads();
    if (!dlog) return;
    float lse = lse_sh;
    int tgt = targets[r];
    bf16 *d = dlog + r * V;
    for (int j = threadIdx.x; j < V; j += CE_THREADS) {
        float g = grad_scale * expf(l[j] - lse);
        if (j == tgt) g -= grad_scale;
        d[j] = __float2bfloat16_rn(g);
    }
}

/* ce_row_kernel's results with a cluster of CE_CLUSTER blocks per row (grid:
 * CE_CLUSTER x rows): block k holds columns [k slice, (k + 1) slice) of its row
 * (slice % 4 == 0, V % 4 == 0: 16-byte loads) in shared memory. */
__global__ void __cluster_dims__(CE_CLUSTER, 1, 1) __launch_bounds__(CE_THREADS)
ce_row_cluster_kernel(bf16 *dlog, float *row_loss, const float *logits, const int32_t *targets, int V, int slice,
                      float grad_scale)
{
    extern __shared__ float4 ce_slice[];
    __shared__ float2 part; /* this block's (max, sum of exp), read by the cluster */
    __shared__ float lse_sh;
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const size_t r = blockIdx.y;
    const int c0 = rank * slice, n4 = max(0, min(V, c0 + slice) - c0) / 4;
    const float4 *l4 = (const float4 *)(logits + r * V + c0);
    /* CE_LOADS loads in flight per thread (with one, 2 blocks x 16 warps per SM
     * keep ~16 KB of reads in flight: about half the H200's bandwidth); each
     * thread still merges its columns in ascending order, so the result is the
     * same bit for bit */
    float m = -INFINITY, s = 0.0f;
    for (int j0 = threadIdx.x; j0 < n4; j0 += CE_LOADS * CE_THREADS) {
        float4 v[CE_LOADS];
#pragma unroll
        for (int u = 0; u < CE_LOADS; u++)
            if (j0 + u * CE_THREADS < n4) v[u] = l4[j0 + u * CE_THREADS];
#pragma unroll
        for (int u = 0; u < CE_LOADS; u++) {
            if (j0 + u * CE_THREADS >= n4) break;
            ce_slice[j0 + u * CE_THREADS] = v[u];
            const float vm = fmaxf(fmaxf(v[u].x, v[u].y), fmaxf(v[u].z, v[u].w));
            lse_merge(m, s, vm, expf(v[u].x - vm) + expf(v[u].y - vm) + expf(v[u].z - vm) + expf(v[u].w - vm));
        }
    }
    const float2 mine = block_lse_pair(m, s);
    if (threadIdx.x == 0) part = mine;
    cluster.sync(); /* every block's part is written */
    if (threadIdx.x == 0) {
        float M = -INFINITY, S = 0.0f;
        for (int k = 0; k < CE_CLUSTER; k++) {
            const float2 p = *cluster.map_shared_rank(&part, k);
            lse_merge(M, S, p.x, p.y);
        }
        lse_sh = M + logf(S);
    }
    cluster.sync(); /* the parts are read: no block leaves while another reads its shared memory */
    const float lse = lse_sh;
    const int tgt = targets[r];
    const float *sl = (const float *)ce_slice;
    if (threadIdx.x == 0 && tgt >= c0 && tgt < c0 + 4 * n4) row_loss[r] = lse - sl[tgt - c0];
    if (!dlog) return;
    uint2 *d = (uint2 *)(dlog + r * V + c0); /* 4 bf16 per 8 bytes */
    for (int j = threadIdx.x; j < n4; j += CE_THREADS) {
        float g[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            g[q] = grad_scale * expf(sl[4 * j + q] - lse);
            if (c0 + 4 * j + q == tgt) g[q] -= grad_scale;
        }
        __nv_bfloat162 lo = __floats2bfloat162_rn(g[0], g[1]), hi = __floats2bfloat162_rn(g[2], g[3]);
        d[j] = make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
    }
}

__global__ void loss_sum_kernel(float *loss_sum, const float *row_loss, int n)
{
    __shared__ double sh[256];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += 256) s += row_loss[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) loss_sum[0] += (float)sh[0];
}

// ---- launchers ----

/* Raises ce_row_cluster_kernel's shared-memory limit to its largest slice, once
 * per backend (more than 48 KB needs an explicit opt-in). */
void loss_init(void)
{
    CUDA_CHECK(cudaFuncSetAttribute((const void *)ce_row_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)CE_CLUSTER_SMEM));
}

void cuda_cross_entropy(ct_backend *be, float *loss_sum, void *dx, const void *x, const void *W,
                        const int32_t *rows, const int32_t *targets, int n, int H, int V,
                        float grad_scale)
{
    cuda_ctx *c = ctx_of(be);
    CT_ASSERT(H % 8 == 0 && aligned16(x) && aligned16(W) && (!dx || aligned16(dx)),
              "cross_entropy: H=%d must be a multiple of 8 and tensors 16-byte aligned", H);
    if (n == 0) return;
    size_t fit = CE_LOGIT_BYTES / ((size_t)V * 4);
    int chunk = fit < CE_PAD ? CE_PAD : (int)(fit / CE_PAD * CE_PAD);
    size_t max_pad = ct_ceil_div((size_t)n, CE_PAD) * CE_PAD;
    if ((size_t)chunk > max_pad) chunk = (int)max_pad;
    if (chunk > CE_MAX_CHUNK) chunk = CE_MAX_CHUNK;

    size_t bytes = scratch_round((size_t)n * 4) + scratch_round((size_t)chunk * H * 2) +
                   scratch_round((size_t)chunk * V * 4);
    if (dx) bytes += scratch_round((size_t)chunk * V * 2) + scratch_round((size_t)chunk * H * 2);
    scratch_carver sc = {(char *)cuda_scratch(c, bytes), 0};
    float *row_loss = (float *)scratch_take(&sc, (size_t)n * 4);
    bf16 *xg = (bf16 *)scratch_take(&sc, (size_t)chunk * H * 2);
    float *logits = (float *)scratch_take(&sc, (size_t)chunk * V * 4);
    bf16 *dlog = dx ? (bf16 *)scratch_take(&sc, (size_t)chunk * V * 2) : NULL;
    bf16 *dxg = dx ? (bf16 *)scratch_take(&sc, (size_t)chunk * H * 2) : NULL;

    /* the cluster kernel's slice of a row (a multiple of 4 columns), or 0: ce_row_kernel */
    const int slice = (int)ct_ceil_div(ct_ceil_div((size_t)V, CE_CLUSTER), 4) * 4;
    const bool clustered = V % 4 == 0 && (size_t)slice * 4 <= CE_CLUSTER_SMEM;
    const int use_slice = clustered ? slice : 0;
    for (int c0 = 0; c0 < n; c0 += chunk) {
        int nc = n - c0 < chunk ? n - c0 : chunk;
        int npad = (nc + CE_PAD - 1) / CE_PAD * CE_PAD;
        gather_rows_kernel<<<grid_for((size_t)npad * H / 8, 256), 256, 0, c->stream>>>(
            xg, (const bf16 *)x, rows + c0, nc, npad, H);
        LAUNCH_CHECK();
        gemm(c, logits, CUDA_R_32F, V, xg, H, false, W, H, true, npad, V, H, 1.0f, 0.0f, NULL);
        if (use_slice > 0)
            ce_row_cluster_kernel<<<dim3(CE_CLUSTER, nc), CE_THREADS, (size_t)use_slice * 4, c->stream>>>(
                dlog, row_loss + c0, logits, targets + c0, V, use_slice, grad_scale);
        else
            ce_row_kernel<<<nc, CE_THREADS, 0, c->stream>>>(dlog, row_loss + c0, logits, targets + c0, V, grad_scale);
        LAUNCH_CHECK();
        if (!dx) continue;
        /* Pad rows of dlog hold stale values; each output row reads only its own
         * row of dlog, and pad rows of dxg are never scattered. */
        gemm(c, dxg, CUDA_R_16BF, H, dlog, V, false, W, H, false, npad, H, V, 1.0f, 0.0f, NULL);
        scatter_rows_kernel<<<grid_for((size_t)nc * H / 8, 256), 256, 0, c->stream>>>(
            (bf16 *)dx, dxg, rows + c0, nc, H);
        LAUNCH_CHECK();
    }
    loss_sum_kernel<<<1, 256, 0, c->stream>>>(loss_sum, row_loss, n);
    LAUNCH_CHECK();
}
