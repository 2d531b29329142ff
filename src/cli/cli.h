/* cli.h — the one option parser every subcommand uses, so all of them share
 * the same conventions:
 *   --name VALUE and --name=VALUE; a flag takes no value;
 *   -h / --help prints the usage and one line per option to stdout (exit 0);
 *   an unknown option is "usage: unknown option '--x' (see ctune CMD --help)"
 *   and a missing value "usage: --opt needs a value (...)", both exit 2;
 *   "--" ends the options: what follows is positional.
 * Each command describes its options in a table; the parser stores each value
 * through the entry's pointer or callback and checks nothing about it (the
 * command converts and validates values afterwards). */
#ifndef CT_CLI_H
#define CT_CLI_H

#include "common.h"

#define CT_VERSION "0.13.0"

/* Returned by cli_parse after it printed the help; commands pass it up and
 * main exits 0. */
#define CLI_HELP (-1)

typedef struct cli_opt {
    const char *name;    /* "--model"; NULL ends a table */
    const char *value;   /* what the value is, for the help ("DIR"); NULL: a flag */
    const char *help;    /* one line */
    const char **str;    /* receives the value (the last one given wins) */
    bool *flag;          /* set to true when a flag is given */
    /* Or called with every value in order (repeatable options such as --set). */
    int (*call)(void *ctx, const char *value, ct_error *err);
    void *ctx;
    bool required;       /* missing: "usage: --opt is required" */
    bool many;           /* also takes the arguments after the value up to the next option (--data A B) */
} cli_opt;

typedef struct cli_cmd {
    const char *name;    /* "prepare" */
    const char *usage;   /* "prepare --in FILE.jsonl --out DIR [options]"; may hold "\n  or: ..." */
    const cli_opt *opts; /* ends with an entry whose name is NULL */
} cli_cmd;

/* Parses argv[1..argc) (argv[0] is the command name). Positional arguments are
 * moved to argv[1..*n_args] in order; n_args NULL means the command takes none
 * ("usage: unexpected argument 'x'"). Returns CT_OK, CLI_HELP or CT_ERR_INPUT. */
int cli_parse(const cli_cmd *c, int argc, char **argv, int *n_args, ct_error *err);

/* opt's value s as an integer in lo..hi into *out; CT_ERR_INPUT ("--opt 'x':
 * expected an integer in lo..hi") otherwise. */
int cli_parse_ll(const char *opt, const char *s, long long lo, long long hi, long long *out, ct_error *err);

/* CT_ERR_INPUT ("PATH: a FIFO, not a regular file") when PATH exists and is not
 * a regular file, so that no reader blocks on a FIFO or reads a device; CT_OK
 * otherwise (a missing file is left for the reader to report). */
int cli_check_file(const char *path, ct_error *err);
/* cli_check_file on the files a model folder (config.json, generation_config.json,
 * model.safetensors, its index) or an adapter folder (adapter_config.json,
 * adapter_model.safetensors) may hold. */
int cli_check_model_dir(const char *dir, ct_error *err);
int cli_check_adapter_dir(const char *dir, ct_error *err);
/* The folder a command writes (merge, quantize) must be new or empty, so that
 * no model is overwritten: CT_ERR_INPUT ("OUT: exists and is not empty (CMD
 * writes a new folder)") otherwise. */
int cli_check_new_dir(const char *out, const char *cmd, ct_error *err);

#endif
