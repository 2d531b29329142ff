/* test_gdn_cpu.c — the Gated DeltaNet ops of the CPU backend (backend.h, "Gated DeltaNet"; backend_cpu_gdn.c):
 * every forward and backward against HF transformers' own code (the fixtures of
 * scripts/gdn_fixtures.py, read from tests/fixtures/gdn: run from the repo root),
 * the conv and delta-rule backwards against central finite differences of the
 * fp32 forwards, packed documents against documents run alone, a 4096-token
 * document against a full-storage double backward written here, the decoding
 * steps (a document fed in pieces with explicit states) against the forwards bit
 * for bit, and thread-count independence.
 *
 * Tolerances (all comparisons NaN-proof; check_max_rel_err floors the
 * denominator at 1e-3 of the tensor's largest value, see check.h):
 *  - HF_TOL 1e-4 (max relative) for the element- and row-wise ops (conv, gates,
 *    gated norm, sigmoid gate): each output takes a few fp32 roundings, a few
 *    1e-7 of the largest operand, which the 1e-3 floor turns into up to ~1e-4 on
 *    an element that cancels to ~0 (cpu_oracle.h's FWD_TOL, same reasoning).
 *    Measured: at most 1.1e-5 (the conv's dx).
 *  - The delta rule, against HF run in float64 and against the double reference
 *    below: DELTA_L2_TOL 1e-5 normwise (check_l2_rel_err) and DELTA_MAX_TOL 1e-3
 *    max relative. The fp32 state takes one rounding per token, which over a
 *    document stays ~1e-7 of the tensor's norm (measured 2e-7, also at 4096
 *    tokens); per element, an entry ~1e-3 of the largest carries the largest's
 *    absolute error (measured up to 1.2e-4). A wrong or missing term is O(1).
 *  - FD_TOL 2e-3 on directional derivatives <grad, dir> against central
 *    differences (step FD_EPS 1e-3) of L = <dout, f(x)> through the fp32 forward:
 *    fp32 rounding of L divided by 2 eps is ~1e-4 relative, truncation error
 *    ~eps^2 ~1e-6; a missing term of the gradient shows as O(1). */
#include "cpu_oracle.h"
#include "backend.h"

#include <omp.h>

#define HF_TOL 1e-4
#define DELTA_L2_TOL 1e-5
#define DELTA_MAX_TOL 1e-3
#define FD_EPS 1e-3f
#define FD_TOL 2e-3
#define FIXTURES "tests/fixtures/gdn"

// ---- fixtures ----

/* A file of scripts/gdn_fixtures.py: records of a 16-byte name, an int32 count and
 * that many float32 (little endian, as this machine). */
typedef struct {
    int n;
    char name[24][17];
    int32_t count[24];
    float *data[24];
} fixture;

static bool fixture_load(fixture *f, const char *file)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", FIXTURES, file);
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    bool ok = true;
    char name[16];
    while (ok && fread(name, 1, 16, fp) == 16) {
        ok = f->n < 24 && fread(&f->count[f->n], 4, 1, fp) == 1 && f->count[f->n] >= 0;
        if (!ok) break;
        memcpy(f->name[f->n], name, 16);
        f->data[f->n] = ct_malloc(((size_t)f->count[f->n] + 1) * sizeof(float));
        ok = fread(f->data[f->n], 4, (size_t)f->count[f->n], fp) == (size_t)f->count[f->n];
        f->n++;
    }
    fclose(fp);
    return ok && f->n > 0;
}

/* The record NAME of exactly n floats, or NULL. */
static const float *fx(const fixture *f, const char *name, size_t n)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->name[i], name) == 0) return (size_t)f->count[i] == n ? f->data[i] : NULL;
    return NULL;
}

static void fixture_free(fixture *f)
{
    for (int i = 0; i < f->n; i++) free(f->data[i]);
}

/* True when the "dims" record is exactly want[0..n). */
static bool fx_dims(const fixture *f, const int *want, int n)
{
    const float *d = fx(f, "dims", (size_t)n);
    for (int i = 0; d && i < n; i++)
        if (d[i] != (float)want[i]) return false;
    return d != NULL;
}

// ---- helpers ----

/* (T, w) dense -> rows of stride ld, the gaps NaN (so a read outside the row shows). */
static float *strided(const float *src, int T, int w, int ld)
{
    float *d = fill_f((size_t)T * ld, NAN);
    for (int t = 0; t < T; t++) memcpy(d + (size_t)t * ld, src + (size_t)t * w, (size_t)w * sizeof(float));
    return d;
}

static float *dense(const float *src, int T, int w, int ld)
{
    float *d = ct_malloc((size_t)T * w * sizeof(float));
    for (int t = 0; t < T; t++) memcpy(d + (size_t)t * w, src + (size_t)t * ld, (size_t)w * sizeof(float));
    return d;
}

static void docs_to_cu(int32_t *cu, const int *len, int n_docs)
{
    cu[0] = 0;
    for (int d = 0; d < n_docs; d++) cu[d + 1] = cu[d] + len[d];
}

static void cu_to_pos(int32_t *pos, const int32_t *cu, int n_docs)
{
    for (int d = 0; d < n_docs; d++)
        for (int t = cu[d]; t < cu[d + 1]; t++) pos[t] = t - cu[d];
}

/* The delta rule's two measures (see the tolerances above). */
static bool delta_close(const float *got, const float *want, size_t n, double *l2, double *mx)
{
    *l2 = check_l2_rel_err(got, want, n);
    *mx = check_max_rel_err(got, want, n);
    return *l2 <= DELTA_L2_TOL && *mx <= DELTA_MAX_TOL;
}

static bool same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static double dot_fd(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// ---- the delta rule's inputs, fused as the model lays them out ----

/* q, k, v in one (T, 2 Hk Dk + Hv Dv) buffer, as the conv's output; g, beta dense. */
typedef struct {
    int T, Hk, Hv, Dk, Dv, n_docs;
    int32_t cu[8];
    float *qkv, *g, *beta, *dout;
    float scale;
} delta_in;

static int qkv_ld(const delta_in *in) { return 2 * in->Hk * in->Dk + in->Hv * in->Dv; }
static const float *qp(const delta_in *in, const float *b) { return b; }
static const float *kp(const delta_in *in, const float *b) { return b + (size_t)in->Hk * in->Dk; }
static const float *vp(const delta_in *in, const float *b) { return b + 2 * (size_t)in->Hk * in->Dk; }

static void delta_fwd(const delta_in *in, const float *qkv, float *o)
{
    int ld = qkv_ld(in);
    be->gdn_delta_fwd(be, o, in->Hv * in->Dv, qp(in, qkv), ld, kp(in, qkv), ld, vp(in, qkv), ld, in->g, in->beta,
                      in->cu, in->n_docs, in->T, in->Hk, in->Hv, in->Dk, in->Dv, in->scale);
}

/* dqkv in qkv's layout. */
static void delta_bwd(const delta_in *in, float *dqkv, float *dg, float *dbeta)
{
    int ld = qkv_ld(in);
    be->gdn_delta_bwd(be, dqkv, ld, dqkv + (size_t)in->Hk * in->Dk, ld, dqkv + 2 * (size_t)in->Hk * in->Dk, ld,
                      dg, dbeta, in->dout, in->Hv * in->Dv, qp(in, in->qkv), ld, kp(in, in->qkv), ld,
                      vp(in, in->qkv), ld, in->g, in->beta, in->cu, in->n_docs,
                      in->T, in->Hk, in->Hv, in->Dk, in->Dv, in->scale);
}

/* Random inputs over documents len[0..n_docs): q, k, v ~ U(-1, 1); g in [-1, -0.01]
 * (decays 0.37 .. 0.99); beta in (0.05, 0.95). */
static void delta_in_rand(delta_in *in, const int *len, int n_docs, int Hk, int Hv, int Dk, int Dv)
{
    memset(in, 0, sizeof *in);
    in->Hk = Hk; in->Hv = Hv; in->Dk = Dk; in->Dv = Dv; in->n_docs = n_docs;
    docs_to_cu(in->cu, len, n_docs);
    in->T = in->cu[n_docs];
    in->scale = 1.0f / sqrtf((float)Dk);
    in->qkv = rand_f((size_t)in->T * qkv_ld(in), -1, 1);
    in->g = rand_f((size_t)in->T * Hv, -1.0f, -0.01f);
    in->beta = rand_f((size_t)in->T * Hv, 0.05f, 0.95f);
    in->dout = rand_f((size_t)in->T * Hv * Dv, -1, 1);
}

static void delta_in_free(delta_in *in) { free(in->qkv); free(in->g); free(in->beta); free(in->dout); }

// ---- 1, 2: against HF ----

enum { CONV_C = 8, CONV_W = 4, CONV_NDOCS = 4 };
static const int conv_docs[CONV_NDOCS] = {1, 2, 5, 12};

TEST(conv_fwd_bwd_match_hf)
{
    int T = 20, C = CONV_C, W = CONV_W, ld = C + 3;
    int want[] = {T, C, W, CONV_NDOCS, 1, 2, 5, 12};
    fixture f;
    REQUIRE(fixture_load(&f, "conv.bin") && fx_dims(&f, want, 8), "conv.bin missing or of other sizes (run from the repo root)");
    const float *x = fx(&f, "x", (size_t)T * C), *w = fx(&f, "w", (size_t)C * W), *y = fx(&f, "y", (size_t)T * C);
    const float *dy = fx(&f, "dy", (size_t)T * C), *dx = fx(&f, "dx", (size_t)T * C);
    REQUIRE(x && w && y && dy && dx, "conv.bin lacks a record");
    int32_t cu[CONV_NDOCS + 1], pos[20];
    docs_to_cu(cu, conv_docs, CONV_NDOCS);
    cu_to_pos(pos, cu, CONV_NDOCS);
    float *xs = strided(x, T, C, ld), *dys = strided(dy, T, C, ld);
    float *ys = fill_f((size_t)T * ld, NAN), *dxs = fill_f((size_t)T * ld, NAN);
    be->gdn_conv_fwd(be, ys, ld, xs, ld, w, pos, T, C, W);
    be->gdn_conv_bwd(be, dxs, ld, dys, ld, xs, ld, w, pos, T, C, W);
    float *yd = dense(ys, T, C, ld), *dxd = dense(dxs, T, C, ld);
    double ey = check_max_rel_err(yd, y, (size_t)T * C), edx = check_max_rel_err(dxd, dx, (size_t)T * C);
    CHECK(ey <= HF_TOL && edx <= HF_TOL, "y %.3g dx %.3g", ey, edx);
    free(xs); free(dys); free(ys); free(dxs); free(yd); free(dxd);
    fixture_free(&f);
}

TEST(gates_fwd_bwd_match_hf)
{
    int T = 16, Hv = 4, ld = Hv + 2;
    int want[] = {T, Hv};
    fixture f;
    REQUIRE(fixture_load(&f, "gates.bin") && fx_dims(&f, want, 2), "gates.bin missing or of other sizes");
    size_t n = (size_t)T * Hv;
    const float *a = fx(&f, "a", n), *b = fx(&f, "b", n), *A_log = fx(&f, "A_log", Hv), *dt = fx(&f, "dt_bias", Hv);
    const float *g = fx(&f, "g", n), *beta = fx(&f, "beta", n), *dg = fx(&f, "dg", n), *dbeta = fx(&f, "dbeta", n);
    const float *da = fx(&f, "da", n), *db = fx(&f, "db", n);
    REQUIRE(a && b && A_log && dt && g && beta && dg && dbeta && da && db, "gates.bin lacks a record");
    float *as = strided(a, T, Hv, ld), *bs = strided(b, T, Hv, ld);
    float *go = fill_f(n, NAN), *bo = fill_f(n, NAN), *das = fill_f((size_t)T * ld, NAN), *dbs = fill_f((size_t)T * ld, NAN);
    be->gdn_gates_fwd(be, go, bo, as, ld, bs, ld, A_log, dt, T, Hv);
    be->gdn_gates_bwd(be, das, ld, dbs, ld, dg, dbeta, as, ld, bs, ld, A_log, dt, T, Hv);
    float *dad = dense(das, T, Hv, ld), *dbd = dense(dbs, T, Hv, ld);
    double e[4] = {check_max_rel_err(go, g, n), check_max_rel_err(bo, beta, n),
                   check_max_rel_err(dad, da, n), check_max_rel_err(dbd, db, n)};
    CHECK(e[0] <= HF_TOL && e[1] <= HF_TOL && e[2] <= HF_TOL && e[3] <= HF_TOL,
          "g %.3g beta %.3g da %.3g db %.3g", e[0], e[1], e[2], e[3]);
    free(as); free(bs); free(go); free(bo); free(das); free(dbs); free(dad); free(dbd);
    fixture_free(&f);
}

enum { HF_HK = 2, HF_HV = 4, HF_DK = 8, HF_DV = 6, HF_NDOCS = 5, HF_T = 200 };
static const int hf_docs[HF_NDOCS] = {1, 63, 64, 65, 7};

/* The delta fixture as a delta_in (the caller frees qkv only: g, beta, dout point into f). */
static bool delta_hf_load(fixture *f, delta_in *in)
{
    int want[] = {HF_T, HF_HK, HF_HV, HF_DK, HF_DV, HF_NDOCS, 1, 63, 64, 65, 7};
    if (!fixture_load(f, "delta.bin") || !fx_dims(f, want, 11)) return false;
    memset(in, 0, sizeof *in);
    in->T = HF_T; in->Hk = HF_HK; in->Hv = HF_HV; in->Dk = HF_DK; in->Dv = HF_DV; in->n_docs = HF_NDOCS;
    docs_to_cu(in->cu, hf_docs, HF_NDOCS);
    in->scale = 1.0f / sqrtf((float)HF_DK);
    size_t nk = (size_t)HF_T * HF_HK * HF_DK, nv = (size_t)HF_T * HF_HV * HF_DV, ng = (size_t)HF_T * HF_HV;
    const float *q = fx(f, "q", nk), *k = fx(f, "k", nk), *v = fx(f, "v", nv);
    in->g = (float *)fx(f, "g", ng);
    in->beta = (float *)fx(f, "beta", ng);
    in->dout = (float *)fx(f, "dout", nv);
    if (!q || !k || !v || !in->g || !in->beta || !in->dout || !fx(f, "o", nv)) return false;
    int ld = qkv_ld(in), kd = HF_HK * HF_DK;
    in->qkv = ct_malloc((size_t)HF_T * ld * sizeof(float));
    for (int t = 0; t < HF_T; t++) {
        memcpy(in->qkv + (size_t)t * ld, q + (size_t)t * kd, kd * sizeof(float));
        memcpy(in->qkv + (size_t)t * ld + kd, k + (size_t)t * kd, kd * sizeof(float));
        memcpy(in->qkv + (size_t)t * ld + 2 * kd, v + (size_t)t * HF_HV * HF_DV, HF_HV * HF_DV * sizeof(float));
    }
    return true;
}

TEST(delta_fwd_matches_hf_chunk_rule)
{
    fixture f;
    delta_in in;
    REQUIRE(delta_hf_load(&f, &in), "delta.bin missing, of other sizes or lacking a record");
    size_t nv = (size_t)HF_T * HF_HV * HF_DV;
    float *o = fill_f(nv, NAN);
    delta_fwd(&in, in.qkv, o);
    double l2, mx;
    CHECK(delta_close(o, fx(&f, "o", nv), nv, &l2, &mx), "o: l2 %.3g max %.3g", l2, mx);
    free(o); free(in.qkv);
    fixture_free(&f);
}

TEST(delta_bwd_matches_hf_autograd)
{
    fixture f;
    delta_in in;
    REQUIRE(delta_hf_load(&f, &in), "delta.bin missing, of other sizes or lacking a record");
    int ld = qkv_ld(&in), kd = HF_HK * HF_DK;
    size_t nk = (size_t)HF_T * kd, nv = (size_t)HF_T * HF_HV * HF_DV, ng = (size_t)HF_T * HF_HV;
    const float *wdq = fx(&f, "dq", nk), *wdk = fx(&f, "dk", nk), *wdv = fx(&f, "dv", nv);
    const float *wdg = fx(&f, "dg", ng), *wdb = fx(&f, "dbeta", ng);
    REQUIRE(wdq && wdk && wdv && wdg && wdb, "delta.bin lacks a gradient");
    float *dqkv = fill_f((size_t)HF_T * ld, NAN), *dg = fill_f(ng, NAN), *dbeta = fill_f(ng, NAN);
    delta_bwd(&in, dqkv, dg, dbeta);
    float *dq = ct_malloc(nk * sizeof(float)), *dk = ct_malloc(nk * sizeof(float)), *dv = ct_malloc(nv * sizeof(float));
    for (int t = 0; t < HF_T; t++) {
        memcpy(dq + (size_t)t * kd, dqkv + (size_t)t * ld, kd * sizeof(float));
        memcpy(dk + (size_t)t * kd, dqkv + (size_t)t * ld + kd, kd * sizeof(float));
        memcpy(dv + (size_t)t * HF_HV * HF_DV, dqkv + (size_t)t * ld + 2 * kd, HF_HV * HF_DV * sizeof(float));
    }
    const char *names[5] = {"dq", "dk", "dv", "dg", "dbeta"};
    const float *got[5] = {dq, dk, dv, dg, dbeta}, *want[5] = {wdq, wdk, wdv, wdg, wdb};
    size_t n[5] = {nk, nk, nv, ng, ng};
    for (int i = 0; i < 5; i++) {
        double l2, mx;
        CHECK(delta_close(got[i], want[i], n[i], &l2, &mx), "%s: l2 %.3g max %.3g", names[i], l2, mx);
    }
    free(dqkv); free(dg); free(dbeta); free(dq); free(dk); free(dv); free(in.qkv);
    fixture_free(&f);
}

TEST(gated_rmsnorm_fwd_bwd_match_hf)
{
    int T = 8, nh = 3, D = 16, w_ = nh * D, ld = w_ + 5;
    int want[] = {T, nh, D};
    fixture f;
    REQUIRE(fixture_load(&f, "gated_norm.bin") && fx_dims(&f, want, 3), "gated_norm.bin missing or of other sizes");
    size_t n = (size_t)T * w_;
    const float *x = fx(&f, "x", n), *z = fx(&f, "z", n), *w = fx(&f, "w", D), *y = fx(&f, "y", n);
    const float *dy = fx(&f, "dy", n), *dx = fx(&f, "dx", n), *dz = fx(&f, "dz", n);
    REQUIRE(x && z && w && y && dy && dx && dz, "gated_norm.bin lacks a record");
    float *xs = strided(x, T, w_, ld), *zs = strided(z, T, w_, ld), *dys = strided(dy, T, w_, ld);
    float *ys = fill_f((size_t)T * ld, NAN), *dxs = fill_f((size_t)T * ld, NAN), *dzs = fill_f((size_t)T * ld, NAN);
    be->gated_rmsnorm_fwd(be, ys, ld, xs, ld, zs, ld, w, T, nh, D, 1e-6f);
    be->gated_rmsnorm_bwd(be, dxs, ld, dzs, ld, dys, ld, xs, ld, zs, ld, w, T, nh, D, 1e-6f);
    float *yd = dense(ys, T, w_, ld), *dxd = dense(dxs, T, w_, ld), *dzd = dense(dzs, T, w_, ld);
    double e[3] = {check_max_rel_err(yd, y, n), check_max_rel_err(dxd, dx, n), check_max_rel_err(dzd, dz, n)};
    CHECK(e[0] <= HF_TOL && e[1] <= HF_TOL && e[2] <= HF_TOL, "y %.3g dx %.3g dz %.3g", e[0], e[1], e[2]);
    free(xs); free(zs); free(dys); free(ys); free(dxs); free(dzs); free(yd); free(dxd); free(dzd);
    fixture_free(&f);
}

TEST(sigmoid_gate_fwd_bwd_match_hf_interleaved_q_proj)
{
    int T = 6, nh = 3, D = 8, lg = nh * 2 * D, lx = nh * D;
    int want[] = {T, nh, D};
    fixture f;
    REQUIRE(fixture_load(&f, "sigmoid_gate.bin") && fx_dims(&f, want, 3), "sigmoid_gate.bin missing or of other sizes");
    size_t n = (size_t)T * lx, ng = (size_t)T * lg;
    const float *qproj = fx(&f, "qproj", ng), *x = fx(&f, "x", n), *y = fx(&f, "y", n);
    const float *dy = fx(&f, "dy", n), *dx = fx(&f, "dx", n), *dqproj = fx(&f, "dqproj", ng);
    REQUIRE(qproj && x && y && dy && dx && dqproj, "sigmoid_gate.bin lacks a record");
    float *yo = fill_f(n, NAN), *dd = ct_malloc(n * sizeof(float)), *dgate = fill_f(ng, 0);
    be->sigmoid_gate_fwd(be, yo, lx, x, lx, qproj + D, lg, 2 * D, T, nh, D);
    memcpy(dd, dy, n * sizeof(float)); /* dx aliases dy, as the contract allows */
    be->sigmoid_gate_bwd(be, dd, lx, dgate + D, lg, dd, lx, x, lx, qproj + D, lg, 2 * D, T, nh, D);
    double e[3] = {check_max_rel_err(yo, y, n), check_max_rel_err(dd, dx, n), check_max_rel_err(dgate, dqproj, ng)};
    CHECK(e[0] <= HF_TOL && e[1] <= HF_TOL && e[2] <= HF_TOL, "y %.3g dx %.3g dgate %.3g", e[0], e[1], e[2]);
    memcpy(dd, x, n * sizeof(float)); /* y aliasing x: the same bits */
    be->sigmoid_gate_fwd(be, dd, lx, dd, lx, qproj + D, lg, 2 * D, T, nh, D);
    CHECK(same_bits(dd, yo, n), "in place differs");
    free(yo); free(dd); free(dgate);
    fixture_free(&f);
}

// ---- 3: finite differences through the fp32 forwards ----

/* <dout, conv(x)> in double. */
static double conv_loss(const float *x, const float *w, const int32_t *pos, const float *dout, int T, int C, int W)
{
    float *y = ct_malloc((size_t)T * C * sizeof(float));
    be->gdn_conv_fwd(be, y, C, x, C, w, pos, T, C, W);
    double s = dot_fd(y, dout, (size_t)T * C);
    free(y);
    return s;
}

TEST(conv_bwd_matches_finite_differences)
{
    int T = 20, C = 5, W = 4;
    int32_t cu[CONV_NDOCS + 1], pos[20];
    docs_to_cu(cu, conv_docs, CONV_NDOCS);
    cu_to_pos(pos, cu, CONV_NDOCS);
    size_t n = (size_t)T * C;
    float *x = rand_f(n, -2, 2), *w = rand_f((size_t)C * W, -1, 1), *dout = rand_f(n, -1, 1), *dx = fill_f(n, NAN);
    be->gdn_conv_bwd(be, dx, C, dout, C, x, C, w, pos, T, C, W);
    for (int rep = 0; rep < 3; rep++) {
        float *dir = rand_f(n, -1, 1), *xp = ct_malloc(n * sizeof(float)), *xm = ct_malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            xp[i] = x[i] + FD_EPS * dir[i];
            xm[i] = x[i] - FD_EPS * dir[i];
        }
        double fd = (conv_loss(xp, w, pos, dout, T, C, W) - conv_loss(xm, w, pos, dout, T, C, W)) / (2.0 * FD_EPS);
        double an = dot_fd(dx, dir, n), e = check_rel_err(an, fd, 1e-3);
        CHECK(e <= FD_TOL, "direction %d: analytic %.6g, differences %.6g (rel %.3g)", rep, an, fd, e);
        free(dir); free(xp); free(xm);
    }
    free(x); free(w); free(dout); free(dx);
}

/* <dout, delta(qkv, g, beta)> in double. */
static double delta_loss(const delta_in *in, const float *qkv)
{
    size_t no = (size_t)in->T * in->Hv * in->Dv;
    float *o = ct_malloc(no * sizeof(float));
    delta_fwd(in, qkv, o);
    double s = dot_fd(o, in->dout, no);
    free(o);
    return s;
}

/* What one direction perturbs: q, k, v (columns of qkv), g or beta. */
enum { DIR_Q, DIR_K, DIR_V, DIR_G, DIR_BETA, DIR_ALL };
static const char *dir_name[] = {"q", "k", "v", "g", "beta", "all"};

/* One central difference on random direction(s) of `which`; returns the relative error. */
static double delta_fd_check(delta_in *in, const float *dqkv, const float *dg, const float *dbeta, int which,
                             double *an_out, double *fd_out)
{
    int ld = qkv_ld(in), kd = in->Hk * in->Dk;
    size_t nq = (size_t)in->T * ld, ng = (size_t)in->T * in->Hv;
    float *dq = fill_f(nq, 0), *dgd = fill_f(ng, 0), *dbd = fill_f(ng, 0);
    for (int t = 0; t < in->T; t++)
        for (int c = 0; c < ld; c++) {
            int part = c < kd ? DIR_Q : c < 2 * kd ? DIR_K : DIR_V;
            if (which == part || which == DIR_ALL) dq[(size_t)t * ld + c] = (float)(2 * ct_rng_uniform(&rng) - 1);
        }
    for (size_t i = 0; i < ng; i++) {
        if (which == DIR_G || which == DIR_ALL) dgd[i] = (float)(2 * ct_rng_uniform(&rng) - 1);
        if (which == DIR_BETA || which == DIR_ALL) dbd[i] = (float)(2 * ct_rng_uniform(&rng) - 1);
    }
    float *g0 = in->g, *b0 = in->beta, *qp_ = ct_malloc(nq * sizeof(float)), *qm = ct_malloc(nq * sizeof(float));
    float *gp = ct_malloc(ng * sizeof(float)), *gm = ct_malloc(ng * sizeof(float));
    float *bp = ct_malloc(ng * sizeof(float)), *bm = ct_malloc(ng * sizeof(float));
    for (size_t i = 0; i < nq; i++) {
        qp_[i] = in->qkv[i] + FD_EPS * dq[i];
        qm[i] = in->qkv[i] - FD_EPS * dq[i];
    }
    for (size_t i = 0; i < ng; i++) {
        gp[i] = g0[i] + FD_EPS * dgd[i]; gm[i] = g0[i] - FD_EPS * dgd[i];
        bp[i] = b0[i] + FD_EPS * dbd[i]; bm[i] = b0[i] - FD_EPS * dbd[i];
    }
    in->g = gp; in->beta = bp;
    double lp = delta_loss(in, qp_);
    in->g = gm; in->beta = bm;
    double lm = delta_loss(in, qm);
    in->g = g0; in->beta = b0;
    double fd = (lp - lm) / (2.0 * FD_EPS);
    double an = dot_fd(dqkv, dq, nq) + dot_fd(dg, dgd, ng) + dot_fd(dbeta, dbd, ng);
    *an_out = an;
    *fd_out = fd;
    free(dq); free(dgd); free(dbd); free(qp_); free(qm); free(gp); free(gm); free(bp); free(bm);
    return check_rel_err(an, fd, 1e-3);
}

TEST(delta_bwd_matches_finite_differences)
{
    /* Documents around the backward's 64-token checkpoint blocks; GVA; Dk != Dv. */
    int len[3] = {5, 70, 1};
    delta_in in;
    delta_in_rand(&in, len, 3, 2, 4, 6, 5);
    int ld = qkv_ld(&in);
    size_t ng = (size_t)in.T * in.Hv;
    float *dqkv = fill_f((size_t)in.T * ld, NAN), *dg = fill_f(ng, NAN), *dbeta = fill_f(ng, NAN);
    delta_bwd(&in, dqkv, dg, dbeta);
    for (int which = DIR_Q; which <= DIR_ALL; which++) {
        double an, fd, e = delta_fd_check(&in, dqkv, dg, dbeta, which, &an, &fd);
        CHECK(e <= FD_TOL, "direction %s: analytic %.6g, differences %.6g (rel %.3g)", dir_name[which], an, fd, e);
    }
    free(dqkv); free(dg); free(dbeta);
    delta_in_free(&in);
}

// ---- 4: packed batches equal documents alone ----

TEST(conv_packed_equals_documents_alone_and_ignores_other_documents)
{
    int T = 20, C = 6, W = 4;
    int32_t cu[CONV_NDOCS + 1], pos[20];
    docs_to_cu(cu, conv_docs, CONV_NDOCS);
    cu_to_pos(pos, cu, CONV_NDOCS);
    size_t n = (size_t)T * C;
    float *x = rand_f(n, -2, 2), *w = rand_f((size_t)C * W, -1, 1), *dy = rand_f(n, -1, 1);
    float *y = ct_malloc(n * sizeof(float)), *dx = ct_malloc(n * sizeof(float));
    float *y1 = ct_malloc(n * sizeof(float)), *dx1 = ct_malloc(n * sizeof(float));
    float *xg = ct_malloc(n * sizeof(float)), *dyg = ct_malloc(n * sizeof(float));
    be->gdn_conv_fwd(be, y, C, x, C, w, pos, T, C, W);
    be->gdn_conv_bwd(be, dx, C, dy, C, x, C, w, pos, T, C, W);
    for (int d = 0; d < CONV_NDOCS; d++) {
        int s = cu[d], len = cu[d + 1] - cu[d];
        size_t off = (size_t)s * C, m = (size_t)len * C;
        be->gdn_conv_fwd(be, y1, C, x + off, C, w, pos + s, len, C, W);
        be->gdn_conv_bwd(be, dx1, C, dy + off, C, x + off, C, w, pos + s, len, C, W);
        CHECK(same_bits(y1, y + off, m) && same_bits(dx1, dx + off, m), "document %d alone differs", d);
        /* The whole batch again with every other document's tokens NaN. */
        for (size_t i = 0; i < n; i++) {
            bool in_doc = i >= off && i < off + m;
            xg[i] = in_doc ? x[i] : NAN;
            dyg[i] = in_doc ? dy[i] : NAN;
        }
        be->gdn_conv_fwd(be, y1, C, xg, C, w, pos, T, C, W);
        be->gdn_conv_bwd(be, dx1, C, dyg, C, xg, C, w, pos, T, C, W);
        CHECK(same_bits(y1 + off, y + off, m) && same_bits(dx1 + off, dx + off, m),
              "document %d changes with NaN in the other documents", d);
    }
    free(x); free(w); free(dy); free(y); free(dx); free(y1); free(dx1); free(xg); free(dyg);
}

TEST(delta_packed_equals_documents_alone_and_ignores_other_documents)
{
    int len[3] = {7, 1, 66};
    delta_in in;
    delta_in_rand(&in, len, 3, 2, 4, 6, 5);
    int ld = qkv_ld(&in), T = in.T, Hv = in.Hv, lo = Hv * in.Dv;
    size_t nq = (size_t)T * ld, ng = (size_t)T * Hv, no = (size_t)T * lo;
    float *o = ct_malloc(no * sizeof(float)), *dqkv = ct_malloc(nq * sizeof(float));
    float *dg = ct_malloc(ng * sizeof(float)), *dbeta = ct_malloc(ng * sizeof(float));
    float *o1 = ct_malloc(no * sizeof(float)), *dqkv1 = ct_malloc(nq * sizeof(float));
    float *dg1 = ct_malloc(ng * sizeof(float)), *dbeta1 = ct_malloc(ng * sizeof(float));
    delta_fwd(&in, in.qkv, o);
    delta_bwd(&in, dqkv, dg, dbeta);
    for (int d = 0; d < 3; d++) {
        int s = in.cu[d], n = in.cu[d + 1] - s;
        /* Alone: the document's rows as a batch of one. */
        delta_in one = in;
        one.T = n; one.n_docs = 1; one.cu[0] = 0; one.cu[1] = n;
        one.qkv = in.qkv + (size_t)s * ld; one.g = in.g + (size_t)s * Hv; one.beta = in.beta + (size_t)s * Hv;
        one.dout = in.dout + (size_t)s * lo;
        delta_fwd(&one, one.qkv, o1);
        delta_bwd(&one, dqkv1, dg1, dbeta1);
        CHECK(same_bits(o1, o + (size_t)s * lo, (size_t)n * lo) && same_bits(dqkv1, dqkv + (size_t)s * ld, (size_t)n * ld)
              && same_bits(dg1, dg + (size_t)s * Hv, (size_t)n * Hv) && same_bits(dbeta1, dbeta + (size_t)s * Hv, (size_t)n * Hv),
              "document %d alone differs", d);
        /* Packed, with every other document's inputs NaN. */
        delta_in nan_in = in;
        nan_in.qkv = ct_malloc(nq * sizeof(float)); nan_in.g = ct_malloc(ng * sizeof(float));
        nan_in.beta = ct_malloc(ng * sizeof(float)); nan_in.dout = ct_malloc(no * sizeof(float));
        for (int t = 0; t < T; t++) {
            bool keep = t >= s && t < s + n;
            for (int c = 0; c < ld; c++) nan_in.qkv[(size_t)t * ld + c] = keep ? in.qkv[(size_t)t * ld + c] : NAN;
            for (int c = 0; c < lo; c++) nan_in.dout[(size_t)t * lo + c] = keep ? in.dout[(size_t)t * lo + c] : NAN;
            for (int h = 0; h < Hv; h++) {
                nan_in.g[(size_t)t * Hv + h] = keep ? in.g[(size_t)t * Hv + h] : NAN;
                nan_in.beta[(size_t)t * Hv + h] = keep ? in.beta[(size_t)t * Hv + h] : NAN;
            }
        }
        delta_fwd(&nan_in, nan_in.qkv, o1);
        delta_bwd(&nan_in, dqkv1, dg1, dbeta1);
        CHECK(same_bits(o1 + (size_t)s * lo, o + (size_t)s * lo, (size_t)n * lo)
              && same_bits(dqkv1 + (size_t)s * ld, dqkv + (size_t)s * ld, (size_t)n * ld)
              && same_bits(dg1 + (size_t)s * Hv, dg + (size_t)s * Hv, (size_t)n * Hv)
              && same_bits(dbeta1 + (size_t)s * Hv, dbeta + (size_t)s * Hv, (size_t)n * Hv),
              "document %d changes with NaN in the other documents", d);
        delta_in_free(&nan_in);
    }
    free(o); free(dqkv); free(dg); free(dbeta); free(o1); free(dqkv1); free(dg1); free(dbeta1);
    delta_in_free(&in);
}

TEST(delta_leaves_tokens_past_the_last_document_untouched)
{
    int len[2] = {3, 4};
    delta_in in;
    delta_in_rand(&in, len, 2, 1, 2, 4, 3);
    int T = in.T, ld = qkv_ld(&in), lo = in.Hv * in.Dv, pad = 2;
    /* Buffers of T + pad rows; the last pad rows must keep their sentinel. */
    float *o = fill_f((size_t)(T + pad) * lo, -7), *dqkv = fill_f((size_t)(T + pad) * ld, -7);
    float *dg = fill_f((size_t)(T + pad) * in.Hv, -7), *dbeta = fill_f((size_t)(T + pad) * in.Hv, -7);
    delta_fwd(&in, in.qkv, o);
    delta_bwd(&in, dqkv, dg, dbeta);
    bool kept = true;
    for (size_t i = (size_t)T * lo; i < (size_t)(T + pad) * lo; i++) kept &= o[i] == -7;
    for (size_t i = (size_t)T * ld; i < (size_t)(T + pad) * ld; i++) kept &= dqkv[i] == -7;
    for (size_t i = (size_t)T * in.Hv; i < (size_t)(T + pad) * in.Hv; i++) kept &= dg[i] == -7 && dbeta[i] == -7;
    CHECK(kept && o[0] != -7 && dqkv[0] != -7 && dg[0] != -7, "rows past cu_seqlens[n_docs] were written (or row 0 was not)");
    free(o); free(dqkv); free(dg); free(dbeta);
    delta_in_free(&in);
}

// ---- 5: a long document against a full-storage double backward ----

/* The gated delta rule of one document (contiguous q, k (T,Hk,Dk), v (T,Hv,Dv)) in
 * double, every state kept, and its backward: the reference the checkpointed
 * fp32 backward must match. o, dq, dk, dv, dg, dbeta dense. */
static void ref_delta(double *o, double *dq, double *dk, double *dv, double *dg, double *dbeta,
                      const double *q, const double *k, const double *v, const double *g, const double *beta,
                      const double *dout, int T, int Hk, int Hv, int Dk, int Dv, double scale)
{
    size_t DS = (size_t)Dk * Dv;
    double *S = ct_calloc((size_t)(T + 1) * DS, sizeof(double)); /* S[t+1]: after token t */
    double *qn = ct_malloc((size_t)T * Dk * sizeof(double)), *kn = ct_malloc((size_t)T * Dk * sizeof(double));
    double *dS = ct_malloc(DS * sizeof(double)), *Sd = ct_malloc(DS * sizeof(double));
    double e[64], u[64], du[64], dqn[64], dkn[64];
    memset(dq, 0, (size_t)T * Hk * Dk * sizeof(double));
    memset(dk, 0, (size_t)T * Hk * Dk * sizeof(double));
    for (int h = 0; h < Hv; h++) {
        int kh = h / (Hv / Hk);
        for (int t = 0; t < T; t++) {
            const double *qt = q + ((size_t)t * Hk + kh) * Dk, *kt = k + ((size_t)t * Hk + kh) * Dk;
            double rq = 1 / sqrt(dot_d(qt, qt, Dk) + 1e-6), rk = 1 / sqrt(dot_d(kt, kt, Dk) + 1e-6);
            for (int i = 0; i < Dk; i++) {
                qn[(size_t)t * Dk + i] = qt[i] * rq * scale;
                kn[(size_t)t * Dk + i] = kt[i] * rk;
            }
            const double *vt = v + ((size_t)t * Hv + h) * Dv, *knt = kn + (size_t)t * Dk;
            double a = exp(g[(size_t)t * Hv + h]), *Sn = S + (size_t)(t + 1) * DS;
            for (size_t x = 0; x < DS; x++) Sn[x] = a * S[(size_t)t * DS + x];
            for (int j = 0; j < Dv; j++) {
                e[j] = vt[j];
                for (int i = 0; i < Dk; i++) e[j] -= Sn[(size_t)i * Dv + j] * knt[i];
                u[j] = beta[(size_t)t * Hv + h] * e[j];
            }
            for (int i = 0; i < Dk; i++)
                for (int j = 0; j < Dv; j++) Sn[(size_t)i * Dv + j] += knt[i] * u[j];
            for (int j = 0; j < Dv; j++) {
                double s = 0;
                for (int i = 0; i < Dk; i++) s += Sn[(size_t)i * Dv + j] * qn[(size_t)t * Dk + i];
                o[((size_t)t * Hv + h) * Dv + j] = s;
            }
        }
        memset(dS, 0, DS * sizeof(double));
        for (int t = T - 1; t >= 0; t--) {
            size_t th = (size_t)t * Hv + h;
            const double *vt = v + th * Dv, *dot_ = dout + th * Dv, *knt = kn + (size_t)t * Dk, *qnt = qn + (size_t)t * Dk;
            const double *St = S + (size_t)(t + 1) * DS;
            double a = exp(g[th]), bt = beta[th];
            for (size_t x = 0; x < DS; x++) Sd[x] = a * S[(size_t)t * DS + x];
            for (int j = 0; j < Dv; j++) {
                e[j] = vt[j];
                for (int i = 0; i < Dk; i++) e[j] -= Sd[(size_t)i * Dv + j] * knt[i];
                u[j] = bt * e[j];
            }
            for (int i = 0; i < Dk; i++) {
                dqn[i] = 0;
                for (int j = 0; j < Dv; j++) {
                    dqn[i] += St[(size_t)i * Dv + j] * dot_[j];
                    dS[(size_t)i * Dv + j] += qnt[i] * dot_[j];
                }
            }
            for (int j = 0; j < Dv; j++) {
                du[j] = 0;
                for (int i = 0; i < Dk; i++) du[j] += dS[(size_t)i * Dv + j] * knt[i];
            }
            for (int i = 0; i < Dk; i++) {
                dkn[i] = 0;
                for (int j = 0; j < Dv; j++) dkn[i] += dS[(size_t)i * Dv + j] * u[j];
            }
            dbeta[th] = dot_d(du, e, Dv);
            for (int j = 0; j < Dv; j++) dv[th * Dv + j] = bt * du[j];
            double gs = 0;
            for (int i = 0; i < Dk; i++)
                for (int j = 0; j < Dv; j++) {
                    size_t x = (size_t)i * Dv + j;
                    dS[x] -= knt[i] * bt * du[j];
                    dkn[i] -= Sd[x] * bt * du[j];
                    gs += dS[x] * Sd[x];
                    dS[x] *= a;
                }
            dg[th] = gs;
            const double *qt = q + ((size_t)t * Hk + kh) * Dk, *kt = k + ((size_t)t * Hk + kh) * Dk;
            double rq = 1 / sqrt(dot_d(qt, qt, Dk) + 1e-6), rk = 1 / sqrt(dot_d(kt, kt, Dk) + 1e-6);
            double qd = dot_d(qt, dqn, Dk), kdd = dot_d(kt, dkn, Dk);
            for (int i = 0; i < Dk; i++) {
                dq[((size_t)t * Hk + kh) * Dk + i] += scale * (rq * dqn[i] - rq * rq * rq * qd * qt[i]);
                dk[((size_t)t * Hk + kh) * Dk + i] += rk * dkn[i] - rk * rk * rk * kdd * kt[i];
            }
        }
    }
    free(S); free(qn); free(kn); free(dS); free(Sd);
}

TEST(delta_long_document_bwd_matches_full_storage_reference)
{
    enum { T = 4096, Hk = 1, Hv = 2, Dk = 16, Dv = 8 };
    int len[1] = {T};
    delta_in in;
    delta_in_rand(&in, len, 1, Hk, Hv, Dk, Dv);
    int ld = qkv_ld(&in);
    size_t nk = (size_t)T * Hk * Dk, nv = (size_t)T * Hv * Dv, ng = (size_t)T * Hv;
    /* Long memory: decays 0.9 .. 0.999, so the state carries across many blocks. */
    for (size_t i = 0; i < ng; i++) in.g[i] = -0.001f - 0.1f * (float)ct_rng_uniform(&rng);
    float *qf = dense(qp(&in, in.qkv), T, Hk * Dk, ld), *kf = dense(kp(&in, in.qkv), T, Hk * Dk, ld);
    float *vf = dense(vp(&in, in.qkv), T, Hv * Dv, ld);
    double *q = to_d(qf, nk), *k = to_d(kf, nk), *v = to_d(vf, nv), *g = to_d(in.g, ng), *beta = to_d(in.beta, ng);
    double *dout = to_d(in.dout, nv);
    double *o = ct_malloc(nv * sizeof(double)), *dq = ct_malloc(nk * sizeof(double)), *dk = ct_malloc(nk * sizeof(double));
    double *dv = ct_malloc(nv * sizeof(double)), *dg = ct_malloc(ng * sizeof(double)), *dbeta = ct_malloc(ng * sizeof(double));
    ref_delta(o, dq, dk, dv, dg, dbeta, q, k, v, g, beta, dout, T, Hk, Hv, Dk, Dv, in.scale);

    float *of = ct_malloc(nv * sizeof(float)), *dqkv = fill_f((size_t)T * ld, NAN);
    float *dgf = fill_f(ng, NAN), *dbf = fill_f(ng, NAN);
    delta_fwd(&in, in.qkv, of);
    delta_bwd(&in, dqkv, dgf, dbf);
    float *dqf = dense(dqkv, T, Hk * Dk, ld), *dkf = dense(dqkv + Hk * Dk, T, Hk * Dk, ld);
    float *dvf = dense(dqkv + 2 * Hk * Dk, T, Hv * Dv, ld);
    float *wo = to_f(o, nv), *wdq = to_f(dq, nk), *wdk = to_f(dk, nk), *wdv = to_f(dv, nv);
    float *wdg = to_f(dg, ng), *wdb = to_f(dbeta, ng);
    const char *names[6] = {"o", "dq", "dk", "dv", "dg", "dbeta"};
    const float *got[6] = {of, dqf, dkf, dvf, dgf, dbf}, *want[6] = {wo, wdq, wdk, wdv, wdg, wdb};
    size_t n[6] = {nv, nk, nk, nv, ng, ng};
    for (int i = 0; i < 6; i++) {
        double l2, mx;
        CHECK(delta_close(got[i], want[i], n[i], &l2, &mx), "%s: l2 %.3g max %.3g", names[i], l2, mx);
    }
    free(qf); free(kf); free(vf); free(q); free(k); free(v); free(g); free(beta); free(dout);
    free(o); free(dq); free(dk); free(dv); free(dg); free(dbeta);
    free(of); free(dqkv); free(dgf); free(dbf); free(dqf); free(dkf); free(dvf);
    free(wo); free(wdq); free(wdk); free(wdv); free(wdg); free(wdb);
    delta_in_free(&in);
}

// ---- decoding steps ----

/* A document's pieces as generate.c feeds them: the prompt in chunks, then one token at a time. */
enum { STEP_T = 70, STEP_NPIECES = 7 };
static const int step_pieces[STEP_NPIECES] = {1, 2, 5, 1, 13, 47, 1};

static bool all_finite(const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return false;
    return true;
}

TEST(conv_steps_over_pieces_equal_conv_fwd_over_the_document)
{
    int T = STEP_T, C = 6, W = 4, ldx = 9;
    int32_t pos[STEP_T];
    for (int t = 0; t < T; t++) pos[t] = t;
    float *x = rand_f((size_t)T * ldx, -2, 2), *w = rand_f((size_t)C * W, -1, 1);
    float *want = ct_malloc((size_t)T * C * sizeof(float)), *got = fill_f((size_t)T * C, NAN);
    float *state = fill_f((size_t)(W - 1) * C, 0.0f);
    be->gdn_conv_fwd(be, want, C, x, ldx, w, pos, T, C, W);
    for (int p = 0, t0 = 0; p < STEP_NPIECES; t0 += step_pieces[p++])
        be->gdn_conv_step(be, got + (size_t)t0 * C, C, state, x + (size_t)t0 * ldx, ldx, w, step_pieces[p], C, W);
    CHECK(all_finite(got, (size_t)T * C) && same_bits(got, want, (size_t)T * C),
          "conv steps differ from conv_fwd (max rel err %.3g)", check_max_rel_err(got, want, (size_t)T * C));
    bool last_rows = true; /* the state is the last W-1 inputs */
    for (int j = 0; j < W - 1; j++)
        for (int c = 0; c < C; c++)
            last_rows &= state[(size_t)j * C + c] == x[(size_t)(T - W + 1 + j) * ldx + c];
    CHECK(last_rows, "the conv state is not the last %d input rows", W - 1);
    free(x); free(w); free(want); free(got); free(state);
}

TEST(delta_steps_over_pieces_equal_delta_fwd_over_the_document)
{
    delta_in in;
    int len[1] = {STEP_T};
    delta_in_rand(&in, len, 1, 2, 4, 8, 6);
    int ld = qkv_ld(&in), Vd = in.Hv * in.Dv;
    size_t n = (size_t)in.T * Vd;
    float *want = ct_malloc(n * sizeof(float)), *got = fill_f(n, NAN);
    float *S = fill_f((size_t)in.Hv * in.Dk * in.Dv, 0.0f);
    delta_fwd(&in, in.qkv, want);
    for (int p = 0, t0 = 0; p < STEP_NPIECES; t0 += step_pieces[p++]) {
        const float *row = in.qkv + (size_t)t0 * ld;
        be->gdn_delta_step(be, got + (size_t)t0 * Vd, Vd, S, qp(&in, row), ld, kp(&in, row), ld, vp(&in, row), ld,
                           in.g + (size_t)t0 * in.Hv, in.beta + (size_t)t0 * in.Hv, step_pieces[p], in.Hk, in.Hv,
                           in.Dk, in.Dv, in.scale);
    }
    CHECK(all_finite(got, n) && same_bits(got, want, n), "delta steps differ from delta_fwd (max rel err %.3g)",
          check_max_rel_err(got, want, n));
    free(want); free(got); free(S);
    delta_in_free(&in);
}

// ---- 6: thread-count independence ----

/* Every op once, all outputs into one buffer, on `threads` OpenMP threads. */
static float *run_all_ops(int threads, const delta_in *in, const float *cx, const float *cw, const int32_t *pos,
                          int T, int C, size_t *n_out)
{
    omp_set_num_threads(threads);
    int ld = qkv_ld(in), Hv = in->Hv, lo = Hv * in->Dv, D = in->Dv, nh = Hv;
    size_t nq = (size_t)in->T * ld, ng = (size_t)in->T * Hv, no = (size_t)in->T * lo, nc = (size_t)T * C;
    size_t n = 2 * nc + nq + 6 * ng + 7 * no;
    float *out = fill_f(n, NAN), *p = out;
    be->gdn_conv_fwd(be, p, C, cx, C, cw, pos, T, C, 4); p += nc;
    be->gdn_conv_bwd(be, p, C, cx, C, cx, C, cw, pos, T, C, 4); p += nc;
    delta_fwd(in, in->qkv, p); p += no;
    be->gdn_delta_bwd(be, p, ld, p + in->Hk * in->Dk, ld, p + 2 * in->Hk * in->Dk, ld, p + nq, p + nq + ng,
                      in->dout, lo, qp(in, in->qkv), ld, kp(in, in->qkv), ld, vp(in, in->qkv), ld, in->g, in->beta,
                      in->cu, in->n_docs, in->T, in->Hk, in->Hv, in->Dk, in->Dv, in->scale);
    p += nq + 2 * ng;
    be->gdn_gates_fwd(be, p, p + ng, in->g, Hv, in->beta, Hv, in->beta, in->g, in->T, Hv);
    be->gdn_gates_bwd(be, p + 2 * ng, Hv, p + 3 * ng, Hv, in->g, in->beta, in->g, Hv, in->beta, Hv, in->beta, in->g,
                      in->T, Hv);
    p += 4 * ng;
    be->gated_rmsnorm_fwd(be, p, lo, in->dout, lo, vp(in, in->qkv), ld, in->beta, in->T, nh, D, 1e-6f); p += no;
    be->gated_rmsnorm_bwd(be, p, lo, p + no, lo, in->dout, lo, in->dout, lo, vp(in, in->qkv), ld, in->beta,
                          in->T, nh, D, 1e-6f);
    p += 2 * no;
    be->sigmoid_gate_fwd(be, p, lo, in->dout, lo, vp(in, in->qkv), ld, D, in->T, nh, D); p += no;
    be->sigmoid_gate_bwd(be, p, lo, p + no, lo, in->dout, lo, in->dout, lo, vp(in, in->qkv), ld, D, in->T, nh, D);
    *n_out = n;
    return out;
}

TEST(results_do_not_depend_on_the_thread_count)
{
    int len[4] = {65, 3, 1, 40};
    delta_in in;
    delta_in_rand(&in, len, 4, 1, 4, 8, 6); /* four value heads per key head: their dq, dk sums have an order */
    int T = 20, C = 7;
    int32_t cu[CONV_NDOCS + 1], pos[20];
    docs_to_cu(cu, conv_docs, CONV_NDOCS);
    cu_to_pos(pos, cu, CONV_NDOCS);
    float *cx = rand_f((size_t)T * C, -2, 2), *cw = rand_f((size_t)C * 4, -1, 1);
    int saved = omp_get_max_threads();
    size_t n1, n2;
    float *a = run_all_ops(1, &in, cx, cw, pos, T, C, &n1), *b = run_all_ops(2, &in, cx, cw, pos, T, C, &n2);
    omp_set_num_threads(saved);
    CHECK(n1 == n2 && same_bits(a, b, n1), "outputs on 1 and 2 threads differ");
    free(a); free(b); free(cx); free(cw);
    delta_in_free(&in);
}

int main(void)
{
    be = backend_cpu_new();
    ct_rng_seed(&rng, 11);
    RUN(conv_fwd_bwd_match_hf);
    RUN(gates_fwd_bwd_match_hf);
    RUN(delta_fwd_matches_hf_chunk_rule);
    RUN(delta_bwd_matches_hf_autograd);
    RUN(gated_rmsnorm_fwd_bwd_match_hf);
    RUN(sigmoid_gate_fwd_bwd_match_hf_interleaved_q_proj);
    RUN(conv_bwd_matches_finite_differences);
    RUN(delta_bwd_matches_finite_differences);
    RUN(conv_packed_equals_documents_alone_and_ignores_other_documents);
    RUN(delta_packed_equals_documents_alone_and_ignores_other_documents);
    RUN(delta_leaves_tokens_past_the_last_document_untouched);
    RUN(delta_long_document_bwd_matches_full_storage_reference);
    RUN(conv_steps_over_pieces_equal_conv_fwd_over_the_document);
    RUN(delta_steps_over_pieces_equal_delta_fwd_over_the_document);
    RUN(results_do_not_depend_on_the_thread_count);
    be->destroy(be);
    return check_summary();
}
