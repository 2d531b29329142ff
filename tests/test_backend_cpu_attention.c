/* test_backend_cpu_attention.c — the CPU backend's attention (forward with its
 * log-sum-exp, backward) against full T x T masked softmax in double precision:
 * packed documents, grouped-query heads, sliding windows and gpt_oss's sinks.
 * Method and tolerances: cpu_oracle.h. */
#include "cpu_oracle.h"

#include <math.h>

// ---- double reference ----

/* Full T x T scores per head with a block-diagonal causal (and window) mask,
 * contiguous q (T,nq,D), k v (T,nkv,D); lse may be NULL. */
static void ref_attention(double *out, double *lse, const double *q, const double *k, const double *v,
                          const int *doc, int T, int nq, int nkv, int D, double scale, int window,
                          const double *sinks)
{
    double *s = ct_malloc((size_t)T * sizeof(double));
    for (int h = 0; h < nq; h++) {
        int g = h / (nq / nkv);
        for (int i = 0; i < T; i++) {
            double mx = sinks ? sinks[h] : -INFINITY;
            for (int j = 0; j < T; j++) {
                int visible = doc[i] == doc[j] && j <= i && (window <= 0 || j > i - window);
                s[j] = visible ? scale * dot_d(q + ((size_t)i * nq + h) * D, k + ((size_t)j * nkv + g) * D, D) : -INFINITY;
                if (s[j] > mx) mx = s[j];
            }
            double sum = sinks ? exp(sinks[h] - mx) : 0;
            for (int j = 0; j < T; j++) sum += exp(s[j] - mx);
            double *o = out + ((size_t)i * nq + h) * D;
            for (int d = 0; d < D; d++) o[d] = 0;
            for (int j = 0; j < T; j++)
                for (int d = 0; d < D; d++) o[d] += exp(s[j] - mx) / sum * v[((size_t)j * nkv + g) * D + d];
            if (lse) lse[(size_t)i * nq + h] = mx + log(sum);
        }
    }
    free(s);
}

// ---- attention ----

/* Documents of length 1, 3 and 7 packed in one batch. */
enum { AT_T = 11, AT_NQ = 4, AT_D = 8, AT_NDOCS = 3, AT_MAXLEN = 7, AT_WINDOW = 3 };
static const int32_t at_cu[AT_NDOCS + 1] = {0, 1, 4, 11};
static const int at_doc[AT_T] = {0, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2};

struct attn_case { int nkv, window, sinks; };
static const struct attn_case at_cases[12] = {
    {4, 0, 0}, {2, 0, 0}, {1, 0, 0}, {4, AT_WINDOW, 0}, {2, AT_WINDOW, 0}, {1, AT_WINDOW, 0},
    {4, 0, 1}, {2, 0, 1}, {1, 0, 1}, {4, AT_WINDOW, 1}, {2, AT_WINDOW, 1}, {1, AT_WINDOW, 1},
};

/* Inputs as float (q, k, v contiguous) and as double; the backend reads them from
 * one fused qkv buffer (T, (nq + 2 nkv) D) through strides, as the model does. */
struct attn_ctx {
    int nkv, window;
    float *q, *k, *v, *sinks, *qkv;
    double *qd, *kd, *vd, *sd, *w, *out;
};

static void attn_setup(struct attn_ctx *c, struct attn_case ac)
{
    size_t nqe = (size_t)AT_T * AT_NQ * AT_D, nke = (size_t)AT_T * ac.nkv * AT_D;
    int ld = (AT_NQ + 2 * ac.nkv) * AT_D;
    c->nkv = ac.nkv;
    c->window = ac.window;
    c->q = rand_f(nqe, -1.5f, 1.5f);
    c->k = rand_f(nke, -1.5f, 1.5f);
    c->v = rand_f(nke, -1, 1);
    c->sinks = ac.sinks ? rand_f(AT_NQ, -1, 2) : NULL;
    c->qkv = ct_malloc((size_t)AT_T * ld * sizeof(float));
    for (int t = 0; t < AT_T; t++) {
        memcpy(c->qkv + (size_t)t * ld, c->q + (size_t)t * AT_NQ * AT_D, AT_NQ * AT_D * sizeof(float));
        memcpy(c->qkv + (size_t)t * ld + AT_NQ * AT_D, c->k + (size_t)t * ac.nkv * AT_D, ac.nkv * AT_D * sizeof(float));
        memcpy(c->qkv + (size_t)t * ld + (AT_NQ + ac.nkv) * AT_D, c->v + (size_t)t * ac.nkv * AT_D, ac.nkv * AT_D * sizeof(float));
    }
    c->qd = to_d(c->q, nqe);
    c->kd = to_d(c->k, nke);
    c->vd = to_d(c->v, nke);
    c->sd = c->sinks ? to_d(c->sinks, AT_NQ) : NULL;
    c->w = NULL;
    c->out = ct_malloc(nqe * sizeof(double));
}

static void attn_teardown(struct attn_ctx *c)
{
    free(c->q); free(c->k); free(c->v); free(c->sinks); free(c->qkv);
    free(c->qd); free(c->kd); free(c->vd); free(c->sd); free(c->w); free(c->out);
}

static float at_scale(void) { return 1.0f / sqrtf(AT_D); }

static void attn_backend_fwd(struct attn_ctx *c, float *out, float *lse)
{
    int ld = (AT_NQ + 2 * c->nkv) * AT_D;
    be->attention_fwd(be, out, AT_NQ * AT_D, lse, c->qkv, ld, c->qkv + AT_NQ * AT_D, ld,
                      c->qkv + (AT_NQ + c->nkv) * AT_D, ld, at_cu, AT_NDOCS, AT_MAXLEN,
                      AT_T, AT_NQ, c->nkv, AT_D, at_scale(), c->window, c->sinks);
}

TEST(attention_fwd_matches_masked_softmax)
{
    size_t no = (size_t)AT_T * AT_NQ * AT_D;
    for (int ci = 0; ci < 12; ci++) {
        struct attn_ctx c;
        attn_setup(&c, at_cases[ci]);
        float *out = ct_malloc(no * sizeof(float)), lse[AT_T * AT_NQ];
        double lsed[AT_T * AT_NQ];
        attn_backend_fwd(&c, out, lse);
        ref_attention(c.out, lsed, c.qd, c.kd, c.vd, at_doc, AT_T, AT_NQ, c.nkv, AT_D, at_scale(), c.window, c.sd);
        float *want = to_f(c.out, no), *want_lse = to_f(lsed, AT_T * AT_NQ);
        double e = check_max_rel_err(out, want, no), el = check_max_rel_err(lse, want_lse, AT_T * AT_NQ);
        CHECK(e <= GEMM_TOL && el <= FWD_TOL, "nkv %d window %d sinks %d: out %.3g lse %.3g",
              c.nkv, c.window, at_cases[ci].sinks, e, el);
        free(out); free(want); free(want_lse);
        attn_teardown(&c);
    }
}

static double attn_obj(void *p)
{
    struct attn_ctx *c = p;
    ref_attention(c->out, NULL, c->qd, c->kd, c->vd, at_doc, AT_T, AT_NQ, c->nkv, AT_D, at_scale(), c->window, c->sd);
    return dot_d(c->out, c->w, (size_t)AT_T * AT_NQ * AT_D);
}

TEST(attention_bwd_matches_finite_differences)
{
    size_t no = (size_t)AT_T * AT_NQ * AT_D;
    for (int ci = 0; ci < 12; ci++) {
        struct attn_ctx c;
        attn_setup(&c, at_cases[ci]);
        size_t nk = (size_t)AT_T * c.nkv * AT_D;
        int ld = (AT_NQ + 2 * c.nkv) * AT_D;
        float *out = ct_malloc(no * sizeof(float)), lse[AT_T * AT_NQ], *dout = rand_f(no, -1, 1);
        float *dqkv = fill_f((size_t)AT_T * ld, NAN); /* overwritten, never read */
        float *dq = ct_malloc(no * sizeof(float)), *dk = ct_malloc(nk * sizeof(float)), *dv = ct_malloc(nk * sizeof(float));
        c.w = to_d(dout, no);
        attn_backend_fwd(&c, out, lse);
        be->attention_bwd(be, dqkv, ld, dqkv + AT_NQ * AT_D, ld, dqkv + (AT_NQ + c.nkv) * AT_D, ld,
                          dout, AT_NQ * AT_D, out, AT_NQ * AT_D, lse,
                          c.qkv, ld, c.qkv + AT_NQ * AT_D, ld, c.qkv + (AT_NQ + c.nkv) * AT_D, ld,
                          at_cu, AT_NDOCS, AT_MAXLEN, AT_T, AT_NQ, c.nkv, AT_D, at_scale(), c.window, c.sinks);
        for (int t = 0; t < AT_T; t++) {
            memcpy(dq + (size_t)t * AT_NQ * AT_D, dqkv + (size_t)t * ld, AT_NQ * AT_D * sizeof(float));
            memcpy(dk + (size_t)t * c.nkv * AT_D, dqkv + (size_t)t * ld + AT_NQ * AT_D, c.nkv * AT_D * sizeof(float));
            memcpy(dv + (size_t)t * c.nkv * AT_D, dqkv + (size_t)t * ld + (AT_NQ + c.nkv) * AT_D, c.nkv * AT_D * sizeof(float));
        }
        float *fq = fd_grad(c.qd, no, NULL, attn_obj, &c);
        float *fk = fd_grad(c.kd, nk, NULL, attn_obj, &c);
        float *fv = fd_grad(c.vd, nk, NULL, attn_obj, &c);
        double eq = check_max_rel_err(dq, fq, no), ek = check_max_rel_err(dk, fk, nk), ev = check_max_rel_err(dv, fv, nk);
        CHECK(eq <= GRAD_TOL && ek <= GRAD_TOL && ev <= GRAD_TOL, "nkv %d window %d sinks %d: dq %.3g dk %.3g dv %.3g",
              c.nkv, c.window, at_cases[ci].sinks, eq, ek, ev);
        free(out); free(dout); free(dqkv); free(dq); free(dk); free(dv); free(fq); free(fk); free(fv);
        attn_teardown(&c);
    }
}

/* Runs forward (and backward when dq != NULL) on rows [t0, t0 + len) of the
 * contiguous q, k, v, dout as one batch of n_docs documents given by cu. */
static void attn_run(float *out, float *dq, float *dk, float *dv, const float *q, const float *k, const float *v,
                     const float *dout, const int32_t *cu, int n_docs, int t0, int len, int nkv)
{
    int lq = AT_NQ * AT_D, lk = nkv * AT_D;
    float lse[AT_T * AT_NQ];
    be->attention_fwd(be, out + t0 * lq, lq, lse, q + t0 * lq, lq, k + t0 * lk, lk, v + t0 * lk, lk,
                      cu, n_docs, AT_MAXLEN, len, AT_NQ, nkv, AT_D, at_scale(), AT_WINDOW, NULL);
    if (!dq) return;
    be->attention_bwd(be, dq + t0 * lq, lq, dk + t0 * lk, lk, dv + t0 * lk, lk, dout + t0 * lq, lq,
                      out + t0 * lq, lq, lse, q + t0 * lq, lq, k + t0 * lk, lk, v + t0 * lk, lk,
                      cu, n_docs, AT_MAXLEN, len, AT_NQ, nkv, AT_D, at_scale(), AT_WINDOW, NULL);
}

static void check_packed_equals_alone(int with_bwd)
{
    int nkv = 2;
    size_t no = (size_t)AT_T * AT_NQ * AT_D, nk = (size_t)AT_T * nkv * AT_D;
    float *q = rand_f(no, -1.5f, 1.5f), *k = rand_f(nk, -1.5f, 1.5f), *v = rand_f(nk, -1, 1), *dout = rand_f(no, -1, 1);
    float *bufs[8];
    for (int i = 0; i < 8; i++) bufs[i] = ct_malloc((i % 4 < 2 ? no : nk) * sizeof(float));
    float *po = bufs[0], *pdq = bufs[1], *pdk = bufs[2], *pdv = bufs[3];
    float *ao = bufs[4], *adq = bufs[5], *adk = bufs[6], *adv = bufs[7];
    attn_run(po, with_bwd ? pdq : NULL, pdk, pdv, q, k, v, dout, at_cu, AT_NDOCS, 0, AT_T, nkv);
    for (int d = 0; d < AT_NDOCS; d++) {
        int32_t cu1[2] = {0, at_cu[d + 1] - at_cu[d]};
        attn_run(ao, with_bwd ? adq : NULL, adk, adv, q, k, v, dout, cu1, 1, at_cu[d], cu1[1], nkv);
    }
    double e = with_bwd ? fmax(fmax(check_max_rel_err(pdq, adq, no), check_max_rel_err(pdk, adk, nk)),
                               check_max_rel_err(pdv, adv, nk))
                        : check_max_rel_err(po, ao, no);
    CHECK(e <= 1e-6, "packed vs alone: max rel err %.3g", e);
    free(q); free(k); free(v); free(dout);
    for (int i = 0; i < 8; i++) free(bufs[i]);
}

TEST(attention_fwd_packed_batch_equals_documents_alone) { check_packed_equals_alone(0); }
TEST(attention_bwd_packed_batch_equals_documents_alone) { check_packed_equals_alone(1); }

TEST(attention_rows_past_the_last_document_get_zeros)
{
    int T = 5, nkv = 2;
    int32_t cu[2] = {0, 3};
    size_t no = (size_t)T * AT_NQ * AT_D, nk = (size_t)T * nkv * AT_D;
    float *q = rand_f(no, -1, 1), *k = rand_f(nk, -1, 1), *v = rand_f(nk, -1, 1), *dout = rand_f(no, -1, 1);
    float *out = fill_f(no, NAN), *dq = fill_f(no, NAN), *dk = fill_f(nk, NAN), *dv = fill_f(nk, NAN);
    attn_run(out, dq, dk, dv, q, k, v, dout, cu, 1, 0, T, nkv);
    int zero = 1;
    for (size_t i = 3 * AT_NQ * AT_D; i < no; i++) zero &= out[i] == 0 && dq[i] == 0;
    for (size_t i = 3 * nkv * AT_D; i < nk; i++) zero &= dk[i] == 0 && dv[i] == 0;
    CHECK(zero && !isnan(out[0]) && !isnan(dk[0]), "rows 3 and 4 are not zero (or rows 0-2 not written)");
    free(q); free(k); free(v); free(dout); free(out); free(dq); free(dk); free(dv);
}

int main(void)
{
    be = backend_cpu_new();
    ct_rng_seed(&rng, 7);
    RUN(attention_fwd_matches_masked_softmax);
    RUN(attention_bwd_matches_finite_differences);
    RUN(attention_fwd_packed_batch_equals_documents_alone);
    RUN(attention_bwd_packed_batch_equals_documents_alone);
    RUN(attention_rows_past_the_last_document_get_zeros);
    be->destroy(be);
    return check_summary();
}
