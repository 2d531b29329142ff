/* safetensors.c — see safetensors.h; the format: docs/ARCHITECTURE.md, "safetensors".
 *
 * Reader: each file is mmap'd read-only and its JSON header parsed into a json_doc
 * that lives as long as the reader, so tensor names point into the doc's arena and
 * data pointers into the mapping: opening copies no tensor bytes. Every check the
 * reference reader makes is repeated here before a data pointer is formed, so a
 * data pointer always lies inside its mapping.
 *
 * Writer: tensors are copied on add and streamed to PATH.tmp on save (a model can
 * be larger than we want to duplicate in one buffer), then fsync + rename. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"

#define ST_MAX_HEADER ((uint64_t)100000000)
#define ST_SINGLE_NAME "model.safetensors"
#define ST_INDEX_NAME "model.safetensors.index.json"

// ---- dtypes ----

static const struct { const char *name; size_t size; } dtype_info[CT_DTYPE_COUNT] = {
    [CT_DTYPE_BOOL] = {"BOOL", 1},       [CT_DTYPE_U8] = {"U8", 1},   [CT_DTYPE_I8] = {"I8", 1},
    [CT_DTYPE_F8_E5M2] = {"F8_E5M2", 1}, [CT_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [CT_DTYPE_I16] = {"I16", 2},         [CT_DTYPE_U16] = {"U16", 2}, [CT_DTYPE_F16] = {"F16", 2},
    [CT_DTYPE_BF16] = {"BF16", 2},       [CT_DTYPE_I32] = {"I32", 4}, [CT_DTYPE_U32] = {"U32", 4},
    [CT_DTYPE_F32] = {"F32", 4},         [CT_DTYPE_I64] = {"I64", 8}, [CT_DTYPE_U64] = {"U64", 8},
    [CT_DTYPE_F64] = {"F64", 8},
};

const char *ct_dtype_name(ct_dtype d)
{
    return (unsigned)d < CT_DTYPE_COUNT ? dtype_info[d].name : "?";
}

size_t ct_dtype_size(ct_dtype d)
{
    CT_ASSERT((unsigned)d < CT_DTYPE_COUNT, "ct_dtype_size: invalid dtype %d", (int)d);
    return dtype_info[d].size;
}

int ct_dtype_from_name(const char *name, ct_dtype *out)
{
    for (int d = 0; d < CT_DTYPE_COUNT; d++)
        if (strcmp(name, dtype_info[d].name) == 0) { *out = (ct_dtype)d; return CT_OK; }
    return CT_ERR_INPUT;
}

// ---- message helpers ----

/* Tensor names come from untrusted files: keep messages one line and bounded. */
static const char *safe(char *buf, size_t n, const char *s)
{
    size_t k = 0;
    for (; *s && k + 4 < n && k < 120; s++) buf[k++] = (unsigned char)*s < 0x20 ? '?' : *s;
    if (*s && k + 4 < n) { buf[k++] = '.'; buf[k++] = '.'; buf[k++] = '.'; }
    buf[k] = '\0';
    return buf;
}

const char *st_printable(char *buf, size_t n, const char *s) { return safe(buf, n, s); }

static const char *fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = ct_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

// ---- reader ----

typedef struct st_file {
    char *path;
    unsigned char *map;
    size_t size;
    json_doc *doc;
    const json_value *metadata; /* the __metadata__ object, or NULL */
} st_file;

struct st_reader {
    char *path;          /* what st_open was given, for messages about the whole model */
    st_file *files;
    size_t nfiles;
    st_tensor *tensors;  /* sorted by name once every file is loaded */
    size_t count, cap;
};

/* Where a tensor's bytes lie in the data section, kept beside it while the file's
 * layout is checked. */
typedef struct span { size_t begin, end, tensor; } span;

static int read_offset(const json_value *v, size_t *out)
{
    if (!v || v->type != JSON_NUMBER || !v->is_integer || v->integer < 0) return -1;
    if ((unsigned long long)v->integer > SIZE_MAX) return -1;
    *out = (size_t)v->integer;
    return 0;
}

/* Parses one header entry into t and its [begin, end) span; checks that the span's
 * length matches the shape, not yet where it lies. */
static int parse_entry(const st_file *f, const char *name, const json_value *v, st_tensor *t,
                       span *sp, ct_error *err)
{
    char nb[128], sb[256];
    safe(nb, sizeof nb, name);
    /* the readers name tensors in their messages, which must stay one line */
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        if (*c < 0x20)
            return CT_FAIL_INPUT(err, "%s: tensor '%s': the name holds the control character 0x%02x", f->path, nb, *c);
    if (v->type != JSON_OBJECT)
        return CT_FAIL_INPUT(err, "%s: tensor '%s': expected an object with dtype, shape and data_offsets", f->path, nb);
    const json_value *dt = json_get_type(v, "dtype", JSON_STRING);
    const json_value *shape = json_get_type(v, "shape", JSON_ARRAY);
    const json_value *offs = json_get_type(v, "data_offsets", JSON_ARRAY);
    if (!dt) return CT_FAIL_INPUT(err, "%s: tensor '%s': missing string 'dtype'", f->path, nb);
    if (!shape) return CT_FAIL_INPUT(err, "%s: tensor '%s': missing array 'shape'", f->path, nb);
    if (!offs) return CT_FAIL_INPUT(err, "%s: tensor '%s': missing array 'data_offsets'", f->path, nb);
    if (ct_dtype_from_name(dt->string, &t->dtype) != CT_OK) {
        char db[64];
        return CT_FAIL_INPUT(err, "%s: tensor '%s': unknown or unsupported dtype '%s'", f->path, nb,
                             safe(db, sizeof db, dt->string));
    }
    if (shape->count > ST_MAX_DIMS)
        return CT_FAIL_INPUT(err, "%s: tensor '%s': shape has %zu dimensions, more than the %d supported",
                             f->path, nb, shape->count, ST_MAX_DIMS);
    t->ndim = (int)shape->count;
    t->numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        const json_value *d = shape->items[i];
        if (d->type != JSON_NUMBER || !d->is_integer || d->integer < 0)
            return CT_FAIL_INPUT(err, "%s: tensor '%s': shape entry %d is not a non-negative integer", f->path, nb, i);
        t->shape[i] = d->integer;
        if (!ct_size_mul(t->numel, (size_t)d->integer, &t->numel))
            return CT_FAIL_INPUT(err, "%s: tensor '%s': shape %s has too many elements", f->path, nb,
                                 fmt_shape(sb, sizeof sb, i + 1, t->shape));
    }
    fmt_shape(sb, sizeof sb, t->ndim, t->shape);
    if (offs->count != 2 || read_offset(offs->items[0], &sp->begin) || read_offset(offs->items[1], &sp->end))
        return CT_FAIL_INPUT(err, "%s: tensor '%s': data_offsets must be two non-negative integers [begin, end]",
                             f->path, nb);
    if (sp->begin > sp->end)
        return CT_FAIL_INPUT(err, "%s: tensor '%s': data_offsets [%zu, %zu] end before they begin",
                             f->path, nb, sp->begin, sp->end);
    if (!ct_size_mul(t->numel, ct_dtype_size(t->dtype), &t->nbytes))
        return CT_FAIL_INPUT(err, "%s: tensor '%s': shape %s %s is too large", f->path, nb, sb, ct_dtype_name(t->dtype));
    if (sp->end - sp->begin != t->nbytes)
        return CT_FAIL_INPUT(err, "%s: tensor '%s': data_offsets [%zu, %zu] hold %zu bytes but shape %s %s needs %zu",
                             f->path, nb, sp->begin, sp->end, sp->end - sp->begin, sb,
                             ct_dtype_name(t->dtype), t->nbytes);
    t->name = name;
    t->file = f->path;
    return CT_OK;
}

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Checks that the spans tile [0, data_len) exactly, then points each tensor's data
 * into the mapping. */
static int check_layout(st_reader *r, const st_file *f, span *sp, size_t n, size_t data_start, ct_error *err)
{
    qsort(sp, n, sizeof *sp, cmp_span);
    size_t at = 0;
    char nb[128], pb[128];
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = &r->tensors[sp[i].tensor];
        if (sp[i].begin > at) {
            if (i == 0)
                return CT_FAIL_INPUT(err, "%s: tensor '%s': data_offsets begin at %zu, leaving a hole at the start of the data",
                                     f->path, safe(nb, sizeof nb, t->name), sp[i].begin);
            return CT_FAIL_INPUT(err, "%s: tensor '%s': data_offsets begin at %zu but tensor '%s' ends at %zu (a hole of %zu bytes)",
                                 f->path, safe(nb, sizeof nb, t->name), sp[i].begin,
                                 safe(pb, sizeof pb, r->tensors[sp[i - 1].tensor].name), at, sp[i].begin - at);
        }
        if (sp[i].begin < at)
            return CT_FAIL_INPUT(err, "%s: tensor '%s': data_offsets [%zu, %zu] overlap tensor '%s', which ends at %zu",
                                 f->path, safe(nb, sizeof nb, t->name), sp[i].begin, sp[i].end,
                                 safe(pb, sizeof pb, r->tensors[sp[i - 1].tensor].name), at);
        at = sp[i].end;
    }
    size_t data_len = f->size - data_start;
    if (at < data_len)
        return CT_FAIL_INPUT(err, "%s: %zu trailing bytes after the tensor data (the data ends at byte %zu of %zu)",
                             f->path, data_len - at, data_start + at, f->size);
    if (at > data_len)
        return CT_FAIL_INPUT(err, "%s: file is truncated: the tensor data needs %zu bytes after the header but the file has %zu",
                             f->path, at, data_len);
    for (size_t i = 0; i < n; i++) r->tensors[sp[i].tensor].data = f->map + data_start + sp[i].begin;
    return CT_OK;
}

static int check_metadata(const st_file *f, const json_value *m, ct_error *err)
{
    if (m->type != JSON_OBJECT)
        return CT_FAIL_INPUT(err, "%s: __metadata__ must be an object mapping strings to strings", f->path);
    for (size_t i = 0; i < m->count; i++) {
        char kb[128];
        if (m->items[i]->type != JSON_STRING)
            return CT_FAIL_INPUT(err, "%s: __metadata__ key '%s' must hold a string", f->path, safe(kb, sizeof kb, m->keys[i]));
    }
    return CT_OK;
}

/* Maps PATH into f, validates its header and layout, and appends its tensors. */
static int load_file(st_reader *r, st_file *f, const char *path, ct_error *err)
{
    f->path = ct_strdup(path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return CT_FAIL_INPUT(err, "%s: cannot open (%s)", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return CT_FAIL_INPUT(err, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size < 8) {
        close(fd);
        return CT_FAIL_INPUT(err, "%s: file is %lld bytes, too short for the 8-byte header length", path, (long long)st.st_size);
    }
    f->size = (size_t)st.st_size;
    void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) return CT_FAIL_RUNTIME(err, "%s: cannot mmap %zu bytes (%s)", path, f->size, strerror(map_errno));
    f->map = map;

    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | f->map[i];
    if (n > ST_MAX_HEADER)
        return CT_FAIL_INPUT(err, "%s: header length %llu exceeds the limit of 100,000,000 bytes (not a safetensors file?)",
                             path, (unsigned long long)n);
    if (n > f->size - 8)
        return CT_FAIL_INPUT(err, "%s: header length %llu runs past the end of the file (%zu bytes)",
                             path, (unsigned long long)n, f->size);
    size_t src_len = strlen(path) + 8;
    char *source = ct_malloc(src_len);
    snprintf(source, src_len, "%s header", path);
    f->doc = json_parse((const char *)f->map + 8, (size_t)n, source, err);
    free(source);
    if (!f->doc) return CT_ERR_INPUT;
    const json_value *root = json_root(f->doc);
    if (root->type != JSON_OBJECT) return CT_FAIL_INPUT(err, "%s: header is not a JSON object", path);

    size_t first = r->count, need;
    if (!ct_size_add(r->count, root->count, &need)) return CT_FAIL_INPUT(err, "%s: too many tensors", path);
    if (need > r->cap) {
        r->cap = need > 2 * r->cap ? need : 2 * r->cap;
        r->tensors = ct_realloc(r->tensors, r->cap * sizeof *r->tensors);
    }
    span *sp = ct_malloc(root->count * sizeof *sp);
    int rc = CT_OK;
    size_t ns = 0;
    for (size_t i = 0; i < root->count && rc == CT_OK; i++) {
        if (strcmp(root->keys[i], "__metadata__") == 0) {
            f->metadata = root->items[i];
            rc = check_metadata(f, f->metadata, err);
            continue;
        }
        st_tensor *t = &r->tensors[first + ns];
        memset(t, 0, sizeof *t);
        rc = parse_entry(f, root->keys[i], root->items[i], t, &sp[ns], err);
        sp[ns].tensor = first + ns;
        ns++;
    }
    if (rc == CT_OK) {
        rc = check_layout(r, f, sp, ns, 8 + (size_t)n, err);
        if (rc == CT_OK) r->count += ns;
    }
    free(sp);
    return rc;
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

/* Sorts by name; equal names can still arise from two shards, or from keys that
 * differ only after a \u0000 (C strings compare them equal). */
static int sort_tensors(st_reader *r, ct_error *err)
{
    qsort(r->tensors, r->count, sizeof *r->tensors, cmp_tensor);
    for (size_t i = 1; i < r->count; i++) {
        if (strcmp(r->tensors[i - 1].name, r->tensors[i].name) != 0) continue;
        char nb[128];
        return CT_FAIL_INPUT(err, "%s: tensor '%s' appears twice (in %s and %s)", r->path,
                             safe(nb, sizeof nb, r->tensors[i].name), r->tensors[i - 1].file, r->tensors[i].file);
    }
    return CT_OK;
}

typedef struct map_entry { const char *name, *shard; } map_entry;

static int cmp_map_entry(const void *a, const void *b)
{
    return strcmp(((const map_entry *)a)->name, ((const map_entry *)b)->name);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks the weight_map against what the shards hold: both lists sorted by name
 * are walked together, so each tensor is matched once whatever the model size. */
static int check_weight_map(st_reader *r, const char *index, map_entry *e, size_t ne,
                            const char **shards, ct_error *err)
{
    qsort(e, ne, sizeof *e, cmp_map_entry);
    size_t i = 0, j = 0;
    char nb[128];
    while (i < ne || j < r->count) {
        int c = i == ne ? 1 : j == r->count ? -1 : strcmp(e[i].name, r->tensors[j].name);
        if (c < 0)
            return CT_FAIL_INPUT(err, "%s: weight_map puts tensor '%s' in %s, but that shard does not hold it",
                                 index, safe(nb, sizeof nb, e[i].name), e[i].shard);
        if (c > 0)
            return CT_FAIL_INPUT(err, "%s: tensor '%s' in %s is not listed in weight_map",
                                 index, safe(nb, sizeof nb, r->tensors[j].name), r->tensors[j].file);
        const char **k = bsearch(&e[i].shard, shards, r->nfiles, sizeof *shards, cmp_str);
        if (r->tensors[j].file != r->files[k - shards].path)
            return CT_FAIL_INPUT(err, "%s: weight_map puts tensor '%s' in %s, but it is in %s",
                                 index, safe(nb, sizeof nb, e[i].name), e[i].shard, r->tensors[j].file);
        i++;
        j++;
    }
    return CT_OK;
}

static int open_index(st_reader *r, const char *dir, const char *index, ct_error *err)
{
    size_t len;
    char *text = ct_read_file_max(index, CT_JSON_MAX_BYTES, &len, err);
    if (!text) return err ? err->code : CT_ERR_INPUT;
    json_doc *doc = json_parse(text, len, index, err);
    free(text);
    if (!doc) return CT_ERR_INPUT;
    const json_value *wm = json_get_type(json_root(doc), "weight_map", JSON_OBJECT);
    int rc = CT_OK;
    map_entry *e = NULL;
    const char **shards = NULL;
    if (!wm || wm->count == 0) {
        rc = CT_FAIL_INPUT(err, "%s: expected a non-empty object 'weight_map'", index);
        goto done;
    }
    e = ct_malloc(wm->count * sizeof *e);
    shards = ct_malloc(wm->count * sizeof *shards);
    for (size_t i = 0; i < wm->count; i++) {
        const json_value *v = wm->items[i];
        char nb[128], sb[128];
        safe(nb, sizeof nb, wm->keys[i]);
        if (v->type != JSON_STRING) {
            rc = CT_FAIL_INPUT(err, "%s: weight_map entry '%s' must be a shard file name", index, nb);
            goto done;
        }
        /* Shard names come from a downloaded file: they must stay inside the folder. */
        if (v->string_len == 0 || strlen(v->string) != v->string_len || strchr(v->string, '/') ||
            strstr(v->string, "..")) {
            rc = CT_FAIL_INPUT(err, "%s: weight_map entry '%s' names shard '%s', which is not a plain file name in the folder",
                               index, nb, safe(sb, sizeof sb, v->string));
            goto done;
        }
        e[i] = (map_entry){ wm->keys[i], v->string };
        shards[i] = v->string;
    }
    qsort(shards, wm->count, sizeof *shards, cmp_str);
    size_t n = 0;
    for (size_t i = 0; i < wm->count; i++)
        if (n == 0 || strcmp(shards[n - 1], shards[i]) != 0) shards[n++] = shards[i];
    r->files = ct_calloc(n, sizeof *r->files);
    r->nfiles = n;
    for (size_t i = 0; i < n && rc == CT_OK; i++) {
        char *p = path_join(dir, shards[i]);
        rc = load_file(r, &r->files[i], p, err);
        free(p);
    }
    if (rc == CT_OK) rc = sort_tensors(r, err);
    if (rc == CT_OK) rc = check_weight_map(r, index, e, wm->count, shards, err);
done:
    free(e);
    free(shards);
    json_free(doc);
    return rc;
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int open_single(st_reader *r, const char *path, ct_error *err)
{
    r->files = ct_calloc(1, sizeof *r->files);
    r->nfiles = 1;
    int rc = load_file(r, &r->files[0], path, err);
    return rc == CT_OK ? sort_tensors(r, err) : rc;
}

st_reader *st_open(const char *path, ct_error *err)
{
    st_reader *r = ct_calloc(1, sizeof *r);
    r->path = ct_strdup(path);
    struct stat st;
    int rc;
    if (stat(path, &st) != 0) {
        rc = CT_FAIL_INPUT(err, "%s: cannot open (%s)", path, strerror(errno));
    } else if (S_ISDIR(st.st_mode)) {
        /* A single file wins over an index, as in transformers' loader. */
        char *single = path_join(path, ST_SINGLE_NAME), *index = path_join(path, ST_INDEX_NAME);
        if (is_file(single)) rc = open_single(r, single, err);
        else if (is_file(index)) rc = open_index(r, path, index, err);
        else rc = CT_FAIL_INPUT(err, "%s: folder holds neither %s nor %s", path, ST_SINGLE_NAME, ST_INDEX_NAME);
        free(single);
        free(index);
    } else {
        rc = open_single(r, path, err);
    }
    if (rc != CT_OK) {
        st_close(r);
        return NULL;
    }
    return r;
}

void st_close(st_reader *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->nfiles; i++) {
        st_file *f = &r->files[i];
        if (f->map) munmap(f->map, f->size);
        json_free(f->doc);
        free(f->path);
    }
    free(r->files);
    free(r->tensors);
    free(r->path);
    free(r);
}

size_t st_count(const st_reader *r) { return r->count; }

const st_tensor *st_at(const st_reader *r, size_t i)
{
    CT_ASSERT(i < r->count, "st_at: index %zu out of %zu tensors", i, r->count);
    return &r->tensors[i];
}

const st_tensor *st_find(const st_reader *r, const char *name)
{
    size_t lo = 0, hi = r->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, r->tensors[mid].name);
        if (c == 0) return &r->tensors[mid];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

const char *st_metadata(const st_reader *r, const char *key)
{
    if (r->nfiles == 0) return NULL;
    const json_value *v = json_get_type(r->files[0].metadata, key, JSON_STRING);
    return v ? v->string : NULL;
}

int st_expect(const st_reader *r, const char *name, ct_dtype dtype, int ndim,
              const int64_t *shape, const st_tensor **out, ct_error *err)
{
    const st_tensor *t = st_find(r, name);
    if (!t) return CT_FAIL_INPUT(err, "%s: tensor '%s' not found", r->path, name);
    if (t->dtype != dtype)
        return CT_FAIL_INPUT(err, "%s: tensor '%s': dtype %s, expected %s", t->file, name,
                             ct_dtype_name(t->dtype), ct_dtype_name(dtype));
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char got[256], want[256];
        return CT_FAIL_INPUT(err, "%s: tensor '%s': shape %s does not match the expected %s", t->file, name,
                             fmt_shape(got, sizeof got, t->ndim, t->shape), fmt_shape(want, sizeof want, ndim, shape));
    }
    if (out) *out = t;
    return CT_OK;
}

// ---- writer ----

typedef struct st_entry {
    char *name;
    ct_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t nbytes;
    void *data;
} st_entry;

struct st_writer {
    st_entry *e;
    size_t count, cap;
    size_t *slots;     /* open-addressing set of names: entry index + 1, 0 = empty */
    size_t nslots;     /* a power of two, kept at least twice count */
};

st_writer *st_writer_new(void) { return ct_calloc(1, sizeof(st_writer)); }

void st_writer_free(st_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->count; i++) {
        free(w->e[i].name);
        free(w->e[i].data);
    }
    free(w->e);
    free(w->slots);
    free(w);
}

static size_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (size_t)h;
}

/* Returns the slot holding NAME, or the empty slot where it would go. */
static size_t *find_slot(const st_writer *w, const char *name)
{
    size_t mask = w->nslots - 1;
    for (size_t i = name_hash(name) & mask;; i = (i + 1) & mask) {
        size_t *s = &w->slots[i];
        if (*s == 0 || strcmp(w->e[*s - 1].name, name) == 0) return s;
    }
}

static void grow_set(st_writer *w)
{
    free(w->slots);
    w->nslots = w->nslots ? w->nslots * 2 : 64;
    w->slots = ct_calloc(w->nslots, sizeof *w->slots);
    for (size_t i = 0; i < w->count; i++) *find_slot(w, w->e[i].name) = i + 1;
}

int st_writer_add(st_writer *w, const char *name, ct_dtype dtype, int ndim,
                  const int64_t *shape, const void *data, ct_error *err)
{
    if (!name || !*name) return CT_FAIL_INPUT(err, "safetensors writer: empty tensor name");
    if (strcmp(name, "__metadata__") == 0)
        return CT_FAIL_INPUT(err, "safetensors writer: '__metadata__' is reserved and cannot name a tensor");
    if ((unsigned)dtype >= CT_DTYPE_COUNT)
        return CT_FAIL_INPUT(err, "safetensors writer: tensor '%s': invalid dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        return CT_FAIL_INPUT(err, "safetensors writer: tensor '%s': %d dimensions (0..%d supported)", name, ndim, ST_MAX_DIMS);
    size_t numel = 1, nbytes;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || !ct_size_mul(numel, (size_t)shape[i], &numel))
            return CT_FAIL_INPUT(err, "safetensors writer: tensor '%s': bad dimension %lld", name, (long long)shape[i]);
    }
    if (!ct_size_mul(numel, ct_dtype_size(dtype), &nbytes))
        return CT_FAIL_INPUT(err, "safetensors writer: tensor '%s': too large", name);
    if (nbytes > 0 && !data) return CT_FAIL_INPUT(err, "safetensors writer: tensor '%s': no data", name);
    if (2 * (w->count + 1) > w->nslots) grow_set(w);
    size_t *slot = find_slot(w, name);
    if (*slot) return CT_FAIL_INPUT(err, "safetensors writer: tensor '%s' added twice", name);
    if (w->count == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->e = ct_realloc(w->e, w->cap * sizeof *w->e);
    }
    st_entry *e = &w->e[w->count];
    memset(e, 0, sizeof *e);
    e->name = ct_strdup(name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = nbytes;
    e->data = ct_malloc(nbytes);
    if (nbytes) memcpy(e->data, data, nbytes);
    *slot = ++w->count;
    return CT_OK;
}

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

/* Largest elements first, so that with an 8-aligned data section every tensor
 * starts aligned to its element size (the reference Rust writer's order:
 * docs/ARCHITECTURE.md, "safetensors"). */
static int cmp_entry_layout(const void *a, const void *b)
{
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    size_t sx = ct_dtype_size(x->dtype), sy = ct_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int fsync_parent(const char *path)
{
    char *copy = ct_strdup(path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    free(copy);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Writes the entries (reordered in place) as one file: PATH.tmp is streamed,
 * fsync'd and renamed over PATH, so PATH holds the old file or the new one. */
static int write_file(st_entry **e, size_t n, const char *path, ct_error *err)
{
    qsort(e, n, sizeof *e, cmp_entry_layout);
    json_writer h;
    json_writer_init(&h);
    json_write_raw(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        json_write_raw(&h, ",");
        json_write_string(&h, e[i]->name);
        json_write_rawf(&h, ":{\"dtype\":\"%s\",\"shape\":[", ct_dtype_name(e[i]->dtype));
        for (int d = 0; d < e[i]->ndim; d++) json_write_rawf(&h, d ? ",%lld" : "%lld", (long long)e[i]->shape[d]);
        size_t end;
        CT_ASSERT(ct_size_add(off, e[i]->nbytes, &end), "safetensors writer: total size overflows");
        json_write_rawf(&h, "],\"data_offsets\":[%zu,%zu]}", off, end);
        off = end;
    }
    json_write_raw(&h, "}");
    while (h.len % 8) json_write_raw(&h, " ");

    size_t tlen = strlen(path) + 5;
    char *tmp = ct_malloc(tlen);
    snprintf(tmp, tlen, "%s.tmp", path);
    int rc = CT_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        rc = CT_FAIL_RUNTIME(err, "%s: cannot create (%s)", tmp, strerror(errno));
        goto done;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(h.buf, 1, h.len, f) == h.len;
    for (size_t i = 0; ok && i < n; i++) ok = fwrite(e[i]->data, 1, e[i]->nbytes, f) == e[i]->nbytes;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    ok = fclose(f) == 0 && ok;
    if (!ok) {
        rc = CT_FAIL_RUNTIME(err, "%s: write failed (%s)", tmp, strerror(saved ? saved : errno));
        unlink(tmp);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        rc = CT_FAIL_RUNTIME(err, "%s: rename to %s failed (%s)", tmp, path, strerror(errno));
        unlink(tmp);
        goto done;
    }
    fsync_parent(path);
done:
    free(tmp);
    json_writer_free(&h);
    return rc;
}

static st_entry **entry_list(st_writer *w)
{
    st_entry **e = ct_calloc(w->count, sizeof *e);
    for (size_t i = 0; i < w->count; i++) e[i] = &w->e[i];
    return e;
}

int st_writer_save(st_writer *w, const char *path, ct_error *err)
{
    st_entry **e = entry_list(w);
    int rc = write_file(e, w->count, path, err);
    free(e);
    return rc;
}

/* A stale file of the other layout would shadow or contradict the new one. */
static void remove_stale(const char *dir, const char *name)
{
    char *p = path_join(dir, name);
    unlink(p);
    free(p);
}

int st_writer_save_sharded(st_writer *w, const char *dir, size_t max_shard_bytes, ct_error *err)
{
    if (!*dir) return CT_FAIL_INPUT(err, "safetensors writer: empty output folder name");
    int rc = ct_mkdirs(dir, err);
    if (rc != CT_OK) return rc;
    size_t total = 0;
    for (size_t i = 0; i < w->count; i++)
        if (!ct_size_add(total, w->e[i].nbytes, &total))
            return CT_FAIL_INPUT(err, "%s: total tensor size overflows", dir);
    if (total <= max_shard_bytes) {
        char *p = path_join(dir, ST_SINGLE_NAME);
        rc = st_writer_save(w, p, err);
        free(p);
        if (rc == CT_OK) remove_stale(dir, ST_INDEX_NAME);
        return rc;
    }

    /* Greedy in name order: a shard closes when the next tensor would overflow it;
     * a tensor larger than the limit gets a shard of its own. */
    st_entry **e = entry_list(w);
    qsort(e, w->count, sizeof *e, cmp_entry_name);
    size_t *shard_of = ct_malloc(w->count * sizeof *shard_of);
    size_t nshards = 0, cur = 0;
    for (size_t i = 0; i < w->count; i++) {
        size_t with; /* cur + this tensor; cannot overflow, total did not */
        ct_size_add(cur, e[i]->nbytes, &with);
        if (nshards == 0 || (cur > 0 && with > max_shard_bytes)) { nshards++; with = e[i]->nbytes; }
        cur = with;
        shard_of[i] = nshards - 1;
    }
    json_writer idx;
    json_writer_init(&idx);
    json_write_rawf(&idx, "{\"metadata\":{\"total_size\":%zu},\"weight_map\":{", total);
    char name[64];
    for (size_t s = 0, i = 0; s < nshards && rc == CT_OK; s++) {
        size_t first = i;
        while (i < w->count && shard_of[i] == s) i++;
        snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, nshards);
        for (size_t k = first; k < i; k++) {
            json_write_raw(&idx, k ? "," : "");
            json_write_string(&idx, e[k]->name);
            json_write_raw(&idx, ":");
            json_write_string(&idx, name);
        }
        char *p = path_join(dir, name);
        /* write_file reorders its slice for the layout; the index already has it */
        rc = write_file(e + first, i - first, p, err);
        free(p);
    }
    json_write_raw(&idx, "}}\n");
    if (rc == CT_OK) {
        char *p = path_join(dir, ST_INDEX_NAME);
        rc = ct_write_file_atomic(p, idx.buf, idx.len, err);
        free(p);
    }
    if (rc == CT_OK) remove_stale(dir, ST_SINGLE_NAME);
    json_writer_free(&idx);
    free(shard_of);
    free(e);
    return rc;
}
