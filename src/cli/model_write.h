/* model_write.h — a model folder's weights written one shard at a time, in
 * spec order (layer by layer), as `ctune init` and `ctune quantize` write them:
 * DIR/model.safetensors, or model-0000i-of-0000n.safetensors plus
 * model.safetensors.index.json (written last) when the weights pass
 * max_shard bytes (docs/ARCHITECTURE.md, "safetensors"). Each tensor is filled
 * as bf16, then written as it is or, by the format: with 4-bit, where
 * quant4_should_quantize says so, as a bitsandbytes 4-bit weight; with mxfp4,
 * a gpt_oss expert parameter [E, in, out] as MXFP4 (BASE_blocks, BASE_scales
 * of its (E, out, in) transpose: mxfp4.h); with fp8, the same linear weights
 * and the per-expert ones as FP8 (NAME, NAME_scale_inv: fp8.h), the weights
 * base_precision fp8 quantizes on load. Memory: one shard of output plus one
 * tensor (bf16 and fp32) at a time. */
#ifndef CT_MODEL_WRITE_H
#define CT_MODEL_WRITE_H

#include "model_config.h"
#include "quant4_write.h"

/* How the weights are stored (see above). */
typedef enum { MODEL_WRITE_BF16, MODEL_WRITE_4BIT, MODEL_WRITE_MXFP4, MODEL_WRITE_FP8 } model_write_form;
typedef struct model_write_format {
    model_write_form form;
    quant4_write_opts quant4; /* MODEL_WRITE_4BIT */
} model_write_format;

/* True when the format writes specs tensor t quantized. */
bool model_write_quantizes(const ct_tensor_spec *t, const model_write_format *f);

/* Fills bf16[0..numel) with the values of specs[i]; an error stops the write. */
typedef int (*model_fill_fn)(void *ctx, size_t i, uint16_t *bf16, ct_error *err);

/* Writes specs[0..n) into DIR (which must exist). who prefixes the progress
 * lines ("init: wrote DIR/model-00001-of-00003.safetensors"); *nfiles gets the
 * number of safetensors files. Files already written stay when it fails. */
int model_write_weights(const ct_tensor_spec *specs, size_t n, const char *dir, size_t max_shard,
                        const model_write_format *f, model_fill_fn fill, void *ctx, const char *who, size_t *nfiles,
                        ct_error *err);

/* The 4-bit options of init and quantize: TYPE (the value of option flag:
 * nf4 or fp4), BLOCKSIZE (NULL: 64) and --no-double-quant. A bad value is a
 * one-line CT_ERR_INPUT naming the option. */
int model_write_parse_quant(const char *flag, const char *type, const char *blocksize, bool no_double_quant,
                            quant4_write_opts *o, ct_error *err);

#endif
