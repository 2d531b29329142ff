/* prepare_pool.c — records from a file, and the worker pool (prepare_pool.h has
 * the design). The reader keeps a 1 MiB buffer and copies each record into
 * one growable string; the pool's slots move FREE -> READY (filled by the
 * reader) -> BUSY (a worker) -> DONE -> FREE (stored by the reader). */
#include "prepare_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define READ_CHUNK ((size_t)1 << 20)
#define BATCH_BYTES ((size_t)256 << 10)
#define BATCH_RECORDS 512

// ---- records ----

enum { ARRAY_FIRST, ARRAY_AFTER, ARRAY_NEXT, ARRAY_DONE };

struct prepare_input {
    FILE *f;
    char *path;
    char *buf;
    size_t len, pos;    /* buf[pos..len) not yet read */
    size_t line;        /* of buf[pos] */
    bool array;
    int state;          /* ARRAY_* */
    size_t last_line;   /* where the last array element started */
    char *rec;
    size_t rec_len, rec_cap;
};

static bool fill(prepare_input *in)
{
    if (in->pos < in->len) return true;
    in->pos = 0;
    in->len = fread(in->buf, 1, READ_CHUNK, in->f);
    return in->len > 0;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* Skips white space; the next byte, or -1 at the end of the file. */
static int skip_ws(prepare_input *in)
{
    while (fill(in)) {
        char c = in->buf[in->pos];
        if (!is_ws(c)) return (unsigned char)c;
        in->line += c == '\n';
        in->pos++;
    }
    return -1;
}

static void rec_put(prepare_input *in, const char *s, size_t n)
{
    if (in->rec_len + n > in->rec_cap) {
        in->rec_cap = in->rec_len + n > 2 * in->rec_cap ? in->rec_len + n : 2 * in->rec_cap;
        in->rec = ct_realloc(in->rec, in->rec_cap);
    }
    memcpy(in->rec + in->rec_len, s, n);
    in->rec_len += n;
}

prepare_input *prepare_input_open(const char *path, ct_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        CT_FAIL_INPUT(err, "%s: cannot open (%s)", path, strerror(errno));
        return NULL;
    }
    prepare_input *in = ct_calloc(1, sizeof *in);
    in->f = f;
    in->path = ct_strdup(path);
    in->buf = ct_malloc(READ_CHUNK);
    in->line = 1;
    in->array = skip_ws(in) == '[';
    if (in->array) in->pos++;
    return in;
}

bool prepare_input_is_array(const prepare_input *in) { return in->array; }

void prepare_input_close(prepare_input *in)
{
    if (!in) return;
    fclose(in->f);
    free(in->path);
    free(in->buf);
    free(in->rec);
    free(in);
}

static int next_line(prepare_input *in, const char **rec, size_t *len, size_t *line)
{
    for (;;) {
        in->rec_len = 0;
        *line = in->line;
        bool any = false;
        while (fill(in)) {
            any = true;
            char *s = in->buf + in->pos, *nl = memchr(s, '\n', in->len - in->pos);
            size_t n = nl ? (size_t)(nl - s) : in->len - in->pos;
            rec_put(in, s, n);
            in->pos += n + (nl != NULL);
            if (nl) {
                in->line++;
                break;
            }
        }
        if (!any) return CT_OK;   /* *rec stays NULL: the end */
        size_t n = in->rec_len, i = 0;
        while (n > 0 && (in->rec[n - 1] == '\r' || in->rec[n - 1] == '\n')) n--;
        while (i < n && is_ws(in->rec[i])) i++;
        if (i == n) continue;   /* a blank line */
        *rec = in->rec;
        *len = n;
        return CT_OK;
    }
}

static int found_fail(prepare_input *in, int c, const char *what, ct_error *err)
{
    if (c < 0) return CT_FAIL_INPUT(err, "%s: the JSON array is not closed (no ']' before the end of the file)", in->path);
    char b[16];
    if (c >= 0x20 && c < 0x7f) snprintf(b, sizeof b, "'%c'", c);
    else snprintf(b, sizeof b, "byte 0x%02x", c);
    return CT_FAIL_INPUT(err, "%s:%zu: %s, found %s", in->path, in->line, what, b);
}

/* One element of the array: bytes up to the ',' or ']' outside strings and brackets. */
static int next_element(prepare_input *in, const char **rec, size_t *len, size_t *line, ct_error *err)
{
    int c = skip_ws(in);
    char what[96];
    if (in->state == ARRAY_AFTER) {
        if (c == ']') {
            in->pos++;
            in->state = ARRAY_DONE;
        } else if (c == ',') {
            in->pos++;
            in->state = ARRAY_NEXT;
            c = skip_ws(in);
        } else {
            snprintf(what, sizeof what, "expected ',' or ']' after the record of line %zu", in->last_line);
            return found_fail(in, c, what, err);
        }
    }
    if (in->state == ARRAY_DONE) {
        c = skip_ws(in);
        return c < 0 ? CT_OK : found_fail(in, c, "expected the end of the file after the JSON array's ']'", err);
    }
    if (c == ']' && in->state == ARRAY_FIRST) {
        in->pos++;
        in->state = ARRAY_DONE;
        return next_element(in, rec, len, line, err);
    }
    if (c < 0 || c == ']' || c == ',') return found_fail(in, c, "expected a record", err);
    in->rec_len = 0;
    *line = in->last_line = in->line;
    int depth = 0;
    bool in_string = false, escape = false, end = false;
    while (!end && fill(in)) {
        size_t i = in->pos;
        for (; i < in->len; i++) {
            char b = in->buf[i];
            in->line += b == '\n';
            if (in_string) {
                if (escape) escape = false;
                else if (b == '\\') escape = true;
                else if (b == '"') in_string = false;
            } else if (b == '"') {
                in_string = true;
            } else if (b == '{' || b == '[') {
                depth++;
            } else if ((b == '}' || b == ']') && depth > 0) {
                if (--depth == 0) {   /* a container ends the record */
                    end = true;
                    i++;
                    break;
                }
            } else if ((b == ',' || b == ']') && depth == 0) {
                end = true;
                break;
            }
        }
        rec_put(in, in->buf + in->pos, i - in->pos);
        in->pos = i;
    }
    if (!end)
        return CT_FAIL_INPUT(err, "%s:%zu: the JSON array is not closed (the record that starts here runs to the end "
                             "of the file)", in->path, *line);
    size_t n = in->rec_len;
    while (n > 0 && is_ws(in->rec[n - 1])) n--;
    in->state = ARRAY_AFTER;
    *rec = in->rec;
    *len = n;
    return CT_OK;
}

int prepare_input_next(prepare_input *in, const char **rec, size_t *len, size_t *line, ct_error *err)
{
    *rec = NULL;
    *len = 0;
    int rc = in->array ? next_element(in, rec, len, line, err) : next_line(in, rec, len, line);
    if (rc == CT_OK && ferror(in->f)) rc = CT_FAIL_RUNTIME(err, "%s: read error", in->path);
    return rc;
}

// ---- the pool ----

enum { SLOT_FREE, SLOT_READY, SLOT_BUSY, SLOT_DONE };
enum { DOC_TRUNCATED = 1, DOC_DROPPED = 2, DOC_MISMATCHED = 4 };

typedef struct rec_info {
    size_t off, len, line;      /* where the record's text is in the batch; its line in the file */
    size_t doc_len;             /* its document's tokens */
    uint8_t flags;              /* DOC_* */
} rec_info;

typedef struct batch {
    char *text;                 /* the records, back to back */
    size_t text_len, text_cap;
    rec_info *recs;
    size_t n, cap;
    size_t first;               /* index of the first record in the file */
    uint32_t *tokens;           /* every document, back to back */
    uint8_t *mask;
    size_t n_tokens, tokens_cap, mask_cap;
    int rc;                     /* of the first bad record; the records before it are done */
    ct_error err;
    int state;
} batch;

typedef struct pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    batch *slots;
    size_t n_slots;
    size_t filled, taken;       /* batches handed out, batches taken by workers */
    bool closing, failed;
    const prepare_text_cfg *cfg;
    const char *path;
} pool;

static void *grow(void *p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap) return p;
    *cap = need > 2 * *cap ? need : 2 * *cap;
    return ct_realloc(p, *cap * size);
}

static void batch_free(batch *b)
{
    free(b->text);
    free(b->recs);
    free(b->tokens);
    free(b->mask);
}

static void run_batch(pool *p, prepare_worker *w, batch *b)
{
    size_t src_cap = strlen(p->path) + 32;
    char *src = ct_malloc(src_cap);
    b->n_tokens = 0;
    b->rc = CT_OK;
    for (size_t i = 0; i < b->n; i++) {
        rec_info *r = &b->recs[i];
        prepare_doc d;
        snprintf(src, src_cap, "%s:%zu", p->path, r->line);
        b->rc = prepare_text_record(p->cfg, w, b->text + r->off, r->len, src, &d, &b->err);
        if (b->rc) break;
        b->tokens = grow(b->tokens, &b->tokens_cap, b->n_tokens + d.len, sizeof *b->tokens);
        b->mask = grow(b->mask, &b->mask_cap, b->n_tokens + d.len, 1);
        memcpy(b->tokens + b->n_tokens, d.ids, d.len * sizeof *d.ids);
        memcpy(b->mask + b->n_tokens, d.mask, d.len);
        b->n_tokens += d.len;
        r->doc_len = d.len;
        r->flags = (uint8_t)((d.truncated ? DOC_TRUNCATED : 0) | (d.dropped ? DOC_DROPPED : 0) |
                             (d.mismatched ? DOC_MISMATCHED : 0));
    }
    free(src);
}

static void *worker_main(void *arg)
{
    pool *p = arg;
    prepare_worker *w = prepare_worker_new();
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->closing && p->taken == p->filled) pthread_cond_wait(&p->work, &p->mu);
        if (p->taken == p->filled) break;
        batch *b = &p->slots[p->taken++ % p->n_slots];
        b->state = SLOT_BUSY;
        bool skip = p->failed;
        pthread_mutex_unlock(&p->mu);
        if (!skip) run_batch(p, w, b);
        pthread_mutex_lock(&p->mu);
        b->state = SLOT_DONE;
        pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    prepare_worker_free(w);
    return NULL;
}

/* Reads up to a batch of records into b; *end at the end of the input. */
static int fill_batch(prepare_input *in, batch *b, size_t first, bool *end, ct_error *err)
{
    b->n = b->text_len = 0;
    b->first = first;
    while (b->n < BATCH_RECORDS && b->text_len < BATCH_BYTES) {
        const char *rec;
        size_t len, line;
        int rc = prepare_input_next(in, &rec, &len, &line, err);
        if (rc) return rc;
        if (!rec) {
            *end = true;
            break;
        }
        b->text = grow(b->text, &b->text_cap, b->text_len + len, 1);
        memcpy(b->text + b->text_len, rec, len);
        b->recs = grow(b->recs, &b->cap, b->n + 1, sizeof *b->recs);
        b->recs[b->n++] = (rec_info){.off = b->text_len, .len = len, .line = line};
        b->text_len += len;
    }
    return CT_OK;
}

/* Adds the documents of a finished batch to the writers. */
static void store_batch(const batch *b, const uint8_t *is_eval, shard_writer *w[2], prepare_stats *st)
{
    size_t at = 0;
    for (size_t i = 0; i < b->n; i++) {
        size_t n = b->recs[i].doc_len;
        uint8_t flags = b->recs[i].flags;
        const uint8_t *mask = b->mask + at;
        st->truncated += (flags & DOC_TRUNCATED) != 0;
        st->mismatched += (flags & DOC_MISMATCHED) != 0;
        if (flags & DOC_DROPPED) {
            st->dropped++;
        } else {
            int split = is_eval ? is_eval[b->first + i] : 0;
            size_t labels = 0;
            for (size_t j = 0; j < n; j++) labels += mask[j];
            shard_writer_add(w[split], b->tokens + at, mask, n);
            st->split[split].docs++;
            st->split[split].tokens += n;
            st->split[split].labels += labels;
            st->no_labels += labels == 0;
        }
        at += n;
    }
    st->records += b->n;
}

static void progress(const prepare_stats *st, double t0, bool final)
{
    size_t tokens = st->split[0].tokens + st->split[1].tokens;
    double dt = ct_now() - t0;
    fprintf(stderr, "\rprepare: %zu records, %.2fM tokens, %.0f tokens/s%s", st->records, (double)tokens / 1e6,
            dt > 0 ? (double)tokens / dt : 0.0, final ? "\n" : "");
    fflush(stderr);
}

int prepare_run_text(const char *path, const prepare_text_cfg *cfg, int n_threads, const uint8_t *is_eval,
                     size_t n_expected, shard_writer *w[2], prepare_stats *st, ct_error *err)
{
    memset(st, 0, sizeof *st);
    double t0 = ct_now(), shown = t0;
    prepare_input *in = prepare_input_open(path, err);
    if (!in) return err->code;
    pool p = {.n_slots = 2 * (size_t)n_threads + 2, .cfg = cfg, .path = path};
    p.slots = ct_calloc(p.n_slots, sizeof *p.slots);
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.work, NULL);
    pthread_cond_init(&p.done, NULL);
    pthread_t *th = ct_calloc((size_t)n_threads, sizeof *th);
    int started = 0;
    for (; started < n_threads; started++)
        if (pthread_create(&th[started], NULL, worker_main, &p)) break;
    int rc = started ? CT_OK : CT_FAIL_RUNTIME(err, "prepare: cannot start a worker thread");
    ct_error read_err = {0};
    int read_rc = CT_OK;
    bool end = false, tty = isatty(2), shown_any = false;
    size_t stored = 0, records = 0;
    while (rc == CT_OK) {
        while (!end && read_rc == CT_OK && p.filled - stored < p.n_slots) {
            batch *b = &p.slots[p.filled % p.n_slots];
            read_rc = fill_batch(in, b, records, &end, &read_err);
            if (read_rc || b->n == 0) break;
            records += b->n;
            pthread_mutex_lock(&p.mu);
            b->state = SLOT_READY;
            p.filled++;
            pthread_cond_signal(&p.work);
            pthread_mutex_unlock(&p.mu);
        }
        if (stored == p.filled) break;
        batch *b = &p.slots[stored % p.n_slots];
        pthread_mutex_lock(&p.mu);
        while (b->state != SLOT_DONE) pthread_cond_wait(&p.done, &p.mu);
        pthread_mutex_unlock(&p.mu);
        if (b->rc) {
            *err = b->err;
            rc = b->rc;
            pthread_mutex_lock(&p.mu);
            p.failed = true;
            pthread_mutex_unlock(&p.mu);
            break;
        }
        store_batch(b, is_eval, w, st);
        b->state = SLOT_FREE;
        stored++;
        if (tty && ct_now() - shown > 0.5) {
            progress(st, t0, false);
            shown = ct_now();
            shown_any = true;
        }
    }
    if (rc == CT_OK && read_rc) {
        *err = read_err;
        rc = read_rc;
    }
    pthread_mutex_lock(&p.mu);
    p.closing = true;
    pthread_cond_broadcast(&p.work);
    pthread_mutex_unlock(&p.mu);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (shown_any) progress(st, t0, true);
    if (rc == CT_OK && n_expected && records != n_expected)
        rc = CT_FAIL_RUNTIME(err, "%s: the file changed while it was read (%zu records, then %zu)", path, n_expected,
                             records);
    for (size_t i = 0; i < p.n_slots; i++) batch_free(&p.slots[i]);
    free(p.slots);
    free(th);
    pthread_cond_destroy(&p.work);
    pthread_cond_destroy(&p.done);
    pthread_mutex_destroy(&p.mu);
    prepare_input_close(in);
    st->seconds = ct_now() - t0;
    return rc;
}
