/* tokenizer_offsets.h — tokenizer_encode with the byte span of the text that
 * each token came from, as HF's offset_mapping gives it (in bytes, where
 * Python gives characters): what an assistant-only loss mask needs to tell the
 * tokens of a reply from those of its prompt.
 *
 * The ids are tokenizer_encode's. The spans are found afterwards by walking the
 * ids along the text, stage by stage as encode made them: added tokens where
 * their text is; between them the normalized text (with each normalized byte's
 * source span, HF's alignments), along which every token's string is matched
 * after undoing the pre-tokenizer and model transforms (the ByteLevel byte map
 * and prefix space, Metaspace's replacement and prepend, byte fallback,
 * continuing_subword_prefix / end_of_word_suffix, unk tokens, whitespace that a
 * Removed split dropped). A character inserted by a normalizer or a
 * pre-tokenizer (Prepend, a prefix space) takes the span of the character it
 * was put before, and a token holding part of a character the whole
 * character's span, as in HF. tests/test_prepare_text.c holds the spans to HF's
 * on the fixture tokenizers and the stress corpus.
 *
 * Where a Unicode normalizer rewrites text, each character of the normal form
 * takes the input character that first produced it (a composed character its
 * first source, the parts of a decomposed one their source), which is what
 * HF's alignments give; a rewritten run of more than 32 characters between two
 * ASCII characters is aligned as one block instead (each byte of its normal
 * form spans the whole run). Such runs never hold a mask boundary unless a
 * template joins a combining mark to the text before it.
 *
 * Threads: as tokenizer_encode (the tokenizer is read only). */
#ifndef CT_TOKENIZER_OFFSETS_H
#define CT_TOKENIZER_OFFSETS_H

#include "tokenizer.h"

/* Token spans: span[2i], span[2i+1] are the start and end byte (exclusive) in
 * the encoded text of token i. Zero-initialise; free with ct_spans_free. */
typedef struct ct_spans {
    size_t *data;
    size_t len, cap;   /* len: tokens (data holds 2 len values) */
} ct_spans;
void ct_spans_free(ct_spans *s);

/* tokenizer_encode(t, text, len, parse_special, ids) that also appends each new
 * token's span to spans. text must be valid UTF-8 (JSON strings and what a chat
 * template renders from them are). Fails with CT_ERR_INPUT when encode fails,
 * when text is not valid UTF-8, or when a token cannot be placed in the text
 * ("token 17 ('<0xE9>') does not match the text at byte 40"): a tokenizer
 * shape the walk does not know. ids and spans then hold what was appended. */
int tokenizer_encode_offsets(const ct_tokenizer *t, const char *text, size_t len, bool parse_special,
                             ct_ids *ids, ct_spans *spans, ct_error *err);

#endif
