/* test_cuda_fp8.c — the FP8 kernels (cuda/quant/fp8.cuh) against their CPU
 * functions (src/formats/fp8.h), bit for bit, on random inputs:
 *  - fp8_dequant_blocks_bf16 (the grid padded as the model holds it): every non-NaN code, scales from 2^-140 (fp32
 *    subnormal products) to 2^100 (products that overflow to inf), partial
 *    blocks, cols not a multiple of 8 (a chunk spans rows) and a short tail;
 *  - fp8_quant_rows: T and K not multiples of anything (K % 8 == 0), padded
 *    row strides and ld_scale, groups of zeros, -0.0, bf16 subnormals, mixed
 *    magnitudes, one row with NaN and inf; padding must stay unwritten;
 *  - fp8_transpose: shapes on the 16-byte path and off it, edge tiles.
 * The launchers are called directly on a stream of the test's own. Without a
 * GPU (or in a build without CUDA) every test reports "skip NAME: skipped: no
 * GPU". */
#include "check.h"
#include "fp8.h"

#ifdef CT_HAVE_CUDA
#include "../cuda/quant/fp8.cuh"   /* tests see src/ folders only */

static bool have_gpu;
static cudaStream_t stream;
static ct_rng rng;

#define NEED_GPU() do { if (!have_gpu) SKIP("skipped: no GPU"); } while (0)
#define CUDA_OK(call) do { cudaError_t e_ = (call); CT_ASSERT(e_ == cudaSuccess, "%s: %s", #call, \
                                                             cudaGetErrorString(e_)); } while (0)

static void *dev_alloc(size_t n)
{
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, n ? n : 1));
    return d;
}

static void *dev_put(const void *h, size_t n)
{
    void *d = dev_alloc(n);
    if (n) CUDA_OK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

static void dev_get(void *h, const void *d, size_t n)
{
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

static uint8_t random_code(void)
{
    uint8_t b = (uint8_t)(ct_rng_u64(&rng) >> 56);
    return (b & 0x7f) == 0x7f ? b ^ 1 : b;   /* NaN codes are refused on load */
}

/* ---- dequant ---- */

static void dequant_case(size_t rows, size_t cols)
{
    size_t n = rows * cols, ns = fp8_blocks(rows) * fp8_blocks(cols);
    uint8_t *q = malloc(n ? n : 1);
    float *s = malloc(ns * sizeof(float)), *want = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) q[i] = random_code();
    for (size_t b = 0; b < ns; b++)
        s[b] = ldexpf(1.0f + (float)(ct_rng_u64(&rng) >> 40) * 0x1p-24f, (int)(b * 37 % 241) - 140);
    fp8_dequantize_blocks(want, q, s, rows, cols);
    /* the GPU reads the grid as the model holds it: rows padded to fp8_weight_scale_ld(cols) */
    size_t lds = fp8_weight_scale_ld(cols), nbc = fp8_blocks(cols);
    float *sp = calloc(fp8_blocks(rows) * lds + 1, sizeof(float));
    for (size_t b = 0; b < ns; b++) sp[b / nbc * lds + b % nbc] = s[b];
    void *dq = dev_put(q, n), *ds = dev_put(sp, fp8_blocks(rows) * lds * sizeof(float)), *dy = dev_alloc(n * 2);
    free(sp);
    fp8_dequant_blocks_bf16(dy, dq, ds, lds, rows, cols, stream);
    uint16_t *got = malloc(n * 2 + 2);
    dev_get(got, dy, n * 2);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != ct_f32_to_bf16(want[i]) && bad++ == 0) first = i;
    CHECK(bad == 0, "(%zu, %zu): %zu of %zu differ, first [%zu, %zu] code 0x%02x: gpu 0x%04x, cpu %g", rows, cols,
          bad, n, bad ? first / cols : 0, bad ? first % cols : 0, bad ? q[first] : 0, bad ? got[first] : 0,
          bad ? want[first] : 0.0f);
    CUDA_OK(cudaFree(dq)); CUDA_OK(cudaFree(ds)); CUDA_OK(cudaFree(dy));
    free(q); free(s); free(want); free(got);
}

TEST(dequant_blocks_bf16_matches_the_cpu_bit_for_bit)
{
    NEED_GPU();
    dequant_case(136, 200);
    dequant_case(128, 128);
    dequant_case(1, 7);
    dequant_case(3, 5);
    dequant_case(257, 129);
    dequant_case(129, 1000);
    dequant_case(2048 + 64, 3072 + 40);
}

/* ---- activation quant ---- */

/* x (T, ldx) bf16: per (row, group) a magnitude 2^-30..2^30, a group of zeros
 * (-0.0 among them), a group of bf16 subnormals, and with nonfinite a NaN and
 * an inf in row 1. */
static uint16_t *activations(int T, int K, int ldx, bool nonfinite)
{
    uint16_t *x = calloc((size_t)T * (size_t)ldx, 2);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int g = k / FP8_BLOCK, kind = (t * 7 + g * 3) % 11;
            float v = ct_rng_normal(&rng);
            float e = kind == 0 ? (k % 5 == 0 ? -0.0f : 0.0f) : kind == 1 ? ldexpf(v, -130) :
                      ldexpf(v, (t * 13 + g * 5) % 61 - 30);
            x[(size_t)t * ldx + k] = ct_f32_to_bf16(e);
        }
    if (nonfinite && T > 1 && K > 20) {
        x[(size_t)ldx + 3] = ct_f32_to_bf16(NAN);
        x[(size_t)ldx + K - 1] = ct_f32_to_bf16(-INFINITY);
    }
    return x;
}

static void quant_rows_case(int T, int K, bool nonfinite)
{
    int ldx = K + 8, ldq = K + 16, lds = T + 3, G = (int)fp8_blocks((size_t)K);
    uint16_t *x = activations(T, K, ldx, nonfinite);
    size_t n = (size_t)T * K;
    float *xf = malloc(n * sizeof(float) + 4), *want_s = malloc((size_t)G * lds * sizeof(float) + 4);
    uint8_t *want_q = malloc(n + 1);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) xf[(size_t)t * K + k] = ct_bf16_to_f32(x[(size_t)t * ldx + k]);
    for (int i = 0; i < G * lds; i++) want_s[i] = -7.0f;
    fp8_quantize_rows(want_q, want_s, xf, (size_t)T, (size_t)K, (size_t)lds);
    size_t qbytes = (size_t)T * ldq, sbytes = (size_t)G * lds * sizeof(float);
    uint8_t *fill = malloc(qbytes + 1);
    memset(fill, 0x5a, qbytes);
    float *minus7 = malloc(sbytes + 4);   /* every slot -7 on both sides: a skipped or stray write shows */
    for (int i = 0; i < G * lds; i++) minus7[i] = -7.0f;
    void *dx = dev_put(x, (size_t)T * ldx * 2), *dq = dev_put(fill, qbytes), *ds = dev_put(minus7, sbytes);
    fp8_quant_rows(dq, ldq, ds, lds, dx, ldx, T, K, stream);
    uint8_t *got_q = malloc(qbytes + 1);
    float *got_s = malloc(sbytes + 4);
    dev_get(got_q, dq, qbytes);
    dev_get(got_s, ds, sbytes);
    size_t bad = 0, first = 0, pad = 0;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < ldq; k++) {
            uint8_t g8 = got_q[(size_t)t * ldq + k];
            if (k >= K) { pad += g8 != 0x5a; continue; }
            if (g8 != want_q[(size_t)t * K + k] && bad++ == 0) first = (size_t)t * K + k;
        }
    CHECK(bad == 0, "T %d K %d: %zu of %zu codes differ, first [%zu, %zu] x %g: gpu 0x%02x, cpu 0x%02x", T, K, bad, n,
          first / K, first % K, xf[first], got_q[(first / K) * ldq + first % K], want_q[first]);
    CHECK(pad == 0, "T %d K %d: %zu padding bytes of q written", T, K, pad);
    size_t sbad = 0;
    for (int i = 0; i < G * lds; i++) sbad += memcmp(&got_s[i], &want_s[i], 4) != 0;
    CHECK(sbad == 0, "T %d K %d: %zu of %d scale slots differ (padding included)", T, K, sbad, G * lds);
    CUDA_OK(cudaFree(dx)); CUDA_OK(cudaFree(dq)); CUDA_OK(cudaFree(ds));
    free(x); free(xf); free(want_s); free(want_q); free(fill); free(minus7); free(got_q); free(got_s);
}

TEST(quant_rows_matches_the_cpu_bit_for_bit)
{
    NEED_GPU();
    quant_rows_case(1, 8, false);
    quant_rows_case(7, 136, false);
    quant_rows_case(33, 304, true);
    quant_rows_case(5, 128, false);
    quant_rows_case(1000, 4096 + 8, true);
    quant_rows_case(4099, 1032, false);
}

/* ---- transpose ---- */

static void transpose_case(size_t rows, size_t cols)
{
    size_t n = rows * cols;
    uint8_t *q = malloc(n), *got = malloc(n);
    for (size_t i = 0; i < n; i++) q[i] = (uint8_t)(ct_rng_u64(&rng) >> 56);
    void *dq = dev_put(q, n), *dt = dev_put(q, n);
    fp8_transpose(dt, dq, rows, cols, stream);
    dev_get(got, dt, n);
    size_t bad = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) bad += got[c * rows + r] != q[r * cols + c];
    CHECK(bad == 0, "(%zu, %zu): %zu of %zu bytes misplaced", rows, cols, bad, n);
    CUDA_OK(cudaFree(dq)); CUDA_OK(cudaFree(dt));
    free(q); free(got);
}

TEST(transpose_matches_the_cpu_bit_for_bit)
{
    NEED_GPU();
    transpose_case(64, 64);
    transpose_case(128, 256);
    transpose_case(136, 200);
    transpose_case(1, 1);
    transpose_case(1000, 17);
    transpose_case(208, 112);
    transpose_case(4096, 1536);
}

#else
/* Built without CUDA: the same tests, each skipped. */
TEST(dequant_blocks_bf16_matches_the_cpu_bit_for_bit) { SKIP("skipped: no GPU"); }
TEST(quant_rows_matches_the_cpu_bit_for_bit) { SKIP("skipped: no GPU"); }
TEST(transpose_matches_the_cpu_bit_for_bit) { SKIP("skipped: no GPU"); }
#endif

int main(void)
{
#ifdef CT_HAVE_CUDA
    int count = 0;
    have_gpu = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    if (!have_gpu) printf("# no CUDA device\n");
    else CUDA_OK(cudaStreamCreate(&stream));
    ct_rng_seed(&rng, 27);
#endif
    RUN(dequant_blocks_bf16_matches_the_cpu_bit_for_bit);
    RUN(quant_rows_matches_the_cpu_bit_for_bit);
    RUN(transpose_matches_the_cpu_bit_for_bit);
#ifdef CT_HAVE_CUDA
    if (have_gpu) CUDA_OK(cudaStreamDestroy(stream));
#endif
    return check_summary();
}
