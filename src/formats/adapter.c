/* adapter.c — see adapter.h.
 *
 * How PEFT 0.21 on transformers v5 reads target_modules (the reason for the
 * layout adapter_write_config picks): v5 fuses qwen3_moe's, qwen3_next's (which
 * transformers converts as qwen2_moe) and mixtral's experts into 3-D
 * parameters, and PEFT converts a v4-style adapter on load
 * (peft/utils/transformers_weight_conversion.py): every target_modules entry
 * naming gate_proj, up_proj or down_proj (w1/w3/w2) becomes a target_parameters
 * entry for the fused experts and leaves target_modules; a regex is first
 * resolved to the leaf names it matches, then converted the same way. A dense
 * layer's mlp.gate_proj of a qwen3_moe or qwen3_next model (mlp_only_layers,
 * decoder_sparse_step) is then adapted by nothing and its LoRA tensors are left
 * unloaded, with no error. So for such a model the dense MLP projections are
 * named as parameters ("mlp.gate_proj.weight", a 2-D parameter: PEFT's
 * ParamWrapper, lora_A [r, in] and lora_B [out, r], the same names and values as
 * a LoRA Linear), and target_modules is a regex that names the experts with
 * their index (transformers v4) or without (v5's probe) but never a dense
 * mlp.*_proj, which v4 would otherwise wrap twice and refuse. PEFT's
 * ParamWrapper refuses lora_dropout != 0, so an adapter whose targets become
 * parameters in v5 is written with lora_dropout 0: dropout is a training-time
 * setting (the run's config.yaml keeps it) and inference is the same. The
 * conversion gives the fused gate_up LoRA rank 2r and alpha 2 alpha, which
 * keeps alpha / r but not rsLoRA's alpha / sqrt(r) (sqrt(2) too large): there
 * an rsLoRA adapter is written as use_rslora false with lora_alpha
 * alpha * sqrt(r), the same scale for every reader. In qwen3_next that
 * conversion also takes the names from the shared expert: gate_proj, up_proj
 * and down_proj adapt the routed experts only (PEFT's all-linear there adapts
 * the experts, the router and shared_expert_gate, never the shared expert's
 * projections), so ctune reads them the same way. */
#include "adapter.h"

#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "json.h"

static const char *const projection_names[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                               "gate_proj", "up_proj", "down_proj",
                                               "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                                               "in_proj_qkvz", "in_proj_ba", "out_proj", "shared_expert_gate"};
#define N_PROJECTIONS 15

static int add_target(ct_lora_config *c, const char *name, const char *src, ct_error *err)
{
    name = config_canonical_module(name);
    bool known = false;
    for (int i = 0; i < N_PROJECTIONS; i++) known |= !strcmp(name, projection_names[i]);
    if (!known)
        return CT_FAIL_INPUT(err, "%s: target_modules: '%s' is not one of q_proj, k_proj, v_proj, o_proj, "
                             "gate_proj, up_proj, down_proj (or a Gated DeltaNet layer's in_proj_qkv, in_proj_z, in_proj_b, "
                             "in_proj_a, in_proj_qkvz, in_proj_ba, out_proj, or the MoE hybrids' shared_expert_gate; ctune "
                             "applies LoRA to those only)", src, name);
    for (int i = 0; i < c->n_target_modules; i++)
        if (!strcmp(c->target_modules[i], name)) return CT_OK;
    strcpy(c->target_modules[c->n_target_modules++], name);
    return CT_OK;
}

/* A key PEFT would honour but ctune cannot apply must be absent or hold its
 * neutral value (false, null, "none", {} or []). */
static int expect_neutral(const json_value *root, const char *key, const char *src, ct_error *err)
{
    const json_value *v = json_get(root, key);
    if (!v || v->type == JSON_NULL) return CT_OK;
    bool neutral = (v->type == JSON_BOOL && !v->boolean) || (v->type == JSON_STRING && !strcmp(v->string, "none")) ||
                   ((v->type == JSON_OBJECT || v->type == JSON_ARRAY) && v->count == 0);
    if (!neutral) return CT_FAIL_INPUT(err, "%s: '%s' is set; ctune cannot apply it (plain LoRA only)", src, key);
    return CT_OK;
}

/* Whether the regex re matches projection p of layer l at its home h: 0
 * attention, 1 a dense MLP (and the MoE hybrids' shared_expert_gate), 2
 * qwen3_moe's experts, 3 mixtral's experts, 4 a Gated DeltaNet layer
 * (linear_attn), 5 qwen3_5_moe's shared expert. */
static bool pattern_matches(const regex_t *re, int h, int l, int p)
{
    static const char *const mixtral_names[] = {"w1", "w3", "w2"};
    char name[160];
    if (h == 0) snprintf(name, sizeof name, "model.layers.%d.self_attn.%s", l, projection_names[p]);
    else if (h == 1) snprintf(name, sizeof name, "model.layers.%d.mlp.%s", l, projection_names[p]);
    else if (h == 2) snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s", l, l % 4, projection_names[p]);
    else if (h == 3) snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.%s", l, l % 4, mixtral_names[p - 4]);
    else if (h == 4) snprintf(name, sizeof name, "model.layers.%d.linear_attn.%s", l, projection_names[p]);
    else snprintf(name, sizeof name, "model.layers.%d.mlp.shared_expert.%s", l, projection_names[p]);
    return regexec(re, name, 0, NULL, 0) == 0;
}

/* target_modules as a regex (PEFT: re.fullmatch against each module's full
 * name): the projections it matches where each family keeps them, probed at a
 * few layer and expert indices. ctune adapts a projection in every layer or in
 * none, so a pattern that picks some layers only is an input error. The
 * patterns ctune writes (and plain alternations of names) are POSIX extended
 * regexes too; one that is not is reported as such. */
static int add_pattern_targets(ct_lora_config *c, const char *pattern, const char *src, ct_error *err)
{
    size_t len = strlen(pattern) + 8;
    char *anchored = ct_malloc(len);
    snprintf(anchored, len, "^(%s)$", pattern);
    regex_t re;
    int bad = regcomp(&re, anchored, REG_EXTENDED | REG_NOSUB);
    free(anchored);
    if (bad)
        return CT_FAIL_INPUT(err, "%s: target_modules: the pattern '%s' is not a regex ctune can read (a POSIX "
                             "extended regex, or a list of names)", src, pattern);
    static const int layers[] = {0, 1, 7, 10, 31};
    const int n_layers = (int)(sizeof layers / sizeof *layers);
    int rc = CT_OK;
    for (int p = 0; p < N_PROJECTIONS && !rc; p++) {
        bool targeted = false;
        /* homes (pattern_matches): attention for q, k, v, o; the MLP, both
         * expert layouts and the shared expert for gate, up, down; linear_attn
         * for the GDN projections; the MLP for shared_expert_gate */
        static const int mlp_homes[] = {1, 2, 3, 5, -1}, attn_home[] = {0, -1}, gdn_home[] = {4, -1},
                         mlp_home[] = {1, -1};
        const int *homes = p < 4 ? attn_home : p < 7 ? mlp_homes : p < 14 ? gdn_home : mlp_home;
        for (int hi = 0; homes[hi] >= 0 && !rc; hi++) {
            int h = homes[hi];
            int hits = 0;
            for (int l = 0; l < n_layers; l++) hits += pattern_matches(&re, h, layers[l], p);
            if (hits > 0 && hits < n_layers)
                rc = CT_FAIL_INPUT(err, "%s: target_modules: the pattern '%s' adapts %s in some layers only "
                                   "(ctune adapts a projection in every layer or in none)", src, pattern,
                                   projection_names[p]);
            targeted |= hits == n_layers;
        }
        if (!rc && targeted) rc = add_target(c, projection_names[p], src, err);
    }
    regfree(&re);
    if (!rc && c->n_target_modules == 0)
        return CT_FAIL_INPUT(err, "%s: target_modules: the pattern '%s' matches none of q_proj, k_proj, v_proj, "
                             "o_proj, gate_proj, up_proj, down_proj, in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, "
                             "in_proj_qkvz, in_proj_ba, out_proj, shared_expert_gate", src, pattern);
    return rc;
}

static int parse_config(const json_value *root, const char *src, ct_lora_config *c, ct_error *err)
{
    if (!root || root->type != JSON_OBJECT) return CT_FAIL_INPUT(err, "%s: expected a JSON object", src);
    const json_value *pt = json_get_type(root, "peft_type", JSON_STRING);
    if (pt && strcmp(pt->string, "LORA"))
        return CT_FAIL_INPUT(err, "%s: peft_type is '%s', expected LORA", src, pt->string);
    long long r;
    double alpha, dropout;
    int rc = json_get_int(root, "r", 8, &r, src, err);
    if (!rc) rc = json_get_double(root, "lora_alpha", 8, &alpha, src, err);
    if (!rc) rc = json_get_double(root, "lora_dropout", 0, &dropout, src, err);
    if (!rc) rc = json_get_bool(root, "use_rslora", false, &c->use_rslora, src, err);
    if (rc) return rc;
    if (r < 1 || r > 1 << 16) return CT_FAIL_INPUT(err, "%s: r is %lld (expected 1..65536)", src, r);
    if (!(alpha > 0)) return CT_FAIL_INPUT(err, "%s: lora_alpha is %g (expected > 0)", src, alpha);
    c->r = (int)r;
    c->lora_alpha = alpha;
    c->lora_dropout = dropout >= 0 && dropout < 1 ? dropout : 0;
    static const char *const unsupported[] = {"use_dora", "fan_in_fan_out", "bias", "rank_pattern", "alpha_pattern",
                                              "modules_to_save", "layers_to_transform", "lora_bias"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
        if ((rc = expect_neutral(root, unsupported[i], src, err))) return rc;
    /* gpt_oss experts are parameters: gate_up_proj adapts gate and up together;
     * mlp.X_proj.weight is a dense MLP projection named as a parameter. */
    const json_value *tp = json_get(root, "target_parameters");
    if (tp && tp->type == JSON_ARRAY) {
        for (size_t i = 0; i < tp->count && !rc; i++) {
            const json_value *v = tp->items[i];
            if (v->type != JSON_STRING) return CT_FAIL_INPUT(err, "%s: target_parameters[%zu]: expected a string", src, i);
            if (!strcmp(v->string, "mlp.experts.gate_up_proj")) {
                rc = add_target(c, "gate_proj", src, err);
                if (!rc) rc = add_target(c, "up_proj", src, err);
            } else if (!strcmp(v->string, "mlp.experts.down_proj")) {
                rc = add_target(c, "down_proj", src, err);
            } else if (!strcmp(v->string, "mlp.gate_proj.weight") || !strcmp(v->string, "mlp.up_proj.weight") ||
                       !strcmp(v->string, "mlp.down_proj.weight")) {
                char name[16];
                snprintf(name, sizeof name, "%.*s", (int)(strlen(v->string) - 11), v->string + 4);
                rc = add_target(c, name, src, err);
            } else {
                return CT_FAIL_INPUT(err, "%s: target_parameters: '%s' is not mlp.experts.gate_up_proj, "
                                     "mlp.experts.down_proj or mlp.{gate,up,down}_proj.weight", src, v->string);
            }
        }
        if (rc) return rc;
    } else if ((rc = expect_neutral(root, "target_parameters", src, err))) {
        return rc;
    }
    const json_value *t = json_get(root, "target_modules");
    if (!t) return CT_FAIL_INPUT(err, "%s: target_modules is missing", src);
    if (t->type == JSON_STRING && !strcmp(t->string, "all-linear")) {
        c->target_all_linear = true;
        for (int i = 0; i < N_PROJECTIONS && !rc; i++) rc = add_target(c, projection_names[i], src, err);
        return rc;
    }
    if (t->type == JSON_STRING) return add_pattern_targets(c, t->string, src, err);
    if (t->type != JSON_ARRAY || (t->count == 0 && c->n_target_modules == 0))
        return CT_FAIL_INPUT(err, "%s: target_modules: expected a non-empty list of names", src);
    for (size_t i = 0; i < t->count && !rc; i++) {
        if (t->items[i]->type != JSON_STRING)
            return CT_FAIL_INPUT(err, "%s: target_modules[%zu]: expected a string", src, i);
        rc = add_target(c, t->items[i]->string, src, err);
    }
    return rc;
}

int adapter_read_config(const char *dir, ct_lora_config *out, ct_error *err)
{
    char path[CT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    size_t len;
    char *text = ct_read_file_max(path, 1 << 20, &len, err);
    if (!text) return err->code;
    json_doc *doc = json_parse(text, len, path, err);
    free(text);
    if (!doc) return err->code;
    ct_lora_config c = {0};
    strcpy(c.init_lora_weights, "true");
    int rc = parse_config(json_root(doc), path, &c, err);
    json_free(doc);
    if (!rc) *out = c;
    return rc;
}

/* Bytes of the fp32 LoRA tensors that config c asks of model mc (the config.json
 * caps keep the sum far inside size_t). */
static size_t adapter_bytes(const ct_lora_config *c, const ct_model_config *mc)
{
    size_t n = 0;
    for (int t = 0; t < c->n_target_modules; t++)
        for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
            if (strcmp(c->target_modules[t], model_module_name((ct_module)mod))) continue;
            for (int l = 0; l < mc->num_hidden_layers; l++) {
                int in, out, experts = model_module_layer_shape(mc, l, (ct_module)mod, &in, &out);
                n += (size_t)experts * (size_t)c->r * ((size_t)in + (size_t)out);
            }
        }
    return n * sizeof(float);
}

int adapter_load(ct_lora *lo, const ct_model *m, const char *dir, ct_error *err)
{
    ct_lora_config c;
    int rc = adapter_read_config(dir, &c, err);
    if (rc) return rc;
    /* Before lora_init allocates and initialises 4 buffers of that size: a
     * config whose r does not match its tensors (r 65536 beside a rank-4 file)
     * would otherwise cost gigabytes and minutes before the first shape check. */
    char path[CT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    struct stat st;
    size_t need = adapter_bytes(&c, &m->cfg);
    if (stat(path, &st) != 0) return CT_FAIL_INPUT(err, "%s: cannot open (%s)", path, strerror(errno));
    if ((uint64_t)st.st_size < need)
        return CT_FAIL_INPUT(err, "%s: %lld bytes, but r %d on these targets needs %zu bytes of fp32 LoRA tensors "
                             "for this model (an adapter_config.json of another adapter, or an adapter of another "
                             "model)", path, (long long)st.st_size, c.r, need);
    rc = lora_init(lo, m, &c, 0, err);
    if (rc) return rc;
    rc = lora_load_peft(lo, m, dir, err);
    if (rc) lora_free(lo, m->be); /* a failed load leaves lo empty, as a failed lora_init does */
    return rc;
}

/* The name target_modules lists for a projection: mixtral's experts are
 * w1/w3/w2; gpt_oss's experts are parameters (target_parameters), not modules. */
static const char *target_name(const ct_lora *lo, ct_module mod)
{
    static const char *const mixtral_names[] = {"w1", "w3", "w2"};
    if (!model_module_is_mlp(mod)) return model_module_name(mod);
    if (lo->arch == CT_ARCH_GPT_OSS) return NULL;
    return lo->arch == CT_ARCH_MIXTRAL ? mixtral_names[mod - CT_MOD_GATE] : model_module_name(mod);
}

/* target_modules for a qwen3_moe or qwen3_next model with dense layers (see the
 * file comment): the other projections (attention, linear_attn,
 * shared_expert_gate) anywhere, the expert projections with or without an
 * expert index, never a dense mlp.*_proj; [] when there is neither. */
static void write_pattern_targets(const ct_lora *lo, bool experts, json_writer *w)
{
    char pattern[512] = "";
    size_t n = 0;
    for (int part = 0; part < 2; part++) {
        int k = 0;
        if (part && !experts) break;
        for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
            if (!lo->targeted[mod] || model_module_is_mlp(mod) != (part == 1)) continue;
            if (k++ == 0) n += (size_t)snprintf(pattern + n, sizeof pattern - n, "%s%s", n ? "|" : "",
                                                part ? ".*\\.experts(\\.[0-9]+)?\\.(" : ".*\\.(");
            else n += (size_t)snprintf(pattern + n, sizeof pattern - n, "|");
            n += (size_t)snprintf(pattern + n, sizeof pattern - n, "%s", model_module_name(mod));
        }
        if (k) n += (size_t)snprintf(pattern + n, sizeof pattern - n, ")");
    }
    if (n) json_write_string(w, pattern);
    else json_write_raw(w, "[]");
}

void adapter_write_config(const ct_lora *lo, const ct_model_config *c, const char *base_model, json_writer *w)
{
    bool sparse = false, dense = false;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        sparse |= c->layer_sparse[l];
        dense |= !c->layer_sparse[l];
    }
    bool mlp = lo->targeted[CT_MOD_GATE] || lo->targeted[CT_MOD_UP] || lo->targeted[CT_MOD_DOWN];
    /* the families whose experts PEFT converts (qwen3_next: as qwen2_moe, like qwen3_moe) */
    bool converted = c->arch == CT_ARCH_QWEN3_MOE || c->arch == CT_ARCH_QWEN3_NEXT || c->arch == CT_ARCH_MIXTRAL;
    bool moe = converted || c->arch == CT_ARCH_GPT_OSS;
    bool dense_as_params = (c->arch == CT_ARCH_QWEN3_MOE || c->arch == CT_ARCH_QWEN3_NEXT) && dense && mlp;
    bool any_params = dense_as_params || (moe && sparse && mlp);
    /* v5's fused gate_up LoRA gets rank 2r and alpha 2 alpha: alpha / r survives,
     * alpha / sqrt(r) does not. rsLoRA's scale is then written as plain alpha. */
    bool fused_gate_up = converted && sparse && lo->targeted[CT_MOD_GATE] && lo->targeted[CT_MOD_UP];
    bool rslora_as_alpha = lo->cfg.use_rslora && fused_gate_up;
    /* PEFT writes sorted keys with indent 2; we do the same so diffs stay readable. */
    json_write_raw(w, "{\n  \"alpha_pattern\": {},\n  \"auto_mapping\": null,\n  \"base_model_name_or_path\": ");
    json_write_string(w, base_model);
    json_write_raw(w, ",\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  \"inference_mode\": true,\n"
                      "  \"init_lora_weights\": ");
    json_write_raw(w, strcmp(lo->cfg.init_lora_weights, "gaussian") ? "true" : "\"gaussian\"");
    json_write_raw(w, ",\n  \"layers_pattern\": null,\n  \"layers_to_transform\": null,\n  \"lora_alpha\": ");
    json_write_number(w, rslora_as_alpha ? lo->cfg.lora_alpha * sqrt((double)lo->R) : lo->cfg.lora_alpha);
    json_write_raw(w, ",\n  \"lora_dropout\": ");
    json_write_number(w, any_params ? 0 : lo->cfg.lora_dropout);
    json_write_raw(w, ",\n  \"modules_to_save\": null,\n  \"peft_type\": \"LORA\",\n  \"r\": ");
    json_write_rawf(w, "%d", lo->R);
    json_write_raw(w, ",\n  \"rank_pattern\": {},\n  \"revision\": null,\n  \"target_modules\": ");
    if (dense_as_params) {
        write_pattern_targets(lo, sparse, w);
    } else {
        json_write_raw(w, "[");
        bool first = true;
        for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
            if (!lo->targeted[mod] || !target_name(lo, mod)) continue;
            json_write_raw(w, first ? "\n    " : ",\n    ");
            json_write_string(w, target_name(lo, mod));
            first = false;
        }
        json_write_raw(w, first ? "]" : "\n  ]");
    }
    bool gpt_oss_experts = c->arch == CT_ARCH_GPT_OSS && (lo->targeted[CT_MOD_GATE] || lo->targeted[CT_MOD_DOWN]);
    if (gpt_oss_experts || dense_as_params) {
        json_write_raw(w, ",\n  \"target_parameters\": [");
        bool first = true;
        for (int mod = CT_MOD_GATE; mod <= CT_MOD_DOWN; mod++) {
            char name[64];
            if (!lo->targeted[mod] || (gpt_oss_experts && mod == CT_MOD_UP)) continue;
            if (gpt_oss_experts)
                snprintf(name, sizeof name, "mlp.experts.%s", mod == CT_MOD_GATE ? "gate_up_proj" : "down_proj");
            else
                snprintf(name, sizeof name, "mlp.%s.weight", model_module_name(mod));
            json_write_raw(w, first ? "\n    " : ",\n    ");
            json_write_string(w, name);
            first = false;
        }
        json_write_raw(w, "\n  ]");
    }
    json_write_raw(w, ",\n  \"task_type\": \"CAUSAL_LM\",\n  \"use_dora\": false,\n  \"use_rslora\": ");
    json_write_raw(w, lo->cfg.use_rslora && !rslora_as_alpha ? "true" : "false");
    json_write_raw(w, "\n}\n");
}

static bool lists(const ct_lora_config *l, const char *name)
{
    for (int i = 0; i < l->n_target_modules; i++)
        if (!strcmp(l->target_modules[i], name)) return true;
    return false;
}

int adapter_check_peft(const ct_model_config *c, const ct_lora_config *l, ct_error *err)
{
    bool sparse = false;
    for (int i = 0; i < c->num_hidden_layers; i++) sparse |= c->layer_sparse[i];
    if (!sparse || (c->arch != CT_ARCH_QWEN3_MOE && c->arch != CT_ARCH_QWEN3_NEXT && c->arch != CT_ARCH_MIXTRAL))
        return CT_OK;
    bool gate = lists(l, "gate_proj"), up = lists(l, "up_proj"), down = lists(l, "down_proj");
    if (gate != up)
        return CT_FAIL_INPUT(err, "lora.target_modules: %s experts' gate_proj and up_proj are one gate_up_proj in "
                             "transformers v5, and PEFT loads a LoRA on one of them only with the other (target "
                             "both, or neither)", c->model_type);
    if (gate && !down)
        return CT_FAIL_INPUT(err, "lora.target_modules: PEFT (0.21, transformers v5) leaves the %s experts' "
                             "gate_proj/up_proj LoRA unloaded unless down_proj is targeted too (add down_proj, or "
                             "leave gate_proj and up_proj out)", c->model_type);
    return CT_OK;
}
