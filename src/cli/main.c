/* main.c — the ctune command line: dispatch to a subcommand, map errors to exit
 * codes (0 success, 1 runtime failure, 2 bad input or usage). Each subcommand
 * parses its own options with cli.h and prints them under `ctune CMD --help`. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv, ct_error *err);
    const char *about;
} command;

static const command commands[] = {
    {"train",    cmd_train,    "train a LoRA adapter from a YAML config"},
    {"eval",     cmd_eval,     "loss and perplexity of a model (and adapter) on eval shards"},
    {"prepare",  cmd_prepare,  "token-id JSONL -> train/eval shards"},
    {"init",     cmd_init,     "a random-weight bf16 (or 4-bit) model folder from an HF config.json"},
    {"inspect",  cmd_inspect,  "report on shards, a model folder or a checkpoint"},
    {"merge",    cmd_merge,    "base model + LoRA adapter -> a merged bf16 model folder"},
    {"quantize", cmd_quantize, "a bf16 model folder -> a bitsandbytes 4-bit (NF4/FP4) folder"},
    {"generate", cmd_generate, "sample a completion with a KV cache"},
    {"summary",  cmd_summary,  "one row per run folder (losses, tokens/s, wall time, memory)"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void print_usage(FILE *out)
{
    fprintf(out, "usage: ctune COMMAND [ARGS]   (ctune COMMAND --help lists its options)\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].about);
    fprintf(out, "  %-10s %s\n", "version", "print the version (also --version)");
    fprintf(out, "\nexit codes: 0 success, 1 runtime failure, 2 bad input or usage\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return CT_ERR_INPUT;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        print_usage(stdout);
        return CT_OK;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "version")) {
        printf("ctune %s\n", CT_VERSION);
        return CT_OK;
    }
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(name, commands[i].name) != 0) continue;
        ct_error err = {0};
        int rc = commands[i].run(argc - 1, argv + 1, &err);
        if (rc == CLI_HELP) return CT_OK;
        if (rc != CT_OK) fprintf(stderr, "ctune %s: %s\n", name, err.msg[0] ? err.msg : "failed");
        return rc;
    }
    fprintf(stderr, "ctune: unknown command '%s'\n", name);
    print_usage(stderr);
    return CT_ERR_INPUT;
}
