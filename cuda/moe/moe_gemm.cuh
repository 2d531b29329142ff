/* moe_gemm.cuh — what the grouped expert GEMMs (moe_gemm.cu) and the expert LoRA
 * (moe_expert_lora.cu) share: the row layout, the expert tile schedule read on the device
 * from offsets, and the setup of their persistent launches.
 *
 * Layouts. Rows are in expert order: expert e owns rows [offsets[e], offsets[e+1])
 * of x, y, dy, dx (act bf16, each with its row stride). offsets (E+1) int32 stay
 * in device memory; the host never learns n = offsets[E], so no launcher waits
 * for the device, loops over experts on the host, or sizes scratch by n.
 * Gather: an op's input rows x_r are x[r], or with gather x[gather[r] / K] (token
 * rows; gather is the routing's row_slot). The kernels resolve each row's address
 * once per tile, when they set up the copies of its rows, so moe_gather's (n, H)
 * copy and its pass over memory do not exist.
 *
 * Scheduling. Every block copies offsets into shared memory (sched_load) and scans
 * them into toff[e], the first row tile of expert e over the rows inside [c0, c1)
 * (an expert's rows cut into ceil(rows / bm) tiles that never cross an expert;
 * toff[E] is the tile count), with warp 0 (sched_tiles). sched_find maps a tile
 * index to (expert, first row, rows) by binary search over toff. Kernels are
 * persistent: the grid is what the GPU holds at once (occupancy x SMs, measured by
 * kernel_setup and sized on the host without n) and blocks stride over the tile
 * list, whose length only the device knows. Experts without rows own no tiles and
 * cost nothing. */
#ifndef CT_MOE_GEMM_CUH
#define CT_MOE_GEMM_CUH

#include "attention.cuh"

#define MOE_MAX_E 1024 /* experts a schedule holds (8 KB of shared memory) */

/* The expert schedule in shared memory: offsets, and toff[e] = the first row tile
 * of expert e over the rows inside [c0, c1) (toff[E] = the tile count). */
struct moe_sched {
    int offs[MOE_MAX_E + 1];
    int toff[MOE_MAX_E + 1];
};

struct row_tile {
    int e, m0, rows; /* expert, first row, rows (1..BM) */
};

__device__ __forceinline__ int sched_count(const moe_sched &s, int e, int bm, int c0, int c1)
{
    int rows = min(s.offs[e + 1], c1) - max(s.offs[e], c0);
    return rows > 0 ? (rows + bm - 1) / bm : 0;
}

__device__ __forceinline__ void sched_load(moe_sched &s, const int32_t *offsets, int E)
{
    for (int i = threadIdx.x; i <= E; i += blockDim.x) s.offs[i] = offsets[i];
    __syncthreads();
}

/* Fills toff for [c0, c1) (warp 0 scans: each lane a run of experts); returns the
 * tile count. Callers must not be reading toff (a barrier precedes each call). */
__device__ __forceinline__ int sched_tiles(moe_sched &s, int E, int bm, int c0, int c1)
{
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x, per = (E + 31) / 32;
        const int e0 = min(E, lane * per), e1 = min(E, e0 + per);
        int mine = 0;
        for (int e = e0; e < e1; e++) mine += sched_count(s, e, bm, c0, c1);
        int x = mine;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        int run = x - mine;
        for (int e = e0; e < e1; e++) {
            s.toff[e] = run;
            run += sched_count(s, e, bm, c0, c1);
        }
        if (lane == 31) s.toff[E] = x;
    }
    __syncthreads();
    return s.toff[E];
}

/* Row tile rt (< toff[E]): its expert is the last e with toff[e] <= rt (empty
 * experts share their successor's toff, so the last one is the one with tiles). */
__device__ __forceinline__ row_tile sched_find(const moe_sched &s, int E, int bm, int c0, int c1, int rt)
{
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (s.toff[mid] <= rt) lo = mid;
        else hi = mid - 1;
    }
    row_tile t;
    t.e = lo;
    t.m0 = max(s.offs[lo], c0) + (rt - s.toff[lo]) * bm;
    t.rows = min(bm, min(s.offs[lo + 1], c1) - t.m0);
    return t;
}

/* fp32 LoRA masters -> padded bf16 copies (lora_convert.cu; any output may be NULL):
 * Ap (E,RP,in), At (E,in,RP), Bp (E,out,RP), Bt (E,RP,out), ranks >= R zero. */
__global__ void lora_convert_kernel(bf16 *Ap, bf16 *At, bf16 *Bp, bf16 *Bt, const float *A, const float *B,
                                    int E, int R, int RP, int in, int out);

/* The arguments of one grouped GEMM call (moe_gemm.cu's ops build them). */
struct gemm_args {
    bf16 *y;               /* (n, N) at row stride ldy */
    const bf16 *x;         /* (n, K) at row stride ldx; with gather, (T, K) token rows */
    const int32_t *gather; /* (n) or NULL: row r of the input is x[gather[r] / topk] */
    const bf16 *W;         /* (E, out, in): per expert (N, K) forward, (K, N) bwd_input */
    const bf16 *bias;      /* (E, N) or NULL */
    const int32_t *offsets;
    int ldy, ldx, topk, E, N, K, accumulate;
};

/* The grouped GEMMs' argument checks (moe_gemm.cu): E, in and out in range,
 * 16-byte rows and operands, a 4-byte aligned bias (or NULL); input errors name op. */
void moe_gemm_check(const char *op, const void *y, int ldy, const void *x, int ldx, const void *W, const void *bias,
                    int E, int in, int out);

/* The TMA grouped GEMM (moe_gemm_tma.cu), every grouped GEMM's kernel.
 * moe_gemm_tma_init raises its kernels' shared-memory limit, measures their
 * occupancy into c->occupancy and fetches the driver's tensor-map encoder (once
 * per backend, before the first moe_gemm_tma). moe_gemm_tma runs y (=|+=) x W_e^T
 * + bias (nn false: the forward, p.gather allowed) or y (=|+=) x W_e (nn true:
 * bwd_input) on c's stream, with p checked by the caller (moe_gemm_check: 16-byte
 * alignment, strides and sizes multiples of 8, which TMA needs too). */
void moe_gemm_tma_init(cuda_ctx *c);
/* lora (nn only, or NULL): the LoRA input-gradient term as one more k-step, y[r] +=
 * g[r] (64 columns at stride ldg) @ A_e, A (E, 64, in) the modules' A stacked and
 * scaled (rows past their ranks zero). */
struct tma_lora {
    const bf16 *g, *A;
    int ldg;
};
void moe_gemm_tma(const cuda_ctx *c, const gemm_args &p, bool nn, const tma_lora *lora);

/* The expert LoRA of n_mod modules fused into a grouped GEMM call (built by
 * moe_gemm_fused_lora.cu for moe_linear_lora_fwd and by moe_gemm.cu for
 * moe_linear_lora_bwd_input): per row, u = x_r Au_q,e^T (x_r the call's input row,
 * reduced over its K), and y[r] (=|+=) x_r W_e (+ bias) + scale * bf16(u) Bu_q,e on
 * module q's columns (each module starting on a 256-column tile); u (bf16, as it
 * is multiplied) into columns q R .. q R + ucols - 1 of u when u is not NULL (one
 * column tile of each module stores). Forward: Au = A, Bu = B^T. bwd_input, the
 * modules as one LoRA of rank n R on all of dx's columns: Au = the stacked B^T over
 * dy's columns (so u = g = dy B), Bu = the stacked A. */
#define FUSED_LORA_MODULES 2
struct fused_lora {
    const bf16 *Au[FUSED_LORA_MODULES]; /* (E, RP, K): zero ranks past R */
    const bf16 *Bu[FUSED_LORA_MODULES]; /* (E, RP, cols[q]): zero ranks past R */
    int col0[FUSED_LORA_MODULES], cols[FUSED_LORA_MODULES];
    int n_mod, R, RP, ucols, ldu;       /* ucols: u's columns stored per module (R, or RP with zeros) */
    float scale;
    bf16 *u; /* (n, ldu) or NULL */
};
/* The TMA kernel with the LoRA fused in: for RP where moe_gemm_tma_fuses says it
 * fits (16 and 32); nn false (forward, p.gather allowed) or true (bwd_input). */
bool moe_gemm_tma_fuses(int RP);
void moe_gemm_tma_lora(const cuda_ctx *c, const gemm_args &p, bool nn, const fused_lora &l);

/* g = dy [B_1; B_2] of n_lora modules as one LoRA (moe_expert_lora.cu: its backward's
 * first phase alone), into g (n, ldg >= 64): module q's in columns q R .. q R + R -
 * 1, zeros up to 64 (what moe_linear_lora_bwd_input's k-step reads). */
void moe_lora_g(ct_backend *be, void *g, int ldg, const void *dy, int lddy, int out, const int32_t *offsets, int E,
                int in, const ct_lora_cols *lora, int n_lora, int R);

/* Raises the shared-memory limit of a kernel (more than 48 KB needs an opt-in) and
 * returns how many of its blocks one SM holds. */
static inline int kernel_setup(const void *fn, int threads, size_t smem)
{
    int n = 0;
    CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    /* All shared: the launch then gets the occupancy measured here (the cooperative
     * grid must be resident at once). */
    CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, threads, smem));
    CT_ASSERT(n >= 1, "moe_gemm: a kernel does not fit on one SM (%zu bytes of shared memory)", smem);
    return n;
}

#endif
