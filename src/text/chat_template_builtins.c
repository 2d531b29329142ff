/* chat_template_builtins.c — jinja2's filters and tests that chat templates use,
 * with jinja2's semantics (jinja2/filters.py, jinja2/tests.py) and transformers'
 * tojson. select/reject/selectattr/rejectattr/map/items and reverse (of a list)
 * return generators, as in jinja2: always true, no length, consumed by the
 * first loop, join or list over them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "chat_template_internal.h"

enum {
    F_ABS, F_CAPITALIZE, F_COUNT, F_D, F_DEFAULT, F_FIRST, F_FLOAT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH,
    F_LIST, F_LOWER, F_MAP, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT,
    F_SELECTATTR, F_STRING, F_TOJSON, F_TRIM, F_UPPER,
};
static const char *const filter_names[] = {
    "abs", "capitalize", "count", "d", "default", "first", "float", "int", "items", "join", "last", "length",
    "list", "lower", "map", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
    "selectattr", "string", "tojson", "trim", "upper", NULL,
};

enum {
    T_DEFINED, T_UNDEFINED, T_NONE, T_STRING, T_NUMBER, T_INTEGER, T_FLOAT, T_BOOLEAN, T_TRUE, T_FALSE,
    T_MAPPING, T_ITERABLE, T_SEQUENCE, T_CALLABLE, T_ODD, T_EVEN, T_DIVISIBLEBY, T_EQ, T_NE, T_LT, T_LE,
    T_GT, T_GE, T_IN, T_SAMEAS, T_LOWER, T_UPPER,
};
static const struct { const char *name; int id; } test_names[] = {
    {"defined", T_DEFINED}, {"undefined", T_UNDEFINED}, {"none", T_NONE}, {"string", T_STRING},
    {"number", T_NUMBER}, {"integer", T_INTEGER}, {"float", T_FLOAT}, {"boolean", T_BOOLEAN},
    {"true", T_TRUE}, {"false", T_FALSE}, {"mapping", T_MAPPING}, {"iterable", T_ITERABLE},
    {"sequence", T_SEQUENCE}, {"callable", T_CALLABLE}, {"odd", T_ODD}, {"even", T_EVEN},
    {"divisibleby", T_DIVISIBLEBY}, {"equalto", T_EQ}, {"eq", T_EQ}, {"==", T_EQ}, {"ne", T_NE},
    {"!=", T_NE}, {"lt", T_LT}, {"lessthan", T_LT}, {"<", T_LT}, {"le", T_LE}, {"<=", T_LE},
    {"gt", T_GT}, {"greaterthan", T_GT}, {">", T_GT}, {"ge", T_GE}, {">=", T_GE}, {"in", T_IN},
    {"sameas", T_SAMEAS}, {"lower", T_LOWER}, {"upper", T_UPPER}, {NULL, 0},
};

int jt_filter_id(const char *name)
{
    for (int i = 0; filter_names[i]; i++)
        if (strcmp(filter_names[i], name) == 0) return i;
    return -1;
}

int jt_test_id(const char *name)
{
    for (int i = 0; test_names[i].name; i++)
        if (strcmp(test_names[i].name, name) == 0) return test_names[i].id;
    return -1;
}

// ---- tests ----

/* value % m == want for numbers (odd, even, divisibleby), with Python's modulo. */
static bool mod_is(jt_ctx *c, jt_value v, jt_value m, double want)
{
    if (!jt_is_number(v) || !jt_is_number(m))
        jt_fail(c, JT_NO_POS, "unsupported operand type(s) for %%: '%s' and '%s'", jt_type_name(v), jt_type_name(m));
    if (v.type != JT_FLOAT && m.type != JT_FLOAT) {
        long long x = v.type == JT_INT ? v.i : v.b, y = m.type == JT_INT ? m.i : m.b;
        if (!y) jt_fail(c, JT_NO_POS, "integer modulo by zero");
        long long r = y == -1 ? 0 : x % y;
        if (r && ((r < 0) != (y < 0))) r += y;
        return (double)r == want;
    }
    double x = jt_as_double(v), y = jt_as_double(m);
    if (y == 0) jt_fail(c, JT_NO_POS, "float modulo");
    double r = fmod(x, y);
    if (r && ((r < 0) != (y < 0))) r += y;
    return r == want;
}

/* Python's str.islower() (want_lower) or isupper(): a cased character and none of the other case. */
static bool case_is(jt_ctx *c, jt_value v, bool want_lower)
{
    jt_value s = jt_to_str(c, v);
    bool cased = false;
    for (size_t i = 0; i < s.s.n;) {
        uint32_t cp = jt_utf8_next(s.s.p, s.s.n, &i);
        int cat = cp >= 0xDC80 && cp <= 0xDCFF ? UTF8PROC_CATEGORY_CN : utf8proc_category((utf8proc_int32_t)cp);
        if (cat == UTF8PROC_CATEGORY_LT || cat == (want_lower ? UTF8PROC_CATEGORY_LU : UTF8PROC_CATEGORY_LL)) return false;
        if (cat == (want_lower ? UTF8PROC_CATEGORY_LL : UTF8PROC_CATEGORY_LU)) cased = true;
    }
    return cased;
}

bool jt_apply_test(jt_render *r, size_t at, int id, jt_value v, const jt_args *a)
{
    jt_ctx *c = &r->c;
    c->at = at;
    bool one = id >= T_DIVISIBLEBY && id <= T_SAMEAS;
    jt_check_args(c, "a test", a, one ? 1 : 0, NULL);
    if (one && !a->n_pos) jt_fail(c, at, "the test takes an argument (is TEST VALUE)");
    jt_value x = one ? a->pos[0] : jt_none_v();
    switch (id) {
    case T_DEFINED: return v.type != JT_UNDEFINED;
    case T_UNDEFINED: return v.type == JT_UNDEFINED;
    case T_NONE: return v.type == JT_NONE;
    case T_STRING: return v.type == JT_STR;
    case T_NUMBER: return jt_is_number(v);
    case T_INTEGER: return v.type == JT_INT;
    case T_FLOAT: return v.type == JT_FLOAT;
    case T_BOOLEAN: return v.type == JT_BOOL;
    case T_TRUE: return v.type == JT_BOOL && v.b;
    case T_FALSE: return v.type == JT_BOOL && !v.b;
    case T_MAPPING: return v.type == JT_DICT;
    case T_ITERABLE:
        return v.type == JT_STR || v.type == JT_LIST || v.type == JT_DICT || v.type == JT_ITER || v.type == JT_UNDEFINED ||
               v.type == JT_LOOP;
    case T_SEQUENCE:
        return v.type == JT_STR || v.type == JT_DICT || v.type == JT_UNDEFINED ||
               (v.type == JT_LIST && (v.list->kind == JT_SEQ_LIST || v.list->kind == JT_SEQ_TUPLE || v.list->kind == JT_SEQ_RANGE));
    case T_CALLABLE: return v.type == JT_MACRO || v.type == JT_FUNC || v.type == JT_LOOP || v.type == JT_UNDEFINED;
    case T_ODD: return mod_is(c, v, jt_int_v(2), 1);
    case T_EVEN: return mod_is(c, v, jt_int_v(2), 0);
    case T_DIVISIBLEBY: return mod_is(c, v, x, 0);
    case T_EQ: return jt_equal(c, v, x);
    case T_NE: return !jt_equal(c, v, x);
    case T_LT: return jt_compare(c, at, v, x) < 0;
    case T_LE: return jt_compare(c, at, v, x) <= 0;
    case T_GT: return jt_compare(c, at, v, x) > 0;
    case T_GE: return jt_compare(c, at, v, x) >= 0;
    case T_IN: return jt_contains(r, x, v);
    case T_SAMEAS:   /* identity: containers by address, small values by equality */
        if (v.type != x.type) return false;
        if (v.type == JT_LIST || v.type == JT_ITER || v.type == JT_DICT || v.type == JT_NAMESPACE) return v.list == x.list;
        return jt_equal(c, v, x);
    case T_LOWER: return case_is(c, v, true);
    case T_UPPER: return case_is(c, v, false);
    }
    jt_fail(c, at, "internal error: test %d", id);
}

// ---- helpers of the filters ----

static jt_value length_of(jt_ctx *c, jt_value v)
{
    switch (v.type) {
    case JT_UNDEFINED: return jt_int_v(0);
    case JT_STR: return jt_int_v((long long)jt_utf8_count(v.s.p, v.s.n));
    case JT_LIST: return jt_int_v((long long)v.list->n);
    case JT_DICT: return jt_int_v((long long)v.dict->n);
    case JT_LOOP: return jt_int_v((long long)v.loop->items->n);
    default: jt_fail(c, JT_NO_POS, "object of type '%s' has no len()", jt_type_name(v));
    }
}

/* A generator that fails when first used, as jinja2's do when given a non-iterable. */
static jt_value lazy_failure(jt_ctx *c, const char *fmt, const char *arg)
{
    char msg[160];
    snprintf(msg, sizeof msg, fmt, arg);
    jt_value v = jt_iter_v(c, NULL, 0);
    v.list->fail = jt_strndup(c, msg, strlen(msg));
    return v;
}

/* jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0 (subscripts). */
static jt_value attr_path(jt_ctx *c, jt_value item, jt_value attr, const jt_value *dflt)
{
    if (attr.type != JT_STR) {
        item = jt_get_item(c, JT_NO_POS, item, attr);
    } else {
        for (size_t i = 0; i <= attr.s.n;) {
            const char *dot = memchr(attr.s.p + i, '.', attr.s.n - i);
            size_t end = dot ? (size_t)(dot - attr.s.p) : attr.s.n;
            bool digits = end > i;
            long long k = 0;
            for (size_t j = i; j < end && digits; j++) {
                digits = attr.s.p[j] >= '0' && attr.s.p[j] <= '9' && k < 100000000000000000LL;
                k = k * 10 + (attr.s.p[j] - '0');
            }
            item = jt_get_item(c, JT_NO_POS, item, digits ? jt_int_v(k) : jt_str_v(attr.s.p + i, end - i));
            i = end + 1;
        }
    }
    if (dflt && dflt->type != JT_NONE && item.type == JT_UNDEFINED) return *dflt;
    return item;
}

/* select/reject/selectattr/rejectattr: args are (attribute?, test name?, test args...). */
static jt_value select_items(jt_render *r, size_t at, jt_value seq, const jt_args *a, bool by_attr, bool keep)
{
    jt_ctx *c = &r->c;
    size_t off = by_attr;
    if (by_attr && !a->n_pos) jt_fail(c, at, "missing parameter for attribute name");
    int test = -1;
    if (a->n_pos > off) {
        jt_value name = jt_str_arg(c, "select", &a->pos[off]);
        char buf[32] = {0};
        memcpy(buf, name.s.p, name.s.n < sizeof buf - 1 ? name.s.n : sizeof buf - 1);
        test = jt_test_id(buf);
        if (test < 0) jt_fail(c, at, "no test named '%.*s'", (int)(name.s.n < 40 ? name.s.n : 40), name.s.p);
    }
    jt_args targs = {a->pos + off + 1, a->n_pos > off ? a->n_pos - off - 1 : 0, a->kw_names, a->kw, a->n_kw};
    if (!jt_truthy(seq)) return jt_iter_v(c, NULL, 0);   /* jinja2: 'if seq: for item in seq' */
    if (!jt_iterable(seq)) return lazy_failure(c, "'%s' object is not iterable", jt_type_name(seq));
    jt_list *items = jt_iterate(c, at, seq);
    jt_value *out = jt_alloc(c, (items->n + 1) * sizeof *out);
    size_t n = 0;
    for (size_t i = 0; i < items->n; i++) {
        jt_step(c, at, 1);
        jt_value v = by_attr ? attr_path(c, items->items[i], a->pos[0], NULL) : items->items[i];
        bool pass = test >= 0 ? jt_apply_test(r, at, test, v, &targs) : jt_truthy(v);
        if (pass == keep) out[n++] = items->items[i];
    }
    return jt_iter_v(c, out, n);
}

static jt_value map(jt_render *r, size_t at, jt_value seq, const jt_args *a)
{
    jt_ctx *c = &r->c;
    const jt_value *attr = NULL, *dflt = NULL;
    int filt = -1;
    if (!a->n_pos) {
        for (size_t k = 0; k < a->n_kw; k++) {
            if (!strcmp(a->kw_names[k], "attribute")) attr = &a->kw[k];
            else if (!strcmp(a->kw_names[k], "default")) dflt = &a->kw[k];
            else jt_fail(c, at, "map: unexpected keyword argument '%s'", a->kw_names[k]);
        }
        if (!attr) jt_fail(c, at, "map requires a filter argument");
    } else {
        jt_value name = jt_str_arg(c, "map", &a->pos[0]);
        char buf[32] = {0};
        memcpy(buf, name.s.p, name.s.n < sizeof buf - 1 ? name.s.n : sizeof buf - 1);
        filt = jt_filter_id(buf);
        if (filt < 0) jt_fail(c, at, "no filter named '%.*s'", (int)(name.s.n < 40 ? name.s.n : 40), name.s.p);
    }
    jt_args fargs = {a->pos + 1, a->n_pos ? a->n_pos - 1 : 0, a->kw_names, a->kw, a->n_kw};
    if (!jt_truthy(seq)) return jt_iter_v(c, NULL, 0);   /* jinja2: 'if value: for item in value' */
    if (!jt_iterable(seq)) return lazy_failure(c, "'%s' object is not iterable", jt_type_name(seq));
    jt_list *items = jt_iterate(c, at, seq);
    jt_value *out = jt_alloc(c, (items->n + 1) * sizeof *out);
    for (size_t i = 0; i < items->n; i++) {
        jt_step(c, at, 1);
        out[i] = attr ? attr_path(c, items->items[i], *attr, dflt) : jt_apply_filter(r, at, filt, items->items[i], &fargs);
    }
    return jt_iter_v(c, out, items->n);
}

/* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False). */
static jt_value tojson(jt_render *r, size_t at, jt_value v, const jt_args *a)
{
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    jt_ctx *c = &r->c;
    jt_check_args(c, "tojson", a, 4, names);
    const jt_value *ascii = jt_arg(a, 0, names[0]), *indent = jt_arg(a, 1, names[1]);
    const jt_value *seps = jt_arg(a, 2, names[2]), *sort = jt_arg(a, 3, names[3]);
    jt_json_opts o = {.ensure_ascii = ascii && jt_truthy(*ascii), .sort_keys = sort && jt_truthy(*sort)};
    if (indent && indent->type != JT_NONE) {
        if (indent->type == JT_STR) {
            o.indent = indent->s.p;
            o.indent_len = indent->s.n;
        } else if (indent->type == JT_INT || indent->type == JT_BOOL) {
            long long k = indent->type == JT_INT ? indent->i : indent->b;
            if (k > 4096) jt_fail(c, at, "tojson: indent %lld is larger than 4096", k);
            o.indent_len = k > 0 ? (size_t)k : 0;
            char *sp = jt_alloc(c, o.indent_len + 1);
            memset(sp, ' ', o.indent_len);
            o.indent = sp;
        } else {
            jt_fail(c, at, "tojson: indent must be an int or a string, not %s", jt_type_name(*indent));
        }
    }
    o.item_sep = o.indent ? "," : ", ";
    o.key_sep = ": ";
    if (seps && seps->type != JT_NONE) {
        jt_list *l = jt_iterate(c, at, *seps);
        if (l->n != 2 || l->items[0].type != JT_STR || l->items[1].type != JT_STR)
            jt_fail(c, at, "tojson: separators must be two strings");
        o.item_sep = l->items[0].s.p, o.item_sep_len = l->items[0].s.n;
        o.key_sep = l->items[1].s.p, o.key_sep_len = l->items[1].s.n;
    } else {
        o.item_sep_len = strlen(o.item_sep);
        o.key_sep_len = 2;
    }
    jt_buf b = {.max = r->max_output};
    jt_json_dump(c, at, &b, v, &o);
    return jt_str_v(b.p ? b.p : "", b.n);
}

/* Python's float(s) for the int and float filters; false when s is not a number. */
static bool parse_float(jt_ctx *c, jt_value s, double *out)
{
    jt_value t = jt_str_strip(c, s, NULL, true, true);
    char buf[128];
    size_t n = 0;
    for (size_t i = 0; i < t.s.n; i++) {
        char ch = t.s.p[i];
        bool between_digits = i > 0 && i + 1 < t.s.n && t.s.p[i - 1] >= '0' && t.s.p[i - 1] <= '9' &&
                              t.s.p[i + 1] >= '0' && t.s.p[i + 1] <= '9';
        if (ch == '_' && between_digits) continue;
        if (n + 1 >= sizeof buf || ch == 'x' || ch == 'X' || ch == 0 || ch == ' ') return false;
        buf[n++] = ch;
    }
    buf[n] = 0;
    if (!n) return false;
    char *end;
    *out = strtod(buf, &end);
    return *end == 0;
}

/* Python's int(s, base) for strings. */
static bool parse_int(jt_value s, long long base, long long *out)
{
    size_t i = 0, n = s.s.n;
    const char *p = s.s.p;
    while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r'))) i++;
    while (n > i && (p[n - 1] == ' ' || (p[n - 1] >= '\t' && p[n - 1] <= '\r'))) n--;
    bool neg = i < n && p[i] == '-';
    if (i < n && (p[i] == '-' || p[i] == '+')) i++;
    if (base == 16 && n - i > 2 && p[i] == '0' && (p[i + 1] | 0x20) == 'x') i += 2;
    if (i >= n || base < 2 || base > 36) return false;
    unsigned long long v = 0;
    for (size_t k = i; k < n; k++) {
        if (p[k] == '_' && k > i && k + 1 < n && p[k - 1] != '_') continue;
        int d = p[k] >= '0' && p[k] <= '9' ? p[k] - '0' : (p[k] | 0x20) >= 'a' && (p[k] | 0x20) <= 'z' ? (p[k] | 0x20) - 'a' + 10 : 99;
        if (d >= base || v > (9223372036854775807ULL - (unsigned)d) / (unsigned long long)base) return false;
        v = v * (unsigned long long)base + (unsigned)d;
    }
    *out = neg ? -(long long)v : (long long)v;
    return true;
}

static jt_value to_int(jt_ctx *c, jt_value v, const jt_value *dflt, long long base)
{
    long long k;
    double f;
    switch (v.type) {
    case JT_INT: return v;
    case JT_BOOL: return jt_int_v(v.b);
    case JT_FLOAT: f = v.f; break;
    case JT_STR:
        if (parse_int(v, base, &k)) return jt_int_v(k);
        if (!parse_float(c, v, &f)) return dflt ? *dflt : jt_int_v(0);
        break;
    default: return dflt ? *dflt : jt_int_v(0);
    }
    if (!(f > -9.2e18 && f < 9.2e18)) return dflt ? *dflt : jt_int_v(0);
    return jt_int_v((long long)f);
}

/* Python's round(x, ndigits): correctly rounded, ties to even (printf rounds so). */
static jt_value round_value(jt_ctx *c, size_t at, jt_value v, const jt_args *a)
{
    static const char *const names[] = {"precision", "method", NULL};
    jt_check_args(c, "round", a, 2, names);
    const jt_value *pv = jt_arg(a, 0, names[0]), *mv = jt_arg(a, 1, names[1]);
    long long prec = 0;
    if (pv) {
        if (pv->type != JT_INT && pv->type != JT_BOOL) jt_fail(c, at, "round: precision must be an integer");
        prec = pv->type == JT_INT ? pv->i : pv->b;
    }
    const char *method = "common";
    if (mv) {
        jt_value m = jt_str_arg(c, "round", mv);
        method = m.s.n == 4 && !memcmp(m.s.p, "ceil", 4) ? "ceil" : m.s.n == 5 && !memcmp(m.s.p, "floor", 5) ? "floor"
               : m.s.n == 6 && !memcmp(m.s.p, "common", 6) ? "common" : NULL;
        if (!method) jt_fail(c, at, "round: method must be common, ceil or floor");
    }
    if (!jt_is_number(v)) jt_fail(c, at, "round: type %s doesn't define __round__ method", jt_type_name(v));
    if (prec < -400) prec = -400;
    if (strcmp(method, "common") != 0) {
        double scale = pow(10.0, (double)prec), x = jt_as_double(v) * scale;
        return jt_float_v((method[0] == 'c' ? ceil(x) : floor(x)) / scale);
    }
    if (v.type != JT_FLOAT) {
        if (prec >= 0) return jt_int_v(v.type == JT_INT ? v.i : v.b);
        double scale = pow(10.0, (double)-prec), x = (double)(v.type == JT_INT ? v.i : v.b) / scale;
        return jt_int_v((long long)(nearbyint(x) * scale));
    }
    double x = v.f;
    if (!isfinite(x) || prec > 323) return v;
    if (prec < 0) {
        double scale = pow(10.0, (double)-prec);
        return jt_float_v(nearbyint(x / scale) * scale);
    }
    char buf[720];
    snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
    return jt_float_v(strtod(buf, NULL));
}

// ---- filters ----

jt_value jt_apply_filter(jt_render *r, size_t at, int id, jt_value v, const jt_args *a)
{
    jt_ctx *c = &r->c;
    c->at = at;
    jt_step(c, at, 1);
    const char *name = filter_names[id];
    switch (id) {
    case F_ABS:
        jt_check_args(c, name, a, 0, NULL);
        if (v.type == JT_FLOAT) return jt_float_v(fabs(v.f));
        if (v.type == JT_BOOL) return jt_int_v(v.b);
        if (v.type != JT_INT) jt_fail(c, at, "bad operand type for abs(): '%s'", jt_type_name(v));
        if (v.i == -9223372036854775807LL - 1) jt_fail(c, at, "integer overflow in abs (integers are 64-bit here)");
        return jt_int_v(v.i < 0 ? -v.i : v.i);
    case F_CAPITALIZE: case F_LOWER: case F_UPPER:
        jt_check_args(c, name, a, 0, NULL);
        return jt_str_case(c, jt_to_str(c, v), id == F_CAPITALIZE ? 'c' : id == F_LOWER ? 'l' : 'u');
    case F_COUNT: case F_LENGTH:
        jt_check_args(c, name, a, 0, NULL);
        return length_of(c, v);
    case F_D: case F_DEFAULT: {
        static const char *const names[] = {"default_value", "boolean", NULL};
        jt_check_args(c, name, a, 2, names);
        const jt_value *dv = jt_arg(a, 0, names[0]), *boolean = jt_arg(a, 1, names[1]);
        bool use = v.type == JT_UNDEFINED || (boolean && jt_truthy(*boolean) && !jt_truthy(v));
        return use ? (dv ? *dv : jt_str_v("", 0)) : v;
    }
    case F_FIRST: case F_LAST: {
        jt_check_args(c, name, a, 0, NULL);
        if (id == F_LAST && v.type == JT_ITER) jt_fail(c, at, "'generator' object is not reversible");
        if (v.type == JT_ITER) {
            jt_iter_check(c, at, v);
            if (v.list->pos < v.list->n) return v.list->items[v.list->pos++];
        } else {
            jt_list *items = jt_iterate(c, at, v);
            if (items->n) return items->items[id == F_FIRST ? 0 : items->n - 1];
        }
        return jt_undef_hint(c, id == F_FIRST ? "No first item, sequence was empty." : "No last item, sequence was empty.");
    }
    case F_FLOAT: {
        static const char *const names[] = {"default", NULL};
        jt_check_args(c, name, a, 1, names);
        const jt_value *dv = jt_arg(a, 0, names[0]);
        double f;
        if (v.type == JT_UNDEFINED) jt_fail_undefined(c, at, v);   /* Undefined.__float__ raises */
        if (jt_is_number(v)) return jt_float_v(jt_as_double(v));
        if (v.type == JT_STR && parse_float(c, v, &f)) return jt_float_v(f);
        return dv ? *dv : jt_float_v(0.0);
    }
    case F_INT: {
        static const char *const names[] = {"default", "base", NULL};
        jt_check_args(c, name, a, 2, names);
        const jt_value *bv = jt_arg(a, 1, names[1]);
        long long base = bv && (bv->type == JT_INT) ? bv->i : 10;
        if (v.type == JT_UNDEFINED) jt_fail_undefined(c, at, v);   /* Undefined.__int__ raises */
        return to_int(c, v, jt_arg(a, 0, names[0]), base);
    }
    case F_ITEMS: {
        jt_check_args(c, name, a, 0, NULL);
        if (v.type == JT_UNDEFINED) return jt_iter_v(c, NULL, 0);
        if (v.type != JT_DICT) return lazy_failure(c, "%s", "Can only get item pairs from a mapping.");
        jt_value *out = jt_alloc(c, (v.dict->n + 1) * sizeof *out);
        for (size_t i = 0; i < v.dict->n; i++) {
            out[i] = jt_list_v(c, 2, JT_SEQ_TUPLE);
            out[i].list->items[0] = v.dict->keys[i];
            out[i].list->items[1] = v.dict->vals[i];
        }
        return jt_iter_v(c, out, v.dict->n);
    }
    case F_JOIN: {
        static const char *const names[] = {"d", "attribute", NULL};
        jt_check_args(c, name, a, 2, names);
        const jt_value *dv = jt_arg(a, 0, names[0]), *attr = jt_arg(a, 1, names[1]);
        jt_value sep = dv ? jt_to_str(c, *dv) : jt_str_v("", 0);
        jt_list *items = jt_iterate(c, at, v);
        jt_value strs = jt_list_v(c, items->n, JT_SEQ_LIST);
        for (size_t i = 0; i < items->n; i++) {
            jt_value item = attr && attr->type != JT_NONE ? attr_path(c, items->items[i], *attr, NULL) : items->items[i];
            strs.list->items[i] = jt_to_str(c, item);
        }
        return jt_str_join(c, sep, strs.list);
    }
    case F_LIST: {
        jt_check_args(c, name, a, 0, NULL);
        jt_list *items = jt_iterate(c, at, v);
        jt_value out = jt_list_v(c, items->n, JT_SEQ_LIST);
        if (items->n) memcpy(out.list->items, items->items, items->n * sizeof(jt_value));
        return out;
    }
    case F_MAP: return map(r, at, v, a);
    case F_SELECT: case F_REJECT: return select_items(r, at, v, a, false, id == F_SELECT);
    case F_SELECTATTR: case F_REJECTATTR: return select_items(r, at, v, a, true, id == F_SELECTATTR);
    case F_REPLACE: {
        static const char *const names[] = {"old", "new", "count", NULL};
        jt_check_args(c, name, a, 3, names);
        const jt_value *old = jt_arg(a, 0, names[0]), *rep = jt_arg(a, 1, names[1]), *count = jt_arg(a, 2, names[2]);
        if (!old || !rep) jt_fail(c, at, "replace: takes the old and the new string");
        long long k = -1;
        if (count && count->type != JT_NONE) {
            if (count->type != JT_INT && count->type != JT_BOOL) jt_fail(c, at, "replace: count must be an integer");
            k = count->type == JT_INT ? count->i : count->b;
        }
        return jt_str_replace(c, jt_to_str(c, v), jt_to_str(c, *old), jt_to_str(c, *rep), k);
    }
    case F_REVERSE: {
        jt_check_args(c, name, a, 0, NULL);
        if (v.type == JT_STR) {
            jt_list *chars = jt_iterate(c, at, v);
            jt_buf b = {0};
            for (size_t i = chars->n; i-- > 0;) jt_buf_put(c, &b, chars->items[i].s.p, chars->items[i].s.n);
            return jt_str_v(b.p ? b.p : "", b.n);
        }
        bool generator = v.type == JT_ITER;   /* reversed() fails on it: jinja2 makes a reversed list */
        jt_list *items = jt_iterate(c, at, v);
        jt_value out = jt_list_v(c, items->n, JT_SEQ_LIST);
        for (size_t i = 0; i < items->n; i++) out.list->items[i] = items->items[items->n - 1 - i];
        return generator ? out : jt_iter_v(c, out.list->items, out.list->n);
    }
    case F_ROUND: return round_value(c, at, v, a);
    case F_SAFE: case F_STRING:
        jt_check_args(c, name, a, 0, NULL);
        return jt_to_str(c, v);
    case F_TOJSON: return tojson(r, at, v, a);
    case F_TRIM: {
        static const char *const names[] = {"chars", NULL};
        jt_check_args(c, name, a, 1, names);
        return jt_str_strip(c, jt_to_str(c, v), jt_arg(a, 0, names[0]), true, true);
    }
    }
    jt_fail(c, at, "internal error: filter %d", id);
}
