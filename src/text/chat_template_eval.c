/* chat_template_eval.c — the syntax tree evaluated as jinja2 evaluates it.
 *
 * Scopes: the globals (messages, add_generation_prompt, the special tokens,
 * tools, documents) and what the template's top level sets share the root;
 * each for-loop iteration and each macro call has its own scope, so a set
 * inside them is gone after (jinja2: a loop body's assignments do not survive
 * the iteration; 'if' makes no scope); only a namespace carries a value out.
 * A macro sees its defining scope at call time (jinja2 closures).
 * Arithmetic follows Python: // and % floor, / is true division, ** is
 * left-associative in Jinja, bool is an int; integers are 64-bit and an
 * overflow is an error. */
#include <math.h>
#include <string.h>

#include "chat_template_internal.h"

struct jt_scope {
    jt_scope *parent;
    const char **names;
    jt_value *vals;
    size_t n, cap;
};

jt_scope *jt_scope_new(jt_render *r, jt_scope *parent)
{
    jt_scope *s = jt_alloc(&r->c, sizeof *s);
    s->parent = parent;
    return s;
}

void jt_scope_set(jt_render *r, jt_scope *s, const char *name, jt_value v)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 4;
        const char **names = jt_alloc(&r->c, cap * sizeof *names);
        jt_value *vals = jt_alloc(&r->c, cap * sizeof *vals);
        if (s->n) memcpy(names, s->names, s->n * sizeof *names), memcpy(vals, s->vals, s->n * sizeof *vals);
        s->names = names;
        s->vals = vals;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

static const jt_value *scope_find(const jt_scope *s, const char *name)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (strcmp(s->names[i], name) == 0) return &s->vals[i];
    return NULL;
}

static jt_value eval(jt_render *r, jt_scope *s, const jt_node *x);

// ---- arithmetic ----

_Noreturn static void fail_operands(jt_render *r, const char *op, jt_value a, jt_value b)
{
    jt_fail(&r->c, JT_NO_POS, "unsupported operand type(s) for %s: '%s' and '%s'", op, jt_type_name(a), jt_type_name(b));
}

static long long as_int(jt_value v) { return v.type == JT_BOOL ? v.b : v.i; }
static bool is_int(jt_value v) { return v.type == JT_INT || v.type == JT_BOOL; }

/* CPython's float divmod: the floored quotient and the modulo with the divisor's sign. */
static void float_divmod(jt_render *r, double a, double b, double *div, double *mod)
{
    if (b == 0) jt_fail(&r->c, JT_NO_POS, "float division by zero");
    double m = fmod(a, b), d = (a - m) / b;
    if (m) {
        if ((b < 0) != (m < 0)) m += b, d -= 1.0;
    } else {
        m = copysign(0.0, b);
    }
    double f;
    if (d) {
        f = floor(d);
        if (d - f > 0.5) f += 1.0;
    } else {
        f = copysign(0.0, a / b);
    }
    *div = f;
    *mod = m;
}

/* s * n for a string or a list (Python repetition; n <= 0 gives an empty one). */
static jt_value repeat(jt_render *r, jt_value seq, long long n)
{
    size_t k = n > 0 ? (size_t)n : 0, unit = seq.type == JT_STR ? seq.s.n : seq.list->n * sizeof(jt_value), total;
    if (!ct_size_mul(unit, k, &total) || total > r->max_output)
        jt_fail(&r->c, JT_NO_POS, "repetition by %lld: the result would be larger than the %zu-byte output limit", n, r->max_output);
    jt_step(&r->c, JT_NO_POS, total / 64);
    if (unit == 0) k = 0; /* an empty sequence repeated is empty: no loop over a huge n */
    if (seq.type == JT_STR) {
        char *p = jt_alloc(&r->c, total + 1);
        for (size_t i = 0; i < k; i++) memcpy(p + i * unit, seq.s.p, unit);
        return jt_str_v(p, total);
    }
    jt_value out = jt_list_v(&r->c, seq.list->n * k, seq.list->kind == JT_SEQ_TUPLE ? JT_SEQ_TUPLE : JT_SEQ_LIST);
    if (unit == 0) return out; /* an empty list has no items array to offset into */
    for (size_t i = 0; i < k; i++) memcpy(out.list->items + i * seq.list->n, seq.list->items, unit);
    return out;
}

static jt_value concat_seq(jt_render *r, jt_value a, jt_value b)
{
    if (a.type == JT_STR) {
        size_t n = a.s.n + b.s.n;
        if (n > r->max_output) jt_fail(&r->c, JT_NO_POS, "a string larger than the %zu-byte output limit", r->max_output);
        char *p = jt_alloc(&r->c, n + 1);
        memcpy(p, a.s.p, a.s.n);
        memcpy(p + a.s.n, b.s.p, b.s.n);
        return jt_str_v(p, n);
    }
    jt_value out = jt_list_v(&r->c, a.list->n + b.list->n, a.list->kind);
    if (a.list->n) memcpy(out.list->items, a.list->items, a.list->n * sizeof(jt_value));
    if (b.list->n) memcpy(out.list->items + a.list->n, b.list->items, b.list->n * sizeof(jt_value));
    return out;
}

static bool plain_seq(jt_value v, jt_seq_kind kind)
{
    return v.type == JT_LIST && v.list->kind == kind;
}

static jt_value int_pow(jt_render *r, long long base, long long e)
{
    long long acc = 1;
    while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) goto overflow;
        e >>= 1;
        if (e && __builtin_mul_overflow(base, base, &base)) goto overflow;
    }
    return jt_int_v(acc);
overflow:
    jt_fail(&r->c, JT_NO_POS, "integer overflow in ** (integers are 64-bit here)");
}

static jt_value binop(jt_render *r, int op, jt_value a, jt_value b)
{
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (op == JT_OP_CONCAT) return concat_seq(r, jt_to_str(&r->c, a), jt_to_str(&r->c, b));
    if (a.type == JT_UNDEFINED) jt_fail_undefined(&r->c, JT_NO_POS, a);
    if (b.type == JT_UNDEFINED) jt_fail_undefined(&r->c, JT_NO_POS, b);
    if (jt_is_number(a) && jt_is_number(b)) {
        if (is_int(a) && is_int(b)) {
            long long x = as_int(a), y = as_int(b), z;
            switch (op) {
            case JT_OP_ADD: if (__builtin_add_overflow(x, y, &z)) break; return jt_int_v(z);
            case JT_OP_SUB: if (__builtin_sub_overflow(x, y, &z)) break; return jt_int_v(z);
            case JT_OP_MUL: if (__builtin_mul_overflow(x, y, &z)) break; return jt_int_v(z);
            case JT_OP_DIV:
                if (!y) jt_fail(&r->c, JT_NO_POS, "division by zero");
                return jt_float_v((double)x / (double)y);
            case JT_OP_FLOORDIV: case JT_OP_MOD: {
                if (!y) jt_fail(&r->c, JT_NO_POS, "integer %s by zero", op == JT_OP_MOD ? "modulo" : "division or modulo");
                if (x == (-9223372036854775807LL - 1) && y == -1) break;
                long long q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) q--, m += y;
                return jt_int_v(op == JT_OP_MOD ? m : q);
            }
            case JT_OP_POW:
                if (y >= 0) return int_pow(r, x, y);
                if (!x) jt_fail(&r->c, JT_NO_POS, "0.0 cannot be raised to a negative power");
                return jt_float_v(pow((double)x, (double)y));
            }
            jt_fail(&r->c, JT_NO_POS, "integer overflow in %s (integers are 64-bit here)", names[op]);
        }
        double x = jt_as_double(a), y = jt_as_double(b), d, m;
        switch (op) {
        case JT_OP_ADD: return jt_float_v(x + y);
        case JT_OP_SUB: return jt_float_v(x - y);
        case JT_OP_MUL: return jt_float_v(x * y);
        case JT_OP_DIV:
            if (y == 0) jt_fail(&r->c, JT_NO_POS, "float division by zero");
            return jt_float_v(x / y);
        case JT_OP_FLOORDIV: float_divmod(r, x, y, &d, &m); return jt_float_v(d);
        case JT_OP_MOD: float_divmod(r, x, y, &d, &m); return jt_float_v(m);
        case JT_OP_POW:
            if (x == 0 && y < 0) jt_fail(&r->c, JT_NO_POS, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y)) jt_fail(&r->c, JT_NO_POS, "a negative number to a fractional power (a complex number)");
            return jt_float_v(pow(x, y));
        }
    }
    if (op == JT_OP_ADD && a.type == JT_STR && b.type == JT_STR) return concat_seq(r, a, b);
    if (op == JT_OP_ADD && (plain_seq(a, JT_SEQ_LIST) || plain_seq(a, JT_SEQ_TUPLE)) && b.type == JT_LIST &&
        b.list->kind == a.list->kind)
        return concat_seq(r, a, b);
    if (op == JT_OP_MUL) {
        bool seq_a = a.type == JT_STR || plain_seq(a, JT_SEQ_LIST) || plain_seq(a, JT_SEQ_TUPLE);
        bool seq_b = b.type == JT_STR || plain_seq(b, JT_SEQ_LIST) || plain_seq(b, JT_SEQ_TUPLE);
        if (seq_a && is_int(b)) return repeat(r, a, as_int(b));
        if (seq_b && is_int(a)) return repeat(r, b, as_int(a));
    }
    if (op == JT_OP_MOD && a.type == JT_STR) jt_fail(&r->c, JT_NO_POS, "printf-style string formatting ('...' %% x) is not supported");
    if (op == JT_OP_ADD && a.type == JT_STR)
        jt_fail(&r->c, JT_NO_POS, "can only concatenate str (not \"%s\") to str", jt_type_name(b));
    fail_operands(r, names[op], a, b);
}

/* item in container, as Python's 'in'. A generator is consumed up to the match. */
bool jt_contains(jt_render *r, jt_value container, jt_value item)
{
    switch (container.type) {
    case JT_UNDEFINED: return false;
    case JT_STR:
        if (item.type != JT_STR)
            jt_fail(&r->c, JT_NO_POS, "'in <string>' requires string as left operand, not %s", jt_type_name(item));
        jt_step(&r->c, JT_NO_POS, container.s.n / 64);
        return item.s.n == 0 || memmem(container.s.p, container.s.n, item.s.p, item.s.n) != NULL;
    case JT_LIST:
        jt_step(&r->c, JT_NO_POS, container.list->n);
        for (size_t i = 0; i < container.list->n; i++)
            if (jt_equal(&r->c, container.list->items[i], item)) return true;
        return false;
    case JT_ITER:
        jt_iter_check(&r->c, JT_NO_POS, container);
        while (container.list->pos < container.list->n) {
            jt_step(&r->c, JT_NO_POS, 1);
            if (jt_equal(&r->c, container.list->items[container.list->pos++], item)) return true;
        }
        return false;
    case JT_DICT:
        if (!jt_hashable(item)) jt_fail(&r->c, JT_NO_POS, "unhashable type: '%s'", jt_type_name(item));
        return jt_dict_get(&r->c, container.dict, item) != NULL;
    default: jt_fail(&r->c, JT_NO_POS, "argument of type '%s' is not iterable", jt_type_name(container));
    }
}

static bool compare(jt_render *r, int op, jt_value a, jt_value b)
{
    switch (op) {
    case JT_OP_EQ: return jt_equal(&r->c, a, b);
    case JT_OP_NE: return !jt_equal(&r->c, a, b);
    case JT_OP_IN: return jt_contains(r, b, a);
    case JT_OP_NOTIN: return !jt_contains(r, b, a);
    default: break;
    }
    int k = jt_compare(&r->c, JT_NO_POS, a, b);
    return op == JT_OP_LT ? k < 0 : op == JT_OP_LTEQ ? k <= 0 : op == JT_OP_GT ? k > 0 : k >= 0;
}

// ---- subscripts ----

/* An optional slice bound: true with *out set, or false when it is not an integer. */
static bool slice_bound(jt_render *r, jt_scope *s, const jt_node *x, bool *given, long long *out)
{
    *given = false;
    if (!x) return true;
    jt_value v = eval(r, s, x);
    if (v.type == JT_NONE) return true;
    if (!is_int(v)) return false;
    *given = true;
    *out = as_int(v);
    return true;
}

static jt_value slice(jt_render *r, jt_scope *s, jt_value obj, const jt_node *x)
{
    bool has[3];
    long long v[3] = {0, 0, 1};
    bool ok = slice_bound(r, s, x->a, &has[0], &v[0]) & slice_bound(r, s, x->b, &has[1], &v[1]) &
              slice_bound(r, s, x->c, &has[2], &v[2]);
    r->c.at = x->pos;   /* jinja2 slices with Python's own [a:b:c]: what cannot be sliced is a TypeError */
    if (obj.type == JT_UNDEFINED) jt_fail_undefined(&r->c, x->pos, obj);
    if (obj.type == JT_DICT) jt_fail(&r->c, x->pos, "unhashable type: 'slice'");
    bool seq = obj.type == JT_STR || (obj.type == JT_LIST && (obj.list->kind == JT_SEQ_LIST || obj.list->kind == JT_SEQ_TUPLE ||
                                                              obj.list->kind == JT_SEQ_RANGE));
    if (!seq) jt_fail(&r->c, x->pos, "'%s' object is not subscriptable", jt_type_name(obj));
    if (!ok) jt_fail(&r->c, x->pos, "slice indices must be integers or None or have an __index__ method");
    long long step = has[2] ? v[2] : 1;
    if (step == 0) jt_fail(&r->c, x->pos, "slice step cannot be zero");
    if (step == -9223372036854775807LL - 1) step = -9223372036854775807LL;
    size_t *offs = NULL;   /* a string's character offsets (one more than its length) */
    long long len;
    if (obj.type == JT_STR) {
        len = (long long)jt_utf8_count(obj.s.p, obj.s.n);
        offs = jt_alloc(&r->c, ((size_t)len + 1) * sizeof *offs);
        size_t k = 0;
        for (size_t i = 0; i < obj.s.n; k++) offs[k] = i, jt_utf8_next(obj.s.p, obj.s.n, &i);
        offs[k] = obj.s.n;
        jt_step(&r->c, x->pos, obj.s.n / 64);
    } else {
        len = (long long)obj.list->n;
    }
    long long lower = step < 0 ? -1 : 0, upper = step < 0 ? len - 1 : len, b[2];
    for (int k = 0; k < 2; k++) {   /* PySlice_AdjustIndices */
        if (!has[k]) { b[k] = (k == 0) == (step < 0) ? upper : lower; continue; }
        b[k] = v[k];
        if (b[k] < 0) { b[k] += len; if (b[k] < lower) b[k] = lower; }
        else if (b[k] > upper) b[k] = upper;
    }
    size_t n = 0;
    if (step > 0 ? b[0] < b[1] : b[0] > b[1])
        n = (size_t)((step > 0 ? (b[1] - b[0] - 1) / step : (b[0] - b[1] - 1) / -step) + 1);
    jt_step(&r->c, x->pos, n);
    if (obj.type == JT_STR) {
        jt_buf out = {0};
        for (size_t i = 0; i < n; i++) {
            long long at = b[0] + (long long)i * step;
            jt_buf_put(&r->c, &out, obj.s.p + offs[at], offs[at + 1] - offs[at]);
        }
        return jt_str_v(out.p ? out.p : "", out.n);
    }
    jt_value out = jt_list_v(&r->c, n, obj.list->kind);
    for (size_t i = 0; i < n; i++) out.list->items[i] = obj.list->items[b[0] + (long long)i * step];
    if (obj.list->kind == JT_SEQ_RANGE) {   /* a slice of a range is a range (it prints as one) */
        const long long *rg = obj.list->range;
        out.list->range[0] = rg[0] + b[0] * rg[2];
        out.list->range[1] = rg[0] + b[1] * rg[2];
        out.list->range[2] = rg[2] * step;
    }
    return out;
}

// ---- calls ----

typedef struct arg_vals {
    jt_value pos[16];
    jt_value kw[16];
    jt_args a;
} arg_vals;

/* Evaluates a call's arguments (kids, kw) into av. */
static void eval_args(jt_render *r, jt_scope *s, const jt_node *x, arg_vals *av)
{
    if (x->n_kids > 16 || x->n_kw > 16) jt_fail(&r->c, x->pos, "more than 16 arguments in a call");
    for (size_t i = 0; i < x->n_kids; i++) av->pos[i] = eval(r, s, x->kids[i]);
    for (size_t i = 0; i < x->n_kw; i++) av->kw[i] = eval(r, s, x->kw_vals[i]);
    av->a = (jt_args){av->pos, x->n_kids, x->kw_names, av->kw, x->n_kw};
}

jt_value jt_call_macro(jt_render *r, size_t at, const jt_macro *m, const jt_args *a)
{
    const jt_node *def = m->def;
    jt_enter(&r->c, at);
    bool varargs = def->op & JT_MACRO_VARARGS, kwargs = def->op & JT_MACRO_KWARGS;
    if (a->n_pos > def->n_kw && !varargs)
        jt_fail(&r->c, at, "macro '%s' takes not more than %zu argument(s)", def->name, def->n_kw);
    jt_scope *s = jt_scope_new(r, m->closure);
    size_t n_bound = a->n_pos < def->n_kw ? a->n_pos : def->n_kw;
    bool *bound = jt_alloc(&r->c, def->n_kw + 1);
    for (size_t i = 0; i < n_bound; i++) jt_scope_set(r, s, def->kw_names[i], a->pos[i]), bound[i] = true;
    if (varargs) {   /* jinja2 gives a macro that reads varargs the extra positional arguments */
        jt_value extra = jt_list_v(&r->c, a->n_pos - n_bound, JT_SEQ_TUPLE);
        for (size_t i = n_bound; i < a->n_pos; i++) extra.list->items[i - n_bound] = a->pos[i];
        jt_scope_set(r, s, "varargs", extra);
    }
    jt_value extra_kw = jt_dict_v(&r->c, JT_DICT);
    if (kwargs) jt_scope_set(r, s, "kwargs", extra_kw);
    for (size_t k = 0; k < a->n_kw; k++) {
        size_t i = 0;
        while (i < def->n_kw && strcmp(def->kw_names[i], a->kw_names[k]) != 0) i++;
        if (i == def->n_kw && kwargs) {
            jt_dict_set(&r->c, extra_kw.dict, jt_cstr_v(a->kw_names[k]), a->kw[k]);
            continue;
        }
        if (i == def->n_kw) jt_fail(&r->c, at, "macro '%s' has no argument '%s'", def->name, a->kw_names[k]);
        if (bound[i]) jt_fail(&r->c, at, "macro '%s' got multiple values for argument '%s'", def->name, a->kw_names[k]);
        jt_scope_set(r, s, def->kw_names[i], a->kw[k]);
        bound[i] = true;
    }
    for (size_t i = 0; i < def->n_kw; i++)
        if (!bound[i]) {
            char hint[128];
            snprintf(hint, sizeof hint, "parameter '%s' was not provided", def->kw_names[i]);
            jt_value v = def->kw_vals[i] ? eval(r, s, def->kw_vals[i]) : jt_undef_hint(&r->c, jt_strndup(&r->c, hint, strlen(hint)));
            jt_scope_set(r, s, def->kw_names[i], v);
        }
    jt_buf *outer = r->out, body = {.max = r->max_output};
    r->out = &body;
    jt_render_body(r, s, &def->body);
    r->out = outer;
    jt_leave(&r->c);
    return jt_str_v(body.p ? body.p : "", body.n);
}

static jt_value call(jt_render *r, jt_scope *s, const jt_node *x)
{
    jt_value fn = eval(r, s, x->a);
    arg_vals av;
    eval_args(r, s, x, &av);
    r->c.at = x->pos;
    switch (fn.type) {
    case JT_MACRO: return jt_call_macro(r, x->pos, fn.macro, &av.a);
    case JT_FUNC: return jt_call_func(r, x->pos, fn, &av.a);
    case JT_UNDEFINED: jt_fail_undefined(&r->c, x->pos, fn);
    default: jt_fail(&r->c, x->pos, "'%s' object is not callable", jt_type_name(fn));
    }
}

/* A filter chain; base stands for the innermost operand when it is absent
 * (a {% set x | filter %} block). */
static jt_value filter(jt_render *r, jt_scope *s, const jt_node *x, const jt_value *base)
{
    jt_value v = x->a ? (x->a->kind == JT_N_FILTER && base ? filter(r, s, x->a, base) : eval(r, s, x->a)) : *base;
    arg_vals av;
    eval_args(r, s, x, &av);
    r->c.at = x->pos;
    return jt_apply_filter(r, x->pos, x->op, v, &av.a);
}

static jt_value lookup(jt_render *r, jt_scope *s, const jt_node *x)
{
    const jt_value *v = scope_find(s, x->name);
    if (v) return *v;
    jt_value fn = jt_global_func(x->name);
    return fn.type == JT_FUNC ? fn : jt_undef_named(&r->c, x->name);
}

static jt_value eval(jt_render *r, jt_scope *s, const jt_node *x)
{
    jt_ctx *c = &r->c;
    jt_step(c, x->pos, 1);
    jt_enter(c, x->pos);
    jt_value v;
    switch (x->kind) {
    case JT_N_CONST: v = x->value; break;
    case JT_N_NAME: v = lookup(r, s, x); break;
    case JT_N_LIST: case JT_N_TUPLE:
        v = jt_list_v(c, x->n_kids, x->kind == JT_N_TUPLE ? JT_SEQ_TUPLE : JT_SEQ_LIST);
        for (size_t i = 0; i < x->n_kids; i++) v.list->items[i] = eval(r, s, x->kids[i]);
        break;
    case JT_N_DICT:
        v = jt_dict_v(c, JT_DICT);
        for (size_t i = 0; i < x->n_kids; i++) {
            jt_value k = eval(r, s, x->kids[i]), val = eval(r, s, x->kids2[i]);
            c->at = x->kids[i]->pos;
            jt_dict_set(c, v.dict, k, val);
        }
        break;
    case JT_N_ATTR: {
        jt_value obj = eval(r, s, x->a);
        c->at = x->pos;
        v = jt_get_attr(c, obj, x->name, x->len, x->op);
        break;
    }
    case JT_N_ITEM: {
        jt_value obj = eval(r, s, x->a);
        if (x->b->kind == JT_N_SLICE) {
            v = slice(r, s, obj, x->b);
        } else {
            jt_value key = eval(r, s, x->b);
            c->at = x->pos;
            v = jt_get_item(c, x->pos, obj, key);
        }
        break;
    }
    case JT_N_CALL: v = call(r, s, x); break;
    case JT_N_FILTER: v = filter(r, s, x, NULL); break;
    case JT_N_TEST: {
        jt_value operand = eval(r, s, x->a);
        arg_vals av;
        eval_args(r, s, x, &av);
        c->at = x->pos;
        v = jt_bool_v(jt_apply_test(r, x->pos, x->op, operand, &av.a));
        break;
    }
    case JT_N_NEG: case JT_N_POS: {
        jt_value a = eval(r, s, x->a);
        c->at = x->pos;
        if (a.type == JT_UNDEFINED) jt_fail_undefined(c, x->pos, a);
        if (!jt_is_number(a))
            jt_fail(c, x->pos, "bad operand type for unary %c: '%s'", x->kind == JT_N_NEG ? '-' : '+', jt_type_name(a));
        if (x->kind == JT_N_POS) v = a.type == JT_BOOL ? jt_int_v(a.b) : a;
        else if (a.type == JT_FLOAT) v = jt_float_v(-a.f);
        else if (as_int(a) == -9223372036854775807LL - 1) jt_fail(c, x->pos, "integer overflow in unary - (integers are 64-bit here)");
        else v = jt_int_v(-as_int(a));
        break;
    }
    case JT_N_NOT: v = jt_bool_v(!jt_truthy(eval(r, s, x->a))); break;
    case JT_N_AND: v = eval(r, s, x->a); if (jt_truthy(v)) v = eval(r, s, x->b); break;
    case JT_N_OR: v = eval(r, s, x->a); if (!jt_truthy(v)) v = eval(r, s, x->b); break;
    case JT_N_BINOP: {
        jt_value a = eval(r, s, x->a), b = eval(r, s, x->b);
        c->at = x->pos;
        v = binop(r, x->op, a, b);
        break;
    }
    case JT_N_COMPARE: {
        jt_value left = eval(r, s, x->a);
        v = jt_bool_v(true);
        for (size_t i = 0; i < x->n_kids; i++) {
            jt_value right = eval(r, s, x->kids[i]);
            c->at = x->kids[i]->pos;
            if (!compare(r, x->ops[i], left, right)) { v = jt_bool_v(false); break; }
            left = right;
        }
        break;
    }
    case JT_N_COND:
        if (jt_truthy(eval(r, s, x->a))) v = eval(r, s, x->b);
        else if (x->c) v = eval(r, s, x->c);
        else v = jt_undef_hint(c, "the inline if expression evaluated to false and no else section was defined.");
        break;
    default: jt_fail(c, x->pos, "internal error: node %d is not an expression", (int)x->kind);
    }
    jt_leave(c);
    return v;
}

// ---- statements ----

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

/* Binds v to a target: a name, or a tuple of names (v unpacked). */
static void assign(jt_render *r, jt_scope *s, const jt_node *target, jt_value v)
{
    if (target->kind == JT_N_NAME) {
        jt_scope_set(r, s, target->name, v);
        return;
    }
    if (target->kind == JT_N_NSREF) {
        const jt_value *ns = scope_find(s, target->name);
        if (!ns || ns->type != JT_NAMESPACE)
            jt_fail(&r->c, target->pos, "cannot assign attribute on non-namespace object ('%s')", target->name);
        jt_dict_set(&r->c, ns->dict, target->value, v);
        return;
    }
    jt_list *items = jt_iterate(&r->c, target->pos, v);
    if (items->n != target->n_kids)
        jt_fail(&r->c, target->pos, "%s values to unpack (expected %zu, got %zu)",
                items->n > target->n_kids ? "too many" : "not enough", target->n_kids, items->n);
    for (size_t i = 0; i < items->n; i++) assign(r, s, target->kids[i], items->items[i]);
}

static int render_for(jt_render *r, jt_scope *s, const jt_node *x)
{
    jt_list *items = jt_iterate(&r->c, x->b->pos, eval(r, s, x->b));
    jt_scope *it = jt_scope_new(r, s);
    if (x->c) {   /* the loop filter sees the target, not 'loop'; loop.length counts what passes */
        jt_list *kept = jt_list_v(&r->c, items->n, JT_SEQ_LIST).list;
        size_t n = 0;
        for (size_t i = 0; i < items->n; i++) {
            it->n = 0;
            assign(r, it, x->a, items->items[i]);
            if (jt_truthy(eval(r, it, x->c))) kept->items[n++] = items->items[i];
        }
        kept->n = n;
        items = kept;
    }
    if (!items->n) return jt_render_body(r, s, &x->orelse);
    jt_loop *loop = jt_alloc(&r->c, sizeof *loop);
    loop->items = items;
    loop->depth = 1;   /* jinja2 counts depth in recursive loops only; a nested loop is at 1 too */
    jt_value lv = {.type = JT_LOOP, .loop = loop};
    for (size_t i = 0; i < items->n; i++) {
        jt_step(&r->c, x->pos, 1);
        loop->index = i;
        it->n = 0;   /* a fresh scope each iteration: what the last one set is gone */
        assign(r, it, x->a, items->items[i]);
        jt_scope_set(r, it, "loop", lv);
        if (jt_render_body(r, it, &x->body) == FLOW_BREAK) break;
    }
    return FLOW_NEXT;
}

/* transformers' AssistantTracker: the body renders as a call block's caller
 * (into a buffer of its own, then written out), and the span recorded starts at
 * the length of the top-level output so far, which is where the block's text
 * lands only when the block is not inside a macro, a {% set %} block or another
 * generation block: jinja2 buffers those, so their text reaches the top level
 * after the span was taken. That offset, however wrong, is what
 * apply_chat_template's assistant mask uses, so it is reproduced; an inner
 * block's span is recorded before the outer one's. The end is the start plus
 * the body's length in characters, counted over the rendering (which is where
 * a misplaced span's bytes differ from the body's): chat_template.c converts
 * it once the rendering is complete. */
static int render_generation(jt_render *r, jt_scope *s, const jt_node *x)
{
    jt_ctx *c = &r->c;
    size_t start = r->top->n;
    jt_buf *outer = r->out, body = {.max = r->max_output};
    r->out = &body;
    int flow = jt_render_body(r, jt_scope_new(r, s), &x->body);
    r->out = outer;
    if (body.n) jt_buf_put(c, r->out, body.p, body.n);
    if (r->track) {
        if (r->n_spans == r->spans_cap) {
            size_t cap = r->spans_cap ? 2 * r->spans_cap : 16;
            ct_chat_span *grown = jt_alloc(c, cap * sizeof *grown);
            if (r->n_spans) memcpy(grown, r->spans, r->n_spans * sizeof *grown);
            r->spans = grown;
            r->spans_cap = cap;
        }
        r->spans[r->n_spans].start = start;
        r->spans[r->n_spans].end = jt_utf8_count(body.p, body.n);   /* characters: bytes once the text is whole */
        r->n_spans++;
    }
    return flow;
}

static int render_node(jt_render *r, jt_scope *s, const jt_node *x)
{
    jt_ctx *c = &r->c;
    c->at = x->pos;
    switch (x->kind) {
    case JT_N_TEXT: jt_buf_put(c, r->out, x->name, x->len); return FLOW_NEXT;
    case JT_N_OUTPUT: {
        jt_value v = eval(r, s, x->a);
        c->at = x->pos;
        jt_str_of(c, r->out, v);
        return FLOW_NEXT;
    }
    case JT_N_IF: return jt_render_body(r, s, jt_truthy(eval(r, s, x->a)) ? &x->body : &x->orelse);
    case JT_N_FOR: return render_for(r, s, x);
    case JT_N_SET: {
        jt_value v = eval(r, s, x->b);
        assign(r, s, x->a, v);
        return FLOW_NEXT;
    }
    case JT_N_SET_BLOCK: {
        jt_buf *outer = r->out, body = {.max = r->max_output};
        r->out = &body;
        jt_render_body(r, jt_scope_new(r, s), &x->body);
        r->out = outer;
        jt_value v = jt_str_v(body.p ? body.p : "", body.n);
        if (x->c) v = filter(r, s, x->c, &v);
        assign(r, s, x->a, v);
        return FLOW_NEXT;
    }
    case JT_N_MACRO: {
        jt_macro *m = jt_alloc(c, sizeof *m);
        m->def = x;
        m->closure = s;
        jt_value v = {.type = JT_MACRO, .macro = m};
        jt_scope_set(r, s, x->name, v);
        return FLOW_NEXT;
    }
    case JT_N_BREAK: return FLOW_BREAK;
    case JT_N_CONTINUE: return FLOW_CONTINUE;
    case JT_N_GENERATION: return render_generation(r, s, x);
    default: jt_fail(c, x->pos, "internal error: node %d is not a statement", (int)x->kind);
    }
}

int jt_render_body(jt_render *r, jt_scope *s, const jt_body *body)
{
    jt_enter(&r->c, JT_NO_POS);
    int flow = FLOW_NEXT;
    for (size_t i = 0; i < body->n && flow == FLOW_NEXT; i++) flow = render_node(r, s, body->items[i]);
    jt_leave(&r->c);
    return flow;
}

jt_value jt_loop_attr(jt_ctx *c, const jt_loop *l, const char *name)
{
    size_t n = l->items->n, i = l->index;
    if (!strcmp(name, "index")) return jt_int_v((long long)i + 1);
    if (!strcmp(name, "index0")) return jt_int_v((long long)i);
    if (!strcmp(name, "revindex")) return jt_int_v((long long)(n - i));
    if (!strcmp(name, "revindex0")) return jt_int_v((long long)(n - i - 1));
    if (!strcmp(name, "first")) return jt_bool_v(i == 0);
    if (!strcmp(name, "last")) return jt_bool_v(i + 1 == n);
    if (!strcmp(name, "length")) return jt_int_v((long long)n);
    if (!strcmp(name, "depth")) return jt_int_v(l->depth);
    if (!strcmp(name, "depth0")) return jt_int_v(l->depth - 1);
    if (!strcmp(name, "previtem")) return i ? l->items->items[i - 1] : jt_undef_hint(c, "there is no previous item");
    if (!strcmp(name, "nextitem")) return i + 1 < n ? l->items->items[i + 1] : jt_undef_hint(c, "there is no next item");
    jt_value owner = {.type = JT_LOOP};
    return jt_undef_member(c, owner, jt_cstr_v(name));
}
