/* test_hf_parity.c — ctune's CPU backend against HF transformers + PEFT.
 *
 * The fixtures in tests/fixtures/parity_NAME/ were made by scripts/parity_fixtures.sh:
 * a random model written by `ctune init`, six documents (with prompt tokens
 * masked), a ctune adapter after three steps (so every B is non-zero), and
 * expected.safetensors: the loss and every LoRA gradient that HF transformers +
 * PEFT computed in fp32, running the documents one by one
 * (scripts/hf_parity.py grads). Here ctune computes the same loss and gradients,
 * packed and unpacked, and must agree to relative error <= 1e-4: the loss as a
 * number, each gradient tensor in the L2 norm (elementwise, entries near zero
 * differ by summation order alone, ~1e-3 of themselves). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "graph.h"
#include "packer.h"

/* Loss and gradients of all documents as one optimizer step. */
static int ctune_step(const char *dir, bool packing, float *loss, float **grads, ct_lora *lo_out,
                      ct_model *m, ct_backend *be)
{
    char path[512];
    ct_error err = {0};
    static ct_config cfg;
    config_defaults(&cfg);
    snprintf(path, sizeof path, "%s/train.yaml", dir);
    if (config_load(&cfg, path, &err)) return printf("%s\n", err.msg), -1;
    snprintf(path, sizeof path, "%s/model", dir);
    if (model_load(m, be, path, &err)) return printf("%s\n", err.msg), -1;
    if (lora_init(lo_out, m, &cfg.lora, 1, &err)) return printf("%s\n", err.msg), -1;
    snprintf(path, sizeof path, "%s/adapter", dir);
    if (lora_load_peft(lo_out, m, path, &err)) return printf("%s\n", err.msg), -1;
    snprintf(path, sizeof path, "%s/data/train.shard", dir);
    const char *pat = path;
    ct_dataset ds;
    if (dataset_open(&ds, &pat, 1, (uint32_t)m->cfg.vocab_size, &err)) return printf("%s\n", err.msg), -1;
    ct_packer_options opt = {.tokens_per_micro_batch = 256, .max_length = 64, .packing = packing,
                             .shuffle_window = 64, .seed = 1};
    ct_packer *p = packer_new(&ds, &opt, &err);
    if (!p) return printf("%s\n", err.msg), -1;
    size_t nb = packer_batches_per_epoch(p);
    ct_batch *bs = ct_calloc(nb, sizeof *bs);
    int targets = 0;
    for (size_t i = 0; i < nb; i++) {
        batch_alloc(&bs[i], 256);
        packer_next(p, &bs[i]);
        targets += bs[i].n_targets;
    }
    ct_graph *g = graph_new(m, 256, true, &err);
    be->zero(be, lo_out->grads, lo_out->n_params * 4);
    be->zero(be, graph_loss_sum(g), 4);
    for (size_t i = 0; i < nb; i++) {
        graph_set_batch(g, &bs[i]);
        graph_train_step(g, lo_out, 1.0f / targets, 0);
    }
    be->download(be, loss, graph_loss_sum(g), 4);
    *loss /= (float)targets;
    *grads = ct_malloc(lo_out->n_params * 4);
    be->download(be, *grads, lo_out->grads, lo_out->n_params * 4);
    graph_free(g);
    for (size_t i = 0; i < nb; i++) batch_free(&bs[i]);
    free(bs);
    packer_free(p);
    dataset_close(&ds);
    return 0;
}

static void check_parity(const char *dir, bool packing)
{
    char path[512];
    ct_error err = {0};
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    st_reader *want = st_open(path, &err);
    REQUIRE(want, "%s (make it with scripts/parity_fixtures.sh)", err.msg);
    ct_backend *be = backend_cpu_new();
    ct_model m;
    ct_lora lo;
    float loss, *grads = NULL;
    REQUIRE(ctune_step(dir, packing, &loss, &grads, &lo, &m, be) == 0, "ctune step");
    const st_tensor *t = st_find(want, "loss");
    REQUIRE(t && t->dtype == CT_DTYPE_F32, "expected loss");
    float hf_loss;
    memcpy(&hf_loss, t->data, 4);
    CHECK(check_rel_err(loss, hf_loss, 0) <= 1e-4, "loss: ctune %.7f vs HF %.7f", loss, hf_loss);
    int compared = 0;
    double worst = 0;
    for (int l = 0; l < lo.n_layers; l++)
        for (int mod = 0; mod < CT_MOD_COUNT; mod++)
            for (int is_B = 0; is_B < 2; is_B++) {
                char name[256];
                lora_tensor_name(name, sizeof name, l, mod, is_B);
                t = st_find(want, name);
                CHECK(t && t->dtype == CT_DTYPE_F32, "expected gradient %s", name);
                if (!t) continue;
                const float *mine = grads + ((is_B ? lora_grad_B(&lo, l, mod) : lora_grad_A(&lo, l, mod)) - lo.grads);
                float *hf = ct_malloc(t->nbytes);
                memcpy(hf, t->data, t->nbytes);
                double e = check_l2_rel_err(mine, hf, t->numel);
                CHECK(e <= 1e-4, "%s: relative error (L2) %.2e", name, e);
                if (e > worst) worst = e;
                free(hf);
                compared++;
            }
    CHECK(compared == 2 * CT_MOD_COUNT * lo.n_layers, "compared %d gradient tensors", compared);
    printf("     %s%s: loss ctune %.7f HF %.7f; worst gradient L2 relative error %.2e\n", dir,
           packing ? " (packed)" : "", loss, hf_loss, worst);
    free(grads);
    lora_free(&lo, be);
    model_free(&m);
    be->destroy(be);
    st_close(want);
}

TEST(llama_loss_and_lora_gradients_match_hf_peft_documents_one_by_one) { check_parity("tests/fixtures/parity_llama", false); }
TEST(llama_packed_batch_matches_hf_peft) { check_parity("tests/fixtures/parity_llama", true); }
TEST(qwen3_loss_and_lora_gradients_match_hf_peft_documents_one_by_one) { check_parity("tests/fixtures/parity_qwen3", false); }
TEST(qwen3_packed_batch_matches_hf_peft) { check_parity("tests/fixtures/parity_qwen3", true); }

int main(void)
{
    RUN(llama_loss_and_lora_gradients_match_hf_peft_documents_one_by_one);
    RUN(llama_packed_batch_matches_hf_peft);
    RUN(qwen3_loss_and_lora_gradients_match_hf_peft_documents_one_by_one);
    RUN(qwen3_packed_batch_matches_hf_peft);
    return check_summary();
}
