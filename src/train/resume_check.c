/* resume_check.c — see resume_check.h.
 *
 * Both configs are read back from config_print's text rather than compared as
 * structs: the printer already walks every key of config.c's table, so a key
 * added there is compared with no change here, and a checkpoint written by an
 * older ctune (with fewer keys) still compares on the keys both know. The text
 * is config_print's own layout: "section:" lines, "  key: value" lines, and
 * "    - item" lines under a list key; comments are dropped. */
#include "resume_check.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef enum {
    RULE_REPORT,  /* does not change the math: reported */
    RULE_EXACT,   /* the math of later steps depends on it: refused unless allowed */
    RULE_SHAPE,   /* the adapter's shapes: refused, allowed or not */
    RULE_STEPS,   /* judged by the step count it gives (facts) */
    RULE_DATA,    /* judged by the data's CRC when the checkpoint has it */
    RULE_IGNORE,  /* how to resume, not what */
} key_rule;

static const struct { const char *key; key_rule rule; } rules[] = {
    {"model", RULE_EXACT},
    {"model_quantization", RULE_EXACT},  /* the base the adapter was trained against */
    {"base_precision", RULE_EXACT},
    {"bnb_4bit_use_double_quant", RULE_EXACT},
    {"lora.r", RULE_SHAPE},
    {"lora.target_modules", RULE_SHAPE},
    {"lora.lora_alpha", RULE_EXACT},
    {"lora.lora_dropout", RULE_EXACT},
    {"lora.use_rslora", RULE_EXACT},
    {"data.train_files", RULE_DATA},
    {"data.max_length", RULE_EXACT},
    {"data.packing", RULE_EXACT},
    {"data.tokens_per_micro_batch", RULE_EXACT},
    {"data.shuffle_window", RULE_EXACT},
    {"training.learning_rate", RULE_EXACT},
    {"training.lr_scheduler_type", RULE_EXACT},
    {"training.warmup_steps", RULE_EXACT},
    {"training.max_steps", RULE_STEPS},
    {"training.num_train_epochs", RULE_STEPS},
    {"training.gradient_accumulation_steps", RULE_EXACT},
    {"training.weight_decay", RULE_EXACT},
    {"training.adam_beta1", RULE_EXACT},
    {"training.adam_beta2", RULE_EXACT},
    {"training.adam_epsilon", RULE_EXACT},
    {"training.max_grad_norm", RULE_EXACT},
    {"training.seed", RULE_EXACT},
    {"training.router_aux_loss", RULE_EXACT},
    {"training.resume_from_checkpoint", RULE_IGNORE},
    {"training.resume_allow_changes", RULE_IGNORE},
};

static key_rule rule_of(const char *key)
{
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (!strcmp(rules[i].key, key)) return rules[i].rule;
    return RULE_REPORT;
}

// ---- config_print's text, read back ----

typedef struct entry {
    char key[128];
    char *value;        /* owned; a list reads "[a, b]" */
} entry;

typedef struct entries {
    entry *v;
    size_t n, cap;
} entries;

/* Cuts a comment: a '#' at the start or after a space, outside double quotes. */
static void strip_comment(char *line)
{
    bool quoted = false;
    for (char *p = line; *p; p++) {
        if (*p == '"' && (p == line || p[-1] != '\\')) quoted = !quoted;
        if (*p == '#' && !quoted && (p == line || p[-1] == ' ')) {
            *p = '\0';
            break;
        }
    }
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\r')) line[--n] = '\0';
}

static void add_entry(entries *e, const char *section, const char *leaf, const char *value)
{
    if (e->n == e->cap) e->v = ct_realloc(e->v, (e->cap = 2 * e->cap + 16) * sizeof *e->v);
    entry *x = &e->v[e->n++];
    if (*section) snprintf(x->key, sizeof x->key, "%s.%s", section, leaf);
    else snprintf(x->key, sizeof x->key, "%s", leaf);
    x->value = ct_strdup(value);
}

/* Appends ITEM to the list value of the newest entry ("" -> "[item]"). */
static void add_item(entries *e, const char *item)
{
    if (e->n == 0) return;
    entry *x = &e->v[e->n - 1];
    size_t old = strlen(x->value), n = strlen(item);
    bool first = old == 0 || !strcmp(x->value, "[]");
    char *v = ct_malloc(old + n + 4);
    if (first) snprintf(v, old + n + 4, "[%s]", item);
    else snprintf(v, old + n + 4, "%.*s, %s]", (int)(old - 1), x->value, item);
    free(x->value);
    x->value = v;
}

static void parse_printed(const char *text, entries *out)
{
    memset(out, 0, sizeof *out);
    char section[64] = "";
    char *copy = ct_strdup(text);
    for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
        strip_comment(line);
        size_t indent = strspn(line, " ");
        char *body = line + indent;
        if (!*body) continue;
        if (indent >= 4 && body[0] == '-' && body[1] == ' ') {
            add_item(out, body + 2);
            continue;
        }
        char *colon = strchr(body, ':');
        if (!colon) continue;
        *colon = '\0';
        const char *value = colon[1] == ' ' ? colon + 2 : colon + 1;
        if (indent == 0 && !*value) {
            snprintf(section, sizeof section, "%s", body);
            continue;
        }
        add_entry(out, indent == 0 ? "" : section, body, value);
    }
    free(copy);
}

static void entries_free(entries *e)
{
    for (size_t i = 0; i < e->n; i++) free(e->v[i].value);
    free(e->v);
}

static const char *value_of(const entries *e, const char *key)
{
    for (size_t i = 0; i < e->n; i++)
        if (!strcmp(e->v[i].key, key)) return e->v[i].value;
    return NULL;
}

// ---- the comparison ----

/* Appends KEY to the comma-separated list in buf. */
static void list_add(char *buf, size_t len, const char *key)
{
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, "%s%s", n ? ", " : "", key);
}

int resume_check(const ct_config *cfg, const char *new_config, const ct_resume_facts *f, FILE *notes,
                 ct_error *err)
{
    entries now, then = {0};
    parse_printed(new_config, &now);
    if (f->saved_config) parse_printed(f->saved_config, &then);
    else if (notes) fprintf(notes, "note: resume: %s keeps no config of its run; only its step count and data are "
                                   "compared\n", f->checkpoint);
    const char *allow_text = value_of(&now, "training.resume_allow_changes");
    bool allow_key = allow_text != NULL, allow = allow_text && !strcmp(allow_text, "true");
    char exact[600] = "", shape[200] = "";
    bool steps_key_changed = false;
    for (size_t i = 0; i < now.n && f->saved_config; i++) {
        const char *key = now.v[i].key, *was = value_of(&then, key), *is = now.v[i].value;
        key_rule rule = rule_of(key);
        if (!was || !strcmp(was, is) || rule == RULE_IGNORE) continue;
        if (notes) fprintf(notes, "resume: %s changed %s -> %s\n", key, was, is);
        if (rule == RULE_SHAPE) list_add(shape, sizeof shape, key);
        if (rule == RULE_EXACT || (rule == RULE_DATA && !f->has_data_crc)) list_add(exact, sizeof exact, key);
        if (rule == RULE_STEPS) steps_key_changed = true;
    }
    if (f->has_data_crc && f->saved_data_crc != f->data_crc) {
        if (notes) fprintf(notes, "resume: data.train_files: the shards' contents changed (data CRC %08x -> %08x)\n",
                           f->saved_data_crc, f->data_crc);
        list_add(exact, sizeof exact, "data.train_files (contents)");
    }
    if (f->saved_total_steps != f->total_steps) {
        bool constant = cfg->training.lr_scheduler_type == CT_SCHED_CONSTANT;
        if (notes) fprintf(notes, "resume: the run now has %lld steps, the checkpoint's run had %lld%s\n",
                           f->total_steps, f->saved_total_steps,
                           constant ? " (the learning rate is constant: the steps so far are unchanged)" : "");
        if (!constant)
            list_add(exact, sizeof exact, steps_key_changed ? "training.max_steps/num_train_epochs (the schedule's length)"
                                                            : "the schedule's length (from num_train_epochs and the data)");
    }
    entries_free(&now);
    entries_free(&then);
    const char *keep = "HINT: put back the values its run had";
    char where[CT_PATH_MAX + 64] = "";
    if (f->saved_config) snprintf(where, sizeof where, " (%s)", f->saved_from);
    if (*shape)
        return CT_FAIL_INPUT(err, "%s: cannot resume: %s changed, so its adapter does not fit this config (%s%s, or "
                             "start another run: another output_dir or training.resume_from_checkpoint: false)",
                             f->checkpoint, shape, keep, where);
    if (!*exact) return CT_OK;
    if (allow) {
        if (notes) fprintf(notes, "resume: continuing anyway (training.resume_allow_changes: true): the steps after "
                                  "%s will not be those of the run it came from\n", f->checkpoint);
        return CT_OK;
    }
    return CT_FAIL_INPUT(err, "%s: cannot resume: %s changed, and the steps after it would not be those of the run "
                         "it belongs to (%s%s%s, or start another run: another output_dir or "
                         "training.resume_from_checkpoint: false)", f->checkpoint, exact, keep, where,
                         allow_key ? ", set training.resume_allow_changes: true to continue anyway" : "");
}

uint32_t dataset_crc32(const ct_dataset *ds)
{
    uLong c = crc32(0L, Z_NULL, 0);
    for (int i = 0; i < ds->n_shards; i++) {
        uint64_t v[3] = {shard_crc32(ds->shards[i]), shard_num_docs(ds->shards[i]), shard_num_tokens(ds->shards[i])};
        c = crc32(c, (const unsigned char *)v, sizeof v);
    }
    return (uint32_t)c;
}
