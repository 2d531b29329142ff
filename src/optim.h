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
 * norm_sq is a backend fp32 scalar that receives sum(grad^2) (pre-clip). */
void optim_step(ct_backend *be, ct_lora *lo, const ct_training_config *t, float *norm_sq, double lr, int step);

#endif
