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
 *    nq/nkv query/key-value heads, R LoRA rank, E experts, K experts per token.
 *  - `accumulate` = 0 overwrites the output, 1 adds into it.
 *  - Ops are ordered on one stream; nothing waits for the device except
 *    download() and sync(). No op allocates on the hot path.
 *  - Dropout masks come from ct_hash_uniform(seed, t * in + i) (common.h): keep
 *    when u >= p, kept values scaled by 1/(1-p); identical on every backend. */
#ifndef CT_BACKEND_H
#define CT_BACKEND_H

#include "common.h"
#include "quant4.h"
#include "safetensors.h"

typedef struct ct_backend ct_backend;
struct ct_model_config;

/* How a mixture-of-experts router turns a token's logits (E) into K experts and
 * their weights (moe_route). Top-K is in decreasing order. */
typedef enum {
    CT_MOE_SOFTMAX_TOPK,      /* p = softmax over all E (fp32); top-K of p; w = p (qwen3_moe) */
    CT_MOE_SOFTMAX_TOPK_NORM, /* the same, then w /= sum of the K (mixtral; qwen3_moe norm_topk_prob) */
    CT_MOE_TOPK_SOFTMAX,      /* top-K of the logits; w = softmax over those K (gpt_oss) */
} ct_moe_rule;

/* One LoRA module on output columns [col0, col0 + cols) of a linear layer (lora_fwd_cols,
 * lora_bwd_cols: E = 1) or of a grouped GEMM's experts (moe_linear_lora_fwd,
 * moe_lora_bwd_cols); dA and dB: its gradients, backward only. */
typedef struct ct_lora_cols {
    const float *A; /* (E, R, in) fp32 */
    const float *B; /* (E, cols, R) fp32 */
    int col0, cols;
    float *dA, *dB; /* (E, R, in), (E, cols, R) fp32, accumulated */
} ct_lora_cols;

/* Most modules one lora_fwd_cols / lora_bwd_cols call takes (q, k and v). */
#define CT_LORA_COLS_MAX 3

/* The least ldu of moe_linear_lora_fwd's u: n_lora * R ranks rounded up to 16, 32
 * or 64 (the CUDA kernels' padded ranks; 0 past 64: no u). */
static inline int moe_u_cols(int n_lora, int R)
{
    int r = n_lora * R;
    return r <= 16 ? 16 : r <= 32 ? 32 : r <= 64 ? 64 : 0;
}

/* The columns of the u = x A^T that lora_fwd_cols keeps for lora_bwd_cols: module q's
 * R ranks at columns q R, the row padded to 8 (CUDA: 16-byte aligned rows). */
static inline int lora_u_cols(int n_lora, int R) { return (n_lora * R + 7) / 8 * 8; }

struct ct_backend {
    const char *name;          /* "cpu" or "cuda" */
    size_t act_bytes;
    size_t weight_bytes;
    void *ctx;                 /* implementation state */
    uint64_t host_syncs;       /* times the host waited for the device (download, sync, free) */

    /* ---- memory ---- */
    /* Zero-filled, the zeros already in place for every stream (copies on the
     * copy stream may write it at once); NULL when out of memory. Setup only. */
    void *(*alloc)(ct_backend *be, size_t bytes);
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
    /* Device memory in use now, in bytes (all processes), for the progress line;
     * NULL where there is no device (CPU). */
    size_t (*memory_used)(ct_backend *be);
    /* CT_ERR_INPUT naming dir/config.json when the backend's kernels do not
     * cover the model's shapes (head_dim, alignment, expert counts); NULL when
     * every shape is supported (CPU). */
    int (*check_model)(ct_backend *be, const struct ct_model_config *c, const char *dir, ct_error *err);
    int max_expert_lora_rank;  /* largest LoRA r of moe_lora_fwd/bwd; 0 = any (lora_init checks it) */
    /* Device memory that can still be allocated, in bytes; NULL where there is no
     * device (CPU: the memory plan then checks nothing). */
    size_t (*memory_free)(ct_backend *be);
    /* Grows the ops' scratch (temporary memory valid within one op) to at least
     * `bytes` now, so that the first step cannot run out of memory; false when it
     * cannot be had. NULL where ops need no scratch reservation (CPU). */
    bool (*reserve_scratch)(ct_backend *be, size_t bytes);
    /* The compute stream (a cudaStream_t), for work queued in order with the ops
     * by a library the backend does not wrap (NCCL, dist.c); NULL on the CPU. */
    void *(*native_stream)(ct_backend *be);

    /* ---- activation offload (graph.c): saved layer inputs in host memory ----
     * Copies run on a second (copy) stream, ordered against the compute stream by
     * events, so the host never waits: store/load first wait for everything queued
     * on the compute stream so far, then copy, then mark `slot` (0 <= slot <
     * CT_OFFLOAD_SLOTS) done; offload_wait makes later compute work wait for the
     * last copy marked on `slot`. The CPU backend copies at once (waits are no-ops),
     * so the schedule's logic is checked there bit for bit. */
#define CT_OFFLOAD_SLOTS 4
    /* Host memory for offloaded activations: page-locked when possible (*pinned
     * true), else plain malloc (*pinned false; copies are then slower and not
     * asynchronous). NULL when neither can be had. */
    void *(*host_alloc)(ct_backend *be, size_t bytes, bool *pinned);
    void (*host_free)(ct_backend *be, void *p, bool pinned);
    void (*offload_store)(ct_backend *be, void *host_dst, const void *src, size_t bytes, int slot);
    void (*offload_load)(ct_backend *be, void *dst, const void *host_src, size_t bytes, int slot);
    void (*offload_wait)(ct_backend *be, int slot);

    /* ---- batch upload (graph_set_batch) ----
     * The next micro-batch's tokens and metadata go up from page-locked memory on
     * the copy stream while the current one computes, into one of
     * CT_UPLOAD_SLOTS device sets: upload_release(slot) marks the point where the
     * compute stream is done reading set `slot`; upload_async copies after that
     * mark and marks the copy done; upload_wait makes later compute wait for it;
     * upload_host_wait returns once the slot's last copy has read its host
     * buffer (true if the host had to wait, which graph counts as a sync). */
#define CT_UPLOAD_SLOTS 2
    void (*upload_release)(ct_backend *be, int slot);
    void (*upload_async)(ct_backend *be, void *dst, const void *host_src, size_t bytes, int slot);
    void (*upload_wait)(ct_backend *be, int slot);
    bool (*upload_host_wait)(ct_backend *be, int slot);

    /* ---- model ops ---- */
    /* out (T,H) act = table[ids[t]] ; table (V,H) weight */
    void (*embedding)(ct_backend *be, void *out, const int32_t *ids, const void *table, int T, int H);

    /* RMSNorm over groups of D: row (t, h) at x + t*ldx + h*D, for h < nh.
     * y = x * rstd * s, rstd = 1/sqrt(mean(x^2) + eps); w (D) weight; rstd (T*nh)
     * fp32 saved for backward (may be NULL). y may alias x. The scale s is w, or
     * with zero_centred (Qwen3.5, Qwen3-Next: norm_zero_centred) 1 + w computed
     * in fp32 from the stored w, as HF does (a bf16 weight cannot hold 1 + w).
     * Either way the product is fp32 and rounded once to the act dtype. */
    void (*rmsnorm_fwd)(ct_backend *be, void *y, int ldy, float *rstd,
                        const void *x, int ldx, const void *w, int zero_centred, int T, int nh, int D, float eps);
    /* dx = dres + d/dx of the above given dy, x and the saved rstd, with the same
     * scale s (w frozen: no dw). dres (stride lddres) is the residual stream's
     * gradient, added in the same pass; it may alias dx, or be NULL (nothing added). */
    void (*rmsnorm_bwd)(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                        const void *x, int ldx, const float *rstd, const void *w, int zero_centred,
                        int T, int nh, int D, const void *dres, int lddres);

    /* y[:, 0:out] (=|+=) x (T,in) @ W^T + bias ; W (out,in) weight ; bias (out) weight or NULL */
    void (*linear_fwd)(ct_backend *be, void *y, int ldy, const void *x, int ldx,
                       const void *W, const void *bias, int T, int in, int out, int accumulate);
    /* y = res + x @ W^T + bias: the residual add done by the GEMM's epilogue.
     * res (T,out) has y's stride and must not alias y. */
    void (*linear_fwd_residual)(ct_backend *be, void *y, int ldy, const void *res, const void *x, int ldx,
                                const void *W, const void *bias, int T, int in, int out);
    /* dx (T,in) (=|+=) dy (T,out) @ W */
    void (*linear_bwd_input)(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                             const void *W, int T, int in, int out, int accumulate);

    /* A frozen 4-bit weight decoded for the GEMMs above (model_weight): y (n)
     * weight = code[q_i] * scale[i / blocksize], q_i the i-th 4-bit code of
     * `codes` (n/2 bytes), code = quant4_code(type). NF4 and FP4 (bitsandbytes):
     * the even element in the high nibble, scales fp32 (absmax). MXFP4: the even
     * element in the low nibble, scales E8M0 bytes (2^(s-127)), blocksize 32.
     * The product is exact in fp32 and rounded once to the weight type, as
     * bitsandbytes' dequantize_4bit and HF's MXFP4 dequantization do.
     * n % blocksize == 0 (asserted). */
    void (*dequant4)(ct_backend *be, void *y, const uint8_t *codes, const void *scales, size_t n, int blocksize,
                     quant4_type type);
    /* A frozen FP8 weight (base_precision fp8) decoded the same way: y (rows,
     * cols) = decode(q) * scale of its 128x128 block, the scales fp32 at
     * scale[(r / 128) * fp8_weight_scale_ld(cols) + c / 128] (fp8.h); the
     * product formed in fp32 and rounded once to the weight type. NULL on a
     * backend that cannot hold FP8 weights yet. */
    void (*dequant_fp8)(ct_backend *be, void *y, const uint8_t *q, const float *scale, size_t rows, size_t cols);
    /* The GEMMs of such a weight W (out, in) in FP8 itself: the activations are
     * quantized on the fly to E4M3 per row and 128-column group with
     * power-of-two scales (fp8_quantize_rows), fp32 accumulation; the result
     * differs from the dense GEMM of the decoded W by that quantization. NULL
     * where a backend has none (model_linear_* then decode W and use the
     * dense ops). in and out multiples of 16, the strides multiples of 8.
     *   fwd: y = c_in + x (T,in) @ W^T + bias; c_in NULL, y itself or a
     *        residual with y's stride
     *   bwd: dx (T,in) (=|+=) dy (T,out) @ W */
    void (*linear_fwd_fp8)(ct_backend *be, void *y, int ldy, const void *c_in, const void *x, int ldx,
                           const uint8_t *q, const float *scale, const void *bias, int T, int in, int out);
    void (*linear_bwd_input_fp8)(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, const uint8_t *q,
                                 const float *scale, int T, int in, int out, int accumulate);

    /* LoRA (PEFT): y += scale * (drop(x) @ A^T) @ B^T ; A (R,in), B (out,R) fp32.
     * u non-NULL: u = drop(x) @ A^T is also written there ((T, R) activations, ld
     * ldu >= R), for a lora_bwd of the same x to read instead of recomputing it. */
    void (*lora_fwd)(ct_backend *be, void *y, int ldy, const void *x, int ldx,
                     const float *A, const float *B, int T, int in, int out, int R,
                     float scale, float dropout_p, uint64_t dropout_seed, void *u, int ldu);
    /* With u = drop(x) @ A^T and g = dy @ B:
     *   dB += scale * dy^T @ u ; dA += scale * g^T @ drop(x) ;
     *   dx += scale * drop'(g @ A)   (dx may be NULL; drop' = the same mask and 1/(1-p)).
     * dA, dB accumulate (fp32) across micro-batches. u: NULL (computed here) or what
     * lora_fwd wrote for the same x, A and mask: the same bits either way. */
    void (*lora_bwd)(ct_backend *be, void *dx, int lddx, float *dA, float *dB,
                     const void *dy, int lddy, const void *x, int ldx,
                     const float *A, const float *B, int T, int in, int out, int R,
                     float scale, float dropout_p, uint64_t dropout_seed, const void *u, int ldu);
    /* n_lora (1..CT_LORA_COLS_MAX) LoRA modules that share x and own column ranges
     * of one y (lora[q].col0 increasing, ranges not overlapping, E = 1), without
     * dropout: exactly lora_fwd / lora_bwd per module q in order, on y + col0 (dy +
     * col0) with out = cols, into lora[q].dA and dB. The CPU runs that sequence;
     * CUDA runs the modules as one LoRA of rank n_lora R (A stacked, B block-
     * diagonal over the columns from the first col0 to the last module's end), so x
     * is read and y (dx) read-modified-written once instead of once per module:
     * results differ from the sequence by rounding only. u, ldu (ldu >=
     * lora_u_cols(n_lora, R)): as lora_fwd's and lora_bwd's, module q's at column q R. */
    void (*lora_fwd_cols)(ct_backend *be, void *y, int ldy, const void *x, int ldx, int T, int in,
                          const ct_lora_cols *lora, int n_lora, int R, float scale, void *u, int ldu);
    void (*lora_bwd_cols)(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, const void *x, int ldx,
                          int T, int in, const ct_lora_cols *lora, int n_lora, int R, float scale, const void *u,
                          int ldu);

    /* RoPE in place, split-halves (rotate_half) style, on the first rot_dim dims of
     * each head of x (T, nh, D) with token stride ldx: angle = pos[t] * inv_freq[i]
     * (inv_freq (rot_dim/2) fp32), cos and sin multiplied by attn_scaling.
     * inverse = 1 applies the transpose (the backward of the forward rotation). */
    void (*rope)(ct_backend *be, void *x, int ldx, const int32_t *pos, const float *inv_freq,
                 int T, int nh, int D, int rot_dim, float attn_scaling, int inverse);

    /* Qwen3's q/k norm followed by RoPE, in one pass: y = rope(rmsnorm(x)) with
     * rmsnorm_fwd's layout, scale (w, or 1 + w with zero_centred) and rope's
     * forward rotation. y may alias x. */
    void (*rmsnorm_rope_fwd)(ct_backend *be, void *y, int ldy, float *rstd, const void *x, int ldx,
                             const void *w, int zero_centred, const int32_t *pos, const float *inv_freq,
                             int T, int nh, int D, int rot_dim, float eps, float attn_scaling);
    /* Its backward: dx = rmsnorm_bwd(rope^T(dy)) (overwritten). dx may alias dy. */
    void (*rmsnorm_rope_bwd)(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                             const void *x, int ldx, const float *rstd, const void *w, int zero_centred,
                             const int32_t *pos, const float *inv_freq,
                             int T, int nh, int D, int rot_dim, float attn_scaling);

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

    /* Inference attention over a KV cache (generate.c): q (Tq,nq,D) holds the tokens
     * at positions n_past .. n_past+Tq-1; k and v (n_past+Tq, nkv, D) hold the keys
     * and values of every position from 0, the new tokens' last. Query i sees key j
     * iff j <= n_past + i and, when window > 0, j > n_past + i - window. sinks as in
     * attention_fwd. out (Tq,nq,D). No lse: nothing runs backward through it. */
    void (*attention_decode)(ct_backend *be, void *out, int ldo, const void *q, int ldq,
                             const void *k, int ldk, const void *v, int ldv,
                             int Tq, int n_past, int nq, int nkv, int D, float scale, int window,
                             const float *sinks);

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

    /* ---- mixture of experts ----
     * Routing costs a fixed number of ops whatever E, and nothing waits for the
     * host: per-expert row counts stay in device memory, where the grouped ops
     * read them. Dimension names: E experts, K experts per token, I the expert
     * intermediate size, n = T*K routed rows.
     *  - Slot s = t*K + k is token t's k-th choice (k = 0 the largest weight).
     *  - Expert order: the n slots sorted by expert, stably, so within an expert
     *    rows follow slot (hence token) order. Row r of an expert-ordered buffer
     *    holds slot row_slot[r]; slot s sits at row slot_row[s] (inverse maps).
     *  - offsets (E+1) int32: expert e owns rows [offsets[e], offsets[e+1]).
     * Expert-ordered buffers are (n, cols) act with row stride = cols unless an
     * ld is given. Both backends implement every op below (CUDA: cuda/moe_*.cu);
     * model_load refuses MoE models on a backend that leaves one NULL. */

    /* topk_idx (T,K) int32 and topk_w (T,K) fp32 from logits (T,E) act, by rule.
     * Probabilities and the softmax over the K are computed in fp32 (double sums on
     * the CPU). Ties in the top-K go to the lower expert index, on every backend.
     * torch.topk does not promise that: its CPU kernel is std::partial_sort or
     * std::nth_element with a strict '>' comparator, and torch 2.11 returns
     * [6, 5, 4] for topk(zeros(8), 3). So HF and ctune can pick different experts
     * only among exactly equal values, which takes identical router rows or
     * underflow, not random or trained weights. */
    void (*moe_route)(ct_backend *be, int32_t *topk_idx, float *topk_w, const void *logits,
                      int T, int E, int K, ct_moe_rule rule);
    /* counts (E) int32 = histogram of idx[0..n) (overwritten). */
    void (*moe_count)(ct_backend *be, int32_t *counts, const int32_t *idx, int n, int E);
    /* offsets (E+1) int32: exclusive scan of counts, offsets[E] = total. */
    void (*moe_offsets)(ct_backend *be, int32_t *offsets, const int32_t *counts, int E);
    /* The stable permutation: row_slot (n) and slot_row (n) int32 from idx (n)
     * and offsets (above). Slot s of expert e goes to offsets[e] + (the number of
     * earlier slots of e). */
    void (*moe_permute)(ct_backend *be, int32_t *row_slot, int32_t *slot_row, const int32_t *idx,
                        const int32_t *offsets, int n, int E);
    /* xe (n,H) act: xe[r] = x[row_slot[r] / K] (token rows into expert order). */
    void (*moe_gather)(ct_backend *be, void *xe, const void *x, int ldx, const int32_t *row_slot,
                       int T, int K, int H);
    /* The weighted un-permute: y[t] = res[t] + sum over k ascending of
     * w[t*K+k] * ye[slot_row[t*K+k]], summed in fp32 and added to res once.
     * res (T, ldres) act may alias y (accumulate) or be NULL (no residual: y is
     * overwritten); the block's residual stream, so that no copy of it into y is
     * needed first. w (T*K) fp32, or NULL for weights 1 (then it is the backward
     * of moe_gather). */
    void (*moe_scatter)(ct_backend *be, void *y, int ldy, const void *ye, const int32_t *slot_row,
                        const float *w, int T, int K, int H, const void *res, int ldres);
    /* Backward of moe_scatter with weights, given dy (T,H):
     *   dye (n,H) act: dye[r] = w[s] * dy[s / K] with s = row_slot[r] (overwritten);
     *   dw (n) fp32:   dw[s] = dy[s / K] . ye[slot_row[s]] (fp32 dot, overwritten).
     * ye NULL: dw[s] = dy[s / K] . bias[idx[s]] instead (bias (E,H) weight, the
     * experts' output bias), or 0 without a bias: the rest of dy . ye is
     * moe_weight_grad's, from the expert's input gradient (graph_moe.c). */
    void (*moe_scatter_bwd)(ct_backend *be, void *dye, float *dw, const void *dy, int lddy,
                            const void *ye, const void *bias, const int32_t *idx, const int32_t *row_slot,
                            const int32_t *slot_row, const float *w, int T, int K, int H);
    /* dw[s] += (dh[r] . h[r]) / w[s] for each row r < n, s = row_slot[r] (fp32
     * dot; nothing where w[s] == 0), dh and h (n, I) act. With h an expert's
     * input and dh its gradient through a linear map to the expert's output ye
     * (bias excluded) whose gradient was w[s] * dy, that is dy . (ye - bias): ye
     * need not be kept for backward. */
    void (*moe_weight_grad)(ct_backend *be, float *dw, const void *dh, const void *h, const float *w,
                            const int32_t *row_slot, int n, int I);
    /* The expert activation's backward with moe_weight_grad fused in: dgu (n, 2I)
     * as swiglu_bwd (clamped 0) or moe_clamped_swiglu_bwd (clamped 1, alpha,
     * limit) gives it, and dw[row_slot[r]] += (dh[r] . h[r]) / w as
     * moe_weight_grad with h the activation of gu (recomputed: CUDA from gu in
     * fp32, not the forward's rounded h; the CPU's is the forward's own). */
    void (*moe_act_bwd)(ct_backend *be, void *dgu, float *dw, const void *dh, const void *gu, const float *w,
                        const int32_t *row_slot, int n, int I, int clamped, float alpha, float limit);
    /* The grouped expert GEMM, one call for all experts: for each e, rows r in
     * [offsets[e], offsets[e+1]) (offsets read from device memory):
     *   y[r, 0:out] (=|+=) x_r @ W_e^T + bias_e ; W (E, out, in) weight (W_e at
     *   e*out*in), bias (E, out) weight or NULL. Experts with no rows cost nothing.
     * The input rows x_r: gather NULL: x_r = x[r] (x expert-ordered, (n, in) at
     * stride ldx); else x_r = x[gather[r] / K] (x holds the T token rows at stride
     * ldx and gather is the permutation's row_slot (n) int32): moe_gather fused
     * into the loads, with no (n, in) copy. Results equal moe_gather then the
     * op, bit for bit. */
    void (*moe_linear_fwd)(ct_backend *be, void *y, int ldy, const void *x, int ldx, const int32_t *gather,
                           int K, const void *W, const void *bias, const int32_t *offsets, int E, int in, int out,
                           int accumulate);
    /* dx[r] (=|+=) dy[r] @ W_e for the rows of each expert e. */
    void (*moe_linear_bwd_input)(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                                 const void *W, const int32_t *offsets, int E, int in, int out,
                                 int accumulate);
    /* LoRA of each expert (PEFT per-expert modules): exactly lora_fwd / lora_bwd
     * over the rows of expert e (T = its row count, row 0 = its first row) with
     * A_e (R,in) at A + e*R*in, B_e (out,R) at B + e*out*R (fp32), and dropout
     * seed ct_hash64(dropout_seed, e): each expert draws its own mask, as each
     * PEFT expert module has its own dropout. dA (E,R,in), dB (E,out,R) accumulate.
     * x, ldx, gather, K: the input rows as for moe_linear_fwd (gather non-NULL:
     * row r is x[gather[r] / K]); the dropout mask index stays (row within the
     * expert) * in + column. y, dy and dx are expert-ordered. */
    void (*moe_lora_fwd)(ct_backend *be, void *y, int ldy, const void *x, int ldx, const int32_t *gather, int K,
                         const float *A, const float *B, const int32_t *offsets, int E, int in, int out,
                         int R, float scale, float dropout_p, uint64_t dropout_seed);
    void (*moe_lora_bwd)(ct_backend *be, void *dx, int lddx, float *dA, float *dB,
                         const void *dy, int lddy, const void *x, int ldx, const int32_t *gather, int K,
                         const float *A, const float *B, const int32_t *offsets, int E, int in, int out, int R,
                         float scale, float dropout_p, uint64_t dropout_seed);
    /* The backward of n_lora (1..2) expert LoRA modules that share x (and its
     * gather) and own column ranges of one dy (n, out at stride lddy), without
     * dropout: exactly moe_lora_bwd per module q, in order, on dy + lora[q].col0
     * (its out = lora[q].cols) into lora[q].dA and dB. The CPU runs that sequence;
     * CUDA runs the modules as one LoRA of rank n_lora * R when that is <= 64 (x read
     * and dx read-modified-written once instead of once per module): dA and dB as
     * the sequence's, dx different from it by bf16 rounding only.
     * g non-NULL (then dx is NULL and n_lora * R <= 64): g as
     * moe_linear_lora_bwd_input wrote it for the same modules and dy, which CUDA
     * reads instead of recomputing dy B (the CPU recomputes the same product).
     * u non-NULL: the modules' u as moe_linear_lora_fwd wrote it (the same modules,
     * x and R, ldu as there): CUDA reads it instead of recomputing x A^T when it
     * runs the modules as one LoRA (the CPU recomputes the same product). */
    void (*moe_lora_bwd_cols)(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, int out,
                              const void *x, int ldx, const int32_t *gather, int K, const int32_t *offsets, int E,
                              int in, const ct_lora_cols *lora, int n_lora, int R, float scale, const void *g,
                              int ldg, const void *u, int ldu);
    /* moe_linear_bwd_input with the LoRA input-gradient term of n_lora (1..2)
     * modules added: dx[r] (=|+=) dy[r] @ W_e + scale * sum_q g_q[r] @ A_q,e with
     * g_q[r] = dy[r, col0_q .. col0_q + cols_q) @ B_q,e (n_lora * R <= 64), and g
     * written to g (n, ldg) act, ldg >= moe_u_cols(n_lora, R): module q's in
     * columns q R .. q R + R - 1 (CUDA: rounded to bf16 as it multiplies them;
     * the columns up to moe_u_cols zero), for moe_lora_bwd_cols to read. The CPU
     * runs the GEMM, then per module the two products; CUDA computes g beside the
     * grouped GEMM's product and adds the term before its epilogue (TMA version,
     * up to 32 ranks in all), so dy is read once for both and dx written once. */
    void (*moe_linear_lora_bwd_input)(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, const void *W,
                                      const int32_t *offsets, int E, int in, int out, int accumulate, void *g,
                                      int ldg, const ct_lora_cols *lora, int n_lora, int R, float scale);
    /* The grouped GEMM forward with the expert LoRA of n_lora (0..2) modules, without
     * dropout: exactly moe_linear_fwd (all arguments as there), then for each module
     * q in order moe_lora_fwd on y's columns [col0, col0 + cols) (its y = y + col0
     * at stride ldy, its out = cols) with lora[q].A, lora[q].B and the same x,
     * gather, K, offsets, E, in, R and scale. Modules lie in column order without
     * overlap (gate and up of a gate|up GEMM, or one module). The CPU runs that
     * sequence; CUDA fuses the LoRA into the GEMM when it can (one bf16 rounding of
     * y instead of two: results differ from the sequence by bf16 rounding only).
     * u non-NULL: also writes each module's u = x_r A_q,e^T (as the op computes
     * it) into columns q R .. q R + R - 1 of u (n, ldu) act, ldu >= moe_u_cols(
     * n_lora, R), for moe_lora_bwd_cols to read instead of recomputing; returns
     * whether it wrote u (CUDA: only when it fuses). */
    bool (*moe_linear_lora_fwd)(ct_backend *be, void *y, int ldy, const void *x, int ldx, const int32_t *gather,
                                int K, const void *W, const void *bias, const int32_t *offsets, int E, int in,
                                int out, int accumulate, const ct_lora_cols *lora, int n_lora, int R,
                                float scale, void *u, int ldu);
    /* gpt_oss's expert activation on interleaved columns (gate 2i, up 2i+1) of
     * gu (n, 2I): g = min(gate, limit), u = clamp(up, -limit, limit),
     * h (n, I) = (u + 1) * g * sigmoid(alpha * g). */
    void (*moe_clamped_swiglu_fwd)(ct_backend *be, void *h, const void *gu, int n, int I,
                                   float alpha, float limit);
    /* dgu (n, 2I) = its gradient given dh; zero where a clamp is active (a value
     * equal to a limit passes the gradient, as torch.clamp does). */
    void (*moe_clamped_swiglu_bwd)(ct_backend *be, void *dgu, const void *dh, const void *gu, int n,
                                   int I, float alpha, float limit);
    /* The router's backward: dlogits (T,E) act (overwritten) = d/dlogits of
     * sum_s dw[s] * w[s], through the rule's softmax/top-K (the selection itself
     * is piecewise constant), recomputed from logits and topk_idx/topk_w:
     *   SOFTMAX_TOPK:       dl_j = p_j (g_j - sum_k dw_k w_k), g_j = dw_k if j is choice k else 0
     *   SOFTMAX_TOPK_NORM,
     *   TOPK_SOFTMAX:       dl_j = w_k (dw_k - sum_m dw_m w_m) for j = choice k, else 0
     * aux (E) fp32 or NULL adds the load-balancing term p_j (aux_j - sum_e aux_e p_e),
     * the gradient of sum_e aux_e p_e with p = softmax over all E (moe_aux_loss). */
    void (*moe_route_bwd)(ct_backend *be, void *dlogits, const float *dw, const void *logits,
                          const int32_t *topk_idx, const float *topk_w, const float *aux,
                          int T, int E, int K, ct_moe_rule rule);
    /* prob_sum (E) fp32 += sum over t of softmax(logits[t]) (all E). */
    void (*moe_prob_sum)(ct_backend *be, float *prob_sum, const void *logits, int T, int E);
    /* The Switch load-balancing loss of HF's load_balancing_loss_func over the
     * n_layers sparse layers of one forward of T tokens (no padding): with
     * N = n_layers*T, c_e = sum_l counts[l*E + e] (experts chosen, K per token and
     * layer), P_e = sum_l prob_sum[l*E + e] / N:
     *   loss[0] += coef * E * sum_e (c_e / N) * P_e
     *   aux_grad (E) = coef * E * c_e / N^2 (overwritten; moe_route_bwd's aux, so that
     *   the counts, which have no gradient, act as constants). */
    void (*moe_aux_loss)(ct_backend *be, float *loss, float *aux_grad, const int32_t *counts,
                         const float *prob_sum, int n_layers, int T, int E, float coef);
    /* A shared expert's output scaled by a scalar gate per token (qwen3_5_moe):
     *   y[t, 0:H] += sigmoid(g[t]) * s[t, 0:H]
     * y (T,H) ldy, s (T,H) lds, g (T) with stride ldg, act. */
    void (*moe_shared_gate_fwd)(ct_backend *be, void *y, int ldy, const void *s, int lds, const void *g, int ldg,
                                int T, int H);
    /* Its backward given dy (T,H): ds (T,H) lds (overwritten) = sigmoid(g[t]) * dy[t];
     * dg (T) ldg (overwritten) = sigmoid(g) (1 - sigmoid(g)) * (dy[t] . s[t]) (fp32 dot). */
    void (*moe_shared_gate_bwd)(ct_backend *be, void *ds, int ldds, void *dg, int lddg, const void *dy, int lddy,
                                const void *s, int lds, const void *g, int ldg, int T, int H);


    /* ---- Gated DeltaNet (qwen3_5, qwen3_5_moe, qwen3_next) ---- */
    /* A GDN layer's causal conv1d + SiLU, its decay and write gates, the gated
     * delta rule, the gated RMSNorm of its output, and the sigmoid output gate
     * of a gated full-attention layer; each a forward and a backward to its
     * activation inputs (conv weights, A_log, dt_bias and norm weights are
     * frozen). Backward outputs are overwritten. Dimensions: C channels, W conv
     * width, Hk key heads, Hv value heads (a multiple of Hk: value head h uses
     * key head h / (Hv/Hk)), Dk and Dv their head dims. g, beta, their
     * gradients, A_log and dt_bias are fp32; conv and norm weights are weight
     * tensors. */
    /* Causal depthwise conv1d + SiLU over C channels, width W (1..8), per document:
     *   y[t,c] = silu( sum_{j=0}^{W-1} w[c*W + j] * x[t-(W-1-j), c] )
     * where the tap at distance d = W-1-j counts only when d <= pos[t] (pos = position
     * inside the document, restarting at 0 at each document start: taps before the
     * document's first token are zero). x (T,C) with row stride ldx, y (T,C) ldy, w (C,W)
     * (HF's conv1d.weight (C,1,W) squeezed); pos (T) int32 with 0 <= pos[t] <= t (asserted).
     * y must not alias x. */
    void (*gdn_conv_fwd)(ct_backend *be, void *y, int ldy, const void *x, int ldx, const void *w,
                         const int32_t *pos, int T, int C, int W);
    /* Its backward to the input (the conv weight is frozen): dx (T,C) overwritten,
     *   dx[t,c] = sum_d w[c*W + W-1-d] * dp[t+d, c],   dp = dy * silu'(pre-activation),
     * over the d in [0, W) for which the forward counted that tap: t + d < T and
     * d <= pos[t+d]. With positions that restart at 0 and count up by one inside a
     * document this is pos[t+d] == pos[t] + d: token t+d feeds from t only inside t's
     * document. dx must not alias dy or x. */
    void (*gdn_conv_bwd)(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, const void *x, int ldx,
                         const void *w, const int32_t *pos, int T, int C, int W);

    /* The gates, fp32: beta[t,h] = sigmoid(b[t,h]); g[t,h] = -exp(A_log[h]) * softplus(a[t,h] + dt_bias[h]),
     * softplus as torch's (x when x > 20, else log1p(exp(x))). a, b (T,Hv) with row strides; g, beta (T,Hv)
     * dense; A_log, dt_bias (Hv). g <= 0 always. */
    void (*gdn_gates_fwd)(ct_backend *be, float *g, float *beta, const void *a, int lda, const void *b,
                          int ldb, const float *A_log, const float *dt_bias, int T, int Hv);
    /* Backward: da, db (overwritten) from dg, dbeta (T,Hv) dense:
     *   da = dg * -exp(A_log) * softplus'(a + dt_bias)  (softplus' = 1 when x > 20, as torch, else sigmoid(x))
     *   db = dbeta * beta (1 - beta).
     * A_log and dt_bias are frozen. */
    void (*gdn_gates_bwd)(ct_backend *be, void *da, int ldda, void *db, int lddb, const float *dg,
                          const float *dbeta, const void *a, int lda, const void *b, int ldb,
                          const float *A_log, const float *dt_bias, int T, int Hv);

    /* The gated delta rule with q/k L2 norm inside, per document d (tokens [cu_seqlens[d], cu_seqlens[d+1]))
     * and value head h, whose key head is h / (Hv / Hk) (Hv a multiple of Hk):
     *   qn = q * rsqrt(sum(q^2) + 1e-6) * scale ; kn = k * rsqrt(sum(k^2) + 1e-6)
     *   S (Dk x Dv, fp32) = 0 at the document start; per token t:
     *   S = exp(g[t,h]) S ; u = beta[t,h] (v[t,h] - S^T kn) ; S += kn u^T ; o[t,h] = S^T qn
     * q, k (T,Hk,Dk) with token strides ldq, ldk; v (T,Hv,Dv) ldv; o (T,Hv,Dv) ldo; g, beta (T,Hv) dense.
     * scale is Dk^-1/2 in HF. cu_seqlens (n_docs+1) int32, nondecreasing from 0, cu_seqlens[n_docs] <= T
     * (T: the rows of the buffers, which bounds the work a backend plans without reading cu_seqlens).
     * Documents never share state. Tokens outside [0, cu_seqlens[n_docs]) are not touched.
     * o must not alias an input. The order per token is HF's torch_recurrent_gated_delta_rule's
     * (decay, read, write, output), which its chunked form computes too. */
    void (*gdn_delta_fwd)(ct_backend *be, void *o, int ldo, const void *q, int ldq, const void *k, int ldk,
                          const void *v, int ldv, const float *g, const float *beta, const int32_t *cu_seqlens,
                          int n_docs, int T, int Hk, int Hv, int Dk, int Dv, float scale);
    /* Its backward (recomputing what it needs; nothing saved by the forward): dq, dk, dv overwritten
     * (dq, dk summed over the Hv/Hk value heads of each key head), dg, dbeta (T,Hv) overwritten,
     * given dout (T,Hv,Dv) with token stride lddo. As in the forward, rows of tokens outside
     * [0, cu_seqlens[n_docs]) are not touched. Memory: per (document, value head) in flight, one
     * Dk x Dv state per 64 tokens of the longest document plus 65 states for the block being
     * reversed, and (T, Hv, Dk) fp32 twice for the per-value-head dq, dk before the sum over heads.
     * The outputs must not alias the inputs. */
    void (*gdn_delta_bwd)(ct_backend *be, void *dq, int lddq, void *dk, int lddk, void *dv, int lddv,
                          float *dg, float *dbeta, const void *dout, int lddo, const void *q, int ldq,
                          const void *k, int ldk, const void *v, int ldv, const float *g, const float *beta,
                          const int32_t *cu_seqlens, int n_docs, int T, int Hk, int Hv, int Dk, int Dv, float scale);

    /* Decoding steps (generate.c): the conv and the delta rule of T new tokens that continue one sequence,
     * its state carried in and out explicitly, both zero before the sequence's first token. NULL in a
     * backend without GDN decoding. Over a document fed in pieces they equal gdn_conv_fwd / gdn_delta_fwd
     * over the whole document, bit for bit.
     * Conv: state (W-1, C) act, dense, oldest row first: the inputs of the W-1 tokens before the first new
     * one. y[t,c] = silu( sum_j w[c*W + j] * r[t+j, c] ), r = [state rows ; x rows] (W-1+T rows); on return
     * state holds r's last W-1 rows. x (T,C) ldx, y (T,C) ldy; y must not alias x or state. */
    void (*gdn_conv_step)(ct_backend *be, void *y, int ldy, void *state, const void *x, int ldx, const void *w,
                          int T, int C, int W);
    /* Delta rule: S (Hv, Dk, Dv) fp32, per value head the state of gdn_delta_fwd, updated per token t in
     * order by gdn_delta_fwd's formulas (q/k L2 norm inside, scale on q); q, k, v, o, g, beta as there
     * (rows 0..T-1 of one document). o must not alias an input. */
    void (*gdn_delta_step)(ct_backend *be, void *o, int ldo, float *S, const void *q, int ldq, const void *k,
                           int ldk, const void *v, int ldv, const float *g, const float *beta, int T, int Hk,
                           int Hv, int Dk, int Dv, float scale);

    /* The gated RMSNorm of a GDN layer's output, rows r = (t, h) of D elements:
     *   y = w * (x * rsqrt(mean(x^2) + eps)) * silu(z)     (w not offset: HF initialises it to 1)
     * x, z, y (T, nh, D) with token strides (head stride D); w (D). y may alias x or z. */
    void (*gated_rmsnorm_fwd)(ct_backend *be, void *y, int ldy, const void *x, int ldx, const void *z, int ldz,
                              const void *w, int T, int nh, int D, float eps);
    /* Backward: dx, dz overwritten (w frozen). With n = x r, r = (mean(x^2) + eps)^-1/2 and
     * dn = dy w silu(z): dx = r dn - x r^3 / D * sum(dn x) ; dz = dy w n silu'(z).
     * dx and dz must not alias the inputs. */
    void (*gated_rmsnorm_bwd)(ct_backend *be, void *dx, int lddx, void *dz, int lddz, const void *dy, int lddy,
                              const void *x, int ldx, const void *z, int ldz, const void *w, int T, int nh,
                              int D, float eps);

    /* The output gate of a gated full-attention layer: y[t,h,:] = x[t,h,:] * sigmoid(gate[t,h,:]),
     * x, y (T,nh,D) with token strides ldx, ldy (head stride D); gate with token stride ldg and head stride hsg
     * (Qwen3.5's q_proj interleaves per head [query (D) | gate (D)], so hsg = 2D there). y may alias x. */
    void (*sigmoid_gate_fwd)(ct_backend *be, void *y, int ldy, const void *x, int ldx, const void *gate,
                             int ldg, int hsg, int T, int nh, int D);
    /* Backward: dx = dy sigmoid(gate) (may alias dy) and dgate = dy x sigmoid(gate) (1 - sigmoid(gate))
     * (same layout as gate, only its D gate elements per head written) overwritten. */
    void (*sigmoid_gate_bwd)(ct_backend *be, void *dx, int lddx, void *dgate, int lddg, const void *dy,
                             int lddy, const void *x, int ldx, const void *gate, int ldg, int hsg, int T,
                             int nh, int D);

    /* ---- optimizer (fp32) ---- */
    /* out[0] += sum(g^2) */
    void (*sum_squares)(ct_backend *be, float *out, const float *g, size_t n);
    /* torch.optim.AdamW step on n parameters, after clipping by the global norm:
     *   c = max_norm > 0 ? min(1, max_norm / (sqrt(norm_sq[0]) + 1e-6)) : 1 ; g = c * grad
     *   p *= 1 - lr * wd ; m = b1 m + (1-b1) g ; v = b2 v + (1-b2) g^2
     *   p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
     * norm_sq stays on the device (no host sync). When norm_sq[0] is not finite
     * the op does nothing: p, m and v keep their values (the step is skipped). */
    void (*adamw)(ct_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                  const float *norm_sq, float max_norm, float lr, float b1, float b2,
                  float eps, float wd, int step);
};

/* The CPU reference backend (never fails). */
ct_backend *backend_cpu_new(void);
/* The attention forward kernel a CUDA backend runs at head_dim 64, where two
 * kernels are kept (head_dim 32, 128 and 256 have one each and ignore the choice). */
typedef enum ct_attn_fwd_kernel {
    CT_ATTN_FWD_AUTO = 0, /* per call, by the documents' mean length (cuda/common/kernel_choice.cu) */
    CT_ATTN_FWD_WGMMA,    /* one warpgroup per 64 queries (cuda/attention/attention_fwd_sm90.cu) */
    CT_ATTN_FWD_TMA,      /* TMA producer, two consumer warpgroups per 128 queries (cuda/attention/attention_fwd_sm90_2wg.cu) */
} ct_attn_fwd_kernel;

/* Kernel choices of a CUDA backend, fixed when it is created. Zero is the
 * automatic choice, what train, eval and generate run; tests and benchmarks
 * force a kept kernel where more than one serves a call. */
typedef struct ct_cuda_options {
    ct_attn_fwd_kernel attn_fwd;
    int device; /* the CUDA device ordinal (a rank's LOCAL_RANK) */
} ct_cuda_options;

/* The CUDA backend with the kernels opt chooses (NULL: all automatic), or NULL
 * with a reason in err when no GPU is usable (or ctune was built without CUDA). */
ct_backend *backend_cuda_new_with(const ct_cuda_options *opt, ct_error *err);
/* backend_cuda_new_with(NULL, err). */
ct_backend *backend_cuda_new(ct_error *err);

#endif
