/* cmd_prepare.c — `ctune prepare`: JSONL (or a JSON array) of text or of token
 * ids -> DIR/train.shard (and DIR/eval.shard), no Python needed.
 *
 * Text (--tokenizer MODEL_DIR; the formats: prepare_text.h) is tokenized by
 * the worker pool of prepare_pool.c; token ids (--format tokens, or records
 * with input_ids: prepare_tokens.h) are parsed line by line straight into the
 * shard writer. --format auto takes the format from the first record's keys.
 * When there is an eval split the file is read twice: once to count the
 * records, so the split can be an exact, seeded choice before any document is
 * stored; once to parse. Every record is checked before anything is written,
 * so a bad one leaves DIR as it was. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "prepare_pool.h"
#include "prepare_tokens.h"

#define LINE_KEEP_BYTES ((size_t)16 << 20) /* a larger line buffer is freed before its document is stored */

typedef struct prepare_opts {
    const char *in, *out, *tokenizer, *chat_template;
    prepare_format format;
    prepare_fields fields;
    bool train_on_inputs, text_options;   /* text_options: a flag only text formats use was given */
    size_t max_length;      /* 0: none */
    int threads;
    uint32_t vocab_size;    /* 0: no check */
    double eval_fraction;   /* [0, 1) */
    uint64_t seed;
} prepare_opts;

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

/* --in must be a regular file and --out a folder or nothing yet: checked before
 * any reading, so a folder or a FIFO is an input error, not a read error or a hang. */
static int check_paths(const prepare_opts *o, ct_error *err)
{
    int rc = cli_check_file(o->in, err);
    if (rc) return rc;
    struct stat st;
    if (stat(o->out, &st) == 0 && !S_ISDIR(st.st_mode))
        return CT_FAIL_INPUT(err, "--out %s: exists and is not a folder (give a folder for train.shard and eval.shard)",
                             o->out);
    if (o->tokenizer && stat(o->tokenizer, &st) == 0 && !S_ISDIR(st.st_mode))
        return CT_FAIL_INPUT(err, "--tokenizer %s: not a folder (give the model folder that holds tokenizer.json)",
                             o->tokenizer);
    if (o->tokenizer) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", o->tokenizer);
        if ((rc = cli_check_file(path, err))) return rc;
    }
    return CT_OK;
}

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

static int parse_args(int argc, char **argv, prepare_opts *o, ct_error *err)
{
    *o = (prepare_opts){.seed = 42, .threads = online_cpus()};
    const char *vocab = NULL, *fraction = NULL, *seed = NULL, *format = NULL, *max_length = NULL, *threads = NULL;
    prepare_fields *f = &o->fields;
    const cli_opt opts[] = {
        {"--in", "FILE", "the records: JSONL, or one JSON array (see --format)", .str = &o->in, .required = true},
        {"--out", "DIR", "the folder for train.shard and eval.shard", .str = &o->out, .required = true},
        {"--tokenizer", "MODEL_DIR", "tokenize text with this model folder's tokenizer.json and chat template",
         .str = &o->tokenizer},
        {"--format", "F", "auto (default: from the first record's keys), messages, sharegpt, alpaca, "
                          "prompt_completion, text or tokens", .str = &format},
        {"--chat-template", "NAME|FILE", "render chats with a built-in template or a Jinja file instead of the "
                                         "model's", .str = &o->chat_template},
        {"--field-messages", "KEY", "the list of turns (default messages; sharegpt: conversations)",
         .str = &f->messages},
        {"--field-role", "KEY", "a turn's role (default role; sharegpt: from)", .str = &f->role},
        {"--field-content", "KEY", "a turn's text (default content; sharegpt: value)", .str = &f->content},
        {"--field-text", "KEY", "the text of a text record (default text)", .str = &f->text},
        {"--field-prompt", "KEY", "the prompt of a prompt_completion record (default prompt)", .str = &f->prompt},
        {"--field-completion", "KEY", "its completion (default completion)", .str = &f->completion},
        {"--train-on-inputs", NULL, "loss on every token (default: assistant turns, completions)",
         .flag = &o->train_on_inputs},
        {"--max-length", "N", "cut longer documents to N tokens (a document left without a label is dropped)",
         .str = &max_length},
        {"--threads", "N", "tokenize on N threads (default: the online CPUs)", .str = &threads},
        {"--vocab-size", "V", "refuse token ids >= V (default with --tokenizer: config.json's vocab_size)",
         .str = &vocab},
        {"--eval-fraction", "F", "this fraction of the documents goes to eval.shard, in [0, 1) (default 0)",
         .str = &fraction},
        {"--seed", "S", "seed of the train/eval split (default 42)", .str = &seed},
        {0}};
    const cli_cmd cmd = {"prepare", "prepare --in FILE --out DIR [--tokenizer MODEL_DIR] [--format F] [options]\n"
                                    "  text (messages, sharegpt, alpaca, prompt_completion, text) needs --tokenizer; "
                                    "token ids (input_ids) do not", opts};
    int rc = cli_parse(&cmd, argc, argv, NULL, err);
    if (rc) return rc;
    uint64_t u;
    if (seed && (rc = parse_u64("--seed", seed, UINT64_MAX, &o->seed, err))) return rc;
    if (vocab) {
        if ((rc = parse_u64("--vocab-size", vocab, UINT32_MAX, &u, err))) return rc;
        if (u == 0) return CT_FAIL_INPUT(err, "--vocab-size must be at least 1, got '%s'", vocab);
        o->vocab_size = (uint32_t)u;
    }
    if (fraction) {
        char *end;
        o->eval_fraction = strtod(fraction, &end);
        if (end == fraction || *end || !(o->eval_fraction >= 0.0 && o->eval_fraction < 1.0))
            return CT_FAIL_INPUT(err, "--eval-fraction must be a number in [0, 1), got '%s'", fraction);
    }
    if (format && (rc = prepare_format_parse(format, &o->format, err))) return rc;
    if (max_length) {
        if ((rc = parse_u64("--max-length", max_length, UINT32_MAX, &u, err))) return rc;
        if (u < 2) return CT_FAIL_INPUT(err, "--max-length must be at least 2, got '%s'", max_length);
        o->max_length = (size_t)u;
    }
    if (threads) {
        if ((rc = parse_u64("--threads", threads, 256, &u, err))) return rc;
        if (u == 0) return CT_FAIL_INPUT(err, "--threads must be at least 1, got '%s'", threads);
        o->threads = (int)u;
    }
    o->text_options = o->chat_template || f->messages || f->role || f->content || f->text || f->prompt ||
                      f->completion || o->train_on_inputs || max_length;
    return check_paths(o, err);
}

static bool is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
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

static void format_split(char *buf, size_t n, const char *path, const prepare_split *s)
{
    snprintf(buf, n, "%s (%zu docs, %zu tokens, %.1f%% labels)", path, s->docs, s->tokens,
             s->tokens ? 100.0 * (double)s->labels / (double)s->tokens : 0.0);
}

/* Second pass: parses every document of f into its split's writer. */
static int read_docs(FILE *f, const prepare_opts *o, const uint8_t *is_eval, size_t n_docs,
                     shard_writer *w[2], prepare_split st[2], size_t *no_labels, ct_error *err)
{
    if (fseek(f, 0, SEEK_SET) != 0)
        return CT_FAIL_INPUT(err, "%s: cannot be read twice (%s); give a regular file", o->in, strerror(errno));
    int rc = CT_OK;
    char *line = NULL;
    size_t line_cap = 0, len, d = 0;
    size_t src_len = strlen(o->in) + 32;
    char *src = ct_malloc(src_len);
    for (size_t lineno = 1; rc == CT_OK && next_line(f, &line, &line_cap, &len); lineno++) {
        if (is_blank(line, len)) continue;
        if (d >= n_docs) break;
        snprintf(src, src_len, "%s:%zu", o->in, lineno);
        shard_writer *split = w[is_eval[d]];
        const uint8_t *mask;
        size_t n = 0;
        rc = prepare_tokens_doc(line, len, src, o->vocab_size, split, &mask, &n, err);
        if (rc) break;
        if (line_cap > LINE_KEEP_BYTES) { /* not kept while the writer grows for the next line */
            free(line);
            line = NULL;
            line_cap = 0;
        }
        size_t labels = 0;
        for (size_t j = 0; j < n; j++) labels += mask[j];
        *no_labels += labels == 0;
        prepare_split *s = &st[is_eval[d]];
        s->docs++;
        s->tokens += n;
        s->labels += labels;
        shard_writer_commit(split, n);
        d++;
    }
    if (rc == CT_OK && ferror(f)) rc = CT_FAIL_RUNTIME(err, "%s: read error", o->in);
    if (rc == CT_OK && (d != n_docs || !feof(f)))
        rc = CT_FAIL_RUNTIME(err, "%s: the file changed while it was read", o->in);
    free(line);
    free(src);
    return rc;
}

/* Writes DIR/train.shard and, when it has documents, DIR/eval.shard; prints the summary. */
static int write_outputs(const prepare_opts *o, shard_writer *w[2], const prepare_split st[2],
                         size_t no_labels, ct_error *err)
{
    size_t out_len = strlen(o->out) + 16;
    char *train_path = ct_malloc(out_len), *eval_path = ct_malloc(out_len);
    snprintf(train_path, out_len, "%s/train.shard", o->out);
    snprintf(eval_path, out_len, "%s/eval.shard", o->out);
    int rc = st[0].docs ? CT_OK : CT_FAIL_INPUT(err, "%s: no documents are left for train.shard", o->in);
    if (rc == CT_OK) rc = ct_mkdirs(o->out, err);
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

/* The eval split of n records, or an error when it leaves no training documents. */
static int eval_count(const prepare_opts *o, size_t n, size_t *n_eval, ct_error *err)
{
    *n_eval = 0;
    if (n == 0) return CT_FAIL_INPUT(err, "%s: no documents (the file is empty or blank)", o->in);
    if (o->eval_fraction <= 0) return CT_OK;
    size_t want = (size_t)llround(o->eval_fraction * (double)n);
    *n_eval = want < 1 ? 1 : want;
    if (*n_eval >= n)
        return CT_FAIL_INPUT(err, "--eval-fraction %g leaves no training documents (%s has %zu)", o->eval_fraction,
                             o->in, n);
    return CT_OK;
}

static int prepare_tokens(const prepare_opts *o, ct_error *err)
{
    FILE *f = fopen(o->in, "rb");
    if (!f) return CT_FAIL_INPUT(err, "%s: cannot open (%s)", o->in, strerror(errno));
    char *line = NULL;
    size_t line_cap = 0, len, n_docs = 0, n_eval = 0;
    while (next_line(f, &line, &line_cap, &len))
        if (!is_blank(line, len)) n_docs++;
    free(line);
    int rc = ferror(f) ? CT_FAIL_RUNTIME(err, "%s: read error", o->in) : eval_count(o, n_docs, &n_eval, err);
    if (rc) {
        fclose(f);
        return rc;
    }
    uint8_t *is_eval = choose_eval(n_docs, n_eval, o->seed);
    shard_writer *w[2] = {shard_writer_new(), shard_writer_new()}; /* train, eval */
    prepare_split st[2] = {{0}};
    size_t no_labels = 0;
    rc = read_docs(f, o, is_eval, n_docs, w, st, &no_labels, err);
    fclose(f);
    free(is_eval);
    if (rc == CT_OK) rc = write_outputs(o, w, st, no_labels, err);
    shard_writer_free(w[0]);
    shard_writer_free(w[1]);
    return rc;
}

/* Records in the input (a first pass, for the eval split). */
static int count_records(const char *path, size_t *n, ct_error *err)
{
    prepare_input *in = prepare_input_open(path, err);
    if (!in) return err->code;
    const char *rec;
    size_t len, line;
    int rc;
    *n = 0;
    while ((rc = prepare_input_next(in, &rec, &len, &line, err)) == CT_OK && rec) (*n)++;
    prepare_input_close(in);
    return rc;
}

static void print_summary(const prepare_opts *o, const prepare_text_cfg *c, const prepare_stats *st)
{
    size_t tokens = st->split[0].tokens + st->split[1].tokens, labels = st->split[0].labels + st->split[1].labels;
    printf("prepare: %zu %s records, %zu tokens, %.1f%% labels", st->records, prepare_format_names[c->format], tokens,
           tokens ? 100.0 * (double)labels / (double)tokens : 0.0);
    if (o->max_length)
        printf(", %zu truncated to %zu tokens, %zu skipped (no label left)", st->truncated, o->max_length, st->dropped);
    if (st->mismatched)
        printf(", %zu whose prompt tokens are not a prefix of prompt + completion's (masked by count, as TRL)",
               st->mismatched);
    printf("; %.2f s, %.0f tokens/s, %d threads\n", st->seconds, st->seconds > 0 ? (double)tokens / st->seconds : 0.0,
           o->threads);
}

static int prepare_text(const prepare_opts *o, prepare_format format, size_t detected_line, ct_error *err)
{
    ct_text_encoder enc;
    int rc = text_encoder_load(&enc, o->tokenizer, err);
    if (rc) return rc;
    prepare_text_cfg c = {.format = format, .detected_line = detected_line, .fields = o->fields, .enc = &enc,
                          .train_on_inputs = o->train_on_inputs, .max_length = o->max_length,
                          .vocab_size = o->vocab_size ? o->vocab_size : enc.model_vocab_size};
    ct_chat_template *tmpl = NULL;
    ct_error tmpl_err = {0};
    if (prepare_format_is_chat(format) || format == PREPARE_FORMAT_PROMPT_COMPLETION) {
        tmpl = chat_template_load(o->tokenizer, o->chat_template, &tmpl_err);
        if (!tmpl && (prepare_format_is_chat(format) || o->chat_template)) {
            *err = tmpl_err;
            rc = tmpl_err.code;
        }
        c.tmpl = tmpl;
        c.tmpl_error = tmpl ? NULL : tmpl_err.msg;
    }
    size_t n = 0, n_eval = 0;
    if (rc == CT_OK && o->eval_fraction > 0 && (rc = count_records(o->in, &n, err)) == CT_OK)
        rc = eval_count(o, n, &n_eval, err);
    uint8_t *is_eval = n_eval ? choose_eval(n, n_eval, o->seed) : NULL;
    shard_writer *w[2] = {shard_writer_new(), shard_writer_new()};
    prepare_stats st;
    if (rc == CT_OK) rc = prepare_run_text(o->in, &c, o->threads, is_eval, n_eval ? n : 0, w, &st, err);
    if (rc == CT_OK && st.records == 0) rc = CT_FAIL_INPUT(err, "%s: no documents (the file is empty or blank)", o->in);
    if (rc == CT_OK) {
        print_summary(o, &c, &st);
        rc = write_outputs(o, w, st.split, st.no_labels, err);
    }
    free(is_eval);
    shard_writer_free(w[0]);
    shard_writer_free(w[1]);
    chat_template_free(tmpl);
    text_encoder_free(&enc);
    return rc;
}

/* The format of --format auto: the first record's keys. */
static int detect(const prepare_opts *o, prepare_format *format, size_t *line, bool *array, ct_error *err)
{
    prepare_input *in = prepare_input_open(o->in, err);
    if (!in) return err->code;
    const char *rec;
    size_t len;
    *array = prepare_input_is_array(in);
    int rc = prepare_input_next(in, &rec, &len, line, err);
    if (rc == CT_OK && !rec) rc = CT_FAIL_INPUT(err, "%s: no documents (the file is empty or blank)", o->in);
    if (rc == CT_OK) {
        size_t src_len = strlen(o->in) + 32;
        char *src = ct_malloc(src_len);
        snprintf(src, src_len, "%s:%zu", o->in, *line);
        rc = prepare_detect_format(rec, len, src, &o->fields, format, err);
        free(src);
    }
    prepare_input_close(in);
    return rc;
}

int cmd_prepare(int argc, char **argv, ct_error *err)
{
    prepare_opts o;
    int rc = parse_args(argc, argv, &o, err);
    if (rc) return rc;
    prepare_format format = o.format;
    size_t line = 0;
    bool array = false;
    if (format == PREPARE_FORMAT_AUTO && (rc = detect(&o, &format, &line, &array, err))) return rc;
    if (format == PREPARE_FORMAT_TOKENS) {
        if (array)
            return CT_FAIL_INPUT(err, "%s: a JSON array of token-id records: write them one a line (JSONL)", o.in);
        if (o.text_options)
            return CT_FAIL_INPUT(err, "--chat-template, --field-*, --train-on-inputs and --max-length apply to text; "
                                 "%s holds token ids (input_ids)", o.in);
        if (o.tokenizer && !o.vocab_size) {   /* the model's size bounds the ids */
            ct_text_encoder enc;
            if ((rc = text_encoder_load(&enc, o.tokenizer, err))) return rc;
            o.vocab_size = enc.model_vocab_size;
            text_encoder_free(&enc);
        }
        return prepare_tokens(&o, err);
    }
    if (!o.tokenizer && line)
        return CT_FAIL_INPUT(err, "%s:%zu: a %s record: text needs --tokenizer MODEL_DIR (a model folder with "
                             "tokenizer.json)", o.in, line, prepare_format_names[format]);
    if (!o.tokenizer)
        return CT_FAIL_INPUT(err, "usage: --format %s needs --tokenizer MODEL_DIR (a model folder with tokenizer.json)",
                             prepare_format_names[format]);
    return prepare_text(&o, format, line, err);
}
