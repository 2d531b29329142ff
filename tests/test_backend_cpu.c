/* test_backend_cpu.c — the CPU reference backend against formulas written
 * here, independently, in double precision: memory and element-wise ops, rmsnorm,
 * GEMM, linear and LoRA, RoPE, cross-entropy and the optimizer (attention is
 * test_backend_cpu_attention.c's). Method and tolerances: cpu_oracle.h. */
#include "cpu_oracle.h"

#include <omp.h>

// ---- double references ----

static void ref_rmsnorm(double *y, int ldy, const double *x, int ldx, const double *w, int T, int nh, int D, double eps)
{
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const double *xr = x + (size_t)t * ldx + (size_t)h * D;
            double ms = dot_d(xr, xr, D) / D;
            for (int i = 0; i < D; i++) y[(size_t)t * ldy + (size_t)h * D + i] = xr[i] / sqrt(ms + eps) * w[i];
        }
}

/* y (T,out) = x (T,in) W^T (+ b) */
static void ref_linear(double *y, const double *x, const double *W, const double *b, int T, int in, int out)
{
    for (int t = 0; t < T; t++)
        for (int o = 0; o < out; o++)
            y[(size_t)t * out + o] = dot_d(x + (size_t)t * in, W + (size_t)o * in, in) + (b ? b[o] : 0);
}

static double dropout_keep(int t, int in, int i, double p, uint64_t seed)
{
    if (p == 0) return 1;
    return ct_hash_uniform(seed, (uint64_t)t * in + i) >= (float)p ? 1 / (1 - p) : 0;
}

/* y (T,out) = scale * (drop(x) A^T) B^T */
static void ref_lora(double *y, const double *x, const double *A, const double *B, int T, int in, int out, int R,
                     double scale, double p, uint64_t seed)
{
    double *u = ct_calloc((size_t)T * R, sizeof(double));
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++)
            for (int i = 0; i < in; i++)
                u[(size_t)t * R + r] += x[(size_t)t * in + i] * dropout_keep(t, in, i, p, seed) * A[(size_t)r * in + i];
    for (int t = 0; t < T; t++)
        for (int o = 0; o < out; o++)
            y[(size_t)t * out + o] = scale * dot_d(u + (size_t)t * R, B + (size_t)o * R, R);
    free(u);
}

// ---- memory and elementwise ops ----

TEST(upload_weight_converts_bf16_f16_and_f32)
{
    uint16_t bf[3] = {0x3f80, 0xc040, 0x3e20};          /* 1, -3, 0.15625 */
    uint16_t hf[5] = {0x3c00, 0xc000, 0x0001, 0x7c00, 0x3555}; /* 1, -2, 2^-24, inf, 0.333251953125 */
    float f32[2] = {1.5f, -7.25f}, got[5];
    float *w = be->alloc(be, 5 * sizeof(float));
    be->upload_weight(be, w, bf, CT_DTYPE_BF16, 3);
    be->download(be, got, w, 3 * sizeof(float));
    CHECK(got[0] == 1.0f && got[1] == -3.0f && got[2] == 0.15625f, "bf16: %g %g %g", got[0], got[1], got[2]);
    be->upload_weight(be, w, hf, CT_DTYPE_F16, 5);
    be->download(be, got, w, 5 * sizeof(float));
    CHECK(got[0] == 1.0f && got[1] == -2.0f && got[2] == ldexpf(1, -24) && isinf(got[3]) && got[4] == 0.333251953125f,
          "f16: %g %g %g %g %g", got[0], got[1], got[2], got[3], got[4]);
    be->upload_weight(be, w, f32, CT_DTYPE_F32, 2);
    be->download(be, got, w, 2 * sizeof(float));
    CHECK(got[0] == 1.5f && got[1] == -7.25f, "f32: %g %g", got[0], got[1]);
    be->free(be, w);
}

TEST(embedding_gathers_table_rows)
{
    int V = 5, H = 3, T = 4, ids[4] = {4, 0, 4, 2};
    float *table = rand_f((size_t)V * H, -1, 1), out[12];
    be->embedding(be, out, ids, table, T, H);
    int same = 1;
    for (int t = 0; t < T; t++) same &= memcmp(out + t * H, table + ids[t] * H, H * sizeof(float)) == 0;
    CHECK(same, "an output row differs from its table row");
    free(table);
}

TEST(add_and_copy_2d_touch_only_their_elements)
{
    float y[6] = {1, 2, 3, 4, 5, 6}, x[6] = {10, 20, 30, 40, 50, 60}, dst[6] = {0};
    be->add(be, y, x, 5);
    CHECK(y[0] == 11 && y[4] == 55 && y[5] == 6, "add: %g %g %g", y[0], y[4], y[5]);
    be->copy_2d(be, dst, 3, x, 2, 2, 2); /* rows of 2 from ld 2 into ld 3 */
    CHECK(dst[0] == 10 && dst[1] == 20 && dst[2] == 0 && dst[3] == 30 && dst[4] == 40 && dst[5] == 0,
          "copy_2d: %g %g %g %g %g %g", dst[0], dst[1], dst[2], dst[3], dst[4], dst[5]);
}

TEST(swiglu_fwd_matches_formula)
{
    int T = 5, I = 7;
    float *gu = rand_f((size_t)T * 2 * I, -4, 4), *h = ct_malloc((size_t)T * I * sizeof(float));
    double *want = ct_malloc((size_t)T * I * sizeof(double));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < I; i++) {
            double g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
            want[t * I + i] = g / (1 + exp(-g)) * u;
        }
    be->swiglu_fwd(be, h, gu, T, I);
    float *wf = to_f(want, (size_t)T * I);
    double e = check_max_rel_err(h, wf, (size_t)T * I);
    CHECK(e <= FWD_TOL, "max rel err %.3g", e);
    free(gu); free(h); free(want); free(wf);
}

struct swiglu_ctx { double *gu, *w; int T, I; };
static double swiglu_obj(void *p)
{
    struct swiglu_ctx *c = p;
    double s = 0;
    for (int t = 0; t < c->T; t++)
        for (int i = 0; i < c->I; i++) {
            double g = c->gu[t * 2 * c->I + i], u = c->gu[t * 2 * c->I + c->I + i];
            s += c->w[t * c->I + i] * g / (1 + exp(-g)) * u;
        }
    return s;
}

TEST(swiglu_bwd_matches_finite_differences)
{
    int T = 4, I = 6;
    size_t n = (size_t)T * 2 * I;
    float *gu = rand_f(n, -4, 4), *dh = rand_f((size_t)T * I, -1, 1), *dgu = ct_malloc(n * sizeof(float));
    struct swiglu_ctx c = {to_d(gu, n), to_d(dh, (size_t)T * I), T, I};
    be->swiglu_bwd(be, dgu, dh, gu, T, I);
    float *fd = fd_grad(c.gu, n, NULL, swiglu_obj, &c);
    double e = check_max_rel_err(dgu, fd, n);
    CHECK(e <= GRAD_TOL, "max rel err %.3g", e);
    free(gu); free(dh); free(dgu); free(c.gu); free(c.w); free(fd);
}

// ---- rmsnorm ----

/* x is (T, ldx) with nh groups of D and padding columns past nh*D. */
enum { RN_T = 3, RN_NH = 2, RN_D = 8, RN_LD = 19 };

TEST(rmsnorm_fwd_matches_formula_with_groups_and_strides)
{
    size_t n = (size_t)RN_T * RN_LD;
    float *x = rand_f(n, -2, 2), *w = rand_f(RN_D, 0.5f, 1.5f), *y = fill_f(n, 9.0f);
    float rstd[RN_T * RN_NH];
    double *xd = to_d(x, n), *wd = to_d(w, RN_D), *want = ct_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) want[i] = 9.0; /* padding must stay untouched */
    ref_rmsnorm(want, RN_LD, xd, RN_LD, wd, RN_T, RN_NH, RN_D, 1e-5);
    be->rmsnorm_fwd(be, y, RN_LD, rstd, x, RN_LD, w, 0, RN_T, RN_NH, RN_D, 1e-5f);
    float *wf = to_f(want, n);
    double e = check_max_rel_err(y, wf, n);
    CHECK(e <= FWD_TOL, "y: max rel err %.3g", e);
    double ms = dot_d(xd + RN_LD + RN_D, xd + RN_LD + RN_D, RN_D) / RN_D; /* row t=1, group 1 */
    CHECK(fabs(rstd[3] - 1 / sqrt(ms + 1e-5)) <= 1e-6 * rstd[3], "rstd %g", rstd[3]);
    free(x); free(w); free(y); free(xd); free(wd); free(want); free(wf);
}

TEST(rmsnorm_fwd_in_place)
{
    int T = 2, D = 16;
    float *x = rand_f((size_t)T * D, -2, 2), *w = rand_f(D, 0.5f, 1.5f), *y = ct_malloc((size_t)T * D * sizeof(float));
    be->rmsnorm_fwd(be, y, D, NULL, x, D, w, 0, T, 1, D, 1e-6f);
    be->rmsnorm_fwd(be, x, D, NULL, x, D, w, 0, T, 1, D, 1e-6f);
    CHECK(memcmp(x, y, (size_t)T * D * sizeof(float)) == 0, "in-place result differs");
    free(x); free(w); free(y);
}

struct rmsnorm_ctx { double *x, *w, *dy, *y; };
static double rmsnorm_obj(void *p)
{
    struct rmsnorm_ctx *c = p;
    ref_rmsnorm(c->y, RN_NH * RN_D, c->x, RN_LD, c->w, RN_T, RN_NH, RN_D, 1e-5);
    return dot_d(c->y, c->dy, RN_T * RN_NH * RN_D);
}

TEST(rmsnorm_bwd_matches_finite_differences)
{
    size_t n = (size_t)RN_T * RN_LD, ny = (size_t)RN_T * RN_NH * RN_D;
    float *x = rand_f(n, -2, 2), *w = rand_f(RN_D, 0.5f, 1.5f), *dy = rand_f(ny, -1, 1);
    float *dx = fill_f(n, 9.0f), rstd[RN_T * RN_NH], *y = ct_malloc(n * sizeof(float));
    be->rmsnorm_fwd(be, y, RN_LD, rstd, x, RN_LD, w, 0, RN_T, RN_NH, RN_D, 1e-5f);
    be->rmsnorm_bwd(be, dx, RN_LD, dy, RN_NH * RN_D, x, RN_LD, rstd, w, 0, RN_T, RN_NH, RN_D, NULL, 0);
    struct rmsnorm_ctx c = {to_d(x, n), to_d(w, RN_D), to_d(dy, ny), ct_malloc(ny * sizeof(double))};
    size_t idx[RN_T * RN_NH * RN_D];
    float got[RN_T * RN_NH * RN_D];
    for (size_t i = 0; i < ny; i++) {
        idx[i] = (i / (RN_NH * RN_D)) * RN_LD + i % (RN_NH * RN_D);
        got[i] = dx[idx[i]];
    }
    float *fd = fd_grad(c.x, ny, idx, rmsnorm_obj, &c);
    double e = check_max_rel_err(got, fd, ny);
    CHECK(e <= GRAD_TOL, "max rel err %.3g", e);
    CHECK(dx[RN_LD - 1] == 9.0f && dx[2 * RN_LD - 1] == 9.0f, "padding of dx was written");
    free(x); free(w); free(dy); free(dx); free(y); free(c.x); free(c.w); free(c.dy); free(c.y); free(fd);
}

TEST(rmsnorm_bwd_adds_the_residual_gradient_in_place_or_not)
{
    int T = 3, D = 8;
    size_t n = (size_t)T * D;
    float *x = rand_f(n, -2, 2), *w = rand_f(D, 0.5f, 1.5f), *dy = rand_f(n, -1, 1), rstd[3];
    float *res = rand_f(n, -1, 1), *over = ct_malloc(n * sizeof(float)), *sep = ct_malloc(n * sizeof(float));
    float *acc = ct_malloc(n * sizeof(float)), *want = ct_malloc(n * sizeof(float));
    memcpy(acc, res, n * sizeof(float));
    be->rmsnorm_fwd(be, over, D, rstd, x, D, w, 0, T, 1, D, 1e-5f);
    be->rmsnorm_bwd(be, over, D, dy, D, x, D, rstd, w, 0, T, 1, D, NULL, 0);
    be->rmsnorm_bwd(be, sep, D, dy, D, x, D, rstd, w, 0, T, 1, D, res, D);
    be->rmsnorm_bwd(be, acc, D, dy, D, x, D, rstd, w, 0, T, 1, D, acc, D);
    for (size_t i = 0; i < n; i++) want[i] = res[i] + over[i];
    double e = check_max_rel_err(sep, want, n), ea = check_max_rel_err(acc, want, n);
    CHECK(e <= FWD_TOL, "separate residual: max rel err %.3g", e);
    CHECK(ea <= FWD_TOL, "residual aliasing dx: max rel err %.3g", ea);
    free(x); free(w); free(dy); free(res); free(over); free(sep); free(acc); free(want);
}

// ---- GEMM, linear, LoRA ----

TEST(sgemm_all_transposes_match_naive_across_blocks)
{
    /* Sizes cross every block edge of the GEMM (MC 64, NC 256, KC 256, MR 4, NR 8). */
    int M = 70, N = 261, K = 300, pad = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int beta = 0; beta < 2; beta++) {
                int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
                float *A = rand_f((size_t)(ta ? K : M) * lda, -1, 1), *B = rand_f((size_t)(tb ? N : K) * ldb, -1, 1);
                float *C = fill_f((size_t)M * ldc, beta ? 0.25f : NAN); /* beta 0 must not read C */
                float *got = ct_malloc((size_t)M * N * sizeof(float)), *want = ct_malloc((size_t)M * N * sizeof(float));
                cpu_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, (float)beta, C, ldc);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double s = 0;
                        for (int k = 0; k < K; k++)
                            s += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                                 (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                        want[i * N + j] = (float)(0.5 * s + (beta ? 0.25 : 0));
                        got[i * N + j] = C[(size_t)i * ldc + j];
                    }
                double e = check_max_rel_err(got, want, (size_t)M * N);
                CHECK(e <= GEMM_TOL, "ta %d tb %d beta %d: max rel err %.3g", ta, tb, beta, e);
                CHECK(isnan(C[ldc - 1]) || beta, "ta %d tb %d: wrote past column N", ta, tb);
                free(A); free(B); free(C); free(got); free(want);
            }
}

TEST(sgemm_result_independent_of_thread_count)
{
    int M = 200, N = 300, K = 280;
    float *A = rand_f((size_t)M * K, -1, 1), *B = rand_f((size_t)N * K, -1, 1);
    float *c1 = ct_malloc((size_t)M * N * sizeof(float)), *c3 = ct_malloc((size_t)M * N * sizeof(float));
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    cpu_sgemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, c1, N);
    omp_set_num_threads(3);
    cpu_sgemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, c3, N);
    omp_set_num_threads(saved);
    CHECK(memcmp(c1, c3, (size_t)M * N * sizeof(float)) == 0, "1 and 3 threads give different bits");
    free(A); free(B); free(c1); free(c3);
}

TEST(linear_fwd_matches_formula_with_bias_into_ldy_slice)
{
    int T = 5, in = 12, out = 7, ldy = 10;
    float *x = rand_f((size_t)T * in, -1, 1), *W = rand_f((size_t)out * in, -1, 1), *b = rand_f(out, -1, 1);
    float *y = fill_f((size_t)T * ldy, 9.0f), got[35], want[35];
    double *yd = ct_malloc((size_t)T * out * sizeof(double)), *xd = to_d(x, (size_t)T * in);
    double *Wd = to_d(W, (size_t)out * in), *bd = to_d(b, out);
    ref_linear(yd, xd, Wd, bd, T, in, out);
    be->linear_fwd(be, y, ldy, x, in, W, b, T, in, out, 0);
    int pad_ok = 1;
    for (int t = 0; t < T; t++) {
        for (int o = 0; o < out; o++) { got[t * out + o] = y[t * ldy + o]; want[t * out + o] = (float)yd[t * out + o]; }
        for (int o = out; o < ldy; o++) pad_ok &= y[t * ldy + o] == 9.0f;
    }
    double e = check_max_rel_err(got, want, (size_t)T * out);
    CHECK(e <= GEMM_TOL, "max rel err %.3g", e);
    CHECK(pad_ok, "columns past out were written");
    free(x); free(W); free(b); free(y); free(yd); free(xd); free(Wd); free(bd);
}

TEST(linear_fwd_accumulates)
{
    int T = 4, in = 9, out = 6;
    float *x = rand_f((size_t)T * in, -1, 1), *W = rand_f((size_t)out * in, -1, 1), *b = rand_f(out, -1, 1);
    float *over = ct_malloc((size_t)T * out * sizeof(float)), *acc = fill_f((size_t)T * out, 2.0f), want[24];
    be->linear_fwd(be, over, out, x, in, W, b, T, in, out, 0);
    be->linear_fwd(be, acc, out, x, in, W, b, T, in, out, 1);
    for (int i = 0; i < T * out; i++) want[i] = 2.0f + over[i];
    double e = check_max_rel_err(acc, want, (size_t)T * out);
    CHECK(e <= FWD_TOL, "max rel err %.3g", e);
    free(x); free(W); free(b); free(over); free(acc);
}

struct linear_ctx { double *x, *W, *w, *y; int T, in, out; };
static double linear_obj(void *p)
{
    struct linear_ctx *c = p;
    ref_linear(c->y, c->x, c->W, NULL, c->T, c->in, c->out);
    return dot_d(c->y, c->w, (size_t)c->T * c->out);
}

TEST(linear_bwd_input_matches_finite_differences_and_accumulates)
{
    int T = 4, in = 10, out = 6, lddx = 13;
    float *x = rand_f((size_t)T * in, -1, 1), *W = rand_f((size_t)out * in, -1, 1), *dy = rand_f((size_t)T * out, -1, 1);
    float *dx = fill_f((size_t)T * lddx, 0.5f), got[40];
    struct linear_ctx c = {to_d(x, (size_t)T * in), to_d(W, (size_t)out * in), to_d(dy, (size_t)T * out),
                           ct_malloc((size_t)T * out * sizeof(double)), T, in, out};
    be->linear_bwd_input(be, dx, lddx, dy, out, W, T, in, out, 1);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < in; i++) got[t * in + i] = dx[t * lddx + i] - 0.5f;
    float *fd = fd_grad(c.x, (size_t)T * in, NULL, linear_obj, &c);
    double e = check_max_rel_err(got, fd, (size_t)T * in);
    CHECK(e <= GRAD_TOL, "max rel err %.3g", e);
    CHECK(dx[in] == 0.5f && dx[lddx - 1] == 0.5f, "columns past in were written");
    free(x); free(W); free(dy); free(dx); free(c.x); free(c.W); free(c.w); free(c.y); free(fd);
}

enum { LO_T = 5, LO_IN = 9, LO_OUT = 7, LO_R = 3 };
#define LO_SCALE 1.75f
#define LO_SEED 1234u

TEST(lora_fwd_adds_scaled_low_rank_product_with_and_without_dropout)
{
    float ps[2] = {0.0f, 0.4f};
    for (int k = 0; k < 2; k++) {
        float *x = rand_f(LO_T * LO_IN, -1, 1), *A = rand_f(LO_R * LO_IN, -1, 1), *B = rand_f(LO_OUT * LO_R, -1, 1);
        float *y = fill_f(LO_T * LO_OUT, 0.5f), want[LO_T * LO_OUT];
        double yd[LO_T * LO_OUT], *xd = to_d(x, LO_T * LO_IN), *Ad = to_d(A, LO_R * LO_IN), *Bd = to_d(B, LO_OUT * LO_R);
        ref_lora(yd, xd, Ad, Bd, LO_T, LO_IN, LO_OUT, LO_R, LO_SCALE, ps[k], LO_SEED);
        for (int i = 0; i < LO_T * LO_OUT; i++) want[i] = (float)(0.5 + yd[i]);
        be->lora_fwd(be, y, LO_OUT, x, LO_IN, A, B, LO_T, LO_IN, LO_OUT, LO_R, LO_SCALE, ps[k], LO_SEED, NULL, 0);
        double e = check_max_rel_err(y, want, LO_T * LO_OUT);
        CHECK(e <= GEMM_TOL, "p %g: max rel err %.3g", ps[k], e);
        free(x); free(A); free(B); free(y); free(xd); free(Ad); free(Bd);
    }
}

struct lora_ctx { double *x, *A, *B, *w; double p; };
static double lora_obj(void *p)
{
    struct lora_ctx *c = p;
    double y[LO_T * LO_OUT];
    ref_lora(y, c->x, c->A, c->B, LO_T, LO_IN, LO_OUT, LO_R, LO_SCALE, c->p, LO_SEED);
    return dot_d(y, c->w, LO_T * LO_OUT);
}

static void check_lora_bwd(float p)
{
    float *x = rand_f(LO_T * LO_IN, -1, 1), *A = rand_f(LO_R * LO_IN, -1, 1), *B = rand_f(LO_OUT * LO_R, -1, 1);
    float *dy = rand_f(LO_T * LO_OUT, -1, 1);
    /* dA, dB and dx all accumulate: start them from non-zero values. */
    float *dA = fill_f(LO_R * LO_IN, 0.25f), *dB = fill_f(LO_OUT * LO_R, 0.25f), *dx = fill_f(LO_T * LO_IN, 0.25f);
    be->lora_bwd(be, dx, LO_IN, dA, dB, dy, LO_OUT, x, LO_IN, A, B, LO_T, LO_IN, LO_OUT, LO_R, LO_SCALE, p, LO_SEED, NULL, 0);
    for (int i = 0; i < LO_R * LO_IN; i++) dA[i] -= 0.25f;
    for (int i = 0; i < LO_OUT * LO_R; i++) dB[i] -= 0.25f;
    for (int i = 0; i < LO_T * LO_IN; i++) dx[i] -= 0.25f;
    struct lora_ctx c = {to_d(x, LO_T * LO_IN), to_d(A, LO_R * LO_IN), to_d(B, LO_OUT * LO_R), to_d(dy, LO_T * LO_OUT), p};
    float *fa = fd_grad(c.A, LO_R * LO_IN, NULL, lora_obj, &c);
    float *fb = fd_grad(c.B, LO_OUT * LO_R, NULL, lora_obj, &c);
    float *fx = fd_grad(c.x, LO_T * LO_IN, NULL, lora_obj, &c);
    double ea = check_max_rel_err(dA, fa, LO_R * LO_IN), eb = check_max_rel_err(dB, fb, LO_OUT * LO_R);
    double ex = check_max_rel_err(dx, fx, LO_T * LO_IN);
    CHECK(ea <= GRAD_TOL && eb <= GRAD_TOL && ex <= GRAD_TOL, "p %g: dA %.3g dB %.3g dx %.3g", p, ea, eb, ex);
    free(x); free(A); free(B); free(dy); free(dA); free(dB); free(dx);
    free(c.x); free(c.A); free(c.B); free(c.w); free(fa); free(fb); free(fx);
}

TEST(lora_bwd_matches_finite_differences) { check_lora_bwd(0.0f); }
TEST(lora_bwd_with_dropout_matches_finite_differences) { check_lora_bwd(0.4f); }

// ---- rope ----

enum { RO_T = 4, RO_NH = 2, RO_D = 10, RO_ROT = 6, RO_LD = 23 };
#define RO_SCALING 0.8f

TEST(rope_matches_rotation_matrix_with_partial_rotary_and_scaling)
{
    int32_t pos[RO_T] = {0, 1, 7, 3000};
    float inv_freq[RO_ROT / 2] = {1.0f, 0.1f, 0.01f};
    size_t n = (size_t)RO_T * RO_LD;
    float *x = rand_f(n, -1, 1), *want = ct_malloc(n * sizeof(float));
    memcpy(want, x, n * sizeof(float));
    for (int t = 0; t < RO_T; t++) {
        double M[RO_D][RO_D] = {{0}};
        for (int i = RO_ROT; i < RO_D; i++) M[i][i] = 1;
        for (int i = 0; i < RO_ROT / 2; i++) {
            double a = (double)(float)((float)pos[t] * inv_freq[i]), c = cos(a) * RO_SCALING, s = sin(a) * RO_SCALING;
            int j = i + RO_ROT / 2;
            M[i][i] = c; M[i][j] = -s; M[j][i] = s; M[j][j] = c;
        }
        for (int h = 0; h < RO_NH; h++) {
            const float *xr = x + t * RO_LD + h * RO_D;
            for (int r = 0; r < RO_D; r++) {
                double s = 0;
                for (int k = 0; k < RO_D; k++) s += M[r][k] * xr[k];
                want[t * RO_LD + h * RO_D + r] = (float)s;
            }
        }
    }
    be->rope(be, x, RO_LD, pos, inv_freq, RO_T, RO_NH, RO_D, RO_ROT, RO_SCALING, 0);
    double e = check_max_rel_err(x, want, n); /* includes untouched padding columns */
    CHECK(e <= FWD_TOL, "max rel err %.3g", e);
    free(x); free(want);
}

TEST(rope_inverse_is_the_transpose)
{
    int32_t pos[RO_T] = {2, 5, 11, 40};
    float inv_freq[RO_ROT / 2] = {1.0f, 0.3f, 0.05f};
    size_t n = (size_t)RO_T * RO_LD;
    float *x = rand_f(n, -1, 1), *y = rand_f(n, -1, 1), *rx = ct_malloc(n * sizeof(float)), *rty = ct_malloc(n * sizeof(float));
    memcpy(rx, x, n * sizeof(float));
    memcpy(rty, y, n * sizeof(float));
    be->rope(be, rx, RO_LD, pos, inv_freq, RO_T, RO_NH, RO_D, RO_ROT, RO_SCALING, 0);
    be->rope(be, rty, RO_LD, pos, inv_freq, RO_T, RO_NH, RO_D, RO_ROT, RO_SCALING, 1);
    double a = 0, b = 0, mag = 0;
    for (size_t i = 0; i < n; i++) {
        a += (double)rx[i] * y[i];
        b += (double)x[i] * rty[i];
        mag += fabs((double)x[i] * y[i]);
    }
    CHECK(fabs(a - b) <= 1e-6 * mag, "<Rx, y> = %.9g but <x, R^T y> = %.9g", a, b);
    free(x); free(y); free(rx); free(rty);
}

/* rmsnorm + RoPE fused (Qwen3's q/k path): forward against the double
 * references composed, backward against finite differences of them, both in
 * and out of place. Partial rotary (RO_ROT < RO_D) with scaling. */
struct normrope_ctx { double *x, *w, *dy, *y; const int32_t *pos; const float *inv_freq; };
static void ref_rope(double *x, int ldx, const int32_t *pos, const float *inv_freq, int T, int nh, int D, int rot,
                     double scaling)
{
    for (int t = 0; t < T; t++)
        for (int i = 0; i < rot / 2; i++) {
            double a = (double)(float)((float)pos[t] * inv_freq[i]), c = cos(a) * scaling, s = sin(a) * scaling;
            for (int h = 0; h < nh; h++) {
                double *xr = x + (size_t)t * ldx + (size_t)h * D, u = xr[i], v = xr[i + rot / 2];
                xr[i] = u * c - v * s;
                xr[i + rot / 2] = v * c + u * s;
            }
        }
}
static double normrope_obj(void *p)
{
    struct normrope_ctx *c = p;
    ref_rmsnorm(c->y, RO_NH * RO_D, c->x, RO_LD, c->w, RO_T, RO_NH, RO_D, 1e-5);
    ref_rope(c->y, RO_NH * RO_D, c->pos, c->inv_freq, RO_T, RO_NH, RO_D, RO_ROT, RO_SCALING);
    return dot_d(c->y, c->dy, RO_T * RO_NH * RO_D);
}

TEST(rmsnorm_rope_matches_composed_references_and_finite_differences)
{
    int32_t pos[RO_T] = {0, 3, 17, 2500};
    float inv_freq[RO_ROT / 2] = {1.0f, 0.2f, 0.03f};
    size_t n = (size_t)RO_T * RO_LD, ny = (size_t)RO_T * RO_NH * RO_D;
    float *x = rand_f(n, -2, 2), *w = rand_f(RO_D, 0.5f, 1.5f), *dy = rand_f(ny, -1, 1);
    float *y = fill_f(n, 9.0f), *dx = fill_f(n, 9.0f), rstd[RO_T * RO_NH];
    struct normrope_ctx c = {to_d(x, n), to_d(w, RO_D), to_d(dy, ny), ct_malloc(ny * sizeof(double)), pos, inv_freq};
    normrope_obj(&c);
    float *want = to_f(c.y, ny), *got = ct_malloc(ny * sizeof(float));
    be->rmsnorm_rope_fwd(be, y, RO_LD, rstd, x, RO_LD, w, 0, pos, inv_freq, RO_T, RO_NH, RO_D, RO_ROT, 1e-5f, RO_SCALING);
    size_t idx[RO_T * RO_NH * RO_D];
    for (size_t i = 0; i < ny; i++) {
        idx[i] = (i / (RO_NH * RO_D)) * RO_LD + i % (RO_NH * RO_D);
        got[i] = y[idx[i]];
    }
    double e = check_max_rel_err(got, want, ny);
    CHECK(e <= FWD_TOL, "forward: max rel err %.3g", e);
    CHECK(y[RO_LD - 1] == 9.0f, "padding of y was written");

    be->rmsnorm_rope_bwd(be, dx, RO_LD, dy, RO_NH * RO_D, x, RO_LD, rstd, w, 0, pos, inv_freq, RO_T, RO_NH, RO_D,
                         RO_ROT, RO_SCALING);
    for (size_t i = 0; i < ny; i++) got[i] = dx[idx[i]];
    float *fd = fd_grad(c.x, ny, idx, normrope_obj, &c);
    double eg = check_max_rel_err(got, fd, ny);
    CHECK(eg <= GRAD_TOL, "backward vs finite differences: max rel err %.3g", eg);
    CHECK(dx[RO_LD - 1] == 9.0f, "padding of dx was written");

    float *inplace = ct_malloc(ny * sizeof(float));
    memcpy(inplace, dy, ny * sizeof(float));
    be->rmsnorm_rope_bwd(be, inplace, RO_NH * RO_D, inplace, RO_NH * RO_D, x, RO_LD, rstd, w, 0, pos, inv_freq, RO_T,
                         RO_NH, RO_D, RO_ROT, RO_SCALING);
    CHECK(memcmp(inplace, got, ny * sizeof(float)) == 0, "in-place backward differs");
    free(x); free(w); free(dy); free(y); free(dx); free(want); free(got); free(fd); free(inplace);
    free(c.x); free(c.w); free(c.dy); free(c.y);
}

/* Zero-centred norms (Qwen3.5, Qwen3-Next) scale by 1 + w formed in fp32 inside
 * the op: on fp32 weights that is exactly the plain op given w + 1 precomputed,
 * forward and backward, plain and fused with RoPE (partial rotary, residual
 * gradient aliasing dx). */
TEST(zero_centred_norms_equal_the_plain_ops_given_one_plus_w)
{
    int32_t pos[RO_T] = {0, 5, 40, 3000};
    float inv_freq[RO_ROT / 2] = {1.0f, 0.2f, 0.03f};
    size_t n = (size_t)RO_T * RO_LD, nr = (size_t)RO_T * RO_NH;
    float *x = rand_f(n, -2, 2), *w = rand_f(RO_D, -0.5f, 0.5f), *dy = rand_f(n, -1, 1), *res = rand_f(n, -1, 1);
    float w1[RO_D];
    for (int i = 0; i < RO_D; i++) w1[i] = 1.0f + w[i];
    float *yz = fill_f(n, 9.0f), *yp = fill_f(n, 9.0f), rz[RO_T * RO_NH], rp[RO_T * RO_NH];
    float *dz = ct_malloc(n * sizeof(float)), *dp = ct_malloc(n * sizeof(float));

    be->rmsnorm_fwd(be, yz, RO_LD, rz, x, RO_LD, w, 1, RO_T, RO_NH, RO_D, 1e-6f);
    be->rmsnorm_fwd(be, yp, RO_LD, rp, x, RO_LD, w1, 0, RO_T, RO_NH, RO_D, 1e-6f);
    CHECK(check_max_rel_err(yz, yp, n) == 0 && check_max_rel_err(rz, rp, nr) == 0, "rmsnorm_fwd: y or rstd differs");
    memcpy(dz, res, n * sizeof(float));
    memcpy(dp, res, n * sizeof(float));
    be->rmsnorm_bwd(be, dz, RO_LD, dy, RO_LD, x, RO_LD, rz, w, 1, RO_T, RO_NH, RO_D, dz, RO_LD);
    be->rmsnorm_bwd(be, dp, RO_LD, dy, RO_LD, x, RO_LD, rp, w1, 0, RO_T, RO_NH, RO_D, dp, RO_LD);
    CHECK(check_max_rel_err(dz, dp, n) == 0, "rmsnorm_bwd: dx differs");

    be->rmsnorm_rope_fwd(be, yz, RO_LD, rz, x, RO_LD, w, 1, pos, inv_freq, RO_T, RO_NH, RO_D, RO_ROT, 1e-6f, 1.2f);
    be->rmsnorm_rope_fwd(be, yp, RO_LD, rp, x, RO_LD, w1, 0, pos, inv_freq, RO_T, RO_NH, RO_D, RO_ROT, 1e-6f, 1.2f);
    CHECK(check_max_rel_err(yz, yp, n) == 0 && check_max_rel_err(rz, rp, nr) == 0,
          "rmsnorm_rope_fwd: y or rstd differs");
    be->rmsnorm_rope_bwd(be, dz, RO_LD, dy, RO_LD, x, RO_LD, rz, w, 1, pos, inv_freq, RO_T, RO_NH, RO_D, RO_ROT,
                         1.2f);
    be->rmsnorm_rope_bwd(be, dp, RO_LD, dy, RO_LD, x, RO_LD, rp, w1, 0, pos, inv_freq, RO_T, RO_NH, RO_D, RO_ROT,
                         1.2f);
    CHECK(check_max_rel_err(dz, dp, n) == 0, "rmsnorm_rope_bwd: dx differs");

    /* and the flag is no no-op: w itself, uncentred, normalises differently */
    be->rmsnorm_fwd(be, yp, RO_LD, NULL, x, RO_LD, w, 0, RO_T, RO_NH, RO_D, 1e-6f);
    be->rmsnorm_fwd(be, yz, RO_LD, NULL, x, RO_LD, w, 1, RO_T, RO_NH, RO_D, 1e-6f);
    CHECK(check_max_rel_err(yz, yp, n) > 0.1, "zero_centred changed nothing");
    free(x); free(w); free(dy); free(res); free(yz); free(yp); free(dz); free(dp);
}

// ---- cross-entropy ----

/* loss of row i = logsumexp(x[rows[i]] W^T) - logit[target] in double. */
static double ref_ce(const double *x, const double *W, const int32_t *rows, const int32_t *tg, int n, int H, int V)
{
    double loss = 0, *l = ct_malloc((size_t)V * sizeof(double));
    for (int i = 0; i < n; i++) {
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) {
            l[j] = dot_d(x + (size_t)rows[i] * H, W + (size_t)j * H, H);
            mx = fmax(mx, l[j]);
        }
        for (int j = 0; j < V; j++) s += exp(l[j] - mx);
        loss += mx + log(s) - l[tg[i]];
    }
    free(l);
    return loss;
}

TEST(cross_entropy_loss_matches_log_softmax_over_chunks)
{
    int T = 160, H = 16, V = 37, n = 150; /* 150 rows: three chunks of 64 */
    float *x = rand_f((size_t)T * H, -1, 1), *W = rand_f((size_t)V * H, -1, 1);
    int32_t rows[150], tg[150];
    for (int i = 0; i < n; i++) { rows[i] = (i * 7 + 3) % T; tg[i] = (int32_t)ct_rng_below(&rng, V); }
    double *xd = to_d(x, (size_t)T * H), *Wd = to_d(W, (size_t)V * H);
    float loss = 1.5f; /* loss_sum accumulates */
    be->cross_entropy(be, &loss, NULL, x, W, rows, tg, n, H, V, 1.0f);
    double want = 1.5 + ref_ce(xd, Wd, rows, tg, n, H, V);
    CHECK(fabs(loss - want) <= 1e-5 * want, "loss %.8g want %.8g", loss, want);
    free(x); free(W); free(xd); free(Wd);
}

struct ce_ctx { double *x, *W; const int32_t *rows, *tg; int n, H, V; double gs; };
static double ce_obj(void *p)
{
    struct ce_ctx *c = p;
    return c->gs * ref_ce(c->x, c->W, c->rows, c->tg, c->n, c->H, c->V);
}

TEST(cross_entropy_dx_matches_finite_differences_and_skips_rows_without_targets)
{
    int T = 6, H = 5, V = 11, n = 3;
    int32_t rows[3] = {4, 0, 2}, tg[3] = {10, 0, 6};
    float *x = rand_f((size_t)T * H, -2, 2), *W = rand_f((size_t)V * H, -1, 1), *dx = fill_f((size_t)T * H, 7.0f);
    float loss = 0, got[15];
    struct ce_ctx c = {to_d(x, (size_t)T * H), to_d(W, (size_t)V * H), rows, tg, n, H, V, 0.3};
    be->cross_entropy(be, &loss, dx, x, W, rows, tg, n, H, V, 0.3f);
    size_t idx[15];
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) { idx[i * H + h] = (size_t)rows[i] * H + h; got[i * H + h] = dx[idx[i * H + h]]; }
    float *fd = fd_grad(c.x, (size_t)n * H, idx, ce_obj, &c);
    double e = check_max_rel_err(got, fd, (size_t)n * H);
    CHECK(e <= GRAD_TOL, "max rel err %.3g", e);
    int untouched = 1;
    for (int t = 1; t < T; t += 2)
        for (int h = 0; h < H; h++) untouched &= dx[t * H + h] == 7.0f;
    CHECK(untouched, "a row without a target was written");
    free(x); free(W); free(dx); free(c.x); free(c.W); free(fd);
}

// ---- optimizer ----

TEST(sum_squares_accumulates_in_order)
{
    size_t n = 10000; /* spans several partial-sum blocks */
    float *g = rand_f(n, -1, 1), out = 2.0f;
    double want = 2.0;
    for (size_t i = 0; i < n; i++) want += (double)g[i] * g[i];
    be->sum_squares(be, &out, g, n);
    CHECK(fabs(out - want) <= 1e-6 * want, "got %.8g want %.8g", out, want);
    free(g);
}

/* Two AdamW steps on three scalars, written out as torch documents them:
 * clip_grad_norm_ (coefficient max_norm / (norm + 1e-6), at most 1), decoupled
 * weight decay, bias-corrected moments. eps = 0.1 is large on purpose: Adam is
 * otherwise nearly invariant to a uniform gradient scale, which would hide the
 * clipping. */
static void check_adamw(float max_norm)
{
    float p[3] = {1.0f, -0.5f, 2.0f}, m[3] = {0}, v[3] = {0};
    const float g[2][3] = {{3.0f, -4.0f, 0.5f}, {-1.0f, 2.0f, 6.0f}};
    double pd[3] = {1.0, -0.5, 2.0}, md[3] = {0}, vd[3] = {0};
    double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 0.1, wd = 0.1;
    for (int step = 1; step <= 2; step++) {
        float norm_sq = 0;
        be->sum_squares(be, &norm_sq, g[step - 1], 3);
        be->adamw(be, p, g[step - 1], m, v, 3, &norm_sq, max_norm, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, step);
        double norm = sqrt(step == 1 ? 25.25 : 41.0); /* |g1|^2 = 9 + 16 + 0.25, |g2|^2 = 1 + 4 + 36 */
        double clip = max_norm > 0 ? fmin(1.0, max_norm / (norm + 1e-6)) : 1.0;
        for (int i = 0; i < 3; i++) {
            double gi = clip * g[step - 1][i];
            pd[i] *= 1 - lr * wd;
            md[i] = b1 * md[i] + (1 - b1) * gi;
            vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
            double mhat = md[i] / (1 - pow(b1, step)), vhat = vd[i] / (1 - pow(b2, step));
            pd[i] -= lr * mhat / (sqrt(vhat) + eps);
        }
    }
    float want_p[3] = {(float)pd[0], (float)pd[1], (float)pd[2]}, want_m[3] = {(float)md[0], (float)md[1], (float)md[2]};
    double ep = check_max_rel_err(p, want_p, 3), em = check_max_rel_err(m, want_m, 3);
    CHECK(ep <= 1e-6 && em <= 1e-6, "max_norm %g: p err %.3g m err %.3g", max_norm, ep, em);
}

TEST(adamw_two_steps_with_clipping_and_weight_decay) { check_adamw(1.0f); }
TEST(adamw_two_steps_without_clipping) { check_adamw(0.0f); }

int main(void)
{
    be = backend_cpu_new();
    ct_rng_seed(&rng, 7);
    RUN(upload_weight_converts_bf16_f16_and_f32);
    RUN(embedding_gathers_table_rows);
    RUN(add_and_copy_2d_touch_only_their_elements);
    RUN(swiglu_fwd_matches_formula);
    RUN(swiglu_bwd_matches_finite_differences);
    RUN(rmsnorm_fwd_matches_formula_with_groups_and_strides);
    RUN(rmsnorm_fwd_in_place);
    RUN(rmsnorm_bwd_matches_finite_differences);
    RUN(rmsnorm_bwd_adds_the_residual_gradient_in_place_or_not);
    RUN(sgemm_all_transposes_match_naive_across_blocks);
    RUN(sgemm_result_independent_of_thread_count);
    RUN(linear_fwd_matches_formula_with_bias_into_ldy_slice);
    RUN(linear_fwd_accumulates);
    RUN(linear_bwd_input_matches_finite_differences_and_accumulates);
    RUN(lora_fwd_adds_scaled_low_rank_product_with_and_without_dropout);
    RUN(lora_bwd_matches_finite_differences);
    RUN(lora_bwd_with_dropout_matches_finite_differences);
    RUN(rope_matches_rotation_matrix_with_partial_rotary_and_scaling);
    RUN(rope_inverse_is_the_transpose);
    RUN(rmsnorm_rope_matches_composed_references_and_finite_differences);
    RUN(zero_centred_norms_equal_the_plain_ops_given_one_plus_w);
    RUN(cross_entropy_loss_matches_log_softmax_over_chunks);
    RUN(cross_entropy_dx_matches_finite_differences_and_skips_rows_without_targets);
    RUN(sum_squares_accumulates_in_order);
    RUN(adamw_two_steps_with_clipping_and_weight_decay);
    RUN(adamw_two_steps_without_clipping);
    be->destroy(be);
    return check_summary();
}
