/* backend.h — the op table the model graph calls. Two implementations: the CPU
 * reference (backend_cpu.c: plain C, fp32, OpenMP) and CUDA (cuda/: bf16
 * storage, fp32 accumulation). The graph is written once over this table.
 *
 * Conventions (every op):
 *  - Pointers are backend memory (from be->alloc). "act" tensors have
 *    be->act_bytes bytes per element (CPU fp32, CUDA bf16); "weight" tensors
 *    be->weight_bytes (CPU fp32, CUDA bf16); LoRA parameters, their gradients,
 *    optimizer moments, rstd, lse and the loss are always fp32; ids and batch
 *    metadata are int32.
 *  - Matrices are row-major. `ld*` is the row stride in elements, so an op can
 *    read or write a column slice of a fused tensor (e.g. q inside qkv).
 *  - Dimension names: T tokens, H hidden, I intermediate, V vocab, D head_dim,
 *    nq/nkv query/key-value heads, R LoRA rank.
 *  - `accumulate` = 0 overwrites the output, 1 adds into it.
 *  - Ops are ordered on one stream; nothing waits for the device except
 *    download() and sync(). No op allocates on the hot path.
 *  - Dropout masks come from ct_hash_uniform(seed, t * in + i) (common.h): keep
 *    when u >= p, kept values scaled by 1/(1-p); identical on every backend. */
#ifndef CT_BACKEND_H
#define CT_BACKEND_H

#include "common.h"
#include "safetensors.h"

typedef struct ct_backend ct_backend;

struct ct_backend {
    const char *name;          /* "cpu" or "cuda" */
    size_t act_bytes;
    size_t weight_bytes;
    void *ctx;                 /* implementation state */
    uint64_t host_syncs;       /* times the host waited for the device (download, sync, free) */

    /* ---- memory ---- */
    void *(*alloc)(ct_backend *be, size_t bytes);  /* zero-filled; NULL when out of memory */
    void (*free)(ct_backend *be, void *p);
    void (*zero)(ct_backend *be, void *p, size_t bytes);
    void (*upload)(ct_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(ct_backend *be, void *host_dst, const void *src, size_t bytes); /* waits */
    /* n host elements of src_dtype (BF16, F16 or F32) -> weight tensor dst */
    void (*upload_weight)(ct_backend *be, void *dst, const void *host_src, ct_dtype src_dtype, size_t n);
    void (*act_from_f32)(ct_backend *be, void *dst, const float *host_src, size_t n);
    void (*act_to_f32)(ct_backend *be, float *host_dst, const void *src, size_t n);    /* waits */
    void (*sync)(ct_backend *be);
    void (*destroy)(ct_backend *be);

    /* ---- model ops ---- */
    /* out (T,H) act = table[ids[t]] ; table (V,H) weight */
    void (*embedding)(ct_backend *be, void *out, const int32_t *ids, const void *table, int T, int H);

    /* RMSNorm over groups of D: row (t, h) at x + t*ldx + h*D, for h < nh.
     * y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); w (D) weight; rstd (T*nh)
     * fp32 saved for backward (may be NULL). y may alias x. */
    void (*rmsnorm_fwd)(ct_backend *be, void *y, int ldy, float *rstd,
                        const void *x, int ldx, const void *w, int T, int nh, int D, float eps);
    /* dx (=|+=) d/dx of the above given dy, x and the saved rstd (w frozen: no dw). */
    void (*rmsnorm_bwd)(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                        const void *x, int ldx, const float *rstd, const void *w,
                        int T, int nh, int D, int accumulate);

    /* y[:, 0:out] (=|+=) x (T,in) @ W^T + bias ; W (out,in) weight ; bias (out) weight or NULL */
    void (*linear_fwd)(ct_backend *be, void *y, int ldy, const void *x, int ldx,
                       const void *W, const void *bias, int T, int in, int out, int accumulate);
    /* dx (T,in) (=|+=) dy (T,out) @ W */
    void (*linear_bwd_input)(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                             const void *W, int T, int in, int out, int accumulate);

    /* LoRA (PEFT): y += scale * (drop(x) @ A^T) @ B^T ; A (R,in), B (out,R) fp32. */
    void (*lora_fwd)(ct_backend *be, void *y, int ldy, const void *x, int ldx,
                     const float *A, const float *B, int T, int in, int out, int R,
                     float scale, float dropout_p, uint64_t dropout_seed);
    /* With u = drop(x) @ A^T and g = dy @ B:
     *   dB += scale * dy^T @ u ; dA += scale * g^T @ drop(x) ;
     *   dx += scale * drop'(g @ A)   (dx may be NULL; drop' = the same mask and 1/(1-p)).
     * dA, dB accumulate (fp32) across micro-batches. */
    void (*lora_bwd)(ct_backend *be, void *dx, int lddx, float *dA, float *dB,
                     const void *dy, int lddy, const void *x, int ldx,
                     const float *A, const float *B, int T, int in, int out, int R,
                     float scale, float dropout_p, uint64_t dropout_seed);

    /* RoPE in place, split-halves (rotate_half) style, on the first rot_dim dims of
     * each head of x (T, nh, D) with token stride ldx: angle = pos[t] * inv_freq[i]
     * (inv_freq (rot_dim/2) fp32), cos and sin multiplied by attn_scaling.
     * inverse = 1 applies the transpose (the backward of the forward rotation). */
    void (*rope)(ct_backend *be, void *x, int ldx, const int32_t *pos, const float *inv_freq,
                 int T, int nh, int D, int rot_dim, float attn_scaling, int inverse);

    /* Causal GQA attention over documents [cu_seqlens[d], cu_seqlens[d+1]), d < n_docs;
     * no attention across documents. q (T,nq,D), k and v (T,nkv,D), out (T,nq,D),
     * each with its own token stride; query head h uses kv head h / (nq/nkv).
     * window > 0: key j is visible from query i iff i - window < j <= i.
     * sinks (nq) fp32 or NULL: one extra logit per head in the softmax denominator.
     * lse (T,nq) fp32: log-sum-exp of the scaled logits, saved for backward. */
    void (*attention_fwd)(ct_backend *be, void *out, int ldo, float *lse,
                          const void *q, int ldq, const void *k, int ldk, const void *v, int ldv,
                          const int32_t *cu_seqlens, int n_docs, int max_seqlen,
                          int T, int nq, int nkv, int D, float scale, int window, const float *sinks);
    /* dq, dk, dv are overwritten. */
    void (*attention_bwd)(ct_backend *be, void *dq, int lddq, void *dk, int lddk, void *dv, int lddv,
                          const void *dout, int lddo, const void *out, int ldo, const float *lse,
                          const void *q, int ldq, const void *k, int ldk, const void *v, int ldv,
                          const int32_t *cu_seqlens, int n_docs, int max_seqlen,
                          int T, int nq, int nkv, int D, float scale, int window, const float *sinks);

    /* h (T,I) = silu(gu[:, 0:I]) * gu[:, I:2I] ; gu (T,2I) */
    void (*swiglu_fwd)(ct_backend *be, void *h, const void *gu, int T, int I);
    /* dgu (T,2I) = the gradient of the above wrt gu, given dh */
    void (*swiglu_bwd)(ct_backend *be, void *dgu, const void *dh, const void *gu, int T, int I);

    /* y += x, n act elements */
    void (*add)(ct_backend *be, void *y, const void *x, size_t n);
    /* dst[r, 0:cols] = src[r, 0:cols] for r < rows (act) */
    void (*copy_2d)(ct_backend *be, void *dst, int lddst, const void *src, int ldsrc, int rows, int cols);

    /* Cross-entropy over the n rows that have targets. logits_i = x[rows[i]] @ W^T
     * (x (T,H) act, W (V,H) weight); loss_sum[0] += sum_i logsumexp(logits_i) -
     * logits_i[targets[i]] (fp32). If dx != NULL: dx[rows[i]] = grad_scale *
     * (softmax(logits_i) - onehot(targets[i])) @ W; other rows of dx untouched.
     * Works over chunks of rows: the (n, V) logits never exist at once. */
    void (*cross_entropy)(ct_backend *be, float *loss_sum, void *dx, const void *x, const void *W,
                          const int32_t *rows, const int32_t *targets, int n, int H, int V,
                          float grad_scale);

    /* ---- optimizer (fp32) ---- */
    /* out[0] += sum(g^2) */
    void (*sum_squares)(ct_backend *be, float *out, const float *g, size_t n);
    /* torch.optim.AdamW step on n parameters, after clipping by the global norm:
     *   c = max_norm > 0 ? min(1, max_norm / (sqrt(norm_sq[0]) + 1e-6)) : 1 ; g = c * grad
     *   p *= 1 - lr * wd ; m = b1 m + (1-b1) g ; v = b2 v + (1-b2) g^2
     *   p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
     * norm_sq stays on the device (no host sync). */
    void (*adamw)(ct_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                  const float *norm_sq, float max_norm, float lr, float b1, float b2,
                  float eps, float wd, int step);
};

/* The CPU reference backend (never fails). */
ct_backend *backend_cpu_new(void);
/* The CUDA backend, or NULL with a reason in err when no GPU is usable
 * (or ctune was built without CUDA). */
ct_backend *backend_cuda_new(ct_error *err);

#endif
