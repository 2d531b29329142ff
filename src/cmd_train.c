/* cmd_train.c — `ctune train` and `ctune eval`: read the config, apply --set
 * overrides, validate, then run. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "config.h"
#include "train.h"

typedef struct train_args {
    const char *config_path;
    bool print_config;
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
        } else if (allow_adapter && !strcmp(argv[i], "--adapter")) {
            if (i + 1 >= argc) return CT_FAIL_INPUT(err, "usage: --adapter needs a folder");
            a->adapter = argv[++i];
        } else {
            return CT_FAIL_INPUT(err, "usage: unknown option '%s' (ctune %s CONFIG.yaml [--set key=value]... %s)",
                                 argv[i], argv[0], allow_adapter ? "[--adapter DIR]" : "[--print-config]");
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
    return train_run(&cfg, err);
}

int cmd_eval(int argc, char **argv, ct_error *err)
{
    static ct_config cfg;
    train_args a;
    int rc = parse(argc, argv, &cfg, &a, true, err);
    if (rc) return rc;
    return eval_run(&cfg, a.adapter, err);
}
