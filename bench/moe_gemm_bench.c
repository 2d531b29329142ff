/* moe_gemm_bench.c — times the CUDA backend's grouped expert GEMMs
 * (moe_linear_fwd, moe_linear_bwd_input: the warp-specialized TMA kernel, the only
 * one kept; the earlier generations' figures are in docs/kernels/moe_gemm.md) and
 * the expert LoRA on the expert shapes of real MoE models, next to one dense
 * cuBLAS GEMM (be->linear_fwd / linear_bwd_input) or dense LoRA of the same total
 * size: the ceiling a grouped GEMM can hope for.
 *
 *   build/bench/moe_gemm_bench [reps]        (default 20 calls per timed trial)
 *
 * Rows: "fwd" reads expert-ordered x; "fwd_g" reads token rows through the
 * routing's row_slot (the gather fused into the loads, as graph_moe.c runs
 * gate_up; the TMA kernel's producer warpgroup copies those rows with cp.async);
 * "bwd_in" is moe_linear_bwd_input. The gate_up LoRA rows read x through the
 * gather too. "lora_fused" times moe_linear_lora_fwd (the GEMM with the LoRA of
 * one module over all columns fused in, graph_moe.c's default; rank 16 runs on
 * the TMA kernel), its TFLOP/s counting the base GEMM's FLOPs only, and the
 * unfused pair it replaces (the GEMM, then moe_lora_fwd) in the dense column.
 *
 * Shapes (T = 16384 tokens, n = T*K routed rows):
 *   qwen3-30b-a3b  E 128, K 8, H 2048, I 768    gate_up (in H, out 2I), down (in I, out H)
 *   gpt-oss-20b    E 32,  K 4, H 2880, I 2880   the same, with biases
 *   mixtral-8x7b   E 8,   K 2, H 4096, I 14336
 * Routing is uneven, as trained routers are: each expert's popularity is
 * log-normal (sigma 0.7), each token draws K distinct experts by it. The
 * TFLOP/s of a GEMM call is 2 * n * in * out / time. LoRA (R 16, qwen3 shapes)
 * is memory-bound: its columns give milliseconds only.
 *
 * Timing: cudaEvents on the backend's stream around `reps` queued calls, after
 * WARMUP calls; the median of TRIALS trials. Inputs are random, never zeros. */
#include "backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define WARMUP 3
#define TRIALS 3
#define FILL_CHUNK ((size_t)1 << 22)
#define T_TOKENS 16384
#define LORA_R 16

typedef struct {
    const char *model;
    int E, K, H, I, bias;
} moe_model;

static const moe_model MODELS[] = {
    {"qwen3-30b-a3b", 128, 8, 2048, 768, 0},
    {"gpt-oss-20b", 32, 4, 2880, 2880, 1},
    {"mixtral-8x7b", 8, 2, 4096, 14336, 0},
};

#ifdef CT_HAVE_CUDA

/* The backend's compute stream: the first member of its context (cuda_ctx in
 * cuda/common/ct_cuda.cuh), so that the events bracket exactly the queued ops. */
static cudaStream_t stream_of(ct_backend *be) { return *(cudaStream_t *)be->ctx; }

static void check_cuda(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return;
    fprintf(stderr, "moe_gemm_bench: %s failed: %s\n", what, cudaGetErrorString(e));
    exit(1);
}

typedef struct {
    ct_backend *be;         /* the backend whose ops run (and whose stream is timed) */
    const moe_model *m;
    int n, in, out, ldy;   /* ldy: the output's row stride */
    void *x, *y, *W, *bias; /* x (n, in), y (n, ldy), W (E, out, in), bias (E, out) or NULL */
    void *dx;               /* LoRA backward's dx (n, in) */
    float *A, *B, *dA, *dB; /* LoRA: (E, R, in), (E, out, R) and their gradients */
    int32_t *offsets;
    int32_t *row_slot;      /* (n) the routing's permutation: the gather of "fwd_g" */
    const int32_t *gather;  /* row_slot or NULL, for the LoRA ops */
} bench_bufs;

typedef void (*bench_op)(bench_bufs *b);

static void op_moe_fwd(bench_bufs *b)
{
    b->be->moe_linear_fwd(b->be, b->y, b->ldy, b->x, b->in, NULL, b->m->K, b->W, b->bias, b->offsets, b->m->E, b->in,
                          b->out, 0);
}
/* x holds T token rows, read through row_slot. */
static void op_moe_fwd_gather(bench_bufs *b)
{
    b->be->moe_linear_fwd(b->be, b->y, b->ldy, b->x, b->in, b->row_slot, b->m->K, b->W, b->bias, b->offsets, b->m->E,
                          b->in, b->out, 0);
}
static void op_dense_fwd(bench_bufs *b)
{
    b->be->linear_fwd(b->be, b->y, b->ldy, b->x, b->in, b->W, b->bias, b->n, b->in, b->out, 0);
}
/* Backward: "x" is dy (n, out) and "y" is dx (n, in): the same buffers, reread. */
static void op_moe_bwd(bench_bufs *b)
{
    b->be->moe_linear_bwd_input(b->be, b->y, b->in, b->x, b->out, b->W, b->offsets, b->m->E, b->in, b->out, 0);
}
static void op_dense_bwd(bench_bufs *b)
{
    b->be->linear_bwd_input(b->be, b->y, b->in, b->x, b->out, b->W, b->n, b->in, b->out, 0);
}
static void op_moe_lora_fwd(bench_bufs *b)
{
    b->be->moe_lora_fwd(b->be, b->y, b->ldy, b->x, b->in, b->gather, b->m->K, b->A, b->B, b->offsets, b->m->E, b->in,
                        b->out, LORA_R, 2.0f, 0.0f, 1);
}
static void op_moe_lora_fused_fwd(bench_bufs *b)
{
    const ct_lora_cols mod = {b->A, b->B, 0, b->out, NULL, NULL};
    b->be->moe_linear_lora_fwd(b->be, b->y, b->ldy, b->x, b->in, b->gather, b->m->K, b->W, b->bias, b->offsets,
                               b->m->E, b->in, b->out, 0, &mod, 1, LORA_R, 2.0f, NULL, 0);
}
static void op_moe_lora_unfused_fwd(bench_bufs *b)
{
    b->be->moe_linear_fwd(b->be, b->y, b->ldy, b->x, b->in, b->gather, b->m->K, b->W, b->bias, b->offsets, b->m->E,
                          b->in, b->out, 0);
    op_moe_lora_fwd(b);
}
static void op_dense_lora_fwd(bench_bufs *b)
{
    b->be->lora_fwd(b->be, b->y, b->ldy, b->x, b->in, b->A, b->B, b->n, b->in, b->out, LORA_R, 2.0f, 0.0f, 1, NULL, 0);
}
/* LoRA backward: dy is y (n, ldy). */
static void op_moe_lora_bwd(bench_bufs *b)
{
    b->be->moe_lora_bwd(b->be, b->dx, b->in, b->dA, b->dB, b->y, b->ldy, b->x, b->in, b->gather, b->m->K, b->A, b->B,
                        b->offsets, b->m->E, b->in, b->out, LORA_R, 2.0f, 0.0f, 1);
}
static void op_dense_lora_bwd(bench_bufs *b)
{
    b->be->lora_bwd(b->be, b->dx, b->in, b->dA, b->dB, b->y, b->ldy, b->x, b->in, b->A, b->B, b->n, b->in, b->out,
                    LORA_R, 2.0f, 0.0f, 1, NULL, 0);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds per call over TRIALS trials of reps calls. */
static double time_op(bench_op op, bench_bufs *b, int reps)
{
    cudaStream_t st = stream_of(b->be);
    cudaEvent_t t0, t1;
    check_cuda(cudaEventCreate(&t0), "cudaEventCreate");
    check_cuda(cudaEventCreate(&t1), "cudaEventCreate");
    for (int i = 0; i < WARMUP; i++) op(b);
    float ms[TRIALS];
    for (int tr = 0; tr < TRIALS; tr++) {
        check_cuda(cudaEventRecord(t0, st), "cudaEventRecord");
        for (int i = 0; i < reps; i++) op(b);
        check_cuda(cudaEventRecord(t1, st), "cudaEventRecord");
        check_cuda(cudaEventSynchronize(t1), "cudaEventSynchronize");
        check_cuda(cudaEventElapsedTime(&ms[tr], t0, t1), "cudaEventElapsedTime");
        ms[tr] /= (float)reps;
    }
    check_cuda(cudaEventDestroy(t0), "cudaEventDestroy");
    check_cuda(cudaEventDestroy(t1), "cudaEventDestroy");
    qsort(ms, TRIALS, sizeof ms[0], cmp_float);
    return ms[TRIALS / 2];
}

/* Uneven routing of T tokens to K distinct experts each: offsets (E+1) and the
 * permutation row_slot (T*K, slots in expert order, ascending within an expert, as
 * moe_permute makes it) on the host. */
static void route(int32_t *offsets, int32_t *row_slot, int E, int K, int T, ct_rng *rng)
{
    double *w = ct_malloc(E * sizeof(double)), total = 0;
    int *counts = ct_calloc(E, sizeof(int)), *pick = ct_malloc(K * sizeof(int));
    int32_t *idx = ct_malloc((size_t)T * K * sizeof(int32_t));
    for (int e = 0; e < E; e++) total += w[e] = exp(0.7 * ct_rng_normal(rng));
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e;
            bool dup;
            do { /* draw by weight, redraw an expert this token already has */
                double u = ct_rng_uniform(rng) * total, s = 0;
                for (e = 0; e < E - 1 && (s += w[e]) <= u; e++) {}
                dup = false;
                for (int j = 0; j < k; j++) dup |= pick[j] == e;
            } while (dup);
            pick[k] = e;
            counts[e]++;
            idx[(size_t)t * K + k] = e;
        }
    offsets[0] = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
    memcpy(counts, offsets, E * sizeof(int)); /* now each expert's next row */
    for (int s = 0; s < T * K; s++) row_slot[counts[idx[s]]++] = s;
    free(w); free(counts); free(pick); free(idx);
}

static void *alloc_or_die(ct_backend *be, size_t bytes)
{
    void *p = be->alloc(be, bytes);
    if (!p) {
        printf("moe_gemm_bench: out of GPU memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* n act (weight) elements of random values in [-a, a], from one repeated chunk. */
static void fill(ct_backend *be, void *dst, size_t n, const float *chunk, bool weight)
{
    for (size_t off = 0; off < n; off += FILL_CHUNK) {
        size_t m = n - off < FILL_CHUNK ? n - off : FILL_CHUNK;
        if (weight) be->upload_weight(be, (char *)dst + off * be->weight_bytes, chunk, CT_DTYPE_F32, m);
        else be->act_from_f32(be, (char *)dst + off * be->act_bytes, chunk, m);
    }
}

static void row_gemm(const char *model, const char *what, int E, int n, int in, int out, double ms, double dense_ms)
{
    double flop = 2.0 * n * (double)in * out;
    printf("%-14s %-15s %4d %7d %6d %6d %8.3f %7.1f %8.3f %7.1f %6.2f\n", model, what, E, n, in, out, ms,
           flop / ms * 1e-9, dense_ms, flop / dense_ms * 1e-9, dense_ms / ms);
    fflush(stdout);
}

static void row_lora(const char *model, const char *what, int E, int n, int in, int out, double ms, double dense_ms)
{
    printf("%-14s %-15s %4d %7d %6d %6d %8.3f %7s %8.3f %7s %6.2f\n", model, what, E, n, in, out, ms, "-", dense_ms,
           "-", dense_ms / ms);
    fflush(stdout);
}

static void check_finite(ct_backend *be, const void *y, const char *model, const char *name)
{
    float head[256];
    be->act_to_f32(be, head, y, 256);
    for (int i = 0; i < 256; i++)
        if (!isfinite(head[i])) {
            printf("moe_gemm_bench: non-finite output in %s %s\n", model, name);
            exit(1);
        }
}

/* One projection (in -> out) of model m: fwd (expert-ordered and gathered x) and
 * bwd_input, grouped and dense; LoRA fwd/bwd as well when lora (gathered x for
 * gate_up, as the graph runs it). */
static void bench_proj(ct_backend *be, const moe_model *m, const char *name, int in, int out,
                       const int32_t *offsets, const int32_t *row_slot, const float *chunk, int reps, bool lora)
{
    int n = offsets[m->E], big = in > out ? in : out;
    bench_bufs b = {be, m, n, in, out, out, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t nW = (size_t)m->E * out * in;
    b.x = alloc_or_die(be, (size_t)n * big * be->act_bytes);
    b.y = alloc_or_die(be, (size_t)n * big * be->act_bytes);
    b.W = alloc_or_die(be, nW * be->weight_bytes);
    b.offsets = alloc_or_die(be, (m->E + 1) * sizeof(int32_t));
    b.row_slot = alloc_or_die(be, (size_t)n * sizeof(int32_t));
    fill(be, b.x, (size_t)n * big, chunk, false);
    fill(be, b.y, (size_t)n * big, chunk, false);
    fill(be, b.W, nW, chunk, true);
    if (m->bias) {
        b.bias = alloc_or_die(be, (size_t)m->E * out * be->weight_bytes);
        fill(be, b.bias, (size_t)m->E * out, chunk, true);
    }
    be->upload(be, b.offsets, offsets, (m->E + 1) * sizeof(int32_t));
    be->upload(be, b.row_slot, row_slot, (size_t)n * sizeof(int32_t));

    char what[64];
    double td = time_op(op_dense_fwd, &b, reps);
    snprintf(what, sizeof what, "%s fwd", name);
    row_gemm(m->model, what, m->E, n, in, out, time_op(op_moe_fwd, &b, reps), td);
    snprintf(what, sizeof what, "%s fwd_g", name);
    row_gemm(m->model, what, m->E, n, in, out, time_op(op_moe_fwd_gather, &b, reps), td);
    check_finite(be, b.y, m->model, what);
    td = time_op(op_dense_bwd, &b, reps);
    snprintf(what, sizeof what, "%s bwd_in", name);
    row_gemm(m->model, what, m->E, n, in, out, time_op(op_moe_bwd, &b, reps), td);
    check_finite(be, b.y, m->model, what);

    if (lora) {
        size_t nA = (size_t)m->E * LORA_R * in, nB = (size_t)m->E * out * LORA_R;
        float *h = ct_malloc((nA > nB ? nA : nB) * sizeof(float));
        for (size_t i = 0; i < (nA > nB ? nA : nB); i++) h[i] = 0.05f * chunk[i % FILL_CHUNK];
        b.A = alloc_or_die(be, nA * 4);
        b.B = alloc_or_die(be, nB * 4);
        b.dA = alloc_or_die(be, nA * 4);
        b.dB = alloc_or_die(be, nB * 4);
        b.dx = alloc_or_die(be, (size_t)n * in * be->act_bytes);
        be->upload(be, b.A, h, nA * 4);
        be->upload(be, b.B, h, nB * 4);
        free(h);
        b.gather = strcmp(name, "gate_up") == 0 ? b.row_slot : NULL;
        double t = time_op(op_moe_lora_fwd, &b, reps);
        td = time_op(op_dense_lora_fwd, &b, reps);
        snprintf(what, sizeof what, "%s lora_f", name);
        row_lora(m->model, what, m->E, n, in, out, t, td);
        t = time_op(op_moe_lora_fused_fwd, &b, reps);
        td = time_op(op_moe_lora_unfused_fwd, &b, reps);
        snprintf(what, sizeof what, "%s lora_fused", name);
        row_gemm(m->model, what, m->E, n, in, out, t, td);
        check_finite(be, b.y, m->model, what);
        t = time_op(op_moe_lora_bwd, &b, reps);
        td = time_op(op_dense_lora_bwd, &b, reps);
        snprintf(what, sizeof what, "%s lora_b", name);
        row_lora(m->model, what, m->E, n, in, out, t, td);
        be->free(be, b.A); be->free(be, b.B); be->free(be, b.dA); be->free(be, b.dB); be->free(be, b.dx);
    }
    be->free(be, b.x); be->free(be, b.y); be->free(be, b.W); be->free(be, b.offsets); be->free(be, b.row_slot);
    if (b.bias) be->free(be, b.bias);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 20;
    if (reps < 1) reps = 1;
    ct_error err = {0};
    ct_backend *be = backend_cuda_new(&err);
    if (!be) {
        printf("moe_gemm_bench: skipped: no GPU (%s)\n", err.msg);
        return 0;
    }
    if (!be->moe_linear_fwd || !be->moe_lora_bwd) {
        printf("moe_gemm_bench: skipped: the CUDA backend has no grouped expert GEMM\n");
        be->destroy(be);
        return 0;
    }
    float *chunk = ct_malloc(FILL_CHUNK * sizeof(float));
    ct_rng rng;
    ct_rng_seed(&rng, 7);
    for (size_t i = 0; i < FILL_CHUNK; i++) chunk[i] = 2.0f * (float)ct_rng_uniform(&rng) - 1.0f;

    printf("# ctune CUDA grouped expert GEMM, bf16 in, fp32 accumulate; %d calls per trial, median of %d trials\n",
           reps, TRIALS);
    printf("# T = %d tokens, n = T*K rows; TF = 2*n*in*out / time (TFLOP/s); moe = the TMA grouped GEMM (fwd_g rows\n"
           "# by cp.async); dense = one cuBLAS GEMM (or dense LoRA, R %d) over all n rows with expert 0's weights, or\n"
           "# for lora_fused the unfused GEMM + moe_lora_fwd; ratio = dense_ms / moe_ms\n", T_TOKENS, LORA_R);
    printf("%-14s %-15s %4s %7s %6s %6s %8s %7s %8s %7s %6s\n", "model", "op", "E", "n", "in", "out", "moe_ms", "moe_TF",
           "dense_ms", "dense_TF", "ratio");
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) {
        const moe_model *m = &MODELS[i];
        int32_t *offsets = ct_malloc((m->E + 1) * sizeof(int32_t));
        int32_t *row_slot = ct_malloc((size_t)T_TOKENS * m->K * sizeof(int32_t));
        route(offsets, row_slot, m->E, m->K, T_TOKENS, &rng);
        int lo = offsets[1] - offsets[0], hi = lo;
        for (int e = 0; e < m->E; e++) {
            int c = offsets[e + 1] - offsets[e];
            lo = c < lo ? c : lo;
            hi = c > hi ? c : hi;
        }
        printf("# %s: rows per expert min %d, mean %d, max %d\n", m->model, lo, offsets[m->E] / m->E, hi);
        bench_proj(be, m, "gate_up", m->H, 2 * m->I, offsets, row_slot, chunk, reps, i == 0);
        bench_proj(be, m, "down", m->I, m->H, offsets, row_slot, chunk, reps, i == 0);
        free(offsets);
        free(row_slot);
    }
    free(chunk);
    be->destroy(be);
    return 0;
}

#else

int main(void)
{
    printf("moe_gemm_bench: skipped: no GPU (built without CUDA)\n");
    return 0;
}

#endif
