/* lora.h — LoRA adapter parameters for the targeted projections of every layer,
 * their gradients and AdamW moments (all fp32, backend memory), PEFT-style
 * initialisation, and the PEFT adapter format on disk (FORMATS.md section 3).
 *
 * Layout: one flat fp32 vector; for each layer, for each targeted module in
 * ct_module order: A (R, in) then B (out, R). grads, m and v mirror it. */
#ifndef CT_LORA_H
#define CT_LORA_H

#include "config.h"
#include "model.h"

typedef struct ct_lora {
    int R;
    float scale;                  /* alpha/R, or alpha/sqrt(R) with rsLoRA */
    float dropout;
    bool targeted[CT_MOD_COUNT];
    int in[CT_MOD_COUNT], out[CT_MOD_COUNT]; /* features of each module (every layer alike) */
    int n_layers;
    size_t n_params;
    size_t *offset;               /* (L * CT_MOD_COUNT): offset of A; B follows A; SIZE_MAX if untargeted */
    float *params, *grads, *m, *v;/* (n_params) backend memory */
    ct_lora_config cfg;           /* as configured (written to adapter_config.json) */
} ct_lora;

/* Allocates and initialises like PEFT: A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in),
 * 1/sqrt(in)) (or N(0, 1/R) for init_lora_weights "gaussian"), B = 0, from seed. */
int lora_init(ct_lora *lo, const ct_model *m, const ct_lora_config *cfg, uint64_t seed, ct_error *err);
void lora_free(ct_lora *lo, ct_backend *be);

/* Backend pointers to A (R, in) and B (out, R) of one module, NULL if untargeted. */
float *lora_A(const ct_lora *lo, int layer, ct_module mod);
float *lora_B(const ct_lora *lo, int layer, ct_module mod);
float *lora_grad_A(const ct_lora *lo, int layer, ct_module mod);
float *lora_grad_B(const ct_lora *lo, int layer, ct_module mod);

/* Writes DIR/adapter_model.safetensors (fp32, PEFT names) and adapter_config.json.
 * base_model is written as base_model_name_or_path. */
int lora_save_peft(const ct_lora *lo, const ct_model *m, const char *dir, const char *base_model,
                   ct_error *err);
/* Reads a PEFT adapter folder into lo (shapes, r and targets must match). */
int lora_load_peft(ct_lora *lo, const ct_model *m, const char *dir, ct_error *err);

/* PEFT tensor name of A or B: base_model.model.model.layers.I.self_attn.q_proj.lora_A.weight */
void lora_tensor_name(char *out, size_t len, int layer, ct_module mod, bool is_B);

#endif
