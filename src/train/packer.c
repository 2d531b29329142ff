/* packer.c — see packer.h.
 *
 * The schedule is recomputed, never stored: an epoch's order is a Fisher-Yates
 * shuffle from ct_hash64(seed, epoch), and a window's bins are a pure function of
 * that order. So a position (epoch, window, bin) is all a checkpoint needs, and
 * seeking costs one shuffle plus packing one window. The packer caches the
 * current epoch's order and the current window's bins; packer_epoch_stats uses
 * its own buffers so it neither moves nor disturbs the stream. */
#include "packer.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

void batch_alloc(ct_batch *b, int capacity)
{
    CT_ASSERT(capacity >= 1, "batch_alloc: capacity %d < 1", capacity);
    size_t n = (size_t)capacity;
    memset(b, 0, sizeof *b);
    b->capacity = capacity;
    b->tokens = ct_malloc(n * sizeof *b->tokens);
    b->positions = ct_malloc(n * sizeof *b->positions);
    b->targets = ct_malloc(n * sizeof *b->targets);
    /* Every document holds >= 1 token, so a batch has at most `capacity` of them. */
    b->cu_seqlens = ct_malloc((n + 1) * sizeof *b->cu_seqlens);
    b->target_rows = ct_malloc(n * sizeof *b->target_rows);
    b->target_ids = ct_malloc(n * sizeof *b->target_ids);
    b->doc_ids = ct_malloc(n * sizeof *b->doc_ids);
}

void batch_free(ct_batch *b)
{
    free(b->tokens);
    free(b->positions);
    free(b->targets);
    free(b->cu_seqlens);
    free(b->target_rows);
    free(b->target_ids);
    free(b->doc_ids);
    memset(b, 0, sizeof *b);
}

/* ---- one window's packing ---- */

/* The bins of one window: bin k holds docs[bin_start[k] .. bin_start[k+1]). */
typedef struct window_bins {
    size_t n_bins;
    size_t *docs;       /* (W): global document indices, bins in creation order */
    size_t *bin_start;  /* (W + 1) */
} window_bins;

typedef struct sort_key {
    size_t len;         /* effective length */
    size_t rank;        /* place in the permuted window: the stable tie-break */
    size_t doc;
} sort_key;

/* Scratch for packing one window; sized for the largest window. */
typedef struct pack_scratch {
    sort_key *keys;     /* (W) */
    size_t *bin_free;   /* (W): tokens still free in each open bin */
    size_t *bin_of;     /* (W): bin of the k-th document in placement order */
    size_t *fill;       /* (W): documents placed so far per bin, for the scatter */
} pack_scratch;

struct ct_packer {
    const ct_dataset *ds;
    ct_packer_options opt;
    size_t doc_cap;         /* effective length = min(len, doc_cap) */
    size_t window;          /* documents per window, <= num_docs */
    size_t n_windows;
    ct_data_pos pos;

    bool perm_valid;        /* perm holds the order of epoch perm_epoch */
    uint64_t perm_epoch;
    size_t *perm;           /* (num_docs) */

    bool bins_valid;        /* bins holds window bins_window of epoch perm_epoch */
    uint64_t bins_window;
    window_bins bins;
    pack_scratch scratch;

    bool bpe_valid;         /* batches_per_epoch is cached */
    size_t batches_per_epoch;
};

static size_t effective_len(const ct_packer *p, size_t doc, size_t *raw_len)
{
    const uint8_t *mask;
    size_t len;
    dataset_doc(p->ds, doc, &len, &mask);
    if (raw_len) *raw_len = len;
    return len < p->doc_cap ? len : p->doc_cap;
}

static void window_bins_alloc(window_bins *wb, size_t w)
{
    wb->n_bins = 0;
    wb->docs = ct_malloc(w * sizeof *wb->docs);
    wb->bin_start = ct_malloc((w + 1) * sizeof *wb->bin_start);
}

static void window_bins_free(window_bins *wb)
{
    free(wb->docs);
    free(wb->bin_start);
}

static void pack_scratch_alloc(pack_scratch *s, size_t w)
{
    s->keys = ct_malloc(w * sizeof *s->keys);
    s->bin_free = ct_malloc(w * sizeof *s->bin_free);
    s->bin_of = ct_malloc(w * sizeof *s->bin_of);
    s->fill = ct_malloc(w * sizeof *s->fill);
}

static void pack_scratch_free(pack_scratch *s)
{
    free(s->keys);
    free(s->bin_free);
    free(s->bin_of);
    free(s->fill);
}

/* The order of epoch e: Fisher-Yates from an RNG seeded by (seed, e), so any
 * epoch can be rebuilt alone, in any order of requests. */
static void epoch_order(const ct_packer *p, uint64_t epoch, size_t *perm)
{
    size_t n = p->ds->num_docs;
    for (size_t i = 0; i < n; i++) perm[i] = i;
    ct_rng rng;
    ct_rng_seed(&rng, ct_hash64(p->opt.seed, epoch));
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)ct_rng_below(&rng, (uint64_t)i + 1);
        size_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static int key_cmp(const void *a, const void *b)
{
    const sort_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->rank < y->rank ? -1 : (x->rank > y->rank);
}

static size_t window_size(const ct_packer *p, uint64_t window)
{
    size_t first = (size_t)window * p->window;
    size_t left = p->ds->num_docs - first;
    return left < p->window ? left : p->window;
}

/* Packs window `window` of the order `perm` into wb. */
static void pack_window(const ct_packer *p, const size_t *perm, uint64_t window,
                        window_bins *wb, pack_scratch *s)
{
    size_t first = (size_t)window * p->window, m = window_size(p, window);
    const size_t *docs = perm + first;
    if (!p->opt.packing) {
        for (size_t k = 0; k < m; k++) {
            wb->docs[k] = docs[k];
            wb->bin_start[k] = k;
        }
        wb->bin_start[m] = m;
        wb->n_bins = m;
        return;
    }
    for (size_t k = 0; k < m; k++)
        s->keys[k] = (sort_key){ effective_len(p, docs[k], NULL), k, docs[k] };
    qsort(s->keys, m, sizeof *s->keys, key_cmp);

    /* Best-fit decreasing: the open bin with the least free space that still fits;
     * the earliest such bin on ties. A linear scan is fine at window sizes of ~1k. */
    size_t cap = (size_t)p->opt.tokens_per_micro_batch, n_bins = 0;
    for (size_t k = 0; k < m; k++) {
        size_t len = s->keys[k].len, best = n_bins;
        for (size_t b = 0; b < n_bins; b++) {
            if (s->bin_free[b] < len) continue;
            if (best == n_bins || s->bin_free[b] < s->bin_free[best]) best = b;
            if (s->bin_free[b] == len) break;
        }
        if (best == n_bins) s->bin_free[n_bins++] = cap;
        s->bin_free[best] -= len;
        s->bin_of[k] = best;
    }

    /* Scatter into bins in creation order, keeping placement order inside each. */
    for (size_t b = 0; b < n_bins; b++) s->fill[b] = 0;
    for (size_t k = 0; k < m; k++) s->fill[s->bin_of[k]]++;
    wb->bin_start[0] = 0;
    for (size_t b = 0; b < n_bins; b++) {
        wb->bin_start[b + 1] = wb->bin_start[b] + s->fill[b];
        s->fill[b] = wb->bin_start[b];
    }
    for (size_t k = 0; k < m; k++) wb->docs[s->fill[s->bin_of[k]]++] = s->keys[k].doc;
    wb->n_bins = n_bins;
}

/* Makes p->bins hold window `window` of epoch `epoch` (the stream's caches). */
static void load_window(ct_packer *p, uint64_t epoch, uint64_t window)
{
    if (!p->perm_valid || p->perm_epoch != epoch) {
        epoch_order(p, epoch, p->perm);
        p->perm_valid = true;
        p->perm_epoch = epoch;
        p->bins_valid = false;
    }
    if (!p->bins_valid || p->bins_window != window) {
        pack_window(p, p->perm, window, &p->bins, &p->scratch);
        p->bins_valid = true;
        p->bins_window = window;
    }
}

/* ---- the packer ---- */

ct_packer *packer_new(const ct_dataset *ds, const ct_packer_options *opt, ct_error *err)
{
    if (ds->num_docs == 0) {
        CT_FAIL_INPUT(err, "data: the dataset holds no documents");
        return NULL;
    }
    if (opt->tokens_per_micro_batch < 1) {
        CT_FAIL_INPUT(err, "data.tokens_per_micro_batch: expected >= 1, found %d",
                      opt->tokens_per_micro_batch);
        return NULL;
    }
    if (opt->max_length < 1) {
        CT_FAIL_INPUT(err, "data.max_length: expected >= 1, found %d", opt->max_length);
        return NULL;
    }
    if (opt->packing && opt->max_length > opt->tokens_per_micro_batch) {
        CT_FAIL_INPUT(err, "data.max_length (%d) exceeds data.tokens_per_micro_batch (%d) "
                      "with packing on: a sample of max_length would not fit in a micro-batch",
                      opt->max_length, opt->tokens_per_micro_batch);
        return NULL;
    }
    if (opt->shuffle_window < 1) {
        CT_FAIL_INPUT(err, "data.shuffle_window: expected >= 1, found %d", opt->shuffle_window);
        return NULL;
    }
    ct_packer *p = ct_calloc(1, sizeof *p);
    p->ds = ds;
    p->opt = *opt;
    /* Without packing a micro-batch is one document, so it must also fit the batch. */
    p->doc_cap = (size_t)opt->max_length;
    if (!opt->packing && opt->tokens_per_micro_batch < opt->max_length)
        p->doc_cap = (size_t)opt->tokens_per_micro_batch;
    p->window = (size_t)opt->shuffle_window < ds->num_docs ? (size_t)opt->shuffle_window
                                                           : ds->num_docs;
    p->n_windows = ct_ceil_div(ds->num_docs, p->window);
    p->perm = ct_malloc(ds->num_docs * sizeof *p->perm);
    window_bins_alloc(&p->bins, p->window);
    pack_scratch_alloc(&p->scratch, p->window);
    return p;
}

void packer_free(ct_packer *p)
{
    if (!p) return;
    free(p->perm);
    window_bins_free(&p->bins);
    pack_scratch_free(&p->scratch);
    free(p);
}

void packer_next(ct_packer *p, ct_batch *b)
{
    CT_ASSERT(b->capacity >= p->opt.tokens_per_micro_batch,
              "packer_next: batch capacity %d < tokens_per_micro_batch %d",
              b->capacity, p->opt.tokens_per_micro_batch);
    load_window(p, p->pos.epoch, p->pos.window);
    const window_bins *wb = &p->bins;
    CT_ASSERT(p->pos.bin < wb->n_bins, "packer_next: bin %llu of a window of %zu bins",
              (unsigned long long)p->pos.bin, wb->n_bins);

    size_t lo = wb->bin_start[p->pos.bin], hi = wb->bin_start[p->pos.bin + 1];
    int32_t t = 0, max_seqlen = 0, n_targets = 0;
    b->n_docs = (int)(hi - lo);
    for (size_t k = lo; k < hi; k++) {
        size_t doc = wb->docs[k], len;
        const uint8_t *mask;
        const uint32_t *tok = dataset_doc(p->ds, doc, &len, &mask);
        if (len > p->doc_cap) len = p->doc_cap;
        b->cu_seqlens[k - lo] = t;
        b->doc_ids[k - lo] = (int64_t)doc;
        for (size_t j = 0; j < len; j++, t++) {
            b->tokens[t] = (int32_t)tok[j];
            b->positions[t] = (int32_t)j;
            /* Position j predicts token j+1 of the same document, where that token is
             * a label; a truncated document's last kept token predicts nothing. */
            if (j + 1 < len && mask[j + 1]) {
                b->targets[t] = (int32_t)tok[j + 1];
                b->target_rows[n_targets] = t;
                b->target_ids[n_targets++] = (int32_t)tok[j + 1];
            } else {
                b->targets[t] = CT_IGNORE;
            }
        }
        if ((int32_t)len > max_seqlen) max_seqlen = (int32_t)len;
    }
    b->cu_seqlens[hi - lo] = t;
    b->n_tokens = t;
    b->max_seqlen = max_seqlen;
    b->n_targets = n_targets;
    CT_ASSERT(t <= p->opt.tokens_per_micro_batch, "packer_next: bin of %d tokens", t);

    p->pos.batches_done++;
    if (++p->pos.bin < wb->n_bins) return;
    p->pos.bin = 0;
    if (++p->pos.window < p->n_windows) return;
    p->pos.window = 0;
    p->pos.epoch++;
}

ct_data_pos packer_position(const ct_packer *p) { return p->pos; }

int packer_check_position(ct_packer *p, ct_data_pos pos, ct_error *err)
{
    if (pos.window < p->n_windows) {
        load_window(p, pos.epoch, pos.window);
        if (pos.bin < p->bins.n_bins) return CT_OK;
    }
    return CT_FAIL_INPUT(err, "data position (epoch %llu, window %llu, bin %llu) does not exist "
                         "in this dataset (%zu windows); HINT: resume with the data files and "
                         "data options of the checkpoint's run",
                         (unsigned long long)pos.epoch, (unsigned long long)pos.window,
                         (unsigned long long)pos.bin, p->n_windows);
}

void packer_seek(ct_packer *p, ct_data_pos pos)
{
    CT_ASSERT(packer_check_position(p, pos, NULL) == CT_OK,
              "packer_seek: position (epoch %llu, window %llu, bin %llu) out of range",
              (unsigned long long)pos.epoch, (unsigned long long)pos.window,
              (unsigned long long)pos.bin);
    p->pos = pos;
}

ct_packer_stats packer_epoch_stats(ct_packer *p, uint64_t epoch)
{
    ct_packer_stats st = { 0 };
    size_t *perm = ct_malloc(p->ds->num_docs * sizeof *perm);
    window_bins wb;
    pack_scratch s;
    window_bins_alloc(&wb, p->window);
    pack_scratch_alloc(&s, p->window);
    epoch_order(p, epoch, perm);
    for (uint64_t w = 0; w < p->n_windows; w++) {
        pack_window(p, perm, w, &wb, &s);
        st.batches += wb.n_bins;
    }
    for (size_t d = 0; d < p->ds->num_docs; d++) {
        size_t raw, len = effective_len(p, d, &raw);
        st.docs++;
        st.tokens += len;
        if (raw > len) {
            st.truncated_docs++;
            st.truncated_tokens += raw - len;
        }
    }
    st.efficiency = (double)st.tokens / ((double)st.batches * p->opt.tokens_per_micro_batch);
    window_bins_free(&wb);
    pack_scratch_free(&s);
    free(perm);
    return st;
}

size_t packer_batches_per_epoch(ct_packer *p)
{
    if (!p->bpe_valid) {
        p->batches_per_epoch = packer_epoch_stats(p, 0).batches;
        p->bpe_valid = true;
    }
    return p->batches_per_epoch;
}

/* ---- the loader thread ----
 * A ring of `depth` slots driven by three counters: the thread fills slot
 * filled % depth while filled - released < depth; the caller takes slot
 * taken % depth while taken < filled and gives slots back in the same order.
 * Each slot remembers the packer position it was produced from, so the caller
 * can learn the position of the next batch it will receive, not the thread's. */

struct ct_loader {
    ct_packer *p;
    int depth;
    ct_batch *slots;            /* (depth) */
    ct_data_pos *slot_pos;      /* (depth): position each slot was produced from */
    ct_data_pos next_fill;      /* position the thread will produce from next */
    uint64_t filled, taken, released;
    bool stop;
    pthread_mutex_t mu;
    pthread_cond_t can_fill;    /* a slot was released, or stop */
    pthread_cond_t can_take;    /* a slot was filled */
    pthread_t thread;
};

static void *loader_main(void *arg)
{
    ct_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && l->filled - l->released >= (uint64_t)l->depth)
            pthread_cond_wait(&l->can_fill, &l->mu);
        if (l->stop) break;
        int slot = (int)(l->filled % (uint64_t)l->depth);
        l->slot_pos[slot] = l->next_fill;
        /* Pack outside the lock: the slot is ours until `filled` moves past it,
         * and only this thread touches the packer while the loader runs. */
        pthread_mutex_unlock(&l->mu);
        packer_next(l->p, &l->slots[slot]);
        ct_data_pos after = packer_position(l->p);
        pthread_mutex_lock(&l->mu);
        l->next_fill = after;
        l->filled++;
        pthread_cond_signal(&l->can_take);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

ct_loader *loader_start(ct_packer *p, int depth)
{
    CT_ASSERT(depth >= 1, "loader_start: depth %d < 1", depth);
    ct_loader *l = ct_calloc(1, sizeof *l);
    l->p = p;
    l->depth = depth;
    l->slots = ct_calloc((size_t)depth, sizeof *l->slots);
    l->slot_pos = ct_calloc((size_t)depth, sizeof *l->slot_pos);
    for (int i = 0; i < depth; i++) batch_alloc(&l->slots[i], p->opt.tokens_per_micro_batch);
    l->next_fill = packer_position(p);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->can_fill, NULL);
    pthread_cond_init(&l->can_take, NULL);
    int rc = pthread_create(&l->thread, NULL, loader_main, l);
    CT_ASSERT(rc == 0, "loader_start: pthread_create failed (%d)", rc);
    return l;
}

const ct_batch *loader_next(ct_loader *l)
{
    pthread_mutex_lock(&l->mu);
    while (l->taken == l->filled) pthread_cond_wait(&l->can_take, &l->mu);
    const ct_batch *b = &l->slots[l->taken % (uint64_t)l->depth];
    l->taken++;
    pthread_mutex_unlock(&l->mu);
    return b;
}

void loader_release(ct_loader *l, const ct_batch *b)
{
    pthread_mutex_lock(&l->mu);
    CT_ASSERT(l->released < l->taken && b == &l->slots[l->released % (uint64_t)l->depth],
              "loader_release: batches must be released once each, in the order received");
    l->released++;
    pthread_cond_signal(&l->can_fill);
    pthread_mutex_unlock(&l->mu);
}

ct_data_pos loader_position(const ct_loader *l)
{
    ct_loader *m = (ct_loader *)l; /* locking is not a logical change */
    pthread_mutex_lock(&m->mu);
    ct_data_pos pos = l->taken < l->filled ? l->slot_pos[l->taken % (uint64_t)l->depth]
                                           : l->next_fill;
    pthread_mutex_unlock(&m->mu);
    return pos;
}

void loader_stop(ct_loader *l)
{
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_signal(&l->can_fill);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    /* Undo the read-ahead: the packer resumes at the caller's next batch. */
    packer_seek(l->p, loader_position(l));
    for (int i = 0; i < l->depth; i++) batch_free(&l->slots[i]);
    free(l->slots);
    free(l->slot_pos);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->can_fill);
    pthread_cond_destroy(&l->can_take);
    free(l);
}
