/* lora.c — LoRA parameters, PEFT initialisation and the PEFT adapter format. */
#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "safetensors.h"

static size_t slot(int layer, ct_module mod) { return (size_t)layer * CT_MOD_COUNT + mod; }

static size_t module_params(const ct_model_config *c, ct_module mod, int R)
{
    int in, out;
    model_module_shape(c, mod, &in, &out);
    return (size_t)R * ((size_t)in + (size_t)out);
}

static bool target_named(const ct_lora_config *cfg, ct_module mod)
{
    for (int i = 0; i < cfg->n_target_modules; i++)
        if (!strcmp(cfg->target_modules[i], model_module_name(mod))) return true;
    return false;
}

int lora_init(ct_lora *lo, const ct_model *m, const ct_lora_config *cfg, uint64_t seed, ct_error *err)
{
    ct_backend *be = m->be;
    const ct_model_config *c = &m->cfg;
    memset(lo, 0, sizeof *lo);
    lo->cfg = *cfg;
    lo->R = cfg->r;
    lo->scale = (float)config_lora_scaling(cfg);
    lo->dropout = (float)cfg->lora_dropout;
    lo->n_layers = c->num_hidden_layers;
    for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
        lo->targeted[mod] = target_named(cfg, mod);
        model_module_shape(c, mod, &lo->in[mod], &lo->out[mod]);
    }
    lo->offset = ct_malloc(sizeof(size_t) * (size_t)lo->n_layers * CT_MOD_COUNT);
    size_t n = 0;
    for (int l = 0; l < lo->n_layers; l++)
        for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
            lo->offset[slot(l, mod)] = lo->targeted[mod] ? n : SIZE_MAX;
            if (lo->targeted[mod]) n += module_params(c, mod, lo->R);
        }
    if (n == 0) return CT_FAIL_INPUT(err, "lora.target_modules selects no projection of this model");
    lo->n_params = n;
    size_t bytes = n * sizeof(float);
    lo->params = be->alloc(be, bytes);
    lo->grads = be->alloc(be, bytes);
    lo->m = be->alloc(be, bytes);
    lo->v = be->alloc(be, bytes);
    if (!lo->params || !lo->grads || !lo->m || !lo->v) {
        lora_free(lo, be);
        return CT_FAIL_RUNTIME(err, "out of %s memory for %zu LoRA parameters", be->name, n);
    }

    /* A drawn in (layer, module) order from one stream: reproducible for a seed. */
    float *host = ct_calloc(n, sizeof(float));
    ct_rng rng;
    ct_rng_seed(&rng, seed);
    bool gaussian = !strcmp(cfg->init_lora_weights, "gaussian");
    for (int l = 0; l < lo->n_layers; l++)
        for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
            if (!lo->targeted[mod]) continue;
            int in, out;
            model_module_shape(c, mod, &in, &out);
            float *A = host + lo->offset[slot(l, mod)];
            size_t nA = (size_t)lo->R * in;
            double bound = 1.0 / sqrt((double)in);
            for (size_t i = 0; i < nA; i++)
                A[i] = gaussian ? ct_rng_normal(&rng) / (float)lo->R
                                : (float)((2.0 * ct_rng_uniform(&rng) - 1.0) * bound);
        }
    be->upload(be, lo->params, host, bytes);
    free(host);
    return CT_OK;
}

void lora_free(ct_lora *lo, ct_backend *be)
{
    if (lo->params) be->free(be, lo->params);
    if (lo->grads) be->free(be, lo->grads);
    if (lo->m) be->free(be, lo->m);
    if (lo->v) be->free(be, lo->v);
    free(lo->offset);
    memset(lo, 0, sizeof *lo);
}

static float *at(const ct_lora *lo, float *base, int layer, ct_module mod, bool is_B)
{
    size_t off = lo->offset[slot(layer, mod)];
    if (off == SIZE_MAX) return NULL;
    return base + off + (is_B ? (size_t)lo->R * lo->in[mod] : 0);
}

float *lora_A(const ct_lora *lo, int layer, ct_module mod) { return at(lo, lo->params, layer, mod, false); }
float *lora_B(const ct_lora *lo, int layer, ct_module mod) { return at(lo, lo->params, layer, mod, true); }
float *lora_grad_A(const ct_lora *lo, int layer, ct_module mod) { return at(lo, lo->grads, layer, mod, false); }
float *lora_grad_B(const ct_lora *lo, int layer, ct_module mod) { return at(lo, lo->grads, layer, mod, true); }

void lora_tensor_name(char *out, size_t len, int layer, ct_module mod, bool is_B)
{
    snprintf(out, len, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", layer, model_module_parent(mod),
             model_module_name(mod), is_B ? 'B' : 'A');
}

static void write_config_json(const ct_lora *lo, const char *base_model, json_writer *w)
{
    /* PEFT writes sorted keys with indent 2; we do the same so diffs stay readable. */
    json_write_raw(w, "{\n  \"alpha_pattern\": {},\n  \"auto_mapping\": null,\n  \"base_model_name_or_path\": ");
    json_write_string(w, base_model);
    json_write_raw(w, ",\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  \"inference_mode\": true,\n"
                      "  \"init_lora_weights\": ");
    json_write_raw(w, strcmp(lo->cfg.init_lora_weights, "gaussian") ? "true" : "\"gaussian\"");
    json_write_raw(w, ",\n  \"layers_pattern\": null,\n  \"layers_to_transform\": null,\n  \"lora_alpha\": ");
    json_write_number(w, lo->cfg.lora_alpha);
    json_write_raw(w, ",\n  \"lora_dropout\": ");
    json_write_number(w, lo->cfg.lora_dropout);
    json_write_raw(w, ",\n  \"modules_to_save\": null,\n  \"peft_type\": \"LORA\",\n  \"r\": ");
    json_write_rawf(w, "%d", lo->R);
    json_write_raw(w, ",\n  \"rank_pattern\": {},\n  \"revision\": null,\n  \"target_modules\": [");
    bool first = true;
    for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
        if (!lo->targeted[mod]) continue;
        json_write_raw(w, first ? "\n    " : ",\n    ");
        json_write_string(w, model_module_name(mod));
        first = false;
    }
    json_write_raw(w, "\n  ],\n  \"task_type\": \"CAUSAL_LM\",\n  \"use_dora\": false,\n  \"use_rslora\": ");
    json_write_raw(w, lo->cfg.use_rslora ? "true" : "false");
    json_write_raw(w, "\n}\n");
}

int lora_save_peft(const ct_lora *lo, const ct_model *m, const char *dir, const char *base_model, ct_error *err)
{
    ct_backend *be = m->be;
    int rc = ct_mkdirs(dir, err);
    if (rc) return rc;
    float *host = ct_malloc(lo->n_params * sizeof(float));
    be->download(be, host, lo->params, lo->n_params * sizeof(float));
    st_writer *sw = st_writer_new();
    char name[256], path[CT_PATH_MAX + 64];
    for (int l = 0; l < lo->n_layers && !rc; l++)
        for (int mod = 0; mod < CT_MOD_COUNT && !rc; mod++) {
            if (!lo->targeted[mod]) continue;
            const float *A = host + lo->offset[slot(l, mod)];
            const float *B = A + (size_t)lo->R * lo->in[mod];
            int64_t shape_a[2] = {lo->R, lo->in[mod]}, shape_b[2] = {lo->out[mod], lo->R};
            lora_tensor_name(name, sizeof name, l, mod, false);
            rc = st_writer_add(sw, name, CT_DTYPE_F32, 2, shape_a, A, err);
            lora_tensor_name(name, sizeof name, l, mod, true);
            if (!rc) rc = st_writer_add(sw, name, CT_DTYPE_F32, 2, shape_b, B, err);
        }
    free(host);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (!rc) rc = st_writer_save(sw, path, err);
    st_writer_free(sw);
    if (rc) return rc;
    json_writer w;
    json_writer_init(&w);
    write_config_json(lo, base_model, &w);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    rc = ct_write_file_atomic(path, w.buf, w.len, err);
    json_writer_free(&w);
    return rc;
}

int lora_load_peft(ct_lora *lo, const ct_model *m, const char *dir, ct_error *err)
{
    char path[CT_PATH_MAX + 64], name[256];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_reader *r = st_open(path, err);
    if (!r) return err->code;
    float *host = ct_calloc(lo->n_params, sizeof(float));
    int rc = CT_OK;
    for (int l = 0; l < lo->n_layers && !rc; l++)
        for (int mod = 0; mod < CT_MOD_COUNT && !rc; mod++) {
            if (!lo->targeted[mod]) continue;
            float *A = host + lo->offset[slot(l, mod)];
            float *B = A + (size_t)lo->R * lo->in[mod];
            for (int is_B = 0; is_B < 2 && !rc; is_B++) {
                int64_t shape[2] = {is_B ? lo->out[mod] : lo->R, is_B ? lo->R : lo->in[mod]};
                const st_tensor *t;
                lora_tensor_name(name, sizeof name, l, mod, is_B);
                rc = st_expect(r, name, CT_DTYPE_F32, 2, shape, &t, err);
                if (!rc) memcpy(is_B ? B : A, t->data, t->nbytes);
            }
        }
    if (!rc && st_count(r) != 2 * (size_t)lo->n_layers * (size_t)(lo->targeted[0] + lo->targeted[1] +
                                  lo->targeted[2] + lo->targeted[3] + lo->targeted[4] + lo->targeted[5] + lo->targeted[6]))
        rc = CT_FAIL_INPUT(err, "%s: holds %zu tensors, but the configured targets need a different set "
                           "(check lora.r and lora.target_modules)", path, st_count(r));
    st_close(r);
    if (!rc) m->be->upload(m->be, lo->params, host, lo->n_params * sizeof(float));
    free(host);
    return rc;
}
