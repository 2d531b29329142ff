/* optim.h — the learning-rate schedule and the optimizer step over all LoRA
 * parameters (clip by global norm + AdamW, on the backend, no host sync). */
#ifndef CT_OPTIM_H
#define CT_OPTIM_H

#include "config.h"
#include "lora.h"

/* Learning rate for optimizer step `step` (1-based) of total_steps, as
 * transformers' get_{constant,linear,cosine}_schedule_with_warmup give it
 * (their lambda is evaluated at step - 1). */
double optim_lr(const ct_training_config *t, int step, int total_steps);

/* Clips by the global gradient norm and applies AdamW to every LoRA parameter.
 * norm_sq is a backend fp32 scalar that receives sum(grad^2) (pre-clip). When
 * it is not finite (a NaN/inf loss or gradient) the backend skips the update:
 * parameters and moments stay as they were. */
void optim_step(ct_backend *be, ct_lora *lo, const ct_training_config *t, float *norm_sq, double lr, int step);

/* The non-finite guard: counts the steps whose update was skipped, without a
 * host sync per step. Each step's sum(grad^2) goes to its own slot of a small
 * backend ring (optim_guard_slot); the host reads the ring (one download) only
 * on logging steps or when it is full, and then knows which steps were skipped.
 * A NaN or inf loss makes every gradient NaN, so the norm catches both; an fp32
 * overflow of the norm itself (gradients ~1e19) is skipped as well.
 * Test hook: CTUNE_INJECT_NAN_STEP=K (or K-M) makes steps K..M non-finite by
 * writing a NaN into the first LoRA gradient (optim_guard_inject). */
typedef struct ct_guard {
    float *ring;            /* backend fp32 (cap): sum(grad^2) of steps first_step.. */
    int cap, used;
    int first_step;         /* the step whose value is in ring[0] */
    int max_in_a_row;       /* training.max_nonfinite_steps */
    int streak;             /* non-finite steps in a row, ending at the newest step read */
    int streak_start;       /* the first step of that streak */
    long long skipped;      /* skipped steps read so far */
    int skipped_since_log;  /* the caller resets it when it logs */
    float last_norm_sq;     /* of the newest step read */
    int inject_first, inject_last; /* CTUNE_INJECT_NAN_STEP; 0 when unset */
} ct_guard;

/* Allocates the ring: min(logging_steps, max_nonfinite_steps, 256) slots, so
 * reads ride on the logging ones and a streak is seen within max_nonfinite_steps
 * steps of completing. CT_ERR_RUNTIME when out of device memory; a malformed
 * CTUNE_INJECT_NAN_STEP is CT_ERR_INPUT. */
int optim_guard_init(ct_guard *g, ct_backend *be, const ct_training_config *t, ct_error *err);
void optim_guard_free(ct_guard *g, ct_backend *be);
/* The norm_sq slot of STEP, for optim_step. Call once per step, and
 * optim_guard_read before the ring is full (optim_guard_full). */
float *optim_guard_slot(ct_guard *g, int step);
bool optim_guard_full(const ct_guard *g);
/* Downloads the slots used since the last read (one host sync) and updates
 * the counts and the streak; empties the ring. */
void optim_guard_read(ct_guard *g, ct_backend *be);
/* The streak has reached training.max_nonfinite_steps. */
bool optim_guard_tripped(const ct_guard *g);
/* The test hook: poisons grads when STEP is in CTUNE_INJECT_NAN_STEP's range. */
void optim_guard_inject(const ct_guard *g, ct_backend *be, float *grads, int step);

#endif
