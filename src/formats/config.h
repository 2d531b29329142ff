/* config.h — the run configuration: a typed struct with defaults, read from YAML
 * (libyaml) and from `--set a.b=value` overrides, validated strictly.
 *
 * Key names follow TRL/PEFT/Axolotl (docs/ARCHITECTURE.md); configs/reference.yaml lists
 * every key with its default and a one-line comment. Errors are one line:
 * "FILE:LINE: what is wrong (expected ...)" (for --set: "--set KEY=VALUE: ...").
 * Unknown keys, wrong types, out-of-range and contradictory values are errors. */
#ifndef CT_CONFIG_H
#define CT_CONFIG_H

#include <stdio.h>
#include "common.h"

#define CT_MAX_FILES 256
#define CT_MAX_TARGETS 16
#define CT_PATH_MAX 1024
#define CT_CONFIG_MAX_BYTES ((size_t)1 << 20) /* a config larger than 1 MiB is not a config */
/* Deepest nesting of mappings and lists in a config (ours needs 3). libyaml's
 * scanner costs O(depth) per token, so a megabyte of '[' took minutes; deeper
 * input is refused while it is scanned, before the cost grows. */
#define CT_CONFIG_MAX_DEPTH 64
#define CT_CONFIG_KEYS 44                 /* keys in config.c's table */
#define CT_ORIGIN_MAX (CT_PATH_MAX + 32)  /* "FILE:LINE", or "--set KEY=VALUE" cut to 300 characters */

typedef enum { CT_SCHED_CONSTANT, CT_SCHED_LINEAR, CT_SCHED_COSINE } ct_sched_type;
typedef enum { CT_TRI_AUTO, CT_TRI_ON, CT_TRI_OFF } ct_tristate;
typedef enum { CT_RESUME_AUTO, CT_RESUME_FALSE, CT_RESUME_PATH } ct_resume_mode;
typedef enum { CT_DEVICE_AUTO, CT_DEVICE_CPU, CT_DEVICE_CUDA } ct_device;
/* model_quantization: quantize the base's linear weights on load (QLoRA) */
typedef enum { CT_MODEL_QUANT_NONE, CT_MODEL_QUANT_NF4, CT_MODEL_QUANT_FP4 } ct_model_quant;
/* base_precision: the frozen base as stored, or in FP8 (quantized on load) */
typedef enum { CT_BASE_AUTO, CT_BASE_FP8 } ct_base_precision;

typedef struct ct_lora_config {
    int r;                                  /* rank, >= 1 (default 16) */
    double lora_alpha;                      /* > 0 (default 32) */
    double lora_dropout;                    /* [0, 1) (default 0) */
    bool use_rslora;                        /* scaling alpha/sqrt(r) instead of alpha/r */
    /* "all-linear" is expanded to the 7 projection names; otherwise a subset of
     * q_proj k_proj v_proj o_proj gate_proj up_proj down_proj. */
    int n_target_modules;
    char target_modules[CT_MAX_TARGETS][32];
    bool target_all_linear;                 /* the config said "all-linear" */
    char init_lora_weights[16];             /* "true" (kaiming-uniform A, zero B) | "gaussian" */
} ct_lora_config;

typedef struct ct_data_config {
    int n_train_files;
    char train_files[CT_MAX_FILES][CT_PATH_MAX];   /* as written; dataset_open expands globs */
    int n_eval_files;
    char eval_files[CT_MAX_FILES][CT_PATH_MAX];
    int max_length;                 /* longest sample in tokens; longer ones are truncated */
    bool packing;                   /* false: one document per micro-batch */
    int tokens_per_micro_batch;     /* >= max_length when packing */
    int shuffle_window;             /* documents per best-fit-decreasing window (default 1024) */
} ct_data_config;

typedef struct ct_training_config {
    double learning_rate;
    ct_sched_type lr_scheduler_type;
    int warmup_steps;
    int max_steps;                  /* > 0 (wins over num_train_epochs, as in HF), or -1 (default): epochs decide */
    double num_train_epochs;        /* used when max_steps == -1 (default 1) */
    int gradient_accumulation_steps;
    double weight_decay;
    double adam_beta1, adam_beta2, adam_epsilon;
    double max_grad_norm;           /* 0 disables clipping */
    int max_nonfinite_steps;        /* stop after this many skipped (non-finite) steps in a row (default 10) */
    long long seed;
    int logging_steps;
    int eval_steps;                 /* 0 disables periodic eval */
    int save_steps;                 /* 0 disables periodic saves (final/ is always written) */
    int save_total_limit;           /* 0 keeps all checkpoints */
    ct_resume_mode resume_mode;
    char resume_from_checkpoint[CT_PATH_MAX]; /* when resume_mode == CT_RESUME_PATH */
    bool resume_allow_changes;      /* resume although keys the later steps depend on changed (resume_check.h) */
    bool router_aux_loss;           /* MoE: add the load-balancing loss x the model's router_aux_loss_coef */
} ct_training_config;

/* memory.checkpoint_layers: with checkpointing, recompute every layer in backward,
 * or only the fewest (from layer 0) that the memory plan needs to fit. */
typedef enum { CT_CKPT_ALL, CT_CKPT_AUTO } ct_checkpoint_layers;

typedef struct ct_memory_config {
    bool gradient_checkpointing;
    ct_checkpoint_layers checkpoint_layers;
    ct_tristate activation_offload;
    int offload_buffers;       /* device staging buffers for offloaded inputs: 2 overlaps copies (default), 1 saves one */
    double gpu_memory_limit;   /* GiB of GPU memory the run may hold, the plan keeping within it; 0: what is free */
} ct_memory_config;

/* Several ranks (dist.h): how long a rank waits on another before it stops the run. */
typedef struct ct_distributed_config {
    double timeout_seconds;
} ct_distributed_config;

typedef struct ct_config {
    char source_path[CT_PATH_MAX];  /* the YAML file it was read from ("" if none) */
    char model[CT_PATH_MAX];        /* HF model folder */
    char output_dir[CT_PATH_MAX];
    ct_device device;               /* auto | cpu | cuda */
    ct_model_quant model_quantization; /* none (as stored) | nf4 | fp4 */
    ct_base_precision base_precision;  /* auto (as stored) | fp8 */
    bool bnb_4bit_use_double_quant; /* with model_quantization: the absmax in 8 bits, as bitsandbytes' double quant */
    ct_lora_config lora;
    ct_data_config data;
    ct_training_config training;
    ct_memory_config memory;
    ct_distributed_config distributed;
    /* Where each key's value came from, by its place in config.c's key table:
     * "FILE:LINE" or "--set KEY=VALUE"; "" while it holds its default (read it
     * with config_origin). Errors that name a key start with it. */
    char origin[CT_CONFIG_KEYS][CT_ORIGIN_MAX];
} ct_config;

/* Fills cfg with every default (the values configs/reference.yaml shows). */
void config_defaults(ct_config *cfg);

/* Fills cfg with the defaults, then reads PATH over them and records PATH in
 * source_path. Relative paths inside the file (model, output_dir, data files) are
 * kept as written (relative to the working folder). Returns CT_OK, or
 * CT_ERR_INPUT with "PATH:LINE: ..." in err and cfg left untouched. An empty
 * file is valid (all defaults); config_validate then asks for model/output_dir.
 * Nesting deeper than CT_CONFIG_MAX_DEPTH and a NUL character inside a key or
 * a value are input errors. */
int config_load(ct_config *cfg, const char *path, ct_error *err);

/* config_load on text[0..len) already in memory (need not be NUL-terminated);
 * PATH names it in errors and becomes source_path. For tests and fuzzing. */
int config_parse_text(ct_config *cfg, const char *text, size_t len, const char *path, ct_error *err);

/* Applies one "a.b=value" override with the same parsing and validation as the
 * file (value is read as a YAML scalar or flow sequence, e.g. "[q_proj,v_proj]";
 * an empty value is null, which clears a file list). On error cfg is untouched
 * and err reads "--set a.b=value: ..."; a control character (a newline, a tab)
 * in the key or the value is such an error. */
int config_set(ct_config *cfg, const char *assignment, ct_error *err);

/* Cross-field checks (e.g. max_length <= tokens_per_micro_batch, warmup <= max_steps),
 * required keys, and every per-key range again (for structs built in code), run
 * once after the file and all overrides are applied. Errors start with where the
 * value of the key they name came from ("FILE:LINE: " or "--set KEY=VALUE: "),
 * and name where the other key of a contradiction came from when elsewhere; a
 * key at its default gives "SOURCE_PATH: " ("config: " without a source file). */
int config_validate(const ct_config *cfg, ct_error *err);

/* Where KEY's value came from ("FILE:LINE" or "--set KEY=VALUE"), or NULL when
 * KEY holds its default or is not a key. The string lives in cfg. */
const char *config_origin(const ct_config *cfg, const char *key);

/* The run's optimizer steps, into *steps: training.max_steps when set (> 0; it
 * wins over num_train_epochs, as in HF), else ceil(num_train_epochs x
 * micro_batches_per_epoch / gradient_accumulation_steps), at least 1. Computed
 * in floating point, so no count can overflow: CT_ERR_INPUT naming the key and
 * where it was set when the steps exceed INT_MAX, or when training.warmup_steps
 * exceeds them. *steps is written only on success. */
int config_total_steps(const ct_config *cfg, size_t micro_batches_per_epoch, int *steps, ct_error *err);

/* Writes every key of the resolved config as YAML that config_load reads back to
 * the same struct (source_path aside); doubles in shortest round-trip form. */
void config_print(const ct_config *cfg, FILE *out);

/* The PEFT scaling for this config: alpha/r, or alpha/sqrt(r) with rsLoRA. */
double config_lora_scaling(const ct_lora_config *lora);

/* The projection name lora.target_modules keeps for a module name: Mixtral's
 * expert names w1 / w3 / w2 (as PEFT and Axolotl configs list them) stand for
 * gate_proj / up_proj / down_proj; any other name is returned as it is. */
const char *config_canonical_module(const char *name);

#endif
