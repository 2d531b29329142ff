/* lora.h — LoRA adapter parameters for the targeted projections of every layer,
 * their gradients and AdamW moments (all fp32, backend memory), PEFT-style
 * initialisation, and the PEFT adapter format on disk (docs/ARCHITECTURE.md,
 * "PEFT adapters").
 *
 * Layout: one flat fp32 vector; for each layer, for each targeted module in
 * ct_module order: A then B. A plain projection has A (R, in), B (out, R). The
 * gate/up/down of a sparse (MoE) layer are one LoRA per expert, stored
 * stacked: A (E, R, in) then B (E, out, R), which the grouped LoRA ops read;
 * the router is never adapted. grads, m and v mirror the layout. */
#ifndef CT_LORA_H
#define CT_LORA_H

#include "config.h"
#include "model.h"

/* One (layer, module): where its A starts and the shape of each of its matrices. */
typedef struct ct_lora_slot {
    size_t offset;                /* of A in params; B follows all of A; SIZE_MAX if untargeted */
    int in, out;                  /* features of one matrix */
    int experts;                  /* 1, E for a sparse layer's experts, 0 if untargeted */
} ct_lora_slot;

typedef struct ct_lora {
    int R;
    float scale;                  /* alpha/R, or alpha/sqrt(R) with rsLoRA */
    float dropout;
    bool targeted[CT_MOD_COUNT];
    int in[CT_MOD_COUNT], out[CT_MOD_COUNT]; /* features of each module of a dense layer */
    int n_layers;
    size_t n_params;
    ct_lora_slot *slots;          /* (L * CT_MOD_COUNT) */
    float *params, *grads, *m, *v;/* (n_params) backend memory */
    ct_arch arch;                 /* the model family: it decides the expert tensor names */
    ct_lora_config cfg;           /* as configured (written to adapter_config.json) */
} ct_lora;

/* Allocates and initialises like PEFT: A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in),
 * 1/sqrt(in)) (or N(0, 1/R) for init_lora_weights "gaussian"), B = 0, from seed;
 * drawn in (layer, module, expert) order. target_modules gate_proj, up_proj and
 * down_proj adapt the dense MLPs and the experts of sparse layers alike (gpt_oss:
 * its fused gate_up_proj needs both gate_proj and up_proj, else CT_ERR_INPUT). A
 * listed GDN projection of the other layout (in_proj_qkv on qwen3_next,
 * in_proj_qkvz on qwen3_5) is CT_ERR_INPUT; all-linear takes the model's own. */
int lora_init(ct_lora *lo, const ct_model *m, const ct_lora_config *cfg, uint64_t seed, ct_error *err);
void lora_free(ct_lora *lo, ct_backend *be);

/* Backend pointers to A and B of one module (stacked over experts: A (E, R, in),
 * B (E, out, R)), NULL if untargeted. */
float *lora_A(const ct_lora *lo, int layer, ct_module mod);
float *lora_B(const ct_lora *lo, int layer, ct_module mod);
float *lora_grad_A(const ct_lora *lo, int layer, ct_module mod);
float *lora_grad_B(const ct_lora *lo, int layer, ct_module mod);

const ct_lora_slot *lora_slot(const ct_lora *lo, int layer, ct_module mod);

/* Writes DIR/adapter_model.safetensors (fp32, PEFT names) and adapter_config.json.
 * base_model is written as base_model_name_or_path. Experts are saved as PEFT's
 * per-expert modules (qwen3_moe ...mlp.experts.E.gate_proj, mixtral
 * ...block_sparse_moe.experts.E.w1/w3/w2, which PEFT, vLLM and llama.cpp load),
 * except gpt_oss, which has no per-expert modules: its experts use PEFT's
 * target_parameters format with transformers v5's is_transposed layout
 * (...mlp.experts[.base_layer].lora_A [R*E, in] expert-major rows, lora_B
 * [out, R*E] with column j*E + e; docs/ARCHITECTURE.md, "PEFT adapters").
 * Every lora_B is written in the row order of its HF weight: gated attention's
 * q_proj and qwen3_next's in_proj_qkvz / in_proj_ba, whose rows params keeps in
 * the fused weight's order, are permuted on the way (and back by lora_load_peft). */
int lora_save_peft(const ct_lora *lo, const ct_model *m, const char *dir, const char *base_model,
                   ct_error *err);
/* Reads a PEFT adapter folder into lo (shapes, r and targets must match). */
int lora_load_peft(ct_lora *lo, const ct_model *m, const char *dir, ct_error *err);

/* PEFT tensor name of A or B: base_model.model.model.layers.I.self_attn.q_proj.lora_A.weight */
void lora_tensor_name(char *out, size_t len, int layer, ct_module mod, bool is_B);
/* The same for expert e of a sparse layer of a qwen3_moe or mixtral model:
 * base_model.model.model.layers.I.mlp.experts.E.gate_proj.lora_A.weight
 * (mixtral: ...block_sparse_moe.experts.E.w1...). */
void lora_expert_tensor_name(char *out, size_t len, ct_arch arch, int layer, int expert, ct_module mod, bool is_B);

#endif
