/* tokenizer_internal.h — what the tokenizer's files share: tokenizer.c (loading
 * tokenizer.json, the lookups), tokenizer_encode.c (added tokens, normalizers,
 * pre-tokenizers), tokenizer_decode.c (the decoders), tokenizer_bpe.c (the
 * vocab, merges and the BPE model) and tokenizer_text.c (UTF-8, PCRE2
 * patterns, Unicode normalization). Not a public contract: callers see
 * tokenizer.h. */
#ifndef CT_TOKENIZER_INTERNAL_H
#define CT_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

/* ---- byte strings ---- */

/* A growable byte buffer; pieces refer to it by offset since it may move. */
typedef struct tk_buf {
    char *data;
    size_t len, cap;
} tk_buf;
void tk_buf_reserve(tk_buf *b, size_t extra);
void tk_buf_put(tk_buf *b, const char *s, size_t n);
void tk_buf_free(tk_buf *b);

/* ---- tokenizer_text.c: UTF-8 ---- */

#define TK_REPLACEMENT "\xEF\xBF\xBD"   /* U+FFFD */

/* Length of the UTF-8 sequence starting at s[0] (valid text assumed). */
static inline size_t tk_utf8_len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}
/* Decodes the code point at s (valid UTF-8) and stores its length in *n. */
uint32_t tk_utf8_decode(const char *s, size_t *n);
/* Appends s[0..n) to b with every maximal ill-formed subpart replaced by
 * U+FFFD (the rule of Python's 'replace' and Rust's from_utf8_lossy). */
void tk_utf8_sanitize(tk_buf *b, const char *s, size_t n);
/* Rust's char::is_whitespace (the White_Space property). */
bool tk_is_whitespace(uint32_t cp);

/* A literal string or a regex, as tokenizer.json's {"String": s} / {"Regex": r}. */
typedef struct tk_pattern {
    char *literal;         /* NULL for a regex */
    size_t literal_len;
    pcre2_code *re;
} tk_pattern;

/* Compiles an Oniguruma regex (what HF compiles tokenizer.json regexes with)
 * into PCRE2 with UTF + UCP (and JIT when available), translating what differs
 * (\s, \w, \h and line anchors). field names it in the error. */
int tk_pattern_regex(tk_pattern *p, const char *regex, size_t len, const char *src, const char *field,
                     ct_error *err);
/* A literal: matched with memmem, or (empty) as PCRE2 matches an empty regex. */
int tk_pattern_literal(tk_pattern *p, const char *s, size_t len, const char *src, const char *field,
                       ct_error *err);
void tk_pattern_free(tk_pattern *p);

/* Per-call matching state for the PCRE2 patterns of one tokenizer. */
typedef struct tk_matcher {
    pcre2_match_data *md;
    pcre2_match_context *mc;
} tk_matcher;
void tk_matcher_init(tk_matcher *m);
void tk_matcher_free(tk_matcher *m);

/* Every match of p in s[0..n), non-overlapping from the left, with Oniguruma's
 * rule for empty matches (one right after the previous match is skipped):
 * appends (start, end) pairs to *spans. */
typedef struct tk_spans {
    size_t *v;          /* start, end, start, end, ... */
    size_t len, cap;    /* in size_t's */
} tk_spans;
void tk_spans_push(tk_spans *s, size_t a, size_t b);
int tk_pattern_find_all(const tk_pattern *p, tk_matcher *m, const char *s, size_t n, tk_spans *spans,
                        const char *src, ct_error *err);
/* Whether regex re matches at s[pos..] (anchored) within s[0..n). */
bool tk_regex_matches_at(const pcre2_code *re, tk_matcher *m, const char *s, size_t n, size_t pos);
/* Appends s with every match of p replaced by content. */
int tk_pattern_replace(const tk_pattern *p, tk_matcher *m, const char *s, size_t n, const char *content,
                       size_t content_len, tk_buf *out, const char *src, ct_error *err);

typedef enum { TK_NF_C, TK_NF_D, TK_NF_KC, TK_NF_KD } tk_nf;
/* Appends the normal form of s (valid UTF-8) to out. */
void tk_unicode_normalize(tk_nf form, const char *s, size_t n, tk_buf *out);

/* ---- the pipeline, as loaded from tokenizer.json ---- */

typedef enum { TK_NORM_NF, TK_NORM_PREPEND, TK_NORM_REPLACE } tk_norm_type;
typedef struct tk_normalizer {
    tk_norm_type type;
    tk_nf nf;              /* TK_NORM_NF */
    tk_pattern pattern;    /* TK_NORM_REPLACE */
    char *str;             /* Prepend: the prefix; Replace: the content */
    size_t str_len;
} tk_normalizer;

typedef enum { TK_SPLIT_REMOVED, TK_SPLIT_ISOLATED, TK_SPLIT_MERGED_PREV, TK_SPLIT_MERGED_NEXT,
               TK_SPLIT_CONTIGUOUS } tk_split_behavior;
typedef enum { TK_PREPEND_ALWAYS, TK_PREPEND_FIRST, TK_PREPEND_NEVER } tk_prepend_scheme;
typedef enum { TK_PRE_SPLIT, TK_PRE_BYTELEVEL, TK_PRE_METASPACE } tk_pre_type;
typedef struct tk_pretokenizer {
    tk_pre_type type;
    tk_pattern pattern;           /* Split; ByteLevel with use_regex (the GPT-2 regex) */
    tk_split_behavior behavior;   /* Split */
    bool invert;                  /* Split */
    bool add_prefix_space;        /* ByteLevel */
    bool use_regex;               /* ByteLevel */
    char replacement[5];          /* Metaspace: one character, UTF-8 */
    size_t replacement_len;
    tk_prepend_scheme prepend;    /* Metaspace */
    bool split;                   /* Metaspace */
} tk_pretokenizer;

typedef enum { TK_DEC_BYTELEVEL, TK_DEC_METASPACE, TK_DEC_REPLACE, TK_DEC_BYTEFALLBACK, TK_DEC_FUSE,
               TK_DEC_STRIP } tk_dec_type;
typedef struct tk_decoder {
    tk_dec_type type;
    tk_pattern pattern;           /* Replace */
    char *content;                /* Replace */
    size_t content_len;
    uint32_t strip_char;          /* Strip */
    size_t strip_start, strip_stop;
    char replacement[5];          /* Metaspace */
    size_t replacement_len;
    tk_prepend_scheme prepend;    /* Metaspace */
} tk_decoder;

/* An added token. form is what encode matches and decode emits: content, or
 * content through the normalizer when normalized (as HF keeps it). */
typedef struct tk_added {
    uint32_t id;
    char *content, *form;
    size_t content_len, form_len;
    bool special, normalized, lstrip, rstrip, single_word;
} tk_added;

/* A byte trie over added-token forms: the leftmost-longest matcher of HF's
 * aho-corasick (MatchKind::LeftmostLongest), one per matching pass. */
typedef struct tk_trie_node {
    uint32_t first_child, next_sibling;   /* node indices, 0 = none (0 is the root) */
    int32_t added;                        /* index into added[], -1 if no token ends here */
    unsigned char byte;
} tk_trie_node;
typedef struct tk_trie {
    tk_trie_node *nodes;
    size_t n, cap;
    bool first_byte[256];                 /* bytes some token starts with */
} tk_trie;

/* ---- tokenizer_bpe.c: vocab and merges ---- */

/* String -> id, open addressing over one arena of token bytes. */
typedef struct tk_vocab {
    char *bytes;                /* every token's bytes, back to back */
    size_t bytes_len;
    uint32_t *off, *len;        /* (n) where token i sits in bytes */
    uint32_t *ids;              /* (n) */
    size_t n;
    uint32_t *slots;            /* (cap) index + 1 into the arrays, 0 = empty */
    size_t cap;
} tk_vocab;
void tk_vocab_init(tk_vocab *v, size_t n_expected);
/* Adds (token, id); an existing token keeps its first id. */
void tk_vocab_add(tk_vocab *v, const char *s, size_t n, uint32_t id);
bool tk_vocab_find(const tk_vocab *v, const char *s, size_t n, uint32_t *id);
void tk_vocab_free(tk_vocab *v);

/* (left id, right id) -> (rank, merged id); one 16-byte slot per entry, so a
 * lookup in a table larger than the cache costs one miss. */
typedef struct tk_merge_slot {
    uint64_t key;               /* left << 32 | right, UINT64_MAX = empty */
    uint32_t rank, merged;
} tk_merge_slot;
typedef struct tk_merges {
    tk_merge_slot *slots;       /* (cap) */
    size_t n, cap;
} tk_merges;
void tk_merges_init(tk_merges *m, size_t n_expected);
/* A later duplicate pair overrides the earlier one, as HF's map does. */
void tk_merges_add(tk_merges *m, uint32_t left, uint32_t right, uint32_t rank, uint32_t merged);
void tk_merges_free(tk_merges *m);

/* Results of short words, shared by the threads that encode with one
 * tokenizer (HF keeps such a cache too): direct-mapped slots in shards, each
 * shard behind a mutex that a thread only tries, so a busy shard is a miss and
 * never a wait. The results do not depend on it. */
#define TK_CACHE_SLOTS 16384
#define TK_CACHE_SHARDS 64
#define TK_CACHE_WORD 24        /* longest word kept, bytes */
#define TK_CACHE_IDS 8          /* most ids kept per word */
typedef struct tk_cache_slot {
    uint8_t len, n_ids;         /* len 0: empty */
    char word[TK_CACHE_WORD];
    uint32_t ids[TK_CACHE_IDS];
} tk_cache_slot;
typedef struct tk_cache tk_cache;
tk_cache *tk_cache_new(void);
void tk_cache_free(tk_cache *c);

typedef struct tk_bpe {
    tk_vocab vocab;
    tk_merges merges;
    int32_t *bmp_id;            /* (0x10000) id of each one-character BMP token, -1 if none */
    int32_t byte_id[256];       /* byte_fallback: the id of <0xNN>, -1 if absent */
    bool byte_fallback, ignore_merges, fuse_unk;
    bool has_unk;               /* model.unk_token is set */
    bool unk_in_vocab;
    uint32_t unk_id;
    char *unk_token;
    char *prefix, *suffix;      /* continuing_subword_prefix, end_of_word_suffix (NULL if none) */
    size_t prefix_len, suffix_len;
    tk_cache *cache;
} tk_bpe;

/* Per-call scratch of the BPE model. */
typedef struct tk_bpe_scratch {
    struct tk_symbol *sym;
    size_t sym_cap;
    struct tk_merge_cand *heap;
    size_t heap_cap;
    tk_buf word;
} tk_bpe_scratch;
void tk_bpe_scratch_free(tk_bpe_scratch *s);
/* Appends the ids of one pre-tokenized word (valid UTF-8, n > 0). */
int tk_bpe_word(const tk_bpe *b, tk_bpe_scratch *s, const char *w, size_t n, ct_ids *out,
                const char *src, ct_error *err);
void tk_bpe_free(tk_bpe *b);

/* The GPT-2 byte <-> character map of ByteLevel: printable Latin-1 bytes stand
 * for themselves, the other 68 take U+0100.. in byte order. */
static inline uint32_t tk_byte_to_cp(unsigned char b)
{
    if (b <= 32) return 256u + b;
    if (b >= 127 && b <= 160) return 289u + (b - 127u);
    if (b == 173) return 323;
    return b;
}
/* The inverse: the byte a code point stands for, -1 for code points outside the map. */
static inline int tk_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return (cp <= 32 || (cp >= 127 && cp <= 160) || cp == 173) ? -1 : (int)cp;
    if (cp <= 288) return (int)(cp - 256);
    if (cp <= 322) return (int)(cp - 289 + 127);
    return cp == 323 ? 173 : -1;
}

/* ---- the tokenizer ---- */

struct ct_tokenizer {
    char *source;               /* the tokenizer.json path, for errors */
    tk_normalizer *norm;        /* Sequences are flattened into these lists */
    size_t n_norm;
    tk_pretokenizer *pre;
    size_t n_pre;
    tk_decoder *dec;
    size_t n_dec;
    bool has_decoder;           /* false: decode joins tokens with spaces */
    tk_bpe bpe;
    tk_added *added;
    size_t n_added;
    tk_trie trie_raw, trie_norm;       /* normalized = false / true tokens */
    pcre2_code *word_char;             /* \w of Rust's regex, for single_word */
    int32_t *added_of_id;              /* (vocab_size) index into added[], -1 if none */
    const char **id_str;               /* (vocab_size) decode form of each id, NULL if none */
    uint32_t *id_len;
    size_t vocab_size;
};

/* tokenizer_encode.c: normalizes s[0..n) with the tokenizer's normalizers. */
int tk_normalize(const ct_tokenizer *t, tk_matcher *m, const char *s, size_t n, tk_buf *out,
                 ct_error *err);

#endif
