/* moe_gemm_fused_lora.cuh — the expert-LoRA pieces of a grouped GEMM forward tile that
 * both fused kernels share: moe_gemm_fused_lora.cu's (cp.async, v2) and moe_gemm_tma.cu's
 * (TMA producer warpgroup). Per warpgroup of 64 rows: u = x A_e^T accumulated
 * beside the base product in the k-loop (one m64nRPk16 per 16-deep step on the x
 * rows already in shared memory), then before the epilogue acc = scale * (acc /
 * scale + bf16(u) B^T) from a B^T slice (RP ranks x 256 columns, 4 MN-major panels
 * of 64 columns, 128-byte swizzle) in shared memory. moe_gemm_fused_lora.cu's header has
 * the design; docs/kernels/moe_gemm.md the measurements. */
#ifndef CT_MOE_GEMM_LORA_CUH
#define CT_MOE_GEMM_LORA_CUH

#include "moe_gemm_tiles.cuh"

/* One B^T panel: 64 columns x RP ranks, 128 bytes a rank. */
template <int RP> __host__ __device__ constexpr int lora_b_panel() { return RP * wg::ROW_BYTES; }

/* The LoRA module (of n_mod <= 2, on columns [col0[q], col0[q] + cols[q])) that
 * owns column tile n0, or -1. Fusing callers guarantee a tile never straddles two. */
__device__ __forceinline__ int lora_tile_module(const int (&col0)[2], const int (&cols)[2], int n_mod, int n0)
{
    const bool in0 = n_mod > 0 && n0 >= col0[0] && n0 < col0[0] + cols[0];
    const bool in1 = n_mod > 1 && n0 >= col0[1] && n0 < col0[1] + cols[1];
    return in0 ? 0 : in1 ? 1 : -1;
}

/* u (64 x RP) (=|+=) x rows (da) @ A_e slice (db, K-major like W's rows). */
template <int RP>
__device__ __forceinline__ void lora_u_mma(float (&u)[RP / 2], uint64_t da, uint64_t db, int scale_d)
{
    if constexpr (RP == 16) wgmma_m64n16k16_ss<false>(u, da, db, scale_d);
    else if constexpr (RP == 32) wgmma_m64n32k16_ss<false>(u, da, db, scale_d);
    else wgmma_m64n64k16_ss<false>(u, da, db, scale_d);
}

/* acc = scale * (acc / scale + bf16(u) @ B_slice): u's accumulator layout is the
 * RS A-fragment layout (wgmma.cuh), rank step j = u[8 j .. 8 j + 7] in pairs.
 * Returns with the wgmmas retired (slb may be reused once every reader returned). */
template <int RP>
__device__ __forceinline__ void lora_add(float (&acc)[128], const float (&u)[RP / 2], uint32_t slb, float scale)
{
    uint32_t a[RP / 16][4];
#pragma unroll
    for (int j = 0; j < RP / 16; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) a[j][r] = pack_bf16(u[8 * j + 2 * r], u[8 * j + 2 * r + 1]);
    const float inv = 1.0f / scale;
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] *= inv;
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < RP / 16; j++)
        wgmma_m64n256k16_rs<true>(acc, a[j], wgmma_desc(slb + j * 16 * wg::ROW_BYTES, lora_b_panel<RP>(), 1024), 1);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_acc_fence(acc);
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] *= scale;
}

/* u of this warpgroup's tile rows (64 wgi .. 64 wgi + 63; tile row r is u row row0
 * + r, stored only when row_lo <= r < row_hi), rounded to bf16 as lora_add rounds
 * it, its ranks [0, R) into columns [col, col + R) of u (row stride ldu). Accumulator layout as
 * lora_add reads it: u[8 j + 2 r + c] is row 16 warp + lane/4 + 8 (r & 1), rank
 * 16 j + 8 (r >> 1) + 2 (lane % 4) + c. Scalar stores: col + rank may be odd. */
template <int RP>
__device__ __forceinline__ void lora_store_u(bf16 *dst, int ldu, int col, int R, const float (&u)[RP / 2], int row0,
                                             int row_lo, int row_hi, int wgi)
{
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
#pragma unroll
    for (int j = 0; j < RP / 16; j++)
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int row = wgi * 64 + warp * 16 + (lane >> 2) + 8 * (r & 1);
                const int k = 16 * j + 8 * (r >> 1) + 2 * (lane & 3) + c;
                if (row >= row_lo && row < row_hi && k < R)
                    dst[(size_t)(row0 + row) * ldu + col + k] = __float2bfloat16_rn(u[8 * j + 2 * r + c]);
            }
}

#endif
