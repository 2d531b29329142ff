/* cuda_pair.h — what the CUDA-vs-CPU tests share: the two backends, an RNG, a
 * tensor held on both ("pair"), uploads of the same values to both, and the
 * normwise error of the GPU's copy against the CPU's (check_max_norm_err; the
 * tolerances are argued at the top of test_backend_cuda.c). A test binary sets
 * cpu and gpu in main (gpu NULL without a GPU: NEED_GPU skips). */
#ifndef CT_CUDA_PAIR_H
#define CT_CUDA_PAIR_H

#include <math.h>
#include <stdlib.h>

#include "backend.h"
#include "check.h"

#define CT_PAIR_UNUSED __attribute__((unused))

static ct_backend *cpu, *gpu;
static ct_rng rng;

#define NEED_GPU() do { if (!gpu) SKIP("skipped: no GPU"); } while (0)

typedef struct { void *c, *g; } pair; /* the same tensor on the CPU and the GPU */

/* n bf16-representable values uniform in [-a, a] (caller frees). */
CT_PAIR_UNUSED static float *rnd(size_t n, float a)
{
    float *x = ct_malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        x[i] = ct_bf16_to_f32(ct_f32_to_bf16(a * (2.0f * (float)ct_rng_uniform(&rng) - 1.0f)));
    return x;
}

CT_PAIR_UNUSED static pair put_act(const float *h, size_t n)
{
    pair p = {cpu->alloc(cpu, n * cpu->act_bytes), gpu->alloc(gpu, n * gpu->act_bytes)};
    cpu->act_from_f32(cpu, p.c, h, n);
    gpu->act_from_f32(gpu, p.g, h, n);
    return p;
}

CT_PAIR_UNUSED static pair put_weight(const float *h, size_t n)
{
    pair p = {cpu->alloc(cpu, n * cpu->weight_bytes), gpu->alloc(gpu, n * gpu->weight_bytes)};
    cpu->upload_weight(cpu, p.c, h, CT_DTYPE_F32, n);
    gpu->upload_weight(gpu, p.g, h, CT_DTYPE_F32, n);
    return p;
}

CT_PAIR_UNUSED static pair put_raw(const void *h, size_t bytes) /* fp32 or int32 */
{
    pair p = {cpu->alloc(cpu, bytes), gpu->alloc(gpu, bytes)};
    cpu->upload(cpu, p.c, h, bytes);
    gpu->upload(gpu, p.g, h, bytes);
    return p;
}

CT_PAIR_UNUSED static void drop(pair p)
{
    cpu->free(cpu, p.c);
    gpu->free(gpu, p.g);
}

/* An act tensor's rows x cols at stride ld (elements) from both backends, packed
 * into cs (the CPU's) and gs (the GPU's), rows * cols floats each (caller frees). */
CT_PAIR_UNUSED static void act_both(pair p, size_t rows, size_t cols, size_t ld, float **cs, float **gs)
{
    size_t n = (rows - 1) * ld + cols;
    float *c = ct_malloc(n * sizeof(float)), *g = ct_malloc(n * sizeof(float));
    *cs = ct_malloc(rows * cols * sizeof(float));
    *gs = ct_malloc(rows * cols * sizeof(float));
    cpu->act_to_f32(cpu, c, p.c, n);
    gpu->act_to_f32(gpu, g, p.g, n);
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < cols; j++) {
            (*cs)[r * cols + j] = c[r * ld + j];
            (*gs)[r * cols + j] = g[r * ld + j];
        }
    free(c); free(g);
}

/* Error of an act tensor: rows x cols at stride ld (elements). */
CT_PAIR_UNUSED static double act_err(pair p, size_t rows, size_t cols, size_t ld)
{
    float *cs, *gs;
    act_both(p, rows, cols, ld, &cs, &gs);
    double e = check_max_norm_err(gs, cs, rows * cols);
    free(cs); free(gs);
    return e;
}

/* max|gpu - cpu| of an act tensor in half bf16 ulps of max|cpu| (inf on NaN):
 * at most 1, plus fp32 noise, when the GPU computes in fp32 what the CPU does
 * and rounds once to bf16; an extra bf16 rounding of an operand or of an
 * intermediate shows as up to 2. */
CT_PAIR_UNUSED static double act_err_half_ulps(pair p, size_t rows, size_t cols, size_t ld)
{
    float *cs, *gs;
    act_both(p, rows, cols, ld, &cs, &gs);
    double num = 0, den = 0;
    for (size_t i = 0; i < rows * cols; i++) {
        double d = fabs((double)gs[i] - (double)cs[i]);
        if (!(d <= num)) num = d; /* NaN-proof */
        if (fabs(cs[i]) > den) den = fabs(cs[i]);
    }
    free(cs); free(gs);
    if (!isfinite(num) || !isfinite(den)) return INFINITY;
    if (den == 0) return num > 0 ? INFINITY : 0.0;
    int e;
    frexp(den, &e); /* den in [2^(e-1), 2^e): a bf16 ulp there is 2^(e-8) */
    return num / ldexp(1.0, e - 9);
}

/* Normwise error of n fp32 values. */
CT_PAIR_UNUSED static double f32_err(pair p, size_t n)
{
    float *c = ct_malloc(n * sizeof(float) + 4), *g = ct_malloc(n * sizeof(float) + 4);
    cpu->download(cpu, c, p.c, n * sizeof(float));
    gpu->download(gpu, g, p.g, n * sizeof(float));
    double e = check_max_norm_err(g, c, n);
    free(c); free(g);
    return e;
}

#endif
