/* optim.c — see optim.h. */
#include "optim.h"

#include "hooks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

// ---- the non-finite guard ----

int optim_guard_init(ct_guard *g, ct_backend *be, const ct_training_config *t, ct_error *err)
{
    memset(g, 0, sizeof *g);
    g->max_in_a_row = t->max_nonfinite_steps;
    g->cap = t->logging_steps < g->max_in_a_row ? t->logging_steps : g->max_in_a_row;
    if (g->cap > CT_GUARD_MAX) g->cap = CT_GUARD_MAX;
    if (g->cap < 1) g->cap = 1;
    const char *inj = hooks_get()->inject_nan_step;
    if (inj) {
        int n = 0;
        if (sscanf(inj, "%d-%d%n", &g->inject_first, &g->inject_last, &n) != 2 || inj[n]) {
            n = 0;
            if (sscanf(inj, "%d%n", &g->inject_first, &n) != 1 || inj[n])
                return CT_FAIL_INPUT(err, "CTUNE_INJECT_NAN_STEP=%s: expected a step K or a range K-M", inj);
            g->inject_last = g->inject_first;
        }
    }
    g->ring = be->alloc(be, (size_t)g->cap * 2 * sizeof(float));
    if (!g->ring) return CT_FAIL_RUNTIME(err, "out of device memory (the gradient-norm ring, %d floats)", 2 * g->cap);
    return CT_OK;
}

void optim_guard_free(ct_guard *g, ct_backend *be)
{
    if (g->ring) be->free(be, g->ring);
    g->ring = NULL;
}

float *optim_guard_slot(ct_guard *g, int step)
{
    CT_ASSERT(g->used < g->cap, "guard: the ring of %d steps is full (read it first)", g->cap);
    if (g->used == 0) g->first_step = step;
    return g->ring + 2 * g->used++;
}

void optim_guard_watch(ct_guard *g, ct_backend *be, const ct_lora *lo)
{
    CT_ASSERT(g->used > 0, "guard: optim_guard_watch before optim_guard_slot");
    float *slot = g->ring + 2 * (g->used - 1) + 1;
    be->zero(be, slot, sizeof(float));
    be->sum_squares(be, slot, lo->params, lo->n_params);
}

bool optim_guard_full(const ct_guard *g) { return g->used == g->cap; }

/* Counts the host copy v (used, 2) of the ring as read. */
static void guard_count(ct_guard *g, const float *v, int used)
{
    for (int i = 0; i < used; i++) {
        if (!isfinite(v[2 * i + 1]) && !g->bad_weights_step) g->bad_weights_step = g->first_step + i;
        if (isfinite(v[2 * i])) {
            g->streak = 0;
            continue;
        }
        if (g->streak++ == 0) g->streak_start = g->first_step + i;
        g->skipped++;
        g->skipped_since_log++;
    }
    if (used > 0) g->last_norm_sq = v[2 * (used - 1)];
}

void optim_guard_read(ct_guard *g, ct_backend *be)
{
    if (g->used == 0) return;
    float v[2 * CT_GUARD_MAX];
    be->download(be, v, g->ring, (size_t)g->used * 2 * sizeof(float));
    guard_count(g, v, g->used);
    g->used = 0;
}

bool optim_guard_tripped(const ct_guard *g) { return g->streak >= g->max_in_a_row; }

void optim_guard_inject(const ct_guard *g, ct_backend *be, float *grads, int step)
{
    if (!g->inject_first || step < g->inject_first || step > g->inject_last) return;
    float nan = NAN;
    be->upload(be, grads, &nan, sizeof nan);
}

void optim_guard_save(const ct_guard *g, ct_backend *be, ct_guard_state *s)
{
    memset(s, 0, sizeof *s);
    s->streak = g->streak;
    s->streak_start = g->streak_start;
    s->skipped = g->skipped;
    s->skipped_since_log = g->skipped_since_log;
    s->first_step = g->first_step;
    s->used = g->used;
    s->last_norm_sq = g->last_norm_sq;
    if (g->used > 0) be->download(be, s->ring, g->ring, (size_t)g->used * 2 * sizeof(float));
}

void optim_guard_restore(ct_guard *g, ct_backend *be, const ct_guard_state *s)
{
    CT_ASSERT(s->used >= 0 && s->used <= CT_GUARD_MAX, "guard: %lld saved slots", (long long)s->used);
    /* A checkpoint that a streak stopped the run with: resuming it is trying again. */
    bool stopped = s->streak >= g->max_in_a_row;
    g->streak = stopped ? 0 : (int)s->streak;
    g->streak_start = stopped ? 0 : (int)s->streak_start;
    g->skipped = s->skipped;
    g->skipped_since_log = (int)s->skipped_since_log;
    g->last_norm_sq = s->last_norm_sq;
    g->first_step = (int)s->first_step;
    g->used = 0;
    if (s->used > g->cap) {
        guard_count(g, s->ring, (int)s->used);
        return;
    }
    g->used = (int)s->used;
    if (g->used > 0) be->upload(be, g->ring, s->ring, (size_t)g->used * 2 * sizeof(float));
}
