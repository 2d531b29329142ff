/* train.h — the training loop and evaluation over a resolved config. */
#ifndef CT_TRAIN_H
#define CT_TRAIN_H

#include "backend.h"
#include "config.h"

/* Trains per cfg: loads the model and data, resumes if asked (and if the
 * config lets the run continue exactly: resume_check.h), runs the optimizer
 * steps with periodic logging, eval and checkpoints, writes final/. A shard
 * of data.train_files or data.eval_files without a target token is
 * CT_ERR_INPUT; an update that leaves a weight non-finite stops the run
 * (CT_ERR_RUNTIME) without saving it. */
int train_run(const ct_config *cfg, ct_error *err);
/* `ctune train --dry-run`: loads the model and data, prints the memory plan
 * and exits (CT_ERR_INPUT when the plan does not fit); writes nothing. */
int train_dry_run(const ct_config *cfg, ct_error *err);
/* Mean loss and perplexity over data.eval_files for the base model plus the
 * adapter in adapter_dir (NULL: base only). No eval files, or a shard without
 * a target token, is CT_ERR_INPUT. */
int eval_run(const ct_config *cfg, const char *adapter_dir, ct_error *err);
/* Several ranks (dist.h) deal each step's micro-batches over them, so every
 * rank needs one: CT_ERR_INPUT naming the config when
 * training.gradient_accumulation_steps < world. */
int train_check_ranks(const ct_config *cfg, int world, ct_error *err);
/* The backend cfg->device asks for (auto: CUDA when a GPU is usable, else CPU);
 * gpu is the CUDA device ordinal (a rank's LOCAL_RANK). */
ct_backend *train_backend(const ct_config *cfg, int gpu, ct_error *err);

#endif
