/* test_quant4_write.c — writing bitsandbytes 4-bit weights (src/formats/
 * quant4_write.h): what quant4_write_add writes reads back through quant4.h
 * as the same codes and values, reproduces the Linear4bit tensors that
 * bitsandbytes itself saved (tests/fixtures/quant4/write.safetensors, made by
 * scripts/quant4_write_fixtures.py) byte for byte, quant_state JSON included, and the config.json text keeps every input byte.
 * tests/quantize.test.sh checks whole folders against transformers. */
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "json.h"
#include "quant4_write.h"

#define FIXTURES "tests/fixtures/quant4"

static char root_dir[64];
static int nfiles;

/* Saves w to a fresh file and opens it. */
static st_reader *save_and_open(st_writer *w)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%d.safetensors", root_dir, nfiles++);
    ct_error err = {0};
    if (st_writer_save(w, path, &err) != CT_OK) {
        printf("     save: %s\n", err.msg);
        return NULL;
    }
    st_reader *r = st_open(path, &err);
    if (!r) printf("     open: %s\n", err.msg);
    return r;
}

/* bf16-rounded N(0, 0.05)-ish values from a fixed seed. */
static float *random_weights(size_t n, uint64_t seed)
{
    float *x = ct_malloc(n * sizeof *x);
    ct_rng r;
    ct_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = ct_bf16_to_f32(ct_f32_to_bf16(0.05f * ct_rng_normal(&r)));
    return x;
}

static bool same_tensor(const st_tensor *a, const st_tensor *b)
{
    if (!a || !b || a->dtype != b->dtype || a->ndim != b->ndim || a->nbytes != b->nbytes) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return memcmp(a->data, b->data, a->nbytes) == 0;
}

/* Writes one weight of each option set, reads it back with quant4_load_f32 and
 * compares with quant4_quantize + quant4_dequantize run directly. */
static void round_trip(quant4_type type, size_t blocksize, bool dq, int64_t rows, int64_t cols)
{
    quant4_write_opts o = {type, blocksize, dq};
    size_t n = (size_t)(rows * cols), nb = quant4_num_blocks(n, blocksize);
    float *x = random_weights(n, (uint64_t)(rows * 7 + cols));
    st_writer *w = st_writer_new();
    ct_error err = {0};
    int64_t shape[2] = {rows, cols};
    size_t bytes = 0;
    int rc = quant4_write_add(w, "m.proj.weight", x, 2, shape, &o, &bytes, &err);
    CHECK(rc == CT_OK, "%s", err.msg);
    st_reader *r = save_and_open(w);
    st_writer_free(w);
    REQUIRE(r != NULL, "cannot read it back");
    CHECK(quant4_is_quantized(r, "m.proj.weight"), "not detected as a 4-bit weight");
    quant4_info info;
    float *y = NULL;
    rc = quant4_load_f32(r, "m.proj.weight", &info, &y, &err);
    CHECK(rc == CT_OK, "%s", err.msg);
    CHECK(info.type == type && info.blocksize == blocksize && info.nested == dq && info.ndim == 2 &&
          info.shape[0] == rows && info.shape[1] == cols && info.numel == n && !strcmp(info.dtype, "bfloat16"),
          "quant_state read back wrong");

    uint8_t *packed = ct_malloc(quant4_packed_bytes(n));
    float *absmax = ct_malloc(nb * sizeof(float)), *want = ct_malloc(n * sizeof(float));
    quant4_quantize(packed, absmax, x, n, blocksize, type, NULL);
    CHECK(!memcmp(st_find(r, "m.proj.weight")->data, packed, quant4_packed_bytes(n)), "packed codes differ");
    if (dq) {
        uint8_t *q8 = ct_malloc(nb);
        float *nested = ct_malloc(ct_ceil_div(nb, 256) * sizeof(float)), offset;
        quant4_double_quantize(q8, nested, &offset, absmax, nb);
        CHECK(info.offset == offset, "nested_offset %.9g read back as %.9g", offset, info.offset);
        quant4_double_dequantize(absmax, q8, nested, quant4_dynamic_map(), offset, nb);
        free(q8);
        free(nested);
    }
    quant4_dequantize(want, packed, absmax, n, blocksize, type);
    size_t diff = 0;
    for (size_t i = 0; i < n && y; i++) diff += !(y[i] == want[i]);
    CHECK(y && diff == 0, "%zu of %zu dequantized values differ", diff, n);
    /* 4 bits keep a weight to within a code step of its block's absmax */
    CHECK(y && check_l2_rel_err(y, x, n) < 0.15, "relative error %g", y ? check_l2_rel_err(y, x, n) : 0.0);
    size_t total = 0;
    for (size_t i = 0; i < st_count(r); i++) total += st_at(r, i)->nbytes;
    CHECK(bytes == total, "reported %zu bytes, wrote %zu", bytes, total);
    free(packed);
    free(absmax);
    free(want);
    free(y);
    free(x);
    st_close(r);
}

TEST(nf4_double_quant_round_trips) { round_trip(QUANT4_NF4, 64, true, 96, 200); }
TEST(nf4_plain_round_trips) { round_trip(QUANT4_NF4, 64, false, 64, 130); }
TEST(fp4_double_quant_round_trips) { round_trip(QUANT4_FP4, 128, true, 33, 70); }
TEST(fp4_plain_round_trips) { round_trip(QUANT4_FP4, 32, false, 1, 129); }
/* past the parallel piece size (2^20), with an odd element count and a short last block */
TEST(large_tensor_in_parallel_round_trips) { round_trip(QUANT4_NF4, 64, true, 1031, 1029); }

/* The CASES of scripts/quant4_write_fixtures.py: every tensor bnb saved for a
 * bf16 weight, JSON blob included, must come out byte for byte. */
static const struct {
    const char *prefix;
    quant4_type type;
    size_t blocksize;
    bool dq;
} write_cases[] = {
    {"nf4.dq", QUANT4_NF4, 64, true},  {"nf4.bs128", QUANT4_NF4, 128, false}, {"fp4", QUANT4_FP4, 64, false},
    {"fp4.dq.bs32.nested3", QUANT4_FP4, 32, true}, {"nf4.dq.bs32", QUANT4_NF4, 32, true},
};

TEST(writes_what_bitsandbytes_saves)
{
    ct_error err = {0};
    st_reader *saved = st_open(FIXTURES "/write.safetensors", &err);
    REQUIRE(saved, "%s (run from the repo root)", err.msg);
    for (size_t c = 0; c < sizeof write_cases / sizeof write_cases[0]; c++) {
        char name[128], key[256];
        snprintf(key, sizeof key, "%s.input", write_cases[c].prefix);
        snprintf(name, sizeof name, "%s.weight", write_cases[c].prefix);
        const st_tensor *in = st_find(saved, key);
        CHECK(in && in->dtype == CT_DTYPE_BF16, "fixture %s missing", key);
        if (!in) continue;
        float *x = ct_malloc(in->numel * sizeof *x);
        for (size_t i = 0; i < in->numel; i++) {
            uint16_t h;
            memcpy(&h, (const char *)in->data + 2 * i, 2);
            x[i] = ct_bf16_to_f32(h);
        }
        quant4_write_opts o = {write_cases[c].type, write_cases[c].blocksize, write_cases[c].dq};
        st_writer *w = st_writer_new();
        size_t bytes = 0;
        CHECK(quant4_write_add(w, name, x, in->ndim, in->shape, &o, &bytes, &err) == CT_OK, "%s", err.msg);
        st_reader *r = save_and_open(w);
        st_writer_free(w);
        free(x);
        CHECK(r, "cannot read %s back", name);
        if (!r) continue;
        size_t compared = 0;
        for (const char *const *s = quant4_write_suffixes(&o); *s; s++, compared++) {
            snprintf(key, sizeof key, "%s%s", name, *s);
            CHECK(same_tensor(st_find(r, key), st_find(saved, key)), "%s differs from bitsandbytes'", key);
        }
        CHECK(compared == st_count(r) && compared == (o.double_quant ? 6u : 4u), "%s: %zu tensors, wrote %zu", name,
              compared, st_count(r));
        st_close(r);
    }
    st_close(saved);
}

TEST(non_finite_weight_is_an_input_error_naming_it)
{
    float x[64] = {0};
    x[5] = NAN;
    quant4_write_opts o = quant4_write_defaults();
    st_writer *w = st_writer_new();
    ct_error err = {0};
    int64_t shape[2] = {1, 64};
    size_t bytes = 0;
    int rc = quant4_write_add(w, "m.bad.weight", x, 2, shape, &o, &bytes, &err);
    CHECK(rc == CT_ERR_INPUT && strstr(err.msg, "m.bad.weight") && strstr(err.msg, "element 5"), "%d: %s", rc, err.msg);
    st_writer_free(w);
}

static const char *with_config(const char *text, ct_error *err, size_t *len)
{
    quant4_write_opts o = quant4_write_defaults();
    return quant4_config_text(text, strlen(text), "config.json", &o, len, err);
}

TEST(config_text_keeps_the_input_and_appends_quantization_config)
{
    const char *in = "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 128\n}\n";
    ct_error err = {0};
    size_t len;
    char *out = (char *)with_config(in, &err, &len);
    REQUIRE(out, "%s", err.msg);
    CHECK(!strncmp(out, in, strlen(in) - 3), "the input's bytes are not kept");
    CHECK(strstr(out, "  \"quantization_config\": {\n    \"_load_in_4bit\": true,\n") &&
          strstr(out, "    \"bnb_4bit_quant_type\": \"nf4\",\n    \"bnb_4bit_use_double_quant\": true,\n") &&
          strstr(out, "    \"quant_method\": \"bitsandbytes\"\n  }\n}\n"), "got:\n%s", out);
    json_doc *doc = json_parse(out, len, "out", &err);
    CHECK(doc && json_get(json_get(json_root(doc), "quantization_config"), "llm_int8_skip_modules"), "%s", err.msg);
    json_free(doc);
    free(out);
    out = (char *)with_config("{}", &err, &len);
    doc = out ? json_parse(out, len, "out", &err) : NULL;
    CHECK(doc && json_root(doc)->count == 1, "an empty object: %s", err.msg);
    json_free(doc);
    free(out);
}

TEST(config_that_is_already_quantized_is_an_input_error)
{
    ct_error err = {0};
    size_t len;
    CHECK(!with_config("{\"quantization_config\": {}}", &err, &len) && err.code == CT_ERR_INPUT &&
          strstr(err.msg, "already quantized"), "%s", err.msg);
    CHECK(!with_config("[1]", &err, &len) && err.code == CT_ERR_INPUT, "a JSON array: %s", err.msg);
}

TEST(routers_experts_and_lm_head_stay_bf16)
{
    ct_tensor_spec s = {.ndim = 2, .kind = CT_TENSOR_LINEAR};
    static const char *const quantized[] = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                                            "model.layers.0.mlp.shared_expert_gate.weight",
                                            "model.layers.0.linear_attn.in_proj_qkvz.weight"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(s.name, sizeof s.name, "%s", quantized[i]);
        CHECK(quant4_should_quantize(&s), "%s should be quantized", s.name);
    }
    static const char *const routers[] = {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.router.weight",
                                          "model.layers.0.block_sparse_moe.gate.weight"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(s.name, sizeof s.name, "%s", routers[i]);
        CHECK(!quant4_should_quantize(&s), "%s is a router", s.name);
    }
    snprintf(s.name, sizeof s.name, "model.layers.0.mlp.experts.3.up_proj.weight");
    s.expert = true;
    CHECK(!quant4_should_quantize(&s), "routed experts stay bf16");
    s.expert = false;
    s.kind = CT_TENSOR_LM_HEAD;
    CHECK(!quant4_should_quantize(&s), "lm_head stays bf16");
}

int main(void)
{
    snprintf(root_dir, sizeof root_dir, "/tmp/ctune_quant4w_XXXXXX");
    CT_ASSERT(mkdtemp(root_dir) != NULL, "mkdtemp failed");
    RUN(nf4_double_quant_round_trips);
    RUN(nf4_plain_round_trips);
    RUN(fp4_double_quant_round_trips);
    RUN(fp4_plain_round_trips);
    RUN(large_tensor_in_parallel_round_trips);
    RUN(writes_what_bitsandbytes_saves);
    RUN(non_finite_weight_is_an_input_error_naming_it);
    RUN(config_text_keeps_the_input_and_appends_quantization_config);
    RUN(config_that_is_already_quantized_is_an_input_error);
    RUN(routers_experts_and_lm_head_stay_bf16);
    for (int i = 0; i < nfiles; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%d.safetensors", root_dir, i);
        unlink(path);
    }
    rmdir(root_dir);
    return check_summary();
}
