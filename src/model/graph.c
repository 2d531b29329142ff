/* graph.c — the decoder graph over the backend op table (see graph.h).
 *
 * Per layer (T tokens, fused QKV = nq*D + 2*nkv*D columns, fused GU = 2I):
 *   xn = rmsnorm(x) ; qkv = xn Wqkv^T (+b) (+LoRA q|k|v) ; [qwen3: per-head q/k norm]
 *   rope(q, k) ; attn = varlen causal attention(q, k, v) [gpt_oss: + sinks]
 *   h = x + attn Wo^T (+LoRA o)
 *   hn = rmsnorm(h) ; gu = hn Wgu^T (+LoRA gate|up) ; a = silu(gate) * up
 *   out = h + a Wdown^T (+LoRA down)
 * Sparse layers replace the last two lines by out = h + MoE(hn) (graph_moe.c).
 *
 * Gated DeltaNet hybrids (qwen3_5*): their norms scale by 1 + w (norm_zero_centred,
 * passed to the norm ops as zero_centred; w as stored). A gated attention layer's
 * fused projection has columns [q (Q) | gate (Q) | k | v] and its attention output
 * is multiplied by sigmoid(gate) before o_proj. A GDN layer replaces the
 * attention by (P = NP columns [qkv (conv_dim) | z (Vd) | b (Hv) | a (Hv)]):
 *   P = xn Win^T (+LoRA in_proj_qkv|z|b|a) ; c = silu(conv(P[:, qkv])) per document
 *   g, beta = gates(a, b) ; o = gated delta rule(c's q, k, v, g, beta) per document
 *   h = x + gated_rmsnorm(o, z) Wout^T (+LoRA out_proj)
 * Backward runs the same steps in reverse, writing LoRA gradients only. */
#include "graph.h"
#include "graph_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The LoRA groups (modules sharing an input) whose u = x A^T a layer's forward keeps
 * for its backward: q|k|v, o, gate|up, down; GDN's in_proj [qkv|z], [b|a], out_proj. */
typedef enum { U_QKV, U_O, U_GU, U_DOWN, U_GDN_QKVZ, U_GDN_BA, U_GDN_OUT, U_SLOTS } u_slot;

/* One layer's intermediates: what backward reads. */
typedef struct layer_acts {
    void *xn;        /* (T, H); h's memory in the recomputed layers' workspace */
    float *rstd1;    /* (T) */
    void *qkv_raw;   /* (T, QKV) before q/k norm; NULL without qk_norm */
    void *qkv;       /* (T, QKV) q and k after norm and rope: what attention read;
                      * v there too without qk_norm, else v stays in qkv_raw */
    float *rstd_q;   /* (T, nq) */
    float *rstd_k;   /* (T, nkv) */
    void *attn;      /* (T, Q) */
    float *lse;      /* (T, nq) */
    void *h;         /* (T, H) */
    void *hn;        /* (T, H), or (C, H) with hn_per_chunk */
    bool hn_per_chunk;/* the recomputed dense layers' workspace: the MLP norm runs
                      * per MLP chunk into one chunk of rows (mlp_input) */
    float *rstd2;    /* (T) */
    void *gu;        /* (C, 2I), dense layers: C = one MLP chunk in the workspace that
                      * recomputed layers share, else T (every chunk of the layer) */
    void *act;       /* (C, I), dense layers */
    void *gated;     /* (T, Q) attention output times sigmoid(gate): o_proj's input
                      * (gated attention layers) */
    /* Gated DeltaNet layers */
    void *proj;      /* (T, NP) fused input projection [qkv | z | b | a] */
    void *conv;      /* (T, conv_dim) conv + SiLU: q | k | v */
    float *gg, *beta;/* (T, Hv) decay (log) and write gates */
    void *core;      /* (T, Vd) delta-rule output */
    void *normed;    /* (T, Vd) gated RMSNorm output: out_proj's input */
    void *u[U_SLOTS];/* (T, u_width) each (gate|up, down: like gu's rows); NULL where
                      * nothing is kept (ct_graph_options.lora_rank 0, no such layer) */
} layer_acts;

struct ct_graph {
    const ct_model *m;
    ct_backend *be;
    ct_graph_options opt;
    int capacity;
    int mlp_chunk;        /* tokens per dense-MLP chunk (capacity without checkpointing) */
    int n_recompute;      /* layers 0 .. n_recompute-1 are recomputed in backward */
    int n_off, n_stage;   /* offloaded layer inputs (0 .. n_off-1); device staging buffers (1|2) */
    int n_ws;             /* workspaces: one the recomputed layers share (if any), then
                           * one per layer that keeps its intermediates; see ws_of */
    layer_acts *ws;
    void **xs;            /* (L + 1) layer inputs on the device, each (T, H); NULL when offloaded */
    void *stage[2];       /* (T, H) device copies of offloaded layer inputs */
    int stage_holds[2];   /* which layer's input each stage buffer holds now (-1: none) */
    char *host_xs;        /* (n_off, T, H) offloaded layer inputs in host memory */
    bool host_pinned;
    /* Backward buffers. Each lives only in some phases of a step, so buffers of
     * phases that never overlap share memory (graph_layout): */
    void *dstream;        /* (T, H) gradient of the residual stream; see layer_backward */
    void *dhn;            /* (T, H) gradient of a layer's MLP input */
    void *xf;             /* (T, H) final-norm output: dstream's memory (read before
                           * dstream is first written) */
    float *rstd_f;        /* (T) */
    void *dxf;            /* (T, H) the head's input gradient: dhn's memory */
    void *dxn;            /* (T, H) gradient of a layer's mixer input: dhn's memory
                           * (written after the MLP norm's backward has read dhn) */
    void *dattn;          /* (T, Q) dhn's memory when Q <= H (read before dxn is
                           * written), else the mixer scratch's */
    /* One scratch for the MLP's backward and the mixer's (one after the other): */
    void *dact;           /* (C, I) */
    void *dgu;            /* (C, 2I) */
    void *dqkv;           /* (T, QKV) */
    void *dproj;          /* (T, NP) GDN layers' */
    void *dconv;          /* (T, conv_dim) */
    void *dcore, *dnormed;/* (T, Vd) */
    float *dgg, *dbeta;   /* (T, Hv) */
    int32_t *tokens, *positions, *cu_seqlens, *target_rows, *target_ids; /* the current batch's device set */
    /* Batch upload (graph_set_batch): CT_UPLOAD_SLOTS device sets of the five
     * arrays above, each (5T + 1) int32, filled from page-locked staging on the
     * copy stream, micro-batches alternating between them. */
    int32_t *batch_dev[CT_UPLOAD_SLOTS];
    int32_t *batch_host[CT_UPLOAD_SLOTS];
    bool batch_pinned[CT_UPLOAD_SLOTS];
    unsigned batch_count;
    float *loss_sum;
    ct_moe *moe;          /* sparse layers' buffers; NULL for a dense model */
    bool router_aux;      /* add the load-balancing loss in training steps */
    float *aux_loss_sum;  /* (1) its sum over micro-batches */
    void *arena;          /* the one backend allocation every buffer above lives in */
    ct_graph_sizes sizes;
    /* current batch (host-side sizes; no device read needed) */
    int T, n_docs, max_seqlen, n_targets;
};

static void *act_at(const ct_graph *g, void *p, size_t elems) { return (char *)p + elems * g->be->act_bytes; }

/* Layer l of a GDN hybrid is a Gated DeltaNet layer (else attention). */
static bool layer_gdn(const ct_model_config *c, int l) { return c->gdn && c->layer_linear[l]; }

static bool recomputed(const ct_graph *g, int l) { return l < g->n_recompute; }

/* Columns of a kept u: room for every module of the group at rank lora_rank
 * (the dropout path puts module q of the group at q r, the stacked one its j-th
 * targeted module at j r). */
static int u_width(const ct_graph *g, u_slot s)
{
    static const int group_modules[U_SLOTS] = {3, 1, 2, 1, 3, 3, 1};
    return lora_u_cols(group_modules[s], g->opt.lora_rank);
}

/* Where the kept u of group s starts for the rows from row on; NULL: recompute. */
static void *u_at(const ct_graph *g, const layer_acts *a, u_slot s, size_t row)
{
    return a->u[s] ? (char *)a->u[s] + row * u_width(g, s) * g->be->act_bytes : NULL;
}

/* Recomputed layers share workspace 0; layer l >= n_recompute keeps its own. */
static int ws_of(const ct_graph *g, int l)
{
    return recomputed(g, l) ? 0 : (g->n_recompute > 0) + l - g->n_recompute;
}
/* The v columns attention reads: with qk_norm the fused norm + RoPE writes only q
 * and k, and v is read where the projection put it (no copy). */
static void *layer_v(const ct_graph *g, const layer_acts *a, size_t v_col)
{
    return act_at(g, g->m->cfg.qk_norm ? a->qkv_raw : a->qkv, v_col);
}

/* One batch set: tokens, positions (T each), cu_seqlens (T + 1), target rows
 * and ids (T each), int32, in that order. */
static size_t batch_set_bytes(const ct_graph *g) { return ((size_t)5 * g->capacity + 1) * sizeof(int32_t); }

/* Every device buffer, in the arena's order: saved layer inputs, staging, the
 * working set (layer intermediates, backward scratch, MoE), batch metadata.
 * Run twice (measure, then carve); sizes record each category. */
static void graph_layout(ct_graph *g, ct_arena *ar)
{
    const ct_model_config *c = &g->m->cfg;
    size_t T = g->capacity, C = g->mlp_chunk, H = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    size_t nq = c->num_attention_heads, nkv = c->num_key_value_heads, L = c->num_hidden_layers;
    size_t Q = nq * D, QKV = (model_attn_gated(c) ? 2 * Q : Q) + 2 * nkv * D, A = g->be->act_bytes, F = sizeof(float);
    size_t NP = c->gdn ? model_gdn_proj_dim(c) : 0, CD = c->gdn ? model_gdn_conv_dim(c) : 0;
    size_t Vd = c->gdn ? model_gdn_value_dim(c) : 0, Hv = c->linear_num_value_heads;
    bool dense_mlp = false; /* only a model with a dense MLP layer needs its buffers */
    bool any_attn = false, any_gdn = false; /* likewise attention and GDN layers */
    for (size_t l = 0; l < L; l++) {
        dense_mlp |= !c->layer_sparse[l];
        any_attn |= !layer_gdn(c, (int)l);
        any_gdn |= layer_gdn(c, (int)l);
    }

    size_t mark = ar->used;
    for (size_t l = 0; l <= L; l++) g->xs[l] = (int)l < g->n_off ? NULL : arena_take(ar, T * H * A);
    g->sizes.saved_device = ar->used - mark;
    mark = ar->used;
    for (int i = 0; i < 2; i++) g->stage[i] = i < g->n_stage && g->n_off > 0 ? arena_take(ar, T * H * A) : NULL;
    g->sizes.staging = ar->used - mark;
    mark = ar->used;
    for (int i = 0; i < g->n_ws; i++) {
        layer_acts *a = &g->ws[i];
        size_t M = i == 0 && g->n_recompute > 0 ? C : T; /* MLP rows: one chunk, or every chunk */
        bool attn = false, gdn = false, sparse = false; /* the kinds of layer this workspace serves */
        for (int l = 0; l < (int)L; l++)
            if (ws_of(g, l) == i) {
                attn |= !layer_gdn(c, l);
                gdn |= layer_gdn(c, l);
                sparse |= c->layer_sparse[l];
            }
        bool shared = i == 0 && g->n_recompute > 0;
        a->h = arena_take(ar, T * H * A);
        /* The recomputed layers' xn lives in h's memory: the mixer reads xn before
         * it writes h, and backward renormalizes x into it once h is dead
         * (layer_backward). */
        a->xn = shared ? a->h : arena_take(ar, T * H * A);
        a->rstd1 = arena_take(ar, T * F);
        a->qkv_raw = attn && c->qk_norm ? arena_take(ar, T * QKV * A) : NULL;
        a->rstd_q = attn && c->qk_norm ? arena_take(ar, T * nq * F) : NULL;
        a->rstd_k = attn && c->qk_norm ? arena_take(ar, T * nkv * F) : NULL;
        a->qkv = attn ? arena_take(ar, T * QKV * A) : NULL;
        a->attn = attn ? arena_take(ar, T * Q * A) : NULL;
        a->lse = attn ? arena_take(ar, T * nq * F) : NULL;
        a->gated = attn && model_attn_gated(c) ? arena_take(ar, T * Q * A) : NULL;
        a->proj = gdn ? arena_take(ar, T * NP * A) : NULL;
        a->conv = gdn ? arena_take(ar, T * CD * A) : NULL;
        a->gg = gdn ? arena_take(ar, T * Hv * F) : NULL;
        a->beta = gdn ? arena_take(ar, T * Hv * F) : NULL;
        a->core = gdn ? arena_take(ar, T * Vd * A) : NULL;
        a->normed = gdn ? arena_take(ar, T * Vd * A) : NULL;
        a->hn_per_chunk = shared && !sparse; /* the experts read all of hn, in backward too */
        a->hn = arena_take(ar, (a->hn_per_chunk ? M : T) * H * A);
        a->rstd2 = arena_take(ar, T * F);
        a->gu = dense_mlp ? arena_take(ar, M * 2 * I * A) : NULL;
        a->act = dense_mlp ? arena_take(ar, M * I * A) : NULL;
        for (int s = 0; s < U_SLOTS; s++) {
            bool used = s == U_QKV || s == U_O ? attn : s == U_GU || s == U_DOWN ? dense_mlp : gdn;
            size_t rows = s == U_GU || s == U_DOWN ? M : T;
            a->u[s] = used && g->opt.lora_rank > 0 ? arena_take(ar, rows * u_width(g, (u_slot)s) * A) : NULL;
        }
    }
    g->dstream = arena_take(ar, T * H * A);
    g->dhn = arena_take(ar, T * H * A);
    g->rstd_f = arena_take(ar, T * F);
    g->xf = g->dstream;
    g->dxf = g->dxn = g->dhn;
    /* the scratch: its three users' buffers carved from the same start */
    size_t scratch = ar->used, scratch_end = scratch;
    g->dact = dense_mlp ? arena_take(ar, C * I * A) : NULL;
    g->dgu = dense_mlp ? arena_take(ar, C * 2 * I * A) : NULL;
    scratch_end = ar->used, ar->used = scratch;
    g->dqkv = any_attn ? arena_take(ar, T * QKV * A) : NULL;
    g->dattn = !any_attn ? NULL : Q <= H ? g->dhn : arena_take(ar, T * Q * A);
    scratch_end = ar->used > scratch_end ? ar->used : scratch_end, ar->used = scratch;
    g->dproj = any_gdn ? arena_take(ar, T * NP * A) : NULL;
    g->dconv = any_gdn ? arena_take(ar, T * CD * A) : NULL;
    g->dcore = any_gdn ? arena_take(ar, T * Vd * A) : NULL;
    g->dnormed = any_gdn ? arena_take(ar, T * Vd * A) : NULL;
    g->dgg = any_gdn ? arena_take(ar, T * Hv * F) : NULL;
    g->dbeta = any_gdn ? arena_take(ar, T * Hv * F) : NULL;
    if (ar->used < scratch_end) ar->used = scratch_end;
    if (g->moe) moe_layout(g->moe, ar);
    g->sizes.working = ar->used - mark;
    mark = ar->used;
    for (int i = 0; i < CT_UPLOAD_SLOTS; i++) g->batch_dev[i] = arena_take(ar, batch_set_bytes(g));
    g->loss_sum = arena_take(ar, F);
    g->aux_loss_sum = arena_take(ar, F);
    g->sizes.batch = ar->used - mark;
    g->sizes.host = (size_t)g->n_off * T * H * A;
}

/* The graph's host-side skeleton for opt, buffers not yet placed. */
static ct_graph *graph_shell(const ct_model *m, const ct_graph_options *opt)
{
    const ct_model_config *c = &m->cfg;
    int L = c->num_hidden_layers;
    ct_graph *g = ct_calloc(1, sizeof *g);
    g->m = m;
    g->be = m->be;
    g->opt = *opt;
    g->capacity = opt->capacity;
    g->mlp_chunk = opt->checkpointing && opt->mlp_chunk > 0 && opt->mlp_chunk < opt->capacity ? opt->mlp_chunk
                                                                                               : opt->capacity;
    int kept = !opt->checkpointing ? L : opt->keep_layers < 0 ? 0 : opt->keep_layers < L ? opt->keep_layers : L;
    g->n_recompute = L - kept;
    g->n_off = opt->checkpointing ? (opt->offload_layers < L ? opt->offload_layers : L) : 0;
    g->n_stage = opt->offload_buffers >= 2 && g->n_off >= 2 ? 2 : 1;
    g->n_ws = (g->n_recompute > 0) + kept;
    g->ws = ct_calloc(g->n_ws, sizeof *g->ws);
    g->xs = ct_calloc(L + 1, sizeof *g->xs);
    g->moe = moe_new(m, opt->capacity, g->n_ws, !opt->no_expert_lora, !opt->separate_expert_lora);
    g->stage_holds[0] = g->stage_holds[1] = -1;
    return g;
}

static void graph_shell_free(ct_graph *g)
{
    moe_free(g->moe);
    free(g->ws);
    free(g->xs);
    free(g);
}

void graph_measure(const ct_model *m, const ct_graph_options *opt, ct_graph_sizes *sizes)
{
    ct_graph *g = graph_shell(m, opt);
    ct_arena ar = {0};
    graph_layout(g, &ar);
    *sizes = g->sizes;
    graph_shell_free(g);
}

ct_graph *graph_new_with(const ct_model *m, const ct_graph_options *opt, ct_error *err)
{
    ct_graph *g = graph_shell(m, opt);
    ct_arena ar = {0};
    graph_layout(g, &ar);
    ct_backend *be = g->be;
    if (!(g->arena = be->alloc(be, ar.used))) {
        graph_shell_free(g);
        CT_FAIL_RUNTIME(err, "out of %s memory for activations (%.2f GiB for %d tokens per micro-batch)",
                        be->name, (double)ar.used / (1 << 30), opt->capacity);
        return NULL;
    }
    ar = (ct_arena){.base = g->arena};
    graph_layout(g, &ar);
    for (int i = 0; i < CT_UPLOAD_SLOTS; i++)
        if (!(g->batch_host[i] = be->host_alloc(be, batch_set_bytes(g), &g->batch_pinned[i]))) {
            CT_FAIL_RUNTIME(err, "out of host memory for batch staging");
            graph_free(g);
            return NULL;
        }
    if (g->n_off > 0) {
        g->host_xs = be->host_alloc(be, g->sizes.host, &g->host_pinned);
        if (!g->host_xs) {
            CT_FAIL_RUNTIME(err, "out of host memory for offloaded activations (%.2f GiB)",
                            (double)g->sizes.host / (1 << 30));
            graph_free(g);
            return NULL;
        }
    }
    return g;
}

ct_graph *graph_new(const ct_model *m, int capacity, bool checkpointing, ct_error *err)
{
    ct_graph_options opt = {.capacity = capacity, .checkpointing = checkpointing};
    return graph_new_with(m, &opt, err);
}

void graph_free(ct_graph *g)
{
    if (!g) return;
    if (g->arena) g->be->free(g->be, g->arena);
    if (g->host_xs) g->be->host_free(g->be, g->host_xs, g->host_pinned);
    for (int i = 0; i < CT_UPLOAD_SLOTS; i++)
        if (g->batch_host[i]) g->be->host_free(g->be, g->batch_host[i], g->batch_pinned[i]);
    graph_shell_free(g);
}

size_t graph_bytes(const ct_graph *g)
{
    return g->sizes.saved_device + g->sizes.staging + g->sizes.working + g->sizes.batch;
}
const ct_graph_sizes *graph_sizes(const ct_graph *g) { return &g->sizes; }
bool graph_host_pinned(const ct_graph *g) { return g->host_pinned; }
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

/* Packs the batch into the next slot's staging, queues its copy (after the
 * compute that last read that slot's device set) and makes compute wait for
 * it: the copy overlaps whatever is still running. The host waits only if the
 * staging's previous copy, two micro-batches ago, has not finished yet. */
void graph_set_batch(ct_graph *g, const ct_batch *b)
{
    CT_ASSERT(b->n_tokens <= g->capacity, "batch of %d tokens exceeds capacity %d", b->n_tokens, g->capacity);
    ct_backend *be = g->be;
    int slot = (int)(g->batch_count++ % CT_UPLOAD_SLOTS);
    size_t T = g->capacity;
    g->T = b->n_tokens;
    g->n_docs = b->n_docs;
    g->max_seqlen = b->max_seqlen;
    g->n_targets = b->n_targets;
    if (be->upload_host_wait(be, slot)) be->host_syncs++;
    int32_t *h = g->batch_host[slot], *d = g->batch_dev[slot];
    memcpy(h, b->tokens, (size_t)b->n_tokens * 4);
    memcpy(h + T, b->positions, (size_t)b->n_tokens * 4);
    memcpy(h + 2 * T, b->cu_seqlens, (size_t)(b->n_docs + 1) * 4);
    memcpy(h + 3 * T + 1, b->target_rows, (size_t)b->n_targets * 4);
    memcpy(h + 4 * T + 1, b->target_ids, (size_t)b->n_targets * 4);
    be->upload_async(be, d, h, (4 * T + 1 + (size_t)b->n_targets) * 4, slot);
    be->upload_wait(be, slot);
    g->tokens = d;
    g->positions = d + T;
    g->cu_seqlens = d + 2 * T;
    g->target_rows = d + 3 * T + 1;
    g->target_ids = d + 4 * T + 1;
}

/* After the last op that reads the current batch set. */
static void release_batch(ct_graph *g) { g->be->upload_release(g->be, (int)((g->batch_count - 1) % CT_UPLOAD_SLOTS)); }

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

/* The dropout seed of module mod of layer l for chunk c of its tokens. Chunk 0
 * (all tokens, unless the MLP runs in chunks) uses the module's own seed, so
 * that chunking changes nothing when there is one chunk; later chunks draw
 * their own masks. */
static uint64_t chunk_seed(const lora_ctx *lc, int l, ct_module mod, int chunk)
{
    uint64_t s = graph_module_seed(lc->seed, l, mod);
    return chunk == 0 ? s : ct_hash64(s, (uint64_t)chunk);
}

/* Where a group's u is kept: the slot's start (u, its width ldu) or NULL. */
typedef struct kept_u {
    void *u;
    int ldu;
} kept_u;

/* Only an adapter of the rank the slots were sized for keeps u (eval may run an
 * adapter of another rank on a graph planned for the config's: it recomputes). */
static kept_u kept(const ct_graph *g, const lora_ctx *lc, const layer_acts *a, u_slot s, size_t row)
{
    if (!lc->lo || lc->lo->R != g->opt.lora_rank) return (kept_u){NULL, 0};
    return (kept_u){u_at(g, a, s, row), u_width(g, s)};
}

/* Module q of a group's kept u. */
static kept_u kept_module(const ct_graph *g, kept_u k, int q)
{
    if (k.u) k.u = (char *)k.u + (size_t)q * g->opt.lora_rank * g->be->act_bytes;
    return k;
}

/* LoRA of module mod over T rows (one chunk of the micro-batch, or all of it). */
static void lora_fwd(ct_graph *g, const lora_ctx *lc, int l, ct_module mod, void *y, int ldy, const void *x,
                     int ldx, int T, int chunk, kept_u k)
{
    if (!lc->lo || !lc->lo->targeted[mod]) return;
    int in, out;
    model_module_shape(&g->m->cfg, mod, &in, &out);
    g->be->lora_fwd(g->be, y, ldy, x, ldx, lora_A(lc->lo, l, mod), lora_B(lc->lo, l, mod), T, in, out,
                    lc->lo->R, lc->lo->scale, lc->dropout, chunk_seed(lc, l, mod, chunk), k.u, k.ldu);
}

static void lora_bwd(ct_graph *g, const lora_ctx *lc, int l, ct_module mod, void *dx, int lddx,
                     const void *dy, int lddy, const void *x, int ldx, int T, int chunk, kept_u k)
{
    if (!lc->lo || !lc->lo->targeted[mod]) return;
    int in, out;
    model_module_shape(&g->m->cfg, mod, &in, &out);
    g->be->lora_bwd(g->be, dx, lddx, lora_grad_A(lc->lo, l, mod), lora_grad_B(lc->lo, l, mod), dy, lddy, x, ldx,
                    lora_A(lc->lo, l, mod), lora_B(lc->lo, l, mod), T, in, out, lc->lo->R, lc->lo->scale,
                    lc->dropout, chunk_seed(lc, l, mod, chunk), k.u, k.ldu);
}

static const ct_module qkv_mods[3] = {CT_MOD_Q, CT_MOD_K, CT_MOD_V};
static const ct_module gate_up[2] = {CT_MOD_GATE, CT_MOD_UP};

/* The targeted modules among mods[0..n) (sharing one input, writing output
 * columns col0[q] in increasing order) as ct_lora_cols, with their gradients when
 * grads; returns how many, *in their input width. */
static int shared_cols(const ct_graph *g, const lora_ctx *lc, int l, const ct_module *mods, const int *col0, int n,
                       bool grads, ct_lora_cols *cols, int *in)
{
    int m = 0;
    for (int q = 0; q < n; q++) {
        if (!lc->lo->targeted[mods[q]]) continue;
        int out;
        model_module_shape(&g->m->cfg, mods[q], in, &out);
        cols[m++] = (ct_lora_cols){.A = lora_A(lc->lo, l, mods[q]), .B = lora_B(lc->lo, l, mods[q]),
                                   .col0 = col0[q], .cols = out,
                                   .dA = grads ? lora_grad_A(lc->lo, l, mods[q]) : NULL,
                                   .dB = grads ? lora_grad_B(lc->lo, l, mods[q]) : NULL};
    }
    return m;
}

/* The LoRA of those modules: one stacked call without dropout, so x and y are
 * passed once; with dropout each module draws its own mask, so one call each. */
static void lora_fwd_shared(ct_graph *g, const lora_ctx *lc, int l, const ct_module *mods, const int *col0, int n,
                            void *y, int ldy, const void *x, int ldx, int T, int chunk, kept_u k)
{
    if (!lc->lo) return;
    if (lc->dropout > 0.0f) {
        for (int q = 0; q < n; q++)
            lora_fwd(g, lc, l, mods[q], act_at(g, y, col0[q]), ldy, x, ldx, T, chunk, kept_module(g, k, q));
        return;
    }
    ct_lora_cols cols[CT_LORA_COLS_MAX];
    int in = 0, m = shared_cols(g, lc, l, mods, col0, n, false, cols, &in);
    if (m) g->be->lora_fwd_cols(g->be, y, ldy, x, ldx, T, in, cols, m, lc->lo->R, lc->lo->scale, k.u, k.ldu);
}

static void lora_bwd_shared(ct_graph *g, const lora_ctx *lc, int l, const ct_module *mods, const int *col0, int n,
                            void *dx, int lddx, const void *dy, int lddy, const void *x, int ldx, int T, int chunk,
                            kept_u k)
{
    if (!lc->lo) return;
    if (lc->dropout > 0.0f) {
        for (int q = 0; q < n; q++)
            lora_bwd(g, lc, l, mods[q], dx, lddx, act_at(g, (void *)dy, col0[q]), lddy, x, ldx, T, chunk,
                     kept_module(g, k, q));
        return;
    }
    ct_lora_cols cols[CT_LORA_COLS_MAX];
    int in = 0, m = shared_cols(g, lc, l, mods, col0, n, true, cols, &in);
    if (m)
        g->be->lora_bwd_cols(g->be, dx, lddx, dy, lddy, x, ldx, T, in, cols, m, lc->lo->R, lc->lo->scale, k.u, k.ldu);
}

static int layer_window(const ct_model_config *c, int l) { return c->layer_sliding[l] ? c->sliding_window : 0; }

/* gu = hn Wgu^T (+LoRA gate|up) and act = swiglu(gu) for the n tokens of chunk c
 * (hn already offset to its first token; gu and act start at row 0). */
static void mlp_chunk_forward(ct_graph *g, const lora_ctx *lc, int l, const void *hn, void *gu, void *act, int n,
                              int chunk, kept_u ku)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    int H = c->hidden_size, I = c->intermediate_size;
    model_linear_fwd(MODEL_W(g->m, l, wgu), gu, 2 * I, hn, H, w->bgu, n, H, 2 * I, 0);
    lora_fwd_shared(g, lc, l, gate_up, (int[]){0, I}, 2, gu, 2 * I, hn, H, n, chunk, ku);
    g->be->swiglu_fwd(g->be, act, gu, n, I);
}

/* The MLP's input rows (hn) for the n tokens from t0: where the layer's forward
 * normed them, or with hn_per_chunk normed now into hn's one chunk (the same bits:
 * the norm is per row). */
static const void *mlp_input(ct_graph *g, int l, const layer_acts *a, int t0, int n)
{
    const ct_model_config *c = &g->m->cfg;
    int H = c->hidden_size;
    if (!a->hn_per_chunk) return act_at(g, a->hn, (size_t)t0 * H);
    g->be->rmsnorm_fwd(g->be, a->hn, H, a->rstd2 + t0, act_at(g, a->h, (size_t)t0 * H), H, g->m->layers[l].mlp_norm,
                       c->norm_zero_centred, n, 1, H, (float)c->rms_norm_eps);
    return a->hn;
}

/* Dense MLP forward, out = h + down(swiglu(gu(hn))), over chunks of mlp_chunk
 * tokens: the (T, 2I) intermediates of a long micro-batch never exist at once. */
static void mlp_forward(ct_graph *g, const lora_ctx *lc, int l, layer_acts *a, void *out)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    int T = g->T, H = c->hidden_size, I = c->intermediate_size;
    for (int t0 = 0, ci = 0; t0 < T; t0 += g->mlp_chunk, ci++) {
        int n = T - t0 < g->mlp_chunk ? T - t0 : g->mlp_chunk;
        size_t row = (size_t)t0 * H, r0 = recomputed(g, l) ? 0 : (size_t)t0; /* chunk's rows in gu, act */
        void *gu = act_at(g, a->gu, r0 * 2 * I), *act = act_at(g, a->act, r0 * I);
        mlp_chunk_forward(g, lc, l, mlp_input(g, l, a, t0, n), gu, act, n, ci, kept(g, lc, a, U_GU, r0));
        model_linear_fwd_residual(MODEL_W(g->m, l, wdown), act_at(g, out, row), H, act_at(g, a->h, row), act, I,
                                  w->bdown, n, I, H);
        lora_fwd(g, lc, l, CT_MOD_DOWN, act_at(g, out, row), H, act, I, n, ci, kept(g, lc, a, U_DOWN, r0));
    }
}

/* dhn = the dense MLP's input gradient given d (its output gradient), chunk by
 * chunk. In a recomputed layer each chunk's gu and act (with hn_per_chunk its hn
 * too) are recomputed here (the layer recompute stops before the MLP); otherwise
 * forward kept them all. */
static void mlp_backward(ct_graph *g, const lora_ctx *lc, int l, const layer_acts *a, const void *d)
{
    const ct_model_config *c = &g->m->cfg;
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size, I = c->intermediate_size;
    for (int t0 = 0, ci = 0; t0 < T; t0 += g->mlp_chunk, ci++) {
        int n = T - t0 < g->mlp_chunk ? T - t0 : g->mlp_chunk;
        size_t row = (size_t)t0 * H, r0 = recomputed(g, l) ? 0 : (size_t)t0;
        const void *hn = mlp_input(g, l, a, t0, n), *dc = act_at(g, (void *)d, row);
        void *dhn = act_at(g, g->dhn, row), *gu = act_at(g, a->gu, r0 * 2 * I), *act = act_at(g, a->act, r0 * I);
        /* A recomputed layer's down LoRA has no kept u (its forward did not run here). */
        kept_u ku_gu = kept(g, lc, a, U_GU, r0), ku_down = kept(g, lc, a, U_DOWN, r0);
        if (recomputed(g, l)) {
            mlp_chunk_forward(g, lc, l, hn, gu, act, n, ci, ku_gu);
            ku_down.u = NULL;
        }
        model_linear_bwd_input(MODEL_W(g->m, l, wdown), g->dact, I, dc, H, n, I, H, 0);
        lora_bwd(g, lc, l, CT_MOD_DOWN, g->dact, I, dc, H, act, I, n, ci, ku_down);
        be->swiglu_bwd(be, g->dgu, g->dact, gu, n, I);
        model_linear_bwd_input(MODEL_W(g->m, l, wgu), dhn, H, g->dgu, 2 * I, n, H, 2 * I, 0);
        lora_bwd_shared(g, lc, l, gate_up, (int[]){0, I}, 2, dhn, H, g->dgu, 2 * I, hn, H, n, ci, ku_gu);
    }
}

/* The LoRA modules on the fused GDN input's [qkv | z] and [b | a] columns:
 * qwen3_5's in_proj_qkv and in_proj_z (in_proj_b, in_proj_a), or qwen3_next's
 * one in_proj_qkvz (in_proj_ba) over both; a model has only one of the two kinds. */
static const ct_module gdn_in_qkvz[3] = {CT_MOD_IN_QKV, CT_MOD_IN_Z, CT_MOD_IN_QKVZ};
static const ct_module gdn_in_ba[3] = {CT_MOD_IN_B, CT_MOD_IN_A, CT_MOD_IN_BA};

/* The GDN mixer of layer l: a->h = x + out_proj(gated_rmsnorm(delta(conv(P)), z)),
 * P = a->xn Win^T (+LoRA). */
static void gdn_forward(ct_graph *g, const lora_ctx *lc, int l, const void *x, layer_acts *a)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size, NP = model_gdn_proj_dim(c), CD = model_gdn_conv_dim(c);
    int Kd = model_gdn_key_dim(c), Vd = model_gdn_value_dim(c), Hv = c->linear_num_value_heads;
    int Hk = c->linear_num_key_heads, Dk = c->linear_key_head_dim, Dv = c->linear_value_head_dim;
    model_linear_fwd(MODEL_W(g->m, l, win), a->proj, NP, a->xn, H, NULL, T, H, NP, 0);
    lora_fwd_shared(g, lc, l, gdn_in_qkvz, (int[]){0, CD, 0}, 3, a->proj, NP, a->xn, H, T, 0,
                    kept(g, lc, a, U_GDN_QKVZ, 0));
    lora_fwd_shared(g, lc, l, gdn_in_ba, (int[]){CD + Vd, CD + Vd + Hv, CD + Vd}, 3, a->proj, NP, a->xn, H, T, 0,
                    kept(g, lc, a, U_GDN_BA, 0));
    be->gdn_conv_fwd(be, a->conv, CD, a->proj, NP, w->conv_w, g->positions, T, CD, c->linear_conv_kernel_dim);
    be->gdn_gates_fwd(be, a->gg, a->beta, act_at(g, a->proj, CD + Vd + Hv), NP, act_at(g, a->proj, CD + Vd), NP,
                      w->A_log, w->dt_bias, T, Hv);
    be->gdn_delta_fwd(be, a->core, Vd, a->conv, CD, act_at(g, a->conv, Kd), CD, act_at(g, a->conv, 2 * Kd), CD,
                      a->gg, a->beta, g->cu_seqlens, g->n_docs, T, Hk, Hv, Dk, Dv, 1.0f / sqrtf((float)Dk));
    be->gated_rmsnorm_fwd(be, a->normed, Vd, a->core, Vd, act_at(g, a->proj, CD), NP, w->gdn_norm, T, Hv, Dv,
                          (float)c->rms_norm_eps);
    model_linear_fwd_residual(MODEL_W(g->m, l, wout), a->h, H, x, a->normed, Vd, NULL, T, Vd, H);
    lora_fwd(g, lc, l, CT_MOD_OUT, a->h, H, a->normed, Vd, T, 0, kept(g, lc, a, U_GDN_OUT, 0));
}

/* Its backward from dh (the gradient of a->h) to g->dxn (of a->xn). */
static void gdn_backward(ct_graph *g, const lora_ctx *lc, int l, const layer_acts *a, const void *dh)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size, NP = model_gdn_proj_dim(c), CD = model_gdn_conv_dim(c);
    int Kd = model_gdn_key_dim(c), Vd = model_gdn_value_dim(c), Hv = c->linear_num_value_heads;
    int Hk = c->linear_num_key_heads, Dk = c->linear_key_head_dim, Dv = c->linear_value_head_dim;
    model_linear_bwd_input(MODEL_W(g->m, l, wout), g->dnormed, Vd, dh, H, T, Vd, H, 0);
    lora_bwd(g, lc, l, CT_MOD_OUT, g->dnormed, Vd, dh, H, a->normed, Vd, T, 0, kept(g, lc, a, U_GDN_OUT, 0));
    be->gated_rmsnorm_bwd(be, g->dcore, Vd, act_at(g, g->dproj, CD), NP, g->dnormed, Vd, a->core, Vd,
                          act_at(g, a->proj, CD), NP, w->gdn_norm, T, Hv, Dv, (float)c->rms_norm_eps);
    be->gdn_delta_bwd(be, g->dconv, CD, act_at(g, g->dconv, Kd), CD, act_at(g, g->dconv, 2 * Kd), CD, g->dgg,
                      g->dbeta, g->dcore, Vd, a->conv, CD, act_at(g, a->conv, Kd), CD, act_at(g, a->conv, 2 * Kd),
                      CD, a->gg, a->beta, g->cu_seqlens, g->n_docs, T, Hk, Hv, Dk, Dv, 1.0f / sqrtf((float)Dk));
    be->gdn_gates_bwd(be, act_at(g, g->dproj, CD + Vd + Hv), NP, act_at(g, g->dproj, CD + Vd), NP, g->dgg, g->dbeta,
                      act_at(g, a->proj, CD + Vd + Hv), NP, act_at(g, a->proj, CD + Vd), NP, w->A_log, w->dt_bias,
                      T, Hv);
    be->gdn_conv_bwd(be, g->dproj, NP, g->dconv, CD, a->proj, NP, w->conv_w, g->positions, T, CD,
                     c->linear_conv_kernel_dim);
    model_linear_bwd_input(MODEL_W(g->m, l, win), g->dxn, H, g->dproj, NP, T, H, NP, 0);
    lora_bwd_shared(g, lc, l, gdn_in_qkvz, (int[]){0, CD, 0}, 3, g->dxn, H, g->dproj, NP, a->xn, H, T, 0,
                    kept(g, lc, a, U_GDN_QKVZ, 0));
    lora_bwd_shared(g, lc, l, gdn_in_ba, (int[]){CD + Vd, CD + Vd + Hv, CD + Vd}, 3, g->dxn, H, g->dproj, NP, a->xn, H,
                    T, 0, kept(g, lc, a, U_GDN_BA, 0));
}

/* The attention of layer l: a->h = x + o(attn(rope(norm_qk(qkv(a->xn))))) [* sigmoid(gate)]. */
static void attention_forward(ct_graph *g, const lora_ctx *lc, int l, const void *x, layer_acts *a)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size, D = c->head_dim;
    int nq = c->num_attention_heads, nkv = c->num_key_value_heads, Q = nq * D, KV = nkv * D;
    int Qw = model_attn_gated(c) ? 2 * Q : Q, QKV = Qw + 2 * KV; /* q (and gate) columns, all columns */
    float eps = (float)c->rms_norm_eps;

    void *qkv_lin = c->qk_norm ? a->qkv_raw : a->qkv;
    model_linear_fwd(MODEL_W(g->m, l, wqkv), qkv_lin, QKV, a->xn, H, w->bqkv, T, H, QKV, 0);
    lora_fwd_shared(g, lc, l, qkv_mods, (int[]){0, Qw, Qw + KV}, 3, qkv_lin, QKV, a->xn, H, T, 0,
                    kept(g, lc, a, U_QKV, 0));
    void *q = a->qkv, *k = act_at(g, a->qkv, Qw), *v = layer_v(g, a, Qw + KV);
    const int32_t *pos = g->positions;
    const float *freq = g->m->inv_freq, scaling = g->m->attn_scaling;
    int rot = g->m->rot_dim;
    if (c->qk_norm) {
        be->rmsnorm_rope_fwd(be, q, QKV, a->rstd_q, a->qkv_raw, QKV, w->q_norm, c->norm_zero_centred, pos, freq, T,
                             nq, D, rot, eps, scaling);
        be->rmsnorm_rope_fwd(be, k, QKV, a->rstd_k, act_at(g, a->qkv_raw, Qw), QKV, w->k_norm, c->norm_zero_centred,
                             pos, freq, T, nkv, D, rot, eps, scaling);
    } else {
        be->rope(be, q, QKV, pos, freq, T, nq, D, rot, scaling, 0);
        be->rope(be, k, QKV, pos, freq, T, nkv, D, rot, scaling, 0);
    }
    be->attention_fwd(be, a->attn, Q, a->lse, q, QKV, k, QKV, v, QKV, g->cu_seqlens, g->n_docs, g->max_seqlen,
                      T, nq, nkv, D, 1.0f / sqrtf((float)D), layer_window(c, l), w->sinks);
    void *oin = a->attn;
    if (model_attn_gated(c)) {
        be->sigmoid_gate_fwd(be, a->gated, Q, a->attn, Q, act_at(g, qkv_lin, Q), QKV, D, T, nq, D);
        oin = a->gated;
    }
    model_linear_fwd_residual(MODEL_W(g->m, l, wo), a->h, H, x, oin, Q, w->bo, T, Q, H);
    lora_fwd(g, lc, l, CT_MOD_O, a->h, H, oin, Q, T, 0, kept(g, lc, a, U_O, 0));
}

/* Its backward from dh to g->dxn. */
static void attention_backward(ct_graph *g, const lora_ctx *lc, int l, const layer_acts *a, const void *dh)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size, D = c->head_dim;
    int nq = c->num_attention_heads, nkv = c->num_key_value_heads, Q = nq * D, KV = nkv * D;
    int Qw = model_attn_gated(c) ? 2 * Q : Q, QKV = Qw + 2 * KV;
    bool gated = model_attn_gated(c);
    void *qkv_lin = c->qk_norm ? a->qkv_raw : a->qkv;

    model_linear_bwd_input(MODEL_W(g->m, l, wo), g->dattn, Q, dh, H, T, Q, H, 0);
    lora_bwd(g, lc, l, CT_MOD_O, g->dattn, Q, dh, H, gated ? a->gated : a->attn, Q, T, 0, kept(g, lc, a, U_O, 0));
    if (gated) /* in place: dattn becomes the gradient of the ungated output */
        be->sigmoid_gate_bwd(be, g->dattn, Q, act_at(g, g->dqkv, Q), QKV, g->dattn, Q, a->attn, Q,
                             act_at(g, qkv_lin, Q), QKV, D, T, nq, D);
    void *q = a->qkv, *k = act_at(g, a->qkv, Qw), *v = layer_v(g, a, Qw + KV);
    void *dq = g->dqkv, *dk = act_at(g, g->dqkv, Qw), *dv = act_at(g, g->dqkv, Qw + KV);
    be->attention_bwd(be, dq, QKV, dk, QKV, dv, QKV, g->dattn, Q, a->attn, Q, a->lse, q, QKV, k, QKV, v, QKV,
                      g->cu_seqlens, g->n_docs, g->max_seqlen, T, nq, nkv, D, 1.0f / sqrtf((float)D),
                      layer_window(c, l), w->sinks);
    const int32_t *pos = g->positions;
    const float *freq = g->m->inv_freq, scaling = g->m->attn_scaling;
    int rot = g->m->rot_dim;
    if (c->qk_norm) { /* in place: dq, dk become the gradients of the raw projections */
        be->rmsnorm_rope_bwd(be, dq, QKV, dq, QKV, a->qkv_raw, QKV, a->rstd_q, w->q_norm, c->norm_zero_centred, pos,
                             freq, T, nq, D, rot, scaling);
        be->rmsnorm_rope_bwd(be, dk, QKV, dk, QKV, act_at(g, a->qkv_raw, Qw), QKV, a->rstd_k, w->k_norm,
                             c->norm_zero_centred, pos, freq, T, nkv, D, rot, scaling);
    } else {
        be->rope(be, dq, QKV, pos, freq, T, nq, D, rot, scaling, 1);
        be->rope(be, dk, QKV, pos, freq, T, nkv, D, rot, scaling, 1);
    }
    model_linear_bwd_input(MODEL_W(g->m, l, wqkv), g->dxn, H, g->dqkv, QKV, T, H, QKV, 0);
    lora_bwd_shared(g, lc, l, qkv_mods, (int[]){0, Qw, Qw + KV}, 3, g->dxn, H, g->dqkv, QKV, a->xn, H, T, 0,
                    kept(g, lc, a, U_QKV, 0));
}

/* out NULL: the checkpointing recompute, which needs what backward reads and
 * not the output (already computed by the first forward): it stops after the
 * MLP norm for dense layers (before it with hn_per_chunk) and before the expert
 * un-permute for sparse ones. */
static void layer_forward(ct_graph *g, const lora_ctx *lc, int l, const void *x, void *out, layer_acts *a)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size;
    float eps = (float)c->rms_norm_eps;

    be->rmsnorm_fwd(be, a->xn, H, a->rstd1, x, H, w->attn_norm, c->norm_zero_centred, T, 1, H, eps);
    if (layer_gdn(c, l)) gdn_forward(g, lc, l, x, a);
    else attention_forward(g, lc, l, x, a);

    if (!a->hn_per_chunk) /* else the MLP norms each chunk (mlp_input) */
        be->rmsnorm_fwd(be, a->hn, H, a->rstd2, a->h, H, w->mlp_norm, c->norm_zero_centred, T, 1, H, eps);
    if (c->layer_sparse[l]) {
        moe_lora ml = moe_lora_of(lc);
        moe_forward(g->moe, &ml, l, ws_of(g, l), a->hn, a->h, out, T, lc->moe_stats);
    } else if (out) {
        mlp_forward(g, lc, l, a, out);
    }
}

/* d holds the gradient of the layer's output on entry, of h (the mixer's output)
 * in between and of the layer's input on exit: each is last read before the next
 * is first written. */
static void layer_backward(ct_graph *g, const lora_ctx *lc, int l, const void *x, void *d, const layer_acts *a)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size;
    float eps = (float)c->rms_norm_eps;

    /* MLP: out = h + down(swiglu(gu(norm(h)))), or out = h + MoE(norm(h)) */
    if (c->layer_sparse[l]) {
        moe_lora ml = moe_lora_of(lc);
        moe_backward(g->moe, &ml, l, ws_of(g, l), d, g->dhn, T, g->router_aux);
    } else {
        mlp_backward(g, lc, l, a, d);
    }
    /* d becomes the gradient of h (in place: the op reads each element of its
     * residual input before writing it) */
    be->rmsnorm_bwd(be, d, H, g->dhn, H, a->h, H, a->rstd2, w->mlp_norm, c->norm_zero_centred, T, 1, H, d, H);
    if (a->xn == a->h) /* h is dead now; the same bits as the forward's xn */
        be->rmsnorm_fwd(be, a->xn, H, a->rstd1, x, H, w->attn_norm, c->norm_zero_centred, T, 1, H, eps);

    /* the mixer: h = x + attention(norm(x)) or x + GDN(norm(x)) */
    if (layer_gdn(c, l)) gdn_backward(g, lc, l, a, d);
    else attention_backward(g, lc, l, a, d);
    be->rmsnorm_bwd(be, d, H, g->dxn, H, x, H, a->rstd1, w->attn_norm, c->norm_zero_centred, T, 1, H, d, H);
}

static layer_acts *acts_of(ct_graph *g, int l) { return &g->ws[ws_of(g, l)]; }

/* ---- activation offload ----
 * Layer inputs 0 .. n_off-1 live in host memory; on the device they pass
 * through n_stage staging buffers, layer l's through stage[l % n_stage].
 * Slot b of the backend's copy ordering belongs to stage[b].
 *  Forward: layer l reads its input from stage[l % n] and the copy to the host
 *    starts at once; with two buffers, layer l's output overwrites the buffer
 *    whose store began one layer earlier, so the compute stream waits on that
 *    store just before layer l; with one, it waits at once (no overlap).
 *  Backward (layers L-1 .. 0): with two buffers, while layer l computes from
 *    one, the other is loaded with layer l-1's input; with one, the load follows
 *    layer l's backward. stage_holds skips loads of inputs still resident after
 *    forward (the last one or two offloaded layers). */
static void *layer_input(const ct_graph *g, int l) { return l < g->n_off ? g->stage[l % g->n_stage] : g->xs[l]; }

static size_t input_bytes(const ct_graph *g) { return (size_t)g->T * g->m->cfg.hidden_size * g->be->act_bytes; }

static char *host_input(const ct_graph *g, int l)
{
    return g->host_xs + (size_t)l * g->capacity * g->m->cfg.hidden_size * g->be->act_bytes;
}

/* Before layer l runs forward (save: training, whose backward needs the inputs). */
static void offload_before_forward(ct_graph *g, int l, bool save)
{
    if (l >= g->n_off) return;
    ct_backend *be = g->be;
    int b = l % g->n_stage, out_b = (l + 1) % g->n_stage;
    g->stage_holds[b] = l;
    if (l + 1 < g->n_off) g->stage_holds[out_b] = l + 1;
    if (!save) return;
    be->offload_store(be, host_input(g, l), g->stage[b], input_bytes(g), b);
    /* layer l writes its output into stage[out_b] when l+1 is offloaded too */
    if (l + 1 < g->n_off) be->offload_wait(be, out_b);
}

/* Makes layer l's input resident in its staging buffer (issuing the load if it
 * is not) and makes compute wait for it. */
static void offload_fetch(ct_graph *g, int l)
{
    ct_backend *be = g->be;
    int b = l % g->n_stage;
    if (g->stage_holds[b] == l) return;
    be->offload_load(be, g->stage[b], host_input(g, l), input_bytes(g), b);
    g->stage_holds[b] = l;
}

static void offload_before_backward(ct_graph *g, int l)
{
    if (l >= g->n_off) return;
    offload_fetch(g, l);   /* no-op when prefetched or resident */
    g->be->offload_wait(g->be, l % g->n_stage);
    if (g->n_stage == 2 && l >= 1) offload_fetch(g, l - 1); /* overlaps layer l's work */
}

/* Embedding, every layer, final norm: xf holds the head's input afterwards. */
static void forward_all(ct_graph *g, const lora_ctx *lc, bool save)
{
    const ct_model_config *c = &g->m->cfg;
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size, L = c->num_hidden_layers;
    /* A store of the previous micro-batch may still read a staging buffer that
     * backward found resident (and never reloaded): wait before overwriting it. */
    for (int b = 0; b < g->n_stage && g->n_off > 0; b++) be->offload_wait(be, b);
    be->embedding(be, layer_input(g, 0), g->tokens, g->m->embed, T, H);
    for (int l = 0; l < L; l++) {
        offload_before_forward(g, l, save);
        layer_forward(g, lc, l, layer_input(g, l), l + 1 < L ? layer_input(g, l + 1) : g->xs[L], acts_of(g, l));
    }
    be->rmsnorm_fwd(be, g->xf, H, g->rstd_f, g->xs[L], H, g->m->final_norm, c->norm_zero_centred, T, 1, H,
                    (float)c->rms_norm_eps);
}

void graph_train_step(ct_graph *g, const ct_lora *lo, float grad_scale, uint64_t dropout_seed)
{
    const ct_model_config *c = &g->m->cfg;
    ct_backend *be = g->be;
    int T = g->T, H = c->hidden_size, L = c->num_hidden_layers;
    lora_ctx lc = {.lo = lo, .seed = dropout_seed, .dropout = lo ? lo->dropout : 0.0f, .moe_stats = g->router_aux};
    if (g->router_aux) moe_aux_begin(g->moe);
    forward_all(g, &lc, g->n_targets > 0);
    if (g->n_targets == 0) { /* nothing to learn from: no loss, no gradient */
        release_batch(g);
        return;
    }
    if (g->router_aux) moe_aux_loss(g->moe, g->aux_loss_sum, T);
    lc.moe_stats = false; /* a checkpointing recompute must not count the statistics twice */
    be->zero(be, g->dxf, (size_t)T * H * be->act_bytes);
    be->cross_entropy(be, g->loss_sum, g->dxf, g->xf, g->m->lm_head, g->target_rows, g->target_ids, g->n_targets,
                      H, c->vocab_size, grad_scale);
    be->rmsnorm_bwd(be, g->dstream, H, g->dxf, H, g->xs[L], H, g->rstd_f, g->m->final_norm, c->norm_zero_centred, T,
                    1, H, NULL, 0);
    for (int l = L - 1; l >= 0; l--) {
        offload_before_backward(g, l);
        if (recomputed(g, l)) layer_forward(g, &lc, l, layer_input(g, l), NULL, acts_of(g, l));
        layer_backward(g, &lc, l, layer_input(g, l), g->dstream, acts_of(g, l));
    }
    release_batch(g);
}

void graph_eval(ct_graph *g, const ct_lora *lo)
{
    lora_ctx lc = {.lo = lo, .seed = 0, .dropout = 0.0f};
    forward_all(g, &lc, false);
    if (g->n_targets > 0)
        g->be->cross_entropy(g->be, g->loss_sum, NULL, g->xf, g->m->lm_head, g->target_rows, g->target_ids,
                             g->n_targets, g->m->cfg.hidden_size, g->m->cfg.vocab_size, 1.0f);
    release_batch(g);
}
