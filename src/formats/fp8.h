/* fp8.h — FP8 E4M3 base weights with 128x128 block scales ("fine-grained
 * FP8", the format of DeepSeek-V3 and of the Hub's Qwen3-*-FP8 checkpoints) on
 * the CPU: the E4M3 codes, the weight blocks as transformers 5.17 quantizes
 * them, ctune's per-128-column activation scales for the FP8 GEMMs, and the
 * checkpoint tensors and config.json entry (docs/fp8.md). The CPU functions
 * are the oracle of the CUDA kernels (cuda/quant/fp8.cuh).
 *
 * E4M3 ("fn": finite, no infinities). Bit 7 sign, 4 exponent bits (bias 7), 3
 * mantissa bits; exponent 0 holds the subnormals m * 2^-9; 0x7f and 0xff are
 * NaN, so the largest value is 448 (0x7e). Every code is exact in fp16, bf16
 * and fp32.
 *
 * Weights. W (rows, cols) row-major (rows = output features) is cut into
 * 128x128 blocks, the last row and column of blocks partial when rows or cols
 * are not multiples of 128. NAME is F8_E4M3 (rows, cols); NAME_scale_inv
 * ("...q_proj.weight_scale_inv") holds one multiplier per block, (ceil(rows/128),
 * ceil(cols/128)) row-major: W[r][c] = decode(q[r][c]) * scale_inv[r/128][c/128].
 *
 * Activations (ctune's own scheme, not a checkpoint format). X (T, K) gets one
 * power-of-two scale per row t and 128-column group g (the last group
 * partial); X[t][k] = decode(q[t][k]) * scale[g][t], stored group-major
 * (fp8_row_scale_index): the layout cuBLASLt reads for per-128 scales of its B
 * operand. Power-of-two scales make x / scale exact, so every device computes
 * the same codes. */
#ifndef CT_FP8_H
#define CT_FP8_H

#include "json.h"
#include "safetensors.h"

#define FP8_BLOCK 128           /* weight block rows and columns; activation group columns */
#define FP8_E4M3_MAX 448.0f     /* the largest E4M3 value (code 0x7e) */

/* The two index helpers are shared with the kernels (cuda/quant/fp8.cu). */
#ifdef __CUDACC__
#define FP8_HOST_DEVICE __host__ __device__
#else
#define FP8_HOST_DEVICE
#endif

/* Blocks (or groups) along a dimension of n elements: ceil(n / 128). */
static inline FP8_HOST_DEVICE size_t fp8_blocks(size_t n) { return (n + FP8_BLOCK - 1) / FP8_BLOCK; }

/* The row length of a weight's 128x128 scale grid as ctune holds it in
 * memory: fp8_blocks(cols) padded to a multiple of 4, the layout cuBLASLt's
 * 128x128 scale mode reads (a checkpoint's scale_inv is unpadded). */
static inline FP8_HOST_DEVICE size_t fp8_weight_scale_ld(size_t cols) { return (fp8_blocks(cols) + 3) / 4 * 4; }

/* Where the activation scale of token t and column group g lives, for scales
 * stored one column per group with ld_scale >= T (tokens contiguous). */
static inline FP8_HOST_DEVICE size_t fp8_row_scale_index(size_t g, size_t t, size_t ld_scale)
{
    return g * ld_scale + t;
}

/* fp32 -> E4M3, as torch's x.clamp(-448, 448).to(torch.float8_e4m3fn): round
 * to nearest, ties to even; finite values beyond 448 and the infinities
 * saturate to +-448; the sign is kept, so -0.0 and small negatives are 0x80;
 * NaN is 0x7f (0xff when its sign bit is set). */
uint8_t fp8_e4m3_encode(float x);
/* E4M3 -> fp32, exact (fp8_e4m3_table()[b]). 0x7f and 0xff decode to NaN. */
float fp8_e4m3_decode(uint8_t b);
/* The 256 values of the codes, indexed by the byte. */
const float *fp8_e4m3_table(void);

/* y (rows, cols) fp32 = decode(q) * scale_inv of its block (fp32 product, one
 * rounding). q (rows, cols); scale_inv (fp8_blocks(rows), fp8_blocks(cols)). */
void fp8_dequantize_blocks(float *y, const uint8_t *q, const float *scale_inv, size_t rows, size_t cols);

/* Quantizes x (rows, cols) fp32 into q and scale_inv (shapes as above) with
 * the arithmetic of transformers 5.17's Fp8Quantize._quantize_one
 * (integrations/finegrained_fp8.py), the op FineGrainedFP8Config(weight_
 * block_size=(128, 128)) runs on each nn.Linear weight of a bf16 model:
 *   amax      = max |x| over the block (fp32)
 *   scale     = (1 / amax) * 448, two fp32 roundings (torch computes a
 *               number over a tensor as its reciprocal times the number);
 *               1 for a block of zeros
 *   scale_inv = 1 / scale in fp32 (stored; it differs from amax / 448 in the
 *               last bits of about half the blocks)
 *   q         = to_e4m3(clamp(x * scale, -448, 448)), x * scale in fp32
 * A block of zeros keeps scale_inv 1 and the signs of its zeros (-0 -> 0x80).
 * On load, transformers 5.17 first casts the bf16 weight to E4M3 unscaled
 * (the loader casts to the FP8Linear parameter's dtype before the op runs),
 * losing most bits of small weights; its on-load result is this function of
 * decode(encode(x)). Partial blocks: 5.17 quantizes none (a weight whose rows
 * or cols are not multiples of 128 is cast unscaled and its scale_inv left
 * uninitialized); ctune applies the rule to the elements a partial block has,
 * which equals the op on the weight zero-padded to whole blocks, cropped.
 * Errors (CT_ERR_INPUT): a non-finite x names its element; a block whose max
 * |x| is so small (below ~1.3e-36) that its scale overflows fp32 names the
 * block (transformers would store scale_inv 0). */
int fp8_quantize_blocks(uint8_t *q, float *scale_inv, const float *x, size_t rows, size_t cols, ct_error *err);

/* Quantizes activations x (T, K) fp32 into q (T, K) and scale, one per row t
 * and 128-column group g, at scale[fp8_row_scale_index(g, t, ld_scale)]
 * (ld_scale >= T, asserted):
 *   amax  = max |x| over the group (NaN ignored, as fmaxf does)
 *   scale = the smallest power of two >= fp32(amax / 448), at least 2^-126
 *           (carried into the exponent field); 1 when amax is 0
 *   q     = encode(x / scale), the division exact (a power of two)
 * Never fails: an infinite x makes its group's scale inf (codes +-0, NaN for
 * the inf itself). A NaN result is always 0x7f: its sign differs between
 * devices (x86 makes inf / inf negative, a GPU's NaN is positive). */
void fp8_quantize_rows(uint8_t *q, float *scale, const float *x, size_t T, size_t K, size_t ld_scale);

/* The scale grid of W^T: st (fp8_blocks(cols), fp8_blocks(rows)) from s
 * (fp8_blocks(rows), fp8_blocks(cols)), for the weight W (rows, cols). */
void fp8_transpose_scales(float *st, const float *s, size_t rows, size_t cols);

/* True when the checkpoint holds NAME ("model.layers.0.self_attn.q_proj.
 * weight") as FP8: NAME is F8_E4M3 or NAME_scale_inv exists (fp8_read_weight
 * then says what is wrong with a half-formed pair). */
bool fp8_is_quantized(const st_reader *r, const char *name);

/* Finds and checks weight NAME of shape (rows, cols): NAME F8_E4M3 [rows,
 * cols] with no NaN code (0x7f, 0xff); NAME_scale_inv [fp8_blocks(rows),
 * fp8_blocks(cols)], F32 as transformers saves it, or BF16 or F16 as some Hub
 * checkpoints ship it (Qwen3 FP8 models), every value finite and > 0. *q points
 * into the mapped file (valid until st_close); the scales are converted
 * (exactly) into the caller's scale_inv, fp8_blocks(rows) * fp8_blocks(cols)
 * floats. Every mismatch is a one-line CT_ERR_INPUT naming file and tensor. */
int fp8_read_weight(const st_reader *r, const char *name, int64_t rows, int64_t cols, const uint8_t **q,
                    float *scale_inv, ct_error *err);

/* Quantizes x (rows, cols) fp32 (fp8_quantize_blocks) and adds NAME F8_E4M3
 * [rows, cols] and NAME_scale_inv F32 [fp8_blocks(rows), fp8_blocks(cols)] to
 * w, as transformers' save_pretrained writes an FP8Linear. Errors:
 * fp8_quantize_blocks' (prefixed with NAME), st_writer_add's, and sizes that
 * are not positive. */
int fp8_write_weight(st_writer *w, const char *name, const float *x, int64_t rows, int64_t cols, ct_error *err);

/* Writes the quantization_config object transformers 5.17 writes into
 * config.json for FineGrainedFP8Config(weight_block_size=(128, 128)): its keys
 * sorted, one per line, indented by indent + 2 spaces, the closing brace by
 * indent. modules_to_not_convert is null: transformers keeps lm_head out by
 * itself; embeddings and norms are not nn.Linear. */
void fp8_write_config(json_writer *j, int indent);

/* CONFIG (a config.json's text) with that quantization_config appended as its
 * last key, every other byte kept: a malloc'd text the caller frees, *out_len
 * its length. NULL with CT_ERR_INPUT (naming source) when the text is not a
 * JSON object or already has a quantization_config. */
char *fp8_config_text(const char *config, size_t len, const char *source, size_t *out_len, ct_error *err);

#endif
