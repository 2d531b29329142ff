/* tokenizer_bpe.c — the BPE model of HF tokenizers (models/bpe/model.rs and
 * word.rs): a word is split into characters, each looked up in the vocab
 * (byte_fallback: missing ones become <0xNN> tokens; else unk_token, fused
 * when fuse_unk; else dropped, as HF drops them), then merged.
 *
 * Merging: repeatedly apply the pair of adjacent symbols with the lowest merge
 * rank, the leftmost one on a tie. HF keeps the candidates in a binary heap
 * and skips stale entries; so do we, so a word of k symbols costs
 * O(k log k) and a long word (a CJK run, a SentencePiece sentence) stays cheap.
 * With ignore_merges (Llama-3, GPT-OSS) a word that is itself in the vocab is
 * that one token, merges or not. */
#include "tokenizer_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- vocab: string -> id ----

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

void tk_vocab_init(tk_vocab *v, size_t n_expected)
{
    memset(v, 0, sizeof *v);
    v->cap = pow2_at_least(n_expected * 2 + 1);
    v->slots = ct_calloc(v->cap, sizeof *v->slots);
    size_t n = n_expected ? n_expected : 1;
    v->off = ct_malloc(n * sizeof *v->off);
    v->len = ct_malloc(n * sizeof *v->len);
    v->ids = ct_malloc(n * sizeof *v->ids);
}

static size_t vocab_slot(const tk_vocab *v, const char *s, size_t n)
{
    size_t i = (size_t)hash_bytes(s, n) & (v->cap - 1);
    for (;;) {
        uint32_t e = v->slots[i];
        if (!e) return i;
        e--;
        if (v->len[e] == n && memcmp(v->bytes + v->off[e], s, n) == 0) return i;
        i = (i + 1) & (v->cap - 1);
    }
}

void tk_vocab_add(tk_vocab *v, const char *s, size_t n, uint32_t id)
{
    CT_ASSERT(n <= UINT32_MAX && v->bytes_len + n <= UINT32_MAX, "vocab larger than 4 GiB");
    if ((v->n + 1) * 2 > v->cap) {   /* keep the load <= 1/2 */
        uint32_t *old = v->slots;
        size_t old_cap = v->cap;
        v->cap *= 2;
        v->slots = ct_calloc(v->cap, sizeof *v->slots);
        for (size_t i = 0; i < old_cap; i++)
            if (old[i]) v->slots[vocab_slot(v, v->bytes + v->off[old[i] - 1], v->len[old[i] - 1])] = old[i];
        free(old);
    }
    size_t slot = vocab_slot(v, s, n);
    if (v->slots[slot]) return;
    /* the arrays grow in step with the table: capacity cap/2 entries */
    v->off = ct_realloc(v->off, (v->cap / 2) * sizeof *v->off);
    v->len = ct_realloc(v->len, (v->cap / 2) * sizeof *v->len);
    v->ids = ct_realloc(v->ids, (v->cap / 2) * sizeof *v->ids);
    v->bytes = ct_realloc(v->bytes, v->bytes_len + n + 1);
    memcpy(v->bytes + v->bytes_len, s, n);
    v->off[v->n] = (uint32_t)v->bytes_len;
    v->len[v->n] = (uint32_t)n;
    v->ids[v->n] = id;
    v->bytes_len += n;
    v->slots[slot] = (uint32_t)++v->n;
}

bool tk_vocab_find(const tk_vocab *v, const char *s, size_t n, uint32_t *id)
{
    if (!v->cap) return false;
    uint32_t e = v->slots[vocab_slot(v, s, n)];
    if (!e) return false;
    *id = v->ids[e - 1];
    return true;
}

void tk_vocab_free(tk_vocab *v)
{
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v->ids);
    free(v->slots);
    memset(v, 0, sizeof *v);
}

// ---- merges: (left, right) -> (rank, merged) ----

#define EMPTY_KEY UINT64_MAX

static size_t merge_slot(const tk_merges *m, uint64_t key)
{
    uint64_t h = (key ^ (key >> 31)) * 0xBF58476D1CE4E5B9ull;   /* both ids reach the low bits */
    h ^= h >> 32;
    size_t i = (size_t)h & (m->cap - 1);
    while (m->slots[i].key != EMPTY_KEY && m->slots[i].key != key) i = (i + 1) & (m->cap - 1);
    return i;
}

void tk_merges_init(tk_merges *m, size_t n_expected)
{
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(n_expected * 2 + 1);
    m->slots = ct_malloc(m->cap * sizeof *m->slots);
    for (size_t i = 0; i < m->cap; i++) m->slots[i].key = EMPTY_KEY;
}

void tk_merges_add(tk_merges *m, uint32_t left, uint32_t right, uint32_t rank, uint32_t merged)
{
    if ((m->n + 1) * 2 > m->cap) {
        tk_merges old = *m;
        tk_merges_init(m, old.cap);
        for (size_t i = 0; i < old.cap; i++)
            if (old.slots[i].key != EMPTY_KEY) {
                m->slots[merge_slot(m, old.slots[i].key)] = old.slots[i];
                m->n++;
            }
        tk_merges_free(&old);
    }
    uint64_t key = (uint64_t)left << 32 | right;
    size_t s = merge_slot(m, key);
    if (m->slots[s].key == EMPTY_KEY) m->n++;
    m->slots[s] = (tk_merge_slot){key, rank, merged};
}

static inline bool merges_find(const tk_merges *m, uint32_t left, uint32_t right, uint32_t *rank,
                               uint32_t *merged)
{
    const tk_merge_slot *e = &m->slots[merge_slot(m, (uint64_t)left << 32 | right)];
    if (e->key == EMPTY_KEY) return false;
    *rank = e->rank;
    *merged = e->merged;
    return true;
}

void tk_merges_free(tk_merges *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}

// ---- the word cache ----

struct tk_cache {
    pthread_mutex_t lock[TK_CACHE_SHARDS];
    tk_cache_slot slot[TK_CACHE_SLOTS];
};

tk_cache *tk_cache_new(void)
{
    tk_cache *c = ct_calloc(1, sizeof *c);
    for (int i = 0; i < TK_CACHE_SHARDS; i++) pthread_mutex_init(&c->lock[i], NULL);
    return c;
}

void tk_cache_free(tk_cache *c)
{
    if (!c) return;
    for (int i = 0; i < TK_CACHE_SHARDS; i++) pthread_mutex_destroy(&c->lock[i]);
    free(c);
}

static bool cache_get(tk_cache *c, size_t slot, const char *w, size_t n, ct_ids *out)
{
    pthread_mutex_t *m = &c->lock[slot % TK_CACHE_SHARDS];
    if (pthread_mutex_trylock(m)) return false;
    const tk_cache_slot *e = &c->slot[slot];
    bool hit = e->len == n && memcmp(e->word, w, n) == 0;
    for (size_t i = 0; hit && i < e->n_ids; i++) ct_ids_push(out, e->ids[i]);
    pthread_mutex_unlock(m);
    return hit;
}

static void cache_put(tk_cache *c, size_t slot, const char *w, size_t n, const uint32_t *ids, size_t n_ids)
{
    if (n_ids > TK_CACHE_IDS) return;
    pthread_mutex_t *m = &c->lock[slot % TK_CACHE_SHARDS];
    if (pthread_mutex_trylock(m)) return;
    tk_cache_slot *e = &c->slot[slot];
    e->len = (uint8_t)n;
    e->n_ids = (uint8_t)n_ids;
    memcpy(e->word, w, n);
    memcpy(e->ids, ids, n_ids * sizeof *ids);
    pthread_mutex_unlock(m);
}

// ---- one word ----

struct tk_symbol {
    uint32_t id;
    int32_t prev, next;   /* -1 at the ends */
    bool removed;         /* merged into its left neighbour */
};

struct tk_merge_cand {
    uint32_t rank, pos, merged;
};

static bool cand_before(const struct tk_merge_cand *a, const struct tk_merge_cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(tk_bpe_scratch *s, size_t *n, struct tk_merge_cand c)
{
    if (*n == s->heap_cap) {
        s->heap_cap = s->heap_cap ? s->heap_cap * 2 : 64;
        s->heap = ct_realloc(s->heap, s->heap_cap * sizeof *s->heap);
    }
    size_t i = (*n)++;
    while (i > 0 && cand_before(&c, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = c;
}

static struct tk_merge_cand heap_pop(tk_bpe_scratch *s, size_t *n)
{
    struct tk_merge_cand top = s->heap[0], last = s->heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_before(&s->heap[c + 1], &s->heap[c])) c++;
        if (!cand_before(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (*n) s->heap[i] = last;
    return top;
}

static void add_symbol(tk_bpe_scratch *s, size_t *n, uint32_t id)
{
    if (*n == s->sym_cap) {
        s->sym_cap = s->sym_cap ? s->sym_cap * 2 : 64;
        s->sym = ct_realloc(s->sym, s->sym_cap * sizeof *s->sym);
    }
    s->sym[*n] = (struct tk_symbol){id, (int32_t)*n - 1, (int32_t)*n + 1, false};
    (*n)++;
}

static void push_pair(const tk_bpe *b, tk_bpe_scratch *s, size_t *heap_n, size_t pos, uint32_t left,
                      uint32_t right)
{
    uint32_t rank, merged;
    if (merges_find(&b->merges, left, right, &rank, &merged))
        heap_push(s, heap_n, (struct tk_merge_cand){rank, (uint32_t)pos, merged});
}

static void merge_all(const tk_bpe *b, tk_bpe_scratch *s, size_t n)
{
    size_t heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(b, s, &heap_n, i, s->sym[i].id, s->sym[i + 1].id);
    while (heap_n) {
        struct tk_merge_cand top = heap_pop(s, &heap_n);
        struct tk_symbol *cur = &s->sym[top.pos];
        if (cur->removed || cur->next < 0) continue;
        struct tk_symbol *right = &s->sym[cur->next];
        uint32_t rank, merged;
        /* stale: the pair at pos changed since this candidate was pushed */
        if (!merges_find(&b->merges, cur->id, right->id, &rank, &merged) || merged != top.merged) continue;
        cur->id = top.merged;
        right->removed = true;
        cur->next = right->next;
        if (cur->next >= 0) s->sym[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) push_pair(b, s, &heap_n, (size_t)cur->prev, s->sym[cur->prev].id, cur->id);
        if (cur->next >= 0) push_pair(b, s, &heap_n, top.pos, cur->id, s->sym[cur->next].id);
    }
}

/* The same merges for a short word: find the lowest-ranked pair by scanning,
 * merge, rescan. Equivalent to the heap (the current order of symbols is the
 * order of their first positions, so "leftmost" agrees) and, below ~32
 * symbols, faster: no stale entries to look up again. */
#define TK_SCAN_MAX 32

static size_t merge_short(const tk_bpe *b, uint32_t *id, size_t n)
{
    uint32_t rank[TK_SCAN_MAX], merged[TK_SCAN_MAX];
    for (size_t i = 0; i + 1 < n; i++)
        if (!merges_find(&b->merges, id[i], id[i + 1], &rank[i], &merged[i])) rank[i] = UINT32_MAX;
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == UINT32_MAX) break;
        id[best] = merged[best];
        for (size_t i = best + 1; i + 1 < n; i++) {
            id[i] = id[i + 1];
            rank[i] = rank[i + 1];
            merged[i] = merged[i + 1];
        }
        n--;
        if (best > 0 && !merges_find(&b->merges, id[best - 1], id[best], &rank[best - 1], &merged[best - 1]))
            rank[best - 1] = UINT32_MAX;
        if (best + 1 < n && !merges_find(&b->merges, id[best], id[best + 1], &rank[best], &merged[best]))
            rank[best] = UINT32_MAX;
    }
    return n;
}

/* The vocab id of one symbol's text (a character, with the prefix/suffix). */
static bool symbol_id(const tk_bpe *b, const char *s, size_t n, uint32_t *id)
{
    size_t k;
    uint32_t cp = tk_utf8_decode(s, &k);
    if (k == n && cp < 0x10000) {   /* one BMP character: the table */
        if (b->bmp_id[cp] < 0) return false;
        *id = (uint32_t)b->bmp_id[cp];
        return true;
    }
    return tk_vocab_find(&b->vocab, s, n, id);
}

int tk_bpe_word(const tk_bpe *b, tk_bpe_scratch *s, const char *w, size_t n, ct_ids *out,
                const char *src, ct_error *err)
{
    uint32_t id;
    if (b->ignore_merges && tk_vocab_find(&b->vocab, w, n, &id)) {
        ct_ids_push(out, id);
        return CT_OK;
    }
    size_t slot = n <= TK_CACHE_WORD ? (size_t)hash_bytes(w, n) % TK_CACHE_SLOTS : 0, first = out->len;
    if (n <= TK_CACHE_WORD && cache_get(b->cache, slot, w, n, out)) return CT_OK;
    size_t nsym = 0;
    bool unk_pending = false;
    for (size_t i = 0; i < n;) {
        size_t cl = tk_utf8_len((unsigned char)w[i]);
        const char *key = w + i;
        size_t key_len = cl;
        if ((i > 0 && b->prefix) || (i + cl == n && b->suffix)) {
            s->word.len = 0;
            if (i > 0 && b->prefix) tk_buf_put(&s->word, b->prefix, b->prefix_len);
            tk_buf_put(&s->word, w + i, cl);
            if (i + cl == n && b->suffix) tk_buf_put(&s->word, b->suffix, b->suffix_len);
            key = s->word.data;
            key_len = s->word.len;
        }
        i += cl;
        if (symbol_id(b, key, key_len, &id)) {
            if (unk_pending) add_symbol(s, &nsym, b->unk_id);
            unk_pending = false;
            add_symbol(s, &nsym, id);
            continue;
        }
        if (b->byte_fallback) {
            size_t k = 0;
            while (k < key_len && b->byte_id[(unsigned char)key[k]] >= 0) k++;
            if (k == key_len) {   /* HF adds the bytes before a pending unk (model.rs) */
                for (k = 0; k < key_len; k++) add_symbol(s, &nsym, (uint32_t)b->byte_id[(unsigned char)key[k]]);
                continue;
            }
        }
        if (!b->has_unk) continue;
        if (!b->unk_in_vocab)
            return CT_FAIL_INPUT(err, "%s: model.unk_token '%s' is not in model.vocab (needed for '%.*s')", src,
                                 b->unk_token, (int)cl, w + i - cl);
        if (unk_pending && !b->fuse_unk) add_symbol(s, &nsym, b->unk_id);
        unk_pending = true;
    }
    if (unk_pending) add_symbol(s, &nsym, b->unk_id);
    if (nsym == 0) return CT_OK;   /* every character unknown, and no unk_token: HF drops them */
    if (nsym <= TK_SCAN_MAX) {
        uint32_t ids[TK_SCAN_MAX];
        for (size_t i = 0; i < nsym; i++) ids[i] = s->sym[i].id;
        size_t k = merge_short(b, ids, nsym);
        for (size_t i = 0; i < k; i++) ct_ids_push(out, ids[i]);
        if (n <= TK_CACHE_WORD) cache_put(b->cache, slot, w, n, out->data + first, k);
        return CT_OK;
    }
    s->sym[nsym - 1].next = -1;
    merge_all(b, s, nsym);
    for (size_t i = 0; i < nsym; i++)
        if (!s->sym[i].removed) ct_ids_push(out, s->sym[i].id);
    return CT_OK;
}

void tk_bpe_scratch_free(tk_bpe_scratch *s)
{
    free(s->sym);
    free(s->heap);
    tk_buf_free(&s->word);
    memset(s, 0, sizeof *s);
}

void tk_bpe_free(tk_bpe *b)
{
    tk_vocab_free(&b->vocab);
    tk_merges_free(&b->merges);
    tk_cache_free(b->cache);
    free(b->bmp_id);
    free(b->unk_token);
    free(b->prefix);
    free(b->suffix);
    memset(b, 0, sizeof *b);
}
