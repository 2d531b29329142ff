/* cli_generate.c — backend, tokenizer and stop ids for the commands that
 * generate (see cli_generate.h). */
#include "cli_generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "generate.h"
#include "json.h"

ct_backend *cli_open_backend(const char *device, ct_error *err)
{
    if (!strcmp(device, "cpu")) return backend_cpu_new();
    ct_error why = {0};
    ct_backend *be = backend_cuda_new(&why);
    if (be) return be;
    if (!strcmp(device, "cuda")) {
        CT_FAIL_RUNTIME(err, "--device cuda: no GPU is usable: %s", why.msg);
        return NULL;
    }
    fprintf(stderr, "note: no GPU (%s); generating on the CPU\n", why.msg);
    return backend_cpu_new();
}

bool cli_has_tokenizer(const char *model_dir)
{
    char path[CT_PATH_MAX + 32];
    struct stat st;
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    return stat(path, &st) == 0;
}

/* eos_token_id (an id or a list) of DIR/NAME, appended to ids; absent files or
 * keys add nothing. */
static void add_eos_ids(const char *dir, const char *name, int32_t *ids, int *n, int cap)
{
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ct_error ignored = {0};
    size_t len;
    char *text = ct_read_file_max(path, 1 << 20, &len, &ignored);
    if (!text) return;
    json_doc *doc = json_parse(text, len, path, &ignored);
    free(text);
    if (!doc) return;
    const json_value *e = json_get(json_root(doc), "eos_token_id");
    size_t count = e ? (e->type == JSON_ARRAY ? e->count : 1) : 0;
    for (size_t i = 0; i < count && *n < cap; i++) {
        const json_value *v = e->type == JSON_ARRAY ? e->items[i] : e;
        if (v->type == JSON_NUMBER && v->is_integer && v->integer >= 0 && v->integer <= INT32_MAX)
            ids[(*n)++] = (int32_t)v->integer;
    }
    json_free(doc);
}

int cli_stop_ids(const char *model_dir, bool bytes, const ct_text_encoder *enc, int32_t *stop)
{
    int n = 0;
    if (bytes) {
        stop[n++] = CT_BYTE_IM_END;
        stop[n++] = CT_BYTE_ENDOFTEXT;
        return n;
    }
    add_eos_ids(model_dir, "config.json", stop, &n, 8);
    add_eos_ids(model_dir, "generation_config.json", stop, &n, 16);
    if (enc && enc->has_eos_id) stop[n++] = (int32_t)enc->eos_id;
    return n;
}
