/* adapter.c — see adapter.h. */
#include "adapter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static const char *const projection_names[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                               "gate_proj", "up_proj", "down_proj"};
#define N_PROJECTIONS 7

static int add_target(ct_lora_config *c, const char *name, const char *src, ct_error *err)
{
    name = config_canonical_module(name);
    bool known = false;
    for (int i = 0; i < N_PROJECTIONS; i++) known |= !strcmp(name, projection_names[i]);
    if (!known)
        return CT_FAIL_INPUT(err, "%s: target_modules: '%s' is not one of q_proj, k_proj, v_proj, o_proj, "
                             "gate_proj, up_proj, down_proj (ctune applies LoRA to those only)", src, name);
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
    /* gpt_oss experts are parameters: gate_up_proj adapts gate and up together. */
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
            } else {
                return CT_FAIL_INPUT(err, "%s: target_parameters: '%s' is not mlp.experts.gate_up_proj or "
                                     "mlp.experts.down_proj", src, v->string);
            }
        }
        if (rc) return rc;
    } else if ((rc = expect_neutral(root, "target_parameters", src, err))) {
        return rc;
    }
    const json_value *t = json_get(root, "target_modules");
    if (!t) return CT_FAIL_INPUT(err, "%s: target_modules is missing", src);
    if (t->type == JSON_STRING) {
        if (strcmp(t->string, "all-linear"))
            return CT_FAIL_INPUT(err, "%s: target_modules is the pattern '%s'; ctune reads a list of names "
                                 "or \"all-linear\"", src, t->string);
        c->target_all_linear = true;
        for (int i = 0; i < N_PROJECTIONS && !rc; i++) rc = add_target(c, projection_names[i], src, err);
        return rc;
    }
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

int adapter_load(ct_lora *lo, const ct_model *m, const char *dir, ct_error *err)
{
    ct_lora_config c;
    int rc = adapter_read_config(dir, &c, err);
    if (!rc) rc = lora_init(lo, m, &c, 0, err);
    if (!rc) rc = lora_load_peft(lo, m, dir, err);
    return rc;
}
