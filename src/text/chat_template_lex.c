/* chat_template_lex.c — template source -> tokens, by jinja2's lexer rules
 * (jinja2/lexer.py) with transformers' settings trim_blocks and lstrip_blocks:
 *   - data runs to the first "{%", "{{" or "{#"; a '-' after the opener strips
 *     the whitespace before it; otherwise, for "{%" and "{#" (not "{{") and
 *     without '+', the spaces and tabs between the line's start and the tag are
 *     dropped (lstrip_blocks);
 *   - "-%}" / "-}}" / "-#}" strip the whitespace after; "%}" and "#}" eat one
 *     newline after them (trim_blocks), "+%}" keeps it; "}}" never does;
 *   - inside a tag: whitespace, floats, integers (0b/0o/0x, '_' separators),
 *     names, strings (Python escapes, as jinja2 decodes them with
 *     'unicode-escape'), operators; an end tag counts only outside brackets;
 *   - {% raw %}...{% endraw %} is data.
 * Whitespace is Python's (str.isspace, Unicode). The caller has normalised
 * newlines and dropped one trailing newline, as jinja2 does before lexing. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "chat_template_internal.h"

typedef struct jt_lexer {
    jt_ctx *c;
    const char *s;
    size_t n;
    jt_token *toks;
    size_t len, cap;
    bool line_starting;       /* the last match ended a line (jinja2's lstrip_blocks condition) */
} jt_lexer;

static jt_token *lex_emit(jt_lexer *L, jt_tok_kind kind, size_t pos, const char *s, size_t n)
{
    if (L->len == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        jt_token *t = jt_alloc(L->c, cap * sizeof *t);
        if (L->len) memcpy(t, L->toks, L->len * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    jt_token *t = &L->toks[L->len++];
    t->kind = kind;
    t->pos = pos;
    t->s = s;
    t->n = n;
    return t;
}

/* The end of the whitespace run at i. */
static size_t lex_skip_space(const jt_lexer *L, size_t i)
{
    while (i < L->n) {
        size_t j = i;
        if (!jt_is_space(jt_utf8_next(L->s, L->n, &j))) break;
        i = j;
    }
    return i;
}

static bool lex_all_space(const jt_lexer *L, size_t from, size_t to)
{
    if (from >= to) return false;   /* jinja2 tests \s+, which an empty run fails */
    for (size_t i = from; i < to;)
        if (!jt_is_space(jt_utf8_next(L->s, to, &i))) return false;
    return true;
}

static bool lex_at(const jt_lexer *L, size_t i, const char *lit)
{
    size_t k = strlen(lit);
    return i <= L->n && L->n - i >= k && memcmp(L->s + i, lit, k) == 0;
}

/* Emits the data [from, to) before a tag whose whitespace sign is sign; lstrip
 * applies to block and comment tags. */
static void lex_data_before(jt_lexer *L, size_t from, size_t to, char sign, bool lstrip)
{
    if (sign == '-') {
        size_t end = to;
        while (end > from) {   /* rstrip(): step back over whole characters */
            size_t start = end - 1;
            while (start > from && ((unsigned char)L->s[start] & 0xC0) == 0x80) start--;
            size_t j = start;
            if (!jt_is_space(jt_utf8_next(L->s, end, &j)) || j != end) break;
            end = start;
        }
        to = end;
    } else if (sign != '+' && lstrip) {
        size_t l_pos = to;
        while (l_pos > from && L->s[l_pos - 1] != '\n') l_pos--;
        if ((l_pos > from || L->line_starting) && lex_all_space(L, l_pos, to)) to = l_pos;
    }
    if (to > from) lex_emit(L, JT_TOK_DATA, from, L->s + from, to - from);
}

/* The end of "SIGN?%}" after a tag's content at i, or 0 when none is at i.
 * Blocks and comments (trim): '+' keeps what follows, else one newline goes
 * (trim_blocks); "}}" takes no '+'. '-' eats all the whitespace after. */
static size_t lex_tag_end(const jt_lexer *L, size_t i, const char *close, bool trim)
{
    if (trim && L->s[i] == '+' && lex_at(L, i + 1, close)) return i + 3;
    if (L->s[i] == '-' && lex_at(L, i + 1, close)) return lex_skip_space(L, i + 3);
    if (lex_at(L, i, close)) return i + 2 + (trim && i + 2 < L->n && L->s[i + 2] == '\n');
    return 0;
}

// ---- literals inside tags ----

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* The end of (\d+_)*\d+ at i, or i when no digit is there. */
static size_t lex_digits(const jt_lexer *L, size_t i)
{
    if (i >= L->n || !is_digit(L->s[i])) return i;
    for (;;) {
        while (i < L->n && is_digit(L->s[i])) i++;
        if (i + 1 < L->n && L->s[i] == '_' && is_digit(L->s[i + 1])) i++;
        else return i;
    }
}

static size_t lex_float(const jt_lexer *L, size_t q)
{
    if (q > 0 && L->s[q - 1] == '.') return q;
    size_t d = lex_digits(L, q);
    if (d == q) return q;
    size_t frac = d;
    if (d < L->n && L->s[d] == '.') {
        size_t f = lex_digits(L, d + 1);
        if (f > d + 1) frac = f;
    }
    if (frac < L->n && (L->s[frac] == 'e' || L->s[frac] == 'E')) {
        size_t j = frac + 1;
        if (j < L->n && (L->s[j] == '+' || L->s[j] == '-')) j++;
        size_t e = lex_digits(L, j);
        if (e > j) return e;
    }
    return frac > d ? frac : q;
}

static int lex_digit_val(char ch)
{
    return is_digit(ch) ? ch - '0' : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'f' ? (ch | 0x20) - 'a' + 10 : 99;
}

/* The end of an integer literal at q (0 when none) and its value. */
static size_t lex_int(jt_lexer *L, size_t q, long long *val)
{
    const char *s = L->s;
    int base = 10;
    size_t i = q, start;
    if (s[q] == '0' && q + 1 < L->n && strchr("bBoOxX", s[q + 1])) {
        base = (s[q + 1] | 0x20) == 'b' ? 2 : (s[q + 1] | 0x20) == 'o' ? 8 : 16;
        i = q + 2;
        start = i;
        for (;;) {
            if (i + 1 < L->n && s[i] == '_' && lex_digit_val(s[i + 1]) < base) i += 2;
            else if (i < L->n && lex_digit_val(s[i]) < base) i++;
            else break;
        }
        if (i == start) base = 10, i = q;   /* "0b" alone: the integer 0, then a name */
    }
    if (base == 10) {
        if (!is_digit(s[q])) return 0;
        i = q + 1;
        for (;;) {   /* [1-9](_?\d)* or 0(_?0)* */
            char hi = s[q] == '0' ? '0' : '9';
            if (i + 1 < L->n && s[i] == '_' && s[i + 1] >= '0' && s[i + 1] <= hi) i += 2;
            else if (i < L->n && s[i] >= '0' && s[i] <= hi) i++;
            else break;
        }
        start = q;
    }
    unsigned long long v = 0;
    for (size_t k = start; k < i; k++) {
        if (s[k] == '_') continue;
        unsigned d = (unsigned)lex_digit_val(s[k]);
        if (v > (9223372036854775807ULL - d) / (unsigned)base)
            jt_fail(L->c, q, "integer literal too large (integers are 64-bit here)");
        v = v * (unsigned)base + d;
    }
    *val = (long long)v;
    return i;
}

static bool lex_ident_start(uint32_t cp)
{
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z' ? true : cp == '_';
    int cat = utf8proc_category((utf8proc_int32_t)cp);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) || cat == UTF8PROC_CATEGORY_NL;
}

static bool lex_ident_char(uint32_t cp)
{
    if (cp < 0x80) return lex_ident_start(cp) || is_digit((char)cp);
    int cat = utf8proc_category((utf8proc_int32_t)cp);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_NO) || cat == UTF8PROC_CATEGORY_PC;
}

static int lex_hex(const jt_lexer *L, size_t i, int digits, uint32_t *cp)
{
    *cp = 0;
    for (int k = 0; k < digits; k++) {
        if (i + (size_t)k >= L->n || lex_digit_val(L->s[i + (size_t)k]) > 15) return 0;
        *cp = *cp << 4 | (uint32_t)lex_digit_val(L->s[i + (size_t)k]);
    }
    return digits;
}

/* The string body [from, to) decoded as jinja2 does: Python's unicode-escape over
 * the text with every non-ASCII character first written as a \x/\u/\U escape
 * (so a backslash before one keeps that escape as text). */
static void lex_string_value(jt_lexer *L, jt_token *t, size_t from, size_t to)
{
    jt_buf b = {0};
    for (size_t i = from; i < to;) {
        if (L->s[i] != '\\') {
            size_t at = i;
            jt_utf8_next(L->s, to, &i);
            jt_buf_put(L->c, &b, L->s + at, i - at);
            continue;
        }
        size_t at = i++;   /* the regex guarantees a character after a backslash */
        char e = L->s[i];
        uint32_t cp = 0;
        int k;
        switch (e) {
        case '\n': i++; continue;
        case '\\': case '\'': case '"': jt_buf_putc(L->c, &b, e); i++; continue;
        case 'a': jt_buf_putc(L->c, &b, '\a'); i++; continue;
        case 'b': jt_buf_putc(L->c, &b, '\b'); i++; continue;
        case 'f': jt_buf_putc(L->c, &b, '\f'); i++; continue;
        case 'n': jt_buf_putc(L->c, &b, '\n'); i++; continue;
        case 'r': jt_buf_putc(L->c, &b, '\r'); i++; continue;
        case 't': jt_buf_putc(L->c, &b, '\t'); i++; continue;
        case 'v': jt_buf_putc(L->c, &b, '\v'); i++; continue;
        case 'x': case 'u': case 'U':
            k = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            if (lex_hex(L, i + 1, k, &cp) != k)
                jt_fail(L->c, at, "(unicode error) truncated \\%c escape in a string", e);
            if (cp > 0x10FFFF) jt_fail(L->c, at, "(unicode error) illegal Unicode character in a string");
            if (cp >= 0xD800 && cp <= 0xDFFF)
                jt_fail(L->c, at, "a lone surrogate \\%c%0*x in a string (not UTF-8)", e, k, cp);
            jt_buf_put_cp(L->c, &b, cp);
            i += 1 + (size_t)k;
            continue;
        case 'N': jt_fail(L->c, at, "the \\N{...} escape is not supported");
        default: break;
        }
        if (e >= '0' && e <= '7') {
            for (k = 0; k < 3 && i < to && L->s[i] >= '0' && L->s[i] <= '7'; k++, i++) cp = cp * 8 + (uint32_t)(L->s[i] - '0');
            jt_buf_put_cp(L->c, &b, cp);
        } else if ((unsigned char)e >= 0x80) {
            cp = jt_utf8_next(L->s, to, &i);
            jt_buf_printf(L->c, &b, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
        } else {
            jt_buf_putc(L->c, &b, '\\');   /* an unknown escape stays as written */
        }
    }
    t->s = b.p ? b.p : "";
    t->n = b.n;
}

/* Tokens of one {{ }} or {% %} from i; returns where the tag ended (n when the
 * source ended first). */
static size_t lex_tag(jt_lexer *L, size_t i, bool block)
{
    char stack[CT_CHAT_MAX_DEPTH];
    int depth = 0;
    static const char *two[] = {"//", "**", "==", "!=", ">=", "<="};
    while (i < L->n) {
        size_t end = depth ? 0 : lex_tag_end(L, i, block ? "%}" : "}}", block);
        if (end) {
            lex_emit(L, block ? JT_TOK_BLOCK_END : JT_TOK_VAR_END, i, L->s + i, end - i);
            L->line_starting = L->s[end - 1] == '\n';
            return end;
        }
        size_t j = lex_skip_space(L, i), k;
        if (j > i) { i = j; continue; }
        if ((k = lex_float(L, i)) > i) {
            char num[64];
            size_t m = 0;
            for (size_t p = i; p < k && m + 1 < sizeof num; p++)
                if (L->s[p] != '_') num[m++] = L->s[p];
            num[m] = 0;
            lex_emit(L, JT_TOK_FLOAT, i, L->s + i, k - i)->f = strtod(num, NULL);
            i = k;
            continue;
        }
        long long iv;
        if ((k = lex_int(L, i, &iv)) > i) {
            lex_emit(L, JT_TOK_INT, i, L->s + i, k - i)->i = iv;
            i = k;
            continue;
        }
        size_t p = i;
        uint32_t cp = jt_utf8_next(L->s, L->n, &p);
        if (lex_ident_char(cp)) {
            if (!lex_ident_start(cp)) jt_fail(L->c, i, "invalid character in identifier");
            for (k = p; k < L->n;) {
                size_t q = k;
                if (!lex_ident_char(jt_utf8_next(L->s, L->n, &q))) break;
                k = q;
            }
            lex_emit(L, JT_TOK_NAME, i, L->s + i, k - i);
            i = k;
            continue;
        }
        if (cp == '\'' || cp == '"') {
            for (k = i + 1; k < L->n && L->s[k] != (char)cp; k++)
                if (L->s[k] == '\\') k++;
            if (k >= L->n) jt_fail(L->c, i, "unterminated string");
            lex_string_value(L, lex_emit(L, JT_TOK_STRING, i, NULL, 0), i + 1, k);
            i = k + 1;
            continue;
        }
        size_t op_len = 0;
        for (size_t t = 0; t < sizeof two / sizeof *two && !op_len; t++)
            if (lex_at(L, i, two[t])) op_len = 2;
        if (!op_len && strchr("+-/*%~[](){}><=.:|,;", (int)cp) && cp) op_len = 1;
        if (!op_len) {
            char shown[8] = {0};
            memcpy(shown, L->s + i, p - i);
            jt_fail(L->c, i, "unexpected char '%s'", shown);
        }
        char ch = L->s[i];
        if (op_len == 1 && (ch == '(' || ch == '[' || ch == '{')) {
            if (depth == CT_CHAT_MAX_DEPTH) jt_fail(L->c, i, "brackets nested deeper than %d", CT_CHAT_MAX_DEPTH);
            stack[depth++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
        } else if (op_len == 1 && (ch == ')' || ch == ']' || ch == '}')) {
            if (!depth) jt_fail(L->c, i, "unexpected '%c'", ch);
            if (stack[--depth] != ch) jt_fail(L->c, i, "unexpected '%c', expected '%c'", ch, stack[depth]);
        }
        lex_emit(L, JT_TOK_OP, i, L->s + i, op_len);
        i += op_len;
    }
    return i;
}

/* "{% raw %}" (with optional signs) at i: returns its end, or 0 when i holds another tag. */
static size_t lex_raw_begin(const jt_lexer *L, size_t i)
{
    if (!lex_at(L, i, "{%")) return 0;
    i += 2;
    if (i < L->n && (L->s[i] == '-' || L->s[i] == '+')) i++;
    i = lex_skip_space(L, i);
    if (!lex_at(L, i, "raw")) return 0;
    i = lex_skip_space(L, i + 3);
    if (lex_at(L, i, "-%}")) return lex_skip_space(L, i + 3);
    return lex_at(L, i, "%}") ? i + 2 : 0;
}

/* The raw block's content from i: emitted as data; returns the end of its endraw. */
static size_t lex_raw(jt_lexer *L, size_t i, size_t opened)
{
    for (size_t q = i; q + 1 < L->n; q++) {
        if (L->s[q] != '{' || L->s[q + 1] != '%') continue;
        size_t p = q + 2;
        char sign = p < L->n && (L->s[p] == '-' || L->s[p] == '+') ? L->s[p] : 0;
        p = lex_skip_space(L, p + (sign != 0));
        if (!lex_at(L, p, "endraw")) continue;
        p = lex_skip_space(L, p + 6);
        size_t end = p < L->n ? lex_tag_end(L, p, "%}", true) : 0;
        if (!end) continue;
        lex_data_before(L, i, q, sign, true);
        L->line_starting = L->s[end - 1] == '\n';
        return end;
    }
    jt_fail(L->c, opened, "missing end of raw directive ({%% endraw %%})");
}

jt_token *jt_lex(jt_ctx *c, size_t *n_tokens)
{
    jt_lexer L = {.c = c, .s = c->src, .n = c->src_len, .line_starting = true};
    size_t pos = 0;
    while (pos < L.n) {
        size_t at = pos;
        while (at + 1 < L.n && !(L.s[at] == '{' && (L.s[at + 1] == '%' || L.s[at + 1] == '{' || L.s[at + 1] == '#'))) at++;
        if (at + 1 >= L.n) {
            lex_emit(&L, JT_TOK_DATA, pos, L.s + pos, L.n - pos);
            break;
        }
        char kind = L.s[at + 1];
        size_t p = at + 2;
        char sign = p < L.n && (L.s[p] == '-' || L.s[p] == '+') ? L.s[p] : 0;
        p += sign != 0;
        lex_data_before(&L, pos, at, sign, kind != '{');
        L.line_starting = false;
        size_t raw = kind == '%' ? lex_raw_begin(&L, at) : 0;
        if (raw) {
            L.line_starting = L.s[raw - 1] == '\n';
            pos = lex_raw(&L, raw, at);
        } else if (kind == '#') {
            size_t end = 0;
            for (size_t q = p; q < L.n && !end; q++) end = lex_tag_end(&L, q, "#}", true);
            if (!end) jt_fail(c, at, "missing end of comment tag (#})");
            L.line_starting = L.s[end - 1] == '\n';
            pos = end;
        } else {
            lex_emit(&L, kind == '%' ? JT_TOK_BLOCK_BEGIN : JT_TOK_VAR_BEGIN, at, L.s + at, p - at);
            pos = lex_tag(&L, p, kind == '%');
        }
    }
    lex_emit(&L, JT_TOK_EOF, L.n, L.s + L.n, 0);
    *n_tokens = L.len;
    return L.toks;
}
