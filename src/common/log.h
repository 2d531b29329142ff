/* log.h — what a run reports: OUTPUT_DIR/metrics.jsonl (one JSON object per
 * logged step or eval), OUTPUT_DIR/loss.svg (plot.h: rewritten at each eval and
 * on log_plot), and a progress display on stderr (one updating line on a
 * terminal, plain lines otherwise). */
#ifndef CT_LOG_H
#define CT_LOG_H

#include <stdio.h>
#include "common.h"

typedef struct ct_log {
    FILE *metrics;
    char *dir;        /* the run folder (owned) */
    bool tty;
    bool line_open;   /* a progress line is on screen without its newline */
    bool quiet;       /* reports nothing (the ranks after rank 0 of a run on several GPUs) */
} ct_log;

typedef struct ct_train_record {
    int step, total_steps;
    double loss, lr, grad_norm;
    double tokens;          /* tokens trained so far */
    double tokens_per_second;
    double elapsed;         /* seconds */
    size_t memory_used;     /* device bytes in use (backend memory_used); 0 when unknown (CPU) */
    int skipped_steps;      /* steps since the last record whose update a non-finite gradient skipped */
    double aux_loss;        /* mean router load-balancing loss per micro-batch since the last record
                             * (coefficient included); NAN when training.router_aux_loss is off */
} ct_train_record;

int log_open(ct_log *lg, const char *output_dir, ct_error *err);
void log_train(ct_log *lg, const ct_train_record *r);
void log_eval(ct_log *lg, int step, double eval_loss, int eval_tokens);
/* Rewrites loss.svg from metrics.jsonl; a failure is a note, never fatal (the
 * plot is a view of the run, not part of it). */
void log_plot(ct_log *lg);
/* A message on its own line (ends any progress line first). */
void log_note(ct_log *lg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_close(ct_log *lg);

#endif
