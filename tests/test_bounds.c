/* test_bounds.c — bounds on untrusted sizes, one class per test: caps on what a
 * file may make us read, sizes in config.json far beyond any model, element and
 * byte counts that overflow, offsets past the end of a file, and names in a
 * checkpoint manifest that would leave its folder. (Token ids >= vocab_size:
 * test_shard.c and faults.test.sh; shapes against the config: test_model_config.c.) */
#include <limits.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "checkpoint.h"
#include "config.h"
#include "json.h"
#include "model_config.h"
#include "safetensors.h"

static char dir[64];

static const char *tmp_path(const char *name)
{
    static char buf[4][256];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static void write_text(const char *path, const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    CT_ASSERT(f && fwrite(text, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

// ---- caps on what a file may make us read ----

TEST(config_file_over_1_mib_is_refused_unread)
{
    size_t n = CT_CONFIG_MAX_BYTES + 1;
    char *text = malloc(n);
    memset(text, '#', n);
    const char *path = tmp_path("big.yaml");
    write_text(path, text, n);
    free(text);
    ct_config *c = malloc(sizeof *c);
    ct_error err = {0};
    CHECK(config_load(c, path, &err) == CT_ERR_INPUT, "loaded");
    CHECK(strstr(err.msg, path) && strstr(err.msg, "larger than the 1048576-byte limit"), "%s", err.msg);
    free(c);
}

TEST(small_file_reader_stops_at_its_cap)
{
    const char *path = tmp_path("cap.json");
    write_text(path, "{\"a\": 1}", 8);
    size_t len = 0;
    ct_error err = {0};
    char *t = ct_read_file_max(path, 8, &len, &err);
    CHECK(t && len == 8, "a file of exactly the cap is read");
    free(t);
    CHECK(!ct_read_file_max(path, 7, &len, &err) && err.code == CT_ERR_INPUT && strstr(err.msg, "7-byte limit"),
          "%s", err.msg);
}

// ---- sizes in config.json ----

#define BASE "\"model_type\":\"gpt_oss\",\"num_hidden_layers\":2,\"num_attention_heads\":8,\"head_dim\":64," \
             "\"num_local_experts\":4,\"num_experts_per_tok\":2"

/* A gpt_oss config.json with KEY set to VALUE and the other sizes small. */
static int parse_with(ct_model_config *mc, const char *key, long long value, ct_error *err)
{
    static const char *sizes[][2] = {
        {"vocab_size", "1000"}, {"hidden_size", "256"}, {"intermediate_size", "512"},
    };
    char text[1024];
    int n = snprintf(text, sizeof text, "{" BASE ",\"%s\":%lld", key, value);
    for (int i = 0; i < 3; i++)
        if (strcmp(sizes[i][0], key)) n += snprintf(text + n, sizeof text - n, ",\"%s\":%s", sizes[i][0], sizes[i][1]);
    snprintf(text + n, sizeof text - n, "}");
    return model_config_parse(mc, text, strlen(text), "config.json", err);
}

TEST(huge_sizes_in_config_json_are_refused_naming_the_key)
{
    static const struct { const char *key; long long cap; } caps[] = {
        {"vocab_size", CT_MAX_VOCAB}, {"hidden_size", CT_MAX_HIDDEN}, {"intermediate_size", CT_MAX_INTERMEDIATE},
    };
    ct_model_config *mc = malloc(sizeof *mc);
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        ct_error err = {0};
        CHECK(parse_with(mc, caps[i].key, caps[i].cap, &err) == CT_OK, "%s at the cap: %s", caps[i].key, err.msg);
        CHECK(parse_with(mc, caps[i].key, caps[i].cap + 1, &err) == CT_ERR_INPUT && strstr(err.msg, caps[i].key) &&
              strstr(err.msg, "more than the"), "%s over the cap: %s", caps[i].key, err.msg);
        CHECK(parse_with(mc, caps[i].key, INT_MAX, &err) == CT_ERR_INPUT, "%s = INT_MAX", caps[i].key);
        CHECK(parse_with(mc, caps[i].key, (long long)INT_MAX + 1, &err) == CT_ERR_INPUT &&
              strstr(err.msg, "out of range"), "%s beyond int: %s", caps[i].key, err.msg);
    }
    free(mc);
}

static int parse_text(ct_model_config *mc, const char *text, ct_error *err)
{
    return model_config_parse(mc, text, strlen(text), "config.json", err);
}

#define LLAMA "\"model_type\":\"llama\",\"vocab_size\":1000,\"hidden_size\":256,\"intermediate_size\":512," \
              "\"num_hidden_layers\":2"

TEST(huge_heads_layers_and_experts_are_refused)
{
    ct_model_config *mc = malloc(sizeof *mc);
    ct_error err = {0};
    CHECK(parse_text(mc, "{" LLAMA ",\"num_attention_heads\":1025,\"num_key_value_heads\":1}", &err) &&
          strstr(err.msg, "'num_attention_heads' is 1025"), "%s", err.msg);
    CHECK(parse_text(mc, "{" LLAMA ",\"num_attention_heads\":2,\"head_dim\":1026}", &err) &&
          strstr(err.msg, "'head_dim' is 1026"), "%s", err.msg);
    CHECK(parse_text(mc, "{" LLAMA ",\"num_attention_heads\":2,\"head_dim\":2147483646}", &err) &&
          strstr(err.msg, "head_dim"), "%s", err.msg);
    CHECK(parse_text(mc, "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":64,"
                         "\"num_hidden_layers\":513,\"num_attention_heads\":2}", &err) &&
          strstr(err.msg, "'num_hidden_layers' is 513"), "%s", err.msg);
    CHECK(parse_text(mc, "{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":64,"
                         "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_experts\":2147483647,"
                         "\"num_experts_per_tok\":1}", &err) && strstr(err.msg, "'num_experts' is 2147483647"),
          "%s", err.msg);
    CHECK(parse_text(mc, "{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":64,"
                         "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_experts\":8,"
                         "\"moe_intermediate_size\":2000000}", &err) && strstr(err.msg, "moe_intermediate_size"),
          "%s", err.msg);
    free(mc);
}

TEST(fp32_and_int_conversions_of_config_numbers_cannot_overflow)
{
    ct_model_config *mc = malloc(sizeof *mc);
    ct_error err = {0};
    CHECK(parse_text(mc, "{" LLAMA ",\"num_attention_heads\":2,\"partial_rotary_factor\":1e300}", &err) &&
          strstr(err.msg, "partial_rotary_factor"), "%s", err.msg);
    CHECK(parse_text(mc, "{" LLAMA ",\"num_attention_heads\":2,\"partial_rotary_factor\":-0.5}", &err) &&
          strstr(err.msg, "partial_rotary_factor"), "%s", err.msg);
    CHECK(parse_text(mc, "{" LLAMA ",\"num_attention_heads\":2,\"rms_norm_eps\":1e300}", &err) &&
          strstr(err.msg, "rms_norm_eps"), "%s", err.msg);
    CHECK(parse_text(mc, "{" LLAMA ",\"num_attention_heads\":2,\"initializer_range\":1e300}", &err) &&
          strstr(err.msg, "initializer_range"), "%s", err.msg);
    CHECK(parse_text(mc, "{" LLAMA ",\"num_attention_heads\":2,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,"
                         "\"beta_fast\":-1}}", &err) && strstr(err.msg, "beta_fast"), "%s", err.msg);
    free(mc);
}

TEST(largest_accepted_config_counts_parameters_without_overflow)
{
    char text[1024];
    snprintf(text, sizeof text, "{\"model_type\":\"gpt_oss\",\"vocab_size\":%d,\"hidden_size\":%d,"
             "\"intermediate_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"head_dim\":%d,"
             "\"num_local_experts\":%d,\"num_experts_per_tok\":4}", CT_MAX_VOCAB, CT_MAX_HIDDEN, CT_MAX_INTERMEDIATE,
             CT_MAX_LAYERS, CT_MAX_HEADS, CT_MAX_HEAD_DIM, CT_MAX_EXPERTS);
    ct_model_config *mc = malloc(sizeof *mc);
    ct_error err = {0};
    REQUIRE(parse_text(mc, text, &err) == CT_OK, "%s", err.msg);
    size_t n;
    ct_tensor_spec *specs = model_tensor_specs(mc, &n);
    unsigned __int128 exact = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned __int128 k = 1;
        for (int d = 0; d < specs[i].ndim; d++) k *= (unsigned __int128)specs[i].shape[d];
        exact += k;
    }
    free(specs);
    ct_param_counts c = model_param_counts(mc);
    CHECK(exact < ((unsigned __int128)1 << 63) && (unsigned __int128)c.total == exact,
          "total %zu, exact %.6g", c.total, (double)exact);
    free(mc);
}

// ---- counts that overflow, offsets past the end ----

static void write_st(const char *path, const char *header, size_t data_len)
{
    size_t hl = strlen(header), n = 8 + hl + data_len;
    char *b = calloc(1, n);
    for (int i = 0; i < 8; i++) b[i] = (char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    write_text(path, b, n);
    free(b);
}

static const char *st_error(const char *path, ct_error *err)
{
    st_reader *r = st_open(path, err);
    if (r) { st_close(r); return "(opened)"; }
    return err->msg;
}

TEST(byte_count_overflow_is_refused_though_the_element_count_fits)
{
    const char *path = tmp_path("bytes.safetensors");
    ct_error err = {0};
    /* 2^62 elements fit a size_t; 2^62 x 8 bytes do not */
    write_st(path, "{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0);
    CHECK(strstr(st_error(path, &err), "is too large"), "%s", err.msg);
    /* eight dimensions whose product overflows only at the last one */
    write_st(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[256,256,256,256,256,256,256,256],\"data_offsets\":[0,0]}}", 0);
    CHECK(strstr(st_error(path, &err), "too many elements"), "%s", err.msg);
}

TEST(data_offsets_far_past_the_end_of_the_file_are_refused)
{
    const char *path = tmp_path("far.safetensors");
    ct_error err = {0};
    write_st(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1099511627776],\"data_offsets\":[0,1099511627776]}}", 16);
    CHECK(strstr(st_error(path, &err), "file is truncated"), "%s", err.msg);
    write_st(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[18446744073709551614,18446744073709551615]}}", 1);
    CHECK(strcmp(st_error(path, &err), "(opened)") != 0, "offsets near 2^64 opened");
}

// ---- checkpoint manifests ----

TEST(manifest_names_cannot_leave_the_checkpoint_folder)
{
    char ck[300];
    snprintf(ck, sizeof ck, "%s/checkpoint-1", dir);
    CT_ASSERT(mkdir(ck, 0755) == 0, "mkdir");
    char path[400];
    snprintf(path, sizeof path, "%s/manifest.json", ck);
    const char *m = "{\"format\": \"ctune-checkpoint-manifest\", \"version\": 1, \"step\": 1, \"files\": "
                    "[{\"name\": \"../big.yaml\", \"size\": 1, \"crc32\": 0}]}";
    write_text(path, m, strlen(m));
    ct_error err = {0};
    CHECK(checkpoint_verify(ck, &err) == CT_ERR_INPUT && strstr(err.msg, "entry 0"), "%s", err.msg);
    char found[400];
    CHECK(!checkpoint_find_latest(dir, found, sizeof found, NULL), "took %s", found);
}

static int rm_all(const char *path)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    return system(cmd);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/ctune-bounds-XXXXXX");
    CT_ASSERT(mkdtemp(dir), "mkdtemp failed");
    RUN(config_file_over_1_mib_is_refused_unread);
    RUN(small_file_reader_stops_at_its_cap);
    RUN(huge_sizes_in_config_json_are_refused_naming_the_key);
    RUN(huge_heads_layers_and_experts_are_refused);
    RUN(fp32_and_int_conversions_of_config_numbers_cannot_overflow);
    RUN(largest_accepted_config_counts_parameters_without_overflow);
    RUN(byte_count_overflow_is_refused_though_the_element_count_fits);
    RUN(data_offsets_far_past_the_end_of_the_file_are_refused);
    RUN(manifest_names_cannot_leave_the_checkpoint_folder);
    rm_all(dir);
    return check_summary();
}
