/* fuzz_config.c — the YAML config reader on arbitrary bytes: the text as a config
 * file (config_parse_text), then as one --set override (config_set).
 * Invariants: no crash or leak; a config that reads and validates prints (as
 * config_print does for `--print-config` and the run folder's config.yaml) to
 * YAML that reads back and prints the same (config.h promises the round trip). */
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

int fuzz_config(const uint8_t *data, size_t size)
{
    /* ct_config is ~0.5 MiB (the file lists): allocated once, not per input */
    static ct_config *cfg, *back;
    if (!cfg) cfg = malloc(sizeof *cfg), back = malloc(sizeof *back);
    ct_error err;
    if (config_parse_text(cfg, (const char *)data, size, "fuzz.yaml", &err) == CT_OK &&
        config_validate(cfg, &err) == CT_OK) {
        size_t len1, len2;
        char *text1 = config_fuzz_print(cfg, &len1);
        int rc = config_parse_text(back, text1, len1, "fuzz.yaml", &err);
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
    config_set(cfg, assignment, &err);
    free(assignment);
    return 0;
}

CT_FUZZ_MAIN(fuzz_config)
