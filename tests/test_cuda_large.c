/* test_cuda_large.c — the CUDA ops on tensors past 2^31 elements: a 512k-token
 * sequence on the llama3.1-8b shape (fused qkv rows of 6144 elements, hidden
 * 4096), where a row index times a stride computed in 32-bit int would wrap.
 *
 * Each test allocates the full-size GPU tensors, fills them on the device (rows
 * of a small random table copied by the embedding op, so gigabytes cost no host
 * time), then overwrites the FIRST and the LAST rows with fresh random values.
 * The op runs over all T rows on the GPU; the CPU backend runs it on just those
 * rows (positions, cu_seqlens and row indices shifted to the slice), and the two
 * are compared. The last rows are those whose offsets pass 2^31 elements: a
 * wrapped offset reads or writes other rows (holding other values) and fails
 * the comparison, or faults. Ops that reduce over all rows (LoRA's dA, dB) get a
 * dy that is zero outside the checked rows, so the slices hold every term.
 *
 * Tolerances are those of test_backend_cuda.c (normwise, max|gpu - cpu| /
 * max|cpu|; NaN never passes): copies exact; elementwise 1e-2; GEMM-based and
 * rmsnorm bwd 2e-2; attention out 2e-2, dq/dk/dv 4e-2; fp32 results 1e-3.
 * GPU memory peaks near 26 GB (attention: four (T, 6144) bf16 tensors; LoRA:
 * three plus its (T, 4096) dropout scratch). Without a GPU every test reports
 * "skip NAME: skipped: no GPU". */
#include "backend.h"
#include "check.h"
#include "cuda_pair.h"

#include <math.h>
#include <stdint.h>

enum {
    LD = 6144,          /* the fused qkv row of llama3.1-8b: (32 + 2*8) heads of 128 */
    T_BIG = 524288,     /* one 512k-token sequence: (T-1) * LD > 2^31 */
    T_BIG4K = 557056,   /* rows of 4096 past 2^31 elements: 524288 + 32768 */
    EDGE = 64,          /* rows checked at each end */
    PATTERN_N = 1 << 22 /* bf16 values of the fill table */
};

static uint16_t *pattern; /* PATTERN_N random bf16 bit patterns in [-1, 1] */

static void *cpu_raw(const void *h, size_t bytes)
{
    void *p = cpu->alloc(cpu, bytes);
    cpu->upload(cpu, p, h, bytes);
    return p;
}

/* A GPU act tensor of n elements (zero-filled), or NULL when out of memory. */
static void *gpu_act(size_t n) { return gpu->alloc(gpu, n * gpu->act_bytes); }

/* Element e of a GPU act tensor / a CPU act tensor, as a byte address. */
static void *gat(void *g, size_t e) { return (char *)g + e * gpu->act_bytes; }
static void *cat(void *c, size_t e) { return (char *)c + e * cpu->act_bytes; }

/* Fills `rows` rows of W act elements on the GPU with rows of the random table,
 * picked at random: the embedding op (exact copies, checked on its own below). */
static void gpu_fill(void *p, size_t rows, int W)
{
    int P = PATTERN_N / W;
    int32_t *ids = ct_malloc(rows * sizeof(int32_t));
    for (size_t r = 0; r < rows; r++) ids[r] = (int32_t)ct_rng_below(&rng, (uint64_t)P);
    void *tab = gpu->alloc(gpu, (size_t)P * W * gpu->weight_bytes);
    void *gid = gpu->alloc(gpu, rows * sizeof(int32_t));
    gpu->upload_weight(gpu, tab, pattern, CT_DTYPE_BF16, (size_t)P * W);
    gpu->upload(gpu, gid, ids, rows * sizeof(int32_t));
    gpu->embedding(gpu, p, gid, tab, (int)rows, W);
    gpu->free(gpu, tab);
    gpu->free(gpu, gid);
    free(ids);
}

/* Rows [r0, r0 + n) of a GPU act tensor with row stride ld get fresh random
 * values in [-a, a]; returns a CPU act tensor (n, ld) holding the same values. */
static void *put_rows(void *g, size_t ld, size_t r0, int n, float a)
{
    size_t m = (size_t)n * ld;
    float *h = rnd(m, a);
    gpu->act_from_f32(gpu, gat(g, r0 * ld), h, m);
    void *c = cpu->alloc(cpu, m * cpu->act_bytes);
    cpu->act_from_f32(cpu, c, h, m);
    free(h);
    return c;
}

/* Columns [c0, c0 + cols) of n rows (stride ld) of host floats, packed (n, cols). */
static float *pick(const float *all, int n, size_t ld, size_t c0, size_t cols)
{
    float *out = ct_malloc((size_t)n * cols * sizeof(float) + 4);
    for (int r = 0; r < n; r++)
        for (size_t j = 0; j < cols; j++) out[(size_t)r * cols + j] = all[(size_t)r * ld + c0 + j];
    return out;
}

/* Columns [c0, c0 + cols) of rows [r0, r0 + n) of a GPU act tensor (caller frees). */
static float *gpu_rows(void *g, size_t ld, size_t r0, int n, size_t c0, size_t cols)
{
    size_t m = (size_t)n * ld;
    float *all = ct_malloc(m * sizeof(float));
    gpu->act_to_f32(gpu, all, gat(g, r0 * ld), m);
    float *out = pick(all, n, ld, c0, cols);
    free(all);
    return out;
}

/* The same of rows [0, n) of a CPU act tensor. */
static float *cpu_rows(void *c, size_t ld, int n, size_t c0, size_t cols)
{
    size_t m = (size_t)n * ld;
    float *all = ct_malloc(m * sizeof(float));
    cpu->act_to_f32(cpu, all, c, m);
    float *out = pick(all, n, ld, c0, cols);
    free(all);
    return out;
}

/* Error of GPU rows [r0, r0 + n) against CPU rows [0, n), columns [c0, c0 + cols). */
static double rows_err(void *g, size_t ld, size_t r0, void *c, int n, size_t c0, size_t cols)
{
    float *a = gpu_rows(g, ld, r0, n, c0, cols), *b = cpu_rows(c, ld, n, c0, cols);
    double e = check_max_norm_err(a, b, (size_t)n * cols);
    free(a);
    free(b);
    return e;
}

/* Error of n fp32 values at GPU address g against CPU address c. */
static double f32_err_at(const float *g, const float *c, size_t n)
{
    float *a = ct_malloc(n * sizeof(float) + 4), *b = ct_malloc(n * sizeof(float) + 4);
    gpu->download(gpu, a, g, n * sizeof(float));
    cpu->download(cpu, b, c, n * sizeof(float));
    double e = check_max_norm_err(a, b, n);
    free(a);
    free(b);
    return e;
}

static const char *edge_name(int e) { return e ? "last" : "first"; }

TEST(rmsnorm_fwd_bwd_on_q_heads_of_a_512k_token_qkv)
{
    NEED_GPU();
    const int T = T_BIG, nh = 32, D = 128, W = nh * D;
    const size_t n = (size_t)T * LD, r0[2] = {0, T - EDGE};
    void *x = gpu_act(n), *y = gpu_act(n), *dx = gpu_act(n);
    float *rs = gpu->alloc(gpu, (size_t)T * nh * sizeof(float));
    REQUIRE(x && y && dx && rs, "out of GPU memory for three (%d, %d) tensors", T, LD);
    gpu_fill(x, T, LD);
    gpu_fill(dx, T, LD);
    float *w = rnd(D, 1.5f);
    pair pw = put_weight(w, D);
    void *cx[2], *cy[2], *cdy[2], *cdx[2];
    float *crs[2];
    for (int e = 0; e < 2; e++) {
        cx[e] = put_rows(x, LD, r0[e], EDGE, 2.0f);
        cy[e] = cpu->alloc(cpu, (size_t)EDGE * LD * cpu->act_bytes);
        crs[e] = cpu->alloc(cpu, (size_t)EDGE * nh * sizeof(float));
    }
    gpu->rmsnorm_fwd(gpu, y, LD, rs, x, LD, pw.g, 0, T, nh, D, 1e-5f);
    for (int e = 0; e < 2; e++) {
        cpu->rmsnorm_fwd(cpu, cy[e], LD, crs[e], cx[e], LD, pw.c, 0, EDGE, nh, D, 1e-5f);
        double ey = rows_err(y, LD, r0[e], cy[e], EDGE, 0, W);
        double er = f32_err_at(rs + r0[e] * nh, crs[e], (size_t)EDGE * nh);
        CHECK(ey < 1e-2, "%s rows: y rel err %g", edge_name(e), ey);
        CHECK(er < 1e-3, "%s rows: rstd rel err %g", edge_name(e), er);
    }

    /* Backward from identical inputs: dy over y's rows, the CPU's rstd. */
    float *r = ct_malloc((size_t)EDGE * nh * sizeof(float));
    for (int e = 0; e < 2; e++) {
        cdy[e] = put_rows(y, LD, r0[e], EDGE, 1.0f);
        cdx[e] = put_rows(dx, LD, r0[e], EDGE, 1.0f);
        cpu->download(cpu, r, crs[e], (size_t)EDGE * nh * sizeof(float));
        gpu->upload(gpu, rs + r0[e] * nh, r, (size_t)EDGE * nh * sizeof(float));
    }
    gpu->rmsnorm_bwd(gpu, dx, LD, y, LD, x, LD, rs, pw.g, 0, T, nh, D, dx, LD);
    for (int e = 0; e < 2; e++) {
        cpu->rmsnorm_bwd(cpu, cdx[e], LD, cdy[e], LD, cx[e], LD, crs[e], pw.c, 0, EDGE, nh, D, cdx[e], LD);
        double ed = rows_err(dx, LD, r0[e], cdx[e], EDGE, 0, W);
        double er = rows_err(dx, LD, r0[e], cdx[e], EDGE, W, LD - W); /* k, v columns untouched */
        CHECK(ed < 2e-2, "%s rows: dx rel err %g", edge_name(e), ed);
        CHECK(er == 0, "%s rows: columns past the q heads changed (rel err %g)", edge_name(e), er);
    }
    for (int e = 0; e < 2; e++) {
        cpu->free(cpu, cx[e]); cpu->free(cpu, cy[e]); cpu->free(cpu, crs[e]);
        cpu->free(cpu, cdy[e]); cpu->free(cpu, cdx[e]);
    }
    gpu->free(gpu, x); gpu->free(gpu, y); gpu->free(gpu, dx); gpu->free(gpu, rs);
    drop(pw); free(w); free(r);
}

/* q heads (32 at column 0) and k heads (8 at column 4096), positions 0..T-1. */
TEST(rope_fwd_and_inverse_on_the_last_rows_of_a_512k_token_qkv)
{
    NEED_GPU();
    const int T = T_BIG, D = 128, rot = 128;
    const size_t n = (size_t)T * LD, r0[2] = {0, T - EDGE};
    void *x = gpu_act(n);
    int32_t *pos = ct_malloc((size_t)T * sizeof(int32_t));
    void *gpos = gpu->alloc(gpu, (size_t)T * sizeof(int32_t));
    REQUIRE(x && gpos, "out of GPU memory for a (%d, %d) tensor", T, LD);
    gpu_fill(x, T, LD);
    for (int t = 0; t < T; t++) pos[t] = t;
    gpu->upload(gpu, gpos, pos, (size_t)T * sizeof(int32_t));
    float inv_freq[64];
    for (int i = 0; i < rot / 2; i++) inv_freq[i] = powf(500000.0f, -2.0f * i / rot);
    pair pf = put_raw(inv_freq, sizeof inv_freq);
    void *cx[2], *cpos[2];
    for (int e = 0; e < 2; e++) {
        cx[e] = put_rows(x, LD, r0[e], EDGE, 1.0f);
        cpos[e] = cpu_raw(pos + r0[e], EDGE * sizeof(int32_t));
    }
    const int heads[2] = {32, 8}, col[2] = {0, 4096};
    for (int s = 0; s < 2; s++)
        for (int inv = 0; inv <= 1; inv++) {
            gpu->rope(gpu, gat(x, col[s]), LD, gpos, pf.g, T, heads[s], D, rot, 1.0f, inv);
            for (int e = 0; e < 2; e++) {
                cpu->rope(cpu, cat(cx[e], col[s]), LD, cpos[e], pf.c, EDGE, heads[s], D, rot, 1.0f, inv);
                double err = rows_err(x, LD, r0[e], cx[e], EDGE, 0, LD);
                CHECK(err < 1e-2, "%s rows: rel err %g (%d heads at column %d, inverse %d)", edge_name(e),
                      err, heads[s], col[s], inv);
            }
        }
    for (int e = 0; e < 2; e++) { cpu->free(cpu, cx[e]); cpu->free(cpu, cpos[e]); }
    gpu->free(gpu, x); gpu->free(gpu, gpos); drop(pf); free(pos);
}

TEST(copy_2d_copies_the_last_rows_of_a_512k_token_slice_exactly)
{
    NEED_GPU();
    const int T = T_BIG, cols = 2048;
    const size_t n = (size_t)T * LD, r0[2] = {0, T - EDGE};
    void *src = gpu_act(n), *dst = gpu_act(n);
    REQUIRE(src && dst, "out of GPU memory for two (%d, %d) tensors", T, LD);
    gpu_fill(src, T, LD);
    gpu_fill(dst, T, LD);
    void *cs[2], *cd[2];
    for (int e = 0; e < 2; e++) {
        cs[e] = put_rows(src, LD, r0[e], EDGE, 1.0f);
        cd[e] = put_rows(dst, LD, r0[e], EDGE, 1.0f);
    }
    /* The k|v columns of src into columns [1024, 3072) of dst. */
    gpu->copy_2d(gpu, gat(dst, 1024), LD, gat(src, 4096), LD, T, cols);
    for (int e = 0; e < 2; e++) {
        cpu->copy_2d(cpu, cat(cd[e], 1024), LD, cat(cs[e], 4096), LD, EDGE, cols);
        double err = rows_err(dst, LD, r0[e], cd[e], EDGE, 0, LD); /* the other columns too */
        CHECK(err == 0, "%s rows: rel err %g", edge_name(e), err);
        cpu->free(cpu, cs[e]); cpu->free(cpu, cd[e]);
    }
    gpu->free(gpu, src); gpu->free(gpu, dst);
}

/* gu (T, 2I) with T * 2I > 2^31; h and dh (T, I). */
TEST(swiglu_fwd_bwd_on_rows_past_2g_elements)
{
    NEED_GPU();
    const int T = 131072, I = 8448;
    const size_t r0[2] = {0, T - EDGE};
    void *gu = gpu_act((size_t)T * 2 * I), *dgu = gpu_act((size_t)T * 2 * I);
    void *h = gpu_act((size_t)T * I), *dh = gpu_act((size_t)T * I);
    REQUIRE(gu && dgu && h && dh, "out of GPU memory for SwiGLU at T=%d, I=%d", T, I);
    gpu_fill(gu, T, 2 * I);
    gpu_fill(dh, T, I);
    void *cgu[2], *cdh[2], *ch[2], *cdgu[2];
    for (int e = 0; e < 2; e++) {
        cgu[e] = put_rows(gu, 2 * I, r0[e], EDGE, 4.0f);
        cdh[e] = put_rows(dh, I, r0[e], EDGE, 1.0f);
        ch[e] = cpu->alloc(cpu, (size_t)EDGE * I * cpu->act_bytes);
        cdgu[e] = cpu->alloc(cpu, (size_t)EDGE * 2 * I * cpu->act_bytes);
    }
    gpu->swiglu_fwd(gpu, h, gu, T, I);
    gpu->swiglu_bwd(gpu, dgu, dh, gu, T, I);
    for (int e = 0; e < 2; e++) {
        cpu->swiglu_fwd(cpu, ch[e], cgu[e], EDGE, I);
        cpu->swiglu_bwd(cpu, cdgu[e], cdh[e], cgu[e], EDGE, I);
        double eh = rows_err(h, I, r0[e], ch[e], EDGE, 0, I);
        double eg = rows_err(dgu, 2 * I, r0[e], cdgu[e], EDGE, 0, 2 * I);
        CHECK(eh < 1e-2, "%s rows: h rel err %g", edge_name(e), eh);
        CHECK(eg < 1e-2, "%s rows: dgu rel err %g", edge_name(e), eg);
        cpu->free(cpu, cgu[e]); cpu->free(cpu, cdh[e]); cpu->free(cpu, ch[e]); cpu->free(cpu, cdgu[e]);
    }
    gpu->free(gpu, gu); gpu->free(gpu, dgu); gpu->free(gpu, h); gpu->free(gpu, dh);
}

/* n = 2^31 + 1003: past INT_MAX, with a tail that is not a multiple of 8. */
TEST(add_over_more_than_2g_elements_reaches_the_tail)
{
    NEED_GPU();
    const size_t n = ((size_t)1 << 31) + 1003, m = 8192 + 3, e0[2] = {0, n - m};
    void *y = gpu_act(n), *x = gpu_act(n);
    REQUIRE(y && x, "out of GPU memory for two tensors of %zu elements", n);
    gpu_fill(y, n / 4096, 4096);
    gpu_fill(x, n / 4096, 4096);
    void *cy[2], *cx[2];
    for (int e = 0; e < 2; e++) {
        cy[e] = put_rows(y, 1, e0[e], (int)m, 1.0f);
        cx[e] = put_rows(x, 1, e0[e], (int)m, 1.0f);
    }
    gpu->add(gpu, y, x, n);
    for (int e = 0; e < 2; e++) {
        cpu->add(cpu, cy[e], cx[e], m);
        double err = rows_err(y, 1, e0[e], cy[e], (int)m, 0, 1);
        CHECK(err < 1e-2, "%s elements: rel err %g", edge_name(e), err);
        cpu->free(cpu, cy[e]); cpu->free(cpu, cx[e]);
    }
    gpu->free(gpu, y); gpu->free(gpu, x);
}

TEST(embedding_copies_rows_past_2g_elements_exactly)
{
    NEED_GPU();
    const int T = T_BIG4K, H = 4096, V = 1000;
    const size_t r0[2] = {0, T - EDGE};
    void *out = gpu_act((size_t)T * H), *gid = gpu->alloc(gpu, (size_t)T * sizeof(int32_t));
    REQUIRE(out && gid, "out of GPU memory for a (%d, %d) tensor", T, H);
    int32_t *ids = ct_malloc((size_t)T * sizeof(int32_t));
    for (int t = 0; t < T; t++) ids[t] = (int32_t)ct_rng_below(&rng, V);
    gpu->upload(gpu, gid, ids, (size_t)T * sizeof(int32_t));
    float *tab = rnd((size_t)V * H, 1.0f);
    pair pw = put_weight(tab, (size_t)V * H);
    gpu->embedding(gpu, out, gid, pw.g, T, H);
    for (int e = 0; e < 2; e++) {
        void *cid = cpu_raw(ids + r0[e], EDGE * sizeof(int32_t));
        void *co = cpu->alloc(cpu, (size_t)EDGE * H * cpu->act_bytes);
        cpu->embedding(cpu, co, cid, pw.c, EDGE, H);
        double err = rows_err(out, H, r0[e], co, EDGE, 0, H);
        CHECK(err == 0, "%s rows: rel err %g", edge_name(e), err);
        cpu->free(cpu, cid); cpu->free(cpu, co);
    }
    gpu->free(gpu, out); gpu->free(gpu, gid); drop(pw); free(ids); free(tab);
}

/* 64 target rows (every 4th) in each of the first and the last ER rows of a
 * (T, 4096) x, so that the last targets' dx rows start past 2^31 elements. */
TEST(cross_entropy_writes_dx_rows_past_2g_elements)
{
    NEED_GPU();
    enum { ER = 256, NE = ER / 4 };
    const int T = T_BIG4K, H = 4096, V = 1000, n = 2 * NE;
    const size_t r0[2] = {0, T - ER};
    void *x = gpu_act((size_t)T * H), *dx = gpu_act((size_t)T * H);
    REQUIRE(x && dx, "out of GPU memory for two (%d, %d) tensors", T, H);
    int32_t rows[2 * NE], tg[2 * NE], rel[NE];
    for (int i = 0; i < n; i++) {
        rows[i] = (int32_t)r0[i / NE] + 4 * (i % NE);
        tg[i] = (int32_t)ct_rng_below(&rng, V);
    }
    for (int i = 0; i < NE; i++) rel[i] = 4 * i;
    float *W = rnd((size_t)V * H, 0.05f), loss0 = 1.5f;
    pair pW = put_weight(W, (size_t)V * H), pl = put_raw(&loss0, 4);
    void *grows = gpu->alloc(gpu, sizeof rows), *gtg = gpu->alloc(gpu, sizeof tg);
    gpu->upload(gpu, grows, rows, sizeof rows);
    gpu->upload(gpu, gtg, tg, sizeof tg);
    void *crel = cpu_raw(rel, sizeof rel), *cx[2], *cdx[2], *ctg[2];
    for (int e = 0; e < 2; e++) {
        cx[e] = put_rows(x, H, r0[e], ER, 1.0f);
        cdx[e] = put_rows(dx, H, r0[e], ER, 1.0f);
        ctg[e] = cpu_raw(tg + e * NE, NE * sizeof(int32_t));
    }
    gpu->cross_entropy(gpu, pl.g, dx, x, pW.g, grows, gtg, n, H, V, 1.0f / n);
    for (int e = 0; e < 2; e++)
        cpu->cross_entropy(cpu, pl.c, cdx[e], cx[e], pW.c, crel, ctg[e], NE, H, V, 1.0f / n);
    double el = f32_err_at(pl.g, pl.c, 1);
    CHECK(el < 1e-3, "loss rel err %g", el);
    /* Target rows against the CPU; the rows between them must keep their values.
     * Targets are every 4th row: viewed as (NE, 4H), columns [0, H) are the
     * target rows and [H, 4H) the three rows after each. */
    for (int e = 0; e < 2; e++) {
        float *a = gpu_rows(dx, H, r0[e], ER, 0, H), *b = cpu_rows(cdx[e], H, ER, 0, H);
        float *at = pick(a, NE, 4 * H, 0, H), *bt = pick(b, NE, 4 * H, 0, H);
        float *ao = pick(a, NE, 4 * H, H, 3 * H), *bo = pick(b, NE, 4 * H, H, 3 * H);
        double et = check_max_norm_err(at, bt, (size_t)NE * H);
        double eo = check_max_norm_err(ao, bo, (size_t)NE * 3 * H);
        CHECK(et < 2e-2, "%s rows: dx of target rows rel err %g", edge_name(e), et);
        CHECK(eo == 0, "%s rows: rows without a target changed (rel err %g)", edge_name(e), eo);
        free(a); free(b); free(at); free(bt); free(ao); free(bo);
        cpu->free(cpu, cx[e]); cpu->free(cpu, cdx[e]); cpu->free(cpu, ctg[e]);
    }
    gpu->free(gpu, x); gpu->free(gpu, dx); gpu->free(gpu, grows); gpu->free(gpu, gtg);
    cpu->free(cpu, crel); drop(pW); drop(pl); free(W);
}

/* 512 documents of 1024 tokens over T = 524288, GQA 4:1, D = 128; q, k, v, out,
 * dout and the gradients are all column slices of (T, 6144) tensors, at llama's
 * q | k | v columns. The CPU runs the first two and the last two documents. */
TEST(attention_fwd_bwd_on_the_last_documents_of_a_512k_token_sequence)
{
    NEED_GPU();
    enum { DOC = 1024, ED = 2, ROWS = ED * DOC };
    const int T = T_BIG, nq = 4, nkv = 1, D = 128, n_docs = T / DOC, qo = 0, ko = 4096, vo = 5120;
    const size_t n = (size_t)T * LD, r0[2] = {0, T - ROWS};
    const float scale = 1.0f / sqrtf((float)D);
    void *qkv = gpu_act(n), *out = gpu_act(n);
    void *dout = gpu_act(n), *d = gpu_act(n);
    float *lse = gpu->alloc(gpu, (size_t)T * nq * sizeof(float));
    REQUIRE(qkv && out && dout && d && lse, "out of GPU memory for four (%d, %d) tensors", T, LD);
    int32_t *cu = ct_malloc(((size_t)n_docs + 1) * sizeof(int32_t)), ccu_h[ED + 1];
    for (int i = 0; i <= n_docs; i++) cu[i] = i * DOC;
    for (int i = 0; i <= ED; i++) ccu_h[i] = i * DOC;
    void *gcu = gpu->alloc(gpu, ((size_t)n_docs + 1) * sizeof(int32_t)), *ccu = cpu_raw(ccu_h, sizeof ccu_h);
    gpu->upload(gpu, gcu, cu, ((size_t)n_docs + 1) * sizeof(int32_t));
    gpu_fill(qkv, T, LD);
    gpu_fill(dout, T, LD);
    void *cq[2], *co[2], *cdo[2], *cd[2];
    float *cl[2];
    for (int e = 0; e < 2; e++) {
        cq[e] = put_rows(qkv, LD, r0[e], ROWS, 2.0f);
        co[e] = cpu->alloc(cpu, (size_t)ROWS * LD * cpu->act_bytes);
        cd[e] = cpu->alloc(cpu, (size_t)ROWS * LD * cpu->act_bytes);
        cl[e] = cpu->alloc(cpu, (size_t)ROWS * nq * sizeof(float));
    }
    gpu->attention_fwd(gpu, gat(out, qo), LD, lse, gat(qkv, qo), LD, gat(qkv, ko), LD, gat(qkv, vo), LD, gcu,
                       n_docs, DOC, T, nq, nkv, D, scale, 0, NULL);
    float *o = ct_malloc((size_t)ROWS * LD * sizeof(float)), *l = ct_malloc((size_t)ROWS * nq * sizeof(float));
    for (int e = 0; e < 2; e++) {
        cpu->attention_fwd(cpu, cat(co[e], qo), LD, cl[e], cat(cq[e], qo), LD, cat(cq[e], ko), LD, cat(cq[e], vo),
                           LD, ccu, ED, DOC, ROWS, nq, nkv, D, scale, 0, NULL);
        double eo = rows_err(out, LD, r0[e], co[e], ROWS, qo, (size_t)nq * D);
        double el = f32_err_at(lse + r0[e] * nq, cl[e], (size_t)ROWS * nq);
        CHECK(eo < 2e-2, "%s documents: out rel err %g", edge_name(e), eo);
        CHECK(el < 1e-3, "%s documents: lse rel err %g", edge_name(e), el);

        /* Backward from identical inputs: the CPU's out (rounded to bf16) and lse. */
        cpu->act_to_f32(cpu, o, co[e], (size_t)ROWS * LD);
        for (size_t i = 0; i < (size_t)ROWS * LD; i++) o[i] = ct_bf16_to_f32(ct_f32_to_bf16(o[i]));
        cpu->act_from_f32(cpu, co[e], o, (size_t)ROWS * LD);
        gpu->act_from_f32(gpu, gat(out, r0[e] * LD), o, (size_t)ROWS * LD);
        cpu->download(cpu, l, cl[e], (size_t)ROWS * nq * sizeof(float));
        gpu->upload(gpu, lse + r0[e] * nq, l, (size_t)ROWS * nq * sizeof(float));
        cdo[e] = put_rows(dout, LD, r0[e], ROWS, 1.0f);
    }
    gpu->attention_bwd(gpu, gat(d, qo), LD, gat(d, ko), LD, gat(d, vo), LD, gat(dout, qo), LD, gat(out, qo), LD,
                       lse, gat(qkv, qo), LD, gat(qkv, ko), LD, gat(qkv, vo), LD, gcu, n_docs, DOC, T, nq, nkv,
                       D, scale, 0, NULL);
    const char *names[3] = {"dq", "dk", "dv"};
    const size_t offs[3] = {qo, ko, vo}, widths[3] = {(size_t)nq * D, (size_t)nkv * D, (size_t)nkv * D};
    for (int e = 0; e < 2; e++) {
        cpu->attention_bwd(cpu, cat(cd[e], qo), LD, cat(cd[e], ko), LD, cat(cd[e], vo), LD, cat(cdo[e], qo), LD,
                           cat(co[e], qo), LD, cl[e], cat(cq[e], qo), LD, cat(cq[e], ko), LD, cat(cq[e], vo), LD,
                           ccu, ED, DOC, ROWS, nq, nkv, D, scale, 0, NULL);
        for (int s = 0; s < 3; s++) {
            double err = rows_err(d, LD, r0[e], cd[e], ROWS, offs[s], widths[s]);
            CHECK(err < 4e-2, "%s documents: %s rel err %g", edge_name(e), names[s], err);
        }
    }
    for (int e = 0; e < 2; e++) {
        cpu->free(cpu, cq[e]); cpu->free(cpu, co[e]); cpu->free(cpu, cdo[e]);
        cpu->free(cpu, cd[e]); cpu->free(cpu, cl[e]);
    }
    gpu->free(gpu, qkv); gpu->free(gpu, out); gpu->free(gpu, dout); gpu->free(gpu, d);
    gpu->free(gpu, lse); gpu->free(gpu, gcu); cpu->free(cpu, ccu);
    free(cu); free(o); free(l);
}

/* PEFT dropout's multiplier for element (t, i) of a (T, in) input (backend.h). */
static float keep_scale(uint64_t seed, size_t t, int in, int i, float p)
{
    if (p <= 0.0f) return 1.0f;
    return ct_hash_uniform(seed, (uint64_t)t * (uint64_t)in + (uint64_t)i) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

/* LoRA on x (T, 6144) columns [0, 4096) into y columns [4096, 5120) (a k_proj),
 * T = 557056 so that t * in (the dropout mask index) passes 2^31 as well. The
 * CPU runs with p = 0 on x already masked with the rows' absolute indices, and
 * the mask of dx is applied to its result on the host. */
static void lora_large_case(float p)
{
    const int T = T_BIG4K, in = 4096, out = 1024, R = 16, yc = 4096;
    const float scale = 2.0f;
    const uint64_t seed = 0x5eed1a2bull;
    const size_t n = (size_t)T * LD, r0[2] = {0, T - EDGE};
    void *x = gpu_act(n), *y = gpu_act(n), *dx = gpu_act(n);
    REQUIRE(x && y && dx, "out of GPU memory for three (%d, %d) tensors", T, LD);
    gpu_fill(x, T, LD);
    float *A = rnd((size_t)R * in, 0.1f), *B = rnd((size_t)out * R, 0.1f);
    float *dA0 = rnd((size_t)R * in, 0.5f), *dB0 = rnd((size_t)out * R, 0.5f);
    pair pA = put_raw(A, (size_t)R * in * 4), pB = put_raw(B, (size_t)out * R * 4);
    pair pdA = put_raw(dA0, (size_t)R * in * 4), pdB = put_raw(dB0, (size_t)out * R * 4);
    float *h = ct_malloc((size_t)EDGE * LD * sizeof(float));
    void *cx[2], *cy[2], *cdy[2], *cdx[2];
    for (int e = 0; e < 2; e++) {
        cx[e] = put_rows(x, LD, r0[e], EDGE, 1.0f);
        cpu->act_to_f32(cpu, h, cx[e], (size_t)EDGE * LD);
        for (int r = 0; r < EDGE; r++)
            for (int i = 0; i < in; i++) h[(size_t)r * LD + i] *= keep_scale(seed, r0[e] + r, in, i, p);
        cpu->act_from_f32(cpu, cx[e], h, (size_t)EDGE * LD);
        cy[e] = put_rows(y, LD, r0[e], EDGE, 0.05f);
    }
    gpu->lora_fwd(gpu, gat(y, yc), LD, x, LD, pA.g, pB.g, T, in, out, R, scale, p, seed, NULL, 0);
    for (int e = 0; e < 2; e++) {
        cpu->lora_fwd(cpu, cat(cy[e], yc), LD, cx[e], LD, pA.c, pB.c, EDGE, in, out, R, scale, 0.0f, 0, NULL, 0);
        double err = rows_err(y, LD, r0[e], cy[e], EDGE, yc, out);
        CHECK(err < 2e-2, "%s rows: y rel err %g (p %g)", edge_name(e), err, p);
    }

    /* dy is zero outside the checked rows, so dA and dB hold only their terms. */
    gpu->zero(gpu, y, n * gpu->act_bytes);
    float *dx0[2];
    for (int e = 0; e < 2; e++) {
        cdy[e] = put_rows(y, LD, r0[e], EDGE, 1.0f);
        cdx[e] = put_rows(dx, LD, r0[e], EDGE, 1.0f);
        dx0[e] = cpu_rows(cdx[e], LD, EDGE, 0, in);
    }
    gpu->lora_bwd(gpu, dx, LD, pdA.g, pdB.g, gat(y, yc), LD, x, LD, pA.g, pB.g, T, in, out, R, scale, p, seed, NULL, 0);
    for (int e = 0; e < 2; e++)
        cpu->lora_bwd(cpu, cdx[e], LD, pdA.c, pdB.c, cat(cdy[e], yc), LD, cx[e], LD, pA.c, pB.c, EDGE, in, out,
                      R, scale, 0.0f, 0, NULL, 0);
    double ea = f32_err_at(pdA.g, pdA.c, (size_t)R * in), eb = f32_err_at(pdB.g, pdB.c, (size_t)out * R);
    CHECK(ea < 2e-2, "dA rel err %g (p %g)", ea, p);
    CHECK(eb < 2e-2, "dB rel err %g (p %g)", eb, p);
    for (int e = 0; e < 2; e++) {
        float *want = cpu_rows(cdx[e], LD, EDGE, 0, in), *got = gpu_rows(dx, LD, r0[e], EDGE, 0, in);
        for (int r = 0; r < EDGE; r++)
            for (int i = 0; i < in; i++) {
                size_t k = (size_t)r * in + i;
                want[k] = dx0[e][k] + keep_scale(seed, r0[e] + r, in, i, p) * (want[k] - dx0[e][k]);
            }
        double err = check_max_norm_err(got, want, (size_t)EDGE * in);
        CHECK(err < 2e-2, "%s rows: dx rel err %g (p %g)", edge_name(e), err, p);
        free(want); free(got); free(dx0[e]);
        cpu->free(cpu, cx[e]); cpu->free(cpu, cy[e]); cpu->free(cpu, cdy[e]); cpu->free(cpu, cdx[e]);
    }
    gpu->free(gpu, x); gpu->free(gpu, y); gpu->free(gpu, dx);
    drop(pA); drop(pB); drop(pdA); drop(pdB);
    free(A); free(B); free(dA0); free(dB0); free(h);
}

TEST(lora_fwd_bwd_on_rows_past_2g_elements_without_dropout)
{
    NEED_GPU();
    lora_large_case(0.0f);
}

TEST(lora_dropout_mask_indices_past_2g_match_cpu)
{
    NEED_GPU();
    lora_large_case(0.1f);
}

int main(void)
{
    ct_error err = {0};
    cpu = backend_cpu_new();
    gpu = backend_cuda_new(&err);
    if (!gpu) printf("# CUDA backend unavailable: %s\n", err.msg);
    ct_rng_seed(&rng, 20261130);
    pattern = ct_malloc((size_t)PATTERN_N * sizeof(uint16_t));
    for (size_t i = 0; i < PATTERN_N; i++)
        pattern[i] = ct_f32_to_bf16(2.0f * (float)ct_rng_uniform(&rng) - 1.0f);
    RUN(embedding_copies_rows_past_2g_elements_exactly);
    RUN(rmsnorm_fwd_bwd_on_q_heads_of_a_512k_token_qkv);
    RUN(rope_fwd_and_inverse_on_the_last_rows_of_a_512k_token_qkv);
    RUN(copy_2d_copies_the_last_rows_of_a_512k_token_slice_exactly);
    RUN(swiglu_fwd_bwd_on_rows_past_2g_elements);
    RUN(add_over_more_than_2g_elements_reaches_the_tail);
    RUN(cross_entropy_writes_dx_rows_past_2g_elements);
    RUN(attention_fwd_bwd_on_the_last_documents_of_a_512k_token_sequence);
    RUN(lora_fwd_bwd_on_rows_past_2g_elements_without_dropout);
    RUN(lora_dropout_mask_indices_past_2g_match_cpu);
    free(pattern);
    if (gpu) gpu->destroy(gpu);
    cpu->destroy(cpu);
    return check_summary();
}
