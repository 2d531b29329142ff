/* tokenizer_text.c — text primitives of the tokenizer: byte buffers, UTF-8
 * (decoding, and the U+FFFD replacement of ill-formed input), PCRE2 patterns
 * and Unicode normalization (utf8proc).
 *
 * HF compiles every tokenizer.json regex with Oniguruma. PCRE2 (UTF + UCP)
 * agrees with it on the constructs tokenizers use (\p{..} categories, (?i:..),
 * lookahead, counted repeats), except for a few escapes, which are rewritten
 * before compiling (measured against tokenizers 0.23 in tests/test_tokenizer.c):
 *   \s  Oniguruma: White_Space (U+0085 in, U+180E out); PCRE2 UCP also takes U+180E
 *   \w  Oniguruma: alphabetic, marks, Nd, Pc and Latin-1's superscripts and
 *       fractions; PCRE2 10.42: letters, all numbers and '_'
 *   \h  Oniguruma: a hex digit; PCRE2: horizontal space
 *   ^ $ Oniguruma: line anchors (PCRE2_MULTILINE)
 * \S, \W and \H inside a character class keep PCRE2's meaning. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

// ---- buffers ----

void tk_buf_reserve(tk_buf *b, size_t extra)
{
    size_t need;
    CT_ASSERT(ct_size_add(b->len, extra, &need), "tokenizer buffer size overflow");
    if (need <= b->cap && b->data) return;   /* allocated even when empty: offsets into it stay valid C */
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    b->data = ct_realloc(b->data, cap);
    b->cap = cap;
}

void tk_buf_put(tk_buf *b, const char *s, size_t n)
{
    tk_buf_reserve(b, n);
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
}

void tk_buf_free(tk_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

void tk_spans_push(tk_spans *s, size_t a, size_t b)
{
    if (s->len + 2 > s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = ct_realloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->len++] = a;
    s->v[s->len++] = b;
}

// ---- UTF-8 ----

uint32_t tk_utf8_decode(const char *s, size_t *n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) { *n = 1; return u[0]; }
    if (u[0] < 0xE0) { *n = 2; return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F); }
    if (u[0] < 0xF0) { *n = 3; return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F); }
    *n = 4;
    return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 | (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
}

/* How many bytes of a well-formed sequence start at s[0..n): its length when
 * complete, else minus the length of its maximal ill-formed subpart (>= 1).
 * The second byte's range depends on the first (Unicode Table 3-7), which
 * excludes overlong forms, surrogates and code points past U+10FFFF. */
static long utf8_sequence(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return -1;
    for (size_t k = 1; k < need; k++) {
        if (k >= n || s[k] < lo || s[k] > hi) return -(long)k;
        lo = 0x80, hi = 0xBF;
    }
    return (long)need;
}

void tk_utf8_sanitize(tk_buf *b, const char *s, size_t n)
{
    tk_buf_reserve(b, n);
    if (n == 0) return;   /* s may be NULL then */
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;   /* s[run..i) is well-formed and not yet copied */
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        long k = utf8_sequence(u + i, n - i);
        if (k > 0) { i += (size_t)k; continue; }
        tk_buf_put(b, s + run, i - run);
        tk_buf_put(b, TK_REPLACEMENT, 3);
        i += (size_t)-k;
        run = i;
    }
    tk_buf_put(b, s + run, i - run);
}

void tokenizer_utf8_lossy(const char *s, size_t n, char **text, size_t *len)
{
    tk_buf b = {0};
    tk_utf8_sanitize(&b, s, n);
    tk_buf_put(&b, "", 1);
    *text = b.data;
    *len = b.len - 1;
}

bool tk_is_whitespace(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// ---- patterns ----

/* Oniguruma's \w, measured over every code point: alphabetic, marks, decimal
 * digits, connector punctuation, and from Latin-1 also the superscripts and
 * fractions (its single-byte tables), not the other No characters. */
#define ONIG_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"

/* Rewrites an Oniguruma regex for PCRE2 (see the header comment). */
static void onig_to_pcre2(const char *re, size_t n, tk_buf *out)
{
    static const char *const outside[][2] = {
        {"s", "[\\t-\\r\\x{85}\\p{Z}]"}, {"S", "[^\\t-\\r\\x{85}\\p{Z}]"},
        {"w", "[" ONIG_WORD "]"}, {"W", "[^" ONIG_WORD "]"},
        {"h", "[0-9a-fA-F]"}, {"H", "[^0-9a-fA-F]"},
    };
    static const char *const inside[][2] = {
        {"s", "\\t-\\r\\x{85}\\p{Z}"}, {"w", ONIG_WORD}, {"h", "0-9a-fA-F"},
    };
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char d = re[++i];
            const char *rep = NULL;
            size_t count = in_class ? sizeof inside / sizeof *inside : sizeof outside / sizeof *outside;
            for (size_t k = 0; k < count && !rep; k++) {
                const char *const *row = in_class ? inside[k] : outside[k];
                if (row[0][0] == d) rep = row[1];
            }
            if (rep) tk_buf_put(out, rep, strlen(rep));
            else { tk_buf_put(out, "\\", 1); tk_buf_put(out, &d, 1); }
            continue;
        }
        tk_buf_put(out, &c, 1);
        if (!in_class && c == '[') {
            in_class = true;
            /* a ']' first in the class (after an optional '^') is a literal */
            if (i + 1 < n && re[i + 1] == '^') tk_buf_put(out, &re[++i], 1);
            if (i + 1 < n && re[i + 1] == ']') tk_buf_put(out, &re[++i], 1);
        } else if (in_class && c == '[' && i + 1 < n && re[i + 1] == ':') {
            const char *end = memchr(re + i, ']', n - i);   /* a POSIX class [:alpha:] */
            if (end) {
                tk_buf_put(out, re + i + 1, (size_t)(end - re) - i);
                i = (size_t)(end - re);
            }
        } else if (in_class && c == ']') {
            in_class = false;
        }
    }
}

static int compile(tk_pattern *p, const char *re, size_t len, uint32_t options, const char *src,
                   const char *field, ct_error *err)
{
    int code;
    PCRE2_SIZE at;
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    p->re = pcre2_compile((PCRE2_SPTR)re, len, options | PCRE2_UTF | PCRE2_UCP, &code, &at, cc);
    pcre2_compile_context_free(cc);
    if (!p->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return CT_FAIL_INPUT(err, "%s: %s: cannot compile the regex: %s (at offset %zu)", src, field,
                             (const char *)msg, (size_t)at);
    }
    /* JIT is an optimisation: without it (or if it fails) pcre2_match interprets */
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE);
    return CT_OK;
}

int tk_pattern_regex(tk_pattern *p, const char *regex, size_t len, const char *src, const char *field,
                     ct_error *err)
{
    memset(p, 0, sizeof *p);
    tk_buf b = {0};
    onig_to_pcre2(regex, len, &b);
    int rc = compile(p, b.data ? b.data : "", b.len, PCRE2_MULTILINE, src, field, err);
    tk_buf_free(&b);
    return rc;
}

int tk_pattern_literal(tk_pattern *p, const char *s, size_t len, const char *src, const char *field,
                       ct_error *err)
{
    memset(p, 0, sizeof *p);
    if (len == 0) return compile(p, "", 0, PCRE2_LITERAL, src, field, err);
    p->literal = ct_malloc(len);
    memcpy(p->literal, s, len);
    p->literal_len = len;
    return CT_OK;
}

void tk_pattern_free(tk_pattern *p)
{
    free(p->literal);
    pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

/* Caps on one match: a regex from an untrusted tokenizer.json that backtracks
 * without end fails the call (an input error) instead of hanging or eating the
 * machine. The tokenizers' own regexes need a few steps per match. */
#define TK_REGEX_MATCH_LIMIT 10000000
#define TK_REGEX_HEAP_KIB 65536

void tk_matcher_init(tk_matcher *m)
{
    m->md = pcre2_match_data_create(1, NULL);
    m->mc = pcre2_match_context_create(NULL);
    CT_ASSERT(m->md && m->mc, "PCRE2 out of memory");
    pcre2_set_match_limit(m->mc, TK_REGEX_MATCH_LIMIT);
    pcre2_set_heap_limit(m->mc, TK_REGEX_HEAP_KIB);
}

void tk_matcher_free(tk_matcher *m)
{
    pcre2_match_data_free(m->md);
    pcre2_match_context_free(m->mc);
}

/* One match at or after pos: 1 found, 0 none, < 0 a PCRE2 error. */
static int match_from(const pcre2_code *re, tk_matcher *m, const char *s, size_t n, size_t pos,
                      uint32_t options, size_t *ms, size_t *me)
{
    options |= PCRE2_NO_UTF_CHECK;
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, options, m->md, m->mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)   /* the interpreter keeps its frames on the heap */
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, options | PCRE2_NO_JIT, m->md, m->mc);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return rc;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

static int regex_error(int rc, const char *src, ct_error *err)
{
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return CT_FAIL_INPUT(err, "%s: a regex failed on this text: %s", src, (const char *)msg);
}

int tk_pattern_find_all(const tk_pattern *p, tk_matcher *m, const char *s, size_t n, tk_spans *spans,
                        const char *src, ct_error *err)
{
    if (n == 0) return CT_OK;   /* HF: an empty string has no match, not even an empty one */
    if (p->literal) {
        for (size_t i = 0; i + p->literal_len <= n;) {
            const char *hit = memmem(s + i, n - i, p->literal, p->literal_len);
            if (!hit) break;
            size_t a = (size_t)(hit - s);
            tk_spans_push(spans, a, a + p->literal_len);
            i = a + p->literal_len;
        }
        return CT_OK;
    }
    bool have_last = false;
    size_t last_end = 0;
    for (size_t pos = 0; pos <= n;) {
        size_t ms, me;
        int rc = match_from(p->re, m, s, n, pos, 0, &ms, &me);
        if (rc == 0) break;
        if (rc < 0) return regex_error(rc, src, err);
        if (ms == me && have_last && last_end == me) {   /* Oniguruma's find_iter: step one character */
            pos += pos < n ? tk_utf8_len((unsigned char)s[pos]) : 1;
            continue;
        }
        pos = me;
        have_last = true;
        last_end = me;
        tk_spans_push(spans, ms, me);
    }
    return CT_OK;
}

bool tk_regex_matches_at(const pcre2_code *re, tk_matcher *m, const char *s, size_t n, size_t pos)
{
    size_t ms, me;
    return match_from(re, m, s, n, pos, PCRE2_ANCHORED, &ms, &me) == 1;
}

int tk_pattern_replace(const tk_pattern *p, tk_matcher *m, const char *s, size_t n, const char *content,
                       size_t content_len, tk_buf *out, const char *src, ct_error *err)
{
    tk_spans spans = {0};
    int rc = tk_pattern_find_all(p, m, s, n, &spans, src, err);
    size_t prev = 0;
    for (size_t i = 0; rc == CT_OK && i < spans.len; i += 2) {
        tk_buf_put(out, s + prev, spans.v[i] - prev);
        tk_buf_put(out, content, content_len);
        prev = spans.v[i + 1];
    }
    if (rc == CT_OK) tk_buf_put(out, s + prev, n - prev);
    free(spans.v);
    return rc;
}

// ---- normalization ----

void tk_unicode_normalize(tk_nf form, const char *s, size_t n, tk_buf *out)
{
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0x80) i++;
    if (i == n) { tk_buf_put(out, s, n); return; }   /* ASCII is in every normal form */
    utf8proc_option_t opt = UTF8PROC_STABLE;
    opt |= form == TK_NF_C || form == TK_NF_KC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
    if (form == TK_NF_KC || form == TK_NF_KD) opt |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t len = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt);
    CT_ASSERT(len >= 0, "utf8proc_map failed on valid UTF-8: %s", utf8proc_errmsg(len));
    tk_buf_put(out, (const char *)dst, (size_t)len);
    free(dst);
}
