/* tokenizer_encode.c — tokenizer_encode: HF's TokenizerImpl::encode with
 * add_special_tokens = false, in its order (tokenizer/mod.rs, added_vocabulary.rs):
 *   1. split on the added tokens with normalized = false, matched on the raw text;
 *   2. normalize each remaining piece, then split on the normalized = true tokens;
 *   3. run each remaining piece through the pre-tokenizers in turn;
 *   4. BPE on each final piece.
 * Every piece's text lives in one buffer used as a stack: a stage appends what
 * it makes, hands each sub-piece to the next stage, and pops its texts when
 * done, so memory stays at the size of one piece's descent, and the ids come
 * out in text order. Pieces are offsets into the buffer (it may move).
 *
 * Added tokens (find_matches in added_vocabulary.rs): leftmost-longest matches,
 * non-overlapping in the raw match positions; a special token when
 * !parse_special, and a single_word token touching a word character (\w of
 * Rust's regex), are passed over (matching resumes after them); lstrip / rstrip
 * widen a kept match over the whitespace beside it (not back past the previous
 * token); the text between matches goes on. As in HF, an rstrip token's
 * whitespace can also be the start of the next token's match. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct tk_piece {
    size_t off, len;
    bool at_start;   /* begins at offset 0 of the original text (Metaspace prepend_scheme "first") */
} tk_piece;

typedef struct tk_ctx {
    const ct_tokenizer *t;
    bool parse_special;
    tk_matcher m;
    tk_buf buf;          /* the stack of piece texts */
    tk_buf norm;         /* one normalized piece before it goes on the stack */
    tk_piece *pieces;    /* a stack too: each stage's sub-pieces */
    size_t n_pieces, cap_pieces;
    tk_spans spans;      /* the matches of one stage, turned into pieces before descending */
    tk_bpe_scratch bpe;
    ct_ids *out;
    ct_error *err;
} tk_ctx;

static int pre_stage(tk_ctx *c, size_t k, size_t off, size_t len, bool at_start);

static void push_piece(tk_ctx *c, size_t off, size_t len, bool at_start)
{
    if (len == 0) return;   /* HF drops empty splits */
    if (c->n_pieces == c->cap_pieces) {
        c->cap_pieces = c->cap_pieces ? c->cap_pieces * 2 : 64;
        c->pieces = ct_realloc(c->pieces, c->cap_pieces * sizeof *c->pieces);
    }
    c->pieces[c->n_pieces++] = (tk_piece){off, len, at_start};
}

/* Hands the sub-pieces [mark, n_pieces) to stage k, then pops them. */
static int descend(tk_ctx *c, size_t k, size_t mark)
{
    size_t end = c->n_pieces;
    int rc = CT_OK;
    for (size_t i = mark; i < end && rc == CT_OK; i++) {
        tk_piece p = c->pieces[i];
        rc = pre_stage(c, k, p.off, p.len, p.at_start);
    }
    c->n_pieces = mark;
    return rc;
}

// ---- Split ----

/* Whether a piece boundary falls between segments a and b (is_match flags), by
 * behavior (split_with_behavior in normalizer.rs, written as boundaries). */
static bool boundary(tk_split_behavior b, bool a_match, bool b_match)
{
    switch (b) {
    case TK_SPLIT_MERGED_PREV: return !(b_match && !a_match);
    case TK_SPLIT_MERGED_NEXT: return !(a_match && !b_match);
    case TK_SPLIT_CONTIGUOUS: return a_match != b_match;
    default: return true;
    }
}

/* The pieces of text[0..len) at off given its matches in c->spans: the gaps
 * and matches are segments, joined or dropped by behavior. */
static void split_segments(tk_ctx *c, size_t off, size_t len, bool at_start, tk_split_behavior behavior,
                           bool invert)
{
    size_t piece_start = 0, prev = 0;
    bool have_seg = false, last_match = false;
    for (size_t i = 0; i <= c->spans.len; i += 2) {
        bool at_end = i == c->spans.len;
        size_t ms = at_end ? len : c->spans.v[i], me = at_end ? len : c->spans.v[i + 1];
        /* the segments: the gap [prev, ms), then the match [ms, me) */
        for (int part = 0; part < 2; part++) {
            size_t a = part ? ms : prev, b = part ? me : ms;
            if (part == 0 && a == b) continue;   /* no gap */
            if (part == 1 && at_end) break;
            bool is_match = (part == 1) != invert;
            bool removed = behavior == TK_SPLIT_REMOVED && is_match;
            if (have_seg && (removed || boundary(behavior, last_match, is_match))) {
                push_piece(c, off + piece_start, a - piece_start, at_start && piece_start == 0);
                piece_start = a;
            }
            if (removed) piece_start = b;   /* a removed match ends the piece and is dropped */
            have_seg = !removed;
            last_match = is_match;
        }
        prev = me;
    }
    if (have_seg) push_piece(c, off + piece_start, len - piece_start, at_start && piece_start == 0);
}

static int pre_split(tk_ctx *c, size_t k, const tk_pretokenizer *p, size_t off, size_t len, bool at_start)
{
    c->spans.len = 0;
    int rc = tk_pattern_find_all(&p->pattern, &c->m, c->buf.data + off, len, &c->spans, c->t->source, c->err);
    if (rc) return rc;
    size_t mark = c->n_pieces;
    split_segments(c, off, len, at_start, p->behavior, p->invert);
    return descend(c, k + 1, mark);
}

// ---- ByteLevel ----

static int pre_bytelevel(tk_ctx *c, size_t k, const tk_pretokenizer *p, size_t off, size_t len, bool at_start)
{
    size_t mark_text = c->buf.len;
    if (p->add_prefix_space && c->buf.data[off] != ' ') {
        tk_buf_reserve(&c->buf, len + 1);
        c->buf.data[c->buf.len] = ' ';
        memcpy(c->buf.data + c->buf.len + 1, c->buf.data + off, len);
        off = c->buf.len;
        c->buf.len += ++len;
    }
    size_t mark = c->n_pieces;
    if (p->use_regex) {
        c->spans.len = 0;
        int rc = tk_pattern_find_all(&p->pattern, &c->m, c->buf.data + off, len, &c->spans, c->t->source, c->err);
        if (rc) return rc;
        split_segments(c, off, len, at_start, TK_SPLIT_ISOLATED, false);
    } else {
        push_piece(c, off, len, at_start);
    }
    /* each byte becomes its character (at most 2 bytes of UTF-8) */
    for (size_t i = mark; i < c->n_pieces; i++) {
        tk_piece *pc = &c->pieces[i];
        tk_buf_reserve(&c->buf, 2 * pc->len);
        const unsigned char *src = (const unsigned char *)c->buf.data + pc->off;
        char *dst = c->buf.data + c->buf.len;
        size_t n = 0;
        for (size_t j = 0; j < pc->len; j++) n += ct_utf8_encode(dst + n, tk_byte_to_cp(src[j]));
        pc->off = c->buf.len;
        pc->len = n;
        c->buf.len += n;
    }
    int rc = descend(c, k + 1, mark);
    c->buf.len = mark_text;
    return rc;
}

// ---- Metaspace ----

static int pre_metaspace(tk_ctx *c, size_t k, const tk_pretokenizer *p, size_t off, size_t len, bool at_start)
{
    size_t mark_text = c->buf.len;
    const char *rep = p->replacement;
    size_t rl = p->replacement_len;
    size_t spaces = 0;
    for (size_t i = 0; i < len; i++) spaces += c->buf.data[off + i] == ' ';
    tk_buf_reserve(&c->buf, len + spaces * rl + rl);
    const char *src = c->buf.data + off;
    char *dst = c->buf.data + c->buf.len;
    size_t n = 0;
    /* HF checks for the replacement after replacing the spaces */
    bool starts = len > 0 && (src[0] == ' ' || (len >= rl && memcmp(src, rep, rl) == 0));
    if (!starts && (p->prepend == TK_PREPEND_ALWAYS || (p->prepend == TK_PREPEND_FIRST && at_start))) {
        memcpy(dst, rep, rl);
        n = rl;
    }
    for (size_t i = 0; i < len; i++) {
        if (src[i] == ' ') { memcpy(dst + n, rep, rl); n += rl; }
        else dst[n++] = src[i];
    }
    off = c->buf.len;
    c->buf.len += n;
    size_t mark = c->n_pieces;
    if (p->split) {
        c->spans.len = 0;
        int rc = tk_pattern_find_all(&p->pattern, &c->m, c->buf.data + off, n, &c->spans, c->t->source, c->err);
        if (rc) return rc;
        split_segments(c, off, n, at_start, TK_SPLIT_MERGED_NEXT, false);
    } else {
        push_piece(c, off, n, at_start);
    }
    int rc = descend(c, k + 1, mark);
    c->buf.len = mark_text;
    return rc;
}

static int pre_stage(tk_ctx *c, size_t k, size_t off, size_t len, bool at_start)
{
    const ct_tokenizer *t = c->t;
    if (k == t->n_pre) return tk_bpe_word(&t->bpe, &c->bpe, c->buf.data + off, len, c->out, t->source, c->err);
    const tk_pretokenizer *p = &t->pre[k];
    switch (p->type) {
    case TK_PRE_SPLIT: return pre_split(c, k, p, off, len, at_start);
    case TK_PRE_BYTELEVEL: return pre_bytelevel(c, k, p, off, len, at_start);
    case TK_PRE_METASPACE: return pre_metaspace(c, k, p, off, len, at_start);
    }
    return CT_OK;
}

// ---- normalizers ----

int tk_normalize(const ct_tokenizer *t, tk_matcher *m, const char *s, size_t n, tk_buf *out, ct_error *err)
{
    tk_buf a = {0}, b = {0};   /* ping-pong between stages */
    tk_buf_put(&a, s, n);
    int rc = CT_OK;
    for (size_t i = 0; i < t->n_norm && rc == CT_OK; i++) {
        const tk_normalizer *z = &t->norm[i];
        b.len = 0;
        switch (z->type) {
        case TK_NORM_NF: tk_unicode_normalize(z->nf, a.data, a.len, &b); break;
        case TK_NORM_PREPEND:
            if (a.len) tk_buf_put(&b, z->str, z->str_len);
            tk_buf_put(&b, a.data, a.len);
            break;
        case TK_NORM_REPLACE:
            rc = tk_pattern_replace(&z->pattern, m, a.data, a.len, z->str, z->str_len, &b, t->source, err);
            break;
        }
        tk_buf tmp = a;
        a = b;
        b = tmp;
    }
    if (rc == CT_OK) tk_buf_put(out, a.data, a.len);
    tk_buf_free(&a);
    tk_buf_free(&b);
    return rc;
}

// ---- added tokens ----

/* The leftmost-longest token match at or after from: its span and index. */
static bool trie_next(const tk_trie *tr, const char *s, size_t n, size_t from, size_t *ms, size_t *me,
                      int32_t *added)
{
    if (!tr->n) return false;
    for (size_t i = from; i < n; i++) {
        if (!tr->first_byte[(unsigned char)s[i]]) continue;
        uint32_t node = 0;
        int32_t best = -1;
        *me = i;
        for (size_t j = i; j < n; j++) {
            uint32_t ch = tr->nodes[node].first_child;
            while (ch && tr->nodes[ch].byte != (unsigned char)s[j]) ch = tr->nodes[ch].next_sibling;
            if (!ch) break;
            node = ch;
            if (tr->nodes[node].added >= 0) { best = tr->nodes[node].added; *me = j + 1; }
        }
        if (best >= 0) { *ms = i; *added = best; return true; }
    }
    return false;
}

static size_t prev_char(const char *s, size_t pos)
{
    do pos--; while (pos > 0 && ((unsigned char)s[pos] & 0xC0) == 0x80);
    return pos;
}

static bool is_word_char_at(tk_ctx *c, const char *s, size_t n, size_t pos)
{
    return tk_regex_matches_at(c->t->word_char, &c->m, s, n, pos);
}

static bool single_word_ok(tk_ctx *c, const char *s, size_t n, size_t ms, size_t me)
{
    if (ms > 0 && is_word_char_at(c, s, n, prev_char(s, ms))) return false;
    return me == n || !is_word_char_at(c, s, n, me);
}

static size_t skip_ws_back(const char *s, size_t pos)
{
    while (pos > 0) {
        size_t p = prev_char(s, pos), k;
        if (!tk_is_whitespace(tk_utf8_decode(s + p, &k))) break;
        pos = p;
    }
    return pos;
}

static size_t skip_ws_forward(const char *s, size_t n, size_t pos)
{
    size_t k;
    while (pos < n && tk_is_whitespace(tk_utf8_decode(s + pos, &k))) pos += k;
    return pos;
}

static int normalize_stage(tk_ctx *c, size_t off, size_t len, bool at_start);

/* Splits buf[off..off+len) on the tokens of tr: token ids go out, the text
 * between them to normalization (raw pass) or to the pre-tokenizers. */
static int split_added(tk_ctx *c, const tk_trie *tr, bool raw_pass, size_t off, size_t len, bool at_start)
{
    size_t scan = 0, start_offset = 0, ms = 0, me = 0;
    int32_t a;
    int rc = CT_OK;
    while (rc == CT_OK && trie_next(tr, c->buf.data + off, len, scan, &ms, &me, &a)) {
        const char *s = c->buf.data + off;
        const tk_added *tok = &c->t->added[a];
        scan = me;
        if (tok->special && !c->parse_special) continue;
        if (tok->single_word && !single_word_ok(c, s, len, ms, me)) continue;
        size_t start = ms, stop = me;
        if (tok->lstrip) {
            start = skip_ws_back(s, ms);
            if (start < start_offset) start = start_offset;
        }
        if (tok->rstrip) stop = skip_ws_forward(s, len, me);
        if (start_offset < start) {
            size_t gap = off + start_offset, gap_len = start - start_offset;
            bool gap_start = at_start && start_offset == 0;
            rc = raw_pass ? normalize_stage(c, gap, gap_len, gap_start) : pre_stage(c, 0, gap, gap_len, gap_start);
        }
        ct_ids_push(c->out, tok->id);
        start_offset = stop;
    }
    if (rc == CT_OK && start_offset < len) {
        size_t gap = off + start_offset, gap_len = len - start_offset;
        bool gap_start = at_start && start_offset == 0;
        rc = raw_pass ? normalize_stage(c, gap, gap_len, gap_start) : pre_stage(c, 0, gap, gap_len, gap_start);
    }
    return rc;
}

static int normalize_stage(tk_ctx *c, size_t off, size_t len, bool at_start)
{
    if (c->t->n_norm == 0) return split_added(c, &c->t->trie_norm, false, off, len, at_start);
    c->norm.len = 0;
    int rc = tk_normalize(c->t, &c->m, c->buf.data + off, len, &c->norm, c->err);
    if (rc) return rc;
    size_t mark = c->buf.len;
    tk_buf_put(&c->buf, c->norm.data, c->norm.len);
    rc = split_added(c, &c->t->trie_norm, false, mark, c->buf.len - mark, at_start);
    c->buf.len = mark;
    return rc;
}

int tokenizer_encode(const ct_tokenizer *t, const char *text, size_t len, bool parse_special, ct_ids *out,
                     ct_error *err)
{
    tk_ctx c = {.t = t, .parse_special = parse_special, .out = out, .err = err};
    tk_matcher_init(&c.m);
    tk_utf8_sanitize(&c.buf, text, len);
    int rc = split_added(&c, &t->trie_raw, true, 0, c.buf.len, true);
    tk_matcher_free(&c.m);
    tk_buf_free(&c.buf);
    tk_buf_free(&c.norm);
    free(c.pieces);
    free(c.spans.v);
    tk_bpe_scratch_free(&c.bpe);
    return rc;
}
