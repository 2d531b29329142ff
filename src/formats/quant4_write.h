/* quant4_write.h — writing bitsandbytes 4-bit model folders (docs/quantization.md):
 * one Linear4bit weight into an st_writer under the keys, dtypes, shapes and
 * quant_state JSON that transformers 5.17 + bitsandbytes 0.50.2 save_pretrained
 * writes, the config.json quantization_config beside it, and the rule of which
 * tensors HF quantizes. Reading them back is quant4.h's. */
#ifndef CT_QUANT4_WRITE_H
#define CT_QUANT4_WRITE_H

#include "json.h"
#include "model_config.h"
#include "quant4.h"

typedef struct quant4_write_opts {
    quant4_type type;
    size_t blocksize;      /* a power of two in 32..4096 (quant4_blocksize_valid) */
    bool double_quant;     /* absmax in 8 bits (bnb_4bit_use_double_quant) */
} quant4_write_opts;

/* NF4, blocksize 64, double quantization: QLoRA's recipe. */
quant4_write_opts quant4_write_defaults(void);

/* "nf4" / "fp4" <-> the type; false for any other name. */
bool quant4_type_from_name(const char *name, quant4_type *out);
const char *quant4_type_name(quant4_type t);

/* True for the tensors HF + bnb stores in 4 bits: every nn.Linear weight but
 * lm_head, i.e. attention, dense MLP, shared-expert (and its gate) and GDN
 * projections. Embeddings, norms, biases, convs, routers and routed experts
 * (fused 3-D parameters in transformers 5, not nn.Linear) stay bf16. */
bool quant4_should_quantize(const ct_tensor_spec *t);

/* The bytes quant4_write_add adds for a weight of numel elements, with a
 * fixed allowance for the JSON blob (deterministic, for planning shards). */
size_t quant4_write_bytes(size_t numel, const quant4_write_opts *o);

/* The key suffixes quant4_write_add adds after NAME, "" (NAME itself) first;
 * NULL-terminated. */
const char *const *quant4_write_suffixes(const quant4_write_opts *o);

/* Quantizes x[0..numel) (the weight's values, shape[0..ndim), already rounded
 * to bf16: the quant_state records dtype "bfloat16") and adds NAME, NAME.absmax,
 * NAME.quant_map, with double quant NAME.nested_absmax and NAME.nested_quant_map,
 * and NAME.quant_state.bitsandbytes__nf4 (or __fp4) to w. Large tensors are
 * quantized in parallel (OpenMP), with the same bytes as one pass. A
 * non-finite value is CT_ERR_INPUT naming NAME and the element. *bytes grows
 * by the bytes of the tensors added. */
int quant4_write_add(st_writer *w, const char *name, const float *x, int ndim, const int64_t *shape,
                     const quant4_write_opts *o, size_t *bytes, ct_error *err);

/* Writes the quantization_config object as transformers writes it for
 * BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type, bnb_4bit_use_
 * double_quant, bnb_4bit_compute_dtype=bfloat16): its keys sorted, one per
 * line, indented by indent + 2 spaces, the closing brace by indent. */
void quant4_write_config(json_writer *j, const quant4_write_opts *o, int indent);

/* CONFIG (a config.json's text) with "quantization_config" appended as its
 * last key, every other byte kept: a malloc'd text the caller frees, *out_len
 * its length. NULL with CT_ERR_INPUT (naming source) when the text is not a
 * JSON object or already has a quantization_config. */
/* The same with the quantization_config object given as text (QC, qc_len
 * bytes), for any format (mxfp4_write_config's). */
char *config_text_with_quantization(const char *config, size_t len, const char *source, const char *qc,
                                    size_t qc_len, size_t *out_len, ct_error *err);
char *quant4_config_text(const char *config, size_t len, const char *source, const quant4_write_opts *o,
                         size_t *out_len, ct_error *err);

#endif
