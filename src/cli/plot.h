/* plot.h — loss.svg: train and eval loss against step (top panel) and the
 * learning rate (bottom panel), as a plain self-contained SVG file that any
 * browser shows. Written by ctune itself: no Python, no plotting library. */
#ifndef CT_PLOT_H
#define CT_PLOT_H

#include "metrics.h"

/* Renders m as SVG text (caller frees; *len receives its length). title is
 * escaped for XML. */
char *plot_svg(const ct_metrics *m, const char *title, size_t *len);

/* Reads RUN_DIR/metrics.jsonl and writes RUN_DIR/loss.svg atomically. */
int plot_run(const char *run_dir, ct_error *err);

#endif
