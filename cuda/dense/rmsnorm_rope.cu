/* rmsnorm_rope.cu — RMSNorm forward and backward (the backward adding the residual
 * gradient), RoPE, and RMSNorm + RoPE fused (Qwen3's q/k norm). bf16 in and out,
 * fp32 math. The norms scale by w, or zero-centred (Qwen3.5, Qwen3-Next) by
 * 1 + w, formed in fp32 from the bf16 w as each chunk is loaded: bf16 cannot
 * hold 1 + w, so the model uploads w as stored and the offset lives here.
 *
 * Layouts (row-major, strides in elements): RMSNorm rows (t, h) of D elements at
 * x + t*ldx + h*D; RoPE x (T, nh, D) with token stride ldx.
 *
 * Every access is 16 bytes (8 bf16) per thread, coalesced across the warp, so
 * the row widths and strides must be multiples of 8 and the pointers 16-byte
 * aligned; the launchers assert it, and cuda_check_model (backend_cuda.cu)
 * refuses at load a model whose head_dim is not 32, 64 or 128 or whose hidden
 * size is not a multiple of 8. RMSNorm uses one warp per row: rows are short
 * (D <= 8192 elements, 1-32 accesses per lane), so a warp suffices and no
 * block-level sync is needed. */
#include "ct_cuda.cuh"

#define WARPS_PER_BLOCK 8

// ---- kernels ----

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The norm's scale at w[0..8): w, or 1 + w in fp32 when zero-centred (without
 * it the values are w's exactly, so that path rounds as it always did). */
__device__ __forceinline__ void load_scale8(float s[8], const bf16 *w, bool zc)
{
    load8(s, w);
    if (zc) {
#pragma unroll
        for (int j = 0; j < 8; j++) s[j] = 1.0f + s[j];
    }
}

/* One warp per (t, h) row. y may alias x: each lane rereads exactly the 8-element
 * chunks it later overwrites, so no lane reads another's output. */
__global__ void rmsnorm_fwd_kernel(bf16 *y, int ldy, float *rstd, const bf16 *x, int ldx,
                                   const bf16 *w, bool zc, int T, int nh, int D, float eps)
{
    size_t row = (size_t)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)T * nh) return;
    size_t t = row / nh, h = row % nh;
    const bf16 *xr = x + t * ldx + h * D;
    bf16 *yr = y + t * ldy + h * D;
    float ss = 0.0f;
    for (int i = lane * 8; i < D; i += 256) {
        float f[8];
        load8(f, xr + i);
#pragma unroll
        for (int j = 0; j < 8; j++) ss += f[j] * f[j];
    }
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)D + eps);
    if (rstd && lane == 0) rstd[row] = r;
    for (int i = lane * 8; i < D; i += 256) {
        float f[8], wf[8];
        load8(f, xr + i);
        load_scale8(wf, w + i, zc);
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = f[j] * r * wf[j];
        store8(yr + i, f);
    }
}

/* One 8-column chunk of the backward below, shared by its two kernels so that
 * their results stay bit-identical: the chunk's terms of sum_i dy_i w_i x_i, and
 * dx = r w dy - cx x, plus dres's values o when res. */
__device__ __forceinline__ void rmsnorm_bwd_dot8(float &dot, const float g[8], const float w[8], const float x[8])
{
#pragma unroll
    for (int j = 0; j < 8; j++) dot += g[j] * w[j] * x[j];
}
__device__ __forceinline__ void rmsnorm_bwd_dx8(float o[8], bool res, float r, float cx, const float g[8],
                                                const float w[8], const float x[8])
{
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float d = r * w[j] * g[j] - cx * x[j];
        o[j] = res ? o[j] + d : d;
    }
}

/* The pointers of the backward's row that this warp takes (one warp per (token, head)
 * row); false past the last row. */
struct rmsnorm_bwd_row {
    size_t row;
    const bf16 *x, *dy, *res; /* res: dres's row, or NULL */
    bf16 *dx;
};
__device__ __forceinline__ bool rmsnorm_bwd_row_at(rmsnorm_bwd_row &p, bf16 *dx, int lddx, const bf16 *dy, int lddy,
                                                   const bf16 *x, int ldx, int T, int nh, int D, const bf16 *dres,
                                                   int lddres)
{
    p.row = (size_t)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32;
    if (p.row >= (size_t)T * nh) return false;
    const size_t t = p.row / nh, h = p.row % nh;
    p.x = x + t * ldx + h * D;
    p.dy = dy + t * lddy + h * D;
    p.dx = dx + t * lddx + h * D;
    p.res = dres ? dres + t * lddres + h * D : NULL;
    return true;
}

/* dx_j = dres_j + r w_j dy_j - x_j r^3 / D * sum_i dy_i w_i x_i. dres may alias
 * dx (each lane reads a chunk of it just before overwriting that chunk). */
__global__ void rmsnorm_bwd_kernel(bf16 *dx, int lddx, const bf16 *dy, int lddy, const bf16 *x,
                                   int ldx, const float *rstd, const bf16 *w, bool zc, int T, int nh, int D,
                                   const bf16 *dres, int lddres)
{
    rmsnorm_bwd_row p;
    if (!rmsnorm_bwd_row_at(p, dx, lddx, dy, lddy, x, ldx, T, nh, D, dres, lddres)) return;
    const int lane = threadIdx.x % 32;
    float dot = 0.0f;
    for (int i = lane * 8; i < D; i += 256) {
        float xf[8], gf[8], wf[8];
        load8(xf, p.x + i);
        load8(gf, p.dy + i);
        load_scale8(wf, w + i, zc);
        rmsnorm_bwd_dot8(dot, gf, wf, xf);
    }
    dot = warp_sum(dot);
    float r = rstd[p.row];
    float cx = dot * r * r * r / (float)D;
    for (int i = lane * 8; i < D; i += 256) {
        float xf[8], gf[8], wf[8], o[8];
        load8(xf, p.x + i);
        load8(gf, p.dy + i);
        load_scale8(wf, w + i, zc);
        if (p.res) load8(o, p.res + i);
        rmsnorm_bwd_dx8(o, p.res, r, cx, gf, wf, xf);
        store8(p.dx + i, o);
    }
}

/* rmsnorm_bwd_kernel with the row's x and dy chunks held in registers (C chunks
 * of 256 columns, D <= 256 C): every load is issued before the first use, and the
 * second pass reads neither again. Same sums in the same order, so the results are
 * bit-identical to it. Measured on the H200 at 16384 x 2048 (ncu, a 4-layer
 * qwen3-30b-a3b step): 66-69 us against the loop kernel's 77 without dres, but
 * 121 against 94 with it (155 registers leave one block of 8 warps per
 * multiprocessor, and each chunk's dres load, which may alias dx, waits for the
 * store before it), so cuda_rmsnorm_bwd takes it only without dres, at C = 8. */
template <int C>
__global__ void rmsnorm_bwd_rows_kernel(bf16 *dx, int lddx, const bf16 *dy, int lddy, const bf16 *x, int ldx,
                                        const float *rstd, const bf16 *w, bool zc, int T, int nh, int D,
                                        const bf16 *dres, int lddres)
{
    rmsnorm_bwd_row p;
    if (!rmsnorm_bwd_row_at(p, dx, lddx, dy, lddy, x, ldx, T, nh, D, dres, lddres)) return;
    const int lane = threadIdx.x % 32;
    uint4 xv[C], gv[C];
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int i = lane * 8 + 256 * c;
        if (i < D) {
            xv[c] = *(const uint4 *)(p.x + i);
            gv[c] = *(const uint4 *)(p.dy + i);
        }
    }
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int i = lane * 8 + 256 * c;
        if (i < D) {
            float xf[8], gf[8], wf[8];
            unpack8(xf, xv[c]);
            unpack8(gf, gv[c]);
            load_scale8(wf, w + i, zc);
            rmsnorm_bwd_dot8(dot, gf, wf, xf);
        }
    }
    dot = warp_sum(dot);
    float r = rstd[p.row];
    float cx = dot * r * r * r / (float)D;
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int i = lane * 8 + 256 * c;
        if (i < D) {
            float xf[8], gf[8], wf[8], o[8];
            unpack8(xf, xv[c]);
            unpack8(gf, gv[c]);
            load_scale8(wf, w + i, zc);
            if (p.res) load8(o, p.res + i);
            rmsnorm_bwd_dx8(o, p.res, r, cx, gf, wf, xf);
            store8(p.dx + i, o);
        }
    }
}

/* One thread per (t, i < rot_dim/2), looping over heads: the angle and its
 * sin/cos are computed once per token and frequency. The angle is rounded to fp32
 * (pos * inv_freq in fp32, as HF and the CPU backend do); sincosf is the accurate
 * version (no fast-math), so large angles reduce correctly. */
__global__ void rope_kernel(bf16 *x, int ldx, const int32_t *pos, const float *inv_freq, int T,
                            int nh, int D, int half, float attn_scaling, float sign)
{
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * half) return;
    size_t t = idx / half;
    int i = (int)(idx % half);
    float angle = (float)pos[t] * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    c *= attn_scaling;
    s *= sign * attn_scaling;
    for (int h = 0; h < nh; h++) {
        bf16 *xr = x + t * ldx + (size_t)h * D;
        float a = __bfloat162float(xr[i]), b = __bfloat162float(xr[i + half]);
        xr[i] = __float2bfloat16_rn(a * c - b * s);
        xr[i + half] = __float2bfloat16_rn(b * c + a * s);
    }
}

/* Fused q/k norm + RoPE (rot_dim == D). One warp per token; its lanes form
 * groups of CPR = D/8 lanes, a group holding one head's row as one 16-byte chunk
 * per lane, so 32/CPR heads are in flight per pass over the token's heads. The
 * row's sum of squares is a reduction inside the group (xor offsets < CPR), and
 * RoPE's partner of chunk c (element i pairs with i + D/2) is chunk c ^ CPR/2,
 * the lane lane ^ CPR/2 of the same group. A lane's 8 angles depend on the token
 * and its chunk only: sincos runs once per lane and serves every head.
 * Forward: y = rope(x r w). Backward (SIGN -1, the transposed rotation):
 * g = rope^T(dy), dx = r w g - x r^3 / D * sum g w x (w: the scale, 1 + w when
 * zero-centred). y (dx) may alias x (dy): every lane has read its chunk and
 * exchanged with its partner before it writes. */
template <int D, bool BWD>
__global__ void rmsnorm_rope_kernel(bf16 *y, int ldy, float *rstd_out, const float *rstd_in, const bf16 *x,
                                    int ldx, const bf16 *xs, int ldxs, const bf16 *w, bool zc, const int32_t *pos,
                                    const float *inv_freq, int T, int nh, float eps, float attn_scaling)
{
    constexpr int CPR = D / 8, R = 32 / CPR, HALF = D / 2;
    size_t t = (size_t)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32;
    if (t >= (size_t)T) return;
    int lane = threadIdx.x % 32, grp = lane / CPR, c = lane % CPR;
    bool first = c < CPR / 2;
    float cs[8], sn[8], wf[8];
    float p = (float)pos[t];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        sincosf(p * inv_freq[(c * 8 + j) % HALF], &sn[j], &cs[j]);
        cs[j] *= attn_scaling;
        sn[j] *= BWD ? -attn_scaling : attn_scaling;
    }
    load_scale8(wf, w + c * 8, zc);
    for (int h0 = 0; h0 < nh; h0 += R) {
        int h = h0 + grp;
        bool active = h < nh;
        size_t row = t * nh + h;
        float f[8], o[8], xf[8];
        if (active) load8(f, x + t * ldx + (size_t)h * D + c * 8);
        else for (int j = 0; j < 8; j++) f[j] = 0.0f;
        if (BWD) { /* rotate the incoming gradient first */
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = __shfl_xor_sync(0xffffffffu, f[j], CPR / 2);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = first ? f[j] * cs[j] - o[j] * sn[j] : f[j] * cs[j] + o[j] * sn[j];
            if (active) load8(xf, xs + t * ldxs + (size_t)h * D + c * 8);
            else for (int j = 0; j < 8; j++) xf[j] = 0.0f;
        }
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) acc += BWD ? f[j] * wf[j] * xf[j] : f[j] * f[j];
#pragma unroll
        for (int m = CPR / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
        if (BWD) {
            float r = active ? rstd_in[row] : 0.0f;
            float cx = acc * r * r * r / (float)D;
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = r * wf[j] * f[j] - cx * xf[j];
        } else {
            float r = 1.0f / sqrtf(acc / (float)D + eps);
            if (active && rstd_out && c == 0) rstd_out[row] = r;
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = f[j] * r * wf[j];
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = __shfl_xor_sync(0xffffffffu, f[j], CPR / 2);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = first ? f[j] * cs[j] - o[j] * sn[j] : f[j] * cs[j] + o[j] * sn[j];
        }
        if (active) store8(y + t * ldy + (size_t)h * D + c * 8, f);
    }
}

// ---- launchers ----

void cuda_rmsnorm_fwd(ct_backend *be, void *y, int ldy, float *rstd, const void *x, int ldx,
                      const void *w, int zero_centred, int T, int nh, int D, float eps)
{
    check_vec8("rmsnorm_fwd", y, ldy, D);
    check_vec8("rmsnorm_fwd", x, ldx, D);
    check_vec8("rmsnorm_fwd", w, D, D);
    size_t rows = (size_t)T * nh;
    if (rows == 0) return;
    rmsnorm_fwd_kernel<<<grid_for(rows, WARPS_PER_BLOCK), WARPS_PER_BLOCK * 32, 0, ctx_of(be)->stream>>>(
        (bf16 *)y, ldy, rstd, (const bf16 *)x, ldx, (const bf16 *)w, zero_centred != 0, T, nh, D, eps);
    LAUNCH_CHECK();
}

void cuda_rmsnorm_bwd(ct_backend *be, void *dx, int lddx, const void *dy, int lddy, const void *x,
                      int ldx, const float *rstd, const void *w, int zero_centred, int T, int nh, int D,
                      const void *dres, int lddres)
{
    if (dres) check_vec8("rmsnorm_bwd", dres, lddres, D);
    check_vec8("rmsnorm_bwd", dx, lddx, D);
    check_vec8("rmsnorm_bwd", dy, lddy, D);
    check_vec8("rmsnorm_bwd", x, ldx, D);
    check_vec8("rmsnorm_bwd", w, D, D);
    size_t rows = (size_t)T * nh;
    if (rows == 0) return;
    const unsigned grid = grid_for(rows, WARPS_PER_BLOCK), block = WARPS_PER_BLOCK * 32;
    cudaStream_t st = ctx_of(be)->stream;
    const bf16 *dyb = (const bf16 *)dy, *xb = (const bf16 *)x, *wb = (const bf16 *)w, *rb = (const bf16 *)dres;
    const bool zc = zero_centred != 0;
    if (!dres && D <= 2048)
        rmsnorm_bwd_rows_kernel<8><<<grid, block, 0, st>>>((bf16 *)dx, lddx, dyb, lddy, xb, ldx, rstd, wb, zc, T, nh,
                                                           D, NULL, 0);
    else
        rmsnorm_bwd_kernel<<<grid, block, 0, st>>>((bf16 *)dx, lddx, dyb, lddy, xb, ldx, rstd, wb, zc, T, nh, D, rb,
                                                   lddres);
    LAUNCH_CHECK();
}

void cuda_rope(ct_backend *be, void *x, int ldx, const int32_t *pos, const float *inv_freq,
               int T, int nh, int D, int rot_dim, float attn_scaling, int inverse)
{
    CT_ASSERT(rot_dim % 2 == 0 && rot_dim <= D, "rope: rot_dim %d must be even and <= D %d", rot_dim, D);
    int half = rot_dim / 2;
    size_t n = (size_t)T * half;
    if (n == 0) return;
    /* The transpose of [[c, -s], [s, c]] is the same matrix with -s. */
    rope_kernel<<<grid_for(n, 256), 256, 0, ctx_of(be)->stream>>>(
        (bf16 *)x, ldx, pos, inv_freq, T, nh, D, half, attn_scaling, inverse ? -1.0f : 1.0f);
    LAUNCH_CHECK();
}

/* The fused kernel covers rot_dim == D with D/8 lanes a power of two dividing
 * the warp (D 32..256: every qk_norm model); anything else composes the
 * unfused kernels. */
static bool rmsnorm_rope_fused(int D, int rot_dim)
{
    return rot_dim == D && (D == 32 || D == 64 || D == 128 || D == 256);
}

template <int D, bool BWD>
static void rmsnorm_rope_launch(cudaStream_t st, bf16 *y, int ldy, float *rstd_out, const float *rstd_in,
                                const bf16 *x, int ldx, const bf16 *xs, int ldxs, const bf16 *w, bool zc,
                                const int32_t *pos, const float *inv_freq, int T, int nh, float eps, float sc)
{
    rmsnorm_rope_kernel<D, BWD><<<grid_for((size_t)T, WARPS_PER_BLOCK), WARPS_PER_BLOCK * 32, 0, st>>>(
        y, ldy, rstd_out, rstd_in, x, ldx, xs, ldxs, w, zc, pos, inv_freq, T, nh, eps, sc);
    LAUNCH_CHECK();
}

template <bool BWD>
static void rmsnorm_rope_dispatch(cudaStream_t st, bf16 *y, int ldy, float *rstd_out, const float *rstd_in,
                                  const bf16 *x, int ldx, const bf16 *xs, int ldxs, const bf16 *w, bool zc,
                                  const int32_t *pos, const float *inv_freq, int T, int nh, int D, float eps,
                                  float sc)
{
    switch (D) {
    case 32: rmsnorm_rope_launch<32, BWD>(st, y, ldy, rstd_out, rstd_in, x, ldx, xs, ldxs, w, zc, pos, inv_freq, T, nh, eps, sc); break;
    case 64: rmsnorm_rope_launch<64, BWD>(st, y, ldy, rstd_out, rstd_in, x, ldx, xs, ldxs, w, zc, pos, inv_freq, T, nh, eps, sc); break;
    case 128: rmsnorm_rope_launch<128, BWD>(st, y, ldy, rstd_out, rstd_in, x, ldx, xs, ldxs, w, zc, pos, inv_freq, T, nh, eps, sc); break;
    default: rmsnorm_rope_launch<256, BWD>(st, y, ldy, rstd_out, rstd_in, x, ldx, xs, ldxs, w, zc, pos, inv_freq, T, nh, eps, sc); break;
    }
}

void cuda_rmsnorm_rope_fwd(ct_backend *be, void *y, int ldy, float *rstd, const void *x, int ldx,
                           const void *w, int zero_centred, const int32_t *pos, const float *inv_freq,
                           int T, int nh, int D, int rot_dim, float eps, float attn_scaling)
{
    if (!rmsnorm_rope_fused(D, rot_dim)) {
        cuda_rmsnorm_fwd(be, y, ldy, rstd, x, ldx, w, zero_centred, T, nh, D, eps);
        cuda_rope(be, y, ldy, pos, inv_freq, T, nh, D, rot_dim, attn_scaling, 0);
        return;
    }
    check_vec8("rmsnorm_rope_fwd", y, ldy, D);
    check_vec8("rmsnorm_rope_fwd", x, ldx, D);
    check_vec8("rmsnorm_rope_fwd", w, D, D);
    if (T == 0 || nh == 0) return;
    rmsnorm_rope_dispatch<false>(ctx_of(be)->stream, (bf16 *)y, ldy, rstd, NULL, (const bf16 *)x, ldx, NULL, 0,
                                 (const bf16 *)w, zero_centred != 0, pos, inv_freq, T, nh, D, eps, attn_scaling);
}

void cuda_rmsnorm_rope_bwd(ct_backend *be, void *dx, int lddx, const void *dy, int lddy,
                           const void *x, int ldx, const float *rstd, const void *w, int zero_centred,
                           const int32_t *pos, const float *inv_freq,
                           int T, int nh, int D, int rot_dim, float attn_scaling)
{
    if (!rmsnorm_rope_fused(D, rot_dim)) { /* rotate a copy in dx, then normalise in place */
        if (dx != dy) cuda_copy_2d(be, dx, lddx, dy, lddy, T, nh * D);
        cuda_rope(be, dx, lddx, pos, inv_freq, T, nh, D, rot_dim, attn_scaling, 1);
        cuda_rmsnorm_bwd(be, dx, lddx, dx, lddx, x, ldx, rstd, w, zero_centred, T, nh, D, NULL, 0);
        return;
    }
    check_vec8("rmsnorm_rope_bwd", dx, lddx, D);
    check_vec8("rmsnorm_rope_bwd", dy, lddy, D);
    check_vec8("rmsnorm_rope_bwd", x, ldx, D);
    check_vec8("rmsnorm_rope_bwd", w, D, D);
    if (T == 0 || nh == 0) return;
    rmsnorm_rope_dispatch<true>(ctx_of(be)->stream, (bf16 *)dx, lddx, NULL, rstd, (const bf16 *)dy, lddy,
                                (const bf16 *)x, ldx, (const bf16 *)w, zero_centred != 0, pos, inv_freq, T, nh,
                                D, 0.0f, attn_scaling);
}
