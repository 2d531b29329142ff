/* backend_cpu_gemm.c — the one fp32 GEMM of the CPU backend (cpu_sgemm, see
 * backend_cpu_internal.h). Linear layers, LoRA products and the cross-entropy
 * logits all go through it, so CPU training time is mostly spent here.
 *
 * Shape of the algorithm (GotoBLAS, in plain C):
 *  - C is cut into MC x NC tiles; OpenMP hands whole tiles to threads, so each
 *    element of C is owned by one thread and summed over K in the same order
 *    (KC blocks in sequence, k in sequence inside a block) whatever the thread
 *    count: results are bit-identical with 1 or 64 threads.
 *  - For each KC block a thread packs its slice of op(A) into MR-row panels and
 *    of op(B) into NR-column panels (zero-padded). Packing absorbs every
 *    transpose and stride, so one micro-kernel serves NN, NT, TN and TT.
 *  - The micro-kernel keeps an MR x NR block of C in registers; its inner loop
 *    over NR has a fixed trip count that GCC vectorizes at -O2 without -march
 *    (SSE2: MR*NR/4 = 8 accumulator registers of the 16).
 *  - Pack buffers are allocated per call and per thread: a few hundred KB,
 *    negligible next to the FLOPs of any GEMM that goes parallel. */
#include "backend_cpu_internal.h"

#include <stdlib.h>
#include <string.h>

enum { MR = 4, NR = 8, MC = 64, NC = 256, KC = 256 };

/* Below this many multiply-adds a GEMM runs on the calling thread: waking the
 * thread team would cost more than the work. */
#define SGEMM_PARALLEL_MIN_MACS (1u << 18)

static inline float op_at(const float *X, int ld, int trans, int r, int c)
{
    return trans ? X[(size_t)c * ld + r] : X[(size_t)r * ld + c];
}

/* Ap[panel][p][i] = op(A)[i0 + panel*MR + i][p0 + p], zero past row M. */
static void pack_a(float *Ap, const float *A, int lda, int trans_a, int i0, int mc, int p0, int kc)
{
    for (int ir = 0; ir < mc; ir += MR) {
        float *dst = Ap + (size_t)ir * kc;
        for (int p = 0; p < kc; p++)
            for (int i = 0; i < MR; i++)
                dst[p * MR + i] = ir + i < mc ? op_at(A, lda, trans_a, i0 + ir + i, p0 + p) : 0.0f;
    }
}

/* Bp[panel][p][j] = op(B)[p0 + p][j0 + panel*NR + j], zero past column N. */
static void pack_b(float *Bp, const float *B, int ldb, int trans_b, int j0, int nc, int p0, int kc)
{
    for (int jr = 0; jr < nc; jr += NR) {
        float *dst = Bp + (size_t)jr * kc;
        for (int p = 0; p < kc; p++)
            for (int j = 0; j < NR; j++)
                dst[p * NR + j] = jr + j < nc ? op_at(B, ldb, trans_b, p0 + p, j0 + jr + j) : 0.0f;
    }
}

/* C[0:mr, 0:nr] = (overwrite ? 0 : C) + alpha * Ap-panel @ Bp-panel. */
static void micro_kernel(int kc, const float *restrict Ap, const float *restrict Bp, float alpha,
                         float *C, int ldc, int mr, int nr, int overwrite)
{
    float acc[MR][NR] = {{0}};
    for (int p = 0; p < kc; p++) {
        const float *a = Ap + p * MR, *b = Bp + p * NR;
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) acc[i][j] += a[i] * b[j];
    }
    for (int i = 0; i < mr; i++) {
        float *c = C + (size_t)i * ldc;
        for (int j = 0; j < nr; j++) c[j] = (overwrite ? 0.0f : c[j]) + alpha * acc[i][j];
    }
}

static void sgemm_tile(int trans_a, int trans_b, int i0, int mc, int j0, int nc, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta,
                       float *C, int ldc, float *Ap, float *Bp)
{
    for (int p0 = 0; p0 < K; p0 += KC) {
        int kc = K - p0 < KC ? K - p0 : KC;
        int overwrite = p0 == 0 && beta == 0.0f;
        pack_a(Ap, A, lda, trans_a, i0, mc, p0, kc);
        pack_b(Bp, B, ldb, trans_b, j0, nc, p0, kc);
        for (int jr = 0; jr < nc; jr += NR)
            for (int ir = 0; ir < mc; ir += MR)
                micro_kernel(kc, Ap + (size_t)ir * kc, Bp + (size_t)jr * kc, alpha,
                             C + (size_t)(i0 + ir) * ldc + j0 + jr, ldc,
                             mc - ir < MR ? mc - ir : MR, nc - jr < NR ? nc - jr : NR, overwrite);
    }
}

void cpu_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    CT_ASSERT(beta == 0.0f || beta == 1.0f, "cpu_sgemm: beta must be 0 or 1, got %g", beta);
    CT_ASSERT(M >= 0 && N >= 0 && K >= 0, "cpu_sgemm: negative size %dx%dx%d", M, N, K);
    if (M == 0 || N == 0) return;
    if (K == 0) {
        if (beta == 0.0f)
            for (int i = 0; i < M; i++) memset(C + (size_t)i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    int tiles_m = (int)ct_ceil_div((size_t)M, MC), tiles_n = (int)ct_ceil_div((size_t)N, NC);
    int n_tiles = tiles_m * tiles_n;
    int parallel = (double)M * N * K >= SGEMM_PARALLEL_MIN_MACS && n_tiles > 1;
    #pragma omp parallel if (parallel)
    {
        float *Ap = aligned_alloc(64, (size_t)MC * KC * sizeof(float));
        float *Bp = aligned_alloc(64, (size_t)KC * NC * sizeof(float));
        CT_ASSERT(Ap && Bp, "cpu_sgemm: out of host memory for pack buffers");
        #pragma omp for schedule(dynamic)
        for (int t = 0; t < n_tiles; t++) {
            int i0 = (t / tiles_n) * MC, j0 = (t % tiles_n) * NC;
            int mc = M - i0 < MC ? M - i0 : MC, nc = N - j0 < NC ? N - j0 : NC;
            sgemm_tile(trans_a, trans_b, i0, mc, j0, nc, K, alpha, A, lda, B, ldb, beta, C, ldc, Ap, Bp);
        }
        free(Ap);
        free(Bp);
    }
}
