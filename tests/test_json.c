/* test_json.c — the strict JSON reader and the writer (src/common/json.h). */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "json.h"

static json_doc *parse(const char *text, ct_error *err)
{
    return json_parse(text, strlen(text), "t.json", err);
}

/* Parses text expecting failure; returns whether the message holds want. */
static int rejects(const char *text, const char *want, ct_error *err)
{
    json_doc *d = parse(text, err);
    if (d) { json_free(d); return 0; }
    return err->code == CT_ERR_INPUT && strstr(err->msg, want) != NULL;
}

TEST(parses_object_with_every_value_type)
{
    ct_error err = {0};
    json_doc *d = parse(" {\"n\": null, \"b\": true, \"f\": false, \"x\": -12, \"s\": \"hi\", \"a\": [1, [2]], \"o\": {}} ", &err);
    REQUIRE(d, "parse failed: %s", err.msg);
    const json_value *r = json_root(d);
    CHECK(r->type == JSON_OBJECT && r->count == 7, "root type %d count %zu", r->type, r->count);
    CHECK(strcmp(r->keys[0], "n") == 0 && strcmp(r->keys[6], "o") == 0, "keys out of text order");
    CHECK(json_get(r, "n")->type == JSON_NULL, "n");
    CHECK(json_get_type(r, "b", JSON_BOOL)->boolean == true, "b");
    CHECK(json_get_type(r, "f", JSON_BOOL)->boolean == false, "f");
    const json_value *x = json_get_type(r, "x", JSON_NUMBER);
    CHECK(x && x->is_integer && x->integer == -12 && x->number == -12.0, "x");
    const json_value *s = json_get_type(r, "s", JSON_STRING);
    CHECK(s && strcmp(s->string, "hi") == 0 && s->string_len == 2, "s");
    const json_value *a = json_get_type(r, "a", JSON_ARRAY);
    CHECK(a && a->count == 2 && a->items[1]->type == JSON_ARRAY && a->items[1]->items[0]->integer == 2, "a");
    CHECK(json_get_type(r, "o", JSON_OBJECT)->count == 0, "o");
    CHECK(json_get(r, "missing") == NULL && json_get_type(r, "s", JSON_NUMBER) == NULL, "absent / wrong type lookups");
    json_free(d);
}

TEST(parses_scalars_at_top_level)
{
    ct_error err = {0};
    const char *docs[] = {"0", "\"\"", "true", "null", "[]", "{}", " \t\r\n7\n"};
    for (size_t i = 0; i < sizeof docs / sizeof *docs; i++) {
        json_doc *d = parse(docs[i], &err);
        CHECK(d != NULL, "'%s' rejected: %s", docs[i], err.msg);
        json_free(d);
    }
}

TEST(parses_numbers_per_grammar)
{
    ct_error err = {0};
    json_doc *d = parse("[0, -0, 1.5, -2.25e2, 1E-3, 3e+1, 9223372036854775807, 9223372036854775808]", &err);
    REQUIRE(d, "%s", err.msg);
    json_value **it = json_root(d)->items;
    CHECK(it[0]->is_integer && it[0]->integer == 0, "0");
    CHECK(it[1]->is_integer && it[1]->integer == 0, "-0");
    CHECK(!it[2]->is_integer && it[2]->number == 1.5, "1.5");
    CHECK(!it[3]->is_integer && it[3]->number == -225.0, "-2.25e2");
    CHECK(it[4]->number == 1e-3, "1E-3");
    CHECK(!it[5]->is_integer && it[5]->number == 30.0, "3e+1 has an exponent so is not an integer literal");
    CHECK(it[6]->is_integer && it[6]->integer == INT64_MAX, "int64 max");
    CHECK(!it[7]->is_integer && it[7]->number == 9223372036854775808.0, "2^63 does not fit a long long");
    json_free(d);
}

TEST(decodes_simple_escapes)
{
    ct_error err = {0};
    json_doc *d = parse("\"a\\\"b\\\\c\\/d\\be\\ff\\ng\\rh\\ti\"", &err);
    REQUIRE(d, "%s", err.msg);
    CHECK(strcmp(json_root(d)->string, "a\"b\\c/d\be\ff\ng\rh\ti") == 0, "got '%s'", json_root(d)->string);
    json_free(d);
}

TEST(decodes_unicode_escapes_and_surrogate_pairs)
{
    ct_error err = {0};
    json_doc *d = parse("\"\\u0041\\u00e9\\u20AC\\ud83d\\ude00\"", &err);
    REQUIRE(d, "%s", err.msg);
    const json_value *v = json_root(d);
    const char want[] = "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
    CHECK(v->string_len == sizeof want - 1 && memcmp(v->string, want, sizeof want) == 0, "got %zu bytes", v->string_len);
    json_free(d);
}

TEST(keeps_nul_escape_with_its_length)
{
    ct_error err = {0};
    json_doc *d = parse("{\"a\": \"x\\u0000y\", \"a\\u0000\": 1}", &err);
    REQUIRE(d, "keys differing after \\u0000 are distinct: %s", err.msg);
    const json_value *v = json_get(json_root(d), "a");
    CHECK(v && v->string_len == 3 && v->string[1] == '\0' && v->string[2] == 'y', "string_len %zu", v ? v->string_len : 0);
    json_free(d);
}

TEST(keeps_raw_utf8)
{
    ct_error err = {0};
    json_doc *d = parse("\"caf\xc3\xa9 \xe2\x82\xac\"", &err);
    REQUIRE(d, "%s", err.msg);
    CHECK(strcmp(json_root(d)->string, "caf\xc3\xa9 \xe2\x82\xac") == 0, "utf-8 changed");
    json_free(d);
}

TEST(rejects_unpaired_surrogates)
{
    ct_error err = {0};
    CHECK(rejects("\"\\ud83d\"", "surrogate", &err), "lone high: %s", err.msg);
    CHECK(rejects("\"\\ud83dx\"", "surrogate", &err), "high then text: %s", err.msg);
    CHECK(rejects("\"\\ude00\"", "surrogate", &err), "lone low: %s", err.msg);
    CHECK(rejects("\"\\ud83d\\u0041\"", "surrogate", &err), "high then non-low: %s", err.msg);
}

TEST(rejects_bad_escapes)
{
    ct_error err = {0};
    CHECK(rejects("\"\\x\"", "invalid escape", &err), "%s", err.msg);
    CHECK(rejects("\"\\u12\"", "hex digits", &err), "%s", err.msg);
    CHECK(rejects("\"\\u12g4\"", "hex digits", &err), "%s", err.msg);
}

TEST(rejects_invalid_utf8)
{
    ct_error err = {0};
    CHECK(rejects("\"\xff\"", "UTF-8", &err), "0xff: %s", err.msg);
    CHECK(rejects("\"\xc0\xaf\"", "UTF-8", &err), "overlong: %s", err.msg);
    CHECK(rejects("\"\xed\xa0\x80\"", "UTF-8", &err), "encoded surrogate: %s", err.msg);
    CHECK(rejects("\"\xe2\x82\"", "UTF-8", &err), "cut sequence: %s", err.msg);
}

TEST(rejects_trailing_commas)
{
    ct_error err = {0};
    CHECK(rejects("[1, 2,]", "expected a value", &err), "array: %s", err.msg);
    CHECK(rejects("{\"a\": 1,}", "expected a string key", &err), "object: %s", err.msg);
}

TEST(rejects_leading_zeros)
{
    ct_error err = {0};
    CHECK(rejects("012", "leading zeros", &err), "%s", err.msg);
    CHECK(rejects("[-01]", "leading zeros", &err), "%s", err.msg);
}

TEST(rejects_malformed_numbers)
{
    ct_error err = {0};
    const char *bad[] = {"1.", "-", ".5", "+1", "1e", "1e+", "0x10", "1.e5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(rejects(bad[i], "offset", &err), "'%s' accepted or wrong error: %s", bad[i], err.msg);
}

TEST(rejects_nan_infinity_and_overflow)
{
    ct_error err = {0};
    CHECK(rejects("NaN", "expected a value", &err), "%s", err.msg);
    CHECK(rejects("[Infinity]", "expected a value", &err), "%s", err.msg);
    CHECK(rejects("-Infinity", "expected a digit", &err), "%s", err.msg);
    CHECK(rejects("1e999", "out of range", &err), "%s", err.msg);
}

TEST(rejects_unterminated_string)
{
    ct_error err = {0};
    CHECK(rejects("{\"a\": \"abc", "unterminated string", &err), "%s", err.msg);
    CHECK(rejects("\"abc\\\"", "unterminated string", &err), "escaped quote is not a close: %s", err.msg);
}

TEST(rejects_raw_control_characters_in_strings)
{
    ct_error err = {0};
    CHECK(rejects("\"a\nb\"", "control character 0x0a", &err), "%s", err.msg);
    CHECK(rejects("\"a\tb\"", "control character 0x09", &err), "%s", err.msg);
}

static char *nested(int depth)
{
    char *s = malloc((size_t)depth * 2 + 1);
    for (int i = 0; i < depth; i++) { s[i] = '['; s[depth * 2 - 1 - i] = ']'; }
    s[depth * 2] = '\0';
    return s;
}

TEST(accepts_nesting_depth_64)
{
    ct_error err = {0};
    char *s = nested(64);
    json_doc *d = parse(s, &err);
    CHECK(d != NULL, "%s", err.msg);
    json_free(d);
    free(s);
}

TEST(rejects_nesting_depth_65)
{
    ct_error err = {0};
    char *s = nested(65);
    CHECK(rejects(s, "nesting deeper than 64", &err), "%s", err.msg);
    free(s);
}

TEST(rejects_duplicate_keys)
{
    ct_error err = {0};
    CHECK(rejects("{\"a\": 1, \"b\": 2, \"a\": 3}", "duplicate key 'a'", &err), "%s", err.msg);
    CHECK(strstr(err.msg, "offset 17") != NULL, "the later key's offset: %s", err.msg);
    CHECK(rejects("{\"x\": {\"k\": 1, \"k\": 1}}", "duplicate key 'k'", &err), "nested: %s", err.msg);
}

TEST(rejects_trailing_garbage)
{
    ct_error err = {0};
    CHECK(rejects("{} x", "end of the input", &err), "%s", err.msg);
    CHECK(rejects("1 2", "end of the input", &err), "%s", err.msg);
    CHECK(rejects("truex", "end of the input", &err), "%s", err.msg);
}

TEST(rejects_every_truncation_of_a_valid_document)
{
    const char *full = "{\"a\": [1, -2.5e3, true, null, \"s\\u00e9\"], \"b\": {\"c\": false}}";
    ct_error err = {0};
    json_doc *d = parse(full, &err);
    REQUIRE(d, "the full document must parse: %s", err.msg);
    json_free(d);
    for (size_t n = 0; n < strlen(full); n++) {
        d = json_parse(full, n, "t.json", &err);
        CHECK(d == NULL, "prefix of %zu bytes accepted", n);
        json_free(d);
    }
}

TEST(rejects_empty_input_and_bare_words)
{
    ct_error err = {0};
    CHECK(rejects("", "expected a value, found the end of the input", &err), "%s", err.msg);
    CHECK(rejects("   ", "expected a value", &err), "%s", err.msg);
    CHECK(rejects("nul", "expected a value", &err), "%s", err.msg);
    CHECK(rejects("{a: 1}", "expected a string key", &err), "%s", err.msg);
    CHECK(rejects("{\"a\" 1}", "expected ':'", &err), "%s", err.msg);
    CHECK(rejects("[1 2]", "expected ',' or ']'", &err), "%s", err.msg);
}

TEST(error_names_source_and_offset)
{
    ct_error err = {0};
    json_doc *d = json_parse("[1, }", 5, "cfg/config.json", &err);
    CHECK(d == NULL, "accepted");
    CHECK(strcmp(err.msg, "cfg/config.json: offset 4: expected a value, found '}'") == 0, "got '%s'", err.msg);
}

TEST(never_reads_past_len)
{
    /* The text is not NUL-terminated: parsing "12" out of "123" must stop at len. */
    char buf[3] = {'1', '2', '3'};
    ct_error err = {0};
    json_doc *d = json_parse(buf, 2, "t", &err);
    REQUIRE(d, "%s", err.msg);
    CHECK(json_root(d)->integer == 12, "got %lld", json_root(d)->integer);
    json_free(d);
    char str[4] = {'"', 'a', 'b', '"'};
    d = json_parse(str, 3, "t", &err);
    CHECK(d == NULL && strstr(err.msg, "unterminated"), "a string cut by len: %s", err.msg);
}

TEST(get_int_accepts_integral_values_only)
{
    ct_error err = {0};
    json_doc *d = parse("{\"a\": 7, \"b\": 1e3, \"c\": 2.0, \"d\": 1.5, \"e\": \"7\", \"f\": 1e19}", &err);
    REQUIRE(d, "%s", err.msg);
    const json_value *r = json_root(d);
    long long v = 0;
    CHECK(json_get_int(r, "a", 0, &v, "c.json", &err) == CT_OK && v == 7, "a");
    CHECK(json_get_int(r, "b", 0, &v, "c.json", &err) == CT_OK && v == 1000, "1e3");
    CHECK(json_get_int(r, "c", 0, &v, "c.json", &err) == CT_OK && v == 2, "2.0");
    CHECK(json_get_int(r, "zz", 42, &v, "c.json", &err) == CT_OK && v == 42, "default");
    CHECK(json_get_int(r, "d", 0, &v, "c.json", &err) == CT_ERR_INPUT, "1.5 accepted");
    CHECK(json_get_int(r, "f", 0, &v, "c.json", &err) == CT_ERR_INPUT, "1e19 is beyond int64");
    CHECK(json_get_int(r, "e", 0, &v, "c.json", &err) == CT_ERR_INPUT, "string accepted");
    CHECK(strcmp(err.msg, "c.json: key 'e': expected an integer, found a string") == 0, "got '%s'", err.msg);
    json_free(d);
}

TEST(get_double_and_get_bool_check_types)
{
    ct_error err = {0};
    json_doc *d = parse("{\"x\": 0.25, \"t\": true, \"s\": \"no\"}", &err);
    REQUIRE(d, "%s", err.msg);
    const json_value *r = json_root(d);
    double x = 0;
    bool b = false;
    CHECK(json_get_double(r, "x", 1, &x, "c", &err) == CT_OK && x == 0.25, "x");
    CHECK(json_get_double(r, "zz", 1.5, &x, "c", &err) == CT_OK && x == 1.5, "default");
    CHECK(json_get_double(r, "t", 1, &x, "c", &err) == CT_ERR_INPUT && strstr(err.msg, "expected a number"), "%s", err.msg);
    CHECK(json_get_bool(r, "t", false, &b, "c", &err) == CT_OK && b, "t");
    CHECK(json_get_bool(r, "zz", true, &b, "c", &err) == CT_OK && b, "default");
    CHECK(json_get_bool(r, "s", false, &b, "c", &err) == CT_ERR_INPUT && strstr(err.msg, "key 's'"), "%s", err.msg);
    json_free(d);
}

TEST(writer_escapes_strings)
{
    json_writer w;
    json_writer_init(&w);
    json_write_string(&w, "q\"b\\n\nt\tc\x01\x1f" "\xc3\xa9");
    CHECK(strcmp(w.buf, "\"q\\\"b\\\\n\\nt\\tc\\u0001\\u001f\xc3\xa9\"") == 0, "got %s", w.buf);
    json_writer_free(&w);
}

TEST(writer_numbers_are_shortest_and_integers_plain)
{
    struct { double v; const char *want; } cases[] = {
        {0, "0"}, {42, "42"}, {-7, "-7"}, {1e15, "1000000000000000"}, {0.1, "0.1"},
        {-2.5, "-2.5"}, {1e-7, "1e-07"}, {1e300, "1e+300"}, {0.30000000000000004, "0.30000000000000004"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_writer w;
        json_writer_init(&w);
        json_write_number(&w, cases[i].v);
        CHECK(strcmp(w.buf, cases[i].want) == 0, "%.17g wrote '%s', want '%s'", cases[i].v, w.buf, cases[i].want);
        json_writer_free(&w);
    }
    json_writer w;
    json_writer_init(&w);
    json_write_number(&w, NAN);
    CHECK(strcmp(w.buf, "null") == 0, "NaN wrote '%s'", w.buf);
    json_writer_free(&w);
}

TEST(writer_output_round_trips_through_parser)
{
    const char *strs[] = {"plain", "with \"quotes\" and \\", "ctrl\x01\x02\n\r\t\b\f", "utf8 \xf0\x9f\x98\x80", ""};
    double nums[] = {1.0 / 3, -1e-300, 6.02214076e23, 123456789, 0.5};
    json_writer w;
    json_writer_init(&w);
    json_write_raw(&w, "{\"s\":[");
    for (size_t i = 0; i < 5; i++) { if (i) json_write_raw(&w, ","); json_write_string(&w, strs[i]); }
    json_write_raw(&w, "],\"n\":[");
    for (size_t i = 0; i < 5; i++) { if (i) json_write_raw(&w, ","); json_write_number(&w, nums[i]); }
    json_write_rawf(&w, "],\"k\":%d}", 3);
    ct_error err = {0};
    json_doc *d = json_parse(w.buf, w.len, "w", &err);
    REQUIRE(d, "writer output did not parse: %s (%s)", err.msg, w.buf);
    const json_value *s = json_get_type(json_root(d), "s", JSON_ARRAY), *n = json_get_type(json_root(d), "n", JSON_ARRAY);
    REQUIRE(s && n && s->count == 5 && n->count == 5, "shape of output");
    for (size_t i = 0; i < 5; i++) {
        CHECK(strcmp(s->items[i]->string, strs[i]) == 0, "string %zu changed", i);
        CHECK(n->items[i]->number == nums[i], "number %zu: %.17g != %.17g", i, n->items[i]->number, nums[i]);
    }
    json_free(d);
    json_writer_free(&w);
}

TEST(survives_random_mutations_with_one_line_errors)
{
    /* Mutated documents either parse or fail with "SOURCE: offset N: ..." on one
     * line; ASan builds catch any read past the (unterminated) buffer. */
    const char *seed = "{\"a\": [1, -2.5e3, true, null, \"s\\u00e9\\ud83d\\ude00\"], \"b\": {\"c\": false, \"d\": \"x\\n\"}}";
    size_t n = strlen(seed);
    char *b = malloc(n);
    ct_rng rng;
    ct_rng_seed(&rng, 99);
    static const char pool[] = "{}[],:\"0123456789-+eE. \\u\x00\x1f\x80\xc3\xed\xf4\xffntrfalse";
    size_t pool_len = sizeof pool - 1; /* pool holds a NUL byte, so not strlen */
    for (int iter = 0; iter < 5000; iter++) {
        memcpy(b, seed, n);
        int edits = 1 + (int)ct_rng_below(&rng, 3);
        for (int e = 0; e < edits; e++) b[ct_rng_below(&rng, n)] = pool[ct_rng_below(&rng, pool_len)];
        size_t len = ct_rng_below(&rng, 4) == 0 ? (size_t)ct_rng_below(&rng, n + 1) : n;
        char *copy = malloc(len ? len : 1);
        memcpy(copy, b, len);
        ct_error err = {0};
        json_doc *d = json_parse(copy, len, "fz", &err);
        if (!d) CHECK(strncmp(err.msg, "fz: offset ", 11) == 0 && !strchr(err.msg, '\n'), "iteration %d: %s", iter, err.msg);
        json_free(d);
        free(copy);
    }
    free(b);
}

int main(void)
{
    RUN(parses_object_with_every_value_type);
    RUN(parses_scalars_at_top_level);
    RUN(parses_numbers_per_grammar);
    RUN(decodes_simple_escapes);
    RUN(decodes_unicode_escapes_and_surrogate_pairs);
    RUN(keeps_nul_escape_with_its_length);
    RUN(keeps_raw_utf8);
    RUN(rejects_unpaired_surrogates);
    RUN(rejects_bad_escapes);
    RUN(rejects_invalid_utf8);
    RUN(rejects_trailing_commas);
    RUN(rejects_leading_zeros);
    RUN(rejects_malformed_numbers);
    RUN(rejects_nan_infinity_and_overflow);
    RUN(rejects_unterminated_string);
    RUN(rejects_raw_control_characters_in_strings);
    RUN(accepts_nesting_depth_64);
    RUN(rejects_nesting_depth_65);
    RUN(rejects_duplicate_keys);
    RUN(rejects_trailing_garbage);
    RUN(rejects_every_truncation_of_a_valid_document);
    RUN(rejects_empty_input_and_bare_words);
    RUN(error_names_source_and_offset);
    RUN(never_reads_past_len);
    RUN(get_int_accepts_integral_values_only);
    RUN(get_double_and_get_bool_check_types);
    RUN(writer_escapes_strings);
    RUN(writer_numbers_are_shortest_and_integers_plain);
    RUN(writer_output_round_trips_through_parser);
    RUN(survives_random_mutations_with_one_line_errors);
    return check_summary();
}
