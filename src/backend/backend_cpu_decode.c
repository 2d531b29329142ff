/* backend_cpu_decode.c — attention of new tokens over a KV cache for the CPU
 * reference backend (contract: attention_decode in backend.h). It is what
 * generate.c calls once per layer per token, so it reads only the cached keys
 * the new queries see: O(Tq * n_keys) work, never the n_keys^2 a full
 * attention_fwd over the whole sequence would cost.
 *
 * For query i (absolute position p = n_past + i) and head h (kv head
 * g = h / (nq/nkv)): s_j = scale * q_i . k_j for visible j, lse = log(sum exp(s_j)
 * [+ exp(sink_h)]), out_i = sum_j exp(s_j - lse) v_j. The softmax sums run in
 * double and the dot products in fp32, as in backend_cpu_attention.c, so the
 * result matches attention_fwd over the same keys. Scratch: one logit row per
 * (i, h), allocated per call. */
#include "backend_cpu_internal.h"

#include <math.h>
#include <stdlib.h>

void cpu_attention_decode(ct_backend *be, void *out, int ldo, const void *q, int ldq,
                          const void *k, int ldk, const void *v, int ldv,
                          int Tq, int n_past, int nq, int nkv, int D, float scale, int window,
                          const float *sinks)
{
    CT_ASSERT(nkv > 0 && nq % nkv == 0, "attention_decode: nq %d is not a multiple of nkv %d", nq, nkv);
    CT_ASSERT(Tq >= 0 && n_past >= 0, "attention_decode: Tq %d, n_past %d", Tq, n_past);
    const float *qf = q, *kf = k, *vf = v;
    float *of = out;
    int group = nq / nkv, n_keys = n_past + Tq;
    #pragma omp parallel
    {
        float *s = ct_malloc((size_t)(n_keys > 0 ? n_keys : 1) * sizeof(float));
        #pragma omp for schedule(static) collapse(2)
        for (int i = 0; i < Tq; i++)
            for (int h = 0; h < nq; h++) {
                int p = n_past + i, g = h / group;
                int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
                const float *qr = qf + (size_t)i * ldq + (size_t)h * D;
                float mx = -INFINITY;
                for (int j = lo; j <= p; j++) {
                    const float *kr = kf + (size_t)j * ldk + (size_t)g * D;
                    float dot = 0;
                    for (int d = 0; d < D; d++) dot += qr[d] * kr[d];
                    s[j] = dot * scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                if (sinks && sinks[h] > mx) mx = sinks[h];
                double se = sinks ? exp((double)sinks[h] - mx) : 0.0;
                for (int j = lo; j <= p; j++) se += exp((double)s[j] - mx);
                double lse = mx + log(se);
                float *orow = of + (size_t)i * ldo + (size_t)h * D;
                for (int d = 0; d < D; d++) orow[d] = 0;
                for (int j = lo; j <= p; j++) {
                    float pj = (float)exp((double)s[j] - lse);
                    const float *vr = vf + (size_t)j * ldv + (size_t)g * D;
                    for (int d = 0; d < D; d++) orow[d] += pj * vr[d];
                }
            }
        free(s);
    }
}
