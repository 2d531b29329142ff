/* model.c — loads an HF checkpoint onto a backend with fused q|k|v and gate|up
 * weights, and the experts of sparse layers stacked per projection (see
 * model.h). The graph itself lives in graph.c and graph_moe.c. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const module_names[CT_MOD_COUNT] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "in_proj_qkvz", "in_proj_ba", "out_proj",
    "shared_expert_gate"};

const char *model_module_name(ct_module mod) { return module_names[mod]; }

const char *model_module_parent(ct_module mod)
{
    return mod <= CT_MOD_O ? "self_attn" : model_module_is_mlp(mod) || mod == CT_MOD_SH_GATE ? "mlp" : "linear_attn";
}

void model_module_path(char *out, size_t len, ct_arch arch, ct_module mod)
{
    bool shared = arch == CT_ARCH_QWEN3_5_MOE && model_module_is_mlp(mod);
    snprintf(out, len, "%s.%s%s", model_module_parent(mod), shared ? "shared_expert." : "", model_module_name(mod));
}

void model_module_shape(const ct_model_config *c, ct_module mod, int *in, int *out)
{
    int H = c->hidden_size, I = c->intermediate_size;
    int Q = c->num_attention_heads * c->head_dim, KV = c->num_key_value_heads * c->head_dim;
    int Vd = c->gdn ? model_gdn_value_dim(c) : 0, Hv = c->linear_num_value_heads;
    switch (mod) {
    case CT_MOD_Q:      *in = H; *out = model_attn_gated(c) ? 2 * Q : Q; break;
    case CT_MOD_K:
    case CT_MOD_V:      *in = H; *out = KV; break;
    case CT_MOD_O:      *in = Q; *out = H;  break;
    case CT_MOD_GATE:
    case CT_MOD_UP:     *in = H; *out = I;  break;
    case CT_MOD_IN_QKV: *in = H; *out = c->gdn ? model_gdn_conv_dim(c) : 0; break;
    case CT_MOD_IN_Z:   *in = H; *out = Vd; break;
    case CT_MOD_IN_B:
    case CT_MOD_IN_A:   *in = H; *out = Hv; break;
    case CT_MOD_IN_QKVZ: *in = H; *out = c->gdn ? model_gdn_conv_dim(c) + Vd : 0; break;
    case CT_MOD_IN_BA:  *in = H; *out = 2 * Hv; break;
    case CT_MOD_OUT:    *in = Vd; *out = H; break;
    case CT_MOD_SH_GATE: *in = H; *out = 1; break;
    default:            *in = I; *out = H;  break;
    }
}

int model_module_layer_shape(const ct_model_config *c, int l, ct_module mod, int *in, int *out)
{
    model_module_shape(c, mod, in, out);
    bool gdn_mod = mod >= CT_MOD_IN_QKV && mod <= CT_MOD_OUT;
    bool grouped_mod = mod == CT_MOD_IN_QKVZ || mod == CT_MOD_IN_BA;
    int H = c->hidden_size, I = c->moe_intermediate_size, Is = c->shared_expert_intermediate_size;
    bool shared = (c->arch == CT_ARCH_QWEN3_5_MOE || c->arch == CT_ARCH_QWEN3_NEXT) && c->layer_sparse[l] && Is > 0;
    if (mod == CT_MOD_SH_GATE) return shared ? 1 : 0;
    if (gdn_mod && mod != CT_MOD_OUT && grouped_mod != c->gdn_grouped_proj) return 0;
    if (!model_module_is_mlp(mod)) return (c->gdn && c->layer_linear[l]) == gdn_mod ? 1 : 0;
    if (!c->layer_sparse[l]) return 1;
    if (c->arch == CT_ARCH_QWEN3_5_MOE) { /* the shared expert's projections */
        *in = mod == CT_MOD_DOWN ? Is : H;
        *out = mod == CT_MOD_DOWN ? H : Is;
        return shared ? 1 : 0;
    }
    bool fused = c->arch == CT_ARCH_GPT_OSS;
    switch (mod) {
    case CT_MOD_GATE: *in = H; *out = fused ? 2 * I : I; break;
    case CT_MOD_UP:   *in = H; *out = I; if (fused) return 0; break;
    default:          *in = I; *out = H; break;
    }
    return c->num_experts;
}

typedef struct loader {
    ct_backend *be;
    const st_reader *r;
    size_t bytes;           /* backend bytes allocated so far */
    ct_error *err;
} loader;

static void *alloc_weight(loader *ld, size_t n)
{
    size_t bytes = n * ld->be->weight_bytes;
    void *p = ld->be->alloc(ld->be, bytes);
    if (!p) {
        CT_FAIL_RUNTIME(ld->err, "out of %s memory loading weights (%zu bytes more after %zu)",
                        ld->be->name, bytes, ld->bytes);
        return NULL;
    }
    ld->bytes += bytes;
    return p;
}

/* NaN and Inf among a float tensor's values (bf16, f16 or f32): one pass over
 * the mapped file, cheap next to the upload, so that a broken checkpoint is
 * an error at load and not a run of NaN losses or a generate that prints 0s. */
static size_t count_nonfinite(const st_tensor *t)
{
    size_t bad = 0;
    const unsigned char *b = t->data;
    if (t->dtype == CT_DTYPE_F32) {
#pragma omp parallel for reduction(+ : bad) schedule(static)
        for (size_t i = 0; i < t->numel; i++) {
            uint32_t u;
            memcpy(&u, b + 4 * i, 4);
            bad += (u & 0x7f800000u) == 0x7f800000u;
        }
        return bad;
    }
    const uint16_t exp = t->dtype == CT_DTYPE_BF16 ? 0x7f80 : 0x7c00; /* bf16 | f16 */
#pragma omp parallel for reduction(+ : bad) schedule(static)
    for (size_t i = 0; i < t->numel; i++) {
        uint16_t h;
        memcpy(&h, b + 2 * i, 2);
        bad += (h & exp) == exp;
    }
    return bad;
}

/* Uploads tensor NAME into dst at element offset `at`; shape was checked already. */
static int put(loader *ld, void *dst, size_t at, const char *name)
{
    const st_tensor *t = st_find(ld->r, name);
    if (!t) return CT_FAIL_INPUT(ld->err, "model: tensor '%s' is missing", name);
    size_t bad = count_nonfinite(t);
    if (bad)
        return CT_FAIL_INPUT(ld->err, "model: tensor '%s' holds %zu non-finite values of %zu (expected finite "
                             "weights: the model files are broken)", name, bad, t->numel);
    ld->be->upload_weight(ld->be, (char *)dst + at * ld->be->weight_bytes, t->data, t->dtype, t->numel);
    return CT_OK;
}

/* Allocates and fills a weight that is one tensor on disk. */
static void *load_one(loader *ld, const char *name, size_t n)
{
    void *p = alloc_weight(ld, n);
    if (p && put(ld, p, 0, name) != CT_OK) {
        ld->be->free(ld->be, p); /* not yet owned by the model, which frees the rest */
        ld->bytes -= n * ld->be->weight_bytes;
        return NULL;
    }
    return p;
}

/* A gpt_oss expert tensor [E, in, out] (for x @ W) uploaded as (E, out, in):
 * transposed on the host in its own dtype, then converted by upload_weight. */
static int put_transposed(loader *ld, void *dst, const char *name, size_t E, size_t in, size_t out)
{
    const st_tensor *t = st_find(ld->r, name);
    if (!t) return CT_FAIL_INPUT(ld->err, "model: tensor '%s' is missing", name);
    size_t bad = count_nonfinite(t);
    if (bad)
        return CT_FAIL_INPUT(ld->err, "model: tensor '%s' holds %zu non-finite values of %zu (expected finite "
                             "weights: the model files are broken)", name, bad, t->numel);
    size_t es = ct_dtype_size(t->dtype), n = in * out;
    unsigned char *tmp = ct_malloc(n * es);
    for (size_t e = 0; e < E; e++) {
        const unsigned char *src = (const unsigned char *)t->data + e * n * es;
        for (size_t i = 0; i < in; i++)
            for (size_t o = 0; o < out; o++) memcpy(tmp + (o * in + i) * es, src + (i * out + o) * es, es);
        ld->be->upload_weight(ld->be, (char *)dst + e * n * ld->be->weight_bytes, tmp, t->dtype, n);
    }
    free(tmp);
    return CT_OK;
}

/* Attention sinks as fp32 whatever the backend's weight type: the attention ops
 * read them as float. */
static float *host_f32(const st_tensor *t);

static float *load_sinks(loader *ld, const char *name, size_t n)
{
    const st_tensor *t = st_find(ld->r, name);
    if (!t) {
        CT_FAIL_INPUT(ld->err, "model: tensor '%s' is missing", name);
        return NULL;
    }
    float *host = host_f32(t);
    float *p = ld->be->alloc(ld->be, n * sizeof(float));
    if (p) {
        ld->be->upload(ld->be, p, host, n * sizeof(float));
        ld->bytes += n * sizeof(float);
    } else {
        CT_FAIL_RUNTIME(ld->err, "out of %s memory loading weights", ld->be->name);
    }
    free(host);
    return p;
}

/* A float tensor's values as fp32 on the host (bf16, f16 or f32); shape checked already. */
static float *host_f32(const st_tensor *t)
{
    float *host = ct_malloc(t->numel * sizeof(float));
    for (size_t i = 0; i < t->numel; i++) {
        if (t->dtype == CT_DTYPE_F32) {
            memcpy(&host[i], (const char *)t->data + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * i, 2);
            if (t->dtype == CT_DTYPE_BF16) host[i] = ct_bf16_to_f32(h);
            else { /* F16 */
                int ex = (h >> 10) & 0x1f, man = h & 0x3ff;
                float v = ex == 0 ? ldexpf((float)man, -24) : ex == 31 ? (man ? NAN : INFINITY)
                                                                      : ldexpf((float)(man | 0x400), ex - 25);
                host[i] = h >> 15 ? -v : v;
            }
        }
    }
    return host;
}

/* A norm weight, uploaded as stored (non-finite values refused) for either
 * convention: the zero-centred norms of a GDN hybrid (HF: x r (1 + w), 1 + w
 * in fp32) get their offset inside the norm ops, from c->norm_zero_centred at
 * each call, since a bf16 weight cannot hold 1 + w exactly. */
static void *load_norm(loader *ld, const ct_model_config *c, const char *name, size_t n)
{
    return load_one(ld, name, n);
}

/* Gated attention's q_proj rows (out = 2Q, HF order: per head h, D query rows
 * then D gate rows) uploaded into dst rows [all queries | all gates]:
 * HF row r goes to model_q_row(r). */
static int put_q_gated(loader *ld, void *dst, const char *name, size_t D, size_t Q, size_t H)
{
    const st_tensor *t = st_find(ld->r, name);
    if (!t) return CT_FAIL_INPUT(ld->err, "model: tensor '%s' is missing", name);
    if (count_nonfinite(t))
        return CT_FAIL_INPUT(ld->err, "model: tensor '%s' holds non-finite values (expected finite weights: the "
                             "model files are broken)", name);
    size_t es = ct_dtype_size(t->dtype);
    for (size_t r = 0; r < 2 * Q; r++)
        ld->be->upload_weight(ld->be, (char *)dst + (size_t)model_q_row((int)r, (int)D, (int)Q) * H * ld->be->weight_bytes,
                              (const char *)t->data + r * H * es, t->dtype, H);
    return CT_OK;
}

/* The experts and router of sparse layer l (names: docs/ARCHITECTURE.md, "Model folders"). */
static int load_sparse(loader *ld, const ct_model_config *c, int l, ct_layer_weights *w)
{
    size_t H = c->hidden_size, I = c->moe_intermediate_size, E = c->num_experts;
    char n[256];
#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    if (!(w->wgu_e = alloc_weight(ld, E * 2 * I * H)) || !(w->wdown_e = alloc_weight(ld, E * H * I)))
        return ld->err->code;
    if (c->arch == CT_ARCH_GPT_OSS) {
        if (!(w->router = load_one(ld, NAME("model.layers.%d.mlp.router.weight", l), E * H)) ||
            !(w->router_bias = load_one(ld, NAME("model.layers.%d.mlp.router.bias", l), E)) ||
            !(w->bgu_e = load_one(ld, NAME("model.layers.%d.mlp.experts.gate_up_proj_bias", l), E * 2 * I)) ||
            !(w->bdown_e = load_one(ld, NAME("model.layers.%d.mlp.experts.down_proj_bias", l), E * H)))
            return ld->err->code;
        if (put_transposed(ld, w->wgu_e, NAME("model.layers.%d.mlp.experts.gate_up_proj", l), E, H, 2 * I) ||
            put_transposed(ld, w->wdown_e, NAME("model.layers.%d.mlp.experts.down_proj", l), E, I, H))
            return ld->err->code;
        return CT_OK;
    }
    bool mixtral = c->arch == CT_ARCH_MIXTRAL;
    const char *block = mixtral ? "block_sparse_moe" : "mlp", *pre = c->tensor_prefix;
    const char *gate = mixtral ? "w1" : "gate_proj", *up = mixtral ? "w3" : "up_proj";
    const char *down = mixtral ? "w2" : "down_proj";
    if (!(w->router = load_one(ld, NAME("%slayers.%d.%s.gate.weight", pre, l, block), E * H))) return ld->err->code;
    for (size_t e = 0; e < E; e++) {
        size_t gu = e * 2 * I * H;
        if (put(ld, w->wgu_e, gu, NAME("%slayers.%d.%s.experts.%zu.%s.weight", pre, l, block, e, gate)) ||
            put(ld, w->wgu_e, gu + I * H, NAME("%slayers.%d.%s.experts.%zu.%s.weight", pre, l, block, e, up)) ||
            put(ld, w->wdown_e, e * H * I, NAME("%slayers.%d.%s.experts.%zu.%s.weight", pre, l, block, e, down)))
            return ld->err->code;
    }
    if (c->shared_expert_intermediate_size > 0) {
        size_t Is = c->shared_expert_intermediate_size;
        if (!(w->wsh_gu = alloc_weight(ld, 2 * Is * H))) return ld->err->code;
        if (put(ld, w->wsh_gu, 0, NAME("%slayers.%d.mlp.shared_expert.gate_proj.weight", pre, l)) ||
            put(ld, w->wsh_gu, Is * H, NAME("%slayers.%d.mlp.shared_expert.up_proj.weight", pre, l)))
            return ld->err->code;
        if (!(w->wsh_down = load_one(ld, NAME("%slayers.%d.mlp.shared_expert.down_proj.weight", pre, l), H * Is)) ||
            !(w->wsh_gate = load_one(ld, NAME("%slayers.%d.mlp.shared_expert_gate.weight", pre, l), H)))
            return ld->err->code;
    }
#undef NAME
    return CT_OK;
}

/* qwen3_next's grouped in_proj_qkvz (rows = conv_dim + value_dim) or in_proj_ba
 * (rows = 2 Hv) uploaded into win from row `at`: HF row i goes to row at +
 * model_gdn_qkvz_row(i) (model_gdn_ba_row(i)), so win holds [qkv | z | b | a]
 * as for qwen3_5 and the graph reads one layout. */
static int put_gdn_grouped(loader *ld, void *win, size_t at, const char *name, const ct_model_config *c, bool ba)
{
    const st_tensor *t = st_find(ld->r, name);
    if (!t) return CT_FAIL_INPUT(ld->err, "model: tensor '%s' is missing", name);
    if (count_nonfinite(t))
        return CT_FAIL_INPUT(ld->err, "model: tensor '%s' holds non-finite values (expected finite weights: the "
                             "model files are broken)", name);
    size_t H = c->hidden_size, es = ct_dtype_size(t->dtype), rows = t->numel / H;
    for (size_t i = 0; i < rows; i++) {
        size_t to = at + (size_t)(ba ? model_gdn_ba_row(c, (int)i) : model_gdn_qkvz_row(c, (int)i));
        ld->be->upload_weight(ld->be, (char *)win + to * H * ld->be->weight_bytes, (const char *)t->data + i * H * es,
                              t->dtype, H);
    }
    return CT_OK;
}

/* A Gated DeltaNet layer's mixer (linear_attn.*) and its fused input projection. */
static int load_gdn(loader *ld, const ct_model_config *c, int l, ct_layer_weights *w)
{
    size_t H = c->hidden_size, conv = model_gdn_conv_dim(c), Vd = model_gdn_value_dim(c);
    size_t Hv = c->linear_num_value_heads, W = c->linear_conv_kernel_dim;
    char n[256];
#define NAME(fmt) (snprintf(n, sizeof n, "%slayers.%d.linear_attn." fmt, c->tensor_prefix, l), n)
    if (!(w->win = alloc_weight(ld, (size_t)model_gdn_proj_dim(c) * H))) return ld->err->code;
    if (c->gdn_grouped_proj) {
        if (put_gdn_grouped(ld, w->win, 0, NAME("in_proj_qkvz.weight"), c, false) ||
            put_gdn_grouped(ld, w->win, conv + Vd, NAME("in_proj_ba.weight"), c, true))
            return ld->err->code;
    } else if (put(ld, w->win, 0, NAME("in_proj_qkv.weight")) || put(ld, w->win, conv * H, NAME("in_proj_z.weight")) ||
               put(ld, w->win, (conv + Vd) * H, NAME("in_proj_b.weight")) ||
               put(ld, w->win, (conv + Vd + Hv) * H, NAME("in_proj_a.weight"))) {
        return ld->err->code;
    }
    if (!(w->conv_w = load_one(ld, NAME("conv1d.weight"), conv * W)) ||
        !(w->A_log = load_sinks(ld, NAME("A_log"), Hv)) || !(w->dt_bias = load_sinks(ld, NAME("dt_bias"), Hv)) ||
        !(w->gdn_norm = load_one(ld, NAME("norm.weight"), c->linear_value_head_dim)) ||
        !(w->wout = load_one(ld, NAME("out_proj.weight"), H * Vd)))
        return ld->err->code;
#undef NAME
    return CT_OK;
}

static int load_layer(loader *ld, const ct_model_config *c, int l, ct_layer_weights *w)
{
    size_t H = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    size_t Q = c->num_attention_heads * D, KV = c->num_key_value_heads * D;
    size_t Qw = model_attn_gated(c) ? 2 * Q : Q; /* q_proj rows: queries (and gates) */
    char n[256];
#define NAME(fmt) (snprintf(n, sizeof n, "%slayers.%d." fmt, c->tensor_prefix, l), n)
    if (!(w->attn_norm = load_norm(ld, c, NAME("input_layernorm.weight"), H))) return ld->err->code;
    if (!(w->mlp_norm = load_norm(ld, c, NAME("post_attention_layernorm.weight"), H))) return ld->err->code;
    if (c->gdn && c->layer_linear[l]) {
        if (load_gdn(ld, c, l, w)) return ld->err->code;
    } else {
        if (!(w->wqkv = alloc_weight(ld, (Qw + 2 * KV) * H))) return ld->err->code;
        if ((model_attn_gated(c) ? put_q_gated(ld, w->wqkv, NAME("self_attn.q_proj.weight"), D, Q, H)
                                 : put(ld, w->wqkv, 0, NAME("self_attn.q_proj.weight"))) ||
            put(ld, w->wqkv, Qw * H, NAME("self_attn.k_proj.weight")) ||
            put(ld, w->wqkv, (Qw + KV) * H, NAME("self_attn.v_proj.weight")))
            return ld->err->code;
        if (c->attention_bias) {
            if (model_attn_gated(c))
                return CT_FAIL_INPUT(ld->err, "model: attention_bias with gated attention is not supported");
            if (!(w->bqkv = alloc_weight(ld, Q + 2 * KV))) return ld->err->code;
            if (put(ld, w->bqkv, 0, NAME("self_attn.q_proj.bias")) ||
                put(ld, w->bqkv, Q, NAME("self_attn.k_proj.bias")) ||
                put(ld, w->bqkv, Q + KV, NAME("self_attn.v_proj.bias")))
                return ld->err->code;
        }
        if (c->qk_norm) {
            if (!(w->q_norm = load_norm(ld, c, NAME("self_attn.q_norm.weight"), D))) return ld->err->code;
            if (!(w->k_norm = load_norm(ld, c, NAME("self_attn.k_norm.weight"), D))) return ld->err->code;
        }
        if (!(w->wo = load_one(ld, NAME("self_attn.o_proj.weight"), H * Q))) return ld->err->code;
        if (c->o_proj_bias && !(w->bo = load_one(ld, NAME("self_attn.o_proj.bias"), H))) return ld->err->code;
        if (c->attention_sinks && !(w->sinks = load_sinks(ld, NAME("self_attn.sinks"), c->num_attention_heads)))
            return ld->err->code;
    }
    if (c->layer_sparse[l]) return load_sparse(ld, c, l, w);
    if (!(w->wgu = alloc_weight(ld, 2 * I * H))) return ld->err->code;
    if (put(ld, w->wgu, 0, NAME("mlp.gate_proj.weight")) || put(ld, w->wgu, I * H, NAME("mlp.up_proj.weight")))
        return ld->err->code;
    if (!(w->wdown = load_one(ld, NAME("mlp.down_proj.weight"), H * I))) return ld->err->code;
    if (c->mlp_bias) {
        if (!(w->bgu = alloc_weight(ld, 2 * I))) return ld->err->code;
        if (put(ld, w->bgu, 0, NAME("mlp.gate_proj.bias")) || put(ld, w->bgu, I, NAME("mlp.up_proj.bias")))
            return ld->err->code;
        if (!(w->bdown = load_one(ld, NAME("mlp.down_proj.bias"), H))) return ld->err->code;
    }
#undef NAME
    return CT_OK;
}

/* Every MoE op, or none usable: a backend may have some while others are written. */
static bool backend_has_moe(const ct_backend *be)
{
    return be->moe_route && be->moe_count && be->moe_offsets && be->moe_permute && be->moe_gather &&
           be->moe_scatter && be->moe_scatter_bwd && be->moe_weight_grad && be->moe_linear_fwd &&
           be->moe_linear_bwd_input && be->moe_lora_fwd && be->moe_lora_bwd && be->moe_clamped_swiglu_fwd &&
           be->moe_clamped_swiglu_bwd && be->moe_route_bwd && be->moe_prob_sum && be->moe_aux_loss;
}

/* Every Gated DeltaNet op. */
static bool backend_has_gdn(const ct_backend *be)
{
    return be->gdn_conv_fwd && be->gdn_conv_bwd && be->gdn_gates_fwd && be->gdn_gates_bwd && be->gdn_delta_fwd &&
           be->gdn_delta_bwd && be->gated_rmsnorm_fwd && be->gated_rmsnorm_bwd && be->sigmoid_gate_fwd &&
           be->sigmoid_gate_bwd;
}

int model_load(ct_model *m, ct_backend *be, const char *dir, ct_error *err)
{
    memset(m, 0, sizeof *m);
    m->be = be;
    int rc = model_config_load(&m->cfg, dir, err);
    if (rc) return rc;
    const ct_model_config *c = &m->cfg;
    if (be->check_model && (rc = be->check_model(be, c, dir, err))) return rc;
    if (c->gdn && !backend_has_gdn(be))
        return CT_FAIL_INPUT(err, "%s: model_type '%s' has Gated DeltaNet layers; the %s backend does not implement "
                             "the GDN ops yet (set device: cpu to train it on the CPU reference backend)",
                             dir, c->model_type, be->name);
    if (c->num_experts > 0 &&
        (!backend_has_moe(be) ||
         (c->shared_expert_intermediate_size > 0 && (!be->moe_shared_gate_fwd || !be->moe_shared_gate_bwd))))
        return CT_FAIL_INPUT(err, "%s: model_type '%s' is a mixture of experts; the %s backend does not implement "
                             "the MoE ops yet (set device: cpu to train it on the CPU reference backend)",
                             dir, c->model_type, be->name);
    st_reader *r = st_open(dir, err);
    if (!r) return err->code;
    rc = model_check_weights(c, r, err);
    if (rc) {
        st_close(r);
        return rc;
    }
    loader ld = {.be = be, .r = r, .err = err};
    size_t V = c->vocab_size, H = c->hidden_size;
    m->layers = ct_calloc(c->num_hidden_layers, sizeof *m->layers);
    rc = CT_OK;
    char name[96];
    snprintf(name, sizeof name, "%sembed_tokens.weight", c->tensor_prefix);
    if (!(m->embed = load_one(&ld, name, V * H))) rc = err->code;
    snprintf(name, sizeof name, "%snorm.weight", c->tensor_prefix);
    if (!rc && !(m->final_norm = load_norm(&ld, c, name, H))) rc = err->code;
    if (!rc) {
        if (c->tie_word_embeddings) m->lm_head = m->embed;
        else if (!(m->lm_head = load_one(&ld, "lm_head.weight", V * H))) rc = err->code;
    }
    for (int l = 0; !rc && l < c->num_hidden_layers; l++) rc = load_layer(&ld, c, l, &m->layers[l]);
    st_close(r);
    if (rc) {
        model_free(m);
        return rc;
    }
    m->rot_dim = model_rope_dim(c);
    float *inv = ct_malloc(sizeof(float) * (size_t)(m->rot_dim / 2));
    model_rope_inv_freq(c, inv, &m->attn_scaling);
    m->inv_freq = be->alloc(be, sizeof(float) * (size_t)(m->rot_dim / 2));
    if (!m->inv_freq) {
        free(inv);
        model_free(m);
        return CT_FAIL_RUNTIME(err, "out of %s memory", be->name);
    }
    be->upload(be, m->inv_freq, inv, sizeof(float) * (size_t)(m->rot_dim / 2));
    free(inv);
    m->weight_bytes = ld.bytes;
    return CT_OK;
}

void model_free(ct_model *m)
{
    ct_backend *be = m->be;
    if (!be) return;
    if (m->layers) {
        for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
            void **w = (void **)&m->layers[l];
            for (size_t i = 0; i < sizeof(ct_layer_weights) / sizeof(void *); i++)
                if (w[i]) be->free(be, w[i]);
        }
        free(m->layers);
    }
    if (m->lm_head && m->lm_head != m->embed) be->free(be, m->lm_head);
    if (m->embed) be->free(be, m->embed);
    if (m->final_norm) be->free(be, m->final_norm);
    if (m->inv_freq) be->free(be, m->inv_freq);
    memset(m, 0, sizeof *m);
}
