/* backend_cpu.c — the CPU reference backend: every op of backend.h in plain C
 * over fp32 (act and weight tensors are float, act_bytes = weight_bytes = 4).
 *
 * It is the oracle the CUDA kernels are checked against, so it favours clear,
 * exact arithmetic: reductions that decide a result (norms, log-sum-exp, the
 * loss, sums of squares) run in double; matrix products use cpu_sgemm (fp32,
 * backend_cpu_gemm.c); attention lives in backend_cpu_attention.c and the
 * mixture-of-experts ops in backend_cpu_moe.c.
 * OpenMP splits rows among threads, and every output element is computed by
 * one thread in a fixed order, so results do not depend on the thread count.
 *
 * "Device" memory is host memory and ops run synchronously, so download and
 * sync have nothing to wait for. Unlike the CUDA backend, a few ops (LoRA with
 * dropout, cross-entropy, sum_squares, the GEMM packing) allocate scratch per
 * call: on the CPU malloc is cheap next to the work, and the buffers then need
 * no capacity planning. */
#include "backend_cpu_internal.h"
#include "hooks.h"
#include "fp8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows of cross_entropy handled at once: the (CE_CHUNK, V) logits are the only
 * vocabulary-sized buffer (64 x 152k floats = 39 MB at the largest vocabularies). */
enum { CE_CHUNK = 64 };

/* Block size of sum_squares partial sums: fixed, so the order of the double
 * additions (hence the result) does not depend on the thread count. */
enum { SUMSQ_BLOCK = 4096 };

// ---- memory ----

static void *cpu_alloc(ct_backend *be, size_t bytes)
{
    /* 64-byte alignment keeps rows on cache lines; aligned_alloc wants a multiple. */
    size_t padded = (bytes + 63) & ~(size_t)63;
    if (padded < bytes) return NULL;
    void *p = aligned_alloc(64, padded ? padded : 64);
    if (p) memset(p, 0, padded);
    return p;
}

static void cpu_free(ct_backend *be, void *p) { free(p); }
static void cpu_zero(ct_backend *be, void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(ct_backend *be, void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void cpu_sync(ct_backend *be) {}


static void cpu_upload_weight(ct_backend *be, void *dst, const void *host_src, ct_dtype src_dtype, size_t n)
{
    float *d = dst;
    if (src_dtype == CT_DTYPE_F32) {
        memcpy(d, host_src, n * sizeof(float));
    } else if (src_dtype == CT_DTYPE_BF16 || src_dtype == CT_DTYPE_F16) {
        /* The mmap'd source need not be 2-byte aligned: read bytes. */
        const unsigned char *s = host_src;
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            d[i] = src_dtype == CT_DTYPE_BF16 ? ct_bf16_to_f32(h) : ct_f16_to_f32(h);
        }
    } else {
        CT_ASSERT(0, "upload_weight: unsupported source dtype %d", (int)src_dtype);
    }
}

static void cpu_act_from_f32(ct_backend *be, void *dst, const float *host_src, size_t n)
{
    memcpy(dst, host_src, n * sizeof(float));
}

static void cpu_act_to_f32(ct_backend *be, float *host_dst, const void *src, size_t n)
{
    memcpy(host_dst, src, n * sizeof(float));
}

static void cpu_destroy(ct_backend *be) { free(be); }

/* Activation offload: host memory is the CPU's memory, copies happen at once.
 * CTUNE_INJECT_PIN_FAIL=1 (hooks.h) reports the memory as not page-locked, so tests can
 * reach the fallback path (its warning) without a GPU. */
static void *cpu_host_alloc(ct_backend *be, size_t bytes, bool *pinned)
{
    *pinned = !hooks_get()->inject_pin_fail;
    return malloc(bytes ? bytes : 1);
}
static void cpu_host_free(ct_backend *be, void *p, bool pinned) { free(p); }
static void cpu_offload_copy(ct_backend *be, void *dst, const void *src, size_t bytes, int slot)
{
    CT_ASSERT(slot >= 0 && slot < CT_OFFLOAD_SLOTS, "offload slot %d out of range", slot);
    memcpy(dst, src, bytes);
}
static void cpu_upload_release(ct_backend *be, int slot) {}
static void cpu_upload_async(ct_backend *be, void *dst, const void *src, size_t bytes, int slot)
{
    CT_ASSERT(slot >= 0 && slot < CT_UPLOAD_SLOTS, "upload slot %d out of range", slot);
    memcpy(dst, src, bytes);
}
static void cpu_upload_wait(ct_backend *be, int slot) {}
static bool cpu_upload_host_wait(ct_backend *be, int slot) { return false; }
static void cpu_offload_wait(ct_backend *be, int slot)
{
    CT_ASSERT(slot >= 0 && slot < CT_OFFLOAD_SLOTS, "offload slot %d out of range", slot);
}

// ---- model ops ----

static void cpu_embedding(ct_backend *be, void *out, const int32_t *ids, const void *table, int T, int H)
{
    float *o = out;
    const float *w = table;
    for (int t = 0; t < T; t++)
        memcpy(o + (size_t)t * H, w + (size_t)ids[t] * H, (size_t)H * sizeof(float));
}

/* The norm's scale at i: w, or 1 + w in fp32 when zero-centred (HF's arithmetic). */
static inline float norm_scale(const float *w, int i, int zero_centred)
{
    return zero_centred ? 1.0f + w[i] : w[i];
}

static void cpu_rmsnorm_fwd(ct_backend *be, void *y, int ldy, float *rstd, const void *x, int ldx,
                            const void *w, int zero_centred, int T, int nh, int D, float eps)
{
    const float *wf = w;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            const float *xr = (const float *)x + (size_t)t * ldx + (size_t)h * D;
            float *yr = (float *)y + (size_t)t * ldy + (size_t)h * D;
            double ss = 0;
            for (int i = 0; i < D; i++) ss += (double)xr[i] * xr[i];
            float r = (float)(1.0 / sqrt(ss / D + eps));
            if (rstd) rstd[(size_t)t * nh + h] = r;
            for (int i = 0; i < D; i++) yr[i] = xr[i] * r * norm_scale(wf, i, zero_centred);
        }
    }
}

/* With y_i = x_i r w_i (w_i: the scale) and r = (mean(x^2) + eps)^-1/2:
 * dx_j = r w_j dy_j - x_j r^3 / D * sum_i dy_i w_i x_i. */
static void cpu_rmsnorm_bwd(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                            const void *x, int ldx, const float *rstd, const void *w, int zero_centred,
                            int T, int nh, int D, const void *dres, int lddres)
{
    const float *wf = w;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            const float *xr = (const float *)x + (size_t)t * ldx + (size_t)h * D;
            const float *dyr = (const float *)dy + (size_t)t * lddy + (size_t)h * D;
            float *dxr = (float *)dx + (size_t)t * lddx + (size_t)h * D;
            const float *rr = dres ? (const float *)dres + (size_t)t * lddres + (size_t)h * D : NULL;
            double r = rstd[(size_t)t * nh + h], dot = 0;
            for (int i = 0; i < D; i++) dot += (double)dyr[i] * norm_scale(wf, i, zero_centred) * xr[i];
            double c = dot * r * r * r / D;
            for (int i = 0; i < D; i++) {
                float g = (float)(r * norm_scale(wf, i, zero_centred) * dyr[i] - c * xr[i]);
                dxr[i] = rr ? rr[i] + g : g;
            }
        }
    }
}

static void cpu_linear_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx,
                           const void *W, const void *bias, int T, int in, int out, int accumulate)
{
    float *yf = y;
    cpu_sgemm(0, 1, T, out, in, 1.0f, x, ldx, W, in, accumulate ? 1.0f : 0.0f, yf, ldy);
    if (!bias) return;
    const float *b = bias;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int j = 0; j < out; j++) yf[(size_t)t * ldy + j] += b[j];
}

static void cpu_linear_fwd_residual(ct_backend *be, void *y, int ldy, const void *res, const void *x,
                                    int ldx, const void *W, const void *bias, int T, int in, int out)
{
    CT_ASSERT(res != y, "linear_fwd_residual: res must not alias y");
    for (int t = 0; t < T; t++)
        memcpy((float *)y + (size_t)t * ldy, (const float *)res + (size_t)t * ldy, (size_t)out * sizeof(float));
    cpu_linear_fwd(be, y, ldy, x, ldx, W, bias, T, in, out, 1);
}

static void cpu_linear_bwd_input(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                                 const void *W, int T, int in, int out, int accumulate)
{
    cpu_sgemm(0, 0, T, in, out, 1.0f, dy, lddy, W, in, accumulate ? 1.0f : 0.0f, dx, lddx);
}

static void cpu_dequant4(ct_backend *be, void *y, const uint8_t *codes, const void *scales, size_t n, int blocksize,
                         quant4_type type)
{
    (void)be;
    bool mx = type == QUANT4_MXFP4;
    CT_ASSERT(blocksize > 0 && n % (size_t)blocksize == 0 && (!mx || blocksize == QUANT4_MXFP4_BLOCKSIZE),
              "dequant4: n %zu, blocksize %d", n, blocksize);
    const float *code = quant4_code(type);
    float *out = y;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint8_t byte = codes[i / 2];
        uint8_t q = (i % 2 == 0) != mx ? byte >> 4 : byte & 0x0F; /* bnb: even high; MXFP4: even low */
        size_t b = i / (size_t)blocksize;
        float s = mx ? ldexpf(1.0f, (int)((const uint8_t *)scales)[b] - 127) : ((const float *)scales)[b];
        out[i] = code[q] * s;
    }
}

static void cpu_dequant_fp8(ct_backend *be, void *y, const uint8_t *q, const float *scale, size_t rows, size_t cols)
{
    (void)be;
    const float *code = fp8_e4m3_table();
    size_t ld = fp8_weight_scale_ld(cols);
    float *out = y;
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            out[r * cols + c] = code[q[r * cols + c]] * scale[(r / FP8_BLOCK) * ld + c / FP8_BLOCK];
}

/* Dropout multiplier of x[t, i]: 0 or 1/(1-p), from the counter-based hash so
 * that forward, backward and the CUDA backend draw the same mask. */
static inline float dropout_mult(uint64_t seed, int t, int in, int i, float p)
{
    return ct_hash_uniform(seed, (uint64_t)t * (uint64_t)in + (uint64_t)i) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

/* drop(x) as a dense (T, in) copy (caller frees), or x itself (ld unchanged)
 * when p == 0. */
static const float *lora_dropped_input(const float *x, int ldx, int *ld_out, int T, int in,
                                       float p, uint64_t seed, float **owned)
{
    *owned = NULL;
    *ld_out = ldx;
    if (p <= 0.0f) return x;
    float *xd = ct_malloc((size_t)T * in * sizeof(float));
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int i = 0; i < in; i++)
            xd[(size_t)t * in + i] = x[(size_t)t * ldx + i] * dropout_mult(seed, t, in, i, p);
    *owned = xd;
    *ld_out = in;
    return xd;
}

static void cpu_lora_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx,
                         const float *A, const float *B, int T, int in, int out, int R,
                         float scale, float dropout_p, uint64_t dropout_seed, void *u_keep, int ldu)
{
    float *owned;
    int ldxd;
    const float *xd = lora_dropped_input(x, ldx, &ldxd, T, in, dropout_p, dropout_seed, &owned);
    float *u = u_keep ? u_keep : ct_malloc((size_t)T * R * sizeof(float));
    int ld = u_keep ? ldu : R;
    cpu_sgemm(0, 1, T, R, in, 1.0f, xd, ldxd, A, in, 0.0f, u, ld);
    cpu_sgemm(0, 1, T, out, R, scale, u, ld, B, R, 1.0f, y, ldy);
    if (!u_keep) free(u);
    free(owned);
}

static void cpu_lora_bwd(ct_backend *be, void *dx, int lddx, float *dA, float *dB,
                         const void *dy, int lddy, const void *x, int ldx,
                         const float *A, const float *B, int T, int in, int out, int R,
                         float scale, float dropout_p, uint64_t dropout_seed, const void *u_kept, int ldu)
{
    float *owned;
    int ldxd;
    const float *xd = lora_dropped_input(x, ldx, &ldxd, T, in, dropout_p, dropout_seed, &owned);
    float *u_own = NULL;
    const float *u = u_kept;
    int ld = ldu;
    if (!u_kept) { /* u = drop(x) A^T */
        u = u_own = ct_malloc((size_t)T * R * sizeof(float));
        ld = R;
        cpu_sgemm(0, 1, T, R, in, 1.0f, xd, ldxd, A, in, 0.0f, u_own, R);
    }
    float *g = ct_malloc((size_t)T * R * sizeof(float));
    cpu_sgemm(0, 0, T, R, out, 1.0f, dy, lddy, B, R, 0.0f, g, R);    /* g = dy B */
    cpu_sgemm(1, 0, out, R, T, scale, dy, lddy, u, ld, 1.0f, dB, R); /* dB += s dy^T u */
    cpu_sgemm(1, 0, R, in, T, scale, g, R, xd, ldxd, 1.0f, dA, in);  /* dA += s g^T drop(x) */
    free(owned);
    free(u_own);
    if (dx && dropout_p <= 0.0f) {
        cpu_sgemm(0, 0, T, in, R, scale, g, R, A, in, 1.0f, dx, lddx);
    } else if (dx) {
        /* drop' needs g A whole before masking: go through a (T, in) buffer. */
        float *gA = ct_malloc((size_t)T * in * sizeof(float));
        cpu_sgemm(0, 0, T, in, R, scale, g, R, A, in, 0.0f, gA, in);
        float *dxf = dx;
        #pragma omp parallel for schedule(static)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < in; i++)
                dxf[(size_t)t * lddx + i] += gA[(size_t)t * in + i] * dropout_mult(dropout_seed, t, in, i, dropout_p);
        free(gA);
    }
    free(g);
}

/* The modules one after another: the sequence lora_fwd_cols / lora_bwd_cols are defined as. */
static void cpu_lora_fwd_cols(ct_backend *be, void *y, int ldy, const void *x, int ldx, int T, int in,
                              const ct_lora_cols *lora, int n_lora, int R, float scale, void *u, int ldu)
{
    for (int q = 0; q < n_lora; q++)
        cpu_lora_fwd(be, (float *)y + lora[q].col0, ldy, x, ldx, lora[q].A, lora[q].B, T, in, lora[q].cols, R,
                     scale, 0.0f, 0, u ? (float *)u + q * R : NULL, ldu);
}

static void cpu_lora_bwd_cols(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, const void *x,
                              int ldx, int T, int in, const ct_lora_cols *lora, int n_lora, int R, float scale,
                              const void *u, int ldu)
{
    for (int q = 0; q < n_lora; q++)
        cpu_lora_bwd(be, dx, lddx, lora[q].dA, lora[q].dB, (const float *)dy + lora[q].col0, lddy, x, ldx,
                     lora[q].A, lora[q].B, T, in, lora[q].cols, R, scale, 0.0f, 0,
                     u ? (const float *)u + q * R : NULL, ldu);
}

static void cpu_rope(ct_backend *be, void *x, int ldx, const int32_t *pos, const float *inv_freq,
                     int T, int nh, int D, int rot_dim, float attn_scaling, int inverse)
{
    CT_ASSERT(rot_dim % 2 == 0 && rot_dim <= D, "rope: rot_dim %d must be even and <= D %d", rot_dim, D);
    int half = rot_dim / 2;
    /* The transpose of [[c, -s], [s, c]] is the same matrix with -s. */
    float sign = inverse ? -1.0f : 1.0f;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            /* The angle is rounded to fp32 as HF does (pos * inv_freq in fp32). */
            float angle = (float)pos[t] * inv_freq[i];
            float c = (float)cos((double)angle) * attn_scaling;
            float s = sign * (float)sin((double)angle) * attn_scaling;
            for (int h = 0; h < nh; h++) {
                float *xr = (float *)x + (size_t)t * ldx + (size_t)h * D;
                float a = xr[i], b = xr[i + half];
                xr[i] = a * c - b * s;
                xr[i + half] = b * c + a * s;
            }
        }
    }
}

/* The oracle composes the two ops: in fp32 nothing is rounded in between. */
static void cpu_rmsnorm_rope_fwd(ct_backend *be, void *y, int ldy, float *rstd, const void *x, int ldx,
                                 const void *w, int zero_centred, const int32_t *pos, const float *inv_freq,
                                 int T, int nh, int D, int rot_dim, float eps, float attn_scaling)
{
    cpu_rmsnorm_fwd(be, y, ldy, rstd, x, ldx, w, zero_centred, T, nh, D, eps);
    cpu_rope(be, y, ldy, pos, inv_freq, T, nh, D, rot_dim, attn_scaling, 0);
}

static void cpu_rmsnorm_rope_bwd(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                                 const void *x, int ldx, const float *rstd, const void *w, int zero_centred,
                                 const int32_t *pos, const float *inv_freq,
                                 int T, int nh, int D, int rot_dim, float attn_scaling)
{
    size_t row = (size_t)nh * D;
    float *g = ct_malloc((size_t)T * row * sizeof(float) + 1);
    for (int t = 0; t < T; t++)
        memcpy(g + (size_t)t * row, (const float *)dy + (size_t)t * lddy, row * sizeof(float));
    cpu_rope(be, g, (int)row, pos, inv_freq, T, nh, D, rot_dim, attn_scaling, 1);
    cpu_rmsnorm_bwd(be, dx, lddx, g, (int)row, x, ldx, rstd, w, zero_centred, T, nh, D, NULL, 0);
    free(g);
}

static void cpu_swiglu_fwd(ct_backend *be, void *h, const void *gu, int T, int I)
{
    float *hf = h;
    const float *g = gu;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const float *gr = g + (size_t)t * 2 * I, *ur = gr + I;
        for (int i = 0; i < I; i++) {
            float sig = 1.0f / (1.0f + expf(-gr[i]));
            hf[(size_t)t * I + i] = gr[i] * sig * ur[i];
        }
    }
}

/* d silu(g)/dg = sig(g) (1 + g (1 - sig(g))). */
static void cpu_swiglu_bwd(ct_backend *be, void *dgu, const void *dh, const void *gu, int T, int I)
{
    float *d = dgu;
    const float *dhf = dh, *g = gu;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const float *gr = g + (size_t)t * 2 * I, *ur = gr + I, *dhr = dhf + (size_t)t * I;
        float *dg = d + (size_t)t * 2 * I, *du = dg + I;
        for (int i = 0; i < I; i++) {
            float sig = 1.0f / (1.0f + expf(-gr[i]));
            dg[i] = dhr[i] * ur[i] * sig * (1.0f + gr[i] * (1.0f - sig));
            du[i] = dhr[i] * gr[i] * sig;
        }
    }
}

static void cpu_add(ct_backend *be, void *y, const void *x, size_t n)
{
    float *yf = y;
    const float *xf = x;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) yf[i] += xf[i];
}

static void cpu_copy_2d(ct_backend *be, void *dst, int lddst, const void *src, int ldsrc, int rows, int cols)
{
    for (int r = 0; r < rows; r++)
        memcpy((float *)dst + (size_t)r * lddst, (const float *)src + (size_t)r * ldsrc,
               (size_t)cols * sizeof(float));
}

static void cpu_cross_entropy(ct_backend *be, float *loss_sum, void *dx, const void *x, const void *W,
                              const int32_t *rows, const int32_t *targets, int n, int H, int V,
                              float grad_scale)
{
    const float *xf = x;
    float *dxf = dx;
    size_t chunk_rows = n < CE_CHUNK ? (size_t)n : CE_CHUNK;
    float *xc = ct_malloc(chunk_rows * H * sizeof(float));
    float *logits = ct_malloc(chunk_rows * V * sizeof(float));
    double loss = 0, row_loss[CE_CHUNK];
    for (int c0 = 0; c0 < n; c0 += CE_CHUNK) {
        int nc = n - c0 < CE_CHUNK ? n - c0 : CE_CHUNK;
        for (int i = 0; i < nc; i++) {
            CT_ASSERT(targets[c0 + i] >= 0 && targets[c0 + i] < V,
                      "cross_entropy: target %d outside vocab %d", targets[c0 + i], V);
            memcpy(xc + (size_t)i * H, xf + (size_t)rows[c0 + i] * H, (size_t)H * sizeof(float));
        }
        cpu_sgemm(0, 1, nc, V, H, 1.0f, xc, H, W, H, 0.0f, logits, V);
        #pragma omp parallel for schedule(static)
        for (int i = 0; i < nc; i++) {
            float *l = logits + (size_t)i * V;
            float mx = l[0];
            for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
            double se = 0;
            for (int j = 0; j < V; j++) se += exp((double)l[j] - mx);
            double lse = mx + log(se);
            row_loss[i] = lse - l[targets[c0 + i]];
            if (dxf) {
                for (int j = 0; j < V; j++) l[j] = grad_scale * (float)exp((double)l[j] - lse);
                l[targets[c0 + i]] -= grad_scale;
            }
        }
        /* Summed in row order, not by an OpenMP reduction: thread-count independent. */
        for (int i = 0; i < nc; i++) loss += row_loss[i];
        if (dxf) {
            cpu_sgemm(0, 0, nc, H, V, 1.0f, logits, V, W, H, 0.0f, xc, H);
            for (int i = 0; i < nc; i++)
                memcpy(dxf + (size_t)rows[c0 + i] * H, xc + (size_t)i * H, (size_t)H * sizeof(float));
        }
    }
    loss_sum[0] += (float)loss;
    free(xc);
    free(logits);
}

// ---- optimizer ----

static void cpu_sum_squares(ct_backend *be, float *out, const float *g, size_t n)
{
    size_t nb = ct_ceil_div(n, SUMSQ_BLOCK);
    double *part = ct_calloc(nb ? nb : 1, sizeof(double));
    #pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t end = (b + 1) * SUMSQ_BLOCK < n ? (b + 1) * SUMSQ_BLOCK : n;
        double s = 0;
        for (size_t i = b * SUMSQ_BLOCK; i < end; i++) s += (double)g[i] * g[i];
        part[b] = s;
    }
    double total = 0;
    for (size_t b = 0; b < nb; b++) total += part[b];
    out[0] += (float)total;
    free(part);
}

/* Mirrors torch.nn.utils.clip_grad_norm_ (fp32 coefficient, clamped at 1) then
 * torch.optim.AdamW's single-tensor path: bias corrections in double, as torch
 * computes them from a Python float step, and element math in fp32. */
static void cpu_adamw(ct_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                      const float *norm_sq, float max_norm, float lr, float b1, float b2,
                      float eps, float wd, int step)
{
    CT_ASSERT(step >= 1, "adamw: step must start at 1, got %d", step);
    if (!isfinite(norm_sq[0])) return; /* a NaN/inf gradient: skip the step (optim.h's guard) */
    float clip = 1.0f;
    if (max_norm > 0) {
        float c = max_norm / (sqrtf(norm_sq[0]) + 1e-6f);
        clip = c < 1.0f ? c : 1.0f;
    }
    float decay = (float)(1.0 - (double)lr * wd);
    float step_size = (float)(lr / (1.0 - pow(b1, step)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(b2, step));
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = clip * grad[i];
        p[i] *= decay;
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

ct_backend *backend_cpu_new(void)
{
    ct_backend *be = ct_calloc(1, sizeof *be);
    be->name = "cpu";
    be->act_bytes = sizeof(float);
    be->weight_bytes = sizeof(float);
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->zero = cpu_zero;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->upload_weight = cpu_upload_weight;
    be->act_from_f32 = cpu_act_from_f32;
    be->act_to_f32 = cpu_act_to_f32;
    be->sync = cpu_sync;
    be->destroy = cpu_destroy;
    be->host_alloc = cpu_host_alloc;
    be->host_free = cpu_host_free;
    be->offload_store = cpu_offload_copy;
    be->offload_load = cpu_offload_copy;
    be->offload_wait = cpu_offload_wait;
    be->upload_release = cpu_upload_release;
    be->upload_async = cpu_upload_async;
    be->upload_wait = cpu_upload_wait;
    be->upload_host_wait = cpu_upload_host_wait;
    be->embedding = cpu_embedding;
    be->rmsnorm_fwd = cpu_rmsnorm_fwd;
    be->rmsnorm_bwd = cpu_rmsnorm_bwd;
    be->linear_fwd = cpu_linear_fwd;
    be->linear_fwd_residual = cpu_linear_fwd_residual;
    be->linear_bwd_input = cpu_linear_bwd_input;
    be->dequant4 = cpu_dequant4;
    be->dequant_fp8 = cpu_dequant_fp8;
    be->lora_fwd = cpu_lora_fwd;
    be->lora_bwd = cpu_lora_bwd;
    be->lora_fwd_cols = cpu_lora_fwd_cols;
    be->lora_bwd_cols = cpu_lora_bwd_cols;
    be->rope = cpu_rope;
    be->rmsnorm_rope_fwd = cpu_rmsnorm_rope_fwd;
    be->rmsnorm_rope_bwd = cpu_rmsnorm_rope_bwd;
    be->attention_fwd = cpu_attention_fwd;
    be->attention_bwd = cpu_attention_bwd;
    be->attention_decode = cpu_attention_decode;
    be->swiglu_fwd = cpu_swiglu_fwd;
    be->swiglu_bwd = cpu_swiglu_bwd;
    be->add = cpu_add;
    be->copy_2d = cpu_copy_2d;
    be->cross_entropy = cpu_cross_entropy;
    be->sum_squares = cpu_sum_squares;
    be->adamw = cpu_adamw;
    cpu_moe_install(be);
    cpu_gdn_install(be);
    return be;
}
