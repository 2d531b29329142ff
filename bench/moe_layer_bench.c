/* moe_layer_bench.c — where one MoE layer's time goes on the CUDA backend:
 * routing (router GEMM, top-K, counts, offsets, permutation, router backward),
 * permutation data movement (weighted un-permute, its backward, the unweighted
 * un-permute of dxe) and expert compute (grouped GEMMs, activation, expert LoRA),
 * for one forward and backward of T tokens, the ops graph_moe.c queues in that
 * order. The gather of hn into expert order is fused into the gate|up GEMM and
 * LoRA (their gather argument), so it costs no op of its own: its reads are in
 * `experts`.
 *
 *   build/bench/moe_layer_bench [reps]        (default 20)
 *
 * Each group is timed alone: `reps` back-to-back copies between two syncs,
 * host clock, after a warm-up; the ops read realistic inputs (router logits
 * from random hidden states and weights, so routing is uneven). The issue's
 * target: routing + permutation <= 5% of the layer. Shapes: qwen3-30b-a3b
 * (E 128, K 8, H 2048, I 768) and gpt-oss-20b (E 32, K 4, H 2880, I 2880). */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>

#define T_TOKENS 16384
#define R 16

typedef struct {
    const char *name;
    int E, K, H, I;
    ct_moe_rule rule;
    int gate_up_modules; /* 2: gate and up adapted apart (qwen3_moe); 1: one gate_up module (gpt_oss) */
} shape;

static const shape SHAPES[] = {
    {"qwen3-30b-a3b", 128, 8, 2048, 768, CT_MOE_SOFTMAX_TOPK_NORM, 2},
    {"gpt-oss-20b", 32, 4, 2880, 2880, CT_MOE_TOPK_SOFTMAX, 1},
};

typedef struct {
    ct_backend *be;
    const shape *s;
    int T, n;
    void *hn, *out, *dout, *dhn, *logits, *dlogits, *gu, *act, *ye, *dye, *dxe, *dact, *dgu, *Wr, *Wgu, *Wd, *g, *u_gu, *u_d;
    int32_t *idx, *counts, *offsets, *row_slot, *slot_row;
    float *w, *dw, *A_gu, *B_gu, *A_d, *B_d, *dA_gu, *dB_gu, *dA_d, *dB_d, *A_up, *dA_up;
} layer;

static void *fill(ct_backend *be, size_t n, float scale, ct_rng *rng, bool weight)
{
    float *h = ct_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = scale * (2.0f * (float)ct_rng_uniform(rng) - 1.0f);
    void *d = be->alloc(be, n * (weight ? be->weight_bytes : be->act_bytes));
    if (!d) {
        fprintf(stderr, "moe_layer_bench: out of GPU memory\n");
        exit(1);
    }
    if (weight) be->upload_weight(be, d, h, CT_DTYPE_F32, n);
    else be->act_from_f32(be, d, h, n);
    free(h);
    return d;
}

static void *zeros(ct_backend *be, size_t bytes)
{
    void *d = be->alloc(be, bytes);
    if (!d) {
        fprintf(stderr, "moe_layer_bench: out of GPU memory\n");
        exit(1);
    }
    return d;
}

static void routing_fwd(layer *L)
{
    ct_backend *be = L->be;
    const shape *s = L->s;
    be->linear_fwd(be, L->logits, s->E, L->hn, s->H, L->Wr, NULL, L->T, s->H, s->E, 0);
    be->moe_route(be, L->idx, L->w, L->logits, L->T, s->E, s->K, s->rule);
    be->moe_count(be, L->counts, L->idx, L->n, s->E);
    be->moe_offsets(be, L->offsets, L->counts, s->E);
    be->moe_permute(be, L->row_slot, L->slot_row, L->idx, L->offsets, L->n, s->E);
}

static void routing_bwd(layer *L)
{
    ct_backend *be = L->be;
    const shape *s = L->s;
    be->moe_route_bwd(be, L->dlogits, L->dw, L->logits, L->idx, L->w, NULL, L->T, s->E, s->K, s->rule);
    be->linear_bwd_input(be, L->dhn, s->H, L->dlogits, s->E, L->Wr, L->T, s->H, s->E, 1);
}

/* forward un-permute, its backward (dye; dw comes with the activation's backward,
 * in experts), and dhn = sum of dxe */
static void permutation(layer *L)
{
    ct_backend *be = L->be;
    const shape *s = L->s;
    be->moe_scatter(be, L->out, s->H, L->ye, L->slot_row, L->w, L->T, s->K, s->H, L->hn, s->H);
    be->moe_scatter_bwd(be, L->dye, L->dw, L->dout, s->H, NULL, NULL, L->idx, L->row_slot, L->slot_row, L->w, L->T,
                        s->K, s->H);
    be->moe_scatter(be, L->dhn, s->H, L->dxe, L->slot_row, NULL, L->T, s->K, s->H, NULL, 0);
}

/* grouped GEMMs, activation, expert LoRA on gate_up and down, as graph_moe.c runs
 * them by default: the LoRA forwards fused into the GEMMs, gate and up (qwen3's
 * two modules on the halves of gate_up, B_gu's halves as their B) in one backward,
 * whose input-gradient term the grouped GEMM adds (g through L->g) and which reads
 * the forwards' u. */
static void experts(layer *L)
{
    ct_backend *be = L->be;
    const shape *s = L->s;
    int E = s->E, K = s->K, H = s->H, I = s->I;
    size_t half = (size_t)E * I * R; /* one module's B and dB in B_gu, dB_gu */
    ct_lora_cols gu[2] = {{L->A_gu, L->B_gu, 0, 2 * I, L->dA_gu, L->dB_gu}};
    if (s->gate_up_modules == 2) {
        gu[0].cols = I;
        gu[1] = (ct_lora_cols){L->A_up, L->B_gu + half, I, I, L->dA_up, L->dB_gu + half};
    }
    const ct_lora_cols d = {L->A_d, L->B_d, 0, H, L->dA_d, L->dB_d};
    bool u_gu = be->moe_linear_lora_fwd(be, L->gu, 2 * I, L->hn, H, L->row_slot, K, L->Wgu, NULL, L->offsets, E, H,
                                        2 * I, 0, gu, s->gate_up_modules, R, 2.0f, L->u_gu, 64);
    be->swiglu_fwd(be, L->act, L->gu, L->n, I);
    bool u_d = be->moe_linear_lora_fwd(be, L->ye, H, L->act, I, NULL, K, L->Wd, NULL, L->offsets, E, I, H, 0, &d, 1, R,
                                       2.0f, L->u_d, 64);
    be->moe_linear_lora_bwd_input(be, L->dact, I, L->dye, H, L->Wd, L->offsets, E, I, H, 0, L->g, 64, &d, 1, R, 2.0f);
    be->moe_lora_bwd_cols(be, NULL, 0, L->dye, H, H, L->act, I, NULL, K, L->offsets, E, I, &d, 1, R, 2.0f, L->g, 64,
                          u_d ? L->u_d : NULL, 64);
    be->moe_act_bwd(be, L->dgu, L->dw, L->dact, L->gu, L->w, L->row_slot, L->n, I, 0, 0.0f, 0.0f); /* dgu and dw */
    be->moe_linear_lora_bwd_input(be, L->dxe, H, L->dgu, 2 * I, L->Wgu, L->offsets, E, H, 2 * I, 0, L->g, 64, gu,
                                  s->gate_up_modules, R, 2.0f);
    be->moe_lora_bwd_cols(be, NULL, 0, L->dgu, 2 * I, 2 * I, L->hn, H, L->row_slot, K, L->offsets, E, H, gu,
                          s->gate_up_modules, R, 2.0f, L->g, 64, u_gu ? L->u_gu : NULL, 64);
}

static double time_group(layer *L, void (*fn)(layer *), int reps)
{
    fn(L);
    L->be->sync(L->be);
    double t0 = ct_now();
    for (int i = 0; i < reps; i++) fn(L);
    L->be->sync(L->be);
    return (ct_now() - t0) / reps * 1e3;
}

static void bench(ct_backend *be, const shape *s, int reps)
{
    ct_rng rng;
    ct_rng_seed(&rng, 7);
    layer L = {.be = be, .s = s, .T = T_TOKENS, .n = T_TOKENS * s->K};
    size_t T = L.T, n = L.n, E = s->E, H = s->H, I = s->I, A = be->act_bytes;
    L.hn = fill(be, T * H, 1.0f, &rng, false);
    L.dout = fill(be, T * H, 1.0f, &rng, false);
    L.Wr = fill(be, E * H, 0.05f, &rng, true);
    L.Wgu = fill(be, E * 2 * I * H, 0.02f, &rng, true);
    L.Wd = fill(be, E * H * I, 0.02f, &rng, true);
    L.out = zeros(be, T * H * A);
    L.dhn = zeros(be, T * H * A);
    L.logits = zeros(be, T * E * A);
    L.dlogits = zeros(be, T * E * A);
    L.ye = fill(be, n * H, 1.0f, &rng, false);
    L.dye = zeros(be, n * H * A);
    L.dxe = zeros(be, n * H * A);
    L.gu = zeros(be, n * 2 * I * A);
    L.act = zeros(be, n * I * A);
    L.dact = zeros(be, n * I * A);
    L.dgu = zeros(be, n * 2 * I * A);
    L.g = zeros(be, n * 64 * A);
    L.u_gu = zeros(be, n * 64 * A);
    L.u_d = zeros(be, n * 64 * A);
    L.idx = zeros(be, n * 4);
    L.counts = zeros(be, E * 4);
    L.offsets = zeros(be, (E + 1) * 4);
    L.row_slot = zeros(be, n * 4);
    L.slot_row = zeros(be, n * 4);
    L.w = zeros(be, n * 4);
    L.dw = zeros(be, n * 4);
    size_t nA_gu = E * R * H, nB_gu = E * 2 * I * R, nA_d = E * R * I, nB_d = E * H * R;
    size_t most = nA_gu > nB_gu ? nA_gu : nB_gu; /* the largest of the four */
    float *h = ct_malloc(most * 4);
    for (size_t i = 0; i < most; i++) h[i] = 0.01f * (2.0f * (float)ct_rng_uniform(&rng) - 1.0f);
    float **lora[] = {&L.A_gu, &L.B_gu, &L.A_d, &L.B_d, &L.A_up, &L.dA_gu, &L.dB_gu, &L.dA_d, &L.dB_d, &L.dA_up};
    size_t sizes[] = {nA_gu, nB_gu, nA_d, nB_d, nA_gu, nA_gu, nB_gu, nA_d, nB_d, nA_gu};
    for (int i = 0; i < 10; i++) {
        *lora[i] = zeros(be, sizes[i] * 4);
        if (i < 5) be->upload(be, *lora[i], h, sizes[i] * 4);
    }
    free(h);
    routing_fwd(&L); /* realistic offsets for the other groups */
    double tr = time_group(&L, routing_fwd, reps) + time_group(&L, routing_bwd, reps);
    double tp = time_group(&L, permutation, reps);
    double te = time_group(&L, experts, reps);
    double total = tr + tp + te;
    printf("%-14s T=%d E=%-3d K=%d  routing %7.3f ms  permutation %7.3f ms  experts %8.3f ms  "
           "routing+permutation %5.1f%% of %.3f ms\n",
           s->name, L.T, s->E, s->K, tr, tp, te, 100.0 * (tr + tp) / total, total);
    void *bufs[] = {L.hn, L.dout, L.Wr, L.Wgu, L.Wd, L.out, L.dhn, L.logits, L.dlogits, L.ye, L.dye, L.dxe,
                    L.gu, L.act, L.dact, L.dgu, L.g, L.u_gu, L.u_d, L.idx, L.counts, L.offsets, L.row_slot, L.slot_row, L.w, L.dw};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    for (int i = 0; i < 10; i++) be->free(be, *lora[i]);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 20;
    ct_error err = {0};
    ct_backend *be = backend_cuda_new(&err);
    if (!be) {
        printf("moe_layer_bench: skipped: no GPU (%s)\n", err.msg);
        return 0;
    }
    for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++) bench(be, &SHAPES[i], reps > 0 ? reps : 1);
    be->destroy(be);
    return 0;
}
