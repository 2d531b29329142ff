/* fuzz_json.c — the JSON reader (json_parse) on arbitrary bytes.
 * Invariants: no crash or leak; a document that parses, written back with the
 * json writer, parses again and writes back to the same text (the writer emits
 * what the reader accepts). Strings holding U+0000 are left out of the round
 * trip: the writer takes C strings, so it cannot write them (json.h). */
#include <stdbool.h>
#include <string.h>

#include "fuzz.h"
#include "json.h"

/* Keys carry no length in json_value, so look for the escape in the text: a
 * "\u0000" anywhere (even a literal one) only skips the round trip. */
static bool json_fuzz_may_hold_nul(const uint8_t *data, size_t size)
{
    for (size_t i = 0; i + 6 <= size; i++)
        if (!memcmp(data + i, "\\u0000", 6)) return true;
    return false;
}

static void json_fuzz_write(json_writer *w, const json_value *v)
{
    switch (v->type) {
    case JSON_NULL: json_write_raw(w, "null"); break;
    case JSON_BOOL: json_write_raw(w, v->boolean ? "true" : "false"); break;
    case JSON_NUMBER: json_write_number(w, v->number); break;
    case JSON_STRING: json_write_string(w, v->string); break;
    case JSON_ARRAY:
    case JSON_OBJECT:
        json_write_raw(w, v->type == JSON_ARRAY ? "[" : "{");
        for (size_t i = 0; i < v->count; i++) {
            if (i) json_write_raw(w, ",");
            if (v->type == JSON_OBJECT) {
                json_write_string(w, v->keys[i]);
                json_write_raw(w, ":");
            }
            json_fuzz_write(w, v->items[i]);
        }
        json_write_raw(w, v->type == JSON_ARRAY ? "]" : "}");
        break;
    }
}

/* The typed getters on every member of every object: they must fail cleanly. */
static void json_fuzz_read_members(const json_value *v)
{
    ct_error err;
    for (size_t i = 0; i < v->count; i++) {
        if (v->type == JSON_OBJECT) {
            long long n;
            double d;
            bool b;
            json_get_int(v, v->keys[i], 0, &n, "fuzz", &err);
            json_get_double(v, v->keys[i], 0, &d, "fuzz", &err);
            json_get_bool(v, v->keys[i], false, &b, "fuzz", &err);
        }
        json_fuzz_read_members(v->items[i]);
    }
}

int fuzz_json(const uint8_t *data, size_t size)
{
    ct_error err;
    json_doc *doc = json_parse((const char *)data, size, "fuzz.json", &err);
    if (!doc) return 0;
    const json_value *root = json_root(doc);
    json_fuzz_read_members(root);
    if (!json_fuzz_may_hold_nul(data, size)) {
        json_writer w1, w2;
        json_writer_init(&w1);
        json_writer_init(&w2);
        json_fuzz_write(&w1, root);
        json_doc *back = json_parse(w1.buf, w1.len, "written", &err);
        FUZZ_ASSERT(back, "written JSON does not parse back: %s", err.msg);
        json_fuzz_write(&w2, json_root(back));
        FUZZ_ASSERT(w1.len == w2.len && !memcmp(w1.buf, w2.buf, w1.len), "JSON write is not stable");
        json_free(back);
        json_writer_free(&w1);
        json_writer_free(&w2);
    }
    json_free(doc);
    return 0;
}

CT_FUZZ_MAIN(fuzz_json)
