/* test_moe.c — tiny qwen3_moe / mixtral / gpt_oss models on the CPU reference
 * backend: LoRA gradients (experts included) against finite differences, packed
 * == unpacked, checkpointing on == off, the fused expert LoRA, the load-balancing
 * loss, the PEFT names, and the input errors of unsupported setups. The MoE ops
 * themselves are test_moe_ops.c's.
 *
 * Model gradients are checked like test_graph.c: a random direction per
 * (module, A|B), bound 2e-2. Routing is piecewise constant, so a +-eps step that
 * moves a token across a routing boundary makes the difference quotient
 * meaningless (seen: a step of 1e-3 along o_proj's A switched an expert, 3e-4 did
 * not). A direction is therefore tried with eps = 1e-3, then 3e-4, then 1e-4, and
 * passes if one agrees: a wrong or missing gradient term disagrees at every step
 * (dropping the router's input-gradient path gives errors of 3e-2 to 10 in every
 * attention module at all three), while a boundary is crossed by the larger steps
 * only. fp32 rounding in the difference stays below ~5e-3 relative at eps = 1e-4. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "graph.h"
#include "json.h"
#include "model_fixture.h"

static ct_backend *be;
static ct_rng rng;

// ---- models ----

typedef struct fixture {
    char dir[256];
    ct_model model;
    ct_lora lora;
    ct_graph *graph;
} fixture;

static const char *const all_targets[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

static int fixture_open(fixture *f, const char *json, bool checkpointing, const char *const *targets, int n_targets)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/ctune_moe_XXXXXX");
    if (!mkdtemp(f->dir) || fixture_write_model(f->dir, json, 7)) return -1;
    ct_error err = {0};
    if (model_load(&f->model, be, f->dir, &err)) return printf("model_load: %s\n", err.msg), -1;
    ct_lora_config lc = {.r = 4, .lora_alpha = 8, .n_target_modules = n_targets};
    for (int i = 0; i < n_targets; i++) strcpy(lc.target_modules[i], targets[i]);
    strcpy(lc.init_lora_weights, "true");
    if (lora_init(&f->lora, &f->model, &lc, 3, &err)) return printf("lora_init: %s\n", err.msg), -1;
    /* B = 0 after PEFT init would make every dA zero: give B values to test A too. */
    size_t n = f->lora.n_params;
    float *p = ct_malloc(n * sizeof(float));
    be->download(be, p, f->lora.params, n * sizeof(float));
    ct_rng r;
    ct_rng_seed(&r, 11);
    for (int l = 0; l < f->lora.n_layers; l++)
        for (int m = 0; m < CT_MOD_COUNT; m++) {
            const ct_lora_slot *s = lora_slot(&f->lora, l, m);
            if (!s->experts) continue;
            float *B = p + (lora_B(&f->lora, l, m) - f->lora.params);
            for (size_t i = 0; i < (size_t)s->experts * s->out * f->lora.R; i++) B[i] = 0.1f * ct_rng_normal(&r);
        }
    be->upload(be, f->lora.params, p, n * sizeof(float));
    free(p);
    f->graph = graph_new(&f->model, 64, checkpointing, &err);
    return f->graph ? 0 : -1;
}

static void fixture_close(fixture *f)
{
    graph_free(f->graph);
    lora_free(&f->lora, be);
    model_free(&f->model);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd)) {}
}

static const int32_t doc_a[] = {1, 5, 9, 2, 33, 17, 8, 60, 4};
static const int32_t doc_b[] = {3, 3, 12, 40, 41};
static const int32_t doc_c[] = {7};
static const int32_t doc_d[] = {50, 22, 9, 13, 13, 2, 63};
static const int32_t *const docs[] = {doc_a, doc_b, doc_c, doc_d};
static const int lens[] = {9, 5, 1, 7};

/* One optimizer step over the batches: mean CE + the load-balancing losses. */
static double step_loss(fixture *f, ct_batch *bs, int nb, float *grads_out)
{
    int targets = 0;
    for (int i = 0; i < nb; i++) targets += bs[i].n_targets;
    be->zero(be, f->lora.grads, f->lora.n_params * sizeof(float));
    be->zero(be, graph_loss_sum(f->graph), sizeof(float));
    be->zero(be, graph_aux_loss_sum(f->graph), sizeof(float));
    for (int i = 0; i < nb; i++) {
        graph_set_batch(f->graph, &bs[i]);
        graph_train_step(f->graph, &f->lora, 1.0f / targets, 5 + i);
    }
    float sum, aux;
    be->download(be, &sum, graph_loss_sum(f->graph), sizeof sum);
    be->download(be, &aux, graph_aux_loss_sum(f->graph), sizeof aux);
    if (grads_out) be->download(be, grads_out, f->lora.grads, f->lora.n_params * sizeof(float));
    return (double)sum / targets + aux;
}

static void packed_batch(ct_batch *b)
{
    batch_alloc(b, 64);
    fixture_batch(b, (const int32_t *const *)docs, lens, 4);
}

/* Directional derivatives per (module, A|B) over all layers and experts. */
static void check_fd(const char *json, const char *const *targets, int n_targets, bool aux)
{
    fixture f;
    REQUIRE(fixture_open(&f, json, true, targets, n_targets) == 0, "fixture");
    ct_error err = {0};
    REQUIRE(graph_set_router_aux_loss(f.graph, aux, &err) == CT_OK, "%s", err.msg);
    ct_batch b;
    packed_batch(&b);
    size_t n = f.lora.n_params;
    float *g = ct_malloc(n * 4), *p0 = ct_malloc(n * 4), *p = ct_malloc(n * 4), *v = ct_malloc(n * 4);
    step_loss(&f, &b, 1, g);
    be->download(be, p0, f.lora.params, n * 4);
    ct_rng r;
    ct_rng_seed(&r, 99);
    const double eps[3] = {1e-3, 3e-4, 1e-4};
    for (int m = 0; m <= CT_MOD_DOWN; m++) /* the modules these models have */
        for (int is_B = 0; is_B < 2; is_B++) {
            memset(v, 0, n * 4);
            double gv = 0;
            int blocks = 0;
            for (int l = 0; l < f.lora.n_layers; l++) {
                const ct_lora_slot *s = lora_slot(&f.lora, l, m);
                if (!s->experts) continue;
                float *base = is_B ? lora_B(&f.lora, l, m) : lora_A(&f.lora, l, m);
                size_t off = (size_t)(base - f.lora.params);
                size_t cnt = (size_t)s->experts * f.lora.R * (is_B ? s->out : s->in);
                for (size_t i = 0; i < cnt; i++) {
                    v[off + i] = ct_rng_normal(&r);
                    gv += (double)g[off + i] * v[off + i];
                }
                blocks++;
            }
            if (!blocks) continue;
            double fd = NAN, rel = INFINITY;
            for (int k = 0; k < 3 && !(rel <= 2e-2); k++) {
                for (size_t i = 0; i < n; i++) p[i] = p0[i] + (float)eps[k] * v[i];
                be->upload(be, f.lora.params, p, n * 4);
                double lp = step_loss(&f, &b, 1, NULL);
                for (size_t i = 0; i < n; i++) p[i] = p0[i] - (float)eps[k] * v[i];
                be->upload(be, f.lora.params, p, n * 4);
                double lm = step_loss(&f, &b, 1, NULL);
                fd = (lp - lm) / (2 * eps[k]);
                rel = fabs(fd - gv) / fmax(fabs(gv), 1e-6);
            }
            be->upload(be, f.lora.params, p0, n * 4);
            CHECK(rel <= 2e-2 && isfinite(gv) && fabs(gv) > 1e-6,
                  "%s lora_%c: analytic %.6g vs finite difference %.6g (rel %.2e)", model_module_name(m),
                  is_B ? 'B' : 'A', gv, fd, rel);
        }
    free(g); free(p0); free(p); free(v);
    batch_free(&b);
    fixture_close(&f);
}

TEST(lora_gradients_match_finite_differences_qwen3_moe_experts_and_dense_layer)
{
    check_fd(fixture_qwen3_moe_json, all_targets, 7, false);
}
TEST(lora_gradients_match_finite_differences_mixtral) { check_fd(fixture_mixtral_json, all_targets, 7, false); }
TEST(lora_gradients_match_finite_differences_gpt_oss) { check_fd(fixture_gpt_oss_json, all_targets, 7, false); }

/* With LoRA on attention only, every gradient reaches the adapters through the
 * MoE blocks' input, so the router's input-gradient path must be right. */
TEST(attention_lora_gradients_through_moe_blocks_include_the_router_path)
{
    check_fd(fixture_qwen3_moe_json, all_targets, 4, false);
    check_fd(fixture_mixtral_json, all_targets, 4, false);
}

TEST(lora_gradients_match_finite_differences_with_router_aux_loss)
{
    check_fd(fixture_qwen3_moe_json, all_targets, 7, true);
}

static void single_batches(ct_batch *single)
{
    for (int i = 0; i < 4; i++) {
        batch_alloc(&single[i], 64);
        fixture_batch(&single[i], &docs[i], &lens[i], 1);
    }
}

static void check_packed_equals_unpacked(const char *json)
{
    fixture f;
    REQUIRE(fixture_open(&f, json, true, all_targets, 7) == 0, "fixture");
    ct_batch packed, single[4];
    packed_batch(&packed);
    single_batches(single);
    size_t n = f.lora.n_params;
    float *g1 = ct_malloc(n * 4), *g2 = ct_malloc(n * 4);
    double l1 = step_loss(&f, &packed, 1, g1), l2 = step_loss(&f, single, 4, g2);
    CHECK(check_rel_err(l1, l2, 0) <= 1e-5, "loss packed %.8f vs one by one %.8f", l1, l2);
    double e = check_max_rel_err(g1, g2, n);
    CHECK(e <= 1e-4, "LoRA gradients packed vs one by one: max relative error %.3e", e);
    free(g1); free(g2);
    batch_free(&packed);
    for (int i = 0; i < 4; i++) batch_free(&single[i]);
    fixture_close(&f);
}

TEST(packed_batch_equals_documents_one_by_one_moe)
{
    check_packed_equals_unpacked(fixture_qwen3_moe_json);
    check_packed_equals_unpacked(fixture_gpt_oss_json);
}

/* One step of the packed batch on each fixture: the same loss and bit-identical
 * LoRA gradients (what names the two setups); closes both fixtures. */
static void expect_identical_steps(fixture *f1, fixture *f2, const char *what)
{
    ct_batch b;
    packed_batch(&b);
    size_t n = f1->lora.n_params;
    float *g1 = ct_malloc(n * 4), *g2 = ct_malloc(n * 4);
    double l1 = step_loss(f1, &b, 1, g1), l2 = step_loss(f2, &b, 1, g2);
    CHECK(l1 == l2, "%s: loss %.9g vs %.9g", what, l1, l2);
    CHECK(memcmp(g1, g2, n * 4) == 0, "gradients differ between %s", what);
    free(g1); free(g2);
    batch_free(&b);
    fixture_close(f1);
    fixture_close(f2);
}

TEST(checkpointing_on_and_off_give_identical_moe_gradients)
{
    fixture f1, f2;
    REQUIRE(fixture_open(&f1, fixture_qwen3_moe_json, true, all_targets, 7) == 0, "fixture");
    REQUIRE(fixture_open(&f2, fixture_qwen3_moe_json, false, all_targets, 7) == 0, "fixture");
    ct_error err = {0};
    REQUIRE(!graph_set_router_aux_loss(f1.graph, true, &err) && !graph_set_router_aux_loss(f2.graph, true, &err),
            "aux on");
    expect_identical_steps(&f1, &f2, "checkpointing on and off");
}

/* The fused expert LoRA forward (the default; the graph option
 * separate_expert_lora turns it off) routes the gate|up and down forwards through
 * moe_linear_lora_fwd (gate and up as two modules on their column halves;
 * gpt_oss's one gate_up module, expert biases and clamped SwiGLU): on the CPU
 * that op is the unfused sequence, so any wrong module, column offset or input
 * shows here. */
static void check_fused_lora_graph(const char *json)
{
    fixture f1, f2;
    REQUIRE(fixture_open(&f1, json, false, all_targets, 7) == 0, "fixture");
    REQUIRE(fixture_open(&f2, json, false, all_targets, 7) == 0, "fixture");
    ct_graph_options separate = {.capacity = 64, .separate_expert_lora = true};
    ct_error err = {0};
    graph_free(f2.graph);
    f2.graph = graph_new_with(&f2.model, &separate, &err);
    REQUIRE(f2.graph, "graph with the separate expert LoRA: %s", err.msg);
    expect_identical_steps(&f1, &f2, "the fused and the separate expert LoRA");
}

TEST(fused_expert_lora_forward_gives_identical_loss_and_gradients_on_the_cpu)
{
    check_fused_lora_graph(fixture_qwen3_moe_json);
    check_fused_lora_graph(fixture_gpt_oss_json);
}

/* A graph laid out for an adapter without expert modules (the memory plan's
 * no_expert_lora: no u or g buffers for the fused expert LoRA) is smaller by
 * those buffers, and if an adapter with expert modules runs on it anyway, the
 * expert LoRA takes the unfused path: on the CPU the same loss and gradients. */
TEST(graph_without_expert_lora_buffers_is_smaller_and_falls_back_unfused)
{
    fixture f1, f2;
    REQUIRE(fixture_open(&f1, fixture_qwen3_moe_json, false, all_targets, 7) == 0, "fixture");
    REQUIRE(fixture_open(&f2, fixture_qwen3_moe_json, false, all_targets, 7) == 0, "fixture");
    ct_graph_options with = {.capacity = 64}, without = {.capacity = 64, .no_expert_lora = true};
    ct_graph_sizes sw, so;
    graph_measure(&f2.model, &with, &sw);
    graph_measure(&f2.model, &without, &so);
    const ct_model_config *c = &f2.model.cfg;
    int sparse = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) sparse += c->layer_sparse[l];
    /* without checkpointing one workspace per layer: u of gate|up and of down each, and one g */
    size_t n = (size_t)64 * c->num_experts_per_tok, buf = n * 64 * be->act_bytes;
    size_t want = (2 * (size_t)c->num_hidden_layers + 1) * buf;
    CHECK(sparse > 0 && sw.working >= so.working + want, "working set %zu with the buffers, %zu without (%zu expected "
          "less)", sw.working, so.working, want);
    ct_error err = {0};
    graph_free(f2.graph);
    f2.graph = graph_new_with(&f2.model, &without, &err);
    REQUIRE(f2.graph, "graph without expert LoRA buffers: %s", err.msg);
    expect_identical_steps(&f1, &f2, "graphs with and without the fused expert LoRA's buffers");
}

/* Its value against HF is in test_hf_parity.c; here: it is what the loss grows
 * by, and it lies within the Switch loss's range. */
TEST(router_aux_loss_adds_to_the_loss_within_its_bounds)
{
    fixture f;
    REQUIRE(fixture_open(&f, fixture_mixtral_json, true, all_targets, 7) == 0, "fixture");
    ct_error err = {0};
    REQUIRE(graph_set_router_aux_loss(f.graph, true, &err) == CT_OK, "%s", err.msg);
    ct_batch b;
    packed_batch(&b);
    double with = step_loss(&f, &b, 1, NULL);
    float aux;
    be->download(be, &aux, graph_aux_loss_sum(f.graph), 4);
    REQUIRE(graph_set_router_aux_loss(f.graph, false, &err) == CT_OK, "%s", err.msg);
    double without = step_loss(&f, &b, 1, NULL);
    CHECK(aux > 0 && check_rel_err(with - without, aux, 0) <= 1e-4, "aux %g is what the loss grew by", aux);
    /* With E = 4, K = 2 the loss is coef * E * sum_e f_e P_e; f and P sum to K and 1,
     * so it lies in [coef * K, coef * E * K] (perfect balance at the bottom). */
    CHECK(aux >= 0.02 * 2 * (1 - 1e-6) && aux <= 0.02 * 4 * 2, "aux %g outside [coef K, coef E K]", aux);
    batch_free(&b);
    fixture_close(&f);
}

TEST(router_aux_loss_is_refused_for_a_dense_model)
{
    fixture f;
    REQUIRE(fixture_open(&f, fixture_llama_json, true, all_targets, 7) == 0, "fixture");
    ct_error err = {0};
    CHECK(graph_set_router_aux_loss(f.graph, true, &err) == CT_ERR_INPUT && strstr(err.msg, "router_aux_loss"),
          "%s", err.msg);
    fixture_close(&f);
}

static void check_adapter(const char *json, const char *expert_a, int64_t a_rows, int64_t a_cols,
                          const char *expert_b, int64_t b_rows, int64_t b_cols, const char *target, size_t count)
{
    fixture f;
    REQUIRE(fixture_open(&f, json, true, all_targets, 7) == 0, "fixture");
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/adapter", f.dir);
    ct_error err = {0};
    REQUIRE(lora_save_peft(&f.lora, &f.model, dir, "models/tiny-moe", &err) == CT_OK, "save: %s", err.msg);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_reader *r = st_open(path, &err);
    REQUIRE(r != NULL, "open: %s", err.msg);
    CHECK(st_count(r) == count, "tensor count %zu, expected %zu", st_count(r), count);
    const st_tensor *t = st_find(r, expert_a);
    CHECK(t && t->shape[0] == a_rows && t->shape[1] == a_cols, "%s [%lld, %lld]", expert_a, (long long)a_rows,
          (long long)a_cols);
    t = st_find(r, expert_b);
    CHECK(t && t->shape[0] == b_rows && t->shape[1] == b_cols, "%s [%lld, %lld]", expert_b, (long long)b_rows,
          (long long)b_cols);
    CHECK(!st_find(r, "base_model.model.model.layers.0.mlp.gate.lora_A.weight"), "the router is never adapted");
    st_close(r);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    size_t len;
    char *text = ct_read_file(path, &len, &err);
    REQUIRE(text, "read config");
    CHECK(strstr(text, target) != NULL, "adapter_config.json names %s", target);
    free(text);
    size_t n = f.lora.n_params;
    float *before = ct_malloc(n * 4), *after = ct_malloc(n * 4);
    be->download(be, before, f.lora.params, n * 4);
    be->zero(be, f.lora.params, n * 4);
    CHECK(lora_load_peft(&f.lora, &f.model, dir, &err) == CT_OK, "load: %s", err.msg);
    be->download(be, after, f.lora.params, n * 4);
    CHECK(memcmp(before, after, n * 4) == 0, "adapter round trip changed parameters");
    free(before); free(after);
    fixture_close(&f);
}

TEST(peft_adapter_names_each_expert_qwen3_moe)
{
    /* 3 layers x 4 attention modules + dense layer 1: 3 MLP modules + 2 sparse layers x 4 experts x 3, A and B */
    check_adapter(fixture_qwen3_moe_json, "base_model.model.model.layers.2.mlp.experts.3.up_proj.lora_A.weight", 4, 32,
                  "base_model.model.model.layers.0.mlp.experts.1.down_proj.lora_B.weight", 32, 4, "\"mlp.gate_proj.weight\"",
                  2 * (3 * 4 + 3 + 2 * 4 * 3));
}

TEST(peft_adapter_names_each_expert_mixtral_w1_w3_w2)
{
    check_adapter(fixture_mixtral_json, "base_model.model.model.layers.1.block_sparse_moe.experts.2.w3.lora_A.weight",
                  4, 32, "base_model.model.model.layers.0.block_sparse_moe.experts.0.w2.lora_B.weight", 32, 4,
                  "\"w1\"", 2 * (2 * 4 + 2 * 4 * 3));
}

TEST(peft_adapter_gpt_oss_experts_use_target_parameters_layout)
{
    /* gate_up: A [R*E, H], B [2I, R*E] (inner wrapper: base_layer); down: A [R*E, I], B [H, R*E] */
    check_adapter(fixture_gpt_oss_json, "base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight", 16, 32,
                  "base_model.model.model.layers.1.mlp.experts.lora_B.weight", 32, 16, "\"mlp.experts.gate_up_proj\"",
                  2 * (2 * 4 + 2 * 2));
}

/* gpt_oss stores its expert stacks transposed ([E, in, out]); the loader turns
 * them to (E, out, in) by 64 x 64 tiles. Dimensions of 1 1/2 and 2 1/4 tiles
 * make every tile edge partial somewhere: each loaded value must be its stored
 * value at the transposed place. */
TEST(gpt_oss_expert_stacks_load_as_their_exact_transposes)
{
    static const char json[] =
        "{\"model_type\": \"gpt_oss\", \"vocab_size\": 64, \"hidden_size\": 96, \"intermediate_size\": 72,"
        " \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8,"
        " \"num_local_experts\": 3, \"num_experts_per_tok\": 2, \"sliding_window\": 4, \"swiglu_limit\": 7.0,"
        " \"rope_theta\": 150000.0, \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 256,"
        " \"tie_word_embeddings\": false}";
    char dir[] = "/tmp/ctune_moe_XXXXXX", path[300];
    REQUIRE(mkdtemp(dir) && fixture_write_model(dir, json, 5) == 0, "fixture");
    ct_model m;
    ct_error err = {0};
    REQUIRE(model_load(&m, be, dir, &err) == CT_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_reader *r = st_open(path, &err);
    REQUIRE(r, "%s", err.msg);
    const char *names[2] = {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"};
    const float *loaded[2] = {m.layers[0].wgu_e, m.layers[0].wdown_e};
    for (int k = 0; k < 2; k++) {
        const st_tensor *t = st_find(r, names[k]);
        REQUIRE(t && t->ndim == 3, "%s missing", names[k]);
        size_t E = (size_t)t->shape[0], in = (size_t)t->shape[1], out = (size_t)t->shape[2], bad = 0;
        const unsigned char *raw = t->data;
        for (size_t e = 0; e < E; e++)
            for (size_t i = 0; i < in; i++)
                for (size_t o = 0; o < out; o++) {
                    uint16_t v;
                    memcpy(&v, raw + ((e * in + i) * out + o) * 2, 2);
                    bad += loaded[k][(e * out + o) * in + i] != ct_bf16_to_f32(v);
                }
        CHECK(bad == 0 && in > 64 && out > 64, "%s: %zu of %zu values misplaced", names[k], bad, E * in * out);
    }
    st_close(r);
    model_free(&m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

TEST(moe_model_on_a_backend_without_moe_ops_is_an_input_error)
{
    char dir[] = "/tmp/ctune_moe_XXXXXX";
    REQUIRE(mkdtemp(dir) && fixture_write_model(dir, fixture_mixtral_json, 1) == 0, "fixture");
    ct_backend *nomoe = backend_cpu_new();
    nomoe->moe_route = NULL; /* a backend without the MoE ops */
    ct_model m;
    ct_error err = {0};
    CHECK(model_load(&m, nomoe, dir, &err) == CT_ERR_INPUT && strstr(err.msg, "mixture of experts") &&
          strstr(err.msg, "device: cpu"), "%s", err.msg);
    nomoe->destroy(nomoe);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

/* A backend whose expert LoRA kernels stop at some rank (CUDA: 64) refuses a
 * larger lora.r on expert modules at lora_init, and only there. */
TEST(expert_lora_rank_beyond_the_backend_limit_is_an_input_error)
{
    char dir[] = "/tmp/ctune_moe_XXXXXX";
    REQUIRE(mkdtemp(dir) && fixture_write_model(dir, fixture_mixtral_json, 1) == 0, "fixture");
    ct_backend *capped = backend_cpu_new();
    capped->max_expert_lora_rank = 4;
    ct_model m;
    ct_error err = {0};
    REQUIRE(model_load(&m, capped, dir, &err) == CT_OK, "%s", err.msg);
    ct_lora lo;
    ct_lora_config lc = {.r = 8, .lora_alpha = 16, .n_target_modules = 2};
    strcpy(lc.target_modules[0], "q_proj");
    strcpy(lc.target_modules[1], "gate_proj"); /* mixtral w1 */
    strcpy(lc.init_lora_weights, "true");
    CHECK(lora_init(&lo, &m, &lc, 1, &err) == CT_ERR_INPUT && strstr(err.msg, "lora.r 8") &&
          strstr(err.msg, "r <= 4"), "rank 8 on experts accepted: %s", err.msg);
    lc.n_target_modules = 1; /* attention only: no expert kernel involved */
    err = (ct_error){0};
    CHECK(lora_init(&lo, &m, &lc, 1, &err) == CT_OK, "rank 8 on attention refused: %s", err.msg);
    lora_free(&lo, capped);
    model_free(&m);
    capped->destroy(capped);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

int main(void)
{
    be = backend_cpu_new();
    ct_rng_seed(&rng, 2024);
    RUN(lora_gradients_match_finite_differences_qwen3_moe_experts_and_dense_layer);
    RUN(lora_gradients_match_finite_differences_mixtral);
    RUN(lora_gradients_match_finite_differences_gpt_oss);
    RUN(attention_lora_gradients_through_moe_blocks_include_the_router_path);
    RUN(lora_gradients_match_finite_differences_with_router_aux_loss);
    RUN(packed_batch_equals_documents_one_by_one_moe);
    RUN(checkpointing_on_and_off_give_identical_moe_gradients);
    RUN(fused_expert_lora_forward_gives_identical_loss_and_gradients_on_the_cpu);
    RUN(graph_without_expert_lora_buffers_is_smaller_and_falls_back_unfused);
    RUN(router_aux_loss_adds_to_the_loss_within_its_bounds);
    RUN(router_aux_loss_is_refused_for_a_dense_model);
    RUN(peft_adapter_names_each_expert_qwen3_moe);
    RUN(peft_adapter_names_each_expert_mixtral_w1_w3_w2);
    RUN(peft_adapter_gpt_oss_experts_use_target_parameters_layout);
    RUN(gpt_oss_expert_stacks_load_as_their_exact_transposes);
    RUN(moe_model_on_a_backend_without_moe_ops_is_an_input_error);
    RUN(expert_lora_rank_beyond_the_backend_limit_is_an_input_error);
    be->destroy(be);
    return check_summary();
}
