/* test_cuda_gdn.c — the Gated DeltaNet ops of the CUDA backend against the CPU
 * reference: the element- and row-wise ones (cuda/gdn/gdn_pointwise.cu: conv1d +
 * SiLU, gates, gated RMSNorm, sigmoid output gate) on packed documents of 1, 5,
 * 63, 64, 65 and 300 tokens, strided column slices and the aliasing the contracts
 * allow; the chunked delta rule (cuda/gdn/gdn_delta.cu) forward and backward on
 * documents of 1, 63, 64, 65 and more tokens up to a 16k-token one, 300 documents
 * of 1 to 3 tokens, GVA head
 * groups, strong and weak decays, padding rows past the last document (left
 * untouched) and bit-identical repeated backwards. All inputs bf16-representable.
 *
 * The delta rule's bounds: bf16 outputs (o, dq, dk, dv) 2e-2, the chunked form
 * regrouping the token loop's fp32 sums before one rounding; dg and dbeta (fp32)
 * 2e-3, sums over 64-token chunks of products whose terms cancel.
 *
 * Tolerances (normwise, check_max_norm_err; test_backend_cuda.c argues them):
 * bf16 outputs of elementwise math 1e-2, of short sums (the conv's W or W^2
 * terms, the norm backward's row sums) 2e-2; fp32 outputs (g, beta) 1e-5, the
 * two backends differing only in expf/log1pf rounding. Without a GPU every test
 * reports "skip NAME: skipped: no GPU". */
#include "backend.h"
#include "check.h"
#include "cuda_pair.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static const int DOCS[] = {1, 5, 63, 64, 65, 300};
#define N_DOCS (int)(sizeof DOCS / sizeof DOCS[0])

/* Positions restarting at 0 per document of DOCS; returns T. */
static int doc_positions(int32_t *pos)
{
    int t = 0;
    for (int d = 0; d < N_DOCS; d++)
        for (int i = 0; i < DOCS[d]; i++) pos[t++] = i;
    return t;
}

static void conv_case(int C, int ld, int W)
{
    int32_t pos[600];
    int T = doc_positions(pos);
    float *x = rnd((size_t)T * ld, 1.0f), *w = rnd((size_t)C * W, 0.5f), *dy = rnd((size_t)T * ld, 1.0f);
    pair px = put_act(x, (size_t)T * ld), pw = put_weight(w, (size_t)C * W), pdy = put_act(dy, (size_t)T * ld);
    pair pp = put_raw(pos, sizeof(int32_t) * T);
    pair py = put_act(x, (size_t)T * C), pdx = put_act(x, (size_t)T * C); /* any contents: overwritten */
    cpu->gdn_conv_fwd(cpu, py.c, C, px.c, ld, pw.c, pp.c, T, C, W);
    gpu->gdn_conv_fwd(gpu, py.g, C, px.g, ld, pw.g, pp.g, T, C, W);
    double ey = act_err(py, T, C, C);
    cpu->gdn_conv_bwd(cpu, pdx.c, C, pdy.c, ld, px.c, ld, pw.c, pp.c, T, C, W);
    gpu->gdn_conv_bwd(gpu, pdx.g, C, pdy.g, ld, px.g, ld, pw.g, pp.g, T, C, W);
    double edx = act_err(pdx, T, C, C);
    CHECK(ey <= 1e-2, "conv fwd (C %d, W %d): rel err %g", C, W, ey);
    CHECK(edx <= 2e-2, "conv bwd (C %d, W %d): rel err %g", C, W, edx);
    drop(px); drop(pw); drop(pdy); drop(pp); drop(py); drop(pdx);
    free(x); free(w); free(dy);
}

TEST(conv_fwd_bwd_match_cpu_over_documents)
{
    NEED_GPU();
    conv_case(96, 160, 4);  /* the qkv slice of a wider fused projection */
    conv_case(40, 40, 2);
    conv_case(8, 24, 1);
}

TEST(gates_fwd_bwd_match_cpu)
{
    NEED_GPU();
    int T = 333, Hv = 12, ld = 2 * Hv + 8;
    float *ab = rnd((size_t)T * ld, 6.0f), A_log[12], dt[12];
    for (int h = 0; h < Hv; h++) {
        A_log[h] = logf(0.01f + 16.0f * (float)ct_rng_uniform(&rng));
        dt[h] = (float)ct_rng_uniform(&rng) * 2.0f - 1.0f;
    }
    ab[5] = 30.0f; /* softplus past its threshold */
    float *dgb = rnd((size_t)2 * T * Hv, 1.0f);
    pair pab = put_act(ab, (size_t)T * ld), pA = put_raw(A_log, sizeof A_log), pdt = put_raw(dt, sizeof dt);
    pair pg = put_raw(dgb, sizeof(float) * T * Hv), pb = put_raw(dgb, sizeof(float) * T * Hv);
    pair pdg = put_raw(dgb, sizeof(float) * T * Hv), pdb = put_raw(dgb + (size_t)T * Hv, sizeof(float) * T * Hv);
    pair pd = put_act(ab, (size_t)T * ld);
    void *ac = pab.c, *bc = (char *)pab.c + Hv * cpu->act_bytes, *ag = pab.g, *bg = (char *)pab.g + Hv * gpu->act_bytes;
    cpu->gdn_gates_fwd(cpu, pg.c, pb.c, ac, ld, bc, ld, pA.c, pdt.c, T, Hv);
    gpu->gdn_gates_fwd(gpu, pg.g, pb.g, ag, ld, bg, ld, pA.g, pdt.g, T, Hv);
    double eg = f32_err(pg, (size_t)T * Hv), eb = f32_err(pb, (size_t)T * Hv);
    void *dac = pd.c, *dbc = (char *)pd.c + Hv * cpu->act_bytes, *dag = pd.g, *dbg = (char *)pd.g + Hv * gpu->act_bytes;
    cpu->gdn_gates_bwd(cpu, dac, ld, dbc, ld, pdg.c, pdb.c, ac, ld, bc, ld, pA.c, pdt.c, T, Hv);
    gpu->gdn_gates_bwd(gpu, dag, ld, dbg, ld, pdg.g, pdb.g, ag, ld, bg, ld, pA.g, pdt.g, T, Hv);
    double ed = act_err(pd, T, 2 * Hv, ld);
    CHECK(eg <= 1e-5 && eb <= 1e-5, "gates fwd: g rel err %g, beta %g", eg, eb);
    CHECK(ed <= 1e-2, "gates bwd: da|db rel err %g", ed);
    drop(pab); drop(pA); drop(pdt); drop(pg); drop(pb); drop(pdg); drop(pdb); drop(pd);
    free(ab); free(dgb);
}

static void gated_norm_case(int T, int nh, int D, int ld)
{
    float *x = rnd((size_t)T * ld, 2.0f), *z = rnd((size_t)T * ld, 3.0f), *w = rnd((size_t)D, 1.5f);
    float *dy = rnd((size_t)T * ld, 1.0f);
    pair px = put_act(x, (size_t)T * ld), pz = put_act(z, (size_t)T * ld), pw = put_weight(w, D);
    pair pdy = put_act(dy, (size_t)T * ld), py = put_act(x, (size_t)T * nh * D);
    pair pdx = put_act(x, (size_t)T * nh * D), pdz = put_act(x, (size_t)T * nh * D);
    int W = nh * D;
    cpu->gated_rmsnorm_fwd(cpu, py.c, W, px.c, ld, pz.c, ld, pw.c, T, nh, D, 1e-6f);
    gpu->gated_rmsnorm_fwd(gpu, py.g, W, px.g, ld, pz.g, ld, pw.g, T, nh, D, 1e-6f);
    double ey = act_err(py, T, W, W);
    cpu->gated_rmsnorm_bwd(cpu, pdx.c, W, pdz.c, W, pdy.c, ld, px.c, ld, pz.c, ld, pw.c, T, nh, D, 1e-6f);
    gpu->gated_rmsnorm_bwd(gpu, pdx.g, W, pdz.g, W, pdy.g, ld, px.g, ld, pz.g, ld, pw.g, T, nh, D, 1e-6f);
    double edx = act_err(pdx, T, W, W), edz = act_err(pdz, T, W, W);
    CHECK(ey <= 1e-2, "gated norm fwd (D %d): rel err %g", D, ey);
    CHECK(edx <= 2e-2 && edz <= 2e-2, "gated norm bwd (D %d): dx rel err %g, dz %g", D, edx, edz);
    /* in place, y over x: the same bits */
    gpu->gated_rmsnorm_fwd(gpu, px.g, ld, px.g, ld, pz.g, ld, pw.g, T, nh, D, 1e-6f);
    float *a = ct_malloc(sizeof(float) * T * ld), *b = ct_malloc(sizeof(float) * T * W);
    gpu->act_to_f32(gpu, a, px.g, (size_t)T * ld);
    gpu->act_to_f32(gpu, b, py.g, (size_t)T * W);
    int same = 1;
    for (int t = 0; t < T && same; t++)
        for (int i = 0; i < W; i++) same &= a[(size_t)t * ld + i] == b[(size_t)t * W + i];
    CHECK(same, "gated norm in place differs from out of place (D %d)", D);
    free(a); free(b);
    drop(px); drop(pz); drop(pw); drop(pdy); drop(py); drop(pdx); drop(pdz);
    free(x); free(z); free(w); free(dy);
}

TEST(gated_rmsnorm_fwd_bwd_match_cpu)
{
    NEED_GPU();
    gated_norm_case(77, 4, 128, 4 * 128 + 64);
    gated_norm_case(40, 3, 64, 3 * 64);
    gated_norm_case(9, 2, 32, 2 * 32 + 8);
}

static void sigmoid_gate_case(int T, int nh, int D, int hsg)
{
    int lx = nh * D, lg = nh * hsg + 16;
    float *x = rnd((size_t)T * lx, 2.0f), *gate = rnd((size_t)T * lg, 4.0f), *dy = rnd((size_t)T * lx, 1.0f);
    pair px = put_act(x, (size_t)T * lx), pgate = put_act(gate, (size_t)T * lg), py = put_act(x, (size_t)T * lx);
    pair pd = put_act(dy, (size_t)T * lx), pdg = put_act(gate, (size_t)T * lg);
    cpu->sigmoid_gate_fwd(cpu, py.c, lx, px.c, lx, pgate.c, lg, hsg, T, nh, D);
    gpu->sigmoid_gate_fwd(gpu, py.g, lx, px.g, lx, pgate.g, lg, hsg, T, nh, D);
    double ey = act_err(py, T, lx, lx);
    /* dx over dy, as the graph calls it */
    cpu->sigmoid_gate_bwd(cpu, pd.c, lx, pdg.c, lg, pd.c, lx, px.c, lx, pgate.c, lg, hsg, T, nh, D);
    gpu->sigmoid_gate_bwd(gpu, pd.g, lx, pdg.g, lg, pd.g, lx, px.g, lx, pgate.g, lg, hsg, T, nh, D);
    double edx = act_err(pd, T, lx, lx), edg = act_err(pdg, T, lg, lg);
    CHECK(ey <= 1e-2, "sigmoid gate fwd (hsg %d): rel err %g", hsg, ey);
    CHECK(edx <= 1e-2 && edg <= 1e-2, "sigmoid gate bwd (hsg %d): dx rel err %g, dgate %g", hsg, edx, edg);
    drop(px); drop(pgate); drop(py); drop(pd); drop(pdg);
    free(x); free(gate); free(dy);
}

TEST(sigmoid_gate_fwd_bwd_match_cpu_interleaved_and_contiguous)
{
    NEED_GPU();
    sigmoid_gate_case(45, 4, 64, 128); /* HF's q_proj: [query | gate] per head */
    sigmoid_gate_case(31, 3, 256, 256); /* ctune's permuted layout: gates contiguous */
}

/* q, k, v as one (T, 2 Hk Dk + Hv Dv) buffer (the conv's output layout), documents
 * lens[0..n) packed from row 0, pad rows after them; g in [gmin, -0.001]. */
static void delta_case(const int *lens, int n, int pad, int Hk, int Hv, int Dk, int Dv, float gmin)
{
    int32_t *cu = ct_malloc(sizeof(int32_t) * (n + 1));
    cu[0] = 0;
    for (int d = 0; d < n; d++) cu[d + 1] = cu[d] + lens[d];
    int T = cu[n] + pad, ld = 2 * Hk * Dk + Hv * Dv, lo = Hv * Dv;
    size_t nq = (size_t)T * ld, ng = (size_t)T * Hv, no = (size_t)T * lo;
    float *qkv = rnd(nq, 1.0f), *dout = rnd(no, 1.0f), *g = ct_malloc(ng * sizeof(float)), *beta = ct_malloc(ng * sizeof(float));
    for (size_t i = 0; i < ng; i++) {
        g[i] = gmin + (-0.001f - gmin) * (float)ct_rng_uniform(&rng);
        beta[i] = 0.02f + 0.96f * (float)ct_rng_uniform(&rng);
    }
    pair pq = put_act(qkv, nq), pdo = put_act(dout, no), pg = put_raw(g, ng * sizeof(float));
    pair pb = put_raw(beta, ng * sizeof(float)), pcu = put_raw(cu, sizeof(int32_t) * (n + 1));
    pair po = put_act(dout, no), pd = put_act(qkv, nq); /* any contents: pad rows must keep them */
    pair pdg = put_raw(g, ng * sizeof(float)), pdb = put_raw(beta, ng * sizeof(float));
    size_t eb[2] = {cpu->act_bytes, gpu->act_bytes};
    void *qc[3], *qg[3], *dc[3], *dgp[3];
    for (int i = 0; i < 3; i++) {
        size_t off = (size_t)i * Hk * Dk;
        qc[i] = (char *)pq.c + off * eb[0]; qg[i] = (char *)pq.g + off * eb[1];
        dc[i] = (char *)pd.c + off * eb[0]; dgp[i] = (char *)pd.g + off * eb[1];
    }
    float scale = 1.0f / sqrtf((float)Dk);
    cpu->gdn_delta_fwd(cpu, po.c, lo, qc[0], ld, qc[1], ld, qc[2], ld, pg.c, pb.c, pcu.c, n, T, Hk, Hv, Dk, Dv, scale);
    gpu->gdn_delta_fwd(gpu, po.g, lo, qg[0], ld, qg[1], ld, qg[2], ld, pg.g, pb.g, pcu.g, n, T, Hk, Hv, Dk, Dv, scale);
    double eo = act_err(po, T, lo, lo);
    cpu->gdn_delta_bwd(cpu, dc[0], ld, dc[1], ld, dc[2], ld, pdg.c, pdb.c, pdo.c, lo, qc[0], ld, qc[1], ld, qc[2], ld,
                       pg.c, pb.c, pcu.c, n, T, Hk, Hv, Dk, Dv, scale);
    gpu->gdn_delta_bwd(gpu, dgp[0], ld, dgp[1], ld, dgp[2], ld, pdg.g, pdb.g, pdo.g, lo, qg[0], ld, qg[1], ld, qg[2], ld,
                       pg.g, pb.g, pcu.g, n, T, Hk, Hv, Dk, Dv, scale);
    double eq = act_err((pair){dc[0], dgp[0]}, T, (size_t)Hk * Dk, ld);
    double ek = act_err((pair){dc[1], dgp[1]}, T, (size_t)Hk * Dk, ld);
    double ev = act_err((pair){dc[2], dgp[2]}, T, (size_t)Hv * Dv, ld);
    double eg = f32_err(pdg, ng), ebt = f32_err(pdb, ng);
    /* A second backward gives the same bits. */
    size_t bytes = nq * gpu->act_bytes;
    char *first = ct_malloc(bytes), *again = ct_malloc(bytes);
    gpu->download(gpu, first, pd.g, bytes);
    gpu->gdn_delta_bwd(gpu, dgp[0], ld, dgp[1], ld, dgp[2], ld, pdg.g, pdb.g, pdo.g, lo, qg[0], ld, qg[1], ld, qg[2], ld,
                       pg.g, pb.g, pcu.g, n, T, Hk, Hv, Dk, Dv, scale);
    gpu->download(gpu, again, pd.g, bytes);
    bool same = memcmp(first, again, bytes) == 0;
    printf("  delta rule T %d, heads %d/%d x %d/%d, gmin %g: o %.1e, dq %.1e, dk %.1e, dv %.1e, dg %.1e, dbeta %.1e\n",
           T, Hk, Hv, Dk, Dv, gmin, eo, eq, ek, ev, eg, ebt);
    CHECK(eo <= 2e-2, "delta fwd (T %d, Hk %d Hv %d, Dk %d Dv %d, gmin %g): rel err %g", T, Hk, Hv, Dk, Dv, gmin, eo);
    CHECK(eq <= 2e-2 && ek <= 2e-2 && ev <= 2e-2, "delta bwd dq/dk/dv (T %d, Dk %d Dv %d, gmin %g): %g %g %g", T, Dk,
          Dv, gmin, eq, ek, ev);
    CHECK(eg <= 2e-3 && ebt <= 2e-3, "delta bwd dg/dbeta (T %d, Dk %d Dv %d, gmin %g): %g %g", T, Dk, Dv, gmin, eg, ebt);
    CHECK(same, "delta bwd (T %d): a second run differs", T);
    free(first); free(again);
    drop(pq); drop(pdo); drop(pg); drop(pb); drop(pcu); drop(po); drop(pd); drop(pdg); drop(pdb);
    free(qkv); free(dout); free(g); free(beta); free(cu);
}

TEST(delta_rule_fwd_bwd_match_cpu_over_documents)
{
    NEED_GPU();
    const int docs[] = {1, 63, 64, 65, 130, 7};
    delta_case(docs, 6, 5, 2, 4, 32, 32, -1.0f);    /* the tiny models' shape */
    delta_case(docs, 6, 0, 2, 4, 32, 32, -30.0f);   /* decays that underflow inside a chunk */
    delta_case(docs, 4, 3, 1, 3, 64, 96, -2.0f);
    const int big[] = {65, 1, 200};
    delta_case(big, 3, 2, 2, 4, 128, 128, -0.5f);   /* Qwen3.5's head dims */
    int tiny[300];                                  /* chunks with no stored state at all */
    for (int d = 0; d < 300; d++) tiny[d] = 1 + d % 3;
    delta_case(tiny, 300, 4, 2, 4, 32, 32, -1.0f);
}

TEST(delta_rule_fwd_bwd_match_cpu_on_a_16k_document)
{
    NEED_GPU();
    const int docs[] = {16384};
    delta_case(docs, 1, 0, 1, 2, 128, 128, -0.2f);
}

int main(void)
{
    ct_error err = {0};
    cpu = backend_cpu_new();
    gpu = backend_cuda_new(&err);
    ct_rng_seed(&rng, 25);
    RUN(conv_fwd_bwd_match_cpu_over_documents);
    RUN(gates_fwd_bwd_match_cpu);
    RUN(gated_rmsnorm_fwd_bwd_match_cpu);
    RUN(sigmoid_gate_fwd_bwd_match_cpu_interleaved_and_contiguous);
    RUN(delta_rule_fwd_bwd_match_cpu_over_documents);
    RUN(delta_rule_fwd_bwd_match_cpu_on_a_16k_document);
    if (gpu) gpu->destroy(gpu);
    cpu->destroy(cpu);
    return check_summary();
}
