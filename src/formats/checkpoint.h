/* checkpoint.h — run-directory checkpoints: OUTPUT_DIR/checkpoint-STEP/ holds the
 * PEFT adapter (adapter_model.safetensors + adapter_config.json), the trainer
 * state (trainer_state.safetensors: AdamW moments, step, data position, the
 * logging window and the non-finite guard; plus a readable trainer_state.json),
 * the run's resolved config (run_config.yaml, what resume compares against) and
 * manifest.json (each file's size and CRC32).
 * A checkpoint is written into checkpoint-STEP.tmp/, its manifest last, and
 * renamed into place only when complete: a crash never leaves a partial
 * checkpoint that looks valid, and never harms an older one. A checkpoint
 * whose manifest is missing or does not match its files is never resumed from,
 * and neither is one whose counters are out of range or whose weights or
 * moments are not finite (CT_ERR_INPUT naming the field or tensor and file). */
#ifndef CT_CHECKPOINT_H
#define CT_CHECKPOINT_H

#include <stdio.h>

#include "lora.h"
#include "optim.h"
#include "packer.h"

/* What the trainer had summed since its last metrics record when the
 * checkpoint was taken, so that a resumed run logs the records (one per
 * logged step) an uninterrupted one does. */
typedef struct ct_log_window {
    float loss_sum, aux_sum;  /* the backend accumulators of loss and router aux loss, as they stood */
    double loss;              /* loss moved to the host by an eval inside the window */
    double targets, tokens;   /* target and input tokens of the window's steps */
    int64_t micro_batches;
} ct_log_window;

typedef struct ct_trainer_state {
    int64_t step;             /* optimizer steps completed */
    int64_t total_steps;
    ct_data_pos data;         /* where the next micro-batch comes from */
    double tokens_seen;
    double elapsed;           /* seconds of training before this checkpoint */
    /* false for a checkpoint written before these were saved: its window
     * starts empty and its data is not compared */
    bool has_run_state;
    uint32_t data_crc32;      /* dataset_crc32 of the training data */
    ct_log_window window;
    ct_guard_state guard;
} ct_trainer_state;

/* Writes checkpoint-STEP (run_config: the resolved config as config_print
 * writes it, kept as run_config.yaml) and then deletes the oldest checkpoints
 * beyond save_total_limit (0 keeps all). Adapter and moments are checked
 * first: a non-finite value is never saved (CT_ERR_RUNTIME naming the tensor).
 * On failure (e.g. a full disk) nothing in output_dir changes and err says so
 * (CT_ERR_RUNTIME). */
int checkpoint_save(const char *output_dir, const ct_lora *lo, const ct_model *m, const ct_trainer_state *st,
                    const char *run_config, const char *base_model, int save_total_limit, ct_error *err);
/* Verifies DIR against its manifest and reads its trainer state (not the
 * moments). Every counter is range-checked; one that is not in range is
 * CT_ERR_INPUT naming the field and the file. */
int checkpoint_read_state(const char *dir, ct_trainer_state *st, ct_error *err);
/* After checkpoint_read_state on DIR: loads the adapter parameters and the
 * AdamW moments into lo. A tensor of the wrong shape, a non-finite value or a
 * negative exp_avg_sq is CT_ERR_INPUT naming the tensor and the file. */
int checkpoint_load_weights(const char *dir, ct_lora *lo, const ct_model *m, ct_error *err);
/* CT_OK when DIR/manifest.json exists and every file it lists has its size and
 * CRC32; else CT_ERR_INPUT naming DIR when it does not exist or the first file
 * that does not match. */
int checkpoint_verify(const char *dir, ct_error *err);
/* Finds the verified checkpoint with the highest step in output_dir into path;
 * returns false when there is none. Each newer one it skips (missing or
 * mismatching manifest) gets a "note: skipping DIR: reason" line on notes
 * (may be NULL). */
bool checkpoint_find_latest(const char *output_dir, char *path, size_t len, FILE *notes);
/* Removes what a kill leaves in output_dir: checkpoint-STEP.tmp/ (a save cut
 * short) and checkpoint-STEP.deleting/ (a rotation cut short), each named in
 * a "note: removed ..." line on notes (may be NULL). Call before training. */
void checkpoint_clean_stale(const char *output_dir, FILE *notes);

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
