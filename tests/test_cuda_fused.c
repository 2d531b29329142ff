/* test_cuda_fused.c — the CUDA kernels that fuse a memory-bound step into its
 * neighbour, against the CPU backend: RMSNorm + RoPE (Qwen3's q/k path, forward
 * and backward, in and out of place, the fallback for partial rotary) and the
 * linear layer whose GEMM epilogue adds the residual stream. Tolerances as in
 * test_backend_cuda.c (normwise): elementwise 1e-2, GEMM-based and RMSNorm
 * backward 2e-2, rstd (fp32) 1e-3. The zero-centred q/k norm (Qwen3.5: scale
 * 1 + w in fp32) must moreover round once where the kernel is fused: at most
 * 1.01 half bf16 ulps from the CPU (act_err_half_ulps; test_backend_cuda.c's
 * ONE_ROUNDING). Without a GPU each test reports "skipped: no GPU". */
#include "backend.h"
#include "check.h"
#include "cuda_pair.h"

#include <math.h>
#include <string.h>

/* Token positions: small, and large enough that sincos needs its slow range
 * reduction (pos * inv_freq up to ~2e5 radians). */
static void rope_inputs(int32_t *pos, float *inv_freq, int T, int rot)
{
    for (int i = 0; i < rot / 2; i++) inv_freq[i] = powf(1000000.0f, -2.0f * i / rot);
    for (int t = 0; t < T; t++) pos[t] = t < T / 2 ? t : (int32_t)ct_rng_below(&rng, 200000);
}

/* nh heads of D at token stride ld (a column slice of a fused qkv row), rotary
 * over rot of D dims; in_place runs the op on its own input; zc zero-centred
 * (w the offsets of the scale 1 + w). */
static void norm_rope_case(int T, int nh, int D, int rot, int ld, int in_place, int zc)
{
    size_t n = (size_t)T * ld;
    float *x = rnd(n, 2.0f), *w = rnd(D, zc ? 0.5f : 1.5f), *dy = rnd(n, 1.0f), *y0 = rnd(n, 1.0f);
    int32_t *pos = ct_malloc((size_t)T * sizeof(int32_t));
    float *inv_freq = ct_malloc((size_t)rot / 2 * sizeof(float) + 4);
    rope_inputs(pos, inv_freq, T, rot);
    pair px = put_act(x, n), pw = put_weight(w, D), py = put_act(in_place ? x : y0, n);
    pair pdy = put_act(dy, n), pdx = put_act(y0, n);
    pair pp = put_raw(pos, (size_t)T * sizeof(int32_t)), pf = put_raw(inv_freq, (size_t)rot / 2 * sizeof(float));
    pair rs = put_raw(x, (size_t)T * nh * sizeof(float));
    float sc = 1.1f, eps = 1e-6f;
    bool one_rounding = zc && rot == D; /* the fused kernel; partial rotary rounds between norm and rope */

    cpu->rmsnorm_rope_fwd(cpu, py.c, ld, rs.c, in_place ? py.c : px.c, ld, pw.c, zc, pp.c, pf.c, T, nh, D, rot, eps,
                          sc);
    gpu->rmsnorm_rope_fwd(gpu, py.g, ld, rs.g, in_place ? py.g : px.g, ld, pw.g, zc, pp.g, pf.g, T, nh, D, rot, eps,
                          sc);
    double ey = act_err(py, T, (size_t)nh * D, ld), er = f32_err(rs, (size_t)T * nh);
    CHECK(ey < 1e-2, "forward rel err %g (T %d nh %d D %d rot %d in place %d zero-centred %d)", ey, T, nh, D, rot,
          in_place, zc);
    CHECK(er < 1e-3, "rstd rel err %g", er);
    if (one_rounding) {
        double u = act_err_half_ulps(py, T, (size_t)nh * D, ld);
        CHECK(u <= 1.01, "zero-centred forward is %g half bf16 ulps off the CPU (one rounding: <= 1; D %d)", u, D);
    }

    /* Backward from the CPU's rstd on both sides. */
    float *r = ct_malloc((size_t)T * nh * sizeof(float));
    cpu->download(cpu, r, rs.c, (size_t)T * nh * sizeof(float));
    gpu->upload(gpu, rs.g, r, (size_t)T * nh * sizeof(float));
    pair out = in_place ? pdy : pdx;
    cpu->rmsnorm_rope_bwd(cpu, out.c, ld, pdy.c, ld, px.c, ld, rs.c, pw.c, zc, pp.c, pf.c, T, nh, D, rot, sc);
    gpu->rmsnorm_rope_bwd(gpu, out.g, ld, pdy.g, ld, px.g, ld, rs.g, pw.g, zc, pp.g, pf.g, T, nh, D, rot, sc);
    double ed = act_err(out, T, (size_t)nh * D, ld);
    CHECK(ed < 2e-2, "backward rel err %g (T %d nh %d D %d rot %d in place %d zero-centred %d)", ed, T, nh, D, rot,
          in_place, zc);
    if (one_rounding) {
        double u = act_err_half_ulps(out, T, (size_t)nh * D, ld);
        CHECK(u <= 1.01, "zero-centred backward is %g half bf16 ulps off the CPU (one rounding: <= 1; D %d)", u, D);
    }
    if (!in_place && ld > nh * D) { /* columns past the heads untouched */
        double ec = act_err((pair){(char *)pdx.c + (size_t)nh * D * cpu->act_bytes,
                                   (char *)pdx.g + (size_t)nh * D * gpu->act_bytes},
                            T, (size_t)(ld - nh * D), ld);
        CHECK(ec == 0, "columns past the heads changed (rel err %g)", ec);
    }
    drop(px); drop(pw); drop(py); drop(pdy); drop(pdx); drop(pp); drop(pf); drop(rs);
    free(x); free(w); free(dy); free(y0); free(pos); free(inv_freq); free(r);
}

TEST(rmsnorm_rope_matches_cpu_d128_gqa_slices)
{
    NEED_GPU();
    norm_rope_case(257, 16, 128, 128, (16 + 2 * 8) * 128, 0, 0); /* qwen3-0.6b q heads in qkv */
    norm_rope_case(257, 8, 128, 128, (16 + 2 * 8) * 128, 0, 0);  /* its k heads */
    norm_rope_case(33, 3, 128, 128, 3 * 128, 1, 0);              /* odd head count: a half-empty pass */
}

TEST(rmsnorm_rope_matches_cpu_d64_d32_d256_in_place)
{
    NEED_GPU();
    norm_rope_case(100, 5, 64, 64, 5 * 64 + 64, 1, 0);
    norm_rope_case(100, 7, 32, 32, 7 * 32, 0, 0);
    norm_rope_case(40, 2, 256, 256, 2 * 256 + 8, 1, 0);
}

TEST(rmsnorm_rope_partial_rotary_takes_the_unfused_path)
{
    NEED_GPU();
    norm_rope_case(77, 4, 64, 32, 4 * 64 + 64, 0, 0);
    norm_rope_case(77, 4, 64, 32, 4 * 64, 1, 0);
}

/* Qwen3.5's gated attention: q heads of D 256 inside [q | gate | k | v] (qwen3.5-9b:
 * 16 q, 4 kv heads), its k heads, in place, a D 128 case, and partial rotary (the
 * real models rotate 64 of 256 dims: the unfused path, two roundings). */
TEST(rmsnorm_rope_zero_centred_matches_cpu_fused_and_partial)
{
    NEED_GPU();
    const int ld = (2 * 4 + 2 * 1) * 256; /* a tiny qwen3_5: 4 q heads (+ gates), 1 kv head */
    norm_rope_case(97, 4, 256, 256, ld, 0, 1);
    norm_rope_case(97, 1, 256, 256, ld, 0, 1);
    norm_rope_case(65, 3, 128, 128, 3 * 128, 1, 1);
    norm_rope_case(77, 4, 256, 64, ld, 0, 1);
    norm_rope_case(77, 4, 256, 64, 4 * 256, 1, 1);
}

TEST(linear_fwd_residual_matches_cpu_with_and_without_bias)
{
    NEED_GPU();
    int T = 300, in = 512, out = 256, ldx = in + 64, ldy = out + 64;
    for (int with_bias = 0; with_bias <= 1; with_bias++) {
        float *x = rnd((size_t)T * ldx, 1.0f), *W = rnd((size_t)out * in, 0.1f), *b = rnd(out, 0.5f);
        float *res = rnd((size_t)T * ldy, 2.0f), *y0 = rnd((size_t)T * ldy, 1.0f);
        pair px = put_act(x, (size_t)T * ldx), pW = put_weight(W, (size_t)out * in), pb = put_weight(b, out);
        pair pres = put_act(res, (size_t)T * ldy), py = put_act(y0, (size_t)T * ldy);
        const void *bc = with_bias ? pb.c : NULL, *bg = with_bias ? pb.g : NULL;
        cpu->linear_fwd_residual(cpu, py.c, ldy, pres.c, px.c, ldx, pW.c, bc, T, in, out);
        gpu->linear_fwd_residual(gpu, py.g, ldy, pres.g, px.g, ldx, pW.g, bg, T, in, out);
        double e = act_err(py, T, out, ldy);
        CHECK(e < 2e-2, "y rel err %g (bias %d)", e, with_bias);
        /* The residual is an input only. */
        double er = act_err(pres, T, out, ldy);
        CHECK(er == 0, "residual changed (rel err %g)", er);
        drop(px); drop(pW); drop(pb); drop(pres); drop(py);
        free(x); free(W); free(b); free(res); free(y0);
    }
}

int main(void)
{
    ct_error err = {0};
    cpu = backend_cpu_new();
    gpu = backend_cuda_new(&err);
    if (!gpu) printf("# CUDA backend unavailable: %s\n", err.msg);
    ct_rng_seed(&rng, 20261130);
    RUN(rmsnorm_rope_matches_cpu_d128_gqa_slices);
    RUN(rmsnorm_rope_matches_cpu_d64_d32_d256_in_place);
    RUN(rmsnorm_rope_partial_rotary_takes_the_unfused_path);
    RUN(linear_fwd_residual_matches_cpu_with_and_without_bias);
    RUN(rmsnorm_rope_zero_centred_matches_cpu_fused_and_partial); /* last: earlier tests keep their draws */
    if (gpu) gpu->destroy(gpu);
    cpu->destroy(cpu);
    return check_summary();
}
