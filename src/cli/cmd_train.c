/* cmd_train.c — `ctune train` and `ctune eval`: read the config, apply --set
 * overrides, validate, then run. `ctune eval` also takes --model/--data
 * directly, without a config file, and with --generate FILE scores
 * generations instead (cmd_eval_generate.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "config.h"
#include "eval_generate.h"
#include "launch.h"
#include "train.h"

/* What the command line says, before any of it is applied to a config. */
typedef struct train_args {
    const char **sets;      /* the --set values in order (room for argc) */
    int n_sets;
    bool print_config, dry_run;
    const char *adapter;    /* eval only */
    const char *model, *device, *max_length, *tokens_per_micro_batch; /* eval without a config */
    const char **data;      /* eval --data shards (room for argc) */
    int n_data;
    eval_generate_args gen; /* eval --generate */
    const char *gpus;       /* train --gpus N */
} train_args;

static int add_set(void *ctx, const char *value, ct_error *err)
{
    train_args *a = ctx;
    a->sets[a->n_sets++] = value;
    return CT_OK;
}

static int add_data(void *ctx, const char *value, ct_error *err)
{
    train_args *a = ctx;
    a->data[a->n_data++] = value;
    return CT_OK;
}

static int apply_sets(ct_config *cfg, const train_args *a, ct_error *err)
{
    int rc = CT_OK;
    for (int i = 0; i < a->n_sets && !rc; i++) rc = config_set(cfg, a->sets[i], err);
    return rc;
}

/* config_set with "key=value", for the options that are a config key by another name. */
static int set_key(ct_config *cfg, const char *key, const char *value, ct_error *err)
{
    if (!value) return CT_OK;
    char set[CT_PATH_MAX + 64];
    snprintf(set, sizeof set, "%s=%s", key, value);
    return config_set(cfg, set, err);
}

/* `ctune eval --model DIR --data SHARD...`: the defaults with these values. */
static int config_direct(ct_config *cfg, const train_args *a, ct_error *err)
{
    config_defaults(cfg);
    snprintf(cfg->output_dir, sizeof cfg->output_dir, ".");
    if (!a->model) return CT_FAIL_INPUT(err, "usage: ctune eval --model DIR --data SHARD... (--model missing)");
    if (a->n_data == 0) return CT_FAIL_INPUT(err, "usage: ctune eval --model DIR --data SHARD... (--data missing)");
    if (a->n_data > CT_MAX_FILES) return CT_FAIL_INPUT(err, "usage: more than %d --data files", CT_MAX_FILES);
    int rc = CT_OK;
    for (int i = 0; i < a->n_data && !rc; i++) {
        const char *path = a->data[i];
        if (strlen(path) >= CT_PATH_MAX) return CT_FAIL_INPUT(err, "%s: path too long", path);
        rc = cli_check_file(path, err);
        strcpy(cfg->data.eval_files[i], path);
        strcpy(cfg->data.train_files[i], path);
    }
    cfg->data.n_eval_files = cfg->data.n_train_files = a->n_data;
    if (!rc) rc = set_key(cfg, "model", a->model, err);
    if (!rc) rc = set_key(cfg, "device", a->device, err);
    if (!rc) rc = set_key(cfg, "data.max_length", a->max_length, err);
    if (!rc) rc = set_key(cfg, "data.tokens_per_micro_batch", a->tokens_per_micro_batch, err);
    if (!rc) rc = apply_sets(cfg, a, err);
    if (!rc && cfg->data.max_length > cfg->data.tokens_per_micro_batch)
        cfg->data.max_length = cfg->data.tokens_per_micro_batch;
    return rc;
}

/* Parses the command line of train (eval false) or eval into a, then builds cfg:
 * the config file first, so that --set overrides it wherever it stands. */
static int parse(int argc, char **argv, bool eval, ct_config *cfg, train_args *a, ct_error *err)
{
    memset(a, 0, sizeof *a);
    a->sets = ct_calloc((size_t)argc, sizeof *a->sets);
    a->data = ct_calloc((size_t)argc, sizeof *a->data);
    eval_generate_args *g = &a->gen;
    const cli_opt train_opts[] = {
        {"--set", "key=value", "override a config key (repeatable; applied after the file)", .call = add_set, .ctx = a},
        {"--print-config", NULL, "print the resolved config and exit", .flag = &a->print_config},
        {"--dry-run", NULL, "load model and data, print the memory plan and exit", .flag = &a->dry_run},
        {"--gpus", "N", "train on N GPUs of this machine, one process each (data-parallel over NCCL): the "
                        "micro-batches of a step are dealt over them; or launch ctune with torchrun, Slurm or mpirun",
         .str = &a->gpus},
        {0}};
    const cli_opt eval_opts[] = {
        {"--set", "key=value", "override a config key (repeatable; applied after the file)", .call = add_set, .ctx = a},
        {"--adapter", "DIR", "evaluate base + this adapter (its adapter_config.json gives rank and targets)",
         .str = &a->adapter},
        {"--print-config", NULL, "print the resolved config and exit", .flag = &a->print_config},
        {"--model", "DIR", "without CONFIG: the model folder", .str = &a->model},
        {"--data", "SHARD", "without CONFIG: the eval shards (or globs)", .call = add_data, .ctx = a, .many = true},
        {"--device", "cpu|cuda|auto", "without CONFIG: where to run (default auto)", .str = &a->device},
        {"--max-length", "N", "without CONFIG: data.max_length", .str = &a->max_length},
        {"--tokens-per-micro-batch", "N", "without CONFIG: data.tokens_per_micro_batch",
         .str = &a->tokens_per_micro_batch},
        {"--generate", "FILE", "score greedy generations against references instead: the records of FILE (JSONL "
                               "or a JSON array; the formats of prepare --tokenizer), with --model", .str = &g->file},
        {"--metric", "exact|contains", "--generate: the trimmed generation equals the trimmed reference (exact, "
                                       "default) or contains it", .str = &g->metric},
        {"--max-new-tokens", "N", "--generate: most tokens to generate per record (default 128)",
         .str = &g->max_new_tokens},
        {"--chat-template", "NAME|FILE", "--generate: render prompts with a built-in template or a Jinja file "
                                         "instead of the model's", .str = &g->chat_template},
        {"--system", "TEXT", "--generate: a system turn before each conversation that has none", .str = &g->system},
        {"--format", "F", "--generate: auto (default: from the first record's keys), messages, sharegpt, alpaca or "
                          "prompt_completion", .str = &g->format},
        {"--field-messages", "KEY", "--generate: the list of turns (default messages; sharegpt: conversations)",
         .str = &g->fields.messages},
        {"--field-role", "KEY", "--generate: a turn's role (default role; sharegpt: from)", .str = &g->fields.role},
        {"--field-content", "KEY", "--generate: a turn's text (default content; sharegpt: value)",
         .str = &g->fields.content},
        {"--field-prompt", "KEY", "--generate: the prompt of a prompt_completion record (default prompt)",
         .str = &g->fields.prompt},
        {"--field-completion", "KEY", "--generate: its completion, the reference (default completion)",
         .str = &g->fields.completion},
        {"--limit", "N", "--generate: the first N records only", .str = &g->limit},
        {"--out", "FILE", "--generate: one JSON object a line per record (index, line, prompt, reference, "
                          "generation, match)", .str = &g->out},
        {0}};
    const cli_cmd cmd = eval ? (cli_cmd){"eval", "eval CONFIG.yaml [--set key=value]... [--adapter DIR]\n"
                                                 "   or: ctune eval --model DIR --data SHARD... [--adapter DIR] [options]\n"
                                                 "   or: ctune eval --model DIR --generate FILE.jsonl [--adapter DIR] "
                                                 "[--metric exact|contains] [options]",
                                         eval_opts}
                             : (cli_cmd){"train", "train CONFIG.yaml [--set key=value]... [--print-config] [--dry-run] "
                                                  "[--gpus N]",
                                         train_opts};
    int n_args = 0;
    int rc = cli_parse(&cmd, argc, argv, &n_args, err);
    if (rc) return rc;
    if (g->file) {
        if (n_args || a->n_sets || a->n_data || a->max_length || a->tokens_per_micro_batch || a->print_config)
            return CT_FAIL_INPUT(err, "usage: --generate takes --model DIR and its own options, not a config file, "
                                 "--set, --data, --max-length, --tokens-per-micro-batch or --print-config (see ctune "
                                 "eval --help)");
        if (!a->model) return CT_FAIL_INPUT(err, "usage: ctune eval --model DIR --generate FILE (--model missing)");
        g->model = a->model;
        g->adapter = a->adapter;
        g->device = a->device;
        return CT_OK;
    }
    if (eval && eval_generate_options_given(g))
        return CT_FAIL_INPUT(err, "usage: --metric, --max-new-tokens, --chat-template, --system, --format, --field-*, "
                             "--limit and --out go with --generate FILE (see ctune eval --help)");
    bool direct = a->model || a->n_data || a->device || a->max_length || a->tokens_per_micro_batch;
    if (n_args > 1)
        return CT_FAIL_INPUT(err, "usage: one config file expected, got '%s' and '%s'", argv[1], argv[2]);
    if (direct && n_args == 1)
        return CT_FAIL_INPUT(err, "usage: --model, --data, --device, --max-length and --tokens-per-micro-batch are "
                             "for eval without a config file; with %s use --set (see ctune eval --help)", argv[1]);
    if (n_args == 1) {
        config_defaults(cfg);
        if (!(rc = cli_check_file(argv[1], err)) && !(rc = config_load(cfg, argv[1], err))) rc = apply_sets(cfg, a, err);
    } else if (eval && direct) {
        rc = config_direct(cfg, a, err);
    } else {
        return CT_FAIL_INPUT(err, "usage: ctune %s CONFIG.yaml [--set key=value]...%s (see ctune %s --help)",
                             cmd.name, eval ? " | ctune eval --model DIR --data SHARD..." : "", cmd.name);
    }
    return rc ? rc : config_validate(cfg, err);
}

static void args_free(train_args *a)
{
    free(a->sets);
    free(a->data);
}

/* `ctune train ... --gpus N`, N > 1: this process supervises N copies of the
 * same command without --gpus, each told its rank by the launcher's
 * environment (launch.h); ranks after 0 write their output to
 * OUTPUT_DIR/rank-K.log. */
static int train_gpus(const ct_config *cfg, int n, int argc, char **argv, ct_error *err)
{
    if (getenv("WORLD_SIZE") || getenv("SLURM_STEP_NUM_TASKS") || getenv("OMPI_COMM_WORLD_SIZE"))
        return CT_FAIL_INPUT(err, "usage: --gpus %d under a launcher (WORLD_SIZE, SLURM_STEP_NUM_TASKS or "
                             "OMPI_COMM_WORLD_SIZE is set): the launcher starts the ranks, drop --gpus", n);
    char exe[CT_PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return CT_FAIL_RUNTIME(err, "--gpus: cannot find this executable (/proc/self/exe)");
    exe[len] = 0;
    char **child = ct_calloc((size_t)argc + 2, sizeof *child);
    int k = 0;
    child[k++] = exe;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--gpus")) {
            i++;
            continue;
        }
        if (!strncmp(argv[i], "--gpus=", 7)) continue;
        child[k++] = argv[i];
    }
    int rc = ct_mkdirs(cfg->output_dir, err);
    if (!rc) {
        ct_launch_options opt = {.ranks = n, .argv = child, .log_dir = cfg->output_dir,
                                 .grace_s = cfg->distributed.timeout_seconds < 30 ? cfg->distributed.timeout_seconds
                                                                                   : 30};
        printf("ctune: %d ranks; rank 0 reports here, the others in %s/rank-K.log\n", n, cfg->output_dir);
        fflush(stdout);
        rc = launch_ranks(&opt, err);
    }
    free(child);
    return rc;
}

int cmd_train(int argc, char **argv, ct_error *err)
{
    static ct_config cfg; /* large (file lists): keep it off the stack */
    train_args a;
    int rc = parse(argc, argv, false, &cfg, &a, err);
    args_free(&a);
    if (rc) return rc;
    if (a.print_config) {
        config_print(&cfg, stdout);
        return CT_OK;
    }
    int gpus = 1;
    if (a.gpus) {
        char *end;
        long v = strtol(a.gpus, &end, 10);
        if (*end || end == a.gpus || v < 1 || v > 4096)
            return CT_FAIL_INPUT(err, "usage: --gpus %s: expected a number of GPUs >= 1", a.gpus);
        gpus = (int)v;
        if (gpus > 1 && a.dry_run)
            return CT_FAIL_INPUT(err, "usage: --dry-run plans one GPU: drop --gpus (every rank holds the same plan)");
    }
    if (gpus > 1) {
        if ((rc = train_check_ranks(&cfg, gpus, err))) return rc;
        return train_gpus(&cfg, gpus, argc, argv, err);
    }
    return a.dry_run ? train_dry_run(&cfg, err) : train_run(&cfg, err);
}

int cmd_eval(int argc, char **argv, ct_error *err)
{
    static ct_config cfg;
    train_args a;
    int rc = parse(argc, argv, true, &cfg, &a, err);
    args_free(&a);
    if (rc) return rc;
    if (a.gen.file) return eval_generate(&a.gen, err);
    if (a.print_config) {
        config_print(&cfg, stdout);
        return CT_OK;
    }
    return eval_run(&cfg, a.adapter, err);
}
