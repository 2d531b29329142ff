/* test_cuda_fp8_linear.c — the CUDA backend's FP8 GEMMs (backend.h:
 * linear_fwd_fp8, linear_bwd_input_fp8; cuda/quant/fp8.cu over gemm_fp8)
 * against a CPU emulation on random inputs.
 *
 * The emulation computes what the op is specified to compute: the bf16
 * activations quantized by fp8_quantize_rows (which fp8_quant_rows matches bit
 * for bit: test_cuda_fp8), decoded, times the decoded weight in fp64, plus
 * bias and c_in. Left to differ: the summation order and the one bf16
 * rounding of the output, so the normwise error is held to 1e-2. The same
 * outputs are also compared with the dense GEMM of the original fp32 weight
 * and activations: the price of FP8 itself (E4M3 keeps 3 mantissa bits,
 * about 3-4% rms per operand), held to 1e-1 and printed. Shapes: the FP8
 * path's needs (in, out multiples of 16) with partial 128-blocks, T not a
 * multiple of anything and below 4, a residual, accumulation, a strided
 * output. */
#include "check.h"
#include "cuda_pair.h"
#include "fp8.h"

/* A random weight (out, in) in FP8 as the model holds it: codes, the padded
 * grid; *dense its decoded values, *orig the values before quantization. */
typedef struct {
    uint8_t *q;
    float *grid, *dense, *orig;
    int out, in;
} fp8w;

static fp8w make_weight(int out, int in)
{
    fp8w w = {.out = out, .in = in};
    size_t n = (size_t)out * in, nbr = fp8_blocks(out), nbc = fp8_blocks(in), lds = fp8_weight_scale_ld(in);
    w.orig = ct_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) /* magnitudes that vary by block: the scales matter */
        w.orig[i] = 0.02f * ct_rng_normal(&rng) * (1.0f + (float)((i / in / 128 + i % in / 128) % 5));
    float *s = ct_malloc(nbr * nbc * sizeof(float));
    w.q = ct_malloc(n);
    ct_error err = {0};
    CT_ASSERT(fp8_quantize_blocks(w.q, s, w.orig, out, in, &err) == CT_OK, "%s", err.msg);
    w.dense = ct_malloc(n * sizeof(float));
    fp8_dequantize_blocks(w.dense, w.q, s, out, in);
    w.grid = ct_calloc(nbr * lds, sizeof(float));
    for (size_t b = 0; b < nbr * nbc; b++) w.grid[b / nbc * lds + b % nbc] = s[b];
    free(s);
    return w;
}

static void free_weight(fp8w *w) { free(w->q); free(w->grid); free(w->dense); free(w->orig); }

/* x (T, K) as the GPU's FP8 path sees it: quantized per row and 128 columns, decoded. */
static float *emulate_input(const float *x, int T, int K)
{
    uint8_t *q = ct_malloc((size_t)T * K);
    float *sc = ct_malloc(fp8_blocks(K) * (size_t)T * sizeof(float)), *y = ct_malloc((size_t)T * K * sizeof(float));
    fp8_quantize_rows(q, sc, x, T, K, T);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            y[(size_t)t * K + k] = fp8_e4m3_decode(q[(size_t)t * K + k]) * sc[fp8_row_scale_index(k / 128, t, T)];
    free(q); free(sc);
    return y;
}

/* y (T, N) = a (T, K) @ b^T (b (N, K) when bt, else b (K, N)) + add (T, N, or NULL) + bias (N, or NULL), fp64 sums. */
static float *matmul(const float *a, const float *b, bool bt, const float *add, const float *bias, int T, int K, int N)
{
    float *y = ct_malloc((size_t)T * N * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double acc = add ? add[(size_t)t * N + n] : 0.0;
            if (bias) acc += bias[n];
            for (int k = 0; k < K; k++) acc += (double)a[(size_t)t * K + k] * (bt ? b[(size_t)n * K + k] : b[(size_t)k * N + n]);
            y[(size_t)t * N + n] = (float)acc;
        }
    return y;
}

/* The GPU's act tensor (T, N) at stride ld, packed. */
static float *gpu_rows(void *d, int T, int N, int ld)
{
    size_t n = (size_t)(T - 1) * ld + N;
    float *all = ct_malloc(n * sizeof(float)), *y = ct_malloc((size_t)T * N * sizeof(float));
    gpu->act_to_f32(gpu, all, d, n);
    for (int t = 0; t < T; t++) memcpy(y + (size_t)t * N, all + (size_t)t * ld, (size_t)N * sizeof(float));
    free(all);
    return y;
}

static void *gpu_act(const float *h, size_t n)
{
    void *d = gpu->alloc(gpu, n * gpu->act_bytes);
    gpu->act_from_f32(gpu, d, h, n);
    return d;
}

/* Forward: y = c_in + x W^T + bias, c_in none, a residual, or y itself (accumulate). */
static void fwd_case(int T, int in, int out, int ldy, int mode /* 0 none, 1 residual, 2 accumulate */, bool bias)
{
    fp8w w = make_weight(out, in);
    float *x = rnd((size_t)T * in, 1.0f), *b = bias ? rnd(out, 0.5f) : NULL;
    float *c0 = rnd((size_t)T * ldy, 1.0f);               /* the residual, or y's values before += */
    float *c0p = ct_malloc((size_t)T * out * sizeof(float));
    for (int t = 0; t < T; t++) memcpy(c0p + (size_t)t * out, c0 + (size_t)t * ldy, (size_t)out * sizeof(float));
    void *dq = gpu->alloc(gpu, (size_t)out * in), *ds = gpu->alloc(gpu, fp8_blocks(out) * fp8_weight_scale_ld(in) * 4);
    gpu->upload(gpu, dq, w.q, (size_t)out * in);
    gpu->upload(gpu, ds, w.grid, fp8_blocks(out) * fp8_weight_scale_ld(in) * 4);
    void *dx = gpu_act(x, (size_t)T * in), *dy = gpu_act(c0, (size_t)T * ldy);
    void *dres = mode == 1 ? gpu_act(c0, (size_t)T * ldy) : NULL, *dbias = NULL;
    if (bias) {
        dbias = gpu->alloc(gpu, (size_t)out * gpu->weight_bytes);
        gpu->upload_weight(gpu, dbias, b, CT_DTYPE_F32, out);
    }
    const void *c_in = mode == 0 ? NULL : mode == 1 ? dres : dy;
    gpu->linear_fwd_fp8(gpu, dy, ldy, c_in, dx, in, dq, ds, dbias, T, in, out);
    float *got = gpu_rows(dy, T, out, ldy), *xe = emulate_input(x, T, in);
    float *want = matmul(xe, w.dense, true, mode ? c0p : NULL, b, T, in, out);
    float *exact = matmul(x, w.orig, true, mode ? c0p : NULL, b, T, in, out);
    double e = check_max_norm_err(got, want, (size_t)T * out), ex = check_max_norm_err(got, exact, (size_t)T * out);
    printf("# fwd T %d in %d out %d ldy %d mode %d bias %d: vs emulation %.2e, vs the bf16/fp32 GEMM %.2e\n", T, in,
           out, ldy, mode, bias, e, ex);
    CHECK(e <= 1e-2, "fwd T %d in %d out %d mode %d: %.3e from the emulation", T, in, out, mode, e);
    CHECK(ex <= 1e-1, "fwd T %d in %d out %d mode %d: %.3e from the unquantized GEMM", T, in, out, mode, ex);
    gpu->free(gpu, dq); gpu->free(gpu, ds); gpu->free(gpu, dx); gpu->free(gpu, dy);
    if (dres) gpu->free(gpu, dres);
    if (dbias) gpu->free(gpu, dbias);
    free(x); free(b); free(c0); free(c0p); free(got); free(xe); free(want); free(exact);
    free_weight(&w);
}

/* Input gradient: dx (=|+=) dy W, W^T built by the op. */
static void bwd_case(int T, int in, int out, int accumulate)
{
    fp8w w = make_weight(out, in);
    float *dyv = rnd((size_t)T * out, 1.0f), *d0 = rnd((size_t)T * in, 1.0f);
    void *dq = gpu->alloc(gpu, (size_t)out * in), *ds = gpu->alloc(gpu, fp8_blocks(out) * fp8_weight_scale_ld(in) * 4);
    gpu->upload(gpu, dq, w.q, (size_t)out * in);
    gpu->upload(gpu, ds, w.grid, fp8_blocks(out) * fp8_weight_scale_ld(in) * 4);
    void *ddy = gpu_act(dyv, (size_t)T * out), *ddx = gpu_act(d0, (size_t)T * in);
    gpu->linear_bwd_input_fp8(gpu, ddx, in, ddy, out, dq, ds, T, in, out, accumulate);
    float *got = gpu_rows(ddx, T, in, in), *dye = emulate_input(dyv, T, out);
    float *want = matmul(dye, w.dense, false, accumulate ? d0 : NULL, NULL, T, out, in);
    float *exact = matmul(dyv, w.orig, false, accumulate ? d0 : NULL, NULL, T, out, in);
    double e = check_max_norm_err(got, want, (size_t)T * in), ex = check_max_norm_err(got, exact, (size_t)T * in);
    printf("# bwd T %d in %d out %d acc %d: vs emulation %.2e, vs the bf16/fp32 GEMM %.2e\n", T, in, out, accumulate,
           e, ex);
    CHECK(e <= 1e-2, "bwd T %d in %d out %d: %.3e from the emulation", T, in, out, e);
    CHECK(ex <= 1e-1, "bwd T %d in %d out %d: %.3e from the unquantized GEMM", T, in, out, ex);
    gpu->free(gpu, dq); gpu->free(gpu, ds); gpu->free(gpu, ddy); gpu->free(gpu, ddx);
    free(dyv); free(d0); free(got); free(dye); free(want); free(exact);
    free_weight(&w);
}

TEST(fp8_forward_matches_its_emulation)
{
    NEED_GPU();
    fwd_case(77, 256, 384, 384, 0, false);
    fwd_case(300, 272, 208, 208, 0, true);   /* partial blocks in both dimensions */
    fwd_case(129, 512, 256, 256, 1, true);   /* residual epilogue */
    fwd_case(64, 384, 128, 200, 2, false);   /* += into a strided output */
    /* fewer than 4 rows, and a tail of 2 after them (the 4-row product) */
    fwd_case(3, 256, 128, 128, 1, true);
    fwd_case(1, 128, 256, 264, 2, false);
    fwd_case(6, 256, 384, 384, 2, true);
}

TEST(fp8_input_gradient_matches_its_emulation)
{
    NEED_GPU();
    bwd_case(77, 256, 384, 0);
    bwd_case(300, 272, 208, 0);
    bwd_case(129, 512, 256, 1);
    bwd_case(2, 256, 128, 1);
    bwd_case(4099, 384, 256, 1);
}

int main(void)
{
    ct_error err = {0};
    cpu = backend_cpu_new();
    gpu = backend_cuda_new(&err);
    if (!gpu) printf("# CUDA backend unavailable: %s\n", err.msg);
    else if (!gpu->linear_fwd_fp8) { gpu->destroy(gpu); gpu = NULL; }
    ct_rng_seed(&rng, 53);
    RUN(fp8_forward_matches_its_emulation);
    RUN(fp8_input_gradient_matches_its_emulation);
    if (gpu) gpu->destroy(gpu);
    cpu->destroy(cpu);
    return check_summary();
}
