/* lora_convert.cu — LoRA's fp32 masters rounded to the padded bf16 copies the
 * tensor-core kernels read (linear_lora.cu, moe_expert_lora.cu, moe_gemm.cu, moe_gemm_fused_lora.cu):
 * lora_convert_kernel, one module on all of its output columns, as A (E,RP,in) and
 * its transpose and B in either orientation; lora_convert_cols, up to
 * CT_LORA_COLS_MAX modules on column ranges as one LoRA of rank n_mod R. Ranks
 * from R (n_mod R) to RP are zero. Contracts: moe_gemm.cuh and ct_cuda.cuh.
 *
 * One thread per column of a master:
 * (expert e, input column c) of A (E, R, in), or (e, output column c) of B (E,
 * out, R). The thread reads the column's ranks and writes them as one rank-major
 * element per rank (coalesced across the threads' consecutive columns) and, for
 * the transposed copies, as 16-byte runs of 8 ranks. (One thread per element, as
 * before, divided 64-bit indices per element and wrote the transposes two bytes
 * at a time with a stride of RP elements: 3-4x the time, 0.4 ms per layer of
 * qwen3-30b-a3b.) Column counts E (in + out) stay below 2^31. */
#include "ct_cuda.cuh"
#include "moe_gemm.cuh"

// ---- kernels ----

/* Ranks k0 .. k0 + 7 of one column, rounded: v[j] = value(k0 + j). */
template <typename F> __device__ __forceinline__ uint4 rank_run(int k0, F value)
{
    uint4 pack;
    bf16 *v = (bf16 *)&pack;
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = __float2bfloat16_rn(value(k0 + j));
    return pack;
}

/* Writes run `pack` of ranks k0 .. k0 + 7 to a rank-major copy (dst + k stride_k)
 * and, if t, to the transposed copy's 8 consecutive ranks at t. */
__device__ __forceinline__ void put_run(bf16 *dst, size_t stride_k, bf16 *t, uint4 pack)
{
    const bf16 *v = (const bf16 *)&pack;
    if (dst)
#pragma unroll
        for (int j = 0; j < 8; j++) dst[(size_t)j * stride_k] = v[j];
    if (t) *(uint4 *)t = pack;
}

/* fp32 masters -> padded bf16 copies (any output may be NULL): Ap (E,RP,in) and
 * its transpose At (E,in,RP), Bt (E,RP,out) and its transpose Bp (E,out,RP); ranks
 * from R on are zero. */
__global__ void lora_convert_kernel(bf16 *Ap, bf16 *At, bf16 *Bp, bf16 *Bt, const float *A, const float *B,
                                    int E, int R, int RP, int in, int out)
{
    const int nA = E * in, nB = E * out;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nA + nB; i += gridDim.x * blockDim.x) {
        if (i < nA) {
            const int e = i / in, c = i - e * in;
            const float *a = A + (size_t)e * R * in + c;
            for (int k0 = 0; k0 < RP; k0 += 8)
                put_run(Ap ? Ap + ((size_t)e * RP + k0) * in + c : NULL, in,
                        At ? At + ((size_t)e * in + c) * RP + k0 : NULL,
                        rank_run(k0, [&](int k) { return k < R ? a[(size_t)k * in] : 0.0f; }));
        } else {
            const int j = i - nA, e = j / out, c = j - e * out;
            const float *b = B + ((size_t)e * out + c) * R;
            for (int k0 = 0; k0 < RP; k0 += 8)
                put_run(Bt ? Bt + ((size_t)e * RP + k0) * out + c : NULL, out,
                        Bp ? Bp + ((size_t)e * out + c) * RP + k0 : NULL,
                        rank_run(k0, [&](int k) { return k < R ? b[k] : 0.0f; }));
        }
    }
}

/* The backward's modules as one LoRA of rank n R (lora_convert_cols, moe_gemm.cuh,
 * has what it writes), so g = dy Bt^T sums each module's columns only. */
struct lora_cvt {
    const float *A[CT_LORA_COLS_MAX], *B[CT_LORA_COLS_MAX];
    int col0[CT_LORA_COLS_MAX], cols[CT_LORA_COLS_MAX], n;
};

static __global__ void lora_convert_cols_kernel(bf16 *Ap, bf16 *At, bf16 *Bt, lora_cvt cv, int E, int R, int RP,
                                                int in, int out)
{
    const int nA = E * in, nB = E * out;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nA + nB; i += gridDim.x * blockDim.x) {
        if (i < nA) {
            const int e = i / in, c = i - e * in;
            for (int k0 = 0; k0 < RP; k0 += 8)
                put_run(Ap + ((size_t)e * RP + k0) * in + c, in, At ? At + ((size_t)e * in + c) * RP + k0 : NULL,
                        rank_run(k0, [&](int k) {
                            const int q = k / R;
                            return q < cv.n ? cv.A[q][((size_t)e * R + k % R) * in + c] : 0.0f;
                        }));
        } else {
            const int j = i - nA, e = j / out, c = j - e * out;
            for (int k0 = 0; k0 < RP; k0 += 8)
                put_run(Bt + ((size_t)e * RP + k0) * out + c, out, NULL, rank_run(k0, [&](int k) {
                            const int q = k / R;
                            const bool own = q < cv.n && c >= cv.col0[q] && c < cv.col0[q] + cv.cols[q];
                            return own ? cv.B[q][((size_t)e * cv.cols[q] + c - cv.col0[q]) * R + k % R] : 0.0f;
                        }));
        }
    }
}

// ---- launchers ----

void lora_convert_cols(cudaStream_t st, bf16 *Ap, bf16 *At, bf16 *Bt, const ct_lora_cols *mods, int n_mod, int E,
                       int R, int RP, int in, int out)
{
    CT_ASSERT(n_mod >= 1 && n_mod <= CT_LORA_COLS_MAX && RP % 8 == 0 && RP >= n_mod * R,
              "lora_convert_cols: %d modules of rank %d in %d padded ranks", n_mod, R, RP);
    lora_cvt cv = {};
    cv.n = n_mod;
    for (int q = 0; q < n_mod; q++) {
        cv.A[q] = mods[q].A;
        cv.B[q] = mods[q].B;
        cv.col0[q] = mods[q].col0;
        cv.cols[q] = mods[q].cols;
    }
    const size_t columns = (size_t)E * (in + out); /* one thread per column of the masters */
    const int blocks = grid_for(columns, 256) < 8192 ? grid_for(columns, 256) : 8192;
    lora_convert_cols_kernel<<<blocks, 256, 0, st>>>(Ap, At, Bt, cv, E, R, RP, in, out);
    LAUNCH_CHECK();
}
