/* test_plot.c — metrics.jsonl read back (resumed runs rewind, broken lines are
 * skipped) and loss.svg's content (every point drawn, the title escaped, a
 * file with no points still a complete document). tests/tools.test.sh parses
 * a real run's loss.svg with an XML parser. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "plot.h"

static char dir[64];

static int write_metrics(const char *text)
{
    char path[128];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    ct_error err = {0};
    return ct_write_file_atomic(path, text, strlen(text), &err);
}

static size_t count(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

TEST(a_resumed_run_rewinds_to_the_checkpoint_step)
{
    /* steps 1..4 and an eval at 4, then a resume from step 2 that reaches 3 */
    REQUIRE(write_metrics("{\"step\": 1, \"loss\": 5.0, \"lr\": 1e-3, \"tokens\": 100, \"elapsed\": 1.0}\n"
                          "{\"step\": 2, \"loss\": 4.0, \"lr\": 1e-3, \"tokens\": 200, \"elapsed\": 2.0}\n"
                          "{\"step\": 3, \"loss\": 3.5, \"lr\": 1e-3, \"tokens\": 300, \"elapsed\": 3.0}\n"
                          "{\"step\": 4, \"loss\": 3.0, \"lr\": 1e-3, \"tokens\": 400, \"elapsed\": 4.0}\n"
                          "{\"step\": 4, \"eval_loss\": 3.2, \"eval_tokens\": 50}\n"
                          "{\"step\": 3, \"loss\": 3.4, \"lr\": 1e-3, \"tokens\": 300, \"elapsed\": 3.1, \"memory_gib\": 2.5}\n"
                          "{\"step\": 4, \"lo") == CT_OK, "write");
    char path[128];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    ct_metrics m;
    ct_error err = {0};
    REQUIRE(metrics_read(path, &m, &err) == CT_OK, "read: %s", err.msg);
    CHECK(m.n_train == 3, "%zu train points, expected 3 (1, 2, and the resumed 3)", m.n_train);
    CHECK(m.n_train == 3 && m.train[2].loss == 3.4 && m.train[2].memory_gib == 2.5, "the resumed step 3 is not last");
    CHECK(m.n_eval == 0, "the eval of the abandoned step 4 survived the rewind");
    metrics_free(&m);
}

TEST(the_svg_draws_every_point_and_escapes_the_title)
{
    ct_train_point t[3] = {{.step = 1, .loss = 5, .lr = 1e-3}, {.step = 2, .loss = 4, .lr = 2e-3},
                           {.step = 3, .loss = 3, .lr = 1e-3}};
    ct_eval_point e[2] = {{.step = 2, .loss = 4.5}, {.step = 3, .loss = 3.5}};
    ct_metrics m = {.train = t, .n_train = 3, .eval = e, .n_eval = 2};
    size_t len;
    char *svg = plot_svg(&m, "runs/a&b<c>", &len);
    CHECK(strlen(svg) == len, "length %zu vs %zu", strlen(svg), len);
    CHECK(count(svg, "<polyline") == 3, "%zu polylines (train, lr, eval)", count(svg, "<polyline"));
    CHECK(count(svg, "<circle") == 2, "%zu eval markers", count(svg, "<circle"));
    CHECK(strstr(svg, "runs/a&amp;b&lt;c&gt;") != NULL, "title not escaped");
    CHECK(strstr(svg, "a&b") == NULL, "a raw '&' in the document");
    CHECK(len > 6 && !strcmp(svg + len - 7, "</svg>\n"), "the document is not closed");
    free(svg);
}

TEST(an_empty_history_still_gives_a_complete_svg)
{
    ct_metrics m = {0};
    size_t len;
    char *svg = plot_svg(&m, "run", &len);
    CHECK(strstr(svg, "no data yet") != NULL, "no placeholder");
    CHECK(strstr(svg, "nan") == NULL && strstr(svg, "inf") == NULL, "non-finite coordinates");
    CHECK(!strcmp(svg + len - 7, "</svg>\n"), "the document is not closed");
    free(svg);
}

TEST(plot_run_writes_loss_svg_next_to_metrics)
{
    REQUIRE(write_metrics("{\"step\": 1, \"loss\": 5.0, \"lr\": 1e-3}\n{\"step\": 1, \"eval_loss\": 5.5}\n") == 0,
            "write");
    ct_error err = {0};
    REQUIRE(plot_run(dir, &err) == CT_OK, "plot_run: %s", err.msg);
    char path[128];
    snprintf(path, sizeof path, "%s/loss.svg", dir);
    size_t len;
    char *svg = ct_read_file(path, &len, &err);
    REQUIRE(svg, "read: %s", err.msg);
    CHECK(strstr(svg, "<svg") && count(svg, "<circle") == 1, "loss.svg lacks the plot");
    free(svg);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/ctune_plot_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    RUN(a_resumed_run_rewinds_to_the_checkpoint_step);
    RUN(the_svg_draws_every_point_and_escapes_the_title);
    RUN(an_empty_history_still_gives_a_complete_svg);
    RUN(plot_run_writes_loss_svg_next_to_metrics);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) printf("could not remove %s\n", dir);
    return check_summary();
}
