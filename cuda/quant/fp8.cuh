/* fp8.cuh — the FP8 E4M3 kernels of cuda/quant/fp8.cu as plain C launchers on
 * a caller's stream: a block-scaled weight decoded to bf16, activations
 * quantized to E4M3 with per-128-column power-of-two scales, and the byte
 * transpose of a weight. Each is bit for bit the CPU function of
 * src/formats/fp8.h it names (tests/test_cuda_fp8.c). Pointers are device
 * memory; the launchers assert what the kernels need and return at once.
 *
 * The header is C as well as CUDA, so C tests can call the launchers: C
 * callers hold bf16 as its 16 bits. */
#ifndef CT_FP8_CUH
#define CT_FP8_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#include <cuda_bf16.h>
typedef __nv_bfloat16 fp8_bf16;
extern "C" {
#else
typedef uint16_t fp8_bf16;
#endif

/* y (rows, cols) bf16 = bf16(decode(q) * scale_inv of its 128x128 block): the
 * fp32 product rounded once, i.e. fp8_dequantize_blocks rounded to bf16. q
 * (rows, cols) E4M3 row-major and dense, scale_inv (ceil(rows/128),
 * ceil(cols/128)) fp32 row-major with ld_scale >= ceil(cols/128) per block
 * row (fp8_weight_scale_ld(cols) for the grids the model holds). Any rows and
 * cols; y 16-byte and q 8-byte aligned (asserted). NaN codes (which
 * fp8_read_weight refuses) decode to a NaN. */
void fp8_dequant_blocks_bf16(fp8_bf16 *y, const uint8_t *q, const float *scale_inv, size_t ld_scale, size_t rows,
                             size_t cols, cudaStream_t stream);

/* fp8_quantize_rows of the bf16 activations x (T, K), row stride ldx: q (T,
 * K) E4M3 with row stride ldq, scale[g * ld_scale + t] the power-of-two scale
 * of row t's 128-column group g (fp8_row_scale_index). K % 8 == 0, ldx % 8 ==
 * 0, ldq % 8 == 0, ld_scale >= T, x 16-byte and q 8-byte aligned (asserted). */
void fp8_quant_rows(uint8_t *q, int ldq, float *scale, int ld_scale, const fp8_bf16 *x, int ldx, int T, int K,
                    cudaStream_t stream);

/* qt (cols, rows) = q (rows, cols) transposed, byte for byte (E4M3 codes of
 * W to those of W^T); the scale grid follows with fp8_transpose_scales on the
 * host. Any rows and cols; 16-byte loads and stores when both are multiples
 * of 16 and the pointers 16-byte aligned. */
void fp8_transpose(uint8_t *qt, const uint8_t *q, size_t rows, size_t cols, cudaStream_t stream);

/* The block grid of W^T from that of W (rows, cols), both padded as the model
 * holds them: st[cb * fp8_weight_scale_ld(rows) + rb] = s[rb *
 * fp8_weight_scale_ld(cols) + cb], the padding of st zero. */
void fp8_transpose_scales_dev(float *st, const float *s, size_t rows, size_t cols, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
