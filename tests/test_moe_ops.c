/* test_moe_ops.c — the mixture-of-experts ops of the CPU reference backend: the
 * routing rules (top-K, ties, empty experts, K = 1 and K = E = 8), the stable
 * permutation and its round trip, the grouped GEMM with and without gathered
 * rows and fused LoRA, the router's and the clamped SwiGLU's backward. The tiny
 * MoE models built on them are test_moe.c's.
 *
 * Backward ops are checked like test_backend_cpu.c does (cpu_oracle.h): the
 * analytic gradient of a random projection against central differences of a
 * double reference (step 1e-6), bound 1e-3. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"

static ct_backend *be;
static ct_rng rng;

// ---- routing ops ----

static void softmax_d(double *p, const float *l, int E)
{
    double mx = l[0], s = 0;
    for (int j = 1; j < E; j++) mx = fmax(mx, l[j]);
    for (int j = 0; j < E; j++) s += exp(l[j] - mx);
    for (int j = 0; j < E; j++) p[j] = exp(l[j] - mx) / s;
}

TEST(route_softmax_topk_picks_the_largest_probabilities_in_decreasing_order)
{
    float logits[2 * 6] = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f, 3.0f, /* token 1 */ -2.0f, -1.0f, 0.5f, 0.4f, 0.3f, 0.2f};
    int32_t idx[4];
    float w[4];
    be->moe_route(be, idx, w, logits, 2, 6, 2, CT_MOE_SOFTMAX_TOPK);
    CHECK(idx[0] == 5 && idx[1] == 1 && idx[2] == 2 && idx[3] == 3, "chosen %d %d | %d %d", idx[0], idx[1], idx[2], idx[3]);
    double p[6];
    softmax_d(p, logits, 6);
    CHECK(check_rel_err(w[0], p[5], 0) <= 1e-6 && check_rel_err(w[1], p[1], 0) <= 1e-6, "weights are the probabilities");
    be->moe_route(be, idx, w, logits, 2, 6, 2, CT_MOE_SOFTMAX_TOPK_NORM);
    CHECK(check_rel_err(w[0], p[5] / (p[5] + p[1]), 0) <= 1e-6 && check_rel_err(w[0] + w[1], 1.0, 0) <= 1e-6,
          "renormalised weights %g %g", w[0], w[1]);
}

TEST(route_ties_go_to_the_lower_expert_index)
{
    float logits[8] = {0.5f, 1.0f, 1.0f, 0.2f, 1.0f, 1.0f, 0.5f, 0.0f};
    int32_t idx[3];
    float w[3];
    for (int rule = 0; rule < 3; rule++) {
        be->moe_route(be, idx, w, logits, 1, 8, 3, (ct_moe_rule)rule);
        CHECK(idx[0] == 1 && idx[1] == 2 && idx[2] == 4, "rule %d: chosen %d %d %d", rule, idx[0], idx[1], idx[2]);
        CHECK(w[0] == w[1] && w[1] == w[2], "rule %d: tied experts get equal weights", rule);
    }
    float flat[8] = {0};
    be->moe_route(be, idx, w, flat, 1, 8, 3, CT_MOE_SOFTMAX_TOPK);
    CHECK(idx[0] == 0 && idx[1] == 1 && idx[2] == 2 && w[0] == 0.125f, "all equal: experts 0 1 2, weight 1/8");
}

TEST(route_k1_takes_the_argmax_and_k8_of_8_ranks_every_expert)
{
    float logits[8] = {0.3f, -0.2f, 1.7f, 0.9f, -1.1f, 0.0f, 1.2f, 0.4f};
    int32_t idx[8];
    float w[8];
    be->moe_route(be, idx, w, logits, 1, 8, 1, CT_MOE_SOFTMAX_TOPK_NORM);
    CHECK(idx[0] == 2 && w[0] == 1.0f, "k=1 renormalised: expert %d weight %g", idx[0], w[0]);
    be->moe_route(be, idx, w, logits, 1, 8, 1, CT_MOE_TOPK_SOFTMAX);
    CHECK(idx[0] == 2 && w[0] == 1.0f, "k=1 gpt_oss: a softmax over one logit is 1");
    be->moe_route(be, idx, w, logits, 1, 8, 8, CT_MOE_SOFTMAX_TOPK);
    const int order[8] = {2, 6, 3, 7, 0, 5, 1, 4};
    double p[8], sum = 0;
    softmax_d(p, logits, 8);
    for (int k = 0; k < 8; k++) {
        CHECK(idx[k] == order[k], "k=8: rank %d is expert %d, expected %d", k, idx[k], order[k]);
        CHECK(check_rel_err(w[k], p[order[k]], 0) <= 1e-6, "k=8: weight of rank %d", k);
        sum += w[k];
    }
    CHECK(fabs(sum - 1) <= 1e-6, "k=8 weights sum to %g", sum);
}

TEST(route_gpt_oss_takes_the_top_logits_then_a_softmax_over_them)
{
    float logits[5] = {1.0f, 3.0f, -2.0f, 2.0f, 0.0f};
    int32_t idx[2];
    float w[2];
    be->moe_route(be, idx, w, logits, 1, 5, 2, CT_MOE_TOPK_SOFTMAX);
    double e = exp(-1.0);
    CHECK(idx[0] == 1 && idx[1] == 3, "chosen %d %d", idx[0], idx[1]);
    CHECK(check_rel_err(w[0], 1 / (1 + e), 0) <= 1e-6 && check_rel_err(w[1], e / (1 + e), 0) <= 1e-6,
          "weights %g %g", w[0], w[1]);
}

TEST(counts_and_offsets_handle_experts_that_get_no_tokens)
{
    const int32_t idx[6] = {3, 0, 3, 5, 0, 3}; /* experts 1, 2, 4, 6 get nothing */
    int32_t counts[7], offsets[8];
    be->moe_count(be, counts, idx, 6, 7);
    be->moe_offsets(be, offsets, counts, 7);
    const int32_t want_c[7] = {2, 0, 0, 3, 0, 1, 0}, want_o[8] = {0, 2, 2, 2, 5, 5, 6, 6};
    CHECK(!memcmp(counts, want_c, sizeof want_c), "counts");
    CHECK(!memcmp(offsets, want_o, sizeof want_o), "offsets");
    int32_t row_slot[6], slot_row[6];
    be->moe_permute(be, row_slot, slot_row, idx, offsets, 6, 7);
    const int32_t want_rs[6] = {1, 4, 0, 2, 5, 3};
    CHECK(!memcmp(row_slot, want_rs, sizeof want_rs), "rows in expert order, slots ascending within each");
}

/* Random distinct top-K per token, as a router produces. */
static void random_choices(int32_t *idx, int T, int E, int K)
{
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e;
            bool dup;
            do {
                e = (int)(ct_rng_uniform(&rng) * E);
                dup = false;
                for (int m = 0; m < k; m++) dup |= idx[t * K + m] == e;
            } while (dup);
            idx[t * K + k] = e;
        }
}

TEST(permutation_is_stable_and_scatter_undoes_gather)
{
    enum { T = 37, E = 8, K = 3, H = 5, N = T * K };
    int32_t idx[N], counts[E], offsets[E + 1], row_slot[N], slot_row[N];
    random_choices(idx, T, E, K);
    be->moe_count(be, counts, idx, N, E);
    be->moe_offsets(be, offsets, counts, E);
    be->moe_permute(be, row_slot, slot_row, idx, offsets, N, E);
    for (int e = 0; e < E; e++)
        for (int r = offsets[e]; r < offsets[e + 1]; r++) {
            CHECK(idx[row_slot[r]] == e, "row %d belongs to expert %d", r, e);
            if (r > offsets[e]) CHECK(row_slot[r] > row_slot[r - 1], "expert %d: slots ascend (stable)", e);
        }
    for (int s = 0; s < N; s++) CHECK(row_slot[slot_row[s]] == s, "slot_row inverts row_slot at %d", s);
    float x[T * H], xe[N * H], y[T * H], w[N];
    for (int i = 0; i < T * H; i++) x[i] = ct_rng_normal(&rng);
    for (int s = 0; s < N; s++) w[s] = 1.0f / K;
    be->moe_gather(be, xe, x, H, row_slot, T, K, H);
    for (int r = 0; r < N; r++)
        CHECK(!memcmp(xe + r * H, x + (row_slot[r] / K) * H, H * 4), "row %d is its token's row", r);
    be->moe_scatter(be, y, H, xe, slot_row, w, T, K, H, NULL, 0);
    CHECK(check_max_rel_err(y, x, T * H) <= 1e-6, "weights 1/K: scatter(gather(x)) == x");
    be->moe_scatter(be, y, H, xe, slot_row, NULL, T, K, H, NULL, 0);
    for (int i = 0; i < T * H; i++) x[i] *= K;
    CHECK(check_max_rel_err(y, x, T * H) <= 1e-6, "weights 1: scatter(gather(x)) == K x");
    /* a residual, in its own buffer and in y itself: y = res + K x both times */
    float res[T * H], want[T * H];
    for (int i = 0; i < T * H; i++) {
        res[i] = ct_rng_normal(&rng);
        want[i] = res[i] + x[i];
    }
    be->moe_scatter(be, y, H, xe, slot_row, NULL, T, K, H, res, H);
    CHECK(check_max_rel_err(y, want, T * H) <= 1e-6, "residual in its own buffer: y = res + K x");
    memcpy(y, res, sizeof y);
    be->moe_scatter(be, y, H, xe, slot_row, NULL, T, K, H, y, H);
    CHECK(check_max_rel_err(y, want, T * H) <= 1e-6, "residual in y: y += K x");
}

TEST(grouped_gemm_reads_offsets_and_matches_each_expert_alone)
{
    enum { E = 5, IN = 7, OUT = 6, N = 20 };
    const int32_t offsets[E + 1] = {0, 6, 6, 15, 15, 20}; /* experts 1 and 3 empty */
    float W[E * OUT * IN], b[E * OUT], x[N * IN], y[N * OUT], want[N * OUT];
    for (int i = 0; i < E * OUT * IN; i++) W[i] = ct_rng_normal(&rng);
    for (int i = 0; i < E * OUT; i++) b[i] = ct_rng_normal(&rng);
    for (int i = 0; i < N * IN; i++) x[i] = ct_rng_normal(&rng);
    for (int e = 0; e < E; e++)
        for (int r = offsets[e]; r < offsets[e + 1]; r++)
            for (int o = 0; o < OUT; o++) {
                double s = b[e * OUT + o];
                for (int i = 0; i < IN; i++) s += (double)x[r * IN + i] * W[(e * OUT + o) * IN + i];
                want[r * OUT + o] = (float)s;
            }
    be->moe_linear_fwd(be, y, OUT, x, IN, NULL, 1, W, b, offsets, E, IN, OUT, 0);
    CHECK(check_max_rel_err(y, want, N * OUT) <= 1e-4, "grouped forward: %.3e", check_max_rel_err(y, want, N * OUT));
    float dx[N * IN], dwant[N * IN];
    for (int e = 0; e < E; e++)
        for (int r = offsets[e]; r < offsets[e + 1]; r++)
            for (int i = 0; i < IN; i++) {
                double s = 0;
                for (int o = 0; o < OUT; o++) s += (double)y[r * OUT + o] * W[(e * OUT + o) * IN + i];
                dwant[r * IN + i] = (float)s;
            }
    be->moe_linear_bwd_input(be, dx, IN, y, OUT, W, offsets, E, IN, OUT, 0);
    CHECK(check_max_rel_err(dx, dwant, N * IN) <= 1e-4, "grouped backward input");
}

/* gather = row_slot reads the token rows in place: the same bits as moe_gather
 * into an expert-ordered copy and then the op without gather, for the GEMM and
 * both LoRA directions (dropout on: its mask index is the row within the expert). */
TEST(grouped_ops_with_gather_equal_moe_gather_then_the_op_bit_for_bit)
{
    enum { T = 23, E = 6, K = 2, N = T * K, IN = 12, LDX = 16, OUT = 10, R = 3 };
    int32_t idx[N], counts[E], offsets[E + 1], row_slot[N], slot_row[N];
    random_choices(idx, T, E, K);
    be->moe_count(be, counts, idx, N, E);
    be->moe_offsets(be, offsets, counts, E);
    be->moe_permute(be, row_slot, slot_row, idx, offsets, N, E);
    float x[T * LDX], xe[N * IN], W[E * OUT * IN], b[E * OUT], A[E * R * IN], B[E * OUT * R], dy[N * OUT];
    for (int i = 0; i < T * LDX; i++) x[i] = ct_rng_normal(&rng);
    for (int i = 0; i < E * OUT * IN; i++) W[i] = ct_rng_normal(&rng);
    for (int i = 0; i < E * OUT; i++) b[i] = ct_rng_normal(&rng);
    for (int i = 0; i < E * R * IN; i++) A[i] = ct_rng_normal(&rng);
    for (int i = 0; i < E * OUT * R; i++) B[i] = ct_rng_normal(&rng);
    for (int i = 0; i < N * OUT; i++) dy[i] = ct_rng_normal(&rng);
    be->moe_gather(be, xe, x, LDX, row_slot, T, K, IN);

    float y0[N * OUT], y1[N * OUT];
    be->moe_linear_fwd(be, y0, OUT, xe, IN, NULL, K, W, b, offsets, E, IN, OUT, 0);
    be->moe_linear_fwd(be, y1, OUT, x, LDX, row_slot, K, W, b, offsets, E, IN, OUT, 0);
    CHECK(!memcmp(y0, y1, sizeof y0), "moe_linear_fwd: gathered rows differ from moe_gather's");
    be->moe_lora_fwd(be, y0, OUT, xe, IN, NULL, K, A, B, offsets, E, IN, OUT, R, 2.0f, 0.25f, 77);
    be->moe_lora_fwd(be, y1, OUT, x, LDX, row_slot, K, A, B, offsets, E, IN, OUT, R, 2.0f, 0.25f, 77);
    CHECK(!memcmp(y0, y1, sizeof y0), "moe_lora_fwd: gathered rows differ from moe_gather's");

    float dx0[N * IN] = {0}, dx1[N * IN] = {0}, dA0[E * R * IN] = {0}, dA1[E * R * IN] = {0};
    float dB0[E * OUT * R] = {0}, dB1[E * OUT * R] = {0};
    be->moe_lora_bwd(be, dx0, IN, dA0, dB0, dy, OUT, xe, IN, NULL, K, A, B, offsets, E, IN, OUT, R, 2.0f, 0.25f, 77);
    be->moe_lora_bwd(be, dx1, IN, dA1, dB1, dy, OUT, x, LDX, row_slot, K, A, B, offsets, E, IN, OUT, R, 2.0f, 0.25f,
                     77);
    CHECK(!memcmp(dx0, dx1, sizeof dx0), "moe_lora_bwd: dx differs with gather");
    CHECK(!memcmp(dA0, dA1, sizeof dA0), "moe_lora_bwd: dA differs with gather");
    CHECK(!memcmp(dB0, dB1, sizeof dB0), "moe_lora_bwd: dB differs with gather");
    double sa = 0;
    for (int i = 0; i < E * R * IN; i++) sa += fabs(dA1[i]);
    CHECK(sa > 0, "dA is zero: the test compared nothing");
}

/* Routing weights in double with the selection fixed, plus sum aux_e p_e. */
typedef struct route_obj {
    double *l;
    const int32_t *idx;
    const float *dw, *aux;
    int T, E, K;
    ct_moe_rule rule;
} route_obj;

/* The fused op's contract on the CPU: the GEMM, then each module's LoRA on its
 * columns, bit for bit. Two modules with a gap of columns that no module owns,
 * through a gather, with bias and accumulate; and one module over all columns. */
TEST(moe_linear_lora_fwd_equals_moe_linear_fwd_then_moe_lora_fwd_bit_for_bit)
{
    enum { T = 19, E = 5, K = 2, N = T * K, IN = 12, LDX = 16, OUT = 14, LDY = 16, R = 3 };
    int32_t idx[N], counts[E], offsets[E + 1], row_slot[N], slot_row[N];
    random_choices(idx, T, E, K);
    be->moe_count(be, counts, idx, N, E);
    be->moe_offsets(be, offsets, counts, E);
    be->moe_permute(be, row_slot, slot_row, idx, offsets, N, E);
    float x[N * LDX], W[E * OUT * IN], b[E * OUT], A0[E * R * IN], B0[E * 6 * R], A1[E * R * IN], B1[E * 4 * R];
    float Ad[E * R * IN], Bd[E * OUT * R], y0[N * LDY];
    float *all[] = {x, W, b, A0, B0, A1, B1, Ad, Bd, y0};
    size_t sizes[] = {N * LDX, E * OUT * IN, E * OUT, E * R * IN, E * 6 * R, E * R * IN, E * 4 * R, E * R * IN,
                      E * OUT * R, N * LDY};
    for (int t = 0; t < 10; t++)
        for (size_t i = 0; i < sizes[t]; i++) all[t][i] = ct_rng_normal(&rng);

    const ct_lora_cols two[2] = {{A0, B0, 0, 6, NULL, NULL}, {A1, B1, 10, 4, NULL, NULL}};
    float want[N * LDY], got[N * LDY];
    memcpy(want, y0, sizeof y0);
    be->moe_linear_fwd(be, want, LDY, x, LDX, row_slot, K, W, b, offsets, E, IN, OUT, 1);
    be->moe_lora_fwd(be, want, LDY, x, LDX, row_slot, K, A0, B0, offsets, E, IN, 6, R, 2.0f, 0.0f, 0);
    be->moe_lora_fwd(be, want + 10, LDY, x, LDX, row_slot, K, A1, B1, offsets, E, IN, 4, R, 2.0f, 0.0f, 0);
    memcpy(got, y0, sizeof y0);
    be->moe_linear_lora_fwd(be, got, LDY, x, LDX, row_slot, K, W, b, offsets, E, IN, OUT, 1, two, 2, R, 2.0f, NULL, 0);
    CHECK(!memcmp(want, got, sizeof want), "two modules through a gather: not the sequence's bits");

    /* expert-ordered rows: x as N rows (through the gather it was T token rows) */
    const ct_lora_cols one[1] = {{Ad, Bd, 0, OUT, NULL, NULL}};
    memcpy(want, y0, sizeof y0);
    be->moe_linear_fwd(be, want, LDY, x, LDX, NULL, K, W, NULL, offsets, E, IN, OUT, 0);
    be->moe_lora_fwd(be, want, LDY, x, LDX, NULL, K, Ad, Bd, offsets, E, IN, OUT, R, 0.5f, 0.0f, 0);
    memcpy(got, y0, sizeof y0);
    be->moe_linear_lora_fwd(be, got, LDY, x, LDX, NULL, K, W, NULL, offsets, E, IN, OUT, 0, one, 1, R, 0.5f, NULL, 0);
    CHECK(!memcmp(want, got, sizeof want), "one module over all columns: not the sequence's bits");
}

static double route_objective(const route_obj *o)
{
    double total = 0, p[16];
    for (int t = 0; t < o->T; t++) {
        const double *l = o->l + t * o->E;
        double mx = l[0], s = 0, sk = 0;
        for (int j = 1; j < o->E; j++) mx = fmax(mx, l[j]);
        for (int j = 0; j < o->E; j++) s += exp(l[j] - mx);
        for (int j = 0; j < o->E; j++) p[j] = exp(l[j] - mx) / s;
        for (int k = 0; k < o->K; k++) sk += p[o->idx[t * o->K + k]];
        for (int k = 0; k < o->K; k++) {
            double pk = p[o->idx[t * o->K + k]];
            double w = o->rule == CT_MOE_SOFTMAX_TOPK ? pk : pk / sk; /* softmax over the K == p / sum p */
            total += o->dw[t * o->K + k] * w;
        }
        if (o->aux)
            for (int j = 0; j < o->E; j++) total += o->aux[j] * p[j];
    }
    return total;
}

static void check_route_bwd(ct_moe_rule rule, bool with_aux)
{
    enum { T = 6, E = 7, K = 3 };
    float logits[T * E], w[T * K], dw[T * K], aux[E], dl[T * E], fd[T * E];
    int32_t idx[T * K];
    double ld[T * E];
    for (int i = 0; i < T * E; i++) ld[i] = logits[i] = ct_rng_normal(&rng);
    for (int i = 0; i < T * K; i++) dw[i] = ct_rng_normal(&rng);
    for (int e = 0; e < E; e++) aux[e] = ct_rng_normal(&rng);
    be->moe_route(be, idx, w, logits, T, E, K, rule);
    be->moe_route_bwd(be, dl, dw, logits, idx, w, with_aux ? aux : NULL, T, E, K, rule);
    route_obj o = {ld, idx, dw, with_aux ? aux : NULL, T, E, K, rule};
    for (int i = 0; i < T * E; i++) {
        double save = ld[i];
        ld[i] = save + 1e-6;
        double fp = route_objective(&o);
        ld[i] = save - 1e-6;
        double fm = route_objective(&o);
        ld[i] = save;
        fd[i] = (float)((fp - fm) / 2e-6);
    }
    CHECK(check_max_rel_err(dl, fd, T * E) <= 1e-3, "rule %d%s: dlogits vs finite differences (max rel %.2e)",
          rule, with_aux ? " with aux" : "", check_max_rel_err(dl, fd, T * E));
}

TEST(route_bwd_matches_finite_differences_for_every_rule)
{
    for (int rule = 0; rule < 3; rule++) {
        check_route_bwd((ct_moe_rule)rule, false);
        check_route_bwd((ct_moe_rule)rule, true);
    }
}

static double clamped_swiglu_d(double g, double u, double alpha, double limit)
{
    g = fmin(g, limit);
    u = fmin(fmax(u, -limit), limit);
    return (u + 1) * g / (1 + exp(-alpha * g));
}

TEST(clamped_swiglu_bwd_matches_finite_differences_and_stops_at_the_limits)
{
    enum { N = 9, I = 4 };
    const float alpha = 1.702f, limit = 1.0f;
    float gu[N * 2 * I], dh[N * I], dgu[N * 2 * I], fd[N * 2 * I], h[N * I];
    for (int i = 0; i < N * 2 * I; i++) gu[i] = 1.6f * ct_rng_normal(&rng); /* some beyond +-limit */
    for (int i = 0; i < N * I; i++) dh[i] = ct_rng_normal(&rng);
    be->moe_clamped_swiglu_fwd(be, h, gu, N, I, alpha, limit);
    be->moe_clamped_swiglu_bwd(be, dgu, dh, gu, N, I, alpha, limit);
    int clamped = 0;
    for (int r = 0; r < N; r++)
        for (int i = 0; i < I; i++) {
            double g = gu[r * 2 * I + 2 * i], u = gu[r * 2 * I + 2 * i + 1];
            CHECK(check_rel_err(h[r * I + i], clamped_swiglu_d(g, u, alpha, limit), 1e-3) <= 1e-5, "forward");
            double e = 1e-6, d = dh[r * I + i];
            fd[r * 2 * I + 2 * i] = (float)(d * (clamped_swiglu_d(g + e, u, alpha, limit) -
                                                 clamped_swiglu_d(g - e, u, alpha, limit)) / (2 * e));
            fd[r * 2 * I + 2 * i + 1] = (float)(d * (clamped_swiglu_d(g, u + e, alpha, limit) -
                                                     clamped_swiglu_d(g, u - e, alpha, limit)) / (2 * e));
            clamped += g > limit || fabs(u) > limit;
        }
    CHECK(clamped > 0, "the inputs exercise the clamps");
    CHECK(check_max_rel_err(dgu, fd, N * 2 * I) <= 1e-3, "dgu vs finite differences");
}

/* The objective sum_t,h dy[t,h] * (y0[t,h] + sigmoid(g[t]) s[t,h]) in double. */
static double shared_gate_obj(const double *s, const double *g, const float *dy, int T, int H)
{
    double f = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) f += dy[t * H + h] * s[t * H + h] / (1 + exp(-g[t]));
    return f;
}

TEST(shared_gate_adds_sigmoid_scaled_rows_and_its_bwd_matches_finite_differences)
{
    enum { T = 7, H = 5, LDS = 6, LDG = 2 };
    float y[T * H], y0[T * H], s[T * LDS], g[T * LDG], dy[T * H], ds[T * LDS], dg[T * LDG];
    double sd[T * H], gd[T];
    for (int t = 0; t < T; t++) {
        g[t * LDG] = 2.5f * ct_rng_normal(&rng);
        g[t * LDG + 1] = 1e9f; /* padding: never read */
        gd[t] = g[t * LDG];
        for (int h = 0; h < H; h++) {
            s[t * LDS + h] = ct_rng_normal(&rng);
            sd[t * H + h] = s[t * LDS + h];
            y[t * H + h] = y0[t * H + h] = ct_rng_normal(&rng);
            dy[t * H + h] = ct_rng_normal(&rng);
        }
    }
    be->moe_shared_gate_fwd(be, y, H, s, LDS, g, LDG, T, H);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            CHECK(fabs(y[t * H + h] - (y0[t * H + h] + sd[t * H + h] / (1 + exp(-gd[t])))) <= 1e-6, "forward");
    be->moe_shared_gate_bwd(be, ds, LDS, dg, LDG, dy, H, s, LDS, g, LDG, T, H);
    float fds[T * H], fdg[T], got_ds[T * H], got_dg[T];
    const double e = 1e-6;
    for (int t = 0; t < T; t++) {
        double keep = gd[t];
        gd[t] = keep + e;
        double fp = shared_gate_obj(sd, gd, dy, T, H);
        gd[t] = keep - e;
        double fm = shared_gate_obj(sd, gd, dy, T, H);
        gd[t] = keep;
        fdg[t] = (float)((fp - fm) / (2 * e));
        got_dg[t] = dg[t * LDG];
        for (int h = 0; h < H; h++) {
            double k2 = sd[t * H + h];
            sd[t * H + h] = k2 + e;
            fp = shared_gate_obj(sd, gd, dy, T, H);
            sd[t * H + h] = k2 - e;
            fm = shared_gate_obj(sd, gd, dy, T, H);
            sd[t * H + h] = k2;
            fds[t * H + h] = (float)((fp - fm) / (2 * e));
            got_ds[t * H + h] = ds[t * LDS + h];
        }
    }
    CHECK(check_max_rel_err(got_ds, fds, T * H) <= 1e-4, "ds vs finite differences");
    CHECK(check_max_rel_err(got_dg, fdg, T) <= 1e-4, "dg vs finite differences");
}

int main(void)
{
    be = backend_cpu_new();
    ct_rng_seed(&rng, 2024);
    RUN(route_softmax_topk_picks_the_largest_probabilities_in_decreasing_order);
    RUN(route_ties_go_to_the_lower_expert_index);
    RUN(route_k1_takes_the_argmax_and_k8_of_8_ranks_every_expert);
    RUN(route_gpt_oss_takes_the_top_logits_then_a_softmax_over_them);
    RUN(counts_and_offsets_handle_experts_that_get_no_tokens);
    RUN(permutation_is_stable_and_scatter_undoes_gather);
    RUN(grouped_gemm_reads_offsets_and_matches_each_expert_alone);
    RUN(grouped_ops_with_gather_equal_moe_gather_then_the_op_bit_for_bit);
    RUN(moe_linear_lora_fwd_equals_moe_linear_fwd_then_moe_lora_fwd_bit_for_bit);
    RUN(route_bwd_matches_finite_differences_for_every_rule);
    RUN(clamped_swiglu_bwd_matches_finite_differences_and_stops_at_the_limits);
    RUN(shared_gate_adds_sigmoid_scaled_rows_and_its_bwd_matches_finite_differences);
    be->destroy(be);
    return check_summary();
}
