/* test_safetensors.c — the safetensors reader and writer (src/formats/safetensors.h).
 * Malformed files are built byte by byte, each test in its own fresh folder. */
#include <ftw.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "json.h"
#include "safetensors.h"

static char root_dir[64];  /* one mkdtemp folder per run, removed at exit */
static char tmpdir[128];
static int ndirs;

/* A new empty folder per test, so no test sees another's files. */
static const char *fresh_dir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s/%d", root_dir, ndirs++);
    CT_ASSERT(mkdir(tmpdir, 0755) == 0, "mkdir %s failed", tmpdir);
    return tmpdir;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static char *join(const char *dir, const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CT_ASSERT(f && fwrite(data, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

/* Writes a safetensors file by hand: the u64 length of header, the header, then
 * data_len bytes of data (0, 1, 2, ...). */
static void write_raw(const char *path, uint64_t declared_len, const char *header, size_t data_len)
{
    size_t hl = strlen(header), n = 8 + hl + data_len;
    unsigned char *b = malloc(n);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(declared_len >> (8 * i));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (unsigned char)i;
    write_bytes(path, b, n);
    free(b);
}

static void write_header_file(const char *path, const char *header, size_t data_len)
{
    write_raw(path, strlen(header), header, data_len);
}

static unsigned char *read_all(const char *path, size_t *n)
{
    ct_error err = {0};
    unsigned char *b = (unsigned char *)ct_read_file(path, n, &err);
    CT_ASSERT(b, "%s", err.msg);
    return b;
}

/* st_open must fail with CT_ERR_INPUT, naming path and saying want. */
static int open_fails(const char *path, const char *want, ct_error *err)
{
    st_reader *r = st_open(path, err);
    if (r) { st_close(r); snprintf(err->msg, sizeof err->msg, "(opened)"); return 0; }
    return err->code == CT_ERR_INPUT && strstr(err->msg, path) && strstr(err->msg, want);
}

static st_writer *sample_writer(uint16_t *bf, float *f32, int64_t *i64, float *scalar)
{
    for (int i = 0; i < 6; i++) bf[i] = ct_f32_to_bf16((float)i - 2.5f);
    for (int i = 0; i < 4; i++) f32[i] = 0.5f * (float)i;
    for (int i = 0; i < 4; i++) i64[i] = (int64_t)1 << (20 * i);
    *scalar = 3.25f;
    st_writer *w = st_writer_new();
    ct_error err = {0};
    int64_t s_bf[2] = {3, 2}, s_f32[1] = {4}, s_i64[2] = {2, 2}, s_empty[2] = {0, 5};
    CT_ASSERT(st_writer_add(w, "layer.weight", CT_DTYPE_BF16, 2, s_bf, bf, &err) == CT_OK, "%s", err.msg);
    CT_ASSERT(st_writer_add(w, "layer.bias", CT_DTYPE_F32, 1, s_f32, f32, &err) == CT_OK, "%s", err.msg);
    CT_ASSERT(st_writer_add(w, "ids", CT_DTYPE_I64, 2, s_i64, i64, &err) == CT_OK, "%s", err.msg);
    CT_ASSERT(st_writer_add(w, "scale", CT_DTYPE_F32, 0, NULL, scalar, &err) == CT_OK, "%s", err.msg);
    CT_ASSERT(st_writer_add(w, "empty", CT_DTYPE_BF16, 2, s_empty, NULL, &err) == CT_OK, "%s", err.msg);
    return w;
}

TEST(round_trip_preserves_names_dtypes_shapes_and_bytes)
{
    uint16_t bf[6]; float f32[4]; int64_t i64[4]; float scalar;
    st_writer *w = sample_writer(bf, f32, i64, &scalar);
    ct_error err = {0};
    const char *path = join(fresh_dir(), "m.safetensors");
    REQUIRE(st_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    st_reader *r = st_open(path, &err);
    REQUIRE(r, "%s", err.msg);
    CHECK(st_count(r) == 5, "count %zu", st_count(r));
    const char *sorted[] = {"empty", "ids", "layer.bias", "layer.weight", "scale"};
    for (size_t i = 0; i < 5 && i < st_count(r); i++)
        CHECK(strcmp(st_at(r, i)->name, sorted[i]) == 0, "st_at(%zu) is %s", i, st_at(r, i)->name);
    const st_tensor *t = st_find(r, "layer.weight");
    CHECK(t && t->dtype == CT_DTYPE_BF16 && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 2 &&
          t->numel == 6 && t->nbytes == 12 && memcmp(t->data, bf, 12) == 0, "bf16 tensor differs");
    CHECK(strcmp(t->file, path) == 0, "file %s", t->file);
    t = st_find(r, "layer.bias");
    CHECK(t && t->dtype == CT_DTYPE_F32 && t->ndim == 1 && t->shape[0] == 4 && memcmp(t->data, f32, 16) == 0, "f32 tensor differs");
    t = st_find(r, "ids");
    CHECK(t && t->dtype == CT_DTYPE_I64 && t->nbytes == 32 && memcmp(t->data, i64, 32) == 0, "i64 tensor differs");
    t = st_find(r, "scale");
    CHECK(t && t->ndim == 0 && t->numel == 1 && t->nbytes == 4 && memcmp(t->data, &scalar, 4) == 0, "scalar differs");
    t = st_find(r, "empty");
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 5 && t->numel == 0 && t->nbytes == 0, "empty tensor differs");
    CHECK(st_find(r, "absent") == NULL && st_find(r, "") == NULL, "st_find of a missing name");
    st_close(r);
}

TEST(header_is_8_aligned_padded_with_spaces_and_says_format_pt)
{
    uint16_t bf[6]; float f32[4]; int64_t i64[4]; float scalar;
    st_writer *w = sample_writer(bf, f32, i64, &scalar);
    ct_error err = {0};
    const char *path = join(fresh_dir(), "m.safetensors");
    REQUIRE(st_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    size_t n;
    unsigned char *b = read_all(path, &n);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    CHECK(hl % 8 == 0, "header length %llu", (unsigned long long)hl);
    REQUIRE(hl + 8 <= n, "header length beyond file");
    CHECK(b[8] == '{' && (b[8 + hl - 1] == '}' || b[8 + hl - 1] == ' '), "header starts with '{' and ends in '}' or padding");
    char *h = strndup((char *)b + 8, hl);
    CHECK(strstr(h, "\"__metadata__\":{\"format\":\"pt\"}") != NULL, "header: %s", h);
    free(h);
    free(b);
    st_reader *r = st_open(path, &err);
    REQUIRE(r, "%s", err.msg);
    CHECK(st_metadata(r, "format") && strcmp(st_metadata(r, "format"), "pt") == 0, "st_metadata format");
    CHECK(st_metadata(r, "absent") == NULL, "absent metadata key");
    st_close(r);
}

TEST(writer_lays_out_by_dtype_size_then_name)
{
    uint16_t bf[6]; float f32[4]; int64_t i64[4]; float scalar;
    st_writer *w = sample_writer(bf, f32, i64, &scalar);
    ct_error err = {0};
    const char *path = join(fresh_dir(), "m.safetensors");
    REQUIRE(st_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    st_reader *r = st_open(path, &err);
    REQUIRE(r, "%s", err.msg);
    const unsigned char *ids = st_find(r, "ids")->data, *bias = st_find(r, "layer.bias")->data,
                        *scale = st_find(r, "scale")->data, *weight = st_find(r, "layer.weight")->data;
    CHECK(ids < bias && bias < scale && scale < weight, "order i64, f32 (by name), bf16");
    CHECK((uintptr_t)ids % 8 == 0 && (uintptr_t)bias % 4 == 0 && (uintptr_t)weight % 2 == 0, "elements aligned in the mapping");
    st_close(r);
}

TEST(writer_rejects_duplicate_and_reserved_names)
{
    st_writer *w = st_writer_new();
    ct_error err = {0};
    float x = 1;
    CHECK(st_writer_add(w, "a", CT_DTYPE_F32, 0, NULL, &x, &err) == CT_OK, "%s", err.msg);
    CHECK(st_writer_add(w, "a", CT_DTYPE_F32, 0, NULL, &x, &err) == CT_ERR_INPUT && strstr(err.msg, "twice"), "%s", err.msg);
    CHECK(st_writer_add(w, "__metadata__", CT_DTYPE_F32, 0, NULL, &x, &err) == CT_ERR_INPUT, "reserved name accepted");
    int64_t neg = -1;
    CHECK(st_writer_add(w, "b", CT_DTYPE_F32, 1, &neg, &x, &err) == CT_ERR_INPUT, "negative dimension accepted");
    st_writer_free(w);
}

TEST(writer_finds_names_among_many)
{
    /* Crosses several growths of the writer's name set. */
    st_writer *w = st_writer_new();
    ct_error err = {0};
    uint8_t b = 7;
    char name[32];
    int ok = 1;
    for (int i = 0; i < 500 && ok; i++) {
        snprintf(name, sizeof name, "t.%d", i);
        ok = st_writer_add(w, name, CT_DTYPE_U8, 0, NULL, &b, &err) == CT_OK;
    }
    CHECK(ok, "%s", err.msg);
    for (int i = 0; i < 500; i += 37) {
        snprintf(name, sizeof name, "t.%d", i);
        CHECK(st_writer_add(w, name, CT_DTYPE_U8, 0, NULL, &b, &err) == CT_ERR_INPUT, "%s re-added", name);
    }
    st_writer_free(w);
}

TEST(sharded_write_opens_through_index)
{
    const char *dir = fresh_dir();
    st_writer *w = st_writer_new();
    ct_error err = {0};
    float data[8][4];
    char name[32];
    int64_t shape[1] = {4};
    for (int i = 0; i < 8; i++) {
        for (int j = 0; j < 4; j++) data[i][j] = (float)(i * 10 + j);
        snprintf(name, sizeof name, "w.%d", i);
        REQUIRE(st_writer_add(w, name, CT_DTYPE_F32, 1, shape, data[i], &err) == CT_OK, "%s", err.msg);
    }
    REQUIRE(st_writer_save_sharded(w, dir, 40, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    struct stat st;
    CHECK(stat(join(dir, "model-00001-of-00004.safetensors"), &st) == 0, "first shard missing");
    CHECK(stat(join(dir, "model-00004-of-00004.safetensors"), &st) == 0, "last shard missing");
    CHECK(stat(join(dir, "model.safetensors"), &st) != 0, "no single file when sharded");
    size_t n;
    char *idx = (char *)read_all(join(dir, "model.safetensors.index.json"), &n);
    json_doc *d = json_parse(idx, n, "index", &err);
    REQUIRE(d, "%s", err.msg);
    long long total = 0;
    CHECK(json_get_int(json_get(json_root(d), "metadata"), "total_size", 0, &total, "index", &err) == CT_OK && total == 128,
          "total_size %lld", total);
    const json_value *wm = json_get_type(json_root(d), "weight_map", JSON_OBJECT);
    CHECK(wm && wm->count == 8, "weight_map entries");
    json_free(d);
    free(idx);
    st_reader *r = st_open(dir, &err);
    REQUIRE(r, "%s", err.msg);
    CHECK(st_count(r) == 8, "count %zu", st_count(r));
    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof name, "w.%d", i);
        const st_tensor *t = st_find(r, name);
        CHECK(t && t->nbytes == 16 && memcmp(t->data, data[i], 16) == 0, "%s differs", name);
    }
    CHECK(st_find(r, "w.0")->file != st_find(r, "w.7")->file, "w.0 and w.7 share a shard");
    CHECK(st_metadata(r, "format") && strcmp(st_metadata(r, "format"), "pt") == 0, "shard metadata");
    st_close(r);
}

TEST(sharded_write_under_the_limit_is_one_file)
{
    const char *dir = fresh_dir();
    st_writer *w = st_writer_new();
    ct_error err = {0};
    float x[2] = {1, 2};
    int64_t shape[1] = {2};
    REQUIRE(st_writer_add(w, "x", CT_DTYPE_F32, 1, shape, x, &err) == CT_OK, "%s", err.msg);
    REQUIRE(st_writer_save_sharded(w, dir, 8, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    struct stat st;
    CHECK(stat(join(dir, "model.safetensors"), &st) == 0, "model.safetensors missing");
    CHECK(stat(join(dir, "model.safetensors.index.json"), &st) != 0, "index written for one file");
    st_reader *r = st_open(dir, &err);
    CHECK(r && st_find(r, "x") && memcmp(st_find(r, "x")->data, x, 8) == 0, "%s", err.msg);
    st_close(r);
}

TEST(expect_reports_dtype_and_shape_mismatch)
{
    uint16_t bf[6]; float f32[4]; int64_t i64[4]; float scalar;
    st_writer *w = sample_writer(bf, f32, i64, &scalar);
    ct_error err = {0};
    const char *path = join(fresh_dir(), "m.safetensors");
    REQUIRE(st_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    st_reader *r = st_open(path, &err);
    REQUIRE(r, "%s", err.msg);
    const st_tensor *t = NULL;
    int64_t good[2] = {3, 2}, bad[2] = {2, 3};
    CHECK(st_expect(r, "layer.weight", CT_DTYPE_BF16, 2, good, &t, &err) == CT_OK && t == st_find(r, "layer.weight"), "%s", err.msg);
    CHECK(st_expect(r, "layer.weight", CT_DTYPE_BF16, 2, bad, &t, &err) == CT_ERR_INPUT, "shape mismatch accepted");
    CHECK(strstr(err.msg, path) && strstr(err.msg, "'layer.weight'") && strstr(err.msg, "[3, 2]") && strstr(err.msg, "[2, 3]"),
          "%s", err.msg);
    CHECK(st_expect(r, "layer.weight", CT_DTYPE_F32, 2, good, &t, &err) == CT_ERR_INPUT && strstr(err.msg, "BF16"), "%s", err.msg);
    CHECK(st_expect(r, "nope", CT_DTYPE_F32, 0, NULL, &t, &err) == CT_ERR_INPUT && strstr(err.msg, "not found"), "%s", err.msg);
    st_close(r);
}

TEST(dtype_names_round_trip)
{
    const char *names[] = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                           "I32", "U32", "F32", "I64", "U64", "F64"};
    size_t sizes[] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
    for (int d = 0; d < CT_DTYPE_COUNT; d++) {
        ct_dtype back;
        CHECK(strcmp(ct_dtype_name((ct_dtype)d), names[d]) == 0, "name of %d", d);
        CHECK(ct_dtype_size((ct_dtype)d) == sizes[d], "size of %s", names[d]);
        CHECK(ct_dtype_from_name(names[d], &back) == CT_OK && back == (ct_dtype)d, "from_name %s", names[d]);
    }
    ct_dtype x;
    CHECK(ct_dtype_from_name("C64", &x) == CT_ERR_INPUT && ct_dtype_from_name("bf16", &x) == CT_ERR_INPUT, "unknown names");
}

TEST(accepts_whitespace_around_header_json)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    write_header_file(path, "  {\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}   ", 2);
    ct_error err = {0};
    st_reader *r = st_open(path, &err);
    CHECK(r && st_count(r) == 1 && ((const uint8_t *)st_find(r, "a")->data)[1] == 1, "%s", err.msg);
    st_close(r);
}

TEST(rejects_header_length_beyond_file)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    write_raw(path, 1000, "{}", 0);
    ct_error err = {0};
    CHECK(open_fails(path, "runs past the end of the file", &err), "%s", err.msg);
}

TEST(rejects_header_over_100_million_bytes)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    write_raw(path, 100000001, "{}", 0);
    ct_error err = {0};
    CHECK(open_fails(path, "exceeds the limit", &err), "%s", err.msg);
}

TEST(rejects_file_shorter_than_length_field)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    write_bytes(path, "\x02\0\0", 3);
    ct_error err = {0};
    CHECK(open_fails(path, "too short", &err), "%s", err.msg);
}

TEST(rejects_header_that_is_not_json)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    write_header_file(path, "{\"a\": nope}", 0);
    ct_error err = {0};
    CHECK(open_fails(path, "header: offset 6", &err), "%s", err.msg);
    write_header_file(path, "[1, 2]  ", 0);
    CHECK(open_fails(path, "not a JSON object", &err), "%s", err.msg);
}

TEST(rejects_unknown_dtype)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    write_header_file(path, "{\"a\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    ct_error err = {0};
    CHECK(open_fails(path, "dtype 'C64'", &err), "%s", err.msg);
}

TEST(rejects_bad_shapes_and_offsets)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    ct_error err = {0};
    write_header_file(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0);
    CHECK(open_fails(path, "not a non-negative integer", &err), "negative: %s", err.msg);
    write_header_file(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,0]}}", 0);
    CHECK(open_fails(path, "not a non-negative integer", &err), "fraction: %s", err.msg);
    write_header_file(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1);
    CHECK(open_fails(path, "9 dimensions", &err), "rank 9: %s", err.msg);
    write_header_file(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0);
    CHECK(open_fails(path, "too many elements", &err), "overflowing numel: %s", err.msg);
    write_header_file(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,1]}}", 0);
    CHECK(open_fails(path, "end before they begin", &err), "reversed: %s", err.msg);
    write_header_file(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[0]}}", 0);
    CHECK(open_fails(path, "data_offsets", &err), "missing offsets: %s", err.msg);
    write_header_file(path, "{\"__metadata__\":{\"n\":1}}", 0);
    CHECK(open_fails(path, "__metadata__ key 'n'", &err), "non-string metadata: %s", err.msg);
}

TEST(rejects_tensor_name_with_a_control_character)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    ct_error err = {0};
    write_header_file(path, "{\"a\\nb\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    CHECK(open_fails(path, "tensor 'a?b': the name holds the control character 0x0a", &err), "%s", err.msg);
    CHECK(!strchr(err.msg, '\n'), "not one line: %s", err.msg);
}

TEST(rejects_hole_between_tensors)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    write_header_file(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                            "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]}}", 6);
    ct_error err = {0};
    CHECK(open_fails(path, "tensor 'b': data_offsets begin at 4 but tensor 'a' ends at 2", &err), "%s", err.msg);
}

TEST(rejects_hole_at_start_of_data)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    write_header_file(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4);
    ct_error err = {0};
    CHECK(open_fails(path, "hole at the start", &err), "%s", err.msg);
}

TEST(rejects_overlapping_offsets)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    write_header_file(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                            "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6);
    ct_error err = {0};
    CHECK(open_fails(path, "overlap tensor 'a'", &err), "%s", err.msg);
}

TEST(rejects_size_mismatch_with_shape)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    write_header_file(path, "{\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[3,2],\"data_offsets\":[0,10]}}", 10);
    ct_error err = {0};
    CHECK(open_fails(path, "", &err), "%s", err.msg);
    char want[600];
    snprintf(want, sizeof want, "%s: tensor 'a.weight': data_offsets [0, 10] hold 10 bytes but shape [3, 2] BF16 needs 12", path);
    CHECK(strcmp(err.msg, want) == 0, "got '%s'", err.msg);
}

TEST(rejects_trailing_bytes_after_data)
{
    const char *path = join(fresh_dir(), "m.safetensors");
    write_header_file(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 3);
    ct_error err = {0};
    CHECK(open_fails(path, "1 trailing bytes", &err), "%s", err.msg);
}

TEST(rejects_truncated_file)
{
    uint16_t bf[6]; float f32[4]; int64_t i64[4]; float scalar;
    st_writer *w = sample_writer(bf, f32, i64, &scalar);
    ct_error err = {0};
    const char *path = join(fresh_dir(), "m.safetensors");
    REQUIRE(st_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    size_t n;
    unsigned char *b = read_all(path, &n);
    write_bytes(path, b, n - 1);
    CHECK(open_fails(path, "truncated", &err), "cut data: %s", err.msg);
    write_bytes(path, b, 40);
    CHECK(open_fails(path, "runs past the end", &err), "cut header: %s", err.msg);
    free(b);
}

/* A two-shard folder written by hand: s1 holds a, s2 holds b. */
static const char *two_shards(const char *index)
{
    const char *dir = fresh_dir();
    write_header_file(join(dir, "s1.safetensors"), "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    write_header_file(join(dir, "s2.safetensors"), "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    write_bytes(join(dir, "model.safetensors.index.json"), index, strlen(index));
    return dir;
}

TEST(opens_hand_written_shards)
{
    const char *dir = two_shards("{\"metadata\":{},\"weight_map\":{\"b\":\"s2.safetensors\",\"a\":\"s1.safetensors\"}}");
    ct_error err = {0};
    st_reader *r = st_open(dir, &err);
    REQUIRE(r, "%s", err.msg);
    CHECK(st_count(r) == 2 && strstr(st_find(r, "b")->file, "s2.safetensors"), "b's file");
    st_close(r);
}

TEST(rejects_index_naming_a_missing_shard)
{
    const char *dir = two_shards("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s3.safetensors\"}}");
    ct_error err = {0};
    CHECK(open_fails(dir, "s3.safetensors: cannot open", &err), "%s", err.msg);
}

TEST(rejects_index_with_path_in_shard_name)
{
    const char *dir = two_shards("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"../s2.safetensors\"}}");
    ct_error err = {0};
    CHECK(open_fails(dir, "not a plain file name", &err), "'../': %s", err.msg);
    write_bytes(join(dir, "model.safetensors.index.json"), "{\"weight_map\":{\"a\":\"sub/s1.safetensors\"}}", 41);
    CHECK(open_fails(dir, "not a plain file name", &err), "'/': %s", err.msg);
}

TEST(rejects_shard_tensor_missing_from_weight_map)
{
    const char *dir = two_shards("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    write_header_file(join(dir, "s2.safetensors"), "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                                                   "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2);
    ct_error err = {0};
    CHECK(open_fails(dir, "tensor 'c' in ", &err) && strstr(err.msg, "not listed in weight_map"), "%s", err.msg);
}

TEST(rejects_weight_map_tensor_missing_from_shard)
{
    const char *dir = two_shards("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\",\"c\":\"s1.safetensors\"}}");
    ct_error err = {0};
    CHECK(open_fails(dir, "'c' in s1.safetensors, but that shard does not hold it", &err), "%s", err.msg);
}

TEST(rejects_tensor_found_in_another_shard_than_weight_map_says)
{
    const char *dir = two_shards("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"x\":\"s2.safetensors\"}}");
    ct_error err = {0};
    CHECK(open_fails(dir, "puts tensor 'b' in s1.safetensors, but it is in ", &err), "%s", err.msg);
}

TEST(rejects_folder_without_model_files)
{
    const char *dir = fresh_dir();
    ct_error err = {0};
    CHECK(open_fails(dir, "neither model.safetensors nor", &err), "%s", err.msg);
    CHECK(open_fails(join(dir, "absent.safetensors"), "cannot open", &err), "%s", err.msg);
}

TEST(save_replaces_an_existing_file_and_leaves_no_tmp)
{
    const char *dir = fresh_dir();
    const char *path = join(dir, "m.safetensors"), *tmp = join(dir, "m.safetensors.tmp");
    write_bytes(path, "old", 3);
    st_writer *w = st_writer_new();
    ct_error err = {0};
    uint8_t b = 9;
    REQUIRE(st_writer_add(w, "b", CT_DTYPE_U8, 0, NULL, &b, &err) == CT_OK, "%s", err.msg);
    REQUIRE(st_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    struct stat st;
    CHECK(stat(tmp, &st) != 0, "temporary file left behind");
    st_reader *r = st_open(path, &err);
    CHECK(r && *(const uint8_t *)st_find(r, "b")->data == 9, "%s", err.msg);
    st_close(r);
}

TEST(survives_random_corruption_of_a_valid_file)
{
    /* Every corrupted file must either open with all data inside the file, or be
     * refused with a message naming it; ASan builds catch any stray read. */
    uint16_t bf[6]; float f32[4]; int64_t i64[4]; float scalar;
    st_writer *w = sample_writer(bf, f32, i64, &scalar);
    ct_error err = {0};
    const char *path = join(fresh_dir(), "m.safetensors");
    REQUIRE(st_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    st_writer_free(w);
    size_t n;
    unsigned char *good = read_all(path, &n);
    unsigned char *b = malloc(n);
    ct_rng rng;
    ct_rng_seed(&rng, 1234);
    int opened = 0;
    for (int iter = 0; iter < 400; iter++) {
        memcpy(b, good, n);
        int edits = 1 + (int)ct_rng_below(&rng, 4);
        for (int e = 0; e < edits; e++) {
            size_t at = (size_t)ct_rng_below(&rng, n);
            const char *pool = "{}[],:\"0123456789-e. \\u";
            b[at] = ct_rng_below(&rng, 2) ? (unsigned char)pool[ct_rng_below(&rng, strlen(pool))] : (unsigned char)ct_rng_u64(&rng);
        }
        size_t len = ct_rng_below(&rng, 8) == 0 ? (size_t)ct_rng_below(&rng, n + 1) : n;
        write_bytes(path, b, len);
        st_reader *r = st_open(path, &err);
        if (!r) {
            CHECK(err.code == CT_ERR_INPUT && strncmp(err.msg, path, strlen(path)) == 0 && !strchr(err.msg, '\n'),
                  "iteration %d: %s", iter, err.msg);
            continue;
        }
        opened++;
        for (size_t i = 0; i < st_count(r); i++) {
            const st_tensor *t = st_at(r, i);
            CHECK(t->nbytes == t->numel * ct_dtype_size(t->dtype), "iteration %d: %s size", iter, t->name);
        }
        st_close(r);
    }
    CHECK(opened < 400, "no corruption was detected");
    free(b);
    free(good);
}

int main(void)
{
    snprintf(root_dir, sizeof root_dir, "/tmp/ct_test_st_XXXXXX");
    CT_ASSERT(mkdtemp(root_dir) != NULL, "mkdtemp failed");
    RUN(round_trip_preserves_names_dtypes_shapes_and_bytes);
    RUN(header_is_8_aligned_padded_with_spaces_and_says_format_pt);
    RUN(writer_lays_out_by_dtype_size_then_name);
    RUN(writer_rejects_duplicate_and_reserved_names);
    RUN(writer_finds_names_among_many);
    RUN(sharded_write_opens_through_index);
    RUN(sharded_write_under_the_limit_is_one_file);
    RUN(expect_reports_dtype_and_shape_mismatch);
    RUN(dtype_names_round_trip);
    RUN(accepts_whitespace_around_header_json);
    RUN(rejects_header_length_beyond_file);
    RUN(rejects_header_over_100_million_bytes);
    RUN(rejects_file_shorter_than_length_field);
    RUN(rejects_header_that_is_not_json);
    RUN(rejects_unknown_dtype);
    RUN(rejects_bad_shapes_and_offsets);
    RUN(rejects_tensor_name_with_a_control_character);
    RUN(rejects_hole_between_tensors);
    RUN(rejects_hole_at_start_of_data);
    RUN(rejects_overlapping_offsets);
    RUN(rejects_size_mismatch_with_shape);
    RUN(rejects_trailing_bytes_after_data);
    RUN(rejects_truncated_file);
    RUN(opens_hand_written_shards);
    RUN(rejects_index_naming_a_missing_shard);
    RUN(rejects_index_with_path_in_shard_name);
    RUN(rejects_shard_tensor_missing_from_weight_map);
    RUN(rejects_weight_map_tensor_missing_from_shard);
    RUN(rejects_tensor_found_in_another_shard_than_weight_map_says);
    RUN(rejects_folder_without_model_files);
    RUN(save_replaces_an_existing_file_and_leaves_no_tmp);
    RUN(survives_random_corruption_of_a_valid_file);
    nftw(root_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return check_summary();
}
