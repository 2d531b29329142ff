/* backend_cpu_gdn.c — the Gated DeltaNet ops of the CPU reference backend, fp32
 * (contracts: backend.h,
 * "Gated DeltaNet"). They follow HF transformers' torch code for
 * Qwen3.5 (causal_conv1d_fn, the gate lines of Qwen3_5GatedDeltaNet.forward,
 * torch_recurrent_gated_delta_rule, Qwen3_5RMSNormGated), with document
 * boundaries added, which HF's torch path lacks.
 *
 * The delta rule runs token by token per (document, value head), the state S
 * (Dk x Dv) in fp32: the plain recurrence is the clearest oracle for a chunked
 * GPU kernel, and its rounding is that of one fp32 state update per token.
 * Its backward carries dS from the document's end to its start. Per token t,
 * with S' = exp(g) S_prev, e = v - S'^T kn, u = beta e, S_t = S' + kn u^T,
 * o = S_t^T qn:
 *   dS += qn do^T ;  dqn = S_t do
 *   du = dS^T kn ;  dkn = dS u ;  dv = beta du ;  dbeta = du . e
 *   dp = -beta du ;  dS += kn dp^T ;  dkn += S' dp          (dS is now dS')
 *   dg = <dS', S'> ;  dS = exp(g) dS'                        (dS_prev)
 * and then through the L2 norms, y = x r with r = (sum x^2 + 1e-6)^-1/2:
 *   dx = r dy - r^3 (x . dy) x.
 * States are not stored per token: a forward re-run keeps S at the start of
 * every 64-token block, and the reverse pass recomputes one block's 65 states
 * from its checkpoint, with the very helpers and loop orders of the forward, so
 * the recomputed states are the forward's bit for bit.
 *
 * The decoding steps (gdn_conv_step, gdn_delta_step) run the same per-token
 * code on states the caller keeps, so a document fed in pieces gets the bits
 * of the whole-document forward.
 *
 * Threads: the delta rule splits over (document, value head) pairs; its dq and
 * dk, shared by the Hv/Hk value heads of a key head, go to per-value-head
 * scratch and are summed over heads afterwards in head order (before the L2-norm
 * backward, which is linear in its dy). Every other op is
 * element- or row-wise. Norm sums run in double; recurrence dots in fp32. */
#include "backend_cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per state checkpoint of the delta rule's backward. */
enum { DELTA_BLOCK = 64 };

/* The L2 norm's epsilon, inside the square root (HF's l2norm, fla's kernels). */
#define L2NORM_EPS 1e-6

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float siluf(float x) { return x * sigmoidf(x); }
/* d silu(x)/dx = sig(x) (1 + x (1 - sig(x))). */
static inline float silu_grad(float x)
{
    float s = sigmoidf(x);
    return s * (1.0f + x * (1.0f - s));
}

// ---- causal conv1d + SiLU ----

/* The pre-activation of y[t, c]: the taps that lie inside t's document. */
static inline float conv_pre(const float *x, int ldx, const float *w, const int32_t *pos, int t, int c, int W)
{
    float s = 0;
    for (int j = 0; j < W; j++) {
        int d = W - 1 - j;
        if (d <= pos[t]) s += w[(size_t)c * W + j] * x[(size_t)(t - d) * ldx + c];
    }
    return s;
}

static void check_conv(const int32_t *pos, int T, int W)
{
    CT_ASSERT(W >= 1 && W <= 8, "gdn_conv: width %d is not in 1..8", W);
    for (int t = 0; t < T; t++)
        CT_ASSERT(pos[t] >= 0 && pos[t] <= t, "gdn_conv: pos[%d] = %d is not in [0, %d]", t, pos[t], t);
}

static void cpu_gdn_conv_fwd(ct_backend *be, void *y_, int ldy, const void *x_, int ldx, const void *w_,
                             const int32_t *pos, int T, int C, int W)
{
    float *y = y_;
    const float *x = x_, *w = w_;
    check_conv(pos, T, W);
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) y[(size_t)t * ldy + c] = siluf(conv_pre(x, ldx, w, pos, t, c, W));
}

static void cpu_gdn_conv_bwd(ct_backend *be, void *dx_, int lddx, const void *dy_, int lddy, const void *x_,
                             int ldx, const void *w_, const int32_t *pos, int T, int C, int W)
{
    float *dx = dx_;
    const float *dy = dy_, *x = x_, *w = w_;
    check_conv(pos, T, W);
    float *dp = ct_malloc((size_t)T * C * sizeof(float)); /* dL/d pre-activation (T, C) */
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++)
            dp[(size_t)t * C + c] = dy[(size_t)t * lddy + c] * silu_grad(conv_pre(x, ldx, w, pos, t, c, W));
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            float s = 0;
            for (int d = 0; d < W && t + d < T; d++)
                if (d <= pos[t + d]) s += w[(size_t)c * W + W - 1 - d] * dp[(size_t)(t + d) * C + c];
            dx[(size_t)t * lddx + c] = s;
        }
    free(dp);
}

/* The conv over [state ; x] (gdn_conv_step): a zero state row adds w * 0 = +-0 to
 * a sum that is still +0, which is the forward's skipped tap, so a document fed
 * in pieces gets gdn_conv_fwd's bits. */
static void cpu_gdn_conv_step(ct_backend *be, void *y_, int ldy, void *state_, const void *x_, int ldx,
                              const void *w_, int T, int C, int W)
{
    float *y = y_, *state = state_;
    const float *x = x_, *w = w_;
    CT_ASSERT(W >= 1 && W <= 8 && T >= 0, "gdn_conv_step: width %d, %d tokens", W, T);
    #pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float r[8]; /* the window of token t (W <= 8): W-1 earlier rows, then t's */
        for (int j = 0; j < W - 1; j++) r[j] = state[(size_t)j * C + c];
        for (int t = 0; t < T; t++) {
            r[W - 1] = x[(size_t)t * ldx + c];
            float s = 0;
            for (int j = 0; j < W; j++) s += w[(size_t)c * W + j] * r[j];
            y[(size_t)t * ldy + c] = siluf(s);
            for (int j = 0; j < W - 1; j++) r[j] = r[j + 1];
        }
        for (int j = 0; j < W - 1; j++) state[(size_t)j * C + c] = r[j];
    }
}

// ---- gates ----

/* torch.nn.functional.softplus with beta 1, threshold 20. */
static inline float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static void cpu_gdn_gates_fwd(ct_backend *be, float *g, float *beta, const void *a_, int lda, const void *b_,
                              int ldb, const float *A_log, const float *dt_bias, int T, int Hv)
{
    const float *a = a_, *b = b_;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hv; h++) {
            beta[(size_t)t * Hv + h] = sigmoidf(b[(size_t)t * ldb + h]);
            g[(size_t)t * Hv + h] = -expf(A_log[h]) * softplusf(a[(size_t)t * lda + h] + dt_bias[h]);
        }
}

static void cpu_gdn_gates_bwd(ct_backend *be, void *da_, int ldda, void *db_, int lddb, const float *dg,
                              const float *dbeta, const void *a_, int lda, const void *b_, int ldb,
                              const float *A_log, const float *dt_bias, int T, int Hv)
{
    float *da = da_, *db = db_;
    const float *a = a_, *b = b_;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hv; h++) {
            float xa = a[(size_t)t * lda + h] + dt_bias[h], s = sigmoidf(b[(size_t)t * ldb + h]);
            float dsp = xa > 20.0f ? 1.0f : sigmoidf(xa);
            da[(size_t)t * ldda + h] = dg[(size_t)t * Hv + h] * -expf(A_log[h]) * dsp;
            db[(size_t)t * lddb + h] = dbeta[(size_t)t * Hv + h] * s * (1.0f - s);
        }
}

// ---- gated delta rule ----

static void check_delta(const int32_t *cu, int n_docs, int T, int Hk, int Hv, int Dk, int Dv)
{
    CT_ASSERT(Hk > 0 && Hv % Hk == 0, "gdn_delta: Hv %d is not a multiple of Hk %d", Hv, Hk);
    CT_ASSERT(Dk > 0 && Dv > 0, "gdn_delta: head dims %d, %d", Dk, Dv);
    CT_ASSERT(n_docs >= 0 && (n_docs == 0 || cu[0] == 0), "gdn_delta: cu_seqlens must start at 0");
    for (int d = 0; d < n_docs; d++)
        CT_ASSERT(cu[d] <= cu[d + 1], "gdn_delta: document %d spans [%d, %d)", d, cu[d], cu[d + 1]);
    CT_ASSERT(n_docs == 0 || cu[n_docs] <= T, "gdn_delta: documents end at %d, past the %d rows", cu[n_docs], T);
}

/* out = x * r * mul with r = (sum x^2 + 1e-6)^-1/2 (HF: l2norm, then the scale); returns r. */
static float l2norm_row(float *out, const float *x, int n, float mul)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss + L2NORM_EPS));
    for (int i = 0; i < n; i++) out[i] = x[i] * r * mul;
    return r;
}

/* dx of y = x r mul (l2norm_row): mul (r dy - r^3 (x . dy) x). */
static void l2norm_row_bwd(float *dx, const float *dy, const float *x, int n, float mul)
{
    double ss = 0, xdy = 0;
    for (int i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
        xdy += (double)x[i] * dy[i];
    }
    double r = 1.0 / sqrt(ss + L2NORM_EPS);
    for (int i = 0; i < n; i++) dx[i] = (float)(mul * (r * dy[i] - r * r * r * xdy * x[i]));
}

/* e = v - S^T kn, S (Dk x Dv). */
static void delta_error(float *e, const float *S, const float *kn, const float *v, int Dk, int Dv)
{
    for (int j = 0; j < Dv; j++) e[j] = 0;
    for (int i = 0; i < Dk; i++)
        for (int j = 0; j < Dv; j++) e[j] += S[(size_t)i * Dv + j] * kn[i];
    for (int j = 0; j < Dv; j++) e[j] = v[j] - e[j];
}

/* One token: S = a S ; e = v - S^T kn ; u = beta e ; S += kn u^T. */
static void delta_step(float *S, float *e, float *u, const float *kn, const float *v, float a, float beta,
                       int Dk, int Dv)
{
    for (size_t i = 0; i < (size_t)Dk * Dv; i++) S[i] *= a;
    delta_error(e, S, kn, v, Dk, Dv);
    for (int j = 0; j < Dv; j++) u[j] = beta * e[j];
    for (int i = 0; i < Dk; i++)
        for (int j = 0; j < Dv; j++) S[(size_t)i * Dv + j] += kn[i] * u[j];
}

/* o = S^T qn. */
static void delta_read(float *o, const float *S, const float *qn, int Dk, int Dv)
{
    for (int j = 0; j < Dv; j++) o[j] = 0;
    for (int i = 0; i < Dk; i++)
        for (int j = 0; j < Dv; j++) o[j] += S[(size_t)i * Dv + j] * qn[i];
}

static int max_doc_len(const int32_t *cu, int n_docs)
{
    int m = 0;
    for (int d = 0; d < n_docs; d++) m = cu[d + 1] - cu[d] > m ? cu[d + 1] - cu[d] : m;
    return m;
}

/* Work items of both passes: the (document d, value head h) pairs n = d * Hv + h. */
static void cpu_gdn_delta_fwd(ct_backend *be, void *o_, int ldo, const void *q_, int ldq, const void *k_,
                              int ldk, const void *v_, int ldv, const float *g, const float *beta,
                              const int32_t *cu_seqlens, int n_docs, int T, int Hk, int Hv, int Dk, int Dv,
                              float scale)
{
    float *o = o_;
    const float *q = q_, *k = k_, *v = v_;
    check_delta(cu_seqlens, n_docs, T, Hk, Hv, Dk, Dv);
    int group = Hv / Hk;
    #pragma omp parallel
    {
        float *S = ct_malloc((size_t)Dk * Dv * sizeof(float));
        float *qn = ct_malloc((size_t)Dk * sizeof(float)), *kn = ct_malloc((size_t)Dk * sizeof(float));
        float *e = ct_malloc((size_t)Dv * sizeof(float)), *u = ct_malloc((size_t)Dv * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        for (long n = 0; n < (long)n_docs * Hv; n++) {
            int d = (int)(n / Hv), h = (int)(n % Hv), kh = h / group;
            memset(S, 0, (size_t)Dk * Dv * sizeof(float));
            for (int t = cu_seqlens[d]; t < cu_seqlens[d + 1]; t++) {
                size_t th = (size_t)t * Hv + h;
                l2norm_row(qn, q + (size_t)t * ldq + (size_t)kh * Dk, Dk, scale);
                l2norm_row(kn, k + (size_t)t * ldk + (size_t)kh * Dk, Dk, 1.0f);
                delta_step(S, e, u, kn, v + (size_t)t * ldv + (size_t)h * Dv, expf(g[th]), beta[th], Dk, Dv);
                delta_read(o + (size_t)t * ldo + (size_t)h * Dv, S, qn, Dk, Dv);
            }
        }
        free(S); free(qn); free(kn); free(e); free(u);
    }
}

/* gdn_delta_step: the forward's per-token loop on the caller's states. */
static void cpu_gdn_delta_step(ct_backend *be, void *o_, int ldo, float *S, const void *q_, int ldq,
                               const void *k_, int ldk, const void *v_, int ldv, const float *g,
                               const float *beta, int T, int Hk, int Hv, int Dk, int Dv, float scale)
{
    float *o = o_;
    const float *q = q_, *k = k_, *v = v_;
    CT_ASSERT(Hk > 0 && Hv % Hk == 0 && Dk > 0 && Dv > 0 && T >= 0,
              "gdn_delta_step: Hk %d, Hv %d, Dk %d, Dv %d, %d tokens", Hk, Hv, Dk, Dv, T);
    int group = Hv / Hk;
    #pragma omp parallel
    {
        float *qn = ct_malloc((size_t)Dk * sizeof(float)), *kn = ct_malloc((size_t)Dk * sizeof(float));
        float *e = ct_malloc((size_t)Dv * sizeof(float)), *u = ct_malloc((size_t)Dv * sizeof(float));
        #pragma omp for schedule(static)
        for (int h = 0; h < Hv; h++) {
            float *Sh = S + (size_t)h * Dk * Dv;
            int kh = h / group;
            for (int t = 0; t < T; t++) {
                size_t th = (size_t)t * Hv + h;
                l2norm_row(qn, q + (size_t)t * ldq + (size_t)kh * Dk, Dk, scale);
                l2norm_row(kn, k + (size_t)t * ldk + (size_t)kh * Dk, Dk, 1.0f);
                delta_step(Sh, e, u, kn, v + (size_t)t * ldv + (size_t)h * Dv, expf(g[th]), beta[th], Dk, Dv);
                delta_read(o + (size_t)t * ldo + (size_t)h * Dv, Sh, qn, Dk, Dv);
            }
        }
        free(qn); free(kn); free(e); free(u);
    }
}

/* Per-thread scratch of the backward. */
typedef struct {
    float *ckpt;          /* (blocks, Dk, Dv): S before each block's first token */
    float *blk;           /* (DELTA_BLOCK + 1, Dk, Dv): S before the block, then after each of its tokens */
    float *dS;            /* (Dk, Dv): dL/dS after the token being reversed */
    float *Sd;            /* (Dk, Dv): S' = exp(g) S_prev of that token */
    float *qn, *kn, *dkn; /* (Dk) */
    float *e, *u, *du;    /* (Dv) */
} delta_scratch;

/* One token's inputs and gradient slots (rows of the caller's tensors). */
typedef struct {
    const float *q, *k, *v, *dout; /* (Dk), (Dk), (Dv), (Dv) */
    float a, beta;                 /* exp(g), beta */
    float *dv, *dqn, *dkn;         /* (Dv), (Dk), (Dk): dqn, dkn of the normalised q, k */
    float *dg, *dbeta;
} delta_token;

/* Reverses one token (the header's formulas): Sp and St are S before and after
 * it; w->dS goes from dL/dS_t to dL/dS_prev. */
static void delta_token_bwd(delta_scratch *w, const delta_token *x, const float *Sp, const float *St,
                            int Dk, int Dv, float scale)
{
    size_t DS = (size_t)Dk * Dv;
    float *dS = w->dS, *Sd = w->Sd;
    l2norm_row(w->qn, x->q, Dk, scale);
    l2norm_row(w->kn, x->k, Dk, 1.0f);
    for (size_t i = 0; i < DS; i++) Sd[i] = Sp[i] * x->a; /* delta_step's S *= a, so the same bits */
    delta_error(w->e, Sd, w->kn, x->v, Dk, Dv);
    for (int j = 0; j < Dv; j++) w->u[j] = x->beta * w->e[j];
    /* o = S_t^T qn */
    for (int i = 0; i < Dk; i++) {
        float s = 0;
        for (int j = 0; j < Dv; j++) {
            s += St[(size_t)i * Dv + j] * x->dout[j];
            dS[(size_t)i * Dv + j] += w->qn[i] * x->dout[j];
        }
        x->dqn[i] = s;
    }
    /* S_t = S' + kn u^T */
    for (int j = 0; j < Dv; j++) w->du[j] = 0;
    for (int i = 0; i < Dk; i++) {
        float s = 0;
        for (int j = 0; j < Dv; j++) {
            w->du[j] += dS[(size_t)i * Dv + j] * w->kn[i];
            s += dS[(size_t)i * Dv + j] * w->u[j];
        }
        w->dkn[i] = s;
    }
    /* u = beta (v - S'^T kn) */
    double db = 0;
    for (int j = 0; j < Dv; j++) {
        db += (double)w->du[j] * w->e[j];
        x->dv[j] = x->beta * w->du[j];
        w->du[j] *= -x->beta; /* now dp, the gradient of p = S'^T kn */
    }
    *x->dbeta = (float)db;
    /* p = S'^T kn, then S' = exp(g) S_prev */
    double dg = 0;
    for (int i = 0; i < Dk; i++) {
        float s = 0;
        for (int j = 0; j < Dv; j++) {
            size_t ij = (size_t)i * Dv + j;
            dS[ij] += w->kn[i] * w->du[j];
            s += Sd[ij] * w->du[j];
            dg += (double)dS[ij] * Sd[ij];
            dS[ij] *= x->a;
        }
        x->dkn[i] = w->dkn[i] + s;
    }
    *x->dg = (float)dg;
}

/* The reverse pass of document [s, end) and value head h (key head kh); dqn, dkn
 * (T, Hv, Dk) get this head's gradients of the normalised (and scaled) q and k. */
static void delta_bwd_one(delta_scratch *w, float *dqn, float *dkn, float *dv, int lddv, float *dg, float *dbeta,
                          const float *dout, int lddo, const float *q, int ldq, const float *k, int ldk,
                          const float *v, int ldv, const float *g, const float *beta,
                          int s, int end, int h, int kh, int Hv, int Dk, int Dv, float scale)
{
    size_t DS = (size_t)Dk * Dv;
    /* Forward re-run, keeping S at each block start. */
    float *S = w->blk;
    memset(S, 0, DS * sizeof(float));
    for (int t = s; t < end; t++) {
        if ((t - s) % DELTA_BLOCK == 0) memcpy(w->ckpt + (size_t)((t - s) / DELTA_BLOCK) * DS, S, DS * sizeof(float));
        size_t th = (size_t)t * Hv + h;
        l2norm_row(w->kn, k + (size_t)t * ldk + (size_t)kh * Dk, Dk, 1.0f);
        delta_step(S, w->e, w->u, w->kn, v + (size_t)t * ldv + (size_t)h * Dv, expf(g[th]), beta[th], Dk, Dv);
    }
    memset(w->dS, 0, DS * sizeof(float));
    for (int b = (end - s + DELTA_BLOCK - 1) / DELTA_BLOCK - 1; b >= 0; b--) {
        int bs = s + b * DELTA_BLOCK, L = end - bs < DELTA_BLOCK ? end - bs : DELTA_BLOCK;
        /* The block's states again, from its checkpoint: blk[i + 1] is S after token bs + i. */
        memcpy(w->blk, w->ckpt + (size_t)b * DS, DS * sizeof(float));
        for (int i = 0; i < L; i++) {
            size_t th = (size_t)(bs + i) * Hv + h;
            float *Sn = w->blk + (size_t)(i + 1) * DS;
            memcpy(Sn, Sn - DS, DS * sizeof(float));
            l2norm_row(w->kn, k + (size_t)(bs + i) * ldk + (size_t)kh * Dk, Dk, 1.0f);
            delta_step(Sn, w->e, w->u, w->kn, v + (size_t)(bs + i) * ldv + (size_t)h * Dv, expf(g[th]), beta[th],
                       Dk, Dv);
        }
        for (int i = L - 1; i >= 0; i--) {
            int t = bs + i;
            size_t th = (size_t)t * Hv + h;
            delta_token x = {
                .q = q + (size_t)t * ldq + (size_t)kh * Dk, .k = k + (size_t)t * ldk + (size_t)kh * Dk,
                .v = v + (size_t)t * ldv + (size_t)h * Dv, .dout = dout + (size_t)t * lddo + (size_t)h * Dv,
                .a = expf(g[th]), .beta = beta[th],
                .dv = dv + (size_t)t * lddv + (size_t)h * Dv, .dqn = dqn + th * Dk, .dkn = dkn + th * Dk,
                .dg = dg + th, .dbeta = dbeta + th,
            };
            delta_token_bwd(w, &x, w->blk + (size_t)i * DS, w->blk + (size_t)(i + 1) * DS, Dk, Dv, scale);
        }
    }
}

static void cpu_gdn_delta_bwd(ct_backend *be, void *dq_, int lddq, void *dk_, int lddk, void *dv_, int lddv,
                              float *dg, float *dbeta, const void *dout_, int lddo, const void *q_, int ldq,
                              const void *k_, int ldk, const void *v_, int ldv, const float *g,
                              const float *beta, const int32_t *cu_seqlens, int n_docs, int T, int Hk, int Hv, int Dk,
                              int Dv, float scale)
{
    float *dq = dq_, *dk = dk_, *dv = dv_;
    const float *dout = dout_, *q = q_, *k = k_, *v = v_;
    check_delta(cu_seqlens, n_docs, T, Hk, Hv, Dk, Dv);
    if (n_docs == 0) return;
    int group = Hv / Hk;
    T = cu_seqlens[n_docs]; /* the rows this pass touches */
    int nb_max = (max_doc_len(cu_seqlens, n_docs) + DELTA_BLOCK - 1) / DELTA_BLOCK;
    size_t DS = (size_t)Dk * Dv, nqk = (size_t)T * Hv * Dk;
    /* Per value head: the gradients of the normalised q and k, (T, Hv, Dk) each. */
    float *dqn = ct_malloc((nqk ? nqk : 1) * sizeof(float)), *dkn = ct_malloc((nqk ? nqk : 1) * sizeof(float));
    #pragma omp parallel
    {
        delta_scratch w;
        w.ckpt = ct_malloc(((size_t)nb_max + 1) * DS * sizeof(float));
        w.blk = ct_malloc((size_t)(DELTA_BLOCK + 1) * DS * sizeof(float));
        w.dS = ct_malloc(DS * sizeof(float));
        w.Sd = ct_malloc(DS * sizeof(float));
        w.qn = ct_malloc((size_t)Dk * sizeof(float));
        w.kn = ct_malloc((size_t)Dk * sizeof(float));
        w.dkn = ct_malloc((size_t)Dk * sizeof(float));
        w.e = ct_malloc((size_t)Dv * sizeof(float));
        w.u = ct_malloc((size_t)Dv * sizeof(float));
        w.du = ct_malloc((size_t)Dv * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        for (long n = 0; n < (long)n_docs * Hv; n++) {
            int d = (int)(n / Hv), h = (int)(n % Hv);
            if (cu_seqlens[d] == cu_seqlens[d + 1]) continue;
            delta_bwd_one(&w, dqn, dkn, dv, lddv, dg, dbeta, dout, lddo, q, ldq, k, ldk, v, ldv, g, beta,
                          cu_seqlens[d], cu_seqlens[d + 1], h, h / group, Hv, Dk, Dv, scale);
        }
        /* Sum over the value heads of each key head (in head order), then the L2 norms. */
        float *sq = w.qn, *sk = w.kn;
        #pragma omp for schedule(static)
        for (long r = 0; r < (long)T * Hk; r++) {
            int t = (int)(r / Hk), kh = (int)(r % Hk);
            for (int i = 0; i < Dk; i++) sq[i] = sk[i] = 0;
            for (int j = 0; j < group; j++) {
                size_t th = ((size_t)t * Hv + (size_t)kh * group + j) * Dk;
                for (int i = 0; i < Dk; i++) {
                    sq[i] += dqn[th + i];
                    sk[i] += dkn[th + i];
                }
            }
            l2norm_row_bwd(dq + (size_t)t * lddq + (size_t)kh * Dk, sq, q + (size_t)t * ldq + (size_t)kh * Dk, Dk, scale);
            l2norm_row_bwd(dk + (size_t)t * lddk + (size_t)kh * Dk, sk, k + (size_t)t * ldk + (size_t)kh * Dk, Dk, 1.0f);
        }
        free(w.ckpt); free(w.blk); free(w.dS); free(w.Sd); free(w.qn); free(w.kn); free(w.dkn);
        free(w.e); free(w.u); free(w.du);
    }
    free(dqn);
    free(dkn);
}

// ---- gated RMSNorm ----

static float rms_rstd(const float *x, int D, float eps)
{
    double ss = 0;
    for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / D + eps));
}

static void cpu_gated_rmsnorm_fwd(ct_backend *be, void *y_, int ldy, const void *x_, int ldx, const void *z_,
                                  int ldz, const void *w_, int T, int nh, int D, float eps)
{
    float *y = y_;
    const float *x = x_, *z = z_, *w = w_;
    #pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)T * nh; r++) {
        int t = (int)(r / nh), h = (int)(r % nh);
        const float *xr = x + (size_t)t * ldx + (size_t)h * D, *zr = z + (size_t)t * ldz + (size_t)h * D;
        float *yr = y + (size_t)t * ldy + (size_t)h * D;
        float rs = rms_rstd(xr, D, eps);
        for (int i = 0; i < D; i++) yr[i] = w[i] * (xr[i] * rs) * siluf(zr[i]);
    }
}

static void cpu_gated_rmsnorm_bwd(ct_backend *be, void *dx_, int lddx, void *dz_, int lddz, const void *dy_,
                                  int lddy, const void *x_, int ldx, const void *z_, int ldz, const void *w_,
                                  int T, int nh, int D, float eps)
{
    float *dx = dx_, *dz = dz_;
    const float *dy = dy_, *x = x_, *z = z_, *w = w_;
    #pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)T * nh; r++) {
        int t = (int)(r / nh), h = (int)(r % nh);
        const float *xr = x + (size_t)t * ldx + (size_t)h * D, *zr = z + (size_t)t * ldz + (size_t)h * D;
        const float *dyr = dy + (size_t)t * lddy + (size_t)h * D;
        float *dxr = dx + (size_t)t * lddx + (size_t)h * D, *dzr = dz + (size_t)t * lddz + (size_t)h * D;
        double rs = rms_rstd(xr, D, eps), dot = 0;
        for (int i = 0; i < D; i++) dot += (double)dyr[i] * w[i] * siluf(zr[i]) * xr[i];
        double c = dot * rs * rs * rs / D;
        for (int i = 0; i < D; i++) {
            dxr[i] = (float)(rs * (dyr[i] * w[i] * siluf(zr[i])) - c * xr[i]);
            dzr[i] = dyr[i] * w[i] * (float)(xr[i] * rs) * silu_grad(zr[i]);
        }
    }
}

// ---- sigmoid output gate ----

static void cpu_sigmoid_gate_fwd(ct_backend *be, void *y_, int ldy, const void *x_, int ldx, const void *gate_,
                                 int ldg, int hsg, int T, int nh, int D)
{
    float *y = y_;
    const float *x = x_, *gate = gate_;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < D; i++)
                y[(size_t)t * ldy + (size_t)h * D + i] =
                    x[(size_t)t * ldx + (size_t)h * D + i] * sigmoidf(gate[(size_t)t * ldg + (size_t)h * hsg + i]);
}

static void cpu_sigmoid_gate_bwd(ct_backend *be, void *dx_, int lddx, void *dgate_, int lddg, const void *dy_,
                                 int lddy, const void *x_, int ldx, const void *gate_, int ldg, int hsg, int T,
                                 int nh, int D)
{
    float *dx = dx_, *dgate = dgate_;
    const float *dy = dy_, *x = x_, *gate = gate_;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < D; i++) {
                float s = sigmoidf(gate[(size_t)t * ldg + (size_t)h * hsg + i]);
                float d = dy[(size_t)t * lddy + (size_t)h * D + i]; /* read before dx, which may alias dy */
                dgate[(size_t)t * lddg + (size_t)h * hsg + i] = d * x[(size_t)t * ldx + (size_t)h * D + i] * s * (1.0f - s);
                dx[(size_t)t * lddx + (size_t)h * D + i] = d * s;
            }
}

void cpu_gdn_install(ct_backend *be)
{
    be->gdn_conv_fwd = cpu_gdn_conv_fwd;
    be->gdn_conv_bwd = cpu_gdn_conv_bwd;
    be->gdn_gates_fwd = cpu_gdn_gates_fwd;
    be->gdn_gates_bwd = cpu_gdn_gates_bwd;
    be->gdn_delta_fwd = cpu_gdn_delta_fwd;
    be->gdn_delta_bwd = cpu_gdn_delta_bwd;
    be->gdn_conv_step = cpu_gdn_conv_step;
    be->gdn_delta_step = cpu_gdn_delta_step;
    be->gated_rmsnorm_fwd = cpu_gated_rmsnorm_fwd;
    be->gated_rmsnorm_bwd = cpu_gated_rmsnorm_bwd;
    be->sigmoid_gate_fwd = cpu_sigmoid_gate_fwd;
    be->sigmoid_gate_bwd = cpu_sigmoid_gate_bwd;
}
