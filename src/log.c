/* log.c — see log.h. */
#include "log.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

int log_open(ct_log *lg, const char *output_dir, ct_error *err)
{
    memset(lg, 0, sizeof *lg);
    char path[CT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", output_dir);
    lg->metrics = fopen(path, "a");
    if (!lg->metrics) return CT_FAIL_RUNTIME(err, "%s: cannot open for writing", path);
    lg->tty = isatty(fileno(stderr));
    return CT_OK;
}

static void end_line(ct_log *lg)
{
    if (lg->line_open) fputc('\n', stderr);
    lg->line_open = false;
}

static void fmt_duration(char *out, size_t len, double s)
{
    if (!isfinite(s) || s < 0) snprintf(out, len, "?");
    else if (s < 60) snprintf(out, len, "%.0fs", s);
    else if (s < 3600) snprintf(out, len, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(out, len, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

void log_train(ct_log *lg, const ct_train_record *r)
{
    fprintf(lg->metrics,
            "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"tokens\": %.0f, "
            "\"tokens_per_second\": %.1f, \"elapsed\": %.3f}\n",
            r->step, r->loss, r->lr, r->grad_norm, r->tokens, r->tokens_per_second, r->elapsed);
    fflush(lg->metrics);
    char eta[32];
    double per_step = r->step > 0 ? r->elapsed / r->step : NAN;
    fmt_duration(eta, sizeof eta, per_step * (r->total_steps - r->step));
    if (lg->tty) {
        fprintf(stderr, "\r\033[Kstep %d/%d  loss %.4f  lr %.2e  gnorm %.3f  %.0f tok/s  eta %s", r->step,
                r->total_steps, r->loss, r->lr, r->grad_norm, r->tokens_per_second, eta);
        lg->line_open = true;
    } else {
        fprintf(stderr, "step %d/%d  loss %.4f  lr %.2e  gnorm %.3f  %.0f tok/s  eta %s\n", r->step, r->total_steps,
                r->loss, r->lr, r->grad_norm, r->tokens_per_second, eta);
    }
    fflush(stderr);
}

void log_eval(ct_log *lg, int step, double eval_loss, int eval_tokens)
{
    fprintf(lg->metrics, "{\"step\": %d, \"eval_loss\": %.6f, \"eval_tokens\": %d}\n", step, eval_loss, eval_tokens);
    fflush(lg->metrics);
    end_line(lg);
    fprintf(stderr, "eval at step %d: loss %.4f (ppl %.2f, %d target tokens)\n", step, eval_loss, exp(eval_loss),
            eval_tokens);
}

void log_note(ct_log *lg, const char *fmt, ...)
{
    end_line(lg);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void log_close(ct_log *lg)
{
    end_line(lg);
    if (lg->metrics) fclose(lg->metrics);
    lg->metrics = NULL;
}
