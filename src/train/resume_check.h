/* resume_check.h — may a run continue from a checkpoint under the config it is
 * started with now? Resume promises the steps an uninterrupted run would have
 * taken, so the config the checkpoint's run had (its run_config.yaml) is
 * compared with the new one, key by key, as config_print writes both:
 *  - the adapter's shape (lora.r, lora.target_modules): never, the checkpoint
 *    could not even be loaded;
 *  - what the math of later steps depends on (model, the other lora keys, the
 *    data and its packing, tokens per micro-batch, accumulation, seed, the
 *    optimizer and the schedule): refused, unless the config says
 *    training.resume_allow_changes: true;
 *  - the rest (logging, eval and save steps, output limits, device, memory
 *    options, eval files): reported only.
 * The training data is compared by content (dataset_crc32 in the trainer
 * state), not by the paths that name it: moved shards are the same data, and
 * shards rewritten in place are not. The schedule's length is compared as
 * the step count it gives: max_steps and num_train_epochs may change as long
 * as it does not, or when the learning rate is constant. */
#ifndef CT_RESUME_CHECK_H
#define CT_RESUME_CHECK_H

#include <stdio.h>

#include "config.h"
#include "shard.h"

typedef struct ct_resume_facts {
    const char *checkpoint;     /* the folder, named in messages */
    const char *saved_config;   /* the config its run printed (config_print), or NULL when none was kept */
    const char *saved_from;     /* the file saved_config was read from */
    long long saved_total_steps, total_steps; /* the schedule's length then and now */
    bool has_data_crc;          /* false for checkpoints older than the data CRC */
    uint32_t saved_data_crc, data_crc;
} ct_resume_facts;

/* Compares as above. Writes one "resume: KEY changed OLD -> NEW" line per
 * changed key to notes, and returns CT_OK, or CT_ERR_INPUT with one line
 * naming the checkpoint and every key that cannot change. new_config is
 * config_print's text of cfg (training.resume_allow_changes is read from it by
 * name, so that this file needs nothing from config.c but the key). */
int resume_check(const ct_config *cfg, const char *new_config, const ct_resume_facts *f, FILE *notes,
                 ct_error *err);

/* CRC32 over each shard's payload CRC, document and token counts, in order:
 * the identity of a dataset's contents, whatever its paths. */
uint32_t dataset_crc32(const ct_dataset *ds);

#endif
