/* cmd_prepare.c — `ctune prepare`: JSONL of token ids -> DIR/train.shard (and
 * DIR/eval.shard), no Python needed.
 *
 * Each non-blank line is one document: {"input_ids": [...]} with optionally
 * "labels" (HF style: -100 = no loss, else equal to input_ids) or "loss_mask"
 * (0/1). Other keys are ignored, so rows straight from a tokenized HF dataset
 * work. The file is read twice: once to count documents, so the eval split can
 * be an exact, seeded choice before any document is stored; once to parse. Every
 * line is validated before anything is written, so a bad line leaves DIR as it
 * was. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "json.h"
#include "shard.h"

#define PREPARE_USAGE "usage: ctune prepare --in FILE.jsonl --out DIR [--vocab-size V] " \
                      "[--eval-fraction F] [--seed S]"

typedef struct prepare_opts {
    const char *in, *out;
    uint32_t vocab_size;    /* 0: no check */
    double eval_fraction;   /* [0, 1) */
    uint64_t seed;
} prepare_opts;

typedef struct split_stats {
    size_t docs, tokens, labels;
} split_stats;

static int parse_u64(const char *flag, const char *s, uint64_t max, uint64_t *out, ct_error *err)
{
    char *end;
    errno = 0;
    unsigned long long v = (*s >= '0' && *s <= '9') ? strtoull(s, &end, 10) : 0;
    if (!(*s >= '0' && *s <= '9') || *end || errno == ERANGE || v > max)
        return CT_FAIL_INPUT(err, "%s must be an integer in [0, %llu], got '%s'",
                             flag, (unsigned long long)max, s);
    *out = v;
    return CT_OK;
}

static int parse_args(int argc, char **argv, prepare_opts *o, ct_error *err)
{
    *o = (prepare_opts){ .seed = 42 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--in") || !strcmp(a, "--out") || !strcmp(a, "--vocab-size") ||
            !strcmp(a, "--eval-fraction") || !strcmp(a, "--seed")) {
            if (i + 1 >= argc) return CT_FAIL_INPUT(err, "%s needs a value; " PREPARE_USAGE, a);
            const char *v = argv[++i];
            uint64_t u;
            if (!strcmp(a, "--in")) o->in = v;
            else if (!strcmp(a, "--out")) o->out = v;
            else if (!strcmp(a, "--seed")) {
                int rc = parse_u64(a, v, UINT64_MAX, &o->seed, err);
                if (rc) return rc;
            } else if (!strcmp(a, "--vocab-size")) {
                int rc = parse_u64(a, v, UINT32_MAX, &u, err);
                if (rc) return rc;
                if (u == 0) return CT_FAIL_INPUT(err, "--vocab-size must be at least 1, got '%s'", v);
                o->vocab_size = (uint32_t)u;
            } else {
                char *end;
                o->eval_fraction = strtod(v, &end);
                if (end == v || *end || !(o->eval_fraction >= 0.0 && o->eval_fraction < 1.0))
                    return CT_FAIL_INPUT(err, "--eval-fraction must be a number in [0, 1), got '%s'", v);
            }
        } else if (a[0] == '-') {
            return CT_FAIL_INPUT(err, "unknown flag '%s'; " PREPARE_USAGE, a);
        } else {
            return CT_FAIL_INPUT(err, "unexpected argument '%s'; " PREPARE_USAGE, a);
        }
    }
    if (!o->in) return CT_FAIL_INPUT(err, PREPARE_USAGE " (--in is missing)");
    if (!o->out) return CT_FAIL_INPUT(err, PREPARE_USAGE " (--out is missing)");
    return CT_OK;
}

static bool is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
}

/* What a JSON value is, for "expected X, found Y" messages. */
static const char *describe(const json_value *v, char *buf, size_t n)
{
    switch (v->type) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "a boolean";
    case JSON_NUMBER: snprintf(buf, n, "%.17g", v->number); return buf;
    case JSON_STRING: return "a string";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "an unknown value";
}

/* A member that is present and not null, which must then be an array of the
 * same length as input_ids (n; 0 for input_ids itself). NULL when absent. */
static int get_array(const json_value *root, const char *key, size_t n, const char *src,
                     const json_value **out, ct_error *err)
{
    const json_value *v = json_get(root, key);
    *out = NULL;
    if (!v || v->type == JSON_NULL) return CT_OK;
    char b[32];
    if (v->type != JSON_ARRAY)
        return CT_FAIL_INPUT(err, "%s: %s must be an array, found %s", src, key, describe(v, b, sizeof b));
    if (n && v->count != n)
        return CT_FAIL_INPUT(err, "%s: %s has %zu entries but input_ids has %zu", src, key, v->count, n);
    *out = v;
    return CT_OK;
}

/* Parses one line into tokens/mask (grown as needed); *len receives its length. */
static int parse_doc(const char *line, size_t line_len, const char *src, uint32_t vocab_size,
                     uint32_t **tokens, uint8_t **mask, size_t *cap, size_t *len, ct_error *err)
{
    json_doc *doc = json_parse(line, line_len, src, err);
    if (!doc) return CT_ERR_INPUT;
    int rc = CT_OK;
    char b[32];
    const json_value *root = json_root(doc), *ids, *labels = NULL, *lmask = NULL;
    if (root->type != JSON_OBJECT) {
        rc = CT_FAIL_INPUT(err, "%s: expected a JSON object, found %s", src, describe(root, b, sizeof b));
        goto done;
    }
    if ((rc = get_array(root, "input_ids", 0, src, &ids, err))) goto done;
    if (!ids) {
        rc = CT_FAIL_INPUT(err, "%s: input_ids is missing", src);
        goto done;
    }
    size_t n = ids->count;
    if (n == 0) {
        rc = CT_FAIL_INPUT(err, "%s: input_ids is empty", src);
        goto done;
    }
    if ((rc = get_array(root, "labels", n, src, &labels, err))) goto done;
    if ((rc = get_array(root, "loss_mask", n, src, &lmask, err))) goto done;
    if (labels && lmask) {
        rc = CT_FAIL_INPUT(err, "%s: has both labels and loss_mask; give one of them", src);
        goto done;
    }
    if (n > *cap) {
        *cap = n;
        *tokens = ct_realloc(*tokens, n * sizeof **tokens);
        *mask = ct_realloc(*mask, n);
    }
    for (size_t i = 0; i < n; i++) {
        const json_value *t = ids->items[i];
        if (t->type != JSON_NUMBER || !t->is_integer || t->integer < 0 || t->integer > UINT32_MAX) {
            rc = CT_FAIL_INPUT(err, "%s: input_ids[%zu] must be an integer token id in [0, 4294967295], "
                               "found %s", src, i, describe(t, b, sizeof b));
            goto done;
        }
        uint32_t id = (uint32_t)t->integer;
        if (vocab_size && id >= vocab_size) {
            rc = CT_FAIL_INPUT(err, "%s: input_ids[%zu] = %u >= vocab size %u", src, i, id, vocab_size);
            goto done;
        }
        (*tokens)[i] = id;
        (*mask)[i] = 1;
        if (labels) {
            const json_value *l = labels->items[i];
            if (l->type != JSON_NUMBER || !l->is_integer || (l->integer != -100 && l->integer != id)) {
                rc = CT_FAIL_INPUT(err, "%s: labels[%zu] must be -100 or input_ids[%zu] = %u (labels are "
                                   "unshifted), found %s", src, i, i, id, describe(l, b, sizeof b));
                goto done;
            }
            (*mask)[i] = l->integer != -100;
        } else if (lmask) {
            const json_value *m = lmask->items[i];
            if (m->type == JSON_BOOL) {
                (*mask)[i] = m->boolean;
            } else if (m->type == JSON_NUMBER && m->is_integer && (m->integer == 0 || m->integer == 1)) {
                (*mask)[i] = (uint8_t)m->integer;
            } else {
                rc = CT_FAIL_INPUT(err, "%s: loss_mask[%zu] must be 0 or 1, found %s",
                                   src, i, describe(m, b, sizeof b));
                goto done;
            }
        }
    }
    *len = n;
done:
    json_free(doc);
    return rc;
}

/* Reads the next line into *line (getline's buffer); strips the newline.
 * Returns false at the end of the file. */
static bool next_line(FILE *f, char **line, size_t *cap, size_t *len)
{
    ssize_t n = getline(line, cap, f);
    if (n < 0) return false;
    while (n > 0 && ((*line)[n - 1] == '\n' || (*line)[n - 1] == '\r')) n--;
    *len = (size_t)n;
    return true;
}

/* Marks which of n documents go to eval: an exact count, chosen by a seeded
 * partial Fisher-Yates shuffle, so the split is the same on every machine. */
static uint8_t *choose_eval(size_t n, size_t n_eval, uint64_t seed)
{
    uint8_t *is_eval = ct_calloc(n ? n : 1, 1);
    size_t *idx = ct_malloc((n ? n : 1) * sizeof *idx);
    for (size_t i = 0; i < n; i++) idx[i] = i;
    ct_rng rng;
    ct_rng_seed(&rng, seed);
    for (size_t i = 0; i < n_eval; i++) {
        size_t j = i + (size_t)ct_rng_below(&rng, n - i);
        size_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
        is_eval[idx[i]] = 1;
    }
    free(idx);
    return is_eval;
}

static void format_split(char *buf, size_t n, const char *path, const split_stats *s)
{
    snprintf(buf, n, "%s (%zu docs, %zu tokens, %.1f%% labels)", path, s->docs, s->tokens,
             s->tokens ? 100.0 * (double)s->labels / (double)s->tokens : 0.0);
}

/* Second pass: parses every document of f into its split's writer. */
static int read_docs(FILE *f, const prepare_opts *o, const uint8_t *is_eval, size_t n_docs,
                     shard_writer *w[2], split_stats st[2], size_t *no_labels, ct_error *err)
{
    if (fseek(f, 0, SEEK_SET) != 0)
        return CT_FAIL_INPUT(err, "%s: cannot be read twice (%s); give a regular file", o->in, strerror(errno));
    int rc = CT_OK;
    char *line = NULL;
    size_t line_cap = 0, len, d = 0;
    uint32_t *tokens = NULL;
    uint8_t *mask = NULL;
    size_t tok_cap = 0;
    size_t src_len = strlen(o->in) + 32;
    char *src = ct_malloc(src_len);
    for (size_t lineno = 1; rc == CT_OK && next_line(f, &line, &line_cap, &len); lineno++) {
        if (is_blank(line, len)) continue;
        if (d >= n_docs) break;
        snprintf(src, src_len, "%s:%zu", o->in, lineno);
        size_t n = 0;
        rc = parse_doc(line, len, src, o->vocab_size, &tokens, &mask, &tok_cap, &n, err);
        if (rc) break;
        size_t labels = 0;
        for (size_t j = 0; j < n; j++) labels += mask[j];
        *no_labels += labels == 0;
        split_stats *s = &st[is_eval[d]];
        s->docs++;
        s->tokens += n;
        s->labels += labels;
        shard_writer_add(w[is_eval[d]], tokens, mask, n);
        d++;
    }
    if (rc == CT_OK && ferror(f)) rc = CT_FAIL_RUNTIME(err, "%s: read error", o->in);
    if (rc == CT_OK && (d != n_docs || !feof(f)))
        rc = CT_FAIL_RUNTIME(err, "%s: the file changed while it was read", o->in);
    free(line);
    free(tokens);
    free(mask);
    free(src);
    return rc;
}

/* Writes DIR/train.shard and, when it has documents, DIR/eval.shard; prints the summary. */
static int write_outputs(const prepare_opts *o, shard_writer *w[2], const split_stats st[2],
                         size_t no_labels, ct_error *err)
{
    size_t out_len = strlen(o->out) + 16;
    char *train_path = ct_malloc(out_len), *eval_path = ct_malloc(out_len);
    snprintf(train_path, out_len, "%s/train.shard", o->out);
    snprintf(eval_path, out_len, "%s/eval.shard", o->out);
    int rc = ct_mkdirs(o->out, err);
    if (rc == CT_OK) rc = shard_writer_save(w[0], train_path, err);
    if (rc == CT_OK && st[1].docs) rc = shard_writer_save(w[1], eval_path, err);
    /* A stale eval.shard from an earlier run would be read as this split's eval set. */
    bool removed_stale = rc == CT_OK && !st[1].docs && unlink(eval_path) == 0;
    if (rc == CT_OK) {
        char a[1024], b[1024] = "";
        format_split(a, sizeof a, train_path, &st[0]);
        if (st[1].docs) format_split(b, sizeof b, eval_path, &st[1]);
        printf("prepare: wrote %s%s%s", a, st[1].docs ? " and " : "", b);
        if (no_labels) printf("; %zu docs have no label tokens", no_labels);
        if (removed_stale) printf("; removed the stale %s", eval_path);
        printf("\n");
    }
    free(train_path);
    free(eval_path);
    return rc;
}

int cmd_prepare(int argc, char **argv, ct_error *err)
{
    prepare_opts o;
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("%s\n", PREPARE_USAGE);
        return CT_OK;
    }
    int rc = parse_args(argc, argv, &o, err);
    if (rc) return rc;

    FILE *f = fopen(o.in, "rb");
    if (!f) return CT_FAIL_INPUT(err, "%s: cannot open (%s)", o.in, strerror(errno));
    char *line = NULL;
    size_t line_cap = 0, len, n_docs = 0, n_eval = 0;
    while (next_line(f, &line, &line_cap, &len))
        if (!is_blank(line, len)) n_docs++;
    free(line);
    if (ferror(f)) rc = CT_FAIL_RUNTIME(err, "%s: read error", o.in);
    else if (n_docs == 0) rc = CT_FAIL_INPUT(err, "%s: no documents (the file is empty or blank)", o.in);
    else if (o.eval_fraction > 0) {
        size_t want = (size_t)llround(o.eval_fraction * (double)n_docs);
        n_eval = want < 1 ? 1 : want;
        if (n_eval >= n_docs)
            rc = CT_FAIL_INPUT(err, "--eval-fraction %g leaves no training documents (%s has %zu)",
                               o.eval_fraction, o.in, n_docs);
    }
    if (rc) {
        fclose(f);
        return rc;
    }

    uint8_t *is_eval = choose_eval(n_docs, n_eval, o.seed);
    shard_writer *w[2] = {shard_writer_new(), shard_writer_new()}; /* train, eval */
    split_stats st[2] = {{0}};
    size_t no_labels = 0;
    rc = read_docs(f, &o, is_eval, n_docs, w, st, &no_labels, err);
    fclose(f);
    free(is_eval);
    if (rc == CT_OK) rc = write_outputs(&o, w, st, no_labels, err);
    shard_writer_free(w[0]);
    shard_writer_free(w[1]);
    return rc;
}
