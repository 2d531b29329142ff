/* moe_gemm_fused_lora.cu — the grouped expert GEMM forward with the expert LoRA fused in
 * (backend.h, moe_linear_lora_fwd): one launch computes
 *   y[r] (=|+=) x_r @ W_e^T + bias_e + scale * (x_r A_q,e^T) B_q,e^T
 * where q is the LoRA module that owns y's column (at most two modules, each on a
 * column range: gate and up of a gate|up GEMM; columns of no module get no LoRA).
 * It replaces moe_linear_fwd followed by moe_lora_fwd (dropout 0) per module: the
 * separate LoRA pass re-reads the (gathered) input rows and read-modify-writes y,
 * hundreds of MB per layer at T = 16384, K = 8 (H200: ~1.3 ms per layer forward
 * for qwen3-30b-a3b, against ~5.2 ms for all the base GEMMs).
 *
 * Kernels (kernel_choice.cu picks): moe_gemm_tma.cu's TMA kernel at padded ranks
 * RP = 16 and 32, with the pieces of moe_gemm_fused_lora.cuh; at RP = 64, which its
 * ring cannot hold, this file's kernel. Else the unfused sequence.
 *
 * Design of this file's kernel: the cp.async + wgmma grouped GEMM (v2, its loads,
 * raster and epilogue in moe_gemm_tiles.cuh) with two additions per 128x256 tile.
 *  - k-loop: each stage also holds A_e's k-slice (RP rows x 64, 128-byte swizzle,
 *    the layout of W's rows), and each warpgroup issues one more wgmma per 16-deep
 *    step, m64nRPk16 (SS), on the x rows already in shared memory for the base
 *    product: u (64 x RP fp32, RP / 2 registers) = x_r A_e^T. Each column tile
 *    recomputes its rows' u: RP / 256 more MMA work (16 / 256 = 6% at R = 16).
 *  - epilogue: u is rounded to bf16 (as moe_expert_lora.cu and linear_lora.cu round it) and fed
 *    from registers as wgmma's A operand (RS, the way attention_fwd_sm90.cu feeds
 *    P), with B_e^T's 256-column slice (RP x 256, MN-major, 4 panels of 64 columns)
 *    from shared memory: acc = scale * (acc / scale + u B^T), so the LoRA term is
 *    scaled exactly as moe_expert_lora.cu scales it (up to fp32 rounding), then the
 *    unchanged v2 epilogue (bias, accumulate, one rounding to bf16).
 * The B slice has one buffer: it is copied at the tile's first k-step (after that
 * step's barrier, which every warpgroup reaches only after the previous tile's
 * epilogue wgmmas retired) in the cp.async group of that step's prefetch, so it
 * has landed by the barrier of k-step AHEAD; with KT <= AHEAD k-steps the
 * epilogue waits for it (and for the next tile's prefetch) explicitly.
 * A tile's columns never straddle two modules: the launcher fuses only when every
 * module starts on a multiple of 256 columns (qwen3-30b-a3b: I = 768; gpt_oss's
 * one gate_up module starts at 0), else it runs the unfused sequence. Columns past
 * a module's end inside its last tile read zero-filled B (they get no LoRA).
 *
 * Budget at RP = 64 (1 block per SM, 256 threads): 3 stages of 16 + 32 + 8 KB
 * (x, W, A_e) and a 32 KB B slice, 201 KB dynamic + 8.2 KB schedule of the 227 KB
 * (4 stages do not fit, so loads run one k-step ahead instead of two); 238
 * registers (ptxas, CUDA 13.0, sm_90a: 128 accumulators + 32 for u), no spills,
 * no wgmma serialization warnings. (It ran RP = 16 and 32 too, 4 and 3 stages,
 * until the TMA kernel took them.)
 * Dropout is not supported: the caller uses the fused op only with dropout 0.
 * Not yet: straddling tiles (two modules' u per tile). Measurements:
 * docs/kernels/moe_gemm.md. */
#include "kernel_choice.cuh"
#include "moe_gemm_fused_lora.cuh"

#include <climits>
#include <cmath>

// ---- kernels ----

namespace fl {
constexpr int MAX_MODULES = FUSED_LORA_MODULES;
__host__ __device__ constexpr int stages(int RP) { return RP == 16 ? 4 : 3; }
__host__ __device__ constexpr int a_bytes(int RP) { return RP * wg::ROW_BYTES; }     /* A_e's k-slice */
__host__ __device__ constexpr int stage_bytes(int RP) { return wg::STAGE_BYTES + a_bytes(RP); }
__host__ __device__ constexpr int b_bytes(int RP) { return RP * wg::BN * 2; }        /* B^T's column slice */
constexpr size_t smem_bytes(int RP) { return (size_t)stages(RP) * stage_bytes(RP) + b_bytes(RP) + 1024; }
}

/* The call: the GEMM's arguments and its modules (moe_gemm.cuh). */
struct fused_args {
    gemm_args p;
    fused_lora l;
};

/* This thread's first A_e row of the stage copies (row tid/8 at column 8 (tid%8),
 * then rows + 32 i), or NULL when the tile has no module or the row is past RP. */
template <int RP>
__device__ __forceinline__ const bf16 *lora_a_rows(const fused_args &f, int q, int e)
{
    const int r = threadIdx.x >> 3;
    if (q < 0 || r >= RP) return NULL;
    const bf16 *Ap = q == 0 ? f.l.Au[0] : f.l.Au[1];
    return Ap + ((size_t)e * RP + r) * f.p.K + (threadIdx.x & 7) * 8;
}

/* Queues A_e's k-step kt (RP rows x 64, zero past K) into the swizzled slice at s. */
template <int RP>
__device__ __forceinline__ void lora_a_stage(const bf16 *la, int K, uint32_t s, int kt)
{
    const int tid = threadIdx.x, c = tid & 7, k0 = kt * wg::BK;
    const bool ok = k0 + c * 8 < K;
#pragma unroll
    for (int i = 0; i < (RP + 31) / 32; i++)
        if ((tid >> 3) + 32 * i < RP) cp_async16_s(s + swz((tid >> 3) + 32 * i, c), ok ? la + (size_t)32 * i * K + k0 : la, ok);
}

/* Queues B^T's slice of module q for expert e and tile columns n0..n0+255 (RP rows
 * k, 256 columns as 4 MN-major panels of 64) into slb; zero past the module's
 * columns. Thread: column chunk tid%32 (panel chunk/8), rows k = tid/32 + 8 i. */
template <int RP>
__device__ __forceinline__ void lora_b_slice(uint32_t slb, const fused_args &f, int q, int e, int n0)
{
    const int cols = f.l.cols[q], tid = threadIdx.x, nc = tid & 31, c = n0 - f.l.col0[q] + nc * 8;
    const bool ok = c < cols;
    const bf16 *src = (q == 0 ? f.l.Bu[0] : f.l.Bu[1]) + (size_t)e * RP * cols + (ok ? c : 0);
#pragma unroll
    for (int i = 0; i < RP / 8; i++) {
        const int k = (tid >> 5) + 8 * i;
        cp_async16_s(slb + (nc >> 3) * lora_b_panel<RP>() + swz(k, nc & 7), src + (size_t)k * cols, ok);
    }
}

/* Persistent: block b takes tiles b, b + grid, ...; their k-steps form one stream
 * (step s = k-step s % KT of the block's tile s / KT), loaded AH = stages - 2
 * steps ahead, across tile boundaries, so the next tile's first loads fly during
 * this tile's last steps and epilogue. Step s: wait for its stage, barrier, issue
 * its wgmmas (async), queue the loads of step s + AH into the stage step s - 2
 * used, then wait until at most one wgmma group (step s's) is in flight. The
 * barrier of step s comes after every warpgroup waited on step s - 2's wgmmas,
 * hence the stage is free. A warpgroup whose 64 rows are all past the tile's rows
 * (an expert's last, partial tile) skips its wgmmas and stores. Tiles and k-steps
 * are two nested loops, not one flat loop over steps: with the epilogue inside
 * the step loop, ptxas inserts a wait for all wgmmas at every step (C7517), which
 * serializes them. To v2's loop this adds u's wgmma per step and lora_add before
 * the epilogue. u's wgmma runs in every tile, also those of no module (whose A_e
 * slice is not copied: u is then garbage and unused): issued under `if (q >= 0)`,
 * ptxas serializes all the loop's wgmmas (C7520, WG.AR in a divergent path). */
template <int RP>
__global__ void __launch_bounds__(wg::NTHREADS, 1) moe_wgmma_lora_kernel(fused_args f)
{
    using namespace wg;
    constexpr int ST = fl::stages(RP), AH = ST - 2, SB = fl::stage_bytes(RP);
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ moe_sched sch;
    const gemm_args &p = f.p;
    const uint32_t smem0 = ((uint32_t)__cvta_generic_to_shared(dyn_smem) + 1023u) & ~1023u;
    const uint32_t slb = smem0 + ST * SB; /* B^T slice of the current tile */
    const int wgi = threadIdx.x >> 7;
    sched_load(sch, p.offsets, p.E);
    const int n_rt = sched_tiles(sch, p.E, BM, INT_MIN, INT_MAX);
    const int n_ct = (p.N + BN - 1) / BN, total = n_rt * n_ct, KT = (p.K + BK - 1) / BK;
    const int mine = (int)blockIdx.x < total ? (total - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int steps = mine * KT;

    wg_loads ld;
    const bf16 *la = NULL;
    int l_step = 0, l_kt = 0, l_tile = blockIdx.x;
    auto load_next = [&]() {
        if (l_step < steps) {
            if (l_kt == 0) {
                int rt, ct;
                tile_coords(l_tile, n_rt, n_ct, GROUP, rt, ct);
                const row_tile t = sched_find(sch, p.E, BM, INT_MIN, INT_MAX, rt);
                wg_loads_init(ld, p, t, ct * BN);
                la = lora_a_rows<RP>(f, lora_tile_module(f.l.col0, f.l.cols, f.l.n_mod, ct * BN), t.e);
            }
            const uint32_t s = smem0 + (l_step % ST) * SB;
            wg_load_stage(ld, p, s, l_kt);
            if (la) lora_a_stage<RP>(la, p.K, s + STAGE_BYTES, l_kt);
            l_step++;
            if (++l_kt == KT) {
                l_kt = 0;
                l_tile += gridDim.x;
            }
        }
        cp_async_commit();
    };

    float acc[128], u[RP / 2];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < RP / 2; i++) u[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < AH; i++) load_next();
    int s = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        int rt, ct;
        tile_coords(tile, n_rt, n_ct, GROUP, rt, ct);
        const row_tile t = sched_find(sch, p.E, BM, INT_MIN, INT_MAX, rt);
        const int n0 = ct * BN, q = lora_tile_module(f.l.col0, f.l.cols, f.l.n_mod, n0);
        const bool live = wgi * 64 < t.rows;
        for (int kt = 0; kt < KT; kt++, s++) {
            cp_async_wait<AH - 1>();
            fence_proxy_async();
            __syncthreads();
            const uint32_t st = smem0 + (s % ST) * SB;
            if (live) {
                const uint32_t sa = st + wgi * 64 * ROW_BYTES, sb = st + A_BYTES, sl = st + STAGE_BYTES;
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < BK / 16; ks++) {
                    const uint64_t da = wgmma_desc(sa + ks * 32, 16, 1024);
                    wgmma_m64n256k16_ss<false>(acc, da, wg_b_desc<false>(sb, ks), kt > 0 || ks > 0);
                    lora_u_mma<RP>(u, da, wgmma_desc(sl + ks * 32, 16, 1024), kt > 0 || ks > 0);
                }
                wgmma_commit();
            }
            if (kt == 0 && q >= 0) lora_b_slice<RP>(slb, f, q, t.e, n0); /* rides with this step's prefetch */
            load_next();
            wgmma_wait<1>();
        }
        wgmma_wait<0>();
        wgmma_acc_fence(acc);
        wgmma_acc_fence(u);
        if (q >= 0) {
            if (KT <= AH) { /* the B slice's group was never waited for in the k-loop */
                cp_async_wait<0>();
                fence_proxy_async();
                __syncthreads();
            }
            if (live && f.l.u && n0 == f.l.col0[q]) /* one column tile stores */
                lora_store_u<RP>(f.l.u, f.l.ldu, q * f.l.R, f.l.ucols, u, t.m0, 0, t.rows, wgi);
            if (live) lora_add<RP>(acc, u, slb, f.l.scale);
        }
        if (live) wg_epilogue(p, acc, t.e, t.m0, 0, t.rows, n0, wgi);
    }
    cp_async_wait<0>();
}

// ---- launchers ----

/* Ranks padded to 16, 32 or 64, as the expert LoRA pads them. */
static int padded_rank(int R) { return R <= 16 ? 16 : R <= 32 ? 32 : 64; }

/* This file's kernel, at RP = 64 (kernel_choice.cu). */
static void fused_launch_cp_async(cuda_ctx *c, const fused_args &f)
{
    moe_wgmma_lora_kernel<64><<<c->occupancy.cp_async_fused * c->num_sms, wg::NTHREADS, fl::smem_bytes(64),
                                c->stream>>>(f);
    LAUNCH_CHECK();
}

/* Fusable when every module starts on a 256-column tile boundary (no tile
 * straddles two modules) and scale is a finite non-zero number (the epilogue
 * divides by it); otherwise the sequence the op stands for: moe_linear_fwd, then
 * moe_lora_fwd per module, which writes no u. */
static bool cuda_moe_linear_lora_fwd(ct_backend *be, void *y, int ldy, const void *x, int ldx,
                                     const int32_t *gather, int K, const void *W, const void *bias,
                                     const int32_t *offsets, int E, int in, int out, int accumulate,
                                     const ct_lora_cols *lora, int n_lora, int R, float scale, void *u, int ldu)
{
    const char *op = "moe_linear_lora_fwd";
    moe_gemm_check(op, y, ldy, x, ldx, W, bias, E, in, out);
    CT_ASSERT(!gather || K >= 1, "%s: K = %d experts per token with a gather", op, K);
    CT_ASSERT(n_lora >= 0 && n_lora <= fl::MAX_MODULES, "%s: %d LoRA modules (0..%d are supported)", op, n_lora,
              fl::MAX_MODULES);
    CT_ASSERT(n_lora == 0 || (R >= 1 && R <= 64), "%s: LoRA rank %d is not supported (1..64 are)", op, R);
    bool fusable = n_lora > 0 && scale != 0.0f && std::isfinite(scale);
    for (int q = 0; q < n_lora; q++) {
        const ct_lora_cols &m = lora[q];
        CT_ASSERT(m.col0 >= 0 && m.cols > 0 && m.col0 % 8 == 0 && m.cols % 8 == 0 && m.col0 + m.cols <= out,
                  "%s: LoRA module %d on columns [%d, %d) is not inside [0, %d) on multiples of 8", op, q, m.col0,
                  m.col0 + m.cols, out);
        CT_ASSERT(q == 0 || m.col0 >= lora[q - 1].col0 + lora[q - 1].cols,
                  "%s: LoRA modules must be in column order without overlap", op);
        fusable &= m.col0 % wg::BN == 0;
    }
    const int RP = padded_rank(R);
    const moe_lora_fwd_choice kind = choose_moe_lora_fwd(fusable, RP);
    if (kind == MOE_LORA_FWD_UNFUSED) {
        be->moe_linear_fwd(be, y, ldy, x, ldx, gather, K, W, bias, offsets, E, in, out, accumulate);
        for (int q = 0; q < n_lora; q++)
            be->moe_lora_fwd(be, (bf16 *)y + lora[q].col0, ldy, x, ldx, gather, K, lora[q].A, lora[q].B, offsets, E,
                             in, lora[q].cols, R, scale, 0.0f, 0);
        return false;
    }
    CT_ASSERT(!u || ldu >= n_lora * R, "%s: ldu %d < %d ranks", op, ldu, n_lora * R);

    cuda_ctx *c = ctx_of(be);
    size_t bytes = 0;
    for (int q = 0; q < n_lora; q++)
        bytes += scratch_round((size_t)E * RP * in * 2) + scratch_round((size_t)E * RP * lora[q].cols * 2);
    scratch_carver sc = {(char *)cuda_scratch(c, bytes), 0};
    fused_args f = {};
    f.p = {(bf16 *)y, (const bf16 *)x, gather, (const bf16 *)W, (const bf16 *)bias, offsets,
           ldy, ldx, gather ? K : 1, E, out, in, accumulate};
    f.l.n_mod = n_lora;
    f.l.scale = scale;
    f.l.u = (bf16 *)u;
    f.l.ldu = ldu;
    f.l.R = R;
    f.l.RP = RP;
    f.l.ucols = R;
    for (int q = 0; q < n_lora; q++) {
        bf16 *Ap = (bf16 *)scratch_take(&sc, (size_t)E * RP * in * 2);
        bf16 *Bt = (bf16 *)scratch_take(&sc, (size_t)E * RP * lora[q].cols * 2);
        const size_t n = (size_t)E * ((size_t)in + lora[q].cols); /* one thread per column */
        lora_convert_kernel<<<grid_for(n, 256) < 8192 ? grid_for(n, 256) : 8192, 256, 0, c->stream>>>(
            Ap, NULL, NULL, Bt, lora[q].A, lora[q].B, E, R, RP, in, lora[q].cols);
        LAUNCH_CHECK();
        f.l.Au[q] = Ap;
        f.l.Bu[q] = Bt;
        f.l.col0[q] = lora[q].col0;
        f.l.cols[q] = lora[q].cols;
    }
    if (kind == MOE_LORA_FWD_TMA) moe_gemm_tma_lora(c, f.p, false, f.l);
    else fused_launch_cp_async(c, f);
    return u != NULL;
}

void cuda_fill_moe_gemm_lora_ops(ct_backend *be)
{
    ctx_of(be)->occupancy.cp_async_fused =
        kernel_setup((const void *)moe_wgmma_lora_kernel<64>, wg::NTHREADS, fl::smem_bytes(64));
    be->moe_linear_lora_fwd = cuda_moe_linear_lora_fwd;
}
