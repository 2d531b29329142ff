/* chat_template_value.c — the engine's memory and values: the pool every parse
 * and render allocates from, failure with line:col, UTF-8, and Python's meaning
 * of str(), repr(), ==, <, truth and json.dumps for each value (what jinja2
 * inherits from Python, so what a template's output depends on). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "chat_template_internal.h"

// ---- context and pool ----

struct jt_chunk {
    jt_chunk *next;
    size_t size, used;
    _Alignas(16) char data[];
};

void jt_ctx_init(jt_ctx *c, const char *src, size_t src_len, const char *name, ct_error *err,
                 size_t pool_cap, size_t max_steps)
{
    memset(c, 0, sizeof *c);
    c->src = src;
    c->src_len = src_len;
    c->name = name;
    c->err = err;
    c->pool_cap = pool_cap;
    c->max_steps = max_steps;
    c->at = JT_NO_POS;
}

void jt_pool_free(jt_chunk *chunks)
{
    while (chunks) {
        jt_chunk *next = chunks->next;
        free(chunks);
        chunks = next;
    }
}

void *jt_alloc(jt_ctx *c, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    jt_chunk *h = c->chunks;
    if (!h || h->size - h->used < n) {
        if (n > c->pool_cap || c->pool_used > c->pool_cap - n)
            jt_fail(c, JT_NO_POS, "more than the %zu-byte memory limit of a render", c->pool_cap);
        size_t size = n > ((size_t)64 << 10) ? n : ((size_t)64 << 10);
        h = ct_malloc(sizeof *h + size);
        h->size = size;
        h->used = 0;
        h->next = c->chunks;
        c->chunks = h;
        c->pool_used += size;
    }
    void *p = h->data + h->used;
    h->used += n;
    memset(p, 0, n);
    return p;
}

char *jt_strndup(jt_ctx *c, const char *s, size_t n)
{
    char *p = jt_alloc(c, n + 1);
    memcpy(p, s, n);
    return p;
}

/* 1-based line and column (in characters) of byte offset pos. */
static void jt_line_col(const jt_ctx *c, size_t pos, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < pos && i < c->src_len; i++) {
        if (c->src[i] == '\n') (*line)++, *col = 1;
        else if (((unsigned char)c->src[i] & 0xC0) != 0x80) (*col)++;
    }
}

void jt_fail(jt_ctx *c, size_t pos, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';   /* one line, whatever a template raised */
    if (pos == JT_NO_POS) pos = c->at;
    if (pos == JT_NO_POS) {
        CT_FAIL_INPUT(c->err, "%s: %s", c->name, msg);
    } else {
        int line, col;
        jt_line_col(c, pos, &line, &col);
        CT_FAIL_INPUT(c->err, "%s: line %d:%d: %s", c->name, line, col, msg);
    }
    longjmp(c->jump, 1);
}

void jt_enter(jt_ctx *c, size_t pos)
{
    if (++c->depth > CT_CHAT_MAX_DEPTH)
        jt_fail(c, pos, "nested deeper than %d levels (a template is limited to that)", CT_CHAT_MAX_DEPTH);
}

void jt_step(jt_ctx *c, size_t pos, size_t n)
{
    c->steps += n;
    if (c->steps > c->max_steps)
        jt_fail(c, pos, "more than %zu steps (a render is limited to that; a loop that does not end?)", c->max_steps);
}

// ---- UTF-8 ----

uint32_t jt_utf8_next(const char *s, size_t n, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s + *i;
    size_t left = n - *i;
    if (u[0] < 0x80) return (*i)++, u[0];
    size_t need = u[0] >= 0xC2 && u[0] <= 0xDF ? 2 : u[0] >= 0xE0 && u[0] <= 0xEF ? 3 : u[0] >= 0xF0 && u[0] <= 0xF4 ? 4 : 0;
    unsigned char lo = u[0] == 0xE0 ? 0xA0 : u[0] == 0xF0 ? 0x90 : 0x80;
    unsigned char hi = u[0] == 0xED ? 0x9F : u[0] == 0xF4 ? 0x8F : 0xBF;
    if (!need || left < need || u[1] < lo || u[1] > hi) return (*i)++, 0xDC00u + u[0];
    for (size_t k = 2; k < need; k++)
        if (u[k] < 0x80 || u[k] > 0xBF) return (*i)++, 0xDC00u + u[0];
    uint32_t cp = need == 2 ? u[0] & 0x1Fu : need == 3 ? u[0] & 0x0Fu : u[0] & 0x07u;
    for (size_t k = 1; k < need; k++) cp = cp << 6 | (u[k] & 0x3Fu);
    *i += need;
    return cp;
}

size_t jt_utf8_put(char *out, uint32_t cp)
{
    if (cp >= 0xDC80 && cp <= 0xDCFF) return out[0] = (char)(cp - 0xDC00), 1; /* an ill-formed byte back */
    return ct_utf8_encode(out, cp);
}

size_t jt_utf8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; k++) jt_utf8_next(s, n, &i);
    return k;
}

bool jt_is_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* Python's str.isprintable() for one character. */
static bool jt_is_printable(uint32_t cp)
{
    if (cp == ' ') return true;
    if (cp >= 0xDC80 && cp <= 0xDCFF) return false;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
        return false;
    default:
        return true;
    }
}

// ---- buffer ----

static void jt_buf_grow(jt_ctx *c, jt_buf *b, size_t extra)
{
    if (b->max && (extra > b->max || b->n > b->max - extra))
        jt_fail(c, JT_NO_POS, "output larger than the %zu-byte limit of a render", b->max);
    if (b->n + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) {
        if (cap > ((size_t)-1) / 4) jt_fail(c, JT_NO_POS, "a string too large");
        cap *= 2;
    }
    char *p = jt_alloc(c, cap);
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
}

void jt_buf_put(jt_ctx *c, jt_buf *b, const char *s, size_t n)
{
    if (!n) return;
    jt_buf_grow(c, b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void jt_buf_putc(jt_ctx *c, jt_buf *b, char ch) { jt_buf_put(c, b, &ch, 1); }

void jt_buf_put_cp(jt_ctx *c, jt_buf *b, uint32_t cp)
{
    char tmp[4];
    jt_buf_put(c, b, tmp, jt_utf8_put(tmp, cp));
}

void jt_buf_printf(jt_ctx *c, jt_buf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    jt_buf_put(c, b, tmp, k < 0 ? 0 : (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

// ---- constructors ----

jt_value jt_cstr_v(const char *s) { return jt_str_v(s, strlen(s)); }

jt_value jt_list_v(jt_ctx *c, size_t n, jt_seq_kind kind)
{
    jt_value v = {.type = JT_LIST};
    v.list = jt_alloc(c, sizeof *v.list);
    if (n > c->pool_cap / sizeof(jt_value)) jt_fail(c, JT_NO_POS, "a list of %zu items is too long", n);
    v.list->items = n ? jt_alloc(c, n * sizeof(jt_value)) : NULL;
    v.list->n = n;
    v.list->kind = kind;
    return v;
}

jt_value jt_iter_v(jt_ctx *c, jt_value *items, size_t n)
{
    jt_value v = {.type = JT_ITER};
    v.list = jt_alloc(c, sizeof *v.list);
    v.list->items = items;
    v.list->n = n;
    return v;
}

jt_value jt_dict_v(jt_ctx *c, jt_type type)
{
    jt_value v = {.type = type};
    v.dict = jt_alloc(c, sizeof *v.dict);
    return v;
}

bool jt_hashable(jt_value v)
{
    if (v.type == JT_LIST) {
        if (v.list->kind == JT_SEQ_RANGE) return true;
        if (v.list->kind != JT_SEQ_TUPLE) return false;
        for (size_t i = 0; i < v.list->n; i++)
            if (!jt_hashable(v.list->items[i])) return false;
        return true;
    }
    return v.type != JT_DICT;   /* generators hash by identity */
}

const jt_value *jt_dict_get(jt_ctx *c, const jt_dict *d, jt_value key)
{
    if (!jt_hashable(key)) return NULL;
    jt_step(c, JT_NO_POS, d->n / 8);
    for (size_t i = 0; i < d->n; i++)
        if (jt_equal(c, d->keys[i], key)) return &d->vals[i];
    return NULL;
}

void jt_dict_set(jt_ctx *c, jt_dict *d, jt_value key, jt_value val)
{
    if (!jt_hashable(key)) jt_fail(c, JT_NO_POS, "unhashable type: '%s'", jt_type_name(key));
    jt_value *at = (jt_value *)jt_dict_get(c, d, key);
    if (at) {
        *at = val;   /* Python keeps the first key and its place */
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 4;
        jt_value *k = jt_alloc(c, cap * sizeof *k), *v = jt_alloc(c, cap * sizeof *v);
        if (d->n) memcpy(k, d->keys, d->n * sizeof *k), memcpy(v, d->vals, d->n * sizeof *v);
        d->keys = k;
        d->vals = v;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n++] = val;
}

jt_value jt_undef_named(jt_ctx *c, const char *name)
{
    jt_undef *u = jt_alloc(c, sizeof *u);
    u->name = name;
    jt_value v = {.type = JT_UNDEFINED, .undef = u};
    return v;
}

jt_value jt_undef_hint(jt_ctx *c, const char *hint)
{
    jt_value v = jt_undef_named(c, hint);
    ((jt_undef *)v.undef)->hint = true;
    return v;
}

/* jinja2's object_type_repr: "dict object", "None" ... */
static const char *jt_owner_name(jt_value v)
{
    switch (v.type) {
    case JT_NONE: return "None";
    case JT_NAMESPACE: return "jinja2.utils.Namespace object";
    case JT_LOOP: return "jinja2.runtime.LoopContext object";
    case JT_MACRO: return "jinja2.runtime.Macro object";
    case JT_UNDEFINED: return "jinja2.runtime.Undefined object";
    case JT_BOOL: return "bool object";
    case JT_INT: return "int object";
    case JT_FLOAT: return "float object";
    case JT_STR: return "str object";
    case JT_DICT: return "dict object";
    case JT_ITER: return "generator object";
    case JT_FUNC: return "builtin_function_or_method object";
    case JT_LIST:
        return v.list->kind == JT_SEQ_TUPLE ? "tuple object" : v.list->kind == JT_SEQ_RANGE ? "range object" : "list object";
    }
    return "object";
}

jt_value jt_undef_member(jt_ctx *c, jt_value owner, jt_value key)
{
    jt_undef *u = jt_alloc(c, sizeof *u);
    u->owner = jt_owner_name(owner);
    if (key.type == JT_STR) {
        u->name = jt_strndup(c, key.s.p, key.s.n);
    } else {
        jt_buf b = {0};
        jt_repr_of(c, &b, key);
        u->name = jt_strndup(c, b.p ? b.p : "", b.n);
        u->element = true;
    }
    jt_value v = {.type = JT_UNDEFINED, .undef = u};
    return v;
}

void jt_fail_undefined(jt_ctx *c, size_t pos, jt_value v)
{
    const jt_undef *u = v.undef;
    if (!u) jt_fail(c, pos, "undefined value used");
    if (u->hint) jt_fail(c, pos, "%s", u->name);
    if (!u->owner) jt_fail(c, pos, "'%s' is undefined", u->name);
    if (u->element) jt_fail(c, pos, "%s has no element %s", u->owner, u->name);
    jt_fail(c, pos, "'%s' has no attribute '%s'", u->owner, u->name);
}

// ---- Python semantics ----

bool jt_truthy(jt_value v)
{
    switch (v.type) {
    case JT_UNDEFINED: case JT_NONE: return false;
    case JT_BOOL: return v.b;
    case JT_INT: return v.i != 0;
    case JT_FLOAT: return v.f != 0;
    case JT_STR: return v.s.n != 0;
    case JT_LIST: return v.list->n != 0;
    case JT_DICT: return v.dict->n != 0;
    default: return true;   /* generators, namespaces, callables, loop */
    }
}

const char *jt_type_name(jt_value v)
{
    switch (v.type) {
    case JT_UNDEFINED: return "Undefined";
    case JT_NONE: return "NoneType";
    case JT_BOOL: return "bool";
    case JT_INT: return "int";
    case JT_FLOAT: return "float";
    case JT_STR: return "str";
    case JT_DICT: return "dict";
    case JT_ITER: return "generator";
    case JT_NAMESPACE: return "Namespace";
    case JT_MACRO: return "Macro";
    case JT_FUNC: return "builtin_function_or_method";
    case JT_LOOP: return "LoopContext";
    case JT_LIST:
        switch (v.list->kind) {
        case JT_SEQ_TUPLE: return "tuple";
        case JT_SEQ_DICT_ITEMS: return "dict_items";
        case JT_SEQ_DICT_KEYS: return "dict_keys";
        case JT_SEQ_DICT_VALUES: return "dict_values";
        case JT_SEQ_RANGE: return "range";
        default: return "list";
        }
    }
    return "object";
}

bool jt_is_number(jt_value v) { return v.type == JT_BOOL || v.type == JT_INT || v.type == JT_FLOAT; }

double jt_as_double(jt_value v)
{
    return v.type == JT_FLOAT ? v.f : v.type == JT_INT ? (double)v.i : v.type == JT_BOOL ? (double)v.b : 0.0;
}

bool jt_equal(jt_ctx *c, jt_value a, jt_value b)
{
    if (jt_is_number(a) && jt_is_number(b)) {
        if (a.type != JT_FLOAT && b.type != JT_FLOAT)
            return (a.type == JT_INT ? a.i : a.b) == (b.type == JT_INT ? b.i : b.b);
        return jt_as_double(a) == jt_as_double(b);
    }
    if (a.type != b.type) return false;
    switch (a.type) {
    case JT_UNDEFINED: case JT_NONE: return true;
    case JT_STR: return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
    case JT_LIST: {
        bool seq_a = a.list->kind == JT_SEQ_LIST || a.list->kind == JT_SEQ_TUPLE || a.list->kind == JT_SEQ_RANGE;
        if (a.list->kind != b.list->kind && seq_a) return false;
        if (a.list->n != b.list->n) return false;
        jt_enter(c, JT_NO_POS);
        bool eq = true;
        for (size_t i = 0; i < a.list->n && eq; i++) eq = jt_equal(c, a.list->items[i], b.list->items[i]);
        jt_leave(c);
        return eq;
    }
    case JT_DICT: {
        if (a.dict->n != b.dict->n) return false;
        jt_enter(c, JT_NO_POS);
        bool eq = true;
        for (size_t i = 0; i < a.dict->n && eq; i++) {
            const jt_value *bv = jt_dict_get(c, b.dict, a.dict->keys[i]);
            eq = bv && jt_equal(c, a.dict->vals[i], *bv);
        }
        jt_leave(c);
        return eq;
    }
    case JT_NAMESPACE: return a.dict == b.dict;
    case JT_ITER: return a.list == b.list;
    case JT_MACRO: return a.macro == b.macro;
    case JT_LOOP: return a.loop == b.loop;
    case JT_FUNC: return a.fn.id == b.fn.id && a.fn.self == b.fn.self;
    default: return false;
    }
}

int jt_compare(jt_ctx *c, size_t pos, jt_value a, jt_value b)
{
    if (a.type == JT_UNDEFINED) jt_fail_undefined(c, pos, a);
    if (b.type == JT_UNDEFINED) jt_fail_undefined(c, pos, b);
    if (jt_is_number(a) && jt_is_number(b)) {
        if (a.type != JT_FLOAT && b.type != JT_FLOAT) {
            long long x = a.type == JT_INT ? a.i : a.b, y = b.type == JT_INT ? b.i : b.b;
            return (x > y) - (x < y);
        }
        double x = jt_as_double(a), y = jt_as_double(b);
        return (x > y) - (x < y);   /* NaN compares as equal here; its < and > are both false in Python too */
    }
    if (a.type == JT_STR && b.type == JT_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int k = memcmp(a.s.p, b.s.p, n);   /* UTF-8 byte order is code point order */
        return k ? (k > 0) - (k < 0) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    if (a.type == JT_LIST && b.type == JT_LIST && a.list->kind == b.list->kind &&
        (a.list->kind == JT_SEQ_LIST || a.list->kind == JT_SEQ_TUPLE)) {
        jt_enter(c, pos);
        for (size_t i = 0; i < a.list->n && i < b.list->n; i++) {
            if (jt_equal(c, a.list->items[i], b.list->items[i])) continue;
            int k = jt_compare(c, pos, a.list->items[i], b.list->items[i]);
            jt_leave(c);
            return k;
        }
        jt_leave(c);
        return (a.list->n > b.list->n) - (a.list->n < b.list->n);
    }
    jt_fail(c, pos, "'<' not supported between instances of '%s' and '%s'", jt_type_name(a), jt_type_name(b));
}

void jt_format_float(char out[32], double f)
{
    if (isnan(f)) { strcpy(out, "nan"); return; }
    if (isinf(f)) { strcpy(out, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { strcpy(out, signbit(f) ? "-0.0" : "0.0"); return; }
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {   /* the shortest digits that read back: Python's repr */
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    char digits[24];
    int nd = 0;
    const char *p = e;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int decpt = atoi(p + 1) + 1;   /* value = 0.DIGITS x 10^decpt */
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt <= -4 || decpt > 16) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        snprintf(o, 8, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
        return;
    }
    if (decpt <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -decpt; i++) *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
    } else if (decpt >= nd) {
        memcpy(o, digits, (size_t)nd);
        o += nd;
        for (int i = nd; i < decpt; i++) *o++ = '0';
        *o++ = '.';
        *o++ = '0';
    } else {
        memcpy(o, digits, (size_t)decpt);
        o += decpt;
        *o++ = '.';
        memcpy(o, digits + decpt, (size_t)(nd - decpt));
        o += nd - decpt;
    }
    *o = 0;
}

static void jt_repr_str(jt_ctx *c, jt_buf *b, const char *s, size_t n)
{
    bool squote = memchr(s, '\'', n) != NULL, dquote = memchr(s, '"', n) != NULL;
    char q = squote && !dquote ? '"' : '\'';
    jt_buf_putc(c, b, q);
    for (size_t i = 0; i < n;) {
        size_t at = i;
        uint32_t cp = jt_utf8_next(s, n, &i);
        if (cp == (uint32_t)q || cp == '\\') jt_buf_putc(c, b, '\\'), jt_buf_putc(c, b, (char)cp);
        else if (cp == '\t') jt_buf_put(c, b, "\\t", 2);
        else if (cp == '\n') jt_buf_put(c, b, "\\n", 2);
        else if (cp == '\r') jt_buf_put(c, b, "\\r", 2);
        else if (jt_is_printable(cp)) jt_buf_put(c, b, s + at, i - at);
        else if (cp < 0x100) jt_buf_printf(c, b, "\\x%02x", cp);
        else if (cp < 0x10000) jt_buf_printf(c, b, "\\u%04x", cp);
        else jt_buf_printf(c, b, "\\U%08x", cp);
    }
    jt_buf_putc(c, b, q);
}

static void jt_repr_items(jt_ctx *c, jt_buf *b, const jt_list *l, const char *open, const char *close)
{
    jt_buf_put(c, b, open, strlen(open));
    for (size_t i = 0; i < l->n; i++) {
        if (i) jt_buf_put(c, b, ", ", 2);
        jt_repr_of(c, b, l->items[i]);
    }
    if (l->kind == JT_SEQ_TUPLE && l->n == 1) jt_buf_putc(c, b, ',');
    jt_buf_put(c, b, close, strlen(close));
}

static void jt_repr_dict(jt_ctx *c, jt_buf *b, const jt_dict *d)
{
    jt_buf_putc(c, b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) jt_buf_put(c, b, ", ", 2);
        jt_repr_of(c, b, d->keys[i]);
        jt_buf_put(c, b, ": ", 2);
        jt_repr_of(c, b, d->vals[i]);
    }
    jt_buf_putc(c, b, '}');
}

void jt_repr_of(jt_ctx *c, jt_buf *b, jt_value v)
{
    jt_enter(c, JT_NO_POS);
    switch (v.type) {
    case JT_UNDEFINED: jt_buf_put(c, b, "Undefined", 9); break;
    case JT_STR: jt_repr_str(c, b, v.s.p, v.s.n); break;
    case JT_DICT: jt_repr_dict(c, b, v.dict); break;
    case JT_LIST:
        switch (v.list->kind) {
        case JT_SEQ_LIST: jt_repr_items(c, b, v.list, "[", "]"); break;
        case JT_SEQ_TUPLE: jt_repr_items(c, b, v.list, "(", ")"); break;
        case JT_SEQ_DICT_ITEMS: jt_repr_items(c, b, v.list, "dict_items([", "])"); break;
        case JT_SEQ_DICT_KEYS: jt_repr_items(c, b, v.list, "dict_keys([", "])"); break;
        case JT_SEQ_DICT_VALUES: jt_repr_items(c, b, v.list, "dict_values([", "])"); break;
        case JT_SEQ_RANGE:
            if (v.list->range[2] == 1) jt_buf_printf(c, b, "range(%lld, %lld)", v.list->range[0], v.list->range[1]);
            else jt_buf_printf(c, b, "range(%lld, %lld, %lld)", v.list->range[0], v.list->range[1], v.list->range[2]);
            break;
        }
        break;
    default: jt_str_of(c, b, v); break;
    }
    jt_leave(c);
}

void jt_str_of(jt_ctx *c, jt_buf *b, jt_value v)
{
    char num[32];
    switch (v.type) {
    case JT_UNDEFINED: break;
    case JT_NONE: jt_buf_put(c, b, "None", 4); break;
    case JT_BOOL: jt_buf_put(c, b, v.b ? "True" : "False", v.b ? 4 : 5); break;
    case JT_INT: jt_buf_printf(c, b, "%lld", v.i); break;
    case JT_FLOAT: jt_format_float(num, v.f); jt_buf_put(c, b, num, strlen(num)); break;
    case JT_STR: jt_buf_put(c, b, v.s.p, v.s.n); break;
    case JT_LIST: case JT_DICT: jt_repr_of(c, b, v); break;
    case JT_NAMESPACE:
        jt_enter(c, JT_NO_POS);
        jt_buf_put(c, b, "<Namespace ", 11);
        jt_repr_dict(c, b, v.dict);
        jt_buf_putc(c, b, '>');
        jt_leave(c);
        break;
    case JT_MACRO: jt_buf_printf(c, b, "<Macro '%s'>", v.macro->def->name); break;
    case JT_LOOP: jt_buf_printf(c, b, "<LoopContext %zu/%zu>", v.loop->index + 1, v.loop->items->n); break;
    case JT_ITER: jt_buf_put(c, b, "<generator object>", 18); break;
    case JT_FUNC: jt_buf_put(c, b, "<built-in function>", 19); break;
    }
}

jt_value jt_to_str(jt_ctx *c, jt_value v)
{
    if (v.type == JT_STR) return v;
    jt_buf b = {0};
    jt_str_of(c, &b, v);
    return jt_str_v(b.p ? b.p : "", b.n);
}

// ---- iteration ----

bool jt_iterable(jt_value v)
{
    return v.type == JT_UNDEFINED || v.type == JT_LIST || v.type == JT_ITER || v.type == JT_DICT || v.type == JT_STR;
}

void jt_iter_check(jt_ctx *c, size_t pos, jt_value v)
{
    if (v.type == JT_ITER && v.list->fail) jt_fail(c, pos, "%s", v.list->fail);
}

jt_list *jt_iterate(jt_ctx *c, size_t pos, jt_value v)
{
    static jt_list empty;
    switch (v.type) {
    case JT_UNDEFINED: return &empty;
    case JT_LIST: return v.list;
    case JT_ITER: {
        jt_iter_check(c, pos, v);
        jt_list *l = jt_alloc(c, sizeof *l);
        /* an empty generator holds no items at all (NULL, not NULL + 0: a fuzz finding) */
        l->items = v.list->items ? v.list->items + v.list->pos : NULL;
        l->n = v.list->n - v.list->pos;
        v.list->pos = v.list->n;
        return l;
    }
    case JT_DICT: {
        jt_list *l = jt_list_v(c, v.dict->n, JT_SEQ_LIST).list;
        if (v.dict->n) memcpy(l->items, v.dict->keys, v.dict->n * sizeof(jt_value));
        return l;
    }
    case JT_STR: {
        jt_list *l = jt_list_v(c, jt_utf8_count(v.s.p, v.s.n), JT_SEQ_LIST).list;
        size_t k = 0;
        for (size_t i = 0; i < v.s.n; k++) {
            size_t at = i;
            jt_utf8_next(v.s.p, v.s.n, &i);
            l->items[k] = jt_str_v(v.s.p + at, i - at);
        }
        jt_step(c, pos, v.s.n / 64);
        return l;
    }
    default:
        jt_fail(c, pos, "'%s' object is not iterable", jt_type_name(v));
    }
}

// ---- json.dumps ----

static void jt_json_str(jt_ctx *c, jt_buf *b, const char *s, size_t n, bool ascii)
{
    jt_buf_putc(c, b, '"');
    for (size_t i = 0; i < n;) {
        size_t at = i;
        uint32_t cp = jt_utf8_next(s, n, &i);
        switch (cp) {
        case '"': jt_buf_put(c, b, "\\\"", 2); continue;
        case '\\': jt_buf_put(c, b, "\\\\", 2); continue;
        case '\n': jt_buf_put(c, b, "\\n", 2); continue;
        case '\r': jt_buf_put(c, b, "\\r", 2); continue;
        case '\t': jt_buf_put(c, b, "\\t", 2); continue;
        case '\b': jt_buf_put(c, b, "\\b", 2); continue;
        case '\f': jt_buf_put(c, b, "\\f", 2); continue;
        default: break;
        }
        if (cp < 0x20 || (ascii && cp > 0x7E)) {
            if (cp >= 0x10000) {
                jt_buf_printf(c, b, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
            } else {
                jt_buf_printf(c, b, "\\u%04x", cp);
            }
        } else {
            jt_buf_put(c, b, s + at, i - at);
        }
    }
    jt_buf_putc(c, b, '"');
}

static void jt_json_float(jt_ctx *c, jt_buf *b, double f)
{
    char num[32];
    if (isnan(f)) strcpy(num, "NaN");
    else if (isinf(f)) strcpy(num, f < 0 ? "-Infinity" : "Infinity");
    else jt_format_float(num, f);
    jt_buf_put(c, b, num, strlen(num));
}

static void jt_json_newline(jt_ctx *c, jt_buf *b, const jt_json_opts *o, int level)
{
    jt_buf_putc(c, b, '\n');
    for (int i = 0; i < level; i++) jt_buf_put(c, b, o->indent, o->indent_len);
}

/* A dict key as json.dumps writes it: strings as they are, numbers, booleans and None as text. */
static void jt_json_key(jt_ctx *c, size_t pos, jt_buf *b, jt_value k, const jt_json_opts *o)
{
    switch (k.type) {
    case JT_STR: jt_json_str(c, b, k.s.p, k.s.n, o->ensure_ascii); return;
    case JT_BOOL: jt_buf_put(c, b, k.b ? "\"true\"" : "\"false\"", k.b ? 6 : 7); return;
    case JT_NONE: jt_buf_put(c, b, "\"null\"", 6); return;
    case JT_INT: jt_buf_printf(c, b, "\"%lld\"", k.i); return;
    case JT_FLOAT:
        jt_buf_putc(c, b, '"');
        jt_json_float(c, b, k.f);
        jt_buf_putc(c, b, '"');
        return;
    default:
        jt_fail(c, pos, "tojson: keys must be str, int, float, bool or None, not %s", jt_type_name(k));
    }
}

static void jt_json_value(jt_ctx *c, size_t pos, jt_buf *b, jt_value v, const jt_json_opts *o, int level);

static void jt_json_dict(jt_ctx *c, size_t pos, jt_buf *b, const jt_dict *d, const jt_json_opts *o, int level)
{
    if (!d->n) { jt_buf_put(c, b, "{}", 2); return; }
    size_t *order = jt_alloc(c, d->n * sizeof *order);
    for (size_t i = 0; i < d->n; i++) order[i] = i;
    if (o->sort_keys)   /* insertion sort: stable, and every comparison may fail as Python's sorted() would */
        for (size_t i = 1; i < d->n; i++)
            for (size_t j = i; j > 0 && jt_compare(c, pos, d->keys[order[j - 1]], d->keys[order[j]]) > 0; j--) {
                size_t t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
                jt_step(c, pos, 1);
            }
    jt_buf_putc(c, b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) jt_buf_put(c, b, o->item_sep, o->item_sep_len);
        if (o->indent) jt_json_newline(c, b, o, level + 1);
        jt_json_key(c, pos, b, d->keys[order[i]], o);
        jt_buf_put(c, b, o->key_sep, o->key_sep_len);
        jt_json_value(c, pos, b, d->vals[order[i]], o, level + 1);
    }
    if (o->indent) jt_json_newline(c, b, o, level);
    jt_buf_putc(c, b, '}');
}

static void jt_json_value(jt_ctx *c, size_t pos, jt_buf *b, jt_value v, const jt_json_opts *o, int level)
{
    jt_enter(c, pos);
    switch (v.type) {
    case JT_NONE: jt_buf_put(c, b, "null", 4); break;
    case JT_BOOL: jt_buf_put(c, b, v.b ? "true" : "false", v.b ? 4 : 5); break;
    case JT_INT: jt_buf_printf(c, b, "%lld", v.i); break;
    case JT_FLOAT: jt_json_float(c, b, v.f); break;
    case JT_STR: jt_json_str(c, b, v.s.p, v.s.n, o->ensure_ascii); break;
    case JT_DICT: jt_json_dict(c, pos, b, v.dict, o, level); break;
    case JT_LIST:
        if (v.list->kind == JT_SEQ_LIST || v.list->kind == JT_SEQ_TUPLE) {
            if (!v.list->n) { jt_buf_put(c, b, "[]", 2); break; }
            jt_buf_putc(c, b, '[');
            for (size_t i = 0; i < v.list->n; i++) {
                if (i) jt_buf_put(c, b, o->item_sep, o->item_sep_len);
                if (o->indent) jt_json_newline(c, b, o, level + 1);
                jt_json_value(c, pos, b, v.list->items[i], o, level + 1);
            }
            if (o->indent) jt_json_newline(c, b, o, level);
            jt_buf_putc(c, b, ']');
            break;
        }
        jt_fail(c, pos, "tojson: Object of type %s is not JSON serializable", jt_type_name(v));   /* views, ranges */
    default:
        jt_fail(c, pos, "tojson: Object of type %s is not JSON serializable", jt_type_name(v));
    }
    jt_leave(c);
}

void jt_json_dump(jt_ctx *c, size_t pos, jt_buf *b, jt_value v, const jt_json_opts *o)
{
    jt_json_value(c, pos, b, v, o, 0);
}
