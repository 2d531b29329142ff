/* test_memory_plan.c — the memory plan's choices (memory_plan_choose) for a
 * given amount of free memory: no offload when everything fits, the fewest
 * offloaded layers when not, one staging buffer as the last resort, a refusal
 * that names the largest micro-batch which fits under the run's own settings,
 * offload that cannot help where device and host memory are one (CPU), with
 * checkpoint_layers auto the most layers that keep their intermediates, and a
 * logits workspace bounded by the tokens. Sizes come from graph_measure, so the
 * plan is checked against the layout that allocates. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "memory_plan.h"
#include "model_fixture.h"

static const char *const llama6_json =
    "{\"model_type\": \"llama\", \"vocab_size\": 64, \"hidden_size\": 64, \"intermediate_size\": 96,"
    " \"num_hidden_layers\": 6, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-5,"
    " \"rope_theta\": 10000.0, \"max_position_embeddings\": 4096, \"tie_word_embeddings\": false,"
    " \"hidden_act\": \"silu\"}";

static char dir[64];
static ct_backend *be;
static ct_model model;

enum { T = 1024 };

/* Device bytes a plan needs for activations and workspace. */
static size_t graph_need(const ct_memory_plan *p)
{
    return p->graph.saved_device + p->graph.staging + p->graph.working + p->graph.batch + p->workspace;
}

static ct_memory_config mem(bool ckpt, ct_tristate off)
{
    return (ct_memory_config){.gradient_checkpointing = ckpt, .activation_offload = off};
}

TEST(everything_fits_no_offload)
{
    ct_memory_config m = mem(true, CT_TRI_AUTO);
    ct_memory_plan p;
    ct_error err = {0};
    CHECK(memory_plan_choose(&model, NULL, &m, T, SIZE_MAX, SIZE_MAX, &p, &err) == CT_OK, "%s", err.msg);
    CHECK(p.fits && p.opt.offload_layers == 0 && p.opt.checkpointing, "offload %d", p.opt.offload_layers);
    CHECK(p.graph.host == 0 && p.graph.staging == 0, "host %zu staging %zu", p.graph.host, p.graph.staging);
}

TEST(auto_offloads_the_fewest_layers_that_fit)
{
    ct_memory_config m = mem(true, CT_TRI_AUTO);
    ct_memory_plan none, p;
    ct_error err = {0};
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, SIZE_MAX, SIZE_MAX, &none, &err) == CT_OK, "%s", err.msg);
    size_t layer = (size_t)T * model.cfg.hidden_size * be->act_bytes;
    /* 2 layers short: two staging buffers cost two layers, so 4 must go to the host */
    size_t avail = graph_need(&none) - 2 * layer;
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, avail, SIZE_MAX, &p, &err) == CT_OK, "%s", err.msg);
    CHECK(p.fits && p.opt.offload_layers == 4 && p.opt.offload_buffers == 2, "k=%d buffers=%d",
          p.opt.offload_layers, p.opt.offload_buffers);
    CHECK(graph_need(&p) <= avail, "chosen plan needs %zu > %zu", graph_need(&p), avail);
    CHECK(p.graph.host == 4 * layer, "host %zu", p.graph.host);
}

TEST(one_staging_buffer_when_two_do_not_fit)
{
    ct_memory_config m = mem(true, CT_TRI_AUTO);
    ct_memory_plan all2, p;
    ct_error err = {0};
    ct_memory_config on = mem(true, CT_TRI_ON);
    REQUIRE(memory_plan_choose(&model, NULL, &on, T, SIZE_MAX, SIZE_MAX, &all2, &err) == CT_OK, "%s", err.msg);
    REQUIRE(all2.opt.offload_layers == model.cfg.num_hidden_layers && all2.opt.offload_buffers == 2, "on: k=%d",
            all2.opt.offload_layers);
    size_t avail = graph_need(&all2) - 1; /* one byte short of two buffers */
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, avail, SIZE_MAX, &p, &err) == CT_OK, "%s", err.msg);
    CHECK(p.opt.offload_buffers == 1 && p.opt.offload_layers == model.cfg.num_hidden_layers, "k=%d buffers=%d",
          p.opt.offload_layers, p.opt.offload_buffers);
    CHECK(graph_need(&p) <= avail, "needs %zu > %zu", graph_need(&p), avail);
}

/* The N of "the largest data.tokens_per_micro_batch that fits is N", or -1. */
static int suggested(const char *msg)
{
    const char *s = strstr(msg, "the largest data.tokens_per_micro_batch that fits is ");
    return s ? atoi(s + strlen("the largest data.tokens_per_micro_batch that fits is ")) : -1;
}

/* Whether `tokens` fit under m (memory_plan_choose says CT_OK). */
static bool fits(const ct_memory_config *m, int tokens, size_t avail, size_t host)
{
    ct_memory_plan q;
    ct_error err = {0};
    return memory_plan_choose(&model, NULL, m, tokens, avail, host, &q, &err) == CT_OK;
}

TEST(refusal_names_the_largest_micro_batch_that_fits)
{
    ct_memory_config m = mem(true, CT_TRI_OFF);
    ct_memory_plan p;
    ct_error err = {0};
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, SIZE_MAX, SIZE_MAX, &p, &err) == CT_OK, "%s", err.msg);
    size_t avail = graph_need(&p) / 3;
    int rc = memory_plan_choose(&model, NULL, &m, T, avail, SIZE_MAX, &p, &err);
    REQUIRE(rc == CT_ERR_INPUT && !p.fits, "rc %d", rc);
    /* under the run's own settings (offload off), then with every saving on */
    int good = suggested(err.msg);
    REQUIRE(good > 0 && good < T, "suggested %d: %s", good, err.msg);
    CHECK(fits(&m, good, avail, SIZE_MAX), "%d does not fit", good);
    CHECK(!fits(&m, good + 1, avail, SIZE_MAX), "%d fits too: the suggestion is not the largest", good + 1);
    const char *with = strstr(err.msg, " with memory.gradient_checkpointing: true, memory.activation_offload: auto");
    REQUIRE(with, "offload not suggested: %s", err.msg);
    int best_good = atoi(strstr(err.msg, "fits is ") + strlen("fits is ") + snprintf(NULL, 0, "%d (", good));
    ct_memory_config best = mem(true, CT_TRI_AUTO);
    best.offload_buffers = 2;
    CHECK(best_good > good && fits(&best, best_good, avail, SIZE_MAX), "%d does not fit with offload", best_good);
    CHECK(!fits(&best, best_good + 1, avail, SIZE_MAX), "%d fits too with offload", best_good + 1);
}

/* With offload on, the suggestion must fit with offload on: it used to be
 * searched with offload auto, which needs no host memory, so it named
 * capacity - 1 whatever the host had. */
TEST(suggestion_fits_under_the_runs_own_offload_setting)
{
    ct_memory_config on = mem(true, CT_TRI_ON);
    ct_memory_plan p;
    ct_error err = {0};
    REQUIRE(memory_plan_choose(&model, NULL, &on, T, SIZE_MAX, SIZE_MAX, &p, &err) == CT_OK, "%s", err.msg);
    size_t host = p.graph.host / 2;
    REQUIRE(memory_plan_choose(&model, NULL, &on, T, SIZE_MAX, host, &p, &err) == CT_ERR_INPUT, "fits");
    int good = suggested(err.msg);
    CHECK(good > 0 && good < T - 1, "suggested %d: %s", good, err.msg);
    CHECK(fits(&on, good, SIZE_MAX, host), "%d does not fit", good);
    CHECK(!fits(&on, good + 1, SIZE_MAX, host), "%d fits too", good + 1);
    CHECK(!strstr(err.msg, "activation_offload: auto"), "a setting the run has: %s", err.msg);
}

/* CPU: the offloaded inputs land in the memory they leave, and staging comes on
 * top, so offload never makes a plan fit there. */
TEST(offload_cannot_help_where_device_and_host_memory_are_one)
{
    ct_memory_config m = mem(true, CT_TRI_AUTO), on = mem(true, CT_TRI_ON);
    ct_memory_plan none, p;
    ct_error err = {0};
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, SIZE_MAX, CT_PLAN_SHARED, &none, &err) == CT_OK, "%s", err.msg);
    size_t need = graph_need(&none);
    CHECK(memory_plan_choose(&model, NULL, &m, T, need, CT_PLAN_SHARED, &p, &err) == CT_OK && p.opt.offload_layers == 0,
          "exact fit: offload %d (%s)", p.opt.offload_layers, err.msg);
    /* 2 layers short: with separate memories 4 layers would go to the host */
    size_t layer = (size_t)T * model.cfg.hidden_size * be->act_bytes;
    int rc = memory_plan_choose(&model, NULL, &m, T, need - 2 * layer, CT_PLAN_SHARED, &p, &err);
    CHECK(rc == CT_ERR_INPUT && suggested(err.msg) > 0 && suggested(err.msg) < T, "rc %d: %s", rc, err.msg);
    /* offload on (one staging buffer, so that no fallback hides the sum): its
     * staging and host copies count against the one memory */
    on.offload_buffers = 1;
    REQUIRE(memory_plan_choose(&model, NULL, &on, T, SIZE_MAX, CT_PLAN_SHARED, &p, &err) == CT_OK, "%s", err.msg);
    CHECK(p.graph.host > 0 && !fits(&on, T, graph_need(&p) + p.graph.host - 1, CT_PLAN_SHARED) &&
          fits(&on, T, graph_need(&p) + p.graph.host, CT_PLAN_SHARED), "host %zu not counted", p.graph.host);
}

TEST(nothing_fits_names_no_size)
{
    ct_memory_config m = mem(true, CT_TRI_AUTO);
    ct_memory_plan p;
    ct_error err = {0};
    CHECK(memory_plan_choose(&model, NULL, &m, T, 0, CT_PLAN_SHARED, &p, &err) == CT_ERR_INPUT &&
          strstr(err.msg, "not even 1 token fits") && strstr(err.msg, "a machine with more memory"), "%s", err.msg);
}

/* vocab_size 1: a 256 MiB logits budget is 67M rows; the chunk must stop at the
 * micro-batch (it asked for 32 GiB of workspace). */
TEST(logits_workspace_is_bounded_by_the_tokens)
{
    ct_backend shape_be = {.name = "cuda", .act_bytes = 2, .weight_bytes = 2};
    ct_model small = {.cfg = model.cfg, .be = &shape_be};
    small.cfg.vocab_size = 1;
    size_t w = memory_plan_workspace(&small, NULL, T);
    CHECK(w < ((size_t)8 << 20), "%zu bytes for %d tokens", w, T);
    w = memory_plan_workspace(&small, NULL, 100000); /* 65472 rows at most: the loss kernel's grid limit */
    CHECK(w < ((size_t)64 << 20), "%zu bytes for 100000 tokens", w);
    small.cfg.vocab_size = 151936; /* a real vocabulary still gets its whole budget */
    CHECK(memory_plan_workspace(&small, NULL, T) > ((size_t)256 << 20), "%zu", memory_plan_workspace(&small, NULL, T));
}

TEST(cpu_workspace_covers_the_ops_largest_allocation)
{
    size_t rope = (size_t)T * model.cfg.num_attention_heads * model.cfg.head_dim * sizeof(float);
    CHECK(memory_plan_workspace(&model, NULL, T) >= rope, "%zu < the rope backward's %zu",
          memory_plan_workspace(&model, NULL, T), rope);
}

TEST(offload_needs_host_memory)
{
    ct_memory_config m = mem(true, CT_TRI_ON);
    ct_memory_plan p;
    ct_error err = {0};
    int rc = memory_plan_choose(&model, NULL, &m, T, SIZE_MAX, 1000, &p, &err);
    CHECK(rc == CT_ERR_INPUT && strstr(err.msg, "host memory"), "rc %d: %s", rc, err.msg);
}

TEST(auto_offloads_only_what_the_host_can_take)
{
    /* device one layer short: 3 layers to the host (2 staging buffers cost 2);
     * host room for exactly 3, so `on` (all 6) must fail where auto fits */
    ct_memory_config m = mem(true, CT_TRI_AUTO), on = mem(true, CT_TRI_ON);
    ct_memory_plan none, p;
    ct_error err = {0};
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, SIZE_MAX, SIZE_MAX, &none, &err) == CT_OK, "%s", err.msg);
    size_t layer = (size_t)T * model.cfg.hidden_size * be->act_bytes;
    size_t avail = graph_need(&none) - layer, host = 3 * layer;
    CHECK(memory_plan_choose(&model, NULL, &m, T, avail, host, &p, &err) == CT_OK, "%s", err.msg);
    CHECK(p.fits && p.opt.offload_layers == 3 && p.graph.host == host, "k=%d host %zu", p.opt.offload_layers,
          p.graph.host);
    CHECK(memory_plan_choose(&model, NULL, &on, T, avail, host, &p, &err) == CT_ERR_INPUT, "on fitted");
}

TEST(no_checkpointing_keeps_every_layer)
{
    ct_memory_config off = mem(false, CT_TRI_AUTO), on = mem(true, CT_TRI_AUTO);
    ct_memory_plan a, b;
    ct_error err = {0};
    REQUIRE(memory_plan_choose(&model, NULL, &off, T, SIZE_MAX, SIZE_MAX, &a, &err) == CT_OK, "%s", err.msg);
    REQUIRE(memory_plan_choose(&model, NULL, &on, T, SIZE_MAX, SIZE_MAX, &b, &err) == CT_OK, "%s", err.msg);
    CHECK(!a.opt.checkpointing && a.opt.offload_layers == 0, "offload without checkpointing");
    CHECK(a.graph.working > 3 * b.graph.working, "working set %zu vs %zu with checkpointing", a.graph.working,
          b.graph.working);
    ct_memory_config bad = mem(false, CT_TRI_ON);
    CHECK(memory_plan_choose(&model, NULL, &bad, T, SIZE_MAX, SIZE_MAX, &a, &err) == CT_ERR_INPUT,
          "offload on without checkpointing accepted");
}

TEST(mlp_chunking_bounds_the_working_set)
{
    /* the long-context mode: the MLP intermediates are per chunk, not per token */
    ct_graph_options whole = {.capacity = 4096, .checkpointing = true};
    ct_graph_options chunked = {.capacity = 4096, .checkpointing = true, .mlp_chunk = 512};
    ct_graph_sizes a, b;
    graph_measure(&model, &whole, &a);
    graph_measure(&model, &chunked, &b);
    const ct_model_config *c = &model.cfg;
    size_t A = be->act_bytes, mlp = 3 * (size_t)c->intermediate_size * A; /* gu + act, or dgu + dact, per token */
    size_t attn = (size_t)(c->num_attention_heads + 2 * c->num_key_value_heads) * c->head_dim * A; /* dqkv */
    /* gu, act and hn (normed per chunk in the recomputed layers' workspace) shrink
     * in the workspace; dgu and dact share the backward scratch with attention's
     * dqkv, so there only what they took beyond dqkv is saved */
    size_t hn = (size_t)c->hidden_size * A;
    size_t saved = (size_t)(4096 - 512) * (mlp + hn) + (4096 * mlp > 4096 * attn ? 4096 * mlp : 4096 * attn) -
                   (512 * mlp > 4096 * attn ? 512 * mlp : 4096 * attn);
    CHECK(a.working - b.working == saved, "saved %zu, expected %zu", a.working - b.working, saved);
}

/* checkpoint_layers auto: all layers keep their intermediates when that fits;
 * else the most (the last ones) that fit, each one more than that not fitting;
 * offload only once not even one fits. */
TEST(auto_checkpoint_layers_keeps_the_most_layers_that_fit)
{
    ct_memory_config m = mem(true, CT_TRI_AUTO);
    m.checkpoint_layers = CT_CKPT_AUTO;
    int L = model.cfg.num_hidden_layers;
    ct_memory_plan p, all, none;
    ct_error err = {0};
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, SIZE_MAX, SIZE_MAX, &all, &err) == CT_OK, "%s", err.msg);
    CHECK(all.fits && all.opt.keep_layers == L && all.opt.offload_layers == 0, "unlimited: keep %d offload %d",
          all.opt.keep_layers, all.opt.offload_layers);
    ct_memory_config every = mem(true, CT_TRI_AUTO);
    REQUIRE(memory_plan_choose(&model, NULL, &every, T, SIZE_MAX, SIZE_MAX, &none, &err) == CT_OK, "%s", err.msg);
    REQUIRE(none.opt.keep_layers == 0, "checkpoint_layers all kept %d", none.opt.keep_layers);
    size_t per_layer = (graph_need(&all) - graph_need(&none)) / L;
    REQUIRE(per_layer > 0, "keeping layers costs nothing");
    /* room for about half the layers' intermediates */
    size_t avail = graph_need(&none) + per_layer * (L / 2) + per_layer / 2;
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, avail, SIZE_MAX, &p, &err) == CT_OK, "%s", err.msg);
    int k = p.opt.keep_layers;
    CHECK(p.fits && k >= 1 && k < L && p.opt.offload_layers == 0 && graph_need(&p) <= avail,
          "keep %d offload %d need %zu avail %zu", k, p.opt.offload_layers, graph_need(&p), avail);
    ct_graph_options more = p.opt;
    more.keep_layers = k + 1;
    ct_memory_plan q;
    ct_memory_config fixed = mem(true, CT_TRI_OFF);
    REQUIRE(memory_plan_choose(&model, NULL, &fixed, T, SIZE_MAX, SIZE_MAX, &q, &err) == CT_OK, "%s", err.msg);
    graph_measure(&model, &more, &q.graph);
    CHECK(graph_need(&q) > avail, "keep %d would also fit (%zu <= %zu)", k + 1, graph_need(&q), avail);
    /* not even one layer fits: every layer recomputed, offload as with all */
    avail = graph_need(&none) - (size_t)T * model.cfg.hidden_size * be->act_bytes * 2;
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, avail, SIZE_MAX, &p, &err) == CT_OK, "%s", err.msg);
    CHECK(p.opt.keep_layers == 0 && p.opt.offload_layers > 0, "keep %d offload %d", p.opt.keep_layers,
          p.opt.offload_layers);
    /* offload on: every input offloaded, no layer kept */
    m.activation_offload = CT_TRI_ON;
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, SIZE_MAX, SIZE_MAX, &p, &err) == CT_OK, "%s", err.msg);
    CHECK(p.opt.keep_layers == 0 && p.opt.offload_layers == L, "on: keep %d offload %d", p.opt.keep_layers,
          p.opt.offload_layers);
}

/* Short of memory even with every input offloaded, the plan halves the MLP
 * chunk and takes the longest one that fits; never below the minimum. */
TEST(short_of_memory_the_mlp_chunk_halves)
{
    enum { LONG = 4 * CT_MLP_CHUNK_TOKENS };
    ct_memory_config on = mem(true, CT_TRI_ON);
    on.offload_buffers = 1; /* else one staging buffer less is tried first */
    ct_memory_plan full, p;
    ct_error err = {0};
    REQUIRE(memory_plan_choose(&model, NULL, &on, LONG, SIZE_MAX, SIZE_MAX, &full, &err) == CT_OK, "%s", err.msg);
    REQUIRE(full.opt.mlp_chunk == CT_MLP_CHUNK_TOKENS, "chunk %d with memory to spare", full.opt.mlp_chunk);
    /* a half chunk saves gu and act in the workspace, 3I per token, and hn there
     * (dgu and dact sit in a scratch that dqkv bounds from below at this length) */
    size_t A = be->act_bytes, per_token = (3 * (size_t)model.cfg.intermediate_size + model.cfg.hidden_size) * A;
    size_t avail = graph_need(&full) - per_token * CT_MLP_CHUNK_TOKENS / 2 * 3 / 4; /* 3/4 of that short */
    REQUIRE(memory_plan_choose(&model, NULL, &on, LONG, avail, SIZE_MAX, &p, &err) == CT_OK, "%s", err.msg);
    CHECK(p.fits && p.opt.mlp_chunk == CT_MLP_CHUNK_TOKENS / 2, "chunk %d", p.opt.mlp_chunk);
    CHECK(graph_need(&p) <= avail, "the plan needs %zu of %zu", graph_need(&p), avail);
    /* the longest that fits: twice as long does not */
    ct_graph_sizes twice;
    ct_graph_options o = p.opt;
    o.mlp_chunk *= 2;
    graph_measure(&model, &o, &twice);
    CHECK(twice.saved_device + twice.staging + twice.working + twice.batch + p.workspace > avail,
          "chunk %d fits too", o.mlp_chunk);
    /* not even the shortest chunk fits: refused, the plan left at the shortest */
    ct_graph_options shortest = p.opt;
    shortest.mlp_chunk = CT_MLP_CHUNK_TOKENS_MIN;
    ct_graph_sizes s;
    graph_measure(&model, &shortest, &s);
    size_t too_little = s.saved_device + s.staging + s.working + s.batch + p.workspace - 1;
    CHECK(memory_plan_choose(&model, NULL, &on, LONG, too_little, SIZE_MAX, &p, &err) == CT_ERR_INPUT, "fits");
    CHECK(p.opt.mlp_chunk == CT_MLP_CHUNK_TOKENS_MIN, "chunk %d", p.opt.mlp_chunk);
    /* without checkpointing there are no chunks to shorten */
    ct_memory_config off = mem(false, CT_TRI_OFF);
    REQUIRE(memory_plan_choose(&model, NULL, &off, 4096, SIZE_MAX, SIZE_MAX, &full, &err) == CT_OK, "%s", err.msg);
    CHECK(memory_plan_choose(&model, NULL, &off, 4096, graph_need(&full) - 1, SIZE_MAX, &p, &err) == CT_ERR_INPUT &&
              p.opt.mlp_chunk == 0, "chunk %d without checkpointing", p.opt.mlp_chunk);
}

/* memory.gpu_memory_limit: the budget is what the limit leaves after what is
 * held and the margin, or the free memory less the margin, whichever is less. */
TEST(gpu_memory_limit_caps_the_device_budget)
{
    const size_t G = (size_t)1 << 30;
    CHECK(memory_plan_device_budget(10 * G, 0, 3 * G) == 10 * G - CT_PLAN_MARGIN, "no limit");
    CHECK(memory_plan_device_budget(10 * G, 8 * G, 3 * G) == 8 * G - 3 * G - CT_PLAN_MARGIN, "a limit that binds");
    CHECK(memory_plan_device_budget(10 * G, 100 * G, 3 * G) == 10 * G - CT_PLAN_MARGIN, "a limit above what is free");
    CHECK(memory_plan_device_budget(10 * G, 3 * G, 3 * G) == 0, "a limit the weights already take");
    CHECK(memory_plan_device_budget(CT_PLAN_MARGIN / 2, 0, 0) == 0, "less free than the margin");
}

/* Under a limit the plan offloads as it would when short of free memory, and a
 * refusal says that the limit is what it ran into. */
TEST(a_binding_limit_offloads_and_a_refusal_names_it)
{
    ct_memory_config m = mem(true, CT_TRI_AUTO);
    ct_memory_plan none, p;
    ct_error err = {0};
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, SIZE_MAX, SIZE_MAX, &none, &err) == CT_OK, "%s", err.msg);
    size_t layer = (size_t)T * model.cfg.hidden_size * be->act_bytes, held = model.weight_bytes;
    size_t limit = held + CT_PLAN_MARGIN + graph_need(&none) - 2 * layer; /* 2 layers short, as above */
    m.gpu_memory_limit = (double)limit / (double)((size_t)1 << 30);
    size_t budget = memory_plan_device_budget(SIZE_MAX / 2, (size_t)(m.gpu_memory_limit * ((size_t)1 << 30)), held);
    REQUIRE(budget <= limit - held - CT_PLAN_MARGIN && budget + 256 >= limit - held - CT_PLAN_MARGIN, "budget %zu",
            budget);
    REQUIRE(memory_plan_choose(&model, NULL, &m, T, budget, SIZE_MAX, &p, &err) == CT_OK, "%s", err.msg);
    CHECK(p.fits && p.opt.offload_layers == 4 && p.device_limit > 0, "k=%d limit %zu", p.opt.offload_layers,
          p.device_limit);
    ct_memory_config off = m;
    off.activation_offload = CT_TRI_OFF;
    CHECK(memory_plan_choose(&model, NULL, &off, T, budget, SIZE_MAX, &p, &err) == CT_ERR_INPUT, "fits");
    CHECK(strstr(err.msg, "under memory.gpu_memory_limit (") != NULL, "%s", err.msg);
    ct_memory_config unlimited = off;
    unlimited.gpu_memory_limit = 0;
    CHECK(memory_plan_choose(&model, NULL, &unlimited, T, budget, SIZE_MAX, &p, &err) == CT_ERR_INPUT, "fits");
    CHECK(strstr(err.msg, "gpu_memory_limit") == NULL, "a limit named that was not set: %s", err.msg);
}

int main(void)
{
    (void)fixture_batch;
    snprintf(dir, sizeof dir, "/tmp/ctune_plan_XXXXXX");
    if (!mkdtemp(dir) || fixture_write_model(dir, llama6_json, 3)) return 1;
    be = backend_cpu_new();
    ct_error err = {0};
    if (model_load(&model, be, dir, &err)) return printf("model_load: %s\n", err.msg), 1;
    RUN(everything_fits_no_offload);
    RUN(auto_offloads_the_fewest_layers_that_fit);
    RUN(one_staging_buffer_when_two_do_not_fit);
    RUN(refusal_names_the_largest_micro_batch_that_fits);
    RUN(suggestion_fits_under_the_runs_own_offload_setting);
    RUN(offload_cannot_help_where_device_and_host_memory_are_one);
    RUN(nothing_fits_names_no_size);
    RUN(logits_workspace_is_bounded_by_the_tokens);
    RUN(cpu_workspace_covers_the_ops_largest_allocation);
    RUN(offload_needs_host_memory);
    RUN(auto_offloads_only_what_the_host_can_take);
    RUN(no_checkpointing_keeps_every_layer);
    RUN(mlp_chunking_bounds_the_working_set);
    RUN(auto_checkpoint_layers_keeps_the_most_layers_that_fit);
    RUN(short_of_memory_the_mlp_chunk_halves);
    RUN(gpu_memory_limit_caps_the_device_budget);
    RUN(a_binding_limit_offloads_and_a_refusal_names_it);
    model_free(&model);
    be->destroy(be);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    return check_summary();
}
