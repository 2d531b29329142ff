/* quant4.c — bitsandbytes NF4/FP4 blockwise quantization, its double
 * quantization and the Linear4bit quant_state (contract: quant4.h).
 *
 * bnb 0.50.2 on the CPU quantizes with torch ops (backends/default/ops.py):
 * scaled = clamp(x * (1/absmax), -1, 1), except that the short last block
 * divides (x / absmax), and the code is torch.bucketize over the fp32
 * midpoints of the sorted code book (a value on a midpoint takes the lower
 * one); an odd n pads with the code of 0. The 8-bit stats come from its C++
 * kernel, which does not pick the nearest map value: v = x * (1/absmax) is
 * truncated to one of 65536 grid points, ((v+1)*0.5)*65535 + 0.5, and a table
 * gives the map value nearest that grid point (a tie to the lower index), so
 * now and then a value lands one step off the nearest. Each of these roundings
 * shows in the fixtures, so each is reproduced as is. */
#include "quant4.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "mxfp4.h"

static const float nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f,
};

/* FP4 (E2M1 with bnb's bias) normalized by its largest value, 12. Code 8 is
 * -0.0 as bnb's C++ and CUDA kernels decode it (get_4bit_type says +0.0). */
static const float fp4_code[16] = {
    0.0f, 0.0052083334885537624f, 0.6666666865348816f, 1.0f,
    0.3333333432674408f, 0.5f, 0.1666666716337204f, 0.25f,
    -0.0f, -0.0052083334885537624f, -0.6666666865348816f, -1.0f,
    -0.3333333432674408f, -0.5f, -0.1666666716337204f, -0.25f,
};

/* Code indices in ascending order of value: torch.argsort's order, which puts
 * code 0 before code 8 (both 0.0), so x <= 0 encodes as 0 and a positive x
 * below the first midpoint as 8. */
static const uint8_t nf4_order[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const uint8_t fp4_order[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};

static const float dynamic_map[256] = {
    -0x1.fc6666p-1f,  -0x1.f53334p-1f,  -0x1.eep-1f,      -0x1.e6ccccp-1f,  -0x1.df999ap-1f,  -0x1.d86666p-1f,
    -0x1.d13334p-1f,  -0x1.cap-1f,      -0x1.c2ccccp-1f,  -0x1.bb999ap-1f,  -0x1.b46666p-1f,  -0x1.ad3334p-1f,
    -0x1.a6p-1f,      -0x1.9eccccp-1f,  -0x1.97999ap-1f,  -0x1.906666p-1f,  -0x1.893334p-1f,  -0x1.82p-1f,
    -0x1.7accccp-1f,  -0x1.73999ap-1f,  -0x1.6c6668p-1f,  -0x1.653334p-1f,  -0x1.5ep-1f,      -0x1.56ccccp-1f,
    -0x1.4f999ap-1f,  -0x1.486668p-1f,  -0x1.413334p-1f,  -0x1.3ap-1f,      -0x1.32ccccp-1f,  -0x1.2b999ap-1f,
    -0x1.246668p-1f,  -0x1.1d3334p-1f,  -0x1.16p-1f,      -0x1.0eccccp-1f,  -0x1.079998p-1f,  -0x1.006666p-1f,
    -0x1.f26664p-2f,  -0x1.e4p-2f,      -0x1.d59998p-2f,  -0x1.c73334p-2f,  -0x1.b8ccccp-2f,  -0x1.aa6666p-2f,
    -0x1.9cp-2f,      -0x1.8d9998p-2f,  -0x1.7f3334p-2f,  -0x1.70ccccp-2f,  -0x1.626666p-2f,  -0x1.54p-2f,
    -0x1.459998p-2f,  -0x1.373334p-2f,  -0x1.28ccccp-2f,  -0x1.1a6668p-2f,  -0x1.0cp-2f,      -0x1.fb3332p-3f,
    -0x1.de6666p-3f,  -0x1.c1999ap-3f,  -0x1.a4ccccp-3f,  -0x1.88p-3f,      -0x1.6b3334p-3f,  -0x1.4e6666p-3f,
    -0x1.31999ap-3f,  -0x1.14ccccp-3f,  -0x1.fp-4f,       -0x1.b66668p-4f,  -0x1.93d70ap-4f,  -0x1.8851eep-4f,
    -0x1.7ccccep-4f,  -0x1.7147aep-4f,  -0x1.65c29p-4f,   -0x1.5a3d7p-4f,   -0x1.4eb854p-4f,  -0x1.433334p-4f,
    -0x1.37ae14p-4f,  -0x1.2c28f6p-4f,  -0x1.20a3d6p-4f,  -0x1.151ebap-4f,  -0x1.09999ap-4f,  -0x1.fc28f6p-5f,
    -0x1.e51ebap-5f,  -0x1.ce147ap-5f,  -0x1.b70a3ep-5f,  -0x1.ap-5f,       -0x1.88f5c2p-5f,  -0x1.71eb86p-5f,
    -0x1.5ae146p-5f,  -0x1.43d70ap-5f,  -0x1.2ccccep-5f,  -0x1.15c29p-5f,   -0x1.fd70a4p-6f,  -0x1.cf5c2ap-6f,
    -0x1.a147aep-6f,  -0x1.733334p-6f,  -0x1.451ebap-6f,  -0x1.170a3ep-6f,  -0x1.d1eb86p-7f,  -0x1.75c29p-7f,
    -0x1.3e76c8p-7f,  -0x1.2c083p-7f,   -0x1.19999ap-7f,  -0x1.072b02p-7f,  -0x1.e978d4p-8f,  -0x1.c49ba6p-8f,
    -0x1.9fbe76p-8f,  -0x1.7ae148p-8f,  -0x1.56041ap-8f,  -0x1.3126e8p-8f,  -0x1.0c49bap-8f,  -0x1.ced914p-9f,
    -0x1.851eb8p-9f,  -0x1.3b645ap-9f,  -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, -0x1.eecbfep-11f, -0x1.b3d07cp-11f,
    -0x1.78d5p-11f,   -0x1.3dd982p-11f, -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, -0x1.040bfep-17f, -0x1.b43528p-19f,
    -0x1.27476ep-21f, 0.0f,             0x1.27476ep-21f,  0x1.b43528p-19f,  0x1.040bfep-17f,  0x1.64840cp-16f,
    0x1.6f0068p-15f,  0x1.15df66p-14f,  0x1.743e96p-14f,  0x1.47ae16p-13f,  0x1.19ce0ap-12f,  0x1.8fc506p-12f,
    0x1.02de02p-11f,  0x1.3dd982p-11f,  0x1.78d5p-11f,    0x1.b3d07cp-11f,  0x1.eecbfep-11f,  0x1.4fdf3ap-10f,
    0x1.e353f8p-10f,  0x1.3b645ap-9f,   0x1.851eb8p-9f,   0x1.ced914p-9f,   0x1.0c49bap-8f,   0x1.3126e8p-8f,
    0x1.56041ap-8f,   0x1.7ae148p-8f,   0x1.9fbe76p-8f,   0x1.c49ba6p-8f,   0x1.e978d4p-8f,   0x1.072b02p-7f,
    0x1.19999ap-7f,   0x1.2c083p-7f,    0x1.3e76c8p-7f,   0x1.75c29p-7f,    0x1.d1eb86p-7f,   0x1.170a3ep-6f,
    0x1.451ebap-6f,   0x1.733334p-6f,   0x1.a147aep-6f,   0x1.cf5c2ap-6f,   0x1.fd70a4p-6f,   0x1.15c29p-5f,
    0x1.2ccccep-5f,   0x1.43d70ap-5f,   0x1.5ae146p-5f,   0x1.71eb86p-5f,   0x1.88f5c2p-5f,   0x1.ap-5f,
    0x1.b70a3ep-5f,   0x1.ce147ap-5f,   0x1.e51ebap-5f,   0x1.fc28f6p-5f,   0x1.09999ap-4f,   0x1.151ebap-4f,
    0x1.20a3d6p-4f,   0x1.2c28f6p-4f,   0x1.37ae14p-4f,   0x1.433334p-4f,   0x1.4eb854p-4f,   0x1.5a3d7p-4f,
    0x1.65c29p-4f,    0x1.7147aep-4f,   0x1.7ccccep-4f,   0x1.8851eep-4f,   0x1.93d70ap-4f,   0x1.b66668p-4f,
    0x1.fp-4f,        0x1.14ccccp-3f,   0x1.31999ap-3f,   0x1.4e6666p-3f,   0x1.6b3334p-3f,   0x1.88p-3f,
    0x1.a4ccccp-3f,   0x1.c1999ap-3f,   0x1.de6666p-3f,   0x1.fb3332p-3f,   0x1.0cp-2f,       0x1.1a6668p-2f,
    0x1.28ccccp-2f,   0x1.373334p-2f,   0x1.459998p-2f,   0x1.54p-2f,       0x1.626666p-2f,   0x1.70ccccp-2f,
    0x1.7f3334p-2f,   0x1.8d9998p-2f,   0x1.9cp-2f,       0x1.aa6666p-2f,   0x1.b8ccccp-2f,   0x1.c73334p-2f,
    0x1.d59998p-2f,   0x1.e4p-2f,       0x1.f26664p-2f,   0x1.006666p-1f,   0x1.079998p-1f,   0x1.0eccccp-1f,
    0x1.16p-1f,       0x1.1d3334p-1f,   0x1.246668p-1f,   0x1.2b999ap-1f,   0x1.32ccccp-1f,   0x1.3ap-1f,
    0x1.413334p-1f,   0x1.486668p-1f,   0x1.4f999ap-1f,   0x1.56ccccp-1f,   0x1.5ep-1f,       0x1.653334p-1f,
    0x1.6c6668p-1f,   0x1.73999ap-1f,   0x1.7accccp-1f,   0x1.82p-1f,       0x1.893334p-1f,   0x1.906666p-1f,
    0x1.97999ap-1f,   0x1.9eccccp-1f,   0x1.a6p-1f,       0x1.ad3334p-1f,   0x1.b46666p-1f,   0x1.bb999ap-1f,
    0x1.c2ccccp-1f,   0x1.cap-1f,       0x1.d13334p-1f,   0x1.d86666p-1f,   0x1.df999ap-1f,   0x1.e6ccccp-1f,
    0x1.eep-1f,       0x1.f53334p-1f,   0x1.fc6666p-1f,   0x1p+0f,
};

const float *quant4_code(quant4_type t)
{
    return t == QUANT4_NF4 ? nf4_code : t == QUANT4_FP4 ? fp4_code : mxfp4_code();
}
const float *quant4_dynamic_map(void) { return dynamic_map; }

bool quant4_blocksize_valid(size_t blocksize)
{
    return blocksize >= 32 && blocksize <= 4096 && (blocksize & (blocksize - 1)) == 0;
}

static uint8_t encode4(float scaled, const float *bounds, const uint8_t *order)
{
    /* torch.bucketize(right=False): the count of bounds below scaled, by
     * binary search over the 15 ascending bounds (bounds[0..q) stay below) */
    int q = 0;
    for (int step = 8; step > 0; step >>= 1)
        if (q + step <= 15 && bounds[q + step - 1] < scaled) q += step;
    return order[q];
}

int quant4_quantize(uint8_t *packed, float *absmax, const float *x, size_t n, size_t blocksize,
                    quant4_type t, ct_error *err)
{
    CT_ASSERT(quant4_blocksize_valid(blocksize), "quant4_quantize: blocksize %zu is not a power of two in [32, 4096]",
              blocksize);
    CT_ASSERT(t != QUANT4_MXFP4, "quant4_quantize: MXFP4 has its own encoder");
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return CT_FAIL_INPUT(err, "quant4: element %zu is %g; only finite values quantize", i, x[i]);
    const float *code = quant4_code(t);
    const uint8_t *order = t == QUANT4_NF4 ? nf4_order : fp4_order;
    float bounds[15];
    for (int i = 0; i < 15; i++) bounds[i] = (code[order[i]] + code[order[i + 1]]) / 2.0f;

    memset(packed, 0, quant4_packed_bytes(n));
    if (n % 2) packed[n / 2] = encode4(0.0f, bounds, order);
    size_t nblocks = quant4_num_blocks(n, blocksize);
    /* blocks start at even elements, so no two blocks share a byte */
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nblocks; b++) {
        size_t lo = b * blocksize, hi = lo + blocksize < n ? lo + blocksize : n;
        float am = 0.0f;
        for (size_t i = lo; i < hi; i++) am = fmaxf(am, fabsf(x[i]));
        float den = fmaxf(am, 1e-38f);  /* torch clamp(min=1e-38): a zero block encodes 0 */
        float inv = 1.0f / den;
        bool full = hi - lo == blocksize;
        absmax[b] = full ? am : den;    /* bnb keeps the clamp for the short block only */
        for (size_t i = lo; i < hi; i++) {
            float s = full ? x[i] * inv : x[i] / den;
            s = fminf(fmaxf(s, -1.0f), 1.0f);
            uint8_t q = encode4(s, bounds, order);
            packed[i / 2] |= (uint8_t)(i % 2 == 0 ? q << 4 : q);
        }
    }
    return CT_OK;
}

void quant4_dequantize(float *y, const uint8_t *packed, const float *absmax, size_t n, size_t blocksize,
                       quant4_type t)
{
    CT_ASSERT(blocksize > 0 && t != QUANT4_MXFP4, "quant4_dequantize: blocksize 0 or MXFP4");
    const float *code = quant4_code(t);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint8_t q = i % 2 == 0 ? packed[i / 2] >> 4 : packed[i / 2] & 0x0F;
        y[i] = code[q] * absmax[i / blocksize];
    }
}

/* torch's CPU sum (aten/src/ATen/native/cpu/SumKernel.cpp) for one contiguous
 * row: items of W lanes summed by 4 interleaved accumulators (ILP), each a
 * cascade of 4 levels flushed every 2^level_power rows, so the fp32 rounding
 * is torch's and not a plain loop's. */
enum { SUM_ILP = 4, SUM_LEVELS = 4, SUM_MAX_W = 8 };

static void multi_row_sum(float out[SUM_ILP][SUM_MAX_W], const float *x, size_t rows, int W)
{
    size_t ceil_log2 = rows <= 2 ? 1 : 64 - (size_t)__builtin_clzll((unsigned long long)(rows - 1));
    size_t level_power = ceil_log2 / SUM_LEVELS > 4 ? ceil_log2 / SUM_LEVELS : 4;
    size_t level_step = (size_t)1 << level_power, level_mask = level_step - 1;
    float acc[SUM_LEVELS][SUM_ILP][SUM_MAX_W] = {{{0}}};
    size_t i = 0;
    for (; i + level_step <= rows;) {
        for (size_t j = 0; j < level_step; j++, i++)
            for (int k = 0; k < SUM_ILP; k++)
                for (int l = 0; l < W; l++) acc[0][k][l] += x[(i * SUM_ILP + (size_t)k) * (size_t)W + (size_t)l];
        for (int j = 1; j < SUM_LEVELS; j++) {
            for (int k = 0; k < SUM_ILP; k++)
                for (int l = 0; l < W; l++) { acc[j][k][l] += acc[j - 1][k][l]; acc[j - 1][k][l] = 0.0f; }
            if ((i & (level_mask << ((size_t)j * level_power))) != 0) break;
        }
    }
    for (; i < rows; i++)
        for (int k = 0; k < SUM_ILP; k++)
            for (int l = 0; l < W; l++) acc[0][k][l] += x[(i * SUM_ILP + (size_t)k) * (size_t)W + (size_t)l];
    for (int j = 1; j < SUM_LEVELS; j++)
        for (int k = 0; k < SUM_ILP; k++)
            for (int l = 0; l < W; l++) acc[0][k][l] += acc[j][k][l];
    memcpy(out, acc[0], sizeof acc[0]);
}

/* Sum of `items` items of W lanes each, lane by lane, into out[W]. */
static void row_sum(float *out, const float *x, size_t items, int W)
{
    float p[SUM_ILP][SUM_MAX_W];
    size_t rows = items / SUM_ILP;
    multi_row_sum(p, x, rows, W);
    for (size_t i = rows * SUM_ILP; i < items; i++)
        for (int l = 0; l < W; l++) p[0][l] += x[i * (size_t)W + (size_t)l];
    for (int k = 1; k < SUM_ILP; k++)
        for (int l = 0; l < W; l++) p[0][l] += p[k][l];
    memcpy(out, p[0], (size_t)W * sizeof(float));
}

float quant4_mean(const float *x, size_t n)
{
    CT_ASSERT(n > 0, "quant4_mean: empty input");
    float sum;
    if (n >= SUM_MAX_W) {  /* torch's vectorized_inner_sum, 8 fp32 lanes (AVX2) */
        size_t vecs = n / SUM_MAX_W;
        float lanes[SUM_MAX_W];
        row_sum(lanes, x, vecs, SUM_MAX_W);
        sum = 0.0f;
        for (size_t i = vecs * SUM_MAX_W; i < n; i++) sum += x[i];
        for (int l = 0; l < SUM_MAX_W; l++) sum += lanes[l];
    } else {               /* scalar_inner_sum */
        row_sum(&sum, x, n, 1);
    }
    return sum / (float)n;
}

enum { DYN_GRID = 65536 };

/* The grid point of v in [-1, 1], as bnb's kernel computes it. */
static size_t dyn_grid_index(float v)
{
    v = fminf(fmaxf(v, -1.0f), 1.0f);
    return (size_t)(((v + 1.0f) * 0.5f) * 65535.0f + 0.5f);
}

/* The map index nearest g, a tie going to the lower index. */
static uint8_t dyn_nearest(float g)
{
    int right = 0;  /* the first map value >= g (std::lower_bound) */
    while (right < 256 && dynamic_map[right] < g) right++;
    if (right == 0) return 0;
    if (right == 256) return 255;
    float dl = fabsf(g - dynamic_map[right - 1]), dr = fabsf(dynamic_map[right] - g);
    return (uint8_t)(dr < dl ? right : right - 1);
}

/* dyn_nearest of every grid point, built once: 65536 searches of the 256-entry
 * map cost more than quantizing a tensor's absmax. */
static uint8_t dyn_table[DYN_GRID];
static pthread_once_t dyn_table_once = PTHREAD_ONCE_INIT;

static void dyn_table_build(void)
{
    for (size_t k = 0; k < DYN_GRID; k++) dyn_table[k] = dyn_nearest((float)k / 65535.0f * 2.0f - 1.0f);
}

void quant4_quantize_dynamic(uint8_t *q8, float *absmax, const float *x, size_t n)
{
    pthread_once(&dyn_table_once, dyn_table_build);
    const size_t bs = QUANT4_NESTED_BLOCKSIZE, nb = ct_ceil_div(n, bs);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * bs, hi = lo + bs < n ? lo + bs : n;
        float am = 0.0f;
        for (size_t i = lo; i < hi; i++) am = fmaxf(am, fabsf(x[i]));
        absmax[b] = am;
        float inv = 1.0f / am;
        for (size_t i = lo; i < hi; i++) q8[i] = am == 0.0f ? 0 : dyn_table[dyn_grid_index(x[i] * inv)];
    }
}

void quant4_double_quantize(uint8_t *q8, float *nested_absmax, float *offset, const float *absmax,
                            size_t nblocks)
{
    CT_ASSERT(nblocks > 0, "quant4_double_quantize: no blocks");
    float off = quant4_mean(absmax, nblocks);
    float *centered = ct_malloc(nblocks * sizeof(float));
    for (size_t i = 0; i < nblocks; i++) centered[i] = absmax[i] - off;
    quant4_quantize_dynamic(q8, nested_absmax, centered, nblocks);
    free(centered);
    *offset = off;
}

void quant4_double_dequantize(float *absmax, const uint8_t *q8, const float *nested_absmax,
                              const float *map, float offset, size_t nblocks)
{
    for (size_t i = 0; i < nblocks; i++)
        absmax[i] = map[q8[i]] * nested_absmax[i / QUANT4_NESTED_BLOCKSIZE] + offset;
}

/* ---- Linear4bit tensors in safetensors ---- */

void quant4_double_roundtrip(float *absmax, size_t nblocks)
{
    uint8_t *q8 = ct_malloc(nblocks);
    float *nested = ct_malloc(ct_ceil_div(nblocks, QUANT4_NESTED_BLOCKSIZE) * sizeof(float)), offset;
    quant4_double_quantize(q8, nested, &offset, absmax, nblocks);
    quant4_double_dequantize(absmax, q8, nested, quant4_dynamic_map(), offset, nblocks);
    free(q8);
    free(nested);
}

static const st_tensor *state_tensor(const st_reader *r, const char *name, quant4_type *type)
{
    char key[1024];
    snprintf(key, sizeof key, "%s.quant_state.bitsandbytes__nf4", name);
    const st_tensor *t = st_find(r, key);
    if (t) { *type = QUANT4_NF4; return t; }
    snprintf(key, sizeof key, "%s.quant_state.bitsandbytes__fp4", name);
    t = st_find(r, key);
    *type = QUANT4_FP4;
    return t;
}

bool quant4_is_quantized(const st_reader *r, const char *name)
{
    quant4_type t;
    return state_tensor(r, name, &t) != NULL;
}

/* Finds NAME+SUFFIX with dtype and numel; fails naming it, in FILE (where the
 * quant_state is) when it is missing. */
static int expect_tensor(const st_reader *r, const char *file, const char *name, const char *suffix, ct_dtype dtype,
                         size_t numel, const st_tensor **out, ct_error *err)
{
    char key[1024];
    snprintf(key, sizeof key, "%s%s", name, suffix);
    const st_tensor *t = st_find(r, key);
    if (!t) return CT_FAIL_INPUT(err, "%s: tensor %s is missing (a bitsandbytes 4-bit weight needs it)", file, key);
    if (t->dtype != dtype || t->numel != numel)
        return CT_FAIL_INPUT(err, "%s: tensor %s: %s with %zu elements, expected %s with %zu", t->file, key,
                             ct_dtype_name(t->dtype), t->numel, ct_dtype_name(dtype), numel);
    *out = t;
    return CT_OK;
}

/* The fp32 values of T (F32, numel n) into a new aligned buffer; non-finite or
 * (when nonneg) negative values are an input error naming T. */
static int read_f32(const st_tensor *t, bool nonneg, float **out, ct_error *err)
{
    float *v = ct_malloc(t->numel * sizeof(float));
    memcpy(v, t->data, t->numel * sizeof(float));
    for (size_t i = 0; i < t->numel; i++)
        if (!isfinite(v[i]) || (nonneg && v[i] < 0)) {
            int rc = CT_FAIL_INPUT(err, "%s: tensor %s: element %zu is %g (expected a finite%s value)", t->file,
                                   t->name, i, v[i], nonneg ? ", non-negative" : "");
            free(v);
            return rc;
        }
    *out = v;
    return CT_OK;
}

static int parse_state(const st_tensor *st, quant4_type key_type, quant4_info *info, ct_error *err)
{
    const char *src = st->name, *file = st->file;
    if (st->dtype != CT_DTYPE_U8 || st->ndim != 1)
        return CT_FAIL_INPUT(err, "%s: tensor %s: expected a 1-D U8 tensor of JSON bytes, found %s with %d dims", file,
                             src, ct_dtype_name(st->dtype), st->ndim);
    char where[1200];
    snprintf(where, sizeof where, "%s: tensor %s", file, src);
    json_doc *doc = json_parse(st->data, st->nbytes, where, err);
    if (!doc) return err ? err->code : CT_ERR_INPUT;
    const json_value *root = json_root(doc);
    int rc = CT_OK;
    const json_value *qt = json_get_type(root, "quant_type", JSON_STRING);
    const json_value *dtype = json_get_type(root, "dtype", JSON_STRING);
    const json_value *shape = json_get_type(root, "shape", JSON_ARRAY);
    long long bs = 0;
    if (root->type != JSON_OBJECT) { rc = CT_FAIL_INPUT(err, "%s: expected a JSON object", where); goto done; }
    if (!qt || !dtype || !shape || !json_get(root, "blocksize")) {
        rc = CT_FAIL_INPUT(err, "%s: needs the keys quant_type, blocksize, dtype and shape", where);
        goto done;
    }
    char text[128];   /* a string of the blob, quoted in one line */
    if (strcmp(qt->string, "nf4") == 0) info->type = QUANT4_NF4;
    else if (strcmp(qt->string, "fp4") == 0) info->type = QUANT4_FP4;
    else {
        rc = CT_FAIL_INPUT(err, "%s: unknown quant_type '%s' (nf4 or fp4)", where,
                           st_printable(text, sizeof text, qt->string));
        goto done;
    }
    if (info->type != key_type) {
        rc = CT_FAIL_INPUT(err, "%s: quant_type '%s' does not match the tensor's name", where, qt->string);
        goto done;
    }
    if ((rc = json_get_int(root, "blocksize", 0, &bs, where, err))) goto done;
    if (bs <= 0 || !quant4_blocksize_valid((size_t)bs)) {
        rc = CT_FAIL_INPUT(err, "%s: blocksize %lld is not a power of two in [32, 4096]", where, bs);
        goto done;
    }
    info->blocksize = (size_t)bs;
    if (dtype->string_len >= sizeof info->dtype) {
        rc = CT_FAIL_INPUT(err, "%s: dtype '%s' is not a torch dtype name", where,
                           st_printable(text, sizeof text, dtype->string));
        goto done;
    }
    strcpy(info->dtype, dtype->string);
    if (shape->count < 1 || shape->count > ST_MAX_DIMS) {
        rc = CT_FAIL_INPUT(err, "%s: shape has %zu dims (1 to %d)", where, shape->count, ST_MAX_DIMS);
        goto done;
    }
    info->ndim = (int)shape->count;
    info->numel = 1;
    for (size_t i = 0; i < shape->count; i++) {
        const json_value *d = shape->items[i];
        if (d->type != JSON_NUMBER || !d->is_integer || d->integer <= 0 ||
            !ct_size_mul(info->numel, (size_t)d->integer, &info->numel)) {
            rc = CT_FAIL_INPUT(err, "%s: shape[%zu] is not a positive integer (or the shape overflows)", where, i);
            goto done;
        }
        info->shape[i] = d->integer;
    }
    info->nested = json_get(root, "nested_blocksize") != NULL;
    info->offset = 0.0f;
    if (info->nested) {
        long long nbs = 0;
        const json_value *nd = json_get_type(root, "nested_dtype", JSON_STRING);
        const json_value *off = json_get_type(root, "nested_offset", JSON_NUMBER);
        if ((rc = json_get_int(root, "nested_blocksize", 0, &nbs, where, err))) goto done;
        if (nbs != QUANT4_NESTED_BLOCKSIZE || !nd || strcmp(nd->string, "float32") != 0 || !off) {
            rc = CT_FAIL_INPUT(err, "%s: double quantization needs nested_blocksize 256, nested_dtype \"float32\" "
                               "and a nested_offset", where);
            goto done;
        }
        info->offset = (float)off->number;  /* written from an fp32, so exact */
        if (!isfinite(info->offset)) {
            rc = CT_FAIL_INPUT(err, "%s: nested_offset %g is not a finite fp32", where, off->number);
            goto done;
        }
    }
done:
    json_free(doc);
    return rc;
}

int quant4_read_info(const st_reader *r, const char *name, quant4_info *info, ct_error *err)
{
    memset(info, 0, sizeof *info);
    quant4_type key_type;
    const st_tensor *st = state_tensor(r, name, &key_type);
    if (!st) {
        const st_tensor *w = st_find(r, name);
        return CT_FAIL_INPUT(err, "%s: tensor %s has no %s.quant_state.bitsandbytes__nf4 or __fp4 (not a "
                             "bitsandbytes 4-bit weight)", w ? w->file : "checkpoint", name, name);
    }
    int rc = parse_state(st, key_type, info, err);
    if (rc) return rc;
    const char *file = st->file;
    const st_tensor *w = st_find(r, name), *t;
    if (!w) return CT_FAIL_INPUT(err, "%s: tensor %s is missing (its quant_state is there)", file, name);
    /* any storage dtype (bnb_4bit_quant_storage): the same bytes reinterpreted */
    if (w->nbytes != quant4_packed_bytes(info->numel))
        return CT_FAIL_INPUT(err, "%s: tensor %s: %zu bytes, but the quant_state's shape needs %zu packed bytes",
                             w->file, name, w->nbytes, quant4_packed_bytes(info->numel));
    size_t nblocks = quant4_num_blocks(info->numel, info->blocksize);
    if ((rc = expect_tensor(r, file, name, ".absmax", info->nested ? CT_DTYPE_U8 : CT_DTYPE_F32, nblocks, &t, err)))
        return rc;
    if ((rc = expect_tensor(r, file, name, ".quant_map", CT_DTYPE_F32, 16, &t, err))) return rc;
    float map[16];
    memcpy(map, t->data, sizeof map);
    const float *code = quant4_code(info->type);
    for (int i = 0; i < 16; i++)
        if (!(map[i] == code[i]))
            return CT_FAIL_INPUT(err, "%s: tensor %s: element %d is %.9g, not the %s code book's %.9g", t->file,
                                 t->name, i, map[i], info->type == QUANT4_NF4 ? "nf4" : "fp4", code[i]);
    if (info->nested) {
        size_t nn = ct_ceil_div(nblocks, QUANT4_NESTED_BLOCKSIZE);
        if ((rc = expect_tensor(r, file, name, ".nested_absmax", CT_DTYPE_F32, nn, &t, err))) return rc;
        if ((rc = expect_tensor(r, file, name, ".nested_quant_map", CT_DTYPE_F32, 256, &t, err))) return rc;
    }
    return CT_OK;
}

int quant4_load_blocks(const st_reader *r, const char *name, quant4_info *info, const uint8_t **codes,
                       float **absmax_out, ct_error *err)
{
    *absmax_out = NULL;
    int rc = quant4_read_info(r, name, info, err);
    if (rc) return rc;
    char key[1024];
    size_t nblocks = quant4_num_blocks(info->numel, info->blocksize);
    snprintf(key, sizeof key, "%s.absmax", name);
    const st_tensor *am_t = st_find(r, key);
    float *absmax = NULL;
    if (info->nested) {
        float *nested = NULL, *nmap = NULL;
        snprintf(key, sizeof key, "%s.nested_absmax", name);
        rc = read_f32(st_find(r, key), true, &nested, err);
        snprintf(key, sizeof key, "%s.nested_quant_map", name);
        if (!rc) rc = read_f32(st_find(r, key), false, &nmap, err);
        if (!rc) {
            absmax = ct_malloc(nblocks * sizeof(float));
            quant4_double_dequantize(absmax, am_t->data, nested, nmap, info->offset, nblocks);
            /* finite stats can still overflow fp32 in map * nested + offset */
            for (size_t i = 0; i < nblocks && !rc; i++)
                if (!isfinite(absmax[i]))
                    rc = CT_FAIL_INPUT(err, "%s: tensor %s: block %zu decodes to %g (nested_quant_map x "
                                       "nested_absmax + nested_offset overflows fp32)", am_t->file, am_t->name, i,
                                       absmax[i]);
        }
        free(nested);
        free(nmap);
        if (rc) {
            free(absmax);
            return rc;
        }
    } else if ((rc = read_f32(am_t, true, &absmax, err))) {
        return rc;
    }
    *codes = st_find(r, name)->data;
    *absmax_out = absmax;
    return CT_OK;
}

int quant4_load_f32(const st_reader *r, const char *name, quant4_info *info, float **out, ct_error *err)
{
    *out = NULL;
    const uint8_t *codes;
    float *absmax;
    int rc = quant4_load_blocks(r, name, info, &codes, &absmax, err);
    if (rc) return rc;
    float *y = ct_malloc(info->numel * sizeof(float));
    quant4_dequantize(y, codes, absmax, info->numel, info->blocksize, info->type);
    free(absmax);
    *out = y;
    return CT_OK;
}
