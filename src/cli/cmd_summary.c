/* cmd_summary.c — `ctune summary RUN_DIR... [--out FILE]`: one row per run folder
 * (from its metrics.jsonl): steps, final train loss, final eval loss, tokens/s
 * (tokens trained / wall time), wall time, peak device memory when logged. Prints
 * an aligned table and writes the same as CSV (summary.csv in the current
 * folder unless --out says otherwise). Folders without metrics.jsonl are named
 * on stderr and left out, so `ctune summary runs/NAME...` works over a glob that also matches stray files. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "config.h"
#include "metrics.h"

#define N_COLS 7

typedef struct row {
    char name[CT_PATH_MAX];
    int steps;
    double train_loss, eval_loss, tokens_per_second, wall, peak_gib; /* NAN when unknown */
} row;

static const char *const headers[N_COLS] = {"run", "steps", "train_loss", "eval_loss", "tokens_per_s",
                                            "wall_time_s", "peak_mem_gib"};

/* The cells of r as text; unknown values are empty (CSV) or "-" (table). */
static void cells(const row *r, char out[N_COLS][CT_PATH_MAX], const char *unknown)
{
    const double v[] = {r->train_loss, r->eval_loss, r->tokens_per_second, r->wall, r->peak_gib};
    const char *f[] = {"%.4f", "%.4f", "%.0f", "%.1f", "%.2f"};
    snprintf(out[0], CT_PATH_MAX, "%s", r->name);
    snprintf(out[1], CT_PATH_MAX, "%d", r->steps);
    for (int i = 0; i < 5; i++) {
        if (isfinite(v[i])) snprintf(out[i + 2], CT_PATH_MAX, f[i], v[i]);
        else snprintf(out[i + 2], CT_PATH_MAX, "%s", unknown);
    }
}

static int read_run(const char *dir, row *r, ct_error *err)
{
    char path[CT_PATH_MAX + 32];
    snprintf(r->name, sizeof r->name, "%s", dir);
    size_t n = strlen(r->name);
    while (n > 1 && r->name[n - 1] == '/') r->name[--n] = 0;
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->name);
    ct_metrics m;
    int rc = cli_check_file(path, err); /* a FIFO would block the reader */
    if (!rc) rc = metrics_read(path, &m, err);
    if (rc) return rc;
    r->steps = 0;
    r->train_loss = r->eval_loss = r->tokens_per_second = r->wall = r->peak_gib = NAN;
    if (m.n_train > 0) {
        const ct_train_point *last = &m.train[m.n_train - 1];
        r->steps = last->step;
        r->train_loss = last->loss;
        r->wall = last->elapsed;
        if (last->elapsed > 0) r->tokens_per_second = last->tokens / last->elapsed;
        for (size_t i = 0; i < m.n_train; i++)
            if (m.train[i].memory_gib > 0 && !(m.train[i].memory_gib <= r->peak_gib)) r->peak_gib = m.train[i].memory_gib;
    }
    if (m.n_eval > 0) r->eval_loss = m.eval[m.n_eval - 1].loss;
    metrics_free(&m);
    return CT_OK;
}

static void print_table(const row *rows, size_t n)
{
    static char c[N_COLS][CT_PATH_MAX];
    int width[N_COLS];
    for (int k = 0; k < N_COLS; k++) width[k] = (int)strlen(headers[k]);
    for (size_t i = 0; i < n; i++) {
        cells(&rows[i], c, "-");
        for (int k = 0; k < N_COLS; k++)
            if ((int)strlen(c[k]) > width[k]) width[k] = (int)strlen(c[k]);
    }
    for (int k = 0; k < N_COLS; k++) printf(k ? "  %*s" : "%-*s", width[k], headers[k]);
    printf("\n");
    for (size_t i = 0; i < n; i++) {
        cells(&rows[i], c, "-");
        for (int k = 0; k < N_COLS; k++) printf(k ? "  %*s" : "%-*s", width[k], c[k]);
        printf("\n");
    }
}

/* RFC 4180: a field with a comma, quote or newline is quoted, quotes doubled. */
static void csv_field(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static int write_csv(const char *path, const row *rows, size_t n, ct_error *err)
{
    static char c[N_COLS][CT_PATH_MAX];
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    for (int k = 0; k < N_COLS; k++) fprintf(f, "%s%s", k ? "," : "", headers[k]);
    fputc('\n', f);
    for (size_t i = 0; i < n; i++) {
        cells(&rows[i], c, "");
        for (int k = 0; k < N_COLS; k++) {
            if (k) fputc(',', f);
            csv_field(f, c[k]);
        }
        fputc('\n', f);
    }
    fclose(f);
    int rc = ct_write_file_atomic(path, buf, len, err);
    free(buf);
    return rc;
}

int cmd_summary(int argc, char **argv, ct_error *err)
{
    const char *out = "summary.csv";
    const cli_opt opts[] = {
        {"--out", "FILE.csv", "where to write the table as CSV (default summary.csv)", .str = &out},
        {0}};
    const cli_cmd cmd = {"summary", "summary RUN_DIR... [--out FILE.csv]", opts};
    int n_args;
    int rc = cli_parse(&cmd, argc, argv, &n_args, err);
    if (rc) return rc;
    if (n_args == 0) return CT_FAIL_INPUT(err, "usage: ctune summary RUN_DIR... [--out FILE.csv] (no run folder given)");
    row *rows = ct_calloc((size_t)n_args, sizeof *rows);
    size_t n = 0;
    for (int i = 1; i <= n_args; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0 || !S_ISDIR(st.st_mode)) continue; /* a glob's stray file (summary.csv) */
        ct_error why = {0};
        if (read_run(argv[i], &rows[n], &why) == CT_OK) n++;
        else fprintf(stderr, "summary: %s left out: %s\n", argv[i], why.msg);
    }
    if (n == 0) rc = CT_FAIL_INPUT(err, "none of the %d paths is a run folder with a readable metrics.jsonl", n_args);
    if (!rc) {
        print_table(rows, n);
        rc = write_csv(out, rows, n, err);
        if (!rc) fprintf(stderr, "summary: %zu runs, written to %s\n", n, out);
    }
    free(rows);
    return rc;
}
