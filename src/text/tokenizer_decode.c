/* tokenizer_decode.c — tokenizer_decode (tokenizer.h): HF's TokenizerImpl::decode.
 * The ids' strings (unknown ids skipped, special ones too when asked) go
 * through the decoders in turn, each mapping a list of strings to a list of
 * strings as HF's decode_chain does, and the result is joined ("" with a
 * decoder, " " without one, as HF). */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

/* A list of strings: spans (start, end) into one buffer. */
typedef struct tk_strs {
    tk_buf buf;
    tk_spans at;
} tk_strs;

static void strs_add(tk_strs *l, const char *s, size_t n)
{
    size_t a = l->buf.len;
    tk_buf_put(&l->buf, s, n);
    tk_spans_push(&l->at, a, l->buf.len);
}

/* ByteLevel: each token's characters back to bytes (a token with a character
 * outside the map keeps its own bytes), then one lossy UTF-8 string. */
static void dec_bytelevel(const tk_strs *in, tk_strs *out)
{
    tk_buf bytes = {0};
    for (size_t i = 0; i < in->at.len; i += 2) {
        const char *s = in->buf.data + in->at.v[i];
        size_t n = in->at.v[i + 1] - in->at.v[i], mark = bytes.len, k;
        bool mapped = true;
        for (size_t j = 0; j < n && mapped; j += k) {
            int b = tk_cp_to_byte(tk_utf8_decode(s + j, &k));
            if (b < 0) mapped = false;
            else { char c = (char)b; tk_buf_put(&bytes, &c, 1); }
        }
        if (!mapped) { bytes.len = mark; tk_buf_put(&bytes, s, n); }
    }
    size_t a = out->buf.len;
    tk_utf8_sanitize(&out->buf, bytes.data, bytes.len);
    tk_spans_push(&out->at, a, out->buf.len);
    tk_buf_free(&bytes);
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* "<0xNN>" -> the byte (Rust's u8::from_str_radix on "NN", which takes a '+' sign). */
static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    if (s[3] == '+') return hex_digit(s[4]);
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* ByteFallback: runs of <0xNN> tokens become their UTF-8 text, or one U+FFFD
 * per byte when the run is not well-formed. */
static void dec_bytefallback(const tk_strs *in, tk_strs *out)
{
    tk_buf run = {0}, check = {0};
    for (size_t i = 0; i <= in->at.len; i += 2) {
        const char *s = i < in->at.len ? in->buf.data + in->at.v[i] : NULL;
        size_t n = s ? in->at.v[i + 1] - in->at.v[i] : 0;
        int b = s ? byte_token(s, n) : -1;
        if (b >= 0) { char c = (char)b; tk_buf_put(&run, &c, 1); continue; }
        if (run.len) {
            check.len = 0;
            tk_utf8_sanitize(&check, run.data, run.len);
            if (check.len == run.len) strs_add(out, run.data, run.len);
            else for (size_t k = 0; k < run.len; k++) strs_add(out, TK_REPLACEMENT, 3);
            run.len = 0;
        }
        if (s) strs_add(out, s, n);
    }
    tk_buf_free(&run);
    tk_buf_free(&check);
}

static int dec_apply(const ct_tokenizer *t, const tk_decoder *d, tk_matcher *m, const tk_strs *in, tk_strs *out,
                     ct_error *err)
{
    if (d->type == TK_DEC_BYTELEVEL) { dec_bytelevel(in, out); return CT_OK; }
    if (d->type == TK_DEC_BYTEFALLBACK) { dec_bytefallback(in, out); return CT_OK; }
    if (d->type == TK_DEC_FUSE) {
        size_t a = out->buf.len;
        for (size_t i = 0; i < in->at.len; i += 2)
            tk_buf_put(&out->buf, in->buf.data + in->at.v[i], in->at.v[i + 1] - in->at.v[i]);
        tk_spans_push(&out->at, a, out->buf.len);
        return CT_OK;
    }
    for (size_t i = 0; i < in->at.len; i += 2) {
        const char *s = in->buf.data + in->at.v[i];
        size_t n = in->at.v[i + 1] - in->at.v[i], a = out->buf.len, k;
        if (d->type == TK_DEC_REPLACE) {
            int rc = tk_pattern_replace(&d->pattern, m, s, n, d->content, d->content_len, &out->buf, t->source, err);
            if (rc) return rc;
        } else if (d->type == TK_DEC_METASPACE) {
            /* the first token loses every replacement character unless prepend_scheme is never */
            bool drop = i == 0 && d->prepend != TK_PREPEND_NEVER;
            for (size_t j = 0; j < n; j += k) {
                k = tk_utf8_len((unsigned char)s[j]);
                bool rep = k == d->replacement_len && memcmp(s + j, d->replacement, k) == 0;
                if (!rep) tk_buf_put(&out->buf, s + j, k);
                else if (!drop) tk_buf_put(&out->buf, " ", 1);
            }
        } else {   /* Strip: up to start leading and stop trailing copies of the character */
            size_t lo = 0, hi = n;
            for (size_t c = 0; c < d->strip_start && lo < hi && tk_utf8_decode(s + lo, &k) == d->strip_char; c++) lo += k;
            for (size_t c = 0; c < d->strip_stop && hi > lo; c++) {
                size_t p = hi;
                do p--; while (p > lo && ((unsigned char)s[p] & 0xC0) == 0x80);
                if (tk_utf8_decode(s + p, &k) != d->strip_char) break;
                hi = p;
            }
            tk_buf_put(&out->buf, s + lo, hi - lo);
        }
        tk_spans_push(&out->at, a, out->buf.len);
    }
    return CT_OK;
}

int tokenizer_decode(const ct_tokenizer *t, const uint32_t *ids, size_t n, bool skip_special, char **text,
                     size_t *len, ct_error *err)
{
    tk_strs a = {0}, b = {0};
    tk_buf_reserve(&a.buf, 1);   /* a decoder may make an empty string of an empty list */
    tk_buf_reserve(&b.buf, 1);
    for (size_t i = 0; i < n; i++) {
        size_t sl;
        const char *s = tokenizer_id_to_token(t, ids[i], &sl);
        if (!s || (skip_special && tokenizer_is_special(t, ids[i]))) continue;
        strs_add(&a, s, sl);
    }
    int rc = CT_OK;
    tk_matcher m;
    tk_matcher_init(&m);
    for (size_t k = 0; k < t->n_dec && rc == CT_OK; k++) {
        b.buf.len = b.at.len = 0;
        rc = dec_apply(t, &t->dec[k], &m, &a, &b, err);
        tk_strs tmp = a;
        a = b;
        b = tmp;
    }
    tk_matcher_free(&m);
    tk_buf out = {0};
    for (size_t i = 0; rc == CT_OK && i < a.at.len; i += 2) {
        if (i && !t->has_decoder) tk_buf_put(&out, " ", 1);   /* no decoder: HF joins with spaces */
        tk_buf_put(&out, a.buf.data + a.at.v[i], a.at.v[i + 1] - a.at.v[i]);
    }
    tk_buf_put(&out, "", 1);
    *text = out.data;
    *len = out.len - 1;
    tk_buf_free(&a.buf);
    tk_buf_free(&b.buf);
    free(a.at.v);
    free(b.at.v);
    if (rc) { free(*text); *text = NULL; *len = 0; }
    return rc;
}
