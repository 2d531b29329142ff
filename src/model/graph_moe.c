/* graph_moe.c — the sparse MLP block (see graph_moe.h) over the backend's MoE
 * ops. Sizes: T tokens, H hidden, E experts, K per token, I expert intermediate,
 * n = T*K expert rows. qwen3_5_moe and qwen3_next add a shared expert, a dense
 * SwiGLU MLP of intermediate size Is on every token, scaled by
 * sigmoid(hn . wsh_gate) per token (moe_shared_gate_fwd) and added to the
 * routed sum; LoRA on shared_expert_gate and, in qwen3_5_moe, on the shared
 * expert's gate, up and down projections (its CT_MOD_GATE/UP/DOWN, as PEFT's
 * target_modules reads those names there; in qwen3_next they are the routed
 * experts', as PEFT's v5 conversion reads them, and the shared expert is frozen).
 *
 * Backward, with out = h + sum_k w_k ye_k:
 *   dye = w * dout (per row), dw = dout . bias_e       (moe_scatter_bwd)
 *   down backward: dact (n,I)
 *   dw += (dact . act) / w                             (moe_weight_grad, in moe_act_bwd)
 *   activation, gate|up backward over expert rows; dxe (n,H)
 *   dhn = sum_k dxe_k                                  (moe_scatter, weights 1)
 * dw is dout . ye: ye = act W_e^T + bias_e + LoRA is linear in act, and dact is
 * w times dout through that map's transpose, so dout . (ye - bias_e) =
 * (dact . act) / w (where w = 0, dw does not reach the router's gradient: every
 * rule multiplies it by w). ye itself is therefore not kept for backward: one
 * (n,H) buffer serves every layer's forward, 512 MiB per layer at T = 16384 on
 * qwen3-30b-a3b that checkpointing need not hold, and a recomputed layer skips
 * the down projection.
 *   dlogits = route'(dw) (+ load-balancing term) ; dhn += dlogits Wr
 * The last line is what makes the gradient exact: the routing weights depend
 * on hn through the frozen router, so hn's gradient has a router path too.
 *
 * No expert-ordered copy of hn exists: the gate|up GEMM and LoRA (forward and
 * backward) read hn's token rows through row_slot (their gather argument), which
 * saves an (n, H) buffer per workspace and a pass over it. (A copy by moe_gather
 * that lets the GEMM load whole tiles by TMA measured a wash or slower on the
 * H200, docs/kernels/moe_gemm.md: the copy costs about what the GEMM saves.)
 *
 * The gate|up and down forwards run with their expert LoRA fused into the grouped
 * GEMM (moe_linear_lora_fwd) when lora_dropout is 0: on the H200 that is 5% more
 * tokens/s on the qwen3-30b-a3b shape than the GEMM and moe_lora_fwd apart. Under
 * the same conditions gate's and up's LoRA backward runs as one
 * (moe_lora_bwd_cols). The separate path remains for dropout and more than 64
 * ranks, and tests force it everywhere (ct_graph_options.separate_expert_lora)
 * to compare. */
#include "graph_moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Columns of mo->g and of a workspace's u: ranks of the modules of one
 * linear_lora_bwd (the CUDA ops store their ranks padded to 16, 32 or 64). */
#define MOE_G_COLS 64

/* gpt_oss's clamped SwiGLU (docs/ARCHITECTURE.md, "Model folders"): alpha is fixed by the model code;
 * the limit is config.json's swiglu_limit. (HF transformers' GptOssExperts
 * hardcodes 7.0 and ignores swiglu_limit; every released gpt-oss has 7.0, and
 * the HF parity fixture uses 7.0, since with another value HF and the config
 * disagree: seen with 1.5, HF's loss equals ctune's with no clamp at all.) */
#define GPT_OSS_ALPHA 1.702f

/* One layer's routing and expert intermediates: what backward reads. */
typedef struct moe_acts {
    void *logits;        /* (T, E) */
    int32_t *idx;        /* (T*K) */
    float *w;            /* (T*K) */
    int32_t *offsets;    /* (E+1) */
    int32_t *row_slot;   /* (n) */
    int32_t *slot_row;   /* (n) */
    const void *hn;      /* (T, H): the block's input, the caller's buffer; gate|up read it through row_slot */
    void *gu;            /* (n, 2I) */
    void *act;           /* (n, I) */
    void *u_gu, *u_d;    /* (n, MOE_G_COLS): the fused forwards' u of gate|up and of down */
    bool u_gu_ok, u_d_ok; /* whether the last forward into this workspace wrote them */
    /* the shared expert (qwen3_5_moe, qwen3_next): NULL without one */
    void *sgu;           /* (T, 2Is) */
    void *sact;          /* (T, Is) */
    void *s;             /* (T, H): its output before the gate */
    void *sg;            /* (T, 1): the gate's logit */
} moe_acts;

struct ct_moe {
    const ct_model *m;
    ct_backend *be;
    int capacity, E, K, I, H, n_sparse, n_ws;
    int Is;              /* the shared expert's intermediate size; 0: none */
    ct_moe_rule rule;
    bool fused_lora;     /* the fused expert LoRA ops may run (ct_graph_options.separate_expert_lora off) */
    bool lora_buffers;   /* the workspaces' u_gu, u_d and g exist (moe_new's expert_lora) */
    int *sparse_index;   /* (L): index among sparse layers, -1 for dense */
    moe_acts *ws;        /* (n_ws) */
    int32_t *counts;     /* (n_sparse, E): per layer, rewritten identically by a recompute */
    float *prob_sum;     /* (n_sparse, E) */
    float *aux_grad;     /* (E) */
    void *ye;            /* (n, H): the experts' outputs, forward scratch shared by all layers */
    /* backward scratch, shared by all layers */
    void *dye, *dxe;     /* (n, H) */
    void *dact;          /* (n, I) */
    void *dgu;           /* (n, 2I) */
    float *dw;           /* (n) */
    void *dlogits;       /* (T, E) */
    void *g;             /* (n, MOE_G_COLS): the expert LoRA's dy B for the GEMM's input gradient */
    void *ds, *dsact, *dsgu, *dsg; /* the shared expert's: (T,H), (T,Is), (T,2Is), (T,1) */
};

ct_moe *moe_new(const ct_model *m, int capacity, int n_ws, bool expert_lora, bool fused_lora)
{
    const ct_model_config *c = &m->cfg;
    int n_sparse = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n_sparse += c->layer_sparse[l];
    if (n_sparse == 0) return NULL;
    ct_moe *mo = ct_calloc(1, sizeof *mo);
    mo->m = m;
    mo->be = m->be;
    mo->capacity = capacity;
    mo->E = c->num_experts;
    mo->K = c->num_experts_per_tok;
    mo->I = c->moe_intermediate_size;
    mo->H = c->hidden_size;
    mo->Is = c->shared_expert_intermediate_size;
    mo->n_sparse = n_sparse;
    mo->n_ws = n_ws;
    mo->fused_lora = fused_lora;
    mo->lora_buffers = expert_lora;
    mo->rule = c->arch == CT_ARCH_GPT_OSS ? CT_MOE_TOPK_SOFTMAX
             : c->norm_topk_prob          ? CT_MOE_SOFTMAX_TOPK_NORM
                                          : CT_MOE_SOFTMAX_TOPK;
    mo->sparse_index = ct_malloc(sizeof(int) * (size_t)c->num_hidden_layers);
    for (int l = 0, i = 0; l < c->num_hidden_layers; l++) mo->sparse_index[l] = c->layer_sparse[l] ? i++ : -1;
    mo->ws = ct_calloc(n_ws, sizeof *mo->ws);
    return mo;
}

void moe_layout(ct_moe *mo, ct_arena *ar)
{
    size_t T = mo->capacity, E = mo->E, n = T * mo->K, H = mo->H, I = mo->I, A = mo->be->act_bytes, F = 4;
    size_t Is = mo->Is;
    for (int i = 0; i < mo->n_ws; i++) {
        moe_acts *a = &mo->ws[i];
        a->logits = arena_take(ar, T * E * A);
        a->idx = arena_take(ar, n * 4);
        a->w = arena_take(ar, n * F);
        a->offsets = arena_take(ar, (E + 1) * 4);
        a->row_slot = arena_take(ar, n * 4);
        a->slot_row = arena_take(ar, n * 4);
        a->gu = arena_take(ar, n * 2 * I * A);
        a->act = arena_take(ar, n * I * A);
        a->u_gu = mo->lora_buffers ? arena_take(ar, n * MOE_G_COLS * A) : NULL;
        a->u_d = mo->lora_buffers ? arena_take(ar, n * MOE_G_COLS * A) : NULL;
        a->sgu = Is ? arena_take(ar, T * 2 * Is * A) : NULL;
        a->sact = Is ? arena_take(ar, T * Is * A) : NULL;
        a->s = Is ? arena_take(ar, T * H * A) : NULL;
        a->sg = Is ? arena_take(ar, T * A) : NULL;
    }
    mo->ye = arena_take(ar, n * H * A);
    mo->counts = arena_take(ar, (size_t)mo->n_sparse * E * 4);
    mo->prob_sum = arena_take(ar, (size_t)mo->n_sparse * E * F);
    mo->aux_grad = arena_take(ar, E * F);
    mo->dye = arena_take(ar, n * H * A);
    mo->dxe = arena_take(ar, n * H * A);
    mo->dact = arena_take(ar, n * I * A);
    mo->dgu = arena_take(ar, n * 2 * I * A);
    mo->dw = arena_take(ar, n * F);
    mo->dlogits = arena_take(ar, T * E * A);
    mo->g = mo->lora_buffers ? arena_take(ar, n * MOE_G_COLS * A) : NULL;
    mo->ds = Is ? arena_take(ar, T * H * A) : NULL;
    mo->dsact = Is ? arena_take(ar, T * Is * A) : NULL;
    mo->dsgu = Is ? arena_take(ar, T * 2 * Is * A) : NULL;
    mo->dsg = Is ? arena_take(ar, T * A) : NULL;
}

void moe_free(ct_moe *mo)
{
    if (!mo) return;
    free(mo->ws);
    free(mo->sparse_index);
    free(mo);
}

static void *act_at(const ct_moe *mo, void *p, size_t elems) { return (char *)p + elems * mo->be->act_bytes; }

/* The expert LoRA of one module, or nothing when it is not targeted. */
static const ct_lora_slot *expert_lora(const moe_lora *ml, int l, ct_module mod)
{
    if (!ml->lo || !ml->lo->targeted[mod]) return NULL;
    if (ml->lo->arch == CT_ARCH_QWEN3_5_MOE) return NULL; /* there gate/up/down are the shared expert's */
    const ct_lora_slot *s = lora_slot(ml->lo, l, mod);
    return s->experts ? s : NULL;
}

/* The shared expert's module mod when it has a LoRA: shared_expert_gate, or
 * qwen3_5_moe's gate/up/down (elsewhere those slots are the routed experts'). */
static const ct_lora_slot *shared_lora(const moe_lora *ml, int l, ct_module mod)
{
    if (!ml->lo || !ml->lo->targeted[mod]) return NULL;
    if (model_module_is_mlp(mod) && ml->lo->arch != CT_ARCH_QWEN3_5_MOE) return NULL;
    const ct_lora_slot *s = lora_slot(ml->lo, l, mod);
    return s->experts ? s : NULL;
}

/* The LoRA of a shared-expert module over the T token rows (dense, no experts). */
static void shared_lora_fwd(ct_moe *mo, const moe_lora *ml, int l, ct_module mod, void *y, int ldy, const void *x,
                            int ldx, int T)
{
    const ct_lora_slot *s = shared_lora(ml, l, mod);
    if (!s) return;
    mo->be->lora_fwd(mo->be, y, ldy, x, ldx, lora_A(ml->lo, l, mod), lora_B(ml->lo, l, mod), T, s->in, s->out,
                     ml->lo->R, ml->lo->scale, ml->dropout, graph_module_seed(ml->step_seed, l, mod), NULL, 0);
}

static void shared_lora_bwd(ct_moe *mo, const moe_lora *ml, int l, ct_module mod, void *dx, int lddx, const void *dy,
                            int lddy, const void *x, int ldx, int T)
{
    const ct_lora_slot *s = shared_lora(ml, l, mod);
    if (!s) return;
    mo->be->lora_bwd(mo->be, dx, lddx, lora_grad_A(ml->lo, l, mod), lora_grad_B(ml->lo, l, mod), dy, lddy, x, ldx,
                     lora_A(ml->lo, l, mod), lora_B(ml->lo, l, mod), T, s->in, s->out, ml->lo->R, ml->lo->scale,
                     ml->dropout, graph_module_seed(ml->step_seed, l, mod), NULL, 0);
}

/* x: expert-ordered rows, or (gather non-NULL) token rows read through gather. */
static void lora_fwd(ct_moe *mo, const moe_lora *ml, int l, ct_module mod, const moe_acts *a,
                     void *y, int ldy, const void *x, int ldx, const int32_t *gather)
{
    const ct_lora_slot *s = expert_lora(ml, l, mod);
    if (!s) return;
    mo->be->moe_lora_fwd(mo->be, y, ldy, x, ldx, gather, mo->K, lora_A(ml->lo, l, mod), lora_B(ml->lo, l, mod),
                         a->offsets, mo->E, s->in, s->out, ml->lo->R, ml->lo->scale, ml->dropout,
                         graph_module_seed(ml->step_seed, l, mod));
}

static void lora_bwd(ct_moe *mo, const moe_lora *ml, int l, ct_module mod, const moe_acts *a,
                     void *dx, int lddx, const void *dy, int lddy, const void *x, int ldx, const int32_t *gather)
{
    const ct_lora_slot *s = expert_lora(ml, l, mod);
    if (!s) return;
    mo->be->moe_lora_bwd(mo->be, dx, lddx, lora_grad_A(ml->lo, l, mod), lora_grad_B(ml->lo, l, mod), dy, lddy,
                         x, ldx, gather, mo->K, lora_A(ml->lo, l, mod), lora_B(ml->lo, l, mod), a->offsets, mo->E,
                         s->in, s->out, ml->lo->R, ml->lo->scale, ml->dropout,
                         graph_module_seed(ml->step_seed, l, mod));
}

/* The targeted ones of modules mods[i] (at most 2), in order, as the ops take
 * them: masters, gradients, and their columns from col0[i]; returns how many. */
static int targeted_cols(const moe_lora *ml, int l, const ct_module *mods, const int *col0, int n_mods,
                         ct_lora_cols *cols)
{
    int n = 0;
    for (int i = 0; i < n_mods; i++) {
        const ct_lora_slot *s = expert_lora(ml, l, mods[i]);
        if (s)
            cols[n++] = (ct_lora_cols){lora_A(ml->lo, l, mods[i]), lora_B(ml->lo, l, mods[i]), col0[i], s->out,
                                           lora_grad_A(ml->lo, l, mods[i]), lora_grad_B(ml->lo, l, mods[i])};
    }
    return n;
}

/* The expert LoRA backward of modules mods[i] on dy's columns from col0[i] (they
 * share x), in one moe_lora_bwd_cols when the fused forward would run (dropout 0,
 * fused_lora) and at least two of them are targeted; else
 * lora_bwd per module. */
static void lora_bwd_cols(ct_moe *mo, const moe_lora *ml, int l, const ct_module *mods, const int *col0, int n_mods,
                          const moe_acts *a, void *dx, int lddx, void *dy, int lddy, int out, const void *x,
                          int ldx, const int32_t *gather, int in)
{
    ct_lora_cols cols[2];
    const int n = targeted_cols(ml, l, mods, col0, n_mods, cols);
    if (n >= 2 && mo->fused_lora && ml->dropout == 0.0f && mo->be->moe_lora_bwd_cols) {
        mo->be->moe_lora_bwd_cols(mo->be, dx, lddx, dy, lddy, out, x, ldx, gather, mo->K, a->offsets, mo->E, in,
                                  cols, n, ml->lo->R, ml->lo->scale, NULL, 0, NULL, 0);
        return;
    }
    for (int i = 0; i < n_mods; i++)
        lora_bwd(mo, ml, l, mods[i], a, dx, lddx, act_at(mo, dy, col0[i]), lddy, x, ldx, gather);
}

/* dx = dy W_e (the grouped GEMM's input gradient) plus the expert LoRA backward of
 * modules mods[i] on dy's columns from col0[i] (x their input). With the fused
 * forward (dropout 0, fused_lora) and at most 64 ranks in all,
 * the GEMM also computes g = dy B per module into mo->g and adds the LoRA's
 * input-gradient term (moe_linear_lora_bwd_input: dy read once for both, dx
 * written once), then the LoRA's weight gradients read g and u instead of
 * recomputing them (moe_lora_bwd_cols). Else the GEMM, then lora_bwd_cols. */
static void linear_lora_bwd(ct_moe *mo, const moe_lora *ml, int l, const ct_module *mods, const int *col0,
                            int n_mods, const moe_acts *a, void *dx, int lddx, void *dy, int lddy, const void *W,
                            int in, int out, const void *x, int ldx, const int32_t *gather, const void *u)
{
    ct_backend *be = mo->be;
    ct_lora_cols cols[2];
    const int n = targeted_cols(ml, l, mods, col0, n_mods, cols);
    if (n >= 1 && n * ml->lo->R <= MOE_G_COLS && mo->fused_lora && mo->g && ml->dropout == 0.0f &&
        be->moe_linear_lora_bwd_input && be->moe_lora_bwd_cols) {
        be->moe_linear_lora_bwd_input(be, dx, lddx, dy, lddy, W, a->offsets, mo->E, in, out, 0, mo->g, MOE_G_COLS,
                                      cols, n, ml->lo->R, ml->lo->scale);
        be->moe_lora_bwd_cols(be, NULL, 0, dy, lddy, out, x, ldx, gather, mo->K, a->offsets, mo->E, in, cols, n,
                              ml->lo->R, ml->lo->scale, mo->g, MOE_G_COLS, u, MOE_G_COLS);
        return;
    }
    be->moe_linear_bwd_input(be, dx, lddx, dy, lddy, W, a->offsets, mo->E, in, out, 0);
    lora_bwd_cols(mo, ml, l, mods, col0, n_mods, a, dx, lddx, dy, lddy, out, x, ldx, gather, in);
}

/* y = the grouped GEMM of x with W (bias) and the expert LoRA of modules mods[i]
 * on y's columns from col0[i], in one moe_linear_lora_fwd: when fused_lora, dropout
 * is 0 and one of the modules is targeted. Returns false when it did not
 * run (the caller runs moe_linear_fwd and lora_fwd per module). */
static bool linear_lora_fwd(ct_moe *mo, const moe_lora *ml, int l, const ct_module *mods, const int *col0,
                            int n_mods, const moe_acts *a, void *y, int ldy, const void *x, int ldx,
                            const int32_t *gather, const void *W, const void *bias, int in, int out, void *u,
                            bool *u_ok)
{
    *u_ok = false;
    if (!mo->fused_lora || ml->dropout != 0.0f || !mo->be->moe_linear_lora_fwd) return false;
    ct_lora_cols cols[2];
    const int n = targeted_cols(ml, l, mods, col0, n_mods, cols);
    if (n == 0) return false;
    const bool want_u = u && moe_u_cols(n, ml->lo->R) > 0 && moe_u_cols(n, ml->lo->R) <= MOE_G_COLS;
    *u_ok = mo->be->moe_linear_lora_fwd(mo->be, y, ldy, x, ldx, gather, mo->K, W, bias, a->offsets, mo->E, in, out, 0,
                                        cols, n, ml->lo->R, ml->lo->scale, want_u ? u : NULL, MOE_G_COLS);
    return true;
}

void moe_forward(ct_moe *mo, const moe_lora *ml, int l, int ws, const void *hn, const void *res, void *out, int T,
                 bool record_stats)
{
    const ct_model_config *c = &mo->m->cfg;
    const ct_layer_weights *w = &mo->m->layers[l];
    ct_backend *be = mo->be;
    moe_acts *a = &mo->ws[ws];
    int E = mo->E, K = mo->K, H = mo->H, I = mo->I, n = T * K, ls = mo->sparse_index[l];
    bool gpt_oss = c->arch == CT_ARCH_GPT_OSS;

    be->linear_fwd(be, a->logits, E, hn, H, w->router, w->router_bias, T, H, E, 0);
    be->moe_route(be, a->idx, a->w, a->logits, T, E, K, mo->rule);
    int32_t *counts = mo->counts + (size_t)ls * E;
    be->moe_count(be, counts, a->idx, n, E);
    be->moe_offsets(be, a->offsets, counts, E);
    be->moe_permute(be, a->row_slot, a->slot_row, a->idx, a->offsets, n, E);
    if (record_stats) be->moe_prob_sum(be, mo->prob_sum + (size_t)ls * E, a->logits, T, E);

    a->hn = hn;
    /* gate on columns [0, I), up on [I, 2I); gpt_oss: gate is the whole gate_up, up has no slot */
    const ct_module gate_up[2] = {CT_MOD_GATE, CT_MOD_UP}, down[1] = {CT_MOD_DOWN};
    const int gate_up_col0[2] = {0, I}, down_col0[1] = {0};
    const void *wgu_e = MODEL_WEIGHT(mo->m, l, wgu_e);
    if (!linear_lora_fwd(mo, ml, l, gate_up, gate_up_col0, 2, a, a->gu, 2 * I, hn, H, a->row_slot, wgu_e, w->bgu_e,
                         H, 2 * I, a->u_gu, &a->u_gu_ok)) {
        be->moe_linear_fwd(be, a->gu, 2 * I, hn, H, a->row_slot, K, wgu_e, w->bgu_e, a->offsets, E, H, 2 * I, 0);
        lora_fwd(mo, ml, l, CT_MOD_GATE, a, a->gu, 2 * I, hn, H, a->row_slot);
        lora_fwd(mo, ml, l, CT_MOD_UP, a, act_at(mo, a->gu, I), 2 * I, hn, H, a->row_slot);
    }
    if (gpt_oss) be->moe_clamped_swiglu_fwd(be, a->act, a->gu, n, I, GPT_OSS_ALPHA, (float)c->swiglu_limit);
    else be->swiglu_fwd(be, a->act, a->gu, n, I);
    if (mo->Is) { /* the shared expert and its gate's logit, which backward reads (a recompute too) */
        int Is = mo->Is;
        model_linear_fwd(MODEL_W(mo->m, l, wsh_gu), a->sgu, 2 * Is, hn, H, NULL, T, H, 2 * Is, 0);
        shared_lora_fwd(mo, ml, l, CT_MOD_GATE, a->sgu, 2 * Is, hn, H, T);
        shared_lora_fwd(mo, ml, l, CT_MOD_UP, act_at(mo, a->sgu, Is), 2 * Is, hn, H, T);
        be->swiglu_fwd(be, a->sact, a->sgu, T, Is);
        model_linear_fwd(MODEL_W(mo->m, l, wsh_down), a->s, H, a->sact, Is, NULL, T, Is, H, 0);
        shared_lora_fwd(mo, ml, l, CT_MOD_DOWN, a->s, H, a->sact, Is, T);
        be->linear_fwd(be, a->sg, 1, hn, H, w->wsh_gate, NULL, T, H, 1, 0);
        shared_lora_fwd(mo, ml, l, CT_MOD_SH_GATE, a->sg, 1, hn, H, T);
    }
    if (!out) { /* a recompute for backward, which needs no ye (and so gets no u of down) */
        a->u_d_ok = false;
        return;
    }
    const void *wdown_e = MODEL_WEIGHT(mo->m, l, wdown_e);
    if (!linear_lora_fwd(mo, ml, l, down, down_col0, 1, a, mo->ye, H, a->act, I, NULL, wdown_e, w->bdown_e, I, H,
                         a->u_d, &a->u_d_ok)) {
        be->moe_linear_fwd(be, mo->ye, H, a->act, I, NULL, K, wdown_e, w->bdown_e, a->offsets, E, I, H, 0);
        lora_fwd(mo, ml, l, CT_MOD_DOWN, a, mo->ye, H, a->act, I, NULL);
    }
    be->moe_scatter(be, out, H, mo->ye, a->slot_row, a->w, T, K, H, res, H);
    if (mo->Is) be->moe_shared_gate_fwd(be, out, H, a->s, H, a->sg, 1, T, H);
}

void moe_backward(ct_moe *mo, const moe_lora *ml, int l, int ws, const void *dout, void *dhn, int T, bool aux)
{
    const ct_model_config *c = &mo->m->cfg;
    const ct_layer_weights *w = &mo->m->layers[l];
    ct_backend *be = mo->be;
    const moe_acts *a = &mo->ws[ws];
    int E = mo->E, K = mo->K, H = mo->H, I = mo->I, n = T * K;

    be->moe_scatter_bwd(be, mo->dye, mo->dw, dout, H, NULL, w->bdown_e, a->idx, a->row_slot, a->slot_row, a->w, T, K,
                        H);
    const ct_module down[1] = {CT_MOD_DOWN}, gate_up[2] = {CT_MOD_GATE, CT_MOD_UP};
    const int down_col0[1] = {0}, gate_up_col0[2] = {0, I};
    linear_lora_bwd(mo, ml, l, down, down_col0, 1, a, mo->dact, I, mo->dye, H, MODEL_WEIGHT(mo->m, l, wdown_e), I, H,
                    a->act, I, NULL, a->u_d_ok ? a->u_d : NULL);
    const bool clamped = c->arch == CT_ARCH_GPT_OSS;
    if (be->moe_act_bwd) { /* one pass over dact and gu for dgu and dw */
        be->moe_act_bwd(be, mo->dgu, mo->dw, mo->dact, a->gu, a->w, a->row_slot, n, I, clamped, GPT_OSS_ALPHA,
                        (float)c->swiglu_limit);
    } else {
        be->moe_weight_grad(be, mo->dw, mo->dact, a->act, a->w, a->row_slot, n, I);
        if (clamped)
            be->moe_clamped_swiglu_bwd(be, mo->dgu, mo->dact, a->gu, n, I, GPT_OSS_ALPHA, (float)c->swiglu_limit);
        else
            be->swiglu_bwd(be, mo->dgu, mo->dact, a->gu, n, I);
    }
    linear_lora_bwd(mo, ml, l, gate_up, gate_up_col0, 2, a, mo->dxe, H, mo->dgu, 2 * I, MODEL_WEIGHT(mo->m, l, wgu_e),
                    H, 2 * I, a->hn, H, a->row_slot, a->u_gu_ok ? a->u_gu : NULL);
    be->moe_scatter(be, dhn, H, mo->dxe, a->slot_row, NULL, T, K, H, NULL, 0);

    be->moe_route_bwd(be, mo->dlogits, mo->dw, a->logits, a->idx, a->w, aux ? mo->aux_grad : NULL, T, E, K, mo->rule);
    be->linear_bwd_input(be, dhn, H, mo->dlogits, E, w->router, T, H, E, 1);

    if (mo->Is) { /* the shared expert: out += sigmoid(sg) s, s = down(swiglu(gu(hn))), sg = hn . wsh_gate */
        int Is = mo->Is;
        be->moe_shared_gate_bwd(be, mo->ds, H, mo->dsg, 1, dout, H, a->s, H, a->sg, 1, T, H);
        model_linear_bwd_input(MODEL_W(mo->m, l, wsh_down), mo->dsact, Is, mo->ds, H, T, Is, H, 0);
        shared_lora_bwd(mo, ml, l, CT_MOD_DOWN, mo->dsact, Is, mo->ds, H, a->sact, Is, T);
        be->swiglu_bwd(be, mo->dsgu, mo->dsact, a->sgu, T, Is);
        model_linear_bwd_input(MODEL_W(mo->m, l, wsh_gu), dhn, H, mo->dsgu, 2 * Is, T, H, 2 * Is, 1);
        shared_lora_bwd(mo, ml, l, CT_MOD_GATE, dhn, H, mo->dsgu, 2 * Is, a->hn, H, T);
        shared_lora_bwd(mo, ml, l, CT_MOD_UP, dhn, H, act_at(mo, mo->dsgu, Is), 2 * Is, a->hn, H, T);
        be->linear_bwd_input(be, dhn, H, mo->dsg, 1, w->wsh_gate, T, H, 1, 1);
        shared_lora_bwd(mo, ml, l, CT_MOD_SH_GATE, dhn, H, mo->dsg, 1, a->hn, H, T);
    }
}

void moe_aux_begin(ct_moe *mo)
{
    mo->be->zero(mo->be, mo->prob_sum, (size_t)mo->n_sparse * mo->E * sizeof(float));
}

void moe_aux_loss(ct_moe *mo, float *loss_sum, int T)
{
    mo->be->moe_aux_loss(mo->be, loss_sum, mo->aux_grad, mo->counts, mo->prob_sum, mo->n_sparse, T, mo->E,
                         (float)mo->m->cfg.router_aux_loss_coef);
}
