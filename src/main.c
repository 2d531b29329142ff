/* main.c — the ctune command line: dispatch to a subcommand, map errors to exit
 * codes (0 success, 1 runtime failure, 2 bad input or usage). */
#include <stdio.h>
#include <string.h>

#include "commands.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv, ct_error *err);
    const char *usage;
} command;

static const command commands[] = {
    {"train",   cmd_train,   "train CONFIG.yaml [--set key=value]... [--print-config] [--dry-run]"},
    {"eval",    cmd_eval,    "eval CONFIG.yaml [--set key=value]... [--adapter DIR] | eval --model DIR [--adapter DIR] --data SHARD..."},
    {"prepare", cmd_prepare, "prepare --in FILE.jsonl --out DIR [--vocab-size V] [--eval-fraction F] [--seed S]"},
    {"init",    cmd_init,    "init --config CONFIG.json --out DIR [--seed S]"},
    {"inspect", cmd_inspect, "inspect SHARD... | MODEL_DIR | CHECKPOINT_DIR"},
    {"merge",   cmd_merge,   "merge --model DIR --adapter DIR --out DIR"},
    {"generate", cmd_generate, "generate --model DIR [--adapter DIR] (--prompt TEXT | --prompt-ids 1,2,3 | "
                               "--prompt-file FILE) [--max-new-tokens N] [--temperature T] [--top-p P] [--seed S] "
                               "[--device cpu|cuda|auto] [--ids]"},
    {"summary", cmd_summary, "summary RUN_DIR... [--out FILE.csv]"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void print_usage(FILE *out)
{
    fprintf(out, "usage: ctune COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(out, "  ctune %s\n", commands[i].usage);
    fprintf(out, "\nexit codes: 0 success, 1 runtime failure, 2 bad input or usage\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return CT_ERR_INPUT;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_usage(stdout);
        return CT_OK;
    }
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(argv[1], commands[i].name) != 0) continue;
        ct_error err = {0};
        int rc = commands[i].run(argc - 1, argv + 1, &err);
        if (rc != CT_OK) {
            fprintf(stderr, "ctune %s: %s\n", commands[i].name, err.msg[0] ? err.msg : "failed");
            if (rc == CT_ERR_INPUT && strstr(err.msg, "usage:") == NULL && err.msg[0] == 0)
                fprintf(stderr, "usage: ctune %s\n", commands[i].usage);
        }
        return rc;
    }
    fprintf(stderr, "ctune: unknown command '%s'\n", argv[1]);
    print_usage(stderr);
    return CT_ERR_INPUT;
}
