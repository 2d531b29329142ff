/* json.c — see json.h. A recursive-descent parser over a length-bounded buffer
 * (the text need not be NUL-terminated, so every read is checked against len),
 * and a writer on a growable buffer.
 *
 * Memory: all values, strings and item arrays live in an arena of blocks owned by
 * the json_doc, so json_free is one walk and no value is freed alone. While a
 * container is being parsed its members wait on one shared scratch stack (inner
 * containers push above and pop before the outer one closes), then are copied
 * into the arena as one exact-size array: no per-container growable vectors to
 * leak on an error path. */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64
#define ARENA_BLOCK_MIN ((size_t)64 * 1024)

// ---- arena ----

typedef struct arena_block {
    struct arena_block *next;
    size_t cap, used;
    max_align_t data[]; /* max_align_t so every allocation can hold any type */
} arena_block;

struct json_doc {
    arena_block *blocks; /* newest first */
    json_value *root;
};

static void *arena_alloc(json_doc *doc, size_t n)
{
    size_t a = sizeof(max_align_t);
    CT_ASSERT(n <= SIZE_MAX - a, "json: arena request of %zu bytes overflows", n);
    n = (n + a - 1) / a * a;
    arena_block *b = doc->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > ARENA_BLOCK_MIN ? n : ARENA_BLOCK_MIN;
        CT_ASSERT(cap <= SIZE_MAX - sizeof(arena_block), "json: arena block of %zu bytes overflows", cap);
        b = ct_malloc(sizeof(arena_block) + cap);
        b->cap = cap;
        b->used = 0;
        b->next = doc->blocks;
        doc->blocks = b;
    }
    void *p = (unsigned char *)b->data + b->used;
    b->used += n;
    return p;
}

// ---- parser ----

typedef struct slot {
    json_value *value;
    const char *key;  /* NULL for array items */
    size_t key_len;   /* keys may hold \u0000, so duplicates compare by length too */
    size_t key_off;   /* where the key starts, for the duplicate-key error */
} slot;

typedef struct parser {
    const char *s;
    size_t len, pos;
    const char *source;
    ct_error *err;
    json_doc *doc;
    int depth;
    slot *stack;
    size_t top, cap;
    char *num;        /* NUL-terminated copy of a number literal for strtod */
    size_t num_cap;
} parser;

static int fail_at(parser *p, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_at(parser *p, size_t off, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return CT_FAIL_INPUT(p->err, "%s: offset %zu: %s", p->source, off, what);
}

/* Describes the byte at pos for "expected X, found Y" messages. */
static const char *found(const parser *p, char *buf, size_t n)
{
    if (p->pos >= p->len) return "the end of the input";
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c >= 0x20 && c < 0x7f) snprintf(buf, n, "'%c'", c);
    else snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

/* Copies at most 60 bytes of a key, control bytes as '?', so a message stays one line. */
static void sanitize(char *dst, size_t n, const char *src, size_t src_len)
{
    size_t k = 0;
    for (size_t i = 0; i < src_len && k + 4 < n && i < 60; i++)
        dst[k++] = (unsigned char)src[i] < 0x20 ? '?' : src[i];
    if (src_len > 60 && k + 4 < n) { dst[k++] = '.'; dst[k++] = '.'; dst[k++] = '.'; }
    dst[k] = '\0';
}

static void skip_ws(parser *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int expect_char(parser *p, char c, const char *what)
{
    if (p->pos < p->len && p->s[p->pos] == c) { p->pos++; return CT_OK; }
    char b[16];
    return fail_at(p, p->pos, "expected %s, found %s", what, found(p, b, sizeof b));
}

static json_value *new_value(parser *p, json_type t)
{
    json_value *v = arena_alloc(p->doc, sizeof *v);
    memset(v, 0, sizeof *v);
    v->type = t;
    return v;
}

static void push(parser *p, slot s)
{
    if (p->top == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        size_t bytes;
        CT_ASSERT(ct_size_mul(cap, sizeof(slot), &bytes), "json: scratch stack overflows");
        p->stack = ct_realloc(p->stack, bytes);
        p->cap = cap;
    }
    p->stack[p->top++] = s;
}

static int hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9') d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = (unsigned)(c - 'A' + 10);
        else return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f)); return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f)); return 4;
}

/* Length of the well-formed UTF-8 sequence at s[0..n), or 0 if it is not one
 * (overlong forms, UTF-16 surrogates and code points past U+10FFFF are rejected). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) { len = 3; if (c == 0xe0) lo = 0xa0; if (c == 0xed) hi = 0x9f; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; if (c == 0xf0) lo = 0x90; if (c == 0xf4) hi = 0x8f; }
    else return 0;
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return len;
}

/* Parses the string starting at the opening quote at p->pos. Decoding never
 * grows the text (an escape of k bytes yields at most k bytes of UTF-8), so the
 * raw span bounds the arena buffer. */
static int parse_string(parser *p, const char **out, size_t *out_len)
{
    size_t open = p->pos, start = p->pos + 1, end = start;
    while (end < p->len && p->s[end] != '"') {
        unsigned char c = (unsigned char)p->s[end];
        if (c < 0x20) return fail_at(p, end, "control character 0x%02x inside a string (it must be escaped)", c);
        end += c == '\\' ? 2 : 1;
    }
    if (end >= p->len) return fail_at(p, open, "unterminated string (no closing '\"' before the end of the input)");
    char *o = arena_alloc(p->doc, end - start + 1);
    size_t k = 0, i = start;
    while (i < end) {
        unsigned char c = (unsigned char)p->s[i];
        if (c != '\\') {
            size_t n = utf8_seq((const unsigned char *)p->s + i, end - i);
            if (!n) return fail_at(p, i, "invalid UTF-8 byte 0x%02x in a string", c);
            memcpy(o + k, p->s + i, n);
            k += n;
            i += n;
            continue;
        }
        char e = p->s[i + 1]; /* i + 1 < end: the scan above stepped over whole escapes */
        switch (e) {
        case '"': o[k++] = '"'; i += 2; continue;
        case '\\': o[k++] = '\\'; i += 2; continue;
        case '/': o[k++] = '/'; i += 2; continue;
        case 'b': o[k++] = '\b'; i += 2; continue;
        case 'f': o[k++] = '\f'; i += 2; continue;
        case 'n': o[k++] = '\n'; i += 2; continue;
        case 'r': o[k++] = '\r'; i += 2; continue;
        case 't': o[k++] = '\t'; i += 2; continue;
        case 'u': break;
        default: return fail_at(p, i, "invalid escape '\\%c' in a string", (unsigned char)e >= 0x20 && (unsigned char)e < 0x7f ? e : '?');
        }
        unsigned cp;
        if (end - i < 6 || hex4(p->s + i + 2, &cp) != 0)
            return fail_at(p, i, "expected 4 hex digits after '\\u'");
        i += 6;
        if (cp >= 0xdc00 && cp <= 0xdfff)
            return fail_at(p, i - 6, "unpaired low surrogate \\u%04x", cp);
        if (cp >= 0xd800 && cp <= 0xdbff) {
            unsigned lo;
            if (end - i < 6 || p->s[i] != '\\' || p->s[i + 1] != 'u' || hex4(p->s + i + 2, &lo) != 0 ||
                lo < 0xdc00 || lo > 0xdfff)
                return fail_at(p, i - 6, "high surrogate \\u%04x is not followed by a low surrogate", cp);
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            i += 6;
        }
        k += put_utf8(o + k, cp);
    }
    o[k] = '\0';
    p->pos = end + 1;
    *out = o;
    *out_len = k;
    return CT_OK;
}

static bool is_digit(const parser *p, size_t i) { return i < p->len && p->s[i] >= '0' && p->s[i] <= '9'; }

static int parse_number(parser *p, json_value **out)
{
    size_t start = p->pos, i = p->pos;
    bool integral = true;
    if (i < p->len && p->s[i] == '-') i++;
    if (!is_digit(p, i)) return fail_at(p, i, "expected a digit in a number");
    if (p->s[i] == '0') {
        i++;
        if (is_digit(p, i)) return fail_at(p, start, "leading zeros are not allowed in numbers");
    } else {
        while (is_digit(p, i)) i++;
    }
    if (i < p->len && p->s[i] == '.') {
        integral = false;
        i++;
        if (!is_digit(p, i)) return fail_at(p, i, "expected a digit after '.'");
        while (is_digit(p, i)) i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        integral = false;
        i++;
        if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (!is_digit(p, i)) return fail_at(p, i, "expected a digit in the exponent");
        while (is_digit(p, i)) i++;
    }
    size_t n = i - start;
    if (n + 1 > p->num_cap) {
        p->num_cap = n + 1;
        p->num = ct_realloc(p->num, p->num_cap);
    }
    memcpy(p->num, p->s + start, n);
    p->num[n] = '\0';
    json_value *v = new_value(p, JSON_NUMBER);
    v->number = strtod(p->num, NULL);
    if (!isfinite(v->number)) return fail_at(p, start, "number %.40s is out of range", p->num);
    if (integral) {
        errno = 0;
        long long x = strtoll(p->num, NULL, 10);
        if (errno == 0) { v->is_integer = true; v->integer = x; }
    }
    p->pos = i;
    *out = v;
    return CT_OK;
}

static int parse_value(parser *p, json_value **out);

static int cmp_keys(const void *a, const void *b)
{
    const slot *x = a, *y = b;
    if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
    return memcmp(x->key, y->key, x->key_len);
}

/* Moves the members pushed since base into v's arena arrays and pops them.
 * For objects it first rejects duplicate keys (sorted copy, adjacent equal). */
static int close_container(parser *p, json_value *v, size_t base)
{
    size_t n = p->top - base, bytes;
    v->count = n;
    if (n == 0) return CT_OK;
    CT_ASSERT(ct_size_mul(n, sizeof(void *), &bytes), "json: %zu members overflow", n);
    if (v->type == JSON_OBJECT && n > 1) {
        slot *sorted = ct_malloc(n * sizeof(slot));
        memcpy(sorted, p->stack + base, n * sizeof(slot));
        qsort(sorted, n, sizeof(slot), cmp_keys);
        for (size_t i = 1; i < n; i++) {
            if (cmp_keys(&sorted[i - 1], &sorted[i]) != 0) continue;
            size_t off = sorted[i].key_off > sorted[i - 1].key_off ? sorted[i].key_off : sorted[i - 1].key_off;
            char k[80];
            sanitize(k, sizeof k, sorted[i].key, sorted[i].key_len);
            free(sorted);
            return fail_at(p, off, "duplicate key '%s' in an object", k);
        }
        free(sorted);
    }
    v->items = arena_alloc(p->doc, bytes);
    if (v->type == JSON_OBJECT) v->keys = arena_alloc(p->doc, bytes);
    for (size_t i = 0; i < n; i++) {
        v->items[i] = p->stack[base + i].value;
        if (v->keys) v->keys[i] = p->stack[base + i].key;
    }
    p->top = base;
    return CT_OK;
}

static int parse_container(parser *p, json_value **out, bool is_object)
{
    size_t open = p->pos;
    char close = is_object ? '}' : ']';
    if (++p->depth > JSON_MAX_DEPTH)
        return fail_at(p, open, "nesting deeper than %d levels", JSON_MAX_DEPTH);
    p->pos++;
    json_value *v = new_value(p, is_object ? JSON_OBJECT : JSON_ARRAY);
    size_t base = p->top;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
    } else {
        for (;;) {
            slot s = {0};
            int rc;
            if (is_object) {
                if (p->pos >= p->len || p->s[p->pos] != '"') {
                    char b[16];
                    return fail_at(p, p->pos, "expected a string key, found %s", found(p, b, sizeof b));
                }
                s.key_off = p->pos;
                if ((rc = parse_string(p, &s.key, &s.key_len)) != CT_OK) return rc;
                skip_ws(p);
                if ((rc = expect_char(p, ':', "':' after an object key")) != CT_OK) return rc;
                skip_ws(p);
            }
            if ((rc = parse_value(p, &s.value)) != CT_OK) return rc;
            push(p, s);
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ',') { p->pos++; skip_ws(p); continue; }
            if (p->pos < p->len && p->s[p->pos] == close) { p->pos++; break; }
            char b[16];
            return fail_at(p, p->pos, "expected ',' or '%c', found %s", close, found(p, b, sizeof b));
        }
    }
    int rc = close_container(p, v, base);
    if (rc != CT_OK) return rc;
    p->depth--;
    *out = v;
    return CT_OK;
}

static int parse_literal(parser *p, const char *word, json_value **out)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) {
        char b[16];
        return fail_at(p, p->pos, "expected a value, found %s", found(p, b, sizeof b));
    }
    json_value *v = new_value(p, word[0] == 'n' ? JSON_NULL : JSON_BOOL);
    v->boolean = word[0] == 't';
    p->pos += n;
    *out = v;
    return CT_OK;
}

static int parse_value(parser *p, json_value **out)
{
    char b[16];
    if (p->pos >= p->len) return fail_at(p, p->pos, "expected a value, found %s", found(p, b, sizeof b));
    char c = p->s[p->pos];
    switch (c) {
    case '{': return parse_container(p, out, true);
    case '[': return parse_container(p, out, false);
    case 't': return parse_literal(p, "true", out);
    case 'f': return parse_literal(p, "false", out);
    case 'n': return parse_literal(p, "null", out);
    case '"': {
        json_value *v = new_value(p, JSON_STRING);
        int rc = parse_string(p, &v->string, &v->string_len);
        if (rc == CT_OK) *out = v;
        return rc;
    }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, out);
        return fail_at(p, p->pos, "expected a value, found %s", found(p, b, sizeof b));
    }
}

json_doc *json_parse(const char *text, size_t len, const char *source, ct_error *err)
{
    json_doc *doc = ct_calloc(1, sizeof *doc);
    parser p = { .s = text, .len = len, .source = source ? source : "json", .err = err, .doc = doc };
    skip_ws(&p);
    int rc = parse_value(&p, &doc->root);
    if (rc == CT_OK) {
        skip_ws(&p);
        if (p.pos < p.len) {
            char b[16];
            rc = fail_at(&p, p.pos, "expected the end of the input after the JSON value, found %s",
                         found(&p, b, sizeof b));
        }
    }
    free(p.stack);
    free(p.num);
    if (rc != CT_OK) {
        json_free(doc);
        return NULL;
    }
    return doc;
}

const json_value *json_root(const json_doc *doc) { return doc ? doc->root : NULL; }

void json_free(json_doc *doc)
{
    if (!doc) return;
    for (arena_block *b = doc->blocks, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    free(doc);
}

// ---- lookups ----

const json_value *json_get(const json_value *obj, const char *key)
{
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    for (size_t i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
    return NULL;
}

const json_value *json_get_type(const json_value *obj, const char *key, json_type type)
{
    const json_value *v = json_get(obj, key);
    return v && v->type == type ? v : NULL;
}

static const char *type_name(json_type t)
{
    switch (t) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "a boolean";
    case JSON_NUMBER: return "a number";
    case JSON_STRING: return "a string";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "an unknown value";
}

int json_get_int(const json_value *obj, const char *key, long long dflt, long long *out,
                 const char *source, ct_error *err)
{
    const json_value *v = json_get(obj, key);
    if (!v) { *out = dflt; return CT_OK; }
    if (v->type != JSON_NUMBER)
        return CT_FAIL_INPUT(err, "%s: key '%s': expected an integer, found %s", source, key, type_name(v->type));
    if (v->is_integer) { *out = v->integer; return CT_OK; }
    /* 1e3 and 2.0 are integers written another way; -2^63 <= x < 2^63 is exactly
     * the range a double can convert to long long without overflow. */
    if (v->number == floor(v->number) && v->number >= -9223372036854775808.0 && v->number < 9223372036854775808.0) {
        *out = (long long)v->number;
        return CT_OK;
    }
    return CT_FAIL_INPUT(err, "%s: key '%s': expected an integer, found %.17g", source, key, v->number);
}

int json_get_double(const json_value *obj, const char *key, double dflt, double *out,
                    const char *source, ct_error *err)
{
    const json_value *v = json_get(obj, key);
    if (!v) { *out = dflt; return CT_OK; }
    if (v->type != JSON_NUMBER)
        return CT_FAIL_INPUT(err, "%s: key '%s': expected a number, found %s", source, key, type_name(v->type));
    *out = v->number;
    return CT_OK;
}

int json_get_bool(const json_value *obj, const char *key, bool dflt, bool *out,
                  const char *source, ct_error *err)
{
    const json_value *v = json_get(obj, key);
    if (!v) { *out = dflt; return CT_OK; }
    if (v->type != JSON_BOOL)
        return CT_FAIL_INPUT(err, "%s: key '%s': expected true or false, found %s", source, key, type_name(v->type));
    *out = v->boolean;
    return CT_OK;
}

// ---- writer ----

void json_writer_init(json_writer *w) { memset(w, 0, sizeof *w); }

void json_writer_free(json_writer *w)
{
    free(w->buf);
    memset(w, 0, sizeof *w);
}

/* Makes room for n more bytes plus the NUL that keeps buf a C string. */
static void reserve(json_writer *w, size_t n)
{
    size_t need;
    CT_ASSERT(ct_size_add(w->len, n, &need) && ct_size_add(need, 1, &need), "json writer: size overflows");
    if (need <= w->cap) return;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < need) {
        CT_ASSERT(ct_size_mul(cap, 2, &cap), "json writer: size overflows");
    }
    w->buf = ct_realloc(w->buf, cap);
    w->cap = cap;
}

static void append(json_writer *w, const char *s, size_t n)
{
    reserve(w, n);
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

void json_write_raw(json_writer *w, const char *s) { append(w, s, strlen(s)); }

void json_write_rawf(json_writer *w, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    CT_ASSERT(n >= 0, "json writer: bad format '%s'", fmt);
    if ((size_t)n < sizeof small) { append(w, small, (size_t)n); return; }
    reserve(w, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(w->buf + w->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    w->len += (size_t)n;
}

void json_write_string(json_writer *w, const char *s) { json_write_string_n(w, s, strlen(s)); }

void json_write_string_n(json_writer *w, const char *s, size_t n)
{
    append(w, "\"", 1);
    const char *run = s, *end = s + n;
    for (; s < end; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        append(w, run, (size_t)(s - run));
        run = s + 1;
        char esc[8];
        switch (c) {
        case '"': append(w, "\\\"", 2); break;
        case '\\': append(w, "\\\\", 2); break;
        case '\n': append(w, "\\n", 2); break;
        case '\t': append(w, "\\t", 2); break;
        case '\r': append(w, "\\r", 2); break;
        case '\b': append(w, "\\b", 2); break;
        case '\f': append(w, "\\f", 2); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            append(w, esc, 6);
        }
    }
    append(w, run, (size_t)(end - run));
    append(w, "\"", 1);
}

void json_write_number(json_writer *w, double v)
{
    if (!isfinite(v)) { json_write_raw(w, "null"); return; }
    if (v == floor(v) && v >= -9223372036854775808.0 && v < 9223372036854775808.0) {
        json_write_rawf(w, "%lld", (long long)v);
        return;
    }
    char buf[32];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    json_write_raw(w, buf);
}

json_doc *json_parse_file(const char *path, ct_error *err)
{
    size_t len;
    char *text = ct_read_file_max(path, CT_JSON_MAX_BYTES, &len, err);
    if (!text) return NULL;
    json_doc *d = json_parse(text, len, path, err);
    free(text);
    return d;
}
