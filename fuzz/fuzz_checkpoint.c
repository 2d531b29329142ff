/* fuzz_checkpoint.c — the checkpoint reader of a resumed run: checkpoint_verify
 * on manifest.json, checkpoint_read_state on trainer_state.safetensors (counters,
 * logging window, non-finite guard) and checkpoint_load_weights (adapter and
 * AdamW moments) into the LoRA of a tiny llama (tests/fixtures/parity_llama,
 * r 4 on all seven projections, as fuzz/seeds/checkpoint/ was trained).
 * Input: trainer_state.safetensors, FUZZ_FILE_SEP, adapter_model.safetensors,
 * and optionally FUZZ_FILE_SEP and manifest.json. That manifest is verified as
 * given; the state is then read under a manifest written here with the files'
 * true sizes and CRCs, since random bytes would otherwise stop at the CRC check
 * and never reach the range checks behind it.
 * Invariants: no crash, leak or UB; every failure is a one-line CT_ERR_INPUT;
 * a state that reads has every counter in the range the trainer relies on
 * (steps fit an int, the guard's unread slots are those of steps 1 .. step,
 * counts whole and finite); weights that load are finite, exp_avg_sq >= 0, and
 * equal the files' tensors byte for byte. */
#include <limits.h>
#include <math.h>
#include <string.h>
#include <zlib.h>

#include "checkpoint.h"
#include "fuzz.h"
#include "fuzz_model.h"

static void checkpoint_fuzz_check_state(const ct_trainer_state *s)
{
    const ct_data_pos *d = &s->data;
    FUZZ_ASSERT(s->step >= 0 && s->step < INT_MAX && s->total_steps >= 1 && s->total_steps <= INT_MAX,
                "step %lld of %lld", (long long)s->step, (long long)s->total_steps);
    FUZZ_ASSERT(d->batches_done >= (uint64_t)s->step && d->epoch <= d->batches_done && d->batches_done <= INT64_MAX &&
                d->window <= INT64_MAX && d->bin <= INT64_MAX, "data position out of range");
    FUZZ_ASSERT(isfinite(s->tokens_seen) && s->tokens_seen >= 0 && isfinite(s->elapsed) && s->elapsed >= 0,
                "tokens_seen %g, elapsed %g", s->tokens_seen, s->elapsed);
    if (!s->has_run_state) return;
    const ct_log_window *w = &s->window;
    FUZZ_ASSERT(w->targets >= 0 && w->targets <= w->tokens && w->tokens <= s->tokens_seen && w->micro_batches >= 0 &&
                (uint64_t)w->micro_batches <= d->batches_done, "logging window out of range");
    const ct_guard_state *g = &s->guard;
    FUZZ_ASSERT(g->used >= 0 && g->used <= CT_GUARD_MAX && g->used <= s->step &&
                (g->used == 0 || g->first_step + g->used - 1 == s->step),
                "guard: %lld unread slots from step %lld at step %lld", (long long)g->used,
                (long long)g->first_step, (long long)s->step);
    FUZZ_ASSERT(g->streak >= 0 && g->streak <= s->step && g->streak_start >= 0 && g->streak_start <= s->step &&
                g->skipped >= 0 && g->skipped <= s->step && g->skipped_since_log >= 0 &&
                g->skipped_since_log <= g->skipped, "guard counters out of range");
}

/* The LoRA the seeds were trained with, on the host backend; made once. */
static ct_lora *checkpoint_fuzz_lora(void)
{
    static ct_lora lo;
    if (!lo.params) {
        ct_lora_config c = {.r = 4, .lora_alpha = 8, .n_target_modules = CT_MOD_COUNT, .target_all_linear = true};
        for (int mod = 0; mod < CT_MOD_COUNT; mod++) strcpy(c.target_modules[mod], model_module_name((ct_module)mod));
        strcpy(c.init_lora_weights, "true");
        ct_error err;
        FUZZ_ASSERT(lora_init(&lo, fuzz_model(FUZZ_LLAMA), &c, 0, &err) == CT_OK, "%s", err.msg);
    }
    return &lo;
}

/* The loaded moments are the state file's, the loaded adapter is the adapter
 * file's (written back to compare), and all of them are finite. */
static void checkpoint_fuzz_check_weights(const ct_lora *lo, const ct_model *m, const char *dir)
{
    const float *v[3] = {lo->params, lo->m, lo->v};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < lo->n_params; i++)
            FUZZ_ASSERT(isfinite(v[k][i]) && !(k == 2 && v[k][i] < 0), "tensor %d element %zu is %g", k, i, v[k][i]);
    char path[300], back[256], back_path[300];
    snprintf(path, sizeof path, "%s/trainer_state.safetensors", dir);
    ct_error err;
    st_reader *r = st_open(path, &err);
    FUZZ_ASSERT(r, "%s", err.msg);
    const char *names[2] = {"exp_avg", "exp_avg_sq"};
    for (int k = 0; k < 2; k++) {
        const st_tensor *t = st_find(r, names[k]);
        FUZZ_ASSERT(t && t->nbytes == lo->n_params * sizeof(float) && !memcmp(t->data, v[k + 1], t->nbytes),
                    "%s loaded differently", names[k]);
    }
    st_close(r);
    snprintf(back, sizeof back, "%s/back", dir);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    snprintf(back_path, sizeof back_path, "%s/adapter_model.safetensors", back);
    FUZZ_ASSERT(lora_save_peft(lo, m, back, "fuzz/model", &err) == CT_OK, "save: %s", err.msg);
    fuzz_same_tensors(path, back_path);
}

/* DIR/manifest.json listing the n files given, with their true sizes and CRCs. */
static void checkpoint_fuzz_manifest(const char *dir, const char *const *names, const uint8_t *const *data,
                                     const size_t *len, int n)
{
    char text[1024];
    int k = snprintf(text, sizeof text, "{\"format\": \"ctune-checkpoint-manifest\", \"version\": 1, \"files\": [");
    for (int i = 0; i < n; i++)
        k += snprintf(text + k, sizeof text - (size_t)k, "%s{\"name\": \"%s\", \"size\": %zu, \"crc32\": %lu}",
                      i ? ", " : "", names[i], len[i], crc32(0L, data[i], (uInt)len[i]));
    k += snprintf(text + k, sizeof text - (size_t)k, "]}\n");
    fuzz_write(dir, "manifest.json", (const uint8_t *)text, (size_t)k);
}

int fuzz_checkpoint(const uint8_t *data, size_t size)
{
    static const char *const names[3] = {"trainer_state.safetensors", "adapter_model.safetensors", "manifest.json"};
    const uint8_t *part[3];
    size_t len[3];
    int n = fuzz_split(data, size, part, len, 3);
    const char *dir = fuzz_dir();
    for (int i = 0; i < n; i++) fuzz_write(dir, names[i], part[i], len[i]);
    ct_error err;
    int rc;
    if (n == 3 && (rc = checkpoint_verify(dir, &err))) fuzz_input_error(rc, &err);
    checkpoint_fuzz_manifest(dir, names, part, len, n < 2 ? n : 2);
    ct_trainer_state st;
    rc = checkpoint_read_state(dir, &st, &err);
    if (rc) {
        fuzz_input_error(rc, &err);
    } else {
        checkpoint_fuzz_check_state(&st);
        const ct_model *m = fuzz_model(FUZZ_LLAMA);
        ct_lora *lo = checkpoint_fuzz_lora();
        rc = checkpoint_load_weights(dir, lo, m, &err);
        if (rc) fuzz_input_error(rc, &err);
        else checkpoint_fuzz_check_weights(lo, m, dir);
    }
    ct_remove_tree(dir);
    return 0;
}

CT_FUZZ_MAIN(fuzz_checkpoint)
