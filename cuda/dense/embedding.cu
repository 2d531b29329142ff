/* embedding.cu — the token embedding: out[t] = table[ids[t]], bf16 rows of H
 * elements (out (T,H), table (V,H)), copied 16 bytes (8 bf16) per thread, so H
 * must be a multiple of 8 and the pointers 16-byte aligned (the launcher asserts
 * it; cuda_check_model refuses such models at load). */
#include "ct_cuda.cuh"

// ---- kernels ----

__global__ void embedding_kernel(bf16 *out, const int32_t *ids, const bf16 *table, int T, int H)
{
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (size_t)T * H) return;
    size_t t = idx / H, i = idx % H;
    *(uint4 *)(out + idx) = *(const uint4 *)(table + (size_t)ids[t] * H + i);
}

// ---- launchers ----

void cuda_embedding(ct_backend *be, void *out, const int32_t *ids, const void *table, int T, int H)
{
    check_vec8("embedding", out, H, H);
    check_vec8("embedding", table, H, H);
    size_t n8 = (size_t)T * H / 8;
    if (n8 == 0) return;
    embedding_kernel<<<grid_for(n8, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)out, ids, (const bf16 *)table, T, H);
    LAUNCH_CHECK();
}
