/* fp8_gemm_probe.cu — a kernel-lab probe (not part of ctune): which cuBLASLt FP8
 * scaling modes run on this GPU, what layout their scale tensors have, and how
 * fast they are against bf16 at the Llama-3.1-8B LoRA shapes (16384 tokens).
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90a lab/fp8_gemm/fp8_gemm_probe.cu -lcublasLt -o /tmp/fp8probe && /tmp/fp8probe
 *
 * Row-major Y (M,N) = X (M,K) W^T, W (N,K), run as cuBLASLt TN: its A = W (col-major
 * K x N, op T), its B = X (col-major K x M, op N), D col-major N x M = Y row-major.
 * Correctness: random E4M3 codes and random per-block scales (spread over 2^-6..2^6,
 * so a wrong layout is far off) against a naive fp32 kernel that applies the scales
 * under each candidate layout; the layout whose error is ~1e-3 (bf16 output) is the
 * library's. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("cuda %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
#define LT(x) ((x) == CUBLAS_STATUS_SUCCESS)

enum mode { SCALAR, OUTER, VEC128, BLK };
static const char *mode_name[] = {"scalar", "outer_vec", "vec128", "blk128x128"};
static cublasLtMatmulMatrixScale_t lt_mode(mode m)
{
    return m == SCALAR ? CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
         : m == OUTER  ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
         : m == VEC128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                       : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

/* Scale index of element (r, k) of a (rows, K) row-major operand (r = output row of W,
 * or token of X; k along the reduction) under mode m and layout variant v. */
__host__ __device__ static size_t scale_idx(mode m, int v, int r, int k, int rows, int K)
{
    int kb = k / 128, nkb = (K + 127) / 128, rb = r / 128, nrb = (rows + 127) / 128;
    switch (m) {
    case SCALAR: return 0;
    case OUTER: return r;
    case VEC128: return v == 0 ? (size_t)kb * rows + r : (size_t)r * nkb + kb;
    default: { /* variants 2, 3: the block grid's leading dimension padded to a multiple of 4 */
        int pk = (nkb + 3) / 4 * 4, pr = (nrb + 3) / 4 * 4;
        return v == 0 ? (size_t)rb * nkb + kb : v == 1 ? (size_t)kb * nrb + rb : v == 2 ? (size_t)rb * pk + kb
                                                                                     : (size_t)kb * pr + rb;
    }
    }
}
__global__ void ref_kernel(float *y, const __nv_fp8_e4m3 *x, const __nv_fp8_e4m3 *w, const float *sx,
                           const float *sw, int M, int N, int K, mode mx, int vx, mode mw, int vw)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= N) return;
    float acc = 0;
    for (int k = 0; k < K; k++)
        acc += (float)x[(size_t)m * K + k] * sx[scale_idx(mx, vx, m, k, M, K)] * (float)w[(size_t)n * K + k] *
               sw[scale_idx(mw, vw, n, k, N, K)];
    y[(size_t)m * N + n] = acc;
}

struct lt_gemm {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo[8];
    int n_algo;
};

static cublasLtHandle_t lt;
static void *ws;
static const size_t ws_bytes = 64u << 20;

/* Builds Y (M,N) bf16 = X W^T; fp8 when mw/mx given (else bf16 inputs). false when unsupported. */
static bool build(lt_gemm *g, bool fp8, mode mw, mode mx, const float *sw, const float *sx, int M, int N, int K,
                  bool fast_accum)
{
    if (!LT(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return false;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cudaDataType_t it = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    if (fp8) {
        cublasLtMatmulMatrixScale_t a = lt_mode(mw), b = lt_mode(mx);
        if (!LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a, sizeof a))) return false;
        if (!LT(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b, sizeof b))) return false;
        cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw);
        cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx);
        int8_t fa = fast_accum;
        cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa);
    }
    cublasLtMatrixLayoutCreate(&g->la, it, K, N, K);
    cublasLtMatrixLayoutCreate(&g->lb, it, K, M, K);
    cublasLtMatrixLayoutCreate(&g->ld, CUDA_R_16BF, N, M, N);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t wsb = ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    cublasLtMatmulHeuristicResult_t res[8];
    g->n_algo = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, g->desc, g->la, g->lb, g->ld, g->ld, pref, 8, res, &g->n_algo);
    cublasLtMatmulPreferenceDestroy(pref);
    if (!LT(st) || g->n_algo == 0) return false;
    for (int i = 0; i < g->n_algo; i++) g->algo[i] = res[i].algo;
    return true;
}

static bool run(lt_gemm *g, int ai, void *y, const void *x, const void *w)
{
    float alpha = 1, beta = 0;
    return LT(cublasLtMatmul(lt, g->desc, &alpha, w, g->la, x, g->lb, &beta, y, g->ld, y, g->ld, &g->algo[ai], ws,
                             ws_bytes, 0));
}

static float time_ms(lt_gemm *g, int ai, void *y, const void *x, const void *w, int iters)
{
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < 3; i++) run(g, ai, y, x, w);
    cudaEventRecord(a);
    for (int i = 0; i < iters; i++) run(g, ai, y, x, w);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    return ms / iters;
}

static unsigned rng = 12345;
static float urand() { rng = rng * 1664525u + 1013904223u; return (rng >> 8) / 16777216.0f; }

int main()
{
    setvbuf(stdout, NULL, _IONBF, 0); /* a library abort must not swallow what was printed */
    cublasLtCreate(&lt);
    CK(cudaMalloc(&ws, ws_bytes));
    int ver = (int)cublasLtGetVersion();
    printf("cuBLASLt %d\n", ver);

    /* 1. support and scale layouts, small shape with partial blocks */
    {
        const int M = 320, N = 384, K = 640;
        std::vector<__nv_fp8_e4m3> hx((size_t)M * K), hw((size_t)N * K);
        for (auto &v : hx) v = __nv_fp8_e4m3(urand() * 4 - 2);
        for (auto &v : hw) v = __nv_fp8_e4m3(urand() * 4 - 2);
        __nv_fp8_e4m3 *dx, *dw;
        CK(cudaMalloc(&dx, hx.size()));
        CK(cudaMalloc(&dw, hw.size()));
        CK(cudaMemcpy(dx, hx.data(), hx.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dw, hw.data(), hw.size(), cudaMemcpyHostToDevice));
        float *sx, *sw, *yref;
        __nv_bfloat16 *y;
        CK(cudaMalloc(&sx, (size_t)M * K * 4));
        CK(cudaMalloc(&sw, (size_t)N * K * 4));
        CK(cudaMalloc(&yref, (size_t)M * N * 4));
        CK(cudaMalloc(&y, (size_t)M * N * 2));
        std::vector<float> hs((size_t)N * K);
        for (auto &v : hs) v = exp2f(floorf(urand() * 12) - 6);
        CK(cudaMemcpy(sx, hs.data(), (size_t)M * K * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(sw, hs.data(), (size_t)N * K * 4, cudaMemcpyHostToDevice));
        std::vector<__nv_bfloat16> hy((size_t)M * N);
        std::vector<float> hr((size_t)M * N);
        /* other pairs: "unsupported combination", or (outer x blk) an abort inside the library */
        mode pairs[][2] = {{SCALAR, SCALAR}, {OUTER, OUTER}, {BLK, VEC128}, {VEC128, VEC128}, {VEC128, BLK}};
        for (auto &pr : pairs) {
            mode mw = pr[0], mx = pr[1];
            {
                lt_gemm g;
                printf("probing W %s X %s\n", mode_name[mw], mode_name[mx]);
                if (!build(&g, true, mw, mx, sw, sx, M, N, K, false)) {
                    printf("support W %-10s X %-10s : no\n", mode_name[mw], mode_name[mx]);
                    continue;
                }
                CK(cudaMemset(y, 0, (size_t)M * N * 2));
                bool ok = run(&g, 0, y, dx, dw);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(hy.data(), y, hy.size() * 2, cudaMemcpyDeviceToHost));
                printf("support W %-10s X %-10s : yes (%d algos, run %s)", mode_name[mw], mode_name[mx], g.n_algo,
                       ok ? "ok" : "failed");
                for (int vw = 0; vw < (mw == BLK ? 4 : mw == VEC128 ? 2 : 1); vw++)
                    for (int vx = 0; vx < (mx == BLK ? 4 : mx == VEC128 ? 2 : 1); vx++) {
                        ref_kernel<<<dim3((N + 127) / 128, M), 128>>>(yref, dx, dw, sx, sw, M, N, K, mx, vx, mw, vw);
                        CK(cudaDeviceSynchronize());
                        CK(cudaMemcpy(hr.data(), yref, hr.size() * 4, cudaMemcpyDeviceToHost));
                        double num = 0, den = 0;
                        for (size_t i = 0; i < hr.size(); i++) {
                            double d = (double)__bfloat162float(hy[i]) - hr[i];
                            num += d * d;
                            den += (double)hr[i] * hr[i];
                        }
                        printf("  [w%d x%d rel %.1e]", vw, vx, sqrt(num / (den + 1e-30)));
                    }
                printf("\n");
            }
        }
    }

    if (getenv("PROBE_LAYOUT_ONLY")) return 0;
    /* 2. speed at the 8B LoRA shapes: (N, K) of qkv, o, gate|up, down; fwd and the dX shape (K, N swapped) */
    const int M = 16384;
    int shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {4096, 6144}, {14336, 4096}};
    const char *names[] = {"qkv fwd", "o fwd/dX", "gate_up fwd", "down fwd", "qkv dX", "gate_up dX... (down dX is gate_up^T)"};
    size_t maxe = (size_t)M * 28672;
    void *x, *w, *y;
    float *s1, *s2;
    CK(cudaMalloc(&x, (size_t)M * 14336 * 2));
    CK(cudaMalloc(&w, (size_t)28672 * 4096 * 2));
    CK(cudaMalloc(&y, maxe * 2));
    CK(cudaMalloc(&s1, (size_t)M * 128 * 4));
    CK(cudaMalloc(&s2, (size_t)M * 128 * 4));
    CK(cudaMemset(x, 0x22, (size_t)M * 14336 * 2));
    CK(cudaMemset(w, 0x22, (size_t)28672 * 4096 * 2));
    std::vector<float> ones((size_t)M * 128, 1.0f);
    CK(cudaMemcpy(s1, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s2, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    printf("\n%-28s %7s %7s %7s %7s %7s %7s   (TFLOP/s, best of the heuristic's algos)\n", "shape M=16384", "bf16",
           "f8 scal", "f8 scF", "f8 outer", "f8 b/v", "f8 v/v");
    for (int s = 0; s < 6; s++) {
        int N = shapes[s][0], K = shapes[s][1];
        double flop = 2.0 * M * N * K;
        printf("%-28s", names[s]);
        struct { bool fp8; mode mw, mx; bool fast; } cfg[] = {{false, SCALAR, SCALAR, false}, {true, SCALAR, SCALAR, false},
            {true, SCALAR, SCALAR, true}, {true, OUTER, OUTER, false}, {true, BLK, VEC128, false}, {true, VEC128, VEC128, false}};
        for (auto &c : cfg) {
            lt_gemm g;
            if (!build(&g, c.fp8, c.mw, c.mx, s1, s2, M, N, K, c.fast)) { printf(" %7s", "n/a"); continue; }
            float best = 1e30f;
            for (int a = 0; a < g.n_algo; a++) {
                float t = time_ms(&g, a, y, x, w, 10);
                if (t < best) best = t;
            }
            printf(" %7.0f", flop / (best * 1e-3) / 1e12);
        }
        printf("\n");
    }
    return 0;
}
