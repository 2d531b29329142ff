/* wgmma.cuh — Hopper (sm_90a) warpgroup MMA and the shared-memory plumbing it
 * needs, shared by the kernels that use it (moe_gemm.cu's v2 GEMM,
 * moe_gemm_fused_lora.cu's fused-LoRA variant and moe_gemm_tma.cu's TMA kernel,
 * attention_fwd_sm90.cu's and attention_fwd_sm90_2wg.cu's forwards,
 * attention_bwd_sm90.cu's, attention_bwd_dq_2wg.cu's and
 * attention_bwd_dkdv_2wg.cu's backward kernels).
 *
 * A warpgroup is 4 consecutive warps (128 threads). wgmma.mma_async computes
 * D (64 x N, fp32 in registers) (=|+=) A (64 x 16) B (16 x N); B always comes
 * from shared memory through a matrix descriptor, A from shared memory too ("SS")
 * or from registers ("RS"). The instructions run asynchronously: issue them
 * after wgmma_fence, close a group with wgmma_commit, and read D (or reuse A's
 * registers) only after wgmma_wait has retired the group.
 *
 * Register layouts (PTX ISA, "wgmma register fragments"; CUTLASS's CLayout_64xN
 * and ALayout_64x16 say the same). Thread t = 32 w + lane of the warpgroup, with
 * g = lane / 4 and c = lane % 4:
 *   D: d[4 j + 2 h + q] is row 16 w + g + 8 h, column 8 j + 2 c + q
 *      (j < N / 8; per warp, the layout of mma.sync's C, repeated over N).
 *   A (bf16, RS): a[r] packs two adjacent columns, low half first:
 *      a[0] row 16 w + g,     columns 2 c, 2 c + 1
 *      a[1] row 16 w + g + 8, columns 2 c, 2 c + 1
 *      a[2] row 16 w + g,     columns 2 c + 8, 2 c + 9
 *      a[3] row 16 w + g + 8, columns 2 c + 8, 2 c + 9
 *   Hence A's fragment of columns [16 s, 16 s + 16) of a 64 x N accumulator
 *   tile is d[8 s .. 8 s + 7] packed in pairs, in order: a product can feed the
 *   next wgmma without a trip through shared memory.
 *
 * Shared-memory operands use the 128-byte swizzle: rows of 128 bytes (64 bf16),
 * 16-byte chunk c of row r stored at chunk c ^ (r % 8), in atoms of 8 rows
 * (1024 bytes, 1024-byte aligned). Wider matrices are panels of 64 columns. */
#ifndef CT_WGMMA_CUH
#define CT_WGMMA_CUH

#include <stdint.h>

/* Shared-memory matrix descriptor (PTX "matrix descriptor format"): start address,
 * leading and stride byte offsets (all >> 4), 128-byte swizzle (mode 1 in bits 62-63).
 * K-major (K contiguous: A, and B as (N, K) rows): 8-row groups of 128-byte rows at
 * SBO 1024, LBO unused (1); a k-step of 16 starts 32 bytes further along the row.
 * MN-major (B as (K, N) rows, N contiguous): SBO 1024 between 8-row (k) groups, LBO
 * between 64-column panels. Swizzled atoms start 1024-byte aligned (base offset 0). */
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
/* Orders the compiler's accesses to d after a wgmma_wait (the asm above hides them). */
template <int N> __device__ __forceinline__ void wgmma_acc_fence(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}
/* Makes this thread's completed cp.async writes visible to wgmma (the async proxy). */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void cp_async16_s(uint32_t s, const void *g, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(g), "r"(valid ? 16 : 0) : "memory");
}

/* Byte offset of 16-byte chunk c (0..7) of row r in a 128-byte-swizzled tile: the
 * chunk index XOR the row's low 3 bits (Swizzle<3,4,3>, what the descriptor's mode 1
 * reads back). */
__device__ __forceinline__ uint32_t swz(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

/* Operand lists of the shapes below: 8 accumulators at a time. */
#define WGMMA_ACC8(d, i)                                                                               \
    "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]),          \
        "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define WGMMA_ACC32(d) WGMMA_ACC8(d, 0), WGMMA_ACC8(d, 8), WGMMA_ACC8(d, 16), WGMMA_ACC8(d, 24)

/* d (64 x 64 fp32) (=|+=) A (64 x 16) @ B (16 x 64), both from shared memory;
 * scale_d 0 overwrites d. TRANS_B: B is stored MN-major (N contiguous), else
 * K-major like A. */
template <bool TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t da, uint64_t db, int scale_d)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, %35;\n}\n"
        : WGMMA_ACC32(d)
        : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B ? 1 : 0));
}

/* d (64 x 128 fp32) (=|+=) A (64 x 16) @ B (16 x 128), both from shared memory, as
 * the m64n64k16 form above (the two-consumer forward's 128-key S tiles). */
template <bool TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t da, uint64_t db, int scale_d)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
        "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
        "%59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, %67;\n}\n"
        : WGMMA_ACC32(d), WGMMA_ACC8(d, 32), WGMMA_ACC8(d, 40), WGMMA_ACC8(d, 48), WGMMA_ACC8(d, 56)
        : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B ? 1 : 0));
}

/* d (64 x 32 fp32) (=|+=) A (64 x 16) @ B (16 x 32), both from shared memory, as
 * the m64n64k16 form above (the dk/dv backward's 32-query steps at D = 128). */
template <bool TRANS_B>
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint64_t da, uint64_t db, int scale_d)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1, 0, %19;\n}\n"
        : WGMMA_ACC8(d, 0), WGMMA_ACC8(d, 8)
        : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B ? 1 : 0));
}

/* d (64 x 16 fp32) (=|+=) A (64 x 16) @ B (16 x 16), both from shared memory, as
 * the m64n64k16 form above (the rank-16 LoRA down-projection u = x A^T of
 * moe_gemm_fused_lora.cu). */
template <bool TRANS_B>
__device__ __forceinline__ void wgmma_m64n16k16_ss(float (&d)[8], uint64_t da, uint64_t db, int scale_d)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, "
        "%8, %9, p, 1, 1, 0, %11;\n}\n"
        : WGMMA_ACC8(d, 0)
        : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B ? 1 : 0));
}

/* d (64 x 64 fp32) (=|+=) A (64 x 16, bf16 fragments a in registers, layout
 * above) @ B (16 x 64) from shared memory. scale_d, TRANS_B as above. */
template <bool TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int scale_d)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : WGMMA_ACC32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TRANS_B ? 1 : 0));
}

/* d (64 x 128 fp32) (=|+=) A (64 x 16, registers) @ B (16 x 128) from shared memory. */
template <bool TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int scale_d)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
        "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
        "%59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : WGMMA_ACC32(d), WGMMA_ACC8(d, 32), WGMMA_ACC8(d, 40), WGMMA_ACC8(d, 48), WGMMA_ACC8(d, 56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TRANS_B ? 1 : 0));
}

/* d (64 x 256 fp32, this warpgroup's accumulators) (=|+=) A (64 x 16) @ B (16 x 256),
 * both from shared memory, as the m64n64k16 form above (the grouped expert GEMMs
 * of moe_gemm.cu and moe_gemm_fused_lora.cu). */
template <bool TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16_ss(float (&d)[128], uint64_t da, uint64_t db, int scale_d)
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

/* d (64 x 256 fp32) (=|+=) A (64 x 16, registers) @ B (16 x 256) from shared memory
 * (moe_gemm_fused_lora.cu's epilogue: the LoRA up-projection u B^T added to the GEMM's
 * accumulators). */
template <bool TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t db, int scale_d)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
        "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
        "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "
        "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, "
        "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, "
        "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "{%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
        : WGMMA_ACC8(d, 0), WGMMA_ACC8(d, 8), WGMMA_ACC8(d, 16), WGMMA_ACC8(d, 24), WGMMA_ACC8(d, 32),
          WGMMA_ACC8(d, 40), WGMMA_ACC8(d, 48), WGMMA_ACC8(d, 56), WGMMA_ACC8(d, 64), WGMMA_ACC8(d, 72),
          WGMMA_ACC8(d, 80), WGMMA_ACC8(d, 88), WGMMA_ACC8(d, 96), WGMMA_ACC8(d, 104), WGMMA_ACC8(d, 112),
          WGMMA_ACC8(d, 120)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TRANS_B ? 1 : 0));
}

#undef WGMMA_ACC32
#undef WGMMA_ACC8

#endif
