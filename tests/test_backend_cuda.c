/* test_backend_cuda.c — every op of the CUDA backend against the CPU reference.
 *
 * Each test draws fresh random inputs, rounds them to bf16 (so both backends see
 * identical values: the CPU gets the rounded fp32, the GPU the bf16), runs the op
 * on both, and compares them normwise (below). NaN never passes.
 *
 * Tolerances. The GPU stores activations in bf16 (8 significant bits: a rounding
 * error of up to 2^-9 = 0.2% per element) and feeds tensor cores bf16 operands,
 * so results that round an intermediate (a GEMM output before the bias or the
 * accumulate, LoRA's u and g, attention's P and dS, cross-entropy's dlogits)
 * carry errors on the scale of the operands, not of each element: where terms
 * cancel, an element's own relative error is meaningless. Every comparison is
 * therefore normwise, max|gpu - cpu| / max|cpu| (check_max_norm_err), with:
 *   copies (embedding, copy_2d)                      exact
 *   elementwise (rmsnorm fwd, rope, swiglu, add)     1e-2
 *   GEMM-based (linear, LoRA, rmsnorm bwd)           2e-2
 *   attention out / dq, dk, dv                       2e-2 / 4e-2
 *   fp32 results (lse, loss, optimizer)              1e-3 .. 1e-5
 * The attention tests run once per kept kernel choice, each on a backend created
 * with the choice forced (ct_cuda_options): the head_dim 64 forward on one
 * warpgroup, then on the TMA kernel (the two kernels kept there). Every pass also
 * runs the one forward of head_dim 32 and 256 (mma.sync) and 128 (TMA) and the
 * one backward of each head_dim (mma.sync at 32, one warpgroup at 64, two
 * warpgroups for dq and dk/dv at 128, mma.sync dq and split dk/dv at 256); each
 * compares the forward and the backward with the CPU and checks that the
 * backward is bit-reproducible; head_dim 256 also runs attention_decode.
 * Without a GPU every test reports "skip NAME: skipped: no GPU". */
#include "backend.h"
#include "check.h"
#include "cuda_pair.h"
#include "model_config.h"

#include <math.h>
#include <stdint.h>

/* The kernel choices the attention tests run under, one backend each. */
static const struct {
    ct_cuda_options options;
    const char *name;
} ATTN_PASSES[] = {
    {{.attn_fwd = CT_ATTN_FWD_WGMMA}, "head_dim 64 forward on one warpgroup"},
    {{.attn_fwd = CT_ATTN_FWD_TMA}, "head_dim 64 forward on TMA"},
};
static const char *attn_pass; /* the name of the pass gpu was created for */

TEST(embedding_copies_rows_exactly)
{
    NEED_GPU();
    int T = 37, H = 64, V = 50;
    int32_t ids[37];
    for (int t = 0; t < T; t++) ids[t] = (int32_t)ct_rng_below(&rng, V);
    float *tab = rnd((size_t)V * H, 1.0f);
    pair w = put_weight(tab, (size_t)V * H), id = put_raw(ids, sizeof ids);
    pair out = put_act(tab, (size_t)T * H); /* any contents: overwritten */
    cpu->embedding(cpu, out.c, id.c, w.c, T, H);
    gpu->embedding(gpu, out.g, id.g, w.g, T, H);
    double e = act_err(out, T, H, H);
    CHECK(e == 0, "embedding differs: rel err %g", e);
    drop(w); drop(id); drop(out); free(tab);
}

/* Zero-centred norms (zc: the scale is 1 + w, w the stored offsets) must also
 * round once (act_err_half_ulps <= 1.01): 1 + w rounded to bf16 first, or the
 * normalised x cast before the multiply, measure 1.4 to 1.9 half ulps on these
 * shapes (simulated on the host; 1.7 to 1.9 for the backward without dres). */
#define ONE_ROUNDING 1.01

static void rmsnorm_fwd_case(int zc)
{
    int T = 33, nh = 3, D = 128, ldx = nh * D + 16, ldy = nh * D;
    float *x = rnd((size_t)T * ldx, 2.0f), *w = rnd(D, zc ? 0.5f : 1.5f);
    pair px = put_act(x, (size_t)T * ldx), pw = put_weight(w, D), py = put_act(x, (size_t)T * ldy);
    pair rs = put_raw(x, (size_t)T * nh * sizeof(float));
    cpu->rmsnorm_fwd(cpu, py.c, ldy, rs.c, px.c, ldx, pw.c, zc, T, nh, D, 1e-6f);
    gpu->rmsnorm_fwd(gpu, py.g, ldy, rs.g, px.g, ldx, pw.g, zc, T, nh, D, 1e-6f);
    double ey = act_err(py, T, nh * D, ldy), er = f32_err(rs, (size_t)T * nh);
    CHECK(ey < 1e-2, "y rel err %g (zero-centred %d)", ey, zc);
    CHECK(er < 1e-3, "rstd rel err %g (zero-centred %d)", er, zc);
    if (zc) {
        double u = act_err_half_ulps(py, T, nh * D, ldy);
        CHECK(u <= ONE_ROUNDING, "zero-centred y is %g half bf16 ulps off the CPU (one rounding: <= 1)", u);
    }
    drop(px); drop(pw); drop(py); drop(rs); free(x); free(w);
}

TEST(rmsnorm_fwd_matches_cpu_on_strided_head_groups)
{
    NEED_GPU();
    rmsnorm_fwd_case(0);
}

/* residual: 0 none, 1 the residual gradient in dx itself (aliasing), 2 in its own buffer. */
static void rmsnorm_bwd_case(int residual, int zc, int T, int nh, int D)
{
    int ld = nh * D;
    float *x = rnd((size_t)T * ld, 2.0f), *w = rnd(D, zc ? 0.5f : 1.5f), *dy = rnd((size_t)T * ld, 1.0f);
    float *dx0 = rnd((size_t)T * ld, 1.0f), *res = rnd((size_t)T * ld, 1.0f);
    pair px = put_act(x, (size_t)T * ld), pw = put_weight(w, D), pdy = put_act(dy, (size_t)T * ld);
    pair pdx = put_act(dx0, (size_t)T * ld), rs = put_raw(x, (size_t)T * nh * sizeof(float));
    pair pres = put_act(res, (size_t)T * ld);
    cpu->rmsnorm_fwd(cpu, pdy.c, ld, rs.c, px.c, ld, pw.c, zc, T, nh, D, 1e-5f); /* rstd only */
    float *r = ct_malloc((size_t)T * nh * sizeof(float));
    cpu->download(cpu, r, rs.c, (size_t)T * nh * sizeof(float));
    gpu->upload(gpu, rs.g, r, (size_t)T * nh * sizeof(float));
    cpu->act_from_f32(cpu, pdy.c, dy, (size_t)T * ld);
    const void *rc = residual == 0 ? NULL : residual == 1 ? pdx.c : pres.c;
    const void *rg = residual == 0 ? NULL : residual == 1 ? pdx.g : pres.g;
    cpu->rmsnorm_bwd(cpu, pdx.c, ld, pdy.c, ld, px.c, ld, rs.c, pw.c, zc, T, nh, D, rc, ld);
    gpu->rmsnorm_bwd(gpu, pdx.g, ld, pdy.g, ld, px.g, ld, rs.g, pw.g, zc, T, nh, D, rg, ld);
    double e = act_err(pdx, T, ld, ld);
    CHECK(e < 2e-2, "dx rel err %g (residual mode %d, D %d, zero-centred %d)", e, residual, D, zc);
    if (zc) {
        double u = act_err_half_ulps(pdx, T, ld, ld);
        CHECK(u <= ONE_ROUNDING, "zero-centred dx is %g half bf16 ulps off the CPU (one rounding: <= 1; "
              "residual mode %d, D %d)", u, residual, D);
    }
    drop(px); drop(pw); drop(pdy); drop(pdx); drop(rs); drop(pres);
    free(x); free(w); free(dy); free(dx0); free(res); free(r);
}

/* without dres, D 64 and 2048 take the register kernel; 2880, 5120 and every dres case the loop kernel */
static const int RMSNORM_BWD_SHAPES[][3] = {{29, 2, 64}, {7, 1, 2048}, {5, 1, 2880}, {3, 1, 5120}};

TEST(rmsnorm_bwd_matches_cpu_with_and_without_residual)
{
    NEED_GPU();
    for (int i = 0; i < 4; i++)
        for (int residual = 0; residual < 3; residual++)
            rmsnorm_bwd_case(residual, 0, RMSNORM_BWD_SHAPES[i][0], RMSNORM_BWD_SHAPES[i][1],
                             RMSNORM_BWD_SHAPES[i][2]);
}

/* Qwen3.5 / Qwen3-Next norms: scale 1 + w formed in fp32 from bf16 w, forward and
 * backward (both kernels, every residual mode), each output rounded once. */
TEST(rmsnorm_zero_centred_fwd_bwd_match_cpu_rounding_once)
{
    NEED_GPU();
    rmsnorm_fwd_case(1);
    for (int i = 0; i < 4; i++)
        for (int residual = 0; residual < 3; residual++)
            rmsnorm_bwd_case(residual, 1, RMSNORM_BWD_SHAPES[i][0], RMSNORM_BWD_SHAPES[i][1],
                             RMSNORM_BWD_SHAPES[i][2]);
}

TEST(linear_fwd_with_bias_accumulates_into_a_slice)
{
    NEED_GPU();
    int T = 100, in = 256, out = 192, ldx = in + 64, ldy = out + 32;
    float *x = rnd((size_t)T * ldx, 1.0f), *W = rnd((size_t)out * in, 0.1f), *b = rnd(out, 0.5f);
    float *y0 = rnd((size_t)T * ldy, 1.0f);
    pair px = put_act(x, (size_t)T * ldx), pW = put_weight(W, (size_t)out * in), pb = put_weight(b, out);
    pair py = put_act(y0, (size_t)T * ldy);
    cpu->linear_fwd(cpu, py.c, ldy, px.c, ldx, pW.c, pb.c, T, in, out, 1);
    gpu->linear_fwd(gpu, py.g, ldy, px.g, ldx, pW.g, pb.g, T, in, out, 1);
    double e = act_err(py, T, out, ldy);
    CHECK(e < 2e-2, "accumulate+bias rel err %g", e);
    cpu->linear_fwd(cpu, py.c, ldy, px.c, ldx, pW.c, NULL, T, in, out, 0);
    gpu->linear_fwd(gpu, py.g, ldy, px.g, ldx, pW.g, NULL, T, in, out, 0);
    e = act_err(py, T, out, ldy);
    CHECK(e < 2e-2, "overwrite rel err %g", e);
    drop(px); drop(pW); drop(pb); drop(py); free(x); free(W); free(b); free(y0);
}

TEST(linear_bwd_input_matches_cpu)
{
    NEED_GPU();
    int T = 70, in = 128, out = 320, lddy = out + 8;
    float *dy = rnd((size_t)T * lddy, 1.0f), *W = rnd((size_t)out * in, 0.1f), *dx0 = rnd((size_t)T * in, 1.0f);
    pair pdy = put_act(dy, (size_t)T * lddy), pW = put_weight(W, (size_t)out * in), pdx = put_act(dx0, (size_t)T * in);
    for (int acc = 0; acc <= 1; acc++) {
        cpu->linear_bwd_input(cpu, pdx.c, in, pdy.c, lddy, pW.c, T, in, out, acc);
        gpu->linear_bwd_input(gpu, pdx.g, in, pdy.g, lddy, pW.g, T, in, out, acc);
        double e = act_err(pdx, T, in, in);
        CHECK(e < 2e-2, "dx rel err %g (accumulate %d)", e, acc);
    }
    drop(pdy); drop(pW); drop(pdx); free(dy); free(W); free(dx0);
}

/* Whether a and b hold the same bytes on the CPU, and on the GPU. */
static bool same_bits(pair a, pair b, size_t bytes_cpu, size_t bytes_gpu, bool on_gpu)
{
    ct_backend *be = on_gpu ? gpu : cpu;
    size_t n = on_gpu ? bytes_gpu : bytes_cpu;
    char *x = ct_malloc(n), *y = ct_malloc(n);
    be->download(be, x, on_gpu ? a.g : a.c, n);
    be->download(be, y, on_gpu ? b.g : b.c, n);
    bool same = memcmp(x, y, n) == 0;
    free(x); free(y);
    return same;
}

/* act tensor of n elements: the same bits on both backends' copies */
#define SAME_ACT(a, b, n, on_gpu) same_bits(a, b, (n) * cpu->act_bytes, (n) * gpu->act_bytes, on_gpu)
#define SAME_F32(a, b, n, on_gpu) same_bits(a, b, (n) * 4, (n) * 4, on_gpu)

/* LoRA on a column slice of x, with and without dropout: a wrong mask (a port of
 * ct_hash64 that is not bit-exact) would make errors of order 1. Then the same
 * from the same start with u kept by the forward for the backward (ld 8 past R):
 * the same bits as recomputing it, on each backend. */
static void lora_case(float p, int with_dx)
{
    int T = 64, in = 256, out = 128, R = 16, ldx = in + 32, ldy = out + 64;
    float scale = 2.0f;
    uint64_t seed = 0x1234abcdull;
    float *x = rnd((size_t)T * ldx, 1.0f), *A = rnd((size_t)R * in, 0.1f), *B = rnd((size_t)out * R, 0.1f);
    float *y0 = rnd((size_t)T * ldy, 0.05f), *dy = rnd((size_t)T * ldy, 1.0f);
    float *dA0 = rnd((size_t)R * in, 0.5f), *dB0 = rnd((size_t)out * R, 0.5f);
    pair px = put_act(x, (size_t)T * ldx), pA = put_raw(A, (size_t)R * in * 4), pB = put_raw(B, (size_t)out * R * 4);
    pair py = put_act(y0, (size_t)T * ldy), pdy = put_act(dy, (size_t)T * ldy);
    pair pdA = put_raw(dA0, (size_t)R * in * 4), pdB = put_raw(dB0, (size_t)out * R * 4);
    pair pdx = put_act(x, (size_t)T * ldx);

    cpu->lora_fwd(cpu, py.c, ldy, px.c, ldx, pA.c, pB.c, T, in, out, R, scale, p, seed, NULL, 0);
    gpu->lora_fwd(gpu, py.g, ldy, px.g, ldx, pA.g, pB.g, T, in, out, R, scale, p, seed, NULL, 0);
    double e = act_err(py, T, out, ldy);
    CHECK(e < 2e-2, "fwd y rel err %g (p %g)", e, p);

    cpu->lora_bwd(cpu, with_dx ? pdx.c : NULL, ldx, pdA.c, pdB.c, pdy.c, ldy, px.c, ldx, pA.c, pB.c,
                  T, in, out, R, scale, p, seed, NULL, 0);
    gpu->lora_bwd(gpu, with_dx ? pdx.g : NULL, ldx, pdA.g, pdB.g, pdy.g, ldy, px.g, ldx, pA.g, pB.g,
                  T, in, out, R, scale, p, seed, NULL, 0);
    double ea = f32_err(pdA, (size_t)R * in), eb = f32_err(pdB, (size_t)out * R);
    CHECK(ea < 2e-2, "dA rel err %g (p %g)", ea, p);
    CHECK(eb < 2e-2, "dB rel err %g (p %g)", eb, p);
    double ex = act_err(pdx, T, in, ldx);
    CHECK(ex < 2e-2, "dx rel err %g (p %g, dx %s)", ex, p, with_dx ? "given" : "NULL: must be untouched");

    int ldu = R + 8;
    pair ky = put_act(y0, (size_t)T * ldy), kdA = put_raw(dA0, (size_t)R * in * 4);
    pair kdB = put_raw(dB0, (size_t)out * R * 4), kdx = put_act(x, (size_t)T * ldx);
    pair ku = put_act(y0, (size_t)T * ldu);
    for (int on_gpu = 0; on_gpu <= 1; on_gpu++) {
        ct_backend *be = on_gpu ? gpu : cpu;
        void *kyp = on_gpu ? ky.g : ky.c, *kup = on_gpu ? ku.g : ku.c;
        be->lora_fwd(be, kyp, ldy, on_gpu ? px.g : px.c, ldx, on_gpu ? pA.g : pA.c, on_gpu ? pB.g : pB.c, T, in,
                     out, R, scale, p, seed, kup, ldu);
        be->lora_bwd(be, with_dx ? (on_gpu ? kdx.g : kdx.c) : NULL, ldx, on_gpu ? kdA.g : kdA.c,
                     on_gpu ? kdB.g : kdB.c, on_gpu ? pdy.g : pdy.c, ldy, on_gpu ? px.g : px.c, ldx,
                     on_gpu ? pA.g : pA.c, on_gpu ? pB.g : pB.c, T, in, out, R, scale, p, seed, kup, ldu);
        const char *where = on_gpu ? "gpu" : "cpu";
        CHECK(SAME_ACT(ky, py, (size_t)T * ldy, on_gpu), "%s: y with u kept differs (p %g)", where, p);
        CHECK(SAME_F32(kdA, pdA, (size_t)R * in, on_gpu), "%s: dA with u kept differs (p %g)", where, p);
        CHECK(SAME_F32(kdB, pdB, (size_t)out * R, on_gpu), "%s: dB with u kept differs (p %g)", where, p);
        CHECK(SAME_ACT(kdx, pdx, (size_t)T * ldx, on_gpu), "%s: dx with u kept differs (p %g)", where, p);
    }
    drop(ky); drop(kdA); drop(kdB); drop(kdx); drop(ku);
    drop(px); drop(pA); drop(pB); drop(py); drop(pdy); drop(pdA); drop(pdB); drop(pdx);
    free(x); free(A); free(B); free(y0); free(dy); free(dA0); free(dB0);
}

/* n modules sharing x as one stacked LoRA (lora_fwd_cols / lora_bwd_cols) against
 * the CPU's module-by-module sequence: modules with a gap of untargeted columns
 * between them (which must come out unchanged), and ranks that pad (n R = 12 ->
 * 16 on the GPU). Then the same from the same start with u kept by the forward
 * for the backward (ld 8 past lora_u_cols): the same bits as recomputing it, on
 * each backend. */
static void lora_cols_case(int n, int R, const int *col0, const int *cols, int out_all)
{
    int T = 77, in = 192, ldx = in + 16, ldy = out_all + 8, ldu = lora_u_cols(n, R) + 8;
    float scale = 1.5f;
    float *x = rnd((size_t)T * ldx, 1.0f), *y0 = rnd((size_t)T * ldy, 0.05f), *dy = rnd((size_t)T * ldy, 1.0f);
    pair px = put_act(x, (size_t)T * ldx), py = put_act(y0, (size_t)T * ldy), pdy = put_act(dy, (size_t)T * ldy);
    pair pdx = put_act(x, (size_t)T * ldx);
    pair ky = put_act(y0, (size_t)T * ldy), kdx = put_act(x, (size_t)T * ldx), ku = put_act(y0, (size_t)T * ldu);
    pair pA[CT_LORA_COLS_MAX], pB[CT_LORA_COLS_MAX], pdA[CT_LORA_COLS_MAX], pdB[CT_LORA_COLS_MAX];
    pair kdA[CT_LORA_COLS_MAX], kdB[CT_LORA_COLS_MAX];
    ct_lora_cols lc[CT_LORA_COLS_MAX], lg[CT_LORA_COLS_MAX], kc[CT_LORA_COLS_MAX], kg[CT_LORA_COLS_MAX];
    for (int q = 0; q < n; q++) {
        size_t nA = (size_t)R * in, nB = (size_t)cols[q] * R;
        float *A = rnd(nA, 0.1f), *B = rnd(nB, 0.1f), *dA = rnd(nA, 0.5f), *dB = rnd(nB, 0.5f);
        pA[q] = put_raw(A, nA * 4); pB[q] = put_raw(B, nB * 4);
        pdA[q] = put_raw(dA, nA * 4); pdB[q] = put_raw(dB, nB * 4);
        kdA[q] = put_raw(dA, nA * 4); kdB[q] = put_raw(dB, nB * 4);
        lc[q] = (ct_lora_cols){.A = pA[q].c, .B = pB[q].c, .col0 = col0[q], .cols = cols[q], .dA = pdA[q].c,
                               .dB = pdB[q].c};
        lg[q] = (ct_lora_cols){.A = pA[q].g, .B = pB[q].g, .col0 = col0[q], .cols = cols[q], .dA = pdA[q].g,
                               .dB = pdB[q].g};
        kc[q] = lc[q]; kc[q].dA = kdA[q].c; kc[q].dB = kdB[q].c;
        kg[q] = lg[q]; kg[q].dA = kdA[q].g; kg[q].dB = kdB[q].g;
        free(A); free(B); free(dA); free(dB);
    }
    cpu->lora_fwd_cols(cpu, py.c, ldy, px.c, ldx, T, in, lc, n, R, scale, NULL, 0);
    gpu->lora_fwd_cols(gpu, py.g, ldy, px.g, ldx, T, in, lg, n, R, scale, NULL, 0);
    double e = act_err(py, T, out_all, ldy);
    CHECK(e < 2e-2, "fwd y rel err %g (%d modules, R %d)", e, n, R);
    cpu->lora_bwd_cols(cpu, pdx.c, ldx, pdy.c, ldy, px.c, ldx, T, in, lc, n, R, scale, NULL, 0);
    gpu->lora_bwd_cols(gpu, pdx.g, ldx, pdy.g, ldy, px.g, ldx, T, in, lg, n, R, scale, NULL, 0);
    for (int q = 0; q < n; q++) {
        double ea = f32_err(pdA[q], (size_t)R * in), eb = f32_err(pdB[q], (size_t)cols[q] * R);
        CHECK(ea < 2e-2, "module %d dA rel err %g (%d modules, R %d)", q, ea, n, R);
        CHECK(eb < 2e-2, "module %d dB rel err %g (%d modules, R %d)", q, eb, n, R);
    }
    double ex = act_err(pdx, T, in, ldx);
    CHECK(ex < 2e-2, "dx rel err %g (%d modules, R %d)", ex, n, R);

    for (int on_gpu = 0; on_gpu <= 1; on_gpu++) {
        ct_backend *be = on_gpu ? gpu : cpu;
        const ct_lora_cols *k = on_gpu ? kg : kc;
        void *kup = on_gpu ? ku.g : ku.c;
        be->lora_fwd_cols(be, on_gpu ? ky.g : ky.c, ldy, on_gpu ? px.g : px.c, ldx, T, in, k, n, R, scale, kup, ldu);
        be->lora_bwd_cols(be, on_gpu ? kdx.g : kdx.c, ldx, on_gpu ? pdy.g : pdy.c, ldy, on_gpu ? px.g : px.c, ldx,
                          T, in, k, n, R, scale, kup, ldu);
        const char *where = on_gpu ? "gpu" : "cpu";
        CHECK(SAME_ACT(ky, py, (size_t)T * ldy, on_gpu), "%s: y with u kept differs (%d modules)", where, n);
        CHECK(SAME_ACT(kdx, pdx, (size_t)T * ldx, on_gpu), "%s: dx with u kept differs (%d modules)", where, n);
        for (int q = 0; q < n; q++) {
            CHECK(SAME_F32(kdA[q], pdA[q], (size_t)R * in, on_gpu), "%s: module %d dA with u kept differs", where, q);
            CHECK(SAME_F32(kdB[q], pdB[q], (size_t)cols[q] * R, on_gpu), "%s: module %d dB with u kept differs",
                  where, q);
        }
    }
    for (int q = 0; q < n; q++) {
        drop(pA[q]); drop(pB[q]); drop(pdA[q]); drop(pdB[q]); drop(kdA[q]); drop(kdB[q]);
    }
    drop(px); drop(py); drop(pdy); drop(pdx); drop(ky); drop(kdx); drop(ku);
    free(x); free(y0); free(dy);
}

TEST(lora_cols_stacked_modules_match_cpu_sequence)
{
    NEED_GPU();
    lora_cols_case(3, 16, (int[]){0, 128, 192}, (int[]){128, 64, 64}, 256);  /* q, k, v */
    lora_cols_case(2, 16, (int[]){0, 192}, (int[]){128, 64}, 256);           /* q and v: k between them */
    lora_cols_case(3, 4, (int[]){8, 72, 136}, (int[]){64, 64, 40}, 184);     /* ranks padded, y from column 8 */
    lora_cols_case(1, 8, (int[]){32}, (int[]){96}, 128);
}

TEST(lora_fwd_bwd_match_cpu_without_dropout)
{
    NEED_GPU();
    lora_case(0.0f, 1);
}

TEST(lora_dropout_mask_is_bit_identical_to_cpu)
{
    NEED_GPU();
    lora_case(0.3f, 1);
    lora_case(0.5f, 0);
}

TEST(rope_matches_cpu_forward_and_inverse_on_partial_dims)
{
    NEED_GPU();
    int T = 40, nh = 4, D = 64, rot = 32, ldx = nh * D + 64;
    float *x = rnd((size_t)T * ldx, 1.0f), inv_freq[16];
    int32_t pos[40];
    for (int i = 0; i < rot / 2; i++) inv_freq[i] = powf(10000.0f, -2.0f * i / rot);
    for (int t = 0; t < T; t++) pos[t] = (int32_t)ct_rng_below(&rng, 200000);
    pair px = put_act(x, (size_t)T * ldx), pp = put_raw(pos, sizeof pos), pf = put_raw(inv_freq, sizeof inv_freq);
    for (int inv = 0; inv <= 1; inv++) {
        cpu->rope(cpu, px.c, ldx, pp.c, pf.c, T, nh, D, rot, 1.1f, inv);
        gpu->rope(gpu, px.g, ldx, pp.g, pf.g, T, nh, D, rot, 1.1f, inv);
        double e = act_err(px, T, nh * D, ldx);
        CHECK(e < 1e-2, "rel err %g (inverse %d)", e, inv);
    }
    drop(px); drop(pp); drop(pf); free(x);
}

/* One attention case: documents of the given lengths packed back to back, then
 * `pad` tokens that belong to no document; q, k, v are slices of one fused qkv. */
/* Largest |x| of a (rows, cols) slice with leading dimension ld of activations
 * on backend be (NaN if any is NaN). */
static double act_max_abs(ct_backend *be, const void *x, size_t rows, size_t cols, size_t ld)
{
    size_t n = (rows - 1) * ld + cols;
    float *f = ct_malloc(n * sizeof(float));
    be->act_to_f32(be, f, x, n);
    double m = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < cols; j++) {
            double v = fabs((double)f[r * ld + j]);
            if (!(v <= m)) m = v; /* NaN sticks */
        }
    free(f);
    return m;
}

static void attention_case(const int *lens, int n_docs, int pad, int nq, int nkv, int D, int window,
                           int with_sinks)
{
    int32_t *cu = ct_malloc(sizeof(int32_t) * (n_docs + 1));
    int max_seqlen = 0;
    cu[0] = 0;
    for (int d = 0; d < n_docs; d++) {
        cu[d + 1] = cu[d] + lens[d];
        if (lens[d] > max_seqlen) max_seqlen = lens[d];
    }
    int T = cu[n_docs] + pad, ldqkv = (nq + 2 * nkv) * D, ldo = nq * D, ldkv = nkv * D;
    float scale = 1.0f / sqrtf((float)D), sinks[64];
    for (int h = 0; h < nq; h++) sinks[h] = 2.0f * (float)ct_rng_uniform(&rng) - 0.5f;
    float *qkv = rnd((size_t)T * ldqkv, 2.0f), *dout = rnd((size_t)T * ldo, 1.0f);
    pair pqkv = put_act(qkv, (size_t)T * ldqkv), pcu = put_raw(cu, sizeof(int32_t) * (n_docs + 1));
    pair ps = put_raw(sinks, sizeof sinks);
    pair po = put_act(dout, (size_t)T * ldo), plse = put_raw(dout, (size_t)T * nq * sizeof(float));
    const float *sc = with_sinks ? ps.c : NULL, *sg = with_sinks ? ps.g : NULL;
    size_t qo = 0, ko = (size_t)nq * D, vo = ko + (size_t)nkv * D;
    char *qc = pqkv.c, *qg = pqkv.g;
    size_t eb = cpu->act_bytes, gb = gpu->act_bytes;

    cpu->attention_fwd(cpu, po.c, ldo, plse.c, qc + qo * eb, ldqkv, qc + ko * eb, ldqkv, qc + vo * eb, ldqkv,
                       pcu.c, n_docs, max_seqlen, T, nq, nkv, D, scale, window, sc);
    gpu->attention_fwd(gpu, po.g, ldo, plse.g, qg + qo * gb, ldqkv, qg + ko * gb, ldqkv, qg + vo * gb, ldqkv,
                       pcu.g, n_docs, max_seqlen, T, nq, nkv, D, scale, window, sg);
    double eo = act_err(po, T, ldo, ldo), el = f32_err(plse, (size_t)T * nq);
    CHECK(eo < 2e-2, "out rel err %g (D %d, %s)", eo, D, attn_pass);
    CHECK(el < 1e-3, "lse rel err %g (D %d, %s)", el, D, attn_pass);

    /* Backward from identical inputs: the CPU's out (rounded to bf16) and lse. */
    float *o = ct_malloc((size_t)T * ldo * sizeof(float)), *lse = ct_malloc((size_t)T * nq * sizeof(float));
    cpu->act_to_f32(cpu, o, po.c, (size_t)T * ldo);
    for (size_t i = 0; i < (size_t)T * ldo; i++) o[i] = ct_bf16_to_f32(ct_f32_to_bf16(o[i]));
    cpu->download(cpu, lse, plse.c, (size_t)T * nq * sizeof(float));
    pair pout = put_act(o, (size_t)T * ldo);
    gpu->upload(gpu, plse.g, lse, (size_t)T * nq * sizeof(float));
    pair pdo = put_act(dout, (size_t)T * ldo), pd = put_act(qkv, (size_t)T * ldqkv); /* dq | dk | dv */
    char *dc = pd.c, *dg = pd.g;
    cpu->attention_bwd(cpu, dc + qo * eb, ldqkv, dc + ko * eb, ldqkv, dc + vo * eb, ldqkv, pdo.c, ldo, pout.c, ldo,
                       plse.c, qc + qo * eb, ldqkv, qc + ko * eb, ldqkv, qc + vo * eb, ldqkv, pcu.c, n_docs,
                       max_seqlen, T, nq, nkv, D, scale, window, sc);
    gpu->attention_bwd(gpu, dg + qo * gb, ldqkv, dg + ko * gb, ldqkv, dg + vo * gb, ldqkv, pdo.g, ldo, pout.g, ldo,
                       plse.g, qg + qo * gb, ldqkv, qg + ko * gb, ldqkv, qg + vo * gb, ldqkv, pcu.g, n_docs,
                       max_seqlen, T, nq, nkv, D, scale, window, sg);
    /* Compare dq, dk, dv one slice at a time: their scales differ. */
    const char *names[3] = {"dq", "dk", "dv"};
    size_t offs[3] = {qo, ko, vo}, widths[3] = {(size_t)nq * D, (size_t)ldkv, (size_t)ldkv};
    /* A window of one key without sinks: every probability is 1, so dq = dk = 0;
     * what both backends give is rounding (dP - delta summed in two orders),
     * held against dv's scale instead. */
    bool zero_qk = window == 1 && !with_sinks;
    double dv_scale = zero_qk ? act_max_abs(cpu, dc + vo * eb, T, ldkv, ldqkv) : 0;
    for (int s = 0; s < 3; s++) {
        pair slice = {dc + offs[s] * eb, dg + offs[s] * gb};
        if (zero_qk && s < 2) {
            double c = act_max_abs(cpu, slice.c, T, widths[s], ldqkv), g = act_max_abs(gpu, slice.g, T, widths[s], ldqkv);
            CHECK(c <= 1e-3 * dv_scale && g <= 1e-3 * dv_scale && dv_scale > 0, "%s: max |cpu| %g, max |gpu| %g, max |dv| %g (D %d, "
                  "%s)", names[s], c, g, dv_scale, D, attn_pass);
            continue;
        }
        double e = act_err(slice, T, widths[s], ldqkv);
        CHECK(e < 4e-2, "%s rel err %g (D %d, %s)", names[s], e, D, attn_pass);
    }
    drop(pout); drop(pdo); drop(pd);
    free(o); free(lse);
    drop(pqkv); drop(pcu); drop(ps); drop(po); drop(plse);
    free(qkv); free(dout); free(cu);
}

TEST(attention_one_token_and_odd_documents_mha_d64)
{
    NEED_GPU();
    int lens[] = {1, 127, 5, 64, 65, 1};
    attention_case(lens, 6, 3, 4, 4, 64, 0, 0);
}

TEST(attention_gqa4_d128_with_sinks)
{
    NEED_GPU();
    int lens[] = {127, 1, 200};
    attention_case(lens, 3, 0, 8, 2, 128, 0, 1);
}

TEST(attention_gqa8_d128_4097_token_document)
{
    NEED_GPU();
    int lens[] = {4097, 1};
    attention_case(lens, 2, 5, 8, 1, 128, 0, 0);
}

TEST(attention_sliding_window_with_sinks_gqa4_d64)
{
    NEED_GPU();
    int lens[] = {300, 1, 129, 4097};
    attention_case(lens, 4, 0, 4, 1, 64, 50, 1);
}

TEST(attention_window_longer_than_document_d32)
{
    NEED_GPU();
    int lens[] = {1, 33, 100};
    attention_case(lens, 3, 2, 4, 2, 32, 128, 0);
}

/* Window 1: each query sees only its own key, so every tile off the diagonal is
 * fully masked (a random parity case, mixtral head_dim 128, found a non-finite
 * k_proj gradient with it). */
TEST(attention_window_of_one_key_d128)
{
    NEED_GPU();
    int lens[] = {1, 2, 130, 300};
    attention_case(lens, 4, 3, 4, 2, 128, 1, 0);
}

TEST(attention_window_of_one_key_d64_and_d32)
{
    NEED_GPU();
    int lens[] = {77, 1, 200};
    attention_case(lens, 3, 0, 4, 1, 64, 1, 1);
    attention_case(lens, 3, 1, 2, 2, 32, 1, 0);
}

/* Tiles strictly inside the window take the mask-free path; tiles at the window's
 * lower edge and on the diagonal take the masked one. */
TEST(attention_window_with_interior_tiles_gqa2_d128)
{
    NEED_GPU();
    int lens[] = {1000, 77};
    attention_case(lens, 2, 4, 4, 2, 128, 300, 0);
}

TEST(attention_window_with_interior_tiles_gqa2_d64)
{
    NEED_GPU();
    int lens[] = {70, 1100};
    attention_case(lens, 2, 0, 4, 2, 64, 257, 1);
}

/* More than a thousand documents, mostly short, some empty, a few over several
 * tiles: the work list (one entry per 64-row tile, scanned 1024 documents at a
 * time) must map every tile to its document. */
TEST(attention_many_short_documents_gqa2_d128)
{
    NEED_GPU();
    enum { N = 1100 };
    int lens[N];
    for (int d = 0; d < N; d++)
        lens[d] = d % 37 == 5 ? 0 : d % 50 == 7 ? 64 + (int)ct_rng_below(&rng, 200) : 1 + (int)ct_rng_below(&rng, 24);
    attention_case(lens, N, 9, 2, 1, 128, 0, 1);
}

/* head_dim 256 (Qwen3.5 / Qwen3-Next full attention; mma.sync with 32-key steps
 * forward and in dq, the split dk/dv backward): 1-token documents and documents
 * either side of a 64-row tile and of a 32-key step, under 16 query heads on 4
 * kv heads, with padding rows. */
TEST(attention_gqa4_d256_short_and_tile_edge_documents)
{
    NEED_GPU();
    int lens[] = {1, 63, 64, 65, 1, 130, 31, 32};
    attention_case(lens, 8, 3, 16, 4, 256, 0, 0);
}

TEST(attention_gqa4_d256_1100_token_document)
{
    NEED_GPU();
    int lens[] = {1100, 1, 33};
    attention_case(lens, 3, 5, 8, 2, 256, 0, 0);
}

/* The Qwen models use neither, but every head_dim takes a window and sinks. */
TEST(attention_sliding_window_with_sinks_gqa4_d256)
{
    NEED_GPU();
    int lens[] = {300, 1, 129};
    attention_case(lens, 3, 2, 4, 1, 256, 50, 1);
}

TEST(attention_window_of_one_key_d256)
{
    NEED_GPU();
    int lens[] = {77, 1, 100};
    attention_case(lens, 3, 0, 4, 2, 256, 1, 0);
}

/* attention_decode (`ctune generate`) at head_dim 256 over a KV cache: a prompt
 * at once, a chunk after 150 positions, one token. */
TEST(attention_decode_gqa4_d256_matches_cpu)
{
    NEED_GPU();
    int T = 200, nq = 16, nkv = 4, D = 256, Q = nq * D, KV = nkv * D;
    float *q = rnd((size_t)T * Q, 1.0f), *k = rnd((size_t)T * KV, 1.0f), *v = rnd((size_t)T * KV, 1.0f);
    pair pk = put_act(k, (size_t)T * KV), pv = put_act(v, (size_t)T * KV);
    int n_pasts[] = {0, 150, T - 1};
    for (int i = 0; i < 3; i++) {
        int n_past = n_pasts[i], Tq = T - n_past;
        pair pq = put_act(q + (size_t)n_past * Q, (size_t)Tq * Q), po = put_act(q, (size_t)Tq * Q);
        cpu->attention_decode(cpu, po.c, Q, pq.c, Q, pk.c, KV, pv.c, KV, Tq, n_past, nq, nkv, D,
                              1.0f / sqrtf((float)D), 0, NULL);
        gpu->attention_decode(gpu, po.g, Q, pq.g, Q, pk.g, KV, pv.g, KV, Tq, n_past, nq, nkv, D,
                              1.0f / sqrtf((float)D), 0, NULL);
        double e = act_err(po, Tq, Q, Q);
        CHECK(e < 2e-2, "n_past %d: out rel err %g (%s)", n_past, e, attn_pass);
        drop(pq); drop(po);
    }
    drop(pk); drop(pv);
    free(q); free(k); free(v);
}

static void bwd_reproducible_case(int D)
{
    int T = 700, nq = 4, nkv = 2, ld = (nq + 2 * nkv) * D;
    int32_t cu[3] = {0, 300, 700};
    float *qkv = rnd((size_t)T * ld, 2.0f), *dout = rnd((size_t)T * nq * D, 1.0f);
    void *pq = gpu->alloc(gpu, (size_t)T * ld * 2), *po = gpu->alloc(gpu, (size_t)T * nq * D * 2);
    void *pdo = gpu->alloc(gpu, (size_t)T * nq * D * 2), *pcu = gpu->alloc(gpu, sizeof cu);
    void *plse = gpu->alloc(gpu, (size_t)T * nq * 4), *pd = gpu->alloc(gpu, (size_t)T * ld * 2);
    gpu->act_from_f32(gpu, pq, qkv, (size_t)T * ld);
    gpu->act_from_f32(gpu, pdo, dout, (size_t)T * nq * D);
    gpu->upload(gpu, pcu, cu, sizeof cu);
    char *q = pq, *d = pd;
    gpu->attention_fwd(gpu, po, nq * D, plse, q, ld, q + nq * D * 2, ld, q + (nq + nkv) * D * 2, ld, pcu, 2, 400,
                       T, nq, nkv, D, 0.125f, 0, NULL);
    uint16_t *a = ct_malloc((size_t)T * ld * 2), *b = ct_malloc((size_t)T * ld * 2);
    for (int run = 0; run < 2; run++) {
        gpu->attention_bwd(gpu, d, ld, d + nq * D * 2, ld, d + (nq + nkv) * D * 2, ld, pdo, nq * D, po, nq * D,
                           plse, q, ld, q + nq * D * 2, ld, q + (nq + nkv) * D * 2, ld, pcu, 2, 400, T, nq, nkv,
                           D, 0.125f, 0, NULL);
        gpu->download(gpu, run ? b : a, d, (size_t)T * ld * 2);
    }
    CHECK(memcmp(a, b, (size_t)T * ld * 2) == 0, "two identical backward passes differ (D %d, %s)", D,
          attn_pass);
    gpu->free(gpu, pq); gpu->free(gpu, po); gpu->free(gpu, pdo); gpu->free(gpu, pcu);
    gpu->free(gpu, plse); gpu->free(gpu, pd);
    free(qkv); free(dout); free(a); free(b);
}

TEST(attention_bwd_is_bit_reproducible)
{
    NEED_GPU();
    bwd_reproducible_case(64);
    bwd_reproducible_case(128);
    bwd_reproducible_case(256);
}

TEST(swiglu_fwd_bwd_match_cpu)
{
    NEED_GPU();
    int T = 20, I = 128;
    float *gu = rnd((size_t)T * 2 * I, 4.0f), *dh = rnd((size_t)T * I, 1.0f);
    pair pgu = put_act(gu, (size_t)T * 2 * I), pdh = put_act(dh, (size_t)T * I);
    pair ph = put_act(dh, (size_t)T * I), pdgu = put_act(gu, (size_t)T * 2 * I);
    cpu->swiglu_fwd(cpu, ph.c, pgu.c, T, I);
    gpu->swiglu_fwd(gpu, ph.g, pgu.g, T, I);
    double e = act_err(ph, T, I, I);
    CHECK(e < 1e-2, "h rel err %g", e);
    cpu->swiglu_bwd(cpu, pdgu.c, pdh.c, pgu.c, T, I);
    gpu->swiglu_bwd(gpu, pdgu.g, pdh.g, pgu.g, T, I);
    e = act_err(pdgu, T, 2 * I, 2 * I);
    CHECK(e < 1e-2, "dgu rel err %g", e);
    drop(pgu); drop(pdh); drop(ph); drop(pdgu); free(gu); free(dh);
}

TEST(add_and_copy_2d_match_cpu)
{
    NEED_GPU();
    size_t n = 1003; /* a tail that is not a multiple of 8 */
    float *x = rnd(n, 1.0f), *y = rnd(n, 1.0f);
    pair px = put_act(x, n), py = put_act(y, n);
    cpu->add(cpu, py.c, px.c, n);
    gpu->add(gpu, py.g, px.g, n);
    double e = act_err(py, 1, n, n);
    CHECK(e < 1e-2, "add rel err %g", e);
    int rows = 17, cols = 64, lds = 128, ldd = 96;
    float *s = rnd((size_t)rows * lds, 1.0f), *d = rnd((size_t)rows * ldd, 1.0f);
    pair ps = put_act(s, (size_t)rows * lds), pd = put_act(d, (size_t)rows * ldd);
    cpu->copy_2d(cpu, pd.c, ldd, ps.c, lds, rows, cols);
    gpu->copy_2d(gpu, pd.g, ldd, ps.g, lds, rows, cols);
    e = act_err(pd, rows, ldd, ldd); /* the columns past cols must be untouched too */
    CHECK(e == 0, "copy_2d rel err %g", e);
    drop(px); drop(py); drop(ps); drop(pd); free(x); free(y); free(s); free(d);
}

/* n target rows scattered over T; rows without a target keep their dx. */
static void cross_entropy_case(int T, int n, int H, int V)
{
    int32_t *rows = ct_malloc((size_t)n * 4), *tg = ct_malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) { /* increasing, distinct rows */
        rows[i] = (int32_t)((int64_t)i * T / n);
        tg[i] = (int32_t)ct_rng_below(&rng, V);
    }
    float *x = rnd((size_t)T * H, 1.0f), *W = rnd((size_t)V * H, 0.5f), *dx0 = rnd((size_t)T * H, 1.0f);
    float loss0 = 1.5f;
    pair px = put_act(x, (size_t)T * H), pW = put_weight(W, (size_t)V * H), pdx = put_act(dx0, (size_t)T * H);
    pair pr = put_raw(rows, (size_t)n * 4), pt = put_raw(tg, (size_t)n * 4), pl = put_raw(&loss0, 4);
    cpu->cross_entropy(cpu, pl.c, pdx.c, px.c, pW.c, pr.c, pt.c, n, H, V, 1.0f / n);
    gpu->cross_entropy(gpu, pl.g, pdx.g, px.g, pW.g, pr.g, pt.g, n, H, V, 1.0f / n);
    double el = f32_err(pl, 1), ed = act_err(pdx, T, H, H);
    CHECK(el < 1e-3, "loss rel err %g (V %d)", el, V);
    CHECK(ed < 2e-2, "dx rel err %g (V %d)", ed, V);
    cpu->cross_entropy(cpu, pl.c, NULL, px.c, pW.c, pr.c, pt.c, n, H, V, 1.0f);
    gpu->cross_entropy(gpu, pl.g, NULL, px.g, pW.g, pr.g, pt.g, n, H, V, 1.0f);
    el = f32_err(pl, 1);
    CHECK(el < 1e-3, "loss without dx rel err %g (V %d)", el, V);
    drop(px); drop(pW); drop(pdx); drop(pr); drop(pt); drop(pl);
    free(rows); free(tg); free(x); free(W); free(dx0);
}

TEST(cross_entropy_matches_cpu_in_one_chunk)
{
    NEED_GPU();
    cross_entropy_case(150, 100, 64, 1000); /* the cluster kernel, its last slice short */
    cross_entropy_case(40, 30, 64, 409604); /* a row's eighth past 200 KB: one block per row */
}

TEST(cross_entropy_matches_cpu_over_several_chunks)
{
    NEED_GPU();
    cross_entropy_case(600, 500, 64, 151936); /* ~384 rows per chunk at this vocab */
    cross_entropy_case(70000, 66000, 8, 256);  /* more rows than one launch's grid.y takes */
}

TEST(sum_squares_adds_to_out)
{
    NEED_GPU();
    size_t n = 1000007;
    float *g = rnd(n, 1.0f), two = 2.0f;
    pair pg = put_raw(g, n * 4), po = put_raw(&two, 4);
    cpu->sum_squares(cpu, po.c, pg.c, n);
    gpu->sum_squares(gpu, po.g, pg.g, n);
    double e = f32_err(po, 1);
    CHECK(e < 1e-5, "rel err %g", e);
    drop(pg); drop(po); free(g);
}

TEST(adamw_matches_cpu_with_and_without_clipping)
{
    NEED_GPU();
    size_t n = 10000;
    float norm_sq = 4.0f;
    for (int clip = 0; clip <= 1; clip++) {
        float *p = rnd(n, 1.0f), *g = rnd(n, 1.0f), *m = rnd(n, 0.1f), *v = rnd(n, 0.1f);
        for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
        pair pp = put_raw(p, n * 4), pg = put_raw(g, n * 4), pm = put_raw(m, n * 4), pv = put_raw(v, n * 4);
        pair pn = put_raw(&norm_sq, 4);
        float max_norm = clip ? 1.0f : 0.0f;
        cpu->adamw(cpu, pp.c, pg.c, pm.c, pv.c, n, pn.c, max_norm, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3);
        gpu->adamw(gpu, pp.g, pg.g, pm.g, pv.g, n, pn.g, max_norm, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3);
        double ep = f32_err(pp, n), em = f32_err(pm, n), ev = f32_err(pv, n);
        CHECK(ep < 1e-5 && em < 1e-5 && ev < 1e-5, "p %g m %g v %g (clip %d)", ep, em, ev, clip);
        drop(pp); drop(pg); drop(pm); drop(pv); drop(pn);
        free(p); free(g); free(m); free(v);
    }
}

/* Shapes the kernels do not cover are input errors at model load, not
 * assertions inside a launcher. */
TEST(unsupported_model_shapes_are_input_errors)
{
    NEED_GPU();
    ct_model_config c = {.hidden_size = 1024, .intermediate_size = 3072, .head_dim = 128,
                         .num_hidden_layers = 2, .num_attention_heads = 8, .num_key_value_heads = 2};
    ct_error err = {0};
    CHECK(gpu->check_model(gpu, &c, "m", &err) == CT_OK, "a llama-like shape refused: %s", err.msg);
    struct { const char *what; int hidden, inter, head_dim, experts, k, moe_i; } bad[] = {
        {"head_dim 96", 1024, 3072, 96, 0, 0, 0},
        {"hidden_size 1020", 1020, 3072, 128, 0, 0, 0},
        {"intermediate_size 3070", 1024, 3070, 128, 0, 0, 0},
        {"512 experts", 1024, 3072, 128, 512, 8, 768},
        {"moe_intermediate_size 770", 1024, 3072, 128, 64, 8, 770},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ct_model_config b = c;
        b.hidden_size = bad[i].hidden;
        b.intermediate_size = bad[i].inter;
        b.head_dim = bad[i].head_dim;
        b.num_experts = bad[i].experts;
        b.num_experts_per_tok = bad[i].k;
        b.moe_intermediate_size = bad[i].moe_i;
        err = (ct_error){0};
        int rc = gpu->check_model(gpu, &b, "m", &err);
        CHECK(rc == CT_ERR_INPUT && strstr(err.msg, "m/config.json") && strstr(err.msg, "device: cpu"),
              "%s: rc %d, '%s'", bad[i].what, rc, err.msg);
    }
}

/* Every attention test, on a backend created for pass i of ATTN_PASSES (gpu). */
static void run_attention_tests(size_t i)
{
    attn_pass = ATTN_PASSES[i].name;
    printf("# attention: %s\n", attn_pass);
    RUN(attention_one_token_and_odd_documents_mha_d64);
    RUN(attention_gqa4_d128_with_sinks);
    RUN(attention_gqa8_d128_4097_token_document);
    RUN(attention_sliding_window_with_sinks_gqa4_d64);
    RUN(attention_window_longer_than_document_d32);
    RUN(attention_window_of_one_key_d128);
    RUN(attention_window_of_one_key_d64_and_d32);
    RUN(attention_window_with_interior_tiles_gqa2_d128);
    RUN(attention_window_with_interior_tiles_gqa2_d64);
    RUN(attention_many_short_documents_gqa2_d128);
    RUN(attention_gqa4_d256_short_and_tile_edge_documents);
    RUN(attention_gqa4_d256_1100_token_document);
    RUN(attention_sliding_window_with_sinks_gqa4_d256);
    RUN(attention_window_of_one_key_d256);
    RUN(attention_decode_gqa4_d256_matches_cpu);
    RUN(attention_bwd_is_bit_reproducible);
}

int main(void)
{
    ct_error err = {0};
    cpu = backend_cpu_new();
    gpu = backend_cuda_new_with(&ATTN_PASSES[0].options, &err);
    if (!gpu) printf("# CUDA backend unavailable: %s\n", err.msg);
    ct_rng_seed(&rng, 20261129);
    RUN(embedding_copies_rows_exactly);
    RUN(rmsnorm_fwd_matches_cpu_on_strided_head_groups);
    RUN(rmsnorm_bwd_matches_cpu_with_and_without_residual);
    RUN(linear_fwd_with_bias_accumulates_into_a_slice);
    RUN(linear_bwd_input_matches_cpu);
    RUN(lora_fwd_bwd_match_cpu_without_dropout);
    RUN(lora_cols_stacked_modules_match_cpu_sequence);
    RUN(lora_dropout_mask_is_bit_identical_to_cpu);
    RUN(rope_matches_cpu_forward_and_inverse_on_partial_dims);
    run_attention_tests(0);
    RUN(swiglu_fwd_bwd_match_cpu);
    RUN(add_and_copy_2d_match_cpu);
    RUN(cross_entropy_matches_cpu_in_one_chunk);
    RUN(cross_entropy_matches_cpu_over_several_chunks);
    RUN(sum_squares_adds_to_out);
    RUN(adamw_matches_cpu_with_and_without_clipping);
    RUN(rmsnorm_zero_centred_fwd_bwd_match_cpu_rounding_once); /* last: the draws of the tests above stay as they were */
    RUN(unsupported_model_shapes_are_input_errors);
    if (gpu) gpu->destroy(gpu);
    for (size_t i = 1; i < sizeof ATTN_PASSES / sizeof *ATTN_PASSES; i++) {
        gpu = backend_cuda_new_with(&ATTN_PASSES[i].options, &err); /* the kernels are fixed at creation */
        run_attention_tests(i);
        if (gpu) gpu->destroy(gpu);
    }
    cpu->destroy(cpu);
    return check_summary();
}
