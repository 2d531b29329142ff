/* log.c — see log.h. */
#include "log.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "plot.h"

int log_open(ct_log *lg, const char *output_dir, ct_error *err)
{
    memset(lg, 0, sizeof *lg);
    char path[CT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", output_dir);
    lg->metrics = fopen(path, "a");
    if (!lg->metrics) return CT_FAIL_RUNTIME(err, "%s: cannot open for writing", path);
    lg->tty = isatty(fileno(stderr));
    lg->dir = ct_strdup(output_dir);
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

/* "%.6f" of v, or null: JSON has no NaN or infinity (a skipped non-finite step). */
static const char *json_num(char *buf, size_t n, double v)
{
    if (isfinite(v)) snprintf(buf, n, "%.6f", v);
    else snprintf(buf, n, "null");
    return buf;
}

void log_train(ct_log *lg, const ct_train_record *r)
{
    if (lg->quiet) return;
    double gib = (double)r->memory_used / (1 << 30);
    char mem_json[48] = "", mem_text[32] = "", skip_json[48] = "", skip_text[48] = "", lb[32], gb[32];
    char aux_json[48] = "";
    if (isfinite(r->aux_loss)) snprintf(aux_json, sizeof aux_json, ", \"aux_loss\": %.6f", r->aux_loss);
    if (r->memory_used) {
        snprintf(mem_json, sizeof mem_json, ", \"memory_gib\": %.3f", gib);
        snprintf(mem_text, sizeof mem_text, "  mem %.1f GiB", gib);
    }
    if (r->skipped_steps) {
        snprintf(skip_json, sizeof skip_json, ", \"nonfinite_skipped\": %d", r->skipped_steps);
        snprintf(skip_text, sizeof skip_text, "  skipped %d non-finite", r->skipped_steps);
    }
    fprintf(lg->metrics,
            "{\"step\": %d, \"loss\": %s, \"lr\": %.6e, \"grad_norm\": %s, \"tokens\": %.0f, "
            "\"tokens_per_second\": %.1f, \"elapsed\": %.3f%s%s%s}\n",
            r->step, json_num(lb, sizeof lb, r->loss), r->lr, json_num(gb, sizeof gb, r->grad_norm), r->tokens,
            r->tokens_per_second, r->elapsed, mem_json, skip_json, aux_json);
    fflush(lg->metrics);
    char eta[32];
    double per_step = r->step > 0 ? r->elapsed / r->step : NAN;
    fmt_duration(eta, sizeof eta, per_step * (r->total_steps - r->step));
    fprintf(stderr, "%sstep %d/%d  loss %.4f  lr %.2e  gnorm %.3f  %.0f tok/s%s%s  eta %s%s", lg->tty ? "\r\033[K" : "",
            r->step, r->total_steps, r->loss, r->lr, r->grad_norm, r->tokens_per_second, mem_text, skip_text, eta,
            lg->tty ? "" : "\n");
    lg->line_open = lg->tty;
    fflush(stderr);
}

void log_eval(ct_log *lg, int step, double eval_loss, int eval_tokens)
{
    if (lg->quiet) return;
    char lb[32];
    fprintf(lg->metrics, "{\"step\": %d, \"eval_loss\": %s, \"eval_tokens\": %d}\n", step,
            json_num(lb, sizeof lb, eval_loss), eval_tokens);
    fflush(lg->metrics);
    end_line(lg);
    fprintf(stderr, "eval at step %d: loss %.4f (ppl %.2f, %d target tokens)\n", step, eval_loss, exp(eval_loss),
            eval_tokens);
    log_plot(lg);
}

void log_plot(ct_log *lg)
{
    if (lg->quiet) return;
    if (!lg->dir) return;
    ct_error err = {0};
    if (plot_run(lg->dir, &err)) log_note(lg, "note: loss.svg not written: %s", err.msg);
}

void log_note(ct_log *lg, const char *fmt, ...)
{
    if (lg->quiet) return;
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
    free(lg->dir);
    lg->dir = NULL;
}
