/* test_cuda_moe_route.c — the CUDA backend's mixture-of-experts routing ops
 * (cuda/moe/moe_route.cu, cuda/moe/moe_rows.cu) against the CPU reference (backend_cpu_moe.c).
 *
 * The method of test_backend_cuda.c: fresh random inputs rounded to bf16 (both
 * backends see identical values), the op on both, then a comparison that NaN
 * never passes. Output buffers start as 0xff bytes (int32 -1, fp32 NaN), so an
 * element an op forgets to write fails.
 *
 * Integer results must be identical element for element: the routing contract
 * (ties to the lower expert, a stable permutation) is the same on every backend,
 * so a GPU that picks another expert among equals, or orders an expert's rows
 * differently, fails. Tolerances for the rest:
 *   topk_idx, counts, offsets, row_slot, slot_row, gather   exact
 *   topk_w, prob_sum, aux loss and gradient (fp32)          1e-5 relative
 *   scatter_bwd's dw (an fp32 dot of bf16 rows)             1e-4 normwise
 *   bf16 outputs (scatter, dye, clamped SwiGLU, dlogits)    1e-2 normwise
 * Without a GPU every test reports "skip NAME: skipped: no GPU". */
#include "backend.h"
#include "check.h"
#include "cuda_pair.h"

#include <math.h>
#include <stdint.h>

static const char *const rule_names[3] = {"softmax_topk", "softmax_topk_norm", "topk_softmax"};

/* An fp32 or int32 output buffer of 0xff bytes on both backends. */
static pair put_garbage(size_t bytes)
{
    unsigned char *h = ct_malloc(bytes + 1);
    memset(h, 0xff, bytes);
    pair p = put_raw(h, bytes);
    free(h);
    return p;
}

/* fp32 results: normwise (norm = 1) or elementwise relative (norm = 0). */
static double f32_err_as(pair p, size_t n, int norm)
{
    float *c = ct_malloc(n * sizeof(float) + 4), *g = ct_malloc(n * sizeof(float) + 4);
    cpu->download(cpu, c, p.c, n * sizeof(float));
    gpu->download(gpu, g, p.g, n * sizeof(float));
    double e = norm ? check_max_norm_err(g, c, n) : check_max_rel_err(g, c, n);
    free(c); free(g);
    return e;
}
static double f32_rel_err(pair p, size_t n) { return f32_err_as(p, n, 0); }

static int32_t *get_ints(ct_backend *be, const void *p, size_t n)
{
    int32_t *h = ct_malloc(n * sizeof(int32_t) + 4);
    be->download(be, h, p, n * sizeof(int32_t));
    return h;
}

/* The first of n int32 elements where the GPU's copy differs from the CPU's, or
 * -1; *cv and *gv get the two values there. */
static long int_diff(pair p, size_t n, int32_t *cv, int32_t *gv)
{
    int32_t *c = get_ints(cpu, p.c, n), *g = get_ints(gpu, p.g, n);
    long at = -1;
    *cv = *gv = 0;
    for (size_t i = 0; i < n && at < 0; i++)
        if (c[i] != g[i]) {
            at = (long)i;
            *cv = c[i];
            *gv = g[i];
        }
    free(c); free(g);
    return at;
}

/* Routes logits (T,E) on both backends and compares; returns the GPU's indices
 * (caller frees) for checks of its own. */
static int32_t *route_case(const float *logits, int T, int E, int K, ct_moe_rule rule, const char *what)
{
    size_t n = (size_t)T * K;
    pair pl = put_act(logits, (size_t)T * E), pi = put_garbage(n * 4), pw = put_garbage(n * 4);
    cpu->moe_route(cpu, pi.c, pw.c, pl.c, T, E, K, rule);
    gpu->moe_route(gpu, pi.g, pw.g, pl.g, T, E, K, rule);
    int32_t cv, gv;
    long at = int_diff(pi, n, &cv, &gv);
    CHECK(at < 0, "%s, %s, E %d, K %d: token %ld rank %ld: GPU chose expert %d, CPU %d", what,
          rule_names[rule], E, K, at / K, at % K, gv, cv);
    double e = f32_rel_err(pw, n);
    CHECK(e < 1e-5, "%s, %s, E %d, K %d: weights rel err %g", what, rule_names[rule], E, K, e);
    int32_t *idx = get_ints(gpu, pi.g, n);
    drop(pl); drop(pi); drop(pw);
    return idx;
}

TEST(route_matches_cpu_for_every_rule_e_and_k)
{
    NEED_GPU();
    const int Es[3] = {8, 32, 128}, Ks[3] = {1, 2, 8};
    int T = 300;
    for (int rule = 0; rule < 3; rule++)
        for (int ei = 0; ei < 3; ei++)
            for (int ki = 0; ki < 3; ki++) {
                /* bf16 logits in [-3, 3] are spaced 2^-6 apart near 3: a row of 128
                 * has exact ties, between probabilities too. */
                float *l = rnd((size_t)T * Es[ei], 3.0f);
                free(route_case(l, T, Es[ei], Ks[ki], (ct_moe_rule)rule, "random logits"));
                free(l);
            }
}

/* Every register layout of the routing warp (1, 2, 4 and 8 experts per lane),
 * E not a multiple of 8 or 32, and K = E. */
TEST(route_matches_cpu_for_odd_sizes_and_k_equal_to_e)
{
    NEED_GPU();
    const int cases[][2] = {{5, 5}, {5, 2}, {33, 3}, {64, 6}, {100, 8}, {256, 8}, {200, 1}, {8, 8}};
    int T = 257;
    for (int rule = 0; rule < 3; rule++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            float *l = rnd((size_t)T * cases[c][0], 2.0f);
            free(route_case(l, T, cases[c][0], cases[c][1], (ct_moe_rule)rule, "odd sizes"));
            free(l);
        }
}

/* Rows built to tie: values from a 6-element set (-0 and +0 among them: equal
 * keys), zero rows (a mix of -0 and +0), constant rows, one row repeated, and rows
 * whose probabilities underflow to exactly 0 but for one expert. Besides matching
 * the CPU, the GPU's choices are checked directly where the answer is known:
 * zero rows take experts 0..K-1, and an underflowed row takes its hot expert,
 * then the lowest others. */
TEST(route_breaks_exact_ties_toward_the_lower_expert)
{
    NEED_GPU();
    const int cases[][2] = {{8, 2}, {32, 8}, {128, 8}, {128, 1}};
    const float set[6] = {-1.0f, -0.0f, 0.0f, 0.5f, 1.0f, 2.0f};
    enum { T = 64 };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int E = cases[c][0], K = cases[c][1];
        float *l = ct_malloc((size_t)T * E * sizeof(float)), *one = rnd((size_t)E, 2.0f);
        int hot[T];
        for (int t = 0; t < T; t++) {
            float *row = l + (size_t)t * E;
            hot[t] = t % 2 ? E - 1 : (int)ct_rng_below(&rng, E);
            for (int j = 0; j < E; j++) {
                if (t < 16) row[j] = set[ct_rng_below(&rng, 6)];
                else if (t < 24) row[j] = (j + t) % 3 ? 0.0f : -0.0f;
                else if (t < 32) row[j] = 1.5f;
                else if (t < 48) row[j] = one[j];
                else row[j] = j == hot[t] ? 0.0f : -110.0f - (float)ct_rng_below(&rng, 91); /* exact in bf16 */
            }
        }
        for (int rule = 0; rule < 3; rule++) {
            int32_t *idx = route_case(l, T, E, K, (ct_moe_rule)rule, "tied logits");
            for (int t = 16; t < 32; t++)
                for (int k = 0; k < K; k++)
                    CHECK(idx[t * K + k] == k, "%s, E %d, K %d: a row of equal logits ranks expert %d at %d",
                          rule_names[rule], E, K, idx[t * K + k], k);
            for (int t = 33; t < 48; t++)
                CHECK(!memcmp(idx + t * K, idx + 32 * K, (size_t)K * 4), "%s: identical rows %d and 32 differ",
                      rule_names[rule], t);
            if (rule != CT_MOE_TOPK_SOFTMAX)
                for (int t = 48; t < T; t++) {
                    CHECK(idx[t * K] == hot[t], "%s, E %d: underflow row %d: first choice %d, not %d",
                          rule_names[rule], E, t, idx[t * K], hot[t]);
                    for (int k = 1, want = 0; k < K; k++, want++) {
                        if (want == hot[t]) want++;
                        CHECK(idx[t * K + k] == want, "%s, E %d: underflow row %d rank %d: expert %d, not %d",
                              rule_names[rule], E, t, k, idx[t * K + k], want);
                    }
                }
            free(idx);
        }
        free(l); free(one);
    }
}

/* moe_count, moe_offsets and moe_permute on both backends from the same idx. */
static void permute_case(const int32_t *idx, int n, int E, const char *what)
{
    pair pi = put_raw(idx, (size_t)n * 4), pc = put_garbage((size_t)E * 4), po = put_garbage((size_t)(E + 1) * 4);
    pair prs = put_garbage((size_t)n * 4 + 4), psr = put_garbage((size_t)n * 4 + 4);
    ct_backend *bes[2] = {cpu, gpu};
    for (int b = 0; b < 2; b++) {
        void *i = b ? pi.g : pi.c, *c = b ? pc.g : pc.c, *o = b ? po.g : po.c;
        bes[b]->moe_count(bes[b], c, i, n, E);
        bes[b]->moe_offsets(bes[b], o, c, E);
        bes[b]->moe_permute(bes[b], b ? prs.g : prs.c, b ? psr.g : psr.c, i, o, n, E);
    }
    const char *names[4] = {"counts", "offsets", "row_slot", "slot_row"};
    pair ps[4] = {pc, po, prs, psr};
    size_t lens[4] = {(size_t)E, (size_t)E + 1, (size_t)n, (size_t)n};
    for (int a = 0; a < 4; a++) {
        int32_t cv, gv;
        long at = int_diff(ps[a], lens[a], &cv, &gv);
        CHECK(at < 0, "%s (n %d, E %d): %s[%ld] is %d on the GPU, %d on the CPU", what, n, E, names[a], at, gv, cv);
    }
    drop(pi); drop(pc); drop(po); drop(prs); drop(psr);
}

TEST(count_offsets_permute_match_cpu_exactly)
{
    NEED_GPU();
    /* T, K, E, mode: 0 uniform, 1 experts e % 3 == 1 never chosen, 2 all slots to one expert */
    const int cases[][4] = {{1, 1, 8, 0},     {1, 8, 128, 0},   {37, 2, 8, 1},     {700, 3, 7, 0},
                            {1000, 8, 128, 1}, {3000, 4, 32, 2}, {5000, 8, 256, 0}, {129, 8, 128, 1},
                            {65536, 8, 128, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int T = cases[c][0], K = cases[c][1], E = cases[c][2], mode = cases[c][3], n = T * K;
        int32_t *idx = ct_malloc((size_t)n * 4);
        for (int s = 0; s < n; s++) {
            int e = (int)ct_rng_below(&rng, E);
            idx[s] = mode == 2 ? 5 : mode == 1 && e % 3 == 1 ? (e + 1) % E : e;
        }
        char what[64];
        snprintf(what, sizeof what, "T %d K %d mode %d", T, K, mode);
        permute_case(idx, n, E, what);
        free(idx);
    }
}

/* The real sequence on device-resident data at qwen3-30b-a3b's routing shape:
 * each backend routes, counts, scans and permutes its own results; nothing may
 * wait for the host on the GPU. */
TEST(routing_pipeline_matches_cpu_at_qwen3_moe_shape_without_host_waits)
{
    NEED_GPU();
    int T = 16384, E = 128, K = 8, n = T * K;
    float *l = rnd((size_t)T * E, 4.0f);
    pair pl = put_act(l, (size_t)T * E), pi = put_garbage((size_t)n * 4), pw = put_garbage((size_t)n * 4);
    pair pc = put_garbage((size_t)E * 4), po = put_garbage((size_t)(E + 1) * 4);
    pair prs = put_garbage((size_t)n * 4), psr = put_garbage((size_t)n * 4);
    uint64_t syncs = gpu->host_syncs;
    for (int b = 1; b >= 0; b--) {
        ct_backend *be = b ? gpu : cpu;
        void *i = b ? pi.g : pi.c, *c = b ? pc.g : pc.c, *o = b ? po.g : po.c;
        be->moe_route(be, i, b ? pw.g : pw.c, b ? pl.g : pl.c, T, E, K, CT_MOE_SOFTMAX_TOPK_NORM);
        be->moe_count(be, c, i, n, E);
        be->moe_offsets(be, o, c, E);
        be->moe_permute(be, b ? prs.g : prs.c, b ? psr.g : psr.c, i, o, n, E);
    }
    CHECK(gpu->host_syncs == syncs, "routing waited for the host %llu times",
          (unsigned long long)(gpu->host_syncs - syncs));
    const char *names[5] = {"topk_idx", "counts", "offsets", "row_slot", "slot_row"};
    pair ps[5] = {pi, pc, po, prs, psr};
    size_t lens[5] = {(size_t)n, (size_t)E, (size_t)E + 1, (size_t)n, (size_t)n};
    for (int a = 0; a < 5; a++) {
        int32_t cv, gv;
        long at = int_diff(ps[a], lens[a], &cv, &gv);
        CHECK(at < 0, "%s[%ld] is %d on the GPU, %d on the CPU", names[a], at, gv, cv);
    }
    double e = f32_rel_err(pw, n);
    CHECK(e < 1e-5, "weights rel err %g", e);
    drop(pl); drop(pi); drop(pw); drop(pc); drop(po); drop(prs); drop(psr); free(l);
}

/* A permutation for n = T*K random slots, computed by the CPU and put on both. */
typedef struct { pair row_slot, slot_row, idx; } perm;

static perm make_perm(int T, int K, int E)
{
    int n = T * K;
    int32_t *idx = ct_malloc((size_t)n * 4), *counts = ct_malloc((size_t)E * 4), *off = ct_malloc((size_t)(E + 1) * 4);
    int32_t *rs = ct_malloc((size_t)n * 4), *sr = ct_malloc((size_t)n * 4);
    for (int s = 0; s < n; s++) idx[s] = (int32_t)ct_rng_below(&rng, E);
    cpu->moe_count(cpu, counts, idx, n, E);
    cpu->moe_offsets(cpu, off, counts, E);
    cpu->moe_permute(cpu, rs, sr, idx, off, n, E);
    perm p = {put_raw(rs, (size_t)n * 4), put_raw(sr, (size_t)n * 4), put_raw(idx, (size_t)n * 4)};
    free(idx); free(counts); free(off); free(rs); free(sr);
    return p;
}

/* T, K, E, H, extra x / y stride: H = 360 leaves lanes idle in a warp's last pass. */
static const int row_cases[][5] = {{50, 4, 8, 256, 64}, {9, 8, 32, 360, 8}, {33, 1, 4, 2048, 0}, {1, 8, 128, 64, 16}};

TEST(gather_copies_rows_exactly_and_scatter_matches_cpu)
{
    NEED_GPU();
    for (size_t c = 0; c < sizeof row_cases / sizeof row_cases[0]; c++) {
        int T = row_cases[c][0], K = row_cases[c][1], E = row_cases[c][2], H = row_cases[c][3];
        int ld = H + row_cases[c][4], n = T * K;
        perm p = make_perm(T, K, E);
        float *x = rnd((size_t)T * ld, 2.0f), *ye = rnd((size_t)n * H, 2.0f), *w = rnd((size_t)n, 1.0f);
        float *y0 = rnd((size_t)T * ld, 1.0f);
        pair px = put_act(x, (size_t)T * ld), pxe = put_act(ye, (size_t)n * H), pye = put_act(ye, (size_t)n * H);
        pair pw = put_raw(w, (size_t)n * 4), py = put_act(y0, (size_t)T * ld);
        cpu->moe_gather(cpu, pxe.c, px.c, ld, p.row_slot.c, T, K, H);
        gpu->moe_gather(gpu, pxe.g, px.g, ld, p.row_slot.g, T, K, H);
        double e = act_err(pxe, n, H, H);
        CHECK(e == 0, "gather (T %d K %d H %d) differs: rel err %g", T, K, H, e);
        for (int with_w = 1; with_w >= 0; with_w--)
            for (int res = 0; res <= 2; res++) { /* residual: none, y itself, x */
                cpu->act_from_f32(cpu, py.c, y0, (size_t)T * ld);
                gpu->act_from_f32(gpu, py.g, y0, (size_t)T * ld);
                cpu->moe_scatter(cpu, py.c, ld, pye.c, p.slot_row.c, with_w ? pw.c : NULL, T, K, H,
                                 res == 0 ? NULL : res == 1 ? py.c : px.c, ld);
                gpu->moe_scatter(gpu, py.g, ld, pye.g, p.slot_row.g, with_w ? pw.g : NULL, T, K, H,
                                 res == 0 ? NULL : res == 1 ? py.g : px.g, ld);
                e = act_err(py, T, ld, ld); /* the columns past H must be untouched too */
                CHECK(e < 1e-2, "scatter (T %d K %d H %d, w %s, residual %d) rel err %g", T, K, H,
                      with_w ? "given" : "NULL", res, e);
            }
        drop(p.row_slot); drop(p.slot_row); drop(p.idx); drop(px); drop(pxe); drop(pye); drop(pw); drop(py);
        free(x); free(ye); free(w); free(y0);
    }
}

/* dw three ways: dy . ye (ye given), dy . bias[idx] (ye NULL, a bias), 0 (neither). */
TEST(scatter_bwd_matches_cpu)
{
    NEED_GPU();
    for (size_t c = 0; c < sizeof row_cases / sizeof row_cases[0]; c++) {
        int T = row_cases[c][0], K = row_cases[c][1], E = row_cases[c][2], H = row_cases[c][3];
        int ld = H + row_cases[c][4], n = T * K;
        perm p = make_perm(T, K, E);
        float *dy = rnd((size_t)T * ld, 1.0f), *ye = rnd((size_t)n * H, 2.0f), *w = rnd((size_t)n, 1.0f);
        float *b = rnd((size_t)E * H, 1.0f);
        pair pdy = put_act(dy, (size_t)T * ld), pye = put_act(ye, (size_t)n * H), pw = put_raw(w, (size_t)n * 4);
        pair pb = put_weight(b, (size_t)E * H);
        for (int with = 0; with < 3; with++) {
            const void *yec = with == 0 ? pye.c : NULL, *yeg = with == 0 ? pye.g : NULL;
            const void *bc = with == 1 ? pb.c : NULL, *bg = with == 1 ? pb.g : NULL;
            pair pdye = put_act(ye, (size_t)n * H), pdw = put_garbage((size_t)n * 4);
            cpu->moe_scatter_bwd(cpu, pdye.c, pdw.c, pdy.c, ld, yec, bc, p.idx.c, p.row_slot.c, p.slot_row.c, pw.c, T,
                                 K, H);
            gpu->moe_scatter_bwd(gpu, pdye.g, pdw.g, pdy.g, ld, yeg, bg, p.idx.g, p.row_slot.g, p.slot_row.g, pw.g, T,
                                 K, H);
            double ed = act_err(pdye, n, H, H), ew = f32_err(pdw, n);
            CHECK(ed < 1e-2, "dye (T %d K %d H %d, dw from %s) rel err %g", T, K, H,
                  with == 0 ? "ye" : with == 1 ? "bias" : "nothing", ed);
            CHECK(ew < 1e-4, "dw (T %d K %d H %d, from %s) rel err %g", T, K, H,
                  with == 0 ? "ye" : with == 1 ? "bias" : "nothing", ew);
            drop(pdye); drop(pdw);
        }
        drop(p.row_slot); drop(p.slot_row); drop(p.idx); drop(pdy); drop(pye); drop(pw); drop(pb);
        free(dy); free(ye); free(w); free(b);
    }
}

/* dw += (dh . h) / w over expert rows, onto random dw; rows whose w is 0 (every
 * 7th slot) leave dw as it was. */
TEST(weight_grad_matches_cpu)
{
    NEED_GPU();
    const int cases[][4] = {{50, 4, 8, 256}, {9, 8, 32, 760}, {1, 8, 128, 64}}; /* T, K, E, I */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int T = cases[c][0], K = cases[c][1], E = cases[c][2], I = cases[c][3], n = T * K;
        perm p = make_perm(T, K, E);
        float *dh = rnd((size_t)n * I, 1.0f), *h = rnd((size_t)n * I, 1.0f), *w = rnd((size_t)n, 1.0f);
        float *dw0 = rnd((size_t)n, 1.0f);
        for (int s = 0; s < n; s += 7) w[s] = 0.0f;
        for (int s = 1; s < n; s += 7) w[s] = w[s] < 0 ? w[s] - 0.5f : w[s] + 0.5f; /* away from 0 */
        pair pdh = put_act(dh, (size_t)n * I), ph = put_act(h, (size_t)n * I), pw = put_raw(w, (size_t)n * 4);
        pair pdw = put_raw(dw0, (size_t)n * 4);
        cpu->moe_weight_grad(cpu, pdw.c, pdh.c, ph.c, pw.c, p.row_slot.c, n, I);
        gpu->moe_weight_grad(gpu, pdw.g, pdh.g, ph.g, pw.g, p.row_slot.g, n, I);
        double e = f32_err(pdw, n);
        CHECK(e < 1e-4, "dw (T %d K %d I %d) rel err %g", T, K, I, e);
        float *g = ct_malloc((size_t)n * 4);
        gpu->download(gpu, g, pdw.g, (size_t)n * 4);
        bool kept = true;
        for (int s = 0; s < n; s += 7) kept &= g[s] == dw0[s];
        CHECK(kept, "dw changed where w is 0 (T %d K %d I %d)", T, K, I);
        free(g);
        drop(p.row_slot); drop(p.slot_row); drop(p.idx); drop(pdh); drop(ph); drop(pw); drop(pdw);
        free(dh); free(h); free(w); free(dw0);
    }
}

/* moe_act_bwd: dgu and dw (onto random values; w = 0 every 7th slot) against the
 * CPU's sequence, for SwiGLU (gate | up halves) and gpt_oss's clamped SwiGLU
 * (interleaved, limit 7, inputs past it). */
TEST(act_bwd_matches_cpu_for_both_activations)
{
    NEED_GPU();
    const int cases[][4] = {{50, 4, 8, 256}, {9, 8, 32, 760}, {1, 8, 128, 64}}; /* T, K, E, I */
    for (int clamped = 0; clamped <= 1; clamped++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            int T = cases[c][0], K = cases[c][1], E = cases[c][2], I = cases[c][3], n = T * K;
            perm p = make_perm(T, K, E);
            float *gu = rnd((size_t)n * 2 * I, clamped ? 10.0f : 3.0f), *dh = rnd((size_t)n * I, 1.0f);
            float *w = rnd((size_t)n, 1.0f), *dw0 = rnd((size_t)n, 1.0f);
            for (int s = 0; s < n; s += 7) w[s] = 0.0f;
            for (int s = 1; s < n; s += 7) w[s] = w[s] < 0 ? w[s] - 0.5f : w[s] + 0.5f;
            pair pgu = put_act(gu, (size_t)n * 2 * I), pdh = put_act(dh, (size_t)n * I), pw = put_raw(w, (size_t)n * 4);
            pair pdw = put_raw(dw0, (size_t)n * 4), pdgu = put_act(gu, (size_t)n * 2 * I);
            cpu->moe_act_bwd(cpu, pdgu.c, pdw.c, pdh.c, pgu.c, pw.c, p.row_slot.c, n, I, clamped, 1.702f, 7.0f);
            gpu->moe_act_bwd(gpu, pdgu.g, pdw.g, pdh.g, pgu.g, pw.g, p.row_slot.g, n, I, clamped, 1.702f, 7.0f);
            double eg = act_err(pdgu, n, 2 * I, 2 * I), ew = f32_err(pdw, n);
            CHECK(eg < 1e-2, "dgu (T %d K %d I %d, clamped %d) rel err %g", T, K, I, clamped, eg);
            CHECK(ew < 2e-2, "dw (T %d K %d I %d, clamped %d) rel err %g", T, K, I, clamped, ew);
            drop(p.row_slot); drop(p.slot_row); drop(p.idx); drop(pgu); drop(pdh); drop(pw); drop(pdw); drop(pdgu);
            free(gu); free(dh); free(w); free(dw0);
        }
}

/* gpt_oss's limit 7 with inputs in [-10, 10], a fifth of them placed exactly on
 * a limit or one bf16 step either side of it. Where a clamp is active the
 * gradient must be exactly 0; exactly at a limit it must pass (torch.clamp). */
TEST(clamped_swiglu_matches_cpu_at_and_beyond_the_limits)
{
    NEED_GPU();
    const float limit = 7.0f, alpha = 1.702f;
    const float edge[6] = {7.0f, -7.0f, 7.03125f, -7.03125f, 6.96875f, -6.96875f}; /* bf16 steps of 2^-5 */
    int n = 64, I = 360;
    size_t ngu = (size_t)n * 2 * I, nh = (size_t)n * I;
    float *gu = rnd(ngu, 10.0f), *dh = rnd(nh, 1.0f);
    for (size_t i = 0; i < ngu; i += 5) gu[i] = edge[(i / 5) % 6];
    pair pgu = put_act(gu, ngu), pdh = put_act(dh, nh), ph = put_act(dh, nh), pdgu = put_act(gu, ngu);
    cpu->moe_clamped_swiglu_fwd(cpu, ph.c, pgu.c, n, I, alpha, limit);
    gpu->moe_clamped_swiglu_fwd(gpu, ph.g, pgu.g, n, I, alpha, limit);
    double e = act_err(ph, n, I, I);
    CHECK(e < 1e-2, "h rel err %g", e);
    cpu->moe_clamped_swiglu_bwd(cpu, pdgu.c, pdh.c, pgu.c, n, I, alpha, limit);
    gpu->moe_clamped_swiglu_bwd(gpu, pdgu.g, pdh.g, pgu.g, n, I, alpha, limit);
    e = act_err(pdgu, n, 2 * I, 2 * I);
    CHECK(e < 1e-2, "dgu rel err %g", e);
    float *c = ct_malloc(ngu * sizeof(float)), *g = ct_malloc(ngu * sizeof(float));
    cpu->act_to_f32(cpu, c, pdgu.c, ngu);
    gpu->act_to_f32(gpu, g, pdgu.g, ngu);
    size_t blocked_passed = 0, zero_mismatch = 0, at_limit_passed = 0;
    for (size_t i = 0; i < ngu; i++) {
        bool up = i % 2, clamped = up ? fabsf(gu[i]) > limit : gu[i] > limit;
        if (clamped && g[i] != 0.0f) blocked_passed++;
        if ((c[i] == 0.0f) != (g[i] == 0.0f)) zero_mismatch++;
        if (fabsf(gu[i]) == limit && (up || gu[i] > 0) && g[i] != 0.0f) at_limit_passed++;
    }
    CHECK(blocked_passed == 0, "%zu gradients passed through an active clamp", blocked_passed);
    CHECK(zero_mismatch == 0, "%zu gradients are zero on one backend only", zero_mismatch);
    CHECK(at_limit_passed > 50, "only %zu values exactly at a limit passed their gradient", at_limit_passed);
    drop(pgu); drop(pdh); drop(ph); drop(pdgu); free(gu); free(dh); free(c); free(g);
}

TEST(route_bwd_matches_cpu_for_every_rule_with_and_without_aux)
{
    NEED_GPU();
    const int cases[][2] = {{8, 2}, {32, 4}, {128, 8}, {100, 3}};
    int T = 200;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int E = cases[c][0], K = cases[c][1];
        size_t n = (size_t)T * K;
        float *l = rnd((size_t)T * E, 2.0f), *dw = rnd(n, 1.0f), *aux = rnd((size_t)E, 0.5f);
        float *dl0 = rnd((size_t)T * E, 1.0f), *w = ct_malloc(n * 4);
        int32_t *idx = ct_malloc(n * 4);
        pair pl = put_act(l, (size_t)T * E), pdw = put_raw(dw, n * 4), paux = put_raw(aux, (size_t)E * 4);
        pair pdl = put_act(dl0, (size_t)T * E);
        for (int rule = 0; rule < 3; rule++) {
            /* The CPU's selection on both, so that only the backward is compared. */
            cpu->moe_route(cpu, idx, w, pl.c, T, E, K, (ct_moe_rule)rule);
            pair pi = put_raw(idx, n * 4), pw = put_raw(w, n * 4);
            for (int with_aux = 0; with_aux <= 1; with_aux++) {
                cpu->moe_route_bwd(cpu, pdl.c, pdw.c, pl.c, pi.c, pw.c, with_aux ? paux.c : NULL, T, E, K,
                                   (ct_moe_rule)rule);
                gpu->moe_route_bwd(gpu, pdl.g, pdw.g, pl.g, pi.g, pw.g, with_aux ? paux.g : NULL, T, E, K,
                                   (ct_moe_rule)rule);
                double e = act_err(pdl, T, E, E);
                CHECK(e < 1e-2, "%s, E %d, K %d, aux %d: dlogits rel err %g", rule_names[rule], E, K, with_aux, e);
            }
            drop(pi); drop(pw);
        }
        drop(pl); drop(pdw); drop(paux); drop(pdl);
        free(l); free(dw); free(aux); free(dl0); free(w); free(idx);
    }
}

/* More tokens than the GPU's partial-sum blocks hold warps (2 blocks per SM of
 * 8 warps), so warps take several tokens; the sum must not depend on timing. */
TEST(prob_sum_adds_softmax_sums_and_is_bit_reproducible)
{
    NEED_GPU();
    const int cases[][2] = {{5000, 8}, {3001, 128}, {7, 256}, {40000, 32}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int T = cases[c][0], E = cases[c][1];
        float *l = rnd((size_t)T * E, 3.0f), *ps0 = rnd((size_t)E, 1.0f);
        for (int e = 0; e < E; e++) ps0[e] = fabsf(ps0[e]) * T / E;
        pair pl = put_act(l, (size_t)T * E), pps = put_raw(ps0, (size_t)E * 4);
        cpu->moe_prob_sum(cpu, pps.c, pl.c, T, E);
        gpu->moe_prob_sum(gpu, pps.g, pl.g, T, E);
        double e = f32_rel_err(pps, (size_t)E);
        CHECK(e < 1e-5, "T %d E %d: prob_sum rel err %g", T, E, e);
        float *a = ct_malloc((size_t)E * 4), *b = ct_malloc((size_t)E * 4);
        gpu->download(gpu, a, pps.g, (size_t)E * 4);
        gpu->upload(gpu, pps.g, ps0, (size_t)E * 4);
        gpu->moe_prob_sum(gpu, pps.g, pl.g, T, E);
        gpu->download(gpu, b, pps.g, (size_t)E * 4);
        CHECK(!memcmp(a, b, (size_t)E * 4), "T %d E %d: two identical calls differ", T, E);
        drop(pl); drop(pps); free(l); free(ps0); free(a); free(b);
    }
}

TEST(aux_loss_matches_cpu)
{
    NEED_GPU();
    const int cases[][3] = {{3, 500, 32}, {48, 16384, 128}, {1, 1, 8}}; /* layers, T, E */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int L = cases[c][0], T = cases[c][1], E = cases[c][2], K = 4;
        size_t m = (size_t)L * E;
        int32_t *counts = ct_malloc(m * 4);
        float *ps = ct_malloc(m * 4), loss0 = 1.25f, coef = 0.01f;
        for (size_t i = 0; i < m; i++) {
            counts[i] = (int32_t)ct_rng_below(&rng, 2 * (uint64_t)T * K / E + 1);
            ps[i] = (float)ct_rng_uniform(&rng) * 2.0f * T / E;
        }
        pair pc = put_raw(counts, m * 4), pps = put_raw(ps, m * 4), pl = put_raw(&loss0, 4);
        pair pg = put_garbage((size_t)E * 4);
        cpu->moe_aux_loss(cpu, pl.c, pg.c, pc.c, pps.c, L, T, E, coef);
        gpu->moe_aux_loss(gpu, pl.g, pg.g, pc.g, pps.g, L, T, E, coef);
        double el = f32_rel_err(pl, 1), eg = f32_rel_err(pg, (size_t)E);
        CHECK(el < 1e-5, "layers %d T %d E %d: loss rel err %g", L, T, E, el);
        CHECK(eg < 1e-5, "layers %d T %d E %d: aux_grad rel err %g", L, T, E, eg);
        drop(pc); drop(pps); drop(pl); drop(pg); free(counts); free(ps);
    }
}

int main(void)
{
    ct_error err = {0};
    cpu = backend_cpu_new();
    gpu = backend_cuda_new(&err);
    if (!gpu) printf("# CUDA backend unavailable: %s\n", err.msg);
    ct_rng_seed(&rng, 20261207);
    RUN(route_matches_cpu_for_every_rule_e_and_k);
    RUN(route_matches_cpu_for_odd_sizes_and_k_equal_to_e);
    RUN(route_breaks_exact_ties_toward_the_lower_expert);
    RUN(count_offsets_permute_match_cpu_exactly);
    RUN(routing_pipeline_matches_cpu_at_qwen3_moe_shape_without_host_waits);
    RUN(gather_copies_rows_exactly_and_scatter_matches_cpu);
    RUN(scatter_bwd_matches_cpu);
    RUN(weight_grad_matches_cpu);
    RUN(act_bwd_matches_cpu_for_both_activations);
    RUN(clamped_swiglu_matches_cpu_at_and_beyond_the_limits);
    RUN(route_bwd_matches_cpu_for_every_rule_with_and_without_aux);
    RUN(prob_sum_adds_softmax_sums_and_is_bit_reproducible);
    RUN(aux_loss_matches_cpu);
    if (gpu) gpu->destroy(gpu);
    cpu->destroy(cpu);
    return check_summary();
}
