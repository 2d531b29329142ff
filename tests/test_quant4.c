/* test_quant4.c — bitsandbytes NF4/FP4 on the CPU (src/formats/quant4.h) against
 * what bitsandbytes 0.50.2 itself wrote: tests/fixtures/quant4, made by
 * scripts/quant4_fixtures.py (which lists every tensor). Codes, absmax and the
 * double-quantized stats must match byte for byte, dequantized values exactly.
 * Malformed Linear4bit checkpoints are the fixture's tensors rewritten with one
 * thing wrong, each in a fresh file. */
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "quant4.h"

#define FIXTURES "tests/fixtures/quant4"
#define DOWN "model.layers.0.mlp.down_proj.weight"
#define QPROJ "model.layers.0.self_attn.q_proj.weight"

/* The CASES of scripts/quant4_fixtures.py. */
static const struct {
    const char *name, *input;
    quant4_type type;
    size_t blocksize;
    bool dq;
} cases[] = {
    {"nf4.bs64", "x.small", QUANT4_NF4, 64, false},     {"nf4.bs64.dq", "x.small", QUANT4_NF4, 64, true},
    {"nf4.bs128", "x.small", QUANT4_NF4, 128, false},   {"nf4.bs128.dq", "x.small", QUANT4_NF4, 128, true},
    {"fp4.bs64", "x.small", QUANT4_FP4, 64, false},     {"fp4.bs64.dq", "x.small", QUANT4_FP4, 64, true},
    {"fp4.bs128", "x.small", QUANT4_FP4, 128, false},   {"fp4.bs128.dq", "x.small", QUANT4_FP4, 128, true},
    {"nf4.ties", "x.ties", QUANT4_NF4, 64, false},      {"fp4.ties.dq", "x.ties", QUANT4_FP4, 64, true},
    {"nf4.divide", "x.divide", QUANT4_NF4, 64, false},  {"fp4.divide", "x.divide", QUANT4_FP4, 64, false},
    {"nf4.large.dq", "x.large", QUANT4_NF4, 64, true},
};
#define NCASES (sizeof cases / sizeof cases[0])

static st_reader *fixtures, *linear, *linear_expected;

static const st_tensor *fx(const st_reader *r, const char *name, const char *suffix)
{
    char key[256];
    snprintf(key, sizeof key, "%s%s", name, suffix);
    const st_tensor *t = st_find(r, key);
    CT_ASSERT(t, "fixture tensor %s is missing (rerun scripts/quant4_fixtures.py)", key);
    return t;
}

/* A tensor's values as fp32 (F32 or BF16), in a new buffer. */
static float *as_f32(const st_tensor *t)
{
    float *v = malloc(t->numel * sizeof(float));
    if (t->dtype == CT_DTYPE_F32) {
        memcpy(v, t->data, t->numel * sizeof(float));
    } else {
        CT_ASSERT(t->dtype == CT_DTYPE_BF16, "%s: unexpected dtype", t->name);
        for (size_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * i, 2);
            v[i] = ct_bf16_to_f32(h);
        }
    }
    return v;
}

/* Index of the first differing byte, or -1. */
static long first_diff(const void *a, const void *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (((const uint8_t *)a)[i] != ((const uint8_t *)b)[i]) return (long)i;
    return -1;
}

/* The case's input quantized by quant4 (packed, absmax), as bnb would. */
static void quantize_case(size_t c, float **x, uint8_t **packed, float **absmax, size_t *n)
{
    const st_tensor *xt = fx(fixtures, cases[c].input, "");
    *n = xt->numel;
    *x = as_f32(xt);
    *packed = malloc(quant4_packed_bytes(*n));
    *absmax = malloc(quant4_num_blocks(*n, cases[c].blocksize) * sizeof(float));
    ct_error err = {0};
    CT_ASSERT(quant4_quantize(*packed, *absmax, *x, *n, cases[c].blocksize, cases[c].type, &err) == CT_OK, "%s",
              err.msg);
}

TEST(code_books_are_bnbs)
{
    const st_tensor *nf4 = fx(linear, DOWN, ".quant_map"), *fp4 = fx(linear, QPROJ, ".quant_map");
    const st_tensor *dyn = fx(linear, DOWN, ".nested_quant_map");
    CHECK(first_diff(quant4_code(QUANT4_NF4), nf4->data, 64) < 0, "nf4 code book differs from bnb's");
    CHECK(first_diff(quant4_dynamic_map(), dyn->data, 1024) < 0, "dynamic map differs from bnb's");
    float want[16];
    memcpy(want, fp4->data, sizeof want);
    for (int i = 0; i < 16; i++)  /* code 8 is -0.0 here, +0.0 in get_4bit_type: equal values */
        CHECK(quant4_code(QUANT4_FP4)[i] == want[i], "fp4 code %d: %g, bnb %g", i, quant4_code(QUANT4_FP4)[i], want[i]);
    CHECK(signbit(quant4_code(QUANT4_FP4)[8]), "fp4 code 8 decodes as -0.0, as bnb's kernels do");
}

TEST(quantize_matches_bnb_byte_for_byte)
{
    for (size_t c = 0; c < NCASES; c++) {
        float *x, *absmax;
        uint8_t *packed;
        size_t n;
        quantize_case(c, &x, &packed, &absmax, &n);
        const st_tensor *wp = fx(fixtures, cases[c].name, ".packed"), *wa = fx(fixtures, cases[c].name, ".absmax");
        size_t nb = quant4_num_blocks(n, cases[c].blocksize);
        CHECK(wp->nbytes == quant4_packed_bytes(n) && wa->numel == nb, "%s: fixture sizes", cases[c].name);
        long d = first_diff(packed, wp->data, wp->nbytes);
        CHECK(d < 0, "%s: packed byte %ld is %02x, bnb %02x", cases[c].name, d, d < 0 ? 0 : packed[d],
              d < 0 ? 0 : ((const uint8_t *)wp->data)[d]);
        d = first_diff(absmax, wa->data, nb * sizeof(float));
        CHECK(d < 0, "%s: absmax[%ld] differs from bnb's", cases[c].name, d / 4);
        free(x); free(packed); free(absmax);
    }
}

TEST(double_quant_matches_bnb_byte_for_byte)
{
    for (size_t c = 0; c < NCASES; c++) {
        if (!cases[c].dq) continue;
        float *x, *absmax;
        uint8_t *packed;
        size_t n;
        quantize_case(c, &x, &packed, &absmax, &n);
        size_t nb = quant4_num_blocks(n, cases[c].blocksize), nn = ct_ceil_div(nb, QUANT4_NESTED_BLOCKSIZE);
        uint8_t *q8 = malloc(nb);
        float *nested = malloc(nn * sizeof(float)), *decoded = malloc(nb * sizeof(float)), offset;
        quant4_double_quantize(q8, nested, &offset, absmax, nb);
        quant4_double_dequantize(decoded, q8, nested, quant4_dynamic_map(), offset, nb);
        const char *name = cases[c].name;
        CHECK(first_diff(&offset, fx(fixtures, name, ".offset")->data, 4) < 0, "%s: offset %.9g differs from bnb's",
              name, offset);
        long d = first_diff(q8, fx(fixtures, name, ".q8")->data, nb);
        CHECK(d < 0, "%s: q8[%ld] is %d, bnb %d", name, d, d < 0 ? 0 : q8[d],
              d < 0 ? 0 : ((const uint8_t *)fx(fixtures, name, ".q8")->data)[d]);
        CHECK(fx(fixtures, name, ".nested_absmax")->numel == nn, "%s: %zu nested blocks", name, nn);
        CHECK(first_diff(nested, fx(fixtures, name, ".nested_absmax")->data, nn * 4) < 0, "%s: nested_absmax", name);
        d = first_diff(decoded, fx(fixtures, name, ".absmax_decoded")->data, nb * 4);
        CHECK(d < 0, "%s: decoded absmax[%ld] differs from bnb's", name, d / 4);
        free(x); free(packed); free(absmax); free(q8); free(nested); free(decoded);
    }
}

/* bnb's 8-bit kernel rounds through a 65536-point grid, not to the nearest
 * map value: x.dynamic holds values where the two differ. */
TEST(dynamic_quantize_matches_bnb_byte_for_byte)
{
    const st_tensor *xt = fx(fixtures, "x.dynamic", ""), *wq = fx(fixtures, "dynamic.q8", "");
    const st_tensor *wa = fx(fixtures, "dynamic.absmax", "");
    size_t n = xt->numel, nb = ct_ceil_div(n, QUANT4_NESTED_BLOCKSIZE);
    REQUIRE(wq->numel == n && wa->numel == nb, "fixture sizes");
    float *x = as_f32(xt), *absmax = malloc(nb * sizeof(float));
    uint8_t *q8 = malloc(n);
    quant4_quantize_dynamic(q8, absmax, x, n);
    long d = first_diff(q8, wq->data, n);
    CHECK(d < 0, "q8[%ld] = %d, bnb %d (x %.9g)", d, d < 0 ? 0 : q8[d], d < 0 ? 0 : ((const uint8_t *)wq->data)[d],
          d < 0 ? 0.0 : x[d]);
    CHECK(first_diff(absmax, wa->data, nb * 4) < 0, "absmax differs from bnb's");
    free(x); free(absmax); free(q8);
}

/* bnb's y is F32 for fp32 inputs and BF16 (its rounding of the same fp32
 * product) for the bf16 one; 0.0 and -0.0 compare equal (bnb's torch path
 * decodes FP4 code 8 as +0.0, its C++ one as -0.0). */
TEST(dequantize_matches_bnb)
{
    for (size_t c = 0; c < NCASES; c++) {
        const char *name = cases[c].name;
        const st_tensor *yt = fx(fixtures, name, ".y");
        size_t n = yt->numel, nb = quant4_num_blocks(n, cases[c].blocksize);
        const st_tensor *at = fx(fixtures, name, cases[c].dq ? ".absmax_decoded" : ".absmax");
        float *absmax = as_f32(at), *want = as_f32(yt), *y = malloc(n * sizeof(float));
        REQUIRE(at->numel == nb, "%s: absmax size", name);
        quant4_dequantize(y, fx(fixtures, name, ".packed")->data, absmax, n, cases[c].blocksize, cases[c].type);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++) {
            float got = yt->dtype == CT_DTYPE_BF16 ? ct_bf16_to_f32(ct_f32_to_bf16(y[i])) : y[i];
            if (!(got == want[i]) && bad++ == 0) first = i;
        }
        CHECK(bad == 0, "%s: %zu of %zu values differ, first [%zu] %.9g vs bnb %.9g", name, bad, n, first, y[first],
              want[first]);
        free(absmax); free(want); free(y);
    }
}

TEST(quantize_rejects_non_finite_input)
{
    float x[70] = {0};
    x[67] = NAN;
    uint8_t packed[35];
    float absmax[2];
    ct_error err = {0};
    CHECK(quant4_quantize(packed, absmax, x, 70, 64, QUANT4_NF4, &err) == CT_ERR_INPUT, "NaN quantized");
    CHECK(strstr(err.msg, "element 67"), "message: %s", err.msg);
}

TEST(linear4bit_checkpoint_dequantizes_like_bnb)
{
    const char *names[2] = {DOWN, QPROJ};
    for (int k = 0; k < 2; k++) {
        quant4_info info;
        float *y = NULL;
        ct_error err = {0};
        CHECK(quant4_is_quantized(linear, names[k]), "%s is a 4-bit weight", names[k]);
        REQUIRE(quant4_load_f32(linear, names[k], &info, &y, &err) == CT_OK, "%s", err.msg);
        const st_tensor *want = fx(linear_expected, names[k], "");
        REQUIRE(info.numel == want->numel, "%s: %zu elements, bnb %zu", names[k], info.numel, want->numel);
        long d = first_diff(y, want->data, info.numel * 4);
        CHECK(d < 0, "%s: element %ld differs from bnb's dequantize_4bit", names[k], d / 4);
        free(y);
    }
    quant4_info a, b;
    ct_error err = {0};
    REQUIRE(quant4_read_info(linear, DOWN, &a, &err) == CT_OK && quant4_read_info(linear, QPROJ, &b, &err) == CT_OK,
            "%s", err.msg);
    CHECK(a.type == QUANT4_NF4 && a.blocksize == 64 && a.nested && a.ndim == 2 && a.shape[0] == 24 &&
          a.shape[1] == 100 && strcmp(a.dtype, "bfloat16") == 0, "down_proj info");
    CHECK(b.type == QUANT4_FP4 && b.blocksize == 128 && !b.nested && b.shape[0] == 16 && b.shape[1] == 70 &&
          strcmp(b.dtype, "float32") == 0, "q_proj info");
}

TEST(plain_tensor_is_not_quantized)
{
    quant4_info info;
    ct_error err = {0};
    CHECK(!quant4_is_quantized(linear, "model.embed_tokens.weight"), "embed_tokens is bf16");
    CHECK(quant4_read_info(linear, "model.embed_tokens.weight", &info, &err) == CT_ERR_INPUT, "read_info accepted it");
    CHECK(strstr(err.msg, "not a bitsandbytes 4-bit weight"), "message: %s", err.msg);
}

/* ---- malformed checkpoints ---- */

static char root_dir[64];
static int nfiles;

typedef struct edit {
    const char *name;        /* the tensor to change */
    bool drop;               /* leave it out */
    const char *json;        /* new bytes for a quant_state tensor */
    long numel;              /* keep only this many elements (>= 0) */
    int poke;                /* element to overwrite with poke_value, or -1 */
    float poke_value;
} edit;

/* SRC with one edit, saved to a new file and opened. */
static st_reader *edited_from(const st_reader *src, edit e)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%d.safetensors", root_dir, nfiles++);
    st_writer *w = st_writer_new();
    ct_error err = {0};
    for (size_t i = 0; i < st_count(src); i++) {
        const st_tensor *t = st_at(src, i);
        if (strcmp(t->name, e.name) != 0) {
            CT_ASSERT(st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, &err) == CT_OK, "%s", err.msg);
            continue;
        }
        if (e.drop) continue;
        if (e.json) {
            int64_t len = (int64_t)strlen(e.json);
            CT_ASSERT(st_writer_add(w, t->name, CT_DTYPE_U8, 1, &len, e.json, &err) == CT_OK, "%s", err.msg);
            continue;
        }
        char *data = malloc(t->nbytes);
        memcpy(data, t->data, t->nbytes);
        if (e.poke >= 0) memcpy(data + 4 * e.poke, &e.poke_value, 4);
        int64_t shape[1] = {e.numel >= 0 ? e.numel : (int64_t)t->numel};
        CT_ASSERT(st_writer_add(w, t->name, t->dtype, 1, shape, data, &err) == CT_OK, "%s", err.msg);
        free(data);
    }
    CT_ASSERT(st_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    st_reader *r = st_open(path, &err);
    CT_ASSERT(r, "%s", err.msg);
    return r;
}

/* linear4bit.safetensors with one edit. */
static st_reader *edited(edit e) { return edited_from(linear, e); }

/* Loading WEIGHT from R (then closed) is CT_ERR_INPUT with a message holding
 * want; what names the edit. */
static void expect_load_error(st_reader *r, const char *what, const char *weight, const char *want)
{
    quant4_info info;
    float *y = (float *)1;
    ct_error err = {0};
    int rc = quant4_load_f32(r, weight, &info, &y, &err);
    CHECK(rc == CT_ERR_INPUT && y == NULL, "%s: rc %d (want an input error)", what, rc);
    CHECK(strstr(err.msg, want) && !strchr(err.msg, '\n'), "%s: message '%s' lacks '%s'", what, err.msg, want);
    st_close(r);
}

static void expect_input_error(edit e, const char *weight, const char *want)
{
    expect_load_error(edited(e), e.name, weight, want);
}

#define NO_EDIT .numel = -1, .poke = -1
#define DOWN_STATE DOWN ".quant_state.bitsandbytes__nf4"
#define QPROJ_STATE QPROJ ".quant_state.bitsandbytes__fp4"

TEST(missing_quant_state_is_an_input_error)
{
    expect_input_error((edit){.name = DOWN_STATE, .drop = true, NO_EDIT}, DOWN, "not a bitsandbytes 4-bit weight");
}

TEST(unknown_quant_type_is_an_input_error)
{
    expect_input_error((edit){.name = QPROJ_STATE, NO_EDIT,
                              .json = "{\"quant_type\": \"int4\", \"blocksize\": 128, \"dtype\": \"float32\", "
                                      "\"shape\": [16, 70]}"},
                       QPROJ, "unknown quant_type 'int4'");
}

TEST(quant_type_with_a_line_break_is_quoted_on_one_line)
{
    expect_input_error((edit){.name = QPROJ_STATE, NO_EDIT,
                              .json = "{\"quant_type\": \"fp4\\nnf4\", \"blocksize\": 128, \"dtype\": \"float32\", "
                                      "\"shape\": [16, 70]}"},
                       QPROJ, "unknown quant_type 'fp4?nf4'");
}

TEST(quant_type_must_match_the_key)
{
    expect_input_error((edit){.name = QPROJ_STATE, NO_EDIT,
                              .json = "{\"quant_type\": \"nf4\", \"blocksize\": 128, \"dtype\": \"float32\", "
                                      "\"shape\": [16, 70]}"},
                       QPROJ, "does not match");
}

TEST(invalid_blocksize_is_an_input_error)
{
    expect_input_error((edit){.name = QPROJ_STATE, NO_EDIT,
                              .json = "{\"quant_type\": \"fp4\", \"blocksize\": 48, \"dtype\": \"float32\", "
                                      "\"shape\": [16, 70]}"},
                       QPROJ, "blocksize 48");
}

TEST(broken_quant_state_json_is_an_input_error)
{
    expect_input_error((edit){.name = QPROJ_STATE, NO_EDIT, .json = "{\"quant_type\": \"fp4\", "}, QPROJ, QPROJ_STATE);
}

TEST(shape_that_disagrees_with_the_packed_bytes_is_an_input_error)
{
    expect_input_error((edit){.name = QPROJ_STATE, NO_EDIT,
                              .json = "{\"quant_type\": \"fp4\", \"blocksize\": 128, \"dtype\": \"float32\", "
                                      "\"shape\": [16, 72]}"},
                       QPROJ, "needs 576 packed bytes");
}

TEST(short_packed_weight_is_an_input_error)
{
    expect_input_error((edit){.name = DOWN, .numel = 1199, .poke = -1}, DOWN, "1199 bytes");
}

TEST(wrong_absmax_size_is_an_input_error)
{
    expect_input_error((edit){.name = DOWN ".absmax", .numel = 37, .poke = -1}, DOWN,
                       DOWN ".absmax: U8 with 37 elements, expected U8 with 38");
}

TEST(missing_nested_absmax_is_an_input_error)
{
    expect_input_error((edit){.name = DOWN ".nested_absmax", .drop = true, NO_EDIT}, DOWN,
                       DOWN ".nested_absmax is missing");
}

TEST(foreign_quant_map_is_an_input_error)
{
    expect_input_error((edit){.name = QPROJ ".quant_map", .numel = -1, .poke = 5, .poke_value = 0.75f}, QPROJ,
                       "not the fp4 code book");
}

TEST(negative_absmax_is_an_input_error)
{
    expect_input_error((edit){.name = QPROJ ".absmax", .numel = -1, .poke = 2, .poke_value = -1.0f}, QPROJ,
                       QPROJ ".absmax: element 2 is -1");
}

TEST(double_quant_stats_whose_product_overflows_fp32_are_an_input_error)
{
    /* each stored value finite; block 0 decodes to map[q] x nested_absmax[0] + offset = 1e60 */
    int q = ((const uint8_t *)fx(linear, DOWN, ".absmax")->data)[0];
    st_reader *big = edited((edit){.name = DOWN ".nested_absmax", .numel = -1, .poke = 0, .poke_value = 1e30f});
    st_reader *r = edited_from(big, (edit){.name = DOWN ".nested_quant_map", .numel = -1, .poke = q,
                                           .poke_value = 1e30f});
    st_close(big);
    expect_load_error(r, DOWN ".nested_quant_map", DOWN, DOWN ".absmax: block 0 decodes to inf");
}

int main(void)
{
    ct_error err = {0};
    fixtures = st_open(FIXTURES "/cases.safetensors", &err);
    if (fixtures) linear = st_open(FIXTURES "/linear4bit.safetensors", &err);
    if (linear) linear_expected = st_open(FIXTURES "/linear4bit_expected.safetensors", &err);
    if (!linear_expected) {
        printf("FAIL fixtures: %s (run from the repo root)\n", err.msg);
        return 1;
    }
    snprintf(root_dir, sizeof root_dir, "/tmp/ctune_quant4_XXXXXX");
    CT_ASSERT(mkdtemp(root_dir) != NULL, "mkdtemp failed");

    RUN(code_books_are_bnbs);
    RUN(quantize_matches_bnb_byte_for_byte);
    RUN(dynamic_quantize_matches_bnb_byte_for_byte);
    RUN(double_quant_matches_bnb_byte_for_byte);
    RUN(dequantize_matches_bnb);
    RUN(quantize_rejects_non_finite_input);
    RUN(linear4bit_checkpoint_dequantizes_like_bnb);
    RUN(plain_tensor_is_not_quantized);
    RUN(missing_quant_state_is_an_input_error);
    RUN(unknown_quant_type_is_an_input_error);
    RUN(quant_type_with_a_line_break_is_quoted_on_one_line);
    RUN(quant_type_must_match_the_key);
    RUN(invalid_blocksize_is_an_input_error);
    RUN(broken_quant_state_json_is_an_input_error);
    RUN(shape_that_disagrees_with_the_packed_bytes_is_an_input_error);
    RUN(short_packed_weight_is_an_input_error);
    RUN(wrong_absmax_size_is_an_input_error);
    RUN(missing_nested_absmax_is_an_input_error);
    RUN(foreign_quant_map_is_an_input_error);
    RUN(negative_absmax_is_an_input_error);
    RUN(double_quant_stats_whose_product_overflows_fp32_are_an_input_error);

    for (int i = 0; i < nfiles; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%d.safetensors", root_dir, i);
        unlink(path);
    }
    rmdir(root_dir);
    st_close(fixtures);
    st_close(linear);
    st_close(linear_expected);
    return check_summary();
}
