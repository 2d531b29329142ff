/* cmd_generate.c — `ctune generate`: sample a completion from a model (plus an
 * optional adapter) to eyeball a run. A text prompt (--prompt, --system) is
 * rendered with the model's chat template and tokenized with its
 * tokenizer.json (text_encoder.h, chat_template.h); the tiny models, which have
 * no tokenizer.json, use their byte-level template. Token ids (--prompt-ids,
 * --prompt-file) work with any model. The new tokens stream to stdout as they
 * are chosen, as text or (--ids, or a prompt of ids) as ids; timing goes to
 * stderr. Generation stops at the model's eos ids (config.json,
 * generation_config.json) and its tokenizer's eos_token (the end of a turn). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapter.h"
#include "chat_template.h"
#include "cli_generate.h"
#include "commands.h"
#include "generate.h"
#include "text_encoder.h"

typedef struct gen_args {
    const char *model, *adapter, *prompt, *system, *chat_template, *prompt_ids, *prompt_file, *device;
    long long max_new_tokens, seed;
    double temperature, top_p;
    bool print_ids;
} gen_args;

static int parse_double(const char *opt, const char *s, double lo, double hi, double *out, ct_error *err)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return CT_FAIL_INPUT(err, "%s '%s': expected a number in [%g, %g]", opt, s, lo, hi);
    *out = v;
    return CT_OK;
}

static int parse_args(int argc, char **argv, gen_args *a, ct_error *err)
{
    *a = (gen_args){.max_new_tokens = 128, .top_p = 1.0, .device = "auto"};
    const char *max_new = NULL, *seed = NULL, *temperature = NULL, *top_p = NULL;
    const cli_opt opts[] = {
        {"--model", "DIR", "the model folder", .str = &a->model, .required = true},
        {"--adapter", "DIR", "a LoRA adapter folder to apply", .str = &a->adapter},
        {"--prompt", "TEXT", "a user turn, rendered with the model's chat template and tokenizer.json (the tiny "
                             "models: their byte-level template)", .str = &a->prompt},
        {"--system", "TEXT", "a system turn before --prompt", .str = &a->system},
        {"--chat-template", "NAME|FILE", "render --prompt with a built-in template or a Jinja file instead of the "
                                         "model's", .str = &a->chat_template},
        {"--prompt-ids", "1,2,3", "the prompt as token ids", .str = &a->prompt_ids},
        {"--prompt-file", "FILE", "the prompt as token ids in a file (commas, spaces or newlines)",
         .str = &a->prompt_file},
        {"--max-new-tokens", "N", "most tokens to generate (default 128)", .str = &max_new},
        {"--temperature", "T", "0 is greedy (default); above 0 samples", .str = &temperature},
        {"--top-p", "P", "sample from the smallest set holding P of the probability (default 1)", .str = &top_p},
        {"--seed", "S", "seed of the sampling (default 0)", .str = &seed},
        {"--device", "cpu|cuda|auto", "where to run (default auto: the GPU when there is one)", .str = &a->device},
        {"--ids", NULL, "print token ids, also for the tiny models", .flag = &a->print_ids},
        {0}};
    const cli_cmd cmd = {"generate", "generate --model DIR [--adapter DIR] (--prompt TEXT [--system TEXT] | "
                                     "--prompt-ids 1,2,3 | --prompt-file FILE) [options]", opts};
    int rc = cli_parse(&cmd, argc, argv, NULL, err);
    if (!rc && max_new) rc = cli_parse_ll("--max-new-tokens", max_new, 1, 1 << 20, &a->max_new_tokens, err);
    if (!rc && seed) rc = cli_parse_ll("--seed", seed, 0, INT64_MAX, &a->seed, err);
    if (!rc && temperature) rc = parse_double("--temperature", temperature, 0, 100, &a->temperature, err);
    if (!rc && top_p) rc = parse_double("--top-p", top_p, 1e-6, 1, &a->top_p, err);
    if (rc) return rc;
    if (!!a->prompt + !!a->prompt_ids + !!a->prompt_file != 1)
        return CT_FAIL_INPUT(err, "usage: give exactly one of --prompt, --prompt-ids, --prompt-file "
                             "(see ctune generate --help)");
    if ((a->system || a->chat_template) && !a->prompt)
        return CT_FAIL_INPUT(err, "usage: --system and --chat-template go with --prompt (see ctune generate --help)");
    if (strcmp(a->device, "cpu") && strcmp(a->device, "cuda") && strcmp(a->device, "auto"))
        return CT_FAIL_INPUT(err, "--device '%s': expected cpu, cuda or auto", a->device);
    /* a FIFO among the inputs is refused here rather than block a reader */
    if (a->prompt_file && (rc = cli_check_file(a->prompt_file, err))) return rc;
    if (a->adapter && (rc = cli_check_adapter_dir(a->adapter, err))) return rc;
    return cli_check_model_dir(a->model, err);
}

/* Token ids separated by commas and/or white space; source names them in errors. */
static int32_t *parse_ids(const char *text, const char *source, int *n, ct_error *err)
{
    size_t cap = 64;
    int32_t *ids = ct_malloc(cap * sizeof *ids);
    *n = 0;
    for (const char *p = text; *p;) {
        if (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            free(ids);
            CT_FAIL_INPUT(err, "%s: '%.20s' is not a token id (expected ids separated by commas or spaces)",
                          source, p);
            return NULL;
        }
        if ((size_t)*n == cap) ids = ct_realloc(ids, (cap *= 2) * sizeof *ids);
        ids[(*n)++] = (int32_t)v;
        p = end;
    }
    if (*n == 0) {
        free(ids);
        CT_FAIL_INPUT(err, "%s: no token ids", source);
        return NULL;
    }
    return ids;
}

enum { STREAM_IDS, STREAM_BYTES, STREAM_TEXT };

typedef struct stream_ctx {
    int mode;                  /* STREAM_* */
    int count;
    const int32_t *stop_ids;
    int n_stop;
    const ct_tokenizer *tok;   /* STREAM_TEXT */
    uint32_t *ids;             /* the new tokens, less stop tokens */
    size_t n, cap;
    size_t base;               /* text is decode(ids[base..]): a window, so each step decodes a few tokens */
    size_t printed;            /* bytes of that text already written */
} stream_ctx;

/* Writes what decode(ids[base..]) adds to what was written: text ending in an
 * unfinished character (U+FFFD) waits for the next token, unless final. The
 * window keeps one written token before the new ones, so a decoder that
 * strips the first token's space (Metaspace) strips one already written. */
static void text_flush(stream_ctx *s, bool final)
{
    char *text;
    size_t len;
    ct_error ignored = {0};
    if (tokenizer_decode(s->tok, s->ids + s->base, s->n - s->base, true, &text, &len, &ignored)) return;
    bool pending = !final && len >= 3 && !memcmp(text + len - 3, "\xEF\xBF\xBD", 3);
    if (!pending && len > s->printed) {
        fwrite(text + s->printed, 1, len - s->printed, stdout);
        s->printed = len;
        if (s->n - s->base > 8) {   /* slide the window to the last written token */
            free(text);
            s->base = s->n - 1;
            if (tokenizer_decode(s->tok, s->ids + s->base, 1, true, &text, &len, &ignored)) return;
            s->printed = len;
        }
    }
    free(text);
}

static void on_token(int32_t t, void *p)
{
    stream_ctx *s = p;
    bool stop = false;
    for (int i = 0; i < s->n_stop; i++) stop |= t == s->stop_ids[i];
    if (s->mode == STREAM_BYTES) {
        if (!stop) byte_token_write(t, stdout);   /* the end of the turn is not part of the answer */
    } else if (s->mode == STREAM_TEXT) {
        if (!stop) {
            if (s->n == s->cap) s->ids = ct_realloc(s->ids, (s->cap = s->cap ? 2 * s->cap : 64) * sizeof *s->ids);
            s->ids[s->n++] = (uint32_t)t;
            text_flush(s, false);
        }
    } else {
        printf("%s%d", s->count ? " " : "", t);
    }
    s->count++;
    fflush(stdout);
}

/* The prompt of --prompt / --system through the chat template and tokenizer.json. */
static int32_t *text_prompt(const gen_args *a, const ct_text_encoder *enc, int *n, ct_error *err)
{
    ct_chat_template *tmpl = chat_template_load(a->model, a->chat_template, err);
    if (!tmpl) return NULL;
    ct_chat_message msgs[2];
    int k = 0;
    if (a->system) msgs[k++] = (ct_chat_message){"system", a->system};
    msgs[k++] = (ct_chat_message){"user", a->prompt};
    char *text = NULL;
    size_t len;
    int32_t *prompt = NULL;
    ct_ids ids = {0};
    int rc = chat_template_render(tmpl, msgs, k, true, &text, &len, err);
    if (!rc) rc = tokenizer_encode(enc->tok, text, len, true, &ids, err);
    if (!rc && ids.len == 0) rc = CT_FAIL_INPUT(err, "--prompt: the chat template rendered an empty prompt");
    if (!rc && ids.len > INT32_MAX / 2) rc = CT_FAIL_INPUT(err, "--prompt: %zu tokens is too long", ids.len);
    if (!rc) {
        prompt = ct_malloc(ids.len * sizeof *prompt);
        for (size_t i = 0; i < ids.len; i++) prompt[i] = (int32_t)ids.data[i];
        *n = (int)ids.len;
    }
    free(text);
    ct_ids_free(&ids);
    chat_template_free(tmpl);
    return prompt;
}

int cmd_generate(int argc, char **argv, ct_error *err)
{
    gen_args a;
    int rc = parse_args(argc, argv, &a, err);
    if (rc) return rc;
    ct_backend *be = cli_open_backend(a.device, err);
    if (!be) return err->code;
    ct_model m;
    ct_lora lo = {0};
    ct_generator *g = NULL;
    ct_text_encoder enc = {0};
    int32_t *prompt = NULL, *out = NULL;
    int n_prompt = 0;
    rc = model_load(&m, be, a.model, err);
    if (rc) {
        be->destroy(be);
        return rc;
    }
    bool text = a.prompt && cli_has_tokenizer(a.model);
    bool bytes = !text && m.cfg.vocab_size == CT_BYTE_VOCAB;
    if (text) {
        if (!(rc = text_encoder_load(&enc, a.model, err)) && !(prompt = text_prompt(&a, &enc, &n_prompt, err)))
            rc = err->code;
    } else if (a.prompt && (!bytes || a.chat_template)) {
        rc = CT_FAIL_INPUT(err, "--prompt%s needs %s/tokenizer.json (or the byte-level tokenizer of the tiny models, "
                           "vocab_size %d; this model has %d): tokenize the prompt and pass --prompt-ids or "
                           "--prompt-file", a.chat_template ? " with --chat-template" : "", a.model, CT_BYTE_VOCAB,
                           m.cfg.vocab_size);
    } else if (a.prompt) {
        prompt = byte_chat_messages(a.system, a.prompt, &n_prompt);
    } else if (a.prompt_ids) {
        if (!(prompt = parse_ids(a.prompt_ids, "--prompt-ids", &n_prompt, err))) rc = err->code;
    } else {
        size_t len;
        char *ids = ct_read_file_max(a.prompt_file, 64 << 20, &len, err);
        if (!ids) rc = err->code;
        else if (!(prompt = parse_ids(ids, a.prompt_file, &n_prompt, err))) rc = err->code;
        free(ids);
    }
    if (!rc && a.adapter) rc = adapter_load(&lo, &m, a.adapter, err);
    int capacity = n_prompt + (int)a.max_new_tokens;
    if (!rc && !(g = generator_new(&m, a.adapter ? &lo : NULL, capacity, n_prompt < 256 ? n_prompt : 256, err)))
        rc = err->code;
    if (!rc) {
        int32_t stop[CLI_MAX_STOP_IDS];
        int n_stop = cli_stop_ids(a.model, bytes, &enc, stop);
        ct_sample_options o = {.max_new_tokens = (int)a.max_new_tokens, .temperature = (float)a.temperature,
                               .top_p = (float)a.top_p, .seed = (uint64_t)a.seed, .stop_ids = stop,
                               .n_stop = n_stop};
        stream_ctx sc = {.mode = a.print_ids ? STREAM_IDS : text ? STREAM_TEXT : bytes ? STREAM_BYTES : STREAM_IDS,
                         .stop_ids = stop, .n_stop = n_stop, .tok = enc.tok};
        out = ct_malloc((size_t)a.max_new_tokens * sizeof *out);
        int n_out = 0;
        double t0 = ct_now();
        rc = generate(g, prompt, n_prompt, &o, out, &n_out, on_token, &sc, err);
        double dt = ct_now() - t0;
        if (sc.mode == STREAM_TEXT) text_flush(&sc, true);
        printf("\n");
        fflush(stdout);
        if (!rc) {
            bool stopped = false;
            for (int i = 0; n_out > 0 && i < n_stop; i++) stopped |= out[n_out - 1] == stop[i];
            fprintf(stderr, "generate: %d prompt tokens, %d new tokens in %.2f s (%.1f tokens/s, %s backend%s), %s\n",
                    n_prompt, n_out, dt, dt > 0 ? n_out / dt : 0.0, be->name, a.adapter ? ", with adapter" : "",
                    stopped ? "stopped at an end token" : "stopped at --max-new-tokens");
        }
        free(sc.ids);
    }
    free(out);
    free(prompt);
    generator_free(g);
    text_encoder_free(&enc);
    if (lo.params) lora_free(&lo, be);
    model_free(&m);
    be->destroy(be);
    return rc;
}
