/* model_config.h — a Hugging Face config.json as a model description, and the
 * map from that description to HF tensor names and shapes (docs/ARCHITECTURE.md, "Model folders").
 *
 * Supported model_type: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, gpt_oss.
 * Anything else is CT_ERR_INPUT naming the supported ones. Both the legacy
 * rope_theta/rope_scaling keys and transformers v5 rope_parameters are read. */
#ifndef CT_MODEL_CONFIG_H
#define CT_MODEL_CONFIG_H

#include "common.h"
#include "safetensors.h"

typedef enum {
    CT_ARCH_LLAMA, CT_ARCH_MISTRAL, CT_ARCH_QWEN2, CT_ARCH_QWEN3,
    CT_ARCH_QWEN3_MOE, CT_ARCH_MIXTRAL, CT_ARCH_GPT_OSS
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
