/* moe_gemm.cu — the grouped expert GEMMs of mixture-of-experts layers (backend.h,
 * "mixture of experts"): one launch serves every expert. The expert LoRA over the
 * same rows is moe_expert_lora.cu; the row layout, the gather and the tile schedule all
 * of them share are described in moe_gemm.cuh.
 *   moe_linear_fwd             y[r] (=|+=) x_r @ W_e^T + bias_e   W (E,out,in), bias (E,out)
 *   moe_linear_bwd_input       dx[r] (=|+=) dy[r] @ W_e
 *   moe_linear_lora_bwd_input  dx[r] (=|+=) dy[r] @ W_e + the modules' LoRA term
 * The input rows x_r of moe_linear_fwd are x[r], or with gather x[gather[r] / K].
 *
 * Every call runs moe_gemm_tma.cu's warp-specialized TMA kernel (its producer
 * warpgroup copies gathered rows with cp.async); this file checks the arguments,
 * and for the LoRA input gradient lets kernel_choice.cu decide where g = dy B is
 * computed. The earlier generations (v1 on mma.sync, v2 on cp.async + wgmma) were
 * removed once v3 was faster on every call; their design and figures are in
 * docs/kernels/moe_gemm.md, v2's plumbing lives on in moe_gemm_tiles.cuh for
 * moe_gemm_fused_lora.cu's rank-64 fused kernel. */
#include "kernel_choice.cuh"
#include "moe_gemm.cuh"

// ---- kernels ----

/* The stacked, scaled A of moe_linear_lora_bwd_input when g comes from
 * moe_lora_g: dst (E, rows, in) bf16, row q R + k of expert e = scale * A_q[e, k,
 * :], rows from n R on zero. One thread per (expert, column): each row's element,
 * coalesced across columns. */
struct lora_stack {
    const float *A[2];
    int n;
};

__global__ void lora_stack_kernel(bf16 *dst, lora_stack ls, int E, int R, int rows, int in, float scale)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < E * in; i += gridDim.x * blockDim.x) {
        const int e = i / in, c = i - e * in;
        bf16 *d = dst + (size_t)e * rows * in + c;
        for (int k = 0; k < rows; k++) {
            const int q = k / R;
            const float a = q < ls.n ? scale * ls.A[q][((size_t)e * R + k % R) * in + c] : 0.0f;
            d[(size_t)k * in] = __float2bfloat16_rn(a);
        }
    }
}

// ---- launchers ----

void moe_gemm_check(const char *op, const void *y, int ldy, const void *x, int ldx, const void *W, const void *bias,
                    int E, int in, int out)
{
    CT_ASSERT(E >= 1 && E <= MOE_MAX_E, "%s: E = %d experts (1..%d are supported)", op, E, MOE_MAX_E);
    CT_ASSERT(in > 0 && out > 0 && in % 8 == 0 && out % 8 == 0,
              "%s: in = %d and out = %d must be positive multiples of 8 (16-byte rows)", op, in, out);
    CT_ASSERT(ldx % 8 == 0 && ldy % 8 == 0 && aligned16(x) && aligned16(y) && aligned16(W),
              "%s: operands must be 16-byte aligned with row strides multiple of 8 (ldx %d, ldy %d)", op, ldx, ldy);
    CT_ASSERT(!bias || ((uintptr_t)bias & 3) == 0, "%s: bias must be 4-byte aligned", op);
}

static void cuda_moe_linear_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx, const int32_t *gather,
                                int K, const void *W, const void *bias, const int32_t *offsets, int E, int in, int out,
                                int accumulate)
{
    moe_gemm_check("moe_linear_fwd", y, ldy, x, ldx, W, bias, E, in, out);
    CT_ASSERT(!gather || K >= 1, "moe_linear_fwd: K = %d experts per token with a gather", K);
    gemm_args p = {(bf16 *)y, (const bf16 *)x, gather, (const bf16 *)W, (const bf16 *)bias, offsets,
                   ldy, ldx, gather ? K : 1, E, out, in, accumulate};
    moe_gemm_tma(ctx_of(be), p, false, NULL);
}

static void cuda_moe_linear_bwd_input(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                                      const void *W, const int32_t *offsets, int E, int in, int out,
                                      int accumulate)
{
    moe_gemm_check("moe_linear_bwd_input", dx, lddx, dy, lddy, W, NULL, E, in, out);
    gemm_args p = {(bf16 *)dx, (const bf16 *)dy, NULL, (const bf16 *)W, NULL, offsets, lddx, lddy, 1, E, in, out,
                   accumulate};
    moe_gemm_tma(ctx_of(be), p, true, NULL);
}

static int grid_cap(size_t threads) { return grid_for(threads, 256) < 8192 ? grid_for(threads, 256) : 8192; }

/* dx = dy W_e + scale * g [A_1,e; A_2,e] with g = dy [B_1,e; B_2,e] (backend.h).
 * Where choose_g_in_gemm says so, one TMA GEMM computes g beside the product
 * (moe_gemm_tma_lora, the modules as one LoRA of rank RP: Au = the stacked B^T, Bu
 * = the stacked A, from lora_convert_cols), adds its term before the epilogue and
 * stores g. Else g by moe_lora_g, then the TMA GEMM with the term as one more
 * k-step (g's 64 columns times the stacked, scaled A). */
static void cuda_moe_linear_lora_bwd_input(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                                           const void *W, const int32_t *offsets, int E, int in, int out,
                                           int accumulate, void *g, int ldg, const ct_lora_cols *lora,
                                           int n_lora, int R, float scale)
{
    const char *op = "moe_linear_lora_bwd_input";
    moe_gemm_check(op, dx, lddx, dy, lddy, W, NULL, E, in, out);
    CT_ASSERT(n_lora >= 1 && n_lora <= 2 && R >= 1 && n_lora * R <= 64,
              "%s: %d LoRA modules of rank %d (1..2 modules, 64 ranks in all are supported)", op, n_lora, R);
    CT_ASSERT(ldg >= 64 && ldg % 8 == 0 && aligned16(g), "%s: g needs a 16-byte aligned row stride >= 64 (%d)", op,
              ldg);
    cuda_ctx *c = ctx_of(be);
    const int RP = moe_u_cols(n_lora, R);
    gemm_args p = {(bf16 *)dx, (const bf16 *)dy, NULL, (const bf16 *)W, NULL, offsets, lddx, lddy, 1, E, in, out,
                   accumulate};
    if (choose_g_in_gemm(in, RP)) {
        const size_t nA = (size_t)E * RP * in, nB = (size_t)E * RP * out;
        scratch_carver sc = {(char *)cuda_scratch(c, scratch_round(nA * 2) + scratch_round(nB * 2)), 0};
        bf16 *Ap = (bf16 *)scratch_take(&sc, nA * 2), *Bt = (bf16 *)scratch_take(&sc, nB * 2);
        lora_convert_cols(c->stream, Ap, NULL, Bt, lora, n_lora, E, R, RP, in, out);
        fused_lora f = {};
        f.Au[0] = Bt;
        f.Bu[0] = Ap;
        f.col0[0] = 0;
        f.cols[0] = in;
        f.n_mod = 1;
        f.R = RP;
        f.RP = RP;
        f.ucols = RP; /* g's padded ranks too (zero: Bt's are), as moe_lora_bwd_cols reads them */
        f.ldu = ldg;
        f.scale = scale;
        f.u = (bf16 *)g;
        moe_gemm_tma_lora(c, p, true, f);
        return;
    }
    moe_lora_g(be, g, ldg, dy, lddy, out, offsets, E, in, lora, n_lora, R);
    const int rows = 64; /* the k-step reads 64 columns of g */
    const size_t nA = (size_t)E * rows * in;
    bf16 *A = (bf16 *)cuda_scratch(c, nA * sizeof(bf16));
    lora_stack ls = {{lora[0].A, n_lora > 1 ? lora[1].A : NULL}, n_lora};
    lora_stack_kernel<<<grid_cap((size_t)E * in), 256, 0, c->stream>>>(A, ls, E, R, rows, in, scale);
    LAUNCH_CHECK();
    const tma_lora tl = {(const bf16 *)g, A, ldg};
    moe_gemm_tma(c, p, true, &tl);
}

void cuda_fill_moe_gemm_ops(ct_backend *be)
{
    moe_gemm_tma_init(ctx_of(be));
    be->moe_linear_fwd = cuda_moe_linear_fwd;
    be->moe_linear_bwd_input = cuda_moe_linear_bwd_input;
    be->moe_linear_lora_bwd_input = cuda_moe_linear_lora_bwd_input;
}
