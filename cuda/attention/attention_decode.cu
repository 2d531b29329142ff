/* attention_decode.cu — attention of a few new tokens over a KV cache (attention_decode in
 * backend.h), for `ctune generate`.
 *
 * Layouts: q (Tq, nq, D) and out (Tq, nq, D) bf16; k and v (n_past+Tq, nkv, D)
 * bf16, each with its own token stride (elements). Query i is at position
 * n_past + i and sees keys j <= n_past + i (and j > n_past + i - window when
 * window > 0); query head h reads kv head h / (nq / nkv). sinks (nq) fp32 or
 * NULL add one value-less logit per head to the softmax denominator.
 *
 * One block of 128 threads per (query, head), on a 1-D grid (block i*nq + h:
 * gridDim.y would cap the queries of one call at 65535), three passes:
 *   1. threads take keys round-robin, s_j = scale * q . k_j (q staged in shared
 *      memory as fp32), written to a scratch row; block max;
 *   2. e_j = exp(s_j - max) written back; block sum (+ the sink);
 *   3. thread d owns output dims d, d+128, ...: out_d = sum_j e_j v_jd / sum,
 *      reading v rows coalesced across the block.
 * The scratch holds Tq * nq * n_keys floats; generate.c feeds prompts in chunks,
 * so it stays small. Decoding is bound by the weight GEMVs, not by this kernel:
 * a flash-decoding split over keys is the next step if long contexts need it. */
#include "ct_cuda.cuh"

#include <math.h>

#define DECODE_THREADS 128

// ---- kernels ----

__device__ __forceinline__ float block_reduce(float v, float *red, bool is_max)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    __syncthreads(); /* red may still be read from the previous reduction */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < DECODE_THREADS / 32; w++) v = is_max ? fmaxf(v, red[w]) : v + red[w];
    return v;
}

__global__ void attention_decode_kernel(bf16 *out, int ldo, const bf16 *q, int ldq, const bf16 *k, int ldk,
                                        const bf16 *v, int ldv, float *logits, int Tq, int n_past, int nq,
                                        int nkv, int D, float scale, int window, const float *sinks)
{
    extern __shared__ float qs[]; /* (D) */
    __shared__ float red[DECODE_THREADS / 32];
    const int h = blockIdx.x % nq, i = blockIdx.x / nq, g = h / (nq / nkv);
    const int p = n_past + i, lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    const int n_keys = n_past + Tq;
    float *s = logits + ((size_t)i * nq + h) * n_keys;
    for (int d = threadIdx.x; d < D; d += DECODE_THREADS)
        qs[d] = __bfloat162float(q[(size_t)i * ldq + (size_t)h * D + d]);
    __syncthreads();

    float mx = -INFINITY;
    for (int j = lo + threadIdx.x; j <= p; j += DECODE_THREADS) {
        const bf16 *kr = k + (size_t)j * ldk + (size_t)g * D;
        float dot = 0;
        for (int d = 0; d < D; d++) dot += qs[d] * __bfloat162float(kr[d]);
        s[j] = dot * scale;
        mx = fmaxf(mx, s[j]);
    }
    mx = block_reduce(mx, red, true);
    if (sinks) mx = fmaxf(mx, sinks[h]);
    float sum = 0;
    for (int j = lo + threadIdx.x; j <= p; j += DECODE_THREADS) {
        float e = __expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    sum = block_reduce(sum, red, false); /* its barriers also publish the e_j */
    if (sinks) sum += __expf(sinks[h] - mx);
    const float inv = 1.0f / sum;
    for (int d = threadIdx.x; d < D; d += DECODE_THREADS) {
        float acc = 0;
        for (int j = lo; j <= p; j++) acc += s[j] * __bfloat162float(v[(size_t)j * ldv + (size_t)g * D + d]);
        out[(size_t)i * ldo + (size_t)h * D + d] = __float2bfloat16(acc * inv);
    }
}

// ---- launchers ----

void cuda_attention_decode(ct_backend *be, void *out, int ldo, const void *q, int ldq, const void *k, int ldk,
                           const void *v, int ldv, int Tq, int n_past, int nq, int nkv, int D, float scale,
                           int window, const float *sinks)
{
    CT_ASSERT(nkv > 0 && nq % nkv == 0, "attention_decode: nq %d is not a multiple of nkv %d", nq, nkv);
    CT_ASSERT(Tq >= 0 && n_past >= 0 && D > 0, "attention_decode: Tq %d, n_past %d, D %d", Tq, n_past, D);
    CT_ASSERT((size_t)Tq * nq <= 0x7fffffffu && (size_t)n_past + Tq <= 0x7fffffffu,
              "attention_decode: %d queries x %d heads after %d positions is too large", Tq, nq, n_past);
    if (Tq == 0) return;
    cuda_ctx *c = ctx_of(be);
    size_t n_keys = (size_t)n_past + Tq;
    float *logits = (float *)cuda_scratch(c, (size_t)Tq * nq * n_keys * sizeof(float));
    attention_decode_kernel<<<(unsigned)((size_t)Tq * nq), DECODE_THREADS, D * sizeof(float), c->stream>>>(
        (bf16 *)out, ldo, (const bf16 *)q, ldq, (const bf16 *)k, ldk, (const bf16 *)v, ldv, logits, Tq, n_past,
        nq, nkv, D, scale, window, sinks);
    LAUNCH_CHECK();
}
