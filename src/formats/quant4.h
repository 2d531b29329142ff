/* quant4.h — bitsandbytes' 4-bit weight formats (NF4, FP4) on the CPU, bit for
 * bit as bitsandbytes 0.50.2 writes them, and the Linear4bit tensors of a
 * safetensors checkpoint (QLoRA bases), read by model.c. It also names the
 * MXFP4 code (gpt-oss experts), which the same dequantization op decodes.
 *
 * Layout. A weight of n elements is flattened row-major and cut into blocks of
 * `blocksize` consecutive elements (the last block may be short). Each block
 * keeps absmax = max|x| (fp32; a short last block of zeros keeps 1e-38, as bnb
 * does) and one 4-bit code per element: the index of the nearest code-book value
 * to x / absmax. Codes are packed two per byte, the even element in the HIGH
 * nibble: (n+1)/2 bytes. Dequantized x = code[q] * absmax, in fp32.
 *
 * Double quantization (bnb's compress_statistics) stores absmax again in 8
 * bits: offset = mean(absmax), then absmax - offset is quantized blockwise
 * with blocks of 256 over the 256-value signed "dynamic" map, keeping one fp32
 * nested_absmax per 256 blocks. Decoded absmax[i] = map[q8[i]] *
 * nested_absmax[i/256] + offset.
 *
 * Bit-exactness (checked by tests/test_quant4.c against fixtures written by the
 * real bitsandbytes): codes, absmax, the 8-bit stats and dequantized values.
 * The offset is torch's fp32 mean as its AVX2 CPU kernel sums (checked up to
 * 262144 blocks); torch on AVX-512 may round its last bit differently, and so
 * may bnb itself. bnb's CUDA quantizer rounds by its own code, not compared
 * here. Loading reads a file's codes, absmax and offset and never re-quantizes,
 * so it is exact whichever machine made the file. */
#ifndef CT_QUANT4_H
#define CT_QUANT4_H

#include "safetensors.h"

/* MXFP4 (OCP microscaling, gpt-oss checkpoints): E2M1 values, the even element
 * in the LOW nibble, blocks of 32 sharing one E8M0 scale byte s (2^(s-127)). */
typedef enum { QUANT4_NF4, QUANT4_FP4, QUANT4_MXFP4 } quant4_type;
#define QUANT4_MXFP4_BLOCKSIZE 32 /* mxfp4.h: the format, its checks and its encoder */

#define QUANT4_NESTED_BLOCKSIZE 256

/* The 16 fp32 values a 4-bit code stands for (bnb's get_4bit_type, except that
 * FP4 code 8 is -0.0, as bnb's kernels decode it; MXFP4: 0, .5, 1, 1.5, 2, 3,
 * 4, 6 and their negatives, code 8 -0.0). */
const float *quant4_code(quant4_type t);
/* bnb's create_dynamic_map(signed=True): 256 sorted fp32 values in [-1, 1]. */
const float *quant4_dynamic_map(void);
/* bnb accepts powers of two from 32 to 4096. */
bool quant4_blocksize_valid(size_t blocksize);
static inline size_t quant4_num_blocks(size_t n, size_t blocksize) { return ct_ceil_div(n, blocksize); }
static inline size_t quant4_packed_bytes(size_t n) { return (n + 1) / 2; }

/* Quantizes x[0..n) (bnb quantize_4bit): packed gets quant4_packed_bytes(n)
 * bytes (an odd n pads the last low nibble with the code of 0), absmax gets
 * quant4_num_blocks(n, blocksize) floats. A non-finite x[i] is CT_ERR_INPUT
 * naming the element; blocksize must be valid (asserted). */
int quant4_quantize(uint8_t *packed, float *absmax, const float *x, size_t n, size_t blocksize,
                    quant4_type t, ct_error *err);
/* y[0..n) = code[q] * absmax[block] (bnb dequantize_4bit to float32). */
void quant4_dequantize(float *y, const uint8_t *packed, const float *absmax, size_t n, size_t blocksize,
                       quant4_type t);

/* torch's float32 absmax.mean() (see the header comment for its limits). */
float quant4_mean(const float *x, size_t n);
/* bnb's quantize_blockwise(x, blocksize=256) over the dynamic map (its C++
 * kernel, see quant4.c): q8 gets n codes, absmax ceil(n/256) floats. */
void quant4_quantize_dynamic(uint8_t *q8, float *absmax, const float *x, size_t n);
/* Double quantization of absmax[0..nblocks): q8 gets nblocks bytes,
 * nested_absmax ceil(nblocks/256) floats, *offset the mean. */
void quant4_double_quantize(uint8_t *q8, float *nested_absmax, float *offset, const float *absmax,
                            size_t nblocks);
/* absmax[i] = map[q8[i]] * nested_absmax[i/256] + offset, in fp32 as bnb does. */
void quant4_double_dequantize(float *absmax, const uint8_t *q8, const float *nested_absmax,
                              const float *map, float offset, size_t nblocks);

/* absmax[0..nblocks) replaced by what dequantize_4bit reads back after double
 * quantization (quant4_double_quantize, then quant4_double_dequantize). */
void quant4_double_roundtrip(float *absmax, size_t nblocks);

/* One Linear4bit weight as its quant_state describes it. */
typedef struct quant4_info {
    quant4_type type;
    size_t blocksize;
    int ndim;
    int64_t shape[ST_MAX_DIMS];   /* the original weight's shape, [out, in] for a Linear */
    size_t numel;
    bool nested;                  /* absmax is double-quantized */
    float offset;                 /* nested_offset (nested only) */
    char dtype[16];               /* the original dtype, e.g. "bfloat16" */
} quant4_info;

/* True when the checkpoint holds NAME as a Linear4bit weight, i.e. the tensor
 * NAME.quant_state.bitsandbytes__nf4 or __fp4 exists. */
bool quant4_is_quantized(const st_reader *r, const char *name);

/* Reads and validates the quant_state of weight NAME ("model.layers.0.mlp.
 * down_proj.weight"): the JSON blob, NAME (packed bytes of any storage dtype),
 * NAME.absmax, NAME.quant_map (must be the code book) and, when nested,
 * NAME.nested_absmax and NAME.nested_quant_map. Every mismatch is a one-line
 * CT_ERR_INPUT naming the file and tensor. */
int quant4_read_info(const st_reader *r, const char *name, quant4_info *info, ct_error *err);

/* quant4_read_info, then dequantizes NAME to fp32 into *out (info->numel
 * floats, malloc'd; the caller frees it). *out is NULL on failure. */
int quant4_load_f32(const st_reader *r, const char *name, quant4_info *info, float **out, ct_error *err);

/* quant4_read_info, then NAME's packed codes (*codes: the file's bytes, valid
 * while r is open) and its absmax as fp32 (*absmax: malloc'd, one per block;
 * double quantization undone exactly as bnb's dequantize_4bit does). Non-finite
 * or negative stored statistics, and a double-quantized absmax that decodes to
 * a non-finite value, are CT_ERR_INPUT naming the tensor. */
int quant4_load_blocks(const st_reader *r, const char *name, quant4_info *info, const uint8_t **codes,
                       float **absmax, ct_error *err);

#endif
