/* cmd_quantize.c — `ctune quantize --model DIR --out DIR [--type nf4|fp4|fp8]
 * [--blocksize 64] [--no-double-quant]`: a bf16 model folder -> the bitsandbytes
 * 4-bit folder transformers + bitsandbytes would save for it
 * (docs/quantization.md): the same tensors quantized (quant4_should_quantize),
 * each bit for bit as bnb quantizes it on the CPU, the others in bf16, and
 * config.json with its quantization_config. With --type fp8, the FP8 folder
 * (docs/fp8.md) of the weights base_precision fp8 quantizes on load, each
 * with the arithmetic of transformers' FP8 quantizer (fp8.h).
 *
 * Every tensor is rounded to bf16 first (F16 and F32 inputs too: HF loads
 * with dtype bfloat16 before it quantizes). Tensors the model does not use
 * (a vision tower, MTP weights) are left out, as HF's causal-LM class drops
 * them; the count is printed. The output is written in spec order and
 * sharded as `ctune init` shards (model_write.h), so `init` then `quantize`
 * equals `init --quantize` byte for byte. Memory: one output shard plus one
 * tensor; the input is mmap'd.
 *
 * Crash safety as merge's: everything goes into OUT.partial, renamed to OUT
 * once complete; OUT must be new or empty. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "config.h"
#include "fp8.h"
#include "model_config.h"
#include "model_write.h"
#include "safetensors.h"

#define DEFAULT_MAX_SHARD_BYTES ((size_t)5000000000) /* huggingface_hub's "5GB", as init */
#define INDEX_NAME "model.safetensors.index.json"


typedef struct read_source {
    const ct_tensor_spec *specs;
    const st_reader *r;
} read_source;

/* The checkpoint's tensor as bf16 (model_check_weights vouched for its
 * dtype and shape); the mmap'd data need not be aligned. */
static int read_fill(void *ctx, size_t i, uint16_t *bf16, ct_error *err)
{
    const read_source *src = ctx;
    const st_tensor *t = st_find(src->r, src->specs[i].name);
    const unsigned char *s = t->data;
    if (t->dtype == CT_DTYPE_BF16) {
        memcpy(bf16, s, t->nbytes);
        return CT_OK;
    }
    #pragma omp parallel for schedule(static)
    for (size_t k = 0; k < t->numel; k++) {
        float f;
        if (t->dtype == CT_DTYPE_F32) {
            memcpy(&f, s + 4 * k, 4);
        } else {
            uint16_t h;
            memcpy(&h, s + 2 * k, 2);
            f = ct_f16_to_f32(h);
        }
        bf16[k] = ct_f32_to_bf16(f);
    }
    return CT_OK;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static bool is_regular(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Copies the model folder's other plain files (tokenizer files,
 * generation_config.json); config.json is written with its quantization_config. */
static int copy_side_files(const char *model, const char *out, ct_error *err)
{
    DIR *d = opendir(model);
    if (!d) return CT_FAIL_INPUT(err, "%s: cannot list the folder", model);
    struct dirent *e;
    int rc = CT_OK;
    while (!rc && (e = readdir(d))) {
        if (e->d_name[0] == '.' || has_suffix(e->d_name, ".safetensors") || !strcmp(e->d_name, INDEX_NAME) ||
            !strcmp(e->d_name, "config.json"))
            continue;
        char src[CT_PATH_MAX + 300], dst[CT_PATH_MAX + 300];
        snprintf(src, sizeof src, "%s/%s", model, e->d_name);
        snprintf(dst, sizeof dst, "%s/%s", out, e->d_name);
        if (!is_regular(src)) continue;
        size_t len;
        char *data = ct_read_file(src, &len, err);
        if (!data) rc = err->code;
        else rc = ct_write_file_atomic(dst, data, len, err);
        free(data);
    }
    closedir(d);
    return rc;
}

/* A folder holding any bitsandbytes quant_state or FP8 tensor is quantized already. */
static int check_not_quantized(const st_reader *r, const char *model, ct_error *err)
{
    for (size_t i = 0; i < st_count(r); i++)
        if (strstr(st_at(r, i)->name, ".quant_state.bitsandbytes__") || st_at(r, i)->dtype == CT_DTYPE_F8_E4M3)
            return CT_FAIL_INPUT(err, "%s: the model is already quantized (tensor %s)", model, st_at(r, i)->name);
    return CT_OK;
}

/* Writes OUT.partial, then renames it to OUT. */
static int write_folder(const char *model, const char *out, const ct_tensor_spec *specs, size_t n,
                        const st_reader *r, const model_write_format *f, size_t max_shard, const char *config,
                        size_t config_len, size_t *nfiles, ct_error *err)
{
    /* OUT/ names OUT: without the slash, OUT.partial is a sibling, not a child */
    char dir[CT_PATH_MAX], tmp[CT_PATH_MAX + 16], path[CT_PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s", out);
    for (size_t k = strlen(dir); k > 1 && dir[k - 1] == '/'; k--) dir[k - 1] = 0;
    snprintf(tmp, sizeof tmp, "%s.partial", dir);
    ct_remove_tree(tmp);
    read_source src = {specs, r};
    int rc = ct_mkdirs(tmp, err);
    if (!rc) rc = model_write_weights(specs, n, tmp, max_shard, f, read_fill, &src, "quantize", nfiles, err);
    if (!rc) rc = copy_side_files(model, tmp, err);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    if (!rc) rc = ct_write_file_atomic(path, config, config_len, err);
    if (!rc && rmdir(dir) != 0 && errno != ENOENT)
        rc = CT_FAIL_RUNTIME(err, "%s: cannot replace the empty folder (%s)", dir, strerror(errno));
    if (!rc && rename(tmp, dir) != 0)
        rc = CT_FAIL_RUNTIME(err, "%s: cannot rename to %s (%s)", tmp, dir, strerror(errno));
    if (rc) ct_remove_tree(tmp);
    return rc;
}

int cmd_quantize(int argc, char **argv, ct_error *err)
{
    const char *model = NULL, *out = NULL, *type_s = "nf4", *bs_s = NULL, *max_shard_s = NULL;
    bool no_dq = false;
    const cli_opt opts[] = {
        {"--model", "DIR", "the bf16 model folder (config.json + safetensors)", .str = &model, .required = true},
        {"--out", "DIR", "the quantized model folder to write (new or empty)", .str = &out, .required = true},
        {"--type", "nf4|fp4|fp8", "the 4-bit code book (default nf4), or fp8: E4M3 in 128x128 blocks",
         .str = &type_s},
        {"--blocksize", "N", "elements per scale, a power of two in 32..4096 (default 64)", .str = &bs_s},
        {"--no-double-quant", NULL, "keep the scales in fp32 (default: 8-bit, as QLoRA)", .flag = &no_dq},
        {"--max-shard-bytes", "N", "largest safetensors file before sharding (default 5000000000)",
         .str = &max_shard_s},
        {0}};
    const cli_cmd cmd = {"quantize", "quantize --model DIR --out DIR [--type nf4|fp4|fp8] [--blocksize 64] "
                                     "[--no-double-quant]", opts};
    int rc = cli_parse(&cmd, argc, argv, NULL, err);
    if (rc) return rc;
    model_write_format f = {.form = strcmp(type_s, "fp8") ? MODEL_WRITE_4BIT : MODEL_WRITE_FP8};
    bool fp8 = f.form == MODEL_WRITE_FP8;
    if (fp8 && (bs_s || no_dq))
        return CT_FAIL_INPUT(err, "%s applies to nf4 and fp4, not --type fp8", bs_s ? "--blocksize" : "--no-double-quant");
    if (!fp8 && (rc = model_write_parse_quant("--type", type_s, bs_s, no_dq, &f.quant4, err))) return rc;
    const quant4_write_opts q = f.quant4;
    long long max_shard = (long long)DEFAULT_MAX_SHARD_BYTES;
    if (max_shard_s && (rc = cli_parse_ll("--max-shard-bytes", max_shard_s, 1, 1LL << 50, &max_shard, err))) return rc;
    if (!*out || strlen(out) >= CT_PATH_MAX) return CT_FAIL_INPUT(err, "--out: an empty or over-long folder name");
    if ((rc = cli_check_model_dir(model, err))) return rc;

    char config_path[CT_PATH_MAX + 64];
    snprintf(config_path, sizeof config_path, "%s/config.json", model);
    size_t len = 0, qlen = 0;
    char *text = ct_read_file(config_path, &len, err), *qtext = NULL;
    if (!text) return err->code;
    ct_model_config mc;
    rc = model_config_parse(&mc, text, len, config_path, err);
    if (!rc && !(qtext = fp8 ? fp8_config_text(text, len, config_path, &qlen, err)
                             : quant4_config_text(text, len, config_path, &q, &qlen, err)))
        rc = err->code;
    st_reader *r = rc ? NULL : st_open(model, err);
    if (!rc && !r) rc = err->code;
    if (!rc) rc = check_not_quantized(r, model, err);
    if (!rc) rc = model_check_weights(&mc, r, err);
    if (!rc) rc = cli_check_new_dir(out, "quantize", err);

    size_t n = 0, nfiles = 0, n4 = 0;
    ct_tensor_spec *specs = rc ? NULL : model_tensor_specs(&mc, &n);
    double t0 = ct_now();
    if (!rc) rc = write_folder(model, out, specs, n, r, &f, (size_t)max_shard, qtext, qlen, &nfiles, err);
    if (!rc) {
        for (size_t i = 0; i < n; i++) n4 += model_write_quantizes(&specs[i], &f);
        char how[64];
        if (fp8) snprintf(how, sizeof how, "in FP8 (E4M3, 128x128 blocks)");
        else snprintf(how, sizeof how, "in 4 bits (%s, blocksize %zu%s)", quant4_type_name(q.type), q.blocksize,
                      q.double_quant ? ", double quant" : "");
        printf("quantize: %s: %zu of %zu tensors %s, %zu file%s, %.1f s\n", out, n4, n, how, nfiles,
               nfiles == 1 ? "" : "s", ct_now() - t0);
        if (st_count(r) > n)
            printf("quantize: left out %zu tensors the model does not use (HF's causal-LM class drops them too)\n",
                   st_count(r) - n);
    }
    free(specs);
    if (r) st_close(r);
    free(qtext);
    free(text);
    return rc;
}
