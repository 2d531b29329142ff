/* ct_cuda.cuh — what the CUDA backend's files share: the backend context, the
 * checked-call macros, the scratch arena, the GEMM entry point, bf16 vector
 * helpers, the device port of ct_hash64, and each file's table functions (so
 * backend_cuda.cu can fill struct ct_backend).
 *
 * Error policy: ops return void (backend.h), so a failed CUDA/cuBLAS call inside
 * one is fatal: it prints file:line, the call, the reason and a HINT, then exits
 * with CT_ERR_RUNTIME, as ct_malloc does for host memory. */
#ifndef CT_CUDA_CUH
#define CT_CUDA_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend.h"
}

typedef __nv_bfloat16 bf16;

[[noreturn]] void ct_cuda_fatal(const char *file, int line, const char *call, const char *reason);

#define CUDA_CHECK(call) do { cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) ct_cuda_fatal(__FILE__, __LINE__, #call, cudaGetErrorString(e_)); } while (0)
#define CUBLAS_CHECK(call) do { cublasStatus_t s_ = (call); \
    if (s_ != CUBLAS_STATUS_SUCCESS) ct_cuda_fatal(__FILE__, __LINE__, #call, cublasGetStatusString(s_)); } while (0)
/* After every kernel launch: catches bad launch configurations at once. */
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

struct gemm_plan;

/* Blocks per multiprocessor of the persistent MoE kernels, measured when the
 * backend is created (kernel_setup in moe_gemm.cuh): their grids are this times
 * num_sms. Index r of the fused and LoRA kernels: padded rank 16, 32, 64. */
struct moe_occupancy {
    int tma_nt, tma_nn, tma_nt_gather; /* moe_gemm_tma.cu without the LoRA: forward, bwd_input, gathered forward */
    int tma_fused[2][3];               /* moe_gemm_tma.cu with it: [RP 16, 32][forward, gathered forward, bwd_input] */
    int cp_async_fused;                /* moe_gemm_fused_lora.cu (RP 64) */
    int lora_fwd[3], lora_bwd[3];      /* moe_expert_lora.cu */
};

struct cuda_ctx {
    cudaStream_t stream;        /* the one compute stream every op is ordered on */
    cublasLtHandle_t lt;
    void *workspace;            /* cuBLASLt workspace, allocated once */
    size_t workspace_bytes;
    gemm_plan *plans;           /* cached matmul descriptors + algorithms, one per shape */
    int n_plans, cap_plans;
    void *scratch;              /* op scratch, grown stream-ordered (see cuda_scratch) */
    size_t scratch_bytes;
    double *partials;           /* (SUMSQ_BLOCKS) sum_squares partial sums, fixed size */
    int num_sms;
    ct_cuda_options options;    /* the kernels forced at creation (kernel_choice.cu reads them) */
    moe_occupancy occupancy;
    /* activation offload (offload.cu): copies run here, ordered by events */
    cudaStream_t copy_stream;
    cudaEvent_t compute_mark;                  /* "everything queued on stream so far" */
    cudaEvent_t slot_done[CT_OFFLOAD_SLOTS];   /* last copy issued on each slot */
    /* batch upload (offload.cu) */
    cudaEvent_t upload_released[CT_UPLOAD_SLOTS]; /* compute done reading the slot's set */
    cudaEvent_t upload_done[CT_UPLOAD_SLOTS];     /* the slot's last copy */
};

static inline cuda_ctx *ctx_of(ct_backend *be) { return (cuda_ctx *)be->ctx; }

/* Scratch valid for the calling op only (the next op may reuse it). Grows with
 * cudaFreeAsync/cudaMallocAsync on the compute stream, so growing neither waits
 * nor races queued work; it happens only when a larger size than ever before is
 * asked for, i.e. in the first step (run one step before capturing a graph). */
void *cuda_scratch(cuda_ctx *c, size_t bytes);

/* Carves consecutive 256-byte-aligned pieces out of a scratch block. */
struct scratch_carver {
    char *base;
    size_t used;
};
static inline size_t scratch_round(size_t b) { return (b + 255) & ~(size_t)255; }
static inline void *scratch_take(scratch_carver *s, size_t bytes)
{
    void *p = s->base + s->used;
    s->used += scratch_round(bytes);
    return p;
}

/* Row-major C (M,N) = alpha * op(A) @ op(B) + beta * C (+ bias (N) when non-NULL,
 * bf16, added to every row). op(A) is (M,K): A is stored (M,K) with row stride
 * lda, or (K,M) when ta. op(B) is (K,N): B is stored (K,N), or (N,K) when tb.
 * Types: A and B CUDA_R_16BF; C CUDA_R_16BF or CUDA_R_32F; fp32 accumulation. */
void gemm(cuda_ctx *c, void *C, cudaDataType_t ctype, int ldc,
          const void *A, int lda, bool ta, const void *B, int ldb, bool tb,
          int M, int N, int K, float alpha, float beta, const bf16 *bias);
/* gemm with C read from C_in (same layout as C; C_in may equal C). */
void gemm_from(cuda_ctx *c, void *C, const void *C_in, cudaDataType_t ctype, int ldc,
               const void *A, int lda, bool ta, const void *B, int ldb, bool tb,
               int M, int N, int K, float alpha, float beta, const bf16 *bias);
/* Row-major C (M,N) bf16 = A8 (M,K) @ B8^T (+ C_in when non-NULL, same layout
 * as C, may equal C) (+ bias (N)): A8 E4M3 activations, a_scale[g * M + m]
 * the fp32 scale of row m's 128-column group g (fp8.h: fp8_row_scale_index
 * with ld_scale M); B8 (N,K) an E4M3 weight, b_scale its fp32 128x128 block
 * scales, row-major with fp8_weight_scale_ld(K) per block row. fp32
 * accumulation. M a multiple of 4, K and the input strides of 16 (asserted). */
void gemm_fp8(cuda_ctx *c, bf16 *C, int ldc, const bf16 *C_in, const uint8_t *A8, int lda, const float *a_scale,
              const uint8_t *B8, int ldb, const float *b_scale, int M, int N, int K, const bf16 *bias);
void gemm_plans_free(cuda_ctx *c);

/* ---- device helpers ---- */

/* Bit-exact port of ct_hash64 / ct_hash_uniform (common.c): dropout masks must be
 * identical on both backends. */
__device__ __forceinline__ float ct_hash_uniform_dev(uint64_t seed, uint64_t index)
{
    uint64_t z = (seed ^ (index * 0xd1b54a32d192ed03ull)) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* 8 bf16 <-> 8 floats through one 16-byte access. */
__device__ __forceinline__ void unpack8(float f[8], uint4 u)
{
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}
__device__ __forceinline__ void load8(float f[8], const bf16 *p) { unpack8(f, *(const uint4 *)p); }
__device__ __forceinline__ void store8(bf16 *p, const float f[8])
{
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *(uint4 *)p = u;
}

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
static inline unsigned grid_for(size_t n, unsigned block) { return (unsigned)((n + block - 1) / block); }
/* The memory-bound kernels move 16 bytes (8 bf16) per thread: a row width and
 * stride that are multiples of 8 and a 16-byte-aligned pointer, or a fatal error. */
static inline void check_vec8(const char *op, const void *p, int ld, int width)
{
    CT_ASSERT(aligned16(p) && ld % 8 == 0 && width % 8 == 0,
              "%s: width %d and stride %d must be multiples of 8 and the pointer 16-byte aligned",
              op, width, ld);
}

/* ---- table functions, by file ---- */

/* embedding.cu */
void cuda_embedding(ct_backend *be, void *out, const int32_t *ids, const void *table, int T, int H);

/* rmsnorm_rope.cu */
void cuda_rmsnorm_fwd(ct_backend *be, void *y, int ldy, float *rstd, const void *x, int ldx,
                      const void *w, int zero_centred, int T, int nh, int D, float eps);
void cuda_rmsnorm_bwd(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, const void *x,
                      int ldx, const float *rstd, const void *w, int zero_centred, int T, int nh, int D,
                      const void *dres, int lddres);
void cuda_rmsnorm_rope_fwd(ct_backend *be, void *y, int ldy, float *rstd, const void *x, int ldx,
                           const void *w, int zero_centred, const int32_t *pos, const float *inv_freq,
                           int T, int nh, int D, int rot_dim, float eps, float attn_scaling);
void cuda_rmsnorm_rope_bwd(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                           const void *x, int ldx, const float *rstd, const void *w, int zero_centred,
                           const int32_t *pos, const float *inv_freq,
                           int T, int nh, int D, int rot_dim, float attn_scaling);
void cuda_rope(ct_backend *be, void *x, int ldx, const int32_t *pos, const float *inv_freq,
               int T, int nh, int D, int rot_dim, float attn_scaling, int inverse);

/* elementwise.cu */
void cuda_swiglu_fwd(ct_backend *be, void *h, const void *gu, int T, int I);
void cuda_swiglu_bwd(ct_backend *be, void *dgu, const void *dh, const void *gu, int T, int I);
void cuda_add(ct_backend *be, void *y, const void *x, size_t n);
void cuda_copy_2d(ct_backend *be, void *dst, int lddst, const void *src, int ldsrc, int rows, int cols);

/* gdn_pointwise.cu: the Gated DeltaNet ops other than the delta rule */
void cuda_fill_gdn_pointwise_ops(ct_backend *be);
/* gdn_delta.cu: the chunked gated delta rule, forward and backward */
void cuda_fill_gdn_delta_ops(ct_backend *be);

/* dequant4.cu: frozen 4-bit weights (NF4, FP4, MXFP4) decoded to bf16 */
void cuda_fill_quant_ops(ct_backend *be);
void cuda_fill_fp8_ops(ct_backend *be);   /* fp8.cu */

/* linear_lora.cu (+ the plain linear layers, which are one gemm each) */
void cuda_linear_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const void *W,
                     const void *bias, int T, int in, int out, int accumulate);
void cuda_linear_fwd_residual(ct_backend *be, void *y, int ldy, const void *res, const void *x, int ldx,
                              const void *W, const void *bias, int T, int in, int out);
void cuda_linear_bwd_input(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                           const void *W, int T, int in, int out, int accumulate);
void cuda_lora_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const float *A,
                   const float *B, int T, int in, int out, int R, float scale, float dropout_p,
                   uint64_t dropout_seed, void *u_keep, int ldu);
void cuda_lora_bwd(ct_backend *be, void *dx, int lddx, float *dA, float *dB, const void *dy,
                   int lddy, const void *x, int ldx, const float *A, const float *B, int T, int in,
                   int out, int R, float scale, float dropout_p, uint64_t dropout_seed, const void *u_kept,
                   int ldu);
void cuda_lora_fwd_cols(ct_backend *be, void *y, int ldy, const void *x, int ldx, int T, int in,
                        const ct_lora_cols *lora, int n_lora, int R, float scale, void *u_keep, int ldu);
void cuda_lora_bwd_cols(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, const void *x, int ldx,
                        int T, int in, const ct_lora_cols *lora, int n_lora, int R, float scale, const void *u_kept,
                        int ldu);
/* The fp32 masters of n_mod (1..CT_LORA_COLS_MAX) modules as one LoRA of rank
 * n_mod R, padded bf16 (lora_convert.cu), queued on st: Ap (E,RP,in) and At (its
 * transpose, or NULL) hold module q's A in ranks q R .. q R + R - 1, Bt (E,RP,out)
 * module q's B^T on its columns [col0, col0 + cols) of those ranks; everything
 * else zero. RP is a multiple of 8, at least n_mod R. */
void lora_convert_cols(cudaStream_t st, bf16 *Ap, bf16 *At, bf16 *Bt, const ct_lora_cols *mods, int n_mod, int E,
                       int R, int RP, int in, int out);

/* attention.cu: attention_init raises the kernels' shared-memory limits (per
 * backend created). */
void attention_init(void);
void cuda_attention_fwd(ct_backend *be, void *out, int ldo, float *lse, const void *q, int ldq,
                        const void *k, int ldk, const void *v, int ldv, const int32_t *cu_seqlens,
                        int n_docs, int max_seqlen, int T, int nq, int nkv, int D, float scale,
                        int window, const float *sinks);
void cuda_attention_bwd(ct_backend *be, void *dq, int lddq, void *dk, int lddk, void *dv, int lddv,
                        const void *dout, int lddo, const void *out, int ldo, const float *lse,
                        const void *q, int ldq, const void *k, int ldk, const void *v, int ldv,
                        const int32_t *cu_seqlens, int n_docs, int max_seqlen, int T, int nq,
                        int nkv, int D, float scale, int window, const float *sinks);

/* attention_decode.cu */
void cuda_attention_decode(ct_backend *be, void *out, int ldo, const void *q, int ldq, const void *k,
                           int ldk, const void *v, int ldv, int Tq, int n_past, int nq, int nkv, int D,
                           float scale, int window, const float *sinks);

/* loss.cu */
void loss_init(void);
void cuda_cross_entropy(ct_backend *be, float *loss_sum, void *dx, const void *x, const void *W,
                        const int32_t *rows, const int32_t *targets, int n, int H, int V,
                        float grad_scale);

/* optim.cu */
#define SUMSQ_BLOCKS 512
void cuda_sum_squares(ct_backend *be, float *out, const float *g, size_t n);
void cuda_adamw(ct_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                const float *norm_sq, float max_norm, float lr, float b1, float b2, float eps,
                float wd, int step);

/* offload.cu: memory queries, scratch reservation, host memory and the
 * copy-stream transfers of activation offload. */
void cuda_offload_init(cuda_ctx *c);
void cuda_offload_destroy(cuda_ctx *c);
void cuda_fill_offload_ops(ct_backend *be);

/* moe_route.cu: routing, permutation, router backward, load-balancing statistics
 * (be->moe_route, moe_count, moe_offsets, moe_permute, moe_route_bwd, moe_prob_sum,
 * moe_aux_loss). */
void cuda_fill_moe_route_ops(ct_backend *be);
/* moe_rows.cu: gather, scatter and its backward, the routing weights' gradient,
 * the clamped SwiGLU and the fused activation backward (be->moe_gather,
 * moe_scatter, moe_scatter_bwd, moe_weight_grad, moe_clamped_swiglu_fwd/_bwd,
 * moe_act_bwd). */
void cuda_fill_moe_rows_ops(ct_backend *be);
/* moe_gemm.cu: the grouped expert GEMMs (be->moe_linear_fwd, moe_linear_bwd_input). */
void cuda_fill_moe_gemm_ops(ct_backend *be);
/* moe_expert_lora.cu: the expert LoRA (be->moe_lora_fwd, moe_lora_bwd). */
void cuda_fill_moe_lora_ops(ct_backend *be);
/* moe_gemm_fused_lora.cu: the grouped GEMM forward with the expert LoRA fused in
 * (be->moe_linear_lora_fwd). */
void cuda_fill_moe_gemm_lora_ops(ct_backend *be);
/* moe_shared_gate.cu: a shared expert's sigmoid gate per token
 * (be->moe_shared_gate_fwd, moe_shared_gate_bwd). */
void cuda_fill_moe_shared_gate_ops(ct_backend *be);

#endif
