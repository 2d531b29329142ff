/* tokenizer_bench.c — single-threaded encode throughput of src/text/tokenizer.h:
 * every document of a corpus encoded in turn (parse_special true), the whole
 * corpus repeated until at least MIN_SECONDS have passed, after one warm-up pass.
 * Time is the process's CPU time, so a machine shared with other jobs slows
 * the wall clock but not the figure (the script measures HF the same way).
 *
 *   build/bench/tokenizer_bench MODEL_DIR DOCS.json [MIN_SECONDS]    (default 3)
 *
 * DOCS.json is a JSON array of strings (scripts/tokenizer_bench.py writes one
 * and runs HF tokenizers on the same documents). Prints the load time, MB/s of
 * UTF-8 input, tokens/s, and the count and an FNV-1a hash of the ids of one
 * pass, which the script compares with HF's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json.h"
#include "tokenizer.h"

static uint64_t fnv_ids(uint64_t h, const ct_ids *ids)
{
    for (size_t i = 0; i < ids->len; i++)
        for (int b = 0; b < 4; b++) h = (h ^ ((ids->data[i] >> (8 * b)) & 0xFF)) * 0x100000001b3ull;
    return h;
}

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR DOCS.json [MIN_SECONDS]\n", argv[0]);
        return 2;
    }
    double min_seconds = argc > 3 ? atof(argv[3]) : 3.0;
    ct_error err = {0};
    double t0 = ct_now();
    ct_tokenizer *t = tokenizer_load(argv[1], &err);
    double load_s = ct_now() - t0;
    if (!t) { fprintf(stderr, "error: %s\n", err.msg); return 2; }
    size_t len;
    char *text = ct_read_file_max(argv[2], CT_JSON_MAX_BYTES, &len, &err);
    json_doc *doc = text ? json_parse(text, len, argv[2], &err) : NULL;
    const json_value *docs = doc ? json_root(doc) : NULL;
    if (!docs || docs->type != JSON_ARRAY) {
        fprintf(stderr, "error: %s\n", doc ? "DOCS.json is not an array of strings" : err.msg);
        return 2;
    }
    size_t bytes = 0;
    for (size_t i = 0; i < docs->count; i++) bytes += docs->items[i]->string_len;

    ct_ids ids = {0};
    uint64_t hash = 0xcbf29ce484222325ull;
    size_t tokens = 0;
    for (size_t i = 0; i < docs->count; i++) {   /* warm-up, and the ids to compare */
        ids.len = 0;
        if (tokenizer_encode(t, docs->items[i]->string, docs->items[i]->string_len, true, &ids, &err)) {
            fprintf(stderr, "error: %s\n", err.msg);
            return 1;
        }
        hash = fnv_ids(hash, &ids);
        tokens += ids.len;
    }
    size_t passes = 0;
    double start = cpu_seconds(), elapsed;
    do {
        for (size_t i = 0; i < docs->count; i++) {
            ids.len = 0;
            tokenizer_encode(t, docs->items[i]->string, docs->items[i]->string_len, true, &ids, &err);
        }
        passes++;
        elapsed = cpu_seconds() - start;
    } while (elapsed < min_seconds);
    double mb_s = (double)bytes * (double)passes / elapsed / 1e6;
    printf("load %.3f s; %zu docs, %.2f MB, %zu tokens per pass; %zu passes in %.2f s of CPU\n", load_s, docs->count,
           bytes / 1e6, tokens, passes, elapsed);
    printf("encode %.2f MB/s, %.0f tokens/s (1 thread); ids hash %016llx\n", mb_s,
           (double)tokens * (double)passes / elapsed, (unsigned long long)hash);
    ct_ids_free(&ids);
    json_free(doc);
    free(text);
    tokenizer_free(t);
    return 0;
}
