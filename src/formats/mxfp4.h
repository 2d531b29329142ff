/* mxfp4.h — MXFP4, the format of gpt-oss's expert weights on the Hub, on the
 * CPU: decoding bit for bit as transformers 5.17 does, an encoder for `ctune
 * init`, and the checkpoint tensors and config.json entry (docs/mxfp4.md).
 *
 * Layout. A weight (E, rows, K) (ctune's expert layout: rows = output
 * features, K = input features, K a multiple of 32) is cut along K into blocks
 * of 32 values. Each block keeps one E8M0 scale byte s (the value 2^(s-127))
 * and 16 bytes of E2M1 codes, two per byte, the even element in the LOW nibble
 * (the opposite of quant4's NF4). The tensors are NAME_blocks U8 [E, rows,
 * K/32, 16] and NAME_scales U8 [E, rows, K/32]. Value = code[q] * 2^(s-127),
 * exact in fp32 and in bf16.
 *
 * Scales above MXFP4_SCALE_MAX are refused when reading: 6 * 2^(s-127) would
 * overflow bf16 (and s = 255 makes transformers decode zeros as NaN). */
#ifndef CT_MXFP4_H
#define CT_MXFP4_H

#include "json.h"
#include "safetensors.h"

#define MXFP4_BLOCK 32          /* values per scale */
#define MXFP4_BLOCK_BYTES 16    /* packed bytes per block */
#define MXFP4_SCALE_MAX 252     /* the largest scale byte whose values all fit bf16 */
#define MXFP4_MAX_SKIP 32       /* modules_to_not_convert entries kept */

/* The 16 fp32 values of the E2M1 codes: 0, .5, 1, 1.5, 2, 3, 4, 6, then the
 * same negated (code 8 is -0.0). */
const float *mxfp4_code(void);

/* y (rows, K) fp32 = code * 2^(s-127) from blocks (rows, K/32, 16) and scales
 * (rows, K/32); rows may span experts (E * rows). K % 32 == 0 (asserted). */
void mxfp4_dequantize(float *y, const uint8_t *blocks, const uint8_t *scales, size_t rows, size_t K);

/* Encodes x (rows, K) fp32 as the gpt-oss reference quantizer does (its torch
 * version, triton_kernels' downcast_to_mxfp_torch): per block the smallest
 * power of two 2^(s-127) >= fp32(max|x| / 6) (s = 0 for a block of zeros),
 * then each x / 2^(s-127) rounded to the nearest code, ties away from zero,
 * keeping the sign (a small negative value is -0, code 8). A non-finite x, or a
 * block so large that it needs s > MXFP4_SCALE_MAX, is CT_ERR_INPUT naming the
 * element. K % 32 == 0 (asserted). */
int mxfp4_quantize(uint8_t *blocks, uint8_t *scales, const float *x, size_t rows, size_t K, ct_error *err);

/* True when the checkpoint holds BASE as MXFP4, i.e. BASE_blocks exists
 * (base "model.layers.0.mlp.experts.gate_up_proj"). */
bool mxfp4_is_quantized(const st_reader *r, const char *base);

/* Finds BASE_blocks and BASE_scales of an (E, rows, K) expert weight and checks
 * them: U8, the exact shapes above, K a multiple of 32, every scale byte <=
 * MXFP4_SCALE_MAX. *blocks and *scales point into the mapped file (valid until
 * st_close). Every mismatch is a one-line CT_ERR_INPUT naming the file and
 * tensor. */
int mxfp4_read_experts(const st_reader *r, const char *base, int64_t E, int64_t rows, int64_t K,
                       const uint8_t **blocks, const uint8_t **scales, ct_error *err);

/* Quantizes x (E, rows, K) fp32 (mxfp4_quantize) and adds BASE_blocks and
 * BASE_scales to w. Errors: mxfp4_quantize's, st_writer_add's, and K not a
 * multiple of 32 (CT_ERR_INPUT naming BASE). */
int mxfp4_write_experts(st_writer *w, const char *base, const float *x, int64_t E, int64_t rows, int64_t K,
                        ct_error *err);

/* config.json's quantization_config for MXFP4. HF converts every gpt-oss
 * experts module that no modules_to_not_convert pattern matches; attention,
 * router, embeddings and lm_head are bf16 whatever the list says. */
typedef struct mxfp4_config {
    int n_skip;
    char skip[MXFP4_MAX_SKIP][128];   /* modules_to_not_convert, in order */
} mxfp4_config;

/* Reads the quantization_config object QC (from config.json, named SOURCE in
 * errors): quant_method must be "mxfp4"; modules_to_not_convert is absent,
 * null or an array of at most MXFP4_MAX_SKIP strings (each < 128 bytes) made
 * of plain characters, '.' and '*' (HF reads them as regular expressions; no
 * other regex syntax is accepted). CT_ERR_INPUT on anything else. */
int mxfp4_read_config(const json_value *qc, const char *source, mxfp4_config *out, ct_error *err);

/* Whether HF would load MODULE ("model.layers.3.mlp.experts") as MXFP4 under
 * c: no pattern matches it as HF does (a regex match at its start, or MODULE
 * ends with the pattern). */
bool mxfp4_converts(const mxfp4_config *c, const char *module);

/* Writes the quantization_config object the official gpt-oss checkpoints
 * carry: {"modules_to_not_convert": [attention, router, embed_tokens,
 * lm_head], "quant_method": "mxfp4"}. */
void mxfp4_write_config(json_writer *w);

#endif
