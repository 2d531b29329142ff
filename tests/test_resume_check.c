/* test_resume_check.c — what resume_check lets a run continue under (the keys
 * the math depends on, the adapter's shape, the schedule's length, the data by
 * content, training.resume_allow_changes read by name), and metrics_truncate,
 * which cuts a resumed run's metrics.jsonl back to its checkpoint.
 * tests/resume.test.sh drives the same through `ctune train`. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "metrics.h"
#include "resume_check.h"

static ct_config base_cfg, new_cfg;

/* config_print of the defaults with these overrides, into a malloc'd string. */
static char *printed(ct_config *cfg, const char *const *sets)
{
    config_defaults(cfg);
    ct_error err = {0};
    CT_ASSERT(config_set(cfg, "model=m", &err) == CT_OK && config_set(cfg, "output_dir=o", &err) == CT_OK &&
              config_set(cfg, "data.train_files=[a.shard, b.shard]", &err) == CT_OK, "%s", err.msg);
    for (; sets && *sets; sets++) CT_ASSERT(config_set(cfg, *sets, &err) == CT_OK, "%s", err.msg);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_print(cfg, f);
    fclose(f);
    return buf;
}

typedef struct outcome {
    int rc;
    char notes[4096];
    ct_error err;
} outcome;

/* resume_check of NOW against THEN (each a list of --set values), with facts
 * that agree unless changed by the caller through f. */
static outcome compare_facts(const char *const *then, const char *const *now, ct_resume_facts f)
{
    outcome o = {0};
    char *saved = printed(&base_cfg, then), *text = printed(&new_cfg, now);
    f.checkpoint = "o/checkpoint-4";
    f.saved_config = saved;
    f.saved_from = "o/checkpoint-4/run_config.yaml";
    FILE *notes = fmemopen(o.notes, sizeof o.notes - 1, "w");
    o.rc = resume_check(&new_cfg, text, &f, notes, &o.err);
    fclose(notes);
    free(saved);
    free(text);
    return o;
}

static outcome compare(const char *const *then, const char *const *now)
{
    return compare_facts(then, now, (ct_resume_facts){.saved_total_steps = 10, .total_steps = 10,
                                                       .has_data_crc = true, .saved_data_crc = 7, .data_crc = 7});
}

TEST(the_same_config_resumes_without_a_word)
{
    outcome o = compare(NULL, NULL);
    CHECK(o.rc == CT_OK && !o.notes[0], "rc %d, notes '%s', %s", o.rc, o.notes, o.err.msg);
}

TEST(keys_that_do_not_change_the_math_are_reported)
{
    const char *now[] = {"training.logging_steps=5", "training.save_steps=7", "device=cpu", NULL};
    outcome o = compare(NULL, now);
    CHECK(o.rc == CT_OK, "%s", o.err.msg);
    CHECK(strstr(o.notes, "resume: training.logging_steps changed 10 -> 5\n") != NULL, "%s", o.notes);
    CHECK(strstr(o.notes, "resume: training.save_steps changed 200 -> 7\n") != NULL, "%s", o.notes);
    CHECK(strstr(o.notes, "resume: device changed auto -> cpu\n") != NULL, "%s", o.notes);
}

TEST(a_new_learning_rate_is_refused_naming_the_checkpoint_and_the_key)
{
    const char *now[] = {"training.learning_rate=1e-3", "lora.lora_alpha=8", NULL};
    outcome o = compare(NULL, now);
    CHECK(o.rc == CT_ERR_INPUT, "rc %d", o.rc);
    CHECK(strstr(o.err.msg, "o/checkpoint-4: cannot resume: lora.lora_alpha, training.learning_rate changed") ==
          o.err.msg, "%s", o.err.msg);
    CHECK(strstr(o.notes, "resume: training.learning_rate changed 0.0002 -> 0.001") != NULL, "%s", o.notes);
    CHECK(!strchr(o.err.msg, '\n'), "one line: %s", o.err.msg);
}

TEST(a_changed_file_list_is_refused_without_a_data_crc)
{
    const char *now[] = {"data.train_files=[a.shard, c.shard]", NULL};
    outcome o = compare_facts(NULL, now, (ct_resume_facts){.saved_total_steps = 10, .total_steps = 10});
    CHECK(o.rc == CT_ERR_INPUT && strstr(o.err.msg, "data.train_files") != NULL, "%s", o.err.msg);
    CHECK(strstr(o.notes, "data.train_files changed [a.shard, b.shard] -> [a.shard, c.shard]") != NULL, "%s", o.notes);
}

TEST(the_data_is_judged_by_its_crc_when_the_checkpoint_has_one)
{
    const char *moved[] = {"data.train_files=[/x/a.shard, /x/b.shard]", NULL};
    outcome o = compare(NULL, moved);
    CHECK(o.rc == CT_OK, "same contents elsewhere: %s", o.err.msg);
    o = compare_facts(NULL, NULL, (ct_resume_facts){.saved_total_steps = 10, .total_steps = 10, .has_data_crc = true,
                                                    .saved_data_crc = 7, .data_crc = 8});
    CHECK(o.rc == CT_ERR_INPUT && strstr(o.err.msg, "data.train_files (contents)") != NULL, "%s", o.err.msg);
}

TEST(a_longer_schedule_is_refused_unless_the_learning_rate_is_constant)
{
    const char *then[] = {"training.max_steps=10", NULL}, *now[] = {"training.max_steps=20", NULL};
    ct_resume_facts longer = {.saved_total_steps = 10, .total_steps = 20, .has_data_crc = true};
    outcome o = compare_facts(then, now, longer);
    CHECK(o.rc == CT_ERR_INPUT && strstr(o.err.msg, "training.max_steps/num_train_epochs") != NULL, "%s", o.err.msg);
    const char *then_c[] = {"training.max_steps=10", "training.lr_scheduler_type=constant", NULL};
    const char *now_c[] = {"training.max_steps=20", "training.lr_scheduler_type=constant", NULL};
    o = compare_facts(then_c, now_c, longer);
    CHECK(o.rc == CT_OK, "%s", o.err.msg);
    CHECK(strstr(o.notes, "the run now has 20 steps, the checkpoint's run had 10") != NULL, "%s", o.notes);
    /* the same length, however it is asked for */
    const char *epochs[] = {"training.max_steps=-1", "training.num_train_epochs=3", NULL};
    o = compare(then, epochs);
    CHECK(o.rc == CT_OK, "%s", o.err.msg);
}

TEST(resume_allow_changes_lets_the_math_change_but_not_the_shapes)
{
    char *saved = printed(&base_cfg, NULL), *text = printed(&new_cfg, (const char *[]){"training.seed=3", NULL});
    char *allowed = printed(&new_cfg, (const char *[]){"training.seed=3", "training.resume_allow_changes=true", NULL});
    ct_resume_facts f = {.checkpoint = "o/checkpoint-4", .saved_config = saved, .saved_from = "x",
                         .saved_total_steps = 10, .total_steps = 10};
    ct_error err = {0};
    CHECK(resume_check(&new_cfg, text, &f, NULL, &err) == CT_ERR_INPUT, "not allowed: refused");
    CHECK(strstr(err.msg, "set training.resume_allow_changes: true to continue anyway") != NULL,
          "the refusal names the way out: %s", err.msg);
    CHECK(resume_check(&new_cfg, allowed, &f, NULL, &err) == CT_OK, "allowed: %s", err.msg);
    free(allowed);
    allowed = printed(&new_cfg, (const char *[]){"lora.r=8", "training.resume_allow_changes=true", NULL});
    CHECK(resume_check(&new_cfg, allowed, &f, NULL, &err) == CT_ERR_INPUT && strstr(err.msg, "lora.r changed"),
          "a rank change is never allowed: %s", err.msg);
    free(allowed);
    free(saved);
    free(text);
}

TEST(comments_in_the_printed_config_are_ignored)
{
    char *saved = printed(&base_cfg, NULL), *text = printed(&new_cfg, NULL);
    /* a printer that says where each value came from must not read as a change */
    char *commented = malloc(2 * strlen(text) + 64);
    size_t o = 0;
    for (const char *p = text; *p; p++) {
        if (*p == '\n') o += (size_t)sprintf(commented + o, "  # --set x");
        commented[o++] = *p;
    }
    commented[o] = '\0';
    ct_resume_facts f = {.checkpoint = "c", .saved_config = saved, .saved_from = "x", .saved_total_steps = 1,
                         .total_steps = 1};
    ct_error err = {0};
    char notes[256] = "";
    FILE *n = fmemopen(notes, sizeof notes - 1, "w");
    CHECK(resume_check(&new_cfg, commented, &f, n, &err) == CT_OK, "%s", err.msg);
    fclose(n);
    CHECK(!notes[0], "notes: %s", notes);
    free(commented);
    free(saved);
    free(text);
}

static char dir[64];

TEST(metrics_are_cut_back_to_the_checkpoint_step)
{
    char path[128];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    const char *text = "{\"step\": 1, \"loss\": 5.0}\n{\"step\": 2, \"loss\": 4.0}\n{\"step\": 2, \"eval_loss\": 4.1}\n"
                       "{\"step\": 3, \"loss\": 3.0}\n{\"step\": 4, \"lo";
    ct_error err = {0};
    REQUIRE(ct_write_file_atomic(path, text, strlen(text), &err) == CT_OK, "%s", err.msg);
    REQUIRE(metrics_truncate(path, 2, &err) == CT_OK, "%s", err.msg);
    size_t len;
    char *got = ct_read_file(path, &len, &err);
    CHECK(got && !strcmp(got, "{\"step\": 1, \"loss\": 5.0}\n{\"step\": 2, \"loss\": 4.0}\n{\"step\": 2, \"eval_loss\": 4.1}\n"),
          "got '%s'", got);
    free(got);
    /* a complete last record without its newline was cut short too */
    REQUIRE(ct_write_file_atomic(path, "{\"step\": 1}\n{\"step\": 2}", 23, &err) == CT_OK, "%s", err.msg);
    REQUIRE(metrics_truncate(path, 5, &err) == CT_OK, "%s", err.msg);
    got = ct_read_file(path, &len, &err);
    CHECK(got && !strcmp(got, "{\"step\": 1}\n"), "got '%s'", got);
    free(got);
    REQUIRE(metrics_truncate(path, 0, &err) == CT_OK, "%s", err.msg);
    got = ct_read_file(path, &len, &err);
    CHECK(got && len == 0, "a fresh start keeps nothing: '%s'", got);
    free(got);
    snprintf(path, sizeof path, "%s/none.jsonl", dir);
    CHECK(metrics_truncate(path, 3, &err) == CT_OK, "a missing file is fine: %s", err.msg);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/ctune-resume-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    RUN(the_same_config_resumes_without_a_word);
    RUN(keys_that_do_not_change_the_math_are_reported);
    RUN(a_new_learning_rate_is_refused_naming_the_checkpoint_and_the_key);
    RUN(a_changed_file_list_is_refused_without_a_data_crc);
    RUN(the_data_is_judged_by_its_crc_when_the_checkpoint_has_one);
    RUN(a_longer_schedule_is_refused_unless_the_learning_rate_is_constant);
    RUN(resume_allow_changes_lets_the_math_change_but_not_the_shapes);
    RUN(comments_in_the_printed_config_are_ignored);
    RUN(metrics_are_cut_back_to_the_checkpoint_step);
    ct_remove_tree(dir);
    return check_summary();
}
