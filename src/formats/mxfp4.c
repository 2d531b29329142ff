/* mxfp4.c — MXFP4 expert weights: E2M1 codes with E8M0 block scales
 * (contract: mxfp4.h).
 *
 * Decoding is code * 2^(s-127), the power of two made by ldexpf once per
 * block (2^-127 is an fp32 subnormal, still exact): every product is exact in
 * fp32 and in bf16 (two significant bits, exponents from -128 to 127 for s <=
 * 252), so bf16 of it equals transformers' bf16 decode bit for bit, -0
 * included. Blocks are independent: one OpenMP loop over them (a gpt-oss-20b
 * checkpoint holds about 19e9 expert values).
 *
 * Encoding follows the reference's rule: the scale is fp32(max|x| / 6) rounded
 * up to a power of two by carrying into its exponent field (adding 0x7FFFFF to
 * the bits, then masking the exponent), whose field is the scale byte; a block
 * of zeros gets byte 0 and multiplier 0. The reference rounds the scaled value
 * by keeping one bit below E2M1's mantissa and adding half, i.e. to the nearest
 * code with ties away from zero, saturating at 6; comparing with the midpoints
 * of the code values does the same. */
#include "mxfp4.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const float code[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

/* Midpoints between consecutive magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6. */
static const float midpoint[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};

const float *mxfp4_code(void) { return code; }

void mxfp4_dequantize(float *y, const uint8_t *blocks, const uint8_t *scales, size_t rows, size_t K)
{
    CT_ASSERT(K % MXFP4_BLOCK == 0, "mxfp4_dequantize: K %zu is not a multiple of %d", K, MXFP4_BLOCK);
    size_t nb = rows * (K / MXFP4_BLOCK);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        float scale = ldexpf(1.0f, (int)scales[b] - 127);
        const uint8_t *q = blocks + b * MXFP4_BLOCK_BYTES;
        float *yb = y + b * MXFP4_BLOCK;
        for (int j = 0; j < MXFP4_BLOCK_BYTES; j++) {
            yb[2 * j] = code[q[j] & 0x0F] * scale;
            yb[2 * j + 1] = code[q[j] >> 4] * scale;
        }
    }
}

/* The code of v (already divided by the block's scale): nearest magnitude,
 * ties away from zero, at most 6; the sign bit kept, so -0.0 and small
 * negatives are code 8. */
static uint8_t encode(float v)
{
    float a = fabsf(v);
    uint8_t m = 0; /* how many midpoints a reaches: they ascend (no branches, so it vectorizes) */
    for (int k = 0; k < 7; k++) m += a >= midpoint[k];
    return (uint8_t)((signbit(v) ? 8 : 0) | m);
}

/* The scale byte of a block with max |x| amax: 2^ceil(log2(amax / 6)) as a biased
 * exponent (amax / 6 rounded up to a power of two). */
static uint32_t block_scale_byte(float amax)
{
    float d = amax / 6.0f;
    uint32_t bits;
    memcpy(&bits, &d, 4);
    return ((bits + 0x007FFFFFu) & 0x7F800000u) >> 23;
}

/* Block b of x into its scale byte and 16 code bytes; false if it cannot be
 * quantized (a non-finite value, or a scale past MXFP4_SCALE_MAX). */
static bool quantize_block(uint8_t *q, uint8_t *scale_byte, const float *xb)
{
    float amax = 0.0f;
    for (int i = 0; i < MXFP4_BLOCK; i++) {
        if (!isfinite(xb[i])) return false;
        if (fabsf(xb[i]) > amax) amax = fabsf(xb[i]);
    }
    uint32_t s = block_scale_byte(amax), bits = s << 23;
    if (s > MXFP4_SCALE_MAX) return false;
    float scale, inv;
    memcpy(&scale, &bits, 4);
    inv = scale == 0.0f ? 0.0f : 1.0f / scale;  /* a power of two: exact */
    *scale_byte = (uint8_t)s;
    for (int j = 0; j < MXFP4_BLOCK_BYTES; j++)
        q[j] = (uint8_t)(encode(xb[2 * j] * inv) | (encode(xb[2 * j + 1] * inv) << 4));
    return true;
}

/* Why block b (starting at xb) failed quantize_block. */
static int block_error(const float *xb, size_t b, ct_error *err)
{
    float amax = 0.0f;
    for (int i = 0; i < MXFP4_BLOCK; i++) {
        if (!isfinite(xb[i]))
            return CT_FAIL_INPUT(err, "mxfp4: element %zu is %g (expected a finite value)", b * MXFP4_BLOCK + i,
                                 xb[i]);
        if (fabsf(xb[i]) > amax) amax = fabsf(xb[i]);
    }
    return CT_FAIL_INPUT(err, "mxfp4: element %zu: a block with max |x| %g needs scale byte %u, above %d "
                         "(its values would overflow bf16)", b * MXFP4_BLOCK, amax, block_scale_byte(amax),
                         MXFP4_SCALE_MAX);
}

/* Blocks in parallel (a gpt-oss-20b folder holds 19B expert values); an input
 * error names the first failing block, as a serial pass would. */
int mxfp4_quantize(uint8_t *blocks, uint8_t *scales, const float *x, size_t rows, size_t K, ct_error *err)
{
    CT_ASSERT(K % MXFP4_BLOCK == 0, "mxfp4_quantize: K %zu is not a multiple of %d", K, MXFP4_BLOCK);
    size_t nb = rows * (K / MXFP4_BLOCK), bad = nb;
#pragma omp parallel for schedule(static) reduction(min : bad)
    for (size_t b = 0; b < nb; b++)
        if (!quantize_block(blocks + b * MXFP4_BLOCK_BYTES, &scales[b], x + b * MXFP4_BLOCK) && b < bad) bad = b;
    return bad < nb ? block_error(x + bad * MXFP4_BLOCK, bad, err) : CT_OK;
}

bool mxfp4_is_quantized(const st_reader *r, const char *base)
{
    char key[1024];
    snprintf(key, sizeof key, "%s_blocks", base);
    return st_find(r, key) != NULL;
}

int mxfp4_read_experts(const st_reader *r, const char *base, int64_t E, int64_t rows, int64_t K,
                       const uint8_t **blocks, const uint8_t **scales, ct_error *err)
{
    char bkey[1024], skey[1024];
    snprintf(bkey, sizeof bkey, "%s_blocks", base);
    snprintf(skey, sizeof skey, "%s_scales", base);
    const st_tensor *bt = st_find(r, bkey), *sc = st_find(r, skey);
    const char *file = bt ? bt->file : sc ? sc->file : "checkpoint";
    if (K <= 0 || K % MXFP4_BLOCK != 0)
        return CT_FAIL_INPUT(err, "%s: tensor %s: the config's %lld input features are not a multiple of %d, as "
                             "MXFP4 needs", file, bkey, (long long)K, MXFP4_BLOCK);
    if (!bt) return CT_FAIL_INPUT(err, "%s: tensor %s is missing (an MXFP4 expert weight needs it)", file, bkey);
    if (!sc) return CT_FAIL_INPUT(err, "%s: tensor %s is missing (an MXFP4 expert weight needs it)", file, skey);
    int64_t bshape[4] = {E, rows, K / MXFP4_BLOCK, MXFP4_BLOCK_BYTES};
    int rc = st_expect(r, bkey, CT_DTYPE_U8, 4, bshape, &bt, err);
    if (!rc) rc = st_expect(r, skey, CT_DTYPE_U8, 3, bshape, &sc, err);
    if (rc) return rc;
    const uint8_t *s = sc->data;
    for (size_t i = 0; i < sc->numel; i++)
        if (s[i] > MXFP4_SCALE_MAX)
            return CT_FAIL_INPUT(err, "%s: tensor %s: element %zu is %d, above %d (its values 2^%d * 6 would "
                                 "overflow bf16)", sc->file, skey, i, s[i], MXFP4_SCALE_MAX, s[i] - 127);
    *blocks = bt->data;
    *scales = s;
    return CT_OK;
}

int mxfp4_write_experts(st_writer *w, const char *base, const float *x, int64_t E, int64_t rows, int64_t K,
                        ct_error *err)
{
    if (E <= 0 || rows <= 0 || K <= 0 || K % MXFP4_BLOCK != 0)
        return CT_FAIL_INPUT(err, "%s: shape [%lld, %lld, %lld]: MXFP4 needs positive sizes and input features "
                             "that are a multiple of %d", base, (long long)E, (long long)rows, (long long)K,
                             MXFP4_BLOCK);
    size_t n = (size_t)E * (size_t)rows, nb = n * ((size_t)K / MXFP4_BLOCK);
    uint8_t *blocks = ct_malloc(nb * MXFP4_BLOCK_BYTES), *scales = ct_malloc(nb);
    char key[1024];
    int64_t shape[4] = {E, rows, K / MXFP4_BLOCK, MXFP4_BLOCK_BYTES};
    int rc = mxfp4_quantize(blocks, scales, x, n, (size_t)K, err);
    snprintf(key, sizeof key, "%s_blocks", base);
    if (!rc) rc = st_writer_add(w, key, CT_DTYPE_U8, 4, shape, blocks, err);
    snprintf(key, sizeof key, "%s_scales", base);
    if (!rc) rc = st_writer_add(w, key, CT_DTYPE_U8, 3, shape, scales, err);
    free(blocks);
    free(scales);
    return rc;
}

/* ---- quantization_config ---- */

static const char *const official_skip[] = {
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head",
};

/* A pattern HF's re.match reads the way match_prefix does: word characters,
 * '.' (any character) and '*' after an atom. */
static bool pattern_valid(const char *p)
{
    for (size_t i = 0; p[i]; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '*') {
            if (i == 0 || p[i - 1] == '*') return false;
        } else if (!isalnum(c) && c != '_' && c != '-' && c != '.') {
            return false;
        }
    }
    return true;
}

/* Marks, after each position j of re marked in on, j + 2 when re[j] is a
 * starred atom (it may match nothing). Ascending, so chains of stars close. */
static void skip_stars(bool *on, const char *re, size_t n)
{
    for (size_t j = 0; j + 1 < n; j++)
        if (on[j] && re[j + 1] == '*') on[j + 2] = true;
}

/* re (a valid pattern, < 128 bytes) matches a prefix of text (re.match:
 * anchored at the start only). The set of pattern positions reachable after
 * each character of text: len(re) x len(text) steps, where backtracking takes
 * exponential time on starred atoms that fail (".*.*.*...z"). */
static bool match_prefix(const char *re, const char *text)
{
    size_t n = strlen(re);
    bool on[sizeof ((mxfp4_config *)0)->skip[0] + 1] = {true}, next[sizeof on];
    CT_ASSERT(n < sizeof on, "pattern of %zu bytes", n);
    skip_stars(on, re, n);
    for (;; text++) {
        if (on[n]) return true;
        if (!*text) return false;
        bool any = false;
        memset(next, 0, sizeof next);
        for (size_t j = 0; j < n; j++)
            if (on[j] && (re[j] == '.' || re[j] == *text))
                next[re[j + 1] == '*' ? j : j + 1] = any = true;   /* a starred atom stays to match again */
        if (!any) return false;
        skip_stars(next, re, n);
        memcpy(on, next, sizeof on);
    }
}

int mxfp4_read_config(const json_value *qc, const char *source, mxfp4_config *out, ct_error *err)
{
    memset(out, 0, sizeof *out);
    if (!qc || qc->type != JSON_OBJECT)
        return CT_FAIL_INPUT(err, "%s: quantization_config: expected an object", source);
    const json_value *m = json_get_type(qc, "quant_method", JSON_STRING);
    char text[128];
    if (!m || strcmp(m->string, "mxfp4") != 0)
        return CT_FAIL_INPUT(err, "%s: quantization_config: quant_method is %s%s%s, expected \"mxfp4\"", source,
                             m ? "\"" : "", m ? st_printable(text, sizeof text, m->string) : "missing", m ? "\"" : "");
    const json_value *skip = json_get(qc, "modules_to_not_convert");
    if (!skip || skip->type == JSON_NULL) return CT_OK;
    if (skip->type != JSON_ARRAY)
        return CT_FAIL_INPUT(err, "%s: quantization_config: modules_to_not_convert must be a list of strings", source);
    if (skip->count > MXFP4_MAX_SKIP)
        return CT_FAIL_INPUT(err, "%s: quantization_config: modules_to_not_convert has %zu entries (at most %d)",
                             source, skip->count, MXFP4_MAX_SKIP);
    for (size_t i = 0; i < skip->count; i++) {
        const json_value *v = skip->items[i];
        if (v->type != JSON_STRING || v->string_len == 0 || v->string_len >= sizeof out->skip[0] ||
            strlen(v->string) != v->string_len || !pattern_valid(v->string))
            return CT_FAIL_INPUT(err, "%s: quantization_config: modules_to_not_convert[%zu] is not a module name "
                                 "or pattern of letters, digits, '_', '.' and '*' (under 128 bytes)", source, i);
        strcpy(out->skip[out->n_skip++], v->string);
    }
    return CT_OK;
}

bool mxfp4_converts(const mxfp4_config *c, const char *module)
{
    size_t n = strlen(module);
    for (int i = 0; i < c->n_skip; i++) {
        const char *p = c->skip[i];
        size_t k = strlen(p);
        if (match_prefix(p, module) || (k <= n && strcmp(module + n - k, p) == 0)) return false;
    }
    return true;
}

void mxfp4_write_config(json_writer *w)
{
    json_write_raw(w, "{\"modules_to_not_convert\": [");
    for (size_t i = 0; i < sizeof official_skip / sizeof official_skip[0]; i++) {
        if (i) json_write_raw(w, ", ");
        json_write_string(w, official_skip[i]);
    }
    json_write_raw(w, "], \"quant_method\": \"mxfp4\"}");
}
