/* prepare_tokens.c — one line of token-id JSONL parsed straight into a shard
 * writer (prepare_tokens.h has the contract).
 *
 * Memory: json_parse builds ~80 bytes of tree per array item (a 100 MB line of
 * ids took 1.9 to 4.5 GB), so lines are read here without a tree: one pass over
 * the bytes checks the grammar as json.c does (strings: escapes and UTF-8;
 * numbers: RFC 8259 and finite; depth <= 64) and keeps only where each field
 * we use lies; then its items go straight into the shard writer's token and
 * mask arrays (5 bytes a token, never copied again: shard_writer_reserve), so
 * the peak is the line plus its tokens. Unlike json.c, duplicate keys are
 * caught only among those fields. */
#include "prepare_tokens.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCAN_MAX_DEPTH 64

// ---- scanning one line ----

enum { F_INPUT_IDS, F_LABELS, F_LOSS_MASK, F_COMPLETION_MASK, F_ASSISTANT_MASKS, N_FIELDS };
static const char *const field_names[N_FIELDS] = {"input_ids", "labels", "loss_mask", "completion_mask",
                                                  "assistant_masks"};

typedef struct field {
    bool present;
    size_t start, end;  /* the value's bytes */
    size_t count;       /* items, when it is an array */
} field;

typedef struct scanner {
    const char *s;
    size_t len, pos;
    const char *src;    /* FILE:LINE */
    ct_error *err;
} scanner;

static int scan_fail(scanner *p, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int scan_fail(scanner *p, size_t off, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return CT_FAIL_INPUT(p->err, "%s: offset %zu: %s", p->src, off, what);
}

/* The byte at pos, for "expected X, found Y" messages. */
static const char *found(const scanner *p, char *buf, size_t n)
{
    if (p->pos >= p->len) return "the end of the input";
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c >= 0x20 && c < 0x7f) snprintf(buf, n, "'%c'", c);
    else snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

static bool at(const scanner *p, char c) { return p->pos < p->len && p->s[p->pos] == c; }
static bool digit_at(const scanner *p, size_t i) { return i < p->len && p->s[i] >= '0' && p->s[i] <= '9'; }

static void scan_ws(scanner *p)
{
    while (at(p, ' ') || at(p, '\t') || at(p, '\r') || at(p, '\n')) p->pos++;
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

/* Length of the well-formed UTF-8 sequence at s[0..n), or 0 (json.c's rules:
 * no overlong forms, surrogates or code points past U+10FFFF). */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0], lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    size_t len;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) { len = 3; if (c == 0xe0) lo = 0xa0; if (c == 0xed) hi = 0x9f; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; if (c == 0xf0) lo = 0x90; if (c == 0xf4) hi = 0x8f; }
    else return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return len;
}

static int scan_string(scanner *p)
{
    size_t open = p->pos++;
    while (p->pos < p->len) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') {
            p->pos++;
            return CT_OK;
        }
        if (c < 0x20) return scan_fail(p, p->pos, "control character 0x%02x inside a string (it must be escaped)", c);
        if (c != '\\') {
            size_t n = utf8_len((const unsigned char *)p->s + p->pos, p->len - p->pos);
            if (!n) return scan_fail(p, p->pos, "invalid UTF-8 byte 0x%02x in a string", c);
            p->pos += n;
            continue;
        }
        if (p->pos + 1 >= p->len) break;
        char e = p->s[p->pos + 1];
        if (e && strchr("\"\\/bfnrt", e)) {
            p->pos += 2;
            continue;
        }
        if (e != 'u') return scan_fail(p, p->pos, "invalid escape '\\%c' in a string", e >= 0x20 && e < 0x7f ? e : '?');
        unsigned cp, lo;
        if (p->len - p->pos < 6 || hex4(p->s + p->pos + 2, &cp) != 0)
            return scan_fail(p, p->pos, "expected 4 hex digits after '\\u'");
        if (cp >= 0xdc00 && cp <= 0xdfff) return scan_fail(p, p->pos, "unpaired low surrogate \\u%04x", cp);
        if (cp >= 0xd800 && cp <= 0xdbff) {
            const char *q = p->s + p->pos + 6;
            if (p->len - p->pos < 12 || q[0] != '\\' || q[1] != 'u' || hex4(q + 2, &lo) != 0 || lo < 0xdc00 ||
                lo > 0xdfff)
                return scan_fail(p, p->pos, "high surrogate \\u%04x is not followed by a low surrogate", cp);
            p->pos += 6;
        }
        p->pos += 6;
    }
    return scan_fail(p, open, "unterminated string (no closing '\"' before the end of the input)");
}

/* strtod of s[0..n), which need not be NUL-terminated. */
static double number_at(const char *s, size_t n)
{
    char buf[64], *b = n < sizeof buf ? buf : ct_malloc(n + 1);
    memcpy(b, s, n);
    b[n] = '\0';
    double v = strtod(b, NULL);
    if (b != buf) free(b);
    return v;
}

static int scan_number(scanner *p)
{
    size_t start = p->pos, i = p->pos;
    bool exponent = false;
    if (at(p, '-')) i++;
    if (!digit_at(p, i)) return scan_fail(p, i, "expected a digit in a number");
    if (p->s[i] == '0') {
        if (digit_at(p, ++i)) return scan_fail(p, start, "leading zeros are not allowed in numbers");
    } else {
        while (digit_at(p, i)) i++;
    }
    if (i < p->len && p->s[i] == '.') {
        if (!digit_at(p, ++i)) return scan_fail(p, i, "expected a digit after '.'");
        while (digit_at(p, i)) i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        exponent = true;
        i++;
        if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (!digit_at(p, i)) return scan_fail(p, i, "expected a digit in the exponent");
        while (digit_at(p, i)) i++;
    }
    /* only an exponent or some 300 digits can leave the range of a double */
    if ((exponent || i - start > 300) && !isfinite(number_at(p->s + start, i - start)))
        return scan_fail(p, start, "number %.*s is out of range", (int)(i - start < 40 ? i - start : 40), p->s + start);
    p->pos = i;
    return CT_OK;
}

static int scan_literal(scanner *p, const char *word)
{
    size_t n = strlen(word);
    char b[16];
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return scan_fail(p, p->pos, "expected a value, found %s", found(p, b, sizeof b));
    p->pos += n;
    return CT_OK;
}

static int scan_container(scanner *p, int depth, field *fields, size_t *count);

/* Any value at pos; an array's item count goes to *count. */
static int scan_value(scanner *p, int depth, size_t *count)
{
    char b[16], c = p->pos < p->len ? p->s[p->pos] : 0;
    switch (c) {
    case '{': return scan_container(p, depth + 1, NULL, count);
    case '[': return scan_container(p, depth + 1, NULL, count);
    case '"': return scan_string(p);
    case 't': return scan_literal(p, "true");
    case 'f': return scan_literal(p, "false");
    case 'n': return scan_literal(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return scan_number(p);
        return scan_fail(p, p->pos, "expected a value, found %s", found(p, b, sizeof b));
    }
}

static int field_of(const char *key, size_t n)
{
    for (int k = 0; k < N_FIELDS; k++)
        if (strlen(field_names[k]) == n && !memcmp(field_names[k], key, n)) return k;
    return -1;
}

/* An object or array at pos. In the top-level object (fields not NULL) the
 * fields we use are recorded. */
static int scan_container(scanner *p, int depth, field *fields, size_t *count)
{
    bool object = at(p, '{');
    char close = object ? '}' : ']', b[16];
    size_t open = p->pos++, n = 0;
    if (depth > SCAN_MAX_DEPTH) return scan_fail(p, open, "nesting deeper than %d levels", SCAN_MAX_DEPTH);
    scan_ws(p);
    if (at(p, close)) {
        p->pos++;
        if (count) *count = 0;
        return CT_OK;
    }
    for (;;) {
        int rc, f = -1;
        size_t key = p->pos, items = 0;
        if (object) {
            if (!at(p, '"')) return scan_fail(p, p->pos, "expected a string key, found %s", found(p, b, sizeof b));
            if ((rc = scan_string(p))) return rc;
            f = fields ? field_of(p->s + key + 1, p->pos - key - 2) : -1;
            if (f >= 0 && fields[f].present)
                return scan_fail(p, key, "duplicate key '%s' in an object", field_names[f]);
            scan_ws(p);
            if (!at(p, ':')) return scan_fail(p, p->pos, "expected ':' after an object key, found %s", found(p, b, sizeof b));
            p->pos++;
            scan_ws(p);
        }
        size_t start = p->pos;
        if ((rc = scan_value(p, depth, &items))) return rc;
        if (f >= 0) fields[f] = (field){true, start, p->pos, items};
        n++;
        scan_ws(p);
        if (at(p, close)) break;
        if (!at(p, ',')) return scan_fail(p, p->pos, "expected ',' or '%c', found %s", close, found(p, b, sizeof b));
        p->pos++;
        scan_ws(p);
    }
    p->pos++; /* the close */
    if (count) *count = n;
    return CT_OK;
}

/* What a (scanned) value is, for "expected X, found Y" messages. */
static const char *describe(const char *s, size_t n, char *buf, size_t cap)
{
    switch (s[0]) {
    case 'n': return "null";
    case 't': case 'f': return "a boolean";
    case '"': return "a string";
    case '[': return "an array";
    case '{': return "an object";
    }
    snprintf(buf, cap, "%.17g", number_at(s, n));
    return buf;
}

/* Checks the whole line; fields receive where the fields we use lie. */
static int scan_line(scanner *p, field fields[N_FIELDS])
{
    memset(fields, 0, N_FIELDS * sizeof *fields);
    scan_ws(p);
    size_t start = p->pos, ignored;
    int rc = at(p, '{') ? scan_container(p, 1, fields, &ignored) : scan_value(p, 0, &ignored);
    if (rc) return rc;
    size_t end = p->pos;
    char b[32];
    scan_ws(p);
    if (p->pos < p->len)
        return scan_fail(p, p->pos, "expected the end of the input after the JSON value, found %s", found(p, b, sizeof b));
    if (p->s[start] != '{')
        return CT_FAIL_INPUT(p->err, "%s: expected a JSON object, found %s", p->src,
                             describe(p->s + start, end - start, b, sizeof b));
    return CT_OK;
}

/* Steps through the items of a scanned array (p->pos starts just after its
 * '['): *item and *n get the next item's bytes; false at its ']'. */
static bool next_item(scanner *p, const char **item, size_t *n)
{
    scan_ws(p);
    if (at(p, ']')) return false;
    size_t start = p->pos, ignored;
    int rc = scan_value(p, 1, &ignored);
    CT_ASSERT(rc == CT_OK, "prepare: an item of a scanned array does not scan again");
    *item = p->s + start;
    *n = p->pos - start;
    scan_ws(p);
    if (at(p, ',')) p->pos++;
    return true;
}

/* An integer literal (no fraction or exponent) into *out. Literals of more than
 * 18 digits, beyond every range used here, count as not integers. */
static bool item_integer(const char *s, size_t n, long long *out)
{
    size_t neg = s[0] == '-';
    if (n == neg || n - neg > 18) return false;
    long long v = 0;
    for (size_t i = neg; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = neg ? -v : v;
    return true;
}

/* Mask item i of field k: 1 = train on token i, 0 = not, -1 = not a valid item. */
static int item_mask(int k, const char *s, size_t n, uint32_t token)
{
    long long v;
    if (k == F_LABELS) return item_integer(s, n, &v) && (v == -100 || v == token) ? v != -100 : -1;
    if (n == 4 && !memcmp(s, "true", 4)) return 1;
    if (n == 5 && !memcmp(s, "false", 5)) return 0;
    return item_integer(s, n, &v) && (v == 0 || v == 1) ? (int)v : -1;
}

int prepare_tokens_doc(const char *line, size_t line_len, const char *src, uint32_t vocab_size, shard_writer *w,
                       const uint8_t **mask_out, size_t *len, ct_error *err)
{
    scanner p = {.s = line, .len = line_len, .src = src, .err = err};
    field f[N_FIELDS];
    int rc = scan_line(&p, f);
    if (rc) return rc;
    char b[32];
    for (int k = 0; k < N_FIELDS; k++) {
        if (f[k].present && line[f[k].start] == 'n') f[k].present = false; /* null is absent */
        if (f[k].present && line[f[k].start] != '[')
            return CT_FAIL_INPUT(err, "%s: %s must be an array, found %s", src, field_names[k],
                                 describe(line + f[k].start, f[k].end - f[k].start, b, sizeof b));
    }
    if (!f[F_INPUT_IDS].present) return CT_FAIL_INPUT(err, "%s: input_ids is missing", src);
    size_t n = f[F_INPUT_IDS].count, i, item_len;
    if (n == 0) return CT_FAIL_INPUT(err, "%s: input_ids is empty", src);
    for (int k = 1; k < N_FIELDS; k++)
        if (f[k].present && f[k].count != n)
            return CT_FAIL_INPUT(err, "%s: %s has %zu entries but input_ids has %zu", src, field_names[k],
                                 f[k].count, n);
    uint32_t *tokens;
    uint8_t *mask;
    shard_writer_reserve(w, n, &tokens, &mask);
    const char *item;
    for (i = 0, p.pos = f[F_INPUT_IDS].start + 1; next_item(&p, &item, &item_len); i++) {
        long long id;
        if (!item_integer(item, item_len, &id) || id < 0 || id > UINT32_MAX)
            return CT_FAIL_INPUT(err, "%s: input_ids[%zu] must be an integer token id in [0, 4294967295], found %s",
                                 src, i, describe(item, item_len, b, sizeof b));
        if (vocab_size && id >= vocab_size)
            return CT_FAIL_INPUT(err, "%s: input_ids[%zu] = %lld >= vocab size %u", src, i, id, vocab_size);
        tokens[i] = (uint32_t)id;
        mask[i] = 1;
    }
    int first = -1; /* the first mask field given; any other must agree with it */
    for (int k = 1; k < N_FIELDS; k++) {
        if (!f[k].present) continue;
        for (i = 0, p.pos = f[k].start + 1; next_item(&p, &item, &item_len); i++) {
            int m = item_mask(k, item, item_len, tokens[i]);
            if (m < 0 && k == F_LABELS)
                return CT_FAIL_INPUT(err, "%s: labels[%zu] must be -100 or input_ids[%zu] = %u (labels are "
                                     "unshifted), found %s", src, i, i, tokens[i], describe(item, item_len, b, sizeof b));
            if (m < 0)
                return CT_FAIL_INPUT(err, "%s: %s[%zu] must be 0 or 1, found %s", src, field_names[k], i,
                                     describe(item, item_len, b, sizeof b));
            if (first >= 0 && mask[i] != m)
                return CT_FAIL_INPUT(err, "%s: %s and %s disagree at token %zu (one trains on it, the other does "
                                     "not); give one mask field, or fields that agree", src, field_names[first],
                                     field_names[k], i);
            mask[i] = (uint8_t)m;
        }
        if (first < 0) first = k;
    }
    *mask_out = mask;
    *len = n;
    return CT_OK;
}
