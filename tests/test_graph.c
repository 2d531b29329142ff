/* test_graph.c — the dense model graph on the CPU reference backend: LoRA
 * gradients against finite differences, packed == unpacked, accumulation,
 * checkpointing on == off, and the PEFT adapter format.
 *
 * Finite differences: for each module kind and for A and B separately, a random
 * direction v ~ N(0,1) over that parameter group (all layers) gives the exact
 * directional derivative g.v from backward, compared with the central
 * difference (L(p + eps v) - L(p - eps v)) / (2 eps), eps = 1e-3, L the mean
 * loss. In fp32 the difference carries about 1e-7 * L / eps of rounding noise,
 * so we require relative error <= 2e-2 (observed: at most 7e-3; dropping one
 * module's backward shows errors of 2e-2 to 1 in every module it feeds). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "graph.h"
#include "json.h"
#include "model_fixture.h"
#include "optim.h"

typedef struct fixture {
    char dir[256];
    ct_backend *be;
    ct_model model;
    ct_lora lora;
    ct_graph *graph;
} fixture;

static int fixture_open(fixture *f, const char *json, bool checkpointing, double dropout)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/ctune_graph_XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    if (fixture_write_model(f->dir, json, 7)) return -1;
    ct_error err = {0};
    f->be = backend_cpu_new();
    if (model_load(&f->model, f->be, f->dir, &err)) {
        printf("model_load: %s\n", err.msg);
        return -1;
    }
    ct_lora_config lc = {.r = 4, .lora_alpha = 8, .lora_dropout = dropout, .n_target_modules = 7};
    const char *names[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < 7; i++) strcpy(lc.target_modules[i], names[i]);
    strcpy(lc.init_lora_weights, "true");
    if (lora_init(&f->lora, &f->model, &lc, 3, &err)) {
        printf("lora_init: %s\n", err.msg);
        return -1;
    }
    /* B = 0 after PEFT init would make every dA zero: give B values to test A too. */
    float *p = ct_malloc(f->lora.n_params * sizeof(float));
    f->be->download(f->be, p, f->lora.params, f->lora.n_params * sizeof(float));
    ct_rng rng;
    ct_rng_seed(&rng, 11);
    for (int l = 0; l < f->lora.n_layers; l++)
        for (int m = 0; m < CT_MOD_COUNT; m++) {
            if (!lora_B(&f->lora, l, m)) continue; /* untargeted (the GDN modules of a model without them) */
            float *B = p + (lora_B(&f->lora, l, m) - f->lora.params);
            for (int i = 0; i < f->lora.out[m] * f->lora.R; i++) B[i] = 0.1f * ct_rng_normal(&rng);
        }
    f->be->upload(f->be, f->lora.params, p, f->lora.n_params * sizeof(float));
    free(p);
    f->graph = graph_new(&f->model, 64, checkpointing, &err);
    return f->graph ? 0 : -1;
}

static void fixture_close(fixture *f)
{
    graph_free(f->graph);
    lora_free(&f->lora, f->be);
    model_free(&f->model);
    f->be->destroy(f->be);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd)) {}
}

static const int32_t doc_a[] = {1, 5, 9, 2, 33, 17, 8, 60, 4};
static const int32_t doc_b[] = {3, 3, 12, 40, 41};
static const int32_t doc_c[] = {7};
static const int32_t doc_d[] = {50, 22, 9, 13, 13, 2, 63};

/* Runs the batches as one optimizer step: returns the mean loss, grads in host. */
static double step_loss(fixture *f, ct_batch *bs, int nb, float *grads_out, uint64_t seed)
{
    ct_backend *be = f->be;
    int targets = 0;
    for (int i = 0; i < nb; i++) targets += bs[i].n_targets;
    be->zero(be, f->lora.grads, f->lora.n_params * sizeof(float));
    be->zero(be, graph_loss_sum(f->graph), sizeof(float));
    for (int i = 0; i < nb; i++) {
        graph_set_batch(f->graph, &bs[i]);
        graph_train_step(f->graph, &f->lora, 1.0f / targets, seed + i);
    }
    float sum;
    be->download(be, &sum, graph_loss_sum(f->graph), sizeof sum);
    if (grads_out) be->download(be, grads_out, f->lora.grads, f->lora.n_params * sizeof(float));
    return sum / targets;
}

static void packed_batch(ct_batch *b)
{
    const int32_t *docs[] = {doc_a, doc_b, doc_c, doc_d};
    int lens[] = {9, 5, 1, 7};
    batch_alloc(b, 64);
    fixture_batch(b, docs, lens, 4);
}

static void check_fd(const char *json, double dropout)
{
    fixture f;
    REQUIRE(fixture_open(&f, json, true, dropout) == 0, "fixture");
    ct_batch b;
    packed_batch(&b);
    size_t n = f.lora.n_params;
    float *g = ct_malloc(n * sizeof(float)), *p0 = ct_malloc(n * sizeof(float)), *p = ct_malloc(n * sizeof(float));
    float *v = ct_calloc(n, sizeof(float));
    step_loss(&f, &b, 1, g, 5);
    f.be->download(f.be, p0, f.lora.params, n * sizeof(float));
    ct_rng rng;
    ct_rng_seed(&rng, 99);
    const double eps = 1e-3;
    for (int m = 0; m <= CT_MOD_DOWN; m++) /* the modules these models have */
        for (int is_B = 0; is_B < 2; is_B++) {
            memset(v, 0, n * sizeof(float));
            double gv = 0;
            for (int l = 0; l < f.lora.n_layers; l++) {
                float *base = is_B ? lora_B(&f.lora, l, m) : lora_A(&f.lora, l, m);
                size_t off = (size_t)(base - f.lora.params);
                size_t cnt = (size_t)f.lora.R * (is_B ? f.lora.out[m] : f.lora.in[m]);
                for (size_t i = 0; i < cnt; i++) {
                    v[off + i] = ct_rng_normal(&rng);
                    gv += (double)g[off + i] * v[off + i];
                }
            }
            double lp, lm;
            for (size_t i = 0; i < n; i++) p[i] = p0[i] + (float)eps * v[i];
            f.be->upload(f.be, f.lora.params, p, n * sizeof(float));
            lp = step_loss(&f, &b, 1, NULL, 5);
            for (size_t i = 0; i < n; i++) p[i] = p0[i] - (float)eps * v[i];
            f.be->upload(f.be, f.lora.params, p, n * sizeof(float));
            lm = step_loss(&f, &b, 1, NULL, 5);
            f.be->upload(f.be, f.lora.params, p0, n * sizeof(float));
            double fd = (lp - lm) / (2 * eps);
            double rel = fabs(fd - gv) / fmax(fabs(gv), 1e-6);
            CHECK(rel <= 2e-2 && isfinite(gv) && fabs(gv) > 1e-6, "%s lora_%c: analytic %.6g vs finite difference %.6g (rel %.2e)",
                  model_module_name(m), is_B ? 'B' : 'A', gv, fd, rel);
        }
    free(g); free(p0); free(p); free(v);
    batch_free(&b);
    fixture_close(&f);
}

TEST(lora_gradients_match_finite_differences_llama) { check_fd(fixture_llama_json, 0.0); }
TEST(lora_gradients_match_finite_differences_qwen3_qk_norm_gqa4) { check_fd(fixture_qwen3_json, 0.0); }
TEST(lora_gradients_match_finite_differences_qwen2_bias_llama3_rope) { check_fd(fixture_qwen2_json, 0.0); }
TEST(lora_gradients_match_finite_differences_with_dropout) { check_fd(fixture_llama_json, 0.1); }

static void compare_grads(const float *a, const float *b, size_t n, double tol, const char *what)
{
    double err = check_max_rel_err(a, b, n);
    CHECK(err <= tol, "%s: max relative error %.3e > %.1e", what, err, tol);
}

TEST(packed_batch_equals_documents_one_by_one)
{
    fixture f;
    REQUIRE(fixture_open(&f, fixture_qwen3_json, true, 0.0) == 0, "fixture");
    ct_batch packed, single[4];
    packed_batch(&packed);
    const int32_t *docs[] = {doc_a, doc_b, doc_c, doc_d};
    int lens[] = {9, 5, 1, 7};
    for (int i = 0; i < 4; i++) {
        batch_alloc(&single[i], 64);
        fixture_batch(&single[i], &docs[i], &lens[i], 1);
    }
    size_t n = f.lora.n_params;
    float *g1 = ct_malloc(n * 4), *g2 = ct_malloc(n * 4);
    double l1 = step_loss(&f, &packed, 1, g1, 5);
    double l2 = step_loss(&f, single, 4, g2, 5);
    CHECK(check_rel_err(l1, l2, 0) <= 1e-5, "loss packed %.8f vs one by one %.8f", l1, l2);
    compare_grads(g1, g2, n, 1e-4, "LoRA gradients packed vs one by one");
    free(g1); free(g2);
    batch_free(&packed);
    for (int i = 0; i < 4; i++) batch_free(&single[i]);
    fixture_close(&f);
}

TEST(one_step_over_four_documents_equals_four_accumulated_micro_steps)
{
    fixture f1, f2;
    REQUIRE(fixture_open(&f1, fixture_llama_json, true, 0.0) == 0, "fixture");
    REQUIRE(fixture_open(&f2, fixture_llama_json, true, 0.0) == 0, "fixture");
    ct_batch packed, single[4];
    packed_batch(&packed);
    const int32_t *docs[] = {doc_a, doc_b, doc_c, doc_d};
    int lens[] = {9, 5, 1, 7};
    for (int i = 0; i < 4; i++) {
        batch_alloc(&single[i], 64);
        fixture_batch(&single[i], &docs[i], &lens[i], 1);
    }
    ct_training_config t = {.learning_rate = 1e-2, .adam_beta1 = 0.9, .adam_beta2 = 0.999, .adam_epsilon = 1e-8,
                            .max_grad_norm = 1.0, .weight_decay = 0.01};
    float *ns1 = f1.be->alloc(f1.be, 4), *ns2 = f2.be->alloc(f2.be, 4);
    step_loss(&f1, &packed, 1, NULL, 5);
    optim_step(f1.be, &f1.lora, &t, ns1, 1e-2, 1);
    step_loss(&f2, single, 4, NULL, 5);
    optim_step(f2.be, &f2.lora, &t, ns2, 1e-2, 1);
    size_t n = f1.lora.n_params;
    float *p1 = ct_malloc(n * 4), *p2 = ct_malloc(n * 4);
    f1.be->download(f1.be, p1, f1.lora.params, n * 4);
    f2.be->download(f2.be, p2, f2.lora.params, n * 4);
    compare_grads(p1, p2, n, 1e-5, "parameters after one AdamW step");
    free(p1); free(p2);
    f1.be->free(f1.be, ns1);
    f2.be->free(f2.be, ns2);
    batch_free(&packed);
    for (int i = 0; i < 4; i++) batch_free(&single[i]);
    fixture_close(&f1);
    fixture_close(&f2);
}

TEST(checkpointing_on_and_off_give_identical_gradients)
{
    fixture f1, f2;
    REQUIRE(fixture_open(&f1, fixture_qwen3_json, true, 0.0) == 0, "fixture");
    REQUIRE(fixture_open(&f2, fixture_qwen3_json, false, 0.0) == 0, "fixture");
    ct_batch b;
    packed_batch(&b);
    size_t n = f1.lora.n_params;
    float *g1 = ct_malloc(n * 4), *g2 = ct_malloc(n * 4);
    double l1 = step_loss(&f1, &b, 1, g1, 5), l2 = step_loss(&f2, &b, 1, g2, 5);
    CHECK(l1 == l2, "loss %.9g vs %.9g", l1, l2);
    CHECK(memcmp(g1, g2, n * 4) == 0, "gradients differ between checkpointing on and off");
    free(g1); free(g2);
    batch_free(&b);
    fixture_close(&f1);
    fixture_close(&f2);
}

TEST(peft_adapter_has_peft_names_shapes_and_config)
{
    fixture f;
    REQUIRE(fixture_open(&f, fixture_llama_json, true, 0.0) == 0, "fixture");
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/adapter", f.dir);
    ct_error err = {0};
    REQUIRE(lora_save_peft(&f.lora, &f.model, dir, "models/tiny", &err) == CT_OK, "save: %s", err.msg);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_reader *r = st_open(path, &err);
    REQUIRE(r != NULL, "open: %s", err.msg);
    CHECK(st_count(r) == 2 * 7 * 2, "tensor count %zu", st_count(r));
    const st_tensor *t = st_find(r, "base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight");
    CHECK(t && t->dtype == CT_DTYPE_F32 && t->ndim == 2 && t->shape[0] == 4 && t->shape[1] == 32, "k_proj lora_A shape");
    t = st_find(r, "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight");
    CHECK(t && t->shape[0] == 16 && t->shape[1] == 4, "k_proj lora_B is (out=kv_heads*head_dim, r)");
    t = st_find(r, "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
    CHECK(t && t->shape[0] == 4 && t->shape[1] == 48, "down_proj lora_A is (r, intermediate)");
    CHECK(st_metadata(r, "format") && !strcmp(st_metadata(r, "format"), "pt"), "format metadata pt");
    st_close(r);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    size_t len;
    char *text = ct_read_file(path, &len, &err);
    REQUIRE(text, "read config");
    json_doc *doc = json_parse(text, len, path, &err);
    REQUIRE(doc, "parse: %s", err.msg);
    const json_value *root = json_root(doc);
    const json_value *v = json_get_type(root, "peft_type", JSON_STRING);
    CHECK(v && !strcmp(v->string, "LORA"), "peft_type LORA");
    v = json_get_type(root, "r", JSON_NUMBER);
    CHECK(v && v->number == 4, "r 4");
    v = json_get_type(root, "lora_alpha", JSON_NUMBER);
    CHECK(v && v->number == 8, "lora_alpha 8");
    v = json_get_type(root, "target_modules", JSON_ARRAY);
    CHECK(v && v->count == 7, "7 target modules");
    v = json_get_type(root, "task_type", JSON_STRING);
    CHECK(v && !strcmp(v->string, "CAUSAL_LM"), "task_type");
    v = json_get_type(root, "bias", JSON_STRING);
    CHECK(v && !strcmp(v->string, "none"), "bias none");
    v = json_get_type(root, "base_model_name_or_path", JSON_STRING);
    CHECK(v && !strcmp(v->string, "models/tiny"), "base model path");
    json_free(doc);
    free(text);

    /* and it loads back into the same parameters */
    size_t n = f.lora.n_params;
    float *before = ct_malloc(n * 4), *after = ct_malloc(n * 4);
    f.be->download(f.be, before, f.lora.params, n * 4);
    f.be->zero(f.be, f.lora.params, n * 4);
    CHECK(lora_load_peft(&f.lora, &f.model, dir, &err) == CT_OK, "load: %s", err.msg);
    f.be->download(f.be, after, f.lora.params, n * 4);
    CHECK(memcmp(before, after, n * 4) == 0, "adapter round trip changed parameters");
    free(before); free(after);
    fixture_close(&f);
}

TEST(lora_init_matches_peft_kaiming_uniform_bound_and_zero_B)
{
    fixture f;
    REQUIRE(fixture_open(&f, fixture_llama_json, true, 0.0) == 0, "fixture");
    ct_error err = {0};
    ct_lora fresh;
    REQUIRE(lora_init(&fresh, &f.model, &f.lora.cfg, 3, &err) == CT_OK, "init");
    size_t n = fresh.n_params;
    float *p = ct_malloc(n * 4);
    f.be->download(f.be, p, fresh.params, n * 4);
    const float *A = p + (lora_A(&fresh, 0, CT_MOD_DOWN) - fresh.params);
    const float *B = p + (lora_B(&fresh, 0, CT_MOD_DOWN) - fresh.params);
    double bound = 1.0 / sqrt(48.0), maxa = 0;
    for (int i = 0; i < 4 * 48; i++) maxa = fmax(maxa, fabs(A[i]));
    CHECK(maxa <= bound && maxa > 0.8 * bound, "max |A| %.4f vs bound 1/sqrt(in) = %.4f", maxa, bound);
    int nonzero = 0;
    for (int i = 0; i < 32 * 4; i++) nonzero += B[i] != 0;
    CHECK(nonzero == 0, "B has %d non-zero entries", nonzero);
    free(p);
    lora_free(&fresh, f.be);
    fixture_close(&f);
}

int main(void)
{
    RUN(lora_gradients_match_finite_differences_llama);
    RUN(lora_gradients_match_finite_differences_qwen3_qk_norm_gqa4);
    RUN(lora_gradients_match_finite_differences_qwen2_bias_llama3_rope);
    RUN(lora_gradients_match_finite_differences_with_dropout);
    RUN(packed_batch_equals_documents_one_by_one);
    RUN(one_step_over_four_documents_equals_four_accumulated_micro_steps);
    RUN(checkpointing_on_and_off_give_identical_gradients);
    RUN(peft_adapter_has_peft_names_shapes_and_config);
    RUN(lora_init_matches_peft_kaiming_uniform_bound_and_zero_B);
    return check_summary();
}
