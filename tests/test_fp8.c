/* test_fp8.c — FP8 E4M3 weights and activations (src/formats/fp8.h) against
 * torch and transformers 5.17: tests/fixtures/fp8, made by
 * scripts/fp8_fixtures.py (which lists every tensor). Codes must equal torch's
 * float8_e4m3fn cast byte for byte, weights transformers' Fp8Quantize and
 * Fp8Dequantize bit for bit, the writer transformers' tensor names, dtypes,
 * shapes and config text; malformed checkpoint tensors are each one file with
 * one thing wrong.
 *
 * Some fixtures hold FNV-1a hashes of outputs whose inputs both sides draw
 * from ctune's RNG (random_values, block_values: the script carries the same
 * generators), which keeps the files small. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fp8.h"

#define FIXTURES "tests/fixtures/fp8/cases.safetensors"
#define TINY "tests/fixtures/fp8/tiny_qwen3.json"
#define Q_PROJ "model.layers.0.self_attn.q_proj.weight"

static st_reader *fixtures;
static char root_dir[64];
static int nfiles;

static const st_tensor *fx(const char *name)
{
    const st_tensor *t = st_find(fixtures, name);
    CT_ASSERT(t, "fixture tensor %s is missing (rerun scripts/fp8_fixtures.py)", name);
    return t;
}

static uint32_t fx_u32(const char *name, size_t i)
{
    uint32_t v;
    memcpy(&v, (const char *)fx(name)->data + 4 * i, 4);
    return v;
}

static float fx_f32(const char *name, size_t i)
{
    float v;
    memcpy(&v, (const char *)fx(name)->data + 4 * i, 4);
    return v;
}

static uint32_t fnv1a(uint32_t h, const void *data, size_t n)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x01000193u;
    return h;
}
#define FNV_START 0x811c9dc5u

static bool same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

/* The script's random_inputs: sign, exponent 2^-16..2^10, mantissa from one
 * draw; one in 8 a tie at E4M3's normal precision. */
static float random_value(ct_rng *r)
{
    uint64_t u = ct_rng_u64(r);
    uint32_t e = 111 + (uint32_t)((u >> 32) % 27), m = (uint32_t)u & 0x7fffffu;
    if (((u >> 24) & 7) == 0) m = (m & ~0xfffffu) | 0x80000u;
    uint32_t bits = (uint32_t)(u >> 63) << 31 | e << 23 | m;
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

/* The script's block_values: v in [-1, 1) times 2^exps[block]; a block whose
 * exponent is ZERO_BLOCK holds zeros, -0.0 at every third element; bf16. */
#define ZERO_BLOCK 999
static float *block_values(uint64_t seed, size_t rows, size_t cols, const int *exps)
{
    ct_rng r;
    ct_rng_seed(&r, seed);
    size_t gc = fp8_blocks(cols);
    float *x = malloc(rows * cols * sizeof(float));
    for (size_t i = 0; i < rows * cols; i++) {
        uint64_t u = ct_rng_u64(&r);
        float v = (float)((int64_t)(u >> 39) - (1 << 24)) * 0x1p-24f;
        int k = exps[(i / cols / FP8_BLOCK) * gc + (i % cols) / FP8_BLOCK];
        x[i] = k == ZERO_BLOCK ? (i % 3 == 0 ? -0.0f : 0.0f) : ct_bf16_to_f32(ct_f32_to_bf16(ldexpf(v, k)));
    }
    return x;
}

/* ---- codes ---- */

TEST(table_matches_torch_for_every_code)
{
    const float *t = fp8_e4m3_table();
    for (int b = 0; b < 256; b++) {
        float want = fx_f32("table", (size_t)b);
        bool nan_ok = isnan(want) && isnan(t[b]) && signbit(want) == signbit(t[b]);
        CHECK(same_bits(t[b], want) || nan_ok, "code 0x%02x: %g, torch %g", b, t[b], want);
        CHECK(same_bits(fp8_e4m3_decode((uint8_t)b), t[b]) || nan_ok, "decode(0x%02x) is not the table's", b);
    }
    CHECK(isnan(t[0x7f]) && isnan(t[0xff]) && t[0x7e] == 448.0f && t[1] == 0x1p-9f, "landmarks");
}

TEST(encode_inverts_decode_for_every_code)
{
    for (int b = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f)
            CHECK(fp8_e4m3_encode(fp8_e4m3_decode((uint8_t)b)) == b, "encode(decode(0x%02x)) = 0x%02x", b,
                  fp8_e4m3_encode(fp8_e4m3_decode((uint8_t)b)));
}

TEST(encode_matches_torch_on_ties_subnormals_saturation_and_nan)
{
    const st_tensor *xt = fx("encode.x"), *qt = fx("encode.q");
    REQUIRE(xt->numel == qt->numel && xt->numel > 1000, "fixture sizes");
    const uint8_t *want = qt->data;
    for (size_t i = 0; i < xt->numel; i++) {
        float x = fx_f32("encode.x", i);
        CHECK(fp8_e4m3_encode(x) == want[i], "encode(%.9g) = 0x%02x, torch 0x%02x", x, fp8_e4m3_encode(x), want[i]);
    }
}

TEST(encode_matches_torch_on_100000_random_values)
{
    const size_t count = 100000, chunk = 4096;
    REQUIRE(fx("random.hash")->numel == ct_ceil_div(count, chunk), "fixture sizes");
    ct_rng r;
    ct_rng_seed(&r, 8);
    uint8_t codes[4096];
    for (size_t c = 0; c * chunk < count; c++) {
        size_t n = count - c * chunk < chunk ? count - c * chunk : chunk;
        float first = 0;
        for (size_t i = 0; i < n; i++) {
            float x = random_value(&r);
            if (i == 0) first = x;
            codes[i] = fp8_e4m3_encode(x);
        }
        CHECK(fnv1a(FNV_START, codes, n) == fx_u32("random.hash", c),
              "values %zu..%zu (the first %.9g): codes differ from torch's", c * chunk, c * chunk + n - 1, first);
    }
}

/* ---- weights ---- */

static const int weight_exps[4] = {-5, 3, ZERO_BLOCK, -100};   /* the script's weight_inputs */

TEST(quantize_blocks_matches_transformers_with_partial_blocks)
{
    size_t rows = 136, cols = 200;
    const st_tensor *wq = fx("weight.q");
    REQUIRE(wq->numel == rows * cols && fx("weight.scale_inv")->numel == 4, "fixture sizes");
    float *x = block_values(27, rows, cols, weight_exps), s[4];
    uint8_t *q = malloc(rows * cols);
    ct_error err = {0};
    REQUIRE(fp8_quantize_blocks(q, s, x, rows, cols, &err) == CT_OK, "%s", err.msg);
    for (size_t b = 0; b < 4; b++)
        CHECK(same_bits(s[b], fx_f32("weight.scale_inv", b)), "block %zu: scale_inv %.9g, transformers %.9g", b, s[b],
              fx_f32("weight.scale_inv", b));
    const uint8_t *want = wq->data;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < rows * cols; i++)
        if (q[i] != want[i] && bad++ == 0) first = i;
    CHECK(bad == 0, "%zu of %zu codes differ, first [%zu, %zu] x %.9g: 0x%02x, transformers 0x%02x", bad, rows * cols,
          first / cols, first % cols, x[first], q[first], want[first]);
    free(x);
    free(q);
}

TEST(dequantize_blocks_matches_transformers_bit_for_bit)
{
    size_t rows = 136, cols = 200, n = rows * cols;
    float s[4], *y = malloc(n * sizeof(float));
    for (size_t b = 0; b < 4; b++) s[b] = fx_f32("weight.scale_inv", b);
    fp8_dequantize_blocks(y, fx("weight.q")->data, s, rows, cols);
    uint32_t h = FNV_START;
    for (size_t i = 0; i < n; i++) {
        uint16_t v = ct_f32_to_bf16(y[i]);
        h = fnv1a(h, &v, 2);
    }
    CHECK(h == fx_u32("weight.y_hash", 0), "bf16 of the dequantized weight differs from transformers' Fp8Dequantize");
    free(y);
}

/* One max per block of a (128, 64 * 128) weight: scale_inv is 1 / scale with
 * scale = (1 / amax) * 448 as torch rounds 448 / amax, which differs from
 * amax / 448 in the last bits of many. */
TEST(quantize_blocks_scale_inv_is_torchs_reciprocal_of_448_over_amax)
{
    size_t n = fx("scales.amax")->numel, rows = 128, cols = n * 128;
    REQUIRE(fx("scales.scale_inv")->numel == n, "fixture sizes");
    float *x = calloc(rows * cols, sizeof(float)), *s = malloc(n * sizeof(float));
    uint8_t *q = malloc(rows * cols);
    for (size_t i = 0; i < n; i++) {
        float a = fx_f32("scales.amax", i);
        x[(i % 128) * cols + i * 128 + (i * 37) % 128] = i % 2 ? -a : a;
    }
    ct_error err = {0};
    REQUIRE(fp8_quantize_blocks(q, s, x, rows, cols, &err) == CT_OK, "%s", err.msg);
    for (size_t i = 0; i < n; i++) {
        CHECK(same_bits(s[i], fx_f32("scales.scale_inv", i)), "block %zu (amax %.9g): scale_inv %.9g, transformers "
              "%.9g", i, fx_f32("scales.amax", i), s[i], fx_f32("scales.scale_inv", i));
        CHECK(q[(i % 128) * cols + i * 128 + (i * 37) % 128] == (i % 2 ? 0xfe : 0x7e), "block %zu: max is not 448", i);
    }
    free(x); free(s); free(q);
}

/* transformers' from_pretrained casts the weight to E4M3 before quantizing:
 * the same function of the cast values gives its bytes. */
TEST(quantize_blocks_of_the_e4m3_cast_weight_matches_transformers_on_load)
{
    static const int exps[2] = {-5, -8};
    size_t rows = 128, cols = 256;
    float *x = block_values(28, rows, cols, exps), s[2];
    for (size_t i = 0; i < rows * cols; i++) x[i] = fp8_e4m3_decode(fp8_e4m3_encode(x[i]));
    uint8_t *q = malloc(rows * cols);
    ct_error err = {0};
    REQUIRE(fp8_quantize_blocks(q, s, x, rows, cols, &err) == CT_OK, "%s", err.msg);
    CHECK(same_bits(s[0], fx_f32("onload.scale_inv", 0)) && same_bits(s[1], fx_f32("onload.scale_inv", 1)),
          "scale_inv %.9g %.9g, transformers %.9g %.9g", s[0], s[1], fx_f32("onload.scale_inv", 0),
          fx_f32("onload.scale_inv", 1));
    CHECK(fnv1a(FNV_START, q, rows * cols) == fx_u32("onload.q_hash", 0), "codes differ from transformers' on-load");
    free(x);
    free(q);
}

TEST(quantize_blocks_of_zeros_keeps_scale_one_and_signed_zeros)
{
    float x[3 * 5] = {0}, s = 0;
    x[4] = -0.0f;
    uint8_t q[15];
    ct_error err = {0};
    REQUIRE(fp8_quantize_blocks(q, &s, x, 3, 5, &err) == CT_OK, "%s", err.msg);
    CHECK(s == 1.0f, "scale_inv %g", s);
    for (int i = 0; i < 15; i++) CHECK(q[i] == (i == 4 ? 0x80 : 0), "code %d is 0x%02x", i, q[i]);
}

/* Each value lands within half an E4M3 step of x, measured in the block's
 * scale: 2^-4 |x| for normal codes, 2^-10 * scale_inv among the subnormals
 * (the fp32 products add a few ulps, hence 1 + 2^-18). */
TEST(quantize_blocks_round_trip_is_within_half_a_step)
{
    static const int exps[6] = {-7, 0, -20, 12, -1, -30};
    size_t rows = 200, cols = 300, n = rows * cols;
    float *x = block_values(5, rows, cols, exps), *y = malloc(n * sizeof(float)), s[6];
    uint8_t *q = malloc(n);
    ct_error err = {0};
    REQUIRE(fp8_quantize_blocks(q, s, x, rows, cols, &err) == CT_OK, "%s", err.msg);
    fp8_dequantize_blocks(y, q, s, rows, cols);
    size_t bad = 0, first = 0, at448 = 0;
    for (size_t i = 0; i < n; i++) {
        float si = s[(i / cols / FP8_BLOCK) * 3 + (i % cols) / FP8_BLOCK];
        float half = fmaxf(fabsf(x[i]) * 0x1p-4f, 0x1p-10f * si) * (1 + 0x1p-18f);
        if (!(fabsf(y[i] - x[i]) <= half) && bad++ == 0) first = i;
        at448 += (q[i] & 0x7f) == 0x7e;
    }
    CHECK(bad == 0, "%zu values off by more than half a step, first [%zu] %.9g -> %.9g", bad, first, x[first],
          y[first]);
    CHECK(at448 >= 6, "each block's max should reach 448 (%zu codes do)", at448);
    free(x); free(y); free(q);
}

TEST(quantize_blocks_rejects_non_finite_input)
{
    float x[4 * 6] = {0}, s;
    uint8_t q[24];
    x[2 * 6 + 3] = NAN;
    x[3 * 6 + 1] = INFINITY;
    ct_error err = {0};
    CHECK(fp8_quantize_blocks(q, &s, x, 4, 6, &err) == CT_ERR_INPUT, "NaN quantized");
    CHECK(strstr(err.msg, "element [2, 3]") && !strchr(err.msg, '\n'), "message: %s", err.msg);
}

TEST(quantize_blocks_rejects_a_block_whose_scale_overflows)
{
    float x[2 * 130] = {0}, s[2];
    uint8_t q[260];
    x[129] = 1e-37f;   /* block [0, 1]: (1 / 1e-37) * 448 > FLT_MAX */
    ct_error err = {0};
    CHECK(fp8_quantize_blocks(q, s, x, 2, 130, &err) == CT_ERR_INPUT, "1e-37 quantized");
    CHECK(strstr(err.msg, "block [0, 1]") && !strchr(err.msg, '\n'), "message: %s", err.msg);
    x[129] = 1e-35f;
    CHECK(fp8_quantize_blocks(q, s, x, 2, 130, &err) == CT_OK && q[129] == 0x7e, "1e-35: %s", err.msg);
}

TEST(transpose_scales_swaps_the_block_grid)
{
    float s[2 * 3] = {1, 2, 3, 4, 5, 6}, st[6];
    fp8_transpose_scales(st, s, 200, 300);  /* grid (2, 3) -> (3, 2) */
    static const float want[6] = {1, 4, 2, 5, 3, 6};
    CHECK(memcmp(st, want, sizeof want) == 0, "%g %g %g %g %g %g", st[0], st[1], st[2], st[3], st[4], st[5]);
}

/* ---- activations ---- */

/* Rows of random magnitudes per group (one group of zeros), T and K not
 * multiples of anything; scales stored with ld_scale > T. */
TEST(quantize_rows_scale_is_the_smallest_power_of_two_at_or_above_amax_over_448)
{
    size_t T = 7, K = 300, G = 3, ld = 9, n = T * K;
    ct_rng r;
    ct_rng_seed(&r, 3);
    float *x = malloc(n * sizeof(float)), scale[3 * 9];
    for (size_t i = 0; i < n; i++) {
        size_t t = i / K, g = (i % K) / FP8_BLOCK;
        float v = (float)ct_rng_normal(&r);
        x[i] = t == 2 && g == 1 ? 0.0f : ldexpf(v, (int)((t * 5 + g * 11) % 40) - 20);
    }
    for (size_t i = 0; i < 27; i++) scale[i] = -1.0f;
    uint8_t *q = malloc(n);
    fp8_quantize_rows(q, scale, x, T, K, ld);
    for (size_t t = 0; t < T; t++)
        for (size_t g = 0; g < G; g++) {
            float amax = 0, s = scale[fp8_row_scale_index(g, t, ld)];
            for (size_t c = g * FP8_BLOCK; c < K && c < (g + 1) * FP8_BLOCK; c++) amax = fmaxf(amax, fabsf(x[t * K + c]));
            int e;
            float m = frexpf(s, &e);
            if (amax == 0) {
                CHECK(s == 1.0f, "row %zu group %zu of zeros: scale %g", t, g, s);
                continue;
            }
            CHECK(m == 0.5f && amax / 448.0f <= s && amax / 448.0f > s / 2, "row %zu group %zu: amax %g, scale %g", t,
                  g, amax, s);
        }
    for (size_t g = 0; g < G; g++)
        for (size_t t = T; t < ld; t++)
            CHECK(scale[fp8_row_scale_index(g, t, ld)] == -1.0f, "padding scale [%zu, %zu] written", g, t);
    free(x);
    free(q);
}

/* x = code * 2^k with 448 * 2^k the group's max: the scale is 2^k and every
 * code comes back as it was. */
TEST(quantize_rows_is_exact_on_codes_times_the_scale)
{
    size_t T = 5, K = 272, n = T * K;
    ct_rng r;
    ct_rng_seed(&r, 4);
    uint8_t *want = malloc(n), *q = malloc(n);
    float *x = malloc(n * sizeof(float)), scale[3 * 5];
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)(ct_rng_u64(&r) >> 56);
        if ((b & 0x7f) >= 0x7e || (i % K) % FP8_BLOCK == 9) b = (b & 0x80) | 0x7e;  /* no NaN; 448 in each group */
        want[i] = b;
        size_t t = i / K, g = (i % K) / FP8_BLOCK;
        x[i] = ldexpf(fp8_e4m3_decode(b), (int)(t * 7 + g) - 20);
    }
    fp8_quantize_rows(q, scale, x, T, K, T);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += q[i] != want[i];
    CHECK(bad == 0, "%zu of %zu codes changed", bad, n);
    for (size_t t = 0; t < T; t++)
        for (size_t g = 0; g < 3; g++)
            CHECK(scale[fp8_row_scale_index(g, t, T)] == ldexpf(1.0f, (int)(t * 7 + g) - 20), "scale [%zu, %zu] %g", g,
                  t, scale[fp8_row_scale_index(g, t, T)]);
    free(want); free(q); free(x);
}

TEST(quantize_rows_of_nonfinite_input_gives_an_infinite_scale_and_nan_code_7f)
{
    float x[2 * 8] = {1, -2, 3, -INFINITY, 0.5f, -0.25f, 0, 7, 1, NAN, -NAN, 2, -4, 0, 0, 1}, scale[2];
    uint8_t q[16];
    fp8_quantize_rows(q, scale, x, 2, 8, 2);
    CHECK(isinf(scale[0]) && scale[1] == 0x1p-6f, "scales %g %g", scale[0], scale[1]);
    static const uint8_t want0[8] = {0x00, 0x80, 0x00, 0x7f, 0x00, 0x80, 0x00, 0x00};
    CHECK(memcmp(q, want0, 8) == 0, "row 0 (inf): %02x %02x %02x %02x %02x %02x %02x %02x", q[0], q[1], q[2], q[3],
          q[4], q[5], q[6], q[7]);
    CHECK(q[9] == 0x7f && q[10] == 0x7f && q[12] == fp8_e4m3_encode(-256.0f), "row 1 (NaN): %02x %02x %02x", q[9],
          q[10], q[12]);
}

/* ---- checkpoint tensors ---- */

typedef struct weight_file {
    const char *weight_name, *scale_name;   /* NULL: leave it out */
    ct_dtype weight_dtype, scale_dtype;
    int64_t weight_shape[2], scale_shape[2];
    int poke_scale;      /* element of scale_inv to set to poke_value, or -1 */
    float poke_value;
    int poke_code;       /* element of the weight to set to 0xff, or -1 */
} weight_file;

enum { ROWS = 136, COLS = 200 };

static weight_file good_file(void)
{
    return (weight_file){Q_PROJ, Q_PROJ "_scale_inv", CT_DTYPE_F8_E4M3, CT_DTYPE_F32, {ROWS, COLS}, {2, 2}, -1, 0, -1};
}

static st_reader *open_written(st_writer *w)
{
    char path[128];
    ct_error err = {0};
    snprintf(path, sizeof path, "%s/%d.safetensors", root_dir, nfiles++);
    CT_ASSERT(st_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    st_reader *r = st_open(path, &err);
    CT_ASSERT(r, "%s", err.msg);
    return r;
}

/* Writes F's tensors (from quantized random values; BF16 or F16 scales
 * converted from them) to a new file and opens it. *scale_out gets the F32
 * scales when not NULL. */
static st_reader *write_weight_file(weight_file f, float *scale_out)
{
    static const int exps[4] = {-6, -4, -9, -2};
    float *x = block_values(9, ROWS, COLS, exps), s[4];
    uint8_t *q = calloc(ROWS * COLS * 2, 1), sbytes[64] = {0};
    ct_error err = {0};
    CT_ASSERT(fp8_quantize_blocks(q, s, x, ROWS, COLS, &err) == CT_OK, "%s", err.msg);
    if (f.poke_scale >= 0) s[f.poke_scale] = f.poke_value;
    if (f.poke_code >= 0) q[f.poke_code] = 0xff;
    for (int i = 0; i < 4; i++) {
        uint16_t h = ct_f32_to_bf16(s[i]);
        if (f.scale_dtype == CT_DTYPE_F16) h = i == 0 ? 0x0c00 : 0x1234 + (uint16_t)i;  /* 2^-12 and others */
        if (f.scale_dtype == CT_DTYPE_F32) memcpy(sbytes + 4 * i, &s[i], 4);
        else memcpy(sbytes + 2 * i, &h, 2);
    }
    if (scale_out) memcpy(scale_out, s, sizeof s);
    st_writer *w = st_writer_new();
    if (f.weight_name)
        CT_ASSERT(st_writer_add(w, f.weight_name, f.weight_dtype, 2, f.weight_shape, q, &err) == CT_OK, "%s", err.msg);
    if (f.scale_name)
        CT_ASSERT(st_writer_add(w, f.scale_name, f.scale_dtype, 2, f.scale_shape, sbytes, &err) == CT_OK, "%s",
                  err.msg);
    int64_t one = 1;
    uint16_t norm = 0x3f80;
    CT_ASSERT(st_writer_add(w, "model.norm.weight", CT_DTYPE_BF16, 1, &one, &norm, &err) == CT_OK, "%s", err.msg);
    free(x);
    free(q);
    return open_written(w);
}

TEST(written_weight_reads_back_as_quantized)
{
    static const int exps[4] = {-6, -4, -9, -2};
    float *x = block_values(9, ROWS, COLS, exps), s[4], got_s[4];
    uint8_t *q = malloc(ROWS * COLS);
    ct_error err = {0};
    REQUIRE(fp8_quantize_blocks(q, s, x, ROWS, COLS, &err) == CT_OK, "%s", err.msg);
    st_writer *w = st_writer_new();
    REQUIRE(fp8_write_weight(w, Q_PROJ, x, ROWS, COLS, &err) == CT_OK, "%s", err.msg);
    st_reader *r = open_written(w);
    CHECK(fp8_is_quantized(r, Q_PROJ) && !fp8_is_quantized(r, "model.layers.0.self_attn.k_proj.weight"),
          "is_quantized");
    const uint8_t *got_q = NULL;
    REQUIRE(fp8_read_weight(r, Q_PROJ, ROWS, COLS, &got_q, got_s, &err) == CT_OK, "%s", err.msg);
    CHECK(memcmp(got_q, q, ROWS * COLS) == 0 && memcmp(got_s, s, sizeof s) == 0, "read back differs from quantize");
    st_close(r);
    free(x);
    free(q);
}

TEST(bf16_weight_is_not_quantized)
{
    weight_file f = good_file();
    f.weight_dtype = CT_DTYPE_BF16;
    f.scale_name = NULL;
    st_reader *r = write_weight_file(f, NULL);
    CHECK(!fp8_is_quantized(r, Q_PROJ), "a bf16 weight without scales counts as FP8");
    st_close(r);
}

TEST(bf16_and_f16_scales_read_exactly)
{
    weight_file f = good_file();
    float s[4], got[4];
    const uint8_t *q;
    ct_error err = {0};
    f.scale_dtype = CT_DTYPE_BF16;
    st_reader *r = write_weight_file(f, s);
    REQUIRE(fp8_read_weight(r, Q_PROJ, ROWS, COLS, &q, got, &err) == CT_OK, "%s", err.msg);
    for (int i = 0; i < 4; i++)
        CHECK(same_bits(got[i], ct_bf16_to_f32(ct_f32_to_bf16(s[i]))), "bf16 scale %d: %g", i, got[i]);
    st_close(r);
    f.scale_dtype = CT_DTYPE_F16;
    r = write_weight_file(f, NULL);
    REQUIRE(fp8_read_weight(r, Q_PROJ, ROWS, COLS, &q, got, &err) == CT_OK, "%s", err.msg);
    CHECK(got[0] == 0x1p-12f && same_bits(got[1], ct_f16_to_f32(0x1235)), "f16 scales %g %g", got[0], got[1]);
    st_close(r);
}

/* Reading the case's Q_PROJ as (ROWS, COLS) is CT_ERR_INPUT, one line naming
 * the file and holding want. */
static void expect_input_error(weight_file f, const char *want)
{
    st_reader *r = write_weight_file(f, NULL);
    const uint8_t *q = NULL;
    float s[4];
    ct_error err = {0};
    int rc = fp8_read_weight(r, Q_PROJ, ROWS, COLS, &q, s, &err);
    CHECK(rc == CT_ERR_INPUT && q == NULL, "rc %d (want an input error)", rc);
    CHECK(strstr(err.msg, want) && strstr(err.msg, ".safetensors") && !strchr(err.msg, '\n'),
          "message '%s' lacks '%s' or the file", err.msg, want);
    st_close(r);
}

TEST(good_weight_file_reads)
{
    st_reader *r = write_weight_file(good_file(), NULL);
    const uint8_t *q = NULL;
    float s[4];
    ct_error err = {0};
    CHECK(fp8_read_weight(r, Q_PROJ, ROWS, COLS, &q, s, &err) == CT_OK && q, "%s", err.msg);
    st_close(r);
}

TEST(weight_of_another_dtype_is_an_input_error)
{
    weight_file f = good_file();
    f.weight_dtype = CT_DTYPE_U8;
    expect_input_error(f, Q_PROJ "': dtype U8, expected F8_E4M3");
}

TEST(weight_of_the_wrong_shape_is_an_input_error)
{
    weight_file f = good_file();
    f.weight_shape[0] = COLS;
    f.weight_shape[1] = ROWS;
    expect_input_error(f, Q_PROJ "': shape [200, 136] does not match the expected [136, 200]");
}

TEST(missing_weight_is_an_input_error)
{
    weight_file f = good_file();
    f.weight_name = NULL;
    expect_input_error(f, Q_PROJ " is missing");
}

TEST(missing_scale_inv_is_an_input_error)
{
    weight_file f = good_file();
    f.scale_name = NULL;
    expect_input_error(f, Q_PROJ "_scale_inv is missing");
}

TEST(scale_inv_of_the_wrong_shape_is_an_input_error)
{
    weight_file f = good_file();
    f.scale_shape[0] = 1;   /* floor(136 / 128) instead of the ceiling */
    f.scale_shape[1] = 4;
    expect_input_error(f, Q_PROJ "_scale_inv': shape [1, 4] does not match the expected [2, 2]");
}

TEST(scale_inv_of_another_dtype_is_an_input_error)
{
    weight_file f = good_file();
    f.scale_dtype = CT_DTYPE_U8;   /* ue8m0 scales, which ctune does not read */
    expect_input_error(f, Q_PROJ "_scale_inv': dtype U8, expected F32 (or BF16, F16)");
}

TEST(nan_scale_is_an_input_error)
{
    weight_file f = good_file();
    f.poke_scale = 3;
    f.poke_value = NAN;
    expect_input_error(f, Q_PROJ "_scale_inv: element [1, 1] is nan");
}

TEST(zero_scale_is_an_input_error)
{
    weight_file f = good_file();
    f.poke_scale = 1;
    f.poke_value = 0.0f;
    expect_input_error(f, Q_PROJ "_scale_inv: element [0, 1] is 0 (expected a finite scale > 0)");
}

TEST(negative_scale_is_an_input_error)
{
    weight_file f = good_file();
    f.poke_scale = 2;
    f.poke_value = -0.5f;
    expect_input_error(f, Q_PROJ "_scale_inv: element [1, 0] is -0.5");
}

TEST(nan_code_is_an_input_error)
{
    weight_file f = good_file();
    f.poke_code = 3 * COLS + 7;
    expect_input_error(f, Q_PROJ ": element [3, 7] is the NaN code 0xff");
}

TEST(write_weight_names_the_tensor_of_a_non_finite_value)
{
    float x[2 * 3] = {0, 1, 2, 3, INFINITY, 5};
    st_writer *w = st_writer_new();
    ct_error err = {0};
    CHECK(fp8_write_weight(w, Q_PROJ, x, 2, 3, &err) == CT_ERR_INPUT, "inf written");
    CHECK(strstr(err.msg, Q_PROJ ": fp8: element [1, 1] is inf"), "message: %s", err.msg);
    st_writer_free(w);
}

/* ---- what transformers saves ---- */

/* Every FP8 weight of the tiny Qwen3, written by fp8_write_weight, gives
 * exactly the names, dtypes and shapes of transformers' FP8 tensors. */
TEST(writer_matches_transformers_tensor_names_dtypes_and_shapes)
{
    ct_error err = {0};
    json_doc *doc = json_parse_file(TINY, &err);
    REQUIRE(doc, "%s", err.msg);
    const json_value *list = json_get_type(json_root(doc), "tensors", JSON_ARRAY);
    REQUIRE(list && list->count > 0, "fixture layout");
    st_writer *w = st_writer_new();
    size_t n_fp8 = 0;
    for (size_t i = 0; i < list->count; i++) {
        const json_value *e = list->items[i], *shape = e->items[2];
        if (strcmp(e->items[1]->string, "F8_E4M3") != 0) continue;
        REQUIRE(shape->count == 2, "%s is not 2-D", e->items[0]->string);
        int64_t rows = shape->items[0]->integer, cols = shape->items[1]->integer;
        float *x = calloc((size_t)(rows * cols), sizeof(float));
        x[0] = 1.0f;
        REQUIRE(fp8_write_weight(w, e->items[0]->string, x, rows, cols, &err) == CT_OK, "%s", err.msg);
        free(x);
        n_fp8++;
    }
    st_reader *r = open_written(w);
    size_t matched = 0;
    for (size_t i = 0; i < list->count; i++) {
        const json_value *e = list->items[i], *shape = e->items[2];
        const st_tensor *t = st_find(r, e->items[0]->string);
        bool ours = strcmp(e->items[1]->string, "F8_E4M3") == 0 || strstr(e->items[0]->string, "_scale_inv");
        CHECK(!t == !ours, "%s: %s by fp8_write_weight", e->items[0]->string, t ? "written" : "not written");
        if (!t) continue;
        bool same = !strcmp(ct_dtype_name(t->dtype), e->items[1]->string) && t->ndim == (int)shape->count;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == shape->items[d]->integer;
        CHECK(same, "%s: %s with %d dims, transformers %s", e->items[0]->string, ct_dtype_name(t->dtype), t->ndim,
              e->items[1]->string);
        matched++;
    }
    CHECK(n_fp8 == 7 && matched == st_count(r) && matched == 2 * n_fp8, "%zu FP8 weights, %zu of %zu tensors matched",
          n_fp8, matched, st_count(r));
    st_close(r);
    json_free(doc);
}

TEST(config_object_is_transformers_text)
{
    ct_error err = {0};
    json_doc *doc = json_parse_file(TINY, &err);
    REQUIRE(doc, "%s", err.msg);
    const json_value *want = json_get_type(json_root(doc), "quantization_config", JSON_STRING);
    REQUIRE(want, "fixture layout");
    json_writer j;
    json_writer_init(&j);
    fp8_write_config(&j, 2);
    CHECK(j.len == want->string_len && memcmp(j.buf, want->string, j.len) == 0, "ours:\n%s\ntransformers:\n%s", j.buf,
          want->string);
    json_writer_free(&j);
    json_free(doc);
}

TEST(config_text_appends_quantization_config)
{
    const char *config = "{\n  \"hidden_size\": 128,\n  \"model_type\": \"qwen3\"\n}\n";
    size_t len = 0;
    ct_error err = {0};
    char *text = fp8_config_text(config, strlen(config), "config.json", &len, &err);
    REQUIRE(text, "%s", err.msg);
    json_doc *doc = json_parse(text, len, "out", &err);
    REQUIRE(doc, "%s: %s", err.msg, text);
    const json_value *qc = json_get_type(json_root(doc), "quantization_config", JSON_OBJECT);
    const json_value *m = qc ? json_get_type(qc, "quant_method", JSON_STRING) : NULL;
    const json_value *bs = qc ? json_get_type(qc, "weight_block_size", JSON_ARRAY) : NULL;
    CHECK(m && !strcmp(m->string, "fp8") && bs && bs->count == 2 && bs->items[0]->integer == 128, "%s", text);
    CHECK(!strncmp(text, "{\n  \"hidden_size\": 128,\n", 24) &&
          strstr(text, "\"qwen3\",\n  \"quantization_config\": {\n    \"activation_scheme\""),
          "not appended as the last key: %s", text);
    json_free(doc);
    char *again = fp8_config_text(text, len, "config.json", &len, &err);
    CHECK(!again && err.code == CT_ERR_INPUT && strstr(err.msg, "already quantized"), "re-quantized: %s", err.msg);
    free(again);
    free(text);
}

int main(void)
{
    ct_error err = {0};
    fixtures = st_open(FIXTURES, &err);
    CT_ASSERT(fixtures, "%s (run from the repository root)", err.msg);
    snprintf(root_dir, sizeof root_dir, "/tmp/ctune_fp8_XXXXXX");
    CT_ASSERT(mkdtemp(root_dir) != NULL, "mkdtemp failed");
    RUN(table_matches_torch_for_every_code);
    RUN(encode_inverts_decode_for_every_code);
    RUN(encode_matches_torch_on_ties_subnormals_saturation_and_nan);
    RUN(encode_matches_torch_on_100000_random_values);
    RUN(quantize_blocks_matches_transformers_with_partial_blocks);
    RUN(dequantize_blocks_matches_transformers_bit_for_bit);
    RUN(quantize_blocks_scale_inv_is_torchs_reciprocal_of_448_over_amax);
    RUN(quantize_blocks_of_the_e4m3_cast_weight_matches_transformers_on_load);
    RUN(quantize_blocks_of_zeros_keeps_scale_one_and_signed_zeros);
    RUN(quantize_blocks_round_trip_is_within_half_a_step);
    RUN(quantize_blocks_rejects_non_finite_input);
    RUN(quantize_blocks_rejects_a_block_whose_scale_overflows);
    RUN(transpose_scales_swaps_the_block_grid);
    RUN(quantize_rows_scale_is_the_smallest_power_of_two_at_or_above_amax_over_448);
    RUN(quantize_rows_is_exact_on_codes_times_the_scale);
    RUN(quantize_rows_of_nonfinite_input_gives_an_infinite_scale_and_nan_code_7f);
    RUN(written_weight_reads_back_as_quantized);
    RUN(bf16_weight_is_not_quantized);
    RUN(bf16_and_f16_scales_read_exactly);
    RUN(good_weight_file_reads);
    RUN(weight_of_another_dtype_is_an_input_error);
    RUN(weight_of_the_wrong_shape_is_an_input_error);
    RUN(missing_weight_is_an_input_error);
    RUN(missing_scale_inv_is_an_input_error);
    RUN(scale_inv_of_the_wrong_shape_is_an_input_error);
    RUN(scale_inv_of_another_dtype_is_an_input_error);
    RUN(nan_scale_is_an_input_error);
    RUN(zero_scale_is_an_input_error);
    RUN(negative_scale_is_an_input_error);
    RUN(nan_code_is_an_input_error);
    RUN(write_weight_names_the_tensor_of_a_non_finite_value);
    RUN(writer_matches_transformers_tensor_names_dtypes_and_shapes);
    RUN(config_object_is_transformers_text);
    RUN(config_text_appends_quantization_config);
    for (int i = 0; i < nfiles; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%d.safetensors", root_dir, i);
        unlink(path);
    }
    rmdir(root_dir);
    st_close(fixtures);
    return check_summary();
}
