/* fp8.c — FP8 E4M3 weights with 128x128 block scales and the per-128-column
 * activation scales (contract: fp8.h).
 *
 * The encoder works on the bits. A normal E4M3 value keeps fp32's top three
 * mantissa bits: adding 0x7ffff plus the lowest kept bit rounds at bit 20 to
 * nearest even (a carry moves into the exponent, as it should), and the kept
 * bits minus the exponent bias difference (120 << 3) are the code. Below 2^-6
 * the codes are the subnormals m * 2^-9, m = rint(|x| * 512) (exact scaling;
 * rint rounds ties to even), and m = 8 is the smallest normal, code 0x08: the
 * codes run on without a seam. Saturating first keeps 448..464, which would
 * round to 448 anyway, and everything above off the NaN code.
 *
 * Weight quantization is three passes over the weight, each parallel (OpenMP
 * over rows or block rows): find the first non-finite element, the block
 * maxima, then the codes. Activation quantization is per row, a group at a
 * time. */
#include "fp8.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "quant4_write.h"

#define F32_BITS_448 0x43e00000u    /* 448.0f */
#define F32_BITS_MIN_NORMAL 0x3c800000u   /* 2^-6, E4M3's smallest normal */

static float table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
    for (int b = 0; b < 256; b++) {
        int e = (b >> 3) & 15, m = b & 7;
        float v = e == 15 && m == 7 ? NAN : e == 0 ? ldexpf((float)m, -9) : ldexpf(8.0f + (float)m, e - 10);
        table[b] = b & 0x80 ? -v : v;
    }
}

const float *fp8_e4m3_table(void)
{
    pthread_once(&table_once, table_init);
    return table;
}

float fp8_e4m3_decode(uint8_t b) { return fp8_e4m3_table()[b]; }

uint8_t fp8_e4m3_encode(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7f;
    if (a >= F32_BITS_448) return sign | 0x7e;
    if (a < F32_BITS_MIN_NORMAL) return sign | (uint8_t)rintf(fabsf(x) * 512.0f);
    a += 0x7ffffu + ((a >> 20) & 1u);
    return sign | (uint8_t)((a >> 20) - (120u << 3));
}

void fp8_dequantize_blocks(float *y, const uint8_t *q, const float *scale_inv, size_t rows, size_t cols)
{
    const float *v = fp8_e4m3_table();
    size_t gc = fp8_blocks(cols);
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        const float *s = scale_inv + (r / FP8_BLOCK) * gc;
        for (size_t c = 0; c < cols; c++) y[r * cols + c] = v[q[r * cols + c]] * s[c / FP8_BLOCK];
    }
}

int fp8_quantize_blocks(uint8_t *q, float *scale_inv, const float *x, size_t rows, size_t cols, ct_error *err)
{
    size_t n = rows * cols, bad = n;
#pragma omp parallel for reduction(min : bad) schedule(static)
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) && i < bad) bad = i;
    if (bad < n)
        return CT_FAIL_INPUT(err, "fp8: element [%zu, %zu] is %g (expected a finite value)", bad / cols, bad % cols,
                             x[bad]);
    size_t gr = fp8_blocks(rows), gc = fp8_blocks(cols);
    float *amax = ct_calloc(gr * gc, sizeof(float)), *scale = ct_malloc(gr * gc * sizeof(float));
#pragma omp parallel for schedule(static)
    for (size_t br = 0; br < gr; br++)
        for (size_t r = br * FP8_BLOCK; r < rows && r < (br + 1) * FP8_BLOCK; r++)
            for (size_t c = 0; c < cols; c++) {
                float *m = amax + br * gc + c / FP8_BLOCK;
                *m = fmaxf(*m, fabsf(x[r * cols + c]));
            }
    for (size_t b = 0; b < gr * gc; b++) {
        scale[b] = amax[b] > 0 ? (1.0f / amax[b]) * FP8_E4M3_MAX : 1.0f;   /* torch's 448 / t: t.reciprocal() * 448 */
        if (isinf(scale[b])) {
            int rc = CT_FAIL_INPUT(err, "fp8: block [%zu, %zu] has max |x| %g: its scale 448 / max overflows "
                                   "fp32 (its scale_inv would be 0)", b / gc, b % gc, amax[b]);
            free(amax);
            free(scale);
            return rc;
        }
        scale_inv[b] = 1.0f / scale[b];
    }
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        const float *s = scale + (r / FP8_BLOCK) * gc;
        for (size_t c = 0; c < cols; c++) q[r * cols + c] = fp8_e4m3_encode(x[r * cols + c] * s[c / FP8_BLOCK]);
    }
    free(amax);
    free(scale);
    return CT_OK;
}

void fp8_quantize_rows(uint8_t *q, float *scale, const float *x, size_t T, size_t K, size_t ld_scale)
{
    CT_ASSERT(ld_scale >= T, "fp8_quantize_rows: ld_scale %zu < T %zu", ld_scale, T);
    size_t G = fp8_blocks(K);
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < T; t++)
        for (size_t g = 0; g < G; g++) {
            size_t c0 = g * FP8_BLOCK, c1 = c0 + FP8_BLOCK < K ? c0 + FP8_BLOCK : K;
            const float *xr = x + t * K;
            float amax = 0.0f;
            for (size_t c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(xr[c]));
            float d = amax / FP8_E4M3_MAX, s = 1.0f;
            if (amax > 0) {
                uint32_t bits;
                memcpy(&bits, &d, 4);
                bits = (bits + 0x007fffffu) & 0x7f800000u;
                if (bits == 0) bits = 0x00800000u;
                memcpy(&s, &bits, 4);
            }
            scale[fp8_row_scale_index(g, t, ld_scale)] = s;
            for (size_t c = c0; c < c1; c++) {
                uint8_t b = fp8_e4m3_encode(xr[c] / s);
                q[t * K + c] = (b & 0x7f) == 0x7f ? 0x7f : b;
            }
        }
}

void fp8_transpose_scales(float *st, const float *s, size_t rows, size_t cols)
{
    size_t gr = fp8_blocks(rows), gc = fp8_blocks(cols);
    for (size_t i = 0; i < gr; i++)
        for (size_t j = 0; j < gc; j++) st[j * gr + i] = s[i * gc + j];
}

/* ---- checkpoint tensors ---- */

bool fp8_is_quantized(const st_reader *r, const char *name)
{
    char key[1024];
    snprintf(key, sizeof key, "%s_scale_inv", name);
    const st_tensor *t = st_find(r, name);
    return (t && t->dtype == CT_DTYPE_F8_E4M3) || st_find(r, key) != NULL;
}

int fp8_read_weight(const st_reader *r, const char *name, int64_t rows, int64_t cols, const uint8_t **q,
                    float *scale_inv, ct_error *err)
{
    char skey[1024];
    snprintf(skey, sizeof skey, "%s_scale_inv", name);
    const st_tensor *wt = st_find(r, name), *st = st_find(r, skey);
    const char *file = wt ? wt->file : st ? st->file : "checkpoint";
    if (rows <= 0 || cols <= 0)
        return CT_FAIL_INPUT(err, "%s: tensor %s: the config's shape [%lld, %lld] is not positive", file, name,
                             (long long)rows, (long long)cols);
    if (!wt) return CT_FAIL_INPUT(err, "%s: tensor %s is missing (an FP8 weight needs it)", file, name);
    if (!st)
        return CT_FAIL_INPUT(err, "%s: tensor %s is missing (the FP8 weight %s needs its block scales)", file, skey,
                             name);
    int64_t wshape[2] = {rows, cols};
    int64_t sshape[2] = {(int64_t)fp8_blocks((size_t)rows), (int64_t)fp8_blocks((size_t)cols)};
    int rc = st_expect(r, name, CT_DTYPE_F8_E4M3, 2, wshape, &wt, err);
    if (rc) return rc;
    if (st->dtype != CT_DTYPE_F32 && st->dtype != CT_DTYPE_BF16 && st->dtype != CT_DTYPE_F16)
        return CT_FAIL_INPUT(err, "%s: tensor '%s': dtype %s, expected F32 (or BF16, F16)", st->file, skey,
                             ct_dtype_name(st->dtype));
    if ((rc = st_expect(r, skey, st->dtype, 2, sshape, &st, err))) return rc;
    const uint8_t *b = wt->data;
    for (size_t i = 0; i < wt->numel; i++)
        if ((b[i] & 0x7f) == 0x7f)
            return CT_FAIL_INPUT(err, "%s: tensor %s: element [%zu, %zu] is the NaN code 0x%02x", wt->file, name,
                                 i / (size_t)cols, i % (size_t)cols, b[i]);
    const uint8_t *s = st->data;
    for (size_t i = 0; i < st->numel; i++) {
        uint16_t h;
        float v;
        if (st->dtype == CT_DTYPE_F32) {
            memcpy(&v, s + 4 * i, 4);
        } else {
            memcpy(&h, s + 2 * i, 2);
            v = st->dtype == CT_DTYPE_BF16 ? ct_bf16_to_f32(h) : ct_f16_to_f32(h);
        }
        if (!(isfinite(v) && v > 0))
            return CT_FAIL_INPUT(err, "%s: tensor %s: element [%zu, %zu] is %g (expected a finite scale > 0)",
                                 st->file, skey, i / (size_t)sshape[1], i % (size_t)sshape[1], v);
        scale_inv[i] = v;
    }
    *q = b;
    return CT_OK;
}

int fp8_write_weight(st_writer *w, const char *name, const float *x, int64_t rows, int64_t cols, ct_error *err)
{
    if (rows <= 0 || cols <= 0)
        return CT_FAIL_INPUT(err, "%s: shape [%lld, %lld]: an FP8 weight needs positive sizes", name,
                             (long long)rows, (long long)cols);
    size_t gr = fp8_blocks((size_t)rows), gc = fp8_blocks((size_t)cols);
    uint8_t *q = ct_malloc((size_t)rows * (size_t)cols);
    float *s = ct_malloc(gr * gc * sizeof(float));
    int64_t wshape[2] = {rows, cols}, sshape[2] = {(int64_t)gr, (int64_t)gc};
    char key[1024];
    int rc = fp8_quantize_blocks(q, s, x, (size_t)rows, (size_t)cols, err);
    if (rc) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        rc = CT_FAIL_INPUT(err, "%s: %s", name, msg);
    }
    if (!rc) rc = st_writer_add(w, name, CT_DTYPE_F8_E4M3, 2, wshape, q, err);
    snprintf(key, sizeof key, "%s_scale_inv", name);
    if (!rc) rc = st_writer_add(w, key, CT_DTYPE_F32, 2, sshape, s, err);
    free(q);
    free(s);
    return rc;
}

/* ---- quantization_config ---- */

void fp8_write_config(json_writer *j, int indent)
{
    int in = indent + 2;
    json_write_raw(j, "{\n");
    json_write_rawf(j, "%*s\"activation_scheme\": \"dynamic\",\n", in, "");
    json_write_rawf(j, "%*s\"dequantize\": false,\n", in, "");
    json_write_rawf(j, "%*s\"modules_to_convert\": null,\n", in, "");
    json_write_rawf(j, "%*s\"modules_to_not_convert\": null,\n", in, "");
    json_write_rawf(j, "%*s\"quant_method\": \"fp8\",\n", in, "");
    json_write_rawf(j, "%*s\"scale_fmt\": \"float\",\n", in, "");
    json_write_rawf(j, "%*s\"weight_block_size\": [\n", in, "");
    json_write_rawf(j, "%*s%d,\n%*s%d\n", in + 2, "", FP8_BLOCK, in + 2, "", FP8_BLOCK);
    json_write_rawf(j, "%*s]\n", in, "");
    json_write_rawf(j, "%*s}", indent, "");
}

char *fp8_config_text(const char *config, size_t len, const char *source, size_t *out_len, ct_error *err)
{
    json_writer qc;
    json_writer_init(&qc);
    fp8_write_config(&qc, 2);
    char *text = config_text_with_quantization(config, len, source, qc.buf, qc.len, out_len, err);
    json_writer_free(&qc);
    return text;
}
