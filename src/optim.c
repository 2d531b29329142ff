/* optim.c — see optim.h. */
#include "optim.h"

#include <math.h>

double optim_lr(const ct_training_config *t, int step, int total_steps)
{
    double s = step - 1, warm = t->warmup_steps, total = total_steps;
    if (s < warm) return t->learning_rate * s / (warm > 1 ? warm : 1);
    double span = total - warm > 1 ? total - warm : 1;
    switch (t->lr_scheduler_type) {
    case CT_SCHED_CONSTANT:
        return t->learning_rate;
    case CT_SCHED_LINEAR:
        return t->learning_rate * fmax(0.0, (total - s) / span);
    default: {
        double progress = (s - warm) / span;
        return t->learning_rate * fmax(0.0, 0.5 * (1.0 + cos(M_PI * progress)));
    }
    }
}

void optim_step(ct_backend *be, ct_lora *lo, const ct_training_config *t, float *norm_sq, double lr, int step)
{
    be->zero(be, norm_sq, sizeof(float));
    be->sum_squares(be, norm_sq, lo->grads, lo->n_params);
    be->adamw(be, lo->params, lo->grads, lo->m, lo->v, lo->n_params, norm_sq, (float)t->max_grad_norm, (float)lr,
              (float)t->adam_beta1, (float)t->adam_beta2, (float)t->adam_epsilon, (float)t->weight_decay, step);
}
