/* cmd_inspect.c — `ctune inspect`: a model folder (config.json inside), a
 * checkpoint folder (adapter + trainer state), or shard files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "config.h"

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_file(const char *dir, const char *name)
{
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int inspect_checkpoint(const char *dir, ct_error *err)
{
    char path[CT_PATH_MAX + 64];
    size_t len;
    printf("checkpoint %s\n", dir);
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "trainer_state.json" : "adapter_config.json";
        snprintf(path, sizeof path, "%s/%s", dir, name);
        char *text = ct_read_file(path, &len, err);
        if (!text) {
            if (i) continue; /* final/ holds only the adapter */
            return err->code;
        }
        printf("--- %s\n%s", name, text);
        free(text);
    }
    return CT_OK;
}

int cmd_inspect(int argc, char **argv, ct_error *err)
{
    if (argc < 2) return CT_FAIL_INPUT(err, "usage: ctune inspect SHARD... | MODEL_DIR | CHECKPOINT_DIR");
    if (argc == 2 && is_dir(argv[1])) {
        if (has_file(argv[1], "config.json")) return inspect_model(argv[1], err);
        if (has_file(argv[1], "adapter_config.json")) return inspect_checkpoint(argv[1], err);
        return CT_FAIL_INPUT(err, "%s: a folder without config.json or adapter_config.json "
                             "(expected a model folder or a checkpoint)", argv[1]);
    }
    return inspect_shards(argc - 1, argv + 1, err);
}
