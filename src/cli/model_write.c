/* model_write.c — see model_write.h. The shard plan needs each tensor's size
 * before it is written: bf16 bytes, or quant4_write_bytes for a 4-bit weight
 * (an estimate of its JSON blob, so the plan depends on the shapes only and
 * `init --quantize` and `quantize` shard alike). total_size in the index is
 * the bytes actually written. */
#include "model_write.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json.h"
#include "fp8.h"
#include "mxfp4.h"

int model_write_parse_quant(const char *flag, const char *type, const char *blocksize, bool no_double_quant,
                            quant4_write_opts *o, ct_error *err)
{
    *o = quant4_write_defaults();
    if (!quant4_type_from_name(type, &o->type))
        return CT_FAIL_INPUT(err, "%s '%s': expected nf4, fp4 or fp8 (init also takes mxfp4)", flag, type);
    if (blocksize) {
        long long bs;
        if (cli_parse_ll("--blocksize", blocksize, 32, 4096, &bs, err) || !quant4_blocksize_valid((size_t)bs))
            return CT_FAIL_INPUT(err, "--blocksize '%s': expected a power of two from 32 to 4096", blocksize);
        o->blocksize = (size_t)bs;
    }
    o->double_quant = !no_double_quant;
    return CT_OK;
}

static bool quantized(const ct_tensor_spec *t, const model_write_format *f)
{
    return f->form == MODEL_WRITE_4BIT && quant4_should_quantize(t);
}

/* A gpt_oss expert parameter the Hub's checkpoints store in MXFP4. */
static bool mx_expert(const ct_tensor_spec *t, const model_write_format *f)
{
    return f->form == MODEL_WRITE_MXFP4 && t->kind == CT_TENSOR_LINEAR && t->expert && t->ndim == 3;
}

/* What base_precision fp8 quantizes on load: the nn.Linear weights and the
 * per-expert (2-D) routed experts. */
static bool fp8_weight(const ct_tensor_spec *t, const model_write_format *f)
{
    return f->form == MODEL_WRITE_FP8 && t->ndim == 2 &&
           (quant4_should_quantize(t) || (t->kind == CT_TENSOR_LINEAR && t->expert));
}

bool model_write_quantizes(const ct_tensor_spec *t, const model_write_format *f)
{
    return quantized(t, f) || mx_expert(t, f) || fp8_weight(t, f);
}

static size_t planned_bytes(const ct_tensor_spec *t, const model_write_format *f)
{
    size_t n = model_tensor_numel(t);
    if (fp8_weight(t, f)) return n + fp8_blocks((size_t)t->shape[0]) * fp8_blocks((size_t)t->shape[1]) * sizeof(float);
    return mx_expert(t, f) ? n / 2 + n / MXFP4_BLOCK
           : quantized(t, f) ? quant4_write_bytes(n, &f->quant4) : n * sizeof(uint16_t);
}

#define TRANSPOSE_TILE 64

/* An expert parameter [E, in, out] (bf16) as MXFP4 of its (E, out, in) transpose.
 * The transpose goes by 64 x 64 tiles: element by element, every read of a
 * column would be a cache miss (out is 5760 wide for gpt-oss-20b). */
static int add_mxfp4(st_writer *sw, const ct_tensor_spec *t, const uint16_t *bf16, size_t *total, ct_error *err)
{
    size_t E = (size_t)t->shape[0], in = (size_t)t->shape[1], out = (size_t)t->shape[2], n = E * in * out;
    size_t ti = ct_ceil_div(in, TRANSPOSE_TILE), to = ct_ceil_div(out, TRANSPOSE_TILE);
    float *x = ct_malloc(n * sizeof *x);
    #pragma omp parallel for schedule(static)
    for (size_t tile = 0; tile < E * ti * to; tile++) {
        size_t e = tile / (ti * to), i0 = tile / to % ti * TRANSPOSE_TILE, o0 = tile % to * TRANSPOSE_TILE;
        size_t i1 = i0 + TRANSPOSE_TILE < in ? i0 + TRANSPOSE_TILE : in;
        size_t o1 = o0 + TRANSPOSE_TILE < out ? o0 + TRANSPOSE_TILE : out;
        for (size_t o = o0; o < o1; o++)
            for (size_t i = i0; i < i1; i++) x[(e * out + o) * in + i] = ct_bf16_to_f32(bf16[(e * in + i) * out + o]);
    }
    int rc = mxfp4_write_experts(sw, t->name, x, (int64_t)E, (int64_t)out, (int64_t)in, err);
    free(x);
    if (rc == CT_OK) *total += n / 2 + n / MXFP4_BLOCK;
    return rc;
}

/* Fills and adds specs[first..end) to one file at path. */
static int write_shard(const ct_tensor_spec *specs, size_t first, size_t end, const char *path,
                       const model_write_format *f, model_fill_fn fill, void *ctx, size_t *total, ct_error *err)
{
    st_writer *sw = st_writer_new();
    int rc = CT_OK;
    for (size_t i = first; i < end && rc == CT_OK; i++) {
        const ct_tensor_spec *t = &specs[i];
        size_t n = model_tensor_numel(t);
        uint16_t *bf16 = ct_malloc(n * sizeof *bf16 + 2);
        rc = fill(ctx, i, bf16, err);
        if (rc == CT_OK && mx_expert(t, f)) {
            rc = add_mxfp4(sw, t, bf16, total, err);
        } else if (rc == CT_OK && (quantized(t, f) || fp8_weight(t, f))) {
            float *x = ct_malloc(n * sizeof *x);
            #pragma omp parallel for schedule(static)
            for (size_t k = 0; k < n; k++) x[k] = ct_bf16_to_f32(bf16[k]);
            free(bf16);
            bf16 = NULL;
            if (fp8_weight(t, f)) {
                rc = fp8_write_weight(sw, t->name, x, t->shape[0], t->shape[1], err);
                if (rc == CT_OK) *total += planned_bytes(t, f);
            } else {
                rc = quant4_write_add(sw, t->name, x, t->ndim, t->shape, &f->quant4, total, err);
            }
            free(x);
        } else if (rc == CT_OK) {
            rc = st_writer_add(sw, t->name, CT_DTYPE_BF16, t->ndim, t->shape, bf16, err);
            *total += n * sizeof *bf16;
        }
        free(bf16);
    }
    if (rc == CT_OK) rc = st_writer_save(sw, path, err);
    st_writer_free(sw);
    return rc;
}

static void index_entry(json_writer *idx, const char *key, const char *file)
{
    json_write_raw(idx, idx->buf[idx->len - 1] == '{' ? "\n" : ",\n");
    json_write_string(idx, key);
    json_write_raw(idx, ":");
    json_write_string(idx, file);
}

int model_write_weights(const ct_tensor_spec *specs, size_t n, const char *dir, size_t max_shard,
                        const model_write_format *f, model_fill_fn fill, void *ctx, const char *who, size_t *nfiles,
                        ct_error *err)
{
    /* Greedy in spec order: a shard closes when the next tensor would overflow
     * it; a tensor larger than the limit gets a shard of its own. */
    size_t *shard_of = ct_malloc((n + 1) * sizeof *shard_of);
    size_t nshards = 0, cur = 0;
    for (size_t i = 0; i < n; i++) {
        size_t bytes = planned_bytes(&specs[i], f);
        if (nshards == 0 || (cur > 0 && cur + bytes > max_shard)) { nshards++; cur = 0; }
        cur += bytes;
        shard_of[i] = nshards - 1;
    }
    *nfiles = nshards;
    json_writer map;
    json_writer_init(&map);
    json_write_raw(&map, "{");
    int rc = CT_OK;
    size_t total = 0;
    char name[64];
    for (size_t s = 0, i = 0; s < nshards && rc == CT_OK; s++) {
        size_t first = i;
        while (i < n && shard_of[i] == s) i++;
        if (nshards == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, nshards);
        for (size_t k = first; k < i; k++) {
            if (fp8_weight(&specs[k], f)) {
                char key[sizeof specs[k].name + 16];
                index_entry(&map, specs[k].name, name);
                snprintf(key, sizeof key, "%s_scale_inv", specs[k].name);
                index_entry(&map, key, name);
                continue;
            }
            if (mx_expert(&specs[k], f)) {
                char key[sizeof specs[k].name + 16];
                snprintf(key, sizeof key, "%s_blocks", specs[k].name);
                index_entry(&map, key, name);
                snprintf(key, sizeof key, "%s_scales", specs[k].name);
                index_entry(&map, key, name);
                continue;
            }
            if (!quantized(&specs[k], f)) {
                index_entry(&map, specs[k].name, name);
                continue;
            }
            for (const char *const *suffix = quant4_write_suffixes(&f->quant4); *suffix; suffix++) {
                char key[sizeof specs[k].name + 64];
                snprintf(key, sizeof key, "%s%s", specs[k].name, *suffix);
                index_entry(&map, key, name);
            }
        }
        size_t plen = strlen(dir) + sizeof name + 2;
        char *path = ct_malloc(plen);
        snprintf(path, plen, "%s/%s", dir, name);
        rc = write_shard(specs, first, i, path, f, fill, ctx, &total, err);
        if (rc == CT_OK && nshards > 1) fprintf(stderr, "%s: wrote %s\n", who, path);
        free(path);
    }
    if (rc == CT_OK && nshards > 1) {
        json_writer idx;
        json_writer_init(&idx);
        json_write_rawf(&idx, "{\"metadata\":{\"total_size\":%zu},\"weight_map\":%s\n}}\n", total, map.buf);
        size_t plen = strlen(dir) + 64;
        char *path = ct_malloc(plen);
        snprintf(path, plen, "%s/model.safetensors.index.json", dir);
        rc = ct_write_file_atomic(path, idx.buf, idx.len, err);
        free(path);
        json_writer_free(&idx);
    }
    json_writer_free(&map);
    free(shard_of);
    return rc;
}
