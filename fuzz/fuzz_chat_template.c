/* fuzz_chat_template.c — the chat-template engine (src/text/chat_template.h) on
 * arbitrary bytes, two ways:
 *   - an input that starts with '{' is a tokenizer_config.json, loaded from a
 *     model folder (chat_template_load: the chat_template string or list, the
 *     special tokens) and rendered;
 *   - any other input is a template (chat_template_parse), rendered on a fixed
 *     conversation (system, user, assistant with a <think> block, tool, user
 *     with Unicode and template syntax) with and without the generation prompt.
 * Renders run under small limits (1 MiB output, 32 MiB memory, 200,000
 * steps; each input renders four times) so that a slow input is an error
 * quickly: at 1 million steps, nested loops over the messages took 11-13 s an
 * input under the sanitizers (tests/fuzz_regressions/chat_template/).
 * Invariants: no crash, hang or leak; every failure is a one-line input error;
 * a render is well-formed UTF-8, NUL-terminated at its length, and the same
 * when repeated (the date is fixed). */
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "chat_template.h"
#include "fuzz.h"

static bool chat_template_fuzz_utf8(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) { i++; continue; }
        size_t need = u[i] >= 0xC2 && u[i] <= 0xDF ? 2 : u[i] >= 0xE0 && u[i] <= 0xEF ? 3 : u[i] >= 0xF0 && u[i] <= 0xF4 ? 4 : 0;
        unsigned char lo = u[i] == 0xE0 ? 0xA0 : u[i] == 0xF0 ? 0x90 : 0x80, hi = u[i] == 0xED ? 0x9F : u[i] == 0xF4 ? 0x8F : 0xBF;
        if (!need || n - i < need || u[i + 1] < lo || u[i + 1] > hi) return false;
        for (size_t k = 2; k < need; k++)
            if (u[i + k] < 0x80 || u[i + k] > 0xBF) return false;
        i += need;
    }
    return true;
}

static void chat_template_fuzz_render(ct_chat_template *t)
{
    static const ct_chat_message msgs[] = {
        {"system", "You are a helpful assistant."},
        {"user", "What is 2+2? {{ messages }} {% if %}"},
        {"assistant", "<think>\nadd\n</think>\n\n4"},
        {"tool", "{\"result\": 4}"},
        {"user", "caf\xC3\xA9 \xF0\x9F\x98\x80 \xE6\x97\xA5\xE6\x9C\xAC  "},
    };
    ct_chat_limits lim = {.max_output = 1 << 20, .max_memory = 32 << 20, .max_steps = 200000};
    struct tm date = {.tm_year = 125, .tm_mon = 2, .tm_mday = 9, .tm_hour = 14, .tm_min = 5, .tm_sec = 7, .tm_yday = 67};
    chat_template_set_limits(t, &lim);
    chat_template_set_date(t, &date);
    for (int agp = 0; agp < 2; agp++) {
        char *out[2] = {NULL, NULL};
        size_t len[2] = {0, 0};
        int rc[2];
        ct_error err[2];
        for (int k = 0; k < 2; k++) {
            rc[k] = chat_template_render(t, msgs, 5, agp, &out[k], &len[k], &err[k]);
            if (rc[k] != CT_OK) {
                fuzz_input_error(rc[k], &err[k]);
                FUZZ_ASSERT(!out[k], "a failed render returned text");
                continue;
            }
            FUZZ_ASSERT(out[k][len[k]] == 0, "render not NUL-terminated at its length");
            FUZZ_ASSERT(chat_template_fuzz_utf8(out[k], len[k]), "render is not well-formed UTF-8");
            FUZZ_ASSERT(len[k] <= lim.max_output, "render of %zu bytes past the %zu-byte limit", len[k], lim.max_output);
        }
        FUZZ_ASSERT(rc[0] == rc[1], "the same render succeeded once and failed once");
        if (rc[0] == CT_OK)
            FUZZ_ASSERT(len[0] == len[1] && memcmp(out[0], out[1], len[0]) == 0, "the same render gave two texts");
        else
            FUZZ_ASSERT(strcmp(err[0].msg, err[1].msg) == 0, "the same render failed two ways");
        free(out[0]);
        free(out[1]);
    }
}

int fuzz_chat_template(const uint8_t *data, size_t size)
{
    ct_error err;
    ct_chat_template *t;
    if (size && data[0] == '{') {
        const char *dir = fuzz_dir();
        fuzz_write(dir, "tokenizer_config.json", data, size);
        t = chat_template_load(dir, NULL, &err);
        ct_remove_tree(dir);
    } else {
        t = chat_template_parse((const char *)data, size, "fuzz.jinja", "<s>", "</s>", &err);
    }
    if (!t) {
        fuzz_input_error(err.code, &err);
        return 0;
    }
    chat_template_fuzz_render(t);
    chat_template_free(t);
    return 0;
}

CT_FUZZ_MAIN(fuzz_chat_template)
