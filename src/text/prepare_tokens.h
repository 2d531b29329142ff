/* prepare_tokens.h — the token-id input of `ctune prepare` (--format tokens):
 * one JSON object a line, {"input_ids": [...]} with optionally a loss mask in
 * any of the forms HF and TRL write: "labels" (-100 = no loss, else equal to
 * input_ids), "loss_mask", "completion_mask" or "assistant_masks" (1 = train
 * on the token; 0/1 or booleans). Several of them must agree token by token.
 * Other keys are ignored, so rows straight from a tokenized HF or TRL dataset
 * work. A line is parsed without a JSON tree, straight into a shard writer:
 * memory is the line plus 5 bytes a token. */
#ifndef CT_PREPARE_TOKENS_H
#define CT_PREPARE_TOKENS_H

#include "shard.h"

/* Parses line[0..line_len) into room reserved in w (the caller commits it with
 * shard_writer_commit(w, *len) or drops it); *mask and *len receive its loss
 * mask and length. vocab_size 0: no check. Errors are one-line CT_ERR_INPUT
 * naming src ("data.jsonl:5: labels has 2 entries but input_ids has 3"). */
int prepare_tokens_doc(const char *line, size_t line_len, const char *src, uint32_t vocab_size, shard_writer *w,
                       const uint8_t **mask, size_t *len, ct_error *err);

#endif
