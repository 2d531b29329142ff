/* interrupt.h — SIGINT / SIGTERM during `ctune train`. The first signal asks the
 * training loop to stop after the step in progress; the trainer then saves a
 * checkpoint (which resume_from_checkpoint: auto picks up) and exits 130 for
 * SIGINT or 143 for SIGTERM (128 + the signal, as shells report it). A second
 * signal while that happens exits at once with the same code, saving nothing. */
#ifndef CT_INTERRUPT_H
#define CT_INTERRUPT_H

#include "common.h"

/* Installs the handlers (and forgets any earlier request). */
void interrupt_install(void);
/* Puts back the handlers that were there before interrupt_install. */
void interrupt_restore(void);
/* The signal that asked to stop (SIGINT or SIGTERM), or 0. Async-safe to poll. */
int interrupt_pending(void);
/* Fills err with "interrupted by SIGINT after step N; ..." for sig (SIGINT or
 * SIGTERM: the one that stopped the run, on this rank or another) and returns
 * the exit code 128 + sig. */
int interrupt_fail(ct_error *err, int sig, const char *output_dir, long long step);

#endif
