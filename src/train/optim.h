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
 * backend ring (optim_guard_slot), and beside it the sum of squares of the LoRA
 * weights after the update (optim_guard_watch); the host reads the ring (one
 * download) only on logging steps or when it is full, and then knows which
 * steps were skipped and whether an update left a weight non-finite.
 * A NaN or inf loss makes every gradient NaN, so the norm catches both; an fp32
 * overflow of the norm itself (gradients ~1e19) is skipped as well. The weights
 * check catches what the gradient check cannot: an update that overflows (a
 * learning rate or weight decay too large for fp32), which AdamW applies.
 * Test hook: CTUNE_INJECT_NAN_STEP=K (or K-M) makes steps K..M non-finite by
 * writing a NaN into the first LoRA gradient (optim_guard_inject). */
#define CT_GUARD_MAX 256        /* most steps the ring holds between reads */

typedef struct ct_guard {
    float *ring;            /* backend fp32 (cap, 2): per step from first_step: sum(grad^2), sum(weight^2) */
    int cap, used;
    int first_step;         /* the step whose values are in ring[0] */
    int max_in_a_row;       /* training.max_nonfinite_steps */
    int streak;             /* non-finite steps in a row, ending at the newest step read */
    int streak_start;       /* the first step of that streak */
    long long skipped;      /* skipped steps read so far */
    int skipped_since_log;  /* the caller resets it when it logs */
    float last_norm_sq;     /* of the newest step read */
    int bad_weights_step;   /* the first step read whose update left a weight non-finite; 0 if none */
    int inject_first, inject_last; /* CTUNE_INJECT_NAN_STEP; 0 when unset */
} ct_guard;

/* What a checkpoint keeps of the guard: its counts and the ring's unread steps,
 * so that a resumed run reads, skips and stops exactly where an uninterrupted
 * one does. */
typedef struct ct_guard_state {
    int64_t streak, streak_start, skipped, skipped_since_log;
    int64_t first_step, used;       /* the unread steps: first_step .. first_step + used - 1 */
    float last_norm_sq;
    float ring[2 * CT_GUARD_MAX];   /* (used, 2) as in ct_guard.ring */
} ct_guard_state;

/* Allocates the ring: min(logging_steps, max_nonfinite_steps, CT_GUARD_MAX)
 * slots, so reads ride on the logging ones and a streak is seen within
 * max_nonfinite_steps steps of completing. CT_ERR_RUNTIME when out of device
 * memory; a malformed CTUNE_INJECT_NAN_STEP is CT_ERR_INPUT. */
int optim_guard_init(ct_guard *g, ct_backend *be, const ct_training_config *t, ct_error *err);
void optim_guard_free(ct_guard *g, ct_backend *be);
/* The norm_sq slot of STEP, for optim_step. Call once per step, and
 * optim_guard_read before the ring is full (optim_guard_full). */
float *optim_guard_slot(ct_guard *g, int step);
/* After optim_step: the sum of squares of the updated weights into the newest
 * step's second slot (backend work, no host sync). */
void optim_guard_watch(ct_guard *g, ct_backend *be, const ct_lora *lo);
bool optim_guard_full(const ct_guard *g);
/* Downloads the slots used since the last read (one host sync) and updates
 * the counts, the streak and bad_weights_step; empties the ring. */
void optim_guard_read(ct_guard *g, ct_backend *be);
/* The streak has reached training.max_nonfinite_steps. */
bool optim_guard_tripped(const ct_guard *g);
/* The test hook: poisons grads when STEP is in CTUNE_INJECT_NAN_STEP's range. */
void optim_guard_inject(const ct_guard *g, ct_backend *be, float *grads, int step);
/* Copies the guard, unread ring slots included (a download), into s. */
void optim_guard_save(const ct_guard *g, ct_backend *be, ct_guard_state *s);
/* Puts a saved guard back (s checked by its reader: used <= CT_GUARD_MAX).
 * Unread slots go back into the ring; when they do not fit (logging_steps or
 * max_nonfinite_steps made the ring smaller) they are read at once instead.
 * A streak that had stopped the run starts again from 0. */
void optim_guard_restore(ct_guard *g, ct_backend *be, const ct_guard_state *s);

#endif
