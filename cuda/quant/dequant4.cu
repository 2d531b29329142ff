/* dequant4.cu — a frozen 4-bit weight decoded to bf16 for the GEMMs
 * (backend.h: dequant4). The QLoRA path dequantizes each weight right before
 * its GEMM into one reused buffer (model_weight), as bitsandbytes' training
 * path does: a GEMM over thousands of tokens is far slower than this pass,
 * which streams 0.5 byte in and 2 bytes out per element.
 *
 * One thread decodes 16 consecutive elements: 8 code bytes in one 8-byte load,
 * 16 bf16 out in two 16-byte stores. A block of the format (>= 32 elements)
 * holds whole threads' groups, so each thread reads one scale. The 16 code
 * values sit in shared memory. The product code * scale is formed in fp32
 * (exact: NF4/FP4 codes times an fp32 absmax round once here, as bnb does;
 * MXFP4 values times a power of two are exact) and rounded once to bf16. */
#include "ct_cuda.cuh"

#define DQ_THREADS 256
#define DQ_PER_THREAD 16

// ---- kernels ----

/* 2^(s-127) for an E8M0 byte s < 255 (s = 0 is the subnormal 2^-127). */
__device__ __forceinline__ float e8m0_scale(uint8_t s)
{
    return s == 0 ? __uint_as_float(0x00400000u) : __uint_as_float((uint32_t)s << 23);
}

template <bool MX>
__global__ void dequant4_kernel(bf16 *y, const uint8_t *codes, const void *scales, size_t groups, int blocksize,
                                float4 c0, float4 c1, float4 c2, float4 c3)
{
    __shared__ float code[16];
    if (threadIdx.x < 16) {
        float4 c = threadIdx.x < 4 ? c0 : threadIdx.x < 8 ? c1 : threadIdx.x < 12 ? c2 : c3;
        int j = threadIdx.x % 4;
        code[threadIdx.x] = j == 0 ? c.x : j == 1 ? c.y : j == 2 ? c.z : c.w;
    }
    __syncthreads();
    size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups) return;
    size_t i0 = g * DQ_PER_THREAD;
    float s = MX ? e8m0_scale(((const uint8_t *)scales)[i0 / blocksize]) : ((const float *)scales)[i0 / blocksize];
    uint2 packed = *(const uint2 *)(codes + i0 / 2);
    uint32_t words[2] = {packed.x, packed.y};
    __align__(16) bf16 out[DQ_PER_THREAD];
#pragma unroll
    for (int w = 0; w < 2; w++)
#pragma unroll
        for (int b = 0; b < 4; b++) {
            uint32_t byte = (words[w] >> (8 * b)) & 0xffu;
            uint32_t even = MX ? byte & 0xfu : byte >> 4, odd = MX ? byte >> 4 : byte & 0xfu;
            out[w * 8 + b * 2] = __float2bfloat16_rn(__fmul_rn(code[even], s));
            out[w * 8 + b * 2 + 1] = __float2bfloat16_rn(__fmul_rn(code[odd], s));
        }
    *(uint4 *)(y + i0) = *(const uint4 *)out;
    *(uint4 *)(y + i0 + 8) = *(const uint4 *)(out + 8);
}

// ---- launchers ----

static void cuda_dequant4(ct_backend *be, void *y, const uint8_t *codes, const void *scales, size_t n, int blocksize,
                          quant4_type type)
{
    bool mx = type == QUANT4_MXFP4;
    CT_ASSERT(blocksize >= 32 && n % (size_t)blocksize == 0 && (!mx || blocksize == QUANT4_MXFP4_BLOCKSIZE),
              "dequant4: n %zu, blocksize %d (%s)", n, blocksize, mx ? "mxfp4" : "bnb");
    CT_ASSERT((uintptr_t)y % 16 == 0 && (uintptr_t)codes % 8 == 0, "dequant4: y needs 16-byte, codes 8-byte alignment");
    size_t groups = n / DQ_PER_THREAD;
    if (groups == 0) return;
    const float *c = quant4_code(type);
    float4 c0 = make_float4(c[0], c[1], c[2], c[3]), c1 = make_float4(c[4], c[5], c[6], c[7]);
    float4 c2 = make_float4(c[8], c[9], c[10], c[11]), c3 = make_float4(c[12], c[13], c[14], c[15]);
    cudaStream_t st = ctx_of(be)->stream;
    if (mx)
        dequant4_kernel<true><<<grid_for(groups, DQ_THREADS), DQ_THREADS, 0, st>>>((bf16 *)y, codes, scales, groups,
                                                                                  blocksize, c0, c1, c2, c3);
    else
        dequant4_kernel<false><<<grid_for(groups, DQ_THREADS), DQ_THREADS, 0, st>>>((bf16 *)y, codes, scales, groups,
                                                                                   blocksize, c0, c1, c2, c3);
    LAUNCH_CHECK();
}

void cuda_fill_quant_ops(ct_backend *be) { be->dequant4 = cuda_dequant4; }
