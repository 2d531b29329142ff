/* generate.h — autoregressive decoding with a KV cache for `ctune generate`:
 * the dense decoder of graph.c run forward only, a few tokens at a time, over
 * the keys and values of every earlier position kept per layer in backend
 * memory; plus the samplers (greedy, temperature + top-p) and the byte-level
 * tokenizer of the tiny models (scripts/byte_tokenizer.py).
 *
 * Each step embeds only the new tokens, runs their projections (base + LoRA),
 * appends their post-RoPE keys and values to the cache and attends over it
 * with the backend's attention_decode; only the last token's logits are
 * computed (one (1, H) x (H, V) product). Cost per new token: one pass over
 * the weights plus O(position) attention, never a recompute of the prefix.
 * Gated DeltaNet layers keep no cache but two fixed-size states per layer (the
 * conv's last inputs and the delta rule's S), carried by the backend's
 * gdn_conv_step / gdn_delta_step; a backend without them refuses GDN models. */
#ifndef CT_GENERATE_H
#define CT_GENERATE_H

#include "chat_template.h"
#include "lora.h"

typedef struct ct_generator ct_generator;

/* capacity: most positions the cache holds (prompt + new tokens); chunk: most
 * tokens fed in one step (prompts are fed chunk by chunk). lo may be NULL (base
 * model); m and lo must outlive the generator. Fails (CT_ERR_RUNTIME) when the
 * backend is out of memory, CT_ERR_INPUT when capacity exceeds the model's
 * max_position_embeddings or the model has GDN layers the backend cannot decode. */
ct_generator *generator_new(const ct_model *m, const ct_lora *lo, int capacity, int chunk, ct_error *err);
void generator_free(ct_generator *g);
/* Empties the cache and zeroes the GDN states (the next token is at position 0). */
void generator_reset(ct_generator *g);
/* Positions in the cache. */
int generator_position(const ct_generator *g);

/* Runs tokens[0..n) at the next n positions (n >= 1, any length: split into
 * chunks) and writes the logits of the last one into logits (V host floats).
 * Returns CT_ERR_INPUT when the cache would overflow or an id is outside the
 * vocabulary; the cache is unchanged then. */
int generator_feed(ct_generator *g, const int32_t *tokens, int n, float *logits, ct_error *err);

typedef struct ct_sample_options {
    int max_new_tokens;
    float temperature;       /* 0: greedy (argmax, lowest id on ties) */
    float top_p;             /* (0, 1]: sample from the smallest set of most likely tokens holding top_p */
    uint64_t seed;
    const int32_t *stop_ids; /* generation ends after one of these (it is returned, last) */
    int n_stop;
} ct_sample_options;

/* Picks the next token from logits (V floats; overwritten with probabilities
 * when sampling). Deterministic for the state of rng. */
int32_t sample_token(float *logits, int V, float temperature, float top_p, ct_rng *rng);

/* Called with each new token as soon as it is chosen (streaming output). */
typedef void (*ct_token_fn)(int32_t token, void *ctx);

/* Resets the cache, feeds the prompt, then samples up to max_new_tokens;
 * out (max_new_tokens) receives the new tokens, *n_out their count. */
int generate(ct_generator *g, const int32_t *prompt, int n_prompt, const ct_sample_options *o,
             int32_t *out, int *n_out, ct_token_fn on_token, void *ctx, ct_error *err);

/* The byte-level tokenizer of the tiny models (vocab_size 384). */
enum { CT_BYTE_VOCAB = 384, CT_BYTE_ENDOFTEXT = 256, CT_BYTE_IM_START = 257, CT_BYTE_IM_END = 258 };
/* A user turn and the opening of the assistant turn, as scripts/byte_tokenizer.py
 * encodes them: <|im_start|>user\nTEXT<|im_end|>\n<|im_start|>assistant\n.
 * Returns a malloc'd array (caller frees) and its length in *n. */
int32_t *byte_chat_prompt(const char *text, int *n);
/* The same after a system turn <|im_start|>system\nSYSTEM<|im_end|>\n (system NULL: none). */
int32_t *byte_chat_messages(const char *system, const char *text, int *n);
/* Any conversation msgs[0..n_msgs) in that template, each turn
 * <|im_start|>ROLE\nCONTENT<|im_end|>\n, then the opening of the assistant turn. */
int32_t *byte_chat_render(const ct_chat_message *msgs, int n_msgs, int *n);
/* Writes the text of one token: the byte itself, or a special token's name. */
void byte_token_write(int32_t token, FILE *out);
/* The text byte_token_write writes for ids[0..n), made well-formed UTF-8
 * (tokenizer_utf8_lossy): *text malloc'd and NUL-terminated, *len its length. */
void byte_tokens_text(const int32_t *ids, int n, char **text, size_t *len);

#endif
