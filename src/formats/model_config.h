/* model_config.h — a Hugging Face config.json as a model description, and the
 * map from that description to HF tensor names and shapes (docs/ARCHITECTURE.md, "Model folders").
 *
 * Supported model_type: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, gpt_oss,
 * and the Gated DeltaNet hybrids qwen3_5, qwen3_5_text, qwen3_5_moe,
 * qwen3_5_moe_text, qwen3_next (computed on backends with the GDN ops: the
 * CPU's for now). Anything else is CT_ERR_INPUT naming the
 * supported ones. Both the legacy rope_theta/rope_scaling keys and transformers
 * v5 rope_parameters are read. The multimodal wrappers qwen3_5 and qwen3_5_moe
 * are read through their text_config; their vision tower is ignored. */
#ifndef CT_MODEL_CONFIG_H
#define CT_MODEL_CONFIG_H

#include "common.h"
#include "safetensors.h"

typedef enum {
    CT_ARCH_LLAMA, CT_ARCH_MISTRAL, CT_ARCH_QWEN2, CT_ARCH_QWEN3,
    CT_ARCH_QWEN3_MOE, CT_ARCH_MIXTRAL, CT_ARCH_GPT_OSS,
    CT_ARCH_QWEN3_5,      /* qwen3_5 (wrapper) and qwen3_5_text: dense MLP */
    CT_ARCH_QWEN3_5_MOE,  /* qwen3_5_moe (wrapper) and qwen3_5_moe_text: every layer MoE */
    CT_ARCH_QWEN3_NEXT    /* qwen3_next: MoE by decoder_sparse_step / mlp_only_layers */
} ct_arch;

typedef enum { CT_ROPE_DEFAULT, CT_ROPE_LINEAR, CT_ROPE_DYNAMIC, CT_ROPE_LLAMA3, CT_ROPE_YARN } ct_rope_type;

#define CT_MAX_LAYERS 512
/* Caps on the sizes a config.json may claim, far above any released model
 * (V 262144, H 16384, I 53248, E 384, D 256). Within them no size derived from
 * a config overflows: an int (graph dimensions such as n_heads * head_dim or
 * 2 * I), a size_t (parameter counts, which stay below 2^62), and the tensor
 * list (L * E * 3 expert entries) stays small enough to build. */
#define CT_MAX_VOCAB        (1 << 24)
#define CT_MAX_HIDDEN       (1 << 17)
#define CT_MAX_INTERMEDIATE (1 << 20)
#define CT_MAX_HEADS        1024
#define CT_MAX_HEAD_DIM     1024
#define CT_MAX_EXPERTS      1024
#define CT_MAX_CONV_WIDTH   8   /* linear_conv_kernel_dim; shipped models use 4 */

typedef struct ct_rope_config {
    ct_rope_type type;
    double theta;
    double partial_rotary_factor;     /* 1.0 unless given */
    double factor;                    /* linear, dynamic, llama3, yarn */
    double low_freq_factor, high_freq_factor;      /* llama3 */
    int original_max_position_embeddings;          /* llama3, yarn */
    double beta_fast, beta_slow;                   /* yarn (defaults 32, 1) */
    double attention_factor;                       /* yarn; <= 0 means derived */
    bool truncate;                                 /* yarn (default true) */
} ct_rope_config;

typedef struct ct_model_config {
    ct_arch arch;
    char model_type[32];
    char architectures[64];           /* architectures[0], e.g. "Qwen3ForCausalLM" */
    int vocab_size;                   /* V */
    int hidden_size;                  /* H */
    int intermediate_size;            /* I (dense MLP) */
    int num_hidden_layers;            /* L */
    int num_attention_heads;          /* n_heads */
    int num_key_value_heads;          /* n_kv */
    int head_dim;                     /* D */
    double rms_norm_eps;
    int max_position_embeddings;
    bool tie_word_embeddings;
    bool attention_bias;              /* q, k, v (and o) biases: qwen2 (q,k,v only), gpt_oss (all) */
    bool o_proj_bias;                 /* o_proj has a bias (llama attention_bias, gpt_oss) */
    bool mlp_bias;
    bool qk_norm;                     /* qwen3, qwen3_moe: per-head RMSNorm on q and k */
    ct_rope_config rope;
    /* attention variants */
    int sliding_window;               /* 0: none */
    bool layer_sliding[CT_MAX_LAYERS];/* per layer: uses the sliding window */
    bool attention_sinks;             /* gpt_oss */
    /* mixture of experts (0 experts: dense) */
    int num_experts;                  /* E */
    int num_experts_per_tok;          /* K */
    int moe_intermediate_size;        /* per-expert I */
    bool norm_topk_prob;
    bool layer_sparse[CT_MAX_LAYERS]; /* per layer: MoE block (else dense MLP) */
    double router_aux_loss_coef;
    double swiglu_limit;              /* gpt_oss (7.0) */
    char torch_dtype[16];             /* as written ("bfloat16" if absent) */
    double initializer_range;         /* std of random init (0.02 if absent) */
    /* Gated DeltaNet hybrids (qwen3_5*, qwen3_next; all zero/false otherwise) */
    bool gdn;                         /* the family has linear-attention (GDN) layers */
    bool layer_linear[CT_MAX_LAYERS]; /* per layer: GDN (else gated full attention) */
    int linear_num_key_heads;         /* Hk */
    int linear_num_value_heads;       /* Hv, a multiple of Hk */
    int linear_key_head_dim;          /* dk */
    int linear_value_head_dim;        /* dv */
    int linear_conv_kernel_dim;       /* W: causal depthwise conv width */
    bool gdn_grouped_proj;            /* qwen3_next: in_proj_qkvz / in_proj_ba, rows grouped by key head;
                                       * else in_proj_qkv / _z / _b / _a, contiguous */
    bool attn_output_gate;            /* q_proj rows (n_heads, 2, D): query then sigmoid gate per head */
    bool norm_zero_centred;           /* decoder, final and q/k norms scale by (1 + w); w init 0 */
    int shared_expert_intermediate_size; /* shared expert width (0: none) */
    int mrope_section[3];             /* accepted; text-only input makes M-RoPE ordinary partial RoPE */
    bool mrope_interleaved;
    int mtp_num_hidden_layers;        /* MTP heads in the checkpoint (HF drops them; so does ctune) */
    /* config.json's quantization_config: how the checkpoint stores its frozen
     * weights (each tensor is still recognised by its own keys at load) */
    enum { CT_QUANT_NONE, CT_QUANT_BNB4, CT_QUANT_MXFP4, CT_QUANT_FP8 } quant_method;
    char tensor_prefix[32];           /* "model." or, for the wrappers, "model.language_model." */
} ct_model_config;

/* Reads DIR/config.json (or a path to a config.json file). */
int model_config_load(ct_model_config *mc, const char *path, ct_error *err);
/* Parses config.json text; source names it in errors. */
int model_config_parse(ct_model_config *mc, const char *text, size_t len,
                       const char *source, ct_error *err);
const char *model_arch_name(ct_arch a);

/* RoPE inverse frequencies for rotary dim d = head_dim * partial_rotary_factor:
 * writes d/2 values and the cos/sin multiplier (1.0 except yarn). Computed in
 * double, rounded to float, as transformers computes each scaling type (docs/ARCHITECTURE.md, "Model folders").
 * dynamic (NTK) equals default up to max_position_embeddings, where HF starts
 * to grow theta; ctune uses the default frequencies at every length. */
int model_rope_dim(const ct_model_config *mc);
void model_rope_inv_freq(const ct_model_config *mc, float *inv_freq, float *attention_scaling);

/* What a tensor is, so init can fill it and counts can classify it. */
typedef enum {
    CT_TENSOR_EMBEDDING,  /* embed_tokens: a lookup, not a matmul */
    CT_TENSOR_LM_HEAD,    /* lm_head (absent when tied) */
    CT_TENSOR_LINEAR,     /* matmul weights: projections, routers, experts */
    CT_TENSOR_NORM,       /* RMSNorm weights (init 1.0) */
    CT_TENSOR_BIAS,       /* additive biases */
    CT_TENSOR_SINKS,      /* gpt_oss attention sink logits (init 0) */
    CT_TENSOR_NORM_ZERO,  /* zero-centred RMSNorm weights, y = x_hat * (1 + w) (init 0) */
    CT_TENSOR_CONV,       /* GDN depthwise conv1d weight [C, 1, W] (init N(0, std)) */
    CT_TENSOR_A_LOG,      /* GDN decay log A per value head (init log U(0.01, 16)) */
    CT_TENSOR_DT_BIAS,    /* GDN softplus bias per value head (init 1) */
} ct_tensor_kind;

/* Every tensor a checkpoint of this model holds (HF names, bf16 shapes). */
typedef struct ct_tensor_spec {
    char name[160];
    int ndim;
    int64_t shape[4];
    ct_tensor_kind kind;
    bool expert;          /* routed-expert weights: a token uses K/E of them */
} ct_tensor_spec;
size_t model_tensor_numel(const ct_tensor_spec *t);
/* Returns a malloc'd array the caller frees; *n receives its length. */
ct_tensor_spec *model_tensor_specs(const ct_model_config *mc, size_t *n);

typedef struct ct_param_counts {
    size_t total;          /* every parameter */
    size_t embedding;      /* embed_tokens (+ lm_head when untied) */
    size_t per_token_active; /* matmul parameters a token passes through (N of BENCHMARKS.md's MFU accounting) */
} ct_param_counts;
ct_param_counts model_param_counts(const ct_model_config *mc);

/* Checks that a reader holds every tensor of the spec with its dtype BF16 (or
 * F32/F16, converted on load) and shape. Extra tensors are ignored (HF ignores
 * them too). Errors name the tensor and its file (or the folder if missing). */
int model_check_weights(const ct_model_config *mc, const st_reader *r, ct_error *err);

#endif
