/* commands.h — one function per ctune subcommand. argv[0] is the subcommand name.
 * Each returns CT_OK, CLI_HELP (it printed its --help; main exits 0) or an error
 * code with a one-line message in err (main prints "ctune CMD: MESSAGE" and exits
 * with the code: 1 runtime failure, 2 bad input/usage). Options are parsed by
 * cli_parse (cli.h), so every command has --help and the same error messages. */
#ifndef CT_COMMANDS_H
#define CT_COMMANDS_H

#include "cli.h"
#include "common.h"

int cmd_train(int argc, char **argv, ct_error *err);    /* cmd_train.c */
int cmd_eval(int argc, char **argv, ct_error *err);     /* cmd_train.c */
int cmd_prepare(int argc, char **argv, ct_error *err);  /* cmd_prepare.c */
int cmd_init(int argc, char **argv, ct_error *err);     /* cmd_init.c */
int cmd_inspect(int argc, char **argv, ct_error *err);  /* cmd_inspect.c: shards, model folders, checkpoints */
int cmd_merge(int argc, char **argv, ct_error *err);    /* cmd_merge.c: base + adapter -> merged model folder */
int cmd_quantize(int argc, char **argv, ct_error *err); /* cmd_quantize.c: bf16 folder -> bitsandbytes 4-bit folder */
int cmd_generate(int argc, char **argv, ct_error *err); /* cmd_generate.c: sample a completion */
int cmd_summary(int argc, char **argv, ct_error *err);  /* cmd_summary.c: a table over run folders */

/* The parts of `inspect`: each prints a report to stdout. */
int inspect_shards(int n, char **paths, ct_error *err);     /* inspect_shard.c */
int inspect_model(const char *model_dir, ct_error *err);    /* inspect_model.c */

#endif
