/* metrics.h — reading a run's metrics.jsonl back (for loss.svg and `ctune
 * summary`), and cutting it back to a checkpoint's step on resume. A resumed
 * run truncates the file to its checkpoint first (metrics_truncate); files of
 * older versions can still repeat steps: a training record whose step is not
 * after the last one rewinds the history to just before it (train and eval
 * points alike), which leaves the curve of the run as resumed. A loss logged as null (a skipped non-finite step) reads as
 * NaN. Lines that do not parse (a line cut short by a crash) are skipped. */
#ifndef CT_METRICS_H
#define CT_METRICS_H

#include "common.h"

typedef struct ct_train_point {
    int step;
    double loss, lr, tokens, tokens_per_second, elapsed;
    double memory_gib;     /* device memory in use; 0 when not logged (CPU) */
} ct_train_point;

typedef struct ct_eval_point {
    int step;
    double loss;
} ct_eval_point;

typedef struct ct_metrics {
    ct_train_point *train;
    size_t n_train;
    ct_eval_point *eval;
    size_t n_eval;
} ct_metrics;

/* Reads PATH into m (freed with metrics_free). A missing file is CT_ERR_INPUT. */
int metrics_read(const char *path, ct_metrics *m, ct_error *err);
void metrics_free(ct_metrics *m);

/* Before a run appends to PATH from step max_step + 1 (a resume from
 * checkpoint-MAX_STEP, or 0 for a fresh start): keeps the records of steps <=
 * max_step, in order, and drops the rest, with any line that does not parse
 * (one cut short by a kill), so that every step has one record. Rewrites PATH
 * atomically, and only when something goes; a missing PATH is fine. */
int metrics_truncate(const char *path, long long max_step, ct_error *err);

#endif
