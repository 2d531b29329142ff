/* cmd_train.c — `ctune train` and `ctune eval`: read the config, apply --set
 * overrides, validate, then run. `ctune eval` also takes --model/--data
 * directly, without a config file. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "config.h"
#include "train.h"

typedef struct train_args {
    const char *config_path;
    bool print_config;
    bool dry_run;
    const char *adapter;    /* eval only */
} train_args;

/* Reads CONFIG [--set k=v]... [--print-config] [--adapter DIR] into cfg. */
static int parse(int argc, char **argv, ct_config *cfg, train_args *a, bool allow_adapter, ct_error *err)
{
    memset(a, 0, sizeof *a);
    config_defaults(cfg);
    /* The file comes first so that --set overrides it wherever it stands. */
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-') {
            if (a->config_path) return CT_FAIL_INPUT(err, "usage: one config file expected, got '%s' and '%s'",
                                                     a->config_path, argv[i]);
            a->config_path = argv[i];
        } else if (!strcmp(argv[i], "--set") || !strcmp(argv[i], "--adapter")) {
            i++;
        }
    }
    if (!a->config_path) return CT_FAIL_INPUT(err, "usage: ctune %s CONFIG.yaml [--set key=value]...", argv[0]);
    int rc = config_load(cfg, a->config_path, err);
    if (rc) return rc;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-') continue;
        if (!strcmp(argv[i], "--set")) {
            if (i + 1 >= argc) return CT_FAIL_INPUT(err, "usage: --set needs key=value");
            if ((rc = config_set(cfg, argv[++i], err))) return rc;
        } else if (!strcmp(argv[i], "--print-config")) {
            a->print_config = true;
        } else if (!allow_adapter && !strcmp(argv[i], "--dry-run")) {
            a->dry_run = true;
        } else if (allow_adapter && !strcmp(argv[i], "--adapter")) {
            if (i + 1 >= argc) return CT_FAIL_INPUT(err, "usage: --adapter needs a folder");
            a->adapter = argv[++i];
        } else {
            return CT_FAIL_INPUT(err, "usage: unknown option '%s' (ctune %s CONFIG.yaml [--set key=value]... %s)",
                                 argv[i], argv[0], allow_adapter ? "[--adapter DIR]" : "[--print-config] [--dry-run]");
        }
    }
    return config_validate(cfg, err);
}

int cmd_train(int argc, char **argv, ct_error *err)
{
    static ct_config cfg; /* large (file lists): keep it off the stack */
    train_args a;
    int rc = parse(argc, argv, &cfg, &a, false, err);
    if (rc) return rc;
    if (a.print_config) {
        config_print(&cfg, stdout);
        return CT_OK;
    }
    return a.dry_run ? train_dry_run(&cfg, err) : train_run(&cfg, err);
}

/* `ctune eval --model DIR [--adapter DIR] --data SHARD... [--device D]
 * [--max-length N] [--tokens-per-micro-batch N]`: no config file; the defaults
 * with these values. */
static int parse_direct(int argc, char **argv, ct_config *cfg, const char **adapter, ct_error *err)
{
    config_defaults(cfg);
    snprintf(cfg->output_dir, sizeof cfg->output_dir, ".");
    *adapter = NULL;
    int rc = CT_OK;
    for (int i = 1; i < argc && !rc; i++) {
        const char *flag = argv[i];
        if (i + 1 >= argc) return CT_FAIL_INPUT(err, "usage: %s needs a value", flag);
        char set[CT_PATH_MAX + 64];
        if (!strcmp(flag, "--model")) {
            snprintf(set, sizeof set, "model=%s", argv[++i]);
            rc = config_set(cfg, set, err);
        } else if (!strcmp(flag, "--adapter")) {
            *adapter = argv[++i];
        } else if (!strcmp(flag, "--device")) {
            snprintf(set, sizeof set, "device=%s", argv[++i]);
            rc = config_set(cfg, set, err);
        } else if (!strcmp(flag, "--max-length")) {
            snprintf(set, sizeof set, "data.max_length=%s", argv[++i]);
            rc = config_set(cfg, set, err);
        } else if (!strcmp(flag, "--tokens-per-micro-batch")) {
            snprintf(set, sizeof set, "data.tokens_per_micro_batch=%s", argv[++i]);
            rc = config_set(cfg, set, err);
        } else if (!strcmp(flag, "--data")) {
            /* every following argument up to the next flag is a shard (or glob) */
            while (i + 1 < argc && argv[i + 1][0] != '-') {
                const char *path = argv[++i];
                if (cfg->data.n_eval_files >= CT_MAX_FILES)
                    return CT_FAIL_INPUT(err, "usage: more than %d --data files", CT_MAX_FILES);
                if (strlen(path) >= CT_PATH_MAX) return CT_FAIL_INPUT(err, "%s: path too long", path);
                strcpy(cfg->data.eval_files[cfg->data.n_eval_files], path);
                strcpy(cfg->data.train_files[cfg->data.n_eval_files], path);
                cfg->data.n_eval_files++;
                cfg->data.n_train_files++;
            }
        } else {
            return CT_FAIL_INPUT(err, "usage: unknown option '%s' (ctune eval --model DIR [--adapter DIR] "
                                 "--data SHARD... [--device cpu|cuda|auto])", flag);
        }
    }
    if (rc) return rc;
    if (!cfg->model[0]) return CT_FAIL_INPUT(err, "usage: ctune eval --model DIR --data SHARD... (--model missing)");
    if (cfg->data.n_eval_files == 0) return CT_FAIL_INPUT(err, "usage: ctune eval --model DIR --data SHARD... (--data missing)");
    if (cfg->data.max_length > cfg->data.tokens_per_micro_batch) cfg->data.max_length = cfg->data.tokens_per_micro_batch;
    return config_validate(cfg, err);
}

int cmd_eval(int argc, char **argv, ct_error *err)
{
    static ct_config cfg;
    train_args a;
    int rc;
    if (argc > 1 && argv[1][0] == '-') {
        const char *adapter;
        if ((rc = parse_direct(argc, argv, &cfg, &adapter, err))) return rc;
        return eval_run(&cfg, adapter, err);
    }
    if ((rc = parse(argc, argv, &cfg, &a, true, err))) return rc;
    return eval_run(&cfg, a.adapter, err);
}
