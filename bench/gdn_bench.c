/* gdn_bench.c — times the CUDA backend's gated delta rule (gdn_delta_fwd and
 * gdn_delta_bwd, cuda/gdn/gdn_delta.cu) on packed documents.
 *
 *   build/bench/gdn_bench [reps [shape]]
 *
 * reps: calls per timed trial (default 10); shape: run only that row of the table
 * (0-based; for profilers). Shapes: the GDN layers of Qwen3.5-27B
 * (16 key / 48 value heads) and Qwen3.5-35B-A3B (16 / 32), head dims 128, 16384
 * tokens per batch as documents of 4k or 16k tokens. q, k, v are column slices of
 * one (T, 2 Hk Dk + Hv Dv) buffer as the conv writes them; g in [-1, 0), beta in
 * (0, 1). Time: a host clock around `reps` queued calls and the backend's sync,
 * the median of TRIALS trials after WARMUP calls. The last column, the backward's
 * tokens x value heads per second, is what a training step sees. */
#include "backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define WARMUP 2
#define TRIALS 5

typedef struct {
    const char *name;
    int Hk, Hv, D, T, doc_len;
} gdn_shape;

typedef struct {
    ct_backend *be;
    const gdn_shape *s;
    char *qkv, *dqkv, *out, *dout;
    float *g, *beta, *dg, *dbeta;
    int32_t *cu;
    int n_docs, ld;
} gdn_bufs;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_fwd(gdn_bufs *b)
{
    const gdn_shape *s = b->s;
    size_t eb = b->be->act_bytes, ko = (size_t)s->Hk * s->D;
    b->be->gdn_delta_fwd(b->be, b->out, s->Hv * s->D, b->qkv, b->ld, b->qkv + ko * eb, b->ld, b->qkv + 2 * ko * eb,
                         b->ld, b->g, b->beta, b->cu, b->n_docs, s->T, s->Hk, s->Hv, s->D, s->D,
                         1.0f / sqrtf((float)s->D));
}

static void run_bwd(gdn_bufs *b)
{
    const gdn_shape *s = b->s;
    size_t eb = b->be->act_bytes, ko = (size_t)s->Hk * s->D;
    b->be->gdn_delta_bwd(b->be, b->dqkv, b->ld, b->dqkv + ko * eb, b->ld, b->dqkv + 2 * ko * eb, b->ld, b->dg,
                         b->dbeta, b->dout, s->Hv * s->D, b->qkv, b->ld, b->qkv + ko * eb, b->ld,
                         b->qkv + 2 * ko * eb, b->ld, b->g, b->beta, b->cu, b->n_docs, s->T, s->Hk, s->Hv, s->D,
                         s->D, 1.0f / sqrtf((float)s->D));
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double time_op(void (*op)(gdn_bufs *), gdn_bufs *b, int reps)
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

static float *uniform(size_t n, float lo, float hi, uint64_t *state)
{
    float *x = ct_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = lo + (hi - lo) * (float)((double)(*state >> 11) / 9007199254740992.0);
    }
    return x;
}

static void bench_shape(ct_backend *be, const gdn_shape *s, int reps)
{
    uint64_t st = 20261202;
    gdn_bufs b = {0};
    b.be = be;
    b.s = s;
    b.n_docs = s->T / s->doc_len;
    b.ld = 2 * s->Hk * s->D + s->Hv * s->D;
    size_t T = s->T, eb = be->act_bytes, nq = T * b.ld, no = T * s->Hv * s->D, ng = T * s->Hv;
    float *hq = uniform(nq, -1, 1, &st), *ho = uniform(no, -1, 1, &st);
    float *hg = uniform(ng, -1.0f, -0.001f, &st), *hb = uniform(ng, 0.02f, 0.98f, &st);
    int32_t *cu = ct_malloc(sizeof(int32_t) * (b.n_docs + 1));
    for (int d = 0; d <= b.n_docs; d++) cu[d] = d * s->doc_len;
    b.qkv = be->alloc(be, nq * eb); b.dqkv = be->alloc(be, nq * eb);
    b.out = be->alloc(be, no * eb); b.dout = be->alloc(be, no * eb);
    b.g = be->alloc(be, ng * 4); b.beta = be->alloc(be, ng * 4); b.dg = be->alloc(be, ng * 4); b.dbeta = be->alloc(be, ng * 4);
    b.cu = be->alloc(be, sizeof(int32_t) * (b.n_docs + 1));
    if (!b.qkv || !b.dqkv || !b.out || !b.dout || !b.g || !b.beta || !b.dg || !b.dbeta || !b.cu) {
        printf("%-8s out of GPU memory\n", s->name);
        exit(1);
    }
    be->act_from_f32(be, b.qkv, hq, nq);
    be->act_from_f32(be, b.dout, ho, no);
    be->upload(be, b.g, hg, ng * 4);
    be->upload(be, b.beta, hb, ng * 4);
    be->upload(be, b.cu, cu, sizeof(int32_t) * (b.n_docs + 1));
    double tf = time_op(run_fwd, &b, reps), tb = time_op(run_bwd, &b, reps);
    float probe[64];
    be->download(be, probe, b.dg, sizeof probe);
    int finite = 1;
    for (int i = 0; i < 64; i++) finite &= isfinite(probe[i]) != 0;
    printf("%-8s %3d/%-3d %4d %6d %6d %9.3f %9.3f %10.1f%s\n", s->name, s->Hk, s->Hv, s->D, s->T, s->doc_len,
           tf * 1e3, tb * 1e3, (double)T * s->Hv / tb * 1e-6, finite ? "" : "  (non-finite dg!)");
    fflush(stdout);
    be->free(be, b.qkv); be->free(be, b.dqkv); be->free(be, b.out); be->free(be, b.dout);
    be->free(be, b.g); be->free(be, b.beta); be->free(be, b.dg); be->free(be, b.dbeta); be->free(be, b.cu);
    free(hq); free(ho); free(hg); free(hb); free(cu);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 10, only = argc > 2 ? atoi(argv[2]) : -1;
    if (reps < 1 || only < -1 || only > 3) {
        fprintf(stderr, "usage: gdn_bench [reps >= 1 [shape 0..3]]\n");
        return 2;
    }
    ct_error err = {0};
    ct_backend *be = backend_cuda_new(&err);
    if (!be) {
        printf("skipped: no GPU (%s)\n", err.msg);
        return 0;
    }
    static const gdn_shape shapes[] = {
        {"27b", 16, 48, 128, 16384, 4096}, {"27b", 16, 48, 128, 16384, 16384},
        {"35b-a3b", 16, 32, 128, 16384, 4096}, {"35b-a3b", 16, 32, 128, 16384, 16384},
    };
    printf("%-8s %7s %4s %6s %6s %9s %9s %10s\n", "shape", "Hk/Hv", "D", "T", "doc", "fwd ms", "bwd ms", "bwd Mtok*h/s");
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++)
        if (only < 0 || only == i) bench_shape(be, &shapes[i], reps);
    be->destroy(be);
    return 0;
}
