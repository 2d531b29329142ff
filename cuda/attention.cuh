/* attention.cuh — what attention.cu (work list, padding rows, forward) and
 * attention_bwd.cu (backward) share: tile sizes, the mma.sync / ldmatrix /
 * cp.async helpers, the mask test, and the launch helpers both sides call.
 * attention.cu's header comment describes the kernels. */
#ifndef CT_ATTENTION_CUH
#define CT_ATTENTION_CUH

#include "ct_cuda.cuh"

#define THREADS 128        /* 4 warps */
#define TILE 64            /* queries per fwd/dq block; keys per tile and per dk/dv block */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* Shared-memory row stride: 16 bytes of padding make the 8 rows an ldmatrix
 * reads fall in distinct banks. QT: queries per dk/dv step (see the header). */
template <int D> struct Cfg {
    static constexpr int ROW = D + 8;
    static constexpr int QT = D == 128 ? 32 : 64;
};

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/* c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col). */
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* Asynchronous global -> shared copies (bypassing registers). With valid false
 * nothing is read (src-size 0) and the destination is zero-filled; the source
 * must still be a mapped address, so callers pass a row that exists. */
__device__ __forceinline__ void cp_async16(void *s, const void *g, bool valid)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(a), "l"(g), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(void *s, const void *g, bool valid)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(a), "l"(g), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

/* ROWS x D tile from global (row r at g + r*ld) into shared s, asynchronously;
 * rows >= valid (valid >= 1) are zero-filled. */
template <int D, int ROWS>
__device__ __forceinline__ void load_tile_async(bf16 *s, const bf16 *g, size_t ld, int valid)
{
    constexpr int CH = D / 8, N = ROWS * CH;
    static_assert(N % THREADS == 0, "tile chunks must divide evenly over the block");
#pragma unroll
    for (int it = 0; it < N / THREADS; it++) {
        int c = it * THREADS + threadIdx.x, r = c / CH, k = (c % CH) * 8;
        bool ok = r < valid;
        cp_async16(s + r * Cfg<D>::ROW + k, g + (size_t)(ok ? r : 0) * ld + k, ok);
    }
}

/* A fragment (16 rows x 16 cols at (row0, col0)) of a row-major shared tile. */
template <int D>
__device__ __forceinline__ void ldsm_a(uint32_t a[4], const bf16 *s, int row0, int col0)
{
    int lane = threadIdx.x % 32;
    ldsm_x4(a, s + (row0 + (lane % 16)) * Cfg<D>::ROW + col0 + (lane / 16) * 8);
}

/* B fragments of two n-tiles (8 rows each) for one 16-wide k-step, where the
 * shared tile holds B^T: rows = n (keys/queries), cols = k (head dims).
 * r[0], r[1] -> n-tile at row0; r[2], r[3] -> n-tile at row0 + 8. */
template <int D>
__device__ __forceinline__ void ldsm_bt(uint32_t r[4], const bf16 *s, int row0, int col0)
{
    int lane = threadIdx.x % 32;
    ldsm_x4(r, s + (row0 + (lane & 7) + ((lane >> 4) << 3)) * Cfg<D>::ROW + col0 + ((lane >> 3) & 1) * 8);
}

/* B fragments of two n-tiles (8 cols each, at col0 and col0 + 8) for the k-step of
 * 16 rows at row0, where the shared tile holds B itself: rows = k, cols = n. */
template <int D>
__device__ __forceinline__ void ldsm_b(uint32_t r[4], const bf16 *s, int row0, int col0)
{
    int lane = threadIdx.x % 32;
    ldsm_x4_t(r, s + (row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * Cfg<D>::ROW + col0 + (lane >> 4) * 8);
}

__device__ __forceinline__ bool visible(int i, int j, int len, int window)
{
    return j <= i && i < len && (window <= 0 || j > i - window);
}

/* Whether queries [q0, q0 + nqr) against keys [k0, k0 + TILE) need the mask:
 * some pair is above the diagonal, below the window, or a query is past len. */
__device__ __forceinline__ bool needs_mask(int q0, int nqr, int k0, int len, int window)
{
    return k0 + TILE - 1 > q0 || (window > 0 && k0 + window <= q0 + nqr - 1) || q0 + nqr > len;
}

/* The outputs whose padding rows (past cu_seqlens[n_docs]) are zeroed. */
struct tail_zero {
    bf16 *p[3];       /* up to three (T, cols) bf16 outputs; NULL when unused */
    int ld[3], cols[3];
    float *f;         /* (T, fcols) fp32 output (lse) or NULL */
    int fcols;
};

/* Zeroes rows [cu_seqlens[n_docs], T) of the outputs in z (device-side end). */
void attn_zero_tail(cudaStream_t st, const tail_zero &z, const int32_t *cu_seqlens, int n_docs, int T);
/* Entries of the work list for these host sizes (>= the number of 64-row tiles). */
size_t attn_tile_slots(int T, int n_docs, int max_seqlen);
/* Scratch bytes the work list takes, and the list itself, built on stream st out
 * of scratch carved by sc: {start, len, tile index, 0} per tile (see attention.cu). */
size_t attn_tiles_bytes(int n_docs, size_t slots);
const int4 *attn_build_tiles(cudaStream_t st, scratch_carver *sc, const int32_t *cu, int n_docs, size_t slots);
/* Asserts the shapes, strides and alignment both directions need. */
void attn_check_args(const char *op, int D, int nq, int nkv, int T, int n_docs, int max_seqlen,
                     const void *const *ptrs, const int *lds, int n);
/* attention_bwd.cu: raises the backward kernels' shared-memory limits and picks
 * the backward cuda_attention_bwd runs at D = 64 and 128 from now on (process-wide):
 * wgmma (attention_bwd_sm90.cu) or mma.sync. */
void attention_bwd_init(bool wgmma);

/* attention_fwd_sm90.cu: the wgmma forward (D = 64 or 128) and its shared-memory opt-in. */
void attn_fwd_sm90(bf16 *out, int ldo, float *lse, const bf16 *q, int ldq, const bf16 *k, int ldk,
                   const bf16 *v, int ldv, const int4 *tiles, size_t slots, int nq, int nkv, int D,
                   float scale, int window, const float *sinks, cudaStream_t st);
void attn_fwd_sm90_init(void);

/* attention_bwd_sm90.cu: the wgmma dq and dk/dv kernels (D = 64 or 128) after
 * attn_delta_kernel filled delta and lse2 ((nq, T) each), and their shared-memory
 * opt-in. Arguments as attention_bwd.cu's mma.sync launch. */
void attn_bwd_sm90(bf16 *dq, int lddq, bf16 *dk, int lddk, bf16 *dv, int lddv, const bf16 *dout, int lddo,
                   const float *lse2, const float *delta, const bf16 *q, int ldq, const bf16 *k, int ldk,
                   const bf16 *v, int ldv, const int4 *tiles, size_t slots, int T, int nq, int nkv, int D,
                   float scale, int window, cudaStream_t st);
void attn_bwd_sm90_init(void);

#endif
