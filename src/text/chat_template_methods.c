/* chat_template_methods.c — what '.' and '[ ]' reach, as jinja2's sandbox
 * resolves them: attribute access tries the Python attribute (a str or dict
 * method) before the key, subscripts try the key before the attribute, and a
 * miss is Undefined. The str methods (strip, split, replace ...), dict methods
 * (items, keys, values, get), loop.cycle, and the globals raise_exception,
 * strftime_now, namespace, range and dict. Methods that mutate (list.append,
 * dict.update ...) are refused as jinja2's ImmutableSandboxedEnvironment refuses
 * them; Python methods not implemented here are named when called. */
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "chat_template_internal.h"

enum {
    FN_RAISE, FN_STRFTIME, FN_NAMESPACE, FN_RANGE, FN_DICT,
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER, M_REPLACE,
    M_FIND, M_COUNT, M_TITLE, M_CAPITALIZE, M_JOIN, M_ISSPACE,
    M_ITEMS, M_KEYS, M_VALUES, M_GET, M_CYCLE, M_LIST_COUNT, M_LIST_INDEX,
};

static const char *const global_names[] = {"raise_exception", "strftime_now", "namespace", "range", "dict", NULL};
static const char *const str_methods[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                          "upper", "lower", "replace", "find", "count", "title", "capitalize",
                                          "join", "isspace", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};
static const char *const str_unsupported[] = {"format", "format_map", "splitlines", "zfill", "center", "ljust", "rjust",
                                              "partition", "rpartition", "casefold", "swapcase", "expandtabs", "index",
                                              "rindex", "rfind", "isdigit", "isalpha", "isalnum", "isnumeric",
                                              "isdecimal", "islower", "isupper", "istitle", "isidentifier",
                                              "isprintable", "isascii", "encode", "translate", "removeprefix",
                                              "removesuffix", NULL};
static const char *const list_mutators[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", NULL};
static const char *const dict_mutators[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};

static int find_name(const char *const *names, const char *name)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], name) == 0) return i;
    return -1;
}

const jt_value *jt_arg(const jt_args *a, size_t i, const char *kw)
{
    if (i < a->n_pos) return &a->pos[i];
    for (size_t k = 0; kw && k < a->n_kw; k++)
        if (strcmp(a->kw_names[k], kw) == 0) return &a->kw[k];
    return NULL;
}

void jt_check_args(jt_ctx *c, const char *what, const jt_args *a, size_t max_pos, const char *const *names)
{
    if (a->n_pos > max_pos) jt_fail(c, JT_NO_POS, "%s takes at most %zu argument(s) (%zu given)", what, max_pos, a->n_pos);
    for (size_t k = 0; k < a->n_kw; k++) {
        size_t i = 0;
        while (i < max_pos && names && names[i] && strcmp(names[i], a->kw_names[k]) != 0) i++;
        if (i == max_pos || !names || !names[i])
            jt_fail(c, JT_NO_POS, "%s got an unexpected keyword argument '%s'", what, a->kw_names[k]);
        if (i < a->n_pos) jt_fail(c, JT_NO_POS, "%s got multiple values for argument '%s'", what, a->kw_names[k]);
    }
}

jt_value jt_str_arg(jt_ctx *c, const char *what, const jt_value *v)
{
    if (!v || v->type != JT_STR)
        jt_fail(c, JT_NO_POS, "%s: expected a string argument, got %s", what, v ? jt_type_name(*v) : "none");
    return *v;
}

static long long int_arg(jt_ctx *c, const char *what, const jt_value *v, long long dflt)
{
    if (!v || v->type == JT_NONE) return dflt;
    if (v->type == JT_INT) return v->i;
    if (v->type == JT_BOOL) return v->b;
    jt_fail(c, JT_NO_POS, "%s: expected an integer argument, got %s", what, jt_type_name(*v));
}

static jt_value bound(jt_ctx *c, int id, jt_value self)
{
    jt_value f = {.type = JT_FUNC};
    f.fn.id = id;
    f.fn.self = jt_alloc(c, sizeof *f.fn.self);
    *f.fn.self = self;
    return f;
}

jt_value jt_global_func(const char *name)
{
    int i = find_name(global_names, name);
    jt_value f = {.type = i < 0 ? JT_UNDEFINED : JT_FUNC};
    f.fn.id = FN_RAISE + i;
    return f;
}

// ---- strings ----

static bool in_chars(uint32_t cp, const jt_value *chars)
{
    if (!chars) return jt_is_space(cp);
    for (size_t i = 0; i < chars->s.n;)
        if (jt_utf8_next(chars->s.p, chars->s.n, &i) == cp) return true;
    return false;
}

/* Python's str.strip/lstrip/rstrip(chars); chars NULL: whitespace. */
jt_value jt_str_strip(jt_ctx *c, jt_value s, const jt_value *chars, bool left, bool right)
{
    if (chars && chars->type == JT_NONE) chars = NULL;
    if (chars) jt_str_arg(c, "strip", chars);
    size_t a = 0, b = s.s.n;
    jt_step(c, JT_NO_POS, s.s.n / 64);
    while (left && a < b) {
        size_t i = a;
        if (!in_chars(jt_utf8_next(s.s.p, b, &i), chars)) break;
        a = i;
    }
    while (right && b > a) {
        size_t start = b - 1;
        while (start > a && ((unsigned char)s.s.p[start] & 0xC0) == 0x80 && b - start < 4) start--;
        size_t i = start;
        uint32_t cp = jt_utf8_next(s.s.p, b, &i);
        if (i != b) start = b - 1, cp = 0xDC00u + (unsigned char)s.s.p[b - 1];
        if (!in_chars(cp, chars)) break;
        b = start;
    }
    return jt_str_v(s.s.p + a, b - a);
}

static bool is_cased(uint32_t cp)
{
    int cat = utf8proc_category((utf8proc_int32_t)cp);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

/* Python's full case mappings where they differ from the simple ones utf8proc
 * gives (the common part of Unicode's SpecialCasing.txt): cp -> upper, title. */
static const struct { uint32_t cp; const char *upper, *title; } special_upper[] = {
    {0x00DF, "SS", "Ss"}, {0xFB00, "FF", "Ff"}, {0xFB01, "FI", "Fi"}, {0xFB02, "FL", "Fl"}, {0xFB03, "FFI", "Ffi"},
    {0xFB04, "FFL", "Ffl"}, {0xFB05, "ST", "St"}, {0xFB06, "ST", "St"}, {0x0149, "\xCA\xBCN", "\xCA\xBCN"},
};

static const char *special_case(uint32_t cp, bool title)
{
    for (size_t i = 0; i < sizeof special_upper / sizeof *special_upper; i++)
        if (special_upper[i].cp == cp) return title ? special_upper[i].title : special_upper[i].upper;
    return NULL;
}

/* mode: 'u' upper, 'l' lower, 't' title (Python's str.title), 'c' capitalize. */
jt_value jt_str_case(jt_ctx *c, jt_value s, char mode)
{
    jt_buf b = {0};
    bool prev_cased = false, first = true;
    jt_step(c, JT_NO_POS, s.s.n / 16);
    for (size_t i = 0; i < s.s.n;) {
        uint32_t cp = jt_utf8_next(s.s.p, s.s.n, &i), out = cp;
        bool raw = cp >= 0xDC80 && cp <= 0xDCFF;
        bool to_title = mode == 't' ? !prev_cased : mode == 'c' && first;
        const char *full = raw || mode == 'l' || (mode != 'u' && !to_title) ? NULL : special_case(cp, mode != 'u');
        if (cp == 0x0130 && (mode == 'l' || (mode != 'u' && !to_title))) full = "i\xCC\x87";   /* İ lowers to i + U+0307 */
        if (full) {
            jt_buf_put(c, &b, full, strlen(full));
            prev_cased = is_cased(cp);
            first = false;
            continue;
        }
        if (!raw) {
            utf8proc_int32_t u = (utf8proc_int32_t)cp;
            switch (mode) {
            case 'u': out = (uint32_t)utf8proc_toupper(u); break;
            case 'l': out = (uint32_t)utf8proc_tolower(u); break;
            case 't': out = (uint32_t)(prev_cased ? utf8proc_tolower(u) : utf8proc_totitle(u)); break;
            default: out = (uint32_t)(first ? utf8proc_totitle(u) : utf8proc_tolower(u)); break;
            }
        }
        prev_cased = !raw && is_cased(cp);
        first = false;
        jt_buf_put_cp(c, &b, out);
    }
    return jt_str_v(b.p ? b.p : "", b.n);
}

/* Python's str.replace(old, new, count): count < 0 replaces all; an empty old
 * inserts new before every character and at the end. */
jt_value jt_str_replace(jt_ctx *c, jt_value s, jt_value old, jt_value rep, long long count)
{
    jt_buf b = {0};
    size_t i = 0;
    long long done = 0;
    jt_step(c, JT_NO_POS, s.s.n / 64);
    if (!old.s.n) {
        for (;;) {
            if (count >= 0 && done == count) break;
            jt_buf_put(c, &b, rep.s.p, rep.s.n);
            done++;
            if (i >= s.s.n) break;
            size_t at = i;
            jt_utf8_next(s.s.p, s.s.n, &i);
            jt_buf_put(c, &b, s.s.p + at, i - at);
        }
    } else {
        while (count < 0 || done < count) {
            const char *hit = memmem(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
            if (!hit) break;
            jt_buf_put(c, &b, s.s.p + i, (size_t)(hit - s.s.p) - i);
            jt_buf_put(c, &b, rep.s.p, rep.s.n);
            i = (size_t)(hit - s.s.p) + old.s.n;
            done++;
        }
    }
    jt_buf_put(c, &b, s.s.p + i, s.s.n - i);
    return jt_str_v(b.p ? b.p : "", b.n);
}

static size_t skip_space(const jt_value *s, size_t i)
{
    while (i < s->s.n) {
        size_t j = i;
        if (!jt_is_space(jt_utf8_next(s->s.p, s->s.n, &j))) break;
        i = j;
    }
    return i;
}

static size_t skip_nonspace(const jt_value *s, size_t i)
{
    while (i < s->s.n) {
        size_t j = i;
        if (jt_is_space(jt_utf8_next(s->s.p, s->s.n, &j))) break;
        i = j;
    }
    return i;
}

typedef struct str_list { jt_value *items; size_t n, cap; } str_list;

static void str_list_push(jt_ctx *c, str_list *l, jt_value v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        jt_value *p = jt_alloc(c, cap * sizeof *p);
        if (l->n) memcpy(p, l->items, l->n * sizeof *p);
        l->items = p;
        l->cap = cap;
    }
    l->items[l->n++] = v;
}

/* Python's str.split(sep, maxsplit); rsplit splits from the right (the
 * pieces are collected backwards and reversed). */
static jt_value str_split(jt_ctx *c, jt_value s, const jt_value *sep, long long maxsplit, bool from_right)
{
    str_list out = {0};
    jt_step(c, JT_NO_POS, s.s.n / 32);
    if (sep && sep->type == JT_NONE) sep = NULL;
    if (sep) {
        jt_str_arg(c, "split", sep);
        if (!sep->s.n) jt_fail(c, JT_NO_POS, "split: empty separator");
    }
    if (!sep && !from_right) {
        size_t i = skip_space(&s, 0);
        while (i < s.s.n) {
            if (maxsplit >= 0 && (long long)out.n == maxsplit) {
                str_list_push(c, &out, jt_str_v(s.s.p + i, s.s.n - i));
                break;
            }
            size_t j = skip_nonspace(&s, i);
            str_list_push(c, &out, jt_str_v(s.s.p + i, j - i));
            i = skip_space(&s, j);
        }
    } else if (!sep) {
        size_t end = s.s.n;
        for (;;) {   /* from the right: trailing whitespace first */
            while (end > 0) {
                size_t k = end - 1;
                while (k > 0 && ((unsigned char)s.s.p[k] & 0xC0) == 0x80) k--;
                size_t j = k;
                if (!jt_is_space(jt_utf8_next(s.s.p, end, &j)) || j != end) break;
                end = k;
            }
            if (!end) break;
            if (maxsplit >= 0 && (long long)out.n == maxsplit) {
                str_list_push(c, &out, jt_str_v(s.s.p, end));
                break;
            }
            size_t start = end;
            while (start > 0) {
                size_t k = start - 1;
                while (k > 0 && ((unsigned char)s.s.p[k] & 0xC0) == 0x80) k--;
                size_t j = k;
                if (jt_is_space(jt_utf8_next(s.s.p, start, &j)) && j == start) break;
                start = k;
            }
            str_list_push(c, &out, jt_str_v(s.s.p + start, end - start));
            end = start;
        }
    } else if (!from_right) {
        size_t i = 0;
        for (;;) {
            const char *hit = maxsplit >= 0 && (long long)out.n == maxsplit ? NULL
                                                                          : memmem(s.s.p + i, s.s.n - i, sep->s.p, sep->s.n);
            size_t end = hit ? (size_t)(hit - s.s.p) : s.s.n;
            str_list_push(c, &out, jt_str_v(s.s.p + i, end - i));
            if (!hit) break;
            i = end + sep->s.n;
        }
    } else {
        size_t end = s.s.n;
        for (;;) {
            size_t hit = (size_t)-1;
            if (maxsplit < 0 || (long long)out.n < maxsplit)
                for (size_t k = end; k >= sep->s.n && hit == (size_t)-1; k--)
                    if (memcmp(s.s.p + k - sep->s.n, sep->s.p, sep->s.n) == 0) hit = k - sep->s.n;
            size_t start = hit == (size_t)-1 ? 0 : hit + sep->s.n;
            str_list_push(c, &out, jt_str_v(s.s.p + start, end - start));
            if (hit == (size_t)-1) break;
            end = hit;
        }
    }
    jt_value v = jt_list_v(c, out.n, JT_SEQ_LIST);
    for (size_t i = 0; i < out.n; i++) v.list->items[i] = out.items[from_right ? out.n - 1 - i : i];
    return v;
}

static bool str_affix(jt_ctx *c, jt_value s, const jt_value *affix, bool prefix)
{
    const char *what = prefix ? "startswith" : "endswith";
    if (!affix) jt_fail(c, JT_NO_POS, "%s() takes at least 1 argument (0 given)", what);
    if (affix->type == JT_LIST && affix->list->kind == JT_SEQ_TUPLE) {
        for (size_t i = 0; i < affix->list->n; i++)
            if (str_affix(c, s, &affix->list->items[i], prefix)) return true;
        return false;
    }
    if (affix->type != JT_STR)
        jt_fail(c, JT_NO_POS, "%s first arg must be str or a tuple of str, not %s", what, jt_type_name(*affix));
    size_t n = affix->s.n;
    return n <= s.s.n && memcmp(prefix ? s.s.p : s.s.p + s.s.n - n, affix->s.p, n) == 0;
}

/* Python's str.join(iterable): every item must be a string. */
jt_value jt_str_join(jt_ctx *c, jt_value sep, const jt_list *items)
{
    jt_buf b = {0};
    for (size_t i = 0; i < items->n; i++) {
        if (items->items[i].type != JT_STR)
            jt_fail(c, JT_NO_POS, "sequence item %zu: expected str instance, %s found", i, jt_type_name(items->items[i]));
        if (i) jt_buf_put(c, &b, sep.s.p, sep.s.n);
        jt_buf_put(c, &b, items->items[i].s.p, items->items[i].s.n);
    }
    return jt_str_v(b.p ? b.p : "", b.n);
}

// ---- attribute and item access ----

static jt_value unsafe(jt_ctx *c, const char *type, const char *name)
{
    char hint[128];
    snprintf(hint, sizeof hint, "access to attribute '%s' of '%s' object is unsafe.", name, type);
    return jt_undef_hint(c, jt_strndup(c, hint, strlen(hint)));
}

static jt_value unsupported(jt_ctx *c, const char *type, const char *name)
{
    char hint[128];
    snprintf(hint, sizeof hint, "%s.%s() is not supported by ctune's chat-template engine", type, name);
    return jt_undef_hint(c, jt_strndup(c, hint, strlen(hint)));
}

bool jt_is_method_name(const char *name)
{
    return find_name(str_methods, name) >= 0 || find_name(dict_methods, name) >= 0 || find_name(str_unsupported, name) >= 0 ||
           find_name(list_mutators, name) >= 0 || find_name(dict_mutators, name) >= 0 || !strcmp(name, "copy") ||
           !strcmp(name, "fromkeys") || !strcmp(name, "index") || !strcmp(name, "count");
}

/* The Python attribute NAME of obj (a method), or Undefined. maybe_method false
 * skips the method tables (the name is in none of them). */
static jt_value python_attr(jt_ctx *c, jt_value obj, const char *name, bool maybe_method)
{
    int k;
    if (!maybe_method && (obj.type == JT_STR || obj.type == JT_DICT || obj.type == JT_LIST)) return jt_undef_v();
    switch (obj.type) {
    case JT_STR:
        if ((k = find_name(str_methods, name)) >= 0) return bound(c, M_STRIP + k, obj);
        if (find_name(str_unsupported, name) >= 0) return unsupported(c, "str", name);
        break;
    case JT_DICT:
        if ((k = find_name(dict_methods, name)) >= 0) return bound(c, M_ITEMS + k, obj);
        if (find_name(dict_mutators, name) >= 0) return unsafe(c, "dict", name);
        if (!strcmp(name, "copy") || !strcmp(name, "fromkeys")) return unsupported(c, "dict", name);
        break;
    case JT_LIST:
        if (obj.list->kind == JT_SEQ_LIST && find_name(list_mutators, name) >= 0) return unsafe(c, "list", name);
        if ((obj.list->kind == JT_SEQ_LIST || obj.list->kind == JT_SEQ_TUPLE || obj.list->kind == JT_SEQ_RANGE) &&
            (!strcmp(name, "count") || !strcmp(name, "index")))
            return bound(c, name[0] == 'c' ? M_LIST_COUNT : M_LIST_INDEX, obj);
        if (!strcmp(name, "copy")) return unsupported(c, jt_type_name(obj), name);
        break;
    case JT_LOOP:
        if (!strcmp(name, "cycle")) return bound(c, M_CYCLE, obj);
        return jt_loop_attr(c, obj.loop, name);
    case JT_NAMESPACE: {
        const jt_value *v = jt_dict_get(c, obj.dict, jt_cstr_v(name));
        if (v) return *v;
        break;
    }
    default: break;
    }
    return jt_undef_v();
}

jt_value jt_get_attr(jt_ctx *c, jt_value obj, const char *name, size_t len, bool maybe_method)
{
    if (obj.type == JT_UNDEFINED) jt_fail_undefined(c, JT_NO_POS, obj);
    jt_value v = python_attr(c, obj, name, maybe_method);
    if (v.type != JT_UNDEFINED || v.undef) return v;
    if (obj.type == JT_DICT) {
        const jt_value *hit = jt_dict_get(c, obj.dict, jt_str_v(name, len));
        if (hit) return *hit;
    }
    return jt_undef_member(c, obj, jt_str_v(name, len));
}

jt_value jt_get_item(jt_ctx *c, size_t pos, jt_value obj, jt_value key)
{
    if (obj.type == JT_UNDEFINED) jt_fail_undefined(c, pos, obj);
    if (obj.type == JT_DICT) {
        const jt_value *hit = jt_dict_get(c, obj.dict, key);
        if (hit) return *hit;
    } else if ((obj.type == JT_STR || (obj.type == JT_LIST && (obj.list->kind == JT_SEQ_LIST || obj.list->kind == JT_SEQ_TUPLE ||
                                                               obj.list->kind == JT_SEQ_RANGE))) &&
               (key.type == JT_INT || key.type == JT_BOOL)) {
        long long i = key.type == JT_INT ? key.i : key.b;
        long long n = obj.type == JT_STR ? (long long)jt_utf8_count(obj.s.p, obj.s.n) : (long long)obj.list->n;
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            if (obj.type != JT_STR) return obj.list->items[i];
            size_t at = 0;
            for (long long k = 0; k < i; k++) jt_utf8_next(obj.s.p, obj.s.n, &at);
            size_t end = at;
            jt_utf8_next(obj.s.p, obj.s.n, &end);
            jt_step(c, pos, at / 64);
            return jt_str_v(obj.s.p + at, end - at);
        }
    }
    if (key.type == JT_STR) {   /* jinja2 falls back to the attribute for a string key */
        char name[128];
        if (key.s.n < sizeof name && !memchr(key.s.p, 0, key.s.n)) {
            memcpy(name, key.s.p, key.s.n);
            name[key.s.n] = 0;
            jt_value v = python_attr(c, obj, name, jt_is_method_name(name));
            if (v.type != JT_UNDEFINED || v.undef) return v;
        }
    }
    return jt_undef_member(c, obj, key);
}

// ---- calls ----

static jt_value call_global(jt_render *r, int id, const jt_args *a)
{
    jt_ctx *c = &r->c;
    switch (id) {
    case FN_RAISE: {
        jt_check_args(c, "raise_exception()", a, 1, (const char *const[]){"message", NULL});
        const jt_value *m = jt_arg(a, 0, "message");
        if (!m) jt_fail(c, JT_NO_POS, "raise_exception() missing 1 required positional argument: 'message'");
        jt_value s = jt_to_str(c, *m);
        jt_fail(c, JT_NO_POS, "raised by the template: %.*s", (int)(s.s.n < 600 ? s.s.n : 600), s.s.p);
    }
    case FN_STRFTIME: {
        jt_check_args(c, "strftime_now()", a, 1, (const char *const[]){"format", NULL});
        jt_value f = jt_str_arg(c, "strftime_now", jt_arg(a, 0, "format"));
        if (memchr(f.s.p, 0, f.s.n) || f.s.n > 4096) jt_fail(c, JT_NO_POS, "strftime_now: a format with a NUL or over 4096 bytes");
        struct tm tm;
        if (r->date) {
            tm = *r->date;
        } else {
            time_t now = time(NULL);
            localtime_r(&now, &tm);
        }
        jt_buf fmt = {0};   /* datetime.strftime's own codes first: %f, and %z/%Z empty on a naive time */
        for (size_t i = 0; i < f.s.n; i++) {
            if (f.s.p[i] == '%' && i + 1 < f.s.n) {
                char k = f.s.p[++i];
                if (k == 'f') jt_buf_put(c, &fmt, "000000", 6);
                else if (k != 'z' && k != 'Z') jt_buf_putc(c, &fmt, '%'), jt_buf_putc(c, &fmt, k);
                continue;
            }
            jt_buf_putc(c, &fmt, f.s.p[i]);
        }
        jt_buf_putc(c, &fmt, 0);
        size_t cap = 256 + 64 * f.s.n;
        char *out = jt_alloc(c, cap);
        size_t n = strftime(out, cap, fmt.p, &tm);
        return jt_str_v(out, n);
    }
    case FN_NAMESPACE: case FN_DICT: {
        if (a->n_pos > 1) jt_fail(c, JT_NO_POS, "%s() expected at most 1 positional argument", id == FN_DICT ? "dict" : "namespace");
        jt_value d = jt_dict_v(c, id == FN_DICT ? JT_DICT : JT_NAMESPACE);
        if (a->n_pos && a->pos[0].type == JT_DICT) {
            for (size_t i = 0; i < a->pos[0].dict->n; i++) jt_dict_set(c, d.dict, a->pos[0].dict->keys[i], a->pos[0].dict->vals[i]);
        } else if (a->n_pos) {
            jt_list *pairs = jt_iterate(c, JT_NO_POS, a->pos[0]);
            for (size_t i = 0; i < pairs->n; i++) {
                jt_list *kv = jt_iterate(c, JT_NO_POS, pairs->items[i]);
                if (kv->n != 2)
                    jt_fail(c, JT_NO_POS, "dictionary update sequence element #%zu has length %zu; 2 is required", i, kv->n);
                jt_dict_set(c, d.dict, kv->items[0], kv->items[1]);
            }
        }
        for (size_t k = 0; k < a->n_kw; k++) jt_dict_set(c, d.dict, jt_cstr_v(a->kw_names[k]), a->kw[k]);
        return d;
    }
    case FN_RANGE: {
        jt_check_args(c, "range()", a, 3, NULL);
        if (!a->n_pos) jt_fail(c, JT_NO_POS, "range expected at least 1 argument, got 0");
        long long v[3] = {0, 0, 1};
        for (size_t i = 0; i < a->n_pos; i++) v[a->n_pos == 1 ? 1 : i] = int_arg(c, "range", &a->pos[i], 0);
        if (!v[2]) jt_fail(c, JT_NO_POS, "range() arg 3 must not be zero");
        long double span = v[2] > 0 ? (long double)v[1] - v[0] : (long double)v[0] - v[1];
        long double len = span > 0 ? (span - 1) / (v[2] > 0 ? v[2] : -(long double)v[2]) + 1 : 0;
        if (len > 100000)
            jt_fail(c, JT_NO_POS, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        jt_value out = jt_list_v(c, (size_t)len, JT_SEQ_RANGE);
        for (size_t i = 0; i < out.list->n; i++) out.list->items[i] = jt_int_v(v[0] + (long long)i * v[2]);
        memcpy(out.list->range, v, sizeof v);
        return out;
    }
    }
    jt_fail(c, JT_NO_POS, "internal error: function %d", id);
}

static jt_value call_method(jt_render *r, int id, jt_value self, const jt_args *a)
{
    jt_ctx *c = &r->c;
    switch (id) {
    case M_STRIP: case M_LSTRIP: case M_RSTRIP:
        jt_check_args(c, "strip()", a, 1, NULL);
        return jt_str_strip(c, self, jt_arg(a, 0, NULL), id != M_RSTRIP, id != M_LSTRIP);
    case M_SPLIT: case M_RSPLIT: {
        static const char *const names[] = {"sep", "maxsplit", NULL};
        jt_check_args(c, "split()", a, 2, names);
        return str_split(c, self, jt_arg(a, 0, "sep"), int_arg(c, "split", jt_arg(a, 1, "maxsplit"), -1), id == M_RSPLIT);
    }
    case M_STARTSWITH: case M_ENDSWITH:
        jt_check_args(c, "startswith()", a, 1, NULL);
        return jt_bool_v(str_affix(c, self, jt_arg(a, 0, NULL), id == M_STARTSWITH));
    case M_UPPER: case M_LOWER: case M_TITLE: case M_CAPITALIZE:
        jt_check_args(c, "upper()", a, 0, NULL);
        return jt_str_case(c, self, id == M_UPPER ? 'u' : id == M_LOWER ? 'l' : id == M_TITLE ? 't' : 'c');
    case M_REPLACE: {
        jt_check_args(c, "replace()", a, 3, NULL);
        jt_value old = jt_str_arg(c, "replace", jt_arg(a, 0, NULL)), rep = jt_str_arg(c, "replace", jt_arg(a, 1, NULL));
        return jt_str_replace(c, self, old, rep, int_arg(c, "replace", jt_arg(a, 2, NULL), -1));
    }
    case M_FIND: case M_COUNT: {
        jt_check_args(c, "find()", a, 1, NULL);
        jt_value sub = jt_str_arg(c, id == M_FIND ? "find" : "count", jt_arg(a, 0, NULL));
        jt_step(c, JT_NO_POS, self.s.n / 64);
        if (id == M_FIND) {
            const char *hit = sub.s.n ? memmem(self.s.p, self.s.n, sub.s.p, sub.s.n) : self.s.p;
            return jt_int_v(hit ? (long long)jt_utf8_count(self.s.p, (size_t)(hit - self.s.p)) : -1);
        }
        if (!sub.s.n) return jt_int_v((long long)jt_utf8_count(self.s.p, self.s.n) + 1);
        long long k = 0;
        for (const char *p = self.s.p, *e = self.s.p + self.s.n; (p = memmem(p, (size_t)(e - p), sub.s.p, sub.s.n)); p += sub.s.n) k++;
        return jt_int_v(k);
    }
    case M_JOIN:
        jt_check_args(c, "join()", a, 1, NULL);
        if (!a->n_pos) jt_fail(c, JT_NO_POS, "join() takes exactly one argument (0 given)");
        return jt_str_join(c, self, jt_iterate(c, JT_NO_POS, a->pos[0]));
    case M_ISSPACE: {
        jt_check_args(c, "isspace()", a, 0, NULL);
        bool all = self.s.n > 0;
        for (size_t i = 0; i < self.s.n && all;) all = jt_is_space(jt_utf8_next(self.s.p, self.s.n, &i));
        return jt_bool_v(all);
    }
    case M_ITEMS: case M_KEYS: case M_VALUES: {
        jt_check_args(c, "items()", a, 0, NULL);
        const jt_dict *d = self.dict;
        jt_value out = jt_list_v(c, d->n, id == M_ITEMS ? JT_SEQ_DICT_ITEMS : id == M_KEYS ? JT_SEQ_DICT_KEYS : JT_SEQ_DICT_VALUES);
        for (size_t i = 0; i < d->n; i++) {
            if (id == M_ITEMS) {
                jt_value kv = jt_list_v(c, 2, JT_SEQ_TUPLE);
                kv.list->items[0] = d->keys[i];
                kv.list->items[1] = d->vals[i];
                out.list->items[i] = kv;
            } else {
                out.list->items[i] = id == M_KEYS ? d->keys[i] : d->vals[i];
            }
        }
        return out;
    }
    case M_GET: {
        jt_check_args(c, "get()", a, 2, NULL);
        if (!a->n_pos) jt_fail(c, JT_NO_POS, "get expected at least 1 argument, got 0");
        const jt_value *hit = jt_dict_get(c, self.dict, a->pos[0]);
        return hit ? *hit : a->n_pos > 1 ? a->pos[1] : jt_none_v();
    }
    case M_LIST_COUNT: case M_LIST_INDEX: {
        jt_check_args(c, id == M_LIST_COUNT ? "count()" : "index()", a, 1, NULL);
        if (!a->n_pos) jt_fail(c, JT_NO_POS, "%s() takes exactly one argument (0 given)", id == M_LIST_COUNT ? "count" : "index");
        long long k = 0;
        jt_step(c, JT_NO_POS, self.list->n);
        for (size_t i = 0; i < self.list->n; i++) {
            if (!jt_equal(c, self.list->items[i], a->pos[0])) continue;
            if (id == M_LIST_INDEX) return jt_int_v((long long)i);
            k++;
        }
        if (id == M_LIST_INDEX) jt_fail(c, JT_NO_POS, "%s.index(x): x not in %s", jt_type_name(self), jt_type_name(self));
        return jt_int_v(k);
    }
    case M_CYCLE:
        if (!a->n_pos) jt_fail(c, JT_NO_POS, "no items for cycling given");
        jt_check_args(c, "loop.cycle()", a, a->n_pos, NULL);
        return a->pos[self.loop->index % a->n_pos];
    }
    jt_fail(c, JT_NO_POS, "internal error: method %d", id);
}

jt_value jt_call_func(jt_render *r, size_t at, jt_value fn, const jt_args *a)
{
    r->c.at = at;
    return fn.fn.self ? call_method(r, fn.fn.id, *fn.fn.self, a) : call_global(r, fn.fn.id, a);
}
