/* check.h — the test harness: each tests/test_*.c is one binary of named tests.
 *
 *   TEST(shard_round_trip) { ... CHECK(x == y, "got %d", x); ... }
 *   int main(void) { RUN(shard_round_trip); return check_summary(); }
 *
 * Each test prints one line: "ok   NAME", "FAIL NAME: file:line: message" or
 * "skip NAME: skipped: no GPU". check_summary prints "#summary P F S", which
 * tests/run_tests.sh adds up into the final "N passed, N failed" line.
 * Comparisons of floats use relative error and never pass on NaN. */
#ifndef CT_CHECK_H
#define CT_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_passed, check_failed, check_skipped;
static int check_cur_failed;   /* the running test has failed */
static int check_cur_skipped;  /* the running test asked to be skipped */
static char check_skip_reason[256];

#define TEST(name) static void name(void)

#define CHECK(cond, ...) do { \
    if (!(cond)) { \
        if (!check_cur_failed) printf("FAIL %s: %s:%d: ", check_cur_name, __FILE__, __LINE__); \
        else printf("     %s: %s:%d: ", check_cur_name, __FILE__, __LINE__); \
        printf(__VA_ARGS__); printf("  [%s]\n", #cond); \
        check_cur_failed = 1; \
    } } while (0)

/* CHECK and leave the test at once (for preconditions later checks rely on). */
#define REQUIRE(cond, ...) do { int check_ok_ = (cond) ? 1 : 0; CHECK(check_ok_, __VA_ARGS__); if (!check_ok_) return; } while (0)

#define SKIP(...) do { snprintf(check_skip_reason, sizeof check_skip_reason, __VA_ARGS__); \
    check_cur_skipped = 1; return; } while (0)

static const char *check_cur_name = "";

/* Relative error of got against want, with a floor on |want| so that values near
 * zero are compared on the scale of the tensor, not divided by ~0. NaN -> inf. */
static inline double check_rel_err(double got, double want, double scale)
{
    if (isnan(got) || isnan(want) || isinf(got) || isinf(want)) return INFINITY;
    double den = fabs(want) > scale ? fabs(want) : scale;
    return fabs(got - want) / (den > 0 ? den : 1.0);
}

/* Max relative error over arrays, where the floor is 1e-3 * max|want|. */
static inline double check_max_rel_err(const float *got, const float *want, size_t n)
{
    double maxw = 0;
    for (size_t i = 0; i < n; i++) if (fabs(want[i]) > maxw) maxw = fabs(want[i]);
    double scale = maxw * 1e-3, worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = check_rel_err(got[i], want[i], scale);
        if (!(e <= worst)) worst = e; /* NaN-proof: a NaN e becomes worst */
    }
    return worst;
}

/* Normwise relative error ||got - want||_2 / ||want||_2 (in double): the measure
 * for whole gradient tensors, where a few near-zero entries must not dominate.
 * NaN or inf anywhere gives inf. */
static inline double check_l2_rel_err(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    if (!isfinite(num) || !isfinite(den)) return INFINITY;
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
}

/* Normwise error max|got - want| / max|want|: for bf16 outputs, whose rounding
 * error is relative to the operands' scale rather than to each element. */
static inline double check_max_norm_err(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= num)) num = d; /* NaN-proof */
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    if (!isfinite(num)) return INFINITY;
    return den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
}

#define RUN(fn) do { \
    check_cur_name = #fn; check_cur_failed = 0; check_cur_skipped = 0; \
    fflush(stdout); fn(); \
    if (check_cur_failed) check_failed++; \
    else if (check_cur_skipped) { check_skipped++; printf("skip %s: %s\n", #fn, check_skip_reason); } \
    else { check_passed++; printf("ok   %s\n", #fn); } \
    fflush(stdout); } while (0)

static inline int check_summary(void)
{
    printf("#summary %d %d %d\n", check_passed, check_failed, check_skipped);
    return check_failed ? 1 : 0;
}

#endif
