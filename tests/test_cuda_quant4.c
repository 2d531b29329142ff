/* test_cuda_quant4.c — the 4-bit weight decode on CUDA (cuda/quant/dequant4.cu:
 * dequant4) against the CPU reference, bit for bit: the CPU's fp32 product
 * code * scale rounded once to bf16 must equal every GPU element. Random code
 * bytes (every nibble value), NF4 and FP4 with random fp32 absmax (blocksizes
 * 32 to 4096), MXFP4 with every scale byte 0..252 (subnormal 2^-127 included),
 * sizes from one block to 2^22 + 64 elements (a partly filled last CUDA block).
 * Without a GPU every test reports "skip NAME: skipped: no GPU". */
#include "backend.h"
#include "check.h"
#include "cuda_pair.h"

#include <string.h>

static void dequant_case(quant4_type type, size_t n, int blocksize)
{
    size_t nb = n / (size_t)blocksize;
    bool mx = type == QUANT4_MXFP4;
    uint8_t *codes = ct_malloc(n / 2), *sbytes = ct_malloc(nb);
    float *absmax = ct_malloc(nb * sizeof(float));
    for (size_t i = 0; i < n / 2; i++) codes[i] = (uint8_t)(ct_rng_u64(&rng) >> 56);
    for (size_t b = 0; b < nb; b++) {
        sbytes[b] = (uint8_t)(b % 253);                       /* every legal E8M0 byte in turn */
        absmax[b] = 1e-3f + (float)(ct_rng_u64(&rng) >> 40) * (1.0f / 16777216.0f) * 4.0f;
    }
    const void *scales_h = mx ? (const void *)sbytes : absmax;
    size_t sbytes_n = mx ? nb : nb * sizeof(float);
    pair pc = put_raw(codes, n / 2), ps = put_raw(scales_h, sbytes_n);
    float *want = ct_malloc(n * sizeof(float));
    cpu->dequant4(cpu, want, pc.c, ps.c, n, blocksize, type);
    void *y = gpu->alloc(gpu, n * 2);
    gpu->dequant4(gpu, y, pc.g, ps.g, n, blocksize, type);
    uint16_t *got = ct_malloc(n * 2);
    gpu->download(gpu, got, y, n * 2);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t w = ct_f32_to_bf16(want[i]);
        if (got[i] != w && !(bad++)) first = i;
    }
    CHECK(bad == 0, "type %d n %zu blocksize %d: %zu of %zu elements differ (first %zu: gpu 0x%04x, cpu %g)",
          (int)type, n, blocksize, bad, n, first, bad ? got[first] : 0, bad ? want[first] : 0.0f);
    gpu->free(gpu, y);
    drop(pc);
    drop(ps);
    free(codes); free(sbytes); free(absmax); free(want); free(got);
}

TEST(nf4_and_fp4_decode_bit_for_bit)
{
    NEED_GPU();
    for (int t = 0; t < 2; t++) {
        quant4_type type = t ? QUANT4_FP4 : QUANT4_NF4;
        dequant_case(type, 64, 64);
        dequant_case(type, 32 * 7, 32);
        dequant_case(type, 4096 * 3, 4096);
        dequant_case(type, ((size_t)1 << 22) + 64, 64);
    }
}

TEST(mxfp4_decode_bit_for_bit)
{
    NEED_GPU();
    dequant_case(QUANT4_MXFP4, 32, 32);
    dequant_case(QUANT4_MXFP4, 32 * 253 * 3, 32); /* every scale byte, subnormal 2^-127 (byte 0) included */
    dequant_case(QUANT4_MXFP4, ((size_t)1 << 22) + 32 * 5, 32);
}

int main(void)
{
    ct_error err = {0};
    cpu = backend_cpu_new();
    gpu = backend_cuda_new(&err);
    if (!gpu) printf("# CUDA backend unavailable: %s\n", err.msg);
    ct_rng_seed(&rng, 47);
    RUN(nf4_and_fp4_decode_bit_for_bit);
    RUN(mxfp4_decode_bit_for_bit);
    if (gpu) gpu->destroy(gpu);
    cpu->destroy(cpu);
    return check_summary();
}
