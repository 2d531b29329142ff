/* wgmma.cuh — Hopper (sm_90a) warpgroup MMA and the shared-memory plumbing it
 * needs, shared by the kernels that use it (moe_gemm.cu's v2 GEMM,
 * attention_fwd_sm90.cu's and attention_fwd_sm90_2wg.cu's forwards,
 * attention_bwd_sm90.cu's backward).
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

#undef WGMMA_ACC32
#undef WGMMA_ACC8

#endif
