/* backend_cpu_moe.c — the mixture-of-experts ops of the CPU reference backend
 * (contracts: the "mixture of experts" section of backend.h).
 *
 * Routing is computed the way HF transformers computes it, in fp32, with the
 * softmax sums in double: qwen3_moe and mixtral rank experts by the softmax
 * probabilities (not the logits), so a tie between probabilities that differ as
 * logits is a tie here too; gpt_oss ranks the logits. Top-K is a selection scan
 * with a strict '>' over ascending expert index, which gives ties to the lower
 * index. E is small (<= a few hundred), so O(K*E) per token is nothing.
 *
 * Counting, scan and permutation run on one thread: they are O(T*K) integer
 * work and must be stable. The grouped GEMM and the expert LoRA call the dense
 * ops once per expert on that expert's contiguous rows, reading the row ranges
 * from offsets (with gather, the expert's token rows are first copied into a
 * dense buffer: the GPU fuses that copy into its loads, the oracle spells it
 * out). A row's result depends only on that row (cpu_sgemm sums each element in
 * a fixed order, whatever the stride), so routing other tokens elsewhere never
 * changes it: packed batches equal documents run one by one, bit for bit. */
#include "backend_cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* p[0..E) = softmax(l) rounded to fp32, with the max and the sum in double. */
static void softmax_row(float *p, const float *l, int E)
{
    float mx = l[0];
    for (int j = 1; j < E; j++) mx = l[j] > mx ? l[j] : mx;
    double s = 0;
    for (int j = 0; j < E; j++) s += exp((double)l[j] - mx);
    for (int j = 0; j < E; j++) p[j] = (float)(exp((double)l[j] - mx) / s);
}

/* The K largest keys, in decreasing order, ties to the lower index. */
static void top_k(int32_t *idx, const float *key, int E, int K)
{
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int j = 0; j < E; j++) {
            bool taken = false;
            for (int m = 0; m < k && !taken; m++) taken = idx[m] == j;
            if (!taken && (best < 0 || key[j] > key[best])) best = j;
        }
        idx[k] = best;
    }
}

static void cpu_moe_route(ct_backend *be, int32_t *topk_idx, float *topk_w, const void *logits,
                          int T, int E, int K, ct_moe_rule rule)
{
    CT_ASSERT(K >= 1 && K <= E, "moe_route: K = %d must be in [1, E = %d]", K, E);
    #pragma omp parallel
    {
        float *p = ct_malloc((size_t)E * sizeof(float));
        #pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            const float *l = (const float *)logits + (size_t)t * E;
            int32_t *idx = topk_idx + (size_t)t * K;
            float *w = topk_w + (size_t)t * K;
            if (rule == CT_MOE_TOPK_SOFTMAX) {
                top_k(idx, l, E, K);
                double s = 0; /* idx[0] holds the largest logit */
                for (int k = 0; k < K; k++) s += exp((double)l[idx[k]] - l[idx[0]]);
                for (int k = 0; k < K; k++) w[k] = (float)(exp((double)l[idx[k]] - l[idx[0]]) / s);
                continue;
            }
            softmax_row(p, l, E);
            top_k(idx, p, E, K);
            for (int k = 0; k < K; k++) w[k] = p[idx[k]];
            if (rule == CT_MOE_SOFTMAX_TOPK_NORM) {
                float s = 0; /* fp32, as torch sums the fp32 top-K weights */
                for (int k = 0; k < K; k++) s += w[k];
                for (int k = 0; k < K; k++) w[k] /= s;
            }
        }
        free(p);
    }
}

static void cpu_moe_count(ct_backend *be, int32_t *counts, const int32_t *idx, int n, int E)
{
    memset(counts, 0, (size_t)E * sizeof(int32_t));
    for (int s = 0; s < n; s++) {
        CT_ASSERT(idx[s] >= 0 && idx[s] < E, "moe_count: expert %d of slot %d outside [0, %d)", idx[s], s, E);
        counts[idx[s]]++;
    }
}

static void cpu_moe_offsets(ct_backend *be, int32_t *offsets, const int32_t *counts, int E)
{
    offsets[0] = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
}

static void cpu_moe_permute(ct_backend *be, int32_t *row_slot, int32_t *slot_row, const int32_t *idx,
                            const int32_t *offsets, int n, int E)
{
    int32_t *cursor = ct_malloc((size_t)E * sizeof(int32_t));
    memcpy(cursor, offsets, (size_t)E * sizeof(int32_t));
    for (int s = 0; s < n; s++) { /* ascending s: stable within each expert */
        int32_t r = cursor[idx[s]]++;
        row_slot[r] = s;
        slot_row[s] = r;
    }
    free(cursor);
}

static void cpu_moe_gather(ct_backend *be, void *xe, const void *x, int ldx, const int32_t *row_slot,
                           int T, int K, int H)
{
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < T * K; r++)
        memcpy((float *)xe + (size_t)r * H, (const float *)x + (size_t)(row_slot[r] / K) * ldx,
               (size_t)H * sizeof(float));
}

static void cpu_moe_scatter(ct_backend *be, void *y, int ldy, const void *ye, const int32_t *slot_row,
                            const float *w, int T, int K, int H, const void *res, int ldres)
{
    const float *yef = ye;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *yr = (float *)y + (size_t)t * ldy;
        const float *rr = res ? (const float *)res + (size_t)t * ldres : NULL;
        for (int h = 0; h < H; h++) {
            float acc = 0;
            for (int k = 0; k < K; k++) {
                int s = t * K + k;
                acc += (w ? w[s] : 1.0f) * yef[(size_t)slot_row[s] * H + h];
            }
            yr[h] = rr ? rr[h] + acc : acc;
        }
    }
}

static void cpu_moe_scatter_bwd(ct_backend *be, void *dye, float *dw, const void *dy, int lddy,
                                const void *ye, const void *bias, const int32_t *idx, const int32_t *row_slot,
                                const int32_t *slot_row, const float *w, int T, int K, int H)
{
    const float *dyf = dy, *yef = ye, *bf = bias;
    int n = T * K;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
        int s = row_slot[r];
        const float *d = dyf + (size_t)(s / K) * lddy;
        float *o = (float *)dye + (size_t)r * H;
        for (int h = 0; h < H; h++) o[h] = w[s] * d[h];
    }
    #pragma omp parallel for schedule(static)
    for (int s = 0; s < n; s++) {
        const float *d = dyf + (size_t)(s / K) * lddy;
        const float *v = yef ? yef + (size_t)slot_row[s] * H : bf ? bf + (size_t)idx[s] * H : NULL;
        double dot = 0;
        for (int h = 0; v && h < H; h++) dot += (double)d[h] * v[h];
        dw[s] = (float)dot;
    }
}

static void cpu_moe_weight_grad(ct_backend *be, float *dw, const void *dh, const void *h, const float *w,
                                const int32_t *row_slot, int n, int I)
{
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
        int s = row_slot[r];
        if (w[s] == 0.0f) continue;
        const float *a = (const float *)dh + (size_t)r * I, *b = (const float *)h + (size_t)r * I;
        double dot = 0;
        for (int i = 0; i < I; i++) dot += (double)a[i] * b[i];
        dw[s] += (float)(dot / w[s]);
    }
}

/* The input rows of expert e (rows r0 .. r0+rows-1): x itself (stride ldx) without
 * gather, else the token rows x[gather[r] / K] copied into buf (stride in). */
static const float *expert_rows(float *buf, int *ld, const void *x, int ldx, const int32_t *gather, int K,
                                int r0, int rows, int in)
{
    if (!gather) {
        *ld = ldx;
        return (const float *)x + (size_t)r0 * ldx;
    }
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        memcpy(buf + (size_t)r * in, (const float *)x + (size_t)(gather[r0 + r] / K) * ldx, (size_t)in * sizeof(float));
    *ld = in;
    return buf;
}

/* The staging buffer expert_rows needs: the largest expert's rows (NULL without gather). */
static float *expert_rows_buf(const int32_t *gather, const int32_t *offsets, int E, int in)
{
    if (!gather) return NULL;
    int most = 0;
    for (int e = 0; e < E; e++) most = offsets[e + 1] - offsets[e] > most ? offsets[e + 1] - offsets[e] : most;
    return ct_malloc(((size_t)most * in + 1) * sizeof(float));
}

static void cpu_moe_linear_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const int32_t *gather,
                               int K, const void *W, const void *bias, const int32_t *offsets, int E, int in, int out,
                               int accumulate)
{
    float *buf = expert_rows_buf(gather, offsets, E, in);
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], rows = offsets[e + 1] - offsets[e], ld;
        if (rows <= 0) continue;
        const float *xr = expert_rows(buf, &ld, x, ldx, gather, K, r0, rows, in);
        be->linear_fwd(be, (float *)y + (size_t)r0 * ldy, ldy, xr, ld, (const float *)W + (size_t)e * out * in,
                       bias ? (const float *)bias + (size_t)e * out : NULL, rows, in, out, accumulate);
    }
    free(buf);
}

static void cpu_moe_linear_bwd_input(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                                     const void *W, const int32_t *offsets, int E, int in, int out, int accumulate)
{
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], rows = offsets[e + 1] - offsets[e];
        if (rows <= 0) continue;
        be->linear_bwd_input(be, (float *)dx + (size_t)r0 * lddx, lddx, (const float *)dy + (size_t)r0 * lddy, lddy,
                             (const float *)W + (size_t)e * out * in, rows, in, out, accumulate);
    }
}

static void cpu_moe_lora_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const int32_t *gather, int K,
                             const float *A, const float *B, const int32_t *offsets, int E, int in, int out,
                             int R, float scale, float dropout_p, uint64_t dropout_seed)
{
    float *buf = expert_rows_buf(gather, offsets, E, in);
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], rows = offsets[e + 1] - offsets[e], ld;
        if (rows <= 0) continue;
        const float *xr = expert_rows(buf, &ld, x, ldx, gather, K, r0, rows, in);
        be->lora_fwd(be, (float *)y + (size_t)r0 * ldy, ldy, xr, ld, A + (size_t)e * R * in, B + (size_t)e * out * R,
                     rows, in, out, R, scale, dropout_p, ct_hash64(dropout_seed, (uint64_t)e), NULL, 0);
    }
    free(buf);
}

static void cpu_moe_lora_bwd(ct_backend *be, void *dx, int lddx, float *dA, float *dB,
                             const void *dy, int lddy, const void *x, int ldx, const int32_t *gather, int K,
                             const float *A, const float *B, const int32_t *offsets, int E, int in, int out, int R,
                             float scale, float dropout_p, uint64_t dropout_seed)
{
    float *buf = expert_rows_buf(gather, offsets, E, in);
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], rows = offsets[e + 1] - offsets[e], ld;
        if (rows <= 0) continue;
        const float *xr = expert_rows(buf, &ld, x, ldx, gather, K, r0, rows, in);
        be->lora_bwd(be, dx ? (float *)dx + (size_t)r0 * lddx : NULL, lddx, dA + (size_t)e * R * in,
                     dB + (size_t)e * out * R, (const float *)dy + (size_t)r0 * lddy, lddy, xr, ld,
                     A + (size_t)e * R * in, B + (size_t)e * out * R, rows, in, out, R, scale, dropout_p,
                     ct_hash64(dropout_seed, (uint64_t)e), NULL, 0);
    }
    free(buf);
}

/* The sequence the op stands for, spelled out: the GEMM, then each module's LoRA;
 * u (if asked for) per expert with lora_fwd's own product, u = x A^T. */
static bool cpu_moe_linear_lora_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const int32_t *gather,
                                    int K, const void *W, const void *bias, const int32_t *offsets, int E, int in,
                                    int out, int accumulate, const ct_lora_cols *lora, int n_lora, int R,
                                    float scale, void *u, int ldu)
{
    be->moe_linear_fwd(be, y, ldy, x, ldx, gather, K, W, bias, offsets, E, in, out, accumulate);
    for (int q = 0; q < n_lora; q++)
        be->moe_lora_fwd(be, (float *)y + lora[q].col0, ldy, x, ldx, gather, K, lora[q].A, lora[q].B, offsets, E, in,
                         lora[q].cols, R, scale, 0.0f, 0);
    if (!u) return false;
    CT_ASSERT(ldu >= n_lora * R, "moe_linear_lora_fwd: ldu %d < %d ranks", ldu, n_lora * R);
    float *buf = expert_rows_buf(gather, offsets, E, in);
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], rows = offsets[e + 1] - offsets[e], ld;
        if (rows <= 0) continue;
        const float *xr = expert_rows(buf, &ld, x, ldx, gather, K, r0, rows, in);
        for (int q = 0; q < n_lora; q++)
            cpu_sgemm(0, 1, rows, R, in, 1.0f, xr, ld, lora[q].A + (size_t)e * R * in, in, 0.0f,
                      (float *)u + (size_t)r0 * ldu + q * R, ldu);
    }
    free(buf);
    return true;
}

/* The sequence the op stands for: each module's LoRA backward on its columns (g,
 * when given, is not read: lora_bwd recomputes the same product). */
static void cpu_moe_lora_bwd_cols(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, int out,
                                  const void *x, int ldx, const int32_t *gather, int K, const int32_t *offsets, int E,
                                  int in, const ct_lora_cols *lora, int n_lora, int R, float scale, const void *g,
                                  int ldg, const void *u, int ldu)
{
    (void)out, (void)u, (void)ldu, (void)ldg; /* u is recomputed: lora_bwd's product is the forward's */
    CT_ASSERT(!g || !dx, "moe_lora_bwd_cols: g needs dx NULL");
    for (int q = 0; q < n_lora; q++)
        be->moe_lora_bwd(be, dx, lddx, lora[q].dA, lora[q].dB, (const float *)dy + lora[q].col0, lddy, x, ldx, gather,
                         K, lora[q].A, lora[q].B, offsets, E, in, lora[q].cols, R, scale, 0.0f, 0);
}

/* The GEMM, then per module g = dy_q B_q,e into its columns of g and its term as
 * lora_bwd adds it (the same sgemms). */
static void cpu_moe_linear_lora_bwd_input(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                                          const void *W, const int32_t *offsets, int E, int in, int out,
                                          int accumulate, void *g, int ldg, const ct_lora_cols *lora,
                                          int n_lora, int R, float scale)
{
    CT_ASSERT(g && ldg >= n_lora * R, "moe_linear_lora_bwd_input: g needs ldg >= %d", n_lora * R);
    be->moe_linear_bwd_input(be, dx, lddx, dy, lddy, W, offsets, E, in, out, accumulate);
    for (int q = 0; q < n_lora; q++)
        for (int e = 0; e < E; e++) {
            int r0 = offsets[e], rows = offsets[e + 1] - offsets[e];
            if (rows <= 0) continue;
            float *gq = (float *)g + (size_t)r0 * ldg + q * R;
            cpu_sgemm(0, 0, rows, R, lora[q].cols, 1.0f, (const float *)dy + (size_t)r0 * lddy + lora[q].col0, lddy,
                      lora[q].B + (size_t)e * lora[q].cols * R, R, 0.0f, gq, ldg);
            cpu_sgemm(0, 0, rows, in, R, scale, gq, ldg, lora[q].A + (size_t)e * R * in, in, 1.0f,
                      (float *)dx + (size_t)r0 * lddx, lddx);
        }
}

static void cpu_moe_clamped_swiglu_fwd(ct_backend *be, void *h, const void *gu, int n, int I,
                                       float alpha, float limit)
{
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
        const float *row = (const float *)gu + (size_t)r * 2 * I;
        float *hr = (float *)h + (size_t)r * I;
        for (int i = 0; i < I; i++) {
            float g = fminf(row[2 * i], limit), u = fminf(fmaxf(row[2 * i + 1], -limit), limit);
            hr[i] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
        }
    }
}

/* With sg = sigmoid(alpha g): d(g sg)/dg = sg + alpha g sg (1 - sg). */
static void cpu_moe_clamped_swiglu_bwd(ct_backend *be, void *dgu, const void *dh, const void *gu, int n,
                                       int I, float alpha, float limit)
{
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < n; r++) {
        const float *row = (const float *)gu + (size_t)r * 2 * I, *dhr = (const float *)dh + (size_t)r * I;
        float *d = (float *)dgu + (size_t)r * 2 * I;
        for (int i = 0; i < I; i++) {
            float graw = row[2 * i], uraw = row[2 * i + 1];
            float g = fminf(graw, limit), u = fminf(fmaxf(uraw, -limit), limit);
            float sg = 1.0f / (1.0f + expf(-alpha * g));
            d[2 * i] = graw <= limit ? dhr[i] * (u + 1.0f) * (sg + alpha * g * sg * (1.0f - sg)) : 0.0f;
            d[2 * i + 1] = uraw >= -limit && uraw <= limit ? dhr[i] * g * sg : 0.0f;
        }
    }
}

/* The sequence the op stands for: the activation's backward, the activation
 * itself again (the forward's function), moe_weight_grad. */
static void cpu_moe_act_bwd(ct_backend *be, void *dgu, float *dw, const void *dh, const void *gu, const float *w,
                            const int32_t *row_slot, int n, int I, int clamped, float alpha, float limit)
{
    float *h = ct_malloc(((size_t)n * I + 1) * sizeof(float));
    if (clamped) {
        be->moe_clamped_swiglu_bwd(be, dgu, dh, gu, n, I, alpha, limit);
        be->moe_clamped_swiglu_fwd(be, h, gu, n, I, alpha, limit);
    } else {
        be->swiglu_bwd(be, dgu, dh, gu, n, I);
        be->swiglu_fwd(be, h, gu, n, I);
    }
    be->moe_weight_grad(be, dw, dh, h, w, row_slot, n, I);
    free(h);
}

static void cpu_moe_route_bwd(ct_backend *be, void *dlogits, const float *dw, const void *logits,
                              const int32_t *topk_idx, const float *topk_w, const float *aux,
                              int T, int E, int K, ct_moe_rule rule)
{
    #pragma omp parallel
    {
        float *p = ct_malloc((size_t)E * sizeof(float));
        #pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            const float *l = (const float *)logits + (size_t)t * E;
            const int32_t *idx = topk_idx + (size_t)t * K;
            const float *w = topk_w + (size_t)t * K, *g = dw + (size_t)t * K;
            float *dl = (float *)dlogits + (size_t)t * E;
            double c = 0;
            for (int k = 0; k < K; k++) c += (double)g[k] * w[k];
            bool need_p = rule == CT_MOE_SOFTMAX_TOPK || aux;
            if (need_p) softmax_row(p, l, E);
            if (rule == CT_MOE_SOFTMAX_TOPK) {
                for (int j = 0; j < E; j++) dl[j] = (float)(-p[j] * c);
                for (int k = 0; k < K; k++) dl[idx[k]] += p[idx[k]] * g[k];
            } else {
                memset(dl, 0, (size_t)E * sizeof(float));
                for (int k = 0; k < K; k++) dl[idx[k]] = (float)(w[k] * (g[k] - c));
            }
            if (aux) {
                double ap = 0;
                for (int e = 0; e < E; e++) ap += (double)aux[e] * p[e];
                for (int j = 0; j < E; j++) dl[j] += (float)(p[j] * (aux[j] - ap));
            }
        }
        free(p);
    }
}

static void cpu_moe_prob_sum(ct_backend *be, float *prob_sum, const void *logits, int T, int E)
{
    float *p = ct_malloc((size_t)T * E * sizeof(float));
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) softmax_row(p + (size_t)t * E, (const float *)logits + (size_t)t * E, E);
    for (int e = 0; e < E; e++) { /* summed in token order: thread-count independent */
        double s = 0;
        for (int t = 0; t < T; t++) s += p[(size_t)t * E + e];
        prob_sum[e] += (float)s;
    }
    free(p);
}

static void cpu_moe_aux_loss(ct_backend *be, float *loss, float *aux_grad, const int32_t *counts,
                             const float *prob_sum, int n_layers, int T, int E, float coef)
{
    double N = (double)n_layers * T, total = 0;
    for (int e = 0; e < E; e++) {
        double c = 0, P = 0;
        for (int l = 0; l < n_layers; l++) {
            c += counts[(size_t)l * E + e];
            P += prob_sum[(size_t)l * E + e];
        }
        total += (c / N) * (P / N);
        aux_grad[e] = (float)(coef * E * c / (N * N));
    }
    loss[0] += (float)(coef * E * total);
}

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

static void cpu_moe_shared_gate_fwd(ct_backend *be, void *y, int ldy, const void *s, int lds, const void *g, int ldg,
                                    int T, int H)
{
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float a = sigmoidf_(((const float *)g)[(size_t)t * ldg]);
        float *yr = (float *)y + (size_t)t * ldy;
        const float *sr = (const float *)s + (size_t)t * lds;
        for (int h = 0; h < H; h++) yr[h] += a * sr[h];
    }
}

static void cpu_moe_shared_gate_bwd(ct_backend *be, void *ds, int ldds, void *dg, int lddg, const void *dy, int lddy,
                                    const void *s, int lds, const void *g, int ldg, int T, int H)
{
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float a = sigmoidf_(((const float *)g)[(size_t)t * ldg]);
        const float *dyr = (const float *)dy + (size_t)t * lddy, *sr = (const float *)s + (size_t)t * lds;
        float *dsr = (float *)ds + (size_t)t * ldds;
        float dot = 0;
        for (int h = 0; h < H; h++) {
            dot += dyr[h] * sr[h];
            dsr[h] = a * dyr[h];
        }
        ((float *)dg)[(size_t)t * lddg] = a * (1.0f - a) * dot;
    }
}

void cpu_moe_install(ct_backend *be)
{
    be->moe_shared_gate_fwd = cpu_moe_shared_gate_fwd;
    be->moe_shared_gate_bwd = cpu_moe_shared_gate_bwd;
    be->moe_route = cpu_moe_route;
    be->moe_count = cpu_moe_count;
    be->moe_offsets = cpu_moe_offsets;
    be->moe_permute = cpu_moe_permute;
    be->moe_gather = cpu_moe_gather;
    be->moe_scatter = cpu_moe_scatter;
    be->moe_scatter_bwd = cpu_moe_scatter_bwd;
    be->moe_weight_grad = cpu_moe_weight_grad;
    be->moe_act_bwd = cpu_moe_act_bwd;
    be->moe_linear_fwd = cpu_moe_linear_fwd;
    be->moe_linear_bwd_input = cpu_moe_linear_bwd_input;
    be->moe_lora_fwd = cpu_moe_lora_fwd;
    be->moe_lora_bwd = cpu_moe_lora_bwd;
    be->moe_linear_lora_fwd = cpu_moe_linear_lora_fwd;
    be->moe_lora_bwd_cols = cpu_moe_lora_bwd_cols;
    be->moe_linear_lora_bwd_input = cpu_moe_linear_lora_bwd_input;
    be->moe_clamped_swiglu_fwd = cpu_moe_clamped_swiglu_fwd;
    be->moe_clamped_swiglu_bwd = cpu_moe_clamped_swiglu_bwd;
    be->moe_route_bwd = cpu_moe_route_bwd;
    be->moe_prob_sum = cpu_moe_prob_sum;
    be->moe_aux_loss = cpu_moe_aux_loss;
}
