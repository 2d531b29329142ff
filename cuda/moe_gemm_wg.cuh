/* moe_gemm_wg.cuh — what the two warpgroup-MMA grouped GEMMs share: moe_gemm.cu's
 * v2 (cp.async loads by the MMA warpgroups) and moe_gemm_tma.cu (a TMA producer
 * warpgroup and two consumers). Both compute 128 x 256 output tiles as two 64 x 256
 * halves with wgmma.m64n256k16, raster row tiles in groups, and store straight from
 * the accumulators (wg_epilogue). */
#ifndef CT_MOE_GEMM_WG_CUH
#define CT_MOE_GEMM_WG_CUH

#include "moe_gemm.cuh"
#include "wgmma.cuh"

/* d (64 x 256 fp32, this warpgroup's accumulators) (=|+=) A (64 x 16) @ B (16 x 256),
 * both from shared memory through descriptors; scale_d 0 overwrites d. TRANS_B: B
 * is stored MN-major (N contiguous), else K-major like A. */
template <bool TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db, int scale_d)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
        "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, "
        "%39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
        "%58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, "
        "%77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, %131;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
            "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
            "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
            "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
            "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
            "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
            "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
            "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
            "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
            "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),
            "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
            "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
            "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
            "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),
            "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]),
            "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
            "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
            "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),
            "+f"(d[127])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B ? 1 : 0));
}

/* Row tile and column tile of a tile index: row tiles rastered in groups of GROUP
 * (the column tiles of GROUP row tiles run together), as the v1 kernel. */
__device__ __forceinline__ void tile_coords(int tile, int n_rt, int n_ct, int group_rows, int &rt, int &ct)
{
    const int per_group = group_rows * n_ct, group = tile / per_group, first = group * group_rows;
    const int rows_g = min(group_rows, n_rt - first), local = tile - group * per_group;
    rt = first + local % rows_g;
    ct = local / rows_g;
}


__device__ __forceinline__ float2 shfl_xor2(float2 v, int m)
{
    return make_float2(__shfl_xor_sync(0xffffffffu, v.x, m), __shfl_xor_sync(0xffffffffu, v.y, m));
}

/* y rows of this warpgroup (tile rows 64 wgi .. 64 wgi + 63; tile row r is y row
 * row0 + r, stored only when row_lo <= r < row_hi) of expert `expert` at columns
 * n0..n0+255 (< N) from the accumulators: + bias (+ the old y) in fp32, rounded once. Accumulator layout (per warp, as mma.sync's C): d[4j + 2h + q] is
 * row 16 warp + lane/4 + 8h, column 8j + 2 (lane%4) + q, so a quad holds 2 columns
 * of each 8-column tile. Two butterfly exchanges (lanes xor 1, then xor 2) give
 * lane q of the quad all 8 columns of tile 4m + q instead: one 16-byte store per
 * lane and row where 4-byte stores would take four times the instructions (with 1
 * block per SM, nothing else runs on the SM while this one stores). */
__device__ __forceinline__ void wg_epilogue(const gemm_args &p, const float (&d)[128], int expert, int row0,
                                            int row_lo, int row_hi, int n0, int wgi)
{
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, tq = lane & 3;
    const bool odd = tq & 1, hi = tq & 2;
    const bf16 *bias = p.bias ? p.bias + (size_t)expert * p.N : NULL;
#pragma unroll
    for (int m = 0; m < 8; m++) {
        float2 b[4]; /* bias at this lane's columns of tiles 4m .. 4m+3 */
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            const int col = n0 + (4 * m + jj) * 8 + 2 * tq;
            b[jj] = bias && col < p.N ? __bfloat1622float2(*(const __nv_bfloat162 *)(bias + col))
                                      : make_float2(0.0f, 0.0f);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float2 e[4];
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
                e[jj] = make_float2(d[4 * (4 * m + jj) + 2 * h] + b[jj].x, d[4 * (4 * m + jj) + 2 * h + 1] + b[jj].y);
            /* xor 1: even lanes trade tiles 1 and 3 for their odd partner's 0 and 2 */
            const float2 r01 = shfl_xor2(odd ? e[0] : e[1], 1), r23 = shfl_xor2(odd ? e[2] : e[3], 1);
            if (odd) {
                e[0] = r01;
                e[2] = r23;
            } else {
                e[1] = r01;
                e[3] = r23;
            }
            /* xor 2: now e[s] is column pair s of tile 4m + tq */
            const float2 r0 = shfl_xor2(hi ? e[0] : e[2], 2), r1 = shfl_xor2(hi ? e[1] : e[3], 2);
            if (hi) {
                e[0] = r0;
                e[1] = r1;
            } else {
                e[2] = r0;
                e[3] = r1;
            }
            const int r = wgi * 64 + warp * 16 + g + 8 * h, col = n0 + 32 * m + 8 * tq;
            if (r < row_lo || r >= row_hi || col >= p.N) continue; /* N % 8 == 0: all 8 columns or none */
            bf16 *dst = p.y + (size_t)(row0 + r) * p.ldy + col;
            float f[8] = {e[0].x, e[0].y, e[1].x, e[1].y, e[2].x, e[2].y, e[3].x, e[3].y};
            if (p.accumulate) {
                float o[8];
                load8(o, dst);
#pragma unroll
                for (int i = 0; i < 8; i++) f[i] += o[i];
            }
            store8(dst, f);
        }
    }
}

#endif
