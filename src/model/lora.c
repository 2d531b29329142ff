/* lora.c — LoRA parameters, PEFT initialisation and the PEFT adapter format. */
#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapter.h"
#include "json.h"
#include "safetensors.h"

static size_t slot_index(int layer, ct_module mod) { return (size_t)layer * CT_MOD_COUNT + mod; }

static bool target_named(const ct_lora_config *cfg, ct_module mod)
{
    for (int i = 0; i < cfg->n_target_modules; i++)
        if (!strcmp(cfg->target_modules[i], model_module_name(mod))) return true;
    return false;
}

static bool any_sparse(const ct_model_config *c)
{
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (c->layer_sparse[l]) return true;
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
    lo->arch = c->arch;
    for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
        /* all-linear lists the seven projections every family has; it also takes
         * a GDN hybrid's linear_attn projections (PEFT's all-linear does), and
         * those are targeted only in a model that has them. */
        lo->targeted[mod] = target_named(cfg, mod) || (cfg->target_all_linear && mod >= CT_MOD_IN_QKV);
        if (mod >= CT_MOD_IN_QKV && !c->gdn) lo->targeted[mod] = false;
        /* shared_expert_gate: the MoE hybrids' (PEFT's all-linear takes it: an nn.Linear) */
        if (mod == CT_MOD_SH_GATE && c->arch != CT_ARCH_QWEN3_5_MOE && c->arch != CT_ARCH_QWEN3_NEXT)
            lo->targeted[mod] = false;
        /* a GDN hybrid has either the grouped in_proj_qkvz / in_proj_ba or the four contiguous ones */
        bool grouped_mod = mod == CT_MOD_IN_QKVZ || mod == CT_MOD_IN_BA;
        if (c->gdn && mod >= CT_MOD_IN_QKV && mod < CT_MOD_OUT && grouped_mod != c->gdn_grouped_proj &&
            lo->targeted[mod]) {
            lo->targeted[mod] = false;
            if (!cfg->target_all_linear)
                return CT_FAIL_INPUT(err, "lora.target_modules: %s: model_type %s has no such projection (its "
                                     "linear_attn has %s)", model_module_name(mod), c->model_type,
                                     c->gdn_grouped_proj ? "in_proj_qkvz, in_proj_ba and out_proj"
                                                         : "in_proj_qkv, in_proj_z, in_proj_b, in_proj_a and out_proj");
        }
        model_module_shape(c, mod, &lo->in[mod], &lo->out[mod]);
    }
    if (c->arch == CT_ARCH_GPT_OSS && any_sparse(c) && lo->targeted[CT_MOD_GATE] != lo->targeted[CT_MOD_UP])
        return CT_FAIL_INPUT(err, "lora.target_modules: gpt_oss fuses each expert's gate and up projections into "
                             "one gate_up_proj; target both gate_proj and up_proj, or neither");
    lo->slots = ct_calloc((size_t)lo->n_layers * CT_MOD_COUNT, sizeof *lo->slots);
    size_t n = 0;
    for (int l = 0; l < lo->n_layers; l++)
        for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
            ct_lora_slot *s = &lo->slots[slot_index(l, mod)];
            s->experts = model_module_layer_shape(c, l, mod, &s->in, &s->out);
            if (!lo->targeted[mod]) s->experts = 0;
            s->offset = s->experts ? n : SIZE_MAX;
            n += (size_t)s->experts * lo->R * ((size_t)s->in + (size_t)s->out);
        }
    if (n == 0) {
        lora_free(lo, be);
        return CT_FAIL_INPUT(err, "lora.target_modules selects no projection of this model");
    }
    bool experts_adapted = false;
    for (int l = 0; l < c->num_hidden_layers; l++)
        experts_adapted |= c->layer_sparse[l] && c->arch != CT_ARCH_QWEN3_5_MOE &&
                           (lo->targeted[CT_MOD_GATE] || lo->targeted[CT_MOD_UP] || lo->targeted[CT_MOD_DOWN]);
    if (experts_adapted && be->max_expert_lora_rank > 0 && lo->R > be->max_expert_lora_rank) {
        int R = lo->R;
        lora_free(lo, be);
        return CT_FAIL_INPUT(err, "lora.r %d: the %s backend's expert LoRA kernels cover r <= %d (lower lora.r, "
                             "or leave gate_proj/up_proj/down_proj out of lora.target_modules)", R, be->name,
                             be->max_expert_lora_rank);
    }
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

    /* A drawn in (layer, module, expert) order from one stream: reproducible for a seed. */
    float *host = ct_calloc(n, sizeof(float));
    ct_rng rng;
    ct_rng_seed(&rng, seed);
    bool gaussian = !strcmp(cfg->init_lora_weights, "gaussian");
    for (size_t i = 0; i < (size_t)lo->n_layers * CT_MOD_COUNT; i++) {
        const ct_lora_slot *s = &lo->slots[i];
        if (!s->experts) continue;
        float *A = host + s->offset;
        size_t nA = (size_t)s->experts * lo->R * s->in;
        double bound = 1.0 / sqrt((double)s->in);
        for (size_t j = 0; j < nA; j++)
            A[j] = gaussian ? ct_rng_normal(&rng) / (float)lo->R : (float)((2.0 * ct_rng_uniform(&rng) - 1.0) * bound);
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
    free(lo->slots);
    memset(lo, 0, sizeof *lo);
}

const ct_lora_slot *lora_slot(const ct_lora *lo, int layer, ct_module mod)
{
    return &lo->slots[slot_index(layer, mod)];
}

static float *at(const ct_lora *lo, float *base, int layer, ct_module mod, bool is_B)
{
    const ct_lora_slot *s = lora_slot(lo, layer, mod);
    if (!s->experts || !base) return NULL; /* untargeted, or no gradients allocated */
    return base + s->offset + (is_B ? (size_t)s->experts * lo->R * s->in : 0);
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

/* Mixtral's expert projections: w1 = gate, w3 = up, w2 = down. */
static const char *expert_module_name(ct_arch arch, ct_module mod)
{
    if (arch != CT_ARCH_MIXTRAL) return model_module_name(mod);
    return mod == CT_MOD_GATE ? "w1" : mod == CT_MOD_UP ? "w3" : "w2";
}

void lora_expert_tensor_name(char *out, size_t len, ct_arch arch, int layer, int expert, ct_module mod, bool is_B)
{
    snprintf(out, len, "base_model.model.model.layers.%d.%s.experts.%d.%s.lora_%c.weight", layer,
             arch == CT_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp", expert, expert_module_name(arch, mod),
             is_B ? 'B' : 'A');
}

/* One tensor of the adapter file and where its values live in params. */
typedef struct peft_tensor {
    char name[256];
    int64_t shape[2];
    size_t offset;     /* of its first value in params */
    int fused_B_E;     /* > 0: a gpt_oss fused lora_B [out, R*E] whose column j*E + e is
                        * column j of expert e's B (stored (E, out, R) in params) */
    ct_module rows_of; /* a lora_B whose rows PEFT orders as HF's weight and params as the
                        * fused weight (CT_MOD_COUNT: the same order): gated attention's
                        * q_proj, qwen3_next's in_proj_qkvz and in_proj_ba (peft_row) */
} peft_tensor;

/* Row of params (the fused weight's order) that holds PEFT's row r of module
 * mod's lora_B (HF's order): gated q_proj's interleaved query/gate rows,
 * qwen3_next's rows grouped by key head (model.h). */
static int peft_row(const ct_model_config *c, ct_module mod, int r)
{
    switch (mod) {
    case CT_MOD_Q:       return model_q_row(r, c->head_dim, c->num_attention_heads * c->head_dim);
    case CT_MOD_IN_QKVZ: return model_gdn_qkvz_row(c, r);
    case CT_MOD_IN_BA:   return model_gdn_ba_row(c, r);
    default:             return r;
    }
}

/* Every tensor of the adapter in file order (layer, module, expert, A then B).
 * Returns the count; *out is malloc'd. */
static size_t peft_tensors(const ct_lora *lo, const ct_model_config *c, peft_tensor **out)
{
    size_t cap = 64, n = 0;
    peft_tensor *v = ct_malloc(cap * sizeof *v);
    int R = lo->R;
    for (int l = 0; l < lo->n_layers; l++)
        for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
            const ct_lora_slot *s = lora_slot(lo, l, mod);
            if (!s->experts) continue;
            bool experts = c->layer_sparse[l] && model_module_is_mlp(mod) && c->arch != CT_ARCH_QWEN3_5_MOE;
            bool fused = experts && c->arch == CT_ARCH_GPT_OSS;
            int count = experts && !fused ? s->experts : 1;
            size_t b0 = s->offset + (size_t)s->experts * R * s->in;
            for (int e = 0; e < count; e++)
                for (int is_B = 0; is_B < 2; is_B++) {
                    if (n + 1 > cap) v = ct_realloc(v, (cap *= 2) * sizeof *v);
                    peft_tensor *t = &v[n++];
                    memset(t, 0, sizeof *t);
                    t->rows_of = CT_MOD_COUNT;
                    if (fused) {
                        /* PEFT nests the gate_up wrapper inside the down one when both are targeted. */
                        bool inner = mod == CT_MOD_GATE && lo->targeted[CT_MOD_DOWN];
                        snprintf(t->name, sizeof t->name, "base_model.model.model.layers.%d.mlp.experts.%slora_%c.weight",
                                 l, inner ? "base_layer." : "", is_B ? 'B' : 'A');
                        t->shape[0] = is_B ? s->out : (int64_t)R * s->experts;
                        t->shape[1] = is_B ? (int64_t)R * s->experts : s->in;
                        t->offset = is_B ? b0 : s->offset;
                        t->fused_B_E = is_B ? s->experts : 0;
                    } else {
                        if (experts) lora_expert_tensor_name(t->name, sizeof t->name, c->arch, l, e, mod, is_B);
                        else {
                            char path[64];
                            model_module_path(path, sizeof path, c->arch, mod);
                            snprintf(t->name, sizeof t->name, "base_model.model.model.layers.%d.%s.lora_%c.weight", l,
                                     path, is_B ? 'B' : 'A');
                        }
                        t->shape[0] = is_B ? s->out : R;
                        t->shape[1] = is_B ? R : s->in;
                        t->offset = is_B ? b0 + (size_t)e * s->out * R : s->offset + (size_t)e * R * s->in;
                        bool permuted = (mod == CT_MOD_Q && model_attn_gated(c)) || mod == CT_MOD_IN_QKVZ ||
                                        mod == CT_MOD_IN_BA;
                        if (is_B && permuted) t->rows_of = (ct_module)mod;
                    }
                }
        }
    *out = v;
    return n;
}

/* Between params and PEFT's lora_B of module mod (out rows, R columns), rows
 * mapped by peft_row. */
static void permuted_B_copy(float *peft, float *mine, const ct_model_config *c, ct_module mod, int out, int R,
                            bool to_peft)
{
    for (int r = 0; r < out; r++) {
        float *a = peft + (size_t)r * R, *b = mine + (size_t)peft_row(c, mod, r) * R;
        memcpy(to_peft ? a : b, to_peft ? b : a, (size_t)R * sizeof(float));
    }
}

/* Between params (E, out, R) and PEFT's fused [out, R*E] (column j*E + e). */
static void fused_B_copy(float *peft, float *mine, int E, int out, int R, bool to_peft)
{
    for (int e = 0; e < E; e++)
        for (int o = 0; o < out; o++)
            for (int j = 0; j < R; j++) {
                float *a = &peft[(size_t)o * R * E + (size_t)j * E + e], *b = &mine[((size_t)e * out + o) * R + j];
                if (to_peft) *a = *b; else *b = *a;
            }
}

int lora_save_peft(const ct_lora *lo, const ct_model *m, const char *dir, const char *base_model, ct_error *err)
{
    ct_backend *be = m->be;
    int rc = ct_mkdirs(dir, err);
    if (rc) return rc;
    float *host = ct_malloc(lo->n_params * sizeof(float));
    be->download(be, host, lo->params, lo->n_params * sizeof(float));
    st_writer *sw = st_writer_new();
    char path[CT_PATH_MAX + 64];
    peft_tensor *ts;
    size_t nt = peft_tensors(lo, &m->cfg, &ts);
    for (size_t i = 0; i < nt && !rc; i++) {
        const peft_tensor *t = &ts[i];
        float *data = host + t->offset, *fused = NULL;
        if (t->fused_B_E) {
            fused = ct_malloc((size_t)t->shape[0] * t->shape[1] * sizeof(float));
            fused_B_copy(fused, data, t->fused_B_E, (int)t->shape[0], lo->R, true);
            data = fused;
        } else if (t->rows_of != CT_MOD_COUNT) {
            fused = ct_malloc((size_t)t->shape[0] * t->shape[1] * sizeof(float));
            permuted_B_copy(fused, data, &m->cfg, t->rows_of, (int)t->shape[0], lo->R, true);
            data = fused;
        }
        rc = st_writer_add(sw, t->name, CT_DTYPE_F32, 2, t->shape, data, err);
        free(fused);
    }
    free(ts);
    free(host);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (!rc) rc = st_writer_save(sw, path, err);
    st_writer_free(sw);
    if (rc) return rc;
    json_writer w;
    json_writer_init(&w);
    adapter_write_config(lo, &m->cfg, base_model, &w);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    rc = ct_write_file_atomic(path, w.buf, w.len, err);
    json_writer_free(&w);
    return rc;
}

int lora_load_peft(ct_lora *lo, const ct_model *m, const char *dir, ct_error *err)
{
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_reader *r = st_open(path, err);
    if (!r) return err->code;
    float *host = ct_calloc(lo->n_params, sizeof(float));
    peft_tensor *ts;
    size_t nt = peft_tensors(lo, &m->cfg, &ts);
    int rc = CT_OK;
    for (size_t i = 0; i < nt && !rc; i++) {
        const peft_tensor *want = &ts[i];
        const st_tensor *t;
        rc = st_expect(r, want->name, CT_DTYPE_F32, 2, want->shape, &t, err);
        if (rc) break;
        if (want->fused_B_E) {
            float *fused = ct_malloc(t->nbytes);
            memcpy(fused, t->data, t->nbytes);
            fused_B_copy(fused, host + want->offset, want->fused_B_E, (int)want->shape[0], lo->R, false);
            free(fused);
        } else if (want->rows_of != CT_MOD_COUNT) {
            float *peft = ct_malloc(t->nbytes);
            memcpy(peft, t->data, t->nbytes);
            permuted_B_copy(peft, host + want->offset, &m->cfg, want->rows_of, (int)want->shape[0], lo->R, false);
            free(peft);
        } else {
            memcpy(host + want->offset, t->data, t->nbytes);
        }
    }
    if (!rc && st_count(r) != nt)
        rc = CT_FAIL_INPUT(err, "%s: holds %zu tensors, but the configured targets need %zu "
                           "(check lora.r and lora.target_modules)", path, st_count(r), nt);
    free(ts);
    st_close(r);
    if (!rc) m->be->upload(m->be, lo->params, host, lo->n_params * sizeof(float));
    free(host);
    return rc;
}
