/* checkpoint.h — run-directory checkpoints: OUTPUT_DIR/checkpoint-STEP/ holds the
 * PEFT adapter (adapter_model.safetensors + adapter_config.json), the trainer
 * state (trainer_state.safetensors: AdamW moments, step, data position; plus a
 * readable trainer_state.json) and manifest.json (each file's size and CRC32).
 * A checkpoint is written into checkpoint-STEP.tmp/, its manifest last, and
 * renamed into place only when complete: a crash never leaves a partial
 * checkpoint that looks valid, and never harms an older one. A checkpoint
 * whose manifest is missing or does not match its files is never resumed from. */
#ifndef CT_CHECKPOINT_H
#define CT_CHECKPOINT_H

#include <stdio.h>

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
 * save_total_limit (0 keeps all). On failure (e.g. a full disk) nothing in
 * output_dir changes and err says so (CT_ERR_RUNTIME). */
int checkpoint_save(const char *output_dir, const ct_lora *lo, const ct_model *m, const ct_trainer_state *st,
                    const char *base_model, int save_total_limit, ct_error *err);
/* Verifies DIR against its manifest, then loads adapter parameters, AdamW
 * moments and the state. A missing or mismatching manifest is CT_ERR_INPUT. */
int checkpoint_load(const char *dir, ct_lora *lo, const ct_model *m, ct_trainer_state *st, ct_error *err);
/* CT_OK when DIR/manifest.json exists and every file it lists has its size and
 * CRC32; else CT_ERR_INPUT naming the first file that does not match. */
int checkpoint_verify(const char *dir, ct_error *err);
/* Finds the verified checkpoint with the highest step in output_dir into path;
 * returns false when there is none. Each newer one it skips (missing or
 * mismatching manifest) gets a "note: skipping DIR: reason" line on notes
 * (may be NULL). */
bool checkpoint_find_latest(const char *output_dir, char *path, size_t len, FILE *notes);

/* Before step 1: creates output_dir and writes (and fsyncs) a probe file in it.
 * Fails with "output_dir DIR: ..." naming the folder: CT_ERR_INPUT when it
 * cannot be created or written, CT_ERR_RUNTIME when the disk is full. */
int checkpoint_probe_dir(const char *output_dir, ct_error *err);
/* Bytes one checkpoint of this adapter takes on disk (an estimate from above). */
size_t checkpoint_bytes(const ct_lora *lo);
/* CT_ERR_RUNTIME when output_dir's filesystem has less free space than one
 * checkpoint needs. */
int checkpoint_check_space(const char *output_dir, const ct_lora *lo, ct_error *err);

#endif
