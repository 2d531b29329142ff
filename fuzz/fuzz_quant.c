/* fuzz_quant.c — the readers of quantized base weights on an arbitrary
 * .safetensors file (via an in-memory file): bitsandbytes 4-bit
 * (quant4_read_info, quant4_load_blocks, quant4_load_f32), FP8
 * (fp8_read_weight) and MXFP4 experts (mxfp4_read_experts). Each runs on every
 * tensor name of the file and on the name each known suffix leaves
 * ("W.absmax" -> "W") when no tensor has that name, with the shape the file
 * itself gives, as `ctune merge` calls them (the loader passes the config's
 * shape: a wrong one is tried too). A quantization_config string in the
 * file's metadata goes to mxfp4_read_config and mxfp4_converts, a config
 * string to the config.json rewriters (fp8_config_text, quant4_config_text).
 * Sizes are capped here before a reader allocates: execs stay fast, and the
 * readers' own checks against the file are what is under test.
 * Invariants: no crash, leak or UB; every failure is a one-line CT_ERR_INPUT;
 * a 4-bit weight that reads has numel = the product of its shape; one that
 * loads decodes to finite values, each code[q] * absmax[block] exactly (so
 * |value| <= max|code| * max|absmax|), its codes the weight's own bytes;
 * an FP8 weight that reads has its codes in the tensor's bytes, no NaN code,
 * every scale finite and > 0 (an F32 scale tensor copied bit for bit), and a
 * shape other than the file's is refused; MXFP4 experts that read have every
 * scale byte <= MXFP4_SCALE_MAX and decode to finite values, each
 * code[q] * 2^(s-127) exactly; a modules_to_not_convert pattern never
 * converts its own name; a rewritten config.json parses with one member more,
 * the quantization_config last. */
#include <math.h>
#include <string.h>

#include "fp8.h"
#include "fuzz.h"
#include "mxfp4.h"
#include "quant4.h"
#include "quant4_write.h"

#define QUANT_FUZZ_MAX_NUMEL ((size_t)1 << 22)   /* elements decoded per weight */

static volatile unsigned quant_fuzz_sink; /* keeps the reads of weight bytes from being optimized away */

/* The tensors a quantized weight NAME brings beside it, as NAME + suffix. */
static const char *const quant_fuzz_suffixes[] = {
    "_blocks", "_scales", "_scale_inv", ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
    ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4",
};

static unsigned quant_fuzz_read(const uint8_t *p, size_t n)
{
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++) sum += p[i];
    return sum;
}

static void quant_fuzz_bnb4(const st_reader *r, const char *name)
{
    if (!quant4_is_quantized(r, name)) return;
    ct_error err;
    quant4_info info, again;
    int rc = quant4_read_info(r, name, &info, &err);
    if (rc) { fuzz_input_error(rc, &err); return; }
    size_t numel = 1;
    FUZZ_ASSERT(info.ndim >= 1 && info.ndim <= ST_MAX_DIMS, "%s: %d dims", name, info.ndim);
    for (int d = 0; d < info.ndim; d++) {
        FUZZ_ASSERT(info.shape[d] > 0, "%s: shape[%d] is %lld", name, d, (long long)info.shape[d]);
        numel *= (size_t)info.shape[d];
    }
    FUZZ_ASSERT(numel == info.numel && quant4_blocksize_valid(info.blocksize), "%s: numel %zu, shape gives %zu",
                name, info.numel, numel);
    if (numel > QUANT_FUZZ_MAX_NUMEL) return;
    const uint8_t *codes = NULL;
    float *absmax = NULL, *y = NULL;
    rc = quant4_load_blocks(r, name, &again, &codes, &absmax, &err);
    ct_error err2;
    int rc2 = quant4_load_f32(r, name, &again, &y, &err2);
    FUZZ_ASSERT(!rc == !rc2, "%s: quant4_load_blocks gives %d, quant4_load_f32 %d", name, rc, rc2);
    if (rc) {
        fuzz_input_error(rc, &err);
        fuzz_input_error(rc2, &err2);
        FUZZ_ASSERT(!absmax && !y, "%s: a failed load returned buffers", name);
        return;
    }
    FUZZ_ASSERT(codes == st_find(r, name)->data, "%s: the codes are not the weight's bytes", name);
    const float *code = quant4_code(info.type);
    float max_code = 0, max_absmax = 0;
    for (int q = 0; q < 16; q++) max_code = fmaxf(max_code, fabsf(code[q]));
    size_t nblocks = quant4_num_blocks(numel, info.blocksize);
    for (size_t b = 0; b < nblocks; b++) max_absmax = fmaxf(max_absmax, fabsf(absmax[b]));
    for (size_t i = 0; i < numel; i++) {
        int q = (codes[i / 2] >> (i % 2 ? 0 : 4)) & 15;   /* the even element in the high nibble */
        float want = code[q] * absmax[i / info.blocksize];
        FUZZ_ASSERT(isfinite(y[i]), "%s: element %zu decodes to %g (absmax %g)", name, i, y[i],
                    absmax[i / info.blocksize]);
        FUZZ_ASSERT(y[i] == want && fabsf(y[i]) <= max_code * max_absmax, "%s: element %zu is %g, code %d gives %g",
                    name, i, y[i], q, want);
    }
    free(absmax);
    free(y);
}

/* fp8_read_weight of NAME as (rows, cols); *scale_inv gets a malloc'd grid. */
static int quant_fuzz_fp8_read(const st_reader *r, const char *name, int64_t rows, int64_t cols, const uint8_t **q,
                               float **scale_inv, ct_error *err)
{
    size_t ns = fp8_blocks((size_t)rows) * fp8_blocks((size_t)cols);
    *scale_inv = malloc((ns ? ns : 1) * sizeof(float));
    int rc = fp8_read_weight(r, name, rows, cols, q, *scale_inv, err);
    if (rc) fuzz_input_error(rc, err);
    return rc;
}

static void quant_fuzz_fp8(const st_reader *r, const char *name)
{
    const st_tensor *t = st_find(r, name);
    /* a 0 in the shape leaves the other dimension unbounded: it must still fail */
    if (!t || t->ndim != 2 || !fp8_is_quantized(r, name) || t->numel > QUANT_FUZZ_MAX_NUMEL) return;
    int64_t rows = t->shape[0], cols = t->shape[1];
    ct_error err;
    const uint8_t *q = NULL;
    float *s = NULL;
    if (t->numel) {
        FUZZ_ASSERT(quant_fuzz_fp8_read(r, name, rows, cols + 1, &q, &s, &err) != CT_OK,
                    "%s: read as [%lld, %lld], one column more than the file's", name, (long long)rows,
                    (long long)cols + 1);
        free(s);
    }
    int rc = quant_fuzz_fp8_read(r, name, rows, cols, &q, &s, &err);
    if (!rc) {
        FUZZ_ASSERT(t->dtype == CT_DTYPE_F8_E4M3 && q == t->data, "%s: the codes are not the weight's bytes", name);
        for (size_t i = 0; i < t->numel; i++)
            FUZZ_ASSERT((q[i] & 0x7f) != 0x7f, "%s: element %zu is the NaN code 0x%02x", name, i, q[i]);
        quant_fuzz_sink += quant_fuzz_read(q, t->numel);
        char key[1024];
        snprintf(key, sizeof key, "%s_scale_inv", name);
        const st_tensor *st = st_find(r, key);
        size_t ns = fp8_blocks((size_t)rows) * fp8_blocks((size_t)cols);
        FUZZ_ASSERT(st && st->numel == ns, "%s: %zu scales read for a grid of %zu", name, st ? st->numel : 0, ns);
        for (size_t i = 0; i < ns; i++)
            FUZZ_ASSERT(isfinite(s[i]) && s[i] > 0, "%s: scale %zu is %g", name, i, s[i]);
        FUZZ_ASSERT(st->dtype != CT_DTYPE_F32 || !memcmp(s, st->data, ns * sizeof(float)),
                    "%s: the F32 scales are not the file's bits", name);
    }
    free(s);
}

static void quant_fuzz_mxfp4(const st_reader *r, const char *base)
{
    char key[1024];
    if (!mxfp4_is_quantized(r, base) || (size_t)snprintf(key, sizeof key, "%s_blocks", base) >= sizeof key) return;
    const st_tensor *bt = st_find(r, key);
    if (bt->ndim != 4 || bt->shape[3] != MXFP4_BLOCK_BYTES || bt->numel > QUANT_FUZZ_MAX_NUMEL) return;
    for (int d = 0; d < 3; d++)
        if (bt->shape[d] > (int64_t)QUANT_FUZZ_MAX_NUMEL) return; /* beside a 0: the sizes below must not overflow */
    int64_t E = bt->shape[0], rows = bt->shape[1], K = bt->shape[2] * MXFP4_BLOCK;
    const uint8_t *blocks = NULL, *scales = NULL;
    ct_error err;
    int rc = mxfp4_read_experts(r, base, E, rows, K + MXFP4_BLOCK, &blocks, &scales, &err);
    FUZZ_ASSERT(rc != CT_OK, "%s: read with K %lld, the file's %lld", base, (long long)K + MXFP4_BLOCK, (long long)K);
    fuzz_input_error(rc, &err);
    if ((rc = mxfp4_read_experts(r, base, E, rows, K, &blocks, &scales, &err))) {
        fuzz_input_error(rc, &err);
        return;
    }
    snprintf(key, sizeof key, "%s_scales", base);
    const st_tensor *sc = st_find(r, key);
    size_t n = (size_t)E * (size_t)rows, nb = n * (size_t)bt->shape[2];
    FUZZ_ASSERT(bt->dtype == CT_DTYPE_U8 && blocks == bt->data && sc && sc->dtype == CT_DTYPE_U8 &&
                scales == sc->data && sc->numel == nb, "%s: blocks or scales are not the file's tensors", base);
    int smax = 0;
    for (size_t b = 0; b < nb; b++) {
        FUZZ_ASSERT(scales[b] <= MXFP4_SCALE_MAX, "%s: scale %zu is %d", base, b, scales[b]);
        if (scales[b] > smax) smax = scales[b];
    }
    quant_fuzz_sink += quant_fuzz_read(blocks, nb * MXFP4_BLOCK_BYTES);
    float *y = malloc((nb ? nb : 1) * MXFP4_BLOCK * sizeof(float));
    mxfp4_dequantize(y, blocks, scales, n, (size_t)K);
    const float *code = mxfp4_code();
    for (size_t i = 0; i < nb * MXFP4_BLOCK; i++) {
        int q = (blocks[i / 2] >> (i % 2 ? 4 : 0)) & 15;   /* the even element in the low nibble */
        float want = ldexpf(code[q], scales[i / MXFP4_BLOCK] - 127);
        FUZZ_ASSERT(isfinite(y[i]) && y[i] == want && fabsf(y[i]) <= ldexpf(6.0f, smax - 127),
                    "%s: element %zu is %g, code %d gives %g", base, i, y[i], q, want);
    }
    free(y);
}

/* A quantization_config in the file's metadata, read as mxfp4 and matched
 * against the module of every tensor. */
static void quant_fuzz_mxfp4_config(const st_reader *r)
{
    const char *text = st_metadata(r, "quantization_config");
    if (!text) return;
    ct_error err;
    json_doc *doc = json_parse(text, strlen(text), "quantization_config", &err);
    if (!doc) { fuzz_input_error(err.code, &err); return; }
    mxfp4_config c;
    int rc = mxfp4_read_config(json_root(doc), "config.json", &c, &err);
    json_free(doc);
    if (rc) { fuzz_input_error(rc, &err); return; }
    FUZZ_ASSERT(c.n_skip >= 0 && c.n_skip <= MXFP4_MAX_SKIP, "%d patterns", c.n_skip);
    for (int i = 0; i < c.n_skip; i++)
        FUZZ_ASSERT(!mxfp4_converts(&c, c.skip[i]), "pattern '%s' converts its own name", c.skip[i]);
    for (size_t i = 0; i < st_count(r); i++) {
        char module[1024];
        snprintf(module, sizeof module, "%s", st_at(r, i)->name);
        char *dot = strrchr(module, '.');
        if (dot) *dot = '\0';
        mxfp4_converts(&c, module);
    }
}

/* TEXT rewritten with a quantization_config: one JSON member more, that one
 * last, or an input error. */
static void quant_fuzz_config_text(const char *text, bool fp8)
{
    ct_error err;
    size_t in_len = strlen(text), out_len = 0;
    quant4_write_opts o = quant4_write_defaults();
    char *out = fp8 ? fp8_config_text(text, in_len, "config.json", &out_len, &err)
                    : quant4_config_text(text, in_len, "config.json", &o, &out_len, &err);
    if (!out) { fuzz_input_error(err.code, &err); return; }
    json_doc *in = json_parse(text, in_len, "config.json", &err), *doc = json_parse(out, out_len, "out", &err);
    FUZZ_ASSERT(in && doc, "the rewritten config.json does not parse: %s", err.msg);
    const json_value *a = json_root(in), *b = json_root(doc);
    FUZZ_ASSERT(b->type == JSON_OBJECT && b->count == a->count + 1 &&
                !strcmp(b->keys[b->count - 1], "quantization_config") && b->items[b->count - 1]->type == JSON_OBJECT,
                "the rewritten config.json has %zu members for %zu, the last not a quantization_config", b->count,
                a->count);
    json_free(in);
    json_free(doc);
    free(out);
}

static void quant_fuzz_name(const st_reader *r, const char *name)
{
    quant_fuzz_bnb4(r, name);
    quant_fuzz_fp8(r, name);
    quant_fuzz_mxfp4(r, name);
}

int fuzz_quant(const uint8_t *data, size_t size)
{
    ct_error err;
    st_reader *r = st_open(fuzz_memfile(data, size), &err);
    if (!r) return 0;
    for (size_t i = 0; i < st_count(r); i++) {
        const char *name = st_at(r, i)->name;
        size_t len = strlen(name);
        quant_fuzz_name(r, name);
        for (size_t k = 0; k < sizeof quant_fuzz_suffixes / sizeof quant_fuzz_suffixes[0]; k++) {
            size_t sl = strlen(quant_fuzz_suffixes[k]);
            if (len <= sl || len - sl >= 1024 || strcmp(name + len - sl, quant_fuzz_suffixes[k]) != 0) continue;
            char base[1024];
            memcpy(base, name, len - sl);
            base[len - sl] = '\0';
            if (!st_find(r, base)) quant_fuzz_name(r, base);
        }
    }
    quant_fuzz_mxfp4_config(r);
    const char *config = st_metadata(r, "config");
    if (config) {
        quant_fuzz_config_text(config, true);
        quant_fuzz_config_text(config, false);
    }
    st_close(r);
    return 0;
}

CT_FUZZ_MAIN(fuzz_quant)
