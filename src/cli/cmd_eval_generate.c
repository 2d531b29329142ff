/* cmd_eval_generate.c — `ctune eval --generate FILE` (eval_generate.h): every
 * record is read, rendered and tokenized before the first generation, so a
 * bad record costs no model time; then each prompt is decoded greedily (the
 * decoder and stop tokens of `ctune generate`), the new tokens turned into
 * text as generate prints them (tokenizer.json's decode without special
 * tokens; the tiny models' bytes) and scored. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapter.h"
#include "cli_generate.h"
#include "commands.h"
#include "eval_generate.h"
#include "generate.h"
#include "json.h"
#include "prepare_pool.h"
#include "text_match.h"

/* One record, ready to generate from. */
typedef struct eval_record {
    size_t line;
    int32_t *ids;        /* (n_ids) the prompt's tokens */
    int n_ids;
    char *prompt;        /* its text, for --out */
    char *reference;     /* (reference_len) */
    size_t reference_len;
} eval_record;

/* The options, converted. */
typedef struct eval_opts {
    text_match_metric metric;
    long long max_new_tokens, limit;   /* limit 0: every record */
    prepare_format format;
} eval_opts;

/* What the records are tokenized with: a tokenizer.json (enc), or the byte
 * tokenizer of the tiny models (bytes). */
typedef struct eval_text {
    const eval_generate_args *a;
    bool bytes;
    ct_text_encoder enc;
    ct_chat_template *tmpl;      /* NULL: the model has none (tmpl_err says why), or bytes */
    ct_error tmpl_err;
    ct_chat_message *msgs;       /* the prompt with --system before it */
    size_t msgs_cap;
} eval_text;

bool eval_generate_options_given(const eval_generate_args *a)
{
    const prepare_fields *f = &a->fields;
    return a->metric || a->max_new_tokens || a->limit || a->out || a->chat_template || a->system || a->format ||
           f->messages || f->role || f->content || f->text || f->prompt || f->completion;
}

static int parse_opts(const eval_generate_args *a, eval_opts *o, ct_error *err)
{
    *o = (eval_opts){.max_new_tokens = 128};
    int rc = a->metric ? text_match_metric_parse(a->metric, &o->metric, err) : CT_OK;
    if (!rc && a->max_new_tokens) rc = cli_parse_ll("--max-new-tokens", a->max_new_tokens, 1, 1 << 20,
                                                    &o->max_new_tokens, err);
    if (!rc && a->limit) rc = cli_parse_ll("--limit", a->limit, 1, INT32_MAX, &o->limit, err);
    if (!rc && a->format) rc = prepare_format_parse(a->format, &o->format, err);
    if (rc) return rc;
    if (o->format == PREPARE_FORMAT_TEXT || o->format == PREPARE_FORMAT_TOKENS)
        return CT_FAIL_INPUT(err, "--format %s: its records have no reference; eval --generate reads messages, "
                             "sharegpt, alpaca or prompt_completion", a->format);
    if (a->device && strcmp(a->device, "cpu") && strcmp(a->device, "cuda") && strcmp(a->device, "auto"))
        return CT_FAIL_INPUT(err, "--device '%s': expected cpu, cuda or auto", a->device);
    if ((rc = cli_check_file(a->file, err))) return rc;
    if (a->out && !strcmp(a->out, a->file))
        return CT_FAIL_INPUT(err, "--out %s: is the --generate file itself", a->out);
    if (a->out && (rc = cli_check_file(a->out, err))) return rc;
    if (a->adapter && (rc = cli_check_adapter_dir(a->adapter, err))) return rc;
    return cli_check_model_dir(a->model, err);
}

/* The format of the first record (--format auto), on *line. */
static int detect(const eval_generate_args *a, prepare_format *format, size_t *line, ct_error *err)
{
    prepare_input *in = prepare_input_open(a->file, err);
    if (!in) return err->code;
    const char *rec;
    size_t len;
    int rc = prepare_input_next(in, &rec, &len, line, err);
    if (!rc && !rec) rc = CT_FAIL_INPUT(err, "%s: no records (the file is empty or blank)", a->file);
    if (!rc) {
        char src[CT_PATH_MAX + 32];
        snprintf(src, sizeof src, "%s:%zu", a->file, *line);
        rc = prepare_detect_format(rec, len, src, &a->fields, format, err);
        if (!rc && (*format == PREPARE_FORMAT_TEXT || *format == PREPARE_FORMAT_TOKENS))
            rc = CT_FAIL_INPUT(err, "%s: a %s record has no reference; eval --generate reads messages, sharegpt, "
                               "alpaca or prompt_completion records (or give --format)", src,
                               prepare_format_names[*format]);
    }
    prepare_input_close(in);
    return rc;
}

/* The prompt of item as tokens and text, into r. */
static int tokenize(eval_text *t, const prepare_eval_item *item, const char *src, eval_record *r, ct_error *err)
{
    const ct_chat_message *msgs = item->msgs;
    int n = item->n_msgs;
    if (n && t->a->system && strcmp(msgs[0].role, "system")) {
        if ((size_t)n + 1 > t->msgs_cap) t->msgs = ct_realloc(t->msgs, (t->msgs_cap = (size_t)n + 1) * sizeof *t->msgs);
        t->msgs[0] = (ct_chat_message){"system", t->a->system};
        memcpy(t->msgs + 1, msgs, (size_t)n * sizeof *msgs);
        msgs = t->msgs;
        n++;
    }
    if (t->bytes) {
        if (n) {
            r->ids = byte_chat_render(msgs, n, &r->n_ids);
        } else {
            r->ids = ct_malloc(item->prompt_len * sizeof *r->ids);
            for (size_t i = 0; i < item->prompt_len; i++) r->ids[i] = (unsigned char)item->prompt[i];
            r->n_ids = (int)item->prompt_len;
        }
        size_t len;
        byte_tokens_text(r->ids, r->n_ids, &r->prompt, &len);
        return CT_OK;
    }
    ct_ids ids = {0};
    int rc = CT_OK;
    size_t len;
    if (n) {
        if (!t->tmpl)
            return CT_FAIL_INPUT(err, "%s: a conversation needs a chat template: %s", src, t->tmpl_err.msg);
        rc = chat_template_render(t->tmpl, msgs, n, true, &r->prompt, &len, err);
        if (rc) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            return ct_fail(err, rc, "%s: chat template %s: %s", src, chat_template_name(t->tmpl), why);
        }
        rc = tokenizer_encode(t->enc.tok, r->prompt, len, true, &ids, err);
    } else {
        r->prompt = ct_strdup(item->prompt);
        rc = text_encoder_encode(&t->enc, item->prompt, item->prompt_len, &ids, err);
    }
    if (!rc && ids.len == 0) rc = CT_FAIL_INPUT(err, "%s: the prompt encodes to no tokens", src);
    if (!rc && ids.len > INT32_MAX / 2) rc = CT_FAIL_INPUT(err, "%s: the prompt is too long (%zu tokens)", src, ids.len);
    if (!rc) {
        r->ids = ct_malloc(ids.len * sizeof *r->ids);
        for (size_t i = 0; i < ids.len; i++) r->ids[i] = (int32_t)ids.data[i];
        r->n_ids = (int)ids.len;
    }
    ct_ids_free(&ids);
    return rc;
}

static void records_free(eval_record *recs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(recs[i].ids);
        free(recs[i].prompt);
        free(recs[i].reference);
    }
    free(recs);
}

/* Every record of the file (up to --limit), checked against the model. */
static int read_records(eval_text *t, const eval_opts *o, prepare_format format, size_t detected_line,
                        const ct_model_config *mc, eval_record **out, size_t *n_out, ct_error *err)
{
    const eval_generate_args *a = t->a;
    prepare_text_cfg c = {.format = format, .detected_line = detected_line, .fields = a->fields};
    prepare_input *in = prepare_input_open(a->file, err);
    if (!in) return err->code;
    prepare_worker *w = prepare_worker_new();
    eval_record *recs = NULL;
    size_t n = 0, cap = 0;
    int rc;
    const char *rec;
    size_t len, line = 0;
    while ((!o->limit || n < (size_t)o->limit) && !(rc = prepare_input_next(in, &rec, &len, &line, err)) && rec) {
        char src[CT_PATH_MAX + 32];
        snprintf(src, sizeof src, "%s:%zu", a->file, line);
        prepare_eval_item item;
        if ((rc = prepare_eval_record(&c, w, rec, len, src, &item, err))) break;
        if (n == cap) recs = ct_realloc(recs, (cap = cap ? 2 * cap : 64) * sizeof *recs);
        eval_record *r = &recs[n++];
        *r = (eval_record){.line = line, .reference = ct_strdup(item.reference), .reference_len = item.reference_len};
        if ((rc = tokenize(t, &item, src, r, err))) break;
        for (int i = 0; i < r->n_ids; i++)
            if (r->ids[i] >= mc->vocab_size) {
                rc = CT_FAIL_INPUT(err, "%s: prompt token %d has id %d >= the model's vocab_size %d", src, i,
                                   r->ids[i], mc->vocab_size);
                break;
            }
        if (!rc && (long long)r->n_ids + o->max_new_tokens > mc->max_position_embeddings)
            rc = CT_FAIL_INPUT(err, "%s: the prompt is %d tokens; with --max-new-tokens %lld that is over the model's "
                               "max_position_embeddings %d", src, r->n_ids, o->max_new_tokens,
                               mc->max_position_embeddings);
        if (rc) break;
    }
    if (rc == CT_ERR_INPUT && strncmp(err->msg, a->file, strlen(a->file))) {   /* the tokenizer's errors */
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        rc = ct_fail(err, rc, "%s:%zu: %s", a->file, line, why);
    }
    if (!rc && n == 0) rc = CT_FAIL_INPUT(err, "%s: no records (the file is empty or blank)", a->file);
    prepare_worker_free(w);
    prepare_input_close(in);
    if (rc) {
        records_free(recs, n);
        return rc;
    }
    *out = recs;
    *n_out = n;
    return CT_OK;
}

/* The text of the new tokens out[0..n) (a last stop token left out), as generate prints it. */
static int decode(const eval_text *t, const int32_t *out, int n, const int32_t *stop, int n_stop, char **text,
                  size_t *len, ct_error *err)
{
    for (int i = 0; n > 0 && i < n_stop; i++)
        if (out[n - 1] == stop[i]) {
            n--;
            break;
        }
    if (t->bytes) {
        byte_tokens_text(out, n, text, len);
        return CT_OK;
    }
    uint32_t *ids = ct_malloc(((size_t)n + 1) * sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = (uint32_t)out[i];
    int rc = tokenizer_decode(t->enc.tok, ids, (size_t)n, true, text, len, err);
    free(ids);
    return rc;
}

static void write_result(FILE *f, size_t index, const eval_record *r, const char *gen, size_t gen_len, bool match)
{
    json_writer w;
    json_writer_init(&w);
    json_write_rawf(&w, "{\"index\": %zu, \"line\": %zu, \"prompt\": ", index, r->line);
    json_write_string(&w, r->prompt);
    json_write_raw(&w, ", \"reference\": ");
    json_write_string_n(&w, r->reference, r->reference_len);
    json_write_raw(&w, ", \"generation\": ");
    json_write_string_n(&w, gen, gen_len);
    json_write_rawf(&w, ", \"match\": %s}\n", match ? "true" : "false");
    fwrite(w.buf, 1, w.len, f);
    json_writer_free(&w);
}

/* Generates and scores every record; the summary to stdout. */
static int run(const eval_text *t, const eval_opts *o, ct_generator *g, const eval_record *recs, size_t n,
               FILE *out, const char *backend, ct_error *err)
{
    int32_t stop[CLI_MAX_STOP_IDS];
    int n_stop = cli_stop_ids(t->a->model, t->bytes, t->bytes ? NULL : &t->enc, stop);
    ct_sample_options so = {.max_new_tokens = (int)o->max_new_tokens, .top_p = 1, .stop_ids = stop, .n_stop = n_stop};
    int32_t *new_ids = ct_malloc((size_t)o->max_new_tokens * sizeof *new_ids);
    bool tty = isatty(STDERR_FILENO);
    size_t matches = 0, new_tokens = 0;
    double t0 = ct_now();
    int rc = CT_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        int n_new = 0;
        char *gen = NULL;
        size_t gen_len = 0;
        rc = generate(g, recs[i].ids, recs[i].n_ids, &so, new_ids, &n_new, NULL, NULL, err);
        if (!rc) rc = decode(t, new_ids, n_new, stop, n_stop, &gen, &gen_len, err);
        if (!rc) {
            bool match = text_match(o->metric, gen, gen_len, recs[i].reference, recs[i].reference_len);
            matches += match;
            new_tokens += (size_t)n_new;
            if (out) write_result(out, i, &recs[i], gen, gen_len, match);
            if (tty) fprintf(stderr, "\reval: %zu/%zu records, %zu match", i + 1, n, matches);
        }
        free(gen);
    }
    free(new_ids);
    if (tty) fprintf(stderr, "\n");
    if (rc) return rc;
    double dt = ct_now() - t0;
    const char *records = n == 1 ? "record" : "records";
    fprintf(stderr, "eval: %zu %s, %zu new tokens in %.2f s (%.1f tokens/s, %s backend%s)\n", n, records, new_tokens,
            dt, dt > 0 ? (double)new_tokens / dt : 0.0, backend, t->a->adapter ? ", with adapter" : "");
    printf("%s match: %zu/%zu = %.1f%% (%s, %zu %s, %zu new tokens)\n", text_match_metric_names[o->metric], matches,
           n, 100.0 * (double)matches / (double)n, t->a->file, n, records, new_tokens);
    return CT_OK;
}

/* The tokenizer and template of the model (m loaded), into t. */
static int load_text(eval_text *t, const ct_model *m, prepare_format format, ct_error *err)
{
    const eval_generate_args *a = t->a;
    if (!cli_has_tokenizer(a->model)) {
        t->bytes = m->cfg.vocab_size == CT_BYTE_VOCAB;
        if (t->bytes && !a->chat_template) return CT_OK;
        return CT_FAIL_INPUT(err, "eval --generate%s needs %s/tokenizer.json (or the byte-level tokenizer of the tiny "
                             "models, vocab_size %d; this model has %d)", a->chat_template ? " with --chat-template" : "",
                             a->model, CT_BYTE_VOCAB, m->cfg.vocab_size);
    }
    int rc = text_encoder_load(&t->enc, a->model, err);
    if (rc) return rc;
    t->tmpl = chat_template_load(a->model, a->chat_template, &t->tmpl_err);
    if (!t->tmpl && (prepare_format_is_chat(format) || a->chat_template)) {
        *err = t->tmpl_err;
        return err->code;
    }
    return CT_OK;
}

int eval_generate(const eval_generate_args *a, ct_error *err)
{
    eval_opts o;
    int rc = parse_opts(a, &o, err);
    if (rc) return rc;
    prepare_format format = o.format;
    size_t detected_line = 0;
    if (format == PREPARE_FORMAT_AUTO && (rc = detect(a, &format, &detected_line, err))) return rc;
    ct_backend *be = cli_open_backend(a->device ? a->device : "auto", err);
    if (!be) return err->code;
    ct_model m;
    if ((rc = model_load(&m, be, a->model, err))) {
        be->destroy(be);
        return rc;
    }
    eval_text t = {.a = a};
    ct_lora lo = {0};
    ct_generator *g = NULL;
    eval_record *recs = NULL;
    size_t n = 0;
    FILE *out = NULL;
    rc = load_text(&t, &m, format, err);
    if (!rc) rc = read_records(&t, &o, format, detected_line, &m.cfg, &recs, &n, err);
    if (!rc && a->adapter) rc = adapter_load(&lo, &m, a->adapter, err);
    int longest = 0;
    for (size_t i = 0; i < n; i++) longest = recs[i].n_ids > longest ? recs[i].n_ids : longest;
    if (!rc && !(g = generator_new(&m, a->adapter ? &lo : NULL, longest + (int)o.max_new_tokens,
                                   longest < 256 ? longest : 256, err)))
        rc = err->code;
    if (!rc && a->out && !(out = fopen(a->out, "wb"))) rc = CT_FAIL_INPUT(err, "--out %s: cannot write (%s)", a->out,
                                                                         strerror(errno));
    if (!rc) rc = run(&t, &o, g, recs, n, out, be->name, err);
    if (out && fclose(out) && !rc) rc = CT_FAIL_RUNTIME(err, "--out %s: write error", a->out);
    records_free(recs, n);
    free(t.msgs);
    chat_template_free(t.tmpl);
    if (!t.bytes) text_encoder_free(&t.enc);
    generator_free(g);
    if (lo.params) lora_free(&lo, be);
    model_free(&m);
    be->destroy(be);
    return rc;
}
