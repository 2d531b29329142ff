/* train.h — the training loop and evaluation over a resolved config. */
#ifndef CT_TRAIN_H
#define CT_TRAIN_H

#include "backend.h"
#include "config.h"

/* Trains per cfg: loads the model and data, resumes if asked, runs the
 * optimizer steps with periodic logging, eval and checkpoints, writes final/. */
int train_run(const ct_config *cfg, ct_error *err);
/* `ctune train --dry-run`: loads the model and data, prints the memory plan
 * and exits (CT_ERR_INPUT when the plan does not fit); writes nothing. */
int train_dry_run(const ct_config *cfg, ct_error *err);
/* Mean loss and perplexity over data.eval_files (or train_files when there are
 * none) for the base model plus the adapter in adapter_dir (NULL: base only). */
int eval_run(const ct_config *cfg, const char *adapter_dir, ct_error *err);
/* The backend cfg->device asks for (auto: CUDA when a GPU is usable, else CPU). */
ct_backend *train_backend(const ct_config *cfg, ct_error *err);

#endif
