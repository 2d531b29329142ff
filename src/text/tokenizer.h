/* tokenizer.h — a Hugging Face model folder's tokenizer.json, encoding and
 * decoding exactly as the `tokenizers` library does (tests/test_tokenizer.c
 * checks ids and decoded text against it on a stress corpus).
 *
 * Supported: model BPE (merges by rank, ignore_merges, byte_fallback, unk_token
 * and fuse_unk, continuing_subword_prefix, end_of_word_suffix); normalizers
 * NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence; pre-tokenizers Split,
 * ByteLevel, Metaspace, Sequence; decoders ByteLevel, Metaspace, Replace,
 * ByteFallback, Fuse, Strip, Sequence; added tokens with their special,
 * normalized, lstrip, rstrip and single_word flags. That covers the byte-level
 * BPE of Qwen2/3, Llama-3 and GPT-OSS and the SentencePiece-style BPE of
 * Llama-2 and Mistral. Anything else is an input error naming the file and the
 * field ("tokenizer.json: model.type 'WordPiece' is not supported (expected BPE)").
 * The post-processor (BOS/EOS templates), truncation and padding are not
 * applied: encode is HF's encode(text, add_special_tokens=False), and the chat
 * template that a caller renders supplies BOS and turn markers as text.
 *
 * Text: encode takes UTF-8; each ill-formed sequence becomes U+FFFD as Python's
 * bytes.decode('utf-8', 'replace') and Rust's from_utf8_lossy make it (one per
 * maximal ill-formed subpart), so a file with stray bytes encodes as HF encodes
 * the text Python reads from it. Decode always returns well-formed UTF-8.
 *
 * Threads: a loaded tokenizer is immutable; any number of threads may call
 * encode and decode on it at once (each call keeps its own scratch).
 * Ownership: tokenizer_load returns a handle the caller frees with tokenizer_free. */
#ifndef CT_TOKENIZER_H
#define CT_TOKENIZER_H

#include "common.h"

/* A growable array of token ids; zero-initialise, free with ct_ids_free. */
typedef struct ct_ids {
    uint32_t *data;
    size_t len, cap;
} ct_ids;
void ct_ids_push(ct_ids *ids, uint32_t id);
void ct_ids_free(ct_ids *ids);

typedef struct ct_tokenizer ct_tokenizer;

/* Reads MODEL_DIR/tokenizer.json. Returns NULL and fills err on failure:
 * CT_ERR_INPUT for a missing, malformed or unsupported file. */
ct_tokenizer *tokenizer_load(const char *model_dir, ct_error *err);
/* The same from the text of a tokenizer.json; source names it in errors. */
ct_tokenizer *tokenizer_load_json(const char *text, size_t len, const char *source, ct_error *err);
void tokenizer_free(ct_tokenizer *t);

/* Appends the ids of text[0..len) to out (out is not cleared, so a document can
 * be encoded piece by piece; pieces are encoded independently, as HF would
 * encode each). parse_special: true matches special added tokens written in
 * the text (HF's default); false encodes them as plain text (HF's
 * encode_special_tokens = True, transformers' split_special_tokens), so user
 * text cannot forge a turn marker. Non-special added tokens match either way.
 * Fails (CT_ERR_INPUT) only when a tokenizer.json regex exceeds PCRE2's match
 * limit on this text, or the text needs model.unk_token and the vocab lacks it;
 * out then holds what was appended before the failure. */
int tokenizer_encode(const ct_tokenizer *t, const char *text, size_t len, bool parse_special,
                     ct_ids *out, ct_error *err);

/* Decodes ids into *text (malloc'd, NUL-terminated, well-formed UTF-8; caller
 * frees) and its length into *len. Ids with no token are skipped, as HF does;
 * skip_special leaves out special added tokens (HF's skip_special_tokens).
 * Fails (CT_ERR_INPUT) only when a decoder regex exceeds the match limit. */
int tokenizer_decode(const ct_tokenizer *t, const uint32_t *ids, size_t n, bool skip_special,
                     char **text, size_t *len, ct_error *err);

/* s[0..n) as well-formed UTF-8, each ill-formed sequence one U+FFFD as decode
 * makes them (Python's bytes.decode('utf-8', 'replace')): *text is malloc'd and
 * NUL-terminated (caller frees), *len its length. For text that did not come
 * through a tokenizer.json (the byte-level tokenizer of the tiny models). */
void tokenizer_utf8_lossy(const char *s, size_t n, char **text, size_t *len);

/* The id of a token string (an added token's content, or a vocab entry), as
 * HF's token_to_id; false when there is none. */
bool tokenizer_token_to_id(const ct_tokenizer *t, const char *token, size_t len, uint32_t *id);
/* The token string of an id (not NUL-terminated; *len gets its length), as HF's
 * id_to_token; NULL when there is none. Lives until tokenizer_free. */
const char *tokenizer_id_to_token(const ct_tokenizer *t, uint32_t id, size_t *len);
/* The largest id + 1 (vocab and added tokens): every id encode returns is below it. */
size_t tokenizer_vocab_size(const ct_tokenizer *t);
/* Whether id is a special added token (what skip_special leaves out). */
bool tokenizer_is_special(const ct_tokenizer *t, uint32_t id);

#endif
