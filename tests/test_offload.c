/* test_offload.c — activation offload and MLP chunking on the CPU reference
 * backend, whose offload copies happen at once: any mistake in the schedule
 * (a layer reading the wrong staging buffer, a missing store or load, a
 * recompute overwriting an input) changes the loss or the gradients, so
 * every layout must match no checkpointing bit for bit; so must every split
 * between recomputed layers and layers that keep their intermediates
 * (keep_layers).
 *
 * On the GPU the same comparison runs with copies on a second stream ordered
 * by events, on a model large enough (2048 tokens per micro-batch) that copies
 * and compute overlap: a missing wait shows up as a different bit. Its kernels
 * are deterministic (no atomics), so bit-identical is the right bar there too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "graph.h"
#include "model_fixture.h"

/* 4 layers, so that offloading 1, 2, 3 or all of them are different schedules. */
static const char *const llama4_json =
    "{\"model_type\": \"llama\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-5,"
    " \"rope_theta\": 10000.0, \"max_position_embeddings\": 256, \"tie_word_embeddings\": false,"
    " \"hidden_act\": \"silu\"}";

/* qwen3_moe, 3 layers (layer 1 dense): the sparse recompute path too. */
static const char *const moe3_json =
    "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 40,"
    " \"moe_intermediate_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
    " \"norm_topk_prob\": false, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [1],"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0, \"max_position_embeddings\": 256,"
    " \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}";

/* A wider llama for the GPU: head_dim 64, 2048-token micro-batches. */
static const char *const llama4_wide_json =
    "{\"model_type\": \"llama\", \"vocab_size\": 512, \"hidden_size\": 256, \"intermediate_size\": 512,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-5,"
    " \"rope_theta\": 10000.0, \"max_position_embeddings\": 4096, \"tie_word_embeddings\": false,"
    " \"hidden_act\": \"silu\"}";

static ct_backend *gpu; /* NULL without a GPU */

typedef struct fixture {
    char dir[256];
    ct_backend *be;
    ct_model model;
    ct_lora lora;
    int capacity;
} fixture;

static int fixture_open(fixture *f, ct_backend *be, const char *json, double dropout, int capacity)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/ctune_offload_XXXXXX");
    if (!mkdtemp(f->dir) || fixture_write_model(f->dir, json, 7)) return -1;
    ct_error err = {0};
    f->be = be ? be : backend_cpu_new();
    f->capacity = capacity;
    if (model_load(&f->model, f->be, f->dir, &err)) return printf("model_load: %s\n", err.msg), -1;
    ct_lora_config lc = {.r = 4, .lora_alpha = 8, .lora_dropout = dropout, .n_target_modules = 7};
    const char *names[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < 7; i++) strcpy(lc.target_modules[i], names[i]);
    strcpy(lc.init_lora_weights, "gaussian"); /* B != 0: every gradient is non-trivial */
    if (lora_init(&f->lora, &f->model, &lc, 3, &err)) return printf("lora_init: %s\n", err.msg), -1;
    size_t n = f->lora.n_params;
    float *p = ct_malloc(n * sizeof(float));
    ct_rng r;
    ct_rng_seed(&r, 5);
    for (size_t i = 0; i < n; i++) p[i] = 0.1f * ct_rng_normal(&r);
    f->be->upload(f->be, f->lora.params, p, n * sizeof(float));
    free(p);
    return 0;
}

static void fixture_close(fixture *f)
{
    lora_free(&f->lora, f->be);
    model_free(&f->model);
    if (f->be != gpu) f->be->destroy(f->be);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd)) {}
}

/* Two micro-batches of different lengths (the second shorter: stale rows in the
 * staging buffers must not matter), scaled to the capacity (64 on the CPU). */
static void batches(ct_batch b[2], int capacity, int vocab)
{
    int k = capacity / 64;
    int lens0[] = {40 * k, 17 * k, 1 + 6 * k - 6, 1}, lens1[] = {23 * k};
    int32_t *docs[5];
    int lens[] = {lens0[0], lens0[1], lens0[2], lens0[3], lens1[0]};
    for (int d = 0; d < 5; d++) {
        docs[d] = ct_malloc((size_t)lens[d] * sizeof(int32_t));
        for (int i = 0; i < lens[d]; i++) docs[d][i] = (int32_t)((i * (7 + 2 * d) + 3 * d + 1) % vocab);
    }
    batch_alloc(&b[0], capacity);
    batch_alloc(&b[1], capacity);
    fixture_batch(&b[0], (const int32_t *const *)docs, lens0, 4);
    fixture_batch(&b[1], (const int32_t *const *)docs + 4, lens1, 1);
    for (int d = 0; d < 5; d++) free(docs[d]);
}

typedef struct result {
    float loss, eval_loss;
    float *grads;
} result;

/* One optimizer step over both micro-batches, then an eval of the first. */
static int run_graph(fixture *f, const ct_graph_options *opt, result *out)
{
    ct_error err = {0};
    ct_graph *g = graph_new_with(&f->model, opt, &err);
    if (!g) return printf("graph_new_with: %s\n", err.msg), -1;
    ct_backend *be = f->be;
    ct_batch b[2];
    batches(b, f->capacity, f->model.cfg.vocab_size);
    int targets = b[0].n_targets + b[1].n_targets;
    be->zero(be, f->lora.grads, f->lora.n_params * sizeof(float));
    be->zero(be, graph_loss_sum(g), sizeof(float));
    for (int i = 0; i < 2; i++) {
        graph_set_batch(g, &b[i]);
        graph_train_step(g, &f->lora, 1.0f / targets, 77 + i);
    }
    be->download(be, &out->loss, graph_loss_sum(g), sizeof(float));
    out->grads = ct_malloc(f->lora.n_params * sizeof(float));
    be->download(be, out->grads, f->lora.grads, f->lora.n_params * sizeof(float));
    be->zero(be, graph_loss_sum(g), sizeof(float));
    graph_set_batch(g, &b[0]);
    graph_eval(g, &f->lora);
    be->download(be, &out->eval_loss, graph_loss_sum(g), sizeof(float));
    batch_free(&b[0]);
    batch_free(&b[1]);
    graph_free(g);
    return 0;
}

static void check_layouts_match(ct_backend *be, const char *json, double dropout, int capacity)
{
    fixture f;
    REQUIRE(fixture_open(&f, be, json, dropout, capacity) == 0, "fixture");
    int L = f.model.cfg.num_hidden_layers;
    ct_graph_options ref_opt = {.capacity = capacity, .checkpointing = false};
    result ref;
    REQUIRE(run_graph(&f, &ref_opt, &ref) == 0, "reference run");
    REQUIRE(isfinite(ref.loss) && ref.loss > 0, "reference loss %g", ref.loss);
    double gsum = 0;
    for (size_t i = 0; i < f.lora.n_params; i++) gsum += fabs(ref.grads[i]);
    REQUIRE(gsum > 0, "reference gradients are all zero");
    /* keep: layers that keep their intermediates (none, one, all but one, all);
     * u: the forward keeps each LoRA's u for the backward (rank r) or not (0) */
    const int keeps[] = {0, 1, L - 1, L};
    for (int ki = 0; ki < 4; ki++)
        for (int k = 0; k <= L; k++)
            for (int nb = 1; nb <= 2; nb++)
                for (int ku = 0; ku < 2; ku++) {
                    const int keep = keeps[ki], rank = ku ? f.lora.R : 0;
                    ct_graph_options o = {.capacity = capacity, .checkpointing = true, .offload_layers = k,
                                          .offload_buffers = nb, .keep_layers = keep, .lora_rank = rank};
                    result r;
                    REQUIRE(run_graph(&f, &o, &r) == 0, "run keep=%d k=%d buffers=%d u rank %d", keep, k, nb, rank);
                    CHECK(r.loss == ref.loss, "keep=%d k=%d buffers=%d u rank %d: loss %.9g != %.9g", keep, k, nb,
                          rank, r.loss, ref.loss);
                    CHECK(r.eval_loss == ref.eval_loss, "keep=%d k=%d buffers=%d u rank %d: eval loss %.9g != %.9g",
                          keep, k, nb, rank, r.eval_loss, ref.eval_loss);
                    CHECK(memcmp(r.grads, ref.grads, f.lora.n_params * sizeof(float)) == 0,
                          "keep=%d k=%d buffers=%d u rank %d: gradients differ (l2 rel %.3g)", keep, k, nb, rank,
                          check_l2_rel_err(r.grads, ref.grads, f.lora.n_params));
                    free(r.grads);
                }
    /* no checkpointing, u kept: every layer's backward reads its own */
    ct_graph_options kept_u = ref_opt;
    kept_u.lora_rank = f.lora.R;
    result r;
    REQUIRE(run_graph(&f, &kept_u, &r) == 0, "no checkpointing, u kept");
    CHECK(r.loss == ref.loss && r.eval_loss == ref.eval_loss, "no checkpointing, u kept: loss %.9g / %.9g", r.loss,
          ref.loss);
    CHECK(memcmp(r.grads, ref.grads, f.lora.n_params * sizeof(float)) == 0,
          "no checkpointing, u kept: gradients differ (l2 rel %.3g)", check_l2_rel_err(r.grads, ref.grads,
                                                                                       f.lora.n_params));
    free(r.grads);
    free(ref.grads);
    fixture_close(&f);
}

TEST(offload_layouts_match_no_checkpointing_bit_for_bit)
{
    check_layouts_match(NULL, llama4_json, 0.0, 64);
}

TEST(offload_layouts_match_with_dropout)
{
    check_layouts_match(NULL, llama4_json, 0.1, 64);
}

TEST(offload_layouts_match_for_a_moe_model)
{
    check_layouts_match(NULL, moe3_json, 0.0, 64);
}

TEST(gpu_offload_layouts_match_no_checkpointing_bit_for_bit)
{
    if (!gpu) SKIP("skipped: no GPU");
    check_layouts_match(gpu, llama4_wide_json, 0.0, 2048);
}

TEST(gpu_offload_layouts_match_with_dropout)
{
    if (!gpu) SKIP("skipped: no GPU");
    check_layouts_match(gpu, llama4_wide_json, 0.1, 2048);
}

/* Chunks sum the LoRA weight gradients in another order: equal to rounding. */
TEST(mlp_chunks_match_the_whole_micro_batch)
{
    fixture f;
    REQUIRE(fixture_open(&f, NULL, llama4_json, 0.0, 64) == 0, "fixture");
    ct_graph_options whole = {.capacity = 64, .checkpointing = true};
    result a;
    REQUIRE(run_graph(&f, &whole, &a) == 0, "whole");
    int chunks[] = {1, 7, 16, 39};
    for (int i = 0; i < 4; i++) {
        ct_graph_options o = {.capacity = 64, .checkpointing = true, .mlp_chunk = chunks[i], .offload_layers = 2,
                              .offload_buffers = 2};
        result r;
        REQUIRE(run_graph(&f, &o, &r) == 0, "chunk %d", chunks[i]);
        double el = check_rel_err(r.loss, a.loss, fabs(a.loss)), ee = check_rel_err(r.eval_loss, a.eval_loss,
                                                                                   fabs(a.eval_loss));
        double eg = check_l2_rel_err(r.grads, a.grads, f.lora.n_params);
        CHECK(el <= 1e-6 && ee <= 1e-6, "chunk %d: loss rel err %.3g, eval %.3g", chunks[i], el, ee);
        CHECK(eg <= 1e-5, "chunk %d: gradient l2 rel err %.3g", chunks[i], eg);
        free(r.grads);
    }
    free(a.grads);
    fixture_close(&f);
}

/* Layers that keep their intermediates run the MLP over the same chunks as the
 * recomputed ones (their gu and act hold every chunk): bit-identical to
 * recomputing every layer at the same chunk size, dropout masks included; and
 * so with each LoRA's u kept per chunk. */
TEST(kept_layers_match_recomputed_ones_with_mlp_chunks_and_dropout)
{
    fixture f;
    REQUIRE(fixture_open(&f, NULL, llama4_json, 0.1, 64) == 0, "fixture");
    int L = f.model.cfg.num_hidden_layers;
    ct_graph_options all = {.capacity = 64, .checkpointing = true, .mlp_chunk = 16};
    result a;
    REQUIRE(run_graph(&f, &all, &a) == 0, "every layer recomputed");
    for (int keep = 1; keep <= 2 * L; keep++) {
        ct_graph_options o = all;
        o.keep_layers = (keep - 1) % L + 1;
        o.offload_layers = 1;
        o.lora_rank = keep > L ? f.lora.R : 0; /* the second round keeps u */
        result r;
        REQUIRE(run_graph(&f, &o, &r) == 0, "keep %d, u rank %d", o.keep_layers, o.lora_rank);
        CHECK(r.loss == a.loss && r.eval_loss == a.eval_loss, "keep %d, u rank %d: loss %.9g / %.9g, eval %.9g / %.9g",
              o.keep_layers, o.lora_rank, r.loss, a.loss, r.eval_loss, a.eval_loss);
        CHECK(memcmp(r.grads, a.grads, f.lora.n_params * sizeof(float)) == 0,
              "keep %d, u rank %d: gradients differ (l2 rel %.3g)", o.keep_layers, o.lora_rank,
              check_l2_rel_err(r.grads, a.grads, f.lora.n_params));
        free(r.grads);
    }
    free(a.grads);
    fixture_close(&f);
}

int main(void)
{
    ct_error err = {0};
    gpu = backend_cuda_new(&err);
    RUN(offload_layouts_match_no_checkpointing_bit_for_bit);
    RUN(offload_layouts_match_with_dropout);
    RUN(offload_layouts_match_for_a_moe_model);
    RUN(mlp_chunks_match_the_whole_micro_batch);
    RUN(kept_layers_match_recomputed_ones_with_mlp_chunks_and_dropout);
    RUN(gpu_offload_layouts_match_no_checkpointing_bit_for_bit);
    RUN(gpu_offload_layouts_match_with_dropout);
    if (gpu) gpu->destroy(gpu);
    return check_summary();
}
