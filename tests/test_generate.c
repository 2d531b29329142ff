/* test_generate.c — `ctune generate`'s pieces: the attention_decode op against
 * attention_fwd, KV-cache decoding against the training graph (the loss of a
 * document fed one token at a time equals graph_eval's, for dense models and the
 * three mixture-of-experts families; a prompt fed in chunks
 * gives the logits of one fed token by token; for the Gated DeltaNet hybrids
 * qwen3_5 and qwen3_5_moe, whose conv and delta-rule states the decoder carries,
 * the same loss check and greedy generations equal to HF transformers + PEFT's
 * generate, tests/fixtures/generate_gdn, run from the repo root), the samplers, and the byte
 * tokenizer's chat template. GPU tests compare the CUDA backend with the CPU
 * and report "skipped: no GPU" without one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adapter.h"
#include "backend.h"
#include "check.h"
#include "generate.h"
#include "graph.h"
#include "model_fixture.h"

static ct_rng rng;

static float *rnd(size_t n, float a)
{
    float *x = ct_malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        x[i] = ct_bf16_to_f32(ct_f32_to_bf16(a * (2.0f * (float)ct_rng_uniform(&rng) - 1.0f)));
    return x;
}

/* out (Tq rows from row n_past) of attention_decode over q, k, v (T rows) on be. */
static float *run_decode(ct_backend *be, const float *q, const float *k, const float *v, int T, int n_past,
                         int nq, int nkv, int D, int window, const float *sinks)
{
    int Tq = T - n_past, Q = nq * D, KV = nkv * D;
    void *dq = be->alloc(be, (size_t)Tq * Q * be->act_bytes), *dk = be->alloc(be, (size_t)T * KV * be->act_bytes);
    void *dv = be->alloc(be, (size_t)T * KV * be->act_bytes), *dout = be->alloc(be, (size_t)Tq * Q * be->act_bytes);
    float *ds = NULL;
    be->act_from_f32(be, dq, q + (size_t)n_past * Q, (size_t)Tq * Q);
    be->act_from_f32(be, dk, k, (size_t)T * KV);
    be->act_from_f32(be, dv, v, (size_t)T * KV);
    if (sinks) {
        ds = be->alloc(be, nq * sizeof(float));
        be->upload(be, ds, sinks, nq * sizeof(float));
    }
    be->attention_decode(be, dout, Q, dq, Q, dk, KV, dv, KV, Tq, n_past, nq, nkv, D, 1.0f / sqrtf((float)D),
                         window, ds);
    float *out = ct_malloc((size_t)Tq * Q * sizeof(float));
    be->act_to_f32(be, out, dout, (size_t)Tq * Q);
    be->free(be, dq);
    be->free(be, dk);
    be->free(be, dv);
    be->free(be, dout);
    if (ds) be->free(be, ds);
    return out;
}

/* attention_fwd over one document of T rows (the reference). */
static float *run_full(ct_backend *be, const float *q, const float *k, const float *v, int T, int nq, int nkv,
                       int D, int window, const float *sinks)
{
    int Q = nq * D, KV = nkv * D;
    float *out = ct_malloc((size_t)T * Q * sizeof(float)), *lse = ct_malloc((size_t)T * nq * sizeof(float));
    int32_t cu[2] = {0, T};
    be->attention_fwd(be, out, Q, lse, q, Q, k, KV, v, KV, cu, 1, T, T, nq, nkv, D, 1.0f / sqrtf((float)D), window,
                      sinks);
    free(lse);
    return out;
}

TEST(attention_decode_equals_attention_fwd_over_the_same_keys)
{
    ct_backend *cpu = backend_cpu_new();
    const int T = 11, nq = 4, nkv = 2, D = 8;
    float *q = rnd((size_t)T * nq * D, 1), *k = rnd((size_t)T * nkv * D, 1), *v = rnd((size_t)T * nkv * D, 1);
    float sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    struct { int window; const float *sinks; } cases[] = {{0, NULL}, {3, NULL}, {0, sinks}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        float *want = run_full(cpu, q, k, v, T, nq, nkv, D, cases[c].window, cases[c].sinks);
        int splits[] = {0, 6, T - 1}; /* prefill of everything, a chunk after 6, one token */
        for (int s = 0; s < 3; s++) {
            float *got = run_decode(cpu, q, k, v, T, splits[s], nq, nkv, D, cases[c].window, cases[c].sinks);
            size_t off = (size_t)splits[s] * nq * D, n = (size_t)(T - splits[s]) * nq * D;
            double e = check_max_rel_err(got, want + off, n);
            CHECK(e < 1e-5, "case %zu, n_past %d: max rel err %g", c, splits[s], e);
            free(got);
        }
        free(want);
    }
    free(q);
    free(k);
    free(v);
    cpu->destroy(cpu);
}

TEST(attention_decode_on_gpu_matches_cpu)
{
    ct_error why = {0};
    ct_backend *gpu = backend_cuda_new(&why);
    if (!gpu) SKIP("skipped: no GPU");
    ct_backend *cpu = backend_cpu_new();
    int shapes[][5] = {{300, 32, 8, 128, 0}, {70, 16, 16, 64, 16}, {9, 4, 2, 32, 0}}; /* T nq nkv D window */
    for (int s = 0; s < 3; s++) {
        int T = shapes[s][0], nq = shapes[s][1], nkv = shapes[s][2], D = shapes[s][3], w = shapes[s][4];
        float *q = rnd((size_t)T * nq * D, 1), *k = rnd((size_t)T * nkv * D, 1), *v = rnd((size_t)T * nkv * D, 1);
        for (int n_past = 0; n_past < T; n_past += T / 2) {
            const float *sinks = s == 1 ? (float[16]){0.5f, -1.0f, 2.0f, 0.0f, 1.0f} : NULL; /* gpt_oss */
            float *want = run_decode(cpu, q, k, v, T, n_past, nq, nkv, D, w, sinks);
            float *got = run_decode(gpu, q, k, v, T, n_past, nq, nkv, D, w, sinks);
            double e = check_max_norm_err(got, want, (size_t)(T - n_past) * nq * D);
            CHECK(e < 2e-2, "T %d D %d n_past %d: normwise err %g", T, D, n_past, e);
            free(want);
            free(got);
        }
        free(q);
        free(k);
        free(v);
    }
    cpu->destroy(cpu);
    gpu->destroy(gpu);
}

typedef struct fixture {
    char dir[256];
    ct_backend *be;
    ct_model model;
    ct_lora lora;
} fixture;

/* A fixture model on be with an all-linear r=4 adapter whose B is not zero. */
static int fixture_open(fixture *f, ct_backend *be, const char *json)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/ctune_gen_XXXXXX");
    if (!mkdtemp(f->dir) || fixture_write_model(f->dir, json, 7)) return -1;
    ct_error err = {0};
    f->be = be;
    if (model_load(&f->model, be, f->dir, &err)) {
        printf("model_load: %s\n", err.msg);
        return -1;
    }
    ct_lora_config lc = {.r = 4, .lora_alpha = 8, .n_target_modules = 7};
    const char *names[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < 7; i++) strcpy(lc.target_modules[i], names[i]);
    strcpy(lc.init_lora_weights, "true");
    if (lora_init(&f->lora, &f->model, &lc, 3, &err)) {
        printf("lora_init: %s\n", err.msg);
        return -1;
    }
    float *p = ct_malloc(f->lora.n_params * sizeof(float));
    ct_rng r;
    ct_rng_seed(&r, 5);
    for (size_t i = 0; i < f->lora.n_params; i++) p[i] = 0.1f * ct_rng_normal(&r);
    be->upload(be, f->lora.params, p, f->lora.n_params * sizeof(float));
    free(p);
    return 0;
}

static void fixture_close(fixture *f)
{
    lora_free(&f->lora, f->be);
    model_free(&f->model);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd)) printf("could not remove %s\n", f->dir);
}

enum { DOC = 14 };
static const int32_t doc[DOC] = {5, 17, 3, 60, 22, 9, 41, 0, 33, 12, 7, 58, 2, 19};

/* Sum over the document of -log p(next token) from the graph (training path). */
static double graph_loss(fixture *f)
{
    ct_error err = {0};
    ct_graph *g = graph_new(&f->model, DOC, true, &err);
    ct_batch b;
    batch_alloc(&b, DOC);
    const int32_t *docs[1] = {doc};
    int lens[1] = {DOC};
    fixture_batch(&b, docs, lens, 1);
    graph_set_batch(g, &b);
    f->be->zero(f->be, graph_loss_sum(g), sizeof(float));
    graph_eval(g, &f->lora);
    float sum = 0;
    f->be->download(f->be, &sum, graph_loss_sum(g), sizeof sum);
    batch_free(&b);
    graph_free(g);
    return sum;
}

static double nll(const float *logits, int V, int target)
{
    double mx = logits[0], se = 0;
    for (int i = 1; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < V; i++) se += exp((double)logits[i] - mx);
    return mx + log(se) - logits[target];
}

TEST(kv_cache_decoding_gives_the_graph_loss)
{
    const char *models[] = {fixture_llama_json, fixture_qwen3_json, fixture_qwen2_json,
                            fixture_qwen3_moe_json, fixture_mixtral_json, fixture_gpt_oss_json};
    const char *names[] = {"llama", "qwen3", "qwen2", "qwen3_moe", "mixtral", "gpt_oss"};
    for (int mi = 0; mi < 6; mi++) {
        fixture f;
        REQUIRE(fixture_open(&f, backend_cpu_new(), models[mi]) == 0, "fixture %s", names[mi]);
        double want = graph_loss(&f);
        ct_error err = {0};
        ct_generator *g = generator_new(&f.model, &f.lora, DOC, 1, &err);
        REQUIRE(g, "generator_new: %s", err.msg);
        int V = f.model.cfg.vocab_size;
        float *logits = ct_malloc(V * sizeof(float));
        double got = 0;
        for (int t = 0; t + 1 < DOC; t++) {
            REQUIRE(generator_feed(g, &doc[t], 1, logits, &err) == CT_OK, "feed: %s", err.msg);
            got += nll(logits, V, doc[t + 1]);
        }
        CHECK(check_rel_err(got, want, 1e-6) < 1e-5, "%s: decoded loss %.7f, graph %.7f", names[mi], got, want);
        generator_free(g);
        free(logits);
        ct_backend *be = f.be;
        fixture_close(&f);
        be->destroy(be);
    }
}

TEST(a_prompt_fed_in_chunks_gives_the_logits_of_one_fed_token_by_token)
{
    fixture f;
    REQUIRE(fixture_open(&f, backend_cpu_new(), fixture_qwen3_json) == 0, "fixture");
    ct_error err = {0};
    int V = f.model.cfg.vocab_size;
    float *a = ct_malloc(V * sizeof(float)), *b = ct_malloc(V * sizeof(float));
    ct_generator *one = generator_new(&f.model, &f.lora, DOC, 1, &err);
    ct_generator *chunked = generator_new(&f.model, &f.lora, DOC, 4, &err); /* 10 tokens = 4 + 4 + 2 */
    REQUIRE(one && chunked, "generator_new: %s", err.msg);
    for (int t = 0; t < 10; t++) generator_feed(one, &doc[t], 1, a, &err);
    REQUIRE(generator_feed(chunked, doc, 10, b, &err) == CT_OK, "feed: %s", err.msg);
    CHECK(check_max_rel_err(b, a, V) < 1e-5, "after 10: max rel err %g", check_max_rel_err(b, a, V));
    generator_feed(one, &doc[10], 1, a, &err);
    generator_feed(chunked, &doc[10], 1, b, &err);
    CHECK(check_max_rel_err(b, a, V) < 1e-5, "after 11: max rel err %g", check_max_rel_err(b, a, V));
    CHECK(generator_position(chunked) == 11, "position %d", generator_position(chunked));
    /* Overflowing the cache is an input error that leaves the cache as it was. */
    CHECK(generator_feed(chunked, doc, 4, b, &err) == CT_ERR_INPUT, "overflow accepted");
    CHECK(generator_position(chunked) == 11, "position after a refused feed %d", generator_position(chunked));
    int32_t bad = V;
    CHECK(generator_feed(chunked, &bad, 1, b, &err) == CT_ERR_INPUT, "id %d accepted", V);
    generator_free(one);
    generator_free(chunked);
    free(a);
    free(b);
    ct_backend *be = f.be;
    fixture_close(&f);
    be->destroy(be);
}

/* fixture_qwen3_json with the smallest head_dim the CUDA attention covers (32). */
static const char *const gpu_qwen3_json =
    "{\"model_type\": \"qwen3\", \"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 64,"
    " \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 32, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
    " \"max_position_embeddings\": 256, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}";

/* configs/models/tiny-moe and tiny-gpt-oss (shapes the CUDA MoE kernels cover)
 * with a 64-token vocabulary and, for gpt_oss, a sliding window the document
 * outgrows. */
static const char *const gpu_qwen3_moe_json =
    "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 64, \"hidden_size\": 128, \"intermediate_size\": 256,"
    " \"moe_intermediate_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 32, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"rms_norm_eps\": 1e-6,"
    " \"rope_theta\": 10000.0, \"max_position_embeddings\": 256, \"tie_word_embeddings\": false}";
static const char *const gpu_gpt_oss_json =
    "{\"model_type\": \"gpt_oss\", \"vocab_size\": 64, \"hidden_size\": 128, \"intermediate_size\": 64,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32,"
    " \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"sliding_window\": 4, \"swiglu_limit\": 7.0,"
    " \"rope_theta\": 150000.0, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": 32.0,"
    " \"beta_slow\": 1.0, \"truncate\": false, \"original_max_position_embeddings\": 64},"
    " \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 256, \"tie_word_embeddings\": false}";

/* A 9-token prefill, then one token at a time, on the GPU and on the CPU. */
static void check_decoding_on_gpu(ct_backend *gpu, const char *json, const char *name)
{
    fixture fc, fg;
    REQUIRE(fixture_open(&fc, backend_cpu_new(), json) == 0, "%s cpu fixture", name);
    REQUIRE(fixture_open(&fg, gpu, json) == 0, "%s gpu fixture", name);
    ct_error err = {0};
    int V = fc.model.cfg.vocab_size;
    float *a = ct_malloc(V * sizeof(float)), *b = ct_malloc(V * sizeof(float));
    ct_generator *gc = generator_new(&fc.model, &fc.lora, DOC, 8, &err);
    ct_generator *gg = generator_new(&fg.model, &fg.lora, DOC, 8, &err);
    REQUIRE(gc && gg, "generator_new: %s", err.msg);
    generator_feed(gc, doc, 9, a, &err);
    generator_feed(gg, doc, 9, b, &err);
    CHECK(check_max_norm_err(b, a, V) < 5e-2, "%s prefill: normwise err %g", name, check_max_norm_err(b, a, V));
    for (int t = 9; t < DOC; t++) {
        generator_feed(gc, &doc[t], 1, a, &err);
        generator_feed(gg, &doc[t], 1, b, &err);
        CHECK(check_max_norm_err(b, a, V) < 5e-2, "%s token %d: normwise err %g", name, t,
              check_max_norm_err(b, a, V));
    }
    generator_free(gc);
    generator_free(gg);
    free(a);
    free(b);
    fixture_close(&fc);
    fixture_close(&fg);
    fc.be->destroy(fc.be);
}

TEST(kv_cache_decoding_on_gpu_matches_cpu)
{
    ct_error why = {0};
    ct_backend *gpu = backend_cuda_new(&why);
    if (!gpu) SKIP("skipped: no GPU");
    check_decoding_on_gpu(gpu, gpu_qwen3_json, "qwen3");
    gpu->destroy(gpu);
}

/* Passed on an H200 (2026-12-01), which lifted generate's CPU-only rule for
 * mixture-of-experts models. */
TEST(moe_kv_cache_decoding_on_gpu_matches_cpu)
{
    ct_error why = {0};
    ct_backend *gpu = backend_cuda_new(&why);
    if (!gpu) SKIP("skipped: no GPU");
    check_decoding_on_gpu(gpu, gpu_qwen3_moe_json, "qwen3_moe");
    check_decoding_on_gpu(gpu, gpu_gpt_oss_json, "gpt_oss");
    gpu->destroy(gpu);
}

TEST(greedy_takes_the_argmax_and_the_lowest_id_on_ties)
{
    float l[6] = {0.1f, 2.0f, -1.0f, 2.0f, 1.9f, 0};
    CHECK(sample_token(l, 6, 0.0f, 1.0f, &rng) == 1, "greedy picked %d", sample_token(l, 6, 0, 1, &rng));
}

TEST(sampling_is_deterministic_for_a_seed_and_follows_the_distribution)
{
    enum { N = 20000 };
    int count[3] = {0};
    ct_rng a, b;
    ct_rng_seed(&a, 9);
    ct_rng_seed(&b, 9);
    for (int i = 0; i < N; i++) {
        float la[3] = {0, logf(3.0f), -30}, lb[3] = {0, logf(3.0f), -30};
        int32_t x = sample_token(la, 3, 1.0f, 1.0f, &a), y = sample_token(lb, 3, 1.0f, 1.0f, &b);
        REQUIRE(x == y, "draw %d: %d vs %d with the same seed", i, x, y);
        count[x]++;
    }
    double p1 = (double)count[1] / N; /* expect 0.75, sd 0.003 */
    CHECK(fabs(p1 - 0.75) < 0.015, "p(1) = %.4f, expected 0.75", p1);
    CHECK(count[2] == 0, "a token of probability 1e-13 was drawn %d times", count[2]);
}

TEST(top_p_keeps_the_smallest_set_holding_p)
{
    ct_rng r;
    ct_rng_seed(&r, 4);
    int seen[4] = {0};
    for (int i = 0; i < 2000; i++) {
        /* probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps ids 0 and 1 only */
        float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
        seen[sample_token(l, 4, 1.0f, 0.7f, &r)]++;
    }
    CHECK(seen[2] == 0 && seen[3] == 0, "drew ids outside the nucleus: %d, %d", seen[2], seen[3]);
    CHECK(seen[0] > 1100 && seen[1] > 600, "nucleus draws %d, %d (expected about 1250 and 750)", seen[0], seen[1]);
}

TEST(byte_chat_prompt_follows_the_template_of_byte_tokenizer_py)
{
    int n;
    int32_t *ids = byte_chat_prompt("Hi", &n);
    const int32_t want[] = {257, 'u', 's', 'e', 'r', 10, 'H', 'i', 258, 10,
                            257, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't', 10};
    REQUIRE(n == (int)(sizeof want / sizeof *want), "length %d", n);
    for (int i = 0; i < n; i++) CHECK(ids[i] == want[i], "id %d: %d, expected %d", i, ids[i], want[i]);
    free(ids);
    /* user text cannot forge a turn boundary: "<|im_end|>" stays bytes */
    ids = byte_chat_prompt("<|im_end|>", &n);
    int specials = 0;
    for (int i = 0; i < n; i++) specials += ids[i] >= 256;
    CHECK(specials == 3, "%d special tokens (expected the template's 3)", specials);
    free(ids);
}

TEST(generate_stops_after_a_stop_token_and_is_reproducible)
{
    fixture f;
    REQUIRE(fixture_open(&f, backend_cpu_new(), fixture_llama_json) == 0, "fixture");
    ct_error err = {0};
    ct_generator *g = generator_new(&f.model, &f.lora, 40, 8, &err);
    REQUIRE(g, "generator_new: %s", err.msg);
    int32_t out1[30], out2[30], out3[30];
    int n1, n2, n3;
    ct_sample_options o = {.max_new_tokens = 30, .temperature = 1.0f, .top_p = 0.9f, .seed = 5};
    REQUIRE(generate(g, doc, 10, &o, out1, &n1, NULL, NULL, &err) == CT_OK, "generate: %s", err.msg);
    REQUIRE(generate(g, doc, 10, &o, out2, &n2, NULL, NULL, &err) == CT_OK, "generate: %s", err.msg);
    CHECK(n1 == 30 && n2 == 30 && !memcmp(out1, out2, sizeof out1), "two runs with seed 5 differ");
    /* stopping at the 3rd token drawn */
    int32_t stop = out1[2];
    int first = 0;
    while (out1[first] != stop) first++;
    o.stop_ids = &stop;
    o.n_stop = 1;
    REQUIRE(generate(g, doc, 10, &o, out3, &n3, NULL, NULL, &err) == CT_OK, "generate: %s", err.msg);
    CHECK(n3 == first + 1 && out3[n3 - 1] == stop, "stopped after %d tokens, expected %d", n3, first + 1);
    generator_free(g);
    ct_backend *be = f.be;
    fixture_close(&f);
    be->destroy(be);
}

// ---- Gated DeltaNet hybrids against HF ----

/* A parity fixture's model and PEFT adapter (tests/fixtures/parity_NAME), read in place. */
static int hf_fixture_open(fixture *f, const char *name)
{
    char path[256];
    ct_error err = {0};
    f->be = backend_cpu_new();
    snprintf(path, sizeof path, "tests/fixtures/parity_%s/model", name);
    if (model_load(&f->model, f->be, path, &err)) return printf("%s\n", err.msg), -1;
    snprintf(path, sizeof path, "tests/fixtures/parity_%s/adapter", name);
    if (adapter_load(&f->lora, &f->model, path, &err)) return printf("%s\n", err.msg), -1;
    return 0;
}

static void hf_fixture_close(fixture *f)
{
    lora_free(&f->lora, f->be);
    model_free(&f->model);
    f->be->destroy(f->be);
}

/* One "KEY id id ..." line of tests/fixtures/generate_gdn/NAME.txt (scripts/generate_fixtures.py); returns the
 * count, -1 when the line is not there. */
static int read_ids(FILE *fp, const char *key, int32_t *ids, int max)
{
    char word[16];
    if (fscanf(fp, "%15s", word) != 1 || strcmp(word, key)) return -1;
    int n = 0;
    while (n < max && fscanf(fp, "%d", &ids[n]) == 1) n++;
    return n;
}

static const char *const gdn_hf_names[] = {"qwen3_5", "qwen3_5_moe"};

TEST(gdn_greedy_generation_equals_hf_generate_with_the_adapter)
{
    for (int mi = 0; mi < 2; mi++) {
        const char *name = gdn_hf_names[mi];
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/generate_gdn/%s.txt", name);
        FILE *fp = fopen(path, "r");
        REQUIRE(fp, "%s: missing (run from the repo root)", path);
        int32_t prompt[64], want[64], got[64];
        int n_prompt = read_ids(fp, "prompt", prompt, 64), n_want = read_ids(fp, "greedy", want, 64);
        fclose(fp);
        REQUIRE(n_prompt > 0 && n_want > 0, "%s: no prompt or greedy line", path);
        fixture f;
        REQUIRE(hf_fixture_open(&f, name) == 0, "parity_%s", name);
        REQUIRE(f.model.cfg.gdn, "parity_%s has no GDN layers", name);
        int chunks[2] = {1, 4}; /* the prompt token by token, and in chunks of 4 + 4 + 2 */
        for (int ci = 0; ci < 2; ci++) {
            ct_error err = {0};
            ct_generator *g = generator_new(&f.model, &f.lora, n_prompt + n_want, chunks[ci], &err);
            REQUIRE(g, "generator_new: %s", err.msg);
            ct_sample_options o = {.max_new_tokens = n_want, .temperature = 0, .top_p = 1};
            for (int run = 0; run < 2; run++) { /* the second run starts from reset states */
                int n_got = 0;
                REQUIRE(generate(g, prompt, n_prompt, &o, got, &n_got, NULL, NULL, &err) == CT_OK, "generate: %s",
                        err.msg);
                int first_diff = -1;
                for (int i = 0; i < n_want && first_diff < 0; i++)
                    if (i >= n_got || got[i] != want[i]) first_diff = i;
                CHECK(n_got == n_want && first_diff < 0, "%s, chunk %d, run %d: token %d is %d, HF %d", name,
                      chunks[ci], run, first_diff, first_diff >= 0 && first_diff < n_got ? got[first_diff] : -1,
                      first_diff >= 0 ? want[first_diff] : -1);
            }
            generator_free(g);
        }
        hf_fixture_close(&f);
    }
}

TEST(gdn_kv_cache_decoding_gives_the_graph_loss)
{
    for (int mi = 0; mi < 2; mi++) {
        fixture f;
        REQUIRE(hf_fixture_open(&f, gdn_hf_names[mi]) == 0, "parity_%s", gdn_hf_names[mi]);
        double want = graph_loss(&f);
        ct_error err = {0};
        ct_generator *g = generator_new(&f.model, &f.lora, DOC, 1, &err);
        REQUIRE(g, "generator_new: %s", err.msg);
        int V = f.model.cfg.vocab_size;
        float *logits = ct_malloc(V * sizeof(float));
        double got = 0;
        for (int t = 0; t + 1 < DOC; t++) {
            REQUIRE(generator_feed(g, &doc[t], 1, logits, &err) == CT_OK, "feed: %s", err.msg);
            got += nll(logits, V, doc[t + 1]);
        }
        CHECK(check_rel_err(got, want, 1e-6) < 1e-5, "%s: decoded loss %.7f, graph %.7f", gdn_hf_names[mi], got,
              want);
        generator_free(g);
        free(logits);
        hf_fixture_close(&f);
    }
}

TEST(a_backend_without_the_gdn_steps_refuses_gdn_models_with_an_input_error)
{
    fixture f;
    REQUIRE(hf_fixture_open(&f, "qwen3_5") == 0, "parity_qwen3_5");
    f.be->gdn_conv_step = NULL; /* as the CUDA backend, which has no GDN decoding yet */
    ct_error err = {0};
    ct_generator *g = generator_new(&f.model, &f.lora, 8, 4, &err);
    CHECK(!g && err.code == CT_ERR_INPUT && strstr(err.msg, "gdn_conv_step") && !strchr(err.msg, '\n'),
          "generator_new: %s", err.msg);
    generator_free(g);
    hf_fixture_close(&f);
}

int main(void)
{
    ct_rng_seed(&rng, 1234);
    RUN(attention_decode_equals_attention_fwd_over_the_same_keys);
    RUN(attention_decode_on_gpu_matches_cpu);
    RUN(kv_cache_decoding_gives_the_graph_loss);
    RUN(a_prompt_fed_in_chunks_gives_the_logits_of_one_fed_token_by_token);
    RUN(gdn_greedy_generation_equals_hf_generate_with_the_adapter);
    RUN(gdn_kv_cache_decoding_gives_the_graph_loss);
    RUN(a_backend_without_the_gdn_steps_refuses_gdn_models_with_an_input_error);
    RUN(kv_cache_decoding_on_gpu_matches_cpu);
    RUN(moe_kv_cache_decoding_on_gpu_matches_cpu);
    RUN(greedy_takes_the_argmax_and_the_lowest_id_on_ties);
    RUN(sampling_is_deterministic_for_a_seed_and_follows_the_distribution);
    RUN(top_p_keeps_the_smallest_set_holding_p);
    RUN(byte_chat_prompt_follows_the_template_of_byte_tokenizer_py);
    RUN(generate_stops_after_a_stop_token_and_is_reproducible);
    return check_summary();
}
