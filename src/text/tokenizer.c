/* tokenizer.c — loading tokenizer.json (tokenizer.h has the contract) and the
 * lookups. Encoding is in tokenizer_encode.c, decoding in tokenizer_decode.c,
 * the BPE model in tokenizer_bpe.c, UTF-8 / regex / normalization in
 * tokenizer_text.c.
 *
 * Loading follows HF's deserializer where it decides something: added tokens
 * take the vocab id of their content, else the next id from the vocab's size
 * in list order (HF ignores the file's "id" there, and so do we); a
 * normalized added token is matched and decoded in its normalized form; merges
 * whose parts or result are not in the vocab are errors; Sequences nest (and
 * are flattened: applying a Sequence is applying its items in turn). */
#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

/* Ids at or above this are refused: the id tables are dense, and a tiny file
 * must not make us allocate gigabytes. Real vocabularies stay under 2^18. */
#define TK_MAX_ID (1u << 24)

#define GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* \w of Rust's regex crate: what single_word treats as part of a word */
#define RUST_WORD_CHAR "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]"

void ct_ids_push(ct_ids *ids, uint32_t id)
{
    if (ids->len == ids->cap) {
        ids->cap = ids->cap ? ids->cap * 2 : 256;
        ids->data = ct_realloc(ids->data, ids->cap * sizeof *ids->data);
    }
    ids->data[ids->len++] = id;
}

void ct_ids_free(ct_ids *ids)
{
    free(ids->data);
    memset(ids, 0, sizeof *ids);
}

// ---- reading tokenizer.json ----

typedef struct loader {
    ct_tokenizer *t;
    const char *src;
    ct_error *err;
} loader;

#define APPEND(arr, n) (arr = ct_realloc(arr, (n + 1) * sizeof *arr), memset(&arr[n], 0, sizeof *arr), &arr[n++])

/* Encoding recurses once per pre-tokenizer: a file may not nest without end.
 * Real files have at most a handful of each component. */
#define TK_MAX_COMPONENTS 64

static int too_many(loader *L, const char *path, size_t n)
{
    if (n < TK_MAX_COMPONENTS) return CT_OK;
    return CT_FAIL_INPUT(L->err, "%s: %s: more than %d components of this kind", L->src, path, TK_MAX_COMPONENTS);
}

static const char *type_name(const json_value *v)
{
    static const char *names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return v ? names[v->type] : "nothing";
}

static int bad_type(loader *L, const char *path, const char *want, const json_value *v)
{
    return CT_FAIL_INPUT(L->err, "%s: %s: expected %s, found %s", L->src, path, want, type_name(v));
}

/* obj[key] as a string; absent or null gives *out = NULL unless required. */
static int get_str(loader *L, const json_value *obj, const char *key, const char *path, bool required,
                   const json_value **out)
{
    const json_value *v = json_get(obj, key);
    *out = NULL;
    if (!v || v->type == JSON_NULL) {
        if (!required) return CT_OK;
        return CT_FAIL_INPUT(L->err, "%s: %s.%s is missing", L->src, path, key);
    }
    if (v->type != JSON_STRING) {
        char p[256];
        snprintf(p, sizeof p, "%s.%s", path, key);
        return bad_type(L, p, "a string", v);
    }
    *out = v;
    return CT_OK;
}

static int get_bool(loader *L, const json_value *obj, const char *key, const char *path, bool dflt, bool *out)
{
    const json_value *v = json_get(obj, key);
    *out = dflt;
    if (!v || v->type == JSON_NULL) return CT_OK;
    if (v->type != JSON_BOOL) {
        char p[256];
        snprintf(p, sizeof p, "%s.%s", path, key);
        return bad_type(L, p, "a boolean", v);
    }
    *out = v->boolean;
    return CT_OK;
}

static int get_count(loader *L, const json_value *obj, const char *key, const char *path, size_t *out)
{
    const json_value *v = json_get(obj, key);
    *out = 0;
    if (!v || v->type == JSON_NULL) return CT_OK;
    if (v->type != JSON_NUMBER || !v->is_integer || v->integer < 0 || v->integer > 1000000) {
        char p[256];
        snprintf(p, sizeof p, "%s.%s", path, key);
        return bad_type(L, p, "an integer in [0, 1000000]", v);
    }
    *out = (size_t)v->integer;
    return CT_OK;
}

/* The "type" of a component, checked against the names this build supports. */
static int get_kind(loader *L, const json_value *v, const char *path, const char *const *names, size_t n,
                    const char *expected, size_t *kind)
{
    if (v->type != JSON_OBJECT) return bad_type(L, path, "an object or null", v);
    const json_value *type;
    if (get_str(L, v, "type", path, true, &type)) return L->err->code;
    for (size_t i = 0; i < n; i++)
        if (strcmp(type->string, names[i]) == 0) { *kind = i; return CT_OK; }
    return CT_FAIL_INPUT(L->err, "%s: %s.type '%s' is not supported (expected %s)", L->src, path, type->string,
                         expected);
}

/* {"String": s} or {"Regex": r}. */
static int get_pattern(loader *L, const json_value *obj, const char *path, tk_pattern *p)
{
    char pp[256];
    snprintf(pp, sizeof pp, "%s.pattern", path);
    const json_value *v = json_get(obj, "pattern");
    if (!v || v->type != JSON_OBJECT) return bad_type(L, pp, "an object {\"String\": ..} or {\"Regex\": ..}", v);
    const json_value *s = json_get_type(v, "String", JSON_STRING), *r = json_get_type(v, "Regex", JSON_STRING);
    char fp[300];
    snprintf(fp, sizeof fp, "%s.%s", pp, s ? "String" : "Regex");
    if (s) return tk_pattern_literal(p, s->string, s->string_len, L->src, fp, L->err);
    if (r) return tk_pattern_regex(p, r->string, r->string_len, L->src, fp, L->err);
    return bad_type(L, pp, "an object {\"String\": ..} or {\"Regex\": ..}", v);
}

/* A string holding exactly one character (Metaspace replacement, Strip content). */
static int get_char(loader *L, const json_value *obj, const char *key, const char *path, const char *dflt,
                    char out[5], size_t *out_len)
{
    const json_value *v;
    if (get_str(L, obj, key, path, false, &v)) return L->err->code;
    const char *s = v ? v->string : dflt;
    size_t n = v ? v->string_len : strlen(dflt);
    if (n == 0 || n > 4 || tk_utf8_len((unsigned char)s[0]) != n)
        return CT_FAIL_INPUT(L->err, "%s: %s.%s: expected one character, found '%s'", L->src, path, key, s);
    memcpy(out, s, n);
    out[n] = 0;
    *out_len = n;
    return CT_OK;
}

static int get_prepend_scheme(loader *L, const json_value *obj, const char *path, tk_prepend_scheme *out)
{
    const json_value *v;
    if (get_str(L, obj, "prepend_scheme", path, false, &v)) return L->err->code;
    if (!v) {   /* files older than prepend_scheme: add_prefix_space */
        bool add;
        if (get_bool(L, obj, "add_prefix_space", path, true, &add)) return L->err->code;
        *out = add ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
        return CT_OK;
    }
    static const char *names[] = {"always", "first", "never"};
    for (int i = 0; i < 3; i++)
        if (strcmp(v->string, names[i]) == 0) { *out = (tk_prepend_scheme)i; return CT_OK; }
    return CT_FAIL_INPUT(L->err, "%s: %s.prepend_scheme '%s' is not supported (expected always, first or never)",
                         L->src, path, v->string);
}

static char *dup_bytes(const char *s, size_t n)
{
    char *d = ct_malloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Walks a Sequence's list, calling load on each item with its path. */
static int load_list(loader *L, const json_value *v, const char *key, const char *path,
                     int (*load)(loader *, const json_value *, const char *))
{
    const json_value *items = json_get(v, key);
    char p[256];
    snprintf(p, sizeof p, "%s.%s", path, key);
    if (!items || items->type != JSON_ARRAY) return bad_type(L, p, "an array", items);
    for (size_t i = 0; i < items->count; i++) {
        char ip[256];
        snprintf(ip, sizeof ip, "%s[%zu]", p, i);
        if (load(L, items->items[i], ip)) return L->err->code;
    }
    return CT_OK;
}

static int load_normalizer(loader *L, const json_value *v, const char *path)
{
    if (v->type == JSON_NULL) return CT_OK;
    static const char *names[] = {"Sequence", "NFC", "NFD", "NFKC", "NFKD", "Prepend", "Replace"};
    size_t kind;
    if (get_kind(L, v, path, names, 7, "Sequence, NFC, NFD, NFKC, NFKD, Prepend or Replace", &kind))
        return L->err->code;
    if (kind == 0) return load_list(L, v, "normalizers", path, load_normalizer);
    ct_tokenizer *t = L->t;
    if (too_many(L, path, t->n_norm)) return L->err->code;
    tk_normalizer *z = APPEND(t->norm, t->n_norm);
    const json_value *s;
    if (kind <= 4) {
        static const tk_nf forms[] = {TK_NF_C, TK_NF_D, TK_NF_KC, TK_NF_KD};
        z->type = TK_NORM_NF;
        z->nf = forms[kind - 1];
    } else if (kind == 5) {
        z->type = TK_NORM_PREPEND;
        if (get_str(L, v, "prepend", path, true, &s)) return L->err->code;
        z->str = dup_bytes(s->string, s->string_len);
        z->str_len = s->string_len;
    } else {
        z->type = TK_NORM_REPLACE;
        if (get_str(L, v, "content", path, true, &s)) return L->err->code;
        z->str = dup_bytes(s->string, s->string_len);
        z->str_len = s->string_len;
        if (get_pattern(L, v, path, &z->pattern)) return L->err->code;
    }
    return CT_OK;
}

static int load_pretokenizer(loader *L, const json_value *v, const char *path)
{
    if (v->type == JSON_NULL) return CT_OK;
    static const char *names[] = {"Sequence", "Split", "ByteLevel", "Metaspace"};
    size_t kind;
    if (get_kind(L, v, path, names, 4, "Sequence, Split, ByteLevel or Metaspace", &kind)) return L->err->code;
    if (kind == 0) return load_list(L, v, "pretokenizers", path, load_pretokenizer);
    ct_tokenizer *t = L->t;
    if (too_many(L, path, t->n_pre)) return L->err->code;
    tk_pretokenizer *p = APPEND(t->pre, t->n_pre);
    if (kind == 1) {
        p->type = TK_PRE_SPLIT;
        if (get_pattern(L, v, path, &p->pattern)) return L->err->code;
        if (get_bool(L, v, "invert", path, false, &p->invert)) return L->err->code;
        const json_value *b;
        if (get_str(L, v, "behavior", path, true, &b)) return L->err->code;
        static const char *behaviors[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        size_t i = 0;
        while (i < 5 && strcmp(b->string, behaviors[i]) != 0) i++;
        if (i == 5)
            return CT_FAIL_INPUT(L->err, "%s: %s.behavior '%s' is not supported (expected Removed, Isolated, "
                                 "MergedWithPrevious, MergedWithNext or Contiguous)", L->src, path, b->string);
        p->behavior = (tk_split_behavior)i;
    } else if (kind == 2) {
        p->type = TK_PRE_BYTELEVEL;
        if (get_bool(L, v, "add_prefix_space", path, true, &p->add_prefix_space) ||
            get_bool(L, v, "use_regex", path, true, &p->use_regex))
            return L->err->code;
        if (p->use_regex &&
            tk_pattern_regex(&p->pattern, GPT2_REGEX, strlen(GPT2_REGEX), L->src, path, L->err))
            return L->err->code;
    } else {
        p->type = TK_PRE_METASPACE;
        if (get_char(L, v, "replacement", path, "\xE2\x96\x81", p->replacement, &p->replacement_len) ||
            get_prepend_scheme(L, v, path, &p->prepend) || get_bool(L, v, "split", path, true, &p->split))
            return L->err->code;
        if (tk_pattern_literal(&p->pattern, p->replacement, p->replacement_len, L->src, path, L->err))
            return L->err->code;
    }
    return CT_OK;
}

static int load_decoder(loader *L, const json_value *v, const char *path)
{
    if (v->type == JSON_NULL) return CT_OK;
    static const char *names[] = {"Sequence", "ByteLevel", "Metaspace", "Replace", "ByteFallback", "Fuse", "Strip"};
    size_t kind;
    if (get_kind(L, v, path, names, 7, "Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse or Strip", &kind))
        return L->err->code;
    ct_tokenizer *t = L->t;
    t->has_decoder = true;
    if (kind == 0) return load_list(L, v, "decoders", path, load_decoder);
    static const tk_dec_type types[] = {0, TK_DEC_BYTELEVEL, TK_DEC_METASPACE, TK_DEC_REPLACE, TK_DEC_BYTEFALLBACK,
                                        TK_DEC_FUSE, TK_DEC_STRIP};
    if (too_many(L, path, t->n_dec)) return L->err->code;
    tk_decoder *d = APPEND(t->dec, t->n_dec);
    d->type = types[kind];
    if (d->type == TK_DEC_METASPACE) {
        if (get_char(L, v, "replacement", path, "\xE2\x96\x81", d->replacement, &d->replacement_len) ||
            get_prepend_scheme(L, v, path, &d->prepend))
            return L->err->code;
    } else if (d->type == TK_DEC_REPLACE) {
        const json_value *s;
        if (get_str(L, v, "content", path, true, &s) || get_pattern(L, v, path, &d->pattern)) return L->err->code;
        d->content = dup_bytes(s->string, s->string_len);
        d->content_len = s->string_len;
    } else if (d->type == TK_DEC_STRIP) {
        char c[5];
        size_t n, k;
        if (get_char(L, v, "content", path, " ", c, &n) || get_count(L, v, "start", path, &d->strip_start) ||
            get_count(L, v, "stop", path, &d->strip_stop))
            return L->err->code;
        d->strip_char = tk_utf8_decode(c, &k);
    }
    return CT_OK;
}

static int check_id(loader *L, const char *path, long long id)
{
    if (id < 0 || id >= (long long)TK_MAX_ID)
        return CT_FAIL_INPUT(L->err, "%s: %s: id %lld is out of range (expected 0 <= id < %u)", L->src, path, id,
                             TK_MAX_ID);
    return CT_OK;
}

/* One entry of model.merges: "a b" (the older form) or ["a", "b"]. */
static int merge_parts(loader *L, const json_value *m, size_t i, const char **a, size_t *an, const char **b,
                       size_t *bn)
{
    char p[64];
    snprintf(p, sizeof p, "model.merges[%zu]", i);
    if (m->type == JSON_STRING) {
        const char *sp = memchr(m->string, ' ', m->string_len);
        if (!sp) return CT_FAIL_INPUT(L->err, "%s: %s: '%s' is not two tokens separated by a space", L->src, p, m->string);
        *a = m->string;
        *an = (size_t)(sp - m->string);
        *b = sp + 1;
        *bn = m->string_len - *an - 1;
        return CT_OK;
    }
    if (m->type != JSON_ARRAY || m->count != 2 || m->items[0]->type != JSON_STRING || m->items[1]->type != JSON_STRING)
        return bad_type(L, p, "\"a b\" or [\"a\", \"b\"]", m);
    *a = m->items[0]->string;
    *an = m->items[0]->string_len;
    *b = m->items[1]->string;
    *bn = m->items[1]->string_len;
    return CT_OK;
}

static int load_model(loader *L, const json_value *v)
{
    if (!v || v->type != JSON_OBJECT) return bad_type(L, "model", "an object", v);
    static const char *names[] = {"BPE"};
    size_t kind;
    if (json_get(v, "type") || !json_get(v, "merges")) {   /* older files leave out "type" */
        if (get_kind(L, v, "model", names, 1, "BPE", &kind)) return L->err->code;
    }
    tk_bpe *b = &L->t->bpe;
    const json_value *drop = json_get(v, "dropout");
    if (drop && drop->type != JSON_NULL && !(drop->type == JSON_NUMBER && drop->number == 0))
        return CT_FAIL_INPUT(L->err, "%s: model.dropout is not supported (expected null: encoding must be "
                             "deterministic)", L->src);
    if (get_bool(L, v, "byte_fallback", "model", false, &b->byte_fallback) ||
        get_bool(L, v, "ignore_merges", "model", false, &b->ignore_merges) ||
        get_bool(L, v, "fuse_unk", "model", false, &b->fuse_unk))
        return L->err->code;
    const json_value *s;
    if (get_str(L, v, "unk_token", "model", false, &s)) return L->err->code;
    if (s) { b->has_unk = true; b->unk_token = dup_bytes(s->string, s->string_len); }
    if (get_str(L, v, "continuing_subword_prefix", "model", false, &s)) return L->err->code;
    if (s && s->string_len) { b->prefix = dup_bytes(s->string, s->string_len); b->prefix_len = s->string_len; }
    if (get_str(L, v, "end_of_word_suffix", "model", false, &s)) return L->err->code;
    if (s && s->string_len) { b->suffix = dup_bytes(s->string, s->string_len); b->suffix_len = s->string_len; }

    const json_value *vocab = json_get(v, "vocab");
    if (!vocab || vocab->type != JSON_OBJECT) return bad_type(L, "model.vocab", "an object", vocab);
    tk_vocab_init(&b->vocab, vocab->count);
    for (size_t i = 0; i < vocab->count; i++) {
        const json_value *id = vocab->items[i];
        char p[64];
        snprintf(p, sizeof p, "model.vocab[%zu]", i);
        if (id->type != JSON_NUMBER || !id->is_integer) return bad_type(L, p, "an integer id", id);
        if (check_id(L, p, id->integer)) return L->err->code;
        tk_vocab_add(&b->vocab, vocab->keys[i], strlen(vocab->keys[i]), (uint32_t)id->integer);
    }
    b->unk_in_vocab = b->has_unk && tk_vocab_find(&b->vocab, b->unk_token, strlen(b->unk_token), &b->unk_id);

    const json_value *merges = json_get(v, "merges");
    if (merges && merges->type != JSON_NULL && merges->type != JSON_ARRAY)
        return bad_type(L, "model.merges", "an array", merges);
    size_t n_merges = merges && merges->type == JSON_ARRAY ? merges->count : 0;
    tk_merges_init(&b->merges, n_merges);
    tk_buf joined = {0};
    for (size_t i = 0; i < n_merges; i++) {
        const char *pa = NULL, *pb = NULL;
        size_t na = 0, nb = 0;
        uint32_t ia, ib, im;
        if (merge_parts(L, merges->items[i], i, &pa, &na, &pb, &nb)) break;
        /* the merged token drops the right part's continuing_subword_prefix */
        size_t skip = b->prefix && nb >= b->prefix_len && memcmp(pb, b->prefix, b->prefix_len) == 0 ? b->prefix_len : 0;
        joined.len = 0;
        tk_buf_put(&joined, pa, na);
        tk_buf_put(&joined, pb + skip, nb - skip);
        const char *missing = !tk_vocab_find(&b->vocab, pa, na, &ia) ? "left" :
                              !tk_vocab_find(&b->vocab, pb, nb, &ib) ? "right" :
                              !tk_vocab_find(&b->vocab, joined.data, joined.len, &im) ? "merged" : NULL;
        if (missing) {
            CT_FAIL_INPUT(L->err, "%s: model.merges[%zu]: the %s token '%.*s' is not in model.vocab", L->src, i, missing,
                          missing[0] == 'l' ? (int)na : missing[0] == 'r' ? (int)nb : (int)joined.len,
                          missing[0] == 'l' ? pa : missing[0] == 'r' ? pb : joined.data);
            break;
        }
        tk_merges_add(&b->merges, ia, ib, (uint32_t)i, im);
    }
    tk_buf_free(&joined);
    if (L->err->code) return L->err->code;

    b->cache = tk_cache_new();
    b->bmp_id = ct_malloc(0x10000 * sizeof *b->bmp_id);
    for (size_t i = 0; i < 0x10000; i++) b->bmp_id[i] = -1;
    for (size_t i = 0; i < b->vocab.n; i++) {
        size_t k;
        const char *tok = b->vocab.bytes + b->vocab.off[i];
        uint32_t cp = tk_utf8_decode(tok, &k);
        if (k == b->vocab.len[i] && cp < 0x10000 && b->bmp_id[cp] < 0) b->bmp_id[cp] = (int32_t)b->vocab.ids[i];
    }
    for (int c = 0; c < 256; c++) {
        char name[8];
        uint32_t id;
        snprintf(name, sizeof name, "<0x%02X>", c);
        b->byte_id[c] = tk_vocab_find(&b->vocab, name, 6, &id) ? (int32_t)id : -1;
    }
    return CT_OK;
}

static void trie_add(tk_trie *tr, const char *s, size_t n, int32_t added)
{
    if (!tr->cap) {
        tr->cap = 64;
        tr->nodes = ct_calloc(tr->cap, sizeof *tr->nodes);
        tr->nodes[0].added = -1;
        tr->n = 1;
    }
    tr->first_byte[(unsigned char)s[0]] = true;
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t ch = tr->nodes[node].first_child;
        while (ch && tr->nodes[ch].byte != (unsigned char)s[i]) ch = tr->nodes[ch].next_sibling;
        if (!ch) {
            if (tr->n == tr->cap) {
                tr->cap *= 2;
                tr->nodes = ct_realloc(tr->nodes, tr->cap * sizeof *tr->nodes);
            }
            ch = (uint32_t)tr->n++;
            tr->nodes[ch] = (tk_trie_node){0, tr->nodes[node].first_child, -1, (unsigned char)s[i]};
            tr->nodes[node].first_child = ch;
        }
        node = ch;
    }
    tr->nodes[node].added = added;
}

static int load_added(loader *L, const json_value *list)
{
    ct_tokenizer *t = L->t;
    if (!list || list->type == JSON_NULL) return CT_OK;
    if (list->type != JSON_ARRAY) return bad_type(L, "added_tokens", "an array", list);
    uint32_t next_id = (uint32_t)t->bpe.vocab.n;   /* HF: new ids start at the model's vocab size */
    tk_matcher m;
    tk_matcher_init(&m);
    for (size_t i = 0; i < list->count; i++) {
        const json_value *v = list->items[i];
        char p[64];
        snprintf(p, sizeof p, "added_tokens[%zu]", i);
        if (v->type != JSON_OBJECT) { bad_type(L, p, "an object", v); break; }
        const json_value *content;
        if (get_str(L, v, "content", p, true, &content)) break;
        if (content->string_len == 0) continue;   /* HF ignores empty tokens */
        tk_added *a = NULL;
        for (size_t k = 0; k < t->n_added && !a; k++)
            if (t->added[k].content_len == content->string_len &&
                memcmp(t->added[k].content, content->string, content->string_len) == 0)
                a = &t->added[k];   /* a repeated token: the later flags win */
        if (!a) {
            a = APPEND(t->added, t->n_added);
            a->content = dup_bytes(content->string, content->string_len);
            a->content_len = content->string_len;
            if (!tk_vocab_find(&t->bpe.vocab, a->content, a->content_len, &a->id)) a->id = next_id++;
            if (check_id(L, p, a->id)) break;
        }
        if (get_bool(L, v, "special", p, false, &a->special) || get_bool(L, v, "normalized", p, true, &a->normalized) ||
            get_bool(L, v, "lstrip", p, false, &a->lstrip) || get_bool(L, v, "rstrip", p, false, &a->rstrip) ||
            get_bool(L, v, "single_word", p, false, &a->single_word))
            break;
    }
    for (size_t k = 0; k < t->n_added && !L->err->code; k++) {
        tk_added *a = &t->added[k];
        tk_buf form = {0};
        if (a->normalized) {
            if (tk_normalize(t, &m, a->content, a->content_len, &form, L->err)) { tk_buf_free(&form); break; }
        } else {
            tk_buf_put(&form, a->content, a->content_len);
        }
        a->form = dup_bytes(form.data ? form.data : "", form.len);
        a->form_len = form.len;
        tk_buf_free(&form);
        if (a->form_len) trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, a->form, a->form_len, (int32_t)k);
        if (a->single_word && !t->word_char) {
            tk_pattern wc;
            if (tk_pattern_regex(&wc, RUST_WORD_CHAR, strlen(RUST_WORD_CHAR), L->src, "single_word", L->err)) break;
            t->word_char = wc.re;
        }
    }
    tk_matcher_free(&m);
    return L->err->code;
}

/* The dense id -> string and id -> added tables. */
static void build_id_tables(ct_tokenizer *t)
{
    size_t size = 0;
    for (size_t i = 0; i < t->bpe.vocab.n; i++)
        if (t->bpe.vocab.ids[i] + (size_t)1 > size) size = t->bpe.vocab.ids[i] + (size_t)1;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id + (size_t)1 > size) size = t->added[i].id + (size_t)1;
    t->vocab_size = size;
    t->id_str = ct_calloc(size ? size : 1, sizeof *t->id_str);
    t->id_len = ct_calloc(size ? size : 1, sizeof *t->id_len);
    t->added_of_id = ct_malloc((size ? size : 1) * sizeof *t->added_of_id);
    for (size_t i = 0; i < size; i++) t->added_of_id[i] = -1;
    for (size_t i = 0; i < t->bpe.vocab.n; i++) {
        uint32_t id = t->bpe.vocab.ids[i];
        if (t->id_str[id]) continue;   /* two tokens with one id: the first in the file */
        t->id_str[id] = t->bpe.vocab.bytes + t->bpe.vocab.off[i];
        t->id_len[id] = t->bpe.vocab.len[i];
    }
    for (size_t i = 0; i < t->n_added; i++) {
        const tk_added *a = &t->added[i];
        t->added_of_id[a->id] = (int32_t)i;
        t->id_str[a->id] = a->form;
        t->id_len[a->id] = (uint32_t)a->form_len;
    }
}

ct_tokenizer *tokenizer_load_json(const char *text, size_t len, const char *source, ct_error *err)
{
    json_doc *doc = json_parse(text, len, source, err);
    if (!doc) return NULL;
    ct_tokenizer *t = ct_calloc(1, sizeof *t);
    t->source = ct_strdup(source);
    loader L = {t, t->source, err};
    err->code = CT_OK;
    const json_value *root = json_root(doc);
    if (root->type != JSON_OBJECT) {
        bad_type(&L, "the top level", "an object", root);
    } else {
        const json_value *norm = json_get(root, "normalizer"), *pre = json_get(root, "pre_tokenizer"),
                         *dec = json_get(root, "decoder");
        if (!load_model(&L, json_get(root, "model")) && (!norm || !load_normalizer(&L, norm, "normalizer")) &&
            (!pre || !load_pretokenizer(&L, pre, "pre_tokenizer")) && (!dec || !load_decoder(&L, dec, "decoder")) &&
            !load_added(&L, json_get(root, "added_tokens")))
            build_id_tables(t);
    }
    json_free(doc);
    if (err->code) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

ct_tokenizer *tokenizer_load(const char *model_dir, ct_error *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/tokenizer.json", model_dir) >= (int)sizeof path) {
        CT_FAIL_INPUT(err, "%s: the model folder's path is too long", model_dir);
        return NULL;
    }
    size_t len;
    char *text = ct_read_file_max(path, CT_JSON_MAX_BYTES, &len, err);
    if (!text) return NULL;
    ct_tokenizer *t = tokenizer_load_json(text, len, path, err);
    free(text);
    return t;
}

void tokenizer_free(ct_tokenizer *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n_norm; i++) { tk_pattern_free(&t->norm[i].pattern); free(t->norm[i].str); }
    for (size_t i = 0; i < t->n_pre; i++) tk_pattern_free(&t->pre[i].pattern);
    for (size_t i = 0; i < t->n_dec; i++) { tk_pattern_free(&t->dec[i].pattern); free(t->dec[i].content); }
    for (size_t i = 0; i < t->n_added; i++) { free(t->added[i].content); free(t->added[i].form); }
    free(t->norm);
    free(t->pre);
    free(t->dec);
    free(t->added);
    free(t->trie_raw.nodes);
    free(t->trie_norm.nodes);
    pcre2_code_free(t->word_char);
    tk_bpe_free(&t->bpe);
    free(t->added_of_id);
    free(t->id_str);
    free(t->id_len);
    free(t->source);
    free(t);
}

// ---- lookups ----

bool tokenizer_token_to_id(const ct_tokenizer *t, const char *token, size_t len, uint32_t *id)
{
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].content_len == len && memcmp(t->added[i].content, token, len) == 0) {
            *id = t->added[i].id;
            return true;
        }
    return tk_vocab_find(&t->bpe.vocab, token, len, id);
}

const char *tokenizer_id_to_token(const ct_tokenizer *t, uint32_t id, size_t *len)
{
    if (id >= t->vocab_size || !t->id_str[id]) return NULL;
    *len = t->id_len[id];
    return t->id_str[id];
}

size_t tokenizer_vocab_size(const ct_tokenizer *t) { return t->vocab_size; }

bool tokenizer_is_special(const ct_tokenizer *t, uint32_t id)
{
    return id < t->vocab_size && t->added_of_id[id] >= 0 && t->added[t->added_of_id[id]].special;
}
