/* adapter.h — reading a PEFT LoRA adapter folder written by ctune or PEFT
 * (FORMATS.md section 3) for inference: `ctune merge` and `ctune generate`.
 *
 * Only what ctune can apply exactly is accepted: plain LoRA (no DoRA, no
 * fan_in_fan_out, bias "none", no rank_pattern/alpha_pattern, no
 * modules_to_save) on the projections q/k/v/o/gate/up/down_proj. Anything else
 * is CT_ERR_INPUT naming adapter_config.json and the key. */
#ifndef CT_ADAPTER_H
#define CT_ADAPTER_H

#include "lora.h"

/* Reads DIR/adapter_config.json: r, lora_alpha, use_rslora, target_modules
 * (a list of projection names, or "all-linear"). lora_dropout is read but
 * inference never applies it. */
int adapter_read_config(const char *dir, ct_lora_config *out, ct_error *err);

/* adapter_read_config + lora_init + lora_load_peft: lo holds the adapter on m's
 * backend afterwards (the caller frees it with lora_free). */
int adapter_load(ct_lora *lo, const ct_model *m, const char *dir, ct_error *err);

#endif
