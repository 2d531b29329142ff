/* packer.h — documents -> packed 1-D micro-batches with their metadata, built once
 * on the host, so that no step waits for the device to learn them
 * (docs/ARCHITECTURE.md).
 *
 * Per epoch the documents are shuffled from (seed, epoch). Consecutive windows of
 * `shuffle_window` documents are packed by best-fit-decreasing into bins of at most
 * `tokens_per_micro_batch` tokens; the bins are emitted in order. With packing off
 * every document is its own micro-batch. Documents longer than max_length are
 * truncated to max_length (counted). The whole schedule is a pure function of
 * (dataset, options, position), so a checkpoint that saves ct_data_pos resumes
 * exactly.
 *
 * A micro-batch holds, for T tokens and n documents:
 *   tokens[T], positions[T] (restart at 0 per document), targets[T] (next token of
 *   the same document if its mask is 1, else CT_IGNORE: so each document's last
 *   position is ignored), cu_seqlens[n+1], max_seqlen, n_targets, and
 *   target_rows[n_targets] (the positions whose target is not ignored: the LM
 *   head runs over these rows only). */
#ifndef CT_PACKER_H
#define CT_PACKER_H

#include "shard.h"

#define CT_IGNORE (-100)

typedef struct ct_batch {
    int capacity;           /* tokens_per_micro_batch: all arrays below hold this many */
    int n_tokens;           /* T */
    int n_docs;             /* n */
    int max_seqlen;
    int n_targets;
    int32_t *tokens;        /* (T) */
    int32_t *positions;     /* (T) */
    int32_t *targets;       /* (T), CT_IGNORE where no loss */
    int32_t *cu_seqlens;    /* (n + 1) */
    int32_t *target_rows;   /* (n_targets) */
    int32_t *target_ids;    /* (n_targets): targets[target_rows[i]] */
    int64_t *doc_ids;       /* (n): global document index of each packed document */
} ct_batch;

void batch_alloc(ct_batch *b, int capacity);
void batch_free(ct_batch *b);

typedef struct ct_packer_options {
    int tokens_per_micro_batch;
    int max_length;
    bool packing;
    int shuffle_window;
    uint64_t seed;
} ct_packer_options;

/* Where the data stream stands: the next micro-batch is bin `bin` of window
 * `window` of epoch `epoch`. Plain data, saved in checkpoints. */
typedef struct ct_data_pos {
    uint64_t epoch;
    uint64_t window;
    uint64_t bin;
    uint64_t batches_done;  /* micro-batches emitted since the start of the run */
} ct_data_pos;

typedef struct ct_packer ct_packer;

/* The dataset must outlive the packer. Fails (CT_ERR_INPUT) on an empty dataset
 * or options that cannot work: tokens_per_micro_batch, max_length or
 * shuffle_window < 1, or max_length > tokens_per_micro_batch with packing on.
 * With packing off a document is cut to min(max_length, tokens_per_micro_batch)
 * so that it fits its micro-batch (counted as truncation). */
ct_packer *packer_new(const ct_dataset *ds, const ct_packer_options *opt, ct_error *err);
void packer_free(ct_packer *p);
/* Fills b (allocated with capacity >= tokens_per_micro_batch) with the next
 * micro-batch; rolls over into the next epoch when one ends. */
void packer_next(ct_packer *p, ct_batch *b);
ct_data_pos packer_position(const ct_packer *p);
/* CT_OK if pos names a micro-batch of this dataset and options; otherwise
 * CT_ERR_INPUT (a checkpoint from a run with other data). Check before seeking to
 * a position read from a file. */
int packer_check_position(ct_packer *p, ct_data_pos pos, ct_error *err);
/* Moves the stream to pos (asserts that packer_check_position accepts it). */
void packer_seek(ct_packer *p, ct_data_pos pos);
/* Micro-batches in epoch 0 (computed by packing it; cached). Later epochs shuffle
 * differently, so their count can differ by a few bins; packer_epoch_stats gives
 * any epoch's exactly. Neither call touches the stream, so either may be made
 * (from one thread) while a loader runs. */
size_t packer_batches_per_epoch(ct_packer *p);

typedef struct ct_packer_stats {
    size_t docs, tokens, truncated_docs, truncated_tokens, batches;
    double efficiency;      /* real tokens / (batches * tokens_per_micro_batch) */
} ct_packer_stats;
/* Packs one whole epoch (without moving the stream) and reports its statistics. */
ct_packer_stats packer_epoch_stats(ct_packer *p, uint64_t epoch);

/* A loader thread that runs the packer ahead of the trainer through a ring of
 * `depth` batches, so a step never waits for packing. While it runs, only the
 * thread may call packer_next/packer_seek. Batches are released in the order
 * received; at most `depth` are held by the caller and the thread together. */
typedef struct ct_loader ct_loader;
ct_loader *loader_start(ct_packer *p, int depth);
/* Blocks until the next batch is ready; the pointer stays valid until loader_release. */
const ct_batch *loader_next(ct_loader *l);
void loader_release(ct_loader *l, const ct_batch *b);
/* Position of the next batch the caller will receive (not of the thread's read-ahead). */
ct_data_pos loader_position(const ct_loader *l);
/* Joins the thread (also when it waits on a full ring) and frees the ring: batches
 * not yet released become invalid. The packer is left at loader_position, so it
 * continues where the caller stopped, as if there had been no read-ahead. */
void loader_stop(ct_loader *l);

#endif
