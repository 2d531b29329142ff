/* text_encoder.h — a model folder's tokenizer as transformers' tokenizer(text)
 * uses it: tokenizer.json's pipeline (tokenizer.h) plus what HF adds around it,
 * read from the same folder:
 *   - the special tokens of add_special_tokens=True: tokenizer.json's
 *     post_processor, its single-sequence template (TemplateProcessing, as in
 *     Llama-3 and Llama-2: "<s> $A"; BertProcessing and RobertaProcessing:
 *     cls $A sep; ByteLevel adds none; Sequence: its items in turn);
 *   - whether offsets are trimmed of their spaces (a ByteLevel or Roberta
 *     post-processor with trim_offsets, as offset_mapping reports them);
 *   - tokenizer.eos_token / bos_token (tokenizer_config.json's eos_token and
 *     bos_token, a string or an {"content": ...} object);
 *   - config.json's vocab_size (also under text_config), the model's size.
 * Ownership: text_encoder_load fills e; text_encoder_free releases it. */
#ifndef CT_TEXT_ENCODER_H
#define CT_TEXT_ENCODER_H

#include "tokenizer.h"
#include "tokenizer_offsets.h"

typedef struct ct_text_encoder {
    ct_tokenizer *tok;
    uint32_t *prefix, *suffix;   /* (n_prefix), (n_suffix): ids around $A */
    size_t n_prefix, n_suffix;
    bool trim_offsets;
    bool trim_keeps_first;       /* add_prefix_space: the first token keeps its leading space */
    char *eos_token, *bos_token; /* NULL when the folder names none */
    uint32_t eos_id, bos_id;     /* valid when the token is named and in the vocabulary */
    bool has_eos_id, has_bos_id;
    uint32_t model_vocab_size;   /* config.json's vocab_size; 0 when absent */
} ct_text_encoder;

/* Loads MODEL_DIR/tokenizer.json (required) and reads tokenizer_config.json and
 * config.json when present. CT_ERR_INPUT naming the file and the field: a
 * missing tokenizer.json ("MODEL_DIR/tokenizer.json: cannot open (...)"), an
 * unsupported tokenizer or post-processor type, a special token of the
 * post-processor that is not in the vocabulary. */
int text_encoder_load(ct_text_encoder *e, const char *model_dir, ct_error *err);
void text_encoder_free(ct_text_encoder *e);

/* HF's tokenizer(text)["input_ids"] (add_special_tokens=True): the prefix, the
 * ids of text (special tokens in it matched), the suffix; appended to out. */
int text_encoder_encode(const ct_text_encoder *e, const char *text, size_t len, ct_ids *out, ct_error *err);

/* Trims spans[first..] as HF's ByteLevel post-processor does with trim_offsets
 * (spaces at either end of a token leave its span); nothing when the model
 * does not trim. ids are the tokens the spans belong to. */
void text_encoder_trim_spans(const ct_text_encoder *e, const ct_ids *ids, ct_spans *spans, size_t first);

#endif
