/* gemm.cu — every dense matrix product of the backend (linear layers, LoRA, the
 * LM head) goes through gemm(): cuBLASLt, bf16 inputs, fp32 accumulation, bf16 or
 * fp32 output, optional bias epilogue; and those of an FP8 base through
 * gemm_fp8(): E4M3 inputs with block scales. Attention and the grouped expert
 * GEMMs are hand-written kernels (attention*.cu, moe_gemm*.cu).
 *
 * FP8 (Hopper): cuBLASLt runs FP8 only as "TN" (its A transposed, its B not),
 * i.e. our C = A B^T with both A and B stored K-contiguous, which is what
 * x W^T is; the input gradient uses a transposed copy of W (fp8.cu). The
 * weight (our B, its A) is scaled per 128x128 block (BLK128x128_32F, the grid
 * row-major with rows padded to 4 blocks), the activations (our A, its B) per
 * row and 128-column group (VEC128_32F, group-major, M per group). Measured on
 * the H200 at the Llama-3.1-8B LoRA shapes: 1.25-1.5k TFLOP/s against bf16's
 * 0.84-0.96k (lab/fp8_gemm/, which also found those scale layouts). With
 * these modes cuBLASLt 13.1 finds no algorithm unless M (the token count) is
 * a multiple of 4 (N and K: any multiple of 16 runs); fp8.cu runs the last
 * 1-3 rows of a batch through a padded 4-row product.
 *
 * Row-major on a column-major library: a row-major (M,N) matrix with row stride
 * ld is the column-major (N,M) matrix with leading dimension ld, so
 * C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B
 * and its "B" is our A, with m = N, n = M.
 *
 * Plans: the matmul descriptor, the three layouts and the heuristic's algorithm
 * are built once per (shape, strides, types, transposes, epilogue, pointer
 * alignment) and reused, never rebuilt per call. Pointer alignment is part of
 * the key because column slices of fused tensors (q inside qkv) need not be
 * 256-byte aligned, and cuBLASLt otherwise assumes they are. Lookup is a linear
 * scan over key hashes: a model has a few dozen shapes per T, and the scan costs
 * far less than a launch. Destroying a plan while queued matmuls use it is safe:
 * cuBLASLt copies what it needs at launch. */
#include "ct_cuda.cuh"

#include <stdlib.h>
#include <string.h>

#define MAX_PLANS 2048

struct gemm_key {
    int M, N, K, lda, ldb, ldc;
    int ta, tb, ctype, bias;
    int align_a, align_b, align_c;
    int fp8; /* E4M3 inputs with block scales (gemm_fp8) */
};

struct gemm_plan {
    uint64_t hash;   /* of key: the scan compares this first */
    gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C and D */
    cublasLtMatmulAlgo_t algo;
};

/* Largest power of two (up to 256) dividing the address. */
static int alignment_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a % (uintptr_t)al) != 0) al /= 2;
    return al;
}

/* fp8_scales: the weight's and the activations' scale pointers of the call
 * that builds the plan. cuBLASLt refuses a block-scaled heuristic query
 * without them ("BLK128x128_32F requires a custom pointer for A scale"); each
 * call sets its own again before the matmul. */
static void plan_build(cuda_ctx *c, gemm_plan *p, const float *const fp8_scales[2])
{
    const gemm_key *k = &p->key;
    cudaDataType_t ct = (cudaDataType_t)k->ctype;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt A = our B */
    cublasOperation_t opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt B = our A */
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    cudaDataType_t in_type = k->fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    if (k->fp8) { /* cuBLASLt's A is our B, the weight */
        cublasLtMatmulMatrixScale_t a = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        cublasLtMatmulMatrixScale_t b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a, sizeof a));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b, sizeof b));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &fp8_scales[0],
                                                    sizeof fp8_scales[0]));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &fp8_scales[1],
                                                    sizeof fp8_scales[1]));
    }
    if (k->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_16BF;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    /* Stored shapes in column-major terms (rows, cols) = (row-major cols, rows). */
    if (k->tb) CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, in_type, k->K, k->N, k->ldb));
    else       CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, in_type, k->N, k->K, k->ldb));
    if (k->ta) CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, in_type, k->M, k->K, k->lda));
    else       CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, in_type, k->K, k->M, k->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, ct, k->N, k->M, k->ldc));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = c->workspace_bytes;
    uint32_t al_a = (uint32_t)k->align_b, al_b = (uint32_t)k->align_a, al_c = (uint32_t)k->align_c;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1,
                                                &res, &found));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    CT_ASSERT(found > 0, "cuBLASLt has no algorithm for M=%d N=%d K=%d lda=%d ldb=%d ldc=%d ta=%d "
              "tb=%d out=%s bias=%d fp8=%d (alignments %d/%d/%d)", k->M, k->N, k->K, k->lda, k->ldb, k->ldc,
              k->ta, k->tb, ct == CUDA_R_32F ? "f32" : "bf16", k->bias, k->fp8, k->align_a, k->align_b, k->align_c);
    p->algo = res.algo;
}

/* FNV-1a over the key's bytes. */
static uint64_t key_hash(const gemm_key *key)
{
    const unsigned char *b = (const unsigned char *)key;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *key; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static gemm_plan *plan_get(cuda_ctx *c, const gemm_key *key, const float *const fp8_scales[2])
{
    uint64_t h = key_hash(key);
    for (int i = 0; i < c->n_plans; i++)
        if (c->plans[i].hash == h && memcmp(&c->plans[i].key, key, sizeof *key) == 0) return &c->plans[i];
    /* A run whose T changes every micro-batch would add plans forever: start over. */
    if (c->n_plans == MAX_PLANS) gemm_plans_free(c);
    if (c->n_plans == c->cap_plans) {
        c->cap_plans = c->cap_plans ? 2 * c->cap_plans : 64;
        c->plans = (gemm_plan *)ct_realloc(c->plans, (size_t)c->cap_plans * sizeof *c->plans);
    }
    gemm_plan *p = &c->plans[c->n_plans];
    memset(p, 0, sizeof *p);
    p->hash = h;
    p->key = *key;
    plan_build(c, p, fp8_scales);
    c->n_plans++;
    return p;
}

// ---- launchers ----

void gemm(cuda_ctx *c, void *C, cudaDataType_t ctype, int ldc,
          const void *A, int lda, bool ta, const void *B, int ldb, bool tb,
          int M, int N, int K, float alpha, float beta, const bf16 *bias)
{
    gemm_from(c, C, C, ctype, ldc, A, lda, ta, B, ldb, tb, M, N, K, alpha, beta, bias);
}

/* cuBLASLt reads C and writes D through separate pointers with one layout: D =
 * alpha op(A) op(B) + beta C_in + bias, so a residual add costs no extra pass. */
void gemm_from(cuda_ctx *c, void *C, const void *C_in, cudaDataType_t ctype, int ldc,
               const void *A, int lda, bool ta, const void *B, int ldb, bool tb,
               int M, int N, int K, float alpha, float beta, const bf16 *bias)
{
    CT_ASSERT(M >= 0 && N >= 0 && K > 0, "gemm: bad sizes M=%d N=%d K=%d", M, N, K);
    CT_ASSERT(ctype == CUDA_R_16BF || ctype == CUDA_R_32F, "gemm: output type %d", (int)ctype);
    CT_ASSERT(ldc >= N && lda >= (ta ? M : K) && ldb >= (tb ? K : N),
              "gemm: strides lda=%d ldb=%d ldc=%d too small for M=%d N=%d K=%d", lda, ldb, ldc, M, N, K);
    if (M == 0 || N == 0) return;
    gemm_key key;
    memset(&key, 0, sizeof key); /* padding-free, but memcmp must never see garbage */
    key.M = M; key.N = N; key.K = K;
    key.lda = lda; key.ldb = ldb; key.ldc = ldc;
    key.ta = ta; key.tb = tb; key.ctype = (int)ctype; key.bias = bias != NULL;
    key.align_a = alignment_of(A);
    key.align_b = alignment_of(B);
    int al_out = alignment_of(C), al_in = alignment_of(C_in);
    key.align_c = al_out < al_in ? al_out : al_in;
    gemm_plan *p = plan_get(c, &key, NULL);
    if (bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    CUBLAS_CHECK(cublasLtMatmul(c->lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C_in, p->lc, C, p->lc,
                                &p->algo, c->workspace, c->workspace_bytes, c->stream));
}

void gemm_fp8(cuda_ctx *c, bf16 *C, int ldc, const bf16 *C_in, const uint8_t *A8, int lda, const float *a_scale,
              const uint8_t *B8, int ldb, const float *b_scale, int M, int N, int K, const bf16 *bias)
{
    CT_ASSERT(M >= 0 && M % 4 == 0 && N >= 0 && K > 0 && K % 16 == 0 && lda % 16 == 0 && ldb % 16 == 0 &&
              ldc % 8 == 0 && lda >= K && ldb >= K && ldc >= N, "gemm_fp8: M=%d N=%d K=%d lda=%d ldb=%d ldc=%d (M a multiple of 4, K "
              "and the input strides of 16)", M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0) return;
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.M = M; key.N = N; key.K = K;
    key.lda = lda; key.ldb = ldb; key.ldc = ldc;
    key.ta = 0; key.tb = 1; key.ctype = (int)CUDA_R_16BF; key.bias = bias != NULL; key.fp8 = 1;
    key.align_a = alignment_of(A8);
    key.align_b = alignment_of(B8);
    int al_out = alignment_of(C), al_in = C_in ? alignment_of(C_in) : al_out;
    key.align_c = al_out < al_in ? al_out : al_in;
    const float *const scales[2] = {b_scale, a_scale}; /* cuBLASLt's A is our B */
    gemm_plan *p = plan_get(c, &key, scales);
    if (bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale,
                                                sizeof b_scale));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale,
                                                sizeof a_scale));
    float alpha = 1.0f, beta = C_in ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(c->lt, p->desc, &alpha, B8, p->la, A8, p->lb, &beta, C_in ? C_in : C, p->lc, C,
                                p->lc, &p->algo, c->workspace, c->workspace_bytes, c->stream));
}

void gemm_plans_free(cuda_ctx *c)
{
    for (int i = 0; i < c->n_plans; i++) {
        gemm_plan *p = &c->plans[i];
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lc));
        CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
    }
    free(c->plans);
    c->plans = NULL;
    c->n_plans = c->cap_plans = 0;
}
