/* prepare_pool.h — the input of `ctune prepare` read record by record, and the
 * worker pool that turns records of text into documents in parallel.
 *
 * Input: JSONL (one record a non-blank line) or one JSON array of records,
 * told apart by the first byte that is not white space ('[': an array). A
 * record is known by the line it starts on ("data.json:17"). The array is split
 * into its elements by a scan of strings and brackets only; each element is
 * then parsed in full by its worker, so a malformed one is named by its line.
 *
 * The pool: the calling thread reads batches of records (about 256 KiB, at most
 * 512 records) into a ring of 2 x threads + 2 slots; workers take them in order
 * and tokenize them (prepare_text_record); the calling thread stores each
 * finished batch, oldest first, into the shard writers. So documents keep the
 * input order and the shards are byte for byte the same for any --threads, and
 * memory is the shard writers' 5 bytes a token plus the slots in flight. The
 * first bad record in file order is the error reported, whatever the timing. */
#ifndef CT_PREPARE_POOL_H
#define CT_PREPARE_POOL_H

#include "prepare_text.h"
#include "shard.h"

typedef struct prepare_input prepare_input;

/* Opens path for reading records. CT_ERR_INPUT when it cannot be opened. */
prepare_input *prepare_input_open(const char *path, ct_error *err);
bool prepare_input_is_array(const prepare_input *in);
/* The next record: *rec (valid until the next call; not NUL-terminated), *len and
 * the line it starts on; *rec = NULL at the end. CT_ERR_INPUT for a JSON array
 * that is not closed or has text after it ("data.json:9: expected ',' or ']'
 * after the record of line 4, found '}'"), CT_ERR_RUNTIME for a read error. */
int prepare_input_next(prepare_input *in, const char **rec, size_t *len, size_t *line, ct_error *err);
void prepare_input_close(prepare_input *in);

typedef struct prepare_split {
    size_t docs, tokens, labels;
} prepare_split;

typedef struct prepare_stats {
    size_t records;           /* read */
    prepare_split split[2];   /* train, eval: documents written */
    size_t truncated;         /* cut to --max-length */
    size_t dropped;           /* of them, left without a label: not written */
    size_t mismatched;        /* prompt_completion: the prompt's tokens are not a prefix */
    size_t no_labels;         /* written with no label token */
    double seconds;
} prepare_stats;

/* Runs every record of path through prepare_text_record on n_threads workers
 * (>= 1) and adds each document to w[is_eval[record]] (is_eval NULL: all to
 * w[0]); n_expected > 0 is the record count of an earlier pass, which the file
 * must still have. A progress line goes to stderr when it is a terminal.
 * Nothing is added after the first error. */
int prepare_run_text(const char *path, const prepare_text_cfg *cfg, int n_threads, const uint8_t *is_eval,
                     size_t n_expected, shard_writer *w[2], prepare_stats *st, ct_error *err);

#endif
