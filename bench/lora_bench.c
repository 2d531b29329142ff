/* lora_bench.c — the dense LoRA of modules that share an input, run one module
 * at a time (lora_fwd / lora_bwd per module) or stacked (lora_fwd_cols /
 * lora_bwd_cols), on the CUDA backend, forward and backward of T tokens:
 * qwen3-30b-a3b's q, k, v (H 2048 -> 4096 | 512 | 512) and qwen3-0.6b's gate, up
 * (H 1024 -> 3072 | 3072).
 *
 *   build/bench/lora_bench [reps]        (default 20)
 *
 * Each variant is timed alone: `reps` back-to-back forward + backward pairs
 * between two syncs, host clock, after a warm-up. */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>

#define T_TOKENS 16384
#define R 16

typedef struct {
    const char *name;
    int in, n, out[CT_LORA_COLS_MAX];
} shape;

static const shape SHAPES[] = {
    {"qwen3-30b-a3b q,k,v", 2048, 3, {4096, 512, 512}},
    {"qwen3-0.6b gate,up", 1024, 2, {3072, 3072}},
};

typedef struct {
    ct_backend *be;
    const shape *s;
    int T, out_all;
    void *x, *y, *dy, *dx;
    ct_lora_cols mods[CT_LORA_COLS_MAX];
} bench_case;

static void *fill(ct_backend *be, size_t n, float scale, ct_rng *rng, bool act)
{
    float *h = ct_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = scale * (2.0f * (float)ct_rng_uniform(rng) - 1.0f);
    void *d = be->alloc(be, n * (act ? be->act_bytes : sizeof(float)));
    if (!d) {
        fprintf(stderr, "lora_bench: out of GPU memory\n");
        exit(1);
    }
    if (act) be->act_from_f32(be, d, h, n);
    else be->upload(be, d, h, n * sizeof(float));
    free(h);
    return d;
}

static void one_by_one(bench_case *b)
{
    ct_backend *be = b->be;
    int T = b->T, in = b->s->in, ld = b->out_all;
    for (int q = 0; q < b->s->n; q++) {
        const ct_lora_cols *m = &b->mods[q];
        be->lora_fwd(be, (char *)b->y + (size_t)m->col0 * be->act_bytes, ld, b->x, in, m->A, m->B, T, in, m->cols,
                     R, 2.0f, 0.0f, 0, NULL, 0);
    }
    for (int q = 0; q < b->s->n; q++) {
        const ct_lora_cols *m = &b->mods[q];
        be->lora_bwd(be, b->dx, in, m->dA, m->dB, (char *)b->dy + (size_t)m->col0 * be->act_bytes, ld, b->x, in,
                     m->A, m->B, T, in, m->cols, R, 2.0f, 0.0f, 0, NULL, 0);
    }
}

static void stacked(bench_case *b)
{
    ct_backend *be = b->be;
    int T = b->T, in = b->s->in, ld = b->out_all;
    be->lora_fwd_cols(be, b->y, ld, b->x, in, T, in, b->mods, b->s->n, R, 2.0f, NULL, 0);
    be->lora_bwd_cols(be, b->dx, in, b->dy, ld, b->x, in, T, in, b->mods, b->s->n, R, 2.0f, NULL, 0);
}

static double time_variant(bench_case *b, void (*fn)(bench_case *), int reps)
{
    fn(b);
    b->be->sync(b->be);
    double t0 = ct_now();
    for (int i = 0; i < reps; i++) fn(b);
    b->be->sync(b->be);
    return (ct_now() - t0) / reps * 1e3;
}

static void bench(ct_backend *be, const shape *s, int reps)
{
    ct_rng rng;
    ct_rng_seed(&rng, 11);
    bench_case b = {.be = be, .s = s, .T = T_TOKENS};
    for (int q = 0; q < s->n; q++) b.out_all += s->out[q];
    size_t T = b.T, in = s->in, out_all = b.out_all;
    b.x = fill(be, T * in, 1.0f, &rng, true);
    b.dx = fill(be, T * in, 1.0f, &rng, true);
    b.y = fill(be, T * out_all, 1.0f, &rng, true);
    b.dy = fill(be, T * out_all, 1.0f, &rng, true);
    int col0 = 0;
    for (int q = 0; q < s->n; q++) {
        size_t nA = (size_t)R * in, nB = (size_t)s->out[q] * R;
        b.mods[q] = (ct_lora_cols){.A = fill(be, nA, 0.02f, &rng, false), .B = fill(be, nB, 0.02f, &rng, false),
                                   .col0 = col0, .cols = s->out[q], .dA = fill(be, nA, 0.0f, &rng, false),
                                   .dB = fill(be, nB, 0.0f, &rng, false)};
        col0 += s->out[q];
    }
    double t_one = time_variant(&b, one_by_one, reps), t_stacked = time_variant(&b, stacked, reps);
    printf("%-22s T=%d R=%d  one module at a time %7.3f ms  stacked %7.3f ms  (fwd + bwd)\n", s->name, b.T, R, t_one,
           t_stacked);
    void *bufs[] = {b.x, b.dx, b.y, b.dy};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    for (int q = 0; q < s->n; q++) {
        be->free(be, (void *)b.mods[q].A);
        be->free(be, (void *)b.mods[q].B);
        be->free(be, b.mods[q].dA);
        be->free(be, b.mods[q].dB);
    }
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 20;
    ct_error err = {0};
    ct_backend *be = backend_cuda_new(&err);
    if (!be) {
        printf("lora_bench: skipped: no GPU (%s)\n", err.msg);
        return 0;
    }
    for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++) bench(be, &SHAPES[i], reps > 0 ? reps : 1);
    be->destroy(be);
    return 0;
}
