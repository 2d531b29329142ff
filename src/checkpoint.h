/* checkpoint.h — run-directory checkpoints: OUTPUT_DIR/checkpoint-STEP/ holds the
 * PEFT adapter (adapter_model.safetensors + adapter_config.json) and the trainer
 * state (trainer_state.safetensors: AdamW moments, step, data position; plus a
 * readable trainer_state.json). A checkpoint is written into
 * checkpoint-STEP.tmp/ and renamed into place only when complete, so a crash
 * never leaves a partial checkpoint that looks valid, and never harms an older one. */
#ifndef CT_CHECKPOINT_H
#define CT_CHECKPOINT_H

#include "lora.h"
#include "packer.h"

typedef struct ct_trainer_state {
    int64_t step;             /* optimizer steps completed */
    int64_t total_steps;
    ct_data_pos data;         /* where the next micro-batch comes from */
    double tokens_seen;
    double elapsed;           /* seconds of training before this checkpoint */
} ct_trainer_state;

/* Writes checkpoint-STEP and then deletes the oldest checkpoints beyond
 * save_total_limit (0 keeps all). */
int checkpoint_save(const char *output_dir, const ct_lora *lo, const ct_model *m, const ct_trainer_state *st,
                    const char *base_model, int save_total_limit, ct_error *err);
/* Loads adapter parameters, AdamW moments and the state from a checkpoint folder. */
int checkpoint_load(const char *dir, ct_lora *lo, const ct_model *m, ct_trainer_state *st, ct_error *err);
/* Finds the complete checkpoint with the highest step in output_dir; returns
 * false when there is none. */
bool checkpoint_find_latest(const char *output_dir, char *path, size_t len);

#endif
