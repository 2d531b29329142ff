/* backend_cpu_internal.h — what the files of the CPU reference backend share
 * (backend_cpu.c, backend_cpu_gemm.c, backend_cpu_attention.c,
 * backend_cpu_moe.c, backend_cpu_gdn.c). Not a public
 * contract: the model only sees struct ct_backend (backend.h). */
#ifndef CT_BACKEND_CPU_INTERNAL_H
#define CT_BACKEND_CPU_INTERNAL_H

#include "backend.h"

/* C (M,N) = alpha * op(A) @ op(B) + beta * C, row-major with row strides.
 * op(A) is (M,K): A[i*lda + k], or A[k*lda + i] when trans_a.
 * op(B) is (K,N): B[k*ldb + j], or B[j*ldb + k] when trans_b.
 * beta is 0 (C is overwritten and never read, so it may hold garbage) or 1.
 * Each element of C is summed by one thread in a fixed order, so results do not
 * depend on the number of OpenMP threads. */
void cpu_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

void cpu_attention_fwd(ct_backend *be, void *out, int ldo, float *lse,
                       const void *q, int ldq, const void *k, int ldk, const void *v, int ldv,
                       const int32_t *cu_seqlens, int n_docs, int max_seqlen,
                       int T, int nq, int nkv, int D, float scale, int window, const float *sinks);
void cpu_attention_bwd(ct_backend *be, void *dq, int lddq, void *dk, int lddk, void *dv, int lddv,
                       const void *dout, int lddo, const void *out, int ldo, const float *lse,
                       const void *q, int ldq, const void *k, int ldk, const void *v, int ldv,
                       const int32_t *cu_seqlens, int n_docs, int max_seqlen,
                       int T, int nq, int nkv, int D, float scale, int window, const float *sinks);

/* backend_cpu_decode.c */
void cpu_attention_decode(ct_backend *be, void *out, int ldo, const void *q, int ldq,
                          const void *k, int ldk, const void *v, int ldv,
                          int Tq, int n_past, int nq, int nkv, int D, float scale, int window,
                          const float *sinks);

/* Sets the mixture-of-experts entries of be (backend_cpu_moe.c). They call the
 * dense ops through be, so those must be set already. */
void cpu_moe_install(ct_backend *be);
/* Sets the Gated DeltaNet entries of be (backend_cpu_gdn.c). */
void cpu_gdn_install(ct_backend *be);

#endif
