/* attention_bwd.cu — backward of the varlen causal GQA flash attention: delta,
 * then dq and dk/dv in two deterministic kernels, here on mma.sync at D = 32
 * and 256, at D = 64 on wgmma (attention_bwd_sm90.cu), at D = 128 on two
 * warpgroups each (attention_bwd_dq_2wg.cu, attention_bwd_dkdv_2wg.cu);
 * kernel_choice.cu has the rule. The contract and the work list are
 * attention.cu's header comment; the algorithm and pipelining are described in
 * docs/kernels/attention.md.
 *
 * D = 256: dq is attn_bwd_dq_kernel over 32-key steps (64-key steps spill S and
 * dP beside the 128 accumulator registers). dk and dv of one warp's 16 keys
 * would take 256 registers a thread, so attn_bwd_dkdv_split_kernel gives them to
 * two warps, 8 per 64-key tile. Resources (ptxas, sm_90a, CUDA 13.0, no spills):
 * dq 255 registers, 132 KB shared, 1 block per multiprocessor; split dk/dv 253
 * registers, 215 KB, 1 block of 8 warps; the forward (attention.cu) 255
 * registers, 99 KB, 2 blocks. */
#include "attention.cuh"
#include "kernel_choice.cuh"

#define SPLIT_THREADS 256 /* the D = 256 dk/dv kernel: a dv warp and a dk warp per 16 keys */

// ---- kernels ----

/* delta (nq, T) = rowsum(dout * out) and lse2 (nq, T) = lse * log2 e, head-major.
 * A row (token t, head h) takes L = min(D / 8, 32) lanes, 8 columns per lane per
 * step; a warp takes 32 / L consecutive rows of one head's order (row r is head
 * r / T, token r % T), so the head-major stores of delta and lse2 are coalesced.
 * (One warp per row left half of the lanes idle at D = 128 and scattered its two
 * stores; the sums are the same, in the same order.) */
template <int D>
__global__ void attn_delta_kernel(float *delta, float *lse2, const bf16 *dout, int lddo, const bf16 *out,
                                  int ldo, const float *lse, int T, int nq)
{
    constexpr int L = D / 8 < 32 ? D / 8 : 32;
    const int lane = threadIdx.x % 32;
    const size_t r = ((size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * (32 / L) + lane / L;
    const bool live = r < (size_t)T * nq;
    const size_t h = live ? r / T : 0, t = live ? r % T : 0;
    float acc = 0.0f;
    if (live)
        for (int i = (lane % L) * 8; i < D; i += 8 * L) {
            float a[8], b[8];
            load8(a, dout + t * lddo + h * D + i);
            load8(b, out + t * ldo + h * D + i);
#pragma unroll
            for (int j = 0; j < 8; j++) acc += a[j] * b[j];
        }
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (live && lane % L == 0) {
        delta[r] = acc;
        lse2[r] = lse[t * nq + h] * LOG2E;
    }
}

/* dq for one 64-query tile: dS = P (dP - delta), dq = scale * dS K, over key
 * tiles of Cfg<D>::KT rows (at D = 256, 64-key tiles spill S and dP). */
template <int D>
__global__ void __launch_bounds__(THREADS)
attn_bwd_dq_kernel(bf16 *dq, int lddq, const bf16 *dout, int lddo, const float *lse2,
                   const float *delta, const bf16 *q, int ldq, const bf16 *k, int ldk,
                   const bf16 *v, int ldv, const int4 *tiles, int T, int nq, int group,
                   float scale, float scale_log2, int window)
{
    constexpr int KT = Cfg<D>::KT, TS = TILE * Cfg<D>::ROW, KS = KT * Cfg<D>::ROW;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Qs = (bf16 *)smem_raw, *dOs = Qs + TS, *Ks = dOs + TS, *Vs = Ks + 2 * KS; /* K, V: two stages */
    const auto [h, start, len, tile] = work_entry_of(tiles, nq);
    const int kvh = h / group;
    if (len == 0) return;
    const int q0 = ((len + TILE - 1) / TILE - 1 - tile) * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    const auto [kmin, n] = key_tiles<TILE, KT>(q0, len, window);
    const bf16 *kb = k + (size_t)start * ldk + (size_t)kvh * D, *vb = v + (size_t)start * ldv + (size_t)kvh * D;
    load_tile_async<D, TILE>(Qs, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, min(TILE, len - q0));
    load_tile_async<D, TILE>(dOs, dout + (size_t)(start + q0) * lddo + (size_t)h * D, lddo, min(TILE, len - q0));
    load_tile_async<D, KT>(Ks, kb + (size_t)kmin * ldk, ldk, min(KT, len - kmin));
    load_tile_async<D, KT>(Vs, vb + (size_t)kmin * ldv, ldv, min(KT, len - kmin));
    cp_async_commit();

    const int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
    float lse2r[2], dl[2];
    load_row_stats(lse2r, dl, lse2, delta, h, T, start, row, len);
    float acc[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

    for (int it = 0; it < n; it++) {
        const int k0 = kmin + it * KT;
        const bf16 *Kc = Ks + (it & 1) * KS, *Vc = Vs + (it & 1) * KS;
        kv_prefetch<D, KT>(Ks + ((it + 1) & 1) * KS, Vs + ((it + 1) & 1) * KS, kb, ldk, vb, ldv, it + 1 < n,
                           k0 + KT, len);
        __syncthreads(); /* stage it & 1 (and, at it = 0, Q and dO) has landed */

        float s[KT / 8][4], dp[KT / 8][4];
#pragma unroll
        for (int i = 0; i < KT / 8; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
        mma_abt_pair<D, KT>(s, dp, Qs, dOs, Kc, Vc, warp);
        /* mask_tile, written out: through the helper ptxas schedules this kernel
         * differently (the other kernels call it). */
        if (needs_mask<KT>(q0, TILE, k0, len, window)) {
#pragma unroll
            for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!visible(row[e / 2], k0 + nt * 8 + 2 * (lane % 4) + (e & 1), len, window))
                        s[nt][e] = -INFINITY;
        }
#pragma unroll
        for (int nt = 0; nt < KT / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(s[nt][e] * scale_log2 - lse2r[e / 2]); /* masked: exp2(-inf) = 0 */
                s[nt][e] = p;
                dp[nt][e] = p * (dp[nt][e] - dl[e / 2]);
            }
        }
        mma_pb<D, KT>(acc, dp, Kc);
        __syncthreads(); /* stage it & 1 is consumed */
    }
    dq_store<D>(dq, lddq, h, start, len, row, acc, scale);
}

/* dk, dv for one 64-key tile of one kv head, summed over its query heads:
 * dv = P^T dO, dk = scale * dS^T Q, with P^T and dS^T computed key-major. The
 * (head, query tile) steps run as one sequence so that the two-stage pipeline
 * crosses head boundaries; the sum order (heads, then queries ascending) is fixed. */
template <int D>
__global__ void __launch_bounds__(THREADS)
attn_bwd_dkdv_kernel(bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo,
                     const float *lse2, const float *delta, const bf16 *q, int ldq, const bf16 *k,
                     int ldk, const bf16 *v, int ldv, const int4 *tiles, int T, int nkv, int group,
                     float scale, float scale_log2, int window)
{
    constexpr int ROW = Cfg<D>::ROW, QT = Cfg<D>::QT, QS = QT * ROW;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Ks = (bf16 *)smem_raw, *Vs = Ks + TILE * ROW;
    bf16 *Qs = Vs + TILE * ROW, *dOs = Qs + 2 * QS;            /* two stages each */
    float *lse2_s = (float *)(dOs + 2 * QS), *dl_s = lse2_s + 2 * QT; /* (2, QT) each */
    const work_entry w = work_entry_of(tiles, nkv); /* no structured binding: issue() captures these */
    const int kvh = w.head, start = w.start, len = w.len;
    if (len == 0) return;
    const int k0 = w.tile * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    /* Queries that see some key of this tile: i >= k0 and i < k0 + TILE - 1 + window. */
    const int qend = window > 0 ? min(len, k0 + TILE - 1 + window) : len;
    const int nqt = (qend - k0 + QT - 1) / QT, nsteps = nqt * group;
    auto issue = [&](int step, int stage) {
        const int h = kvh * group + step / nqt, q0 = k0 + (step % nqt) * QT, valid = min(QT, len - q0);
        load_tile_async<D, QT>(Qs + stage * QS, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, valid);
        load_tile_async<D, QT>(dOs + stage * QS, dout + (size_t)(start + q0) * lddo + (size_t)h * D, lddo, valid);
        load_step_stats<QT>(lse2_s, dl_s, stage, lse2, delta, h, T, start, q0, valid);
    };
    load_tile_async<D, TILE>(Ks, k + (size_t)(start + k0) * ldk + (size_t)kvh * D, ldk, min(TILE, len - k0));
    load_tile_async<D, TILE>(Vs, v + (size_t)(start + k0) * ldv + (size_t)kvh * D, ldv, min(TILE, len - k0));
    issue(0, 0);
    cp_async_commit();

    const int key[2] = {k0 + warp * 16 + lane / 4, k0 + warp * 16 + lane / 4 + 8};
    float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
        dka[i][0] = dka[i][1] = dka[i][2] = dka[i][3] = dva[i][0] = dva[i][1] = dva[i][2] = dva[i][3] = 0.0f;

    for (int step = 0; step < nsteps; step++) {
        const int stage = step & 1, q0 = k0 + (step % nqt) * QT;
        if (step + 1 < nsteps) {
            issue(step + 1, stage ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); /* this stage (and, at step 0, K and V) has landed */
        const bf16 *Qc = Qs + stage * QS, *dOc = dOs + stage * QS;
        const float *lse2c = lse2_s + stage * QT, *dlc = dl_s + stage * QT;

        float s[QT / 8][4], dp[QT / 8][4];
#pragma unroll
        for (int i = 0; i < QT / 8; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
        mma_abt_pair<D, QT>(s, dp, Ks, Vs, Qc, dOc, warp);
        /* s holds S^T (keys x queries): element e of n-tile nt is key key[e/2],
         * query q0 + nt*8 + 2*(lane%4) + (e&1). Now P^T -> s, dS^T -> dp. */
        if (needs_mask(q0, QT, k0, len, window)) mask_tile<true>(s, key, q0, len, window);
#pragma unroll
        for (int nt = 0; nt < QT / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int qi = nt * 8 + 2 * (lane % 4) + (e & 1);
                float p = exp2f(s[nt][e] * scale_log2 - lse2c[qi]); /* masked: exp2(-inf) = 0 */
                s[nt][e] = p;
                dp[nt][e] = p * (dp[nt][e] - dlc[qi]);
            }
        }
#pragma unroll
        for (int kk = 0; kk < QT / 16; kk++) {
            uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            uint32_t da[4] = {pack_bf16(dp[2 * kk][0], dp[2 * kk][1]), pack_bf16(dp[2 * kk][2], dp[2 * kk][3]),
                              pack_bf16(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                              pack_bf16(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
            for (int j = 0; j < D / 16; j++) {
                uint32_t b[4];
                ldsm_b<D>(b, dOc, kk * 16, j * 16);
                mma16816(dva[2 * j], pa, b[0], b[1]);
                mma16816(dva[2 * j + 1], pa, b[2], b[3]);
                ldsm_b<D>(b, Qc, kk * 16, j * 16);
                mma16816(dka[2 * j], da, b[0], b[1]);
                mma16816(dka[2 * j + 1], da, b[2], b[3]);
            }
        }
        __syncthreads(); /* this stage is consumed */
    }
    dkdv_store<D>(dk, lddk, dv, lddv, kvh, start, len, key, dka, dva, scale);
}

/* dk, dv at D = 256 for one 64-key tile of one kv head, summed over its query
 * heads, as attn_bwd_dkdv_kernel but with dk and dv on separate warps: dk and dv
 * of 16 keys x 256 dims in one warp would be 256 accumulator registers a thread.
 * Warp w < 4 (a dv warp) takes keys 16 w .. 16 w + 15: S^T = K Q^T, P^T, dv +=
 * P^T dO; warp w + 4 (its dk warp) the same keys: dP^T = V dO^T, then, with P^T
 * handed over through shared memory in fp32, dS^T = P^T (dP^T - delta) and dk +=
 * dS^T Q. Each product is computed once, with attn_bwd_dkdv_kernel's roundings
 * and sum order. Two barriers a step: after the copy wait (the stage has landed,
 * and the previous step, with its reads of the other stage and of pt_s, is done,
 * so the next copy may start) and after the dv warps' P^T. */
__global__ void __launch_bounds__(SPLIT_THREADS)
attn_bwd_dkdv_split_kernel(bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo,
                           const float *lse2, const float *delta, const bf16 *q, int ldq, const bf16 *k,
                           int ldk, const bf16 *v, int ldv, const int4 *tiles, int T, int nkv, int group,
                           float scale, float scale_log2, int window)
{
    constexpr int D = 256, ROW = Cfg<D>::ROW, QT = Cfg<D>::QT, QS = QT * ROW, NT = SPLIT_THREADS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Ks = (bf16 *)smem_raw, *Vs = Ks + TILE * ROW;
    bf16 *Qs = Vs + TILE * ROW, *dOs = Qs + 2 * QS;                   /* two stages each */
    float *lse2_s = (float *)(dOs + 2 * QS), *dl_s = lse2_s + 2 * QT; /* (2, QT) each */
    float *pt_s = dl_s + 2 * QT; /* (4, QT / 2, 32): element i of lane l of dv warp w at [w][i][l] */
    const work_entry w = work_entry_of(tiles, nkv); /* no structured binding: issue() captures these */
    const int kvh = w.head, start = w.start, len = w.len;
    if (len == 0) return;
    const int k0 = w.tile * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, kw = warp % 4; /* keys 16 kw .. 16 kw + 15 */
    const bool dk_warp = warp >= 4;

    /* Queries that see some key of this tile: i >= k0 and i < k0 + TILE - 1 + window. */
    const int qend = window > 0 ? min(len, k0 + TILE - 1 + window) : len;
    const int nqt = (qend - k0 + QT - 1) / QT, nsteps = nqt * group;
    auto issue = [&](int step, int stage) {
        const int h = kvh * group + step / nqt, q0 = k0 + (step % nqt) * QT, valid = min(QT, len - q0);
        load_tile_async<D, QT, NT>(Qs + stage * QS, q + (size_t)(start + q0) * ldq + (size_t)h * D, ldq, valid);
        load_tile_async<D, QT, NT>(dOs + stage * QS, dout + (size_t)(start + q0) * lddo + (size_t)h * D, lddo,
                                   valid);
        load_step_stats<QT>(lse2_s, dl_s, stage, lse2, delta, h, T, start, q0, valid);
    };
    load_tile_async<D, TILE, NT>(Ks, k + (size_t)(start + k0) * ldk + (size_t)kvh * D, ldk, min(TILE, len - k0));
    load_tile_async<D, TILE, NT>(Vs, v + (size_t)(start + k0) * ldv + (size_t)kvh * D, ldv, min(TILE, len - k0));
    issue(0, 0);
    cp_async_commit();

    const int key[2] = {k0 + kw * 16 + lane / 4, k0 + kw * 16 + lane / 4 + 8};
    float acc[D / 8][4]; /* dv in a dv warp, dk in a dk warp */
#pragma unroll
    for (int i = 0; i < D / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float *pt = pt_s + (size_t)kw * (QT / 2) * 32 + lane;

    for (int step = 0; step < nsteps; step++) {
        const int stage = step & 1, q0 = k0 + (step % nqt) * QT;
        cp_async_wait<0>();
        __syncthreads(); /* this stage (at step 0, K and V too) has landed; step - 1 is done */
        if (step + 1 < nsteps) {
            issue(step + 1, stage ^ 1);
            cp_async_commit();
        }
        const bf16 *Qc = Qs + stage * QS, *dOc = dOs + stage * QS;
        const float *lse2c = lse2_s + stage * QT, *dlc = dl_s + stage * QT;

        /* s: S^T, then P^T in a dv warp; dP^T, then dS^T in a dk warp. Element e of
         * n-tile nt is key key[e / 2], query q0 + nt * 8 + 2 (lane % 4) + (e & 1). */
        float s[QT / 8][4];
#pragma unroll
        for (int i = 0; i < QT / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
        mma_abt<D, QT>(s, dk_warp ? Vs : Ks, dk_warp ? dOc : Qc, kw);
        if (!dk_warp) {
            if (needs_mask(q0, QT, k0, len, window)) mask_tile<true>(s, key, q0, len, window);
#pragma unroll
            for (int nt = 0; nt < QT / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = nt * 8 + 2 * (lane % 4) + (e & 1);
                    s[nt][e] = exp2f(s[nt][e] * scale_log2 - lse2c[qi]); /* masked: exp2(-inf) = 0 */
                    pt[(nt * 4 + e) * 32] = s[nt][e];
                }
            }
        }
        __syncthreads(); /* P^T is in pt_s */
        if (dk_warp) {
#pragma unroll
            for (int nt = 0; nt < QT / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = nt * 8 + 2 * (lane % 4) + (e & 1);
                    s[nt][e] = pt[(nt * 4 + e) * 32] * (s[nt][e] - dlc[qi]);
                }
            }
        }
        mma_pb<D, QT>(acc, s, dk_warp ? Qc : dOc);
    }
    if (dk_warp) dq_store<D>(dk, lddk, kvh, start, len, key, acc, scale);
    else dq_store<D>(dv, lddv, kvh, start, len, key, acc, 1.0f);
}

// ---- launchers ----

/* Q, dO, then two stages of K and of V. */
template <int D> static size_t dq_smem() { return (size_t)(2 * TILE + 4 * Cfg<D>::KT) * Cfg<D>::ROW * 2; }
template <int D> static size_t dkdv_smem()
{
    return (size_t)(2 * TILE + 4 * Cfg<D>::QT) * Cfg<D>::ROW * 2 + 4 * Cfg<D>::QT * sizeof(float);
}
/* attn_bwd_dkdv_kernel's, and the four dv warps' P^T. */
static size_t dkdv_split_smem() { return dkdv_smem<256>() + (size_t)4 * 16 * Cfg<256>::QT * sizeof(float); }

/* The mma.sync kernels are built for D = 32 (dq, dk/dv) and 256 (dq, split dk/dv): kernel_choice.cu. */
void attention_bwd_init(void)
{
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dq_smem<32>()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dkdv_smem<32>()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dq_smem<256>()));
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dkdv_split_smem()));
    attn_bwd_sm90_init();
    attn_bwd_dkdv_2wg_init();
    attn_bwd_dq_2wg_init();
}

/* delta and lse2 ((nq, T) each) for every kind of backward. */
template <int D>
static void delta_launch(float *delta, float *lse2, const bf16 *dout, int lddo, const bf16 *out, int ldo,
                         const float *lse, int T, int nq, cudaStream_t st)
{
    size_t rows = (size_t)T * nq;
    constexpr int rows_per_warp = D / 8 < 32 ? 256 / D : 1;
    attn_delta_kernel<D><<<grid_for(rows, 8 * rows_per_warp), 256, 0, st>>>(delta, lse2, dout, lddo, out, ldo, lse,
                                                                           T, nq);
    LAUNCH_CHECK();
}

/* dq, then dk/dv, on mma.sync (D = 32) over the 64-row work list tiles (slots entries). */
static void bwd_mma(bf16 *dq, int lddq, bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo,
                    const float *lse2, const float *delta, const bf16 *q, int ldq, const bf16 *k, int ldk,
                    const bf16 *v, int ldv, const int4 *tiles, size_t slots, int T, int nq, int nkv, float scale,
                    int window, cudaStream_t st)
{
    attn_bwd_dq_kernel<32><<<(unsigned)(slots * nq), THREADS, dq_smem<32>(), st>>>(
        dq, lddq, dout, lddo, lse2, delta, q, ldq, k, ldk, v, ldv, tiles, T, nq, nq / nkv, scale,
        scale * LOG2E, window);
    LAUNCH_CHECK();
    attn_bwd_dkdv_kernel<32><<<(unsigned)(slots * nkv), THREADS, dkdv_smem<32>(), st>>>(
        dk, lddk, dv, lddv, dout, lddo, lse2, delta, q, ldq, k, ldk, v, ldv, tiles, T, nkv, nq / nkv,
        scale, scale * LOG2E, window);
    LAUNCH_CHECK();
}

/* dq, then the split dk/dv, on mma.sync (D = 256), as bwd_mma. */
static void bwd_mma_split(bf16 *dq, int lddq, bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo,
                          const float *lse2, const float *delta, const bf16 *q, int ldq, const bf16 *k, int ldk,
                          const bf16 *v, int ldv, const int4 *tiles, size_t slots, int T, int nq, int nkv,
                          float scale, int window, cudaStream_t st)
{
    attn_bwd_dq_kernel<256><<<(unsigned)(slots * nq), THREADS, dq_smem<256>(), st>>>(
        dq, lddq, dout, lddo, lse2, delta, q, ldq, k, ldk, v, ldv, tiles, T, nq, nq / nkv, scale,
        scale * LOG2E, window);
    LAUNCH_CHECK();
    attn_bwd_dkdv_split_kernel<<<(unsigned)(slots * nkv), SPLIT_THREADS, dkdv_split_smem(), st>>>(
        dk, lddk, dv, lddv, dout, lddo, lse2, delta, q, ldq, k, ldk, v, ldv, tiles, T, nkv, nq / nkv,
        scale, scale * LOG2E, window);
    LAUNCH_CHECK();
}

void cuda_attention_bwd(ct_backend *be, void *dq, int lddq, void *dk, int lddk, void *dv, int lddv,
                        const void *dout, int lddo, const void *out, int ldo, const float *lse,
                        const void *q, int ldq, const void *k, int ldk, const void *v, int ldv,
                        const int32_t *cu_seqlens, int n_docs, int max_seqlen, int T, int nq,
                        int nkv, int D, float scale, int window, const float *sinks)
{
    const void *ptrs[] = {dq, dk, dv, dout, out, q, k, v};
    const int lds[] = {lddq, lddk, lddv, lddo, ldo, ldq, ldk, ldv};
    attn_check_args("attention_bwd", D, nq, nkv, T, n_docs, max_seqlen, ptrs, lds, 8);
    if (T == 0) return;
    cuda_ctx *c = ctx_of(be);
    tail_zero z = {{(bf16 *)dq, (bf16 *)dk, (bf16 *)dv}, {lddq, lddk, lddv}, {nq * D, nkv * D, nkv * D}, NULL, 0};
    attn_zero_tail(c->stream, z, cu_seqlens, n_docs, T);
    size_t slots = attn_tile_slots(T, n_docs, max_seqlen, TILE);
    if (slots == 0) return;
    const attn_bwd_choice kind = choose_attn_bwd(D);
    const size_t slots2 = kind == ATTN_BWD_TWO_WG ? attn_tile_slots(T, n_docs, max_seqlen, 2 * TILE) : 0;
    /* The sinks enter backward only through lse (they have no value rows and are
     * frozen), so they are not read here. */
    size_t head_rows = scratch_round((size_t)T * nq * sizeof(float));
    size_t lists = attn_tiles_bytes(n_docs, slots) + (slots2 ? attn_tiles_bytes(n_docs, slots2) : 0);
    scratch_carver sc = {(char *)cuda_scratch(c, 2 * head_rows + lists), 0};
    float *delta = (float *)scratch_take(&sc, (size_t)T * nq * sizeof(float));
    float *lse2 = (float *)scratch_take(&sc, (size_t)T * nq * sizeof(float));
    const int4 *tiles = attn_build_tiles(c->stream, &sc, cu_seqlens, n_docs, slots, TILE);
    const int4 *tiles2 = slots2 ? attn_build_tiles(c->stream, &sc, cu_seqlens, n_docs, slots2, 2 * TILE) : NULL;
    bf16 *a = (bf16 *)dq, *b = (bf16 *)dk, *cc = (bf16 *)dv;
    const bf16 *go = (const bf16 *)dout, *o = (const bf16 *)out;
    const bf16 *qb = (const bf16 *)q, *kb = (const bf16 *)k, *vb = (const bf16 *)v;
    cudaStream_t st = c->stream;
    if (D == 32) delta_launch<32>(delta, lse2, go, lddo, o, ldo, lse, T, nq, st);
    else if (D == 64) delta_launch<64>(delta, lse2, go, lddo, o, ldo, lse, T, nq, st);
    else if (D == 128) delta_launch<128>(delta, lse2, go, lddo, o, ldo, lse, T, nq, st);
    else delta_launch<256>(delta, lse2, go, lddo, o, ldo, lse, T, nq, st);
    if (kind == ATTN_BWD_TWO_WG) {
        attn_bwd_dq_2wg(a, lddq, go, lddo, lse2, delta, qb, ldq, kb, ldk, vb, ldv, tiles2, slots2, T, nq, nkv, scale,
                        window, st);
        attn_bwd_dkdv_2wg(b, lddk, cc, lddv, go, lddo, lse2, delta, qb, ldq, kb, ldk, vb, ldv, tiles2, slots2, T, nq,
                          nkv, scale, window, st);
    } else if (kind == ATTN_BWD_WGMMA) {
        attn_bwd_dq_sm90(a, lddq, go, lddo, lse2, delta, qb, ldq, kb, ldk, vb, ldv, tiles, slots, T, nq, nkv, D,
                         scale, window, st);
        attn_bwd_dkdv_sm90(b, lddk, cc, lddv, go, lddo, lse2, delta, qb, ldq, kb, ldk, vb, ldv, tiles, slots, T, nq,
                           nkv, D, scale, window, st);
    } else if (kind == ATTN_BWD_MMA_SPLIT) {
        bwd_mma_split(a, lddq, b, lddk, cc, lddv, go, lddo, lse2, delta, qb, ldq, kb, ldk, vb, ldv, tiles, slots, T,
                      nq, nkv, scale, window, st);
    } else {
        bwd_mma(a, lddq, b, lddk, cc, lddv, go, lddo, lse2, delta, qb, ldq, kb, ldk, vb, ldv, tiles, slots, T, nq, nkv,
                scale, window, st);
    }
}

