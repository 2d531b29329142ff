/* eval_generate.h — `ctune eval --generate FILE`: greedy generations from a
 * model (plus an optional adapter) for the records of FILE, each scored
 * against its reference (text_match.h). The records are those of `ctune
 * prepare --tokenizer` (prepare_text.h; prepare_eval_record says which part is
 * the prompt and which the reference). cmd_train.c's eval parses the options
 * into eval_generate_args, as strings; eval_generate checks them. */
#ifndef CT_EVAL_GENERATE_H
#define CT_EVAL_GENERATE_H

#include "prepare_text.h"

typedef struct eval_generate_args {
    const char *file;            /* --generate */
    const char *model, *adapter, *device;
    const char *metric, *max_new_tokens, *limit, *out, *chat_template, *system, *format;
    prepare_fields fields;       /* the --field-* keys */
} eval_generate_args;

/* Whether any option that only --generate uses was given. */
bool eval_generate_options_given(const eval_generate_args *a);

/* Reads and checks every record first (each malformed one a one-line
 * CT_ERR_INPUT naming FILE:LINE and the field, before any generation), then
 * generates, prints a progress line per record to stderr when it is a
 * terminal, the summary ("exact match: 37/50 = 74.0% (FILE, 50 records, 1234
 * new tokens)") to stdout, and with --out one JSON object a line per record. */
int eval_generate(const eval_generate_args *a, ct_error *err);

#endif
