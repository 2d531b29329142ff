/* cli_generate.h — what `ctune generate` and `ctune eval --generate` share: the
 * backend a --device names, whether a model folder has a tokenizer.json, and
 * the tokens that end a generation. */
#ifndef CT_CLI_GENERATE_H
#define CT_CLI_GENERATE_H

#include "backend.h"
#include "text_encoder.h"

/* At most this many stop ids (config.json 8, generation_config.json 8, the turn's end). */
#define CLI_MAX_STOP_IDS 17

/* cpu, cuda, or auto: the GPU when one is usable, else the CPU (with a note on
 * stderr). NULL and CT_ERR_RUNTIME for cuda without a usable GPU. */
ct_backend *cli_open_backend(const char *device, ct_error *err);
/* Whether MODEL_DIR/tokenizer.json exists. */
bool cli_has_tokenizer(const char *model_dir);
/* The ids that end a generation, into stop (CLI_MAX_STOP_IDS); returns their
 * count. bytes: the byte tokenizer's <|im_end|> and <|endoftext|>; else the
 * eos_token_id of config.json and generation_config.json (an id or a list;
 * absent files or keys add nothing) and enc's eos_token (the template's end of
 * a turn; enc may be NULL). */
int cli_stop_ids(const char *model_dir, bool bytes, const ct_text_encoder *enc, int32_t *stop);

#endif
