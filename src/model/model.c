/* model.c — loads an HF checkpoint onto a backend with fused q|k|v and gate|up
 * weights, and the experts of sparse layers stacked per projection (see
 * model.h). The graph itself lives in graph.c and graph_moe.c.
 *
 * Every fused weight is loaded as a slot of parts (the tensors on disk, each
 * with its rows in the weight and how they are ordered); one place
 * (slot_form) decides whether it is held dense, in 4 bits or in FP8, from the
 * parts' forms on disk and the load options, so bf16, bitsandbytes 4-bit,
 * FP8 and quantize-on-load share every layer's loading code. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "mxfp4.h"

static const char *const module_names[CT_MOD_COUNT] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "in_proj_qkvz", "in_proj_ba", "out_proj",
    "shared_expert_gate"};

const char *model_module_name(ct_module mod) { return module_names[mod]; }

const char *model_module_parent(ct_module mod)
{
    return mod <= CT_MOD_O ? "self_attn" : model_module_is_mlp(mod) || mod == CT_MOD_SH_GATE ? "mlp" : "linear_attn";
}

void model_module_path(char *out, size_t len, ct_arch arch, ct_module mod)
{
    bool shared = arch == CT_ARCH_QWEN3_5_MOE && model_module_is_mlp(mod);
    snprintf(out, len, "%s.%s%s", model_module_parent(mod), shared ? "shared_expert." : "", model_module_name(mod));
}

void model_module_shape(const ct_model_config *c, ct_module mod, int *in, int *out)
{
    int H = c->hidden_size, I = c->intermediate_size;
    int Q = c->num_attention_heads * c->head_dim, KV = c->num_key_value_heads * c->head_dim;
    int Vd = c->gdn ? model_gdn_value_dim(c) : 0, Hv = c->linear_num_value_heads;
    switch (mod) {
    case CT_MOD_Q:      *in = H; *out = model_attn_gated(c) ? 2 * Q : Q; break;
    case CT_MOD_K:
    case CT_MOD_V:      *in = H; *out = KV; break;
    case CT_MOD_O:      *in = Q; *out = H;  break;
    case CT_MOD_GATE:
    case CT_MOD_UP:     *in = H; *out = I;  break;
    case CT_MOD_IN_QKV: *in = H; *out = c->gdn ? model_gdn_conv_dim(c) : 0; break;
    case CT_MOD_IN_Z:   *in = H; *out = Vd; break;
    case CT_MOD_IN_B:
    case CT_MOD_IN_A:   *in = H; *out = Hv; break;
    case CT_MOD_IN_QKVZ: *in = H; *out = c->gdn ? model_gdn_conv_dim(c) + Vd : 0; break;
    case CT_MOD_IN_BA:  *in = H; *out = 2 * Hv; break;
    case CT_MOD_OUT:    *in = Vd; *out = H; break;
    case CT_MOD_SH_GATE: *in = H; *out = 1; break;
    default:            *in = I; *out = H;  break;
    }
}

int model_module_layer_shape(const ct_model_config *c, int l, ct_module mod, int *in, int *out)
{
    model_module_shape(c, mod, in, out);
    bool gdn_mod = mod >= CT_MOD_IN_QKV && mod <= CT_MOD_OUT;
    bool grouped_mod = mod == CT_MOD_IN_QKVZ || mod == CT_MOD_IN_BA;
    int H = c->hidden_size, I = c->moe_intermediate_size, Is = c->shared_expert_intermediate_size;
    bool shared = (c->arch == CT_ARCH_QWEN3_5_MOE || c->arch == CT_ARCH_QWEN3_NEXT) && c->layer_sparse[l] && Is > 0;
    if (mod == CT_MOD_SH_GATE) return shared ? 1 : 0;
    if (gdn_mod && mod != CT_MOD_OUT && grouped_mod != c->gdn_grouped_proj) return 0;
    if (!model_module_is_mlp(mod)) return (c->gdn && c->layer_linear[l]) == gdn_mod ? 1 : 0;
    if (!c->layer_sparse[l]) return 1;
    if (c->arch == CT_ARCH_QWEN3_5_MOE) { /* the shared expert's projections */
        *in = mod == CT_MOD_DOWN ? Is : H;
        *out = mod == CT_MOD_DOWN ? H : Is;
        return shared ? 1 : 0;
    }
    bool fused = c->arch == CT_ARCH_GPT_OSS;
    switch (mod) {
    case CT_MOD_GATE: *in = H; *out = fused ? 2 * I : I; break;
    case CT_MOD_UP:   *in = H; *out = I; if (fused) return 0; break;
    default:          *in = I; *out = H; break;
    }
    return c->num_experts;
}

typedef struct loader {
    ct_backend *be;
    const st_reader *r;
    const ct_model_config *c;
    const ct_load_options *opt; /* quantize on load, or NULL */
    size_t bytes;           /* backend bytes allocated so far */
    size_t quant_weights;   /* weights held in 4 bits */
    size_t fp8_weights;     /* weights held in FP8 */
    size_t dequant_max;     /* elements of the largest 4-bit or FP8 weight */
    ct_error *err;
} loader;

static void *alloc_bytes(loader *ld, size_t bytes)
{
    void *p = ld->be->alloc(ld->be, bytes);
    if (!p) {
        CT_FAIL_RUNTIME(ld->err, "out of %s memory loading weights (%zu bytes more after %zu)",
                        ld->be->name, bytes, ld->bytes);
        return NULL;
    }
    ld->bytes += bytes;
    return p;
}

static void *alloc_weight(loader *ld, size_t n) { return alloc_bytes(ld, n * ld->be->weight_bytes); }

/* NaN and Inf among a float tensor's values (bf16, f16 or f32): one pass over
 * the mapped file, cheap next to the upload, so that a broken checkpoint is
 * an error at load and not a run of NaN losses or a generate that prints 0s. */
static size_t count_nonfinite(const void *data, ct_dtype dtype, size_t n)
{
    size_t bad = 0;
    const unsigned char *b = data;
    if (dtype == CT_DTYPE_F32) {
#pragma omp parallel for reduction(+ : bad) schedule(static)
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, b + 4 * i, 4);
            bad += (u & 0x7f800000u) == 0x7f800000u;
        }
        return bad;
    }
    const uint16_t exp = dtype == CT_DTYPE_BF16 ? 0x7f80 : 0x7c00; /* bf16 | f16 */
#pragma omp parallel for reduction(+ : bad) schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, b + 2 * i, 2);
        bad += (h & exp) == exp;
    }
    return bad;
}

/* The values of tensor NAME on the host: the mapped bytes as stored (bf16, f16
 * or f32), or a bitsandbytes 4-bit weight decoded to fp32 (owned). Shapes were
 * checked by model_check_weights. */
typedef struct host_vals {
    const void *data;
    ct_dtype dtype;
    size_t numel;
    float *owned;
} host_vals;

static int host_get(loader *ld, const char *name, host_vals *h)
{
    memset(h, 0, sizeof *h);
    if (quant4_is_quantized(ld->r, name)) {
        quant4_info info;
        int rc = quant4_load_f32(ld->r, name, &info, &h->owned, ld->err);
        if (rc) return rc;
        size_t bad = count_nonfinite(h->owned, CT_DTYPE_F32, info.numel);
        if (bad) {
            free(h->owned);
            return CT_FAIL_INPUT(ld->err, "model: 4-bit tensor '%s' decodes to %zu non-finite values (its absmax is "
                                 "broken)", name, bad);
        }
        *h = (host_vals){h->owned, CT_DTYPE_F32, info.numel, h->owned};
        return CT_OK;
    }
    const st_tensor *t = st_find(ld->r, name);
    if (t && fp8_is_quantized(ld->r, name) && t->ndim == 2) {
        size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
        const uint8_t *q;
        float *scale_inv = ct_malloc(fp8_blocks(rows) * fp8_blocks(cols) * sizeof(float));
        int rc = fp8_read_weight(ld->r, name, t->shape[0], t->shape[1], &q, scale_inv, ld->err);
        if (!rc) {
            h->owned = ct_malloc(rows * cols * sizeof(float));
            fp8_dequantize_blocks(h->owned, q, scale_inv, rows, cols);
            if (count_nonfinite(h->owned, CT_DTYPE_F32, rows * cols))
                rc = CT_FAIL_INPUT(ld->err, "model: FP8 tensor '%s' decodes to non-finite values (its "
                                   "weight_scale_inv is too large)", name);
        }
        free(scale_inv);
        if (rc) {
            free(h->owned);
            h->owned = NULL;
            return rc;
        }
        *h = (host_vals){h->owned, CT_DTYPE_F32, rows * cols, h->owned};
        return CT_OK;
    }
    if (!t) return CT_FAIL_INPUT(ld->err, "model: tensor '%s' is missing", name);
    size_t bad = count_nonfinite(t->data, t->dtype, t->numel);
    if (bad)
        return CT_FAIL_INPUT(ld->err, "model: tensor '%s' holds %zu non-finite values of %zu (expected finite "
                             "weights: the model files are broken)", name, bad, t->numel);
    *h = (host_vals){t->data, t->dtype, t->numel, NULL};
    return CT_OK;
}

/* How the rows of a tensor on disk land in its fused weight (model.h). */
typedef enum {
    ROWS_AS_IS,
    ROWS_Q_GATED,   /* gated attention's q_proj: model_q_row */
    ROWS_GDN_QKVZ,  /* qwen3_next's in_proj_qkvz: model_gdn_qkvz_row */
    ROWS_GDN_BA,    /* qwen3_next's in_proj_ba: model_gdn_ba_row */
    ROWS_TRANSPOSED /* a gpt_oss expert stack [E, in, out] (for x @ W) into (E, out, in) */
} row_order;

/* One tensor of a fused weight: its rows [row0, row0 + rows) of the weight. */
typedef struct slot_part {
    char name[256];
    size_t row0, rows;
    row_order order;
} slot_part;

static size_t dest_row(const loader *ld, row_order order, size_t i)
{
    const ct_model_config *c = ld->c;
    switch (order) {
    case ROWS_Q_GATED: return (size_t)model_q_row((int)i, c->head_dim, c->num_attention_heads * c->head_dim);
    case ROWS_GDN_QKVZ: return (size_t)model_gdn_qkvz_row(c, (int)i);
    case ROWS_GDN_BA: return (size_t)model_gdn_ba_row(c, (int)i);
    default: return i;
    }
}

#define TRANSPOSE_TILE 64

/* E stacks of [cols, out] elements of es bytes into E stacks of [out, cols],
 * by 64 x 64 tiles in parallel: element by element, every write of a column is
 * a cache miss (gpt-oss-20b's gate_up_proj is 32 x 2880 x 5760 per layer, and
 * its bf16 folder took minutes to load so). */
static void transpose_stacks(void *dst, const void *src, size_t E, size_t cols, size_t out, size_t es)
{
    size_t tc = ct_ceil_div(cols, TRANSPOSE_TILE), to = ct_ceil_div(out, TRANSPOSE_TILE), n = cols * out;
    #pragma omp parallel for schedule(static)
    for (size_t tile = 0; tile < E * tc * to; tile++) {
        size_t e = tile / (tc * to), i0 = tile / to % tc * TRANSPOSE_TILE, o0 = tile % to * TRANSPOSE_TILE;
        size_t i1 = i0 + TRANSPOSE_TILE < cols ? i0 + TRANSPOSE_TILE : cols;
        size_t o1 = o0 + TRANSPOSE_TILE < out ? o0 + TRANSPOSE_TILE : out;
        const unsigned char *s = (const unsigned char *)src + e * n * es;
        unsigned char *d = (unsigned char *)dst + e * n * es;
        for (size_t o = o0; o < o1; o++)
            for (size_t i = i0; i < i1; i++)
                if (es == 2) ((uint16_t *)d)[o * cols + i] = ((const uint16_t *)s)[i * out + o];
                else memcpy(d + (o * cols + i) * es, s + (i * out + o) * es, es);
    }
}

/* src (rows of row_bytes, disk order) into dst in the fused order. A
 * transposed part is E stacks of [cols, rows / E] elements of es bytes. */
static void reorder(const loader *ld, void *dst, const void *src, const slot_part *p, size_t cols, size_t es,
                    size_t E)
{
    if (p->order == ROWS_TRANSPOSED) {
        transpose_stacks(dst, src, E, cols, p->rows / E, es);
        return;
    }
    size_t rb = cols * es;
    for (size_t i = 0; i < p->rows; i++)
        memcpy((unsigned char *)dst + dest_row(ld, p->order, i) * rb, (const unsigned char *)src + i * rb, rb);
}

/* How a fused weight is held: dense as stored (4-bit and FP8 parts decoded at
 * load), in 4 bits, in FP8, or dense with its values rounded through 4 bits or
 * FP8 at load (what quantize-on-load gives a weight ctune cannot hold so). */
typedef enum { FORM_DENSE, FORM_Q4, FORM_ROUNDTRIP, FORM_FP8, FORM_FP8_ROUNDTRIP } slot_form_kind;

/* Which load options may quantize a weight: none (norms, embeddings, routers,
 * biases), both 4-bit and FP8 (an nn.Linear, as HF's quantizers do), or FP8
 * only (routed expert stacks, which transformers 5's bitsandbytes leaves in
 * bf16). */
typedef enum { QUANT_NEVER, QUANT_ANY, QUANT_FP8_ONLY } quant_rule;

/* A part can join an FP8 weight of total_rows rows when it starts on a block
 * row and fills whole blocks (the last part may end in a partial one), and a
 * reordering of its rows moves whole 128-row blocks, each kept in order. */
static bool part_fits_fp8(const loader *ld, const slot_part *p, size_t total_rows)
{
    if (p->order == ROWS_TRANSPOSED || p->row0 % FP8_BLOCK != 0) return false;
    if (p->rows % FP8_BLOCK != 0 && p->row0 + p->rows != total_rows) return false;
    if (p->order == ROWS_AS_IS) return true;
    for (size_t i = 0; i < p->rows; i++) {
        size_t d = dest_row(ld, p->order, i), d0 = dest_row(ld, p->order, i - i % FP8_BLOCK);
        if (d % FP8_BLOCK != i % FP8_BLOCK || d - d0 != i % FP8_BLOCK) return false;
    }
    return true;
}

/* A part can join a 4-bit weight when its blocks are whole and, if its rows
 * move, no block spans two rows. */
static bool part_fits_q4(const slot_part *p, size_t cols, size_t bs)
{
    return (p->rows * cols) % bs == 0 && (p->order == ROWS_AS_IS || cols % bs == 0) && p->order != ROWS_TRANSPOSED;
}

/* The form of a fused weight of rows x cols: FP8 when every part is an FP8
 * tensor that fits, or when none is stored quantized, the rule allows it and
 * the load options ask for FP8 (FP8_ROUNDTRIP where a part does not fit or
 * there is no q); else 4 bits when every part is a bitsandbytes 4-bit tensor
 * of one type and blocksize that fits, or when none is, the rule allows it and
 * the load options quantize (ROUNDTRIP where a part does not fit, or where
 * there is no q to hold it: with_q false). */
static int slot_form(loader *ld, const slot_part *parts, int n, size_t rows, size_t cols, quant_rule rule,
                     bool with_q, slot_form_kind *form, quant4_type *type, int *blocksize)
{
    int stored = 0, stored_fp8 = 0;
    bool mixed = false;
    quant4_info first = {0};
    for (int i = 0; i < n; i++) stored_fp8 += fp8_is_quantized(ld->r, parts[i].name);
    *form = FORM_DENSE;
    if (stored_fp8 > 0 || (rule != QUANT_NEVER && ld->opt && ld->opt->fp8)) {
        bool fits = with_q;
        for (int i = 0; i < n && fits; i++) fits = part_fits_fp8(ld, &parts[i], rows);
        if (stored_fp8 == n && fits) *form = FORM_FP8;
        else if (stored_fp8 == 0) *form = fits ? FORM_FP8 : FORM_FP8_ROUNDTRIP;
        return CT_OK; /* a partly FP8 weight, or one that does not fit: decoded at load */
    }
    for (int i = 0; i < n; i++) {
        if (!quant4_is_quantized(ld->r, parts[i].name)) continue;
        quant4_info info;
        int rc = quant4_read_info(ld->r, parts[i].name, &info, ld->err);
        if (rc) return rc;
        if (stored++ == 0) first = info;
        else mixed |= info.type != first.type || info.blocksize != first.blocksize;
    }
    size_t bs = 0;
    if (stored == n && !mixed && with_q) {
        bs = first.blocksize;
        *type = first.type;
    } else if (stored == 0 && rule == QUANT_ANY && ld->opt && ld->opt->quantize) {
        bs = (size_t)ld->opt->blocksize;
        *type = ld->opt->type;
        *form = FORM_ROUNDTRIP;
    } else {
        return CT_OK;
    }
    *blocksize = (int)bs;
    bool fits = with_q;
    for (int i = 0; i < n && fits; i++) fits = part_fits_q4(&parts[i], cols, bs);
    if (fits) *form = FORM_Q4;
    return CT_OK;
}

/* bitsandbytes' quantize_4bit of n fp32 values: codes ((n+1)/2 bytes) and the
 * absmax as dequantize_4bit reads it (after the 8-bit round trip with double
 * quantization). */
static int quantize_host(loader *ld, uint8_t *codes, float *absmax, const float *x, size_t n, quant4_type type,
                         int blocksize, const char *name)
{
    ct_error qerr = {0};
    if (quant4_quantize(codes, absmax, x, n, (size_t)blocksize, type, &qerr))
        return CT_FAIL_INPUT(ld->err, "model_quantization: tensor %s: %s", name, qerr.msg);
    if (ld->opt->double_quant) quant4_double_roundtrip(absmax, quant4_num_blocks(n, (size_t)blocksize));
    return CT_OK;
}


/* A tensor's values as fp32 in its file order (malloc'd). */
static float *vals_f32(const host_vals *h)
{
    float *f = ct_malloc(h->numel * sizeof(float));
    for (size_t i = 0; i < h->numel; i++) {
        if (h->dtype == CT_DTYPE_F32) {
            memcpy(&f[i], (const char *)h->data + 4 * i, 4);
        } else {
            uint16_t v;
            memcpy(&v, (const char *)h->data + 2 * i, 2);
            f[i] = h->dtype == CT_DTYPE_BF16 ? ct_bf16_to_f32(v) : ct_f16_to_f32(v);
        }
    }
    return f;
}

/* A 4-bit part: its codes and fp32 absmax (from the file, or quantized now, in
 * the file's order as bitsandbytes would), moved to its rows of q. */
static int put_q4_part(loader *ld, ct_qweight *q, const slot_part *p, size_t cols)
{
    size_t n = p->rows * cols, nb = n / (size_t)q->blocksize, bpr = cols / (size_t)q->blocksize;
    const uint8_t *codes = NULL;
    uint8_t *own_codes = NULL;
    float *absmax = NULL;
    int rc;
    if (quant4_is_quantized(ld->r, p->name)) {
        quant4_info info;
        if ((rc = quant4_load_blocks(ld->r, p->name, &info, &codes, &absmax, ld->err))) return rc;
    } else {
        host_vals h;
        if ((rc = host_get(ld, p->name, &h))) return rc;
        float *x = vals_f32(&h);
        free(h.owned);
        codes = own_codes = ct_malloc(n / 2);
        absmax = ct_malloc(nb * sizeof(float));
        rc = quantize_host(ld, own_codes, absmax, x, n, q->type, q->blocksize, p->name);
        free(x);
        if (rc) goto done;
    }
    uint8_t *dc = q->codes + p->row0 * cols / 2;
    float *ds = (float *)q->scales + p->row0 * cols / (size_t)q->blocksize;
    if (p->order == ROWS_AS_IS) {
        ld->be->upload(ld->be, dc, codes, n / 2);
        ld->be->upload(ld->be, ds, absmax, nb * sizeof(float));
    } else { /* whole row blocks (part_fits_q4): rows of cols/2 code bytes and bpr scales move alike */
        uint8_t *rc_ = ct_malloc(n / 2);
        float *ra = ct_malloc(nb * sizeof(float));
        reorder(ld, rc_, codes, p, cols / 2, 1, 1);
        reorder(ld, ra, absmax, p, bpr, sizeof(float), 1);
        ld->be->upload(ld->be, dc, rc_, n / 2);
        ld->be->upload(ld->be, ds, ra, nb * sizeof(float));
        free(rc_);
        free(ra);
    }
done:
    free(own_codes);
    free(absmax);
    return rc;
}

/* An FP8 part: its E4M3 codes and block scales (from the file, or quantized
 * now in its own block grid, as transformers' FP8 quantizer does each
 * nn.Linear), moved to its rows of q; the scales into the padded grid of
 * fp8_weight_scale_ld(cols) per block row. */
static int put_fp8_part(loader *ld, ct_qweight *q, const slot_part *p, size_t cols)
{
    size_t n = p->rows * cols, nbr = fp8_blocks(p->rows), nbc = fp8_blocks(cols), lds = fp8_weight_scale_ld(cols);
    float *scale_inv = ct_malloc(nbr * nbc * sizeof(float));
    const uint8_t *codes = NULL;
    uint8_t *own = NULL, *moved = NULL;
    float *grid = NULL;
    int rc;
    if (fp8_is_quantized(ld->r, p->name)) {
        rc = fp8_read_weight(ld->r, p->name, (int64_t)p->rows, (int64_t)cols, &codes, scale_inv, ld->err);
        for (size_t i = 0; !rc && i < nbr * nbc; i++)
            if (!isfinite(scale_inv[i] * FP8_E4M3_MAX))
                rc = CT_FAIL_INPUT(ld->err, "model: FP8 tensor '%s': weight_scale_inv %g would decode to non-finite "
                                   "weights", p->name, (double)scale_inv[i]);
    } else {
        host_vals h;
        if ((rc = host_get(ld, p->name, &h))) goto done;
        float *x = vals_f32(&h);
        free(h.owned);
        codes = own = ct_malloc(n);
        ct_error qerr = {0};
        if (fp8_quantize_blocks(own, scale_inv, x, p->rows, cols, &qerr))
            rc = CT_FAIL_INPUT(ld->err, "base_precision fp8: tensor %s: %s", p->name, qerr.msg);
        free(x);
    }
    if (rc) goto done;
    grid = ct_calloc(nbr * lds, sizeof(float));
    if (p->order != ROWS_AS_IS) { /* whole blocks move (part_fits_fp8): rows of codes, block rows of scales */
        moved = ct_malloc(n);
        reorder(ld, moved, codes, p, cols, 1, 1);
        codes = moved;
    }
    for (size_t br = 0; br < nbr; br++) {
        size_t to = p->order == ROWS_AS_IS ? br : dest_row(ld, p->order, br * FP8_BLOCK) / FP8_BLOCK;
        memcpy(grid + to * lds, scale_inv + br * nbc, nbc * sizeof(float));
    }
    ld->be->upload(ld->be, q->codes + p->row0 * cols, codes, n);
    ld->be->upload(ld->be, (float *)q->scales + p->row0 / FP8_BLOCK * lds, grid, nbr * lds * sizeof(float));
done:
    free(scale_inv);
    free(own);
    free(moved);
    free(grid);
    return rc;
}

/* A dense part: its stored values (4-bit ones decoded; with roundtrip,
 * quantized and decoded in the file's order as HF would), reordered, uploaded
 * at its rows of dst. */
static int put_dense_part(loader *ld, void *dst, const slot_part *p, size_t cols, size_t E, slot_form_kind form)
{
    host_vals h;
    int rc = host_get(ld, p->name, &h);
    if (rc) return rc;
    void *at = (char *)dst + p->row0 * cols * ld->be->weight_bytes;
    float *rt = NULL;
    if (form == FORM_FP8_ROUNDTRIP) { /* the part's own grid, in the file's order (p->rows x cols) */
        rt = vals_f32(&h);
        uint8_t *codes = ct_malloc(h.numel);
        float *scale_inv = ct_malloc(fp8_blocks(p->rows) * fp8_blocks(cols) * sizeof(float));
        ct_error qerr = {0};
        if (fp8_quantize_blocks(codes, scale_inv, rt, p->rows, cols, &qerr))
            rc = CT_FAIL_INPUT(ld->err, "base_precision fp8: tensor %s: %s", p->name, qerr.msg);
        else
            fp8_dequantize_blocks(rt, codes, scale_inv, p->rows, cols);
        free(codes);
        free(scale_inv);
        free(h.owned);
        h = (host_vals){rt, CT_DTYPE_F32, p->rows * cols, NULL};
    } else if (form == FORM_ROUNDTRIP) {
        size_t n = h.numel, bs = (size_t)ld->opt->blocksize;
        rt = vals_f32(&h);
        uint8_t *codes = ct_malloc(quant4_packed_bytes(n));
        float *absmax = ct_malloc(quant4_num_blocks(n, bs) * sizeof(float));
        rc = quantize_host(ld, codes, absmax, rt, n, ld->opt->type, (int)bs, p->name);
        if (!rc) quant4_dequantize(rt, codes, absmax, n, bs, ld->opt->type);
        free(codes);
        free(absmax);
        free(h.owned);
        h = (host_vals){rt, CT_DTYPE_F32, n, NULL};
    }
    if (!rc && p->order == ROWS_AS_IS) {
        ld->be->upload_weight(ld->be, at, h.data, h.dtype, h.numel);
    } else if (!rc) {
        size_t es = ct_dtype_size(h.dtype);
        void *tmp = ct_malloc(h.numel * es);
        reorder(ld, tmp, h.data, p, cols, es, E);
        ld->be->upload_weight(ld->be, at, tmp, h.dtype, h.numel);
        free(tmp);
    }
    free(h.owned);
    free(rt);
    return rc;
}

/* A fused weight of rows x cols from its parts: in 4 bits or FP8 into *q when
 * slot_form says so (q NULL: never), else dense into *dense. E: the expert
 * count of a transposed part (1 otherwise). rule: which quantize-on-load
 * options apply to it. */
static int load_slot(loader *ld, void **dense, ct_qweight *q, size_t rows, size_t cols, const slot_part *parts,
                     int n, quant_rule rule, size_t E)
{
    slot_form_kind form;
    quant4_type type = QUANT4_NF4;
    int bs = 0;
    int rc = slot_form(ld, parts, n, rows, cols, rule, q != NULL, &form, &type, &bs);
    if (rc) return rc;
    if (form == FORM_FP8) {
        *q = (ct_qweight){.numel = rows * cols, .fp8 = true, .rows = rows, .cols = cols};
        if (!(q->codes = alloc_bytes(ld, rows * cols)) ||
            !(q->scales = alloc_bytes(ld, fp8_blocks(rows) * fp8_weight_scale_ld(cols) * sizeof(float))))
            return ld->err->code;
        for (int i = 0; i < n; i++)
            if ((rc = put_fp8_part(ld, q, &parts[i], cols))) return rc;
        ld->fp8_weights += rows * cols;
        if (rows * cols > ld->dequant_max) ld->dequant_max = rows * cols;
        return CT_OK;
    }
    if (form == FORM_Q4) {
        *q = (ct_qweight){.numel = rows * cols, .blocksize = bs, .type = type};
        if (!(q->codes = alloc_bytes(ld, rows * cols / 2)) ||
            !(q->scales = alloc_bytes(ld, rows * cols / (size_t)bs * sizeof(float))))
            return ld->err->code;
        for (int i = 0; i < n; i++)
            if ((rc = put_q4_part(ld, q, &parts[i], cols))) return rc;
        ld->quant_weights += rows * cols;
        if (rows * cols > ld->dequant_max) ld->dequant_max = rows * cols;
        return CT_OK;
    }
    if (!(*dense = alloc_weight(ld, rows * cols))) return ld->err->code;
    for (int i = 0; i < n; i++)
        if ((rc = put_dense_part(ld, *dense, &parts[i], cols, E, form))) return rc;
    return CT_OK;
}

/* A weight that is one tensor on disk, kept dense (norms, biases, routers,
 * embeddings): a 4-bit one is decoded. */
static void *load_one(loader *ld, const char *name, size_t n)
{
    slot_part p = {.rows = 1, .order = ROWS_AS_IS};
    snprintf(p.name, sizeof p.name, "%s", name);
    void *w = NULL;
    if (load_slot(ld, &w, NULL, 1, n, &p, 1, QUANT_NEVER, 1) == CT_OK) return w;
    if (w) { /* not yet owned by the model, which frees the rest */
        ld->be->free(ld->be, w);
        ld->bytes -= n * ld->be->weight_bytes;
    }
    return NULL;
}

/* Attention sinks and the GDN decay parameters as fp32 whatever the backend's
 * weight type: the ops read them as float. */
static float *load_f32(loader *ld, const char *name, size_t n)
{
    host_vals h;
    if (host_get(ld, name, &h)) return NULL;
    float *host = vals_f32(&h);
    free(h.owned);
    float *d = alloc_bytes(ld, n * sizeof(float));
    if (d) ld->be->upload(ld->be, d, host, n * sizeof(float));
    free(host);
    return d;
}

/* A norm weight, uploaded as stored (non-finite values refused) for either
 * convention: the zero-centred norms of a GDN hybrid (HF: x r (1 + w), 1 + w
 * in fp32) get their offset inside the norm ops, from c->norm_zero_centred at
 * each call, since a bf16 weight cannot hold 1 + w exactly. */
static void *load_norm(loader *ld, const char *name, size_t n) { return load_one(ld, name, n); }

/* An MXFP4 expert stack of gpt_oss (BASE_blocks, BASE_scales: mxfp4.h),
 * already in the (E, out, in) order, so its bytes go up as they are. */
static int load_mxfp4(loader *ld, ct_qweight *q, const char *base, size_t E, size_t rows, size_t cols)
{
    const uint8_t *blocks, *scales;
    int rc = mxfp4_read_experts(ld->r, base, (int64_t)E, (int64_t)rows, (int64_t)cols, &blocks, &scales, ld->err);
    if (rc) return rc;
    size_t n = E * rows * cols;
    *q = (ct_qweight){.numel = n, .blocksize = QUANT4_MXFP4_BLOCKSIZE, .type = QUANT4_MXFP4};
    if (!(q->codes = alloc_bytes(ld, n / 2)) || !(q->scales = alloc_bytes(ld, n / QUANT4_MXFP4_BLOCKSIZE)))
        return ld->err->code;
    ld->be->upload(ld->be, q->codes, blocks, n / 2);
    ld->be->upload(ld->be, q->scales, scales, n / QUANT4_MXFP4_BLOCKSIZE);
    ld->quant_weights += n;
    if (n > ld->dequant_max) ld->dequant_max = n;
    return CT_OK;
}

#define PART(p, r0, nrows, ord, ...) \
    ((p).row0 = (r0), (p).rows = (nrows), (p).order = (ord), snprintf((p).name, sizeof (p).name, __VA_ARGS__))

/* The experts and router of sparse layer l (names: docs/ARCHITECTURE.md, "Model folders"). */
static int load_sparse(loader *ld, const ct_model_config *c, int l, ct_layer_weights *w, ct_layer_qweights *qw)
{
    size_t H = c->hidden_size, I = c->moe_intermediate_size, E = c->num_experts;
    const char *pre = c->tensor_prefix;
    char n[256];
    int rc;
#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    if (c->arch == CT_ARCH_GPT_OSS) {
        if (!(w->router = load_one(ld, NAME("%slayers.%d.mlp.router.weight", pre, l), E * H)) ||
            !(w->router_bias = load_one(ld, NAME("%slayers.%d.mlp.router.bias", pre, l), E)) ||
            !(w->bgu_e = load_one(ld, NAME("%slayers.%d.mlp.experts.gate_up_proj_bias", pre, l), E * 2 * I)) ||
            !(w->bdown_e = load_one(ld, NAME("%slayers.%d.mlp.experts.down_proj_bias", pre, l), E * H)))
            return ld->err->code;
        const char *proj[2] = {"gate_up_proj", "down_proj"};
        for (int k = 0; k < 2; k++) {
            size_t rows = k == 0 ? 2 * I : H, cols = k == 0 ? H : I;
            void **dense = k == 0 ? &w->wgu_e : &w->wdown_e;
            ct_qweight *q = k == 0 ? &qw->wgu_e : &qw->wdown_e;
            NAME("%slayers.%d.mlp.experts.%s", pre, l, proj[k]);
            if (mxfp4_is_quantized(ld->r, n)) {
                if ((rc = load_mxfp4(ld, q, n, E, rows, cols))) return rc;
                continue;
            }
            slot_part p;
            PART(p, 0, E * rows, ROWS_TRANSPOSED, "%s", n);
            if ((rc = load_slot(ld, dense, q, E * rows, cols, &p, 1, QUANT_NEVER, E))) return rc;
        }
        return CT_OK;
    }
    bool mixtral = c->arch == CT_ARCH_MIXTRAL;
    const char *block = mixtral ? "block_sparse_moe" : "mlp";
    const char *gate = mixtral ? "w1" : "gate_proj", *up = mixtral ? "w3" : "up_proj";
    const char *down = mixtral ? "w2" : "down_proj";
    if (!(w->router = load_one(ld, NAME("%slayers.%d.%s.gate.weight", pre, l, block), E * H))) return ld->err->code;
    slot_part *parts = ct_calloc(2 * E, sizeof *parts);
    for (size_t e = 0; e < E; e++) {
        PART(parts[2 * e], e * 2 * I, I, ROWS_AS_IS, "%slayers.%d.%s.experts.%zu.%s.weight", pre, l, block, e, gate);
        PART(parts[2 * e + 1], e * 2 * I + I, I, ROWS_AS_IS, "%slayers.%d.%s.experts.%zu.%s.weight", pre, l, block, e,
             up);
    }
    /* routed experts are parameters in transformers 5, which its bitsandbytes
     * leaves in bf16: quantize-on-load to 4 bits does the same (to FP8 it
     * quantizes them); a folder that stores them in 4 bits (per-expert
     * Linear4bit) or FP8 keeps them so */
    rc = load_slot(ld, &w->wgu_e, &qw->wgu_e, E * 2 * I, H, parts, (int)(2 * E), QUANT_FP8_ONLY, 1);
    for (size_t e = 0; e < E && !rc; e++)
        PART(parts[e], e * H, H, ROWS_AS_IS, "%slayers.%d.%s.experts.%zu.%s.weight", pre, l, block, e, down);
    if (!rc) rc = load_slot(ld, &w->wdown_e, &qw->wdown_e, E * H, I, parts, (int)E, QUANT_FP8_ONLY, 1);
    free(parts);
    if (rc) return rc;
    if (c->shared_expert_intermediate_size > 0) {
        size_t Is = c->shared_expert_intermediate_size;
        slot_part p[2];
        PART(p[0], 0, Is, ROWS_AS_IS, "%slayers.%d.mlp.shared_expert.gate_proj.weight", pre, l);
        PART(p[1], Is, Is, ROWS_AS_IS, "%slayers.%d.mlp.shared_expert.up_proj.weight", pre, l);
        if ((rc = load_slot(ld, &w->wsh_gu, &qw->wsh_gu, 2 * Is, H, p, 2, QUANT_ANY, 1))) return rc;
        PART(p[0], 0, H, ROWS_AS_IS, "%slayers.%d.mlp.shared_expert.down_proj.weight", pre, l);
        if ((rc = load_slot(ld, &w->wsh_down, &qw->wsh_down, H, Is, p, 1, QUANT_ANY, 1))) return rc;
        PART(p[0], 0, 1, ROWS_AS_IS, "%slayers.%d.mlp.shared_expert_gate.weight", pre, l);
        if ((rc = load_slot(ld, &w->wsh_gate, NULL, 1, H, p, 1, QUANT_ANY, 1))) return rc;
    }
#undef NAME
    return CT_OK;
}

/* A Gated DeltaNet layer's mixer (linear_attn.*) and its fused input projection
 * [qkv | z | b | a] (qwen3_next's grouped in_proj_qkvz / in_proj_ba reordered). */
static int load_gdn(loader *ld, const ct_model_config *c, int l, ct_layer_weights *w, ct_layer_qweights *qw)
{
    size_t H = c->hidden_size, conv = model_gdn_conv_dim(c), Vd = model_gdn_value_dim(c);
    size_t Hv = c->linear_num_value_heads, W = c->linear_conv_kernel_dim;
    char n[256];
    int rc, np;
    slot_part p[4];
#define NAME(fmt) (snprintf(n, sizeof n, "%slayers.%d.linear_attn." fmt, c->tensor_prefix, l), n)
#define GDN_PART(i, r0, rows, ord, fmt) PART(p[i], r0, rows, ord, "%slayers.%d.linear_attn." fmt, c->tensor_prefix, l)
    if (c->gdn_grouped_proj) {
        GDN_PART(0, 0, conv + Vd, ROWS_GDN_QKVZ, "in_proj_qkvz.weight");
        GDN_PART(1, conv + Vd, 2 * Hv, ROWS_GDN_BA, "in_proj_ba.weight");
        np = 2;
    } else {
        GDN_PART(0, 0, conv, ROWS_AS_IS, "in_proj_qkv.weight");
        GDN_PART(1, conv, Vd, ROWS_AS_IS, "in_proj_z.weight");
        GDN_PART(2, conv + Vd, Hv, ROWS_AS_IS, "in_proj_b.weight");
        GDN_PART(3, conv + Vd + Hv, Hv, ROWS_AS_IS, "in_proj_a.weight");
        np = 4;
    }
    if ((rc = load_slot(ld, &w->win, &qw->win, (size_t)model_gdn_proj_dim(c), H, p, np, QUANT_ANY, 1))) return rc;
    GDN_PART(0, 0, H, ROWS_AS_IS, "out_proj.weight");
    if ((rc = load_slot(ld, &w->wout, &qw->wout, H, Vd, p, 1, QUANT_ANY, 1))) return rc;
    if (!(w->conv_w = load_one(ld, NAME("conv1d.weight"), conv * W)) ||
        !(w->A_log = load_f32(ld, NAME("A_log"), Hv)) || !(w->dt_bias = load_f32(ld, NAME("dt_bias"), Hv)) ||
        !(w->gdn_norm = load_norm(ld, NAME("norm.weight"), c->linear_value_head_dim)))
        return ld->err->code;
#undef GDN_PART
#undef NAME
    return CT_OK;
}

static int load_layer(loader *ld, const ct_model_config *c, int l, ct_layer_weights *w, ct_layer_qweights *qw)
{
    size_t H = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    size_t Q = c->num_attention_heads * D, KV = c->num_key_value_heads * D;
    size_t Qw = model_attn_gated(c) ? 2 * Q : Q; /* q_proj rows: queries (and gates) */
    const char *pre = c->tensor_prefix;
    char n[256];
    slot_part p[3];
    int rc;
#define NAME(fmt) (snprintf(n, sizeof n, "%slayers.%d." fmt, pre, l), n)
    if (!(w->attn_norm = load_norm(ld, NAME("input_layernorm.weight"), H))) return ld->err->code;
    if (!(w->mlp_norm = load_norm(ld, NAME("post_attention_layernorm.weight"), H))) return ld->err->code;
    if (c->gdn && c->layer_linear[l]) {
        if ((rc = load_gdn(ld, c, l, w, qw))) return rc;
    } else {
        row_order q_rows = model_attn_gated(c) ? ROWS_Q_GATED : ROWS_AS_IS;
        PART(p[0], 0, Qw, q_rows, "%slayers.%d.self_attn.q_proj.weight", pre, l);
        PART(p[1], Qw, KV, ROWS_AS_IS, "%slayers.%d.self_attn.k_proj.weight", pre, l);
        PART(p[2], Qw + KV, KV, ROWS_AS_IS, "%slayers.%d.self_attn.v_proj.weight", pre, l);
        if ((rc = load_slot(ld, &w->wqkv, &qw->wqkv, Qw + 2 * KV, H, p, 3, QUANT_ANY, 1))) return rc;
        if (c->attention_bias) {
            if (model_attn_gated(c))
                return CT_FAIL_INPUT(ld->err, "model: attention_bias with gated attention is not supported");
            /* a bias as a column: rows of one element */
            PART(p[0], 0, Q, ROWS_AS_IS, "%slayers.%d.self_attn.q_proj.bias", pre, l);
            PART(p[1], Q, KV, ROWS_AS_IS, "%slayers.%d.self_attn.k_proj.bias", pre, l);
            PART(p[2], Q + KV, KV, ROWS_AS_IS, "%slayers.%d.self_attn.v_proj.bias", pre, l);
            if ((rc = load_slot(ld, &w->bqkv, NULL, Q + 2 * KV, 1, p, 3, QUANT_NEVER, 1))) return rc;
        }
        if (c->qk_norm) {
            if (!(w->q_norm = load_norm(ld, NAME("self_attn.q_norm.weight"), D))) return ld->err->code;
            if (!(w->k_norm = load_norm(ld, NAME("self_attn.k_norm.weight"), D))) return ld->err->code;
        }
        PART(p[0], 0, H, ROWS_AS_IS, "%slayers.%d.self_attn.o_proj.weight", pre, l);
        if ((rc = load_slot(ld, &w->wo, &qw->wo, H, Q, p, 1, QUANT_ANY, 1))) return rc;
        if (c->o_proj_bias && !(w->bo = load_one(ld, NAME("self_attn.o_proj.bias"), H))) return ld->err->code;
        if (c->attention_sinks && !(w->sinks = load_f32(ld, NAME("self_attn.sinks"), c->num_attention_heads)))
            return ld->err->code;
    }
    if (c->layer_sparse[l]) return load_sparse(ld, c, l, w, qw);
    PART(p[0], 0, I, ROWS_AS_IS, "%slayers.%d.mlp.gate_proj.weight", pre, l);
    PART(p[1], I, I, ROWS_AS_IS, "%slayers.%d.mlp.up_proj.weight", pre, l);
    if ((rc = load_slot(ld, &w->wgu, &qw->wgu, 2 * I, H, p, 2, QUANT_ANY, 1))) return rc;
    PART(p[0], 0, H, ROWS_AS_IS, "%slayers.%d.mlp.down_proj.weight", pre, l);
    if ((rc = load_slot(ld, &w->wdown, &qw->wdown, H, I, p, 1, QUANT_ANY, 1))) return rc;
    if (c->mlp_bias) {
        PART(p[0], 0, I, ROWS_AS_IS, "%slayers.%d.mlp.gate_proj.bias", pre, l);
        PART(p[1], I, I, ROWS_AS_IS, "%slayers.%d.mlp.up_proj.bias", pre, l);
        if ((rc = load_slot(ld, &w->bgu, NULL, 2 * I, 1, p, 2, QUANT_NEVER, 1))) return rc;
        if (!(w->bdown = load_one(ld, NAME("mlp.down_proj.bias"), H))) return ld->err->code;
    }
#undef NAME
    return CT_OK;
}

static const char *quant_method_name(const ct_model_config *c)
{
    return c->quant_method == CT_QUANT_BNB4 ? "bitsandbytes" : c->quant_method == CT_QUANT_MXFP4 ? "mxfp4" : "fp8";
}

/* Every MoE op, or none usable: a backend may have some while others are written. */
static bool backend_has_moe(const ct_backend *be)
{
    return be->moe_route && be->moe_count && be->moe_offsets && be->moe_permute && be->moe_gather &&
           be->moe_scatter && be->moe_scatter_bwd && be->moe_weight_grad && be->moe_linear_fwd &&
           be->moe_linear_bwd_input && be->moe_lora_fwd && be->moe_lora_bwd && be->moe_clamped_swiglu_fwd &&
           be->moe_clamped_swiglu_bwd && be->moe_route_bwd && be->moe_prob_sum && be->moe_aux_loss;
}

/* Every Gated DeltaNet op. */
static bool backend_has_gdn(const ct_backend *be)
{
    return be->gdn_conv_fwd && be->gdn_conv_bwd && be->gdn_gates_fwd && be->gdn_gates_bwd && be->gdn_delta_fwd &&
           be->gdn_delta_bwd && be->gated_rmsnorm_fwd && be->gated_rmsnorm_bwd && be->sigmoid_gate_fwd &&
           be->sigmoid_gate_bwd;
}

int model_load_with(ct_model *m, ct_backend *be, const char *dir, const ct_load_options *opt, ct_error *err)
{
    memset(m, 0, sizeof *m);
    m->be = be;
    int rc = model_config_load(&m->cfg, dir, err);
    if (rc) return rc;
    const ct_model_config *c = &m->cfg;
    if (be->check_model && (rc = be->check_model(be, c, dir, err))) return rc;
    if (c->gdn && !backend_has_gdn(be))
        return CT_FAIL_INPUT(err, "%s: model_type '%s' has Gated DeltaNet layers; the %s backend does not implement "
                             "the GDN ops yet (set device: cpu to train it on the CPU reference backend)",
                             dir, c->model_type, be->name);
    if (c->num_experts > 0 &&
        (!backend_has_moe(be) ||
         (c->shared_expert_intermediate_size > 0 && (!be->moe_shared_gate_fwd || !be->moe_shared_gate_bwd))))
        return CT_FAIL_INPUT(err, "%s: model_type '%s' is a mixture of experts; the %s backend does not implement "
                             "the MoE ops yet (set device: cpu to train it on the CPU reference backend)",
                             dir, c->model_type, be->name);
    CT_ASSERT(!(opt && opt->quantize && opt->fp8), "model_load_with: 4-bit and FP8 quantize-on-load together");
    if (opt && opt->fp8 && c->quant_method != CT_QUANT_NONE)
        return CT_FAIL_INPUT(err, "%s: base_precision fp8 asks to quantize on load, but the folder is already "
                             "quantized (quantization_config.quant_method %s); remove base_precision to train on it "
                             "as stored", dir, quant_method_name(c));
    if (((opt && opt->fp8) || c->quant_method == CT_QUANT_FP8) && !be->dequant_fp8)
        return CT_FAIL_INPUT(err, "%s: FP8 base weights (%s) are not supported on the %s backend yet (set device: "
                             "cpu to train on the CPU reference backend)", dir,
                             opt && opt->fp8 ? "base_precision fp8" : "quantization_config.quant_method fp8", be->name);
    if (opt && opt->quantize) {
        CT_ASSERT(opt->type != QUANT4_MXFP4 && quant4_blocksize_valid((size_t)opt->blocksize),
                  "model_load_with: quantize to type %d, blocksize %d", (int)opt->type, opt->blocksize);
        if (c->quant_method != CT_QUANT_NONE)
            return CT_FAIL_INPUT(err, "%s: model_quantization asks to quantize on load, but the folder is already "
                                 "quantized (quantization_config.quant_method %s); remove model_quantization to "
                                 "train on it as stored", dir, quant_method_name(c));
    }
    st_reader *r = st_open(dir, err);
    if (!r) return err->code;
    rc = model_check_weights(c, r, err);
    if (rc) {
        st_close(r);
        return rc;
    }
    loader ld = {.be = be, .r = r, .c = c, .opt = opt, .err = err};
    size_t V = c->vocab_size, H = c->hidden_size;
    m->layers = ct_calloc(c->num_hidden_layers, sizeof *m->layers);
    m->qlayers = ct_calloc(c->num_hidden_layers, sizeof *m->qlayers);
    rc = CT_OK;
    char name[96];
    snprintf(name, sizeof name, "%sembed_tokens.weight", c->tensor_prefix);
    if (!(m->embed = load_one(&ld, name, V * H))) rc = err->code;
    snprintf(name, sizeof name, "%snorm.weight", c->tensor_prefix);
    if (!rc && !(m->final_norm = load_norm(&ld, name, H))) rc = err->code;
    if (!rc) {
        if (c->tie_word_embeddings) m->lm_head = m->embed;
        else if (!(m->lm_head = load_one(&ld, "lm_head.weight", V * H))) rc = err->code;
    }
    for (int l = 0; !rc && l < c->num_hidden_layers; l++) rc = load_layer(&ld, c, l, &m->layers[l], &m->qlayers[l]);
    st_close(r);
    if (!rc && ld.dequant_max && !(m->dequant_buf = alloc_weight(&ld, ld.dequant_max))) rc = err->code;
    if (rc) {
        model_free(m);
        return rc;
    }
    m->quant_weights = ld.quant_weights;
    m->fp8_weights = ld.fp8_weights;
    m->rot_dim = model_rope_dim(c);
    float *inv = ct_malloc(sizeof(float) * (size_t)(m->rot_dim / 2));
    model_rope_inv_freq(c, inv, &m->attn_scaling);
    m->inv_freq = be->alloc(be, sizeof(float) * (size_t)(m->rot_dim / 2));
    if (!m->inv_freq) {
        free(inv);
        model_free(m);
        return CT_FAIL_RUNTIME(err, "out of %s memory", be->name);
    }
    be->upload(be, m->inv_freq, inv, sizeof(float) * (size_t)(m->rot_dim / 2));
    free(inv);
    m->weight_bytes = ld.bytes;
    return CT_OK;
}

int model_load(ct_model *m, ct_backend *be, const char *dir, ct_error *err)
{
    return model_load_with(m, be, dir, NULL, err);
}

const void *model_weight(const ct_model *m, const void *dense, const ct_qweight *q)
{
    if (!q || !q->codes) return dense;
    if (q->fp8) {
        m->be->dequant_fp8(m->be, m->dequant_buf, q->codes, q->scales, q->rows, q->cols);
        return m->dequant_buf;
    }
    m->be->dequant4(m->be, m->dequant_buf, q->codes, q->scales, q->numel, q->blocksize, q->type);
    return m->dequant_buf;
}

/* Whether the FP8 GEMMs take this weight and these strides. */
static bool fp8_gemm(const ct_model *m, const ct_qweight *q, int in, int out, int ld_in, int ld_out)
{
    return q && q->codes && q->fp8 && m->be->linear_fwd_fp8 && m->be->linear_bwd_input_fp8 && in % 16 == 0 &&
           out % 16 == 0 && ld_in % 8 == 0 && ld_out % 8 == 0;
}

void model_linear_fwd(const ct_model *m, const void *dense, const ct_qweight *q, void *y, int ldy, const void *x,
                      int ldx, const void *bias, int T, int in, int out, int accumulate)
{
    if (fp8_gemm(m, q, in, out, ldx, ldy))
        m->be->linear_fwd_fp8(m->be, y, ldy, accumulate ? y : NULL, x, ldx, q->codes, q->scales, bias, T, in, out);
    else
        m->be->linear_fwd(m->be, y, ldy, x, ldx, model_weight(m, dense, q), bias, T, in, out, accumulate);
}

void model_linear_fwd_residual(const ct_model *m, const void *dense, const ct_qweight *q, void *y, int ldy,
                               const void *res, const void *x, int ldx, const void *bias, int T, int in, int out)
{
    if (fp8_gemm(m, q, in, out, ldx, ldy))
        m->be->linear_fwd_fp8(m->be, y, ldy, res, x, ldx, q->codes, q->scales, bias, T, in, out);
    else
        m->be->linear_fwd_residual(m->be, y, ldy, res, x, ldx, model_weight(m, dense, q), bias, T, in, out);
}

void model_linear_bwd_input(const ct_model *m, const void *dense, const ct_qweight *q, void *dx, int lddx,
                            const void *dy, int lddy, int T, int in, int out, int accumulate)
{
    if (fp8_gemm(m, q, in, out, lddx, lddy))
        m->be->linear_bwd_input_fp8(m->be, dx, lddx, dy, lddy, q->codes, q->scales, T, in, out, accumulate);
    else
        m->be->linear_bwd_input(m->be, dx, lddx, dy, lddy, model_weight(m, dense, q), T, in, out, accumulate);
}

void model_free(ct_model *m)
{
    ct_backend *be = m->be;
    if (!be) return;
    if (m->layers) {
        for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
            void **w = (void **)&m->layers[l];
            for (size_t i = 0; i < sizeof(ct_layer_weights) / sizeof(void *); i++)
                if (w[i]) be->free(be, w[i]);
        }
        free(m->layers);
    }
    if (m->qlayers) {
        for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
            ct_qweight *q = (ct_qweight *)&m->qlayers[l];
            for (size_t i = 0; i < sizeof(ct_layer_qweights) / sizeof(ct_qweight); i++) {
                if (q[i].codes) be->free(be, q[i].codes);
                if (q[i].scales) be->free(be, q[i].scales);
            }
        }
        free(m->qlayers);
    }
    if (m->dequant_buf) be->free(be, m->dequant_buf);
    if (m->lm_head && m->lm_head != m->embed) be->free(be, m->lm_head);
    if (m->embed) be->free(be, m->embed);
    if (m->final_norm) be->free(be, m->final_norm);
    if (m->inv_freq) be->free(be, m->inv_freq);
    memset(m, 0, sizeof *m);
}
