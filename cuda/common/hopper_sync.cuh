/* hopper_sync.cuh — Hopper (sm_90a) plumbing for warp-specialized kernels, where a
 * producer warpgroup loads tiles with the Tensor Memory Accelerator (TMA) and
 * consumer warpgroups compute on them (attention_fwd_sm90_2wg.cu, moe_gemm_tma.cu),
 * and the host side of their tensor maps (tensor_map_encoder, tensor_map_bf16).
 *
 * mbarrier: a 64-bit object in shared memory that completes a phase when its
 * pending arrivals (set by mbar_init) and its pending transaction bytes (raised
 * by mbar_arrive_expect_tx, lowered by the TMA copies that name the barrier) both
 * reach zero; then the phase parity flips and the counts reset. A waiter names
 * the parity of the phase it waits for: the k-th completion (k = 0, 1, ...) has
 * parity k & 1. Arrive has release and wait acquire semantics at CTA scope (the
 * defaults), so a consumer that saw a phase complete also sees the bytes the TMA
 * wrote in it, and a producer that saw an "empty" phase complete may overwrite
 * what the arriving consumers read.
 *
 * setmaxnreg moves registers between the warpgroups of a block: all four warps
 * of a warpgroup execute it; .dec returns registers to the block's pool and
 * .inc waits until the pool holds enough. The counts must balance against what
 * the block was launched with (__launch_bounds__), or .inc waits forever. */
#ifndef CT_HOPPER_SYNC_CUH
#define CT_HOPPER_SYNC_CUH

#include "ct_cuda.cuh"

#include <cuda.h> /* CUtensorMap (types only: no -lcuda) */
#include <stdint.h>
#include <stdio.h>

/* The driver's cuTensorMapEncodeTiled, fetched through the runtime (no -lcuda)
 * on the first call in each file that asks; fatal when the driver has none. */
typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static inline encode_tiled_fn tensor_map_encoder(void)
{
    static encode_tiled_fn fn;
    if (!fn) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult found;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || !p)
            ct_cuda_fatal(__FILE__, __LINE__, "cudaGetDriverEntryPointByVersion(\"cuTensorMapEncodeTiled\")",
                          "the driver has no cuTensorMapEncodeTiled");
        fn = (encode_tiled_fn)p;
    }
    return fn;
}

/* A bf16 tensor map of `rank` dimensions (dim[0] innermost, byte strides of the
 * outer ones), boxes of box[] elements written in the 128-byte swizzle (box[0] =
 * 64: one 128-byte row); elements outside the tensor read as 0. */
static inline CUtensorMap tensor_map_bf16(const bf16 *base, int rank, const cuuint64_t *dim,
                                          const cuuint64_t *stride, const cuuint32_t *box)
{
    CUtensorMap map;
    const cuuint32_t step[5] = {1, 1, 1, 1, 1};
    const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, (void *)base,
                                            dim, stride, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        char why[64];
        snprintf(why, sizeof why, "CUresult %d", (int)r);
        ct_cuda_fatal(__FILE__, __LINE__, "cuTensorMapEncodeTiled", why);
    }
    return map;
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
/* Orders the mbar_init calls before the barriers' use by other threads and by
 * the TMA unit; a block barrier follows. */
__device__ __forceinline__ void mbar_init_fence()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" :: "r"(bar) : "memory");
}
/* One arrival that also announces bytes the TMA copies of this phase will deliver. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n"
                 :: "r"(bar), "r"(bytes) : "memory");
}
/* Waits until the phase of the given parity has completed (try_wait suspends the
 * thread for a while in hardware before it reports failure, so the loop is cheap). */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

/* TMA: the box of the 2-D tensor map at element coordinates (c0 innermost, c1)
 * into shared memory at dst (laid out and swizzled as the map says), completing
 * its bytes on the mbarrier bar. Elements outside the tensor are zero-filled and
 * still count toward the box's bytes. map is the generic address of a
 * __grid_constant__ kernel parameter. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

/* The same for the box of a 3-D tensor map at element coordinates (c0 innermost,
 * c1, c2): moe_gemm_tma.cu's expert weights, (in, out, E). */
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2,
                                            uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4}], [%5];\n"
                 :: "r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}

template <int N> __device__ __forceinline__ void regs_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}
template <int N> __device__ __forceinline__ void regs_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}

/* Named barrier ID (1..15; 0 is __syncthreads) across COUNT threads (a multiple
 * of 32): bar_sync waits for COUNT arrivals, bar_arrive adds this warp's without
 * waiting. */
template <int COUNT> __device__ __forceinline__ void bar_sync(int id)
{
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "n"(COUNT) : "memory");
}
template <int COUNT> __device__ __forceinline__ void bar_arrive(int id)
{
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "n"(COUNT) : "memory");
}

#endif
