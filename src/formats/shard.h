/* shard.h — tokenized shards: one file holding documents of uint32 tokens with a
 * per-token loss mask, mmap'd and validated on open (docs/SHARDS.md has the
 * byte layout: magic + version header, document offsets, tokens, loss mask,
 * CRC32 (zlib) of the payload).
 *
 * Loss-mask convention: mask[j] == 1 means token j is a label (it is predicted
 * from position j-1). HF labels == -100 map to mask 0.
 * Ownership: shard_open returns a handle the caller frees with shard_close. */
#ifndef CT_SHARD_H
#define CT_SHARD_H

#include "common.h"

typedef struct shard shard;

#define SHARD_HEADER_BYTES 64   /* the payload (offsets, tokens, mask) starts here */

/* Opens and validates PATH: header fields, sizes against the file size, monotone
 * offsets, token ids < vocab_size (0: skip this check), CRC. On failure returns
 * NULL with a one-line CT_ERR_INPUT such as
 * "data/a.shard: CRC mismatch (stored 1a2b3c4d, computed 99aa0011)" or
 * "data/a.shard: document 17 has token id 200000 >= vocab_size 151936"
 * (CT_ERR_RUNTIME only when the OS fails: stat, mmap). A shard holds >= 1
 * document and no document is empty. The file is read in place (mmap). */
shard *shard_open(const char *path, uint32_t vocab_size, ct_error *err);
void shard_close(shard *s);
const char *shard_path(const shard *s);
size_t shard_num_docs(const shard *s);
size_t shard_num_tokens(const shard *s);
uint32_t shard_max_token(const shard *s);          /* largest token id present */
size_t shard_num_labels(const shard *s);           /* tokens whose mask is 1 */
uint32_t shard_crc32(const shard *s);              /* payload CRC32, verified on open */
/* Tokens and mask of document i (i < num_docs); *len receives its length. */
const uint32_t *shard_doc_tokens(const shard *s, size_t i, size_t *len);
const uint8_t  *shard_doc_mask(const shard *s, size_t i);

/* Writer: documents are buffered in memory (5 bytes a token, held once) and
 * written atomically by save. */
typedef struct shard_writer shard_writer;
shard_writer *shard_writer_new(void);
/* Adds one document (len >= 1; tokens and mask are copied). mask values are 0 or
 * 1; mask may be NULL (every token a label). Breaking either rule is a bug
 * (CT_ASSERT), so callers validate user data first. */
void shard_writer_add(shard_writer *w, const uint32_t *tokens, const uint8_t *mask, size_t len);
/* For a caller that fills a document in place instead of copying it in (ctune
 * prepare parses a line straight into it): *tokens and *mask receive room for
 * len >= 1 tokens after the documents so far, valid until the next call on w.
 * Nothing is added until shard_writer_commit; another reserve replaces it. */
void shard_writer_reserve(shard_writer *w, size_t len, uint32_t **tokens, uint8_t **mask);
/* Adds the first len tokens (1 <= len <= reserved) of the reserved document,
 * under shard_writer_add's rules. */
void shard_writer_commit(shard_writer *w, size_t len);
size_t shard_writer_num_docs(const shard_writer *w);
/* Writes PATH atomically (PATH.tmp, fsync, rename) straight from the writer's
 * buffers: no copy of the file is made in memory. The writer stays usable.
 * A writer with no documents is CT_ERR_INPUT: an empty shard cannot be opened. */
int shard_writer_save(shard_writer *w, const char *path, ct_error *err);
void shard_writer_free(shard_writer *w);

/* A dataset: several shards seen as one list of documents. */
typedef struct ct_dataset {
    int n_shards;
    shard **shards;
    size_t num_docs;            /* total */
    size_t num_tokens;          /* total */
    size_t *doc_base;           /* [n_shards + 1]: first global doc index of each shard */
} ct_dataset;

/* Opens every shard that the patterns name: each pattern is expanded with glob(3)
 * (matches sorted; a literal path is a pattern matching itself), patterns in the
 * order given; a file named twice is used twice. A pattern matching nothing is
 * CT_ERR_INPUT "'data/x-*.shard' matches no file". Errors do not know the config
 * key: callers prefix it ("data.train_files: 'data/x-*.shard' matches no file").
 * On failure ds is left zeroed (dataset_close on it is harmless). */
int dataset_open(ct_dataset *ds, const char *const *patterns, int n_patterns,
                 uint32_t vocab_size, ct_error *err);
void dataset_close(ct_dataset *ds);
/* Tokens of global document doc (< num_docs); *len and *mask (either may be NULL)
 * receive its length and loss mask. O(log n_shards). */
const uint32_t *dataset_doc(const ct_dataset *ds, size_t doc, size_t *len, const uint8_t **mask);

#endif
