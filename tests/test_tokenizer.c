/* test_tokenizer.c — the tokenizer (src/text/tokenizer.h) against Hugging Face
 * `tokenizers`: every fixture tokenizer x every corpus string of
 * tests/fixtures/tokenizer (scripts/tokenizer_fixtures.py wrote HF's answers
 * there), then the behaviours one at a time. CTUNE_TOKENIZER_FIXTURES points
 * at another fixture folder (tests/tokenizer.test.sh: fresh random strings
 * checked against the installed `tokenizers`). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "json.h"
#include "tokenizer.h"

static const char *fixtures_dir(void)
{
    const char *d = getenv("CTUNE_TOKENIZER_FIXTURES");
    return d && *d ? d : "tests/fixtures/tokenizer";
}

static const char *fixture_names[] = {"bl_qwen2", "bl_llama3", "bl_o200k", "bl_gpt2",
                                      "sp_llama2", "sp_metaspace", "sp_legacy", "wp_suffix"};
#define N_FIXTURES (sizeof fixture_names / sizeof *fixture_names)

typedef struct corpus {
    size_t n;
    char **text;
    size_t *len;
} corpus;

static int hex_val(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

static json_doc *read_json(const char *path, ct_error *err)
{
    size_t len;
    char *text = ct_read_file(path, &len, err);
    if (!text) return NULL;
    json_doc *d = json_parse(text, len, path, err);
    free(text);
    return d;
}

/* corpus.json: [{"text": s} | {"hex": "..."}]. */
static bool load_corpus(corpus *c, ct_error *err)
{
    char path[512];
    snprintf(path, sizeof path, "%s/corpus.json", fixtures_dir());
    json_doc *d = read_json(path, err);
    if (!d) return false;
    const json_value *r = json_root(d);
    c->n = r->count;
    c->text = ct_calloc(c->n, sizeof *c->text);
    c->len = ct_calloc(c->n, sizeof *c->len);
    for (size_t i = 0; i < c->n; i++) {
        const json_value *t = json_get_type(r->items[i], "text", JSON_STRING);
        const json_value *h = json_get_type(r->items[i], "hex", JSON_STRING);
        if (t) {
            c->text[i] = ct_malloc(t->string_len + 1);
            memcpy(c->text[i], t->string, t->string_len + 1);
            c->len[i] = t->string_len;
        } else {
            c->len[i] = h->string_len / 2;
            c->text[i] = ct_malloc(c->len[i] + 1);
            for (size_t k = 0; k < c->len[i]; k++)
                c->text[i][k] = (char)(hex_val(h->string[2 * k]) * 16 + hex_val(h->string[2 * k + 1]));
        }
    }
    json_free(d);
    return true;
}

static void free_corpus(corpus *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->text[i]);
    free(c->text);
    free(c->len);
}

static ct_tokenizer *load_fixture(const char *name, ct_error *err)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", fixtures_dir(), name);
    return tokenizer_load(dir, err);
}

static bool ids_equal(const ct_ids *got, const json_value *want)
{
    if (!want || got->len != want->count) return false;
    for (size_t i = 0; i < got->len; i++)
        if (!want->items[i]->is_integer || want->items[i]->integer != (long long)got->data[i]) return false;
    return true;
}

/* A short printable view of a corpus string for failure messages. */
static const char *preview(const char *s, size_t n)
{
    static char buf[100];
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < sizeof buf; i++) {
        unsigned char c = (unsigned char)s[i];
        o += (size_t)snprintf(buf + o, sizeof buf - o, c >= 0x20 && c < 0x7F ? "%c" : "\\x%02x", c);
    }
    buf[o] = 0;
    return buf;
}

static size_t first_difference(const ct_ids *got, const json_value *want)
{
    size_t i = 0;
    while (i < got->len && i < want->count && want->items[i]->integer == (long long)got->data[i]) i++;
    return i;
}

/* Runs check(tokenizer, expected case, corpus string) over every fixture x string;
 * returns how many (tokenizer, string) pairs passed. */
typedef bool (*case_fn)(const ct_tokenizer *t, const json_value *want, const char *text, size_t len,
                        const char *name, size_t index);

static size_t over_fixtures(case_fn fn, size_t *total)
{
    ct_error err = {0};
    corpus c = {0};
    size_t ok = 0;
    *total = 0;
    if (!load_corpus(&c, &err)) { CHECK(0, "%s", err.msg); return 0; }
    for (size_t f = 0; f < N_FIXTURES; f++) {
        ct_tokenizer *t = load_fixture(fixture_names[f], &err);
        CHECK(t, "%s", err.msg);
        char path[512];
        snprintf(path, sizeof path, "%s/%s/expected.json", fixtures_dir(), fixture_names[f]);
        json_doc *d = t ? read_json(path, &err) : NULL;
        CHECK(!t || d, "%s", err.msg);
        const json_value *cases = d ? json_get_type(json_root(d), "cases", JSON_ARRAY) : NULL;
        CHECK(!d || (cases && cases->count == c.n), "%s: %zu cases for %zu corpus strings", path,
              cases ? cases->count : 0, c.n);
        for (size_t i = 0; cases && i < c.n && i < cases->count; i++, (*total)++)
            ok += fn(t, cases->items[i], c.text[i], c.len[i], fixture_names[f], i);
        json_free(d);
        tokenizer_free(t);
    }
    free_corpus(&c);
    return ok;
}

static bool encodes_as_hf(const ct_tokenizer *t, const json_value *want, const char *text, size_t len,
                          const char *name, size_t index)
{
    bool ok = true;
    for (int plain = 0; plain < 2; plain++) {
        ct_error err = {0};
        ct_ids ids = {0};
        const json_value *w = json_get_type(want, plain ? "ids_plain" : "ids", JSON_ARRAY);
        int rc = tokenizer_encode(t, text, len, !plain, &ids, &err);
        bool same = rc == CT_OK && ids_equal(&ids, w);
        if (!same) {
            size_t k = rc ? 0 : first_difference(&ids, w);
            CHECK(same, "%s: string %zu '%s' (parse_special %d): %zu ids, HF %zu; first difference at %zu: "
                  "got %lld, HF %lld %s", name, index, preview(text, len), !plain, ids.len, w ? w->count : 0, k,
                  k < ids.len ? (long long)ids.data[k] : -1LL, w && k < w->count ? w->items[k]->integer : -1LL,
                  rc ? err.msg : "");
        }
        ok = ok && same;
        ct_ids_free(&ids);
    }
    return ok;
}

TEST(every_fixture_tokenizer_encodes_every_corpus_string_as_hf)
{
    size_t total, ok = over_fixtures(encodes_as_hf, &total);
    printf("     encode: %zu of %zu (tokenizer, string) pairs equal HF's ids, with and without special tokens\n",
           ok, total);
    CHECK(total > 0 && ok == total, "%zu of %zu differ", total - ok, total);
}

static bool decodes_as_hf(const ct_tokenizer *t, const json_value *want, const char *text, size_t len,
                          const char *name, size_t index)
{
    ct_error err = {0};
    ct_ids ids = {0};
    bool ok = tokenizer_encode(t, text, len, true, &ids, &err) == CT_OK;
    for (int skip = 0; skip < 2 && ok; skip++) {
        const json_value *w = json_get_type(want, skip ? "decoded_skip" : "decoded", JSON_STRING);
        char *out = NULL;
        size_t n = 0;
        ok = tokenizer_decode(t, ids.data, ids.len, skip, &out, &n, &err) == CT_OK && w && n == w->string_len &&
             memcmp(out, w->string, n) == 0;
        CHECK(ok, "%s: string %zu '%s': decode (skip_special %d) gives '%s'", name, index, preview(text, len), skip,
              out ? preview(out, n) : err.msg);
        if (w && !ok) CHECK(0, "     HF: '%s'", preview(w->string, w->string_len));
        free(out);
    }
    ct_ids_free(&ids);
    return ok;
}

TEST(decode_of_encode_equals_hf_decode_on_every_fixture)
{
    size_t total, ok = over_fixtures(decodes_as_hf, &total);
    printf("     decode: %zu of %zu (tokenizer, string) pairs equal HF's text, with and without special tokens\n",
           ok, total);
    CHECK(total > 0 && ok == total, "%zu of %zu differ", total - ok, total);
}

/* ---- behaviours ---- */

static ct_ids encode_str(const ct_tokenizer *t, const char *s, bool special)
{
    ct_ids ids = {0};
    ct_error err = {0};
    CHECK(tokenizer_encode(t, s, strlen(s), special, &ids, &err) == CT_OK, "%s", err.msg);
    return ids;
}

TEST(invalid_utf8_encodes_as_replacement_characters)
{
    ct_error err = {0};
    ct_tokenizer *t = load_fixture("bl_qwen2", &err);
    REQUIRE(t, "%s", err.msg);
    /* E2 82 is one maximal ill-formed subpart (one U+FFFD); FF is another */
    ct_ids bad = encode_str(t, "a\xE2\x82z\xFF", true), good = encode_str(t, "a\xEF\xBF\xBDz\xEF\xBF\xBD", true);
    CHECK(bad.len == good.len && bad.len > 0 && !memcmp(bad.data, good.data, bad.len * sizeof *bad.data),
          "%zu ids vs %zu", bad.len, good.len);
    ct_ids_free(&bad);
    ct_ids_free(&good);
    tokenizer_free(t);
}

TEST(parse_special_false_encodes_special_tokens_as_text)
{
    ct_error err = {0};
    ct_tokenizer *t = load_fixture("bl_qwen2", &err);
    REQUIRE(t, "%s", err.msg);
    uint32_t im_end;
    REQUIRE(tokenizer_token_to_id(t, "<|im_end|>", 10, &im_end), "no <|im_end|>");
    ct_ids a = encode_str(t, "<|im_end|>", true), b = encode_str(t, "<|im_end|>", false);
    CHECK(a.len == 1 && a.data[0] == im_end, "parse_special: %zu ids", a.len);
    CHECK(b.len > 1, "plain: %zu ids", b.len);
    for (size_t i = 0; i < b.len; i++) CHECK(b.data[i] != im_end, "the special id came out of plain text");
    CHECK(tokenizer_is_special(t, im_end), "<|im_end|> is not special");
    ct_ids_free(&a);
    ct_ids_free(&b);
    tokenizer_free(t);
}

TEST(encode_appends_to_out)
{
    ct_error err = {0};
    ct_tokenizer *t = load_fixture("bl_llama3", &err);
    REQUIRE(t, "%s", err.msg);
    ct_ids ids = encode_str(t, "Hello", true);
    size_t first = ids.len;
    CHECK(tokenizer_encode(t, " world", 6, true, &ids, &err) == CT_OK, "%s", err.msg);
    ct_ids world = encode_str(t, " world", true);
    CHECK(ids.len == first + world.len && !memcmp(ids.data + first, world.data, world.len * sizeof *world.data),
          "appended %zu ids, alone %zu", ids.len - first, world.len);
    ct_ids_free(&ids);
    ct_ids_free(&world);
    tokenizer_free(t);
}

TEST(every_id_has_a_token_that_maps_back)
{
    ct_error err = {0};
    for (size_t f = 0; f < N_FIXTURES; f++) {
        ct_tokenizer *t = load_fixture(fixture_names[f], &err);
        REQUIRE(t, "%s", err.msg);
        size_t missing = 0, wrong = 0;
        for (uint32_t id = 0; id < tokenizer_vocab_size(t); id++) {
            size_t n;
            uint32_t back;
            const char *s = tokenizer_id_to_token(t, id, &n);
            if (!s) { missing++; continue; }
            /* a normalized added token is looked up by content, shown in its normalized form (as HF) */
            if (!tokenizer_token_to_id(t, s, n, &back) || back != id) wrong += strcmp(s, "\xE2\x96\x81<extra>") != 0 &&
                                                                               strcmp(s, "caf\xC3\xA9") != 0;
        }
        size_t n;
        CHECK(missing == 0 && wrong == 0, "%s: %zu ids without a token, %zu that map back elsewhere", fixture_names[f],
              missing, wrong);
        CHECK(!tokenizer_id_to_token(t, (uint32_t)tokenizer_vocab_size(t), &n), "an id past the vocab has a token");
        tokenizer_free(t);
    }
}

TEST(decode_skips_ids_without_a_token)
{
    ct_error err = {0};
    ct_tokenizer *t = load_fixture("bl_qwen2", &err);
    REQUIRE(t, "%s", err.msg);
    ct_ids ids = encode_str(t, "ab", true);
    uint32_t with_bad[8] = {0};
    memcpy(with_bad, ids.data, ids.len * sizeof *ids.data);
    with_bad[ids.len] = 99999999;
    char *a, *b;
    size_t na, nb;
    REQUIRE(tokenizer_decode(t, ids.data, ids.len, false, &a, &na, &err) == CT_OK, "%s", err.msg);
    REQUIRE(tokenizer_decode(t, with_bad, ids.len + 1, false, &b, &nb, &err) == CT_OK, "%s", err.msg);
    CHECK(na == 2 && nb == 2 && !strcmp(a, "ab") && !strcmp(b, "ab"), "'%s' / '%s'", a, b);
    free(a);
    free(b);
    ct_ids_free(&ids);
    tokenizer_free(t);
}

/* A minimal tokenizer.json around the given model / component fragments. */
static ct_tokenizer *load_text(const char *model, const char *extra, ct_error *err)
{
    char text[4096];
    snprintf(text, sizeof text, "{\"added_tokens\": [], %s%s\"model\": %s}", extra, *extra ? ", " : "",
             model ? model : "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}");
    return tokenizer_load_json(text, strlen(text), "x/tokenizer.json", err);
}

static void expect_input_error(const char *model, const char *extra, const char *want)
{
    ct_error err = {0};
    ct_tokenizer *t = load_text(model, extra, &err);
    CHECK(!t && err.code == CT_ERR_INPUT && strstr(err.msg, want), "want '%s', got '%s'", want, t ? "loaded" : err.msg);
    tokenizer_free(t);
}

TEST(unsupported_components_are_input_errors_naming_the_field)
{
    expect_input_error("{\"type\": \"WordPiece\", \"vocab\": {}}", "",
                       "x/tokenizer.json: model.type 'WordPiece' is not supported (expected BPE)");
    expect_input_error(NULL, "\"normalizer\": {\"type\": \"BertNormalizer\"}",
                       "normalizer.type 'BertNormalizer' is not supported");
    expect_input_error(NULL, "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}]}",
                       "pre_tokenizer.pretokenizers[0].type 'Digits' is not supported");
    expect_input_error(NULL, "\"decoder\": {\"type\": \"WordPiece\"}", "decoder.type 'WordPiece' is not supported");
    expect_input_error("{\"type\": \"BPE\", \"vocab\": {}, \"merges\": [], \"dropout\": 0.1}", "",
                       "model.dropout is not supported");
}

TEST(malformed_files_are_input_errors)
{
    expect_input_error("{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}", "",
                       "model.merges[0]: the right token 'b' is not in model.vocab");
    expect_input_error("{\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}", "", "out of range");
    expect_input_error(NULL, "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, "
                       "\"behavior\": \"Isolated\"}", "pre_tokenizer.pattern.Regex: cannot compile the regex");
    expect_input_error(NULL, "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"a\"}, "
                       "\"behavior\": \"Sideways\"}", "behavior 'Sideways' is not supported");
    ct_error err = {0};
    CHECK(!tokenizer_load("/nonexistent-folder", &err) && err.code != CT_OK &&
          strstr(err.msg, "/nonexistent-folder/tokenizer.json"), "%s", err.msg);
}

TEST(merges_apply_by_rank_not_by_position)
{
    /* "abc": (b c) ranks before (a b), so a + bc; then (a bc) is no merge */
    ct_error err = {0};
    ct_tokenizer *t = load_text("{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4},"
                                " \"merges\": [[\"b\", \"c\"], [\"a\", \"b\"]]}", "", &err);
    REQUIRE(t, "%s", err.msg);
    ct_ids ids = encode_str(t, "abc", true);
    CHECK(ids.len == 2 && ids.data[0] == 0 && ids.data[1] == 4, "%zu ids", ids.len);
    ct_ids_free(&ids);
    tokenizer_free(t);
}

typedef struct worker {
    const ct_tokenizer *t;
    const corpus *c;
    ct_ids *want;
    size_t mismatches;
} worker;

static void *encode_all(void *arg)
{
    worker *w = arg;
    for (int rep = 0; rep < 5; rep++)
        for (size_t i = 0; i < w->c->n; i++) {
            ct_ids ids = {0};
            ct_error err;
            tokenizer_encode(w->t, w->c->text[i], w->c->len[i], true, &ids, &err);
            w->mismatches += ids.len != w->want[i].len ||
                             (ids.len && memcmp(ids.data, w->want[i].data, ids.len * sizeof *ids.data) != 0);
            ct_ids_free(&ids);
        }
    return NULL;
}

TEST(concurrent_encodes_on_one_tokenizer_agree_with_serial_ones)
{
    ct_error err = {0};
    corpus c = {0};
    REQUIRE(load_corpus(&c, &err), "%s", err.msg);
    ct_tokenizer *t = load_fixture("bl_qwen2", &err);
    REQUIRE(t, "%s", err.msg);
    ct_ids *want = ct_calloc(c.n, sizeof *want);
    for (size_t i = 0; i < c.n; i++) tokenizer_encode(t, c.text[i], c.len[i], true, &want[i], &err);
    worker w[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        w[k] = (worker){t, &c, want, 0};
        pthread_create(&th[k], NULL, encode_all, &w[k]);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        CHECK(w[k].mismatches == 0, "thread %d: %zu encodes differ", k, w[k].mismatches);
    }
    for (size_t i = 0; i < c.n; i++) ct_ids_free(&want[i]);
    free(want);
    tokenizer_free(t);
    free_corpus(&c);
}

int main(void)
{
    RUN(every_fixture_tokenizer_encodes_every_corpus_string_as_hf);
    RUN(decode_of_encode_equals_hf_decode_on_every_fixture);
    RUN(invalid_utf8_encodes_as_replacement_characters);
    RUN(parse_special_false_encodes_special_tokens_as_text);
    RUN(encode_appends_to_out);
    RUN(every_id_has_a_token_that_maps_back);
    RUN(decode_skips_ids_without_a_token);
    RUN(unsupported_components_are_input_errors_naming_the_field);
    RUN(malformed_files_are_input_errors);
    RUN(merges_apply_by_rank_not_by_position);
    RUN(concurrent_encodes_on_one_tokenizer_agree_with_serial_ones);
    return check_summary();
}
