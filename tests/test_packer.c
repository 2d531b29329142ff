/* test_packer.c — the packer's contract (packer.h): packed micro-batches never let
 * attention cross a document, positions and targets follow each document, every
 * document is seen once per epoch, the stream is a pure function of (seed,
 * position), and the loader thread hands out exactly that stream. */
#include "check.h"
#include "packer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB 50000u

/* A dataset written as real shards in a temporary folder, with its source
 * documents kept alongside for comparison. */
typedef struct fixture {
    char dir[64];
    int n_shards;
    ct_dataset ds;
    size_t n;
    size_t *len;
    uint32_t **tok;
    uint8_t **mask;
} fixture;

static void shard_name(char *out, size_t cap, const fixture *f, int i)
{
    snprintf(out, cap, "%s/part-%d.shard", f->dir, i);
}

/* Documents of the given lengths, random tokens, and a loss mask that is 0 on a
 * "prompt" (the first third) and mostly 1 after it, split across n_shards files. */
static bool fixture_make(fixture *f, const size_t *lens, size_t n, int n_shards, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/ctune_packer_XXXXXX");
    if (!mkdtemp(f->dir)) return false;
    f->n = n;
    f->n_shards = n_shards;
    f->len = ct_malloc(n * sizeof *f->len);
    f->tok = ct_malloc(n * sizeof *f->tok);
    f->mask = ct_malloc(n * sizeof *f->mask);
    ct_rng rng;
    ct_rng_seed(&rng, seed);
    for (size_t d = 0; d < n; d++) {
        f->len[d] = lens[d];
        f->tok[d] = ct_malloc(lens[d] * sizeof **f->tok);
        f->mask[d] = ct_malloc(lens[d]);
        for (size_t j = 0; j < lens[d]; j++) {
            f->tok[d][j] = (uint32_t)ct_rng_below(&rng, VOCAB);
            f->mask[d][j] = j >= lens[d] / 3 && ct_rng_below(&rng, 10) < 8;
        }
    }
    char paths[8][128];
    const char *pats[8];
    ct_error err = { 0 };
    for (int s = 0; s < n_shards; s++) {
        shard_writer *w = shard_writer_new();
        for (size_t d = n * (size_t)s / (size_t)n_shards; d < n * (size_t)(s + 1) / (size_t)n_shards; d++)
            shard_writer_add(w, f->tok[d], f->mask[d], f->len[d]);
        shard_name(paths[s], sizeof paths[s], f, s);
        pats[s] = paths[s];
        int rc = shard_writer_save(w, paths[s], &err);
        shard_writer_free(w);
        if (rc != CT_OK) return false;
    }
    return dataset_open(&f->ds, pats, n_shards, VOCAB, &err) == CT_OK && f->ds.num_docs == n;
}

static void fixture_free(fixture *f)
{
    dataset_close(&f->ds);
    for (size_t d = 0; d < f->n; d++) {
        free(f->tok[d]);
        free(f->mask[d]);
    }
    free(f->len);
    free(f->tok);
    free(f->mask);
    for (int s = 0; s < f->n_shards; s++) {
        char path[128];
        shard_name(path, sizeof path, f, s);
        unlink(path);
    }
    rmdir(f->dir);
}

/* A mix of short and long documents, some longer than max_length. */
static bool fixture_mixed(fixture *f, size_t n, size_t max_len, uint64_t seed)
{
    size_t *lens = ct_malloc(n * sizeof *lens);
    ct_rng rng;
    ct_rng_seed(&rng, seed ^ 0x5eed);
    for (size_t d = 0; d < n; d++) lens[d] = 1 + (size_t)ct_rng_below(&rng, max_len);
    bool ok = fixture_make(f, lens, n, 2, seed);
    free(lens);
    return ok;
}

static ct_packer_options options(int cap, int max_length, bool packing, int window, uint64_t seed)
{
    return (ct_packer_options){ .tokens_per_micro_batch = cap, .max_length = max_length,
                                .packing = packing, .shuffle_window = window, .seed = seed };
}

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

static bool batches_equal(const ct_batch *a, const ct_batch *b)
{
    if (a->n_tokens != b->n_tokens || a->n_docs != b->n_docs || a->max_seqlen != b->max_seqlen ||
        a->n_targets != b->n_targets) return false;
    size_t t = (size_t)a->n_tokens, n = (size_t)a->n_docs, k = (size_t)a->n_targets;
    return !memcmp(a->tokens, b->tokens, t * 4) && !memcmp(a->positions, b->positions, t * 4) &&
           !memcmp(a->targets, b->targets, t * 4) && !memcmp(a->cu_seqlens, b->cu_seqlens, (n + 1) * 4) &&
           !memcmp(a->target_rows, b->target_rows, k * 4) && !memcmp(a->target_ids, b->target_ids, k * 4) &&
           !memcmp(a->doc_ids, b->doc_ids, n * 8);
}

static bool pos_equal(ct_data_pos a, ct_data_pos b)
{
    return a.epoch == b.epoch && a.window == b.window && a.bin == b.bin &&
           a.batches_done == b.batches_done;
}

TEST(each_attention_span_covers_exactly_one_document)
{
    fixture f;
    bool made = fixture_mixed(&f, 200, 150, 1);
    REQUIRE(made, "fixture");
    ct_packer_options o = options(256, 128, true, 64, 7);
    ct_packer *p = packer_new(&f.ds, &o, NULL);
    ct_batch b;
    batch_alloc(&b, 256);
    size_t nb = packer_batches_per_epoch(p);
    for (size_t i = 0; i < nb && !check_cur_failed; i++) {
        packer_next(p, &b);
        CHECK(b.cu_seqlens[0] == 0 && b.cu_seqlens[b.n_docs] == b.n_tokens, "batch %zu ends", i);
        for (int k = 0; k < b.n_docs; k++) {
            size_t d = (size_t)b.doc_ids[k], want = min_sz(f.len[d], 128);
            size_t lo = (size_t)b.cu_seqlens[k], span = (size_t)(b.cu_seqlens[k + 1] - b.cu_seqlens[k]);
            CHECK(span == want, "batch %zu doc %zu: span %zu, want %zu", i, d, span, want);
            for (size_t j = 0; j < span && j < want; j++)
                CHECK((uint32_t)b.tokens[lo + j] == f.tok[d][j], "batch %zu doc %zu token %zu", i, d, j);
        }
    }
    batch_free(&b);
    packer_free(p);
    fixture_free(&f);
}

TEST(positions_restart_at_zero_per_document)
{
    fixture f;
    bool made = fixture_mixed(&f, 100, 60, 2);
    REQUIRE(made, "fixture");
    ct_packer_options o = options(128, 64, true, 100, 3);
    ct_packer *p = packer_new(&f.ds, &o, NULL);
    ct_batch b;
    batch_alloc(&b, 128);
    for (int i = 0; i < 20; i++) {
        packer_next(p, &b);
        int max_seqlen = 0;
        for (int k = 0; k < b.n_docs; k++) {
            int lo = b.cu_seqlens[k], hi = b.cu_seqlens[k + 1];
            for (int t = lo; t < hi; t++)
                CHECK(b.positions[t] == t - lo, "batch %d pos %d = %d, want %d", i, t, b.positions[t], t - lo);
            if (hi - lo > max_seqlen) max_seqlen = hi - lo;
        }
        CHECK(b.max_seqlen == max_seqlen, "batch %d max_seqlen %d, want %d", i, b.max_seqlen, max_seqlen);
    }
    batch_free(&b);
    packer_free(p);
    fixture_free(&f);
}

TEST(targets_are_the_next_label_of_the_same_document)
{
    fixture f;
    bool made = fixture_mixed(&f, 150, 90, 3);
    REQUIRE(made, "fixture");
    ct_packer_options o = options(200, 80, true, 50, 11);
    ct_packer *p = packer_new(&f.ds, &o, NULL);
    ct_batch b;
    batch_alloc(&b, 200);
    size_t nb = packer_batches_per_epoch(p), ignored_mask = 0;
    for (size_t i = 0; i < nb && !check_cur_failed; i++) {
        packer_next(p, &b);
        int n_targets = 0;
        for (int k = 0; k < b.n_docs; k++) {
            size_t d = (size_t)b.doc_ids[k];
            int lo = b.cu_seqlens[k], len = b.cu_seqlens[k + 1] - lo;
            CHECK(b.targets[lo + len - 1] == CT_IGNORE, "batch %zu doc %zu: last position has a target", i, d);
            for (int j = 0; j + 1 < len; j++) {
                int32_t want = f.mask[d][j + 1] ? (int32_t)f.tok[d][j + 1] : CT_IGNORE;
                ignored_mask += !f.mask[d][j + 1];
                CHECK(b.targets[lo + j] == want, "batch %zu doc %zu pos %d: %d, want %d",
                      i, d, j, b.targets[lo + j], want);
            }
        }
        for (int t = 0; t < b.n_tokens; t++) {
            if (b.targets[t] == CT_IGNORE) continue;
            CHECK(n_targets < b.n_targets && b.target_rows[n_targets] == t,
                  "batch %zu: target row %d missing or out of order", i, t);
            CHECK(n_targets < b.n_targets && b.target_ids[n_targets] == b.targets[t],
                  "batch %zu: target id at row %d", i, t);
            n_targets++;
        }
        CHECK(b.n_targets == n_targets, "batch %zu: n_targets %d, want %d", i, b.n_targets, n_targets);
    }
    CHECK(ignored_mask > 0, "the fixture has masked tokens inside documents");
    batch_free(&b);
    packer_free(p);
    fixture_free(&f);
}

/* Counts the documents of `nb` batches from p; true if each appears exactly once. */
static bool each_document_once(ct_packer *p, size_t nb, size_t n_docs, int cap)
{
    int *seen = ct_calloc(n_docs, sizeof *seen);
    ct_batch b;
    batch_alloc(&b, cap);
    for (size_t i = 0; i < nb; i++) {
        packer_next(p, &b);
        for (int k = 0; k < b.n_docs; k++) seen[b.doc_ids[k]]++;
    }
    bool ok = true;
    for (size_t d = 0; d < n_docs; d++) ok = ok && seen[d] == 1;
    batch_free(&b);
    free(seen);
    return ok;
}

TEST(every_document_appears_once_per_epoch)
{
    fixture f;
    bool made = fixture_mixed(&f, 333, 100, 4);
    REQUIRE(made, "fixture");
    ct_packer_options o = options(256, 100, true, 40, 5);
    ct_packer *p = packer_new(&f.ds, &o, NULL);
    size_t nb0 = packer_batches_per_epoch(p);
    CHECK(each_document_once(p, nb0, f.n, 256), "epoch 0: a document missing or repeated");
    ct_data_pos pos = packer_position(p);
    CHECK(pos.epoch == 1 && pos.window == 0 && pos.bin == 0 && pos.batches_done == nb0,
          "after epoch 0: epoch %llu window %llu bin %llu", (unsigned long long)pos.epoch,
          (unsigned long long)pos.window, (unsigned long long)pos.bin);
    size_t nb1 = packer_epoch_stats(p, 1).batches;
    CHECK(each_document_once(p, nb1, f.n, 256), "epoch 1: a document missing or repeated");
    packer_free(p);
    fixture_free(&f);
}

TEST(no_batch_exceeds_capacity_and_efficiency_is_a_fraction)
{
    fixture f;
    bool made = fixture_mixed(&f, 400, 120, 5);
    REQUIRE(made, "fixture");
    ct_packer_options o = options(300, 120, true, 100, 9);
    ct_packer *p = packer_new(&f.ds, &o, NULL);
    ct_batch b;
    batch_alloc(&b, 300);
    ct_packer_stats st = packer_epoch_stats(p, 0);
    size_t tokens = 0;
    for (size_t i = 0; i < st.batches; i++) {
        packer_next(p, &b);
        CHECK(b.n_tokens >= 1 && b.n_tokens <= 300, "batch %zu holds %d tokens", i, b.n_tokens);
        tokens += (size_t)b.n_tokens;
    }
    CHECK(st.tokens == tokens, "stats count %zu tokens, the batches %zu", st.tokens, tokens);
    double want = (double)tokens / ((double)st.batches * 300);
    CHECK(st.efficiency > 0 && st.efficiency <= 1 && fabs(st.efficiency - want) < 1e-12,
          "efficiency %g, want %g", st.efficiency, want);
    CHECK(st.docs == f.n, "stats count %zu docs", st.docs);
    batch_free(&b);
    packer_free(p);
    fixture_free(&f);
}

TEST(best_fit_packs_tighter_than_one_document_per_batch)
{
    fixture f;
    bool made = fixture_mixed(&f, 400, 120, 6);
    REQUIRE(made, "fixture");
    ct_packer_options on = options(512, 120, true, 200, 9), off = options(512, 120, false, 200, 9);
    ct_packer *p = packer_new(&f.ds, &on, NULL), *q = packer_new(&f.ds, &off, NULL);
    ct_packer_stats s_on = packer_epoch_stats(p, 0), s_off = packer_epoch_stats(q, 0);
    CHECK(s_on.efficiency > 0.9, "best-fit efficiency %g", s_on.efficiency);
    CHECK(s_on.efficiency > 3 * s_off.efficiency, "best-fit %g vs one per batch %g",
          s_on.efficiency, s_off.efficiency);
    CHECK(s_on.batches < s_off.batches / 3, "%zu batches packed vs %zu", s_on.batches, s_off.batches);
    packer_free(p);
    packer_free(q);
    fixture_free(&f);
}

/* Lengths 12, 9, 9, 2 into bins of 20: sorted 12, 9, 9, 2; the 2 goes to the bin
 * with the least room that fits (9+9, 2 free), not the first that fits (12, 8 free). */
TEST(best_fit_chooses_the_tightest_bin)
{
    fixture f;
    size_t lens[] = { 9, 2, 12, 9 };
    bool made = fixture_make(&f, lens, 4, 1, 7);
    REQUIRE(made, "fixture");
    ct_packer_options o = options(20, 20, true, 4, 1);
    ct_packer *p = packer_new(&f.ds, &o, NULL);
    ct_batch b;
    batch_alloc(&b, 20);
    size_t nb = packer_batches_per_epoch(p);
    REQUIRE(nb == 2, "%zu bins, want 2", nb);
    packer_next(p, &b);
    CHECK(b.n_docs == 1 && f.len[b.doc_ids[0]] == 12, "first bin: %d docs", b.n_docs);
    packer_next(p, &b);
    REQUIRE(b.n_docs == 3, "second bin: %d docs", b.n_docs);
    CHECK(f.len[b.doc_ids[0]] == 9 && f.len[b.doc_ids[1]] == 9 && f.len[b.doc_ids[2]] == 2,
          "second bin lengths %zu %zu %zu, want 9 9 2 (placement order)",
          f.len[b.doc_ids[0]], f.len[b.doc_ids[1]], f.len[b.doc_ids[2]]);
    batch_free(&b);
    packer_free(p);
    fixture_free(&f);
}

/* Equal lengths sort as ties, so one big bin lists documents in shuffle order,
 * which is the order packing off emits them. */
TEST(equal_lengths_keep_shuffle_order)
{
    fixture f;
    size_t lens[30];
    for (int i = 0; i < 30; i++) lens[i] = 3;
    bool made = fixture_make(&f, lens, 30, 3, 8);
    REQUIRE(made, "fixture");
    ct_packer_options on = options(90, 3, true, 30, 4), off = options(90, 3, false, 30, 4);
    ct_packer *p = packer_new(&f.ds, &on, NULL), *q = packer_new(&f.ds, &off, NULL);
    ct_batch b, c;
    batch_alloc(&b, 90);
    batch_alloc(&c, 90);
    packer_next(p, &b);
    REQUIRE(b.n_docs == 30, "one bin of 30 docs, got %d", b.n_docs);
    for (int k = 0; k < 30; k++) {
        packer_next(q, &c);
        CHECK(b.doc_ids[k] == c.doc_ids[0], "place %d: doc %lld, shuffle order has %lld",
              k, (long long)b.doc_ids[k], (long long)c.doc_ids[0]);
    }
    batch_free(&b);
    batch_free(&c);
    packer_free(p);
    packer_free(q);
    fixture_free(&f);
}

TEST(long_documents_are_truncated_and_counted)
{
    fixture f;
    size_t lens[] = { 10, 50, 20, 35 };
    bool made = fixture_make(&f, lens, 4, 1, 9);
    REQUIRE(made, "fixture");
    ct_packer_options o = options(64, 20, true, 4, 2);
    ct_packer *p = packer_new(&f.ds, &o, NULL);
    ct_packer_stats st = packer_epoch_stats(p, 0);
    CHECK(st.truncated_docs == 2, "truncated docs %zu, want 2", st.truncated_docs);
    CHECK(st.truncated_tokens == 30 + 15, "truncated tokens %zu, want 45", st.truncated_tokens);
    CHECK(st.tokens == 10 + 20 + 20 + 20, "tokens %zu, want 70", st.tokens);
    ct_batch b;
    batch_alloc(&b, 64);
    bool found = false;
    for (size_t i = 0; i < st.batches; i++) {
        packer_next(p, &b);
        for (int k = 0; k < b.n_docs; k++) {
            if (b.doc_ids[k] != 1) continue;
            found = true;
            int lo = b.cu_seqlens[k], len = b.cu_seqlens[k + 1] - lo;
            CHECK(len == 20, "the 50-token doc spans %d", len);
            CHECK(!memcmp(&b.tokens[lo], f.tok[1], 20 * sizeof(int32_t)), "kept tokens are the first 20");
            CHECK(b.targets[lo + 19] == CT_IGNORE, "the last kept token predicts nothing");
        }
    }
    CHECK(found, "doc 1 was emitted");
    batch_free(&b);
    packer_free(p);
    fixture_free(&f);
}

TEST(packing_off_gives_one_document_per_batch)
{
    fixture f;
    bool made = fixture_mixed(&f, 50, 40, 10);
    REQUIRE(made, "fixture");
    ct_packer_options o = options(64, 40, false, 16, 2);
    ct_packer *p = packer_new(&f.ds, &o, NULL);
    CHECK(packer_batches_per_epoch(p) == 50, "%zu batches, want 50", packer_batches_per_epoch(p));
    ct_batch b;
    batch_alloc(&b, 64);
    for (int i = 0; i < 50; i++) {
        packer_next(p, &b);
        CHECK(b.n_docs == 1 && b.n_tokens == (int)f.len[b.doc_ids[0]], "batch %d: %d docs", i, b.n_docs);
    }
    batch_free(&b);
    packer_free(p);
    fixture_free(&f);
}

/* The doc-id order of the first `n` batches from a fresh packer at `epoch`. */
static void doc_order(const ct_dataset *ds, ct_packer_options o, uint64_t epoch, int64_t *out, size_t n)
{
    ct_packer *p = packer_new(ds, &o, NULL);
    packer_seek(p, (ct_data_pos){ .epoch = epoch });
    ct_batch b;
    batch_alloc(&b, o.tokens_per_micro_batch);
    for (size_t i = 0; i < n; i++) {
        packer_next(p, &b);
        out[i] = b.doc_ids[0];
    }
    batch_free(&b);
    packer_free(p);
}

TEST(same_seed_same_stream_other_seed_or_epoch_other_order)
{
    fixture f;
    bool made = fixture_mixed(&f, 120, 50, 11);
    REQUIRE(made, "fixture");
    ct_packer_options o = options(128, 50, true, 30, 42);
    ct_packer *p = packer_new(&f.ds, &o, NULL), *q = packer_new(&f.ds, &o, NULL);
    ct_batch a, b;
    batch_alloc(&a, 128);
    batch_alloc(&b, 128);
    for (int i = 0; i < 100; i++) {
        packer_next(p, &a);
        packer_next(q, &b);
        CHECK(batches_equal(&a, &b), "batch %d differs for the same seed", i);
    }
    ct_packer_options off = options(128, 50, false, 30, 42), other = off;
    other.seed = 43;
    int64_t e0[120], e1[120], s43[120];
    doc_order(&f.ds, off, 0, e0, 120);
    doc_order(&f.ds, off, 1, e1, 120);
    doc_order(&f.ds, other, 0, s43, 120);
    CHECK(memcmp(e0, e1, sizeof e0) != 0, "epochs 0 and 1 have the same order");
    CHECK(memcmp(e0, s43, sizeof e0) != 0, "seeds 42 and 43 give the same order");
    batch_free(&a);
    batch_free(&b);
    packer_free(p);
    packer_free(q);
    fixture_free(&f);
}

TEST(seek_to_a_saved_position_resumes_the_same_stream)
{
    fixture f;
    bool made = fixture_mixed(&f, 150, 70, 12);
    REQUIRE(made, "fixture");
    ct_packer_options o = options(160, 70, true, 25, 8);
    ct_packer *p = packer_new(&f.ds, &o, NULL);
    ct_batch a, b;
    batch_alloc(&a, 160);
    batch_alloc(&b, 160);
    size_t k = packer_batches_per_epoch(p) / 2 + 3, rest = 2 * packer_batches_per_epoch(p);
    for (size_t i = 0; i < k; i++) packer_next(p, &a);
    ct_data_pos saved = packer_position(p);
    ct_packer *q = packer_new(&f.ds, &o, NULL);
    CHECK(packer_check_position(q, saved, NULL) == CT_OK, "saved position rejected");
    packer_seek(q, saved);
    CHECK(pos_equal(packer_position(q), saved), "seek did not set the position");
    for (size_t i = 0; i < rest; i++) {
        packer_next(p, &a);
        packer_next(q, &b);
        CHECK(batches_equal(&a, &b), "batch %zu after resume differs", k + i);
        CHECK(pos_equal(packer_position(p), packer_position(q)), "position %zu differs", k + i);
    }
    ct_error err = { 0 };
    ct_data_pos bogus = { .epoch = 0, .window = 1000 };
    CHECK(packer_check_position(q, bogus, &err) == CT_ERR_INPUT && strstr(err.msg, "window 1000"),
          "an impossible position is refused: %s", err.msg);
    batch_free(&a);
    batch_free(&b);
    packer_free(p);
    packer_free(q);
    fixture_free(&f);
}

TEST(loader_yields_the_direct_stream_and_its_positions)
{
    fixture f;
    bool made = fixture_mixed(&f, 200, 90, 13);
    REQUIRE(made, "fixture");
    ct_packer_options o = options(192, 90, true, 50, 21);
    ct_packer *direct = packer_new(&f.ds, &o, NULL), *threaded = packer_new(&f.ds, &o, NULL);
    ct_batch want;
    batch_alloc(&want, 192);
    size_t n = 2 * packer_batches_per_epoch(direct) + 5;
    ct_loader *l = loader_start(threaded, 3);
    for (size_t i = 0; i < n; i++) {
        CHECK(pos_equal(loader_position(l), packer_position(direct)), "position before batch %zu", i);
        packer_next(direct, &want);
        const ct_batch *got = loader_next(l);
        CHECK(batches_equal(got, &want), "batch %zu differs", i);
        loader_release(l, got);
    }
    /* Hold one batch so the thread reads ahead into a full ring, then stop. */
    const ct_batch *held = loader_next(l);
    packer_next(direct, &want);
    CHECK(batches_equal(held, &want), "held batch differs");
    usleep(20000);
    ct_data_pos at = loader_position(l);
    CHECK(pos_equal(at, packer_position(direct)), "position while holding a batch");
    loader_stop(l);
    CHECK(pos_equal(packer_position(threaded), at), "after stop the packer is back at the caller's position");
    batch_free(&want);
    packer_free(direct);
    packer_free(threaded);
    fixture_free(&f);
}

TEST(impossible_options_are_input_errors)
{
    fixture f;
    size_t lens[] = { 5, 6 };
    bool made = fixture_make(&f, lens, 2, 1, 14);
    REQUIRE(made, "fixture");
    ct_error err = { 0 };
    ct_packer_options zero_cap = options(0, 4, true, 8, 1), too_long = options(16, 32, true, 8, 1);
    CHECK(!packer_new(&f.ds, &zero_cap, &err) && err.code == CT_ERR_INPUT, "capacity 0: %s", err.msg);
    CHECK(!packer_new(&f.ds, &too_long, &err) && err.code == CT_ERR_INPUT &&
          strstr(err.msg, "max_length"), "max_length > capacity: %s", err.msg);
    ct_packer_options ok_off = options(16, 32, false, 8, 1);
    ct_packer *p = packer_new(&f.ds, &ok_off, &err);
    CHECK(p != NULL, "max_length > capacity is fine with packing off: %s", err.msg);
    packer_free(p);
    ct_dataset empty = { 0 };
    ct_packer_options o = options(16, 8, true, 8, 1);
    CHECK(!packer_new(&empty, &o, &err) && err.code == CT_ERR_INPUT, "empty dataset: %s", err.msg);
    fixture_free(&f);
}

int main(void)
{
    RUN(each_attention_span_covers_exactly_one_document);
    RUN(positions_restart_at_zero_per_document);
    RUN(targets_are_the_next_label_of_the_same_document);
    RUN(every_document_appears_once_per_epoch);
    RUN(no_batch_exceeds_capacity_and_efficiency_is_a_fraction);
    RUN(best_fit_packs_tighter_than_one_document_per_batch);
    RUN(best_fit_chooses_the_tightest_bin);
    RUN(equal_lengths_keep_shuffle_order);
    RUN(long_documents_are_truncated_and_counted);
    RUN(packing_off_gives_one_document_per_batch);
    RUN(same_seed_same_stream_other_seed_or_epoch_other_order);
    RUN(seek_to_a_saved_position_resumes_the_same_stream);
    RUN(loader_yields_the_direct_stream_and_its_positions);
    RUN(impossible_options_are_input_errors);
    return check_summary();
}
