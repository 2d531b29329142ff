/* safetensors.h — the safetensors format (docs/ARCHITECTURE.md): an mmap reader
 * that also opens sharded folders through model.safetensors.index.json, and a
 * writer (header padded with spaces to 8 bytes, tensors sorted by dtype size then
 * name, metadata {"format":"pt"}, written atomically).
 *
 * The reader validates as the reference implementation does: header length
 * <= 100,000,000; JSON object; known dtypes; data_offsets contiguous from 0 with
 * no holes or overlaps; end - begin == numel * dtype size; 8 + N + last end ==
 * file size; no duplicate names; shape products checked for overflow. Names
 * holding a control character (below 0x20) are refused, so every message that
 * names a tensor is one line. Every failure is a one-line CT_ERR_INPUT naming
 * the file. */
#ifndef CT_SAFETENSORS_H
#define CT_SAFETENSORS_H

#include "common.h"

typedef enum {
    CT_DTYPE_BOOL, CT_DTYPE_U8, CT_DTYPE_I8, CT_DTYPE_F8_E5M2, CT_DTYPE_F8_E4M3,
    CT_DTYPE_I16, CT_DTYPE_U16, CT_DTYPE_F16, CT_DTYPE_BF16,
    CT_DTYPE_I32, CT_DTYPE_U32, CT_DTYPE_F32,
    CT_DTYPE_I64, CT_DTYPE_U64, CT_DTYPE_F64,
    CT_DTYPE_COUNT
} ct_dtype;

const char *ct_dtype_name(ct_dtype d);          /* "BF16" */
size_t ct_dtype_size(ct_dtype d);               /* bytes per element */
int ct_dtype_from_name(const char *name, ct_dtype *out); /* CT_OK or CT_ERR_INPUT */

#define ST_MAX_DIMS 8

typedef struct st_tensor {
    const char *name;
    ct_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    const void *data;      /* points into the mmap'd file; not aligned in general */
    size_t nbytes;
    const char *file;      /* the file holding it */
} st_tensor;

typedef struct st_reader st_reader;

/* Opens PATH: a .safetensors file, or a folder holding model.safetensors or
 * model.safetensors.index.json (+ the shards it names; every tensor must be in
 * the shard weight_map says). Returns NULL and fills err on failure. When a
 * folder holds both, model.safetensors wins (as in transformers). Shard names
 * must be plain file names (no '/', no ".."); each shard is opened once, and
 * weight_map must list exactly the tensors the shards hold. */
st_reader *st_open(const char *path, ct_error *err);
void st_close(st_reader *r);
size_t st_count(const st_reader *r);
const st_tensor *st_at(const st_reader *r, size_t i);          /* sorted by name */
const st_tensor *st_find(const st_reader *r, const char *name); /* NULL if absent */
/* Value of a __metadata__ key of the (first) file, or NULL. */
const char *st_metadata(const st_reader *r, const char *key);

/* Finds NAME and checks dtype and shape; fails with "FILE: tensor NAME: shape
 * [a, b] does not match the config's [c, d]" style messages. */
int st_expect(const st_reader *r, const char *name, ct_dtype dtype, int ndim,
              const int64_t *shape, const st_tensor **out, ct_error *err);

/* S as a one-line message may quote it: bytes below 0x20 written '?', cut
 * after 120 bytes ("..."), into buf (n bytes); returns buf. For strings from
 * untrusted files that are not tensor names (st_open refuses those). */
const char *st_printable(char *buf, size_t n, const char *s);

typedef struct st_writer st_writer;
st_writer *st_writer_new(void);
/* Adds a tensor; data is copied. name must be unique (checked: CT_ERR_INPUT). */
int st_writer_add(st_writer *w, const char *name, ct_dtype dtype, int ndim,
                  const int64_t *shape, const void *data, ct_error *err);
/* Writes one file atomically (tmp + fsync + rename) with {"format":"pt"}. */
int st_writer_save(st_writer *w, const char *path, ct_error *err);
/* Writes DIR/model.safetensors, or when the total exceeds max_shard_bytes,
 * DIR/model-0000i-of-0000n.safetensors + model.safetensors.index.json (written
 * last; tensors split greedily in name order, one larger than the limit alone in
 * its shard). Creates DIR; removes the file of the other layout left by an
 * earlier save, which would otherwise shadow or contradict this one. */
int st_writer_save_sharded(st_writer *w, const char *dir, size_t max_shard_bytes, ct_error *err);
void st_writer_free(st_writer *w);

#endif
