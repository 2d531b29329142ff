/* model.h — a decoder (llama, mistral, qwen2, qwen3; the mixtures of experts
 * qwen3_moe, mixtral, gpt_oss) loaded onto a backend, and the layer graph:
 * forward, backward (LoRA gradients only; the base is frozen) and evaluation
 * over one packed micro-batch.
 *
 * On load q/k/v are fused into one weight (rows q | k | v) and gate/up into one
 * (rows gate | up), so each is one GEMM; LoRA writes into column slices of the
 * fused outputs. Sparse (MoE) layers hold every expert's weights in one tensor
 * per projection, in the (E, out, in) layout the grouped GEMM reads. The graph
 * keeps each layer's input (checkpointing) and recomputes the layer in
 * backward; with checkpointing off it keeps every layer's intermediates
 * instead. The two give identical results. */
#ifndef CT_MODEL_H
#define CT_MODEL_H

#include "backend.h"
#include "model_config.h"

typedef struct ct_layer_weights {
    void *attn_norm;   /* (H) */
    void *wqkv;        /* (nq*D + 2*nkv*D, H) */
    void *bqkv;        /* (nq*D + 2*nkv*D) or NULL */
    void *q_norm;      /* (D) or NULL */
    void *k_norm;      /* (D) or NULL */
    void *wo;          /* (H, nq*D) */
    void *bo;          /* (H) or NULL */
    void *mlp_norm;    /* (H) */
    void *wgu;         /* (2I, H) */
    void *bgu;         /* (2I) or NULL */
    void *wdown;       /* (H, I) */
    void *bdown;       /* (H) or NULL */
    float *sinks;      /* (nq) fp32 attention sink logits (gpt_oss) or NULL */
    /* Gated DeltaNet layers (cfg.layer_linear[l]) have these instead of wqkv..wo;
     * a gated attention layer (the other layers of a GDN hybrid) has wqkv with rows
     * [queries of all heads (Q) | their output gates (Q) | k | v]: HF interleaves
     * query and gate per head in q_proj, permuted at load. */
    void *win;         /* (conv_dim + value_dim + 2 Hv, H): rows in_proj_qkv | in_proj_z |
                        * in_proj_b | in_proj_a (qwen3_next's grouped in_proj_qkvz and
                        * in_proj_ba are permuted into this order at load) */
    void *conv_w;      /* (conv_dim, W) */
    float *A_log;      /* (Hv) fp32 */
    float *dt_bias;    /* (Hv) fp32 */
    void *gdn_norm;    /* (Dv) gated RMSNorm weight */
    void *wout;        /* (H, value_dim) */
    /* Sparse layers (cfg.layer_sparse[l]) have these instead of wgu..bdown;
     * I is moe_intermediate_size here. */
    void *router;      /* (E, H) */
    void *router_bias; /* (E) or NULL (gpt_oss has one) */
    void *wgu_e;       /* (E, 2I, H): per expert gate rows then up rows; gpt_oss keeps
                        * its interleaved order (row 2i gate i, row 2i+1 up i) */
    void *bgu_e;       /* (E, 2I) or NULL, rows as wgu_e */
    void *wdown_e;     /* (E, H, I) */
    void *bdown_e;     /* (E, H) or NULL */
    /* the shared expert of the MoE hybrids' sparse layers (qwen3_5_moe, qwen3_next; NULL elsewhere),
     * Is its intermediate size */
    void *wsh_gu;      /* (2Is, H): gate rows then up rows */
    void *wsh_down;    /* (H, Is) */
    void *wsh_gate;    /* (1, H): the scalar gate, sigmoid(hn . w) per token */
} ct_layer_weights;   /* every field a backend pointer (model_free walks them) */

/* A frozen weight held in 4 bits (a QLoRA base: docs/quantization.md) instead
 * of its dense field above, which is then NULL. The (rows, cols) matrix is
 * stored as 4-bit codes, two per byte in row-major order, with one scale per
 * block of `blocksize` consecutive elements of a row (cols % blocksize == 0):
 * bitsandbytes' absmax as fp32 (double quantization undone exactly at load, so
 * that fusing q|k|v and permuting rows move bytes only; 0.5 bit per weight
 * more than the 8-bit form) or MXFP4's E8M0 bytes. Or held in FP8 (fp8 set):
 * one E4M3 byte per weight and one fp32 scale per 128x128 block, fused weights
 * joining whole blocks only. The graph reads it through model_weight, which
 * decodes it to a dense weight right before each GEMM. */
typedef struct ct_qweight {
    uint8_t *codes;   /* backend memory, numel / 2 bytes (FP8: numel bytes); NULL: the weight is dense */
    void *scales;     /* backend memory: numel / blocksize fp32 (NF4, FP4) or bytes (MXFP4); FP8: fp32, one
                         per 128x128 block, (ceil(rows / 128), fp8_weight_scale_ld(cols)) */
    size_t numel;
    int blocksize;    /* 4-bit only */
    quant4_type type; /* 4-bit only */
    bool fp8;         /* E4M3 codes in 128x128 blocks (fp8.h; base_precision fp8) instead of 4 bits */
    size_t rows, cols; /* FP8: the matrix, rows = output features (a stack of experts: E * rows) */
} ct_qweight;

/* The 4-bit or FP8 forms of the fields of ct_layer_weights that may have one. */
typedef struct ct_layer_qweights {
    ct_qweight wqkv, wo, wgu, wdown, win, wout, wgu_e, wdown_e, wsh_gu, wsh_down;
} ct_layer_qweights;

typedef struct ct_model {
    ct_model_config cfg;
    ct_backend *be;
    void *embed;              /* (V, H) */
    void *final_norm;         /* (H) */
    void *lm_head;            /* (V, H); == embed when tied */
    ct_layer_weights *layers; /* (L) */
    ct_layer_qweights *qlayers; /* (L) */
    void *dequant_buf;        /* the dense weight model_weight decodes into: the largest 4-bit or FP8 one; NULL if none */
    size_t quant_weights;     /* weights held in 4 bits */
    size_t fp8_weights;       /* weights held in FP8 */
    float *inv_freq;          /* (rot_dim/2) fp32, backend memory */
    float attn_scaling;
    int rot_dim;
    size_t weight_bytes;      /* backend memory held by weights */
} ct_model;

/* What model_load_with does with dense linear weights: quantize them on load
 * (QLoRA from a bf16 folder), exactly as bitsandbytes' quantize_4bit would, or
 * to FP8. */
typedef struct ct_load_options {
    bool fp8;             /* base_precision fp8: the linear weights and routed experts to FP8 (E4M3, 128x128
                             blocks) as transformers' FineGrainedFP8 quantizer would, instead of 4 bits */
    bool quantize;
    quant4_type type;     /* NF4 or FP4 */
    int blocksize;        /* bitsandbytes' 64 */
    bool double_quant;    /* compress_statistics: the absmax kept in 8 bits, as decoded from them */
} ct_load_options;

/* Reads DIR/config.json and the safetensors in DIR, checks every tensor's name,
 * shape and dtype, and uploads the weights (fused) to the backend. Weights the
 * folder stores in 4 bits (bitsandbytes NF4/FP4, gpt_oss's MXFP4 experts) or
 * in FP8 stay so where the whole fused weight is (else they are decoded at
 * load); opt (NULL: none) may quantize the others. FP8 weights on a backend
 * without dequant_fp8 are CT_ERR_INPUT. A mixture of experts on a backend
 * without the MoE ops is CT_ERR_INPUT, and so is a Gated DeltaNet hybrid on a
 * backend without the GDN ops. */
int model_load(ct_model *m, ct_backend *be, const char *dir, ct_error *err);
int model_load_with(ct_model *m, ct_backend *be, const char *dir, const ct_load_options *opt, ct_error *err);

/* The dense weight for a GEMM: `dense` itself, or q (when it holds a 4-bit
 * or FP8 weight) decoded into m->dequant_buf, valid until the next model_weight call.
 * Ops run in order on one stream, so one buffer serves every layer. */
const void *model_weight(const ct_model *m, const void *dense, const ct_qweight *q);
/* model_weight of field F of layer L. */
#define MODEL_WEIGHT(m, l, F) model_weight((m), (m)->layers[l].F, (m)->qlayers ? &(m)->qlayers[l].F : NULL)

/* The GEMMs of a base weight (its dense field, or q holding it in 4 bits or
 * FP8), with the contracts of the backend ops linear_fwd,
 * linear_fwd_residual and linear_bwd_input, and the one place that chooses
 * how they run: an FP8 weight through the backend's FP8 GEMMs where it has
 * them and the shapes allow (in and out multiples of 16, strides multiples of
 * 8), every other quantized weight decoded first (model_weight). */
void model_linear_fwd(const ct_model *m, const void *dense, const ct_qweight *q, void *y, int ldy, const void *x,
                      int ldx, const void *bias, int T, int in, int out, int accumulate);
void model_linear_fwd_residual(const ct_model *m, const void *dense, const ct_qweight *q, void *y, int ldy,
                               const void *res, const void *x, int ldx, const void *bias, int T, int in, int out);
void model_linear_bwd_input(const ct_model *m, const void *dense, const ct_qweight *q, void *dx, int lddx,
                            const void *dy, int lddy, int T, int in, int out, int accumulate);
/* The weight arguments of field F of layer L for model_linear_*. */
#define MODEL_W(m, l, F) (m), (m)->layers[l].F, (m)->qlayers ? &(m)->qlayers[l].F : NULL
void model_free(ct_model *m);

/* Per-projection sizes: in and out features of each LoRA-able module. */
typedef enum {
    CT_MOD_Q, CT_MOD_K, CT_MOD_V, CT_MOD_O, CT_MOD_GATE, CT_MOD_UP, CT_MOD_DOWN,
    /* Gated DeltaNet layers' projections (linear_attn.*): qwen3_5's contiguous
     * in_proj_qkv, _z, _b, _a, or qwen3_next's in_proj_qkvz and in_proj_ba (one
     * LoRA each, over the fused columns [qkv | z] and [b | a]); out_proj in both */
    CT_MOD_IN_QKV, CT_MOD_IN_Z, CT_MOD_IN_B, CT_MOD_IN_A, CT_MOD_IN_QKVZ, CT_MOD_IN_BA, CT_MOD_OUT,
    /* the MoE hybrids' mlp.shared_expert_gate (1, H) */
    CT_MOD_SH_GATE, CT_MOD_COUNT
} ct_module;
/* The MLP modules (dense, experts, or qwen3_5_moe's shared expert): gate, up, down. */
static inline bool model_module_is_mlp(ct_module mod) { return mod >= CT_MOD_GATE && mod <= CT_MOD_DOWN; }
/* Gated DeltaNet sizes: key_dim = Hk dk, value_dim = Hv dv, conv_dim = 2 key_dim + value_dim. */
static inline int model_gdn_key_dim(const ct_model_config *c) { return c->linear_num_key_heads * c->linear_key_head_dim; }
static inline int model_gdn_value_dim(const ct_model_config *c)
{
    return c->linear_num_value_heads * c->linear_value_head_dim;
}
static inline int model_gdn_conv_dim(const ct_model_config *c) { return 2 * model_gdn_key_dim(c) + model_gdn_value_dim(c); }
/* Columns of the fused GDN input projection: [qkv | z | b | a]. */
static inline int model_gdn_proj_dim(const ct_model_config *c)
{
    return model_gdn_conv_dim(c) + model_gdn_value_dim(c) + 2 * c->linear_num_value_heads;
}
/* qwen3_next's grouped projections: per key head g (r = Hv/Hk value heads each)
 * in_proj_qkvz holds rows [q_g (dk) | k_g (dk) | v_g (r dv) | z_g (r dv)] and
 * in_proj_ba [b_g (r) | a_g (r)]; value head g r + j belongs to key head g.
 * HF row i of in_proj_qkvz is row model_gdn_qkvz_row(i) of [all q | all k | all v
 * | all z] (the fused weight's first conv_dim + value_dim rows, and the order of
 * in_proj_qkvz's LoRA B in memory); HF row i of in_proj_ba is row
 * model_gdn_ba_row(i) of [all b | all a]. */
static inline int model_gdn_qkvz_row(const ct_model_config *c, int i)
{
    int dk = c->linear_key_head_dim, Kd = model_gdn_key_dim(c);
    int rv = c->linear_num_value_heads / c->linear_num_key_heads * c->linear_value_head_dim; /* v (z) rows per group */
    int group = 2 * dk + 2 * rv, g = i / group, j = i % group;
    if (j < dk) return g * dk + j;
    if (j < 2 * dk) return Kd + g * dk + j - dk;
    if (j < 2 * dk + rv) return 2 * Kd + g * rv + j - 2 * dk;
    return model_gdn_conv_dim(c) + g * rv + j - 2 * dk - rv;
}
static inline int model_gdn_ba_row(const ct_model_config *c, int i)
{
    int r = c->linear_num_value_heads / c->linear_num_key_heads, g = i / (2 * r), j = i % (2 * r);
    return j < r ? g * r + j : c->linear_num_value_heads + g * r + j - r;
}
/* Gated attention's q_proj: HF row r (per head h, D query rows then D gate rows)
 * is row model_q_row(r) of the fused weight and of q_proj's LoRA B in memory
 * ([all queries (Q) | all gates (Q)]). */
static inline int model_q_row(int r, int D, int Q)
{
    int h = r / (2 * D), j = r % (2 * D);
    return j < D ? h * D + j : Q + h * D + j - D;
}
/* Gated full attention (qwen3_5*): q_proj yields a sigmoid output gate per query. */
static inline bool model_attn_gated(const ct_model_config *c) { return c->attn_output_gate; }
const char *model_module_name(ct_module mod);           /* "q_proj" */
const char *model_module_parent(ct_module mod);         /* "self_attn", "linear_attn" or "mlp" */
/* The module's path under a layer as PEFT names it: "self_attn.q_proj";
 * qwen3_5_moe's gate/up/down are its shared expert's, "mlp.shared_expert.gate_proj"
 * (qwen3_next's are its routed experts', as PEFT's v5 conversion reads those names). */
void model_module_path(char *out, size_t len, ct_arch arch, ct_module mod);
/* in/out of a module of a dense layer (the MLP with intermediate_size). */
void model_module_shape(const ct_model_config *cfg, ct_module mod, int *in, int *out);
/* in/out of one matrix of module mod in layer l; returns how many there are:
 * 1, or E for gate/up/down of a sparse layer (one per expert; qwen3_5_moe:
 * its shared expert's, 1, as PEFT's target_modules reads them there, the
 * experts being parameters), or 0 where the
 * module does not exist: gpt_oss fuses gate and up into one gate_up_proj per
 * expert, which is its GATE module (out = 2I, interleaved rows), and has no UP;
 * a GDN hybrid's linear-attention layers have no q/k/v/o and its attention
 * layers no in_proj_* / out_proj; qwen3_next has in_proj_qkvz / in_proj_ba and
 * no in_proj_qkv / _z / _b / _a, the other hybrids the reverse. Gated
 * attention's q_proj has out = 2 Q. */
int model_module_layer_shape(const ct_model_config *cfg, int l, ct_module mod, int *in, int *out);

#endif
