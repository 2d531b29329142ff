/* adapter.h — the PEFT adapter_config.json: written for ctune's adapters so
 * that PEFT loads every tensor of adapter_model.safetensors (PEFT 0.21 on
 * transformers v4 and v5), and read back, from ctune or PEFT, for inference:
 * `ctune merge`, `ctune eval --adapter` and `ctune generate`
 * (docs/ARCHITECTURE.md, "PEFT adapters").
 *
 * Only what ctune can apply exactly is accepted: plain LoRA (no DoRA, no
 * fan_in_fan_out, bias "none", no rank_pattern/alpha_pattern, no
 * modules_to_save) on the projections q/k/v/o/gate/up/down_proj. Anything else
 * is CT_ERR_INPUT naming adapter_config.json and the key. */
#ifndef CT_ADAPTER_H
#define CT_ADAPTER_H

#include "json.h"
#include "lora.h"

/* Reads DIR/adapter_config.json: r, lora_alpha, use_rslora, target_modules
 * (a list of projection names, "all-linear", or a regex that adapts each
 * projection in every layer or in none) and target_parameters (gpt_oss's
 * mlp.experts.gate_up_proj / down_proj, a dense mlp.X_proj.weight).
 * lora_dropout is read but inference never applies it. */
int adapter_read_config(const char *dir, ct_lora_config *out, ct_error *err);

/* adapter_read_config + lora_init + lora_load_peft: lo holds the adapter on m's
 * backend afterwards (the caller frees it with lora_free). Before allocating,
 * the file must hold the bytes that r and the targets need (a config whose r
 * belongs to another adapter is an input error, not gigabytes); a failed load
 * leaves lo empty. */
int adapter_load(ct_lora *lo, const ct_model *m, const char *dir, ct_error *err);

/* Writes lo's adapter_config.json (for model config c) to w: PEFT's keys,
 * sorted, indent 2. The targets take the form PEFT loads completely (see
 * adapter.c): a list of names, or for a qwen3_moe or qwen3_next model with
 * dense layers a regex plus the dense MLP projections as target_parameters;
 * lora_dropout is written 0 where PEFT adapts a target as a parameter (it
 * takes no dropout); rsLoRA on fused experts is written as its scale (alpha *
 * sqrt(r), no rsLoRA). */
void adapter_write_config(const ct_lora *lo, const ct_model_config *c, const char *base_model, json_writer *w);

/* CT_OK if PEFT 0.21 on transformers v5 loads every tensor of an adapter with
 * these targets on this model; else CT_ERR_INPUT naming lora.target_modules and
 * what to target instead. v5 fuses the experts' gate_proj and up_proj of
 * qwen3_moe, qwen3_next and mixtral into one gate_up_proj: PEFT converts a LoRA
 * on one of them only with the other (a ValueError otherwise), and one on both
 * only with down_proj's too (without it the fused gate_up LoRA is left
 * unloaded). For a
 * training run to check before step 1 (a reader of existing adapters need not). */
int adapter_check_peft(const ct_model_config *c, const ct_lora_config *l, ct_error *err);

#endif
