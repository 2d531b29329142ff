/* fuzz_config.c — the YAML config reader on arbitrary bytes: the text as a config
 * file (config_parse_text), then as one --set override (config_set).
 * Invariants: no crash or leak; every error is one line; a config that reads
 * and validates prints (as config_print does for `--print-config` and the run
 * folder's config.yaml) to YAML that reads back and prints the same (config.h
 * promises the round trip).
 *
 * Inputs stay short (fuzz/run.sh: -max_len 8192) so that the fuzzer runs fast,
 * but costs that grow with depth or length (libyaml's scan was quadratic in
 * nesting) show only on large inputs: an input whose first byte is 0x01 stands
 * for the rest repeated up to 64 KiB ("\x01[" is 65,536 levels of '['). That is
 * large enough for a quadratic cost to pass fuzz/run.sh's 10 s timeout (before
 * the depth cap, 65,536 levels took libyaml 27 s on a busy 2-core machine) and
 * small enough to keep the fuzzer fast (such an input costs about ten ordinary
 * ones). */
#include <string.h>

#include "config.h"
#include "fuzz.h"

static char *config_fuzz_print(const ct_config *cfg, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    config_print(cfg, f);
    fclose(f);
    return buf;
}

#define CONFIG_FUZZ_REPEAT_BYTES ((size_t)64 << 10)

/* "\x01" + UNIT: UNIT repeated up to CONFIG_FUZZ_REPEAT_BYTES (caller frees). */
static uint8_t *config_fuzz_repeat(const uint8_t *unit, size_t n, size_t *size)
{
    *size = n ? CONFIG_FUZZ_REPEAT_BYTES / n * n : 0;
    uint8_t *big = malloc(*size + 1);
    for (size_t i = 0; i < *size; i += n) memcpy(big + i, unit, n);
    return big;
}

static void config_fuzz_one_line(int rc, const ct_error *err)
{
    FUZZ_ASSERT(rc == CT_OK || !strchr(err->msg, '\n'), "an error of more than one line:\n%s", err->msg);
}

int fuzz_config(const uint8_t *data, size_t size)
{
    /* ct_config is ~0.5 MiB (the file lists): allocated once, not per input */
    static ct_config *cfg, *back;
    if (!cfg) cfg = malloc(sizeof *cfg), back = malloc(sizeof *back);
    uint8_t *big = NULL;
    if (size > 0 && data[0] == 0x01) data = big = config_fuzz_repeat(data + 1, size - 1, &size);
    ct_error err;
    int rc = config_parse_text(cfg, (const char *)data, size, "fuzz.yaml", &err);
    config_fuzz_one_line(rc, &err);
    if (rc == CT_OK) {
        rc = config_validate(cfg, &err);
        config_fuzz_one_line(rc, &err);
    }
    if (rc == CT_OK) {
        size_t len1, len2;
        char *text1 = config_fuzz_print(cfg, &len1);
        rc = config_parse_text(back, text1, len1, "fuzz.yaml", &err);
        FUZZ_ASSERT(rc == CT_OK, "printed config does not read back: %s\n%s", err.msg, text1);
        char *text2 = config_fuzz_print(back, &len2);
        FUZZ_ASSERT(len1 == len2 && !memcmp(text1, text2, len1), "printed config reads back different:\n%s\n---\n%s",
                    text1, text2);
        free(text1);
        free(text2);
    }
    /* The same bytes as "KEY=VALUE" after --set (a C string: stops at a NUL). */
    char *assignment = malloc(size + 1);
    memcpy(assignment, data, size);
    assignment[size] = '\0';
    config_defaults(cfg);
    config_fuzz_one_line(config_set(cfg, assignment, &err), &err);
    free(assignment);
    free(big);
    return 0;
}

CT_FUZZ_MAIN(fuzz_config)
