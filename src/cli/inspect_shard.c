/* inspect_shard.c — `ctune inspect SHARD...`: what is in each shard and in all of
 * them together (documents, tokens, lengths, labels, largest token id), so a
 * user can check a dataset before spending GPU time on it. Opening a shard
 * validates it fully (sizes, offsets, CRC), so a report means the file is sound. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "shard.h"

#define HIST_BUCKETS 64   /* bucket k holds lengths in [2^k, 2^(k+1)) */
#define BAR_WIDTH 40

typedef struct shard_stats {
    size_t docs, tokens, labels;
    size_t min_len, max_len;
    uint32_t max_token;
    size_t hist[HIST_BUCKETS];
} shard_stats;

static int log2_floor(size_t x)
{
    int k = 0;
    while (x >>= 1) k++;
    return k;
}

static void stats_add_shard(shard_stats *st, const shard *s)
{
    for (size_t i = 0; i < shard_num_docs(s); i++) {
        size_t len;
        shard_doc_tokens(s, i, &len);
        if (st->docs == 0 || len < st->min_len) st->min_len = len;
        if (len > st->max_len) st->max_len = len;
        st->hist[log2_floor(len)]++;
        st->docs++;
    }
    st->tokens += shard_num_tokens(s);
    st->labels += shard_num_labels(s);
    if (shard_max_token(s) > st->max_token) st->max_token = shard_max_token(s);
}

static void print_stats(const shard_stats *st)
{
    printf("  documents    %zu\n", st->docs);
    printf("  tokens       %zu\n", st->tokens);
    printf("  labels       %zu (%.1f%% of tokens carry loss)\n", st->labels,
           st->tokens ? 100.0 * (double)st->labels / (double)st->tokens : 0.0);
    printf("  length       min %zu, mean %.1f, max %zu\n", st->min_len,
           st->docs ? (double)st->tokens / (double)st->docs : 0.0, st->max_len);
    printf("  max token id %u\n", st->max_token);
    printf("  length histogram:\n");
    int lo = log2_floor(st->min_len), hi = log2_floor(st->max_len);
    size_t peak = 0;
    for (int k = lo; k <= hi; k++) if (st->hist[k] > peak) peak = st->hist[k];
    for (int k = lo; k <= hi; k++) {
        char range[64], bar[BAR_WIDTH + 1];
        /* Shown as first-last (inclusive) so the top bucket's end never overflows size_t. */
        size_t first = (size_t)1 << k, last = first + (first - 1);
        if (first == last) snprintf(range, sizeof range, "%zu", first);
        else snprintf(range, sizeof range, "%zu-%zu", first, last);
        /* Any non-empty bucket gets at least one mark, so rare lengths stay visible. */
        size_t w = peak ? (st->hist[k] * BAR_WIDTH + peak - 1) / peak : 0;
        memset(bar, '#', w);
        bar[w] = 0;
        printf("    %-14s %10zu  %s\n", range, st->hist[k], bar);
    }
}

int inspect_shards(int n, char **paths, ct_error *err)
{
    shard_stats total = {0};
    for (int i = 0; i < n; i++) {
        int rc = cli_check_file(paths[i], err); /* shard_open would block on a FIFO */
        if (rc) return rc;
        shard *s = shard_open(paths[i], 0, err);
        if (!s) return err ? err->code : CT_ERR_INPUT;
        shard_stats st = {0};
        stats_add_shard(&st, s);
        stats_add_shard(&total, s);
        printf("%s: CRC ok (%08x)\n", paths[i], shard_crc32(s));
        print_stats(&st);
        shard_close(s);
    }
    if (n > 1) {
        printf("total (%d shards):\n", n);
        print_stats(&total);
    }
    return CT_OK;
}
