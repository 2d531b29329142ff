/* test_config.c — the config contract: defaults, the shipped configs, one test per
 * error class (exact "FILE:LINE:" prefix and CT_ERR_INPUT), --set overrides and
 * the print -> load round trip, where each error blames the value (file line or
 * --set), the run's step count, and the bounds on nesting, NUL and control
 * characters. Runs from the repo root. */
#include "check.h"
#include "config.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmp_dir[256];

/* Writes TEXT to a fresh file in the test folder and returns its path (static). */
static const char *write_yaml(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "w");
    CT_ASSERT(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
    return path;
}

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* The first field where a and b differ, or NULL. */
static const char *config_diff(const ct_config *a, const ct_config *b)
{
#define SAME(f) if (a->f != b->f) return #f
#define SAME_STR(f) if (strcmp(a->f, b->f)) return #f
    SAME_STR(model); SAME_STR(output_dir); SAME(device);
    SAME(lora.r); SAME(lora.lora_alpha); SAME(lora.lora_dropout); SAME(lora.use_rslora);
    SAME(lora.n_target_modules); SAME(lora.target_all_linear); SAME_STR(lora.init_lora_weights);
    for (int i = 0; i < a->lora.n_target_modules; i++) SAME_STR(lora.target_modules[i]);
    SAME(data.n_train_files); SAME(data.n_eval_files);
    for (int i = 0; i < a->data.n_train_files; i++) SAME_STR(data.train_files[i]);
    for (int i = 0; i < a->data.n_eval_files; i++) SAME_STR(data.eval_files[i]);
    SAME(data.max_length); SAME(data.packing); SAME(data.tokens_per_micro_batch); SAME(data.shuffle_window);
    SAME(training.learning_rate); SAME(training.lr_scheduler_type); SAME(training.warmup_steps);
    SAME(training.max_steps); SAME(training.num_train_epochs); SAME(training.gradient_accumulation_steps);
    SAME(training.weight_decay); SAME(training.adam_beta1); SAME(training.adam_beta2);
    SAME(training.adam_epsilon); SAME(training.max_grad_norm); SAME(training.seed);
    SAME(training.logging_steps); SAME(training.eval_steps); SAME(training.save_steps);
    SAME(training.save_total_limit); SAME(training.resume_mode); SAME_STR(training.resume_from_checkpoint);
    SAME(memory.gradient_checkpointing); SAME(memory.activation_offload);
#undef SAME
#undef SAME_STR
    return NULL;
}

/* Loads TEXT from a temp file NAME and expects CT_ERR_INPUT whose message starts
 * with "PATH:LINE: " followed by WANT (a prefix of the rest). */
#define EXPECT_LOAD_ERROR(name, text, line, want) do { \
    ct_config *c_ = malloc(sizeof *c_); ct_error e_ = {0}; \
    const char *p_ = write_yaml(name, text); \
    int rc_ = config_load(c_, p_, &e_); \
    char pre_[600]; snprintf(pre_, sizeof pre_, "%s:%d: %s", p_, line, want); \
    CHECK(rc_ == CT_ERR_INPUT, "rc %d", rc_); \
    CHECK(starts_with(e_.msg, pre_), "got '%s', want prefix '%s'", e_.msg, pre_); \
    CHECK(!strchr(e_.msg, '\n'), "message is not one line: '%s'", e_.msg); \
    free(c_); } while (0)

TEST(defaults_match_documented_values)
{
    ct_config *c = malloc(sizeof *c);
    config_defaults(c);
    CHECK(c->lora.r == 16 && c->lora.lora_alpha == 32 && c->lora.lora_dropout == 0 && !c->lora.use_rslora, "lora");
    CHECK(c->lora.target_all_linear && c->lora.n_target_modules == 7, "targets %d", c->lora.n_target_modules);
    CHECK(!strcmp(c->lora.target_modules[6], "down_proj"), "%s", c->lora.target_modules[6]);
    CHECK(!strcmp(c->lora.init_lora_weights, "true"), "%s", c->lora.init_lora_weights);
    CHECK(c->data.max_length == 4096 && c->data.packing && c->data.tokens_per_micro_batch == 16384, "data");
    CHECK(c->data.shuffle_window == 1024 && c->data.n_train_files == 0 && c->data.n_eval_files == 0, "data files");
    CHECK(c->training.learning_rate == 2e-4 && c->training.lr_scheduler_type == CT_SCHED_COSINE, "lr");
    /* as HF: max_steps -1, so that num_train_epochs alone decides the run */
    CHECK(c->training.warmup_steps == 10 && c->training.max_steps == -1 && c->training.num_train_epochs == 1,
          "steps: max_steps %d", c->training.max_steps);
    CHECK(c->training.gradient_accumulation_steps == 1 && c->training.weight_decay == 0, "accum");
    CHECK(c->training.adam_beta1 == 0.9 && c->training.adam_beta2 == 0.999 && c->training.adam_epsilon == 1e-8, "adam");
    CHECK(c->training.max_grad_norm == 1.0 && c->training.seed == 42, "clip/seed");
    CHECK(c->training.logging_steps == 10 && c->training.eval_steps == 100 && c->training.save_steps == 200, "cadence");
    CHECK(c->training.save_total_limit == 3 && c->training.resume_mode == CT_RESUME_AUTO, "save/resume");
    CHECK(c->memory.gradient_checkpointing && c->memory.activation_offload == CT_TRI_AUTO, "memory");
    CHECK(c->memory.gpu_memory_limit == 0, "no GPU memory limit by default: %g", c->memory.gpu_memory_limit);
    CHECK(c->device == CT_DEVICE_AUTO && !c->model[0] && !c->output_dir[0] && !c->source_path[0], "top level");
    free(c);
}

TEST(reference_yaml_is_defaults_plus_required_keys)
{
    ct_config *c = malloc(sizeof *c), *d = malloc(sizeof *d);
    ct_error e = {0};
    REQUIRE(config_load(c, "configs/reference.yaml", &e) == CT_OK, "%s", e.msg);
    CHECK(config_validate(c, &e) == CT_OK, "%s", e.msg);
    CHECK(!strcmp(c->source_path, "configs/reference.yaml"), "%s", c->source_path);
    config_defaults(d);
    strcpy(d->model, "models/tiny");
    strcpy(d->output_dir, "runs/reference");
    d->data.n_train_files = 1;
    strcpy(d->data.train_files[0], "data/arith/train.shard");
    const char *diff = config_diff(c, d);
    CHECK(!diff, "reference.yaml differs from the defaults in %s", diff);
    free(c); free(d);
}

TEST(tiny_yaml_loads_and_validates)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    REQUIRE(config_load(c, "configs/tiny.yaml", &e) == CT_OK, "%s", e.msg);
    CHECK(config_validate(c, &e) == CT_OK, "%s", e.msg);
    CHECK(!strcmp(c->model, "models/tiny") && !strcmp(c->output_dir, "runs/tiny") && c->device == CT_DEVICE_CPU, "top");
    CHECK(c->data.n_train_files == 1 && !strcmp(c->data.train_files[0], "data/arith/train.shard"), "train");
    CHECK(c->data.n_eval_files == 1 && !strcmp(c->data.eval_files[0], "data/arith/eval.shard"), "eval");
    CHECK(c->data.max_length == 256 && c->data.tokens_per_micro_batch == 2048, "lengths");
    CHECK(c->training.learning_rate == 2.0e-3 && c->training.max_steps == 150, "lr/steps");
    CHECK(c->training.eval_steps == 50 && c->training.save_steps == 50 && c->training.save_total_limit == 2, "saves");
    free(c);
}

TEST(empty_file_is_defaults_and_validate_asks_for_model)
{
    ct_config *c = malloc(sizeof *c), *d = malloc(sizeof *d);
    ct_error e = {0};
    const char *p = write_yaml("empty.yaml", "# nothing but a comment\n");
    REQUIRE(config_load(c, p, &e) == CT_OK, "%s", e.msg);
    config_defaults(d);
    CHECK(!config_diff(c, d), "differs in %s", config_diff(c, d));
    char want[600];
    snprintf(want, sizeof want, "%s: model: required (expected a Hugging Face model folder)", p);
    CHECK(config_validate(c, &e) == CT_ERR_INPUT && !strcmp(e.msg, want), "got '%s'", e.msg);
    free(c); free(d);
}

TEST(validate_without_source_file_says_config)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    config_defaults(c);
    strcpy(c->model, "m");
    CHECK(config_validate(c, &e) == CT_ERR_INPUT && starts_with(e.msg, "config: output_dir: required"), "%s", e.msg);
    strcpy(c->output_dir, "o");
    CHECK(config_validate(c, &e) == CT_ERR_INPUT && starts_with(e.msg, "config: data.train_files: required"), "%s", e.msg);
    c->data.n_train_files = 1;
    strcpy(c->data.train_files[0], "x.shard");
    CHECK(config_validate(c, &e) == CT_OK, "%s", e.msg);
    c->lora.r = 0;
    CHECK(config_validate(c, &e) == CT_ERR_INPUT && starts_with(e.msg, "config: lora.r 0 is out of range"), "%s", e.msg);
    free(c);
}

TEST(unknown_key_suggests_closest_known_key)
{
    EXPECT_LOAD_ERROR("unk1.yaml", "model: m\nlora:\n  r: 8\n  rank: 8\n", 4,
                      "unknown key 'lora.rank' (did you mean 'lora.r'?)");
    EXPECT_LOAD_ERROR("unk2.yaml", "training:\n  lerning_rate: 1e-4\n", 2,
                      "unknown key 'training.lerning_rate' (did you mean 'training.learning_rate'?)");
    EXPECT_LOAD_ERROR("unk3.yaml", "learning_rate: 1e-4\n", 1,
                      "unknown key 'learning_rate' (did you mean 'training.learning_rate'?)");
    EXPECT_LOAD_ERROR("unk4.yaml", "trainig:\n  seed: 1\n", 1, "unknown key 'trainig' (did you mean 'training'?)");
    EXPECT_LOAD_ERROR("unk5.yaml", "lora.r: 8\n", 1, "unknown key 'lora.r' (write it nested");
    EXPECT_LOAD_ERROR("unk6.yaml", "memory:\n  zzzz: 1\n", 2, "unknown key 'memory.zzzz' (expected a key listed");
}

TEST(wrong_type_names_key_value_and_expectation)
{
    EXPECT_LOAD_ERROR("type1.yaml", "training:\n  warmup_steps: 5\n  max_steps: ten\n", 3,
                      "training.max_steps: 'ten' is not an integer (expected -1 (use num_train_epochs) or an integer >= 1)");
    EXPECT_LOAD_ERROR("type2.yaml", "lora:\n  lora_alpha: 1.5.2\n", 2, "lora.lora_alpha: '1.5.2' is not a number");
    EXPECT_LOAD_ERROR("type3.yaml", "data:\n  packing: yes\n", 2,
                      "data.packing: 'yes' is not a boolean (expected true or false)");
    EXPECT_LOAD_ERROR("type4.yaml", "training:\n  lr_scheduler_type: step\n", 2,
                      "training.lr_scheduler_type: 'step' is not a valid choice (expected constant, linear or cosine)");
    EXPECT_LOAD_ERROR("type5.yaml", "data:\n  max_length: 1.5\n", 2, "data.max_length: '1.5' is not an integer");
    EXPECT_LOAD_ERROR("type6.yaml", "training:\n  learning_rate: nan\n", 2, "training.learning_rate: 'nan' is not a number");
    EXPECT_LOAD_ERROR("type7.yaml", "model:\n  - a\n", 2, "model: got a list (expected a Hugging Face model folder)");
    EXPECT_LOAD_ERROR("type8.yaml", "device: gpu\n", 1, "device: 'gpu' is not a valid choice (expected auto, cpu or cuda)");
}

TEST(out_of_range_values_are_rejected)
{
    EXPECT_LOAD_ERROR("range1.yaml", "lora:\n  r: 0\n", 2, "lora.r: 0 is out of range (expected an integer in [1, 4096])");
    EXPECT_LOAD_ERROR("range2.yaml", "lora:\n  r: 4097\n", 2, "lora.r: 4097 is out of range");
    EXPECT_LOAD_ERROR("range3.yaml", "lora:\n  lora_dropout: 1.0\n", 2,
                      "lora.lora_dropout: 1.0 is out of range (expected a number in [0, 1))");
    EXPECT_LOAD_ERROR("range4.yaml", "training:\n  max_steps: 0\n", 2, "training.max_steps: 0 is out of range");
    EXPECT_LOAD_ERROR("range5.yaml", "training:\n  learning_rate: 0\n", 2, "training.learning_rate: 0 is out of range");
    EXPECT_LOAD_ERROR("range6.yaml", "training:\n  adam_beta2: 1\n", 2, "training.adam_beta2: 1 is out of range");
    EXPECT_LOAD_ERROR("range7.yaml", "data:\n  tokens_per_micro_batch: 99999999999\n", 2,
                      "data.tokens_per_micro_batch: 99999999999 is out of range");
    EXPECT_LOAD_ERROR("range8.yaml", "training:\n  seed: -1\n", 2, "training.seed: -1 is out of range");
    EXPECT_LOAD_ERROR("range9.yaml", "training:\n  save_steps: -5\n", 2, "training.save_steps: -5 is out of range");
    /* the trainer loads 2 x gradient_accumulation_steps + 2 micro-batches ahead, as an int */
    EXPECT_LOAD_ERROR("range10.yaml", "training:\n  gradient_accumulation_steps: 1073741824\n", 2,
                      "training.gradient_accumulation_steps: 1073741824 is out of range (expected an integer in [1, 65536])");
    EXPECT_LOAD_ERROR("range11.yaml", "memory:\n  gpu_memory_limit: -19\n", 2,
                      "memory.gpu_memory_limit: -19 is out of range (expected a number of GiB in [0, 1048576] (0: no limit))");
    EXPECT_LOAD_ERROR("range12.yaml", "memory:\n  gpu_memory_limit: 1e30\n", 2, "memory.gpu_memory_limit: 1e30 is out of range");
}

TEST(max_steps_minus_one_selects_epochs)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    const char *p = write_yaml("epochs.yaml", "training:\n  max_steps: -1\n  num_train_epochs: 2.5\n  warmup_steps: 5000\n");
    REQUIRE(config_load(c, p, &e) == CT_OK, "%s", e.msg);
    CHECK(c->training.max_steps == -1 && c->training.num_train_epochs == 2.5, "epochs");
    free(c);
}

TEST(duplicate_key_names_both_lines)
{
    EXPECT_LOAD_ERROR("dup1.yaml", "lora:\n  r: 8\n  lora_alpha: 16\n  r: 32\n", 4,
                      "duplicate key 'lora.r' (first given at line 2)");
    EXPECT_LOAD_ERROR("dup2.yaml", "lora:\n  r: 8\nmodel: m\nlora:\n  r: 4\n", 4,
                      "duplicate key 'lora' (first given at line 1)");
}

TEST(syntax_error_reports_libyaml_problem_and_line)
{
    EXPECT_LOAD_ERROR("syn1.yaml", "model: m\nlora:\n  r: 8\n   lora_alpha: 16\n", 4, "YAML syntax error: ");
    EXPECT_LOAD_ERROR("syn2.yaml", "model: m\ndata:\n  train_files: [a, b\n  max_length: 4\n", 4, "YAML syntax error: ");
    EXPECT_LOAD_ERROR("syn3.yaml", "model: m\n\toutput_dir: o\n", 2, "YAML syntax error: ");
}

TEST(only_one_mapping_document_is_accepted)
{
    EXPECT_LOAD_ERROR("multi.yaml", "model: a\n---\nmodel: b\n", 2, "a second YAML document starts here");
    EXPECT_LOAD_ERROR("list.yaml", "- model: a\n", 1, "the top level is a list (expected a mapping");
    EXPECT_LOAD_ERROR("scalar.yaml", "hello\n", 1, "the top level is a scalar");
}

TEST(section_given_as_scalar_is_rejected)
{
    EXPECT_LOAD_ERROR("sec1.yaml", "model: m\nlora: 16\n", 2,
                      "'lora' is a section but got a scalar (expected keys indented under 'lora:')");
    EXPECT_LOAD_ERROR("sec2.yaml", "training:\n  - 1\n", 2, "'training' is a section but got a list");
}

TEST(empty_section_is_allowed)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    CHECK(config_load(c, write_yaml("emptysec.yaml", "lora:\nmemory:\n"), &e) == CT_OK, "%s", e.msg);
    free(c);
}

TEST(max_length_over_micro_batch_is_a_contradiction)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    const char *p = write_yaml("contra.yaml", "model: m\noutput_dir: o\ndata:\n  train_files: a.shard\n"
                                              "  max_length: 8192\n  tokens_per_micro_batch: 4096\n");
    REQUIRE(config_load(c, p, &e) == CT_OK, "%s", e.msg);
    char want[1200];
    snprintf(want, sizeof want, "%s:5: data.max_length 8192 exceeds data.tokens_per_micro_batch 4096 "
                                "(a sample must fit one micro-batch); data.tokens_per_micro_batch comes from %s:6", p, p);
    CHECK(config_validate(c, &e) == CT_ERR_INPUT && !strcmp(e.msg, want), "got '%s'", e.msg);
    c->data.packing = false;
    CHECK(config_validate(c, &e) == CT_OK, "without packing: %s", e.msg);
    free(c);
}

TEST(warmup_longer_than_max_steps_is_a_contradiction)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    const char *p = write_yaml("warm.yaml", "model: m\noutput_dir: o\ndata: {train_files: [a.shard]}\n"
                                           "training: {max_steps: 5, warmup_steps: 10}\n");
    REQUIRE(config_load(c, p, &e) == CT_OK, "%s", e.msg);
    CHECK(config_validate(c, &e) == CT_ERR_INPUT && strstr(e.msg, "training.warmup_steps 10 exceeds training.max_steps 5"),
          "%s", e.msg);
    free(c);
}

/* Loads TEXT as NAME, applies the --set SETS (NULL-ended) and validates. */
static int load_set_validate(ct_config *c, const char *name, const char *text, const char *const *sets, ct_error *e)
{
    int rc = config_load(c, write_yaml(name, text), e);
    for (int i = 0; !rc && sets && sets[i]; i++) rc = config_set(c, sets[i], e);
    return rc ? rc : config_validate(c, e);
}

TEST(warmup_error_blames_the_set_or_the_line_that_gave_each_value)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    char want[1200];
    const char *text = "model: m\noutput_dir: o\ndata: {train_files: [a.shard]}\ntraining:\n  max_steps: 20\n";
    const char *p = write_yaml("warm_set.yaml", text);
    const char *warm50[] = {"training.warmup_steps=50", NULL};
    CHECK(load_set_validate(c, "warm_set.yaml", text, warm50, &e) == CT_ERR_INPUT, "accepted");
    snprintf(want, sizeof want, "--set training.warmup_steps=50: training.warmup_steps 50 exceeds training.max_steps 20 "
             "(expected warmup_steps <= max_steps); training.max_steps comes from %s:5", p);
    CHECK(!strcmp(e.msg, want), "got  '%s'\nwant '%s'", e.msg, want);
    /* the file's warmup, the command line's max_steps: the file line first, the --set named */
    text = "model: m\noutput_dir: o\ndata: {train_files: [a.shard]}\ntraining:\n  warmup_steps: 10\n";
    p = write_yaml("warm_file.yaml", text);
    const char *max5[] = {"training.max_steps=5", NULL};
    CHECK(load_set_validate(c, "warm_file.yaml", text, max5, &e) == CT_ERR_INPUT, "accepted");
    snprintf(want, sizeof want, "%s:5: training.warmup_steps 10 exceeds training.max_steps 5 (expected warmup_steps <= "
             "max_steps); training.max_steps comes from --set training.max_steps=5", p);
    CHECK(!strcmp(e.msg, want), "got  '%s'\nwant '%s'", e.msg, want);
    /* warmup at its default: the --set that made it too long is blamed */
    text = "model: m\noutput_dir: o\ndata: {train_files: [a.shard]}\n";
    CHECK(load_set_validate(c, "warm_default.yaml", text, max5, &e) == CT_ERR_INPUT, "accepted");
    CHECK(starts_with(e.msg, "--set training.max_steps=5: training.warmup_steps 10 exceeds training.max_steps 5"),
          "%s", e.msg);
    /* a later --set of the same key replaces where it came from */
    const char *twice[] = {"training.warmup_steps=50", "training.max_steps=60", "training.max_steps=40", NULL};
    CHECK(load_set_validate(c, "warm_default.yaml", text, twice, &e) == CT_ERR_INPUT && strstr(e.msg,
          "; training.max_steps comes from --set training.max_steps=40"), "%s", e.msg);
    CHECK(!strcmp(config_origin(c, "training.max_steps"), "--set training.max_steps=40"), "%s",
          config_origin(c, "training.max_steps"));
    CHECK(config_origin(c, "lora.r") == NULL, "a default has an origin");
    free(c);
}

TEST(range_and_offload_errors_blame_where_the_value_was_set)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    const char *text = "model: m\noutput_dir: o\ndata: {train_files: [a.shard]}\nmemory:\n"
                       "  gradient_checkpointing: false\n";
    const char *p = write_yaml("offload.yaml", text);
    const char *on[] = {"memory.activation_offload=on", NULL};
    CHECK(load_set_validate(c, "offload.yaml", text, on, &e) == CT_ERR_INPUT &&
          starts_with(e.msg, "--set memory.activation_offload=on: memory.activation_offload: on needs"), "%s", e.msg);
    char want[600];
    snprintf(want, sizeof want, "; memory.gradient_checkpointing comes from %s:5", p);
    CHECK(strstr(e.msg, want), "%s", e.msg);
    /* a value changed in code after the load keeps its key's origin; an empty list from --set is blamed on it */
    const char *clear[] = {"data.train_files=", NULL};
    CHECK(load_set_validate(c, "offload.yaml", text, clear, &e) == CT_ERR_INPUT &&
          starts_with(e.msg, "--set data.train_files=: data.train_files: required"), "%s", e.msg);
    free(c);
}

TEST(epochs_alone_decide_the_steps)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    const char *text = "model: m\noutput_dir: o\ndata: {train_files: [a.shard]}\ntraining:\n  num_train_epochs: 3\n"
                       "  gradient_accumulation_steps: 4\n";
    REQUIRE(load_set_validate(c, "ep3.yaml", text, NULL, &e) == CT_OK, "%s", e.msg);
    int steps = 0;
    CHECK(config_total_steps(c, 101, &steps, &e) == CT_OK && steps == 76, "3 x 101 / 4 -> %d steps (%s)", steps, e.msg);
    CHECK(config_set(c, "training.warmup_steps=0", &e) == CT_OK && config_total_steps(c, 0, &steps, &e) == CT_OK &&
          steps == 1, "an empty epoch: %d steps (%s)", steps, e.msg);
    free(c);
}

TEST(max_steps_wins_when_both_are_given)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    const char *text = "model: m\noutput_dir: o\ndata: {train_files: [a.shard]}\ntraining:\n  num_train_epochs: 3\n"
                       "  max_steps: 50\n";
    REQUIRE(load_set_validate(c, "both.yaml", text, NULL, &e) == CT_OK, "%s", e.msg);
    int steps = 0;
    CHECK(config_total_steps(c, 1000, &steps, &e) == CT_OK && steps == 50, "%d steps (%s)", steps, e.msg);
    free(c);
}

TEST(steps_beyond_int_are_an_input_error_naming_the_epochs)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    const char *text = "model: m\noutput_dir: o\ndata: {train_files: [a.shard]}\ntraining:\n  max_steps: -1\n"
                       "  num_train_epochs: 1e7\n";
    const char *p = write_yaml("ep1e7.yaml", text);
    REQUIRE(load_set_validate(c, "ep1e7.yaml", text, NULL, &e) == CT_OK, "%s", e.msg);
    int steps = -5;
    char want[600];
    snprintf(want, sizeof want, "%s:6: training.num_train_epochs 1e+07 gives 1.5e+10 optimizer steps (1500 "
             "micro-batches per epoch, gradient_accumulation_steps 1), more than the 2147483647 a run can count", p);
    CHECK(config_total_steps(c, 1500, &steps, &e) == CT_ERR_INPUT && starts_with(e.msg, want), "got  '%s'\nwant '%s'",
          e.msg, want);
    CHECK(steps == -5, "steps written on failure: %d", steps);
    /* exactly INT_MAX steps still count; one micro-batch more does not */
    const char *one[] = {"training.num_train_epochs=1", NULL};
    REQUIRE(load_set_validate(c, "ep1e7.yaml", text, one, &e) == CT_OK, "%s", e.msg);
    CHECK(config_total_steps(c, INT_MAX, &steps, &e) == CT_OK && steps == INT_MAX, "%d (%s)", steps, e.msg);
    CHECK(config_total_steps(c, (size_t)INT_MAX + 1, &steps, &e) == CT_ERR_INPUT &&
          starts_with(e.msg, "--set training.num_train_epochs=1: training.num_train_epochs 1 gives"), "%s", e.msg);
    CHECK(config_total_steps(c, SIZE_MAX, &steps, &e) == CT_ERR_INPUT, "SIZE_MAX micro-batches accepted");
    free(c);
}

TEST(warmup_longer_than_the_epochs_is_a_contradiction)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    const char *text = "model: m\noutput_dir: o\ndata: {train_files: [a.shard]}\n";
    const char *warm[] = {"training.warmup_steps=50", NULL};
    REQUIRE(load_set_validate(c, "ep_warm.yaml", text, warm, &e) == CT_OK, "%s", e.msg);
    int steps = 0;
    CHECK(config_total_steps(c, 37, &steps, &e) == CT_ERR_INPUT &&
          starts_with(e.msg, "--set training.warmup_steps=50: training.warmup_steps 50 exceeds the run's 37 optimizer "
                             "steps"), "%s", e.msg);
    CHECK(config_total_steps(c, 50, &steps, &e) == CT_OK && steps == 50, "%d (%s)", steps, e.msg);
    free(c);
}

/* An (N+1)-level text: the root mapping, then N - 1 nested flow lists. */
static char *nested(int levels, size_t *len)
{
    char *t = malloc((size_t)levels * 2 + 16);
    size_t n = (size_t)sprintf(t, "model: ");
    for (int i = 1; i < levels; i++) t[n++] = '[';
    for (int i = 1; i < levels; i++) t[n++] = ']';
    t[n++] = '\n';
    *len = n;
    return t;
}

TEST(nesting_deeper_than_64_levels_fails_fast_naming_the_line)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    size_t len;
    char *t = nested(64, &len);
    CHECK(config_parse_text(c, t, len, "n64.yaml", &e) == CT_ERR_INPUT &&
          starts_with(e.msg, "n64.yaml:1: model: got a list"), "64 levels: %s", e.msg);
    free(t);
    t = nested(65, &len);
    CHECK(config_parse_text(c, t, len, "n65.yaml", &e) == CT_ERR_INPUT &&
          starts_with(e.msg, "n65.yaml:1: nesting deeper than 64 levels"), "65 levels: %s", e.msg);
    free(t);
    /* 80,000 levels: libyaml alone takes ~20 s (its scan is quadratic in depth) */
    const int deep = 80000;
    char *big = malloc(deep + 64);
    size_t n = (size_t)sprintf(big, "lora:\n  r: 8\nmodel:\n  ");
    for (int i = 0; i < deep; i++) big[n++] = i % 2 ? '{' : '[';
    double t0 = ct_now();
    int rc = config_parse_text(c, big, n, "deep.yaml", &e);
    double secs = ct_now() - t0;
    CHECK(rc == CT_ERR_INPUT && starts_with(e.msg, "deep.yaml:4: nesting deeper than 64 levels"), "%s", e.msg);
    CHECK(secs < 0.1, "%d levels took %.2f s", deep, secs);
    /* one line per level ('[' then a newline) and nested block lists ("- - - x") alike */
    n = (size_t)sprintf(big, "model: ");
    for (int i = 0; i < deep; i++) big[n++] = i % 3 == 0 ? '[' : i % 3 == 1 ? '\n' : ' ';
    t0 = ct_now();
    CHECK(config_parse_text(c, big, n, "lines.yaml", &e) == CT_ERR_INPUT && strstr(e.msg, "nesting deeper than 64"),
          "%s", e.msg);
    n = (size_t)sprintf(big, "model:\n  ");
    for (int i = 0; i < deep / 2; i++) big[n++] = i % 2 ? ' ' : '-';
    CHECK(config_parse_text(c, big, n, "dash.yaml", &e) == CT_ERR_INPUT &&
          starts_with(e.msg, "dash.yaml:2: nesting deeper than 64 levels"), "%s", e.msg);
    secs = ct_now() - t0;
    CHECK(secs < 0.2, "took %.2f s", secs);
    /* the same bound on a --set value */
    n = (size_t)sprintf(big, "model=");
    for (int i = 0; i < deep; i++) big[n++] = '[';
    big[n] = '\0';
    t0 = ct_now();
    CHECK(config_set(c, big, &e) == CT_ERR_INPUT && strstr(e.msg, ": the value nests deeper than 64 levels"), "%.80s",
          e.msg);
    CHECK(ct_now() - t0 < 0.1, "--set took %.2f s", ct_now() - t0);
    free(big);
    free(c);
}

TEST(control_characters_in_set_are_one_line_errors)
{
    ct_config *c = malloc(sizeof *c), *d = malloc(sizeof *d);
    ct_error e = {0};
    config_defaults(c);
    memcpy(d, c, sizeof *d);
    /* YAML would fold the newline into "runs/a b" and take it */
    CHECK(config_set(c, "output_dir=runs/a\nb", &e) == CT_ERR_INPUT &&
          !strcmp(e.msg, "--set output_dir=runs/a\\x0ab: the value holds a control character (byte 0x0a; expected "
                         "printable text)"), "%s", e.msg);
    CHECK(config_set(c, "lora.r\t=8", &e) == CT_ERR_INPUT && !strchr(e.msg, '\t') &&
          strstr(e.msg, ": the key holds a control character (byte 0x09"), "%s", e.msg);
    CHECK(config_set(c, "model=m\x7f", &e) == CT_ERR_INPUT && strstr(e.msg, "byte 0x7f"), "%s", e.msg);
    CHECK(!config_diff(c, d), "a refused --set changed %s", config_diff(c, d));
    /* a control character the YAML escapes put into a value is written escaped in the message */
    EXPECT_LOAD_ERROR("ctl.yaml", "lora:\n  r: \"8\\n9\\t\"\n", 2, "lora.r: '8\\x0a9\\x09' is not an integer");
    CHECK(config_set(c, "lora.r=\"8\\n9\"", &e) == CT_ERR_INPUT && !strchr(e.msg, '\n') &&
          strstr(e.msg, "'8\\x0a9' is not an integer"), "%s", e.msg);
    free(c); free(d);
}

TEST(nul_inside_a_key_or_a_value_is_refused)
{
    /* a double-quoted "\0" makes the NUL; C would see "model" and "8" */
    EXPECT_LOAD_ERROR("nulkey.yaml", "\"model\\0junk\": m\n", 1,
                      "the key 'model' goes on past a NUL character (expected a plain key name)");
    EXPECT_LOAD_ERROR("nulkey2.yaml", "lora:\n  \"r\\0\": 8\n", 2, "the key 'lora.r' goes on past a NUL character");
    EXPECT_LOAD_ERROR("nulval.yaml", "lora:\n  r: \"8\\0x\"\n", 2, "lora.r: the value holds a NUL character");
    EXPECT_LOAD_ERROR("nultm.yaml", "lora:\n  target_modules: [\"q_proj\\0\"]\n", 2,
                      "lora.target_modules: an entry holds a NUL character");
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    config_defaults(c);
    CHECK(config_set(c, "training.seed=\"7\\0\"", &e) == CT_ERR_INPUT && strstr(e.msg, "holds a NUL character"),
          "%s", e.msg);
    free(c);
}

TEST(bad_target_module_lists_valid_names)
{
    EXPECT_LOAD_ERROR("tm1.yaml", "lora:\n  target_modules:\n    - q_proj\n    - qkv_proj\n", 4,
                      "lora.target_modules: unknown module 'qkv_proj' (expected one of q_proj, k_proj, v_proj, o_proj, "
                      "gate_proj, up_proj, down_proj (Gated DeltaNet layers: in_proj_qkv, in_proj_z, in_proj_b, "
                      "in_proj_a, out_proj, or qwen3_next's in_proj_qkvz, in_proj_ba, out_proj; the MoE hybrids: "
                      "shared_expert_gate); Mixtral's w1, w3, w2 stand for gate_proj, up_proj, down_proj)");
    EXPECT_LOAD_ERROR("tm2.yaml", "lora:\n  target_modules: [q_proj, v_proj, q_proj]\n", 2,
                      "lora.target_modules: 'q_proj' is listed twice");
    EXPECT_LOAD_ERROR("tm3.yaml", "lora:\n  target_modules: all\n", 2, "lora.target_modules: 'all' is not all-linear");
    EXPECT_LOAD_ERROR("tm4.yaml", "lora:\n  target_modules: []\n", 2, "lora.target_modules: empty list");
    EXPECT_LOAD_ERROR("tm5.yaml", "lora:\n  target_modules: [w1, gate_proj]\n", 2,
                      "lora.target_modules: 'gate_proj' is listed twice"); /* w1 is gate_proj */
}

TEST(target_module_list_is_kept_in_order)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    REQUIRE(config_load(c, write_yaml("tm.yaml", "lora:\n  target_modules: [v_proj, q_proj]\n"), &e) == CT_OK, "%s", e.msg);
    CHECK(!c->lora.target_all_linear && c->lora.n_target_modules == 2, "n %d", c->lora.n_target_modules);
    CHECK(!strcmp(c->lora.target_modules[0], "v_proj") && !strcmp(c->lora.target_modules[1], "q_proj"), "order");
    /* Mixtral's expert names, as PEFT and Axolotl configs list them */
    REQUIRE(config_load(c, write_yaml("tmx.yaml", "lora:\n  target_modules: [w2, w1, w3]\n"), &e) == CT_OK, "%s", e.msg);
    CHECK(c->lora.n_target_modules == 3 && !strcmp(c->lora.target_modules[0], "down_proj") &&
          !strcmp(c->lora.target_modules[1], "gate_proj") && !strcmp(c->lora.target_modules[2], "up_proj"),
          "w2, w1, w3 kept as %s, %s, %s", c->lora.target_modules[0], c->lora.target_modules[1],
          c->lora.target_modules[2]);
    free(c);
}

TEST(file_lists_take_one_string_or_a_list)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    const char *p = write_yaml("files.yaml", "data:\n  train_files: data/train-*.shard\n  eval_files:\n"
                                             "    - a.shard\n    - \"b c.shard\"\n");
    REQUIRE(config_load(c, p, &e) == CT_OK, "%s", e.msg);
    CHECK(c->data.n_train_files == 1 && !strcmp(c->data.train_files[0], "data/train-*.shard"), "glob kept as written");
    CHECK(c->data.n_eval_files == 2 && !strcmp(c->data.eval_files[1], "b c.shard"), "list");
    EXPECT_LOAD_ERROR("files2.yaml", "data:\n  train_files:\n    - a\n    - {x: 1}\n", 4,
                      "data.train_files: entry 2 is a mapping");
    free(c);
}

TEST(load_failure_leaves_config_untouched)
{
    ct_config *c = malloc(sizeof *c), *d = malloc(sizeof *d);
    ct_error e = {0};
    config_defaults(c);
    c->lora.r = 7;
    memcpy(d, c, sizeof *d);
    CHECK(config_load(c, write_yaml("half.yaml", "lora:\n  r: 8\n  lora_alpha: -1\n"), &e) == CT_ERR_INPUT, "rc");
    CHECK(!config_diff(c, d), "changed %s", config_diff(c, d));
    CHECK(config_load(c, "/nonexistent/ctune.yaml", &e) != CT_OK && starts_with(e.msg, "/nonexistent/ctune.yaml"),
          "%s", e.msg);
    /* fopen opens a folder and only the read fails: the message says what it is */
    CHECK(config_load(c, "configs", &e) == CT_ERR_INPUT && !strcmp(e.msg, "configs: is a folder, not a file"),
          "%s", e.msg);
    free(c); free(d);
}

TEST(set_overrides_every_kind_of_value)
{
    ct_config *c = malloc(sizeof *c);
    ct_error e = {0};
    config_defaults(c);
    CHECK(config_set(c, "lora.r=32", &e) == CT_OK && c->lora.r == 32, "int: %s", e.msg);
    CHECK(config_set(c, "training.learning_rate=1e-4", &e) == CT_OK && c->training.learning_rate == 1e-4, "float: %s", e.msg);
    CHECK(config_set(c, "lora.use_rslora=true", &e) == CT_OK && c->lora.use_rslora, "bool: %s", e.msg);
    CHECK(config_set(c, "model=models/qwen3-0.6b", &e) == CT_OK && !strcmp(c->model, "models/qwen3-0.6b"), "str: %s", e.msg);
    CHECK(config_set(c, "lora.target_modules=[q_proj,v_proj]", &e) == CT_OK && c->lora.n_target_modules == 2 &&
          !c->lora.target_all_linear && !strcmp(c->lora.target_modules[1], "v_proj"), "list: %s", e.msg);
    CHECK(config_set(c, "lora.target_modules=all-linear", &e) == CT_OK && c->lora.n_target_modules == 7, "all: %s", e.msg);
    CHECK(config_set(c, "data.train_files=[a.shard, b.shard]", &e) == CT_OK && c->data.n_train_files == 2, "files: %s", e.msg);
    CHECK(config_set(c, "data.eval_files=e.shard", &e) == CT_OK && c->data.n_eval_files == 1, "one file: %s", e.msg);
    CHECK(config_set(c, "data.eval_files=", &e) == CT_OK && c->data.n_eval_files == 0, "clear: %s", e.msg);
    CHECK(config_set(c, "memory.activation_offload=on", &e) == CT_OK && c->memory.activation_offload == CT_TRI_ON, "tri");
    CHECK(config_set(c, "memory.gpu_memory_limit=19.5", &e) == CT_OK && c->memory.gpu_memory_limit == 19.5, "limit: %s",
          e.msg);
    CHECK(config_set(c, "training.resume_from_checkpoint=false", &e) == CT_OK &&
          c->training.resume_mode == CT_RESUME_FALSE, "resume false: %s", e.msg);
    CHECK(config_set(c, "training.resume_from_checkpoint=runs/x/checkpoint-50", &e) == CT_OK &&
          c->training.resume_mode == CT_RESUME_PATH &&
          !strcmp(c->training.resume_from_checkpoint, "runs/x/checkpoint-50"), "resume path: %s", e.msg);
    CHECK(config_set(c, "training.seed=123456789012", &e) == CT_OK && c->training.seed == 123456789012LL, "seed");
    free(c);
}

TEST(set_errors_name_the_override)
{
    ct_config *c = malloc(sizeof *c), *d = malloc(sizeof *d);
    ct_error e = {0};
    config_defaults(c);
    memcpy(d, c, sizeof *d);
    CHECK(config_set(c, "lora.rank=8", &e) == CT_ERR_INPUT &&
          !strcmp(e.msg, "--set lora.rank=8: unknown key 'lora.rank' (did you mean 'lora.r'?)"), "%s", e.msg);
    CHECK(config_set(c, "training.max_steps=ten", &e) == CT_ERR_INPUT &&
          starts_with(e.msg, "--set training.max_steps=ten: training.max_steps: 'ten' is not an integer"), "%s", e.msg);
    CHECK(config_set(c, "lora.lora_dropout=1.5", &e) == CT_ERR_INPUT &&
          starts_with(e.msg, "--set lora.lora_dropout=1.5: lora.lora_dropout: 1.5 is out of range"), "%s", e.msg);
    CHECK(config_set(c, "lora.target_modules=[q_proj,foo]", &e) == CT_ERR_INPUT &&
          strstr(e.msg, "unknown module 'foo'"), "%s", e.msg);
    CHECK(config_set(c, "lora.r", &e) == CT_ERR_INPUT && starts_with(e.msg, "--set lora.r: expected KEY=VALUE"), "%s", e.msg);
    CHECK(config_set(c, "lora=8", &e) == CT_ERR_INPUT && starts_with(e.msg, "--set lora=8: 'lora' is a section"), "%s", e.msg);
    CHECK(config_set(c, "model=[a", &e) == CT_ERR_INPUT &&
          starts_with(e.msg, "--set model=[a: the value is not valid YAML"), "%s", e.msg);
    CHECK(config_set(c, "model=", &e) == CT_ERR_INPUT && strstr(e.msg, "model: no value"), "%s", e.msg);
    CHECK(!config_diff(c, d), "a failed --set changed %s", config_diff(c, d));
    free(c); free(d);
}

TEST(print_then_load_gives_the_same_config)
{
    ct_config *c = malloc(sizeof *c), *back = malloc(sizeof *back);
    ct_error e = {0};
    config_defaults(c);
    const char *sets[] = {
        "model=models/my model", "output_dir='runs/#1: test'", "device=cuda", "lora.r=8", "lora.lora_alpha=0.1",
        "lora.lora_dropout=0.05", "lora.use_rslora=true", "lora.target_modules=[down_proj, q_proj]",
        "lora.init_lora_weights=gaussian", "data.train_files=['*.shard', \"a\\\"b.shard\", null.shard]",
        "data.max_length=1000", "data.packing=false", "data.tokens_per_micro_batch=999", "data.shuffle_window=7",
        "training.learning_rate=3.3333333333333335e-05", "training.lr_scheduler_type=linear", "training.warmup_steps=0",
        "training.max_steps=-1", "training.num_train_epochs=0.7", "training.gradient_accumulation_steps=4",
        "training.weight_decay=0.01", "training.adam_beta1=0.95", "training.adam_beta2=0.98",
        "training.adam_epsilon=1e-6", "training.max_grad_norm=0", "training.seed=7", "training.logging_steps=1",
        "training.eval_steps=0", "training.save_steps=0", "training.save_total_limit=0",
        "training.resume_from_checkpoint=runs/a b/checkpoint-1", "memory.gradient_checkpointing=false",
        "memory.activation_offload=off",
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        REQUIRE(config_set(c, sets[i], &e) == CT_OK, "%s", e.msg);
    char path[512];
    snprintf(path, sizeof path, "%s/printed.yaml", tmp_dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f, "cannot write %s", path);
    config_print(c, f);
    fclose(f);
    REQUIRE(config_load(back, path, &e) == CT_OK, "%s", e.msg);
    CHECK(!config_diff(back, c), "round trip differs in %s", config_diff(back, c));

    config_defaults(c);
    f = fopen(path, "w");
    config_print(c, f);
    fclose(f);
    REQUIRE(config_load(back, path, &e) == CT_OK, "%s", e.msg);
    CHECK(!config_diff(back, c), "defaults round trip differs in %s", config_diff(back, c));
    free(c); free(back);
}

TEST(lora_scaling_is_alpha_over_r_or_sqrt_r)
{
    ct_lora_config l = { .r = 16, .lora_alpha = 32 };
    CHECK(config_lora_scaling(&l) == 2.0, "%g", config_lora_scaling(&l));
    l.use_rslora = true;
    CHECK(config_lora_scaling(&l) == 8.0, "%g", config_lora_scaling(&l));
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ctune_test_config_XXXXXX");
    CT_ASSERT(mkdtemp(tmp_dir), "mkdtemp failed");
    RUN(defaults_match_documented_values);
    RUN(reference_yaml_is_defaults_plus_required_keys);
    RUN(tiny_yaml_loads_and_validates);
    RUN(empty_file_is_defaults_and_validate_asks_for_model);
    RUN(validate_without_source_file_says_config);
    RUN(unknown_key_suggests_closest_known_key);
    RUN(wrong_type_names_key_value_and_expectation);
    RUN(out_of_range_values_are_rejected);
    RUN(max_steps_minus_one_selects_epochs);
    RUN(duplicate_key_names_both_lines);
    RUN(syntax_error_reports_libyaml_problem_and_line);
    RUN(only_one_mapping_document_is_accepted);
    RUN(section_given_as_scalar_is_rejected);
    RUN(empty_section_is_allowed);
    RUN(max_length_over_micro_batch_is_a_contradiction);
    RUN(warmup_longer_than_max_steps_is_a_contradiction);
    RUN(warmup_error_blames_the_set_or_the_line_that_gave_each_value);
    RUN(range_and_offload_errors_blame_where_the_value_was_set);
    RUN(epochs_alone_decide_the_steps);
    RUN(max_steps_wins_when_both_are_given);
    RUN(steps_beyond_int_are_an_input_error_naming_the_epochs);
    RUN(warmup_longer_than_the_epochs_is_a_contradiction);
    RUN(nesting_deeper_than_64_levels_fails_fast_naming_the_line);
    RUN(control_characters_in_set_are_one_line_errors);
    RUN(nul_inside_a_key_or_a_value_is_refused);
    RUN(bad_target_module_lists_valid_names);
    RUN(target_module_list_is_kept_in_order);
    RUN(file_lists_take_one_string_or_a_list);
    RUN(load_failure_leaves_config_untouched);
    RUN(set_overrides_every_kind_of_value);
    RUN(set_errors_name_the_override);
    RUN(print_then_load_gives_the_same_config);
    RUN(lora_scaling_is_alpha_over_r_or_sqrt_r);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    return check_summary();
}
