/* config.c — see config.h.
 *
 * One table (keys[]) describes every key: its dotted name, its kind, where it
 * lives in ct_config, its range and the "expected ..." text of its errors. The
 * YAML reader, --set, the per-field checks of config_validate and config_print
 * all walk that table, so a key added there is read, checked and printed alike.
 *
 * YAML is read with libyaml's document API: the whole tree is small, and nodes
 * carry their start marks, which gives every error its line. libyaml does not
 * reject duplicate keys, so the mapping walk does. Scalars are read by their
 * text, not by YAML 1.1 tags: `on`/`off` are tristate words here, not booleans.
 *
 * Before the tree is built, one pass over the parser's events refuses nesting
 * deeper than CT_CONFIG_MAX_DEPTH. libyaml's scanner checks every open flow
 * level for a stale simple key on every token, which is quadratic in depth
 * (80,000 levels of '[' took 21 s, a megabyte would take an hour); the event
 * pass stops at level 65, when the scanner has looked at most 1024 characters
 * ahead (the 80,000-deep file now fails in under a millisecond). Each key keeps where its value came from
 * (cfg->origin), so that config_validate blames the file line or the --set that
 * set it. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

typedef enum {
    K_PATH,    /* char[CT_PATH_MAX] */
    K_INT,     /* int */
    K_I64,     /* long long */
    K_FLOAT,   /* double */
    K_BOOL,    /* bool */
    K_ENUM,    /* an int-sized enum, value = index into names */
    K_INIT,    /* lora.init_lora_weights: a word from names, stored as text */
    K_TARGETS, /* lora.target_modules */
    K_FILES,   /* int count at off, char[CT_MAX_FILES][CT_PATH_MAX] at off2 */
    K_RESUME,  /* training.resume_from_checkpoint */
} key_kind;

enum { LO_OPEN = 1, HI_OPEN = 2, NOT_ZERO = 4 };

typedef struct key_spec {
    const char *name;        /* dotted: "lora.r" */
    key_kind kind;
    size_t off, off2;
    long long ilo, ihi;      /* K_INT, K_I64 */
    double flo, fhi;         /* K_FLOAT */
    unsigned flags;
    const char *const *names; /* K_ENUM, K_INIT */
    const char *expect;
} key_spec;

_Static_assert(sizeof(ct_sched_type) == sizeof(int) && sizeof(ct_tristate) == sizeof(int) &&
               sizeof(ct_device) == sizeof(int) && sizeof(ct_model_quant) == sizeof(int) && sizeof(ct_checkpoint_layers) == sizeof(int) &&
               sizeof(ct_base_precision) == sizeof(int),
               "K_ENUM stores enums through an int");

static const char *const sched_names[] = { "constant", "linear", "cosine", NULL };
static const char *const device_names[] = { "auto", "cpu", "cuda", NULL };
static const char *const quant_names[] = { "none", "nf4", "fp4", NULL };
static const char *const base_precision_names[] = { "auto", "fp8", NULL };
static const char *const tri_names[] = { "auto", "on", "off", NULL };
static const char *const ckpt_layer_names[] = { "all", "auto", NULL };
static const char *const init_names[] = { "true", "gaussian", NULL };
/* The first N_ALL_LINEAR are what all-linear lists (every family has them); the
 * Gated DeltaNet projections after them are taken by all-linear too where the
 * model has them (lora_init: target_all_linear). */
static const char *const linear_names[] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "in_proj_qkvz", "in_proj_ba", "out_proj",
    "shared_expert_gate", NULL };
#define N_ALL_LINEAR 7
#define LINEAR_LIST "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (Gated DeltaNet layers: " \
                    "in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj, or qwen3_next's in_proj_qkvz, " \
                    "in_proj_ba, out_proj; the MoE hybrids: shared_expert_gate)"

#define OFF(f) offsetof(ct_config, f)
#define PATHK(k, f, e)            { .name = k, .kind = K_PATH, .off = OFF(f), .expect = e }
#define INTK(k, f, lo, hi, fl, e) \
    { .name = k, .kind = K_INT, .off = OFF(f), .ilo = lo, .ihi = hi, .flags = fl, .expect = e }
#define FLTK(k, f, lo, hi, fl, e) \
    { .name = k, .kind = K_FLOAT, .off = OFF(f), .flo = lo, .fhi = hi, .flags = fl, .expect = e }
#define BOOLK(k, f)               { .name = k, .kind = K_BOOL, .off = OFF(f), .expect = "true or false" }
#define ENUMK(k, f, n, e)         { .name = k, .kind = K_ENUM, .off = OFF(f), .names = n, .expect = e }

static const key_spec keys[] = {
    PATHK("model", model, "a Hugging Face model folder"),
    PATHK("output_dir", output_dir, "a folder for checkpoints and logs"),
    ENUMK("device", device, device_names, "auto, cpu or cuda"),
    ENUMK("model_quantization", model_quantization, quant_names, "none, nf4 or fp4"),
    BOOLK("bnb_4bit_use_double_quant", bnb_4bit_use_double_quant),
    ENUMK("base_precision", base_precision, base_precision_names, "auto or fp8"),
    INTK("lora.r", lora.r, 1, 4096, 0, "an integer in [1, 4096]"),
    FLTK("lora.lora_alpha", lora.lora_alpha, 0, INFINITY, LO_OPEN, "a number > 0"),
    FLTK("lora.lora_dropout", lora.lora_dropout, 0, 1, HI_OPEN, "a number in [0, 1)"),
    BOOLK("lora.use_rslora", lora.use_rslora),
    { .name = "lora.target_modules", .kind = K_TARGETS, .off = OFF(lora),
      .expect = "all-linear or a list of " LINEAR_LIST },
    { .name = "lora.init_lora_weights", .kind = K_INIT, .off = OFF(lora.init_lora_weights),
      .names = init_names, .expect = "true or gaussian" },
    { .name = "data.train_files", .kind = K_FILES, .off = OFF(data.n_train_files),
      .off2 = OFF(data.train_files), .expect = "a shard path or glob, or a list of them" },
    { .name = "data.eval_files", .kind = K_FILES, .off = OFF(data.n_eval_files),
      .off2 = OFF(data.eval_files), .expect = "a shard path or glob, or a list of them" },
    INTK("data.max_length", data.max_length, 1, INT_MAX, 0, "an integer >= 1"),
    BOOLK("data.packing", data.packing),
    INTK("data.tokens_per_micro_batch", data.tokens_per_micro_batch, 1, INT_MAX, 0, "an integer >= 1"),
    INTK("data.shuffle_window", data.shuffle_window, 1, INT_MAX, 0, "an integer >= 1"),
    FLTK("training.learning_rate", training.learning_rate, 0, INFINITY, LO_OPEN, "a number > 0"),
    ENUMK("training.lr_scheduler_type", training.lr_scheduler_type, sched_names, "constant, linear or cosine"),
    INTK("training.warmup_steps", training.warmup_steps, 0, INT_MAX, 0, "an integer >= 0"),
    INTK("training.max_steps", training.max_steps, -1, INT_MAX, NOT_ZERO,
         "-1 (use num_train_epochs) or an integer >= 1"),
    FLTK("training.num_train_epochs", training.num_train_epochs, 0, INFINITY, LO_OPEN, "a number > 0"),
    /* the trainer keeps 2 x this many micro-batches loaded ahead: bounded, so that count fits an int */
    INTK("training.gradient_accumulation_steps", training.gradient_accumulation_steps, 1, 65536, 0,
         "an integer in [1, 65536]"),
    FLTK("training.weight_decay", training.weight_decay, 0, INFINITY, 0, "a number >= 0"),
    FLTK("training.adam_beta1", training.adam_beta1, 0, 1, HI_OPEN, "a number in [0, 1)"),
    FLTK("training.adam_beta2", training.adam_beta2, 0, 1, HI_OPEN, "a number in [0, 1)"),
    FLTK("training.adam_epsilon", training.adam_epsilon, 0, INFINITY, LO_OPEN, "a number > 0"),
    FLTK("training.max_grad_norm", training.max_grad_norm, 0, INFINITY, 0, "a number >= 0 (0 disables clipping)"),
    INTK("training.max_nonfinite_steps", training.max_nonfinite_steps, 1, INT_MAX, 0, "an integer >= 1"),
    { .name = "training.seed", .kind = K_I64, .off = OFF(training.seed), .ilo = 0, .ihi = LLONG_MAX,
      .expect = "an integer >= 0" },
    INTK("training.logging_steps", training.logging_steps, 1, INT_MAX, 0, "an integer >= 1"),
    INTK("training.eval_steps", training.eval_steps, 0, INT_MAX, 0, "an integer >= 0 (0 disables eval)"),
    INTK("training.save_steps", training.save_steps, 0, INT_MAX, 0, "an integer >= 0 (0 disables saves)"),
    INTK("training.save_total_limit", training.save_total_limit, 0, INT_MAX, 0, "an integer >= 0 (0 keeps all)"),
    { .name = "training.resume_from_checkpoint", .kind = K_RESUME, .off = OFF(training),
      .expect = "auto, false or a checkpoint folder" },
    BOOLK("training.resume_allow_changes", training.resume_allow_changes),
    BOOLK("training.router_aux_loss", training.router_aux_loss),
    BOOLK("memory.gradient_checkpointing", memory.gradient_checkpointing),
    ENUMK("memory.checkpoint_layers", memory.checkpoint_layers, ckpt_layer_names, "all or auto"),
    ENUMK("memory.activation_offload", memory.activation_offload, tri_names, "auto, on or off"),
    INTK("memory.offload_buffers", memory.offload_buffers, 1, 2, 0, "1 or 2"),
    /* bounded so that the bytes fit a size_t */
    FLTK("memory.gpu_memory_limit", memory.gpu_memory_limit, 0, 1048576, 0, "a number of GiB in [0, 1048576] (0: no limit)"),
    FLTK("distributed.timeout_seconds", distributed.timeout_seconds, 0, INFINITY, LO_OPEN, "a number of seconds > 0"),
};
#define N_KEYS (sizeof keys / sizeof keys[0])
_Static_assert(N_KEYS == CT_CONFIG_KEYS, "CT_CONFIG_KEYS in config.h counts the keys of this table");

static const char *const sections[] = { "lora", "data", "training", "memory", "distributed", NULL };

/* Names users bring from Axolotl, TRL and PEFT that no edit distance would reach. */
static const char *const aliases[][2] = {
    { "rank", "lora.r" }, { "lora_r", "lora.r" }, { "alpha", "lora.lora_alpha" },
    { "dropout", "lora.lora_dropout" }, { "lora_target_modules", "lora.target_modules" },
    { "gpu_memory_limit", "memory.gpu_memory_limit" }, { "base_model", "model" }, { "model_name_or_path", "model" },
    { "lr", "training.learning_rate" }, { "epochs", "training.num_train_epochs" },
    { "num_epochs", "training.num_train_epochs" }, { "lr_scheduler", "training.lr_scheduler_type" },
    { "warmup", "training.warmup_steps" }, { "gradient_accumulation", "training.gradient_accumulation_steps" },
    { "sequence_len", "data.max_length" }, { "max_seq_length", "data.max_length" },
    { "micro_batch_size", "data.tokens_per_micro_batch" }, { "batch_size", "data.tokens_per_micro_batch" },
    { "datasets", "data.train_files" },
    { "load_in_4bit", "model_quantization" }, { "bnb_4bit_quant_type", "model_quantization" },
    { "quantization", "model_quantization" }, { "use_bnb_nested_quant", "bnb_4bit_use_double_quant" },
    { "fp8", "base_precision" }, { "load_in_fp8", "base_precision" }, { "base_dtype", "base_precision" },
};

void config_defaults(ct_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->device = CT_DEVICE_AUTO;
    cfg->model_quantization = CT_MODEL_QUANT_NONE;
    cfg->bnb_4bit_use_double_quant = true;
    ct_lora_config *l = &cfg->lora;
    l->r = 16;
    l->lora_alpha = 32;
    l->lora_dropout = 0;
    l->use_rslora = false;
    for (int i = 0; i < N_ALL_LINEAR; i++) strcpy(l->target_modules[l->n_target_modules++], linear_names[i]);
    l->target_all_linear = true;
    strcpy(l->init_lora_weights, "true");
    ct_data_config *d = &cfg->data;
    d->max_length = 4096;
    d->packing = true;
    d->tokens_per_micro_batch = 16384;
    d->shuffle_window = 1024;
    ct_training_config *t = &cfg->training;
    t->learning_rate = 2e-4;
    t->lr_scheduler_type = CT_SCHED_COSINE;
    t->warmup_steps = 10;
    t->max_steps = -1;
    t->num_train_epochs = 1;
    t->gradient_accumulation_steps = 1;
    t->weight_decay = 0;
    t->adam_beta1 = 0.9;
    t->adam_beta2 = 0.999;
    t->adam_epsilon = 1e-8;
    t->max_grad_norm = 1.0;
    t->max_nonfinite_steps = 10;
    t->seed = 42;
    t->logging_steps = 10;
    t->eval_steps = 100;
    t->save_steps = 200;
    t->save_total_limit = 3;
    t->resume_mode = CT_RESUME_AUTO;
    cfg->memory.gradient_checkpointing = true;
    cfg->memory.checkpoint_layers = CT_CKPT_ALL;
    cfg->memory.activation_offload = CT_TRI_AUTO;
    cfg->memory.offload_buffers = 2;
    cfg->distributed.timeout_seconds = 600;
}

const char *config_canonical_module(const char *name)
{
    if (!strcmp(name, "w1")) return "gate_proj";
    if (!strcmp(name, "w3")) return "up_proj";
    if (!strcmp(name, "w2")) return "down_proj";
    return name;
}

double config_lora_scaling(const ct_lora_config *lora)
{
    return lora->use_rslora ? lora->lora_alpha / sqrt((double)lora->r) : lora->lora_alpha / lora->r;
}

// ---- where errors point ----

/* A file error reads "PATH:LINE: ..."; an override error "--set KEY=VALUE: ...". */
typedef struct src {
    const char *path;     /* NULL for --set */
    const char *set_text;
    yaml_document_t *doc;
} src;

__attribute__((format(printf, 4, 5)))
static int fail_at(const src *s, const yaml_node_t *node, ct_error *err, const char *fmt, ...)
{
    char body[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    if (s->set_text) return CT_FAIL_INPUT(err, "--set %s: %s", s->set_text, body);
    return CT_FAIL_INPUT(err, "%s:%zu: %s", s->path, node ? node->start_mark.line + 1 : 1, body);
}

static const char *scalar(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

/* A double-quoted "\0" puts a NUL inside a scalar; C would read the text before it. */
static bool has_nul(const yaml_node_t *n) { return strlen(scalar(n)) != n->data.scalar.length; }

/* Messages are one line: control characters that came from the input (a
 * newline inside a quoted value, a tab in a path) are written as \xNN. */
static int one_line(ct_error *err, int rc)
{
    if (rc == CT_OK || !err) return rc;
    char out[sizeof err->msg];
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)err->msg; *p && o + 5 < sizeof out; p++) {
        if (*p < 0x20 || *p == 0x7f) o += (size_t)snprintf(out + o, sizeof out - o, "\\x%02x", *p);
        else out[o++] = (char)*p;
    }
    out[o] = '\0';
    memcpy(err->msg, out, o + 1);
    return rc;
}

static bool is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *v = scalar(n);
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

static const char *node_kind(const yaml_node_t *n)
{
    return n->type == YAML_MAPPING_NODE ? "a mapping" : n->type == YAML_SEQUENCE_NODE ? "a list" : "a scalar";
}

// ---- unknown keys ----

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return SIZE_MAX;
    size_t row[65];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static const char *leaf_of(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

/* The known key a user most likely meant by FULL (leaf LEAF), or NULL: the same
 * leaf in another section, a name from another tool, then edit distance <= 2. */
static const char *suggest(const char *full, const char *leaf)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(leaf_of(keys[i].name), leaf)) return keys[i].name;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(aliases[i][0], leaf)) return aliases[i][1];
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < N_KEYS; i++) {
        size_t d = edit_distance(full, keys[i].name);
        if (d < best_d) { best_d = d; best = keys[i].name; }
    }
    if (!strchr(full, '.'))
        for (int i = 0; sections[i]; i++) {
            size_t d = edit_distance(full, sections[i]);
            if (d < best_d) { best_d = d; best = sections[i]; }
        }
    return best;
}

static int fail_unknown(const src *s, const yaml_node_t *node, ct_error *err, const char *full, const char *leaf)
{
    const char *hint = suggest(full, leaf);
    if (hint && !strcmp(hint, full))
        return fail_at(s, node, err, "unknown key '%s' (write it nested: '%.*s:' then '%s:' indented under it)",
                       full, (int)(leaf - full - 1), full, leaf);
    if (hint) return fail_at(s, node, err, "unknown key '%s' (did you mean '%s'?)", full, hint);
    return fail_at(s, node, err, "unknown key '%s' (expected a key listed in configs/reference.yaml)", full);
}

static const key_spec *find_key(const char *name)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].name, name)) return &keys[i];
    return NULL;
}

// ---- values ----

static bool parse_ll(const char *v, long long *out, bool *overflow)
{
    const char *p = v + (*v == '+' || *v == '-');
    if (!*p) return false;
    for (; *p; p++) if (!isdigit((unsigned char)*p)) return false;
    errno = 0;
    *out = strtoll(v, NULL, 10);
    *overflow = errno == ERANGE;
    return true;
}

/* Decimal only: strtod alone would also take hex, "nan" and "inf". */
static bool parse_double(const char *v, double *out)
{
    if (!*v) return false;
    for (const char *p = v; *p; p++)
        if (!isdigit((unsigned char)*p) && !strchr("+-.eE", *p)) return false;
    char *end;
    *out = strtod(v, &end);
    return *end == '\0' && end != v && isfinite(*out);
}

static bool in_int_range(const key_spec *k, long long v)
{
    return v >= k->ilo && v <= k->ihi && !((k->flags & NOT_ZERO) && v == 0);
}

static bool in_float_range(const key_spec *k, double v)
{
    bool lo = (k->flags & LO_OPEN) ? v > k->flo : v >= k->flo;
    bool hi = (k->flags & HI_OPEN) ? v < k->fhi : v <= k->fhi;
    return isfinite(v) && lo && hi;
}

static int word_index(const char *const *names, const char *v)
{
    for (int i = 0; names[i]; i++) if (!strcmp(names[i], v)) return i;
    return -1;
}

static int set_path(const src *s, const yaml_node_t *n, ct_error *err, const char *name, char *dst)
{
    size_t len = n->data.scalar.length;
    if (len >= CT_PATH_MAX)
        return fail_at(s, n, err, "%s: %zu characters is too long (expected at most %d)", name, len, CT_PATH_MAX - 1);
    if (strlen(scalar(n)) != len) return fail_at(s, n, err, "%s: contains a NUL character", name);
    memcpy(dst, scalar(n), len + 1);
    return CT_OK;
}

static int set_files(const src *s, const key_spec *k, const yaml_node_t *n, ct_config *cfg, ct_error *err)
{
    int *count = (int *)((char *)cfg + k->off);
    char (*files)[CT_PATH_MAX] = (char (*)[CT_PATH_MAX])((char *)cfg + k->off2);
    *count = 0;
    if (is_null(n)) return CT_OK;
    if (n->type == YAML_SCALAR_NODE) {
        /* a quoted "" or an empty block scalar: empty like a list entry, not null */
        if (!n->data.scalar.length) return fail_at(s, n, err, "%s: empty (expected %s)", k->name, k->expect);
        *count = 1;
        return set_path(s, n, err, k->name, files[0]);
    }
    if (n->type != YAML_SEQUENCE_NODE) return fail_at(s, n, err, "%s: got a mapping (expected %s)", k->name, k->expect);
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
        yaml_node_t *item = yaml_document_get_node(s->doc, *it);
        if (*count == CT_MAX_FILES)
            return fail_at(s, item, err, "%s: more than %d entries (expected a glob such as data/train-*.shard)",
                           k->name, CT_MAX_FILES);
        if (item->type != YAML_SCALAR_NODE || !item->data.scalar.length)
            return fail_at(s, item, err, "%s: entry %d is %s (expected a shard path or glob)", k->name, *count + 1,
                           item->type == YAML_SCALAR_NODE ? "empty" : node_kind(item));
        int rc = set_path(s, item, err, k->name, files[*count]);
        if (rc) return rc;
        (*count)++;
    }
    return CT_OK;
}

static int set_targets(const src *s, const key_spec *k, const yaml_node_t *n, ct_lora_config *l, ct_error *err)
{
    if (n->type == YAML_SCALAR_NODE) {
        if (has_nul(n)) return fail_at(s, n, err, "%s: the value holds a NUL character (expected %s)", k->name, k->expect);
        if (strcmp(scalar(n), "all-linear"))
            return fail_at(s, n, err, "%s: '%s' is not all-linear (expected %s)", k->name, scalar(n), k->expect);
        l->n_target_modules = 0;
        for (int i = 0; i < N_ALL_LINEAR; i++) strcpy(l->target_modules[l->n_target_modules++], linear_names[i]);
        l->target_all_linear = true;
        return CT_OK;
    }
    if (n->type != YAML_SEQUENCE_NODE) return fail_at(s, n, err, "%s: got a mapping (expected %s)", k->name, k->expect);
    if (n->data.sequence.items.start == n->data.sequence.items.top)
        return fail_at(s, n, err, "%s: empty list (expected %s)", k->name, k->expect);
    l->n_target_modules = 0;
    l->target_all_linear = false;
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
        yaml_node_t *item = yaml_document_get_node(s->doc, *it);
        if (item->type != YAML_SCALAR_NODE || has_nul(item))
            return fail_at(s, item, err, "%s: an entry %s (expected one of %s)", k->name,
                           item->type == YAML_SCALAR_NODE ? "holds a NUL character" :
                           item->type == YAML_MAPPING_NODE ? "is a mapping" : "is a list", LINEAR_LIST);
        const char *v = config_canonical_module(scalar(item));
        if (word_index(linear_names, v) < 0)
            return fail_at(s, item, err, "%s: unknown module '%s' (expected one of %s; Mixtral's w1, w3, w2 stand "
                           "for gate_proj, up_proj, down_proj)", k->name, v, LINEAR_LIST);
        for (int i = 0; i < l->n_target_modules; i++)
            if (!strcmp(l->target_modules[i], v))
                return fail_at(s, item, err, "%s: '%s' is listed twice (expected each module once)", k->name, v);
        strcpy(l->target_modules[l->n_target_modules++], v);
    }
    return CT_OK;
}

/* Applies node N to key K of cfg, checking type and range. */
static int set_value(const src *s, const key_spec *k, const yaml_node_t *n, ct_config *cfg, ct_error *err)
{
    void *field = (char *)cfg + k->off;
    if (k->kind == K_FILES) return set_files(s, k, n, cfg, err);
    if (k->kind == K_TARGETS) return set_targets(s, k, n, field, err);
    if (n->type != YAML_SCALAR_NODE)
        return fail_at(s, n, err, "%s: got %s (expected %s)", k->name, node_kind(n), k->expect);
    if (is_null(n)) return fail_at(s, n, err, "%s: no value (expected %s)", k->name, k->expect);
    if (has_nul(n)) return fail_at(s, n, err, "%s: the value holds a NUL character (expected %s)", k->name, k->expect);
    const char *v = scalar(n);
    switch (k->kind) {
    case K_PATH:
        return set_path(s, n, err, k->name, field);
    case K_INT: case K_I64: {
        long long x;
        bool overflow;
        if (!parse_ll(v, &x, &overflow))
            return fail_at(s, n, err, "%s: '%s' is not an integer (expected %s)", k->name, v, k->expect);
        if (overflow || !in_int_range(k, x))
            return fail_at(s, n, err, "%s: %s is out of range (expected %s)", k->name, v, k->expect);
        if (k->kind == K_INT) *(int *)field = (int)x;
        else *(long long *)field = x;
        return CT_OK;
    }
    case K_FLOAT: {
        double x;
        if (!parse_double(v, &x))
            return fail_at(s, n, err, "%s: '%s' is not a number (expected %s)", k->name, v, k->expect);
        if (!in_float_range(k, x))
            return fail_at(s, n, err, "%s: %s is out of range (expected %s)", k->name, v, k->expect);
        *(double *)field = x;
        return CT_OK;
    }
    case K_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "TRUE")) *(bool *)field = true;
        else if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "FALSE")) *(bool *)field = false;
        else return fail_at(s, n, err, "%s: '%s' is not a boolean (expected %s)", k->name, v, k->expect);
        return CT_OK;
    case K_ENUM: case K_INIT: {
        int i = word_index(k->names, v);
        if (i < 0) return fail_at(s, n, err, "%s: '%s' is not a valid choice (expected %s)", k->name, v, k->expect);
        if (k->kind == K_ENUM) *(int *)field = i;
        else strcpy(field, k->names[i]);
        return CT_OK;
    }
    case K_RESUME: {
        ct_training_config *t = field;
        if (!strcmp(v, "auto")) t->resume_mode = CT_RESUME_AUTO;
        else if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "FALSE")) t->resume_mode = CT_RESUME_FALSE;
        else if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "TRUE"))
            return fail_at(s, n, err, "%s: '%s' is ambiguous (expected %s)", k->name, v, k->expect);
        else {
            int rc = set_path(s, n, err, k->name, t->resume_from_checkpoint);
            if (rc) return rc;
            t->resume_mode = CT_RESUME_PATH;
            return CT_OK;
        }
        t->resume_from_checkpoint[0] = '\0';
        return CT_OK;
    }
    default:
        CT_ASSERT(0, "config: key kind %d has no reader", (int)k->kind);
    }
}

/* Records in cfg where key K got its value: the file and the line of KEY_NODE,
 * or the --set text (both fit CT_ORIGIN_MAX: paths are shorter than CT_PATH_MAX
 * and --set texts are cut). */
static void set_origin(ct_config *cfg, const key_spec *k, const src *s, const yaml_node_t *key_node)
{
    char *o = cfg->origin[k - keys];
    if (s->set_text) snprintf(o, CT_ORIGIN_MAX, "--set %s", s->set_text);
    else snprintf(o, CT_ORIGIN_MAX, "%s:%zu", s->path, key_node->start_mark.line + 1);
}

// ---- mappings ----

/* Checks that the pair at P has a scalar key not seen earlier in the mapping M. */
static int check_key(const src *s, const yaml_node_t *m, const yaml_node_pair_t *p, const char *prefix, ct_error *err)
{
    yaml_node_t *key = yaml_document_get_node(s->doc, p->key);
    if (key->type != YAML_SCALAR_NODE)
        return fail_at(s, key, err, "a key is %s (expected a plain %skey name)", node_kind(key), prefix);
    if (has_nul(key))
        return fail_at(s, key, err, "the key '%s%s' goes on past a NUL character (expected a plain key name)", prefix,
                       scalar(key));
    for (const yaml_node_pair_t *q = m->data.mapping.pairs.start; q < p; q++) {
        yaml_node_t *prev = yaml_document_get_node(s->doc, q->key);
        if (prev->type == YAML_SCALAR_NODE && !strcmp(scalar(prev), scalar(key)))
            return fail_at(s, key, err, "duplicate key '%s%s' (first given at line %zu)", prefix, scalar(key),
                           prev->start_mark.line + 1);
    }
    return CT_OK;
}

static int read_section(const src *s, const char *section, const yaml_node_t *m, ct_config *cfg, ct_error *err)
{
    char prefix[32], full[256];
    snprintf(prefix, sizeof prefix, "%s.", section);
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        int rc = check_key(s, m, p, prefix, err);
        if (rc) return rc;
        yaml_node_t *key = yaml_document_get_node(s->doc, p->key);
        snprintf(full, sizeof full, "%s%s", prefix, scalar(key));
        const key_spec *k = find_key(full);
        if (!k) return fail_unknown(s, key, err, full, full + strlen(prefix));
        if ((rc = set_value(s, k, yaml_document_get_node(s->doc, p->value), cfg, err))) return rc;
        set_origin(cfg, k, s, key);
    }
    return CT_OK;
}

static int read_root(const src *s, const yaml_node_t *root, ct_config *cfg, ct_error *err)
{
    if (is_null(root)) return CT_OK;
    if (root->type != YAML_MAPPING_NODE)
        return fail_at(s, root, err, "the top level is %s (expected a mapping of keys: model, output_dir, lora, data, "
                       "training, memory)", node_kind(root));
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        int rc = check_key(s, root, p, "", err);
        if (rc) return rc;
        yaml_node_t *key = yaml_document_get_node(s->doc, p->key);
        yaml_node_t *val = yaml_document_get_node(s->doc, p->value);
        const char *name = scalar(key);
        if (word_index(sections, name) >= 0) {
            if (is_null(val)) continue;
            if (val->type != YAML_MAPPING_NODE)
                return fail_at(s, val, err, "'%s' is a section but got %s (expected keys indented under '%s:')",
                               name, node_kind(val), name);
            rc = read_section(s, name, val, cfg, err);
        } else {
            const key_spec *k = find_key(name);
            if (!k || strchr(name, '.')) return fail_unknown(s, key, err, name, leaf_of(name));
            rc = set_value(s, k, val, cfg, err);
            if (!rc) set_origin(cfg, k, s, key);
        }
        if (rc) return rc;
    }
    return CT_OK;
}

// ---- parsing ----

/* The line of a parser error; reader errors (bad UTF-8) only give a byte offset. */
static size_t problem_line(const yaml_parser_t *p, const char *text, size_t len)
{
    if (p->error != YAML_READER_ERROR) return p->problem_mark.line + 1;
    size_t line = 1;
    for (size_t i = 0; i < p->problem_offset && i < len; i++) line += text[i] == '\n';
    return line;
}

static int fail_syntax(const src *s, const yaml_parser_t *p, const char *text, size_t len, ct_error *err)
{
    const char *problem = p->problem ? p->problem : "unreadable YAML";
    if (s->set_text)
        return CT_FAIL_INPUT(err, "--set %s: the value is not valid YAML: %s (expected a scalar or a flow list "
                             "such as [a, b]; quote values with special characters)", s->set_text, problem);
    if (p->context)
        return CT_FAIL_INPUT(err, "%s:%zu: YAML syntax error: %s (%s at line %zu)", s->path, problem_line(p, text, len),
                             problem, p->context, p->context_mark.line + 1);
    return CT_FAIL_INPUT(err, "%s:%zu: YAML syntax error: %s", s->path, problem_line(p, text, len), problem);
}

/* One pass over TEXT's events: a syntax error, or nesting deeper than
 * CT_CONFIG_MAX_DEPTH, which stops the scan at the first level too deep. */
static int check_depth(const src *s, const char *text, size_t len, ct_error *err)
{
    yaml_parser_t parser;
    CT_ASSERT(yaml_parser_initialize(&parser), "config: libyaml parser init failed");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int depth = 0, rc = CT_OK;
    for (bool end = false; !end && !rc;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            rc = fail_syntax(s, &parser, text, len, err);
            break;
        }
        if (ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT) depth++;
        if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT) depth--;
        if (depth > CT_CONFIG_MAX_DEPTH && s->set_text)
            rc = CT_FAIL_INPUT(err, "--set %s: the value nests deeper than %d levels (expected a scalar or a flow "
                               "list such as [a, b])", s->set_text, CT_CONFIG_MAX_DEPTH);
        else if (depth > CT_CONFIG_MAX_DEPTH)
            rc = CT_FAIL_INPUT(err, "%s:%zu: nesting deeper than %d levels (a config needs 3: the top level, a "
                               "section, a list)", s->path, ev.start_mark.line + 1, CT_CONFIG_MAX_DEPTH);
        end = ev.type == YAML_STREAM_END_EVENT;
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    return rc;
}

/* Loads the single YAML document in TEXT into *doc (the caller deletes it). */
static int load_document(const src *s, const char *text, size_t len, yaml_document_t *doc, ct_error *err)
{
    int rc = check_depth(s, text, len, err);
    if (rc) return rc;
    yaml_parser_t parser;
    CT_ASSERT(yaml_parser_initialize(&parser), "config: libyaml parser init failed");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, doc)) {
        rc = fail_syntax(s, &parser, text, len, err);
        yaml_parser_delete(&parser);
        return rc;
    }
    if (yaml_document_get_root_node(doc)) {
        yaml_document_t next;
        if (!yaml_parser_load(&parser, &next)) {
            rc = fail_syntax(s, &parser, text, len, err);
        } else {
            if (yaml_document_get_root_node(&next) && s->set_text)
                rc = CT_FAIL_INPUT(err, "--set %s: the value holds two YAML documents (expected one)", s->set_text);
            else if (yaml_document_get_root_node(&next))
                rc = CT_FAIL_INPUT(err, "%s:%zu: a second YAML document starts here (expected one document per "
                                   "config file)", s->path, next.start_mark.line + 1);
            yaml_document_delete(&next);
        }
    }
    yaml_parser_delete(&parser);
    if (rc) yaml_document_delete(doc);
    return rc;
}

int config_load(ct_config *cfg, const char *path, ct_error *err)
{
    size_t len;
    char *text = ct_read_file_max(path, CT_CONFIG_MAX_BYTES, &len, err);
    if (!text) return one_line(err, CT_ERR_INPUT);
    int rc = config_parse_text(cfg, text, len, path, err);
    free(text);
    return rc;
}

int config_parse_text(ct_config *cfg, const char *text, size_t len, const char *path, ct_error *err)
{
    if (strlen(path) >= CT_PATH_MAX)
        return one_line(err, CT_FAIL_INPUT(err, "%s: path is too long (expected at most %d characters)", path,
                                           CT_PATH_MAX - 1));
    ct_config *tmp = ct_malloc(sizeof *tmp);
    config_defaults(tmp);
    strcpy(tmp->source_path, path);
    yaml_document_t doc;
    src s = { .path = path, .doc = &doc };
    int rc = load_document(&s, text, len, &doc, err);
    if (!rc) {
        yaml_node_t *root = yaml_document_get_root_node(&doc);
        if (root) rc = read_root(&s, root, tmp, err);
        yaml_document_delete(&doc);
    }
    if (!rc) memcpy(cfg, tmp, sizeof *cfg);
    free(tmp);
    return one_line(err, rc);
}

/* Messages and origins show at most this much of a --set (a value can be a
 * megabyte); a longer one is cut and ends in "...". */
#define SET_SHOWN_MAX 300

static int set_one(ct_config *cfg, const char *assignment, ct_error *err)
{
    char shown[SET_SHOWN_MAX + 4];
    if (snprintf(shown, sizeof shown, "%s", assignment) >= (int)sizeof shown) strcpy(shown + SET_SHOWN_MAX, "...");
    const char *eq = strchr(assignment, '=');
    for (const unsigned char *p = (const unsigned char *)assignment; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return CT_FAIL_INPUT(err, "--set %s: the %s holds a control character (byte 0x%02x; expected printable "
                                 "text)", shown, eq && (const char *)p > eq ? "value" : "key", *p);
    if (!eq || eq == assignment)
        return CT_FAIL_INPUT(err, "--set %s: expected KEY=VALUE (e.g. --set lora.r=32)", shown);
    char name[256];
    size_t nlen = (size_t)(eq - assignment);
    if (nlen >= sizeof name) return CT_FAIL_INPUT(err, "--set %s: the key is too long", shown);
    memcpy(name, assignment, nlen);
    name[nlen] = '\0';
    src s = { .set_text = shown };
    const key_spec *k = find_key(name);
    if (!k) {
        if (word_index(sections, name) >= 0)
            return CT_FAIL_INPUT(err, "--set %s: '%s' is a section (expected a key inside it, such as %s.*; see "
                                 "configs/reference.yaml)", shown, name, name);
        return fail_unknown(&s, NULL, err, name, leaf_of(name));
    }
    const char *value = eq + 1;
    yaml_document_t doc;
    s.doc = &doc;
    int rc = load_document(&s, value, strlen(value), &doc, err);
    if (rc) return rc;
    ct_config *tmp = ct_malloc(sizeof *tmp);
    memcpy(tmp, cfg, sizeof *tmp);
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    /* An empty value is YAML's null, and lets --set data.eval_files= clear a list. */
    yaml_node_t empty = { .type = YAML_SCALAR_NODE };
    empty.data.scalar.value = (yaml_char_t *)"";
    empty.data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
    rc = set_value(&s, k, root ? root : &empty, tmp, err);
    if (!rc) {
        set_origin(tmp, k, &s, NULL);
        memcpy(cfg, tmp, sizeof *cfg);
    }
    free(tmp);
    yaml_document_delete(&doc);
    return rc;
}

int config_set(ct_config *cfg, const char *assignment, ct_error *err)
{
    return one_line(err, set_one(cfg, assignment, err));
}

// ---- validation ----

const char *config_origin(const ct_config *cfg, const char *key)
{
    const key_spec *k = find_key(key);
    return k && cfg->origin[k - keys][0] ? cfg->origin[k - keys] : NULL;
}

/* Fails with "WHERE: BODY". WHERE is where key A got its value, else (A at its
 * default) where key B got its, else the source file; when B's value came from
 * another place, "; B comes from THERE" follows. */
__attribute__((format(printf, 5, 6)))
static int fail_keys(const ct_config *cfg, ct_error *err, const char *a, const char *b, const char *fmt, ...)
{
    char body[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    const char *oa = config_origin(cfg, a), *ob = b ? config_origin(cfg, b) : NULL;
    const char *where = oa ? oa : ob ? ob : cfg->source_path[0] ? cfg->source_path : "config";
    if (ob && strcmp(ob, where)) return CT_FAIL_INPUT(err, "%s: %s; %s comes from %s", where, body, b, ob);
    return CT_FAIL_INPUT(err, "%s: %s", where, body);
}

static int warmup_over_max_steps(const ct_config *cfg, ct_error *err)
{
    return fail_keys(cfg, err, "training.warmup_steps", "training.max_steps",
                     "training.warmup_steps %d exceeds training.max_steps %d (expected warmup_steps <= max_steps)",
                     cfg->training.warmup_steps, cfg->training.max_steps);
}

static int validate(const ct_config *cfg, ct_error *err)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_spec *k = &keys[i];
        const void *field = (const char *)cfg + k->off;
        if (k->kind == K_INT && !in_int_range(k, *(const int *)field))
            return fail_keys(cfg, err, k->name, NULL, "%s %d is out of range (expected %s)", k->name,
                             *(const int *)field, k->expect);
        if (k->kind == K_I64 && !in_int_range(k, *(const long long *)field))
            return fail_keys(cfg, err, k->name, NULL, "%s %lld is out of range (expected %s)", k->name,
                             *(const long long *)field, k->expect);
        if (k->kind == K_FLOAT && !in_float_range(k, *(const double *)field))
            return fail_keys(cfg, err, k->name, NULL, "%s %g is out of range (expected %s)", k->name,
                             *(const double *)field, k->expect);
    }
    if (!cfg->model[0]) return fail_keys(cfg, err, "model", NULL, "model: required (expected a Hugging Face model folder)");
    if (!cfg->output_dir[0])
        return fail_keys(cfg, err, "output_dir", NULL, "output_dir: required (expected a folder for checkpoints and logs)");
    if (cfg->data.n_train_files == 0)
        return fail_keys(cfg, err, "data.train_files", NULL,
                         "data.train_files: required (expected a shard path or glob, or a list of them)");
    if (cfg->lora.n_target_modules == 0)
        return fail_keys(cfg, err, "lora.target_modules", NULL,
                         "lora.target_modules: empty (expected all-linear or a list of " LINEAR_LIST ")");
    if (cfg->data.packing && cfg->data.max_length > cfg->data.tokens_per_micro_batch)
        return fail_keys(cfg, err, "data.max_length", "data.tokens_per_micro_batch",
                         "data.max_length %d exceeds data.tokens_per_micro_batch %d (a sample must fit one micro-batch)",
                         cfg->data.max_length, cfg->data.tokens_per_micro_batch);
    if (cfg->base_precision == CT_BASE_FP8 && cfg->model_quantization != CT_MODEL_QUANT_NONE)
        return fail_keys(cfg, err, "base_precision", "model_quantization",
                         "base_precision: fp8 and model_quantization: %s both quantize the base (choose one)",
                         cfg->model_quantization == CT_MODEL_QUANT_NF4 ? "nf4" : "fp4");
    if (cfg->memory.activation_offload == CT_TRI_ON && !cfg->memory.gradient_checkpointing)
        return fail_keys(cfg, err, "memory.activation_offload", "memory.gradient_checkpointing",
                         "memory.activation_offload: on needs memory.gradient_checkpointing: true (offload moves the "
                         "saved layer inputs, which exist only with checkpointing)");
    if (cfg->training.max_steps > 0 && cfg->training.warmup_steps > cfg->training.max_steps)
        return warmup_over_max_steps(cfg, err);
    if (cfg->training.resume_mode == CT_RESUME_PATH && !cfg->training.resume_from_checkpoint[0])
        return fail_keys(cfg, err, "training.resume_from_checkpoint", NULL, "training.resume_from_checkpoint: empty "
                         "path (expected auto, false or a checkpoint folder)");
    return CT_OK;
}

int config_validate(const ct_config *cfg, ct_error *err)
{
    return one_line(err, validate(cfg, err));
}

/* Steps from epochs are computed in double: epochs x micro-batches can pass
 * INT_MAX (and SIZE_MAX) long before double loses an integer that fits an int. */
static int total_steps(const ct_config *cfg, size_t micro_batches_per_epoch, int *steps, ct_error *err)
{
    const ct_training_config *t = &cfg->training;
    if (t->max_steps > 0) {
        if (t->warmup_steps > t->max_steps) return warmup_over_max_steps(cfg, err);
        *steps = t->max_steps;
        return CT_OK;
    }
    double x = ceil(t->num_train_epochs * (double)micro_batches_per_epoch / t->gradient_accumulation_steps);
    if (!(x <= INT_MAX))
        return fail_keys(cfg, err, "training.num_train_epochs", "training.gradient_accumulation_steps",
                         "training.num_train_epochs %g gives %.3g optimizer steps (%zu micro-batches per epoch, "
                         "gradient_accumulation_steps %d), more than the %d a run can count (expected fewer epochs, "
                         "or training.max_steps)", t->num_train_epochs, x, micro_batches_per_epoch,
                         t->gradient_accumulation_steps, INT_MAX);
    int n = x < 1 ? 1 : (int)x;
    if (t->warmup_steps > n)
        return fail_keys(cfg, err, "training.warmup_steps", "training.num_train_epochs",
                         "training.warmup_steps %d exceeds the run's %d optimizer steps (training.num_train_epochs %g "
                         "of %zu micro-batches, gradient_accumulation_steps %d; expected warmup_steps <= %d)",
                         t->warmup_steps, n, t->num_train_epochs, micro_batches_per_epoch,
                         t->gradient_accumulation_steps, n);
    *steps = n;
    return CT_OK;
}

int config_total_steps(const ct_config *cfg, size_t micro_batches_per_epoch, int *steps, ct_error *err)
{
    return one_line(err, total_steps(cfg, micro_batches_per_epoch, steps, err));
}

// ---- printing ----

/* Plain when the text cannot be mistaken for null or for YAML syntax; else quoted. */
static void print_string(FILE *out, const char *v)
{
    bool plain = *v && (isalnum((unsigned char)*v) || strchr("_./", *v)) && strcmp(v, "null") && strcmp(v, "Null") &&
                 strcmp(v, "NULL");
    for (const char *p = v; plain && *p; p++) plain = isalnum((unsigned char)*p) || strchr("_./-+", *p);
    if (plain) { fputs(v, out); return; }
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) fprintf(out, "\\x%02x", *p);
        /* YAML refuses C1 controls and U+FFFE/U+FFFF written raw, and folds the
         * line breaks NEL (a C1 code), LS and PS: escape them (and the BOM) */
        else if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) { fprintf(out, "\\x%02x", p[1]); p++; }
        else if (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) {
            fputs(p[2] == 0xa8 ? "\\L" : "\\P", out);
            p += 2;
        } else if (p[0] == 0xef && ((p[1] == 0xbb && p[2] == 0xbf) || (p[1] == 0xbf && p[2] >= 0xbe))) {
            fprintf(out, "\\u%04x", (unsigned)(p[0] & 0x0f) << 12 | (unsigned)(p[1] & 0x3f) << 6 | (p[2] & 0x3f));
            p += 2;
        } else fputc(*p, out);
    }
    fputc('"', out);
}

/* The shortest %g form that reads back to the same double. */
static void print_double(FILE *out, double v)
{
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    fputs(buf, out);
}

/* Writes " VALUE", or a block list one "\n    - ITEM" at a time. */
static void print_value(FILE *out, const key_spec *k, const ct_config *cfg)
{
    const void *field = (const char *)cfg + k->off;
    if (k->kind != K_FILES || !*(const int *)field) fputc(' ', out);
    switch (k->kind) {
    case K_PATH: print_string(out, field); break;
    case K_INT: fprintf(out, "%d", *(const int *)field); break;
    case K_I64: fprintf(out, "%lld", *(const long long *)field); break;
    case K_FLOAT: print_double(out, *(const double *)field); break;
    case K_BOOL: fputs(*(const bool *)field ? "true" : "false", out); break;
    case K_ENUM: fputs(k->names[*(const int *)field], out); break;
    case K_INIT: fputs((const char *)field, out); break;
    case K_TARGETS: {
        const ct_lora_config *l = field;
        if (l->target_all_linear) { fputs("all-linear", out); break; }
        fputc('[', out);
        for (int i = 0; i < l->n_target_modules; i++) fprintf(out, "%s%s", i ? ", " : "", l->target_modules[i]);
        fputc(']', out);
        break;
    }
    case K_FILES: {
        int n = *(const int *)field;
        const char (*files)[CT_PATH_MAX] = (const void *)((const char *)cfg + k->off2);
        if (!n) fputs("[]", out);
        for (int i = 0; i < n; i++) { fputs("\n    - ", out); print_string(out, files[i]); }
        break;
    }
    case K_RESUME: {
        const ct_training_config *t = field;
        if (t->resume_mode == CT_RESUME_PATH) print_string(out, t->resume_from_checkpoint);
        else fputs(t->resume_mode == CT_RESUME_AUTO ? "auto" : "false", out);
        break;
    }
    }
}

void config_print(const ct_config *cfg, FILE *out)
{
    const char *section = "";
    size_t section_len = 0;
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_spec *k = &keys[i];
        const char *leaf = leaf_of(k->name);
        size_t plen = leaf == k->name ? 0 : (size_t)(leaf - k->name - 1);
        if (plen && (plen != section_len || strncmp(section, k->name, plen))) {
            fprintf(out, "%.*s:\n", (int)plen, k->name);
            section = k->name;
            section_len = plen;
        }
        fprintf(out, "%s%s:", plen ? "  " : "", leaf);
        print_value(out, k, cfg);
        fputc('\n', out);
    }
}
