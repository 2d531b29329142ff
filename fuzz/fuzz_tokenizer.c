/* fuzz_tokenizer.c — the tokenizer (src/text/tokenizer.h) on arbitrary bytes, two ways:
 *   - an input that starts with '{' is a tokenizer.json: tokenizer_load_json on
 *     it; one that loads then encodes a few probe strings and the input itself;
 *   - any other input is text, encoded by the fixture tokenizers of
 *     tests/fixtures/tokenizer (loaded once; run from the repo root).
 * Invariants: no crash, hang or leak; every id is below tokenizer_vocab_size;
 * decode returns well-formed UTF-8; and for bl_llama3 (no normalizer, only
 * special added tokens) with parse_special false, decode(encode(x)) is x with
 * its ill-formed UTF-8 replaced by U+FFFD (byte-level BPE loses nothing). */
#include <stdbool.h>
#include <string.h>

#include "fuzz.h"
#include "tokenizer.h"

/* The sequence at s[0..n): +length when well-formed, else -(the length of its
 * maximal ill-formed subpart), per Unicode Table 3-7. */
static long tokenizer_fuzz_utf8_seq(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80) return 1;
    size_t need = s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3 : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    if (!need) return -1;
    unsigned char lo = s[0] == 0xE0 ? 0xA0 : s[0] == 0xF0 ? 0x90 : 0x80;
    unsigned char hi = s[0] == 0xED ? 0x9F : s[0] == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    for (; k < need && k < n && s[k] >= lo && s[k] <= hi; k++) lo = 0x80, hi = 0xBF;
    return k == need ? (long)k : -(long)k;
}

/* x with each maximal ill-formed subpart replaced by U+FFFD (tokenizer.h). */
static char *tokenizer_fuzz_sanitize(const uint8_t *s, size_t n, size_t *out_len)
{
    char *out = malloc(3 * n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        long k = tokenizer_fuzz_utf8_seq(s + i, n - i);
        if (k > 0) memcpy(out + o, s + i, (size_t)k), o += (size_t)k, i += (size_t)k;
        else memcpy(out + o, "\xEF\xBF\xBD", 3), o += 3, i += (size_t)-k;
    }
    *out_len = o;
    return out;
}

static bool tokenizer_fuzz_well_formed(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        long k = tokenizer_fuzz_utf8_seq((const unsigned char *)s + i, n - i);
        if (k < 0) return false;
        i += (size_t)k;
    }
    return true;
}

/* Encodes text both ways and decodes both ways, checking ids and UTF-8. */
static void tokenizer_fuzz_round(const ct_tokenizer *t, const uint8_t *text, size_t n, ct_ids *plain_ids)
{
    for (int special = 0; special < 2; special++) {
        ct_ids ids = {0};
        ct_error err;
        int rc = tokenizer_encode(t, (const char *)text, n, special, &ids, &err);
        FUZZ_ASSERT(rc == CT_OK || rc == CT_ERR_INPUT, "encode returned %d", rc);
        for (size_t i = 0; i < ids.len; i++)
            FUZZ_ASSERT(ids.data[i] < tokenizer_vocab_size(t), "id %u >= vocab size %zu", ids.data[i],
                        tokenizer_vocab_size(t));
        for (int skip = 0; skip < 2 && rc == CT_OK; skip++) {
            char *out;
            size_t len;
            if (tokenizer_decode(t, ids.data, ids.len, skip, &out, &len, &err) != CT_OK) continue;
            FUZZ_ASSERT(tokenizer_fuzz_well_formed(out, len) && out[len] == 0, "decode gave ill-formed UTF-8");
            free(out);
        }
        if (!special && plain_ids) *plain_ids = ids;
        else ct_ids_free(&ids);
    }
}

static void tokenizer_fuzz_json(const uint8_t *data, size_t size)
{
    ct_error err;
    ct_tokenizer *t = tokenizer_load_json((const char *)data, size, "fuzz/tokenizer.json", &err);
    if (!t) {
        FUZZ_ASSERT(err.code == CT_ERR_INPUT && err.msg[0], "a failed load must be an input error with a message");
        return;
    }
    static const char *probes[] = {"", " ", "Hello world", "<s> a\n\n  b", "caf\xC3\xA9 \xF0\x9F\x98\x80 \xFF", "aaaa"};
    for (size_t i = 0; i < sizeof probes / sizeof *probes; i++)
        tokenizer_fuzz_round(t, (const uint8_t *)probes[i], strlen(probes[i]), NULL);
    tokenizer_fuzz_round(t, data, size < 1024 ? size : 1024, NULL);
    for (uint32_t id = 0; id < 64 && id < tokenizer_vocab_size(t); id++) {
        size_t n;
        uint32_t back;
        const char *s = tokenizer_id_to_token(t, id, &n);
        if (s) tokenizer_token_to_id(t, s, n, &back);
    }
    tokenizer_free(t);
}

int fuzz_tokenizer(const uint8_t *data, size_t size)
{
    if (size && data[0] == '{') {
        tokenizer_fuzz_json(data, size);
        return 0;
    }
    static const char *names[] = {"bl_qwen2", "bl_llama3", "bl_o200k", "bl_gpt2",
                                  "sp_llama2", "sp_metaspace", "sp_legacy", "wp_suffix"};
    static ct_tokenizer *fixtures[8];
    for (int i = 0; i < 8; i++) {
        if (!fixtures[i]) {
            char dir[128];
            ct_error err;
            snprintf(dir, sizeof dir, "tests/fixtures/tokenizer/%s", names[i]);
            fixtures[i] = tokenizer_load(dir, &err);
            FUZZ_ASSERT(fixtures[i], "%s (run from the repo root)", err.msg);
        }
        ct_ids plain = {0};
        tokenizer_fuzz_round(fixtures[i], data, size, &plain);
        if (strcmp(names[i], "bl_llama3") == 0) {
            char *out, *want;
            size_t len, want_len;
            ct_error err;
            FUZZ_ASSERT(tokenizer_decode(fixtures[i], plain.data, plain.len, false, &out, &len, &err) == CT_OK, "%s",
                        err.msg);
            want = tokenizer_fuzz_sanitize(data, size, &want_len);
            FUZZ_ASSERT(len == want_len && memcmp(out, want, len) == 0, "byte-level decode(encode(x)) != x");
            free(out);
            free(want);
        }
        ct_ids_free(&plain);
    }
    return 0;
}

CT_FUZZ_MAIN(fuzz_tokenizer)
