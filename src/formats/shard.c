/* shard.c — the tokenized shard format: validating mmap reader, buffered atomic
 * writer (saved straight from its arrays), and datasets over several shards.
 * The byte layout is in docs/SHARDS.md; the SHARD_OFF_* constants below are
 * that table. */
#include "shard.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* The file is read in place through mmap, so the host must share its byte order. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shard.c maps little-endian shards in place and needs a little-endian host"
#endif

static const char SHARD_MAGIC[8] = {'C', 'T', 'S', 'H', 'A', 'R', 'D', 0};
enum {
    SHARD_VERSION = 1,
    SHARD_TOKEN_BYTES = 4,
    SHARD_OFF_VERSION = 8,
    SHARD_OFF_TOKEN_BYTES = 12,
    SHARD_OFF_NUM_DOCS = 16,
    SHARD_OFF_NUM_TOKENS = 24,
    SHARD_OFF_MAX_TOKEN = 32,
    SHARD_OFF_PAYLOAD_CRC = 36,
    SHARD_OFF_RESERVED = 40,    /* 20 zero bytes */
    SHARD_OFF_HEADER_CRC = 60,  /* crc32 of bytes [0, 60) */
};

struct shard {
    char *path;
    void *map;
    size_t map_len;
    size_t num_docs, num_tokens, num_labels;
    uint32_t max_token, payload_crc;
    const uint64_t *offsets;    /* (num_docs + 1) */
    const uint32_t *tokens;     /* (num_tokens) */
    const uint8_t *mask;        /* (num_tokens) */
};

static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* zlib's crc32 takes a 32-bit length; payloads of many GiB go in chunks. */
static uint32_t crc32_more(uint32_t crc, const uint8_t *p, size_t n)
{
    uLong c = crc;
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)c;
}

static uint32_t crc32_bytes(const uint8_t *p, size_t n) { return crc32_more(0, p, n); }

/* Total file size for a shard of num_docs documents and num_tokens tokens:
 * header, offsets, tokens, mask, zero padding to a multiple of 8.
 * Returns false when it does not fit in size_t (a corrupt header). */
static bool shard_file_size(uint64_t num_docs, uint64_t num_tokens, size_t *out)
{
    size_t n_off, off_bytes, tok_bytes, total;
    if (num_docs >= SIZE_MAX || num_tokens > SIZE_MAX) return false;
    if (!ct_size_add((size_t)num_docs, 1, &n_off)) return false;
    if (!ct_size_mul(n_off, 8, &off_bytes)) return false;
    if (!ct_size_mul((size_t)num_tokens, SHARD_TOKEN_BYTES + 1, &tok_bytes)) return false;
    if (!ct_size_add(SHARD_HEADER_BYTES, off_bytes, &total)) return false;
    if (!ct_size_add(total, tok_bytes, &total)) return false;
    if (!ct_size_add(total, 7, &total)) return false;
    *out = total & ~(size_t)7;
    return true;
}

/* Checks every structural rule of a mapped file; fills the view fields of s.
 * Order matters for the message a user sees: identity (magic, version, width)
 * first, then header integrity, sizes, payload CRC, then the payload's meaning. */
static int shard_validate(shard *s, uint32_t vocab_size, ct_error *err)
{
    const char *path = s->path;
    const uint8_t *b = s->map;
    size_t size = s->map_len;

    if (memcmp(b, SHARD_MAGIC, 8) != 0)
        return CT_FAIL_INPUT(err, "%s: not a ctune shard (bad magic); make shards with `ctune prepare` "
                             "or scripts/prepare_data.py", path);
    uint32_t version = get_u32(b + SHARD_OFF_VERSION);
    if (version != SHARD_VERSION)
        return CT_FAIL_INPUT(err, "%s: shard version %u is not supported (this ctune reads version %d)",
                             path, version, SHARD_VERSION);
    uint32_t width = get_u32(b + SHARD_OFF_TOKEN_BYTES);
    if (width != SHARD_TOKEN_BYTES)
        return CT_FAIL_INPUT(err, "%s: token width %u bytes is not supported (expected %d)",
                             path, width, SHARD_TOKEN_BYTES);
    uint32_t hcrc_stored = get_u32(b + SHARD_OFF_HEADER_CRC);
    uint32_t hcrc = crc32_bytes(b, SHARD_OFF_HEADER_CRC);
    if (hcrc != hcrc_stored)
        return CT_FAIL_INPUT(err, "%s: header CRC mismatch (stored %08x, computed %08x)",
                             path, hcrc_stored, hcrc);
    for (size_t i = SHARD_OFF_RESERVED; i < SHARD_OFF_HEADER_CRC; i++)
        if (b[i] != 0)
            return CT_FAIL_INPUT(err, "%s: reserved header bytes are not zero", path);

    uint64_t num_docs = get_u64(b + SHARD_OFF_NUM_DOCS);
    uint64_t num_tokens = get_u64(b + SHARD_OFF_NUM_TOKENS);
    if (num_docs == 0) return CT_FAIL_INPUT(err, "%s: holds no documents", path);
    size_t want;
    if (!shard_file_size(num_docs, num_tokens, &want))
        return CT_FAIL_INPUT(err, "%s: header claims an impossible size (%llu documents, %llu tokens)",
                             path, (unsigned long long)num_docs, (unsigned long long)num_tokens);
    if (size < want)
        return CT_FAIL_INPUT(err, "%s: truncated: %zu bytes, but its header (%llu documents, %llu tokens) "
                             "needs %zu", path, size, (unsigned long long)num_docs,
                             (unsigned long long)num_tokens, want);
    if (size > want)
        return CT_FAIL_INPUT(err, "%s: %zu trailing bytes after the end its header (%llu documents, "
                             "%llu tokens) implies", path, size - want, (unsigned long long)num_docs,
                             (unsigned long long)num_tokens);

    uint32_t crc_stored = get_u32(b + SHARD_OFF_PAYLOAD_CRC);
    s->payload_crc = crc32_bytes(b + SHARD_HEADER_BYTES, size - SHARD_HEADER_BYTES);
    if (s->payload_crc != crc_stored)
        return CT_FAIL_INPUT(err, "%s: CRC mismatch (stored %08x, computed %08x)",
                             path, crc_stored, s->payload_crc);

    s->num_docs = (size_t)num_docs;
    s->num_tokens = (size_t)num_tokens;
    s->offsets = (const uint64_t *)(b + SHARD_HEADER_BYTES);
    s->tokens = (const uint32_t *)(s->offsets + s->num_docs + 1);
    s->mask = (const uint8_t *)(s->tokens + s->num_tokens);

    if (s->offsets[0] != 0)
        return CT_FAIL_INPUT(err, "%s: first document offset is %llu, expected 0",
                             path, (unsigned long long)s->offsets[0]);
    for (size_t i = 0; i < s->num_docs; i++) {
        uint64_t a = s->offsets[i], e = s->offsets[i + 1];
        if (e == a) return CT_FAIL_INPUT(err, "%s: document %zu is empty", path, i);
        if (e < a)
            return CT_FAIL_INPUT(err, "%s: document offsets decrease at document %zu (%llu after %llu)",
                                 path, i + 1, (unsigned long long)e, (unsigned long long)a);
    }
    if (s->offsets[s->num_docs] != num_tokens)
        return CT_FAIL_INPUT(err, "%s: last document offset %llu does not match num_tokens %llu",
                             path, (unsigned long long)s->offsets[s->num_docs],
                             (unsigned long long)num_tokens);

    uint32_t max_token = 0;
    size_t labels = 0;
    for (size_t d = 0; d < s->num_docs; d++) {
        for (size_t j = s->offsets[d]; j < s->offsets[d + 1]; j++) {
            uint32_t t = s->tokens[j];
            if (vocab_size != 0 && t >= vocab_size)
                return CT_FAIL_INPUT(err, "%s: document %zu has token id %u >= vocab_size %u",
                                     path, d, t, vocab_size);
            if (t > max_token) max_token = t;
            if (s->mask[j] > 1)
                return CT_FAIL_INPUT(err, "%s: document %zu has loss mask value %u at token %zu "
                                     "(must be 0 or 1)", path, d, s->mask[j], j - (size_t)s->offsets[d]);
            labels += s->mask[j];
        }
    }
    uint32_t max_stored = get_u32(b + SHARD_OFF_MAX_TOKEN);
    if (max_stored != max_token)
        return CT_FAIL_INPUT(err, "%s: header max_token_id %u but the largest token is %u",
                             path, max_stored, max_token);
    for (const uint8_t *p = s->mask + s->num_tokens; p < b + size; p++)
        if (*p != 0) return CT_FAIL_INPUT(err, "%s: padding bytes are not zero", path);
    s->max_token = max_token;
    s->num_labels = labels;
    return CT_OK;
}

/* shard_open with the error code kept, so callers can pass it on even when err is NULL. */
static int shard_open_rc(const char *path, uint32_t vocab_size, shard **out, ct_error *err)
{
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer,
     * before fstat could tell it is not a shard. A regular file ignores it. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return CT_FAIL_INPUT(err, "%s: cannot open shard (%s)", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return CT_FAIL_RUNTIME(err, "%s: cannot stat (%s)", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        /* (a socket never gets here: opening one fails) */
        const char *what = S_ISDIR(st.st_mode) ? "a folder" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device";
        return CT_FAIL_INPUT(err, "%s: %s, not a regular file (expected a shard made by `ctune prepare`)", path,
                             what);
    }
    /* Checked before mmap: a zero-length mapping is an error of its own. */
    if ((uint64_t)st.st_size < SHARD_HEADER_BYTES) {
        close(fd);
        if (st.st_size == 0) return CT_FAIL_INPUT(err, "%s: empty file, not a shard", path);
        return CT_FAIL_INPUT(err, "%s: too small to be a shard (%lld bytes; the header alone is %d)",
                             path, (long long)st.st_size, SHARD_HEADER_BYTES);
    }
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED)
        return CT_FAIL_RUNTIME(err, "%s: mmap of %zu bytes failed (%s)", path, len, strerror(map_errno));
    shard *s = ct_calloc(1, sizeof *s);
    s->path = ct_strdup(path);
    s->map = map;
    s->map_len = len;
    int rc = shard_validate(s, vocab_size, err);
    if (rc != CT_OK) {
        shard_close(s);
        return rc;
    }
    *out = s;
    return CT_OK;
}

shard *shard_open(const char *path, uint32_t vocab_size, ct_error *err)
{
    shard *s;
    shard_open_rc(path, vocab_size, &s, err);
    return s;
}

void shard_close(shard *s)
{
    if (!s) return;
    if (s->map) munmap(s->map, s->map_len);
    free(s->path);
    free(s);
}

const char *shard_path(const shard *s) { return s->path; }
size_t shard_num_docs(const shard *s) { return s->num_docs; }
size_t shard_num_tokens(const shard *s) { return s->num_tokens; }
size_t shard_num_labels(const shard *s) { return s->num_labels; }
uint32_t shard_max_token(const shard *s) { return s->max_token; }
uint32_t shard_crc32(const shard *s) { return s->payload_crc; }

const uint32_t *shard_doc_tokens(const shard *s, size_t i, size_t *len)
{
    CT_ASSERT(i < s->num_docs, "%s: document %zu of %zu", s->path, i, s->num_docs);
    if (len) *len = (size_t)(s->offsets[i + 1] - s->offsets[i]);
    return s->tokens + s->offsets[i];
}

const uint8_t *shard_doc_mask(const shard *s, size_t i)
{
    CT_ASSERT(i < s->num_docs, "%s: document %zu of %zu", s->path, i, s->num_docs);
    return s->mask + s->offsets[i];
}

// ---- writer ----

struct shard_writer {
    uint64_t *offsets;          /* (num_docs + 1) */
    size_t num_docs, offsets_cap;
    uint32_t *tokens;           /* (num_tokens), then the reserved document */
    uint8_t *mask;              /* (num_tokens), then the reserved document */
    size_t num_tokens, tokens_cap, reserved;
    uint32_t max_token;
};

shard_writer *shard_writer_new(void)
{
    shard_writer *w = ct_calloc(1, sizeof *w);
    w->offsets_cap = 64;
    w->offsets = ct_malloc(w->offsets_cap * sizeof *w->offsets);
    w->offsets[0] = 0;
    return w;
}

void shard_writer_reserve(shard_writer *w, size_t len, uint32_t **tokens, uint8_t **mask)
{
    CT_ASSERT(len >= 1, "shard documents cannot be empty");
    size_t need;
    CT_ASSERT(ct_size_add(w->num_tokens, len, &need), "shard token count overflows");
    if (need > w->tokens_cap) {
        size_t cap = w->tokens_cap ? w->tokens_cap : 4096;
        while (cap < need) CT_ASSERT(ct_size_mul(cap, 2, &cap), "shard token count overflows");
        w->tokens = ct_realloc(w->tokens, cap * sizeof *w->tokens);
        w->mask = ct_realloc(w->mask, cap);
        w->tokens_cap = cap;
    }
    if (w->num_docs + 2 > w->offsets_cap) {
        w->offsets_cap *= 2;
        w->offsets = ct_realloc(w->offsets, w->offsets_cap * sizeof *w->offsets);
    }
    w->reserved = len;
    *tokens = w->tokens + w->num_tokens;
    *mask = w->mask + w->num_tokens;
}

void shard_writer_commit(shard_writer *w, size_t len)
{
    CT_ASSERT(len >= 1 && len <= w->reserved, "shard_writer_commit of %zu tokens, %zu reserved", len, w->reserved);
    const uint32_t *t = w->tokens + w->num_tokens;
    const uint8_t *m = w->mask + w->num_tokens;
    for (size_t j = 0; j < len; j++) {
        if (t[j] > w->max_token) w->max_token = t[j];
        CT_ASSERT(m[j] <= 1, "loss mask values are 0 or 1, got %u", m[j]);
    }
    w->num_tokens += len;
    w->num_docs++;
    w->offsets[w->num_docs] = w->num_tokens;
    w->reserved = 0;
}

void shard_writer_add(shard_writer *w, const uint32_t *tokens, const uint8_t *mask, size_t len)
{
    uint32_t *t;
    uint8_t *m;
    shard_writer_reserve(w, len, &t, &m);
    memcpy(t, tokens, len * sizeof *tokens);
    if (mask) memcpy(m, mask, len);
    else memset(m, 1, len);
    shard_writer_commit(w, len);
}

size_t shard_writer_num_docs(const shard_writer *w) { return w->num_docs; }

/* The header, then each of the writer's arrays from where it lies: no image of
 * the file is built, so saving takes no memory beyond the documents. Written
 * atomically (ct_write_pieces_atomic): a crash never leaves a half shard. */
int shard_writer_save(shard_writer *w, const char *path, ct_error *err)
{
    if (w->num_docs == 0) return CT_FAIL_INPUT(err, "%s: refusing to write a shard with no documents", path);
    size_t size;
    CT_ASSERT(shard_file_size(w->num_docs, w->num_tokens, &size), "shard size overflows");
    static const uint8_t zeros[8];
    size_t off_bytes = (w->num_docs + 1) * sizeof *w->offsets, tok_bytes = w->num_tokens * sizeof *w->tokens;
    uint8_t head[SHARD_HEADER_BYTES] = {0};
    const ct_piece pieces[5] = {
        {head, sizeof head}, {w->offsets, off_bytes}, {w->tokens, tok_bytes}, {w->mask, w->num_tokens},
        {zeros, size - SHARD_HEADER_BYTES - off_bytes - tok_bytes - w->num_tokens}};
    uint32_t crc = 0;
    for (int i = 1; i < 5; i++) crc = crc32_more(crc, pieces[i].data, pieces[i].len); /* the payload */
    memcpy(head, SHARD_MAGIC, 8);
    put_u32(head + SHARD_OFF_VERSION, SHARD_VERSION);
    put_u32(head + SHARD_OFF_TOKEN_BYTES, SHARD_TOKEN_BYTES);
    put_u64(head + SHARD_OFF_NUM_DOCS, w->num_docs);
    put_u64(head + SHARD_OFF_NUM_TOKENS, w->num_tokens);
    put_u32(head + SHARD_OFF_MAX_TOKEN, w->max_token);
    put_u32(head + SHARD_OFF_PAYLOAD_CRC, crc);
    put_u32(head + SHARD_OFF_HEADER_CRC, crc32_bytes(head, SHARD_OFF_HEADER_CRC));
    return ct_write_pieces_atomic(path, pieces, 5, err);
}

void shard_writer_free(shard_writer *w)
{
    if (!w) return;
    free(w->offsets);
    free(w->tokens);
    free(w->mask);
    free(w);
}

// ---- dataset ----

void dataset_close(ct_dataset *ds)
{
    for (int i = 0; i < ds->n_shards; i++) shard_close(ds->shards[i]);
    free(ds->shards);
    free(ds->doc_base);
    memset(ds, 0, sizeof *ds);
}

static int dataset_add(ct_dataset *ds, const char *path, uint32_t vocab_size, ct_error *err)
{
    shard *s;
    int rc = shard_open_rc(path, vocab_size, &s, err);
    if (rc != CT_OK) return rc;
    ds->shards = ct_realloc(ds->shards, (size_t)(ds->n_shards + 1) * sizeof *ds->shards);
    ds->shards[ds->n_shards++] = s;
    ds->num_docs += shard_num_docs(s);
    ds->num_tokens += shard_num_tokens(s);
    return CT_OK;
}

int dataset_open(ct_dataset *ds, const char *const *patterns, int n_patterns,
                 uint32_t vocab_size, ct_error *err)
{
    memset(ds, 0, sizeof *ds);
    if (n_patterns <= 0) return CT_FAIL_INPUT(err, "no shard files given");
    int rc = CT_OK;
    for (int p = 0; p < n_patterns && rc == CT_OK; p++) {
        glob_t g = {0};
        /* glob sorts its matches, so a pattern always yields the same shard order. */
        int grc = glob(patterns[p], 0, NULL, &g);
        if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0))
            rc = CT_FAIL_INPUT(err, "'%s' matches no file", patterns[p]);
        else if (grc != 0)
            rc = CT_FAIL_RUNTIME(err, "'%s': cannot expand the pattern (%s)", patterns[p],
                                 grc == GLOB_NOSPACE ? "out of memory" : "read error");
        for (size_t i = 0; grc == 0 && rc == CT_OK && i < g.gl_pathc; i++)
            rc = dataset_add(ds, g.gl_pathv[i], vocab_size, err);
        globfree(&g);
    }
    if (rc != CT_OK) {
        dataset_close(ds);
        return rc;
    }
    ds->doc_base = ct_malloc((size_t)(ds->n_shards + 1) * sizeof *ds->doc_base);
    ds->doc_base[0] = 0;
    for (int i = 0; i < ds->n_shards; i++)
        ds->doc_base[i + 1] = ds->doc_base[i] + shard_num_docs(ds->shards[i]);
    return CT_OK;
}

const uint32_t *dataset_doc(const ct_dataset *ds, size_t doc, size_t *len, const uint8_t **mask)
{
    CT_ASSERT(doc < ds->num_docs, "document %zu of %zu", doc, ds->num_docs);
    /* The last shard whose first document is <= doc (shards are never empty). */
    int lo = 0, hi = ds->n_shards - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (ds->doc_base[mid] <= doc) lo = mid;
        else hi = mid - 1;
    }
    size_t local = doc - ds->doc_base[lo];
    if (mask) *mask = shard_doc_mask(ds->shards[lo], local);
    return shard_doc_tokens(ds->shards[lo], local, len);
}
