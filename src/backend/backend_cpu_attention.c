/* backend_cpu_attention.c — exact causal GQA attention over packed documents
 * for the CPU reference backend (contract: attention_fwd/bwd in backend.h).
 *
 * For query row i of document [s, e) and head h (kv head g = h / (nq/nkv)),
 * the visible keys are j in [lo, i] with lo = s, or max(s, i - window + 1)
 * when window > 0. Scaled logits s_j = scale * q_i . k_j; with sinks the
 * softmax denominator has one more term exp(sink_h) (unscaled, value-less).
 *   lse_i = log(sum_j exp(s_j) [+ exp(sink_h)])   (the sink is inside lse, so
 *   P_j = exp(s_j - lse_i) are the probabilities, sink column excluded)
 *   out_i = sum_j P_j v_j
 * Backward, with Delta_i = dO_i . out_i:
 *   dP_j = dO_i . v_j ; dS_j = P_j (dP_j - Delta_i)
 *   dq_i = scale sum_j dS_j k_j ; dk_j = scale sum_i dS_ij q_i ; dv_j = sum_i P_ij dO_i
 * where dk, dv also sum over the nq/nkv query heads that share kv head g. The
 * sink is a frozen weight, so it gets no gradient; its effect on P is all the
 * backward needs and lse carries it.
 *
 * Work split: forward and dq go row by row ((i, h) pairs); dk and dv go by
 * blocks of key rows and kv head, recomputing P from lse, instead of
 * scattering into shared key rows. Each output row is thus written by one
 * thread in a fixed order (thread-count independent), and the scratch is one
 * logit row (max_seqlen floats) or one key block's dk|dv per thread plus
 * Delta (T, nq): never T x T. Scratch is allocated per call (CPU backend).
 * Rows past cu_seqlens[n_docs] belong to no document: their outputs and
 * gradients are zero. Softmax sums run in double; dot products in fp32. */
#include "backend_cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Key rows per dk/dv work item (see the backward). */
enum { KEY_BLOCK = 16 };

/* omp simd lets GCC vectorize the fp32 sum (lanes, then a fixed tree), which it
 * may not do on its own without -ffast-math; the order is still fixed per build. */
static inline float dot(const float *a, const float *b, int D)
{
    float s = 0;
    #pragma omp simd reduction(+ : s)
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

static inline void axpy(float *y, float a, const float *x, int D)
{
    for (int d = 0; d < D; d++) y[d] += a * x[d];
}

/* The document holding row t: its [start, end), or end = start = -1 when none. */
static void doc_bounds(const int32_t *cu, int n_docs, int t, int *start, int *end)
{
    *start = *end = -1;
    if (n_docs <= 0 || t < cu[0] || t >= cu[n_docs]) return;
    int lo = 0, hi = n_docs - 1; /* find the last d with cu[d] <= t */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= t) lo = mid; else hi = mid - 1;
    }
    *start = cu[lo];
    *end = cu[lo + 1];
}

static void check_docs(const int32_t *cu, int n_docs, int max_seqlen, int T)
{
    CT_ASSERT(n_docs >= 0 && (n_docs == 0 || cu[0] == 0), "attention: cu_seqlens must start at 0");
    for (int d = 0; d < n_docs; d++)
        CT_ASSERT(cu[d] <= cu[d + 1] && cu[d + 1] - cu[d] <= max_seqlen,
                  "attention: document %d spans [%d, %d), max_seqlen %d", d, cu[d], cu[d + 1], max_seqlen);
    CT_ASSERT(n_docs == 0 || cu[n_docs] <= T, "attention: cu_seqlens ends at %d > T %d", cu[n_docs], T);
}

void cpu_attention_fwd(ct_backend *be, void *out, int ldo, float *lse,
                       const void *q, int ldq, const void *k, int ldk, const void *v, int ldv,
                       const int32_t *cu_seqlens, int n_docs, int max_seqlen,
                       int T, int nq, int nkv, int D, float scale, int window, const float *sinks)
{
    CT_ASSERT(nkv > 0 && nq % nkv == 0, "attention: nq %d is not a multiple of nkv %d", nq, nkv);
    check_docs(cu_seqlens, n_docs, max_seqlen, T);
    const float *qf = q, *kf = k, *vf = v;
    float *of = out;
    int group = nq / nkv;
    #pragma omp parallel
    {
        float *s = ct_malloc((size_t)(max_seqlen > 0 ? max_seqlen : 1) * sizeof(float));
        #pragma omp for schedule(dynamic, 8)
        for (long r = 0; r < (long)T * nq; r++) {
            int i = (int)(r / nq), h = (int)(r % nq), g = h / group;
            int start, end;
            doc_bounds(cu_seqlens, n_docs, i, &start, &end);
            float *o = of + (size_t)i * ldo + (size_t)h * D;
            memset(o, 0, (size_t)D * sizeof(float));
            if (start < 0) {
                lse[r] = 0.0f;
                continue;
            }
            int lo = window > 0 && i - window + 1 > start ? i - window + 1 : start;
            const float *qi = qf + (size_t)i * ldq + (size_t)h * D;
            float mx = sinks ? sinks[h] : -INFINITY;
            for (int j = lo; j <= i; j++) {
                s[j - lo] = scale * dot(qi, kf + (size_t)j * ldk + (size_t)g * D, D);
                if (s[j - lo] > mx) mx = s[j - lo];
            }
            double sum = sinks ? exp((double)sinks[h] - mx) : 0.0;
            for (int j = lo; j <= i; j++) sum += exp((double)s[j - lo] - mx);
            double l = mx + log(sum);
            lse[r] = (float)l;
            for (int j = lo; j <= i; j++)
                axpy(o, (float)exp((double)s[j - lo] - l), vf + (size_t)j * ldv + (size_t)g * D, D);
        }
        free(s);
    }
}

void cpu_attention_bwd(ct_backend *be, void *dq, int lddq, void *dk, int lddk, void *dv, int lddv,
                       const void *dout, int lddo, const void *out, int ldo, const float *lse,
                       const void *q, int ldq, const void *k, int ldk, const void *v, int ldv,
                       const int32_t *cu_seqlens, int n_docs, int max_seqlen,
                       int T, int nq, int nkv, int D, float scale, int window, const float *sinks)
{
    CT_ASSERT(nkv > 0 && nq % nkv == 0, "attention: nq %d is not a multiple of nkv %d", nq, nkv);
    check_docs(cu_seqlens, n_docs, max_seqlen, T);
    const float *qf = q, *kf = k, *vf = v, *dof = dout, *of = out;
    int group = nq / nkv;
    float *delta = ct_malloc((size_t)T * nq * sizeof(float)); /* Delta (T, nq) */
    #pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)T * nq; r++) {
        int i = (int)(r / nq), h = (int)(r % nq);
        delta[r] = dot(dof + (size_t)i * lddo + (size_t)h * D, of + (size_t)i * ldo + (size_t)h * D, D);
    }

    /* dq: one (query row, head) per iteration. */
    #pragma omp parallel for schedule(dynamic, 8)
    for (long r = 0; r < (long)T * nq; r++) {
        int i = (int)(r / nq), h = (int)(r % nq), g = h / group;
        int start, end;
        doc_bounds(cu_seqlens, n_docs, i, &start, &end);
        float *dqi = (float *)dq + (size_t)i * lddq + (size_t)h * D;
        memset(dqi, 0, (size_t)D * sizeof(float));
        if (start < 0) continue;
        int lo = window > 0 && i - window + 1 > start ? i - window + 1 : start;
        const float *qi = qf + (size_t)i * ldq + (size_t)h * D;
        const float *doi = dof + (size_t)i * lddo + (size_t)h * D;
        for (int j = lo; j <= i; j++) {
            const float *kj = kf + (size_t)j * ldk + (size_t)g * D;
            float p = expf(scale * dot(qi, kj, D) - lse[r]);
            float ds = p * (dot(doi, vf + (size_t)j * ldv + (size_t)g * D, D) - delta[r]);
            axpy(dqi, scale * ds, kj, D);
        }
    }

    /* dk, dv: one block of KEY_BLOCK key rows and one kv head per iteration.
     * Each query row loaded serves the whole block from L1 (streaming q and dO
     * once per key instead made this pass memory-bound). For every key the sum
     * still runs over h, then i ascending: the blocking does not change bits. */
    int n_blocks = (int)ct_ceil_div((size_t)T, KEY_BLOCK);
    #pragma omp parallel
    {
        float *acc = ct_malloc((size_t)KEY_BLOCK * 2 * D * sizeof(float)); /* dk | dv per key */
        #pragma omp for schedule(dynamic, 1)
        for (long r = 0; r < (long)n_blocks * nkv; r++) {
            int j0 = (int)(r / nkv) * KEY_BLOCK, g = (int)(r % nkv);
            int nj = T - j0 < KEY_BLOCK ? T - j0 : KEY_BLOCK;
            int hi[KEY_BLOCK], i_end = j0; /* key j sees queries [j, hi[j - j0]) */
            for (int b = 0; b < nj; b++) {
                int start, end, j = j0 + b;
                doc_bounds(cu_seqlens, n_docs, j, &start, &end);
                hi[b] = start < 0 ? j : window > 0 && j + window < end ? j + window : end;
                if (hi[b] > i_end) i_end = hi[b];
            }
            memset(acc, 0, (size_t)nj * 2 * D * sizeof(float));
            for (int h = g * group; h < (g + 1) * group; h++) {
                for (int i = j0; i < i_end; i++) {
                    const float *qi = qf + (size_t)i * ldq + (size_t)h * D;
                    const float *doi = dof + (size_t)i * lddo + (size_t)h * D;
                    size_t ri = (size_t)i * nq + h;
                    for (int b = 0; b < nj && j0 + b <= i; b++) {
                        if (i >= hi[b]) continue;
                        const float *kj = kf + (size_t)(j0 + b) * ldk + (size_t)g * D;
                        const float *vj = vf + (size_t)(j0 + b) * ldv + (size_t)g * D;
                        float p = expf(scale * dot(qi, kj, D) - lse[ri]);
                        float ds = p * (dot(doi, vj, D) - delta[ri]);
                        axpy(acc + (size_t)b * 2 * D, scale * ds, qi, D);
                        axpy(acc + (size_t)b * 2 * D + D, p, doi, D);
                    }
                }
            }
            for (int b = 0; b < nj; b++) {
                memcpy((float *)dk + (size_t)(j0 + b) * lddk + (size_t)g * D, acc + (size_t)b * 2 * D, (size_t)D * sizeof(float));
                memcpy((float *)dv + (size_t)(j0 + b) * lddv + (size_t)g * D, acc + (size_t)b * 2 * D + D, (size_t)D * sizeof(float));
            }
        }
        free(acc);
    }
    free(delta);
}
