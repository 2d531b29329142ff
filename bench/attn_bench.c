/* attn_bench.c — times the CUDA backend's attention_fwd and attention_bwd on
 * packed causal documents and prints TFLOP/s, for comparison with torch's varlen
 * attention on the same shapes (scripts/attn_bench_torch.py prints the same table).
 *
 *   build/bench/attn_bench [reps] [auto|wgmma|tma]
 *
 * reps: calls per timed trial (default 20). The second argument forces the
 * head_dim 64 forward (ct_cuda_options.attn_fwd: one warpgroup or TMA, the two
 * kernels kept there) to re-measure the rule cuda/common/kernel_choice.cu picks by;
 * auto, the default, times what training runs.
 *
 * Shapes: 32 query heads over 8 kv heads (GQA 4), head_dim 64 and 128, 32768
 * tokens per batch of documents of 1k, 4k or 16k tokens; plus "mix", the
 * qwen3-0.6b training shape (16 q / 8 kv heads, D 128, 16384 tokens of
 * log-normal lengths with median 600, cut at 4096; the same generator as the
 * torch script). q, k, v are column slices of one fused qkv, as in the model.
 *
 * FLOPs are causal: fwd = 2 * 2 * sum_d(S_d^2 / 2) * nq * D (Q K^T and P V),
 * bwd = 2.5 * fwd. Time: the backend's sync plus a host clock around `reps` calls
 * (the calls queue asynchronously, so launch gaps are hidden); the median of
 * TRIALS trials, after WARMUP calls. Inputs are random, never zeros. */
#include "backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WARMUP 3
#define TRIALS 5
#define FILL_CHUNK ((size_t)1 << 22)

typedef struct {
    const char *name;
    int nq, nkv, D, T, n_docs, max_seqlen;
    int32_t *cu;   /* (n_docs + 1) host copy */
} attn_shape;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The torch script mirrors these two functions exactly (64-bit LCG, Box-Muller). */
static uint64_t lcg_state;
static double lcg_uniform(void)
{
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(lcg_state >> 11) + 0.5) / 9007199254740992.0;
}

/* Log-normal lengths (median 600, sigma 1, clamped to [16, 4096]) filling T tokens;
 * the last document is cut to fit. Returns n_docs; cu has room for T + 1 entries. */
static int mix_lengths(int32_t *cu, int T)
{
    lcg_state = 20261129;
    int n = 0;
    cu[0] = 0;
    while (cu[n] < T) {
        double u1 = lcg_uniform(), u2 = lcg_uniform();
        double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        int len = (int)floor(600.0 * exp(z) + 0.5);
        if (len < 16) len = 16;
        if (len > 4096) len = 4096;
        if (len > T - cu[n]) len = T - cu[n];
        cu[n + 1] = cu[n] + len;
        n++;
    }
    return n;
}

static attn_shape shape_uniform(const char *name, int nq, int nkv, int D, int T, int doc_len)
{
    attn_shape s = {name, nq, nkv, D, T, T / doc_len, doc_len, NULL};
    s.cu = ct_malloc(sizeof(int32_t) * (s.n_docs + 1));
    for (int d = 0; d <= s.n_docs; d++) s.cu[d] = d * doc_len;
    return s;
}

static attn_shape shape_mix(void)
{
    attn_shape s = {"mix", 16, 8, 128, 16384, 0, 0, NULL};
    s.cu = ct_malloc(sizeof(int32_t) * (s.T + 1));
    s.n_docs = mix_lengths(s.cu, s.T);
    for (int d = 0; d < s.n_docs; d++)
        if (s.cu[d + 1] - s.cu[d] > s.max_seqlen) s.max_seqlen = s.cu[d + 1] - s.cu[d];
    return s;
}

static double causal_fwd_flops(const attn_shape *s)
{
    double sum = 0;
    for (int d = 0; d < s->n_docs; d++) {
        double len = s->cu[d + 1] - s->cu[d];
        sum += len * len / 2.0;
    }
    return 2.0 * 2.0 * sum * s->nq * s->D;
}

/* n act elements of uniform [-1, 1) values, from one repeated random chunk. */
static void fill_random(ct_backend *be, void *dst, size_t n, const float *chunk)
{
    for (size_t off = 0; off < n; off += FILL_CHUNK) {
        size_t m = n - off < FILL_CHUNK ? n - off : FILL_CHUNK;
        be->act_from_f32(be, (char *)dst + off * be->act_bytes, chunk, m);
    }
}

typedef struct {
    ct_backend *be;
    const attn_shape *s;
    char *qkv, *dqkv, *out, *dout;
    float *lse;
    int32_t *cu;
    int ld;        /* qkv row stride, elements */
} attn_bufs;

static void run_fwd(attn_bufs *b)
{
    const attn_shape *s = b->s;
    size_t eb = b->be->act_bytes, ko = (size_t)s->nq * s->D, vo = ko + (size_t)s->nkv * s->D;
    b->be->attention_fwd(b->be, b->out, s->nq * s->D, b->lse, b->qkv, b->ld, b->qkv + ko * eb, b->ld,
                         b->qkv + vo * eb, b->ld, b->cu, s->n_docs, s->max_seqlen, s->T, s->nq, s->nkv,
                         s->D, 1.0f / sqrtf((float)s->D), 0, NULL);
}

static void run_bwd(attn_bufs *b)
{
    const attn_shape *s = b->s;
    size_t eb = b->be->act_bytes, ko = (size_t)s->nq * s->D, vo = ko + (size_t)s->nkv * s->D;
    int ldo = s->nq * s->D;
    b->be->attention_bwd(b->be, b->dqkv, b->ld, b->dqkv + ko * eb, b->ld, b->dqkv + vo * eb, b->ld,
                         b->dout, ldo, b->out, ldo, b->lse, b->qkv, b->ld, b->qkv + ko * eb, b->ld,
                         b->qkv + vo * eb, b->ld, b->cu, s->n_docs, s->max_seqlen, s->T, s->nq, s->nkv,
                         s->D, 1.0f / sqrtf((float)s->D), 0, NULL);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds per call of op over TRIALS trials of reps calls. */
static double time_op(void (*op)(attn_bufs *), attn_bufs *b, int reps)
{
    double t[TRIALS];
    for (int i = 0; i < WARMUP; i++) op(b);
    b->be->sync(b->be);
    for (int tr = 0; tr < TRIALS; tr++) {
        double t0 = now_s();
        for (int i = 0; i < reps; i++) op(b);
        b->be->sync(b->be);
        t[tr] = (now_s() - t0) / reps;
    }
    qsort(t, TRIALS, sizeof t[0], cmp_double);
    return t[TRIALS / 2];
}

static void bench_shape(ct_backend *be, const attn_shape *s, const float *chunk, int reps)
{
    int ld = (s->nq + 2 * s->nkv) * s->D, ldo = s->nq * s->D;
    size_t eb = be->act_bytes;
    attn_bufs b = {be, s, NULL, NULL, NULL, NULL, NULL, NULL, ld};
    b.qkv = be->alloc(be, (size_t)s->T * ld * eb);
    b.dqkv = be->alloc(be, (size_t)s->T * ld * eb);
    b.out = be->alloc(be, (size_t)s->T * ldo * eb);
    b.dout = be->alloc(be, (size_t)s->T * ldo * eb);
    b.lse = be->alloc(be, (size_t)s->T * s->nq * sizeof(float));
    b.cu = be->alloc(be, sizeof(int32_t) * (s->n_docs + 1));
    if (!b.qkv || !b.dqkv || !b.out || !b.dout || !b.lse || !b.cu) {
        printf("%-5s out of GPU memory\n", s->name);
        exit(1);
    }
    fill_random(be, b.qkv, (size_t)s->T * ld, chunk);
    fill_random(be, b.dout, (size_t)s->T * ldo, chunk);
    be->upload(be, b.cu, s->cu, sizeof(int32_t) * (s->n_docs + 1));

    double tf = time_op(run_fwd, &b, reps), tb = time_op(run_bwd, &b, reps);
    double flops = causal_fwd_flops(s);

    float lse_head[256];
    be->download(be, lse_head, b.lse, sizeof lse_head);
    int finite = 1;
    for (int i = 0; i < 256; i++) finite &= isfinite(lse_head[i]) != 0;

    printf("%-5s %4d %3d/%-2d %6d %5d %8.3f %8.1f %8.3f %8.1f%s\n", s->name, s->D, s->nq, s->nkv, s->T,
           s->n_docs, tf * 1e3, flops / tf * 1e-12, tb * 1e3, 2.5 * flops / tb * 1e-12,
           finite ? "" : "  (non-finite lse!)");
    fflush(stdout);
    be->free(be, b.qkv); be->free(be, b.dqkv); be->free(be, b.out); be->free(be, b.dout);
    be->free(be, b.lse); be->free(be, b.cu);
}

/* The head_dim 64 forward named on the command line (auto when absent). */
static int parse_fwd(const char *arg, ct_attn_fwd_kernel *fwd)
{
    static const char *const names[] = {"auto", "wgmma", "tma"};
    static const ct_attn_fwd_kernel kernels[] = {CT_ATTN_FWD_AUTO, CT_ATTN_FWD_WGMMA, CT_ATTN_FWD_TMA};
    for (int i = 0; i < 3; i++)
        if (!arg || !strcmp(arg, names[i])) {
            *fwd = kernels[arg ? i : 0];
            return 0;
        }
    return -1;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 20;
    if (reps < 1) reps = 1;
    ct_cuda_options opt = {0};
    if (parse_fwd(argc > 2 ? argv[2] : NULL, &opt.attn_fwd)) {
        fprintf(stderr, "attn_bench: %s is not auto, wgmma or tma (the head_dim 64 forward)\n", argv[2]);
        return 2;
    }
    ct_error err = {0};
    ct_backend *be = backend_cuda_new_with(&opt, &err);
    if (!be) {
        printf("attn_bench: skipped: CUDA backend unavailable: %s\n", err.msg);
        return 0;
    }
    float *chunk = ct_malloc(FILL_CHUNK * sizeof(float));
    ct_rng rng;
    ct_rng_seed(&rng, 7);
    for (size_t i = 0; i < FILL_CHUNK; i++) chunk[i] = 2.0f * (float)ct_rng_uniform(&rng) - 1.0f;

    attn_shape shapes[7];
    int n = 0;
    static const int Ds[2] = {64, 128};
    static const int lens[3] = {1024, 4096, 16384};
    static const char *names[3] = {"1k", "4k", "16k"};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) shapes[n++] = shape_uniform(names[j], 32, 8, Ds[i], 32768, lens[j]);
    shapes[n++] = shape_mix();

    printf("# ctune CUDA attention, causal, bf16, %d calls per trial, median of %d trials; head_dim 64 forward: %s\n",
           reps, TRIALS, argc > 2 ? argv[2] : "auto");
    printf("# TFLOP/s: fwd 4 * sum(S^2/2) * nq * D per call, bwd 2.5x that\n");
    printf("%-5s %4s %6s %6s %5s %8s %8s %8s %8s\n", "docs", "D", "heads", "T", "n", "fwd_ms", "fwd_TF",
           "bwd_ms", "bwd_TF");
    for (int i = 0; i < n; i++) {
        bench_shape(be, &shapes[i], chunk, reps);
        free(shapes[i].cu);
    }
    free(chunk);
    be->destroy(be);
    return 0;
}
