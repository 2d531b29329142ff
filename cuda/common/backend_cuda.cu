/* backend_cuda.cu — the CUDA backend: its context (one compute stream, one
 * cuBLASLt handle and workspace, a scratch arena), memory and transfer ops, and
 * the op table. Activations and weights are bf16; LoRA parameters, gradients,
 * moments, rstd, lse and the loss are fp32 (backend.h).
 *
 * Transfers: upload() is cudaMemcpyAsync on the compute stream. From pageable
 * host memory the driver copies the source into its own staging before
 * returning, so the caller may reuse its buffer at once; from pinned memory the
 * copy is truly asynchronous and the caller must not touch the buffer before the
 * next download()/sync(). Conversions (upload_weight, act_from_f32, act_to_f32)
 * go through a host buffer and wait: they run at load time, never in a step. */
#include "ct_cuda.cuh"

extern "C" {
#include "model_config.h"
}

#include <cuda_fp16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuBLASLt's own advice for Hopper is 32 MiB of workspace. */
#define WORKSPACE_BYTES ((size_t)32 << 20)
/* Host-side conversion chunk: bounds the temporary host buffer at load time. */
#define CONVERT_CHUNK ((size_t)1 << 24)

void ct_cuda_fatal(const char *file, int line, const char *call, const char *reason)
{
    fprintf(stderr, "ctune: %s:%d: %s failed: %s\n", file, line, call, reason);
    if (strstr(reason, "memory"))
        fprintf(stderr, "HINT: the GPU ran out of memory: lower data.tokens_per_micro_batch "
                        "or set memory.activation_offload: on\n");
    else
        fprintf(stderr, "HINT: check nvidia-smi (driver for CUDA 13, a Hopper GPU); rerun with "
                        "CUDA_LAUNCH_BLOCKING=1 to name the kernel that failed\n");
    exit(CT_ERR_RUNTIME);
}

void *cuda_scratch(cuda_ctx *c, size_t bytes)
{
    if (bytes > c->scratch_bytes) {
        if (c->scratch) CUDA_CHECK(cudaFreeAsync(c->scratch, c->stream));
        /* Round up so that slowly growing requests do not regrow every call. */
        size_t want = scratch_round(bytes + bytes / 8);
        CUDA_CHECK(cudaMallocAsync(&c->scratch, want, c->stream));
        CUDA_CHECK(cudaMemsetAsync(c->scratch, 0, want, c->stream)); /* see cuda_reserve_scratch */
        c->scratch_bytes = want;
    }
    return c->scratch;
}

// ---- launchers (memory and transfers) ----

static void *cuda_alloc(ct_backend *be, size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* clear it: running out is an answer, not a failure */
        return NULL;
    }
    CUDA_CHECK(e);
    /* The zeros must be in place before alloc returns: the batch upload writes
     * into the graph's arena from the copy stream, which is not ordered after
     * this stream, and an arena of tens of GiB takes milliseconds to clear (a
     * memset still running wiped the first micro-batch's tokens and metadata).
     * Allocation happens at setup, never in a step. */
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_of(be)->stream));
    be->host_syncs++;
    CUDA_CHECK(cudaStreamSynchronize(ctx_of(be)->stream));
    return p;
}

static void cuda_free(ct_backend *be, void *p)
{
    if (!p) return;
    /* Queued work may still read p. */
    be->host_syncs++;
    CUDA_CHECK(cudaStreamSynchronize(ctx_of(be)->stream));
    CUDA_CHECK(cudaFree(p));
}

static void cuda_zero(ct_backend *be, void *p, size_t bytes)
{
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_of(be)->stream));
}

static void cuda_upload(ct_backend *be, void *dst, const void *host_src, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, ctx_of(be)->stream));
}

static void cuda_download(ct_backend *be, void *host_dst, const void *src, size_t bytes)
{
    cuda_ctx *c = ctx_of(be);
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    be->host_syncs++;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static void cuda_upload_weight(ct_backend *be, void *dst, const void *host_src, ct_dtype src_dtype,
                               size_t n)
{
    cuda_ctx *c = ctx_of(be);
    if (src_dtype == CT_DTYPE_BF16) {
        CUDA_CHECK(cudaMemcpyAsync(dst, host_src, n * 2, cudaMemcpyHostToDevice, c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        return;
    }
    CT_ASSERT(src_dtype == CT_DTYPE_F16 || src_dtype == CT_DTYPE_F32,
              "upload_weight: unsupported source dtype %d", (int)src_dtype);
    /* Rounded on the host with ct_f32_to_bf16, the rounding the CPU tests use. */
    uint16_t *buf = (uint16_t *)ct_malloc(CONVERT_CHUNK * 2);
    const unsigned char *s = (const unsigned char *)host_src;
    for (size_t i0 = 0; i0 < n; i0 += CONVERT_CHUNK) {
        size_t m = n - i0 < CONVERT_CHUNK ? n - i0 : CONVERT_CHUNK;
        for (size_t i = 0; i < m; i++) {
            float f;
            if (src_dtype == CT_DTYPE_F32) {
                memcpy(&f, s + 4 * (i0 + i), 4); /* mmap'd sources need not be aligned */
            } else {
                __half_raw r;
                memcpy(&r.x, s + 2 * (i0 + i), 2);
                f = __half2float(__half(r));
            }
            buf[i] = ct_f32_to_bf16(f);
        }
        CUDA_CHECK(cudaMemcpyAsync((uint16_t *)dst + i0, buf, m * 2, cudaMemcpyHostToDevice, c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* buf is reused next chunk */
    }
    free(buf);
}

static void cuda_act_from_f32(ct_backend *be, void *dst, const float *host_src, size_t n)
{
    cuda_ctx *c = ctx_of(be);
    uint16_t *buf = (uint16_t *)ct_malloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) buf[i] = ct_f32_to_bf16(host_src[i]);
    CUDA_CHECK(cudaMemcpyAsync(dst, buf, n * 2, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    free(buf);
}

static void cuda_act_to_f32(ct_backend *be, float *host_dst, const void *src, size_t n)
{
    cuda_ctx *c = ctx_of(be);
    uint16_t *buf = (uint16_t *)ct_malloc(n * 2 + 2);
    CUDA_CHECK(cudaMemcpyAsync(buf, src, n * 2, cudaMemcpyDeviceToHost, c->stream));
    be->host_syncs++;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (size_t i = 0; i < n; i++) host_dst[i] = ct_bf16_to_f32(buf[i]);
    free(buf);
}

static void cuda_sync(ct_backend *be)
{
    be->host_syncs++;
    CUDA_CHECK(cudaStreamSynchronize(ctx_of(be)->stream));
}

/* The shapes the kernels cover: attention for head_dim 32/64/128/256, 16-byte
 * vector access along every row (so widths multiples of 8), routing for up to
 * 256 experts and 32 per token (moe_route.cu). Real models all fit; a config
 * that does not gets a clear input error here instead of an internal assertion
 * in a kernel launcher later. */
static int cuda_check_model(ct_backend *be, const ct_model_config *c, const char *dir, ct_error *err)
{
    const char *why = NULL;
    char buf[160];
    bool dense = false;
    for (int l = 0; l < c->num_hidden_layers; l++) dense |= !c->layer_sparse[l];
    if (c->head_dim != 32 && c->head_dim != 64 && c->head_dim != 128 && c->head_dim != 256)
        snprintf(buf, sizeof buf, "head_dim %d (the CUDA attention kernels cover 32, 64, 128 and 256)", c->head_dim),
            why = buf;
    else if (c->hidden_size % 8)
        snprintf(buf, sizeof buf, "hidden_size %d is not a multiple of 8", c->hidden_size), why = buf;
    else if (dense && c->intermediate_size % 8)
        snprintf(buf, sizeof buf, "intermediate_size %d is not a multiple of 8", c->intermediate_size), why = buf;
    else if (c->num_experts > 0 && c->moe_intermediate_size % 8)
        snprintf(buf, sizeof buf, "moe_intermediate_size %d is not a multiple of 8", c->moe_intermediate_size), why = buf;
    else if (c->num_experts > 256)
        snprintf(buf, sizeof buf, "%d experts (the CUDA routing covers up to 256)", c->num_experts), why = buf;
    else if (c->num_experts > 0 && c->num_experts_per_tok > 32)
        snprintf(buf, sizeof buf, "%d experts per token (the CUDA routing covers up to 32)", c->num_experts_per_tok),
            why = buf;
    else if (c->gdn && c->linear_key_head_dim != 32 && c->linear_key_head_dim != 64 && c->linear_key_head_dim != 128)
        snprintf(buf, sizeof buf, "linear_key_head_dim %d (the CUDA delta rule covers 32, 64 and 128)",
                 c->linear_key_head_dim), why = buf;
    else if (c->gdn && c->linear_value_head_dim % 32)
        snprintf(buf, sizeof buf, "linear_value_head_dim %d is not a multiple of 32", c->linear_value_head_dim),
            why = buf;
    if (!why) return CT_OK;
    return CT_FAIL_INPUT(err, "%s/config.json: %s: not supported by the CUDA backend (set device: cpu to train it "
                         "on the CPU reference backend)", dir, why);
}

static size_t cuda_memory_used(ct_backend *be)
{
    size_t free_b = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    return total - free_b;
}

static void *cuda_native_stream(ct_backend *be) { return ctx_of(be)->stream; }

static void cuda_destroy(ct_backend *be)
{
    if (!be) return;
    cuda_ctx *c = ctx_of(be);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    cuda_offload_destroy(c);
    gemm_plans_free(c);
    if (c->scratch) CUDA_CHECK(cudaFreeAsync(c->scratch, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    CUDA_CHECK(cudaFree(c->workspace));
    CUDA_CHECK(cudaFree(c->partials));
    CUBLAS_CHECK(cublasLtDestroy(c->lt));
    CUDA_CHECK(cudaStreamDestroy(c->stream));
    free(c);
    free(be);
}

extern "C" ct_backend *backend_cuda_new_with(const ct_cuda_options *opt, ct_error *err)
{
    int n = 0, dev = opt ? opt->device : 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        CT_FAIL_RUNTIME(err, "no usable CUDA GPU (%s)",
                        e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices");
        (void)cudaGetLastError();
        return NULL;
    }
    if (dev < 0 || dev >= n) {
        CT_FAIL_RUNTIME(err, "GPU %d was asked for (LOCAL_RANK) but %d GPU%s visible (HINT: one rank per GPU: "
                             "check --gpus, the launcher's processes per node and CUDA_VISIBLE_DEVICES)",
                        dev, n, n == 1 ? " is" : "s are");
        return NULL;
    }
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) {
        CT_FAIL_RUNTIME(err, "cannot query GPU %d (%s)", dev, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return NULL;
    }
    /* The kernels are built for sm_90a only; other GPUs cannot load them. */
    if (prop.major != 9 || prop.minor != 0) {
        CT_FAIL_RUNTIME(err, "GPU %d (%s) has compute capability %d.%d; this build needs a Hopper "
                             "GPU (9.0)", dev, prop.name, prop.major, prop.minor);
        return NULL;
    }
    CUDA_CHECK(cudaSetDevice(dev));
    cuda_ctx *c = (cuda_ctx *)ct_calloc(1, sizeof *c);
    c->num_sms = prop.multiProcessorCount;
    if (opt) c->options = *opt;
    CT_ASSERT(c->options.attn_fwd >= CT_ATTN_FWD_AUTO && c->options.attn_fwd <= CT_ATTN_FWD_TMA,
              "backend_cuda_new_with: attn_fwd %d is not a ct_attn_fwd_kernel", (int)c->options.attn_fwd);
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&c->lt));
    c->workspace_bytes = WORKSPACE_BYTES;
    CUDA_CHECK(cudaMalloc(&c->workspace, c->workspace_bytes));
    CUDA_CHECK(cudaMalloc(&c->partials, SUMSQ_BLOCKS * sizeof(double)));
    attention_init();
    loss_init();
    cuda_offload_init(c);

    ct_backend *be = (ct_backend *)ct_calloc(1, sizeof *be);
    be->name = "cuda";
    be->act_bytes = 2;
    be->weight_bytes = 2;
    be->ctx = c;
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->zero = cuda_zero;
    be->upload = cuda_upload;
    be->download = cuda_download;
    be->upload_weight = cuda_upload_weight;
    be->act_from_f32 = cuda_act_from_f32;
    be->act_to_f32 = cuda_act_to_f32;
    be->sync = cuda_sync;
    be->destroy = cuda_destroy;
    be->memory_used = cuda_memory_used;
    be->native_stream = cuda_native_stream;
    be->check_model = cuda_check_model;
    be->max_expert_lora_rank = 64; /* moe_expert_lora.cu pads R to 16, 32 or 64 */
    cuda_fill_offload_ops(be);
    be->embedding = cuda_embedding;
    be->rmsnorm_fwd = cuda_rmsnorm_fwd;
    be->rmsnorm_bwd = cuda_rmsnorm_bwd;
    be->linear_fwd = cuda_linear_fwd;
    be->linear_fwd_residual = cuda_linear_fwd_residual;
    be->linear_bwd_input = cuda_linear_bwd_input;
    be->lora_fwd = cuda_lora_fwd;
    be->lora_bwd = cuda_lora_bwd;
    be->lora_fwd_cols = cuda_lora_fwd_cols;
    be->lora_bwd_cols = cuda_lora_bwd_cols;
    be->rope = cuda_rope;
    be->rmsnorm_rope_fwd = cuda_rmsnorm_rope_fwd;
    be->rmsnorm_rope_bwd = cuda_rmsnorm_rope_bwd;
    be->attention_fwd = cuda_attention_fwd;
    be->attention_bwd = cuda_attention_bwd;
    be->attention_decode = cuda_attention_decode;
    be->swiglu_fwd = cuda_swiglu_fwd;
    be->swiglu_bwd = cuda_swiglu_bwd;
    be->add = cuda_add;
    be->copy_2d = cuda_copy_2d;
    be->cross_entropy = cuda_cross_entropy;
    be->sum_squares = cuda_sum_squares;
    be->adamw = cuda_adamw;
    /* Mixture of experts. An op left NULL makes model_load refuse MoE models. */
    cuda_fill_moe_route_ops(be);
    cuda_fill_moe_rows_ops(be);
    cuda_fill_moe_gemm_ops(be);
    cuda_fill_moe_lora_ops(be);
    cuda_fill_moe_gemm_lora_ops(be);
    cuda_fill_moe_shared_gate_ops(be);
    cuda_fill_quant_ops(be);
    cuda_fill_fp8_ops(be);
    /* Gated DeltaNet (model_load needs every GDN op). */
    cuda_fill_gdn_pointwise_ops(be);
    cuda_fill_gdn_delta_ops(be);
    return be;
}

extern "C" ct_backend *backend_cuda_new(ct_error *err) { return backend_cuda_new_with(NULL, err); }
