/* cmd_inspect.c — `ctune inspect`: a model folder (config.json inside), a
 * checkpoint folder (adapter + trainer state, verified against its manifest),
 * or shard files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "commands.h"
#include "config.h"

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Present as a directory entry, whatever it is (a FIFO or a broken link too). */
static bool has_entry(const char *dir, const char *name)
{
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    return lstat(path, &st) == 0;
}

static int print_file(const char *dir, const char *name, ct_error *err)
{
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len;
    char *text = ct_read_file(path, &len, err);
    if (!text) return err->code;
    printf("--- %s\n%s", name, text);
    free(text);
    return CT_OK;
}

/* A checkpoint-STEP folder has trainer state and a manifest, which must verify;
 * final/ (or a PEFT adapter) has only the adapter, verified when it has one. */
static int inspect_checkpoint(const char *dir, ct_error *err)
{
    static const char *const files[] = {"trainer_state.json", "trainer_state.safetensors", "manifest.json", NULL};
    char path[CT_PATH_MAX + 64];
    int rc = cli_check_adapter_dir(dir, err); /* before any reader: a FIFO would block it */
    for (int i = 0; files[i] && !rc; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        rc = cli_check_file(path, err);
    }
    if (rc) return rc;
    bool state = has_entry(dir, "trainer_state.json") || has_entry(dir, "trainer_state.safetensors");
    bool verify = state || has_entry(dir, "manifest.json");
    if (verify && (rc = checkpoint_verify(dir, err))) return rc;
    printf("checkpoint %s\n", dir);
    printf("manifest: %s\n", verify ? "ok (every file has the size and CRC32 it lists)" : "none (an adapter folder)");
    rc = print_file(dir, "adapter_config.json", err);
    if (!rc && has_entry(dir, "trainer_state.json")) rc = print_file(dir, "trainer_state.json", err);
    return rc;
}

int cmd_inspect(int argc, char **argv, ct_error *err)
{
    const cli_opt opts[] = {{0}};
    const cli_cmd cmd = {"inspect", "inspect SHARD... | MODEL_DIR | CHECKPOINT_DIR", opts};
    int n_args;
    int rc = cli_parse(&cmd, argc, argv, &n_args, err);
    if (rc) return rc;
    if (n_args == 0) return CT_FAIL_INPUT(err, "usage: ctune inspect SHARD... | MODEL_DIR | CHECKPOINT_DIR");
    if (n_args == 1 && is_dir(argv[1])) {
        if (has_entry(argv[1], "config.json")) return inspect_model(argv[1], err);
        if (has_entry(argv[1], "adapter_config.json")) return inspect_checkpoint(argv[1], err);
        return CT_FAIL_INPUT(err, "%s: a folder without config.json or adapter_config.json "
                             "(expected a model folder or a checkpoint)", argv[1]);
    }
    return inspect_shards(n_args, argv + 1, err);
}
