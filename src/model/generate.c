/* generate.c — KV-cache decoding, samplers and the byte tokenizer (see generate.h).
 *
 * The layer is graph.c's forward, restated for a chunk of new tokens at
 * positions n_past.. (graph.c works on packed training batches and keeps what
 * backward needs; here nothing is kept but the cache):
 *   xn = rmsnorm(x) ; qkv = xn Wqkv^T (+b) (+LoRA q|k|v) ; [qwen3: q/k norm]
 *   rope(q, k) at n_past.. ; K[n_past..], V[n_past..] = k, v
 *   attn = attention_decode(q, K[0..n_past+C), V) ; h = x + attn Wo^T (+LoRA o)
 *   out = h + down(swiglu(gu(rmsnorm(h)))) (+LoRA)
 * A sparse layer's MLP is graph_moe.c's moe_forward itself (routing, grouped
 * expert GEMMs and their LoRA, the weighted un-permute), on a workspace sized
 * for one chunk; gpt_oss's attention sinks go to attention_decode.
 *
 * Gated DeltaNet hybrids (qwen3_5*, qwen3_next): a gated attention layer's
 * projection is [q | gate | k | v], its q/k norms zero-centred, its RoPE
 * partial, and its attention output times sigmoid(gate) before o_proj. A GDN
 * layer keeps no cache but two states per layer, zero at position 0: the
 * conv's last W-1 input rows and the delta rule's S (Hv, Dk, Dv) fp32; the
 * backend's gdn_conv_step / gdn_delta_step carry them over the new tokens,
 * and the rest of the layer is graph.c's gdn_forward on the chunk's rows.
 * test_generate.c holds it to the graph: the loss of a document fed one token
 * at a time equals graph_eval's. */
#include "generate.h"

#include "arena.h"
#include "graph_moe.h"
#include "tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ct_generator {
    const ct_model *m;
    const ct_lora *lo;
    ct_backend *be;
    int capacity, chunk, n_past;
    void **k_cache, **v_cache;  /* (L) each (capacity, nkv*D) act, post-RoPE keys and values; NULL in GDN layers */
    void **conv_state;          /* (L) GDN layers: (W-1, CD) act, the conv's last inputs; else NULL */
    float **delta_state;        /* (L) GDN layers: (Hv, Dk, Dv) fp32, the delta rule's S; else NULL */
    int32_t *tokens, *positions;/* (chunk) device */
    void *x;                    /* (chunk, H) the residual stream */
    void *xn, *h, *hn;          /* (chunk, H) */
    void *qkv;                  /* (chunk, QKV), QKV = Q [+ Q gate] + 2 KV */
    void *attn;                 /* (chunk, Q) */
    void *gu;                   /* (chunk, 2I) */
    void *act;                  /* (chunk, I) */
    void *xf;                   /* (1, H) final norm of the last token */
    void *logits;               /* (1, V) act */
    void *proj;                 /* (chunk, NP) GDN input projection [qkv | z | b | a] */
    void *conv;                 /* (chunk, CD) its conv + SiLU: q | k | v */
    float *gg, *beta;           /* (chunk, Hv) decay (log) and write gates */
    void *core, *normed;        /* (chunk, Vd) delta-rule output, gated RMSNorm of it */
    int32_t *host_pos;          /* (chunk) */
    ct_moe *moe;                /* sparse layers' block (NULL for a dense model) */
    void *moe_arena;            /* its buffers, for chunk tokens */
    bool failed;
};

static void *act_at(const ct_generator *g, void *p, size_t elems) { return (char *)p + elems * g->be->act_bytes; }

static bool layer_gdn(const ct_model_config *c, int l) { return c->gdn && c->layer_linear[l]; }

static size_t conv_state_bytes(const ct_generator *g)
{
    const ct_model_config *c = &g->m->cfg;
    return (size_t)(c->linear_conv_kernel_dim - 1) * model_gdn_conv_dim(c) * g->be->act_bytes;
}

static size_t delta_state_bytes(const ct_model_config *c)
{
    return (size_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim * sizeof(float);
}

static void *galloc(ct_generator *g, size_t bytes)
{
    if (g->failed) return NULL;
    void *p = g->be->alloc(g->be, bytes ? bytes : 1); /* a width-1 conv keeps a 0-byte state */
    if (!p) g->failed = true;
    return p;
}

ct_generator *generator_new(const ct_model *m, const ct_lora *lo, int capacity, int chunk, ct_error *err)
{
    const ct_model_config *c = &m->cfg;
    if (capacity < 1 || chunk < 1) {
        CT_FAIL_INPUT(err, "generate: capacity %d and chunk %d must be >= 1", capacity, chunk);
        return NULL;
    }
    if (c->gdn && (!m->be->gdn_conv_step || !m->be->gdn_delta_step)) {
        CT_FAIL_INPUT(err, "generate: model_type %s has Gated DeltaNet layers; the %s backend has no gdn_conv_step / "
                      "gdn_delta_step to decode them (generate with --device cpu)", c->model_type, m->be->name);
        return NULL;
    }
    if (capacity > c->max_position_embeddings) {
        CT_FAIL_INPUT(err, "prompt + new tokens = %d positions, more than the model's max_position_embeddings %d",
                      capacity, c->max_position_embeddings);
        return NULL;
    }
    if (chunk > capacity) chunk = capacity;
    ct_generator *g = ct_calloc(1, sizeof *g);
    g->m = m;
    g->lo = lo;
    g->be = m->be;
    g->capacity = capacity;
    g->chunk = chunk;
    size_t C = chunk, H = c->hidden_size, I = c->intermediate_size, D = c->head_dim, A = g->be->act_bytes;
    size_t Q = c->num_attention_heads * D, KV = c->num_key_value_heads * D;
    size_t QKV = (model_attn_gated(c) ? 2 * Q : Q) + 2 * KV;
    int L = c->num_hidden_layers;
    g->k_cache = ct_calloc(L, sizeof *g->k_cache);
    g->v_cache = ct_calloc(L, sizeof *g->v_cache);
    g->conv_state = ct_calloc(L, sizeof *g->conv_state);
    g->delta_state = ct_calloc(L, sizeof *g->delta_state);
    bool any_gdn = false;
    for (int l = 0; l < L; l++) {
        if (layer_gdn(c, l)) {
            g->conv_state[l] = galloc(g, conv_state_bytes(g));
            g->delta_state[l] = galloc(g, delta_state_bytes(c));
            any_gdn = true;
            continue;
        }
        g->k_cache[l] = galloc(g, (size_t)capacity * KV * A);
        g->v_cache[l] = galloc(g, (size_t)capacity * KV * A);
    }
    if (any_gdn) {
        size_t NP = model_gdn_proj_dim(c), CD = model_gdn_conv_dim(c), Vd = model_gdn_value_dim(c);
        size_t Hv = c->linear_num_value_heads;
        g->proj = galloc(g, C * NP * A);
        g->conv = galloc(g, C * CD * A);
        g->gg = galloc(g, C * Hv * sizeof(float));
        g->beta = galloc(g, C * Hv * sizeof(float));
        g->core = galloc(g, C * Vd * A);
        g->normed = galloc(g, C * Vd * A);
    }
    g->tokens = galloc(g, C * 4);
    g->positions = galloc(g, C * 4);
    g->x = galloc(g, C * H * A);
    g->xn = galloc(g, C * H * A);
    g->h = galloc(g, C * H * A);
    g->hn = galloc(g, C * H * A);
    g->qkv = galloc(g, C * QKV * A);
    g->attn = galloc(g, C * Q * A);
    g->gu = galloc(g, C * 2 * I * A);
    g->act = galloc(g, C * I * A);
    g->xf = galloc(g, H * A);
    g->logits = galloc(g, (size_t)c->vocab_size * A);
    g->host_pos = ct_malloc(C * sizeof(int32_t));
    if ((g->moe = moe_new(m, chunk, 1, lo != NULL, true))) {
        ct_arena ar = {0}; /* measure, allocate, carve (arena.h) */
        moe_layout(g->moe, &ar);
        if ((g->moe_arena = galloc(g, ar.used))) {
            ar = (ct_arena){.base = g->moe_arena};
            moe_layout(g->moe, &ar);
        }
    }
    if (g->failed) {
        generator_free(g);
        CT_FAIL_RUNTIME(err, "out of %s memory for the KV cache (%d positions) and a %d-token chunk",
                        m->be->name, capacity, chunk);
        return NULL;
    }
    generator_reset(g);
    return g;
}

void generator_free(ct_generator *g)
{
    if (!g) return;
    ct_backend *be = g->be;
#define FREE(p) do { if (p) be->free(be, p); } while (0)
    for (int l = 0; l < g->m->cfg.num_hidden_layers; l++) {
        FREE(g->k_cache[l]);
        FREE(g->v_cache[l]);
        FREE(g->conv_state[l]);
        FREE(g->delta_state[l]);
    }
    FREE(g->tokens); FREE(g->positions); FREE(g->x); FREE(g->xn); FREE(g->h); FREE(g->hn); FREE(g->qkv);
    FREE(g->attn); FREE(g->gu); FREE(g->act); FREE(g->xf); FREE(g->logits); FREE(g->moe_arena);
    FREE(g->proj); FREE(g->conv); FREE(g->gg); FREE(g->beta); FREE(g->core); FREE(g->normed);
#undef FREE
    moe_free(g->moe);
    free(g->k_cache);
    free(g->v_cache);
    free(g->conv_state);
    free(g->delta_state);
    free(g->host_pos);
    free(g);
}

void generator_reset(ct_generator *g)
{
    g->n_past = 0;
    for (int l = 0; l < g->m->cfg.num_hidden_layers; l++) {
        if (g->conv_state[l]) g->be->zero(g->be, g->conv_state[l], conv_state_bytes(g));
        if (g->delta_state[l]) g->be->zero(g->be, g->delta_state[l], delta_state_bytes(&g->m->cfg));
    }
}
int generator_position(const ct_generator *g) { return g->n_past; }

static void lora_fwd(ct_generator *g, int l, ct_module mod, void *y, int ldy, const void *x, int ldx, int T)
{
    const ct_lora *lo = g->lo;
    if (!lo || !lo->targeted[mod]) return;
    g->be->lora_fwd(g->be, y, ldy, x, ldx, lora_A(lo, l, mod), lora_B(lo, l, mod), T, lo->in[mod], lo->out[mod],
                    lo->R, lo->scale, 0.0f, 0, NULL, 0);
}

/* The LoRA modules on the GDN input projection and their first columns: qwen3_5's
 * in_proj_qkv | z | b | a, or qwen3_next's in_proj_qkvz | ba (untargeted ones add nothing). */
static void gdn_in_lora(ct_generator *g, int l, int T)
{
    const ct_model_config *c = &g->m->cfg;
    int H = c->hidden_size, NP = model_gdn_proj_dim(c), CD = model_gdn_conv_dim(c);
    int Vd = model_gdn_value_dim(c), Hv = c->linear_num_value_heads;
    const ct_module mods[6] = {CT_MOD_IN_QKV, CT_MOD_IN_Z, CT_MOD_IN_QKVZ, CT_MOD_IN_B, CT_MOD_IN_A, CT_MOD_IN_BA};
    const int col0[6] = {0, CD, 0, CD + Vd, CD + Vd + Hv, CD + Vd};
    for (int i = 0; i < 6; i++) lora_fwd(g, l, mods[i], act_at(g, g->proj, col0[i]), NP, g->xn, H, T);
}

/* g->h = g->x + out_proj(gated_rmsnorm(delta(conv(P)), z)), P = g->xn Win^T (+LoRA),
 * the conv and the delta rule continuing layer l's states. */
static void gdn_mixer(ct_generator *g, int l, int T)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    ct_backend *be = g->be;
    int H = c->hidden_size, NP = model_gdn_proj_dim(c), CD = model_gdn_conv_dim(c);
    int Kd = model_gdn_key_dim(c), Vd = model_gdn_value_dim(c), Hv = c->linear_num_value_heads;
    int Hk = c->linear_num_key_heads, Dk = c->linear_key_head_dim, Dv = c->linear_value_head_dim;
    model_linear_fwd(MODEL_W(g->m, l, win), g->proj, NP, g->xn, H, NULL, T, H, NP, 0);
    gdn_in_lora(g, l, T);
    be->gdn_conv_step(be, g->conv, CD, g->conv_state[l], g->proj, NP, w->conv_w, T, CD, c->linear_conv_kernel_dim);
    be->gdn_gates_fwd(be, g->gg, g->beta, act_at(g, g->proj, CD + Vd + Hv), NP, act_at(g, g->proj, CD + Vd), NP,
                      w->A_log, w->dt_bias, T, Hv);
    be->gdn_delta_step(be, g->core, Vd, g->delta_state[l], g->conv, CD, act_at(g, g->conv, Kd), CD,
                       act_at(g, g->conv, 2 * Kd), CD, g->gg, g->beta, T, Hk, Hv, Dk, Dv, 1.0f / sqrtf((float)Dk));
    be->gated_rmsnorm_fwd(be, g->normed, Vd, g->core, Vd, act_at(g, g->proj, CD), NP, w->gdn_norm, T, Hv, Dv,
                          (float)c->rms_norm_eps);
    be->copy_2d(be, g->h, H, g->x, H, T, H);
    model_linear_fwd(MODEL_W(g->m, l, wout), g->h, H, g->normed, Vd, NULL, T, Vd, H, 1);
    lora_fwd(g, l, CT_MOD_OUT, g->h, H, g->normed, Vd, T);
}

/* g->h = g->x + o(attention over the cache of rope(norm_qk(qkv(g->xn)))) [* sigmoid(gate)]. */
static void attention_mixer(ct_generator *g, int l, int T)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    ct_backend *be = g->be;
    int H = c->hidden_size, D = c->head_dim;
    int nq = c->num_attention_heads, nkv = c->num_key_value_heads, Q = nq * D, KV = nkv * D;
    int Qw = model_attn_gated(c) ? 2 * Q : Q, QKV = Qw + 2 * KV; /* q (and gate) columns, all columns */
    float eps = (float)c->rms_norm_eps;

    model_linear_fwd(MODEL_W(g->m, l, wqkv), g->qkv, QKV, g->xn, H, w->bqkv, T, H, QKV, 0);
    lora_fwd(g, l, CT_MOD_Q, g->qkv, QKV, g->xn, H, T);
    lora_fwd(g, l, CT_MOD_K, act_at(g, g->qkv, Qw), QKV, g->xn, H, T);
    lora_fwd(g, l, CT_MOD_V, act_at(g, g->qkv, Qw + KV), QKV, g->xn, H, T);
    void *q = g->qkv, *k = act_at(g, g->qkv, Qw), *v = act_at(g, g->qkv, Qw + KV);
    const int32_t *pos = g->positions;
    const float *freq = g->m->inv_freq, scaling = g->m->attn_scaling;
    int rot = g->m->rot_dim;
    if (c->qk_norm) { /* in place: nothing reads the raw projections in inference */
        be->rmsnorm_rope_fwd(be, q, QKV, NULL, q, QKV, w->q_norm, c->norm_zero_centred, pos, freq, T, nq, D, rot, eps,
                             scaling);
        be->rmsnorm_rope_fwd(be, k, QKV, NULL, k, QKV, w->k_norm, c->norm_zero_centred, pos, freq, T, nkv, D, rot,
                             eps, scaling);
    } else {
        be->rope(be, q, QKV, pos, freq, T, nq, D, rot, scaling, 0);
        be->rope(be, k, QKV, pos, freq, T, nkv, D, rot, scaling, 0);
    }
    size_t at = (size_t)g->n_past * KV;
    be->copy_2d(be, act_at(g, g->k_cache[l], at), KV, k, QKV, T, KV);
    be->copy_2d(be, act_at(g, g->v_cache[l], at), KV, v, QKV, T, KV);
    int window = c->layer_sliding[l] ? c->sliding_window : 0;
    be->attention_decode(be, g->attn, Q, q, QKV, g->k_cache[l], KV, g->v_cache[l], KV, T, g->n_past, nq, nkv, D,
                         1.0f / sqrtf((float)D), window, w->sinks);
    if (model_attn_gated(c)) /* in place */
        be->sigmoid_gate_fwd(be, g->attn, Q, g->attn, Q, act_at(g, g->qkv, Q), QKV, D, T, nq, D);

    be->copy_2d(be, g->h, H, g->x, H, T, H);
    model_linear_fwd(MODEL_W(g->m, l, wo), g->h, H, g->attn, Q, w->bo, T, Q, H, 1);
    lora_fwd(g, l, CT_MOD_O, g->h, H, g->attn, Q, T);
}

/* One layer over the T tokens in g->x (updated in place). */
static void layer_forward(ct_generator *g, int l, int T)
{
    const ct_model_config *c = &g->m->cfg;
    const ct_layer_weights *w = &g->m->layers[l];
    ct_backend *be = g->be;
    int H = c->hidden_size, I = c->intermediate_size;
    float eps = (float)c->rms_norm_eps;

    be->rmsnorm_fwd(be, g->xn, H, NULL, g->x, H, w->attn_norm, c->norm_zero_centred, T, 1, H, eps);
    if (layer_gdn(c, l)) gdn_mixer(g, l, T);
    else attention_mixer(g, l, T);

    be->rmsnorm_fwd(be, g->hn, H, NULL, g->h, H, w->mlp_norm, c->norm_zero_centred, T, 1, H, eps);
    if (c->layer_sparse[l]) {
        const moe_lora ml = {.lo = g->lo}; /* no dropout in inference */
        moe_forward(g->moe, &ml, l, 0, g->hn, g->h, g->x, T, false);
        return;
    }
    model_linear_fwd(MODEL_W(g->m, l, wgu), g->gu, 2 * I, g->hn, H, w->bgu, T, H, 2 * I, 0);
    lora_fwd(g, l, CT_MOD_GATE, g->gu, 2 * I, g->hn, H, T);
    lora_fwd(g, l, CT_MOD_UP, act_at(g, g->gu, I), 2 * I, g->hn, H, T);
    be->swiglu_fwd(be, g->act, g->gu, T, I);
    be->copy_2d(be, g->x, H, g->h, H, T, H);
    model_linear_fwd(MODEL_W(g->m, l, wdown), g->x, H, g->act, I, w->bdown, T, I, H, 1);
    lora_fwd(g, l, CT_MOD_DOWN, g->x, H, g->act, I, T);
}

int generator_feed(ct_generator *g, const int32_t *tokens, int n, float *logits, ct_error *err)
{
    const ct_model_config *c = &g->m->cfg;
    ct_backend *be = g->be;
    int H = c->hidden_size, V = c->vocab_size;
    if (n < 1) return CT_FAIL_INPUT(err, "generate: nothing to feed");
    if (n > g->capacity - g->n_past)
        return CT_FAIL_INPUT(err, "generate: %d more tokens after %d overflow the %d-position cache", n, g->n_past,
                             g->capacity);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return CT_FAIL_INPUT(err, "token id %d is outside the vocabulary (0..%d)", tokens[i], V - 1);
    for (int done = 0; done < n;) {
        int T = n - done < g->chunk ? n - done : g->chunk;
        for (int i = 0; i < T; i++) g->host_pos[i] = g->n_past + i;
        be->upload(be, g->tokens, tokens + done, (size_t)T * 4);
        be->upload(be, g->positions, g->host_pos, (size_t)T * 4);
        be->embedding(be, g->x, g->tokens, g->m->embed, T, H);
        for (int l = 0; l < c->num_hidden_layers; l++) layer_forward(g, l, T);
        g->n_past += T;
        done += T;
        if (done == n) {
            be->rmsnorm_fwd(be, g->xf, H, NULL, act_at(g, g->x, (size_t)(T - 1) * H), H, g->m->final_norm,
                            c->norm_zero_centred, 1, 1, H, (float)c->rms_norm_eps);
            be->linear_fwd(be, g->logits, V, g->xf, H, g->m->lm_head, NULL, 1, H, V, 0);
            be->act_to_f32(be, logits, g->logits, (size_t)V);
        }
    }
    return CT_OK;
}

// ---- sampling ----

typedef struct { float p; int32_t id; } ranked;

/* Descending probability, then ascending id: a total order, so qsort (not
 * stable) still gives one answer for a seed. */
static int by_prob_desc(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

int32_t sample_token(float *logits, int V, float temperature, float top_p, ct_rng *rng)
{
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (!(temperature > 0)) return best;
    double sum = 0, mx = logits[best];
    for (int i = 0; i < V; i++) sum += exp(((double)logits[i] - mx) / temperature);
    for (int i = 0; i < V; i++) logits[i] = (float)(exp(((double)logits[i] - mx) / temperature) / sum);
    double u = ct_rng_uniform(rng);
    if (top_p > 0 && top_p < 1) {
        ranked *r = ct_malloc((size_t)V * sizeof *r);
        for (int i = 0; i < V; i++) r[i] = (ranked){logits[i], i};
        qsort(r, (size_t)V, sizeof *r, by_prob_desc);
        int keep = 0;
        double mass = 0;
        while (keep < V && (keep == 0 || mass < top_p)) mass += r[keep++].p;
        double target = u * mass, acc = 0;
        int32_t pick = r[keep - 1].id;
        for (int i = 0; i < keep; i++) {
            acc += r[i].p;
            if (target < acc) {
                pick = r[i].id;
                break;
            }
        }
        free(r);
        return pick;
    }
    double acc = 0;
    for (int32_t i = 0; i < V; i++) {
        acc += logits[i];
        if (u < acc) return i;
    }
    return best; /* u fell past the last rounding of the sum */
}

int generate(ct_generator *g, const int32_t *prompt, int n_prompt, const ct_sample_options *o, int32_t *out,
             int *n_out, ct_token_fn on_token, void *ctx, ct_error *err)
{
    int V = g->m->cfg.vocab_size;
    float *logits = ct_malloc((size_t)V * sizeof(float));
    ct_rng rng;
    ct_rng_seed(&rng, o->seed);
    *n_out = 0;
    generator_reset(g);
    int rc = generator_feed(g, prompt, n_prompt, logits, err);
    while (!rc && *n_out < o->max_new_tokens) {
        int32_t t = sample_token(logits, V, o->temperature, o->top_p, &rng);
        out[(*n_out)++] = t;
        if (on_token) on_token(t, ctx);
        bool stop = false;
        for (int i = 0; i < o->n_stop; i++) stop |= t == o->stop_ids[i];
        if (stop || *n_out == o->max_new_tokens) break;
        rc = generator_feed(g, &t, 1, logits, err);
    }
    free(logits);
    return rc;
}

// ---- the byte tokenizer ----

static int put_turn(int32_t *ids, int k, const char *role, const char *text)
{
    ids[k++] = CT_BYTE_IM_START;
    for (const char *p = role; *p; p++) ids[k++] = (unsigned char)*p;
    ids[k++] = '\n';
    for (const char *p = text; *p; p++) ids[k++] = (unsigned char)*p;
    ids[k++] = CT_BYTE_IM_END;
    ids[k++] = '\n';
    return k;
}

int32_t *byte_chat_render(const ct_chat_message *msgs, int n_msgs, int *n)
{
    size_t len = 16;
    for (int i = 0; i < n_msgs; i++) len += strlen(msgs[i].role) + strlen(msgs[i].content) + 4;
    int32_t *ids = ct_malloc(len * sizeof *ids);
    int k = 0;
    for (int i = 0; i < n_msgs; i++) k = put_turn(ids, k, msgs[i].role, msgs[i].content);
    ids[k++] = CT_BYTE_IM_START;
    for (const char *p = "assistant\n"; *p; p++) ids[k++] = (unsigned char)*p;
    *n = k;
    return ids;
}

int32_t *byte_chat_messages(const char *system, const char *text, int *n)
{
    ct_chat_message msgs[2] = {{"system", system}, {"user", text}};
    return system ? byte_chat_render(msgs, 2, n) : byte_chat_render(msgs + 1, 1, n);
}

int32_t *byte_chat_prompt(const char *text, int *n) { return byte_chat_messages(NULL, text, n); }

void byte_token_write(int32_t token, FILE *out)
{
    if (token >= 0 && token < 256) fputc(token, out);
    else if (token == CT_BYTE_ENDOFTEXT) fputs("<|endoftext|>", out);
    else if (token == CT_BYTE_IM_START) fputs("<|im_start|>", out);
    else if (token == CT_BYTE_IM_END) fputs("<|im_end|>", out);
    else if (token == 259) fputs("<|pad|>", out);
    else fprintf(out, "<|unused_%d|>", token);
}

void byte_tokens_text(const int32_t *ids, int n, char **text, size_t *len)
{
    char *raw = NULL;
    size_t raw_len = 0;
    FILE *f = open_memstream(&raw, &raw_len);
    CT_ASSERT(f, "open_memstream failed");
    for (int i = 0; i < n; i++) byte_token_write(ids[i], f);
    fclose(f);
    tokenizer_utf8_lossy(raw, raw_len, text, len);
    free(raw);
}
