/* prepare_text.h — one JSON record of text -> one document (token ids and a
 * per-token loss mask), for `ctune prepare --tokenizer MODEL_DIR`.
 *
 * Formats (the keys in quotes are the defaults of the --field-* flags):
 *   messages           {"messages": [{"role", "content"}, ...]} (OpenAI, TRL)
 *   sharegpt           {"conversations": [{"from", "value"}, ...]}; from "human"
 *                      is role user, "gpt" assistant, others ("system") as written
 *   alpaca             {"instruction", "input"?, "output"}: a user turn
 *                      instruction, or instruction + "\n\n" + input when input is
 *                      a non-empty string, then an assistant turn output
 *   prompt_completion  {"prompt", "completion"}: both strings, or both lists of
 *                      messages (TRL's two kinds)
 *   text               {"text"}: a document, loss on every token
 *   tokens             {"input_ids", ...}: token ids (cmd_prepare.c; not here)
 *
 * Chat formats (messages, sharegpt, alpaca) render the conversation with the
 * chat template and train on the assistant turns only, computed as
 * scripts/prepare_data.py's fallback computes them: for assistant message i,
 * prefix = render(messages[:i], add_generation_prompt) must begin
 * render(messages[:i+1]); the rest, less trailing white space (Python's
 * rstrip), is the turn, found in the rendering of the whole conversation from
 * the end of the previous turn on. The whole rendering is tokenized once
 * (special tokens in it matched, no others added: HF's tokenize of a
 * template's text) and a token whose offsets overlap a turn is a label.
 *
 * A template with a {% generation %} tag (prepare_data.py's regex,
 * chat_template_has_generation) takes prepare_data.py's other rule instead,
 * transformers' apply_chat_template(..., return_assistant_tokens_mask=True):
 * the conversation rendered once, with the spans of its generation blocks
 * (chat_template_render_spans: where a block in a macro or a {% set %} block
 * gets a span that is not where its text is, those are kept), and for each
 * span in order, from the first token holding its first character to the one
 * holding its last (HF's char_to_token over the offsets) every token is a
 * label; when no token holds the first character (a span at the end of the
 * text, or on a space that trim_offsets leaves out) that span and all later
 * ones are dropped; when none holds the last, or it is token 0, the labels run
 * to the last token. A conversation may then open with an assistant message;
 * an empty span at byte 0 is an error (transformers fails there).
 *
 * prompt_completion follows TRL's SFTTrainer: strings get the eos_token
 * appended to the completion (when it does not end with it) and are encoded
 * as tokenizer(text) (add_special_tokens: the post-processor's BOS); lists
 * render prompt with add_generation_prompt, and prompt + completion without.
 * The first len(tokens of the prompt) tokens of prompt + completion carry no
 * loss, the rest do (where the prompt's tokens are not a prefix of those of
 * prompt + completion the count is kept, as TRL does; the record counts as
 * mismatched).
 *
 * text is prepare_data.py's: tokenizer(text) (add_special_tokens), then the
 * eos token unless the ids already end with it.
 *
 * --train-on-inputs gives every token of every format a label.
 * Threads: prepare_text_record may run on any number of threads with one
 * prepare_worker each (the tokenizer and the template are read only). */
#ifndef CT_PREPARE_TEXT_H
#define CT_PREPARE_TEXT_H

#include "chat_template.h"
#include "json.h"
#include "text_encoder.h"

typedef enum {
    PREPARE_FORMAT_AUTO,
    PREPARE_FORMAT_MESSAGES,
    PREPARE_FORMAT_SHAREGPT,
    PREPARE_FORMAT_ALPACA,
    PREPARE_FORMAT_PROMPT_COMPLETION,
    PREPARE_FORMAT_TEXT,
    PREPARE_FORMAT_TOKENS,
} prepare_format;

/* "messages", ...; NULL-terminated list of every name, in enum order. */
extern const char *const prepare_format_names[];
/* CT_ERR_INPUT "--format 'x': expected auto, messages, ..." for an unknown name. */
int prepare_format_parse(const char *name, prepare_format *out, ct_error *err);
bool prepare_format_is_chat(prepare_format f);

/* The keys of the --field-* flags; NULL: the format's default. */
typedef struct prepare_fields {
    const char *messages, *role, *content, *text, *prompt, *completion;
} prepare_fields;

/* The format a record's keys say (auto): input_ids -> tokens; the messages key
 * ("messages" or --field-messages) -> messages, or sharegpt when its first item
 * has "from" and no role key; "conversations" -> sharegpt; prompt + completion;
 * instruction + output -> alpaca; the text key -> text. rec is one record's
 * JSON; src ("FILE:LINE") names it in errors. CT_ERR_INPUT when it is not
 * JSON, not an object, or has none of those keys. */
int prepare_detect_format(const char *rec, size_t len, const char *src, const prepare_fields *f,
                          prepare_format *out, ct_error *err);

typedef struct prepare_text_cfg {
    prepare_format format;        /* not AUTO or TOKENS */
    size_t detected_line;         /* > 0: auto detected the format on this line (errors say so) */
    prepare_fields fields;
    const ct_text_encoder *enc;
    const ct_chat_template *tmpl; /* chat formats and conversational prompt_completion */
    const char *tmpl_error;       /* tmpl NULL: why the model has none (for a record that needs one) */
    bool train_on_inputs;
    size_t max_length;            /* 0: no limit */
    uint32_t vocab_size;          /* 0: no check */
} prepare_text_cfg;

/* One document: ids and mask hold its tokens (valid until the worker's next record). */
typedef struct prepare_doc {
    const uint32_t *ids;
    const uint8_t *mask;
    size_t len;
    bool truncated;    /* cut to max_length */
    bool dropped;      /* and left without a label: not to be written */
    bool mismatched;   /* prompt_completion: the prompt's tokens are not a prefix */
} prepare_doc;

typedef struct prepare_worker prepare_worker;
prepare_worker *prepare_worker_new(void);
void prepare_worker_free(prepare_worker *w);

/* Turns record rec[0..len) (src: "FILE:LINE", for errors) into *doc. Every
 * malformed record is a one-line CT_ERR_INPUT naming src and the field
 * ("data.jsonl:7: messages[1].content: expected a string, found null"). */
int prepare_text_record(const prepare_text_cfg *c, prepare_worker *w, const char *rec, size_t len,
                        const char *src, prepare_doc *doc, ct_error *err);

/* One record of `ctune eval --generate`: a prompt and the reference answer.
 *   messages, sharegpt   the conversation up to its last assistant message is
 *                        the prompt; that message's content is the reference
 *   alpaca               instruction (+ "\n\n" + input) as the user turn; output
 *   prompt_completion    lists: prompt + completion up to the completion's last
 *                        assistant message, and its content; strings: prompt
 *                        (encoded as is) and completion */
typedef struct prepare_eval_item {
    const ct_chat_message *msgs; /* (n_msgs) the prompt as a conversation, rendered with the generation prompt */
    int n_msgs;                  /* 0: the prompt is the string below */
    const char *prompt;          /* prompt_completion strings: the prompt text (NUL-terminated) */
    size_t prompt_len;
    const char *reference;       /* NUL-terminated, NUL-free */
    size_t reference_len;
} prepare_eval_item;

/* Reads record rec[0..len) (src: "FILE:LINE") of c->format (a chat format or
 * prompt_completion; only c->format, c->fields and c->detected_line are read)
 * into *item, whose pointers stay valid until the worker's next record. Every
 * malformed record is a one-line CT_ERR_INPUT naming src and the field: the
 * errors of prepare_text_record, and no assistant message, nothing before it,
 * an empty prompt, a reference that is empty or only white space. */
int prepare_eval_record(const prepare_text_cfg *c, prepare_worker *w, const char *rec, size_t len, const char *src,
                        prepare_eval_item *item, ct_error *err);

#endif
