/* test_fuzz_regressions.c — replays, without libFuzzer, every input that once
 * crashed a fuzz target or broke its invariants (tests/fuzz_regressions/NAME/,
 * one folder per fuzz/fuzz_NAME.c), plus the repo files the fuzz corpora are
 * seeded from (for a folder reader, each seed folder's files joined as
 * fuzz/run.sh joins them). The targets are included whole, so CI calls exactly
 * the code `make fuzz` runs; under `make test-asan` the sanitizers watch each
 * replay. Each input runs in a child process: a regression fails the test
 * naming it. */
#include <dirent.h>
#include <glob.h>
#include <sys/wait.h>

#include "check.h"
#include "../fuzz/fuzz_adapter.c"
#include "../fuzz/fuzz_chat_template.c"
#include "../fuzz/fuzz_checkpoint.c"
#include "../fuzz/fuzz_config.c"
#include "../fuzz/fuzz_json.c"
#include "../fuzz/fuzz_model_config.c"
#include "../fuzz/fuzz_quant.c"
#include "../fuzz/fuzz_safetensors.c"
#include "../fuzz/fuzz_shard.c"
#include "../fuzz/fuzz_tokenizer.c"

typedef int (*fuzz_fn)(const uint8_t *data, size_t size);

/* Runs fn on data in a child process, so a crash or sanitizer abort becomes a
 * failure naming what, and the other inputs still run. */
static void replay_bytes(const char *what, const char *data, size_t len, fuzz_fn fn)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        fn((const uint8_t *)data, len);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the fuzz target %s %d on it", what,
          WIFSIGNALED(status) ? "died of signal" : "exited with", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

static void replay_file(const char *path, fuzz_fn fn)
{
    size_t len;
    ct_error err;
    char *data = ct_read_file(path, &len, &err);
    CHECK(data, "%s", err.msg);
    if (!data) return;
    replay_bytes(path, data, len, fn);
    free(data);
}

/* Every file in tests/fuzz_regressions/NAME and every match of the seed pattern
 * (NULL: none). */
static int replay(const char *name, const char *seeds, fuzz_fn fn)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fuzz_regressions/%s", name);
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        replay_file(path, fn);
        n++;
    }
    if (d) closedir(d);
    glob_t g = {0};
    if (seeds && glob(seeds, GLOB_BRACE, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++, n++) replay_file(g.gl_pathv[i], fn);
    globfree(&g);
    return n;
}

/* Each folder matching dirs (a pattern ending in the folder's name or a '/') as
 * one input of a folder reader: its files names (NULL-terminated) joined by
 * FUZZ_FILE_SEP, as fuzz/run.sh seeds them. */
static int replay_folders(const char *dirs, const char *const *names, fuzz_fn fn)
{
    glob_t g = {0};
    int n = 0;
    if (glob(dirs, 0, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++, n++) {
            char *joined = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&joined, &len);
            for (int k = 0; names[k]; k++) {
                char path[512];
                size_t part_len;
                ct_error err;
                snprintf(path, sizeof path, "%s/%s", g.gl_pathv[i], names[k]);
                char *part = ct_read_file(path, &part_len, &err);
                CHECK(part, "%s", err.msg);
                if (k) fputs(FUZZ_FILE_SEP, f);
                if (part) fwrite(part, 1, part_len, f);
                free(part);
            }
            fclose(f);
            replay_bytes(g.gl_pathv[i], joined, len, fn);
            free(joined);
        }
    globfree(&g);
    return n;
}

TEST(adapter_reader_survives_every_saved_input)
{
    static const char *const names[] = {"adapter_config.json", "adapter_model.safetensors", NULL};
    int n = replay("adapter", NULL, fuzz_adapter) + replay_folders("tests/fixtures/*/adapter", names, fuzz_adapter);
    CHECK(n > 0, "nothing replayed");
}

TEST(chat_template_engine_survives_every_saved_input)
{
    CHECK(replay("chat_template", "tests/fixtures/chat_templates/{*.jinja,fuzz_seeds/*}", fuzz_chat_template) > 0,
          "nothing replayed");
}

TEST(checkpoint_reader_survives_every_saved_input)
{
    static const char *const names[] = {"trainer_state.safetensors", "adapter_model.safetensors", "manifest.json",
                                        NULL};
    int n = replay("checkpoint", NULL, fuzz_checkpoint) + replay_folders("fuzz/seeds/checkpoint/*/", names, fuzz_checkpoint);
    CHECK(n > 0, "nothing replayed");
}

TEST(config_reader_survives_every_saved_input)
{
    CHECK(replay("config", "{configs/*.yaml,tests/fixtures/*/train.yaml}", fuzz_config) > 0, "nothing replayed");
}

TEST(json_reader_survives_every_saved_input)
{
    CHECK(replay("json", "configs/models/*/config.json", fuzz_json) > 0, "nothing replayed");
}

TEST(model_config_survives_every_saved_input)
{
    CHECK(replay("model_config", "configs/models/*/config.json", fuzz_model_config) > 0, "nothing replayed");
}

TEST(quantized_weight_readers_survive_every_saved_input)
{
    CHECK(replay("quant", "tests/fixtures/{parity_qwen3_nf4/model/model,parity_llama_fp4/model/model,"
                          "parity_gpt_oss_mxfp4/model/model,fp8/cases,mxfp4/cases,quant4/linear4bit}.safetensors",
                 fuzz_quant) > 0, "nothing replayed");
}

TEST(safetensors_reader_survives_every_saved_input)
{
    CHECK(replay("safetensors", "tests/fixtures/*/{adapter,model}/*.safetensors", fuzz_safetensors) > 0,
          "nothing replayed");
}

TEST(shard_reader_survives_every_saved_input)
{
    CHECK(replay("shard", "tests/fixtures/*/data/*.shard", fuzz_shard) > 0, "nothing replayed");
}

TEST(tokenizer_survives_every_saved_input)
{
    CHECK(replay("tokenizer", "tests/fixtures/tokenizer/fuzz_seeds/*", fuzz_tokenizer) > 0, "nothing replayed");
}

int main(void)
{
    RUN(adapter_reader_survives_every_saved_input);
    RUN(chat_template_engine_survives_every_saved_input);
    RUN(checkpoint_reader_survives_every_saved_input);
    RUN(config_reader_survives_every_saved_input);
    RUN(json_reader_survives_every_saved_input);
    RUN(model_config_survives_every_saved_input);
    RUN(quantized_weight_readers_survive_every_saved_input);
    RUN(safetensors_reader_survives_every_saved_input);
    RUN(shard_reader_survives_every_saved_input);
    RUN(tokenizer_survives_every_saved_input);
    return check_summary();
}
