/* text_match.c — Python's strip and the eval match rules (see text_match.h). */
#include "text_match.h"

#include <string.h>

const char *const text_match_metric_names[] = {"exact", "contains", NULL};

int text_match_metric_parse(const char *name, text_match_metric *out, ct_error *err)
{
    for (int i = 0; text_match_metric_names[i]; i++)
        if (!strcmp(name, text_match_metric_names[i])) {
            *out = (text_match_metric)i;
            return CT_OK;
        }
    return CT_FAIL_INPUT(err, "--metric '%s': expected exact or contains", name);
}

/* Python's str.isspace, which strip strips. */
static bool py_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

/* The code point of the well-formed sequence s[0..n) (n the sequence's own
 * length, 1 to 3: every white space code point is below U+10000), or
 * 0x110000 when those bytes are not one. */
static uint32_t decode_exact(const unsigned char *s, size_t n)
{
    if (n == 1) return s[0] < 0x80 ? s[0] : 0x110000;
    for (size_t k = 1; k < n; k++)
        if ((s[k] & 0xC0) != 0x80) return 0x110000;
    if (n == 2 && s[0] >= 0xC2 && s[0] < 0xE0) return (s[0] & 0x1Fu) << 6 | (s[1] & 0x3Fu);
    if (n == 3 && (s[0] & 0xF0) == 0xE0) {
        uint32_t cp = (s[0] & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu);
        return cp >= 0x800 ? cp : 0x110000;
    }
    return 0x110000;
}

/* Length of the sequence a lead byte announces (1 for a stray byte). */
static size_t lead_len(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

size_t text_rstrip(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    while (n > 0) {
        size_t k = n - 1;   /* the start of the last sequence: back over at most 3 continuation bytes */
        while (k > 0 && n - k < 4 && (u[k] & 0xC0) == 0x80) k--;
        if (lead_len(u[k]) != n - k || !py_space(decode_exact(u + k, n - k))) break;
        n = k;
    }
    return n;
}

void text_strip(const char *s, size_t n, size_t *start, size_t *end)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t k = lead_len(u[i]);
        if (k > n - i || !py_space(decode_exact(u + i, k))) break;
        i += k;
    }
    *start = i;
    *end = i + text_rstrip(s + i, n - i);
}

bool text_match(text_match_metric metric, const char *gen, size_t gen_len, const char *ref, size_t ref_len)
{
    size_t gs, ge, rs, re;
    text_strip(gen, gen_len, &gs, &ge);
    text_strip(ref, ref_len, &rs, &re);
    size_t rn = re - rs, gn = ge - gs;
    if (metric == TEXT_MATCH_CONTAINS) return rn == 0 || memmem(gen + gs, gn, ref + rs, rn) != NULL;
    return rn == gn && (rn == 0 || !memcmp(gen + gs, ref + rs, rn));
}
