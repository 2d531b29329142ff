/* graph.c — the decoder graph over the backend op table (see graph.h).
 *
 * Per layer (T tokens, fused QKV = nq*D + 2*nkv*D columns, fused GU = 2I):
 *   xn = rmsnorm(x) ; qkv = xn Wqkv^T (+b) (+LoRA q|k|v) ; [qwen3: per-head q/k norm]
 *   rope(q, k) ; attn = varlen causal attention(q, k, v) [gpt_oss: + sinks]
 *   h = x + attn Wo^T (+LoRA o)
 *   hn = rmsnorm(h) ; gu = hn Wgu^T (+LoRA gate|up) ; a = silu(gate) * up
 *   out = h + a Wdown^T (+LoRA down)
 * Sparse layers replace the last two lines by out = h + MoE(hn) (graph_moe.c).
 * Backward runs the same steps in reverse, writing LoRA gradients only. */
#include "graph.h"
#include "graph_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One layer's intermediates: what backward reads. */
typedef struct layer_acts {
    void *xn;        /* (T, H) */
    float *rstd1;    /* (T) */
    void *qkv_raw;   /* (T, QKV) before q/k norm; NULL without qk_norm */
    void *qkv;       /* (T, QKV) after norm and rope: what attention read */
    float *rstd_q;   /* (T, nq) */
    float *rstd_k;   /* (T, nkv) */
    void *attn;      /* (T, Q) */
    float *lse;      /* (T, nq) */
    void *h;         /* (T, H) */
    void *hn;        /* (T, H) */
    float *rstd2;    /* (T) */
    void *gu;        /* (T, 2I), dense layers */
    void *act;       /* (T, I), dense layers */
} layer_acts;

struct ct_graph {
    const ct_model *m;
    ct_backend *be;
    int capacity;
    bool checkpointing;
    int n_ws;             /* workspaces: 1 with checkpointing, else L */
    layer_acts *ws;
    void **xs;            /* (L + 1) layer inputs, each (T, H) */
    void *xf;             /* (T, H) final-norm output */
    float *rstd_f;        /* (T) */
    void *dxf;            /* (T, H) */
    void *dstream;        /* (T, H) gradient of the residual stream; see layer_backward */
    void *dh, *dhn, *dxn; /* (T, H) */
    void *dact;           /* (T, I) */
    void *dgu;            /* (T, 2I) */
    void *dattn;          /* (T, Q) */
    void *dqkv, *dqkv2;   /* (T, QKV) */
    int32_t *tokens, *positions, *cu_seqlens, *target_rows, *target_ids; /* device copies */
    float *loss_sum;
    ct_moe *moe;          /* sparse layers' buffers; NULL for a dense model */
    bool router_aux;      /* add the load-balancing loss in training steps */
    float *aux_loss_sum;  /* (1) its sum over micro-batches */
    /* current batch (host-side sizes; no device read needed) */
    int T, n_docs, max_seqlen, n_targets;
    size_t bytes;
    bool failed;
};

static void *galloc(ct_graph *g, size_t bytes)
{
    if (g->failed) return NULL;
    void *p = g->be->alloc(g->be, bytes);
    if (!p) g->failed = true;
    g->bytes += bytes;
    return p;
}

static void *act_at(const ct_graph *g, void *p, size_t elems) { return (char *)p + elems * g->be->act_bytes; }

ct_graph *graph_new(const ct_model *m, int capacity, bool checkpointing, ct_error *err)
{
    const ct_model_config *c = &m->cfg;
    ct_graph *g = ct_calloc(1, sizeof *g);
    g->m = m;
    g->be = m->be;
    g->capacity = capacity;
    g->checkpointing = checkpointing;
    size_t T = capacity, H = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    size_t nq = c->num_attention_heads, nkv = c->num_key_value_heads, L = c->num_hidden_layers;
    size_t Q = nq * D, QKV = Q + 2 * nkv * D, A = g->be->act_bytes, F = sizeof(float);
    bool dense_mlp = false; /* only a model with a dense MLP layer needs its buffers */
    for (size_t l = 0; l < L; l++) dense_mlp |= !c->layer_sparse[l];
    g->n_ws = checkpointing ? 1 : (int)L;
    g->ws = ct_calloc(g->n_ws, sizeof *g->ws);
    for (int i = 0; i < g->n_ws; i++) {
        layer_acts *a = &g->ws[i];
        a->xn = galloc(g, T * H * A);
        a->rstd1 = galloc(g, T * F);
        if (c->qk_norm) {
            a->qkv_raw = galloc(g, T * QKV * A);
            a->rstd_q = galloc(g, T * nq * F);
            a->rstd_k = galloc(g, T * nkv * F);
        }
        a->qkv = galloc(g, T * QKV * A);
        a->attn = galloc(g, T * Q * A);
        a->lse = galloc(g, T * nq * F);
        a->h = galloc(g, T * H * A);
        a->hn = galloc(g, T * H * A);
        a->rstd2 = galloc(g, T * F);
        if (dense_mlp) {
            a->gu = galloc(g, T * 2 * I * A);
            a->act = galloc(g, T * I * A);
        }
    }
    g->xs = ct_calloc(L + 1, sizeof *g->xs);
    for (size_t l = 0; l <= L; l++) g->xs[l] = galloc(g, T * H * A);
    g->xf = galloc(g, T * H * A);
    g->rstd_f = galloc(g, T * F);
    g->dxf = galloc(g, T * H * A);
    g->dstream = galloc(g, T * H * A);
    g->dh = galloc(g, T * H * A);
    g->dhn = galloc(g, T * H * A);
    g->dxn = galloc(g, T * H * A);
    if (dense_mlp) {
        g->dact = galloc(g, T * I * A);
        g->dgu = galloc(g, T * 2 * I * A);
    }
    g->dattn = galloc(g, T * Q * A);
    g->dqkv = galloc(g, T * QKV * A);
    if (c->qk_norm) g->dqkv2 = galloc(g, T * QKV * A);
    g->tokens = galloc(g, T * 4);
    g->positions = galloc(g, T * 4);
    g->cu_seqlens = galloc(g, (T + 1) * 4);
    g->target_rows = galloc(g, T * 4);
    g->target_ids = galloc(g, T * 4);
    g->loss_sum = galloc(g, F);
    g->aux_loss_sum = galloc(g, F);
    if (!g->failed) g->moe = moe_new(m, capacity, g->n_ws, &g->bytes, &g->failed);
    if (g->failed) {
        size_t want = g->bytes;
        graph_free(g);
        CT_FAIL_RUNTIME(err, "out of %s memory for activations (%.2f GiB for %d tokens per micro-batch)",
                        m->be->name, (double)want / (1 << 30), capacity);
        return NULL;
    }
    return g;
}

void graph_free(ct_graph *g)
{
    if (!g) return;
    ct_backend *be = g->be;
#define FREE(p) do { if (p) be->free(be, p); } while (0)
    for (int i = 0; i < g->n_ws; i++) {
        layer_acts *a = &g->ws[i];
        FREE(a->xn); FREE(a->rstd1); FREE(a->qkv_raw); FREE(a->qkv); FREE(a->rstd_q); FREE(a->rstd_k);
        FREE(a->attn); FREE(a->lse); FREE(a->h); FREE(a->hn); FREE(a->rstd2); FREE(a->gu); FREE(a->act);
    }
    if (g->xs)
        for (int l = 0; l <= g->m->cfg.num_hidden_layers; l++) FREE(g->xs[l]);
    FREE(g->xf); FREE(g->rstd_f); FREE(g->dxf); FREE(g->dstream); FREE(g->dh); FREE(g->dhn); FREE(g->dxn);
    FREE(g->dact); FREE(g->dgu); FREE(g->dattn); FREE(g->dqkv); FREE(g->dqkv2);
    FREE(g->tokens); FREE(g->positions); FREE(g->cu_seqlens); FREE(g->target_rows); FREE(g->target_ids);
    FREE(g->loss_sum); FREE(g->aux_loss_sum);
#undef FREE
    moe_free(g->moe);
    free(g->ws);
    free(g->xs);
    free(g);
}

size_t graph_bytes(const ct_graph *g) { return g->bytes; }
float *graph_loss_sum(ct_graph *g) { return g->loss_sum; }
float *graph_aux_loss_sum(ct_graph *g) { return g->aux_loss_sum; }

int graph_set_router_aux_loss(ct_graph *g, bool on, ct_error *err)
{
    const ct_model_config *c = &g->m->cfg;
    if (on && !g->moe)
        return CT_FAIL_INPUT(err, "training.router_aux_loss: model_type '%s' has no mixture-of-experts layer",
                             c->model_type);
    if (on && c->arch == CT_ARCH_GPT_OSS)
        return CT_FAIL_INPUT(err, "training.router_aux_loss: not implemented for gpt_oss yet (ctune has the "
                             "load-balancing loss of qwen3_moe and mixtral, checked against HF)");
    g->router_aux = on;
    return CT_OK;
}

void graph_set_batch(ct_graph *g, const ct_batch *b)
{
    CT_ASSERT(b->n_tokens <= g->capacity, "batch of %d tokens exceeds capacity %d", b->n_tokens, g->capacity);
    ct_backend *be = g->be;
    g->T = b->n_tokens;
    g->n_docs = b->n_docs;
    g->max_seqlen = b->max_seqlen;
    g->n_targets = b->n_targets;
    be->upload(be, g->tokens, b->tokens, (size_t)b->n_tokens * 4);
    be->upload(be, g->positions, b->positions, (size_t)b->n_tokens * 4);
    be->upload(be, g->cu_seqlens, b->cu_seqlens, (size_t)(b->n_docs + 1) * 4);
    if (b->n_targets > 0) {
        be->upload(be, g->target_rows, b->target_rows, (size_t)b->n_targets * 4);
        be->upload(be, g->target_ids, b->target_ids, (size_t)b->n_targets * 4);
    }
}

typedef struct lora_ctx {
    const ct_lora *lo;   /* NULL: no adapter */
    uint64_t seed;
    float dropout;       /* 0 in eval */
    bool moe_stats;      /* sparse layers record the load-balancing statistics */
} lora_ctx;

static moe_lora moe_lora_of(const lora_ctx *lc)
{
    return (moe_lora){.lo = lc->lo, .dropout = lc->dropout, .step_seed = lc->seed};
}

static void lora_fwd(ct_graph *g, const lora_ctx *lc, int l, ct_module mod,
                     void *y, int ldy, const void *x, int ldx)
{
    if (!lc->lo || !lc->lo->targeted[mod]) return;
    int in, out;
    model_module_shape(&g->m->cfg, mod, &in, &out);
    g->be->lora_fwd(g->be, y, ldy, x, ldx, lora_A(lc->lo, l, mod), lora_B(lc->lo, l, mod), g->T, in, out,
                    lc->lo->R, lc->lo->scale, lc->dropout, graph_module_seed(lc->seed, l, mod));
}

static void lora_bwd(ct_graph *g, const lora_ctx *lc, int l, ct_module mod, void *dx, int lddx,
                     const void *dy, int lddy, const void *x, int ldx)
{
    if (!lc->lo || !lc->lo->targeted[mod]) return;
    int in, out;
    model_module_shape(&g->m->cfg, mod, &in, &out);
    g->be->lora_bwd(g->be, dx, lddx, lora_grad_A(lc->lo, l, mod), lora_grad_B(lc->lo, l, mod), dy, lddy, x, ldx,
                    lora_A(lc->lo, l, mod), lora_B(lc->lo, l, mod), g->T, in, out, lc->lo->R, lc->lo->scale,
                    lc->dropout, graph_module_seed(lc->seed, l, mod));
}

static int layer_window(const ct_model_config *c, int l) { return c->layer_sliding[l] ? c->sliding_window : 0; }

static int ws_of(const ct_graph *g, int l) { return g->checkpointing ? 0 : l; }

static void layer_forward(ct_graph *g, const lora_ctx *lc, int l, const void *x, void *out, layer_acts *a)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    int nq = c->num_attention_heads, nkv = c->num_key_value_heads, Q = nq * D, KV = nkv * D, QKV = Q + 2 * KV;
    float eps = (float)c->rms_norm_eps;

    be->rmsnorm_fwd(be, a->xn, H, a->rstd1, x, H, w->attn_norm, T, 1, H, eps);
    void *qkv_lin = c->qk_norm ? a->qkv_raw : a->qkv;
    be->linear_fwd(be, qkv_lin, QKV, a->xn, H, w->wqkv, w->bqkv, T, H, QKV, 0);
    lora_fwd(g, lc, l, CT_MOD_Q, qkv_lin, QKV, a->xn, H);
    lora_fwd(g, lc, l, CT_MOD_K, act_at(g, qkv_lin, Q), QKV, a->xn, H);
    lora_fwd(g, lc, l, CT_MOD_V, act_at(g, qkv_lin, Q + KV), QKV, a->xn, H);
    void *q = a->qkv, *k = act_at(g, a->qkv, Q), *v = act_at(g, a->qkv, Q + KV);
    if (c->qk_norm) {
        be->rmsnorm_fwd(be, q, QKV, a->rstd_q, a->qkv_raw, QKV, w->q_norm, T, nq, D, eps);
        be->rmsnorm_fwd(be, k, QKV, a->rstd_k, act_at(g, a->qkv_raw, Q), QKV, w->k_norm, T, nkv, D, eps);
        be->copy_2d(be, v, QKV, act_at(g, a->qkv_raw, Q + KV), QKV, T, KV);
    }
    be->rope(be, q, QKV, g->positions, g->m->inv_freq, T, nq, D, g->m->rot_dim, g->m->attn_scaling, 0);
    be->rope(be, k, QKV, g->positions, g->m->inv_freq, T, nkv, D, g->m->rot_dim, g->m->attn_scaling, 0);
    be->attention_fwd(be, a->attn, Q, a->lse, q, QKV, k, QKV, v, QKV, g->cu_seqlens, g->n_docs, g->max_seqlen,
                      T, nq, nkv, D, 1.0f / sqrtf((float)D), layer_window(c, l), w->sinks);

    be->copy_2d(be, a->h, H, x, H, T, H);
    be->linear_fwd(be, a->h, H, a->attn, Q, w->wo, w->bo, T, Q, H, 1);
    lora_fwd(g, lc, l, CT_MOD_O, a->h, H, a->attn, Q);

    be->rmsnorm_fwd(be, a->hn, H, a->rstd2, a->h, H, w->mlp_norm, T, 1, H, eps);
    if (c->layer_sparse[l]) {
        moe_lora ml = moe_lora_of(lc);
        be->copy_2d(be, out, H, a->h, H, T, H);
        moe_forward(g->moe, &ml, l, ws_of(g, l), a->hn, out, T, lc->moe_stats);
        return;
    }
    be->linear_fwd(be, a->gu, 2 * I, a->hn, H, w->wgu, w->bgu, T, H, 2 * I, 0);
    lora_fwd(g, lc, l, CT_MOD_GATE, a->gu, 2 * I, a->hn, H);
    lora_fwd(g, lc, l, CT_MOD_UP, act_at(g, a->gu, I), 2 * I, a->hn, H);
    be->swiglu_fwd(be, a->act, a->gu, T, I);
    be->copy_2d(be, out, H, a->h, H, T, H);
    be->linear_fwd(be, out, H, a->act, I, w->wdown, w->bdown, T, I, H, 1);
    lora_fwd(g, lc, l, CT_MOD_DOWN, out, H, a->act, I);
}

/* d holds the gradient of the layer's output on entry and of its input on exit:
 * the output gradient is last read before the input gradient is first written. */
static void layer_backward(ct_graph *g, const lora_ctx *lc, int l, const void *x, void *d, const layer_acts *a)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    int nq = c->num_attention_heads, nkv = c->num_key_value_heads, Q = nq * D, KV = nkv * D, QKV = Q + 2 * KV;

    /* MLP: out = h + down(swiglu(gu(norm(h)))), or out = h + MoE(norm(h)) */
    be->copy_2d(be, g->dh, H, d, H, T, H);
    if (c->layer_sparse[l]) {
        moe_lora ml = moe_lora_of(lc);
        moe_backward(g->moe, &ml, l, ws_of(g, l), d, g->dhn, T, g->router_aux);
    } else {
        be->linear_bwd_input(be, g->dact, I, d, H, w->wdown, T, I, H, 0);
        lora_bwd(g, lc, l, CT_MOD_DOWN, g->dact, I, d, H, a->act, I);
        be->swiglu_bwd(be, g->dgu, g->dact, a->gu, T, I);
        be->linear_bwd_input(be, g->dhn, H, g->dgu, 2 * I, w->wgu, T, H, 2 * I, 0);
        lora_bwd(g, lc, l, CT_MOD_GATE, g->dhn, H, g->dgu, 2 * I, a->hn, H);
        lora_bwd(g, lc, l, CT_MOD_UP, g->dhn, H, act_at(g, g->dgu, I), 2 * I, a->hn, H);
    }
    be->rmsnorm_bwd(be, g->dh, H, g->dhn, H, a->h, H, a->rstd2, w->mlp_norm, T, 1, H, 1);

    /* attention: h = x + o(attn(rope(norm_qk(qkv(norm(x)))))) */
    be->linear_bwd_input(be, g->dattn, Q, g->dh, H, w->wo, T, Q, H, 0);
    lora_bwd(g, lc, l, CT_MOD_O, g->dattn, Q, g->dh, H, a->attn, Q);
    void *q = a->qkv, *k = act_at(g, a->qkv, Q), *v = act_at(g, a->qkv, Q + KV);
    void *dq = g->dqkv, *dk = act_at(g, g->dqkv, Q), *dv = act_at(g, g->dqkv, Q + KV);
    be->attention_bwd(be, dq, QKV, dk, QKV, dv, QKV, g->dattn, Q, a->attn, Q, a->lse, q, QKV, k, QKV, v, QKV,
                      g->cu_seqlens, g->n_docs, g->max_seqlen, T, nq, nkv, D, 1.0f / sqrtf((float)D),
                      layer_window(c, l), w->sinks);
    be->rope(be, dq, QKV, g->positions, g->m->inv_freq, T, nq, D, g->m->rot_dim, g->m->attn_scaling, 1);
    be->rope(be, dk, QKV, g->positions, g->m->inv_freq, T, nkv, D, g->m->rot_dim, g->m->attn_scaling, 1);
    void *dlin = g->dqkv;
    if (c->qk_norm) {
        dlin = g->dqkv2;
        be->rmsnorm_bwd(be, dlin, QKV, dq, QKV, a->qkv_raw, QKV, a->rstd_q, w->q_norm, T, nq, D, 0);
        be->rmsnorm_bwd(be, act_at(g, dlin, Q), QKV, dk, QKV, act_at(g, a->qkv_raw, Q), QKV, a->rstd_k,
                        w->k_norm, T, nkv, D, 0);
        be->copy_2d(be, act_at(g, dlin, Q + KV), QKV, dv, QKV, T, KV);
    }
    be->linear_bwd_input(be, g->dxn, H, dlin, QKV, w->wqkv, T, H, QKV, 0);
    lora_bwd(g, lc, l, CT_MOD_Q, g->dxn, H, dlin, QKV, a->xn, H);
    lora_bwd(g, lc, l, CT_MOD_K, g->dxn, H, act_at(g, dlin, Q), QKV, a->xn, H);
    lora_bwd(g, lc, l, CT_MOD_V, g->dxn, H, act_at(g, dlin, Q + KV), QKV, a->xn, H);
    be->copy_2d(be, d, H, g->dh, H, T, H);
    be->rmsnorm_bwd(be, d, H, g->dxn, H, x, H, a->rstd1, w->attn_norm, T, 1, H, 1);
}

static layer_acts *acts_of(ct_graph *g, int l) { return &g->ws[ws_of(g, l)]; }

/* Embedding, every layer, final norm: xf holds the head's input afterwards. */
static void forward_all(ct_graph *g, const lora_ctx *lc)
{
    const ct_model_config *c = &g->m->cfg;
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size, L = c->num_hidden_layers;
    be->embedding(be, g->xs[0], g->tokens, g->m->embed, T, H);
    for (int l = 0; l < L; l++) layer_forward(g, lc, l, g->xs[l], g->xs[l + 1], acts_of(g, l));
    be->rmsnorm_fwd(be, g->xf, H, g->rstd_f, g->xs[L], H, g->m->final_norm, T, 1, H, (float)c->rms_norm_eps);
}

void graph_train_step(ct_graph *g, const ct_lora *lo, float grad_scale, uint64_t dropout_seed)
{
    const ct_model_config *c = &g->m->cfg;
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size, L = c->num_hidden_layers;
    lora_ctx lc = {.lo = lo, .seed = dropout_seed, .dropout = lo ? lo->dropout : 0.0f, .moe_stats = g->router_aux};
    if (g->router_aux) moe_aux_begin(g->moe);
    forward_all(g, &lc);
    if (g->n_targets == 0) return; /* nothing to learn from: no loss, no gradient */
    if (g->router_aux) moe_aux_loss(g->moe, g->aux_loss_sum, T);
    lc.moe_stats = false; /* a checkpointing recompute must not count the statistics twice */
    be->zero(be, g->dxf, (size_t)T * H * be->act_bytes);
    be->cross_entropy(be, g->loss_sum, g->dxf, g->xf, g->m->lm_head, g->target_rows, g->target_ids, g->n_targets,
                      H, c->vocab_size, grad_scale);
    be->rmsnorm_bwd(be, g->dstream, H, g->dxf, H, g->xs[L], H, g->rstd_f, g->m->final_norm, T, 1, H, 0);
    for (int l = L - 1; l >= 0; l--) {
        /* Recomputing writes xs[l+1] again with identical values; it is not read any more. */
        if (g->checkpointing) layer_forward(g, &lc, l, g->xs[l], g->xs[l + 1], acts_of(g, l));
        layer_backward(g, &lc, l, g->xs[l], g->dstream, acts_of(g, l));
    }
}

void graph_eval(ct_graph *g, const ct_lora *lo)
{
    lora_ctx lc = {.lo = lo, .seed = 0, .dropout = 0.0f};
    forward_all(g, &lc);
    if (g->n_targets == 0) return;
    g->be->cross_entropy(g->be, g->loss_sum, NULL, g->xf, g->m->lm_head, g->target_rows, g->target_ids,
                         g->n_targets, g->m->cfg.hidden_size, g->m->cfg.vocab_size, 1.0f);
}
