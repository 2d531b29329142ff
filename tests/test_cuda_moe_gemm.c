/* test_cuda_moe_gemm.c — the CUDA grouped expert GEMMs and expert LoRA
 * (moe_linear_fwd, moe_linear_bwd_input, moe_lora_fwd, moe_lora_bwd) and the GEMM
 * forward with the LoRA fused in (moe_linear_lora_fwd) against the CPU reference,
 * which runs the dense ops once per expert. Every grouped GEMM runs the TMA
 * kernel (its producer warpgroup copies gathered rows with cp.async); the fused
 * forward runs it at ranks 16 and 32 and the cp.async wgmma kernel at 64, and the
 * LoRA input gradient computes g in the GEMM or before it by the input width:
 * the cases' ranks and widths reach every one of those kernels
 * (cuda/common/kernel_choice.cu). The input rows come either expert-ordered or through
 * a gather (token rows read as x[gather[r] / K], gather a permutation of slots as
 * moe_permute makes).
 *
 * As in test_backend_cuda.c: fresh random inputs rounded to bf16 (both backends
 * see identical values), comparisons normwise (max|gpu - cpu| / max|cpu|), NaN
 * never passes. Tolerances: bf16 outputs of GEMMs 2e-2; the fp32 LoRA gradients
 * dA, dB 1e-2 (their only bf16 roundings are of A, B, u and g). Row counts per
 * expert include zero, one, all rows and sizes that are not multiples of the
 * kernels' 128-row and 128/32-column tiles; every buffer has rows past the last
 * expert's, which no op may write. Without a GPU every test reports
 * "skip NAME: skipped: no GPU". */
#include "backend.h"
#include "check.h"
#include "cuda_pair.h"

#include <math.h>
#include <stdint.h>


#define SPARE_ROWS 5 /* rows past offsets[E] in every row buffer: must stay untouched */

/* Whether rows [r0, r0 + rows) of an act tensor (stride ld, first cols) still
 * equal h on the GPU, bit for bit. */
static bool rows_unchanged(pair p, const float *h, size_t r0, size_t rows, size_t cols, size_t ld)
{
    size_t n = rows * ld;
    float *g = ct_malloc(n * sizeof(float));
    gpu->act_to_f32(gpu, g, (char *)p.g + r0 * ld * gpu->act_bytes, n);
    bool same = true;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < cols; j++) same &= g[r * ld + j] == h[(r0 + r) * ld + j];
    free(g);
    return same;
}

/* The experts' row ranges: offsets (E+1) from counts (E); returns n. */
static int offsets_of(int32_t *off, const int *counts, int E)
{
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    return off[E];
}

/* Uneven routing: about n rows over E experts with log-normal weights; every
 * 5th expert gets none and one gets a single row (when E > 5). */
static void uneven_counts(int *counts, int E, int n)
{
    double *w = ct_malloc(E * sizeof(double)), sum = 0;
    for (int e = 0; e < E; e++) sum += w[e] = e % 5 == 4 ? 0.0 : exp(1.5 * ct_rng_normal(&rng));
    for (int e = 0; e < E; e++) counts[e] = (int)floor(n * w[e] / sum);
    if (E > 5) counts[3] = 1;
    free(w);
}

/* A gather for n expert rows with K slots per token: T = ceil(n / K) tokens, row r
 * reads slot gather[r] (token gather[r] / K); the n slots are a random subset of the
 * T*K, in random order (moe_permute's are ascending within an expert: a harder
 * case here, the same code path). Returns T. */
static int gather_of(int32_t *gather, int n, int K)
{
    int T = n > 0 ? (n + K - 1) / K : 1, slots = T * K;
    int32_t *perm = ct_malloc((size_t)slots * sizeof(int32_t));
    for (int s = 0; s < slots; s++) perm[s] = s;
    for (int s = slots - 1; s > 0; s--) {
        int j = (int)ct_rng_below(&rng, (uint64_t)s + 1), tmp = perm[s];
        perm[s] = perm[j];
        perm[j] = tmp;
    }
    memcpy(gather, perm, (size_t)n * sizeof(int32_t));
    free(perm);
    return T;
}

/* ---- grouped GEMM ---- */

typedef struct {
    int E, in, out, ldx, ldy;
    const int *counts;
    int K; /* forward only: > 0 reads x (T token rows) through a gather with K slots per token */
} gemm_case;

/* y (n + SPARE_ROWS rows) from moe_linear_fwd on both backends, for each bias /
 * accumulate combination; checks the rows of the experts and the spare rows. */
static void fwd_case(const gemm_case *k)
{
    int32_t *off = ct_malloc((k->E + 1) * sizeof(int32_t));
    int n = offsets_of(off, k->counts, k->E), rows = n + SPARE_ROWS;
    int32_t *gather = ct_malloc(((size_t)n + 1) * sizeof(int32_t));
    int xrows = k->K > 0 ? gather_of(gather, n, k->K) : rows;
    size_t nW = (size_t)k->E * k->out * k->in;
    float *x = rnd((size_t)xrows * k->ldx, 1.0f), *W = rnd(nW, 0.1f), *b = rnd((size_t)k->E * k->out, 0.5f);
    float *y0 = rnd((size_t)rows * k->ldy, 1.0f);
    pair px = put_act(x, (size_t)xrows * k->ldx), pW = put_weight(W, nW), pb = put_weight(b, (size_t)k->E * k->out);
    pair po = put_raw(off, (k->E + 1) * sizeof(int32_t)), pg = put_raw(gather, ((size_t)n + 1) * sizeof(int32_t));
    const int32_t *gc = k->K > 0 ? pg.c : NULL, *gg = k->K > 0 ? pg.g : NULL;
    for (int bias = 0; bias <= 1; bias++)
        for (int acc = 0; acc <= 1; acc++) {
            pair py = put_act(y0, (size_t)rows * k->ldy);
            cpu->moe_linear_fwd(cpu, py.c, k->ldy, px.c, k->ldx, gc, k->K, pW.c, bias ? pb.c : NULL, po.c, k->E,
                                k->in, k->out, acc);
            gpu->moe_linear_fwd(gpu, py.g, k->ldy, px.g, k->ldx, gg, k->K, pW.g, bias ? pb.g : NULL, po.g, k->E,
                                k->in, k->out, acc);
            double e = n > 0 ? act_err(py, n, k->out, k->ldy) : 0.0;
            CHECK(e < 2e-2, "y rel err %g (E %d, n %d, in %d, out %d, gather K %d, bias %d, accumulate %d)", e,
                  k->E, n, k->in, k->out, k->K, bias, acc);
            CHECK(rows_unchanged(py, y0, n, SPARE_ROWS, k->ldy, k->ldy), "rows past offsets[E] were written");
            drop(py);
        }
    drop(px); drop(pW); drop(pb); drop(po); drop(pg);
    free(off); free(gather); free(x); free(W); free(b); free(y0);
}

static void bwd_case(const gemm_case *k) /* ldx: dx's stride, ldy: dy's */
{
    int32_t *off = ct_malloc((k->E + 1) * sizeof(int32_t));
    int n = offsets_of(off, k->counts, k->E), rows = n + SPARE_ROWS;
    size_t nW = (size_t)k->E * k->out * k->in;
    float *dy = rnd((size_t)rows * k->ldy, 1.0f), *W = rnd(nW, 0.1f), *dx0 = rnd((size_t)rows * k->ldx, 1.0f);
    pair pdy = put_act(dy, (size_t)rows * k->ldy), pW = put_weight(W, nW);
    pair po = put_raw(off, (k->E + 1) * sizeof(int32_t));
    for (int acc = 0; acc <= 1; acc++) {
        pair pdx = put_act(dx0, (size_t)rows * k->ldx);
        cpu->moe_linear_bwd_input(cpu, pdx.c, k->ldx, pdy.c, k->ldy, pW.c, po.c, k->E, k->in, k->out, acc);
        gpu->moe_linear_bwd_input(gpu, pdx.g, k->ldx, pdy.g, k->ldy, pW.g, po.g, k->E, k->in, k->out, acc);
        double e = n > 0 ? act_err(pdx, n, k->in, k->ldx) : 0.0;
        CHECK(e < 2e-2, "dx rel err %g (E %d, n %d, in %d, out %d, accumulate %d)", e, k->E, n, k->in,
              k->out, acc);
        CHECK(rows_unchanged(pdx, dx0, n, SPARE_ROWS, k->ldx, k->ldx), "rows past offsets[E] were written");
        drop(pdx);
    }
    drop(pdy); drop(pW); drop(po);
    free(off); free(dy); free(W); free(dx0);
}

/* Edge tiles everywhere: in = 72 (a partial k step of 64), out = 200 (a partial
 * column tile of 256), experts with 0, 1, 64 (exactly a consumer's half tile), 65,
 * 127, 129 and 300 rows. The TMA kernel's row box ends at the tile's last row, so
 * the first expert's short tiles read rows before row 0 (zero-filled) and every
 * partial tile reads the previous expert's rows. */
static const int COUNTS8[8] = {0, 1, 127, 129, 0, 300, 64, 17};
static const int COUNTS_HALF[6] = {64, 65, 63, 192, 0, 1};

TEST(moe_linear_fwd_matches_cpu_on_edge_tiles_with_bias_accumulate_and_strides)
{
    NEED_GPU();
    gemm_case k = {8, 72, 200, 80, 224, COUNTS8, 0};
    fwd_case(&k);
    gemm_case kh = {6, 136, 264, 136, 264, COUNTS_HALF, 0};
    fwd_case(&kh);
}

TEST(moe_linear_fwd_one_expert_with_all_rows_and_a_single_row)
{
    NEED_GPU();
    int all1[1] = {300};
    gemm_case k1 = {1, 128, 136, 128, 136, all1, 0};
    fwd_case(&k1);
    int all32[32] = {0};
    all32[17] = 257;
    gemm_case k32 = {32, 64, 520, 72, 520, all32, 0};
    fwd_case(&k32);
    int one[8] = {0, 0, 0, 0, 0, 1, 0, 0};
    gemm_case k8 = {8, 256, 64, 256, 64, one, 0};
    fwd_case(&k8);
}

TEST(moe_linear_fwd_matches_cpu_with_128_uneven_experts)
{
    NEED_GPU();
    int counts[128];
    uneven_counts(counts, 128, 6000);
    gemm_case k = {128, 264, 392, 264, 400, counts, 0};
    fwd_case(&k);
}

TEST(moe_linear_fwd_matches_cpu_over_a_long_reduction)
{
    NEED_GPU();
    int counts[32];
    uneven_counts(counts, 32, 1500);
    gemm_case k = {32, 1032, 264, 1040, 264, counts, 0};
    fwd_case(&k);
}

/* Several tiles per block of the persistent grid with one k-step each: the
 * loads run tiles ahead of the multiplies (k-steps stream across tiles). */
TEST(moe_linear_fwd_and_bwd_input_with_many_tiles_per_block_and_one_k_step)
{
    NEED_GPU();
    int counts[128];
    uneven_counts(counts, 128, 9000);
    gemm_case kf = {128, 64, 776, 64, 776, counts, 0};
    fwd_case(&kf);
    gemm_case kb = {128, 776, 64, 776, 64, counts, 0};
    bwd_case(&kb);
}

/* The fused gather: token rows at a stride wider than in, K = 8 and K = 2 slots
 * per token, edge tiles and 128 uneven experts. */
TEST(moe_linear_fwd_through_a_gather_matches_cpu)
{
    NEED_GPU();
    gemm_case k = {8, 72, 200, 80, 224, COUNTS8, 8};
    fwd_case(&k);
    gemm_case kh = {6, 136, 264, 144, 264, COUNTS_HALF, 2};
    fwd_case(&kh);
    int counts[128];
    uneven_counts(counts, 128, 6000);
    gemm_case k128 = {128, 264, 520, 264, 520, counts, 8};
    fwd_case(&k128);
}

TEST(moe_linear_bwd_input_matches_cpu_on_edge_tiles_overwrite_and_accumulate)
{
    NEED_GPU();
    gemm_case k = {8, 72, 200, 80, 208, COUNTS8, 0};
    bwd_case(&k);
    gemm_case kh = {6, 264, 136, 264, 136, COUNTS_HALF, 0};
    bwd_case(&kh);
}

TEST(moe_linear_bwd_input_matches_cpu_with_uneven_experts)
{
    NEED_GPU();
    int counts[32];
    uneven_counts(counts, 32, 2500);
    gemm_case k = {32, 392, 1032, 392, 1040, counts, 0};
    bwd_case(&k);
    int c128[128];
    uneven_counts(c128, 128, 4000);
    gemm_case k128 = {128, 136, 264, 144, 264, c128, 0};
    bwd_case(&k128);
    int all1[1] = {129};
    gemm_case k1 = {1, 200, 72, 200, 72, all1, 0};
    bwd_case(&k1);
}

/* ---- expert LoRA ---- */

typedef struct {
    int E, in, out, R, ldx, ldy;
    const int *counts;
    float p;
    int with_dx;
    int K; /* > 0: x holds token rows read through a gather with K slots per token */
} lora_case;

/* moe_lora_fwd on y, then moe_lora_bwd into dA, dB (accumulating onto random
 * values) and dx (or NULL: dx must stay as it was). A wrong dropout mask (a
 * wrong seed per expert or a wrong row index) gives errors of order 1. */
static void lora_run(const lora_case *k)
{
    int32_t *off = ct_malloc((k->E + 1) * sizeof(int32_t));
    int n = offsets_of(off, k->counts, k->E), rows = n + SPARE_ROWS;
    int32_t *gather = ct_malloc(((size_t)n + 1) * sizeof(int32_t));
    int xrows = k->K > 0 ? gather_of(gather, n, k->K) : rows;
    size_t nA = (size_t)k->E * k->R * k->in, nB = (size_t)k->E * k->out * k->R;
    float scale = 2.0f;
    uint64_t seed = 0x5eed0123ull;
    float *x = rnd((size_t)xrows * k->ldx, 1.0f), *A = rnd(nA, 0.1f), *B = rnd(nB, 0.1f);
    float *y0 = rnd((size_t)rows * k->ldy, 0.05f), *dy = rnd((size_t)rows * k->ldy, 1.0f);
    float *dA0 = rnd(nA, 0.5f), *dB0 = rnd(nB, 0.5f), *dx0 = rnd((size_t)rows * k->ldx, 0.05f);
    pair px = put_act(x, (size_t)xrows * k->ldx), pA = put_raw(A, nA * 4), pB = put_raw(B, nB * 4);
    pair py = put_act(y0, (size_t)rows * k->ldy), pdy = put_act(dy, (size_t)rows * k->ldy);
    pair pdA = put_raw(dA0, nA * 4), pdB = put_raw(dB0, nB * 4), pdx = put_act(dx0, (size_t)rows * k->ldx);
    pair po = put_raw(off, (k->E + 1) * sizeof(int32_t)), pg = put_raw(gather, ((size_t)n + 1) * sizeof(int32_t));
    const int32_t *gc = k->K > 0 ? pg.c : NULL, *gg = k->K > 0 ? pg.g : NULL;

    cpu->moe_lora_fwd(cpu, py.c, k->ldy, px.c, k->ldx, gc, k->K, pA.c, pB.c, po.c, k->E, k->in, k->out, k->R, scale,
                      k->p, seed);
    gpu->moe_lora_fwd(gpu, py.g, k->ldy, px.g, k->ldx, gg, k->K, pA.g, pB.g, po.g, k->E, k->in, k->out, k->R, scale,
                      k->p, seed);
    double e = n > 0 ? act_err(py, n, k->out, k->ldy) : 0.0;
    CHECK(e < 2e-2, "fwd y rel err %g (E %d, n %d, R %d, p %g, gather K %d)", e, k->E, n, k->R, k->p, k->K);
    CHECK(rows_unchanged(py, y0, n, SPARE_ROWS, k->ldy, k->ldy), "fwd wrote rows past offsets[E]");

    cpu->moe_lora_bwd(cpu, k->with_dx ? pdx.c : NULL, k->ldx, pdA.c, pdB.c, pdy.c, k->ldy, px.c, k->ldx, gc, k->K,
                      pA.c, pB.c, po.c, k->E, k->in, k->out, k->R, scale, k->p, seed);
    gpu->moe_lora_bwd(gpu, k->with_dx ? pdx.g : NULL, k->ldx, pdA.g, pdB.g, pdy.g, k->ldy, px.g, k->ldx, gg, k->K,
                      pA.g, pB.g, po.g, k->E, k->in, k->out, k->R, scale, k->p, seed);
    double ea = f32_err(pdA, nA), eb = f32_err(pdB, nB);
    CHECK(ea < 1e-2, "dA rel err %g (E %d, n %d, R %d, p %g, gather K %d)", ea, k->E, n, k->R, k->p, k->K);
    CHECK(eb < 1e-2, "dB rel err %g (E %d, n %d, R %d, p %g, gather K %d)", eb, k->E, n, k->R, k->p, k->K);
    if (k->with_dx) {
        double ex = n > 0 ? act_err(pdx, n, k->in, k->ldx) : 0.0;
        CHECK(ex < 2e-2, "dx rel err %g (E %d, n %d, R %d, p %g, gather K %d)", ex, k->E, n, k->R, k->p, k->K);
        CHECK(rows_unchanged(pdx, dx0, n, SPARE_ROWS, k->ldx, k->ldx), "bwd wrote dx rows past offsets[E]");
    } else {
        CHECK(rows_unchanged(pdx, dx0, 0, rows, k->ldx, k->ldx), "dx is NULL, yet the buffer changed");
    }
    drop(px); drop(pA); drop(pB); drop(py); drop(pdy); drop(pdA); drop(pdB); drop(pdx); drop(po); drop(pg);
    free(off); free(gather); free(x); free(A); free(B); free(y0); free(dy); free(dA0); free(dB0); free(dx0);
}

TEST(moe_lora_fwd_bwd_match_cpu_without_dropout)
{
    NEED_GPU();
    lora_case k = {8, 72, 200, 16, 80, 216, COUNTS8, 0.0f, 1, 0};
    lora_run(&k);
    int all1[1] = {300};
    lora_case k1 = {1, 128, 64, 16, 128, 64, all1, 0.0f, 1, 0};
    lora_run(&k1);
}

TEST(moe_lora_dropout_masks_match_cpu_per_expert)
{
    NEED_GPU();
    lora_case k = {8, 72, 200, 8, 72, 200, COUNTS8, 0.1f, 1, 0};
    lora_run(&k);
    lora_case knull = {8, 136, 64, 24, 144, 64, COUNTS8, 0.1f, 0, 0};
    lora_run(&knull);
}

TEST(moe_lora_matches_cpu_with_128_uneven_experts_and_rank_64)
{
    NEED_GPU();
    int counts[128];
    uneven_counts(counts, 128, 5000);
    lora_case k = {128, 128, 64, 16, 128, 72, counts, 0.1f, 1, 0};
    lora_run(&k);
    int c32[32];
    uneven_counts(c32, 32, 2000);
    lora_case k64 = {32, 264, 136, 64, 264, 136, c32, 0.0f, 1, 0};
    lora_run(&k64);
}

/* Rank 64 keeps u and g of 32768 rows per backward chunk: 40000 rows take two
 * chunks, the boundary inside expert 2, with dropout (the row index restarts
 * per expert, not per chunk). */
TEST(moe_lora_bwd_matches_cpu_over_several_row_chunks)
{
    NEED_GPU();
    int counts[4] = {15000, 0, 20000, 5000};
    lora_case k = {4, 64, 48, 64, 64, 48, counts, 0.1f, 1, 0};
    lora_run(&k);
}

/* x read through a gather (the gate|up LoRA of the graph): the forward's u, the
 * backward's u and its dA reduction all read token rows; dropout's index stays the
 * row within the expert. Ranks 16 and 64 (two backward chunks at 40000 rows). */
TEST(moe_lora_through_a_gather_matches_cpu)
{
    NEED_GPU();
    lora_case k = {8, 72, 200, 16, 80, 216, COUNTS8, 0.1f, 1, 8};
    lora_run(&k);
    int counts[128];
    uneven_counts(counts, 128, 5000);
    lora_case k128 = {128, 136, 64, 16, 144, 72, counts, 0.0f, 1, 8};
    lora_run(&k128);
    int big[4] = {15000, 0, 20000, 5000};
    lora_case kc = {4, 64, 48, 64, 64, 48, big, 0.1f, 0, 4};
    lora_run(&kc);
}

/* moe_lora_bwd_cols on both backends (the CPU's is moe_lora_bwd per module on its
 * columns of dy): two modules sharing x through a gather, on column ranges of dy
 * with a gap between them (columns of no module), dx and dA / dB accumulating onto
 * random values. A gradient stored to the wrong module, rank or column, or a
 * module's g summing the other module's columns, fails by far. */
static void lora_cols_run(const lora_case *k, const int col0[2], const int cols[2])
{
    int32_t *off = ct_malloc((k->E + 1) * sizeof(int32_t));
    int n = offsets_of(off, k->counts, k->E), rows = n + SPARE_ROWS;
    int32_t *gather = ct_malloc(((size_t)n + 1) * sizeof(int32_t));
    int xrows = k->K > 0 ? gather_of(gather, n, k->K) : rows;
    size_t nA = (size_t)k->E * k->R * k->in, nB[2];
    float *x = rnd((size_t)xrows * k->ldx, 1.0f), *dy = rnd((size_t)rows * k->ldy, 1.0f);
    float *dx0 = rnd((size_t)rows * k->ldx, 0.05f), *A[2], *B[2], *dA0[2], *dB0[2];
    pair px = put_act(x, (size_t)xrows * k->ldx), pdy = put_act(dy, (size_t)rows * k->ldy);
    pair pdx = put_act(dx0, (size_t)rows * k->ldx), po = put_raw(off, (k->E + 1) * sizeof(int32_t));
    pair pg = put_raw(gather, ((size_t)n + 1) * sizeof(int32_t)), pA[2], pB[2], pdA[2], pdB[2];
    ct_lora_cols mc[2], mg[2];
    for (int q = 0; q < 2; q++) {
        nB[q] = (size_t)k->E * cols[q] * k->R;
        A[q] = rnd(nA, 0.1f);
        B[q] = rnd(nB[q], 0.1f);
        dA0[q] = rnd(nA, 0.5f);
        dB0[q] = rnd(nB[q], 0.5f);
        pA[q] = put_raw(A[q], nA * 4);
        pB[q] = put_raw(B[q], nB[q] * 4);
        pdA[q] = put_raw(dA0[q], nA * 4);
        pdB[q] = put_raw(dB0[q], nB[q] * 4);
        mc[q] = (ct_lora_cols){pA[q].c, pB[q].c, col0[q], cols[q], pdA[q].c, pdB[q].c};
        mg[q] = (ct_lora_cols){pA[q].g, pB[q].g, col0[q], cols[q], pdA[q].g, pdB[q].g};
    }
    const int32_t *gc = k->K > 0 ? pg.c : NULL, *gg = k->K > 0 ? pg.g : NULL;
    cpu->moe_lora_bwd_cols(cpu, pdx.c, k->ldx, pdy.c, k->ldy, k->out, px.c, k->ldx, gc, k->K, po.c, k->E, k->in, mc,
                           2, k->R, 2.0f, NULL, 0, NULL, 0);
    gpu->moe_lora_bwd_cols(gpu, pdx.g, k->ldx, pdy.g, k->ldy, k->out, px.g, k->ldx, gg, k->K, po.g, k->E, k->in, mg,
                           2, k->R, 2.0f, NULL, 0, NULL, 0);
    for (int q = 0; q < 2; q++) {
        double ea = f32_err(pdA[q], nA), eb = f32_err(pdB[q], nB[q]);
        CHECK(ea < 1e-2, "cols: module %d dA rel err %g (E %d, n %d, R %d, gather K %d)", q, ea, k->E, n, k->R, k->K);
        CHECK(eb < 1e-2, "cols: module %d dB rel err %g (E %d, n %d, R %d, gather K %d)", q, eb, k->E, n, k->R, k->K);
    }
    double ex = n > 0 ? act_err(pdx, n, k->in, k->ldx) : 0.0;
    CHECK(ex < 2e-2, "cols: dx rel err %g (E %d, n %d, R %d, gather K %d)", ex, k->E, n, k->R, k->K);
    CHECK(rows_unchanged(pdx, dx0, n, SPARE_ROWS, k->ldx, k->ldx), "cols: dx rows past offsets[E] were written");
    for (int q = 0; q < 2; q++) {
        drop(pA[q]); drop(pB[q]); drop(pdA[q]); drop(pdB[q]);
        free(A[q]); free(B[q]); free(dA0[q]); free(dB0[q]);
    }
    drop(px); drop(pdy); drop(pdx); drop(po); drop(pg);
    free(off); free(gather); free(x); free(dy); free(dx0);
}

/* The gate|up shape of the graph: ranks 16 and 24 per module (one LoRA of rank
 * 32, 48), 40 (80 in all: past 64, so module by module), a gap of 16 columns
 * between the modules, 128 uneven experts, and 40000 rows at rank 2 x 24 (two
 * backward chunks, the boundary inside an expert). */
TEST(moe_lora_bwd_cols_of_two_modules_matches_cpu)
{
    NEED_GPU();
    const int col0[2] = {0, 136}, cols[2] = {120, 64};
    lora_case k = {8, 72, 200, 16, 80, 216, COUNTS8, 0.0f, 1, 8};
    lora_cols_run(&k, col0, cols);
    int counts[128];
    uneven_counts(counts, 128, 5000);
    lora_case k128 = {128, 136, 200, 24, 144, 200, counts, 0.0f, 1, 8};
    lora_cols_run(&k128, col0, cols);
    lora_case k40 = {8, 72, 200, 40, 80, 216, COUNTS8, 0.0f, 1, 8};
    lora_cols_run(&k40, col0, cols);
    int big[4] = {15000, 0, 20000, 5000};
    lora_case kc = {4, 64, 200, 24, 64, 200, big, 0.0f, 1, 4};
    lora_cols_run(&kc, col0, cols);
}

/* The LoRA input-gradient term inside the grouped GEMM: moe_linear_lora_bwd_input
 * computing g = dy B per module (into g) and adding scale g A to dy W, then
 * moe_lora_bwd_cols reading that g (dx NULL) for the weight gradients, on both
 * backends: dx (overwrite and accumulate), g's module columns, dA and dB against
 * the CPU. g starts as NaN: the GPU must write its columns up to moe_u_cols
 * (zeros past the ranks), which its weight-gradient pass reads. */
static void lora_dx_run(const lora_case *k, int n_mod, const int col0[2], const int cols[2], bool use_u)
{
    int32_t *off = ct_malloc((k->E + 1) * sizeof(int32_t));
    int n = offsets_of(off, k->counts, k->E), rows = n + SPARE_ROWS, G = 64;
    int32_t *gather = ct_malloc(((size_t)n + 1) * sizeof(int32_t));
    int xrows = k->K > 0 ? gather_of(gather, n, k->K) : rows;
    size_t nA = (size_t)k->E * k->R * k->in, nW = (size_t)k->E * k->out * k->in;
    float *x = rnd((size_t)xrows * k->ldx, 1.0f), *dy = rnd((size_t)rows * k->ldy, 1.0f), *W = rnd(nW, 0.1f);
    float *dx0 = rnd((size_t)rows * k->ldx, 1.0f), *g0 = rnd((size_t)rows * G, 1.0f), *A[2], *B[2], *dA0[2], *dB0[2];
    for (size_t i = 0; i < (size_t)rows * G; i++) g0[i] = NAN; /* unwritten columns would poison dx */
    pair px = put_act(x, (size_t)xrows * k->ldx), pdy = put_act(dy, (size_t)rows * k->ldy), pW = put_weight(W, nW);
    pair po = put_raw(off, (k->E + 1) * sizeof(int32_t)), pg = put_raw(gather, ((size_t)n + 1) * sizeof(int32_t));
    pair pgo = put_act(g0, (size_t)rows * G), pA[2], pB[2], pdA[2], pdB[2];
    ct_lora_cols mc[2], mg[2];
    for (int q = 0; q < n_mod; q++) {
        size_t nB = (size_t)k->E * cols[q] * k->R;
        A[q] = rnd(nA, 0.1f);
        B[q] = rnd(nB, 0.1f);
        dA0[q] = rnd(nA, 0.5f);
        dB0[q] = rnd(nB, 0.5f);
        pA[q] = put_raw(A[q], nA * 4);
        pB[q] = put_raw(B[q], nB * 4);
        pdA[q] = put_raw(dA0[q], nA * 4);
        pdB[q] = put_raw(dB0[q], nB * 4);
        mc[q] = (ct_lora_cols){pA[q].c, pB[q].c, col0[q], cols[q], pdA[q].c, pdB[q].c};
        mg[q] = (ct_lora_cols){pA[q].g, pB[q].g, col0[q], cols[q], pdA[q].g, pdB[q].g};
    }
    const int32_t *gc = k->K > 0 ? pg.c : NULL, *gg = k->K > 0 ? pg.g : NULL;
    /* u (use_u): the CPU forward's, rounded to bf16 on the GPU, NaN past the ranks
     * (which the GPU must not let into any stored gradient) */
    float *u = rnd((size_t)rows * G, 1.0f);
    for (size_t i = 0; i < (size_t)rows * G; i++) u[i] = NAN;
    pair pu = put_act(u, (size_t)rows * G), py = put_act(dy, (size_t)rows * k->ldy);
    if (use_u) {
        CHECK(cpu->moe_linear_lora_fwd(cpu, py.c, k->ldy, px.c, k->ldx, gc, k->K, pW.c, NULL, po.c, k->E, k->in, k->out,
                                       0, mc, n_mod, k->R, 2.0f, pu.c, G),
              "the CPU forward wrote no u");
        gpu->act_from_f32(gpu, pu.g, (const float *)pu.c, (size_t)rows * G);
    }
    for (int acc = 0; acc <= 1; acc++) {
        pair pdx = put_act(dx0, (size_t)rows * k->ldx);
        cpu->moe_linear_lora_bwd_input(cpu, pdx.c, k->ldx, pdy.c, k->ldy, pW.c, po.c, k->E, k->in, k->out, acc, pgo.c, G,
                                       mc, n_mod, k->R, 2.0f);
        gpu->moe_linear_lora_bwd_input(gpu, pdx.g, k->ldx, pdy.g, k->ldy, pW.g, po.g, k->E, k->in, k->out, acc, pgo.g, G,
                                       mg, n_mod, k->R, 2.0f);
        double ex = n > 0 ? act_err(pdx, n, k->in, k->ldx) : 0.0;
        CHECK(ex < 2e-2, "dx rel err %g (E %d, n %d, R %d, modules %d, accumulate %d)", ex, k->E, n, k->R,
              n_mod, acc);
        CHECK(rows_unchanged(pdx, dx0, n, SPARE_ROWS, k->ldx, k->ldx), "dx rows past offsets[E] were written");
        drop(pdx);
    }
    double eg = n > 0 ? act_err(pgo, n, n_mod * k->R, G) : 0.0;
    CHECK(eg < 1e-2, "g rel err %g (E %d, n %d, R %d, modules %d)", eg, k->E, n, k->R, n_mod);
    const int ucols = moe_u_cols(n_mod, k->R);
    float *gh = ct_malloc((size_t)rows * G * sizeof(float));
    gpu->act_to_f32(gpu, gh, pgo.g, (size_t)rows * G);
    int bad = 0;
    for (int r = 0; r < n; r++)
        for (int c = n_mod * k->R; c < ucols; c++) bad += gh[(size_t)r * G + c] != 0.0f;
    CHECK(bad == 0, "%d elements of g past the ranks (up to column %d) are not zero", bad, ucols);
    free(gh);
    cpu->moe_lora_bwd_cols(cpu, NULL, 0, pdy.c, k->ldy, k->out, px.c, k->ldx, gc, k->K, po.c, k->E, k->in, mc, n_mod,
                           k->R, 2.0f, pgo.c, G, use_u ? pu.c : NULL, G);
    gpu->moe_lora_bwd_cols(gpu, NULL, 0, pdy.g, k->ldy, k->out, px.g, k->ldx, gg, k->K, po.g, k->E, k->in, mg, n_mod,
                           k->R, 2.0f, pgo.g, G, use_u ? pu.g : NULL, G);
    drop(pu); drop(py);
    free(u);
    for (int q = 0; q < n_mod; q++) {
        double ea = f32_err(pdA[q], nA), eb = f32_err(pdB[q], (size_t)k->E * cols[q] * k->R);
        CHECK(ea < 1e-2 && eb < 1e-2, "module %d dA / dB rel err %g / %g with g given", q, ea, eb);
    }
    for (int q = 0; q < n_mod; q++) {
        drop(pA[q]); drop(pB[q]); drop(pdA[q]); drop(pdB[q]);
        free(A[q]); free(B[q]); free(dA0[q]); free(dB0[q]);
    }
    drop(px); drop(pdy); drop(pW); drop(po); drop(pg); drop(pgo);
    free(off); free(gather); free(x); free(dy); free(W); free(dx0); free(g0);
}

/* gate and up (two modules, a column gap, through a gather) and down (one module
 * on all columns, expert-ordered rows), edge tiles and 128 uneven experts; ranks
 * 16 x 2 and 32 x 2 (64 in all) and 24 alone (padded to 32, zeros to 64); with u
 * recomputed, then with u given (the forward's, as graph_moe.c passes it). g is
 * computed inside the GEMM up to in = 2048 at 16 or 32 padded ranks (the 72- and
 * 264-column cases) and by the LoRA kernel with the GEMM's k-step otherwise (64
 * ranks; the 2056-column case at 32). */
TEST(moe_linear_lora_bwd_input_adds_the_lora_term_in_the_gemm)
{
    NEED_GPU();
    const int col0[2] = {0, 136}, cols[2] = {120, 64}, whole[2] = {200, 0}, at0[2] = {0, 0};
    lora_case k = {8, 72, 200, 16, 80, 216, COUNTS8, 0.0f, 1, 8};
    for (int use_u = 0; use_u <= 1; use_u++) {
        lora_dx_run(&k, 2, col0, cols, use_u);
        int counts[128];
        uneven_counts(counts, 128, 5000);
        lora_case k128 = {128, 136, 200, 32, 144, 200, counts, 0.0f, 1, 8};
        lora_dx_run(&k128, 2, col0, cols, use_u);
        lora_case kd = {128, 264, 200, 24, 264, 200, counts, 0.0f, 1, 0};
        lora_dx_run(&kd, 1, at0, whole, use_u);
        lora_case kw = {32, 2056, 200, 16, 2056, 200, counts, 0.0f, 1, 4};
        lora_dx_run(&kw, 2, col0, cols, use_u);
    }
}

/* ---- grouped GEMM with the expert LoRA fused in ---- */

typedef struct {
    int E, in, out, ldx, ldy;
    const int *counts;
    int K;               /* > 0: x holds token rows read through a gather with K slots per token */
    int R, n_mod;
    int col0[2], cols[2]; /* the modules' columns */
    float scale;
} fused_case;

/* moe_linear_lora_fwd on both backends (the CPU's is moe_linear_fwd then
 * moe_lora_fwd per module), for each bias / accumulate combination. The LoRA term
 * is about as large as the GEMM's, so a missing or misplaced one fails by far. */
static void fused_run(const fused_case *k)
{
    int32_t *off = ct_malloc((k->E + 1) * sizeof(int32_t));
    int n = offsets_of(off, k->counts, k->E), rows = n + SPARE_ROWS;
    int32_t *gather = ct_malloc(((size_t)n + 1) * sizeof(int32_t));
    int xrows = k->K > 0 ? gather_of(gather, n, k->K) : rows;
    size_t nW = (size_t)k->E * k->out * k->in, nA = (size_t)k->E * k->R * k->in;
    float *x = rnd((size_t)xrows * k->ldx, 1.0f), *W = rnd(nW, 0.1f), *b = rnd((size_t)k->E * k->out, 0.5f);
    float *y0 = rnd((size_t)rows * k->ldy, 1.0f), *A[2], *B[2];
    pair px = put_act(x, (size_t)xrows * k->ldx), pW = put_weight(W, nW), pb = put_weight(b, (size_t)k->E * k->out);
    pair po = put_raw(off, (k->E + 1) * sizeof(int32_t)), pg = put_raw(gather, ((size_t)n + 1) * sizeof(int32_t));
    pair pA[2], pB[2];
    ct_lora_cols mc[2], mg[2];
    for (int q = 0; q < k->n_mod; q++) {
        size_t nB = (size_t)k->E * k->cols[q] * k->R;
        A[q] = rnd(nA, 0.1f);
        B[q] = rnd(nB, 0.1f);
        pA[q] = put_raw(A[q], nA * 4);
        pB[q] = put_raw(B[q], nB * 4);
        mc[q] = (ct_lora_cols){pA[q].c, pB[q].c, k->col0[q], k->cols[q], NULL, NULL};
        mg[q] = (ct_lora_cols){pA[q].g, pB[q].g, k->col0[q], k->cols[q], NULL, NULL};
    }
    const int32_t *gc = k->K > 0 ? pg.c : NULL, *gg = k->K > 0 ? pg.g : NULL;
    const int G = 64; /* u's columns (also asked for where R * modules > 64: then none come back) */
    float *u0 = rnd((size_t)rows * G, 1.0f);
    for (int bias = 0; bias <= 1; bias++)
        for (int acc = 0; acc <= 1; acc++) {
            pair py = put_act(y0, (size_t)rows * k->ldy), pu = put_act(u0, (size_t)rows * G);
            const bool want_u = k->n_mod > 0 && k->n_mod * k->R <= G;
            cpu->moe_linear_lora_fwd(cpu, py.c, k->ldy, px.c, k->ldx, gc, k->K, pW.c, bias ? pb.c : NULL, po.c, k->E,
                                     k->in, k->out, acc, mc, k->n_mod, k->R, k->scale, want_u ? pu.c : NULL, G);
            bool got_u = gpu->moe_linear_lora_fwd(gpu, py.g, k->ldy, px.g, k->ldx, gg, k->K, pW.g, bias ? pb.g : NULL,
                                                  po.g, k->E, k->in, k->out, acc, mg, k->n_mod, k->R, k->scale,
                                                  want_u ? pu.g : NULL, G);
            if (got_u) {
                double eu = n > 0 ? act_err(pu, n, k->n_mod * k->R, G) : 0.0;
                CHECK(eu < 2e-2, "fused: u rel err %g (E %d, n %d, R %d, modules %d)", eu, k->E, n, k->R, k->n_mod);
            }
            drop(pu);
            double e = n > 0 ? act_err(py, n, k->out, k->ldy) : 0.0;
            CHECK(e < 2e-2, "fused: y rel err %g (E %d, n %d, in %d, out %d, gather K %d, R %d, modules %d, bias %d, "
                  "accumulate %d)", e, k->E, n, k->in, k->out, k->K, k->R, k->n_mod, bias, acc);
            CHECK(rows_unchanged(py, y0, n, SPARE_ROWS, k->ldy, k->ldy), "fused: rows past offsets[E] were written");
            drop(py);
        }
    for (int q = 0; q < k->n_mod; q++) {
        drop(pA[q]); drop(pB[q]);
        free(A[q]); free(B[q]);
    }
    drop(px); drop(pW); drop(pb); drop(po); drop(pg);
    free(off); free(gather); free(x); free(W); free(b); free(y0); free(u0);
}

/* The down projection's shape: expert-ordered rows, one module over all columns,
 * out = 200 and 520 (partial 256-column tiles), in = 72 (a partial k-step), ranks
 * 16, 24 (padded to 32) and 64, a scale that is not a power of two. */
TEST(moe_linear_lora_fwd_matches_cpu_without_gather)
{
    NEED_GPU();
    fused_case k = {8, 72, 200, 80, 224, COUNTS8, 0, 16, 1, {0}, {200}, 2.0f};
    fused_run(&k);
    int counts[32];
    uneven_counts(counts, 32, 3000);
    fused_case k24 = {32, 264, 520, 264, 520, counts, 0, 24, 1, {0}, {520}, 0.75f};
    fused_run(&k24);
    fused_case k64 = {32, 1032, 264, 1040, 264, counts, 0, 64, 1, {0}, {264}, 2.0f};
    fused_run(&k64);
}

/* The gate|up projection's shape: token rows through a gather, gate and up as two
 * modules on 256-aligned column ranges (up's last tile partial), 128 uneven
 * experts with empty ones, ranks 16 and 64; and gate alone, whose up columns get
 * no LoRA. */
TEST(moe_linear_lora_fwd_matches_cpu_through_a_gather_with_gate_and_up)
{
    NEED_GPU();
    int counts[128];
    uneven_counts(counts, 128, 6000);
    fused_case k = {128, 264, 520, 264, 520, counts, 8, 16, 2, {0, 256}, {256, 264}, 2.0f};
    fused_run(&k);
    fused_case k64 = {128, 136, 512, 144, 512, counts, 8, 64, 2, {0, 256}, {256, 256}, 0.75f};
    fused_run(&k64);
    fused_case kg = {8, 72, 512, 80, 512, COUNTS8, 8, 16, 1, {0}, {256}, 2.0f};
    fused_run(&kg);
}

/* One or two k-steps per tile (in = 64, 128), on the TMA kernel (ranks 16, 32)
 * and on the cp.async one (rank 64), where the B slice's copy is not waited for
 * inside the k-loop and the epilogue waits for it. */
TEST(moe_linear_lora_fwd_matches_cpu_with_one_or_two_k_steps)
{
    NEED_GPU();
    int counts[128];
    uneven_counts(counts, 128, 9000);
    fused_case k1 = {128, 64, 776, 64, 776, counts, 0, 16, 1, {0}, {776}, 2.0f};
    fused_run(&k1);
    fused_case k2 = {128, 128, 512, 128, 512, counts, 2, 16, 2, {0, 256}, {256, 256}, 2.0f};
    fused_run(&k2);
    fused_case k2r = {128, 128, 512, 128, 512, counts, 2, 32, 2, {0, 256}, {256, 256}, 2.0f};
    fused_run(&k2r);
    fused_case k1w = {128, 64, 776, 64, 776, counts, 0, 64, 1, {0}, {776}, 2.0f};
    fused_run(&k1w);
    fused_case k2w = {128, 128, 512, 128, 512, counts, 2, 64, 2, {0, 256}, {256, 256}, 2.0f};
    fused_run(&k2w);
}

/* gpt_oss's I = 2880 would put up's first column inside a 256-column tile: the op
 * then runs the unfused sequence, with the same results. */
TEST(moe_linear_lora_fwd_falls_back_when_a_module_straddles_a_tile)
{
    NEED_GPU();
    fused_case k = {8, 72, 400, 80, 400, COUNTS8, 8, 16, 2, {0, 200}, {200, 200}, 2.0f};
    fused_run(&k);
}

/* Each gradient element has one owner and a fixed summation order. */
TEST(moe_lora_bwd_is_bit_reproducible)
{
    NEED_GPU();
    int E = 32, in = 136, out = 200, R = 16, counts[32];
    uneven_counts(counts, E, 3000);
    int32_t off[33];
    int n = offsets_of(off, counts, E);
    size_t nA = (size_t)E * R * in, nB = (size_t)E * out * R;
    float *x = rnd((size_t)n * in, 1.0f), *dy = rnd((size_t)n * out, 1.0f), *A = rnd(nA, 0.1f), *B = rnd(nB, 0.1f);
    size_t ab = gpu->act_bytes, nx = (size_t)n * in;
    void *gx = gpu->alloc(gpu, nx * ab), *gdy = gpu->alloc(gpu, (size_t)n * out * ab);
    void *gdx = gpu->alloc(gpu, nx * ab), *go = gpu->alloc(gpu, sizeof off);
    float *gA = gpu->alloc(gpu, nA * 4), *gB = gpu->alloc(gpu, nB * 4);
    float *gdA = gpu->alloc(gpu, nA * 4), *gdB = gpu->alloc(gpu, nB * 4);
    gpu->act_from_f32(gpu, gx, x, nx);
    gpu->act_from_f32(gpu, gdy, dy, (size_t)n * out);
    gpu->upload(gpu, gA, A, nA * 4);
    gpu->upload(gpu, gB, B, nB * 4);
    gpu->upload(gpu, go, off, sizeof off);
    char *dx[2];
    float *dA[2], *dB[2];
    for (int run = 0; run < 2; run++) {
        gpu->zero(gpu, gdA, nA * 4);
        gpu->zero(gpu, gdB, nB * 4);
        gpu->zero(gpu, gdx, nx * ab);
        gpu->moe_lora_bwd(gpu, gdx, in, gdA, gdB, gdy, out, gx, in, NULL, 1, gA, gB, go, E, in, out, R, 2.0f, 0.1f,
                          99);
        dx[run] = ct_malloc(nx * ab);
        dA[run] = ct_malloc(nA * 4);
        dB[run] = ct_malloc(nB * 4);
        gpu->download(gpu, dx[run], gdx, nx * ab);
        gpu->download(gpu, dA[run], gdA, nA * 4);
        gpu->download(gpu, dB[run], gdB, nB * 4);
    }
    double sa = 0;
    for (size_t i = 0; i < nA; i++) sa += fabs(dA[0][i]);
    CHECK(sa > 0 && isfinite(sa), "dA is zero or not finite (sum |dA| = %g)", sa);
    CHECK(memcmp(dA[0], dA[1], nA * 4) == 0, "dA differs between two identical runs");
    CHECK(memcmp(dB[0], dB[1], nB * 4) == 0, "dB differs between two identical runs");
    CHECK(memcmp(dx[0], dx[1], nx * ab) == 0, "dx differs between two identical runs");
    for (int run = 0; run < 2; run++) {
        free(dx[run]); free(dA[run]); free(dB[run]);
    }
    gpu->free(gpu, gx); gpu->free(gpu, gdy); gpu->free(gpu, gdx); gpu->free(gpu, go);
    gpu->free(gpu, gA); gpu->free(gpu, gB); gpu->free(gpu, gdA); gpu->free(gpu, gdB);
    free(x); free(dy); free(A); free(B);
}

int main(void)
{
    ct_error err = {0};
    cpu = backend_cpu_new();
    ct_rng_seed(&rng, 20261207);
    gpu = backend_cuda_new(&err);
    if (!gpu) printf("# CUDA backend unavailable: %s\n", err.msg);
    RUN(moe_linear_fwd_matches_cpu_on_edge_tiles_with_bias_accumulate_and_strides);
    RUN(moe_linear_fwd_one_expert_with_all_rows_and_a_single_row);
    RUN(moe_linear_fwd_matches_cpu_with_128_uneven_experts);
    RUN(moe_linear_fwd_matches_cpu_over_a_long_reduction);
    RUN(moe_linear_fwd_through_a_gather_matches_cpu);
    RUN(moe_linear_fwd_and_bwd_input_with_many_tiles_per_block_and_one_k_step);
    RUN(moe_linear_bwd_input_matches_cpu_on_edge_tiles_overwrite_and_accumulate);
    RUN(moe_linear_bwd_input_matches_cpu_with_uneven_experts);
    RUN(moe_linear_lora_bwd_input_adds_the_lora_term_in_the_gemm);
    RUN(moe_lora_fwd_bwd_match_cpu_without_dropout);
    RUN(moe_lora_dropout_masks_match_cpu_per_expert);
    RUN(moe_lora_matches_cpu_with_128_uneven_experts_and_rank_64);
    RUN(moe_lora_bwd_matches_cpu_over_several_row_chunks);
    RUN(moe_lora_through_a_gather_matches_cpu);
    RUN(moe_lora_bwd_cols_of_two_modules_matches_cpu);
    RUN(moe_lora_bwd_is_bit_reproducible);
    RUN(moe_linear_lora_fwd_matches_cpu_without_gather);
    RUN(moe_linear_lora_fwd_matches_cpu_through_a_gather_with_gate_and_up);
    RUN(moe_linear_lora_fwd_matches_cpu_with_one_or_two_k_steps);
    RUN(moe_linear_lora_fwd_falls_back_when_a_module_straddles_a_tile);
    if (gpu) gpu->destroy(gpu);
    cpu->destroy(cpu);
    return check_summary();
}
