/* json.h — a small strict JSON reader (RFC 8259) and a writer, for config.json,
 * safetensors headers, index files and adapter_config.json.
 *
 * The reader builds an immutable tree in one arena owned by the json_doc; every
 * pointer into it lives until json_free. Limits guard untrusted input: nesting
 * depth <= 64, duplicate object keys are an error, numbers must be finite.
 * Errors name the source and byte offset: "PATH: offset 123: expected ':'". */
#ifndef CT_JSON_H
#define CT_JSON_H

#include <stdio.h>
#include "common.h"

/* The largest JSON file (config.json, index files) read whole: the same bound
 * as a safetensors header, so no small-file reader trusts an unbounded size. */
#define CT_JSON_MAX_BYTES ((size_t)100000000)

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value json_value;
struct json_value {
    json_type type;
    bool boolean;
    double number;
    bool is_integer;          /* the literal had no fraction or exponent and fits a long long */
    long long integer;        /* its exact value when is_integer */
    const char *string;       /* NUL-terminated, UTF-8 (escapes decoded) */
    size_t string_len;
    size_t count;             /* array items or object members */
    json_value **items;       /* array items, or object member values */
    const char **keys;        /* object member keys (same order as in the text) */
};

typedef struct json_doc json_doc;

/* Parses text[0..len) (need not be NUL-terminated). source names it in errors. */
json_doc *json_parse(const char *text, size_t len, const char *source, ct_error *err);
/* json_parse of the file at path (at most CT_JSON_MAX_BYTES), path naming it in errors. */
json_doc *json_parse_file(const char *path, ct_error *err);
const json_value *json_root(const json_doc *doc);
void json_free(json_doc *doc);

/* Lookups return NULL when absent or of another type. */
const json_value *json_get(const json_value *obj, const char *key);
const json_value *json_get_type(const json_value *obj, const char *key, json_type type);

/* Typed member reads with a default when absent. They fail (CT_ERR_INPUT,
 * "SOURCE: key 'k': expected an integer, found a string") on a wrong type. */
int json_get_int(const json_value *obj, const char *key, long long dflt, long long *out,
                 const char *source, ct_error *err);
int json_get_double(const json_value *obj, const char *key, double dflt, double *out,
                    const char *source, ct_error *err);
int json_get_bool(const json_value *obj, const char *key, bool dflt, bool *out,
                  const char *source, ct_error *err);

/* Writer: a growable buffer with helpers that emit valid JSON (escaping strings). */
typedef struct json_writer {
    char *buf;
    size_t len, cap;
} json_writer;
void json_writer_init(json_writer *w);
void json_writer_free(json_writer *w);
void json_write_raw(json_writer *w, const char *s);
void json_write_rawf(json_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void json_write_string(json_writer *w, const char *s);   /* quoted and escaped */
/* s[0..n), which may hold NUL bytes (written as \u0000). */
void json_write_string_n(json_writer *w, const char *s, size_t n);
/* Shortest text that reads back as v; integral values without ".0"; NaN and
 * infinities (which JSON cannot express) are written as null. */
void json_write_number(json_writer *w, double v);

#endif
