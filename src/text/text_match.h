/* text_match.h — white space trimming as Python's str.strip() does it, and the
 * match rules of `ctune eval --generate` that score a generation against its
 * reference:
 *   exact     the two are equal once leading and trailing white space is trimmed
 *   contains  the trimmed reference occurs in the generation (byte for byte)
 * White space is Python's str.isspace(): ASCII \t \n \v \f \r, the separators
 * 0x1c-0x1f, space, U+0085, U+00A0 and the Unicode spaces (U+1680, U+2000-200A,
 * U+2028, U+2029, U+202F, U+205F, U+3000). Text is UTF-8; an ill-formed
 * sequence (a model's raw bytes) is never white space, and nothing is read
 * past the n bytes given. Strings may hold NUL bytes (lengths, not C strings). */
#ifndef CT_TEXT_MATCH_H
#define CT_TEXT_MATCH_H

#include "common.h"

typedef enum { TEXT_MATCH_EXACT, TEXT_MATCH_CONTAINS } text_match_metric;

/* "exact", "contains"; NULL-terminated, in enum order. */
extern const char *const text_match_metric_names[];
/* CT_ERR_INPUT "--metric 'x': expected exact or contains" for an unknown name. */
int text_match_metric_parse(const char *name, text_match_metric *out, ct_error *err);

/* Python's s.rstrip(): the length of s[0..n) less its trailing white space. */
size_t text_rstrip(const char *s, size_t n);
/* Python's s.strip(): s[*start..*end) is s[0..n) less white space at both ends. */
void text_strip(const char *s, size_t n, size_t *start, size_t *end);

/* Whether generation gen[0..gen_len) matches reference ref[0..ref_len) under
 * metric. An empty trimmed reference is contained in every generation and
 * equals only an empty (or all white space) one. */
bool text_match(text_match_metric metric, const char *gen, size_t gen_len, const char *ref, size_t ref_len);

#endif
