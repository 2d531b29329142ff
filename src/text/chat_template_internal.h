/* chat_template_internal.h — shared by the chat-template engine's files:
 *   chat_template_lex.c     source -> tokens (jinja2's lexer rules, whitespace control)
 *   chat_template_parse.c   tokens -> syntax tree (jinja2's grammar and precedence)
 *   chat_template_value.c   values: Python's str(), repr(), ==, <, truth, json.dumps
 *   chat_template_eval.c    the tree evaluated over scopes, into the output
 *   chat_template_builtins.c  filters and tests
 *   chat_template_methods.c   attribute and item access, str/dict methods, global functions
 *   chat_template.c         loading (model folder, built-ins, files) and rendering
 *
 * Failure: every function that meets bad input calls jt_fail, which writes the
 * message and longjmps back to the entry point (parse or render). That is safe
 * because everything a parse or a render allocates lives in its context's pool,
 * freed at once by the entry point; nothing between holds malloc'd memory. */
#ifndef CT_CHAT_TEMPLATE_INTERNAL_H
#define CT_CHAT_TEMPLATE_INTERNAL_H

#include <setjmp.h>
#include <stdio.h>
#include <stdarg.h>

#include "chat_template.h"

/* ---- context: pool, error exit, limits ---- */

typedef struct jt_chunk jt_chunk;
typedef struct jt_ctx {
    jmp_buf jump;
    ct_error *err;
    const char *src;          /* the template source (newlines normalised), for line:col */
    size_t src_len;
    const char *name;         /* what errors cite: a file, "built-in chatml", ... */
    jt_chunk *chunks;         /* the pool */
    size_t pool_used, pool_cap;
    size_t at;                /* the offset errors cite when the caller gives none */
    int depth;                /* current nesting of parse / eval */
    size_t steps, max_steps;
} jt_ctx;

#define JT_NO_POS ((size_t)-1)

void jt_ctx_init(jt_ctx *c, const char *src, size_t src_len, const char *name, ct_error *err,
                 size_t pool_cap, size_t max_steps);
void jt_pool_free(jt_chunk *chunks);
void *jt_alloc(jt_ctx *c, size_t n);             /* zeroed; fails past pool_cap */
char *jt_strndup(jt_ctx *c, const char *s, size_t n);
_Noreturn void jt_fail(jt_ctx *c, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void jt_enter(jt_ctx *c, size_t pos);            /* depth + 1, fails past CT_CHAT_MAX_DEPTH */
static inline void jt_leave(jt_ctx *c) { c->depth--; }
void jt_step(jt_ctx *c, size_t pos, size_t n);   /* n steps of work, fails past max_steps */

/* ---- UTF-8 (ill-formed bytes are code points 0xDC80 + byte, as Python's surrogateescape) ---- */

uint32_t jt_utf8_next(const char *s, size_t n, size_t *i);
size_t jt_utf8_put(char *out, uint32_t cp);      /* writes 1-4 bytes */
size_t jt_utf8_count(const char *s, size_t n);
bool jt_is_space(uint32_t cp);                   /* Python's str.isspace() */

/* ---- growable byte buffer in the pool ---- */

typedef struct jt_buf {
    char *p;
    size_t n, cap;
    size_t max;               /* the output cap; 0: none */
} jt_buf;
void jt_buf_put(jt_ctx *c, jt_buf *b, const char *s, size_t n);
void jt_buf_putc(jt_ctx *c, jt_buf *b, char ch);
void jt_buf_printf(jt_ctx *c, jt_buf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void jt_buf_put_cp(jt_ctx *c, jt_buf *b, uint32_t cp);

/* ---- values ---- */

typedef enum {
    JT_UNDEFINED, JT_NONE, JT_BOOL, JT_INT, JT_FLOAT, JT_STR,
    JT_LIST,        /* list, tuple or a read-only view (kind) */
    JT_ITER,        /* a generator: select, map, reverse ... (truthy, no len, consumed once) */
    JT_DICT, JT_NAMESPACE, JT_MACRO, JT_FUNC, JT_LOOP,
} jt_type;

typedef enum { JT_SEQ_LIST, JT_SEQ_TUPLE, JT_SEQ_DICT_ITEMS, JT_SEQ_DICT_KEYS, JT_SEQ_DICT_VALUES, JT_SEQ_RANGE } jt_seq_kind;

typedef struct jt_value jt_value;
typedef struct jt_list jt_list;
typedef struct jt_dict jt_dict;
typedef struct jt_node jt_node;
typedef struct jt_scope jt_scope;

typedef struct jt_undef {
    const char *name;         /* the variable, attribute or hint */
    const char *owner;        /* "dict object" ... when an attribute or element was missing */
    bool element;             /* subscript by a non-string ("has no element 0") */
    bool hint;                /* name is the whole message */
} jt_undef;

typedef struct jt_macro { const jt_node *def; jt_scope *closure; } jt_macro;
typedef struct jt_loop jt_loop;

struct jt_value {
    jt_type type;
    union {
        bool b;
        long long i;
        double f;
        struct { const char *p; size_t n; } s;
        jt_list *list;        /* JT_LIST, JT_ITER */
        jt_dict *dict;        /* JT_DICT, JT_NAMESPACE */
        const jt_macro *macro;
        struct { int id; jt_value *self; } fn;
        jt_loop *loop;
        const jt_undef *undef;
    };
};

struct jt_list {
    jt_value *items;
    size_t n;
    size_t pos;               /* JT_ITER: items before pos are consumed */
    const char *fail;         /* JT_ITER: the error its first use raises (a generator over a non-iterable) */
    jt_seq_kind kind;
    long long range[3];       /* JT_SEQ_RANGE: start, stop, step (for printing) */
};

struct jt_dict {
    jt_value *keys, *vals;    /* insertion order, as Python's dict */
    size_t n, cap;
};

struct jt_loop {
    jt_list *items;
    size_t index;             /* 0-based */
    int depth;                /* 1 for the outermost loop */
};

static inline jt_value jt_undef_v(void) { jt_value v = {.type = JT_UNDEFINED}; return v; }
static inline jt_value jt_none_v(void) { jt_value v = {.type = JT_NONE}; return v; }
static inline jt_value jt_bool_v(bool b) { jt_value v = {.type = JT_BOOL, .b = b}; return v; }
static inline jt_value jt_int_v(long long i) { jt_value v = {.type = JT_INT, .i = i}; return v; }
static inline jt_value jt_float_v(double f) { jt_value v = {.type = JT_FLOAT, .f = f}; return v; }
static inline jt_value jt_str_v(const char *p, size_t n) { jt_value v = {.type = JT_STR, .s = {p, n}}; return v; }
jt_value jt_cstr_v(const char *s);
jt_value jt_list_v(jt_ctx *c, size_t n, jt_seq_kind kind);   /* n undefined items to fill */
jt_value jt_iter_v(jt_ctx *c, jt_value *items, size_t n);
/* A generator over v's items, or, when v is not iterable, one whose first use
 * fails with what (jinja2's generators fail only when consumed). */
bool jt_iterable(jt_value v);
void jt_iter_check(jt_ctx *c, size_t pos, jt_value v);   /* fails if v is a failed generator */
jt_value jt_dict_v(jt_ctx *c, jt_type type);
void jt_dict_set(jt_ctx *c, jt_dict *d, jt_value key, jt_value val);
bool jt_hashable(jt_value v);   /* may be a dict key (Python's hash() succeeds) */
const jt_value *jt_dict_get(jt_ctx *c, const jt_dict *d, jt_value key);
jt_value jt_undef_named(jt_ctx *c, const char *name);
jt_value jt_undef_member(jt_ctx *c, jt_value owner, jt_value key);
jt_value jt_undef_hint(jt_ctx *c, const char *hint);

bool jt_truthy(jt_value v);
bool jt_equal(jt_ctx *c, jt_value a, jt_value b);
int jt_compare(jt_ctx *c, size_t pos, jt_value a, jt_value b);   /* <0, 0, >0; fails when unordered */
const char *jt_type_name(jt_value v);             /* Python's: "str", "int", "dict" ... */
bool jt_is_number(jt_value v);                    /* bool, int, float */
double jt_as_double(jt_value v);
_Noreturn void jt_fail_undefined(jt_ctx *c, size_t pos, jt_value v);
void jt_str_of(jt_ctx *c, jt_buf *b, jt_value v);   /* Python's str(v), appended */
void jt_repr_of(jt_ctx *c, jt_buf *b, jt_value v);  /* Python's repr(v), appended */
jt_value jt_to_str(jt_ctx *c, jt_value v);          /* str(v) as a JT_STR (v itself if one) */
void jt_format_float(char out[32], double f);       /* Python's repr of a float */

typedef struct jt_json_opts {
    bool ensure_ascii, sort_keys;
    const char *indent;       /* NULL: one line */
    size_t indent_len;
    const char *item_sep, *key_sep;
    size_t item_sep_len, key_sep_len;
} jt_json_opts;
void jt_json_dump(jt_ctx *c, size_t pos, jt_buf *b, jt_value v, const jt_json_opts *o);

/* Items of an iterable for a for loop, join, list ...: a JT_ITER is consumed.
 * Strings give their characters, dicts their keys, Undefined nothing. */
jt_list *jt_iterate(jt_ctx *c, size_t pos, jt_value v);

/* ---- syntax tree ---- */

typedef enum {
    /* statements */
    JT_N_TEXT, JT_N_OUTPUT, JT_N_IF, JT_N_FOR, JT_N_SET, JT_N_SET_BLOCK, JT_N_MACRO,
    JT_N_BREAK, JT_N_CONTINUE, JT_N_GENERATION,
    /* expressions */
    JT_N_CONST, JT_N_NAME, JT_N_LIST, JT_N_TUPLE, JT_N_DICT, JT_N_ATTR, JT_N_ITEM, JT_N_SLICE,
    JT_N_CALL, JT_N_FILTER, JT_N_TEST, JT_N_NEG, JT_N_POS, JT_N_NOT, JT_N_AND, JT_N_OR,
    JT_N_BINOP, JT_N_COMPARE, JT_N_COND, JT_N_NSREF,
} jt_node_kind;

typedef enum {
    JT_OP_ADD, JT_OP_SUB, JT_OP_MUL, JT_OP_DIV, JT_OP_FLOORDIV, JT_OP_MOD, JT_OP_POW, JT_OP_CONCAT,
    JT_OP_EQ, JT_OP_NE, JT_OP_LT, JT_OP_LTEQ, JT_OP_GT, JT_OP_GTEQ, JT_OP_IN, JT_OP_NOTIN,
} jt_op;

typedef struct jt_body { jt_node **items; size_t n; } jt_body;

enum { JT_MACRO_VARARGS = 1, JT_MACRO_KWARGS = 2 };   /* MACRO op: its body reads varargs / kwargs */

struct jt_node {
    jt_node_kind kind;
    size_t pos;               /* byte offset in the source */
    int op;                   /* BINOP: jt_op; FILTER/TEST: builtin id; MACRO: JT_MACRO_*; ATTR: a method name */
    const char *name;         /* NAME, ATTR, NSREF attribute, FILTER/TEST/MACRO name; TEXT bytes */
    size_t len;               /* TEXT, ATTR: the length of name */
    jt_value value;           /* CONST */
    jt_node *a, *b, *c;       /* operands (see chat_template_parse.c for each kind) */
    jt_node **kids;           /* LIST/TUPLE items, DICT keys, CALL/FILTER/TEST args, COMPARE operands */
    jt_node **kids2;          /* DICT values */
    int *ops;                 /* COMPARE: an operator per operand */
    size_t n_kids;
    const char **kw_names;    /* CALL/FILTER/TEST keywords; MACRO parameters */
    jt_node **kw_vals;        /* their values; MACRO defaults (NULL: none) */
    size_t n_kw;
    jt_body body, orelse;     /* IF, FOR, MACRO, SET_BLOCK, GENERATION */
};

typedef enum {
    JT_TOK_DATA, JT_TOK_VAR_BEGIN, JT_TOK_VAR_END, JT_TOK_BLOCK_BEGIN, JT_TOK_BLOCK_END,
    JT_TOK_NAME, JT_TOK_STRING, JT_TOK_INT, JT_TOK_FLOAT, JT_TOK_OP, JT_TOK_EOF,
} jt_tok_kind;

typedef struct jt_token {
    jt_tok_kind kind;
    size_t pos;
    const char *s;            /* DATA, NAME, STRING (decoded), OP (its text) */
    size_t n;
    long long i;
    double f;
} jt_token;

jt_token *jt_lex(jt_ctx *c, size_t *n_tokens);
jt_body jt_parse(jt_ctx *c, const jt_token *toks, size_t n_toks);

/* ---- builtins (chat_template_builtins.c, chat_template_methods.c) ---- */

int jt_filter_id(const char *name);   /* -1 when unknown */
int jt_test_id(const char *name);
typedef struct jt_args {
    const jt_value *pos;
    size_t n_pos;
    const char *const *kw_names;
    const jt_value *kw;
    size_t n_kw;
} jt_args;
typedef struct jt_render jt_render;
jt_value jt_apply_filter(jt_render *r, size_t at, int id, jt_value v, const jt_args *a);
bool jt_apply_test(jt_render *r, size_t at, int id, jt_value v, const jt_args *a);
jt_value jt_get_method(jt_ctx *c, jt_value self, const char *name);   /* JT_UNDEFINED when none */
jt_value jt_call_func(jt_render *r, size_t at, jt_value fn, const jt_args *a);
jt_value jt_global_func(const char *name);   /* raise_exception ...; JT_UNDEFINED when not one */
/* obj.name; maybe_method: jt_is_method_name(name), which the parser computes once per node. */
jt_value jt_get_attr(jt_ctx *c, jt_value obj, const char *name, size_t len, bool maybe_method);
bool jt_is_method_name(const char *name);   /* a method (or refused method) of str, dict or list */
/* Argument i, or keyword kw; NULL when not given. */
const jt_value *jt_arg(const jt_args *a, size_t i, const char *kw);
/* Fails on more than max_pos positional arguments or a keyword not among
 * names (names[i] is positional i's keyword; NULL: none take keywords). */
void jt_check_args(jt_ctx *c, const char *what, const jt_args *a, size_t max_pos, const char *const *names);
jt_value jt_str_arg(jt_ctx *c, const char *what, const jt_value *v);
jt_value jt_str_strip(jt_ctx *c, jt_value s, const jt_value *chars, bool left, bool right);
jt_value jt_str_case(jt_ctx *c, jt_value s, char mode);   /* 'u'pper 'l'ower 't'itle 'c'apitalize */
jt_value jt_str_replace(jt_ctx *c, jt_value s, jt_value old, jt_value rep, long long count);
jt_value jt_str_join(jt_ctx *c, jt_value sep, const jt_list *items);
jt_value jt_get_item(jt_ctx *c, size_t pos, jt_value obj, jt_value key);

/* ---- evaluation (chat_template_eval.c) ---- */

struct jt_render {
    jt_ctx c;
    jt_buf *out;              /* where output goes now (a macro's body writes to its own) */
    jt_buf *top;              /* the rendering itself, the output of the template's top level */
    bool track;               /* record the spans of generation blocks (chat_template_render_spans) */
    ct_chat_span *spans;      /* (n_spans) in the pool */
    size_t n_spans, spans_cap;
    size_t max_output;
    jt_scope *globals;
    const struct tm *date;    /* NULL: the clock */
};
jt_scope *jt_scope_new(jt_render *r, jt_scope *parent);
void jt_scope_set(jt_render *r, jt_scope *s, const char *name, jt_value v);
int jt_render_body(jt_render *r, jt_scope *s, const jt_body *body);   /* 0, or a break/continue to pass up */
jt_value jt_call_macro(jt_render *r, size_t at, const jt_macro *m, const jt_args *a);
jt_value jt_loop_attr(jt_ctx *c, const jt_loop *l, const char *name);
bool jt_contains(jt_render *r, jt_value container, jt_value item);   /* Python's 'item in container' */

#endif
