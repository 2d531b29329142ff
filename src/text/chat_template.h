/* chat_template.h — a model's chat template rendered in C, as transformers'
 * apply_chat_template(messages, tokenize=False, add_generation_prompt=...)
 * renders it (tests/test_chat_template.c checks byte for byte against
 * transformers on the templates of tests/fixtures/chat_templates).
 *
 * The engine is a Jinja2 subset, the one chat templates use, with transformers'
 * environment: trim_blocks and lstrip_blocks, the loopcontrols extension
 * (break, continue), its {% generation %} tag, its tojson (no HTML escaping,
 * ensure_ascii/indent/separators/sort_keys), the globals raise_exception() and
 * strftime_now(), and jinja2's sandbox (lists and dicts are read-only).
 *   Syntax: text, {{ }}, {% %}, {# #} and {% raw %}, with '-' and '+' whitespace
 *     control on either side.
 *   Statements: for (tuple targets, an 'if' filter, else, loop.index/index0/
 *     revindex/revindex0/first/last/length/previtem/nextitem/depth), if/elif/else,
 *     set (a name, a tuple, ns.attr, or a {% set %}...{% endset %} block), macro
 *     (positional and keyword arguments, defaults, varargs/kwargs, recursion), break, continue,
 *     generation.
 *   Expressions: none/true/false, ints, floats, strings (Python escapes), lists,
 *     tuples, dicts; .attr, [key], slices; + - * / // % ** ~, comparisons (chained),
 *     and/or/not, in/not in, 'a if c else b'; Jinja's Undefined (falsy, renders as
 *     nothing; using it further is an error as in jinja2).
 *   Tests: defined undefined none string number integer float boolean true false
 *     mapping iterable sequence callable odd even divisibleby equalto/eq/==
 *     ne/!= lt/< le/<= gt/> ge/>= in sameas lower upper.
 *   Filters: abs capitalize count d default first float int items join last length
 *     list lower map reject rejectattr replace reverse round safe select selectattr
 *     string tojson trim upper.
 *   Methods: str strip lstrip rstrip split rsplit startswith endswith upper lower
 *     replace find count title capitalize join isspace; dict items keys values get;
 *     list/tuple count index; loop.cycle.
 *   Globals: messages, add_generation_prompt, bos_token/eos_token (when the
 *     model names them), tools and documents (none), raise_exception,
 *     strftime_now, namespace, range, dict.
 * Anything else is CT_ERR_INPUT naming the construct and line:col, at load time
 * for what parses (an unknown tag, filter or test) and at render time for what
 * only evaluation shows (a type error, a raised exception).
 *
 * Differences from jinja2 that only unusual templates can see: integers are 64-bit
 * (beyond that is an error, Python would go on); upper/lower/title use Unicode's
 * simple case mappings plus the common special cases (ß, the ﬁ ligatures, İ), not
 * Greek final sigma; printing a generator, a function or a macro does not give
 * Python's <object at 0x...> text; a generator filter (select, map ...)
 * computes its items at once, so an error in one shows even if nothing reads
 * them; jinja2's constant folding, which turns some errors on literals (1[:2])
 * into Undefined, is not reproduced (they stay errors); no complex numbers.
 *
 * A template is untrusted input: its size, the nesting depth of what it parses
 * and evaluates, the steps of a render, the memory a render holds and the size of
 * what it writes are capped (ct_chat_limits), each overrun an input error.
 *
 * Threads: a loaded template is immutable; renders of it may run at once.
 * Ownership: chat_template_load returns a handle freed with chat_template_free. */
#ifndef CT_CHAT_TEMPLATE_H
#define CT_CHAT_TEMPLATE_H

#include <time.h>

#include "common.h"

#define CT_CHAT_TEMPLATE_MAX_BYTES ((size_t)1 << 20)   /* a template's source */
#define CT_CHAT_MAX_DEPTH 200   /* nesting of parsing and of evaluation (macro calls included) */

typedef struct ct_chat_message { const char *role; const char *content; } ct_chat_message;
typedef struct ct_chat_template ct_chat_template;

/* The template of MODEL_DIR (chat_template.jinja, else tokenizer_config.json's chat_template
 * (a list: the one named "default"), with its bos_token/eos_token strings), or, when OVERRIDE is not
 * NULL, a built-in NAME or a FILE path. CT_ERR_INPUT naming the file and what is wrong (no template,
 * a syntax error with line:col, an unsupported construct named). */
ct_chat_template *chat_template_load(const char *model_dir, const char *override, ct_error *err);
/* Renders messages (n >= 0) as transformers' apply_chat_template(messages, tokenize=False,
 * add_generation_prompt=...) does; *out is malloc'd and NUL-terminated. system/user/assistant roles
 * (and tool where the template handles it); raise_exception() in the template -> CT_ERR_INPUT with
 * its message. */
int chat_template_render(const ct_chat_template *t, const ct_chat_message *msgs, int n,
                         bool add_generation_prompt, char **out, size_t *len, ct_error *err);
/* A byte range [start, end) of a rendering. */
typedef struct ct_chat_span { size_t start, end; } ct_chat_span;
/* chat_template_render that also returns the spans of the text each {% generation %} block
 * rendered, as transformers records them for apply_chat_template(..., return_assistant_tokens_mask=True):
 * one per block evaluated, in the order the blocks end (an inner block before the one around it),
 * start = the length of the top-level output when the block began, end = start + the length of
 * its text (so a block inside a macro or a {% set %} block gets a span that starts where the macro
 * call's or the set's text begins, not where its own text is). Empty spans are kept. In bytes where
 * transformers counts characters: end is start plus the block's length in characters counted over
 * the rendering, each character past its end one byte (so end > *len says the span runs past it).
 * *spans is malloc'd (NULL when *n_spans is 0). */
int chat_template_render_spans(const ct_chat_template *t, const ct_chat_message *msgs, int n,
                               bool add_generation_prompt, char **out, size_t *len, ct_chat_span **spans,
                               size_t *n_spans, ct_error *err);
/* Whether the source has a generation tag as scripts/prepare_data.py looks for one (the regex
 * \{%-?\s*generation\s*-?%\}, transformers' own test), which picks the mask rule of prepare. */
bool chat_template_has_generation(const ct_chat_template *t);
const char *chat_template_name(const ct_chat_template *t);   /* "model", a built-in name, or the file */
void chat_template_free(ct_chat_template *t);

/* A template from its text (len bytes, need not be NUL-terminated). name is what
 * chat_template_name returns and errors cite; bos/eos are the bos_token and
 * eos_token variables (NULL: undefined, as transformers leaves a token the
 * model does not have). */
ct_chat_template *chat_template_parse(const char *text, size_t len, const char *name, const char *bos,
                                      const char *eos, ct_error *err);

/* The built-in templates for --chat-template NAME, each written in Jinja and
 * rendered by the same engine: chatml, llama2, llama3, mistral, qwen3 (see
 * chat_template.c for what each reproduces). NULL-terminated. */
extern const char *const chat_template_builtin_names[];
/* The Jinja text of a built-in (NULL when NAME is not one). */
const char *chat_template_builtin_text(const char *name);

/* strftime_now() reads the local time, as transformers' does; a template given
 * a date here reads that instead (tests, reproducible renders). NULL: the clock again. */
void chat_template_set_date(ct_chat_template *t, const struct tm *date);

/* What one render may use; every overrun is CT_ERR_INPUT naming the limit. */
typedef struct ct_chat_limits {
    size_t max_output;   /* bytes of rendered text (a macro's output too) */
    size_t max_memory;   /* bytes of values a render holds at once */
    size_t max_steps;    /* nodes evaluated + loop iterations + bytes scanned / 64 */
} ct_chat_limits;
/* The defaults: 32 MiB of output, 256 MiB of memory, 20 million steps. */
ct_chat_limits chat_template_default_limits(void);
void chat_template_set_limits(ct_chat_template *t, const ct_chat_limits *limits);

#endif
