/* model_config.c — see model_config.h. Family defaults follow the transformers
 * config classes (docs/ARCHITECTURE.md, "Model folders"); where a field is absent we use the value
 * HF would, so a checkpoint means the same model here as in transformers. */
#include "model_config.h"
#include "fp8.h"
#include "mxfp4.h"
#include "quant4.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "json.h"

static const struct { const char *name; ct_arch arch; } arch_names[] = {
    {"llama", CT_ARCH_LLAMA},     {"mistral", CT_ARCH_MISTRAL},     {"qwen2", CT_ARCH_QWEN2},
    {"qwen3", CT_ARCH_QWEN3},     {"qwen3_moe", CT_ARCH_QWEN3_MOE}, {"mixtral", CT_ARCH_MIXTRAL},
    {"gpt_oss", CT_ARCH_GPT_OSS},
    /* Gated DeltaNet hybrids: the wrappers name the arch; their text configs say the same */
    {"qwen3_5", CT_ARCH_QWEN3_5},           {"qwen3_5_text", CT_ARCH_QWEN3_5},
    {"qwen3_5_moe", CT_ARCH_QWEN3_5_MOE},   {"qwen3_5_moe_text", CT_ARCH_QWEN3_5_MOE},
    {"qwen3_next", CT_ARCH_QWEN3_NEXT},
};
#define N_ARCHS (sizeof arch_names / sizeof arch_names[0])
#define SUPPORTED_ARCHS "llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, gpt_oss, " \
                        "qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text, qwen3_next"

const char *model_arch_name(ct_arch a)
{
    for (size_t i = 0; i < N_ARCHS; i++)
        if (arch_names[i].arch == a) return arch_names[i].name;
    return "unknown";
}

/* ---- typed reads: JSON null counts as absent, as HF treats None as "use default" ---- */

static bool present(const json_value *obj, const char *key)
{
    const json_value *v = json_get(obj, key);
    return v && v->type != JSON_NULL;
}

static int opt_int(const json_value *obj, const char *key, int dflt, int *out,
                   const char *src, ct_error *err)
{
    if (!present(obj, key)) { *out = dflt; return CT_OK; }
    long long v;
    int rc = json_get_int(obj, key, dflt, &v, src, err);
    if (rc) return rc;
    if (v < INT_MIN || v > INT_MAX) return CT_FAIL_INPUT(err, "%s: key '%s': %lld is out of range", src, key, v);
    *out = (int)v;
    return CT_OK;
}

static int req_int(const json_value *obj, const char *key, int *out, const char *src, ct_error *err)
{
    if (!present(obj, key)) return CT_FAIL_INPUT(err, "%s: key '%s' is missing", src, key);
    return opt_int(obj, key, 0, out, src, err);
}

static int opt_double(const json_value *obj, const char *key, double dflt, double *out,
                      const char *src, ct_error *err)
{
    if (!present(obj, key)) { *out = dflt; return CT_OK; }
    return json_get_double(obj, key, dflt, out, src, err);
}

static int opt_bool(const json_value *obj, const char *key, bool dflt, bool *out,
                    const char *src, ct_error *err)
{
    if (!present(obj, key)) { *out = dflt; return CT_OK; }
    return json_get_bool(obj, key, dflt, out, src, err);
}

/* A string member or NULL; a non-string value is an error. */
static int opt_string(const json_value *obj, const char *key, const char **out,
                      const char *src, ct_error *err)
{
    *out = NULL;
    if (!present(obj, key)) return CT_OK;
    const json_value *v = json_get(obj, key);
    if (v->type != JSON_STRING) return CT_FAIL_INPUT(err, "%s: key '%s': expected a string", src, key);
    *out = v->string;
    return CT_OK;
}

static int require_positive(int v, const char *key, const char *src, ct_error *err)
{
    if (v <= 0) return CT_FAIL_INPUT(err, "%s: key '%s' must be positive (found %d)", src, key, v);
    return CT_OK;
}

static int require_at_most(int v, int max, const char *key, const char *src, ct_error *err)
{
    if (v > max)
        return CT_FAIL_INPUT(err, "%s: key '%s' is %d, more than the %d ctune supports (a corrupt config.json?)",
                             src, key, v, max);
    return CT_OK;
}

/* Values used as fp32 in the kernels must convert to float without overflow. */
static int require_float_range(double v, double lo, double hi, const char *key, const char *src, ct_error *err)
{
    if (!(v >= lo && v <= hi)) return CT_FAIL_INPUT(err, "%s: key '%s' is %g (expected %g to %g)", src, key, v, lo, hi);
    return CT_OK;
}

/* ---- RoPE ---- */

/* Qwen3.5's interleaved M-RoPE fills rotary slots from T/H/W position rows; for
 * text those rows are equal and it is the ordinary partial RoPE, so the fields
 * are only checked and kept. The section sum is checked against the rotary dim
 * after that is known (parse_root). */
static int parse_mrope(ct_model_config *mc, const json_value *p, const char *src, ct_error *err)
{
    int rc = opt_bool(p, "mrope_interleaved", false, &mc->mrope_interleaved, src, err);
    if (rc || !present(p, "mrope_section")) return rc;
    const json_value *m = json_get(p, "mrope_section");
    if (m->type != JSON_ARRAY || m->count != 3)
        return CT_FAIL_INPUT(err, "%s: key 'mrope_section': expected an array of 3 integers (T, H, W)", src);
    for (size_t i = 0; i < 3; i++) {
        const json_value *v = m->items[i];
        if (v->type != JSON_NUMBER || !v->is_integer || v->integer < 0 || v->integer > CT_MAX_HEAD_DIM)
            return CT_FAIL_INPUT(err, "%s: mrope_section[%zu]: expected an integer in [0, %d]", src, i, CT_MAX_HEAD_DIM);
        mc->mrope_section[i] = (int)v->integer;
    }
    return CT_OK;
}

static int parse_rope(ct_model_config *mc, const json_value *root, const char *src, ct_error *err)
{
    ct_rope_config *rp = &mc->rope;
    rp->type = CT_ROPE_DEFAULT;
    rp->factor = 1.0;
    rp->beta_fast = 32.0;
    rp->beta_slow = 1.0;
    rp->truncate = true;
    double theta_dflt = mc->arch == CT_ARCH_GPT_OSS ? 150000.0 : mc->arch == CT_ARCH_MIXTRAL ? 1e6 : 10000.0;
    int rc = opt_double(root, "rope_theta", theta_dflt, &rp->theta, src, err);
    /* The Gated DeltaNet configs default to 0.25 (in rope_parameters or beside it). */
    if (!rc) rc = opt_double(root, "partial_rotary_factor", mc->gdn ? 0.25 : 1.0, &rp->partial_rotary_factor, src, err);
    if (rc) return rc;

    /* transformers v5 writes rope_parameters; older files rope_scaling. */
    const char *key = present(root, "rope_parameters") ? "rope_parameters" : "rope_scaling";
    if (!present(root, key)) {
        if (mc->arch == CT_ARCH_GPT_OSS) { /* GptOssConfig's default when neither is given */
            rp->type = CT_ROPE_YARN;
            rp->factor = 32.0;
            rp->truncate = false;
            rp->original_max_position_embeddings = 4096;
        }
        return CT_OK;
    }
    const json_value *p = json_get(root, key);
    if (p->type != JSON_OBJECT) return CT_FAIL_INPUT(err, "%s: key '%s': expected an object", src, key);
    char sub[600];
    snprintf(sub, sizeof sub, "%s: %s", src, key);

    rc = opt_double(p, "rope_theta", rp->theta, &rp->theta, sub, err);
    if (!rc) rc = opt_double(p, "partial_rotary_factor", rp->partial_rotary_factor, &rp->partial_rotary_factor, sub, err);
    if (!rc && mc->gdn) rc = parse_mrope(mc, p, sub, err);
    const char *type = NULL;
    if (!rc) rc = opt_string(p, "rope_type", &type, sub, err);
    if (!rc && !type) rc = opt_string(p, "type", &type, sub, err);
    if (rc) return rc;
    if (!type || !strcmp(type, "default")) return CT_OK;
    if (!strcmp(type, "linear")) rp->type = CT_ROPE_LINEAR;
    else if (!strcmp(type, "dynamic")) rp->type = CT_ROPE_DYNAMIC;
    else if (!strcmp(type, "llama3")) rp->type = CT_ROPE_LLAMA3;
    else if (!strcmp(type, "yarn")) rp->type = CT_ROPE_YARN;
    else return CT_FAIL_INPUT(err, "%s: rope_type '%s' is not supported (supported: default, linear, dynamic, llama3, yarn)", sub, type);

    if (!present(p, "factor")) return CT_FAIL_INPUT(err, "%s: key 'factor' is missing (rope_type %s needs it)", sub, type);
    rc = opt_double(p, "factor", 1.0, &rp->factor, sub, err);
    if (rc) return rc;
    if (!(rp->factor >= 1.0)) return CT_FAIL_INPUT(err, "%s: key 'factor' must be >= 1 (found %g)", sub, rp->factor);

    if (rp->type == CT_ROPE_LLAMA3) {
        static const char *need[] = {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
        for (int i = 0; i < 3; i++)
            if (!present(p, need[i])) return CT_FAIL_INPUT(err, "%s: key '%s' is missing (rope_type llama3 needs it)", sub, need[i]);
        rc = opt_double(p, "low_freq_factor", 1.0, &rp->low_freq_factor, sub, err);
        if (!rc) rc = opt_double(p, "high_freq_factor", 4.0, &rp->high_freq_factor, sub, err);
        if (!rc) rc = opt_int(p, "original_max_position_embeddings", 0, &rp->original_max_position_embeddings, sub, err);
        if (rc) return rc;
        if (!(rp->high_freq_factor > rp->low_freq_factor) || rp->low_freq_factor <= 0)
            return CT_FAIL_INPUT(err, "%s: need 0 < low_freq_factor < high_freq_factor (found %g, %g)", sub,
                                 rp->low_freq_factor, rp->high_freq_factor);
        return require_positive(rp->original_max_position_embeddings, "original_max_position_embeddings", sub, err);
    }
    if (rp->type == CT_ROPE_YARN) {
        rc = opt_double(p, "beta_fast", 32.0, &rp->beta_fast, sub, err);
        if (!rc) rc = opt_double(p, "beta_slow", 1.0, &rp->beta_slow, sub, err);
        if (!rc) rc = opt_double(p, "attention_factor", 0.0, &rp->attention_factor, sub, err);
        if (!rc) rc = opt_bool(p, "truncate", true, &rp->truncate, sub, err);
        if (!rc) rc = opt_int(p, "original_max_position_embeddings", mc->max_position_embeddings,
                              &rp->original_max_position_embeddings, sub, err);
        if (rc) return rc;
        /* HF replaces falsy betas by the paper's defaults (`or 32`, `or 1`). */
        if (rp->beta_fast == 0) rp->beta_fast = 32.0;
        if (rp->beta_slow == 0) rp->beta_slow = 1.0;
        /* log() of the correction range needs positive betas; fp32 needs the factor in range */
        if (!(rp->beta_fast > 0 && rp->beta_slow > 0))
            return CT_FAIL_INPUT(err, "%s: yarn beta_fast and beta_slow must be positive (found %g, %g)", sub,
                                 rp->beta_fast, rp->beta_slow);
        if ((rc = require_float_range(rp->attention_factor, -1e30, 1e30, "attention_factor", sub, err))) return rc;
        if (present(p, "mscale") || present(p, "mscale_all_dim"))
            return CT_FAIL_INPUT(err, "%s: yarn 'mscale'/'mscale_all_dim' are not supported (give attention_factor)", sub);
        return require_positive(rp->original_max_position_embeddings, "original_max_position_embeddings", sub, err);
    }
    return CT_OK;
}

int model_rope_dim(const ct_model_config *mc)
{
    return (int)(mc->head_dim * mc->rope.partial_rotary_factor);
}

static double yarn_correction_dim(double rotations, int d, double theta, int orig_max)
{
    return d * log(orig_max / (rotations * 2.0 * M_PI)) / (2.0 * log(theta));
}

void model_rope_inv_freq(const ct_model_config *mc, float *inv_freq, float *attention_scaling)
{
    const ct_rope_config *rp = &mc->rope;
    int d = model_rope_dim(mc), half = d / 2;
    double scaling = 1.0;
    double low = 0, high = 0;
    if (rp->type == CT_ROPE_YARN) {
        low = yarn_correction_dim(rp->beta_fast, d, rp->theta, rp->original_max_position_embeddings);
        high = yarn_correction_dim(rp->beta_slow, d, rp->theta, rp->original_max_position_embeddings);
        if (rp->truncate) { low = floor(low); high = ceil(high); }
        if (low < 0) low = 0;
        if (high > d - 1) high = d - 1;
        if (low == high) high += 0.001; /* as HF: avoid a zero-width ramp */
        scaling = rp->attention_factor > 0 ? rp->attention_factor
                : rp->factor <= 1 ? 1.0 : 0.1 * log(rp->factor) + 1.0;
    }
    for (int i = 0; i < half; i++) {
        double inv = 1.0 / pow(rp->theta, (2.0 * i) / d);
        switch (rp->type) {
        case CT_ROPE_DEFAULT:
        case CT_ROPE_DYNAMIC:
            break;
        case CT_ROPE_LINEAR:
            inv /= rp->factor;
            break;
        case CT_ROPE_LLAMA3: {
            double orig = rp->original_max_position_embeddings;
            double wavelen = 2.0 * M_PI / inv;
            double lo_wavelen = orig / rp->low_freq_factor, hi_wavelen = orig / rp->high_freq_factor;
            if (wavelen > lo_wavelen) {
                inv /= rp->factor;
            } else if (wavelen >= hi_wavelen) {
                double s = (orig / wavelen - rp->low_freq_factor) / (rp->high_freq_factor - rp->low_freq_factor);
                inv = (1 - s) * inv / rp->factor + s * inv;
            }
            break;
        }
        case CT_ROPE_YARN: {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            inv = (inv / rp->factor) * ramp + inv * (1 - ramp);
            break;
        }
        }
        inv_freq[i] = (float)inv;
    }
    *attention_scaling = (float)scaling;
}

/* ---- per-layer attention and MoE layout ---- */

static int parse_layer_types(ct_model_config *mc, const json_value *root, const char *src, ct_error *err)
{
    int L = mc->num_hidden_layers;
    if (!present(root, "layer_types")) return CT_OK;
    const json_value *lt = json_get(root, "layer_types");
    if (lt->type != JSON_ARRAY) return CT_FAIL_INPUT(err, "%s: key 'layer_types': expected an array", src);
    if (lt->count != (size_t)L)
        return CT_FAIL_INPUT(err, "%s: key 'layer_types' has %zu entries, num_hidden_layers is %d", src, lt->count, L);
    for (int i = 0; i < L; i++) {
        const json_value *v = lt->items[i];
        if (v->type == JSON_STRING && !strcmp(v->string, "sliding_attention")) mc->layer_sliding[i] = true;
        else if (v->type == JSON_STRING && !strcmp(v->string, "full_attention")) mc->layer_sliding[i] = false;
        else return CT_FAIL_INPUT(err, "%s: layer_types[%d]: expected \"sliding_attention\" or \"full_attention\"", src, i);
    }
    return CT_OK;
}

static int parse_attention(ct_model_config *mc, const json_value *root, const char *src, ct_error *err)
{
    int L = mc->num_hidden_layers, rc = CT_OK;
    bool bias = false;
    switch (mc->arch) {
    case CT_ARCH_LLAMA:
    case CT_ARCH_QWEN3:
    case CT_ARCH_QWEN3_MOE:
    case CT_ARCH_QWEN3_5:
    case CT_ARCH_QWEN3_5_MOE:
    case CT_ARCH_QWEN3_NEXT:
        rc = opt_bool(root, "attention_bias", false, &bias, src, err);
        mc->attention_bias = mc->o_proj_bias = bias;
        break;
    case CT_ARCH_QWEN2: /* Qwen2Attention: q/k/v always biased, o never */
        mc->attention_bias = true;
        break;
    case CT_ARCH_GPT_OSS:
        mc->attention_bias = mc->o_proj_bias = mc->attention_sinks = true;
        break;
    case CT_ARCH_MISTRAL:
    case CT_ARCH_MIXTRAL:
        break;
    }
    if (rc) return rc;
    mc->qk_norm = mc->arch == CT_ARCH_QWEN3 || mc->arch == CT_ARCH_QWEN3_MOE || mc->gdn;
    if (mc->arch == CT_ARCH_LLAMA) rc = opt_bool(root, "mlp_bias", false, &mc->mlp_bias, src, err);
    if (rc) return rc;

    /* Sliding windows: which layers use one follows each family's config class. */
    int window = 0;
    switch (mc->arch) {
    case CT_ARCH_LLAMA:
    case CT_ARCH_QWEN3_5: /* no sliding windows: the hybrids' long range is their GDN layers */
    case CT_ARCH_QWEN3_5_MOE:
    case CT_ARCH_QWEN3_NEXT:
        return CT_OK;
    case CT_ARCH_MISTRAL: /* absent -> 4096 (MistralConfig default), null -> none; every layer */
        if (!json_get(root, "sliding_window")) window = 4096;
        else rc = opt_int(root, "sliding_window", 0, &window, src, err);
        for (int i = 0; i < L; i++) mc->layer_sliding[i] = true;
        break;
    case CT_ARCH_MIXTRAL:
        rc = opt_int(root, "sliding_window", 0, &window, src, err);
        for (int i = 0; i < L; i++) mc->layer_sliding[i] = true;
        break;
    case CT_ARCH_QWEN2:
    case CT_ARCH_QWEN3: { /* window only with use_sliding_window; layers >= max_window_layers */
        bool use = false;
        int max_window_layers = 28;
        rc = opt_bool(root, "use_sliding_window", false, &use, src, err);
        if (!rc) rc = opt_int(root, "sliding_window", 4096, &window, src, err);
        if (!rc) rc = opt_int(root, "max_window_layers", 28, &max_window_layers, src, err);
        if (!use) window = 0;
        for (int i = 0; i < L; i++) mc->layer_sliding[i] = i >= max_window_layers;
        if (!rc) rc = parse_layer_types(mc, root, src, err);
        break;
    }
    case CT_ARCH_QWEN3_MOE: /* transformers' Qwen3MoeAttention: with use_sliding_window every layer slides
                             * (max_window_layers and layer_types are not read) */
    {
        bool use = false;
        rc = opt_bool(root, "use_sliding_window", false, &use, src, err);
        if (!rc) rc = opt_int(root, "sliding_window", 4096, &window, src, err);
        if (!use) window = 0;
        for (int i = 0; i < L; i++) mc->layer_sliding[i] = true;
        break;
    }
    case CT_ARCH_GPT_OSS:
        rc = opt_int(root, "sliding_window", 128, &window, src, err);
        for (int i = 0; i < L; i++) mc->layer_sliding[i] = i % 2 == 0;
        if (!rc) rc = parse_layer_types(mc, root, src, err);
        break;
    }
    if (rc) return rc;
    if (window < 0) return CT_FAIL_INPUT(err, "%s: key 'sliding_window' must be >= 0 (found %d)", src, window);
    mc->sliding_window = window;
    if (window == 0)
        for (int i = 0; i < L; i++) mc->layer_sliding[i] = false;
    return CT_OK;
}

static int parse_moe(ct_model_config *mc, const json_value *root, const char *src, ct_error *err)
{
    int L = mc->num_hidden_layers, rc = CT_OK;
    const char *experts_key = "num_local_experts";
    switch (mc->arch) {
    case CT_ARCH_QWEN3_5_MOE: /* Qwen3_5MoeTextConfig: every layer sparse, top-k always renormalized */
        experts_key = "num_experts";
        rc = opt_int(root, "num_experts", 256, &mc->num_experts, src, err);
        if (!rc) rc = opt_int(root, "num_experts_per_tok", 8, &mc->num_experts_per_tok, src, err);
        if (!rc) rc = opt_int(root, "moe_intermediate_size", 512, &mc->moe_intermediate_size, src, err);
        if (!rc) rc = opt_int(root, "shared_expert_intermediate_size", 512, &mc->shared_expert_intermediate_size, src, err);
        if (!rc) rc = opt_double(root, "router_aux_loss_coef", 0.001, &mc->router_aux_loss_coef, src, err);
        mc->norm_topk_prob = true;
        for (int i = 0; i < L; i++) mc->layer_sparse[i] = true;
        break;
    case CT_ARCH_QWEN3_MOE:
    case CT_ARCH_QWEN3_NEXT: { /* the same sparse-layer rule; Qwen3NextConfig's defaults and a shared expert */
        bool next = mc->arch == CT_ARCH_QWEN3_NEXT;
        experts_key = "num_experts";
        int step = 1;
        rc = opt_int(root, "num_experts", next ? 512 : 128, &mc->num_experts, src, err);
        if (!rc) rc = opt_int(root, "num_experts_per_tok", next ? 10 : 8, &mc->num_experts_per_tok, src, err);
        if (!rc) rc = opt_int(root, "moe_intermediate_size", next ? 512 : 768, &mc->moe_intermediate_size, src, err);
        if (!rc && next)
            rc = opt_int(root, "shared_expert_intermediate_size", 512, &mc->shared_expert_intermediate_size, src, err);
        if (!rc) rc = opt_bool(root, "norm_topk_prob", next, &mc->norm_topk_prob, src, err);
        if (!rc) rc = opt_double(root, "router_aux_loss_coef", 0.001, &mc->router_aux_loss_coef, src, err);
        if (!rc) rc = opt_int(root, "decoder_sparse_step", 1, &step, src, err);
        if (rc) return rc;
        if (step <= 0) return CT_FAIL_INPUT(err, "%s: key 'decoder_sparse_step' must be positive (found %d)", src, step);
        for (int i = 0; i < L; i++) mc->layer_sparse[i] = mc->num_experts > 0 && (i + 1) % step == 0;
        if (present(root, "mlp_only_layers")) {
            const json_value *m = json_get(root, "mlp_only_layers");
            if (m->type != JSON_ARRAY) return CT_FAIL_INPUT(err, "%s: key 'mlp_only_layers': expected an array", src);
            for (size_t j = 0; j < m->count; j++) {
                const json_value *v = m->items[j];
                if (v->type != JSON_NUMBER || !v->is_integer || v->integer < 0 || v->integer >= L)
                    return CT_FAIL_INPUT(err, "%s: mlp_only_layers[%zu]: expected a layer index in [0, %d)", src, j, L);
                mc->layer_sparse[v->integer] = false;
            }
        }
        break;
    }
    case CT_ARCH_MIXTRAL: /* routing always renormalizes the top-k weights */
        rc = opt_int(root, "num_local_experts", 8, &mc->num_experts, src, err);
        if (!rc) rc = opt_int(root, "num_experts_per_tok", 2, &mc->num_experts_per_tok, src, err);
        if (!rc) rc = opt_double(root, "router_aux_loss_coef", 0.02, &mc->router_aux_loss_coef, src, err);
        mc->moe_intermediate_size = mc->intermediate_size;
        mc->norm_topk_prob = true;
        for (int i = 0; i < L; i++) mc->layer_sparse[i] = true;
        break;
    case CT_ARCH_GPT_OSS: { /* softmax over the top-k logits: normalized by construction */
        /* transformers routes to num_experts_per_tok (default 4) and clamps the
         * SwiGLU at 7.0; a file whose experts_per_token or swiglu_limit says
         * otherwise would train a model that HF, PEFT and vLLM do not run. */
        int per_tok = 0;
        rc = opt_int(root, "num_local_experts", 128, &mc->num_experts, src, err);
        if (!rc) rc = opt_int(root, "num_experts_per_tok", 4, &mc->num_experts_per_tok, src, err);
        if (!rc) rc = opt_int(root, "experts_per_token", mc->num_experts_per_tok, &per_tok, src, err);
        if (!rc) rc = opt_double(root, "router_aux_loss_coef", 0.9, &mc->router_aux_loss_coef, src, err);
        if (!rc) rc = opt_double(root, "swiglu_limit", 7.0, &mc->swiglu_limit, src, err);
        if (rc) return rc;
        if (per_tok != mc->num_experts_per_tok)
            return CT_FAIL_INPUT(err, "%s: key 'experts_per_token' is %d but num_experts_per_tok is %d%s: transformers "
                                 "routes to num_experts_per_tok (make the two equal)", src, per_tok,
                                 mc->num_experts_per_tok, present(root, "num_experts_per_tok") ? "" : " (its default)");
        if (mc->swiglu_limit != 7.0)
            return CT_FAIL_INPUT(err, "%s: key 'swiglu_limit' is %g: transformers' GptOssExperts clamps at 7.0 whatever "
                                 "the file says, so an adapter trained at %g would not mean the same there (expected 7.0)",
                                 src, mc->swiglu_limit, mc->swiglu_limit);
        mc->moe_intermediate_size = mc->intermediate_size;
        mc->norm_topk_prob = true;
        for (int i = 0; i < L; i++) mc->layer_sparse[i] = true;
        break;
    }
    default:
        return CT_OK;
    }
    if (rc) return rc;
    if ((rc = require_float_range(mc->router_aux_loss_coef, -1e30, 1e30, "router_aux_loss_coef", src, err)) ||
        (rc = require_float_range(mc->swiglu_limit, -1e30, 1e30, "swiglu_limit", src, err)))
        return rc;
    if (mc->num_experts <= 0) {
        if (mc->arch != CT_ARCH_QWEN3_MOE && mc->arch != CT_ARCH_QWEN3_NEXT)
            return CT_FAIL_INPUT(err, "%s: key '%s' must be positive", src, experts_key);
        mc->shared_expert_intermediate_size = 0;
        return CT_OK; /* qwen3_moe or qwen3_next with 0 experts is a dense model */
    }
    if (mc->gdn) {
        int sh = mc->shared_expert_intermediate_size;
        if ((rc = require_positive(sh, "shared_expert_intermediate_size", src, err)) ||
            (rc = require_at_most(sh, CT_MAX_INTERMEDIATE, "shared_expert_intermediate_size", src, err)))
            return rc;
    }
    if ((rc = require_at_most(mc->num_experts, CT_MAX_EXPERTS, experts_key, src, err)) ||
        (rc = require_at_most(mc->moe_intermediate_size, CT_MAX_INTERMEDIATE, "moe_intermediate_size", src, err)))
        return rc;
    if (mc->num_experts_per_tok <= 0 || mc->num_experts_per_tok > mc->num_experts)
        return CT_FAIL_INPUT(err, "%s: key 'num_experts_per_tok' must be in [1, %s=%d] (found %d)", src,
                             experts_key, mc->num_experts, mc->num_experts_per_tok);
    return require_positive(mc->moe_intermediate_size, "moe_intermediate_size", src, err);
}

/* ---- Gated DeltaNet layers ---- */

/* Which layers are GDN: layer_types when given (with transformers' legacy names
 * "mamba" and "attention"), else every full_attention_interval-th layer is
 * full attention ((i + 1) % interval == 0), as the config classes build it. */
static int parse_gdn_layer_types(ct_model_config *mc, const json_value *root, const char *src, ct_error *err)
{
    int L = mc->num_hidden_layers;
    if (!present(root, "layer_types")) {
        int interval = 4;
        int rc = opt_int(root, "full_attention_interval", 4, &interval, src, err);
        if (rc) return rc;
        if (interval <= 0) return CT_FAIL_INPUT(err, "%s: key 'full_attention_interval' must be positive (found %d)", src, interval);
        for (int i = 0; i < L; i++) mc->layer_linear[i] = (i + 1) % interval != 0;
        return CT_OK;
    }
    const json_value *lt = json_get(root, "layer_types");
    if (lt->type != JSON_ARRAY) return CT_FAIL_INPUT(err, "%s: key 'layer_types': expected an array", src);
    if (lt->count != (size_t)L)
        return CT_FAIL_INPUT(err, "%s: key 'layer_types' has %zu entries, num_hidden_layers is %d", src, lt->count, L);
    for (int i = 0; i < L; i++) {
        const json_value *v = lt->items[i];
        const char *t = v->type == JSON_STRING ? v->string : "";
        if (!strcmp(t, "linear_attention") || !strcmp(t, "mamba")) mc->layer_linear[i] = true;
        else if (!strcmp(t, "full_attention") || !strcmp(t, "attention")) mc->layer_linear[i] = false;
        else return CT_FAIL_INPUT(err, "%s: layer_types[%d]: expected \"linear_attention\" or \"full_attention\"", src, i);
    }
    return CT_OK;
}

/* GDN geometry with the defaults of Qwen3NextConfig / Qwen3_5TextConfig (equal
 * in all three families), the per-layer split, and the always-gated attention. */
static int parse_gdn(ct_model_config *mc, const json_value *root, const char *src, ct_error *err)
{
    static const char *keys[] = {"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                 "linear_value_head_dim", "linear_conv_kernel_dim"};
    static const int dflt[] = {16, 32, 128, 128, 4};
    static const int caps[] = {CT_MAX_HEADS, CT_MAX_HEADS, CT_MAX_HEAD_DIM, CT_MAX_HEAD_DIM, CT_MAX_CONV_WIDTH};
    int *out[] = {&mc->linear_num_key_heads, &mc->linear_num_value_heads, &mc->linear_key_head_dim,
                  &mc->linear_value_head_dim, &mc->linear_conv_kernel_dim};
    int rc = CT_OK;
    for (int i = 0; i < 5 && !rc; i++) {
        rc = opt_int(root, keys[i], dflt[i], out[i], src, err);
        if (!rc) rc = require_positive(*out[i], keys[i], src, err);
        if (!rc) rc = require_at_most(*out[i], caps[i], keys[i], src, err);
    }
    if (rc) return rc;
    if (mc->linear_num_value_heads % mc->linear_num_key_heads != 0)
        return CT_FAIL_INPUT(err, "%s: linear_num_value_heads (%d) is not a multiple of linear_num_key_heads (%d)", src,
                             mc->linear_num_value_heads, mc->linear_num_key_heads);
    if ((rc = parse_gdn_layer_types(mc, root, src, err))) return rc;
    /* transformers has no switch for the output gate: a file that turns it off
     * describes a model HF does not run. */
    bool gate = true;
    if ((rc = opt_bool(root, "attn_output_gate", true, &gate, src, err))) return rc;
    if (!gate)
        return CT_FAIL_INPUT(err, "%s: key 'attn_output_gate' is false: transformers' %s attention is always gated "
                             "(expected true or absent)", src, mc->model_type);
    mc->attn_output_gate = true;
    mc->norm_zero_centred = true;
    mc->gdn_grouped_proj = mc->arch == CT_ARCH_QWEN3_NEXT;
    if ((rc = opt_int(root, "mtp_num_hidden_layers", 0, &mc->mtp_num_hidden_layers, src, err))) return rc;
    if (mc->mtp_num_hidden_layers < 0)
        return CT_FAIL_INPUT(err, "%s: key 'mtp_num_hidden_layers' must be >= 0 (found %d)", src, mc->mtp_num_hidden_layers);
    return CT_OK;
}

/* ---- config.json ---- */

/* An fp8 quantization_config (fp8.h): E4M3 weights in 128x128 blocks, the
 * activations quantized at run time. The tensors say which weights are FP8. */
static int parse_fp8_quantization(const json_value *q, const char *src, ct_error *err)
{
    const json_value *bs = json_get(q, "weight_block_size");
    if (bs && bs->type != JSON_NULL &&
        (bs->type != JSON_ARRAY || bs->count != 2 || bs->items[0]->type != JSON_NUMBER ||
         bs->items[1]->type != JSON_NUMBER || bs->items[0]->number != FP8_BLOCK || bs->items[1]->number != FP8_BLOCK))
        return CT_FAIL_INPUT(err, "%s: quantization_config.weight_block_size must be [128, 128] (ctune reads FP8 "
                             "weights in 128x128 blocks)", src);
    const json_value *a = json_get(q, "activation_scheme");
    if (a && a->type != JSON_NULL && (a->type != JSON_STRING || strcmp(a->string, "dynamic") != 0))
        return CT_FAIL_INPUT(err, "%s: quantization_config.activation_scheme must be \"dynamic\" (static input "
                             "scales are not supported)", src);
    const json_value *f = json_get(q, "fmt");
    if (f && f->type != JSON_NULL && (f->type != JSON_STRING || strcmp(f->string, "e4m3") != 0))
        return CT_FAIL_INPUT(err, "%s: quantization_config.fmt must be \"e4m3\" (ctune reads E4M3 weights)", src);
    return CT_OK;
}

/* quantization_config (top level, also for the multimodal wrappers): the 4-bit
 * forms ctune reads; any other method is refused here rather than failing on
 * its tensors' names later. */
static int parse_quantization(ct_model_config *mc, const json_value *root, const char *src, ct_error *err)
{
    const json_value *q = json_get(root, "quantization_config");
    mc->quant_method = CT_QUANT_NONE;
    if (!q || q->type == JSON_NULL) return CT_OK;
    if (q->type != JSON_OBJECT) return CT_FAIL_INPUT(err, "%s: key 'quantization_config': expected an object", src);
    const json_value *m = json_get_type(q, "quant_method", JSON_STRING);
    if (!m) return CT_FAIL_INPUT(err, "%s: quantization_config has no quant_method string", src);
    if (!strcmp(m->string, "mxfp4")) { /* the tensors say which experts are MXFP4; the config must parse */
        mxfp4_config mx;
        mc->quant_method = CT_QUANT_MXFP4;
        return mxfp4_read_config(q, src, &mx, err);
    }
    if (!strcmp(m->string, "fp8")) {
        mc->quant_method = CT_QUANT_FP8;
        return parse_fp8_quantization(q, src, err);
    }
    if (strcmp(m->string, "bitsandbytes") != 0)
        return CT_FAIL_INPUT(err, "%s: quantization_config.quant_method '%s' is not supported (ctune reads "
                             "bitsandbytes 4-bit, mxfp4 and fp8 checkpoints; dequantize this one to bf16 first)", src,
                             m->string);
    bool in4 = false, in8 = false;
    int rc = opt_bool(q, "load_in_4bit", false, &in4, src, err);
    if (!rc) rc = opt_bool(q, "load_in_8bit", false, &in8, src, err);
    if (rc) return rc;
    if (in8 || !in4)
        return CT_FAIL_INPUT(err, "%s: quantization_config: bitsandbytes %s is not supported (ctune reads 4-bit "
                             "checkpoints: load_in_4bit true)", src, in8 ? "8-bit (load_in_8bit)" : "without load_in_4bit");
    mc->quant_method = CT_QUANT_BNB4;
    return CT_OK;
}

static int parse_root(ct_model_config *mc, const json_value *root, const char *src, ct_error *err)
{
    if (!root || root->type != JSON_OBJECT) return CT_FAIL_INPUT(err, "%s: expected a JSON object", src);
    const char *mt = NULL;
    int rc = opt_string(root, "model_type", &mt, src, err);
    if (rc) return rc;
    if (!mt) return CT_FAIL_INPUT(err, "%s: key 'model_type' is missing (supported: " SUPPORTED_ARCHS ")", src);
    size_t a = 0;
    while (a < N_ARCHS && strcmp(arch_names[a].name, mt) != 0) a++;
    if (a == N_ARCHS) return CT_FAIL_INPUT(err, "%s: model_type '%s' is not supported (supported: " SUPPORTED_ARCHS ")", src, mt);
    mc->arch = arch_names[a].arch;
    snprintf(mc->model_type, sizeof mc->model_type, "%s", mt);
    mc->gdn = mc->arch == CT_ARCH_QWEN3_5 || mc->arch == CT_ARCH_QWEN3_5_MOE || mc->arch == CT_ARCH_QWEN3_NEXT;
    snprintf(mc->tensor_prefix, sizeof mc->tensor_prefix, "model.");

    const json_value *archs = json_get_type(root, "architectures", JSON_ARRAY);
    if (archs && archs->count > 0 && archs->items[0]->type == JSON_STRING)
        snprintf(mc->architectures, sizeof mc->architectures, "%s", archs->items[0]->string);

    if ((rc = parse_quantization(mc, root, src, err))) return rc;

    /* The multimodal wrappers hold the language model in text_config and its
     * tensors under model.language_model.; everything below reads text_config. */
    char text_src[600];
    bool wrapper = !strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_moe");
    bool wrapper_tie = false;
    if (wrapper) {
        if ((rc = opt_bool(root, "tie_word_embeddings", false, &wrapper_tie, src, err))) return rc;
        if (!present(root, "text_config"))
            return CT_FAIL_INPUT(err, "%s: key 'text_config' is missing (model_type %s holds its language model there)", src, mt);
        root = json_get(root, "text_config");
        if (root->type != JSON_OBJECT) return CT_FAIL_INPUT(err, "%s: key 'text_config': expected an object", src);
        snprintf(text_src, sizeof text_src, "%s: text_config", src);
        src = text_src;
        snprintf(mc->tensor_prefix, sizeof mc->tensor_prefix, "model.language_model.");
    }

    rc = req_int(root, "vocab_size", &mc->vocab_size, src, err);
    if (!rc) rc = req_int(root, "hidden_size", &mc->hidden_size, src, err);
    /* Qwen3_5MoeTextConfig has no dense MLP; Qwen3NextConfig's is for mlp_only_layers */
    if (!rc && mc->arch == CT_ARCH_QWEN3_NEXT) rc = opt_int(root, "intermediate_size", 5632, &mc->intermediate_size, src, err);
    else if (!rc && mc->arch != CT_ARCH_QWEN3_5_MOE) rc = req_int(root, "intermediate_size", &mc->intermediate_size, src, err);
    if (!rc) rc = req_int(root, "num_hidden_layers", &mc->num_hidden_layers, src, err);
    if (!rc) rc = req_int(root, "num_attention_heads", &mc->num_attention_heads, src, err);
    if (rc) return rc;
    static const char *sizes[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"};
    const int vals[] = {mc->vocab_size, mc->hidden_size, mc->intermediate_size, mc->num_hidden_layers, mc->num_attention_heads};
    for (int i = 0; i < 5; i++)
        if ((i != 2 || mc->arch != CT_ARCH_QWEN3_5_MOE) && (rc = require_positive(vals[i], sizes[i], src, err))) return rc;
    const int caps[] = {CT_MAX_VOCAB, CT_MAX_HIDDEN, CT_MAX_INTERMEDIATE, CT_MAX_LAYERS, CT_MAX_HEADS};
    for (int i = 0; i < 5; i++)
        if ((rc = require_at_most(vals[i], caps[i], sizes[i], src, err))) return rc;

    /* An absent head_dim: Qwen3Config's default is 128, GptOssConfig's 64 (its
     * hidden/heads only for an explicit null), the hybrids' 256; every other
     * family hidden/heads. Absent KV heads: as many as query heads, except in
     * the hybrids (Qwen3_5TextConfig 4, the MoE ones 2). */
    int hd_dflt = mc->hidden_size / mc->num_attention_heads;
    if (mc->arch == CT_ARCH_QWEN3) hd_dflt = 128;
    if (mc->arch == CT_ARCH_GPT_OSS && !json_get(root, "head_dim")) hd_dflt = 64;
    if (mc->gdn) hd_dflt = 256;
    int kv_dflt = mc->arch == CT_ARCH_QWEN3_5 ? 4 : mc->gdn ? 2 : mc->num_attention_heads;
    rc = opt_int(root, "num_key_value_heads", kv_dflt, &mc->num_key_value_heads, src, err);
    if (!rc) rc = opt_int(root, "head_dim", hd_dflt, &mc->head_dim, src, err);
    if (rc) return rc;
    if ((rc = require_positive(mc->num_key_value_heads, "num_key_value_heads", src, err))) return rc;
    if ((rc = require_positive(mc->head_dim, "head_dim", src, err))) return rc;
    if ((rc = require_at_most(mc->head_dim, CT_MAX_HEAD_DIM, "head_dim", src, err))) return rc;
    if (mc->num_attention_heads % mc->num_key_value_heads != 0)
        return CT_FAIL_INPUT(err, "%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", src,
                             mc->num_attention_heads, mc->num_key_value_heads);
    if (mc->head_dim % 2 != 0) return CT_FAIL_INPUT(err, "%s: key 'head_dim' must be even for RoPE (found %d)", src, mc->head_dim);

    bool eps_1e5 = mc->arch == CT_ARCH_GPT_OSS || mc->arch == CT_ARCH_MIXTRAL;
    int maxpos_dflt = mc->arch == CT_ARCH_LLAMA ? 2048
                    : mc->arch == CT_ARCH_MISTRAL || mc->arch == CT_ARCH_MIXTRAL || mc->arch == CT_ARCH_GPT_OSS ? 131072
                    : 32768;
    rc = opt_double(root, "rms_norm_eps", eps_1e5 ? 1e-5 : 1e-6, &mc->rms_norm_eps, src, err);
    if (!rc) rc = opt_int(root, "max_position_embeddings", maxpos_dflt, &mc->max_position_embeddings, src, err);
    if (!rc) rc = opt_bool(root, "tie_word_embeddings", false, &mc->tie_word_embeddings, src, err);
    if (!rc) rc = opt_double(root, "initializer_range", 0.02, &mc->initializer_range, src, err);
    if (rc) return rc;
    /* Qwen3_5ForCausalLM ties by text_config's flag, the ForConditionalGeneration
     * class by the wrapper's (both default false): only equal flags mean one model. */
    if (wrapper && mc->tie_word_embeddings != wrapper_tie)
        return CT_FAIL_INPUT(err, "%s: key 'tie_word_embeddings' is %s but the wrapper's is %s%s: transformers' "
                             "ForCausalLM class reads the first, its ForConditionalGeneration class the second "
                             "(make them equal)", src, mc->tie_word_embeddings ? "true" : "false",
                             wrapper_tie ? "true" : "false", present(root, "tie_word_embeddings") ? "" : " (its default)");
    if (!(mc->rms_norm_eps > 0)) return CT_FAIL_INPUT(err, "%s: key 'rms_norm_eps' must be positive", src);
    if ((rc = require_float_range(mc->rms_norm_eps, 0, 1, "rms_norm_eps", src, err))) return rc;
    if ((rc = require_positive(mc->max_position_embeddings, "max_position_embeddings", src, err))) return rc;
    if (!(mc->initializer_range >= 0)) return CT_FAIL_INPUT(err, "%s: key 'initializer_range' must be >= 0", src);
    if ((rc = require_float_range(mc->initializer_range, 0, 1e3, "initializer_range", src, err))) return rc;

    /* gpt_oss's MLP is its own clamped SwiGLU; hidden_act does not select it. */
    const char *act = NULL;
    if ((rc = opt_string(root, "hidden_act", &act, src, err))) return rc;
    if (mc->arch != CT_ARCH_GPT_OSS && act && strcmp(act, "silu") != 0)
        return CT_FAIL_INPUT(err, "%s: hidden_act '%s' is not supported (ctune implements silu)", src, act);

    const char *dtype = NULL;
    if ((rc = opt_string(root, "torch_dtype", &dtype, src, err))) return rc;
    if (!dtype && (rc = opt_string(root, "dtype", &dtype, src, err))) return rc; /* v5 name */
    snprintf(mc->torch_dtype, sizeof mc->torch_dtype, "%s", dtype ? dtype : "bfloat16");

    if ((rc = parse_rope(mc, root, src, err))) return rc;
    if (!(mc->rope.theta > 0)) return CT_FAIL_INPUT(err, "%s: key 'rope_theta' must be positive", src);
    /* Checked before model_rope_dim converts head_dim * factor to an int. */
    if (!(mc->rope.partial_rotary_factor > 0 && mc->rope.partial_rotary_factor <= 1))
        return CT_FAIL_INPUT(err, "%s: key 'partial_rotary_factor' is %g (expected a number in (0, 1])", src,
                             mc->rope.partial_rotary_factor);
    int rd = model_rope_dim(mc);
    if (rd <= 0 || rd % 2 != 0 || rd > mc->head_dim)
        return CT_FAIL_INPUT(err, "%s: partial_rotary_factor %g gives rotary dim %d (must be even, in (0, head_dim])", src,
                             mc->rope.partial_rotary_factor, rd);
    if (mc->mrope_section[0] + mc->mrope_section[1] + mc->mrope_section[2] > rd / 2)
        return CT_FAIL_INPUT(err, "%s: key 'mrope_section' sums to %d, more than the %d rotary frequencies", src,
                             mc->mrope_section[0] + mc->mrope_section[1] + mc->mrope_section[2], rd / 2);
    if ((rc = parse_attention(mc, root, src, err))) return rc;
    if (mc->gdn && (rc = parse_gdn(mc, root, src, err))) return rc;
    return parse_moe(mc, root, src, err);
}

int model_config_parse(ct_model_config *mc, const char *text, size_t len, const char *source, ct_error *err)
{
    memset(mc, 0, sizeof *mc);
    json_doc *doc = json_parse(text, len, source, err);
    if (!doc) return err ? err->code : CT_ERR_INPUT;
    int rc = parse_root(mc, json_root(doc), source, err);
    json_free(doc);
    return rc;
}

int model_config_load(ct_model_config *mc, const char *path, ct_error *err)
{
    struct stat st;
    size_t plen = strlen(path) + sizeof "/config.json";
    char *file = ct_malloc(plen);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(file, plen, "%s/config.json", path);
    else snprintf(file, plen, "%s", path);
    size_t len;
    char *text = ct_read_file_max(file, CT_JSON_MAX_BYTES, &len, err);
    int rc = text ? model_config_parse(mc, text, len, file, err) : err ? err->code : CT_ERR_INPUT;
    free(text);
    free(file);
    return rc;
}

/* ---- tensor specs ---- */

typedef struct spec_list { ct_tensor_spec *v; size_t n, cap; } spec_list;

static void spec_add(spec_list *s, ct_tensor_kind kind, bool expert, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void spec_add(spec_list *s, ct_tensor_kind kind, bool expert, int ndim, const int64_t *shape, const char *fmt, ...)
{
    if (s->n == s->cap) s->v = ct_realloc(s->v, (s->cap = s->cap ? 2 * s->cap : 64) * sizeof *s->v);
    ct_tensor_spec *t = &s->v[s->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->kind = kind;
    t->expert = expert;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
}
#define SHAPE(...) (const int64_t[]){__VA_ARGS__}
#define NDIM(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define ADD(kind, expert, dims, ...) spec_add(&s, kind, expert, NDIM dims, SHAPE dims, __VA_ARGS__)

/* A GDN layer's mixer (p names the layer). key_dim = Hk*dk, value_dim = Hv*dv;
 * the conv runs over conv_dim = 2*key_dim + value_dim channels [q | k | v]. */
static void add_gdn_mixer(spec_list *sl, const ct_model_config *mc, const char *p)
{
#define ADDL(kind, dims, ...) spec_add(sl, kind, false, NDIM dims, SHAPE dims, __VA_ARGS__)
    const int64_t H = mc->hidden_size, Hv = mc->linear_num_value_heads;
    const int64_t Kd = (int64_t)mc->linear_num_key_heads * mc->linear_key_head_dim;
    const int64_t Vd = Hv * mc->linear_value_head_dim, conv = 2 * Kd + Vd;
    if (mc->gdn_grouped_proj) { /* rows grouped per key head: [q k v z] and [b a] */
        ADDL(CT_TENSOR_LINEAR, (conv + Vd, H), "%s.linear_attn.in_proj_qkvz.weight", p);
        ADDL(CT_TENSOR_LINEAR, (2 * Hv, H), "%s.linear_attn.in_proj_ba.weight", p);
    } else {
        ADDL(CT_TENSOR_LINEAR, (conv, H), "%s.linear_attn.in_proj_qkv.weight", p);
        ADDL(CT_TENSOR_LINEAR, (Vd, H), "%s.linear_attn.in_proj_z.weight", p);
        ADDL(CT_TENSOR_LINEAR, (Hv, H), "%s.linear_attn.in_proj_b.weight", p);
        ADDL(CT_TENSOR_LINEAR, (Hv, H), "%s.linear_attn.in_proj_a.weight", p);
    }
    ADDL(CT_TENSOR_CONV, (conv, 1, mc->linear_conv_kernel_dim), "%s.linear_attn.conv1d.weight", p);
    ADDL(CT_TENSOR_DT_BIAS, (Hv), "%s.linear_attn.dt_bias", p);
    ADDL(CT_TENSOR_A_LOG, (Hv), "%s.linear_attn.A_log", p);
    ADDL(CT_TENSOR_NORM, (mc->linear_value_head_dim), "%s.linear_attn.norm.weight", p); /* gated: plain w, init 1 */
    ADDL(CT_TENSOR_LINEAR, (H, Vd), "%s.linear_attn.out_proj.weight", p);
#undef ADDL
}

/* A full-attention layer's mixer; with the output gate q_proj's rows are, per
 * head, D query rows then D gate rows. */
static void add_attention(spec_list *sl, const ct_model_config *mc, const char *p)
{
#define ADDL(kind, dims, ...) spec_add(sl, kind, false, NDIM dims, SHAPE dims, __VA_ARGS__)
    const int64_t H = mc->hidden_size, D = mc->head_dim;
    const int64_t Q = (int64_t)mc->num_attention_heads * D, KV = (int64_t)mc->num_key_value_heads * D;
    const int64_t Qrows = mc->attn_output_gate ? 2 * Q : Q;
    const ct_tensor_kind NORM = mc->norm_zero_centred ? CT_TENSOR_NORM_ZERO : CT_TENSOR_NORM;
    ADDL(CT_TENSOR_LINEAR, (Qrows, H), "%s.self_attn.q_proj.weight", p);
    ADDL(CT_TENSOR_LINEAR, (KV, H), "%s.self_attn.k_proj.weight", p);
    ADDL(CT_TENSOR_LINEAR, (KV, H), "%s.self_attn.v_proj.weight", p);
    ADDL(CT_TENSOR_LINEAR, (H, Q), "%s.self_attn.o_proj.weight", p);
    if (mc->attention_bias) {
        ADDL(CT_TENSOR_BIAS, (Qrows), "%s.self_attn.q_proj.bias", p);
        ADDL(CT_TENSOR_BIAS, (KV), "%s.self_attn.k_proj.bias", p);
        ADDL(CT_TENSOR_BIAS, (KV), "%s.self_attn.v_proj.bias", p);
    }
    if (mc->o_proj_bias) ADDL(CT_TENSOR_BIAS, (H), "%s.self_attn.o_proj.bias", p);
    if (mc->qk_norm) {
        ADDL(NORM, (D), "%s.self_attn.q_norm.weight", p);
        ADDL(NORM, (D), "%s.self_attn.k_norm.weight", p);
    }
    if (mc->attention_sinks) ADDL(CT_TENSOR_SINKS, (mc->num_attention_heads), "%s.self_attn.sinks", p);
#undef ADDL
}

ct_tensor_spec *model_tensor_specs(const ct_model_config *mc, size_t *n)
{
    spec_list s = {0};
    const int64_t V = mc->vocab_size, H = mc->hidden_size, I = mc->intermediate_size;
    const int64_t E = mc->num_experts, Im = mc->moe_intermediate_size, Is = mc->shared_expert_intermediate_size;
    const ct_tensor_kind NORM = mc->norm_zero_centred ? CT_TENSOR_NORM_ZERO : CT_TENSOR_NORM;
    const char *pre = mc->tensor_prefix[0] ? mc->tensor_prefix : "model.";
    ADD(CT_TENSOR_EMBEDDING, false, (V, H), "%sembed_tokens.weight", pre);
    for (int l = 0; l < mc->num_hidden_layers; l++) {
        char p[64];
        snprintf(p, sizeof p, "%slayers.%d", pre, l);
        ADD(NORM, false, (H), "%s.input_layernorm.weight", p);
        if (mc->gdn && mc->layer_linear[l]) add_gdn_mixer(&s, mc, p);
        else add_attention(&s, mc, p);
        ADD(NORM, false, (H), "%s.post_attention_layernorm.weight", p);
        if (!mc->layer_sparse[l]) {
            ADD(CT_TENSOR_LINEAR, false, (I, H), "%s.mlp.gate_proj.weight", p);
            ADD(CT_TENSOR_LINEAR, false, (I, H), "%s.mlp.up_proj.weight", p);
            ADD(CT_TENSOR_LINEAR, false, (H, I), "%s.mlp.down_proj.weight", p);
            if (mc->mlp_bias) {
                ADD(CT_TENSOR_BIAS, false, (I), "%s.mlp.gate_proj.bias", p);
                ADD(CT_TENSOR_BIAS, false, (I), "%s.mlp.up_proj.bias", p);
                ADD(CT_TENSOR_BIAS, false, (H), "%s.mlp.down_proj.bias", p);
            }
        } else if (mc->arch == CT_ARCH_QWEN3_MOE || mc->gdn) {
            /* the hybrids' experts on disk: per expert, as HF saves them (it fuses them on load) */
            ADD(CT_TENSOR_LINEAR, false, (E, H), "%s.mlp.gate.weight", p);
            for (int e = 0; e < E; e++) {
                ADD(CT_TENSOR_LINEAR, true, (Im, H), "%s.mlp.experts.%d.gate_proj.weight", p, e);
                ADD(CT_TENSOR_LINEAR, true, (Im, H), "%s.mlp.experts.%d.up_proj.weight", p, e);
                ADD(CT_TENSOR_LINEAR, true, (H, Im), "%s.mlp.experts.%d.down_proj.weight", p, e);
            }
            if (Is > 0) {
                ADD(CT_TENSOR_LINEAR, false, (Is, H), "%s.mlp.shared_expert.gate_proj.weight", p);
                ADD(CT_TENSOR_LINEAR, false, (Is, H), "%s.mlp.shared_expert.up_proj.weight", p);
                ADD(CT_TENSOR_LINEAR, false, (H, Is), "%s.mlp.shared_expert.down_proj.weight", p);
                ADD(CT_TENSOR_LINEAR, false, (1, H), "%s.mlp.shared_expert_gate.weight", p);
            }
        } else if (mc->arch == CT_ARCH_MIXTRAL) {
            ADD(CT_TENSOR_LINEAR, false, (E, H), "%s.block_sparse_moe.gate.weight", p);
            for (int e = 0; e < E; e++) {
                ADD(CT_TENSOR_LINEAR, true, (Im, H), "%s.block_sparse_moe.experts.%d.w1.weight", p, e);
                ADD(CT_TENSOR_LINEAR, true, (H, Im), "%s.block_sparse_moe.experts.%d.w2.weight", p, e);
                ADD(CT_TENSOR_LINEAR, true, (Im, H), "%s.block_sparse_moe.experts.%d.w3.weight", p, e);
            }
        } else { /* gpt_oss, bf16 layout: experts stored [E, in, out] for x @ W */
            ADD(CT_TENSOR_LINEAR, false, (E, H), "%s.mlp.router.weight", p);
            ADD(CT_TENSOR_BIAS, false, (E), "%s.mlp.router.bias", p);
            ADD(CT_TENSOR_LINEAR, true, (E, H, 2 * Im), "%s.mlp.experts.gate_up_proj", p);
            ADD(CT_TENSOR_BIAS, true, (E, 2 * Im), "%s.mlp.experts.gate_up_proj_bias", p);
            ADD(CT_TENSOR_LINEAR, true, (E, Im, H), "%s.mlp.experts.down_proj", p);
            ADD(CT_TENSOR_BIAS, true, (E, H), "%s.mlp.experts.down_proj_bias", p);
        }
    }
    ADD(NORM, false, (H), "%snorm.weight", pre);
    if (!mc->tie_word_embeddings) ADD(CT_TENSOR_LM_HEAD, false, (V, H), "lm_head.weight");
    *n = s.n;
    return s.v;
}

size_t model_tensor_numel(const ct_tensor_spec *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

ct_param_counts model_param_counts(const ct_model_config *mc)
{
    ct_param_counts c = {0};
    size_t n, expert_matmul = 0;
    ct_tensor_spec *specs = model_tensor_specs(mc, &n);
    for (size_t i = 0; i < n; i++) {
        size_t k = model_tensor_numel(&specs[i]);
        c.total += k;
        switch (specs[i].kind) {
        case CT_TENSOR_EMBEDDING: c.embedding += k; break;
        case CT_TENSOR_LM_HEAD: c.embedding += k; c.per_token_active += k; break;
        case CT_TENSOR_LINEAR:
            if (specs[i].expert) expert_matmul += k;
            else c.per_token_active += k;
            break;
        default: break; /* norms, biases, sinks: not matmul parameters */
        }
    }
    free(specs);
    /* A token passes through K of E experts; the LM head counts even when tied. */
    if (mc->num_experts > 0) c.per_token_active += expert_matmul / (size_t)mc->num_experts * (size_t)mc->num_experts_per_tok;
    if (mc->tie_word_embeddings) c.per_token_active += (size_t)mc->vocab_size * (size_t)mc->hidden_size;
    return c;
}

/* ---- checking a checkpoint against the config ---- */

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t off = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && off < cap; i++)
        off += (size_t)snprintf(buf + off, cap - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < cap) snprintf(buf + off, cap - off, "]");
}

int model_check_weights(const ct_model_config *mc, const st_reader *r, ct_error *err)
{
    /* Missing tensors have no file; name the folder of the checkpoint instead. */
    char where[512] = "checkpoint";
    if (st_count(r) > 0) {
        snprintf(where, sizeof where, "%s", st_at(r, 0)->file);
        char *slash = strrchr(where, '/');
        if (slash) *slash = 0;
        else snprintf(where, sizeof where, ".");
    }
    size_t n;
    ct_tensor_spec *specs = model_tensor_specs(mc, &n);
    int rc = CT_OK;
    for (size_t i = 0; i < n && rc == CT_OK; i++) {
        const ct_tensor_spec *s = &specs[i];
        const st_tensor *t = st_find(r, s->name);
        char want[96], got[96], packed[200];
        if (!t) {
            snprintf(packed, sizeof packed, "%s_blocks", s->name);
            const char *ex = s->expert ? strstr(s->name, ".mlp.experts.") : NULL;
            char fused[200];
            snprintf(fused, sizeof fused, "%.*s.mlp.experts.gate_up_proj", ex ? (int)(ex - s->name) : 0, s->name);
            if (ex && st_find(r, fused))
                rc = CT_FAIL_INPUT(err, "%s: tensor %s is missing: the experts are stored fused (%s); ctune reads "
                                   "them per expert for now (save the model with transformers' save_pretrained, "
                                   "which writes that form)", where, s->name, fused);
            else if (st_find(r, packed) && mc->arch == CT_ARCH_GPT_OSS && s->expert)
                continue; /* MXFP4 experts: model.c reads and checks _blocks and _scales */
            else if (st_find(r, packed))
                rc = CT_FAIL_INPUT(err, "%s: tensor %s is stored quantized (%s); ctune reads that form for "
                                   "gpt_oss experts only (dequantize the checkpoint first)", where, s->name, packed);
            else
                rc = CT_FAIL_INPUT(err, "%s: tensor %s is missing (model_type %s expects it)", where, s->name, mc->model_type);
            break;
        }
        if (quant4_is_quantized(r, s->name)) { /* a bitsandbytes 4-bit weight: its quant_state holds the shape */
            quant4_info qi;
            if ((rc = quant4_read_info(r, s->name, &qi, err))) break;
            bool same = qi.ndim == s->ndim;
            for (int d = 0; same && d < s->ndim; d++) same = qi.shape[d] == s->shape[d];
            if (!same) {
                format_shape(got, sizeof got, qi.ndim, qi.shape);
                format_shape(want, sizeof want, s->ndim, s->shape);
                rc = CT_FAIL_INPUT(err, "%s: tensor %s: 4-bit shape %s does not match the config's %s", t->file, s->name,
                                   got, want);
                break;
            }
            continue;
        }
        /* an FP8 weight: its shape is checked below (model.c decodes some with the
         * file's shape); model.c reads and checks its dtype and scales (fp8_read_weight) */
        bool fp8 = fp8_is_quantized(r, s->name) && s->ndim == 2;
        if (fp8 && mc->quant_method != CT_QUANT_FP8) {
            rc = CT_FAIL_INPUT(err, "%s: tensor %s is stored in FP8 but config.json has no fp8 "
                               "quantization_config", t->file, s->name);
            break;
        }
        if (!fp8 && t->dtype != CT_DTYPE_BF16 && t->dtype != CT_DTYPE_F16 && t->dtype != CT_DTYPE_F32) {
            rc = CT_FAIL_INPUT(err, "%s: tensor %s: dtype %s is not supported (need BF16, F16 or F32)", t->file, s->name,
                               ct_dtype_name(t->dtype));
            break;
        }
        bool same = t->ndim == s->ndim;
        for (int d = 0; same && d < s->ndim; d++) same = t->shape[d] == s->shape[d];
        if (!same) {
            format_shape(got, sizeof got, t->ndim, t->shape);
            format_shape(want, sizeof want, s->ndim, s->shape);
            rc = CT_FAIL_INPUT(err, "%s: tensor %s: shape %s does not match the config's %s", t->file, s->name, got, want);
        }
    }
    free(specs);
    return rc;
}
