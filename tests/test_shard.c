/* test_shard.c — the shard format: round trip, every validation rule on open,
 * datasets over several shards and glob expansion.
 * The byte offsets patched here are the layout table of docs/SHARDS.md, so these
 * tests also hold the documentation to the code. */
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "common.h"
#include "shard.h"

static char tmp_dir[256];

/* A path inside this run's temp folder; the result lives for the next 3 calls. */
static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 512, "%s/%s", tmp_dir, name);
    return p;
}

/* Three documents: lengths 3, 1, 4; the mask of the first hides its prompt. */
static const uint32_t doc0[] = {5, 17, 99}, doc1[] = {7}, doc2[] = {1, 2, 3, 1000};
static const uint8_t mask0[] = {0, 1, 1}, mask2[] = {0, 0, 1, 1};

static void write_sample(const char *path)
{
    shard_writer *w = shard_writer_new();
    shard_writer_add(w, doc0, mask0, 3);
    shard_writer_add(w, doc1, NULL, 1);
    shard_writer_add(w, doc2, mask2, 4);
    ct_error err = {0};
    CT_ASSERT(shard_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    shard_writer_free(w);
}

static uint8_t *slurp(const char *path, size_t *len)
{
    ct_error err = {0};
    char *b = ct_read_file(path, len, &err);
    CT_ASSERT(b, "%s", err.msg);
    return (uint8_t *)b;
}

static void spit(const char *path, const uint8_t *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    CT_ASSERT(f && fwrite(b, 1, len, f) == len && fclose(f) == 0, "cannot write %s", path);
}

/* Recomputes both CRCs so a test can reach the checks that come after them. */
static void fix_crcs(uint8_t *b, size_t len)
{
    uint32_t pcrc = (uint32_t)crc32(0L, b + 64, (uInt)(len - 64));
    memcpy(b + 36, &pcrc, 4);
    uint32_t hcrc = (uint32_t)crc32(0L, b, 60);
    memcpy(b + 60, &hcrc, 4);
}

/* Opens path expecting failure; returns the message (static) for checks. */
static const char *open_error(const char *path, uint32_t vocab, int *code)
{
    static ct_error err;
    memset(&err, 0, sizeof err);
    shard *s = shard_open(path, vocab, &err);
    if (s) {
        shard_close(s);
        return NULL;
    }
    if (code) *code = err.code;
    return err.msg;
}

TEST(shard_round_trip_keeps_docs_tokens_and_masks)
{
    const char *path = tmp_path("rt.shard");
    write_sample(path);
    ct_error err = {0};
    shard *s = shard_open(path, 1001, &err);
    REQUIRE(s, "open failed: %s", err.msg);
    CHECK(shard_num_docs(s) == 3, "docs %zu", shard_num_docs(s));
    CHECK(shard_num_tokens(s) == 8, "tokens %zu", shard_num_tokens(s));
    CHECK(shard_num_labels(s) == 5, "labels %zu", shard_num_labels(s));
    CHECK(shard_max_token(s) == 1000, "max %u", shard_max_token(s));
    CHECK(strcmp(shard_path(s), path) == 0, "path %s", shard_path(s));
    const uint32_t *docs[] = {doc0, doc1, doc2};
    const uint8_t one[] = {1};
    const uint8_t *masks[] = {mask0, one, mask2};
    const size_t lens[] = {3, 1, 4};
    for (size_t i = 0; i < 3; i++) {
        size_t len = 0;
        const uint32_t *t = shard_doc_tokens(s, i, &len);
        CHECK(len == lens[i], "doc %zu len %zu", i, len);
        CHECK(memcmp(t, docs[i], len * 4) == 0, "doc %zu tokens differ", i);
        CHECK(memcmp(shard_doc_mask(s, i), masks[i], len) == 0, "doc %zu mask differs", i);
    }
    shard_close(s);
}

TEST(shard_file_is_8_byte_aligned_and_left_without_tmp)
{
    const char *path = tmp_path("align.shard");
    write_sample(path);
    struct stat st;
    REQUIRE(stat(path, &st) == 0, "no file");
    /* 64 header + 4*8 offsets + 8*4 tokens + 8 mask = 136 */
    CHECK(st.st_size == 136, "size %lld", (long long)st.st_size);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "%s left behind", tmp);
}

TEST(shard_flipped_payload_byte_is_crc_error_naming_the_file)
{
    const char *path = tmp_path("flip.shard");
    write_sample(path);
    size_t len;
    uint8_t *b = slurp(path, &len);
    b[64 + 32 + 5] ^= 0x10; /* inside the tokens */
    spit(path, b, len);
    free(b);
    int code = 0;
    const char *msg = open_error(path, 0, &code);
    REQUIRE(msg, "corrupt shard opened");
    CHECK(code == CT_ERR_INPUT, "code %d", code);
    CHECK(strstr(msg, path) && strstr(msg, "CRC mismatch"), "message: %s", msg);
}

TEST(shard_every_single_byte_corruption_is_detected)
{
    const char *path = tmp_path("every.shard");
    write_sample(path);
    size_t len;
    uint8_t *orig = slurp(path, &len);
    for (size_t i = 0; i < len; i++) {
        uint8_t *b = ct_malloc(len);
        memcpy(b, orig, len);
        b[i] ^= 0x01;
        spit(path, b, len);
        free(b);
        CHECK(open_error(path, 0, NULL) != NULL, "flipping byte %zu went unnoticed", i);
    }
    free(orig);
}

TEST(shard_truncated_file_is_error)
{
    const char *path = tmp_path("trunc.shard");
    write_sample(path);
    size_t len;
    uint8_t *b = slurp(path, &len);
    for (size_t cut = 1; cut < len; cut++) {
        spit(path, b, cut);
        const char *msg = open_error(path, 0, NULL);
        CHECK(msg && strstr(msg, path), "truncated to %zu bytes: %s", cut, msg ? msg : "opened");
    }
    spit(path, b, len - 8);
    const char *msg = open_error(path, 0, NULL);
    CHECK(msg && strstr(msg, "truncated"), "message: %s", msg ? msg : "opened");
    free(b);
}

TEST(shard_trailing_bytes_are_error)
{
    const char *path = tmp_path("trail.shard");
    write_sample(path);
    size_t len;
    uint8_t *b = slurp(path, &len);
    uint8_t *longer = ct_calloc(1, len + 8);
    memcpy(longer, b, len);
    spit(path, longer, len + 8);
    const char *msg = open_error(path, 0, NULL);
    CHECK(msg && strstr(msg, "trailing"), "message: %s", msg ? msg : "opened");
    free(b);
    free(longer);
}

TEST(shard_bad_magic_is_error)
{
    const char *path = tmp_path("magic.shard");
    write_sample(path);
    size_t len;
    uint8_t *b = slurp(path, &len);
    memcpy(b, "GGUF\0\0\0\0", 8);
    spit(path, b, len);
    free(b);
    const char *msg = open_error(path, 0, NULL);
    CHECK(msg && strstr(msg, path) && strstr(msg, "not a ctune shard"), "message: %s", msg ? msg : "opened");
}

TEST(shard_wrong_version_is_error)
{
    const char *path = tmp_path("version.shard");
    write_sample(path);
    size_t len;
    uint8_t *b = slurp(path, &len);
    uint32_t v = 2;
    memcpy(b + 8, &v, 4);
    spit(path, b, len);
    free(b);
    const char *msg = open_error(path, 0, NULL);
    CHECK(msg && strstr(msg, "version 2 is not supported"), "message: %s", msg ? msg : "opened");
}

TEST(shard_wrong_token_width_is_error)
{
    const char *path = tmp_path("width.shard");
    write_sample(path);
    size_t len;
    uint8_t *b = slurp(path, &len);
    uint32_t w = 2;
    memcpy(b + 12, &w, 4);
    spit(path, b, len);
    free(b);
    const char *msg = open_error(path, 0, NULL);
    CHECK(msg && strstr(msg, "token width 2"), "message: %s", msg ? msg : "opened");
}

TEST(shard_huge_counts_in_header_are_errors_not_crashes)
{
    const char *path = tmp_path("huge.shard");
    write_sample(path);
    size_t len;
    uint8_t *b = slurp(path, &len);
    const uint64_t docs[] = {UINT64_MAX, UINT64_MAX / 8, 3, 3};
    const uint64_t toks[] = {8, 8, UINT64_MAX / 5 + 1, 1ull << 40};
    for (int i = 0; i < 4; i++) {
        memcpy(b + 16, &docs[i], 8);
        memcpy(b + 24, &toks[i], 8);
        fix_crcs(b, len);
        spit(path, b, len);
        const char *msg = open_error(path, 0, NULL);
        CHECK(msg && strstr(msg, path), "docs %llu tokens %llu: %s", (unsigned long long)docs[i],
              (unsigned long long)toks[i], msg ? msg : "opened");
    }
    free(b);
}

TEST(shard_non_monotone_offsets_are_error)
{
    const char *path = tmp_path("offsets.shard");
    write_sample(path);
    size_t len;
    uint8_t *b = slurp(path, &len);
    uint64_t off2 = 2; /* offsets are {0, 3, 4, 8}: make document 1 end before it starts */
    memcpy(b + 64 + 2 * 8, &off2, 8);
    fix_crcs(b, len);
    spit(path, b, len);
    const char *msg = open_error(path, 0, NULL);
    CHECK(msg && strstr(msg, "offsets decrease at document 2"), "message: %s", msg ? msg : "opened");

    uint64_t off_equal = 3; /* document 1 empty */
    memcpy(b + 64 + 2 * 8, &off_equal, 8);
    fix_crcs(b, len);
    spit(path, b, len);
    msg = open_error(path, 0, NULL);
    CHECK(msg && strstr(msg, "document 1 is empty"), "message: %s", msg ? msg : "opened");

    uint64_t off_last = 7, off_ok = 4;
    memcpy(b + 64 + 2 * 8, &off_ok, 8);
    memcpy(b + 64 + 3 * 8, &off_last, 8);
    fix_crcs(b, len);
    spit(path, b, len);
    msg = open_error(path, 0, NULL);
    CHECK(msg && strstr(msg, "last document offset 7"), "message: %s", msg ? msg : "opened");
    free(b);
}

TEST(shard_mask_value_other_than_0_1_is_error)
{
    const char *path = tmp_path("mask.shard");
    write_sample(path);
    size_t len;
    uint8_t *b = slurp(path, &len);
    b[64 + 32 + 32 + 5] = 2; /* mask of document 2, token 1 */
    fix_crcs(b, len);
    spit(path, b, len);
    free(b);
    const char *msg = open_error(path, 0, NULL);
    CHECK(msg && strstr(msg, "document 2 has loss mask value 2 at token 1"), "message: %s", msg ? msg : "opened");
}

TEST(shard_token_id_over_vocab_names_document_and_value)
{
    const char *path = tmp_path("vocab.shard");
    write_sample(path);
    int code = 0;
    const char *msg = open_error(path, 1000, &code);
    REQUIRE(msg, "opened with too small a vocab");
    CHECK(code == CT_ERR_INPUT, "code %d", code);
    char want[700];
    snprintf(want, sizeof want, "%s: document 2 has token id 1000 >= vocab_size 1000", path);
    CHECK(strcmp(msg, want) == 0, "message: %s", msg);
    CHECK(open_error(path, 100, NULL) && strstr(open_error(path, 100, NULL), "document 2"), "first bad doc");
    CHECK(open_error(path, 0, NULL) == NULL, "vocab 0 skips the check");
}

TEST(shard_empty_and_tiny_files_are_errors)
{
    const char *path = tmp_path("empty.shard");
    spit(path, (const uint8_t *)"", 0);
    const char *msg = open_error(path, 0, NULL);
    CHECK(msg && strstr(msg, path) && strstr(msg, "empty file"), "message: %s", msg ? msg : "opened");
    spit(path, (const uint8_t *)"CTSHARD", 8);
    msg = open_error(path, 0, NULL);
    CHECK(msg && strstr(msg, "too small"), "message: %s", msg ? msg : "opened");
    msg = open_error(tmp_path("missing.shard"), 0, NULL);
    CHECK(msg && strstr(msg, "cannot open"), "message: %s", msg ? msg : "opened");
    msg = open_error(tmp_dir, 0, NULL);
    CHECK(msg != NULL, "a folder opened as a shard");
}

/* A FIFO named in data.train_files: opening one for reading waits for a writer,
 * so the check must come before that wait. Run in a child with an alarm, so a
 * regression fails here instead of hanging the suite. */
TEST(shard_fifo_in_train_files_is_refused_without_blocking)
{
    const char *fifo = tmp_path("pipe.shard");
    REQUIRE(mkfifo(fifo, 0600) == 0, "mkfifo %s failed", fifo);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(5);
        ct_dataset ds;
        ct_error err = {0};
        const char *pats[] = {fifo};
        int rc = dataset_open(&ds, pats, 1, 0, &err);
        char want[600];
        snprintf(want, sizeof want, "%s: a FIFO, not a regular file", fifo);
        if (rc != CT_ERR_INPUT || strncmp(err.msg, want, strlen(want)) != 0) {
            printf("     rc %d, message: %s\n", rc, err.msg);
            _exit(1);
        }
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(!WIFSIGNALED(status), "shard_open blocked on the FIFO (killed by signal %d)",
          WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "not refused with a one-line input error naming it");
    unlink(fifo);
}

TEST(shard_writer_with_no_documents_refuses_to_save)
{
    shard_writer *w = shard_writer_new();
    ct_error err = {0};
    CHECK(shard_writer_save(w, tmp_path("none.shard"), &err) == CT_ERR_INPUT, "saved an empty shard");
    CHECK(access(tmp_path("none.shard"), F_OK) != 0, "file written");
    shard_writer_free(w);
}

static void write_n_docs(const char *path, uint32_t first, int n)
{
    shard_writer *w = shard_writer_new();
    for (int i = 0; i < n; i++) {
        uint32_t t[2] = {first + (uint32_t)i, 0};
        shard_writer_add(w, t, NULL, (size_t)(i % 2) + 1);
    }
    ct_error err = {0};
    CT_ASSERT(shard_writer_save(w, path, &err) == CT_OK, "%s", err.msg);
    shard_writer_free(w);
}

TEST(dataset_over_two_shards_maps_global_indices)
{
    char a[512], b[512];
    snprintf(a, sizeof a, "%s", tmp_path("ds-a.shard"));
    snprintf(b, sizeof b, "%s", tmp_path("ds-b.shard"));
    write_n_docs(a, 100, 3);
    write_n_docs(b, 200, 4);
    const char *pats[] = {a, b};
    ct_dataset ds;
    ct_error err = {0};
    int rc = dataset_open(&ds, pats, 2, 0, &err); /* REQUIRE evaluates its condition twice */
    REQUIRE(rc == CT_OK, "%s", err.msg);
    CHECK(ds.n_shards == 2 && ds.num_docs == 7, "shards %d docs %zu", ds.n_shards, ds.num_docs);
    CHECK(ds.num_tokens == (1 + 2 + 1) + (1 + 2 + 1 + 2), "tokens %zu", ds.num_tokens);
    CHECK(ds.doc_base[0] == 0 && ds.doc_base[1] == 3 && ds.doc_base[2] == 7, "doc_base");
    const uint32_t want[] = {100, 101, 102, 200, 201, 202, 203};
    for (size_t d = 0; d < 7; d++) {
        size_t len = 0;
        const uint8_t *mask = NULL;
        const uint32_t *t = dataset_doc(&ds, d, &len, &mask);
        CHECK(t[0] == want[d], "doc %zu starts with %u", d, t[0]);
        CHECK(mask && mask[0] == 1, "doc %zu mask", d);
    }
    dataset_close(&ds);
}

TEST(dataset_expands_globs_sorted)
{
    write_n_docs(tmp_path("g-2.shard"), 300, 1);
    write_n_docs(tmp_path("g-1.shard"), 200, 2);
    write_n_docs(tmp_path("g-3.shard"), 400, 1);
    char pat[512];
    snprintf(pat, sizeof pat, "%s", tmp_path("g-*.shard"));
    const char *pats[] = {pat};
    ct_dataset ds;
    ct_error err = {0};
    int rc = dataset_open(&ds, pats, 1, 0, &err);
    REQUIRE(rc == CT_OK, "%s", err.msg);
    REQUIRE(ds.n_shards == 3 && ds.num_docs == 4, "shards %d docs %zu", ds.n_shards, ds.num_docs);
    CHECK(strstr(shard_path(ds.shards[0]), "g-1.shard"), "first %s", shard_path(ds.shards[0]));
    CHECK(strstr(shard_path(ds.shards[2]), "g-3.shard"), "last %s", shard_path(ds.shards[2]));
    CHECK(dataset_doc(&ds, 3, NULL, NULL)[0] == 400, "last document");
    dataset_close(&ds);
}

TEST(dataset_pattern_with_no_match_is_error)
{
    char a[512], pat[512];
    snprintf(a, sizeof a, "%s", tmp_path("nm-a.shard"));
    snprintf(pat, sizeof pat, "%s", tmp_path("x-*.shard"));
    write_n_docs(a, 1, 1);
    const char *pats[] = {a, pat};
    ct_dataset ds;
    ct_error err = {0};
    CHECK(dataset_open(&ds, pats, 2, 0, &err) == CT_ERR_INPUT, "opened");
    char want[700];
    snprintf(want, sizeof want, "'%s' matches no file", pat);
    CHECK(strcmp(err.msg, want) == 0, "message: %s", err.msg);
    CHECK(ds.n_shards == 0 && ds.shards == NULL, "dataset not left zeroed");
    dataset_close(&ds);
}

TEST(dataset_with_a_bad_shard_names_it)
{
    char good[512], bad[512];
    snprintf(good, sizeof good, "%s", tmp_path("bd-a.shard"));
    snprintf(bad, sizeof bad, "%s", tmp_path("bd-b.shard"));
    write_n_docs(good, 1, 2);
    write_n_docs(bad, 5000, 2);
    const char *pats[] = {good, bad};
    ct_dataset ds;
    ct_error err = {0};
    CHECK(dataset_open(&ds, pats, 2, 4096, &err) == CT_ERR_INPUT, "opened");
    CHECK(strstr(err.msg, bad) && strstr(err.msg, ">= vocab_size 4096"), "message: %s", err.msg);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ctune-test-shard-XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(shard_round_trip_keeps_docs_tokens_and_masks);
    RUN(shard_file_is_8_byte_aligned_and_left_without_tmp);
    RUN(shard_flipped_payload_byte_is_crc_error_naming_the_file);
    RUN(shard_every_single_byte_corruption_is_detected);
    RUN(shard_truncated_file_is_error);
    RUN(shard_trailing_bytes_are_error);
    RUN(shard_bad_magic_is_error);
    RUN(shard_wrong_version_is_error);
    RUN(shard_wrong_token_width_is_error);
    RUN(shard_huge_counts_in_header_are_errors_not_crashes);
    RUN(shard_non_monotone_offsets_are_error);
    RUN(shard_mask_value_other_than_0_1_is_error);
    RUN(shard_token_id_over_vocab_names_document_and_value);
    RUN(shard_empty_and_tiny_files_are_errors);
    RUN(shard_fifo_in_train_files_is_refused_without_blocking);
    RUN(shard_writer_with_no_documents_refuses_to_save);
    RUN(dataset_over_two_shards_maps_global_indices);
    RUN(dataset_expands_globs_sorted);
    RUN(dataset_pattern_with_no_match_is_error);
    RUN(dataset_with_a_bad_shard_names_it);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    return check_summary();
}
