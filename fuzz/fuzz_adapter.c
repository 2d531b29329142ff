/* fuzz_adapter.c — the PEFT adapter reader of `ctune merge`, `eval --adapter`
 * and `generate`: adapter_read_config on adapter_config.json, then adapter_load
 * (the config and adapter_model.safetensors) against each model of
 * fuzz_model.h. Input: adapter_config.json, FUZZ_FILE_SEP,
 * adapter_model.safetensors (the seeds: each tests/fixtures/NAME/adapter/).
 * Invariants: no crash, leak or UB; every failure is a one-line CT_ERR_INPUT
 * and leaves no LoRA allocated; no load asks for more LoRA memory than the
 * file could fill (4 buffers of its size: r is checked against the file before
 * anything is allocated); a config that reads has r in 1..65536, a finite
 * positive scale, dropout in [0, 1) and 1..7 distinct projection names; an
 * adapter that loads has one slot per (layer, targeted module) with the
 * model's shapes, and written back (lora_save_peft) gives the input's tensors
 * byte for byte and a config that reads back with the same r, targets and
 * scale. */
#include <math.h>
#include <string.h>

#include "adapter.h"
#include "fuzz.h"
#include "fuzz_model.h"

static void adapter_fuzz_check_config(const ct_lora_config *c)
{
    double scale = config_lora_scaling(c);
    FUZZ_ASSERT(c->r >= 1 && c->r <= 65536, "r %d", c->r);
    FUZZ_ASSERT(isfinite(scale) && scale > 0, "scale %g", scale);
    FUZZ_ASSERT(c->lora_dropout >= 0 && c->lora_dropout < 1, "lora_dropout %g", c->lora_dropout);
    FUZZ_ASSERT(c->n_target_modules >= 1 && c->n_target_modules <= CT_MOD_COUNT, "%d targets", c->n_target_modules);
    for (int i = 0; i < c->n_target_modules; i++) {
        bool known = false;
        for (int mod = 0; mod < CT_MOD_COUNT; mod++) known |= !strcmp(c->target_modules[i], model_module_name(mod));
        FUZZ_ASSERT(known, "target '%s'", c->target_modules[i]);
        for (int j = 0; j < i; j++)
            FUZZ_ASSERT(strcmp(c->target_modules[i], c->target_modules[j]), "target '%s' twice", c->target_modules[i]);
    }
}

static bool adapter_fuzz_lists(const ct_lora_config *c, ct_module mod)
{
    for (int i = 0; i < c->n_target_modules; i++)
        if (!strcmp(c->target_modules[i], model_module_name(mod))) return true;
    return false;
}

/* The slots of a loaded adapter against the model's shapes. */
static void adapter_fuzz_check_slots(const ct_lora *lo, const ct_lora_config *c, const ct_model_config *mc)
{
    size_t n = 0;
    FUZZ_ASSERT(lo->R == c->r && lo->n_layers == mc->num_hidden_layers, "r %d, %d layers", lo->R, lo->n_layers);
    for (int l = 0; l < lo->n_layers; l++)
        for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
            const ct_lora_slot *s = lora_slot(lo, l, (ct_module)mod);
            int in, out, experts = model_module_layer_shape(mc, l, (ct_module)mod, &in, &out);
            FUZZ_ASSERT(lo->targeted[mod] == adapter_fuzz_lists(c, (ct_module)mod), "module %d targeted wrongly", mod);
            if (!lo->targeted[mod]) experts = 0;
            FUZZ_ASSERT(s->experts == experts && (!experts || (s->in == in && s->out == out && s->offset == n)),
                        "layer %d module %d: slot (%d x %d, %d experts at %zu), the model says (%d x %d, %d)", l,
                        mod, s->in, s->out, s->experts, s->offset, in, out, experts);
            n += (size_t)experts * lo->R * ((size_t)in + (size_t)out);
        }
    FUZZ_ASSERT(n == lo->n_params, "%zu parameters, the slots hold %zu", lo->n_params, n);
}

static void adapter_fuzz_round_trip(const ct_lora *lo, const ct_model *m, const char *dir)
{
    char back[256], in_path[300], back_path[300];
    snprintf(back, sizeof back, "%s/back", dir);
    snprintf(in_path, sizeof in_path, "%s/adapter_model.safetensors", dir);
    snprintf(back_path, sizeof back_path, "%s/adapter_model.safetensors", back);
    ct_error err;
    FUZZ_ASSERT(lora_save_peft(lo, m, back, "fuzz/model", &err) == CT_OK, "save: %s", err.msg);
    fuzz_same_tensors(in_path, back_path);
    ct_lora_config c;
    FUZZ_ASSERT(adapter_read_config(back, &c, &err) == CT_OK, "the written config does not read: %s", err.msg);
    double got = config_lora_scaling(&c), want = config_lora_scaling(&lo->cfg);
    FUZZ_ASSERT(c.r == lo->R && fabs(got - want) <= 1e-6 * want, "read back as r %d scale %g (was r %d scale %g)",
                c.r, got, lo->R, want);
    for (int mod = 0; mod < CT_MOD_COUNT; mod++)
        FUZZ_ASSERT(adapter_fuzz_lists(&c, (ct_module)mod) == lo->targeted[mod], "module %s read back %s",
                    model_module_name((ct_module)mod), lo->targeted[mod] ? "untargeted" : "targeted");
    ct_remove_tree(back);
}

int fuzz_adapter(const uint8_t *data, size_t size)
{
    const uint8_t *part[2];
    size_t len[2];
    int n = fuzz_split(data, size, part, len, 2);
    const char *dir = fuzz_dir();
    fuzz_write(dir, "adapter_config.json", part[0], len[0]);
    if (n == 2) fuzz_write(dir, "adapter_model.safetensors", part[1], len[1]);
    ct_error err;
    ct_lora_config c;
    int rc = adapter_read_config(dir, &c, &err);
    if (rc) fuzz_input_error(rc, &err);
    else adapter_fuzz_check_config(&c);
    for (int i = 0; !rc && i < FUZZ_N_MODELS; i++) {
        const ct_model *m = fuzz_model(i);
        ct_lora lo = {0};
        /* params, grads and both moments: 4 buffers, each at most the file's size */
        fuzz_host_bytes = 0;
        fuzz_host_cap = 4 * ((n == 2 ? len[1] : 0) + sizeof(float));
        int lrc = adapter_load(&lo, m, dir, &err);
        fuzz_host_cap = 0;
        if (lrc) {
            fuzz_input_error(lrc, &err);
            FUZZ_ASSERT(!lo.params && !lo.slots, "a failed load left its LoRA allocated");
            continue;
        }
        adapter_fuzz_check_slots(&lo, &c, &m->cfg);
        adapter_fuzz_round_trip(&lo, m, dir);
        lora_free(&lo, m->be);
    }
    ct_remove_tree(dir);
    return 0;
}

CT_FUZZ_MAIN(fuzz_adapter)
