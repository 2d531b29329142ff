/* model.h — a dense decoder (llama, mistral, qwen2, qwen3) loaded onto a backend,
 * and the layer graph: forward, backward (LoRA gradients only; the base is
 * frozen) and evaluation over one packed micro-batch.
 *
 * On load q/k/v are fused into one weight (rows q | k | v) and gate/up into one
 * (rows gate | up), so each is one GEMM; LoRA writes into column slices of the
 * fused outputs. The graph keeps each layer's input (checkpointing) and
 * recomputes the layer in backward; with checkpointing off it keeps every
 * layer's intermediates instead. The two give identical results. */
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
} ct_layer_weights;

typedef struct ct_model {
    ct_model_config cfg;
    ct_backend *be;
    void *embed;              /* (V, H) */
    void *final_norm;         /* (H) */
    void *lm_head;            /* (V, H); == embed when tied */
    ct_layer_weights *layers; /* (L) */
    float *inv_freq;          /* (rot_dim/2) fp32, backend memory */
    float attn_scaling;
    int rot_dim;
    size_t weight_bytes;      /* backend memory held by weights */
} ct_model;

/* Reads DIR/config.json and the safetensors in DIR, checks every tensor's name,
 * shape and dtype, and uploads the weights (fused) to the backend. */
int model_load(ct_model *m, ct_backend *be, const char *dir, ct_error *err);
void model_free(ct_model *m);

/* Per-projection sizes: in and out features of each LoRA-able module. */
typedef enum {
    CT_MOD_Q, CT_MOD_K, CT_MOD_V, CT_MOD_O, CT_MOD_GATE, CT_MOD_UP, CT_MOD_DOWN, CT_MOD_COUNT
} ct_module;
const char *model_module_name(ct_module mod);           /* "q_proj" */
const char *model_module_parent(ct_module mod);         /* "self_attn" or "mlp" */
void model_module_shape(const ct_model_config *cfg, ct_module mod, int *in, int *out);

#endif
