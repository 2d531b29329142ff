/* metrics.c — see metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "json.h"

static double num(const json_value *o, const char *key, double dflt)
{
    const json_value *v = json_get_type(o, key, JSON_NUMBER);
    return v ? v->number : dflt;
}

static void add_line(ct_metrics *m, const json_value *o, size_t *cap_t, size_t *cap_e)
{
    const json_value *step = json_get_type(o, "step", JSON_NUMBER);
    if (!step) return;
    int s = (int)step->number;
    if (json_get(o, "loss")) {
        if (m->n_train > 0 && s <= m->train[m->n_train - 1].step) {
            while (m->n_train > 0 && m->train[m->n_train - 1].step >= s) m->n_train--;
            while (m->n_eval > 0 && m->eval[m->n_eval - 1].step >= s) m->n_eval--;
        }
        if (m->n_train == *cap_t) m->train = ct_realloc(m->train, (*cap_t = 2 * *cap_t + 16) * sizeof *m->train);
        m->train[m->n_train++] = (ct_train_point){
            .step = s, .loss = num(o, "loss", NAN), .lr = num(o, "lr", 0), .tokens = num(o, "tokens", 0),
            .tokens_per_second = num(o, "tokens_per_second", 0), .elapsed = num(o, "elapsed", 0),
            .memory_gib = num(o, "memory_gib", 0)};
    } else if (json_get(o, "eval_loss")) {
        while (m->n_eval > 0 && m->eval[m->n_eval - 1].step >= s) m->n_eval--;
        if (m->n_eval == *cap_e) m->eval = ct_realloc(m->eval, (*cap_e = 2 * *cap_e + 16) * sizeof *m->eval);
        m->eval[m->n_eval++] = (ct_eval_point){.step = s, .loss = num(o, "eval_loss", NAN)};
    }
}

int metrics_read(const char *path, ct_metrics *m, ct_error *err)
{
    memset(m, 0, sizeof *m);
    size_t len;
    char *text = ct_read_file(path, &len, err);
    if (!text) return err->code;
    size_t cap_t = 0, cap_e = 0;
    for (char *line = text; line < text + len;) {
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        size_t n = end ? (size_t)(end - line) : (size_t)(text + len - line);
        ct_error ignored = {0};
        json_doc *doc = n > 0 ? json_parse(line, n, path, &ignored) : NULL;
        if (doc) {
            const json_value *o = json_root(doc);
            if (o->type == JSON_OBJECT) add_line(m, o, &cap_t, &cap_e);
            json_free(doc);
        }
        line += n + 1;
    }
    free(text);
    return CT_OK;
}

int metrics_truncate(const char *path, long long max_step, ct_error *err)
{
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return CT_OK;
    size_t len;
    char *text = ct_read_file(path, &len, err);
    if (!text) return err->code;
    char *out = ct_malloc(len + 1);
    size_t n_out = 0;
    for (char *line = text; line < text + len;) {
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        size_t n = end ? (size_t)(end - line) : (size_t)(text + len - line);
        ct_error ignored = {0};
        json_doc *doc = n > 0 ? json_parse(line, n, path, &ignored) : NULL;
        const json_value *step = doc ? json_get_type(json_root(doc), "step", JSON_NUMBER) : NULL;
        /* a line without its newline was cut short, even when what is there parses */
        if (end && step && step->number <= (double)max_step) {
            memcpy(out + n_out, line, n + 1);
            n_out += n + 1;
        }
        json_free(doc);
        line += n + 1;
    }
    int rc = n_out == len ? CT_OK : ct_write_file_atomic(path, out, n_out, err);
    free(out);
    free(text);
    return rc;
}

void metrics_free(ct_metrics *m)
{
    free(m->train);
    free(m->eval);
    memset(m, 0, sizeof *m);
}
