/* cpu_oracle.h — what the CPU backend's own tests share (test_backend_cpu.c,
 * test_backend_cpu_attention.c): the backend and an RNG (set in main), random and
 * constant fp32 arrays, fp32 <-> double copies and central finite differences.
 *
 * Method and tolerances. Forward ops: the backend (fp32) against a naive double
 * reference written in the test, independently of the backend. fp32 rounding is
 * ~1e-7 of the operands, and check_max_rel_err floors the denominator at 1e-3 of
 * the tensor's largest value, so an element that cancels to near zero may show
 * ~1e-4: the bound is 1e-4 for element-wise ops and 1e-3 for sums of up to a few
 * hundred fp32 terms (GEMMs, attention). Backward ops: the backend's analytic
 * gradient of a random projection sum(w * out) (w is the upstream gradient passed
 * to the backward op) against central finite differences of the double reference,
 * step 1e-6. In double the FD error is ~1e-10, so what remains is the backend's
 * own fp32 rounding, ~1e-5 of the tensor's scale; a 1e-3 bound leaves margin for
 * that and still fails on any wrong or missing term. (FD through the fp32 backend
 * itself would need eps ~1e-2 and a ~2e-2 bound, too loose to see a small missing
 * term.) All comparisons use check_max_rel_err: relative error with a floor of
 * 1e-3 * max|want|, never passing on NaN. */
#ifndef CT_CPU_ORACLE_H
#define CT_CPU_ORACLE_H

#include "backend_cpu_internal.h"
#include "check.h"

#define FD_STEP 1e-6
#define FWD_TOL 1e-4
#define GEMM_TOL 1e-3
#define GRAD_TOL 1e-3

#define CT_ORACLE_UNUSED __attribute__((unused))

static ct_backend *be;
static ct_rng rng;

CT_ORACLE_UNUSED static float *rand_f(size_t n, float lo, float hi)
{
    float *x = ct_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)ct_rng_uniform(&rng);
    return x;
}

CT_ORACLE_UNUSED static float *fill_f(size_t n, float v)
{
    float *x = ct_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}

CT_ORACLE_UNUSED static double *to_d(const float *x, size_t n)
{
    double *d = ct_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

CT_ORACLE_UNUSED static float *to_f(const double *x, size_t n)
{
    float *f = ct_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}

CT_ORACLE_UNUSED static double dot_d(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Central differences of obj() with respect to x[idx[i]] (idx NULL: all n). */
CT_ORACLE_UNUSED static float *fd_grad(double *x, size_t n, const size_t *idx, double (*obj)(void *), void *ctx)
{
    float *g = ct_calloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) {
        size_t e = idx ? idx[i] : i;
        double save = x[e];
        x[e] = save + FD_STEP;
        double fp = obj(ctx);
        x[e] = save - FD_STEP;
        double fm = obj(ctx);
        x[e] = save;
        g[i] = (float)((fp - fm) / (2 * FD_STEP));
    }
    return g;
}

#endif
