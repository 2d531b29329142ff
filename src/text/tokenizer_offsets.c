/* tokenizer_offsets.c — tokenizer_encode_offsets (tokenizer_offsets.h has the
 * contract). The ids come from tokenizer_encode; this file only places them:
 *   1. the text is cut at the added tokens matched on the raw text (the
 *      normalized = false ones): each such id is found at or after the cursor,
 *      widened by its lstrip / rstrip whitespace;
 *   2. each gap between them is normalized again, here with alignments (the
 *      source span of every normalized byte), and cut at the normalized = true
 *      added tokens;
 *   3. the ids of each remaining piece are matched one after another along its
 *      normalized text (match_token undoes what the pre-tokenizers and the
 *      model did to a token's string).
 * A gap the normalizers leave unchanged (the usual case) needs no alignment
 * arrays: its spans are its offsets. */
#include "tokenizer_offsets.h"
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

void ct_spans_free(ct_spans *s)
{
    free(s->data);
    memset(s, 0, sizeof *s);
}

static void spans_push(ct_spans *s, size_t a, size_t b)
{
    if (s->len == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->data = ct_realloc(s->data, 2 * s->cap * sizeof *s->data);
    }
    s->data[2 * s->len] = a;
    s->data[2 * s->len + 1] = b;
    s->len++;
}

/* A text with the source span of each of its bytes (lo, hi NULL: identity,
 * byte i comes from base + i). */
typedef struct aligned {
    tk_buf text;
    size_t *lo, *hi, cap;
    size_t base;
} aligned;

static void aligned_reserve(aligned *a, size_t n)
{
    tk_buf_reserve(&a->text, n - a->text.len);
    if (n <= a->cap) return;
    a->cap = n > 2 * a->cap ? n : 2 * a->cap;
    a->lo = ct_realloc(a->lo, a->cap * sizeof *a->lo);
    a->hi = ct_realloc(a->hi, a->cap * sizeof *a->hi);
}

static void aligned_put(aligned *a, const char *s, size_t n, size_t lo, size_t hi)
{
    aligned_reserve(a, a->text.len + n);
    for (size_t i = 0; i < n; i++) {
        a->lo[a->text.len + i] = lo;
        a->hi[a->text.len + i] = hi;
    }
    tk_buf_put(&a->text, s, n);
}

static void aligned_free(aligned *a)
{
    tk_buf_free(&a->text);
    free(a->lo);
    free(a->hi);
}

typedef struct walk {
    const ct_tokenizer *t;
    bool parse_special;
    const char *text;
    size_t len;
    const uint32_t *ids;
    size_t n, k;                 /* the ids to place; the next one */
    ct_spans *spans;
    tk_matcher m;
    aligned norm, tmp;           /* the normalized gap; a stage's scratch */
    tk_buf check;
    bool bytelevel, prefix_space, metaspace, meta_prepend;
    const tk_pattern *removed[8];  /* the patterns of Removed splits */
    size_t n_removed;
    tk_spans drop;               /* their matches in the piece being walked */
    const char *rep;             /* Metaspace's replacement character */
    size_t rep_len;
    ct_error *err;
} walk;

static bool continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

static size_t char_end(const char *s, size_t n, size_t i)
{
    i++;
    while (i < n && continuation((unsigned char)s[i])) i++;
    return i;
}

static bool is_ws_at(const char *s, size_t n, size_t i, size_t *next)
{
    size_t k;
    if (i >= n || !tk_is_whitespace(tk_utf8_decode(s + i, &k))) return false;
    *next = i + k;
    return true;
}

static size_t skip_ws_forward(const char *s, size_t n, size_t i)
{
    size_t next;
    while (is_ws_at(s, n, i, &next)) i = next;
    return i;
}

static size_t skip_ws_back(const char *s, size_t i, size_t floor)
{
    while (i > floor) {
        size_t p = i - 1, k;
        while (p > floor && continuation((unsigned char)s[p])) p--;
        if (!tk_is_whitespace(tk_utf8_decode(s + p, &k))) break;
        i = p;
    }
    return i;
}

static int fail(walk *w, size_t at, const char *what)
{
    size_t n;
    const char *s = tokenizer_id_to_token(w->t, w->ids[w->k], &n);
    return CT_FAIL_INPUT(w->err, "token %zu (id %u, '%.*s') %s at byte %zu of the text; its offsets are unknown",
                         w->k, w->ids[w->k], s ? (int)(n < 40 ? n : 40) : 0, s ? s : "", what, at);
}

// ---- normalizing with alignments ----

/* Source span of byte i of a (lo..hi of the character it belongs to). */
static void span_of(const aligned *a, size_t i, size_t *lo, size_t *hi)
{
    if (a->lo) {
        *lo = a->lo[i];
        *hi = a->hi[i];
        return;
    }
    size_t s = i;
    while (s > 0 && continuation((unsigned char)a->text.data[s])) s--;
    *lo = a->base + s;
    *hi = a->base + char_end(a->text.data, a->text.len, s);
}

/* Gives a identity spans made explicit, so a stage can rewrite them. */
static void make_explicit(aligned *a)
{
    if (a->lo) return;
    size_t n = a->text.len;
    a->cap = n ? n : 1;
    a->lo = ct_malloc(a->cap * sizeof *a->lo);
    a->hi = ct_malloc(a->cap * sizeof *a->hi);
    for (size_t i = 0; i < n;) {
        size_t e = char_end(a->text.data, n, i);
        for (size_t j = i; j < e; j++) {
            a->lo[j] = a->base + i;
            a->hi[j] = a->base + e;
        }
        i = e;
    }
}

/* out += in[s..e) with its spans. */
static void copy_range(aligned *out, const aligned *in, size_t s, size_t e)
{
    aligned_reserve(out, out->text.len + (e - s));
    memcpy(out->lo + out->text.len, in->lo + s, (e - s) * sizeof *in->lo);
    memcpy(out->hi + out->text.len, in->hi + s, (e - s) * sizeof *in->hi);
    tk_buf_put(&out->text, in->text.data + s, e - s);
}

/* out += text, every byte spanning in[s..e) (at least one byte of in). */
static void put_block(aligned *out, const aligned *in, size_t s, size_t e, const char *text, size_t n)
{
    size_t lo = in->lo[s], hi = in->hi[e - 1];
    for (size_t i = s; i < e; i++) {
        if (in->lo[i] < lo) lo = in->lo[i];
        if (in->hi[i] > hi) hi = in->hi[i];
    }
    aligned_put(out, text, n, lo, hi);
}

/* Appends nf, the normal form of in[ms..me), aligned as HF's transform aligns
 * it: each output character to the input character that first produced its
 * position when the input is normalized one more character at a time (so a
 * composed character takes its first source, a decomposed one's parts all take
 * their source). Runs longer than ALIGN_MAX_CHARS are aligned as a block. */
#define ALIGN_MAX_CHARS 32
static void align_changed(aligned *out, const aligned *in, size_t ms, size_t me, const char *nf, size_t nl, tk_nf form)
{
    const char *s = in->text.data;
    size_t starts[ALIGN_MAX_CHARS + 1], m = 0, lens[ALIGN_MAX_CHARS];
    for (size_t i = ms; i < me && m <= ALIGN_MAX_CHARS; i = char_end(s, me, i)) starts[m++] = i;
    if (m > ALIGN_MAX_CHARS || me == ms) {
        if (me == ms) {   /* a pure insertion: the character before it, as HF's inserted characters */
            size_t p = ms ? ms - 1 : 0;
            aligned_put(out, nf, nl, in->lo[p], in->hi[p]);
        } else {
            put_block(out, in, ms, me, nf, nl);
        }
        return;
    }
    tk_buf b = {0};
    for (size_t j = 0; j < m; j++) {   /* characters in the normal form of the first j + 1 input characters */
        b.len = 0;
        tk_unicode_normalize(form, s + ms, (j + 1 < m ? starts[j + 1] : me) - ms, &b);
        size_t c = 0;
        for (size_t i = 0; i < b.len; i = char_end(b.data, b.len, i)) c++;
        lens[j] = c;
    }
    tk_buf_free(&b);
    size_t x = 0, j = 0;
    for (size_t i = 0; i < nl; x++) {
        size_t e = char_end(nf, nl, i);
        while (j + 1 < m && lens[j] <= x) j++;
        aligned_put(out, nf + i, e - i, in->lo[starts[j]], in->hi[starts[j]]);
        i = e;
    }
}

/* A Unicode normal form, run by run: every ASCII character starts a run (none
 * composes with what precedes it, and its normal form is itself), so the
 * runs normalize independently. A run that changes keeps its common first and
 * last characters; align_changed aligns the rest. */
static void stage_nf(walk *w, tk_nf form, const aligned *in, aligned *out)
{
    const char *s = in->text.data;
    size_t n = in->text.len;
    tk_buf nf = {0};
    for (size_t a = 0; a < n;) {
        size_t b = char_end(s, n, a);
        while (b < n && (unsigned char)s[b] >= 0x80) b = char_end(s, n, b);
        nf.len = 0;
        tk_unicode_normalize(form, s + a, b - a, &nf);
        if (nf.len == b - a && !memcmp(nf.data, s + a, nf.len)) {
            copy_range(out, in, a, b);
            a = b;
            continue;
        }
        size_t p = 0, q = 0;   /* common prefix (in, nf), in characters */
        while (a + p < b && q < nf.len) {
            size_t e = char_end(s + a, b - a, p) - p;
            if (q + e > nf.len || memcmp(s + a + p, nf.data + q, e)) break;
            p += e;
            q += e;
        }
        size_t sa = b, sn = nf.len;   /* common suffix, not into the prefix */
        while (sa > a + p && sn > q) {
            size_t c = sa - 1, d;
            while (c > a + p && continuation((unsigned char)s[c])) c--;
            if (sa - c > sn - q) break;
            d = sn - (sa - c);
            if (memcmp(s + c, nf.data + d, sa - c)) break;
            sa = c;
            sn = d;
        }
        copy_range(out, in, a, a + p);
        if (sn > q) align_changed(out, in, a + p, sa, nf.data + q, sn - q, form);
        copy_range(out, in, sa, b);
        a = b;
    }
    tk_buf_free(&nf);
}

/* Replace: HF removes the match and inserts the content, so every content
 * character takes the span of the match's last character (of the character
 * before an empty match). */
static int stage_replace(walk *w, const tk_normalizer *z, const aligned *in, aligned *out)
{
    tk_spans m = {0};
    int rc = tk_pattern_find_all(&z->pattern, &w->m, in->text.data, in->text.len, &m, w->t->source, w->err);
    size_t prev = 0, n = in->text.len;
    for (size_t i = 0; rc == CT_OK && i < m.len; i += 2) {
        size_t ms = m.v[i], me = m.v[i + 1];
        copy_range(out, in, prev, ms);
        size_t at = me > ms ? me - 1 : ms ? ms - 1 : 0;
        if (n) aligned_put(out, z->str, z->str_len, in->lo[at], in->hi[at]);
        else aligned_put(out, z->str, z->str_len, in->base, in->base);
        prev = me;
    }
    if (rc == CT_OK) copy_range(out, in, prev, n);
    free(m.v);
    return rc;
}

/* w->norm = text[gs..ge) through the normalizers, with alignments when they change it. */
static int normalize_gap(walk *w, size_t gs, size_t ge)
{
    const ct_tokenizer *t = w->t;
    aligned *a = &w->norm, *b = &w->tmp;
    a->text.len = 0;
    tk_buf_put(&a->text, w->text + gs, ge - gs);
    free(a->lo);
    free(a->hi);
    a->lo = a->hi = NULL;
    a->cap = 0;
    a->base = gs;
    if (t->n_norm == 0 || ge == gs) return CT_OK;
    w->check.len = 0;
    int rc = tk_normalize(t, &w->m, w->text + gs, ge - gs, &w->check, w->err);
    if (rc) return rc;
    if (w->check.len == ge - gs && !memcmp(w->check.data, w->text + gs, ge - gs)) return CT_OK;
    make_explicit(a);
    for (size_t i = 0; i < t->n_norm && rc == CT_OK; i++) {
        const tk_normalizer *z = &t->norm[i];
        b->text.len = 0;
        make_explicit(b);
        switch (z->type) {
        case TK_NORM_NF: stage_nf(w, z->nf, a, b); break;
        case TK_NORM_PREPEND:
            if (a->text.len) aligned_put(b, z->str, z->str_len, a->lo[0], a->hi[0]);
            copy_range(b, a, 0, a->text.len);
            break;
        case TK_NORM_REPLACE: rc = stage_replace(w, z, a, b); break;
        }
        aligned t2 = *a;
        *a = *b;
        *b = t2;
    }
    if (rc == CT_OK && (a->text.len != w->check.len || memcmp(a->text.data, w->check.data, a->text.len)))
        rc = CT_FAIL_INPUT(w->err, "the normalizers of %s rewrite the text at bytes %zu..%zu in a way the offsets "
                           "cannot follow", t->source, gs, ge);
    return rc;
}

/* Pushes the source span of normalized bytes [s, e) (e > s), widened to whole characters. */
static void push_norm_span(walk *w, size_t s, size_t e)
{
    const aligned *a = &w->norm;
    size_t lo, hi, l2, h2;
    span_of(a, s, &lo, &hi);
    span_of(a, e - 1, &l2, &h2);
    if (a->lo)
        for (size_t i = s; i < e; i++) {
            if (a->lo[i] < lo) lo = a->lo[i];
            if (a->hi[i] > h2) h2 = a->hi[i];
        }
    spans_push(w->spans, lo, h2 > hi ? h2 : hi);
}

// ---- matching one token ----

/* The text offset that normalized byte p comes from, for messages. */
static size_t raw_at(const walk *w, size_t p)
{
    if (!w->norm.lo) return w->norm.base + p;
    return p < w->norm.text.len ? w->norm.lo[p] : w->norm.text.len ? w->norm.hi[w->norm.text.len - 1] : w->norm.base;
}

/* Matches token string s[0..sl) at norm[p..b): *end gets where it stops. A
 * leading space the pre-tokenizer put in (ByteLevel's prefix space, Metaspace's
 * prepend) matches nothing. */
static bool match_string(const walk *w, const char *s, size_t sl, const char *nt, size_t p, size_t b, size_t *end)
{
    for (size_t i = 0; i < sl;) {
        size_t cl;
        uint32_t c = tk_utf8_decode(s + i, &cl);
        bool first = i == 0;
        i += cl;
        if (w->bytelevel) {
            int byte = tk_cp_to_byte(c);
            if (byte >= 0) {
                if (p < b && (unsigned char)nt[p] == byte) p++;
                else if (!(first && byte == ' ' && w->prefix_space)) return false;
                continue;
            }
        }
        if (w->metaspace && cl == w->rep_len && !memcmp(s + i - cl, w->rep, cl)) {
            if (p < b && nt[p] == ' ') p++;
            else if (b - p >= cl && !memcmp(nt + p, w->rep, cl)) p += cl;
            else if (!(first && w->meta_prepend)) return false;
            continue;
        }
        if (b - p < cl || memcmp(nt + p, s + i - cl, cl)) return false;
        p += cl;
    }
    *end = p;
    return true;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Places token id at norm[*p..b): its normalized bytes [*s, *e) (empty for a
 * token that is only an inserted space) and the new *p. */
static bool match_token(const walk *w, uint32_t id, size_t *p, size_t b, size_t *s, size_t *e)
{
    const tk_bpe *bpe = &w->t->bpe;
    const char *nt = w->norm.text.data;
    size_t sl;
    const char *str = tokenizer_id_to_token(w->t, id, &sl);
    if (!str) return false;
    if (bpe->byte_fallback && sl == 6 && !memcmp(str, "<0x", 3) && str[5] == '>' && hexval(str[3]) >= 0 &&
        hexval(str[4]) >= 0) {
        unsigned char byte = (unsigned char)(hexval(str[3]) * 16 + hexval(str[4]));
        if (*p < b && (unsigned char)nt[*p] == byte) {
            *s = *p;
            *e = ++*p;
            return true;
        }
    }
    if (bpe->has_unk && id == bpe->unk_id && *p < b) {
        *s = *p;
        *e = *p = char_end(nt, b, *p);
        return true;
    }
    /* the string as the model wrote it, then without its subword affixes */
    for (int strip = 0; strip < 2; strip++) {
        const char *q = str;
        size_t ql = sl;
        if (strip) {
            bool pre = bpe->prefix && ql >= bpe->prefix_len && !memcmp(q, bpe->prefix, bpe->prefix_len);
            if (pre) { q += bpe->prefix_len; ql -= bpe->prefix_len; }
            bool suf = bpe->suffix && ql >= bpe->suffix_len && !memcmp(q + ql - bpe->suffix_len, bpe->suffix, bpe->suffix_len);
            if (suf) ql -= bpe->suffix_len;
            if (!pre && !suf) break;
        }
        size_t end;
        if (ql && match_string(w, q, ql, nt, *p, b, &end)) {
            *s = *p;
            *e = *p = end;
            return true;
        }
    }
    return false;
}

/* w->drop = what the Removed splits take out of norm[a..b), in order. */
static int find_dropped(walk *w, size_t a, size_t b)
{
    w->drop.len = 0;
    for (size_t i = 0; i < w->n_removed; i++) {
        tk_spans m = {0};
        int rc = tk_pattern_find_all(w->removed[i], &w->m, w->norm.text.data + a, b - a, &m, w->t->source, w->err);
        for (size_t j = 0; rc == CT_OK && j < m.len; j += 2) tk_spans_push(&w->drop, a + m.v[j], a + m.v[j + 1]);
        free(m.v);
        if (rc) return rc;
    }
    return CT_OK;
}

/* p moved past any dropped text that starts at it. */
static size_t skip_dropped(const walk *w, size_t p)
{
    for (bool moved = true; moved;) {
        moved = false;
        for (size_t i = 0; i < w->drop.len; i += 2)
            if (w->drop.v[i] <= p && w->drop.v[i + 1] > p) {
                p = w->drop.v[i + 1];
                moved = true;
            }
    }
    return p;
}

/* Places ids [w->k, stop) along norm[p..b), then checks nothing is left but
 * what a Removed split dropped. */
static int walk_piece(walk *w, size_t p, size_t b, size_t stop)
{
    const char *nt = w->norm.text.data;
    int rc = w->n_removed ? find_dropped(w, p, b) : CT_OK;
    for (; rc == CT_OK && w->k < stop; w->k++) {
        p = skip_dropped(w, p);
        size_t s, e, q = p;
        if (!match_token(w, w->ids[w->k], &q, b, &s, &e)) return fail(w, raw_at(w, p), "does not match the text");
        if (e > s) push_norm_span(w, s, e);
        else if (s < b) push_norm_span(w, s, char_end(nt, b, s));
        else return fail(w, raw_at(w, p), "is an inserted space at the end of a piece");
        p = q;
    }
    if (rc) return rc;
    p = skip_dropped(w, p);
    if (p < b)
        return CT_FAIL_INPUT(w->err, "the text at byte %zu has no token (after token %zu); its offsets are unknown",
                             raw_at(w, p), w->k);
    return CT_OK;
}

/* The added token of id (NULL: a token of the model). */
static const tk_added *added_of(const walk *w, uint32_t id)
{
    int32_t a = id < w->t->vocab_size ? w->t->added_of_id[id] : -1;
    if (a < 0) return NULL;
    const tk_added *tok = &w->t->added[a];
    return tok->special && !w->parse_special ? NULL : tok;
}

/* An added token that is also the model's unk token: either encode matched it
 * in the text, or the model made it from text it cannot spell. */
static bool maybe_unk(const walk *w, size_t j)
{
    return w->t->bpe.has_unk && w->ids[j] == w->t->bpe.unk_id;
}

/* The next id in [from, stop) that is an added token of the given pass. */
static size_t next_added(const walk *w, size_t from, size_t stop, bool normalized)
{
    for (size_t j = from; j < stop; j++) {
        const tk_added *a = added_of(w, w->ids[j]);
        if (a && a->normalized == normalized) return j;
    }
    return stop;
}

static bool word_char_at(walk *w, const char *s, size_t n, size_t pos)
{
    return tk_regex_matches_at(w->t->word_char, &w->m, s, n, pos);
}

/* Finds added token a in s[from..n) where encode would match it (a
 * single_word token not touching a word character): *start / *stop its span
 * with the whitespace its lstrip / rstrip take. */
static bool find_added(walk *w, const tk_added *a, bool normalized, const char *s, size_t n, size_t from,
                       size_t *start, size_t *stop)
{
    const char *form = normalized ? a->form : a->content;
    size_t fl = normalized ? a->form_len : a->content_len, pos;
    for (size_t at = from;; at = pos + 1) {
        const char *hit = fl && n - at >= fl ? memmem(s + at, n - at, form, fl) : NULL;
        if (!hit) return false;
        pos = (size_t)(hit - s);
        if (!a->single_word) break;
        size_t before = pos;
        while (before > 0 && continuation((unsigned char)s[before - 1])) before--;
        if (before > 0) {
            before--;
            while (before > 0 && continuation((unsigned char)s[before])) before--;
        }
        if ((pos == 0 || !word_char_at(w, s, n, before)) && (pos + fl == n || !word_char_at(w, s, n, pos + fl))) break;
    }
    *start = a->lstrip ? skip_ws_back(s, pos, from) : pos;
    *stop = a->rstrip ? skip_ws_forward(s, n, pos + fl) : pos + fl;
    return true;
}

/* The ids [w->k, stop) of the raw gap text[gs..ge). */
static int walk_gap(walk *w, size_t gs, size_t ge, size_t stop)
{
    int rc = normalize_gap(w, gs, ge);
    const char *nt = w->norm.text.data;
    size_t n = w->norm.text.len, cur = 0;
    while (rc == CT_OK) {
        size_t j = next_added(w, w->k, stop, true), s = n, e = n;
        if (j < stop && !find_added(w, added_of(w, w->ids[j]), true, nt, n, cur, &s, &e)) {
            w->k = j;
            return fail(w, gs, "is not in the normalized text");
        }
        rc = walk_piece(w, cur, s, j);
        if (rc || j == stop) break;
        if (e > s) push_norm_span(w, s, e);
        else spans_push(w->spans, w->norm.base + s, w->norm.base + s);
        w->k = j + 1;
        cur = e;
    }
    return rc;
}

static bool valid_utf8(const char *s, size_t n)
{
    tk_buf b = {0};
    tk_utf8_sanitize(&b, s, n);
    bool same = b.len == n && (n == 0 || !memcmp(b.data, s, n));
    tk_buf_free(&b);
    return same;
}

int tokenizer_encode_offsets(const ct_tokenizer *t, const char *text, size_t len, bool parse_special,
                             ct_ids *ids, ct_spans *spans, ct_error *err)
{
    if (!valid_utf8(text, len)) return CT_FAIL_INPUT(err, "the text is not valid UTF-8, so its token offsets are unknown");
    size_t first = ids->len;
    int rc = tokenizer_encode(t, text, len, parse_special, ids, err);
    if (rc) return rc;
    walk w = {.t = t, .parse_special = parse_special, .text = text, .len = len, .ids = ids->data + first,
              .n = ids->len - first, .spans = spans, .err = err};
    for (size_t i = 0; i < t->n_pre; i++) {
        const tk_pretokenizer *p = &t->pre[i];
        if (p->type == TK_PRE_BYTELEVEL) {
            w.bytelevel = true;
            w.prefix_space |= p->add_prefix_space;
        } else if (p->type == TK_PRE_METASPACE) {
            w.metaspace = true;
            w.meta_prepend = p->prepend != TK_PREPEND_NEVER;
            w.rep = p->replacement;
            w.rep_len = p->replacement_len;
        } else if (p->behavior == TK_SPLIT_REMOVED && !p->invert && w.n_removed < 8) {
            w.removed[w.n_removed++] = &p->pattern;
        }
    }
    tk_matcher_init(&w.m);
    size_t cur = 0, from = 0;
    while (rc == CT_OK) {
        size_t j = next_added(&w, from, w.n, false), s = len, e = len;
        if (j < w.n && !find_added(&w, added_of(&w, w.ids[j]), false, text, len, cur, &s, &e)) {
            if (maybe_unk(&w, j)) {
                from = j + 1;
                continue;
            }
            w.k = j;
            rc = fail(&w, cur, "is not in the text");
            break;
        }
        size_t mark_spans = spans->len, mark_k = w.k;
        rc = walk_gap(&w, cur, s, j);
        if (rc && j < w.n && maybe_unk(&w, j)) {   /* then the model made it: walk on past it */
            spans->len = mark_spans;
            w.k = mark_k;
            from = j + 1;
            rc = err->code = CT_OK;
            continue;
        }
        if (rc || j == w.n) break;
        spans_push(spans, s, e);
        w.k = from = j + 1;
        cur = e;
    }
    free(w.drop.v);
    tk_matcher_free(&w.m);
    aligned_free(&w.norm);
    aligned_free(&w.tmp);
    tk_buf_free(&w.check);
    return rc;
}
