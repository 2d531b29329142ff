/* quant4_write.c — bitsandbytes 4-bit folders as HF writes them (contract:
 * quant4_write.h). What HF writes was read off folders that transformers 5.17
 * + bitsandbytes 0.50.2 save on the CPU (docs/quantization.md):
 *   - the quant_state blob is Python's json.dumps of bnb's dict: ", " and ": "
 *     separators, keys in bnb's order, nested_offset as Python's repr of the
 *     fp32 mean widened to double;
 *   - quant_map is get_4bit_type's table, whose FP4 code 8 is +0.0 (quant4.h's
 *     table says -0.0, as the kernels decode it);
 *   - config.json's quantization_config is BitsAndBytesConfig.to_dict with
 *     sorted keys, llm_int8_skip_modules null even though lm_head stays bf16. */
#include "quant4_write.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAR_CHUNK ((size_t)1 << 20)  /* elements per parallel piece: a multiple of every blocksize */
#define STATE_JSON_BYTES 256         /* allowance for the quant_state blob in quant4_write_bytes */

quant4_write_opts quant4_write_defaults(void)
{
    return (quant4_write_opts){.type = QUANT4_NF4, .blocksize = 64, .double_quant = true};
}

bool quant4_type_from_name(const char *name, quant4_type *out)
{
    if (!strcmp(name, "nf4")) *out = QUANT4_NF4;
    else if (!strcmp(name, "fp4")) *out = QUANT4_FP4;
    else return false;
    return true;
}

const char *quant4_type_name(quant4_type t) { return t == QUANT4_NF4 ? "nf4" : "fp4"; }

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

bool quant4_should_quantize(const ct_tensor_spec *t)
{
    /* Routers are custom modules in transformers 5 (a weight, no nn.Linear);
     * qwen3_next's shared_expert_gate is an nn.Linear and is quantized. */
    static const char *const routers[] = {".mlp.gate.weight", ".block_sparse_moe.gate.weight", ".mlp.router.weight"};
    if (t->kind != CT_TENSOR_LINEAR || t->expert || t->ndim != 2) return false;
    for (size_t i = 0; i < sizeof routers / sizeof routers[0]; i++)
        if (has_suffix(t->name, routers[i])) return false;
    return true;
}

size_t quant4_write_bytes(size_t numel, const quant4_write_opts *o)
{
    size_t nblocks = quant4_num_blocks(numel, o->blocksize);
    size_t bytes = quant4_packed_bytes(numel) + 16 * sizeof(float) + STATE_JSON_BYTES;
    if (o->double_quant)
        bytes += nblocks + ct_ceil_div(nblocks, QUANT4_NESTED_BLOCKSIZE) * sizeof(float) + 256 * sizeof(float);
    else
        bytes += nblocks * sizeof(float);
    return bytes;
}

/* Python's repr(float(v)): the shortest digits that read back as v, in fixed
 * notation for exponents -4..15 (at least one digit after the point), else
 * d.ddde-XX. */
static void py_float_repr(char *out, size_t cap, double v)
{
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    char digits[24];
    size_t nd = 0;
    const char *s = e;
    bool neg = *s == '-';
    if (neg) s++;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    digits[nd] = 0;
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    int exp = atoi(s + 1);
    json_writer j;
    json_writer_init(&j);
    json_write_raw(&j, neg ? "-" : "");
    if (exp < -4 || exp >= 16) {
        json_write_rawf(&j, "%c%s%se%c%02d", digits[0], nd > 1 ? "." : "", digits + 1, exp < 0 ? '-' : '+',
                        exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        json_write_raw(&j, "0.");
        for (int z = 0; z < -exp - 1; z++) json_write_raw(&j, "0");
        json_write_raw(&j, digits);
    } else if ((size_t)exp + 1 >= nd) {
        json_write_raw(&j, digits);
        for (size_t z = nd; z < (size_t)exp + 1; z++) json_write_raw(&j, "0");
        json_write_raw(&j, ".0");
    } else {
        json_write_rawf(&j, "%.*s.%s", exp + 1, digits, digits + exp + 1);
    }
    snprintf(out, cap, "%s", j.buf);
    json_writer_free(&j);
}

/* bnb's QuantState.as_dict(packed=True) blob, as json.dumps writes it. */
static void state_json(json_writer *j, const quant4_write_opts *o, int ndim, const int64_t *shape, float offset)
{
    json_write_rawf(j, "{\"quant_type\": \"%s\", \"blocksize\": %zu, \"dtype\": \"bfloat16\", \"shape\": [",
                    quant4_type_name(o->type), o->blocksize);
    for (int d = 0; d < ndim; d++) json_write_rawf(j, "%s%lld", d ? ", " : "", (long long)shape[d]);
    json_write_raw(j, "]");
    if (o->double_quant) {
        char num[40];
        py_float_repr(num, sizeof num, (double)offset);
        json_write_rawf(j, ", \"nested_blocksize\": %d, \"nested_dtype\": \"float32\", \"nested_offset\": %s",
                        QUANT4_NESTED_BLOCKSIZE, num);
    }
    json_write_raw(j, "}");
}

/* quant4_quantize over block-aligned pieces in parallel: blocks are
 * independent and only the last piece holds the short block and odd padding. */
static void quantize_parallel(uint8_t *packed, float *absmax, const float *x, size_t n, size_t blocksize,
                              quant4_type t)
{
    size_t pieces = ct_ceil_div(n, PAR_CHUNK);
    #pragma omp parallel for schedule(dynamic, 1)
    for (size_t p = 0; p < pieces; p++) {
        size_t lo = p * PAR_CHUNK, len = lo + PAR_CHUNK < n ? PAR_CHUNK : n - lo;
        quant4_quantize(packed + lo / 2, absmax + lo / blocksize, x + lo, len, blocksize, t, NULL);
    }
}

const char *const *quant4_write_suffixes(const quant4_write_opts *o)
{
    static const char *const nf4[] = {"", ".absmax", ".nested_absmax", ".nested_quant_map", ".quant_map",
                                      ".quant_state.bitsandbytes__nf4", NULL};
    static const char *const fp4[] = {"", ".absmax", ".nested_absmax", ".nested_quant_map", ".quant_map",
                                      ".quant_state.bitsandbytes__fp4", NULL};
    static const char *const nf4_plain[] = {"", ".absmax", ".quant_map", ".quant_state.bitsandbytes__nf4", NULL};
    static const char *const fp4_plain[] = {"", ".absmax", ".quant_map", ".quant_state.bitsandbytes__fp4", NULL};
    if (o->double_quant) return o->type == QUANT4_NF4 ? nf4 : fp4;
    return o->type == QUANT4_NF4 ? nf4_plain : fp4_plain;
}

int quant4_write_add(st_writer *w, const char *name, const float *x, int ndim, const int64_t *shape,
                     const quant4_write_opts *o, size_t *bytes, ct_error *err)
{
    CT_ASSERT(quant4_blocksize_valid(o->blocksize) && ndim >= 1 && ndim <= ST_MAX_DIMS,
              "quant4_write_add: %s: blocksize %zu or %d dims out of range", name, o->blocksize, ndim);
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
    size_t bad = n; /* the first non-finite element, found in parallel (70B values for a 70B folder) */
    #pragma omp parallel for schedule(static) reduction(min : bad)
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) && i < bad) bad = i;
    if (bad < n)
        return CT_FAIL_INPUT(err, "%s: element %zu is %g; only finite weights quantize", name, bad, (double)x[bad]);
    size_t nbytes = quant4_packed_bytes(n), nblocks = quant4_num_blocks(n, o->blocksize);
    uint8_t *packed = ct_malloc(nbytes);
    float *absmax = ct_malloc(nblocks * sizeof(float));
    quantize_parallel(packed, absmax, x, n, o->blocksize, o->type);

    char key[1024];
    int64_t s2[2] = {(int64_t)nbytes, 1}, s1[1];
    int rc = st_writer_add(w, name, CT_DTYPE_U8, 2, s2, packed, err);
    size_t total = nbytes + nblocks * (o->double_quant ? 1 : sizeof(float)) + 16 * sizeof(float);
    float offset = 0.0f;
    if (!rc && o->double_quant) {
        size_t nn = ct_ceil_div(nblocks, QUANT4_NESTED_BLOCKSIZE);
        uint8_t *q8 = ct_malloc(nblocks);
        float *nested = ct_malloc(nn * sizeof(float));
        quant4_double_quantize(q8, nested, &offset, absmax, nblocks);
        total += (nn + 256) * sizeof(float);
        snprintf(key, sizeof key, "%s.absmax", name);
        s1[0] = (int64_t)nblocks;
        rc = st_writer_add(w, key, CT_DTYPE_U8, 1, s1, q8, err);
        snprintf(key, sizeof key, "%s.nested_absmax", name);
        s1[0] = (int64_t)nn;
        if (!rc) rc = st_writer_add(w, key, CT_DTYPE_F32, 1, s1, nested, err);
        snprintf(key, sizeof key, "%s.nested_quant_map", name);
        s1[0] = 256;
        if (!rc) rc = st_writer_add(w, key, CT_DTYPE_F32, 1, s1, quant4_dynamic_map(), err);
        free(q8);
        free(nested);
    } else if (!rc) {
        snprintf(key, sizeof key, "%s.absmax", name);
        s1[0] = (int64_t)nblocks;
        rc = st_writer_add(w, key, CT_DTYPE_F32, 1, s1, absmax, err);
    }
    float map[16];
    memcpy(map, quant4_code(o->type), sizeof map);
    for (int i = 0; i < 16; i++)
        if (map[i] == 0.0f) map[i] = 0.0f;  /* +0.0, as get_4bit_type's table */
    snprintf(key, sizeof key, "%s.quant_map", name);
    s1[0] = 16;
    if (!rc) rc = st_writer_add(w, key, CT_DTYPE_F32, 1, s1, map, err);
    json_writer j;
    json_writer_init(&j);
    state_json(&j, o, ndim, shape, offset);
    snprintf(key, sizeof key, "%s.quant_state.bitsandbytes__%s", name, quant4_type_name(o->type));
    s1[0] = (int64_t)j.len;
    if (!rc) rc = st_writer_add(w, key, CT_DTYPE_U8, 1, s1, j.buf, err);
    if (!rc) *bytes += total + j.len;
    json_writer_free(&j);
    free(packed);
    free(absmax);
    return rc;
}

void quant4_write_config(json_writer *j, const quant4_write_opts *o, int indent)
{
    int in = indent + 2;
    json_write_raw(j, "{\n");
    json_write_rawf(j, "%*s\"_load_in_4bit\": true,\n", in, "");
    json_write_rawf(j, "%*s\"_load_in_8bit\": false,\n", in, "");
    json_write_rawf(j, "%*s\"bnb_4bit_compute_dtype\": \"bfloat16\",\n", in, "");
    json_write_rawf(j, "%*s\"bnb_4bit_quant_storage\": \"uint8\",\n", in, "");
    json_write_rawf(j, "%*s\"bnb_4bit_quant_type\": \"%s\",\n", in, "", quant4_type_name(o->type));
    json_write_rawf(j, "%*s\"bnb_4bit_use_double_quant\": %s,\n", in, "", o->double_quant ? "true" : "false");
    json_write_rawf(j, "%*s\"llm_int8_enable_fp32_cpu_offload\": false,\n", in, "");
    json_write_rawf(j, "%*s\"llm_int8_has_fp16_weight\": false,\n", in, "");
    json_write_rawf(j, "%*s\"llm_int8_skip_modules\": null,\n", in, "");
    json_write_rawf(j, "%*s\"llm_int8_threshold\": 6.0,\n", in, "");
    json_write_rawf(j, "%*s\"load_in_4bit\": true,\n", in, "");
    json_write_rawf(j, "%*s\"load_in_8bit\": false,\n", in, "");
    json_write_rawf(j, "%*s\"quant_method\": \"bitsandbytes\"\n", in, "");
    json_write_rawf(j, "%*s}", indent, "");
}

char *config_text_with_quantization(const char *config, size_t len, const char *source, const char *qc,
                                    size_t qc_len, size_t *out_len, ct_error *err)
{
    json_doc *doc = json_parse(config, len, source, err);
    if (!doc) return NULL;
    const json_value *root = json_root(doc);
    bool object = root->type == JSON_OBJECT, quantized = object && json_get(root, "quantization_config");
    bool empty = object && root->count == 0;
    json_free(doc);
    if (!object) {
        CT_FAIL_INPUT(err, "%s: expected a JSON object", source);
        return NULL;
    }
    if (quantized) {
        CT_FAIL_INPUT(err, "%s: the model is already quantized (it has a quantization_config)", source);
        return NULL;
    }
    /* The object's closing brace is the text's last one; the new key goes
     * after the last member, on its own line as HF indents. */
    size_t close = len;
    while (close > 0 && config[close - 1] != '}') close--;
    size_t end = close - 1;
    while (end > 0 && strchr(" \t\r\n", config[end - 1])) end--;
    json_writer j;
    json_writer_init(&j);
    json_write_rawf(&j, "%.*s%s\n  \"quantization_config\": %.*s", (int)end, config, empty ? "" : ",", (int)qc_len, qc);
    json_write_rawf(&j, "\n%.*s", (int)(len - (close - 1)), config + close - 1);
    *out_len = j.len;
    return j.buf;
}

char *quant4_config_text(const char *config, size_t len, const char *source, const quant4_write_opts *o,
                         size_t *out_len, ct_error *err)
{
    json_writer qc;
    json_writer_init(&qc);
    quant4_write_config(&qc, o, 2);
    char *text = config_text_with_quantization(config, len, source, qc.buf, qc.len, out_len, err);
    json_writer_free(&qc);
    return text;
}
