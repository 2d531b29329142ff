/* plot.c — see plot.h. Layout (pixels): a 760 x 520 canvas; the loss panel
 * spans y 50..330 and the learning-rate panel y 380..480, both over x 80..700,
 * sharing the step axis. Axis ticks fall on 1-2-5 multiples of a power of ten. */
#include "plot.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

enum { W = 760, HGT = 520, X0 = 80, X1 = 700, LOSS_Y0 = 60, LOSS_Y1 = 330, LR_Y0 = 380, LR_Y1 = 480 };

typedef struct range { double lo, hi; } range;

typedef struct panel {
    range x, y;
    int top, bottom;   /* pixel rows of y.hi and y.lo */
} panel;

static double px(const panel *p, double x) { return X0 + (x - p->x.lo) / (p->x.hi - p->x.lo) * (X1 - X0); }
static double py(const panel *p, double y) { return p->bottom - (y - p->y.lo) / (p->y.hi - p->y.lo) * (p->bottom - p->top); }

/* The tick spacing that gives about n ticks over r: 1, 2 or 5 times a power of ten. */
static double tick_step(range r, int n)
{
    double raw = (r.hi - r.lo) / n, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

/* Widens an empty or degenerate range so the mapping never divides by zero,
 * and pads a real one by 5% so no line sits on the frame. */
static range padded(double lo, double hi)
{
    if (!(lo <= hi)) return (range){0, 1};
    if (hi - lo < 1e-12 * (fabs(hi) + 1)) return (range){lo - 0.5 * (fabs(lo) + 1e-3), hi + 0.5 * (fabs(hi) + 1e-3)};
    double pad = 0.05 * (hi - lo);
    return (range){lo - pad, hi + pad};
}

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '"') fputs("&quot;", f);
        else if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
    }
}

static void axes(FILE *f, const panel *p, const char *ylabel, bool x_labels, bool sci)
{
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", X0, p->top,
            X1 - X0, p->bottom - p->top);
    double ys = tick_step(p->y, 5);
    for (double y = ceil(p->y.lo / ys) * ys; y <= p->y.hi; y += ys) {
        double v = fabs(y) < ys * 1e-6 ? 0 : y;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>\n", X0, py(p, v), X1, py(p, v));
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">", X0 - 6, py(p, v) + 4);
        fprintf(f, sci ? "%.1e" : "%.3g", v);
        fputs("</text>\n", f);
    }
    double xs = tick_step(p->x, 8);
    if (xs < 1) xs = 1;
    for (double x = ceil(p->x.lo / xs) * xs; x <= p->x.hi; x += xs) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#888\"/>\n", px(p, x), p->bottom,
                px(p, x), p->bottom + 4);
        if (x_labels) fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", px(p, x),
                              p->bottom + 18, x);
    }
    fprintf(f, "<text x=\"18\" y=\"%d\" transform=\"rotate(-90 18 %d)\" text-anchor=\"middle\">%s</text>\n",
            (p->top + p->bottom) / 2, (p->top + p->bottom) / 2, ylabel);
}

/* A polyline through the points (xs[i], ys[i]) whose y is finite. */
static void polyline(FILE *f, const panel *p, size_t n, const double *xs, const double *ys, const char *color)
{
    if (n == 0) return;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    for (size_t i = 0; i < n; i++)
        if (isfinite(ys[i])) fprintf(f, "%.1f,%.1f ", px(p, xs[i]), py(p, ys[i]));
    fputs("\"/>\n", f);
}

char *plot_svg(const ct_metrics *m, const char *title, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    double x_hi = 1, loss_lo = INFINITY, loss_hi = -INFINITY, lr_lo = INFINITY, lr_hi = -INFINITY;
    for (size_t i = 0; i < m->n_train; i++) {
        const ct_train_point *t = &m->train[i];
        if (t->step > x_hi) x_hi = t->step;
        if (isfinite(t->loss)) loss_lo = fmin(loss_lo, t->loss), loss_hi = fmax(loss_hi, t->loss);
        if (isfinite(t->lr)) lr_lo = fmin(lr_lo, t->lr), lr_hi = fmax(lr_hi, t->lr);
    }
    for (size_t i = 0; i < m->n_eval; i++) {
        if (m->eval[i].step > x_hi) x_hi = m->eval[i].step;
        if (isfinite(m->eval[i].loss)) loss_lo = fmin(loss_lo, m->eval[i].loss), loss_hi = fmax(loss_hi, m->eval[i].loss);
    }
    range xr = {0, x_hi};
    panel loss = {xr, padded(loss_lo, loss_hi), LOSS_Y0, LOSS_Y1};
    panel lr = {xr, padded(lr_lo < 0 ? lr_lo : 0, lr_hi), LR_Y0, LR_Y1};

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n"
               "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, HGT, W, HGT, W, HGT);
    fprintf(f, "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">", (X0 + X1) / 2);
    xml_text(f, title);
    fputs("</text>\n", f);
    axes(f, &loss, "loss", true, false);
    axes(f, &lr, "learning rate", true, true);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (X0 + X1) / 2, LR_Y1 + 34);
    if (m->n_train == 0 && m->n_eval == 0)
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#888\">no data yet</text>\n",
                (X0 + X1) / 2, (LOSS_Y0 + LOSS_Y1) / 2);
    size_t n = m->n_train > m->n_eval ? m->n_train : m->n_eval;
    double *xs = ct_malloc((n + 1) * sizeof(double)), *ys = ct_malloc((n + 1) * sizeof(double));
    for (size_t i = 0; i < m->n_train; i++) xs[i] = m->train[i].step, ys[i] = m->train[i].loss;
    polyline(f, &loss, m->n_train, xs, ys, "#1f77b4");
    for (size_t i = 0; i < m->n_train; i++) ys[i] = m->train[i].lr;
    polyline(f, &lr, m->n_train, xs, ys, "#2ca02c");
    for (size_t i = 0; i < m->n_eval; i++) xs[i] = m->eval[i].step, ys[i] = m->eval[i].loss;
    polyline(f, &loss, m->n_eval, xs, ys, "#ff7f0e");
    for (size_t i = 0; i < m->n_eval; i++)
        if (isfinite(ys[i]))
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#ff7f0e\"/>\n", px(&loss, xs[i]),
                    py(&loss, ys[i]));
    free(xs);
    free(ys);
    /* legend */
    fprintf(f, "<g transform=\"translate(%d %d)\">\n"
               "<line x1=\"0\" y1=\"0\" x2=\"20\" y2=\"0\" stroke=\"#1f77b4\" stroke-width=\"2\"/>"
               "<text x=\"26\" y=\"4\">train loss</text>\n"
               "<line x1=\"110\" y1=\"0\" x2=\"130\" y2=\"0\" stroke=\"#ff7f0e\" stroke-width=\"2\"/>"
               "<text x=\"136\" y=\"4\">eval loss</text>\n"
               "<line x1=\"210\" y1=\"0\" x2=\"230\" y2=\"0\" stroke=\"#2ca02c\" stroke-width=\"2\"/>"
               "<text x=\"236\" y=\"4\">learning rate</text>\n</g>\n", X1 - 330, LOSS_Y0 - 14);
    fputs("</svg>\n", f);
    fclose(f);
    return buf;
}

int plot_run(const char *run_dir, ct_error *err)
{
    char path[CT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    ct_metrics m;
    int rc = metrics_read(path, &m, err);
    if (rc) return rc;
    size_t len;
    char *svg = plot_svg(&m, run_dir, &len);
    metrics_free(&m);
    snprintf(path, sizeof path, "%s/loss.svg", run_dir);
    rc = ct_write_file_atomic(path, svg, len, err);
    free(svg);
    return rc;
}
