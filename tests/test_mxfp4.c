/* test_mxfp4.c — MXFP4 (src/formats/mxfp4.h) against transformers 5.17 and the
 * gpt-oss reference quantizer's rule: tests/fixtures/mxfp4, made by
 * scripts/mxfp4_fixtures.py (which lists every tensor). Decoding must equal
 * transformers' bf16 bit for bit, encoding the reference byte for byte;
 * malformed expert tensors are each one file with one thing wrong.
 *
 * `test_mxfp4 --convert SRC DST EXPECTED` is the C half of
 * scripts/check_mxfp4_folder.py: it rewrites the bf16 gpt_oss folder SRC as an
 * MXFP4 folder DST (experts through mxfp4_write_experts, config.json with
 * mxfp4_write_config) and writes what mxfp4_dequantize reads back from DST, as
 * F32 (E, rows, K) under each expert weight's name, to EXPECTED. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "mxfp4.h"

#define FIXTURES "tests/fixtures/mxfp4/cases.safetensors"
#define GATE_UP "model.layers.0.mlp.experts.gate_up_proj"

static st_reader *fixtures;

static const st_tensor *fx(const char *name)
{
    const st_tensor *t = st_find(fixtures, name);
    CT_ASSERT(t, "fixture tensor %s is missing (rerun scripts/mxfp4_fixtures.py)", name);
    return t;
}

/* Deterministic normal-ish values: sums of uniforms, scaled per block of 32 by
 * 2^(-12..12) so scales vary. */
static void fill_random(float *x, size_t n, uint32_t seed)
{
    uint32_t s = seed;
    for (size_t i = 0; i < n; i++) {
        float v = 0;
        for (int k = 0; k < 4; k++) {
            s = s * 1664525u + 1013904223u;
            v += (float)(s >> 8) / 16777216.0f - 0.5f;
        }
        x[i] = ldexpf(v, (int)((i / MXFP4_BLOCK) * 7 % 25) - 12);
    }
}

TEST(code_book_is_e2m1)
{
    static const float want[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int i = 0; i < 16; i++)
        CHECK(mxfp4_code()[i] == want[i] && signbit(mxfp4_code()[i]) == signbit(want[i]), "code %d is %g", i,
              mxfp4_code()[i]);
}

TEST(dequantize_matches_transformers_bit_for_bit)
{
    const st_tensor *b = fx("dequant.blocks"), *s = fx("dequant.scales"), *want = fx("dequant.y");
    REQUIRE(b->ndim == 4 && want->dtype == CT_DTYPE_BF16, "fixture layout");
    size_t rows = (size_t)(b->shape[0] * b->shape[1]), K = (size_t)b->shape[2] * MXFP4_BLOCK;
    REQUIRE(want->numel == rows * K, "fixture sizes");
    float *y = malloc(rows * K * sizeof(float));
    mxfp4_dequantize(y, b->data, s->data, rows, K);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < rows * K; i++) {
        uint16_t h;
        memcpy(&h, (const char *)want->data + 2 * i, 2);
        if (ct_f32_to_bf16(y[i]) != h && bad++ == 0) first = i;
    }
    uint16_t h0;
    memcpy(&h0, (const char *)want->data + 2 * first, 2);
    CHECK(bad == 0, "%zu of %zu values differ, first [%zu] %.9g vs transformers %.9g", bad, rows * K, first,
          y[first], ct_bf16_to_f32(h0));
    free(y);
}

/* Every decoded value (scales 0..252) is a bf16 value already: converting
 * loses nothing, so fp32 compute on them sees what transformers' bf16 holds. */
TEST(dequantized_values_are_exact_in_bf16)
{
    const st_tensor *b = fx("dequant.blocks"), *s = fx("dequant.scales");
    size_t rows = (size_t)(b->shape[0] * b->shape[1]), K = (size_t)b->shape[2] * MXFP4_BLOCK;
    float *y = malloc(rows * K * sizeof(float));
    mxfp4_dequantize(y, b->data, s->data, rows, K);
    size_t bad = 0;
    for (size_t i = 0; i < rows * K; i++) {
        float r = ct_bf16_to_f32(ct_f32_to_bf16(y[i]));
        if (!(isfinite(y[i]) && memcmp(&r, &y[i], 4) == 0)) bad++;
    }
    CHECK(bad == 0, "%zu values are not exact bf16 values", bad);
    free(y);
}

TEST(quantize_matches_the_reference_byte_for_byte)
{
    const st_tensor *xt = fx("quant.x"), *wb = fx("quant.blocks"), *ws = fx("quant.scales");
    size_t rows = (size_t)xt->shape[0], K = (size_t)xt->shape[1], nb = rows * K / MXFP4_BLOCK;
    REQUIRE(xt->dtype == CT_DTYPE_F32 && wb->nbytes == nb * MXFP4_BLOCK_BYTES && ws->nbytes == nb, "fixture sizes");
    float *x = malloc(rows * K * sizeof(float));
    memcpy(x, xt->data, rows * K * sizeof(float));
    uint8_t *blocks = malloc(nb * MXFP4_BLOCK_BYTES), *scales = malloc(nb);
    ct_error err = {0};
    REQUIRE(mxfp4_quantize(blocks, scales, x, rows, K, &err) == CT_OK, "%s", err.msg);
    const uint8_t *want_s = ws->data, *want_b = wb->data;
    for (size_t i = 0; i < nb; i++)
        CHECK(scales[i] == want_s[i], "block %zu: scale %d, reference %d", i, scales[i], want_s[i]);
    for (size_t i = 0; i < nb * MXFP4_BLOCK_BYTES; i++)
        CHECK(blocks[i] == want_b[i], "byte %zu (block %zu): %02x, reference %02x (x %.9g, %.9g)", i,
              i / MXFP4_BLOCK_BYTES, blocks[i], want_b[i], x[2 * i], x[2 * i + 1]);
    free(x); free(blocks); free(scales);
}

/* Each block's scale is the smallest power of two with max|x| / scale <= 6
 * (up to fp32's rounding of max / 6), and each value lands within half a code
 * step of x: steps are .5 below 2, 1 below 4, 2 above. */
TEST(quantize_round_trip_is_within_half_a_code_step)
{
    size_t rows = 40, K = 96, n = rows * K, nb = n / MXFP4_BLOCK;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    uint8_t *blocks = malloc(nb * MXFP4_BLOCK_BYTES), *scales = malloc(nb);
    fill_random(x, n, 26);
    ct_error err = {0};
    REQUIRE(mxfp4_quantize(blocks, scales, x, rows, K, &err) == CT_OK, "%s", err.msg);
    mxfp4_dequantize(y, blocks, scales, rows, K);
    size_t bad_scale = 0, bad = 0, first = 0;
    for (size_t b = 0; b < nb; b++) {
        float amax = 0, scale = ldexpf(1.0f, scales[b] - 127);
        for (int i = 0; i < MXFP4_BLOCK; i++) amax = fmaxf(amax, fabsf(x[b * MXFP4_BLOCK + i]));
        if (!(amax / scale <= 6.0f * (1 + 0x1p-22f) && amax / scale > 3.0f * (1 - 0x1p-22f))) bad_scale++;
        for (int i = 0; i < MXFP4_BLOCK; i++) {
            size_t j = b * MXFP4_BLOCK + i;
            float a = fabsf(x[j]) / scale, half = a < 2 ? 0.25f : a < 4 ? 0.5f : 1.0f;
            if (!(fabsf(y[j] - x[j]) <= half * scale) && bad++ == 0) first = j;
        }
    }
    CHECK(bad_scale == 0, "%zu blocks have a scale that is not the smallest power of two >= max/6", bad_scale);
    CHECK(bad == 0, "%zu values off by more than half a step, first [%zu] %.9g -> %.9g", bad, first, x[first],
          y[first]);
    free(x); free(y); free(blocks); free(scales);
}

TEST(quantize_rejects_non_finite_input)
{
    float x[64] = {0};
    x[37] = INFINITY;
    uint8_t blocks[32], scales[2];
    ct_error err = {0};
    CHECK(mxfp4_quantize(blocks, scales, x, 1, 64, &err) == CT_ERR_INPUT, "inf quantized");
    CHECK(strstr(err.msg, "element 37") && !strchr(err.msg, '\n'), "message: %s", err.msg);
}

/* Blocks quantize in parallel: of several bad blocks the first is named, as a
 * serial pass would name it. */
TEST(quantize_names_the_first_bad_block_of_many)
{
    size_t rows = 512, K = 1024, n = rows * K;
    float *x = ct_calloc(n, sizeof *x);
    x[n - 5] = NAN;
    x[300000] = 3e38f;
    x[200001] = -INFINITY;
    uint8_t *blocks = ct_malloc(n / 2), *scales = ct_malloc(n / 32);
    ct_error err = {0};
    CHECK(mxfp4_quantize(blocks, scales, x, rows, K, &err) == CT_ERR_INPUT, "bad blocks quantized");
    CHECK(strstr(err.msg, "element 200001 is -inf"), "message: %s", err.msg);
    x[200001] = 0.0f;
    CHECK(mxfp4_quantize(blocks, scales, x, rows, K, &err) == CT_ERR_INPUT && strstr(err.msg, "element 300000:") &&
              strstr(err.msg, "253"), "message: %s", err.msg);
    free(x); free(blocks); free(scales);
}

TEST(quantize_rejects_a_block_that_would_overflow_bf16)
{
    float x[64] = {0};
    x[40] = 3e38f;  /* needs scale 2^126, byte 253 */
    uint8_t blocks[32], scales[2];
    ct_error err = {0};
    CHECK(mxfp4_quantize(blocks, scales, x, 1, 64, &err) == CT_ERR_INPUT, "3e38 quantized");
    CHECK(strstr(err.msg, "element 32") && strstr(err.msg, "253"), "message: %s", err.msg);
    x[40] = 6.0f * 0x1p125f;  /* exactly the largest: byte 252 */
    CHECK(mxfp4_quantize(blocks, scales, x, 1, 64, &err) == CT_OK && scales[1] == 252, "6 * 2^125: %s", err.msg);
}

/* ---- checkpoint tensors ---- */

static char root_dir[64];
static int nfiles;

enum { E = 2, ROWS = 6, K = 64 };

/* One expert weight's tensors, each of which a malformed case replaces. */
typedef struct experts_file {
    const char *blocks_name, *scales_name;       /* NULL: leave it out */
    ct_dtype blocks_dtype;
    int blocks_ndim, scales_ndim;
    int64_t blocks_shape[4], scales_shape[3];
    int poke_scale;                              /* element to set to 253, or -1 */
} experts_file;

static experts_file good_file(void)
{
    return (experts_file){GATE_UP "_blocks", GATE_UP "_scales", CT_DTYPE_U8, 4, 3,
                          {E, ROWS, K / 32, 16}, {E, ROWS, K / 32}, -1};
}

/* Writes F's tensors (from quantized random values) to a new file and opens it. */
static st_reader *write_experts_file(experts_file f)
{
    size_t n = (size_t)E * ROWS * K, nb = n / MXFP4_BLOCK;
    float *x = malloc(n * sizeof(float));
    uint8_t *blocks = calloc(nb * MXFP4_BLOCK_BYTES * 2, 1), *scales = calloc(nb * 2, 1);
    fill_random(x, n, 7);
    ct_error err = {0};
    CT_ASSERT(mxfp4_quantize(blocks, scales, x, (size_t)E * ROWS, K, &err) == CT_OK, "%s", err.msg);
    if (f.poke_scale >= 0) scales[f.poke_scale] = 253;
    st_writer *w = st_writer_new();
    if (f.blocks_name) {
        int64_t bytes = 1;
        for (int i = 0; i < f.blocks_ndim; i++) bytes *= f.blocks_shape[i];
        bytes *= (int64_t)ct_dtype_size(f.blocks_dtype);
        CT_ASSERT(bytes <= (int64_t)(nb * MXFP4_BLOCK_BYTES * 2), "case too large");
        CT_ASSERT(st_writer_add(w, f.blocks_name, f.blocks_dtype, f.blocks_ndim, f.blocks_shape, blocks, &err) ==
                  CT_OK, "%s", err.msg);
    }
    if (f.scales_name)
        CT_ASSERT(st_writer_add(w, f.scales_name, CT_DTYPE_U8, f.scales_ndim, f.scales_shape, scales, &err) == CT_OK,
                  "%s", err.msg);
    int64_t one = 1;
    uint8_t pad = 0;
    CT_ASSERT(st_writer_add(w, "model.norm.weight", CT_DTYPE_U8, 1, &one, &pad, &err) == CT_OK, "%s", err.msg);
    char path[128];
    snprintf(path, sizeof path, "%s/%d.safetensors", root_dir, nfiles++);
    CT_ASSERT(st_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    free(x); free(blocks); free(scales);
    st_reader *r = st_open(path, &err);
    CT_ASSERT(r, "%s", err.msg);
    return r;
}

TEST(written_experts_read_back_as_quantized)
{
    size_t n = (size_t)E * ROWS * K, nb = n / MXFP4_BLOCK;
    float *x = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    uint8_t *blocks = malloc(nb * MXFP4_BLOCK_BYTES), *scales = malloc(nb);
    fill_random(x, n, 11);
    ct_error err = {0};
    REQUIRE(mxfp4_quantize(blocks, scales, x, (size_t)E * ROWS, K, &err) == CT_OK, "%s", err.msg);
    mxfp4_dequantize(want, blocks, scales, (size_t)E * ROWS, K);
    st_writer *w = st_writer_new();
    REQUIRE(mxfp4_write_experts(w, GATE_UP, x, E, ROWS, K, &err) == CT_OK, "%s", err.msg);
    char path[128];
    snprintf(path, sizeof path, "%s/%d.safetensors", root_dir, nfiles++);
    REQUIRE(st_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    st_reader *r = st_open(path, &err);
    REQUIRE(r, "%s", err.msg);
    const uint8_t *rb = NULL, *rs = NULL;
    CHECK(mxfp4_is_quantized(r, GATE_UP) && !mxfp4_is_quantized(r, "model.layers.0.mlp.experts.down_proj"),
          "is_quantized");
    REQUIRE(mxfp4_read_experts(r, GATE_UP, E, ROWS, K, &rb, &rs, &err) == CT_OK, "%s", err.msg);
    mxfp4_dequantize(got, rb, rs, (size_t)E * ROWS, K);
    CHECK(memcmp(got, want, n * sizeof(float)) == 0, "read-back values differ from quantize + dequantize");
    st_close(r);
    free(x); free(want); free(got); free(blocks); free(scales);
}

/* Reading the case's GATE_UP as (E, ROWS, k) is CT_ERR_INPUT, one line holding want. */
static void expect_input_error(experts_file f, int64_t k, const char *want)
{
    st_reader *r = write_experts_file(f);
    const uint8_t *b = NULL, *s = NULL;
    ct_error err = {0};
    int rc = mxfp4_read_experts(r, GATE_UP, E, ROWS, k, &b, &s, &err);
    CHECK(rc == CT_ERR_INPUT && b == NULL && s == NULL, "rc %d (want an input error)", rc);
    CHECK(strstr(err.msg, want) && strstr(err.msg, ".safetensors") && !strchr(err.msg, '\n'),
          "message '%s' lacks '%s' or the file", err.msg, want);
    st_close(r);
}

TEST(good_experts_file_reads)
{
    st_reader *r = write_experts_file(good_file());
    const uint8_t *b = NULL, *s = NULL;
    ct_error err = {0};
    CHECK(mxfp4_read_experts(r, GATE_UP, E, ROWS, K, &b, &s, &err) == CT_OK && b && s, "%s", err.msg);
    st_close(r);
}

TEST(missing_blocks_is_an_input_error)
{
    experts_file f = good_file();
    f.blocks_name = NULL;
    expect_input_error(f, K, GATE_UP "_blocks is missing");
}

TEST(missing_scales_is_an_input_error)
{
    experts_file f = good_file();
    f.scales_name = NULL;
    expect_input_error(f, K, GATE_UP "_scales is missing");
}

TEST(blocks_of_another_dtype_are_an_input_error)
{
    experts_file f = good_file();
    f.blocks_dtype = CT_DTYPE_I8;
    expect_input_error(f, K, GATE_UP "_blocks': dtype I8, expected U8");
}

TEST(blocks_with_unpacked_dims_are_an_input_error)
{
    experts_file f = good_file();  /* [E, rows, K/2]: the block dims flattened */
    f.blocks_ndim = 3;
    f.blocks_shape[2] = K / 2;
    expect_input_error(f, K, GATE_UP "_blocks': shape [2, 6, 32] does not match the expected [2, 6, 2, 16]");
}

TEST(blocks_with_rows_and_k_mixed_up_are_an_input_error)
{
    experts_file f = good_file();  /* the same bytes with rows and K/32 reshaped */
    f.blocks_shape[1] = 3;
    f.blocks_shape[2] = 4;
    expect_input_error(f, K, GATE_UP "_blocks': shape [2, 3, 4, 16] does not match");
}

TEST(scales_of_the_wrong_shape_are_an_input_error)
{
    experts_file f = good_file();
    f.scales_shape[2] = 1;
    expect_input_error(f, K, GATE_UP "_scales': shape [2, 6, 1] does not match the expected [2, 6, 2]");
}

TEST(input_features_not_a_multiple_of_32_are_an_input_error)
{
    expect_input_error(good_file(), 48, GATE_UP "_blocks: the config's 48 input features are not a multiple of 32");
}

TEST(scale_that_overflows_bf16_is_an_input_error)
{
    experts_file f = good_file();
    f.poke_scale = 17;
    expect_input_error(f, K, GATE_UP "_scales: element 17 is 253, above 252");
}

/* ---- quantization_config ---- */

/* mxfp4_read_config of TEXT; returns its rc and fills c and err. */
static int read_config(const char *text, mxfp4_config *c, ct_error *err)
{
    json_doc *doc = json_parse(text, strlen(text), "config.json", err);
    CT_ASSERT(doc, "%s", err->msg);
    int rc = mxfp4_read_config(json_root(doc), "config.json", c, err);
    json_free(doc);
    return rc;
}

TEST(written_config_reads_back_as_the_official_one)
{
    json_writer w;
    json_writer_init(&w);
    mxfp4_write_config(&w);
    mxfp4_config c;
    ct_error err = {0};
    REQUIRE(read_config(w.buf, &c, &err) == CT_OK, "%s: %s", w.buf, err.msg);
    CHECK(strstr(w.buf, "\"quant_method\": \"mxfp4\""), "%s", w.buf);
    REQUIRE(c.n_skip == 4, "%d patterns", c.n_skip);
    CHECK(!strcmp(c.skip[0], "model.layers.*.self_attn") && !strcmp(c.skip[1], "model.layers.*.mlp.router") &&
          !strcmp(c.skip[2], "model.embed_tokens") && !strcmp(c.skip[3], "lm_head"), "patterns");
    json_writer_free(&w);
}

TEST(official_config_converts_only_the_experts)
{
    mxfp4_config c;
    ct_error err = {0};
    REQUIRE(read_config("{\"modules_to_not_convert\": [\"model.layers.*.self_attn\", \"model.layers.*.mlp.router\", "
                        "\"model.embed_tokens\", \"lm_head\"], \"quant_method\": \"mxfp4\"}", &c, &err) == CT_OK,
            "%s", err.msg);
    CHECK(mxfp4_converts(&c, "model.layers.0.mlp.experts"), "layer 0 experts");
    CHECK(mxfp4_converts(&c, "model.layers.23.mlp.experts"), "layer 23 experts");
    CHECK(!mxfp4_converts(&c, "model.layers.3.self_attn"), "attention");
    CHECK(!mxfp4_converts(&c, "model.layers.3.mlp.router"), "router");
    CHECK(!mxfp4_converts(&c, "lm_head") && !mxfp4_converts(&c, "model.embed_tokens"), "embeddings, lm_head");
}

/* HF reads a pattern as a regex anchored at the start, or as a suffix: "1"
 * would match layer 1 only through a prefix such as model.layers.1. */
TEST(skipped_layer_keeps_its_experts_bf16)
{
    mxfp4_config c;
    ct_error err = {0};
    REQUIRE(read_config("{\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": [\"model.layers.1.mlp\", "
                        "\"experts_x\"]}", &c, &err) == CT_OK, "%s", err.msg);
    CHECK(!mxfp4_converts(&c, "model.layers.1.mlp.experts"), "layer 1 is skipped");
    CHECK(mxfp4_converts(&c, "model.layers.10.mlp.experts"), "layer 10 is not");
    CHECK(!mxfp4_converts(&c, "model.layers.4.mlp.experts_x"), "suffix match");
    REQUIRE(read_config("{\"quant_method\": \"mxfp4\"}", &c, &err) == CT_OK, "%s", err.msg);
    CHECK(c.n_skip == 0 && mxfp4_converts(&c, "model.layers.0.mlp.experts"), "no list: everything converts");
}

/* Backtracking took exponential time on starred atoms that fail: 60 of them
 * against a module name ran for ages; each is one step per character now. */
TEST(many_starred_atoms_match_in_linear_time)
{
    char text[256], pattern[128] = "";
    for (int i = 0; i < 60; i++) strcat(pattern, ".*");
    mxfp4_config c;
    ct_error err = {0};
    strcat(pattern, "z");
    snprintf(text, sizeof text, "{\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": [\"%s\"]}", pattern);
    REQUIRE(read_config(text, &c, &err) == CT_OK, "%s", err.msg);
    CHECK(mxfp4_converts(&c, "model.layers.0.mlp.experts"), "no 'z' in the name: it converts");
    CHECK(!mxfp4_converts(&c, "model.layers.0.mlp.experts.z"), "a 'z' in it: skipped");
}

TEST(other_quant_method_is_an_input_error)
{
    mxfp4_config c;
    ct_error err = {0};
    CHECK(read_config("{\"quant_method\": \"bitsandbytes\"}", &c, &err) == CT_ERR_INPUT, "accepted");
    CHECK(strstr(err.msg, "quant_method is \"bitsandbytes\", expected \"mxfp4\""), "message: %s", err.msg);
    CHECK(read_config("{\"modules_to_not_convert\": []}", &c, &err) == CT_ERR_INPUT, "accepted a missing method");
    CHECK(strstr(err.msg, "quant_method is missing"), "message: %s", err.msg);
    CHECK(read_config("{\"quant_method\": \"mx\\nfp4\"}", &c, &err) == CT_ERR_INPUT, "accepted a line break");
    CHECK(strstr(err.msg, "quant_method is \"mx?fp4\"") && !strchr(err.msg, '\n'), "message: %s", err.msg);
}

TEST(malformed_modules_to_not_convert_is_an_input_error)
{
    static const char *bad[] = {
        "{\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": \"lm_head\"}",
        "{\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": [\"lm_head\", 3]}",
        "{\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": [\"model.(layers)\"]}",
        "{\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": [\"*.experts\"]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mxfp4_config c;
        ct_error err = {0};
        CHECK(read_config(bad[i], &c, &err) == CT_ERR_INPUT, "accepted %s", bad[i]);
        CHECK(strstr(err.msg, "config.json: quantization_config: modules_to_not_convert"), "message: %s", err.msg);
    }
}

/* ---- --convert: an MXFP4 gpt_oss folder for scripts/check_mxfp4_folder.py ---- */

static int fail(const ct_error *err)
{
    fprintf(stderr, "error: %s\n", err->msg);
    return 2;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int convert(const char *src, const char *dst, const char *expected_path)
{
    ct_error err = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", src);
    size_t len = 0;
    char *text = ct_read_file(path, &len, &err);
    if (!text) return fail(&err);
    char *end = strrchr(text, '}');
    if (!end) { fprintf(stderr, "error: %s: not a JSON object\n", path); return 2; }
    st_reader *r = st_open(src, &err);
    if (!r) return fail(&err);
    if (ct_mkdirs(dst, &err)) return fail(&err);
    st_writer *w = st_writer_new();
    int rc = CT_OK;
    for (size_t i = 0; i < st_count(r) && !rc; i++) {
        const st_tensor *t = st_at(r, i);
        if (!ends_with(t->name, ".mlp.experts.gate_up_proj") && !ends_with(t->name, ".mlp.experts.down_proj")) {
            rc = st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, &err);
            continue;
        }
        /* HF's bf16 layout [E, K, rows] into ctune's (E, rows, K) */
        if (t->dtype != CT_DTYPE_BF16 || t->ndim != 3) {
            fprintf(stderr, "error: %s: tensor %s: expected BF16 [E, K, rows]\n", t->file, t->name);
            return 2;
        }
        int64_t e = t->shape[0], k = t->shape[1], rows = t->shape[2];
        float *x = malloc(t->numel * sizeof(float));
        const uint16_t *h = t->data;
        for (int64_t a = 0; a < e; a++)
            for (int64_t c = 0; c < k; c++)
                for (int64_t b = 0; b < rows; b++) {
                    uint16_t v;
                    memcpy(&v, h + (size_t)((a * k + c) * rows + b), 2);
                    x[(size_t)((a * rows + b) * k + c)] = ct_bf16_to_f32(v);
                }
        rc = mxfp4_write_experts(w, t->name, x, e, rows, k, &err);
        free(x);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    if (!rc) rc = st_writer_save(w, path, &err);
    st_writer_free(w);
    if (rc) return fail(&err);

    json_writer cfg;
    json_writer_init(&cfg);
    json_write_rawf(&cfg, "%.*s,\n  \"quantization_config\": ", (int)(end - text), text);
    mxfp4_write_config(&cfg);
    json_write_raw(&cfg, "\n}\n");
    snprintf(path, sizeof path, "%s/config.json", dst);
    rc = ct_write_file_atomic(path, cfg.buf, cfg.len, &err);
    json_writer_free(&cfg);
    free(text);
    if (rc) return fail(&err);

    /* what ctune reads back from DST */
    st_reader *q = st_open(dst, &err);
    if (!q) return fail(&err);
    st_writer *ex = st_writer_new();
    for (size_t i = 0; i < st_count(r) && !rc; i++) {
        const st_tensor *t = st_at(r, i);
        if (!ends_with(t->name, ".mlp.experts.gate_up_proj") && !ends_with(t->name, ".mlp.experts.down_proj"))
            continue;
        int64_t shape[3] = {t->shape[0], t->shape[2], t->shape[1]};
        const uint8_t *b, *s;
        rc = mxfp4_read_experts(q, t->name, shape[0], shape[1], shape[2], &b, &s, &err);
        if (rc) break;
        float *y = malloc(t->numel * sizeof(float));
        mxfp4_dequantize(y, b, s, (size_t)(shape[0] * shape[1]), (size_t)shape[2]);
        rc = st_writer_add(ex, t->name, CT_DTYPE_F32, 3, shape, y, &err);
        free(y);
    }
    if (!rc) rc = st_writer_save(ex, expected_path, &err);
    st_writer_free(ex);
    st_close(q);
    st_close(r);
    if (rc) return fail(&err);
    printf("wrote %s and %s\n", dst, expected_path);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--convert") == 0) return convert(argv[2], argv[3], argv[4]);
    if (argc != 1) {
        fprintf(stderr, "usage: test_mxfp4 [--convert SRC DST EXPECTED]\n");
        return 2;
    }
    ct_error err = {0};
    fixtures = st_open(FIXTURES, &err);
    if (!fixtures) {
        printf("FAIL fixtures: %s (run from the repo root)\n", err.msg);
        return 1;
    }
    snprintf(root_dir, sizeof root_dir, "/tmp/ctune_mxfp4_XXXXXX");
    CT_ASSERT(mkdtemp(root_dir) != NULL, "mkdtemp failed");

    RUN(code_book_is_e2m1);
    RUN(dequantize_matches_transformers_bit_for_bit);
    RUN(dequantized_values_are_exact_in_bf16);
    RUN(quantize_matches_the_reference_byte_for_byte);
    RUN(quantize_round_trip_is_within_half_a_code_step);
    RUN(quantize_rejects_non_finite_input);
    RUN(quantize_names_the_first_bad_block_of_many);
    RUN(quantize_rejects_a_block_that_would_overflow_bf16);
    RUN(written_experts_read_back_as_quantized);
    RUN(good_experts_file_reads);
    RUN(missing_blocks_is_an_input_error);
    RUN(missing_scales_is_an_input_error);
    RUN(blocks_of_another_dtype_are_an_input_error);
    RUN(blocks_with_unpacked_dims_are_an_input_error);
    RUN(blocks_with_rows_and_k_mixed_up_are_an_input_error);
    RUN(scales_of_the_wrong_shape_are_an_input_error);
    RUN(input_features_not_a_multiple_of_32_are_an_input_error);
    RUN(scale_that_overflows_bf16_is_an_input_error);
    RUN(written_config_reads_back_as_the_official_one);
    RUN(official_config_converts_only_the_experts);
    RUN(skipped_layer_keeps_its_experts_bf16);
    RUN(many_starred_atoms_match_in_linear_time);
    RUN(other_quant_method_is_an_input_error);
    RUN(malformed_modules_to_not_convert_is_an_input_error);

    for (int i = 0; i < nfiles; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%d.safetensors", root_dir, i);
        unlink(path);
    }
    rmdir(root_dir);
    st_close(fixtures);
    return check_summary();
}
