/* chat_template_parse.c — tokens -> syntax tree, by jinja2's grammar
 * (jinja2/parser.py), lowest precedence first:
 *   expression  or ['if' or ['else' expression]]
 *   or / and    and ('or' and)* / not ('and' not)*
 *   not         'not' not | compare
 *   compare     math1 (('=='|'!='|'<'|'<='|'>'|'>='|'in'|'not' 'in') math1)*
 *   math1       concat (('+'|'-') concat)*
 *   concat      math2 ('~' math2)*
 *   math2       pow (('*'|'/'|'//'|'%') pow)*
 *   pow         unary ('**' unary)*           (left-associative, as jinja2)
 *   unary       ('-'|'+') unary-without-filters | primary postfix; then
 *               ('|' filter | 'is' test | call)*
 *   postfix     ('.' name | '.' int | '[' subscript ']' | '(' args ')')*
 * Nodes (see jt_node): IF a=test, body, orelse (an elif is an IF alone in
 * orelse); FOR a=target b=iter c=filter, body, orelse; SET a=target b=value;
 * SET_BLOCK a=target c=filters, body; MACRO name, kw_names=params,
 * kw_vals=defaults, body; ITEM a=object b=key (SLICE a:b:c); CALL/FILTER/TEST
 * a=callee/operand, kids=args, kw; COND a=test b=then c=else; COMPARE a=first,
 * kids=operands with ops; NSREF name=namespace, value=attribute.
 * Filters and tests are resolved here: an unknown one is a load-time error, as
 * in jinja2. */
#include <string.h>

#include "chat_template_internal.h"

typedef struct jt_parser {
    jt_ctx *c;
    const jt_token *t;
    size_t n, i;
    int loops;                /* for loops around the current statement (break/continue) */
    int macro_refs;           /* JT_MACRO_*: what the macro being parsed reads */
} jt_parser;

typedef struct jt_vec { jt_node **p; size_t n, cap; } jt_vec;

static void vec_push(jt_parser *P, jt_vec *v, jt_node *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 4;
        jt_node **p = jt_alloc(P->c, cap * sizeof *p);
        if (v->n) memcpy(p, v->p, v->n * sizeof *p);
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
}

static const jt_token *cur(const jt_parser *P) { return &P->t[P->i]; }
static const jt_token *look(const jt_parser *P) { return &P->t[P->i + 1 < P->n ? P->i + 1 : P->i]; }
static const jt_token *next(jt_parser *P)
{
    const jt_token *t = cur(P);
    if (P->i + 1 < P->n) P->i++;
    return t;
}

static bool tok_is(const jt_token *t, jt_tok_kind kind, const char *s)
{
    return t->kind == kind && (!s || (t->n == strlen(s) && memcmp(t->s, s, t->n) == 0));
}
static bool is_op(const jt_parser *P, const char *op) { return tok_is(cur(P), JT_TOK_OP, op); }
static bool is_name(const jt_parser *P, const char *name) { return tok_is(cur(P), JT_TOK_NAME, name); }
static bool skip_op(jt_parser *P, const char *op) { return is_op(P, op) ? (next(P), true) : false; }
static bool skip_name(jt_parser *P, const char *name) { return is_name(P, name) ? (next(P), true) : false; }

/* What a token is, for errors: "'x'", "end of statement block" ... */
static const char *describe(const jt_parser *P, const jt_token *t, char *buf, size_t n)
{
    switch (t->kind) {
    case JT_TOK_EOF: return "end of template";
    case JT_TOK_BLOCK_END: return "end of statement block";
    case JT_TOK_VAR_END: return "end of print statement";
    case JT_TOK_BLOCK_BEGIN: return "begin of statement block";
    case JT_TOK_VAR_BEGIN: return "begin of print statement";
    case JT_TOK_DATA: return "template data";
    case JT_TOK_STRING: return "a string";
    default: snprintf(buf, n, "'%.*s'", (int)(t->n < 40 ? t->n : 40), t->s); return buf;
    }
}

_Noreturn static void fail_expected(jt_parser *P, const char *what)
{
    char buf[64];
    jt_fail(P->c, cur(P)->pos, "expected %s, got %s", what, describe(P, cur(P), buf, sizeof buf));
}

static void expect_op(jt_parser *P, const char *op)
{
    if (!skip_op(P, op)) {
        char want[8];
        snprintf(want, sizeof want, "'%s'", op);
        fail_expected(P, want);
    }
}

static void expect_kind(jt_parser *P, jt_tok_kind kind, const char *what)
{
    if (cur(P)->kind != kind) fail_expected(P, what);
    next(P);
}

static const char *expect_ident(jt_parser *P)
{
    if (cur(P)->kind != JT_TOK_NAME) fail_expected(P, "a name");
    const jt_token *t = next(P);
    return jt_strndup(P->c, t->s, t->n);
}

static jt_node *new_node(jt_parser *P, jt_node_kind kind, size_t pos)
{
    jt_node *x = jt_alloc(P->c, sizeof *x);
    x->kind = kind;
    x->pos = pos;
    return x;
}

static jt_node *new_op(jt_parser *P, jt_node_kind kind, size_t pos, jt_node *a, jt_node *b)
{
    jt_node *x = new_node(P, kind, pos);
    x->a = a;
    x->b = b;
    return x;
}

static jt_node *parse_expression(jt_parser *P, bool with_cond);
static jt_node *parse_unary(jt_parser *P, bool with_filter);
static jt_node *parse_primary(jt_parser *P);
static jt_node *parse_postfix(jt_parser *P, jt_node *x);
static jt_body subparse(jt_parser *P, const char *const *end, size_t opened, const char *tag);

/* Comma-separated expressions: one alone is itself, else a tuple (jinja2's parse_tuple). */
static jt_node *parse_tuple(jt_parser *P, bool with_cond, bool parens)
{
    size_t pos = cur(P)->pos;
    jt_vec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n) expect_op(P, ",");
        jt_tok_kind k = cur(P)->kind;
        if (k == JT_TOK_VAR_END || k == JT_TOK_BLOCK_END || is_op(P, ")")) break;
        vec_push(P, &items, parse_expression(P, with_cond));
        if (is_op(P, ",")) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.p[0];
        if (!parens) fail_expected(P, "an expression");
    }
    jt_node *x = new_node(P, JT_N_TUPLE, pos);
    x->kids = items.p;
    x->n_kids = items.n;
    return x;
}

/* '(' args ')': positional then keyword arguments. */
static void parse_call_args(jt_parser *P, jt_node *x)
{
    jt_vec args = {0}, kw = {0};
    jt_vec names = {0};   /* the keyword names, as nodes of kind NAME */
    expect_op(P, "(");
    while (!is_op(P, ")")) {
        if (args.n || kw.n) {
            expect_op(P, ",");
            if (is_op(P, ")")) break;
        }
        if (is_op(P, "*") || is_op(P, "**"))
            jt_fail(P->c, cur(P)->pos, "*args and **kwargs in a call are not supported");
        if (cur(P)->kind == JT_TOK_NAME && tok_is(look(P), JT_TOK_OP, "=")) {
            jt_node *name = new_node(P, JT_N_NAME, cur(P)->pos);
            name->name = expect_ident(P);
            next(P);
            vec_push(P, &names, name);
            vec_push(P, &kw, parse_expression(P, true));
        } else {
            if (kw.n) jt_fail(P->c, cur(P)->pos, "invalid syntax for function call expression (a positional argument after a keyword)");
            vec_push(P, &args, parse_expression(P, true));
        }
    }
    expect_op(P, ")");
    x->kids = args.p;
    x->n_kids = args.n;
    x->n_kw = kw.n;
    x->kw_vals = kw.p;
    x->kw_names = jt_alloc(P->c, (kw.n + 1) * sizeof *x->kw_names);
    for (size_t i = 0; i < kw.n; i++) x->kw_names[i] = names.p[i]->name;
}

/* A filter or test name (dotted names joined, as jinja2 does). */
static const char *parse_dotted(jt_parser *P)
{
    const char *name = expect_ident(P);
    while (is_op(P, ".")) {
        next(P);
        const char *more = expect_ident(P);
        size_t a = strlen(name), b = strlen(more);
        char *joined = jt_alloc(P->c, a + b + 2);
        memcpy(joined, name, a);
        joined[a] = '.';
        memcpy(joined + a + 1, more, b);
        name = joined;
    }
    return name;
}

static jt_node *parse_filter(jt_parser *P, jt_node *operand)
{
    while (is_op(P, "|")) {
        next(P);
        size_t pos = cur(P)->pos;
        jt_node *x = new_node(P, JT_N_FILTER, pos);
        x->name = parse_dotted(P);
        x->op = jt_filter_id(x->name);
        if (x->op < 0) jt_fail(P->c, pos, "filter '%s' is not supported", x->name);
        x->a = operand;
        if (is_op(P, "(")) parse_call_args(P, x);
        operand = x;
    }
    return operand;
}

static jt_node *parse_test(jt_parser *P, jt_node *operand)
{
    size_t pos = next(P)->pos;   /* 'is' */
    bool negated = skip_name(P, "not");
    size_t name_pos = cur(P)->pos;
    jt_node *x = new_node(P, JT_N_TEST, pos);
    x->name = parse_dotted(P);
    x->op = jt_test_id(x->name);
    if (x->op < 0) jt_fail(P->c, name_pos, "test '%s' is not supported", x->name);
    x->a = operand;
    const jt_token *t = cur(P);
    if (is_op(P, "(")) {
        parse_call_args(P, x);
    } else if ((t->kind == JT_TOK_NAME || t->kind == JT_TOK_STRING || t->kind == JT_TOK_INT || t->kind == JT_TOK_FLOAT ||
                is_op(P, "[") || is_op(P, "{")) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        if (is_name(P, "is")) jt_fail(P->c, t->pos, "you cannot chain multiple tests with 'is'");
        x->kids = jt_alloc(P->c, sizeof *x->kids);
        x->kids[0] = parse_postfix(P, parse_primary(P));
        x->n_kids = 1;
    }
    x->kw_names = x->kw_names ? x->kw_names : jt_alloc(P->c, sizeof *x->kw_names);
    return negated ? new_op(P, JT_N_NOT, pos, x, NULL) : x;
}

/* One entry of [...]: an expression or a slice a:b:c (parts optional). */
static jt_node *parse_subscribed(jt_parser *P)
{
    size_t pos = cur(P)->pos;
    jt_node *part[3] = {NULL, NULL, NULL};
    if (!is_op(P, ":")) {
        part[0] = parse_expression(P, true);
        if (!is_op(P, ":")) return part[0];
    }
    next(P);
    if (!is_op(P, ":") && !is_op(P, "]") && !is_op(P, ",")) part[1] = parse_expression(P, true);
    if (skip_op(P, ":") && !is_op(P, "]") && !is_op(P, ",")) part[2] = parse_expression(P, true);
    jt_node *x = new_node(P, JT_N_SLICE, pos);
    x->a = part[0];
    x->b = part[1];
    x->c = part[2];
    return x;
}

static jt_node *parse_postfix(jt_parser *P, jt_node *x)
{
    for (;;) {
        size_t pos = cur(P)->pos;
        if (skip_op(P, ".")) {
            const jt_token *t = cur(P);
            if (t->kind == JT_TOK_NAME) {
                jt_node *a = new_node(P, JT_N_ATTR, pos);
                a->a = x;
                a->name = expect_ident(P);
                a->op = jt_is_method_name(a->name);
                a->len = strlen(a->name);
                x = a;
            } else if (t->kind == JT_TOK_INT) {
                jt_node *k = new_node(P, JT_N_CONST, t->pos);
                k->value = jt_int_v(next(P)->i);
                x = new_op(P, JT_N_ITEM, pos, x, k);
            } else {
                fail_expected(P, "a name or number after '.'");
            }
        } else if (skip_op(P, "[")) {
            jt_vec keys = {0};
            while (!is_op(P, "]")) {
                if (keys.n) expect_op(P, ",");
                vec_push(P, &keys, parse_subscribed(P));
            }
            expect_op(P, "]");
            if (!keys.n) jt_fail(P->c, pos, "expected a subscript expression");
            jt_node *key = keys.p[0];
            if (keys.n > 1) {
                key = new_node(P, JT_N_TUPLE, pos);
                key->kids = keys.p;
                key->n_kids = keys.n;
            }
            x = new_op(P, JT_N_ITEM, pos, x, key);
        } else if (is_op(P, "(")) {
            jt_node *call = new_op(P, JT_N_CALL, x->pos, x, NULL);   /* errors point at what is called */
            parse_call_args(P, call);
            x = call;
        } else {
            return x;
        }
    }
}

static jt_node *parse_primary(jt_parser *P)
{
    const jt_token *t = cur(P);
    jt_node *x;
    switch (t->kind) {
    case JT_TOK_NAME:
        x = new_node(P, JT_N_CONST, t->pos);
        if (tok_is(t, JT_TOK_NAME, "true") || tok_is(t, JT_TOK_NAME, "True")) x->value = jt_bool_v(true);
        else if (tok_is(t, JT_TOK_NAME, "false") || tok_is(t, JT_TOK_NAME, "False")) x->value = jt_bool_v(false);
        else if (tok_is(t, JT_TOK_NAME, "none") || tok_is(t, JT_TOK_NAME, "None")) x->value = jt_none_v();
        else x->kind = JT_N_NAME, x->name = jt_strndup(P->c, t->s, t->n);
        if (x->kind == JT_N_NAME && !strcmp(x->name, "varargs")) P->macro_refs |= JT_MACRO_VARARGS;
        if (x->kind == JT_N_NAME && !strcmp(x->name, "kwargs")) P->macro_refs |= JT_MACRO_KWARGS;
        next(P);
        return x;
    case JT_TOK_STRING: {
        jt_buf b = {0};   /* adjacent strings are one: 'a' "b" is 'ab' */
        while (cur(P)->kind == JT_TOK_STRING) {
            jt_buf_put(P->c, &b, cur(P)->s, cur(P)->n);
            next(P);
        }
        x = new_node(P, JT_N_CONST, t->pos);
        x->value = jt_str_v(b.p ? b.p : "", b.n);
        return x;
    }
    case JT_TOK_INT: case JT_TOK_FLOAT:
        x = new_node(P, JT_N_CONST, t->pos);
        x->value = t->kind == JT_TOK_INT ? jt_int_v(t->i) : jt_float_v(t->f);
        next(P);
        return x;
    default: break;
    }
    if (skip_op(P, "(")) {
        x = parse_tuple(P, true, true);
        expect_op(P, ")");
        return x;
    }
    bool list = is_op(P, "[");
    if (list || is_op(P, "{")) {
        const char *close = list ? "]" : "}";
        next(P);
        jt_vec keys = {0}, vals = {0};
        while (!is_op(P, close)) {
            if (keys.n) expect_op(P, ",");
            if (is_op(P, close)) break;
            vec_push(P, &keys, parse_expression(P, true));
            if (!list) {
                expect_op(P, ":");
                vec_push(P, &vals, parse_expression(P, true));
            }
        }
        expect_op(P, close);
        x = new_node(P, list ? JT_N_LIST : JT_N_DICT, t->pos);
        x->kids = keys.p;
        x->kids2 = vals.p;
        x->n_kids = keys.n;
        return x;
    }
    char buf[64];
    jt_fail(P->c, t->pos, "unexpected %s", describe(P, t, buf, sizeof buf));
}

static jt_node *parse_unary(jt_parser *P, bool with_filter)
{
    jt_enter(P->c, cur(P)->pos);
    size_t pos = cur(P)->pos;
    jt_node *x;
    if (skip_op(P, "-")) x = new_op(P, JT_N_NEG, pos, parse_unary(P, false), NULL);
    else if (skip_op(P, "+")) x = new_op(P, JT_N_POS, pos, parse_unary(P, false), NULL);
    else x = parse_primary(P);
    x = parse_postfix(P, x);
    while (with_filter) {
        if (is_op(P, "|")) x = parse_filter(P, x);
        else if (is_name(P, "is")) x = parse_test(P, x);
        else if (is_op(P, "(")) {
            jt_node *call = new_op(P, JT_N_CALL, cur(P)->pos, x, NULL);
            parse_call_args(P, call);
            x = call;
        } else {
            break;
        }
    }
    jt_leave(P->c);
    return x;
}

static jt_node *parse_binary(jt_parser *P, int level);

/* Levels 0..3: math1 (+ -), concat (~), math2 (* / // %), pow (**). */
static jt_node *parse_binary(jt_parser *P, int level)
{
    static const char *const ops[4][4] = {{"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
    static const jt_op codes[4][4] = {{JT_OP_ADD, JT_OP_SUB}, {JT_OP_CONCAT},
                                      {JT_OP_MUL, JT_OP_DIV, JT_OP_FLOORDIV, JT_OP_MOD}, {JT_OP_POW}};
    jt_node *x = level == 3 ? parse_unary(P, true) : parse_binary(P, level + 1);
    for (;;) {
        int k = -1;
        for (int j = 0; j < 4 && ops[level][j]; j++)
            if (is_op(P, ops[level][j])) k = j;
        if (k < 0) return x;
        size_t pos = next(P)->pos;
        jt_node *y = level == 3 ? parse_unary(P, true) : parse_binary(P, level + 1);
        x = new_op(P, JT_N_BINOP, pos, x, y);
        x->op = (int)codes[level][k];
    }
}

static jt_node *parse_compare(jt_parser *P)
{
    static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">="};
    static const jt_op codes[] = {JT_OP_EQ, JT_OP_NE, JT_OP_LT, JT_OP_LTEQ, JT_OP_GT, JT_OP_GTEQ};
    size_t pos = cur(P)->pos;
    jt_node *first = parse_binary(P, 0);
    jt_vec operands = {0};
    int ops_buf[CT_CHAT_MAX_DEPTH];
    size_t n_ops = 0;
    for (;;) {
        int op = -1;
        for (int j = 0; j < 6; j++)
            if (is_op(P, ops[j])) op = (int)codes[j];
        if (op >= 0) next(P);
        else if (skip_name(P, "in")) op = JT_OP_IN;
        else if (is_name(P, "not") && tok_is(look(P), JT_TOK_NAME, "in")) next(P), next(P), op = JT_OP_NOTIN;
        else break;
        if (n_ops == CT_CHAT_MAX_DEPTH) jt_fail(P->c, cur(P)->pos, "more than %d chained comparisons", CT_CHAT_MAX_DEPTH);
        ops_buf[n_ops++] = op;
        vec_push(P, &operands, parse_binary(P, 0));
    }
    if (!n_ops) return first;
    jt_node *x = new_node(P, JT_N_COMPARE, pos);
    x->a = first;
    x->kids = operands.p;
    x->n_kids = n_ops;
    x->ops = jt_alloc(P->c, n_ops * sizeof *x->ops);
    memcpy(x->ops, ops_buf, n_ops * sizeof *x->ops);
    return x;
}

static jt_node *parse_not(jt_parser *P)
{
    if (!is_name(P, "not")) return parse_compare(P);
    size_t pos = next(P)->pos;
    jt_enter(P->c, pos);
    jt_node *x = new_op(P, JT_N_NOT, pos, parse_not(P), NULL);
    jt_leave(P->c);
    return x;
}

static jt_node *parse_logic(jt_parser *P, bool is_or)
{
    jt_node *x = is_or ? parse_logic(P, false) : parse_not(P);
    while (is_name(P, is_or ? "or" : "and")) {
        size_t pos = next(P)->pos;
        x = new_op(P, is_or ? JT_N_OR : JT_N_AND, pos, x, is_or ? parse_logic(P, false) : parse_not(P));
    }
    return x;
}

static jt_node *parse_expression(jt_parser *P, bool with_cond)
{
    jt_enter(P->c, cur(P)->pos);
    jt_node *x = parse_logic(P, true);
    while (with_cond && is_name(P, "if")) {
        size_t pos = next(P)->pos;
        jt_node *cond = new_node(P, JT_N_COND, pos);
        cond->a = parse_logic(P, true);
        cond->b = x;
        if (skip_name(P, "else")) cond->c = parse_expression(P, true);
        x = cond;
    }
    jt_leave(P->c);
    return x;
}

// ---- statements ----

/* A name, names separated by commas (optionally in parentheses), or with
 * namespace, NAME.ATTR. */
static jt_node *parse_target(jt_parser *P, bool with_namespace)
{
    size_t pos = cur(P)->pos;
    bool parens = skip_op(P, "(");
    jt_vec names = {0};
    do {
        if (names.n && (is_name(P, "in") || is_op(P, "=") || is_op(P, ")"))) break;
        const jt_token *t = cur(P);
        if (t->kind != JT_TOK_NAME || tok_is(t, JT_TOK_NAME, "true") || tok_is(t, JT_TOK_NAME, "false") ||
            tok_is(t, JT_TOK_NAME, "none") || tok_is(t, JT_TOK_NAME, "True") || tok_is(t, JT_TOK_NAME, "False") ||
            tok_is(t, JT_TOK_NAME, "None"))
            fail_expected(P, "a name to assign to");
        jt_node *x = new_node(P, JT_N_NAME, t->pos);
        x->name = expect_ident(P);
        if (with_namespace && !parens && !names.n && is_op(P, ".")) {
            next(P);
            x->kind = JT_N_NSREF;
            x->value = jt_cstr_v(expect_ident(P));
            return x;
        }
        vec_push(P, &names, x);
    } while (skip_op(P, ","));
    if (parens) expect_op(P, ")");
    if (names.n == 1 && !parens) return names.p[0];
    jt_node *x = new_node(P, JT_N_TUPLE, pos);
    x->kids = names.p;
    x->n_kids = names.n;
    return x;
}

/* The body after a tag, up to one of the end tags (left current). */
static jt_body parse_statements(jt_parser *P, const char *const *end, size_t opened, const char *tag)
{
    skip_op(P, ":");
    expect_kind(P, JT_TOK_BLOCK_END, "the end of the tag ('%}')");
    return subparse(P, end, opened, tag);
}

static jt_node *parse_for(jt_parser *P, size_t pos)
{
    static const char *const end_body[] = {"endfor", "else", NULL}, *const end_else[] = {"endfor", NULL};
    jt_node *x = new_node(P, JT_N_FOR, pos);
    x->a = parse_target(P, false);
    if (!skip_name(P, "in")) fail_expected(P, "'in'");
    x->b = parse_tuple(P, false, false);
    if (skip_name(P, "if")) x->c = parse_expression(P, true);
    if (is_name(P, "recursive")) jt_fail(P->c, cur(P)->pos, "recursive for loops are not supported");
    P->loops++;
    x->body = parse_statements(P, end_body, pos, "for");
    P->loops--;
    if (tok_is(next(P), JT_TOK_NAME, "else")) {
        x->orelse = parse_statements(P, end_else, pos, "for");
        next(P);
    }
    return x;
}

static jt_node *parse_if(jt_parser *P, size_t pos)
{
    static const char *const end_body[] = {"elif", "else", "endif", NULL}, *const end_else[] = {"endif", NULL};
    jt_node *x = new_node(P, JT_N_IF, pos);
    x->a = parse_tuple(P, false, false);
    x->body = parse_statements(P, end_body, pos, "if");
    const jt_token *t = next(P);
    if (tok_is(t, JT_TOK_NAME, "elif")) {
        x->orelse.items = jt_alloc(P->c, sizeof *x->orelse.items);
        x->orelse.items[0] = parse_if(P, t->pos);
        x->orelse.n = 1;
    } else if (tok_is(t, JT_TOK_NAME, "else")) {
        x->orelse = parse_statements(P, end_else, pos, "if");
        next(P);
    }
    return x;
}

static jt_node *parse_set(jt_parser *P, size_t pos)
{
    static const char *const end[] = {"endset", NULL};
    jt_node *target = parse_target(P, true);
    if (skip_op(P, "=")) {
        jt_node *x = new_op(P, JT_N_SET, pos, target, parse_tuple(P, true, false));
        return x;
    }
    if (target->kind == JT_N_NSREF) fail_expected(P, "'='");
    jt_node *x = new_op(P, JT_N_SET_BLOCK, pos, target, NULL);
    x->c = parse_filter(P, NULL);
    x->body = parse_statements(P, end, pos, "set");
    next(P);
    return x;
}

static jt_node *parse_macro(jt_parser *P, size_t pos)
{
    static const char *const end[] = {"endmacro", NULL};
    jt_node *x = new_node(P, JT_N_MACRO, pos);
    x->name = expect_ident(P);
    jt_vec params = {0}, defaults = {0};
    bool any_default = false;
    expect_op(P, "(");
    while (!is_op(P, ")")) {
        if (params.n) expect_op(P, ",");
        jt_node *p = new_node(P, JT_N_NAME, cur(P)->pos);
        p->name = expect_ident(P);
        vec_push(P, &params, p);
        jt_node *d = NULL;
        if (skip_op(P, "=")) d = parse_expression(P, true), any_default = true;
        else if (any_default) jt_fail(P->c, p->pos, "non-default argument follows default argument");
        vec_push(P, &defaults, d);
    }
    expect_op(P, ")");
    x->n_kw = params.n;
    x->kw_names = jt_alloc(P->c, (params.n + 1) * sizeof *x->kw_names);
    for (size_t i = 0; i < params.n; i++) x->kw_names[i] = params.p[i]->name;
    x->kw_vals = defaults.p;
    int loops = P->loops, refs = P->macro_refs;
    P->loops = 0;   /* a macro's body is a function: break there does not leave the caller's loop */
    P->macro_refs = 0;
    x->body = parse_statements(P, end, pos, "macro");
    x->op = P->macro_refs;
    P->loops = loops;
    P->macro_refs = refs;
    next(P);
    return x;
}

static jt_node *parse_statement(jt_parser *P)
{
    static const char *const end_generation[] = {"endgeneration", NULL};
    static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "call", "filter",
                                              "with", "autoescape", "print", "do", "trans", NULL};
    const jt_token *t = cur(P);
    if (t->kind != JT_TOK_NAME) fail_expected(P, "a tag name");
    size_t pos = t->pos;
    next(P);
    if (tok_is(t, JT_TOK_NAME, "for")) return parse_for(P, pos);
    if (tok_is(t, JT_TOK_NAME, "if")) return parse_if(P, pos);
    if (tok_is(t, JT_TOK_NAME, "set")) return parse_set(P, pos);
    if (tok_is(t, JT_TOK_NAME, "macro")) return parse_macro(P, pos);
    if (tok_is(t, JT_TOK_NAME, "break") || tok_is(t, JT_TOK_NAME, "continue")) {
        bool brk = tok_is(t, JT_TOK_NAME, "break");
        if (!P->loops) jt_fail(P->c, pos, "'%s' outside a for loop", brk ? "break" : "continue");
        return new_node(P, brk ? JT_N_BREAK : JT_N_CONTINUE, pos);
    }
    if (tok_is(t, JT_TOK_NAME, "generation")) {   /* transformers' tag: marks assistant text, renders its body */
        jt_node *x = new_node(P, JT_N_GENERATION, pos);
        x->body = parse_statements(P, end_generation, pos, "generation");
        next(P);
        return x;
    }
    static const char *const closers[] = {"endfor", "endif", "endset", "endmacro", "endgeneration", "endraw",
                                          "else", "elif", NULL};
    for (int i = 0; closers[i]; i++)
        if (tok_is(t, JT_TOK_NAME, closers[i]))
            jt_fail(P->c, pos, "unexpected {%% %s %%}: no open block takes it here", closers[i]);
    for (int i = 0; unsupported[i]; i++)
        if (tok_is(t, JT_TOK_NAME, unsupported[i]))
            jt_fail(P->c, pos, "the {%% %s %%} tag is not supported", unsupported[i]);
    jt_fail(P->c, pos, "unknown tag '%.*s'", (int)(t->n < 40 ? t->n : 40), t->s);
}

/* Statements and output until EOF (end == NULL) or a tag named in end. */
static jt_body subparse(jt_parser *P, const char *const *end, size_t opened, const char *tag)
{
    jt_enter(P->c, cur(P)->pos);
    jt_vec body = {0};
    for (;;) {
        const jt_token *t = cur(P);
        if (t->kind == JT_TOK_EOF) {
            if (!end) break;
            char want[96] = "", buf[64];
            for (int i = 0; end[i]; i++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s{%% %s %%}", i ? " or " : "", end[i]);
            int line = 1, col = 1;
            for (size_t k = 0; k < opened && k < P->c->src_len; k++) {
                if (P->c->src[k] == '\n') line++, col = 1;
                else if (((unsigned char)P->c->src[k] & 0xC0) != 0x80) col++;
            }
            jt_fail(P->c, t->pos, "unexpected %s: expected %s (the '%s' at line %d:%d is not closed)",
                    describe(P, t, buf, sizeof buf), want, tag, line, col);
        }
        if (t->kind == JT_TOK_DATA) {
            jt_node *x = new_node(P, JT_N_TEXT, t->pos);
            x->name = t->s;
            x->len = t->n;
            vec_push(P, &body, x);
            next(P);
        } else if (t->kind == JT_TOK_VAR_BEGIN) {
            next(P);
            jt_node *x = new_op(P, JT_N_OUTPUT, t->pos, parse_tuple(P, true, false), NULL);
            expect_kind(P, JT_TOK_VAR_END, "the end of the print statement ('}}')");
            vec_push(P, &body, x);
        } else if (t->kind == JT_TOK_BLOCK_BEGIN) {
            next(P);
            for (int i = 0; end && end[i]; i++)
                if (is_name(P, end[i])) {
                    jt_leave(P->c);
                    return (jt_body){body.p, body.n};
                }
            vec_push(P, &body, parse_statement(P));
            expect_kind(P, JT_TOK_BLOCK_END, "the end of the tag ('%}')");
        } else {
            char buf[64];
            jt_fail(P->c, t->pos, "unexpected %s", describe(P, t, buf, sizeof buf));
        }
    }
    jt_leave(P->c);
    return (jt_body){body.p, body.n};
}

jt_body jt_parse(jt_ctx *c, const jt_token *toks, size_t n_toks)
{
    jt_parser P = {.c = c, .t = toks, .n = n_toks};
    return subparse(&P, NULL, 0, NULL);
}
