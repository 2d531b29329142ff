/* test_hf_parity.c — ctune's CPU backend against HF transformers + PEFT.
 *
 * The fixtures in tests/fixtures/parity_NAME/ were made by scripts/parity_fixtures.sh:
 * a random model written by `ctune init`, six documents (with prompt tokens
 * masked), a ctune adapter after three steps (so every B is non-zero), and
 * expected.safetensors: the loss and every LoRA gradient that HF transformers +
 * PEFT computed in fp32 (parity_qwen3_5: in fp64, see gdn_gap_bounds), running the documents one by one
 * (scripts/hf_parity.py grads). Here ctune computes the same loss and gradients,
 * packed and unpacked, and must agree to relative error <= 1e-4: the loss as a
 * number, each gradient tensor in the L2 norm (elementwise, entries near zero
 * differ by summation order alone, ~1e-3 of themselves), or, for a tensor that
 * is a small part of the gradient, to 1e-5 of the whole gradient's norm.
 *
 * parity_qwen3_moe adds the mixture-of-experts path (router, top-2 of 8
 * experts without renormalisation, per-expert LoRA); parity_gpt_oss adds
 * gpt_oss (top-2 of 4 by logits, router and expert biases, clamped interleaved
 * SwiGLU, attention sinks, a sliding-window layer, yarn RoPE, fused expert
 * LoRA in PEFT's target_parameters layout); parity_mixtral adds mixtral
 * (block_sparse_moe names, w1/w3/w2 expert LoRA, renormalised top-2 of 4);
 * parity_qwen3_5 adds the Gated DeltaNet hybrid qwen3_5_text (three GDN layers
 * and one gated attention layer: causal conv, decay and write gates, the gated
 * delta rule, gated RMSNorm, zero-centred norms, partial RoPE, the sigmoid
 * output gate, LoRA on in_proj_qkv/z/b/a and out_proj), whose packed documents
 * must not share conv taps or delta-rule state; parity_qwen3_5_moe its mixture
 * of experts with the gated shared expert; parity_qwen3_next qwen3_next (the
 * grouped in_proj_qkvz / in_proj_ba, permuted at load and in LoRA B, routed
 * expert LoRA, a dense mlp_only layer). parity_qwen3_nf4 and parity_llama_fp4
 * are 4-bit frozen bases (bitsandbytes NF4 with double quant, FP4 without, as
 * HF saves them), parity_qwen3_nf4_onload the bf16 base quantized on load
 * (model_quantization: nf4), parity_gpt_oss_mxfp4 a gpt_oss base whose
 * experts are MXFP4 (against HF's dequantized path), parity_qwen3_fp8 and
 * parity_qwen3_fp8_onload an FP8 base stored and quantized on load: see their
 * TESTs.
 * Their expected.safetensors were made with torch 2.11, transformers 5.17
 * (fused experts: PEFT 0.21 converts the per-expert adapters on load, and
 * scripts/hf_parity.py splits the gradients back) on a machine with torch
 * (scripts/parity_fixtures.sh hf NAME); a fixture without one is skipped,
 * saying so.
 *
 * Given case folders (the same layout: train.yaml, model/, adapter/,
 * data/train.shard, expected.safetensors), it checks those instead, unpacked and
 * packed, and prints one "#summary" for all:
 *
 *   test_hf_parity [--device cpu|cuda] [--tol-loss X] [--tol-grad Y] [--unpacked-only] CASE...
 *
 * scripts/random_parity.py drives it over generated configs (bounds 1e-4 on the
 * CPU, bf16 bounds on the GPU); tests/random_parity.test.sh over the stored
 * handful in tests/fixtures/random_parity/. The gradient step uses dropout seed
 * 0, the seed random_parity.py reproduces in HF for dropout cases (unpacked
 * only: a packed document's rows, and so its mask, sit elsewhere). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapter.h"
#include "check.h"
#include "config.h"
#include "graph.h"
#include "json.h"
#include "packer.h"

/* Relative bounds: on the loss, and on each gradient tensor in the L2 norm. */
typedef struct parity_bounds {
    double loss, grad;
} parity_bounds;
static const parity_bounds fp32_bounds = {1e-4, 1e-4};

/* Loss and gradients of all documents as one optimizer step, micro-batches as
 * train.yaml's data section packs them. */
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
    ct_load_options lopt = {.fp8 = cfg.base_precision == CT_BASE_FP8,
                            .quantize = cfg.model_quantization != CT_MODEL_QUANT_NONE,
                            .type = cfg.model_quantization == CT_MODEL_QUANT_FP4 ? QUANT4_FP4 : QUANT4_NF4,
                            .blocksize = 64, .double_quant = cfg.bnb_4bit_use_double_quant};
    if (model_load_with(m, be, path, &lopt, &err)) return printf("%s\n", err.msg), -1;
    if (lora_init(lo_out, m, &cfg.lora, 1, &err)) return printf("%s\n", err.msg), -1;
    snprintf(path, sizeof path, "%s/adapter", dir);
    if (lora_load_peft(lo_out, m, path, &err)) return printf("%s\n", err.msg), -1;
    snprintf(path, sizeof path, "%s/data/train.shard", dir);
    const char *pat = path;
    ct_dataset ds;
    if (dataset_open(&ds, &pat, 1, (uint32_t)m->cfg.vocab_size, &err)) return printf("%s\n", err.msg), -1;
    int cap = cfg.data.tokens_per_micro_batch;
    ct_packer_options opt = {.tokens_per_micro_batch = cap, .max_length = cfg.data.max_length,
                             .packing = packing, .shuffle_window = 64, .seed = 1};
    ct_packer *p = packer_new(&ds, &opt, &err);
    if (!p) return printf("%s\n", err.msg), -1;
    size_t nb = packer_batches_per_epoch(p);
    ct_batch *bs = ct_calloc(nb, sizeof *bs);
    int targets = 0;
    for (size_t i = 0; i < nb; i++) {
        batch_alloc(&bs[i], cap);
        packer_next(p, &bs[i]);
        targets += bs[i].n_targets;
    }
    /* u kept for the backward, as training runs it (test_offload: the same bits as recomputing it) */
    ct_graph_options gopt = {.capacity = cap, .checkpointing = true, .lora_rank = lo_out->R};
    ct_graph *g = graph_new_with(m, &gopt, &err);
    if (!g) return printf("%s\n", err.msg), -1;
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

/* optional: expected.safetensors may be missing (not made yet): skip then.
 * be_new makes the backend (NULL: the CPU's). */
static void check_parity_within(const char *dir, bool packing, bool optional, parity_bounds tol,
                                ct_backend *(*be_new)(ct_error *))
{
    char path[512];
    ct_error err = {0};
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    if (optional && access(path, R_OK) != 0)
        SKIP("%s is not made yet: run 'bash scripts/parity_fixtures.sh hf %s' where torch, transformers and "
             "peft are installed", path, strrchr(dir, '/') + 1);
    st_reader *want = st_open(path, &err);
    REQUIRE(want, "%s (make it with scripts/parity_fixtures.sh)", err.msg);
    ct_backend *be = be_new ? be_new(&err) : backend_cpu_new();
    if (!be) {
        st_close(want);
        SKIP("%s", err.msg);
    }
    ct_model m;
    ct_lora lo;
    float loss, *grads = NULL;
    REQUIRE(ctune_step(dir, packing, &loss, &grads, &lo, &m, be) == 0, "%s: ctune step", dir);
    const st_tensor *t = st_find(want, "loss");
    REQUIRE(t && t->dtype == CT_DTYPE_F32, "expected loss");
    float hf_loss;
    memcpy(&hf_loss, t->data, 4);
    CHECK(check_rel_err(loss, hf_loss, 0) <= tol.loss, "%s: loss: ctune %.7f vs HF %.7f (relative %.2e > %g)", dir,
          loss, hf_loss, check_rel_err(loss, hf_loss, 0), tol.loss);
    /* ctune's gradients written as an adapter carry PEFT's names and layouts
     * (per-expert modules, or gpt_oss's fused expert parameters), as HF's do. */
    char gdir[] = "/tmp/ctune_parity_XXXXXX";
    REQUIRE(mkdtemp(gdir), "temp dir");
    be->upload(be, lo.params, grads, lo.n_params * 4);
    REQUIRE(lora_save_peft(&lo, &m, gdir, "gradients", &err) == CT_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", gdir);
    st_reader *mine = st_open(path, &err);
    REQUIRE(mine, "%s", err.msg);
    /* A tensor whose gradient is a small part of the whole (an expert few tokens
     * reach, lora_A behind a small B) sums terms that cancel, so its own relative
     * error is rounding magnified: it also passes when its error is within a
     * tenth of the bound of the whole gradient's norm. */
    double total = 0;
    for (size_t i = 0; i < st_count(want); i++) {
        const st_tensor *w = st_at(want, i);
        if (strcmp(w->name, "loss") && w->dtype == CT_DTYPE_F32)
            for (size_t j = 0; j < w->numel; j++) {
                float v;
                memcpy(&v, (const char *)w->data + 4 * j, 4);
                total += (double)v * v;
            }
    }
    total = sqrt(total);
    int compared = 0;
    double worst = 0;
    for (size_t i = 0; i < st_count(mine); i++) {
        const st_tensor *g = st_at(mine, i);
        t = st_find(want, g->name);
        CHECK(t && t->dtype == CT_DTYPE_F32 && t->numel == g->numel, "expected gradient %s (%zu values)", g->name,
              g->numel);
        if (!t || t->numel != g->numel) continue;
        float *a = ct_malloc(g->nbytes), *b = ct_malloc(t->nbytes);
        memcpy(a, g->data, g->nbytes);
        memcpy(b, t->data, t->nbytes);
        double e = check_l2_rel_err(a, b, t->numel), norm = 0, diff = 0;
        for (size_t j = 0; j < t->numel; j++) {
            norm += (double)b[j] * b[j];
            diff += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
        }
        /* the error against the whole norm (also where this tensor's own gradient
         * is 0: a window of one key gives q and k none); NaN fails both ways */
        double of_total = total > 0 ? sqrt(diff) / total : e;
        CHECK(e <= tol.grad || of_total <= 0.1 * tol.grad, "%s: %s: relative error (L2) %.2e > %g (%.2e of the "
              "whole gradient's norm > %g)", dir, g->name, e, tol.grad, of_total, 0.1 * tol.grad);
        if ((total > 0 ? sqrt(norm) / total : 1) >= 0.01 && e > worst) worst = e; /* the tensors that matter */
        free(a);
        free(b);
        compared++;
    }
    CHECK(compared > 0 && st_count(want) == (size_t)compared + 1, "compared %d gradient tensors of %zu in %s",
          compared, st_count(want) - 1, dir);
    st_close(mine);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", gdir);
    if (system(cmd)) {}
    printf("     %s%s: loss ctune %.7f HF %.7f; worst gradient L2 relative error %.2e (of the tensors "
           "holding >= 1%% of the whole gradient's norm)\n", dir,
           packing ? " (packed)" : "", loss, hf_loss, worst);
    free(grads);
    lora_free(&lo, be);
    model_free(&m);
    be->destroy(be);
    st_close(want);
}

static void check_parity(const char *dir, bool packing, bool optional)
{
    check_parity_within(dir, packing, optional, fp32_bounds, NULL);
}

TEST(llama_loss_and_lora_gradients_match_hf_peft_documents_one_by_one)
{
    check_parity("tests/fixtures/parity_llama", false, false);
}
TEST(llama_packed_batch_matches_hf_peft) { check_parity("tests/fixtures/parity_llama", true, false); }
TEST(qwen3_loss_and_lora_gradients_match_hf_peft_documents_one_by_one)
{
    check_parity("tests/fixtures/parity_qwen3", false, false);
}
TEST(qwen3_packed_batch_matches_hf_peft) { check_parity("tests/fixtures/parity_qwen3", true, false); }
TEST(qwen3_moe_loss_and_lora_gradients_match_hf_peft_documents_one_by_one)
{
    check_parity("tests/fixtures/parity_qwen3_moe", false, true);
}
TEST(qwen3_moe_packed_batch_matches_hf_peft) { check_parity("tests/fixtures/parity_qwen3_moe", true, true); }
TEST(gpt_oss_loss_and_lora_gradients_match_hf_peft_documents_one_by_one)
{
    check_parity("tests/fixtures/parity_gpt_oss", false, true);
}
TEST(gpt_oss_packed_batch_matches_hf_peft) { check_parity("tests/fixtures/parity_gpt_oss", true, true); }
TEST(mixtral_loss_and_lora_gradients_match_hf_peft_documents_one_by_one)
{
    check_parity("tests/fixtures/parity_mixtral", false, true);
}
TEST(mixtral_packed_batch_matches_hf_peft) { check_parity("tests/fixtures/parity_mixtral", true, true); }

/* 4-bit frozen bases (bitsandbytes QLoRA): parity_qwen3's and parity_llama's
 * models as HF + bitsandbytes 0.50.2 quantized and saved them on the CPU (NF4
 * with double quant; FP4 without), with their bases' documents and adapters.
 * HF + PEFT ran them in fp32 with every Linear4bit dequantized to fp32 in both
 * passes (scripts/hf_parity.py: equal bit for bit to a plain fp32 model holding
 * code * absmax), which is what the CPU backend computes: the fp32 bounds. */
TEST(qwen3_nf4_loss_and_lora_gradients_match_hf_peft_bnb_documents_one_by_one)
{
    check_parity("tests/fixtures/parity_qwen3_nf4", false, false);
}
TEST(qwen3_nf4_packed_batch_matches_hf_peft_bnb) { check_parity("tests/fixtures/parity_qwen3_nf4", true, false); }
TEST(llama_fp4_loss_and_lora_gradients_match_hf_peft_bnb_documents_one_by_one)
{
    check_parity("tests/fixtures/parity_llama_fp4", false, false);
}
TEST(llama_fp4_packed_batch_matches_hf_peft_bnb) { check_parity("tests/fixtures/parity_llama_fp4", true, false); }
/* Quantize on load: parity_qwen3's bf16 model with train.yaml's
 * model_quantization: nf4, against HF quantizing on load on the CPU
 * (BitsAndBytesConfig nf4, double quant, blocksize 64: bnb's CPU quantizer,
 * which ctune's quant4 matches bit for bit), so the same numbers as
 * parity_qwen3_nf4. ctune_step must hand the config's model_quantization to
 * model_load for this case. */
TEST(qwen3_nf4_quantized_on_load_matches_hf_peft_bnb_documents_one_by_one)
{
    check_parity("tests/fixtures/parity_qwen3_nf4_onload", false, false);
}
TEST(qwen3_nf4_quantized_on_load_packed_batch_matches_hf_peft_bnb)
{
    check_parity("tests/fixtures/parity_qwen3_nf4_onload", true, false);
}

/* An MXFP4 base (gpt-oss's expert format, docs/mxfp4.md): parity_gpt_oss's
 * config with intermediate_size 32 (down_proj's input features must fill whole
 * 32-element blocks), written by ctune init --quantize mxfp4, its own documents
 * and adapter. HF loaded it with Mxfp4Config(dequantize=True) and ran fp32
 * (scripts/hf_parity.py checks that every expert stack is a plain parameter
 * equal to the folder's code * 2^(s - 127) decoded by hand): those values are
 * bf16 and exact in fp32, ctune's CPU backend decodes the same ones per GEMM,
 * so the fp32 bounds. */
TEST(gpt_oss_mxfp4_loss_and_lora_gradients_match_hf_peft_dequantized_documents_one_by_one)
{
    check_parity("tests/fixtures/parity_gpt_oss_mxfp4", false, false);
}
TEST(gpt_oss_mxfp4_packed_batch_matches_hf_peft_dequantized)
{
    check_parity("tests/fixtures/parity_gpt_oss_mxfp4", true, false);
}

/* An FP8 base (E4M3, 128x128 blocks; docs/fp8.md): parity_qwen3's config
 * widened to H 256, D 128, 2 heads, 1 KV head, I 384, so that every projection
 * and both fused ones (q|k|v, gate|up) fill whole blocks and stay in FP8 (and
 * transformers 5.17, which takes the block size from the grid, decodes them
 * right), written by ctune init --quantize fp8, with parity_qwen3's documents
 * and its own adapter. HF loaded it with FineGrainedFP8Config(dequantize=True)
 * and ran fp32 (scripts/hf_parity.py checks that every FP8 weight became a
 * plain nn.Linear equal bit for bit to decode(q) * scale_inv of its block, one
 * fp32 product): what ctune's CPU backend decodes before each GEMM, so the
 * fp32 bounds. Both FP8 fixtures' expected.safetensors were made with torch
 * 2.15, transformers 5.17.0, peft 0.21.0, and are identical. */
TEST(qwen3_fp8_loss_and_lora_gradients_match_hf_peft_dequantized_documents_one_by_one)
{
    check_parity("tests/fixtures/parity_qwen3_fp8", false, false);
}
TEST(qwen3_fp8_packed_batch_matches_hf_peft_dequantized)
{
    check_parity("tests/fixtures/parity_qwen3_fp8", true, false);
}
/* Quantize on load: parity_qwen3_fp8's bf16 model with train.yaml's
 * base_precision: fp8, against hf_parity.py --quantize fp8, which quantizes in
 * fp32 with fp8_quantize_blocks' arithmetic (checked bit for bit against
 * transformers' own Fp8Quantize op), not through transformers' loader, which
 * casts each bf16 weight to E4M3 unscaled first. So the same numbers as
 * parity_qwen3_fp8. ctune_step must hand the config's base_precision to
 * model_load for this case. */
TEST(qwen3_fp8_quantized_on_load_matches_hf_peft_documents_one_by_one)
{
    check_parity("tests/fixtures/parity_qwen3_fp8_onload", false, false);
}
TEST(qwen3_fp8_quantized_on_load_packed_batch_matches_hf_peft)
{
    check_parity("tests/fixtures/parity_qwen3_fp8_onload", true, false);
}

/* An ill-conditioned fixture, judged against fp64: its expected.safetensors is
 * HF + PEFT run in fp64 throughout (scripts/hf_parity.py --dtype float64, the
 * chunked delta rule's and the norms' internal fp32 casts too). Against that
 * truth HF's own fp32 run is 2-4.5e-4 off (L2, relative; worst layer 0's
 * in_proj_b) and ctune's fp32 is 0.9-1.9e-4 off, 2.3x closer on every tensor
 * that goes through a delta rule. The gradients through the delta rule amplify
 * fp32 rounding: rounding only the five inputs and the output of each delta
 * rule (and their gradients) to fp32 once, in an otherwise fp64 run, moves
 * layer 0's in_proj_b by 6e-5 and layer 3's in_proj_qkv by 2.6e-5 (the query
 * input alone: 4e-5 and 1.8e-5); the tensors that bypass it (layer 3's
 * out_proj, in_proj_z, in_proj_a, MLP) stay at 2-7e-6. So 1e-4 is below this
 * fixture's fp32 noise floor: the gradient bound is 2.5e-4 (ctune: 1.87e-4). */
static const parity_bounds gdn_gap_bounds = {1e-4, 2.5e-4};
TEST(qwen3_5_loss_and_lora_gradients_match_hf_peft_documents_one_by_one)
{
    check_parity_within("tests/fixtures/parity_qwen3_5", false, false, gdn_gap_bounds, NULL);
}
TEST(qwen3_5_packed_batch_matches_hf_peft)
{
    check_parity_within("tests/fixtures/parity_qwen3_5", true, false, gdn_gap_bounds, NULL);
}
/* qwen3_5_moe_text (the same GDN/gated-attention layers, every MLP sparse: 4
 * experts, top-2 renormalised, a shared expert behind its sigmoid gate; LoRA
 * all-linear as PEFT reads it there: attention, linear_attn, the shared
 * expert's gate/up/down and shared_expert_gate, the experts and router frozen),
 * judged against fp64 as parity_qwen3_5 and for the same reason: HF's own fp32
 * run is up to 2.25e-4 off that truth (layer 0's in_proj_a), ctune's 1.73e-4
 * (layer 0's in_proj_qkv); the tensors past the last delta rule (layer 3) stay
 * below 4.3e-5. So the gradient bound is parity_qwen3_5's 2.5e-4. */
static const parity_bounds gdn_moe_bounds = {1e-4, 2.5e-4};
TEST(qwen3_5_moe_loss_and_lora_gradients_match_hf_peft_documents_one_by_one)
{
    check_parity_within("tests/fixtures/parity_qwen3_5_moe", false, false, gdn_moe_bounds, NULL);
}
TEST(qwen3_5_moe_packed_batch_matches_hf_peft)
{
    check_parity_within("tests/fixtures/parity_qwen3_5_moe", true, false, gdn_moe_bounds, NULL);
}

/* qwen3_next (the GDN and gated attention layers of qwen3_5, but in_proj_qkvz
 * and in_proj_ba grouped by key head: permuted into the fused weight at load,
 * and LoRA B between ctune's order and PEFT's; 4 experts, top-2 renormalised,
 * with the gated shared expert; layer 2 a dense mlp_only layer), with LoRA
 * all-linear as PEFT's v5 conversion reads it there: attention, linear_attn,
 * shared_expert_gate, the routed experts' gate/up/down (per expert on disk,
 * fused by PEFT on load) and the dense layer's MLP as target_parameters; the
 * shared expert and the router frozen. Judged against fp64 with the bound of
 * parity_qwen3_5_moe: HF's own fp32 run is up to 2.1e-4 off that truth (layer
 * 2's in_proj_ba lora_B), ctune's 3.3e-5 (layer 0's expert LoRA). */
TEST(qwen3_next_loss_and_lora_gradients_match_hf_peft_documents_one_by_one)
{
    check_parity_within("tests/fixtures/parity_qwen3_next", false, false, gdn_moe_bounds, NULL);
}
TEST(qwen3_next_packed_batch_matches_hf_peft)
{
    check_parity_within("tests/fixtures/parity_qwen3_next", true, false, gdn_moe_bounds, NULL);
}

/* The router load-balancing loss of the base model on one document alone,
 * against HF's outputs.aux_loss (load_balancing_loss_func over the sparse
 * layers; model(input_ids, position_ids, output_router_logits=True) in train
 * mode, fp32; torch 2.11, transformers 5.17). ctune's sum includes
 * router_aux_loss_coef; it is divided out here. */
static void check_aux_loss(const char *dir, int doc, double hf_aux)
{
    char path[512];
    ct_error err = {0};
    snprintf(path, sizeof path, "%s/docs.jsonl", dir);
    size_t len;
    char *text = ct_read_file(path, &len, &err);
    REQUIRE(text, "%s", err.msg);
    char *line = text;
    for (int i = 0; i < doc && line; i++) line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL;
    REQUIRE(line, "%s has no document %d", path, doc);
    json_doc *jd = json_parse(line, strcspn(line, "\n"), path, &err);
    REQUIRE(jd, "%s", err.msg);
    const json_value *ids = json_get_type(json_root(jd), "input_ids", JSON_ARRAY);
    REQUIRE(ids && ids->count >= 2 && ids->count <= 64, "input_ids");
    ct_batch b;
    batch_alloc(&b, 64);
    int T = (int)ids->count;
    b.n_tokens = T;
    b.n_docs = 1;
    b.max_seqlen = T;
    b.cu_seqlens[0] = 0;
    b.cu_seqlens[1] = T;
    b.n_targets = T - 1;
    for (int t = 0; t < T; t++) {
        b.tokens[t] = (int32_t)ids->items[t]->integer;
        b.positions[t] = t;
    }
    for (int t = 0; t + 1 < T; t++) {
        b.target_rows[t] = t;
        b.target_ids[t] = b.tokens[t + 1];
    }
    json_free(jd);
    free(text);
    ct_backend *be = backend_cpu_new();
    ct_model m;
    snprintf(path, sizeof path, "%s/model", dir);
    REQUIRE(model_load(&m, be, path, &err) == CT_OK, "%s", err.msg);
    ct_graph *g = graph_new(&m, 64, true, &err);
    REQUIRE(g && graph_set_router_aux_loss(g, true, &err) == CT_OK, "%s", err.msg);
    be->zero(be, graph_aux_loss_sum(g), 4);
    be->zero(be, graph_loss_sum(g), 4);
    graph_set_batch(g, &b);
    graph_train_step(g, NULL, 1.0f, 0);
    float aux;
    be->download(be, &aux, graph_aux_loss_sum(g), 4);
    double mine = aux / m.cfg.router_aux_loss_coef;
    CHECK(check_rel_err(mine, hf_aux, 0) <= 1e-5, "%s document %d: aux loss ctune %.7f vs HF %.7f", dir, doc, mine,
          hf_aux);
    graph_free(g);
    model_free(&m);
    be->destroy(be);
    batch_free(&b);
}

TEST(router_aux_loss_matches_hf_load_balancing_loss)
{
    check_aux_loss("tests/fixtures/parity_mixtral", 0, 2.4459047317504883);
    check_aux_loss("tests/fixtures/parity_mixtral", 5, 2.467245101928711);
    check_aux_loss("tests/fixtures/parity_qwen3_moe", 3, 2.758314847946167);
    /* qwen3_5_moe_text: the same load_balancing_loss_func over its gate's logits (fp32, as above) */
    check_aux_loss("tests/fixtures/parity_qwen3_5_moe", 0, 2.102974892);
    check_aux_loss("tests/fixtures/parity_qwen3_5_moe", 3, 2.009290695);
    /* qwen3_next: over its three sparse layers (layer 2 is dense) */
    check_aux_loss("tests/fixtures/parity_qwen3_next", 0, 2.013179302);
    check_aux_loss("tests/fixtures/parity_qwen3_next", 3, 2.022948265);
}

/* ---- adapter_config.json: the forms PEFT loads completely ---- */

/* A qwen3_moe config.json of L layers with these mlp_only_layers (JSON array text). */
static void moe_config(ct_model_config *mc, int L, const char *mlp_only)
{
    char text[512];
    snprintf(text, sizeof text, "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 64, \"hidden_size\": 16, "
             "\"intermediate_size\": 24, \"num_hidden_layers\": %d, \"num_attention_heads\": 2, "
             "\"head_dim\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, "
             "\"mlp_only_layers\": %s}", L, mlp_only);
    ct_error err = {0};
    if (model_config_parse(mc, text, strlen(text), "config.json", &err)) printf("%s\n", err.msg);
}

/* The adapter_config.json ctune writes for targets (comma-separated) and dropout,
 * read back into *back; returns the text (caller frees). */
static char *written_config(const ct_model_config *mc, const char *targets, double dropout, bool rslora,
                            ct_lora_config *back, ct_error *err)
{
    ct_lora lo;
    memset(&lo, 0, sizeof lo);
    lo.R = lo.cfg.r = 4;
    lo.cfg.lora_alpha = 8;
    lo.cfg.lora_dropout = dropout;
    lo.cfg.use_rslora = rslora;
    strcpy(lo.cfg.init_lora_weights, "true");
    lo.arch = mc->arch;
    lo.n_layers = mc->num_hidden_layers;
    for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
        const char *name = model_module_name(mod), *at = strstr(targets, name);
        lo.targeted[mod] = at && (at == targets || at[-1] == ',') && (at[strlen(name)] == ',' || !at[strlen(name)]);
    }
    json_writer w;
    json_writer_init(&w);
    adapter_write_config(&lo, mc, "model", &w);
    char dir[] = "/tmp/ctune_adapter_XXXXXX", path[64];
    char *text = NULL;
    if (mkdtemp(dir)) {
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        FILE *f = fopen(path, "w");
        if (f) {
            fwrite(w.buf, 1, w.len, f);
            fclose(f);
        }
        if (adapter_read_config(dir, back, err) == CT_OK) text = strdup(w.buf);
        remove(path);
        rmdir(dir);
    }
    json_writer_free(&w);
    return text;
}

static bool back_has(const ct_lora_config *c, const char *name)
{
    for (int i = 0; i < c->n_target_modules; i++)
        if (!strcmp(c->target_modules[i], name)) return true;
    return false;
}

TEST(qwen3_moe_dense_layers_mlp_lora_is_named_as_target_parameters_and_reads_back)
{
    ct_model_config mc;
    moe_config(&mc, 3, "[1]");
    ct_lora_config back;
    ct_error err = {0};
    char *text = written_config(&mc, "q_proj,v_proj,gate_proj,up_proj,down_proj", 0.1, false, &back, &err);
    REQUIRE(text, "%s", err.msg);
    /* PEFT v5 turns every target_modules name ending in gate/up/down_proj into the
     * experts' fused parameters: the dense layer's projections are parameters. */
    CHECK(strstr(text, "\"target_parameters\": [\n    \"mlp.gate_proj.weight\",\n    \"mlp.up_proj.weight\",\n    "
                       "\"mlp.down_proj.weight\"\n  ]"), "%s", text);
    CHECK(strstr(text, "\"target_modules\": \".*\\\\.(q_proj|v_proj)|.*\\\\.experts(\\\\.[0-9]+)?\\\\."
                       "(gate_proj|up_proj|down_proj)\""), "%s", text);
    CHECK(strstr(text, "\"lora_dropout\": 0,"), "PEFT's ParamWrapper takes no dropout: %s", text);
    CHECK(back.n_target_modules == 5 && back_has(&back, "q_proj") && back_has(&back, "v_proj") &&
          back_has(&back, "gate_proj") && back_has(&back, "up_proj") && back_has(&back, "down_proj") &&
          !back_has(&back, "k_proj"), "read back %d targets", back.n_target_modules);
    free(text);
}

TEST(qwen3_moe_attention_only_adapter_keeps_its_list_and_dropout)
{
    ct_model_config mc;
    moe_config(&mc, 3, "[1]");
    ct_lora_config back;
    ct_error err = {0};
    char *text = written_config(&mc, "q_proj,k_proj", 0.1, false, &back, &err);
    REQUIRE(text, "%s", err.msg);
    CHECK(strstr(text, "\"target_modules\": [\n    \"q_proj\",\n    \"k_proj\"\n  ]") &&
          !strstr(text, "target_parameters") && strstr(text, "\"lora_dropout\": 0.1"), "%s", text);
    free(text);
}

TEST(all_sparse_qwen3_moe_adapter_keeps_the_per_expert_list)
{
    ct_model_config mc;
    moe_config(&mc, 2, "[]");
    ct_lora_config back;
    ct_error err = {0};
    char *text = written_config(&mc, "q_proj,gate_proj,up_proj,down_proj", 0, false, &back, &err);
    REQUIRE(text, "%s", err.msg);
    CHECK(strstr(text, "\"q_proj\",\n    \"gate_proj\",\n    \"up_proj\",\n    \"down_proj\"\n  ]") &&
          !strstr(text, "target_parameters"), "%s", text);
    CHECK(back.n_target_modules == 4, "read back %d targets", back.n_target_modules);
    free(text);
}

/* PEFT's v5 conversion doubles r and alpha of the fused gate_up LoRA, which keeps
 * alpha / r but not alpha / sqrt(r): rsLoRA is written as its scale. */
TEST(rslora_on_fused_experts_is_written_as_its_scale)
{
    ct_model_config mc;
    moe_config(&mc, 2, "[]");
    ct_lora_config back;
    ct_error err = {0};
    char *text = written_config(&mc, "gate_proj,up_proj,down_proj", 0, true, &back, &err);
    REQUIRE(text, "%s", err.msg);
    CHECK(strstr(text, "\"lora_alpha\": 16,") && strstr(text, "\"use_rslora\": false"), "%s", text);
    CHECK(check_rel_err(config_lora_scaling(&back), 8 / sqrt(4.0), 0) <= 1e-12, "scale %g", config_lora_scaling(&back));
    free(text);
    text = written_config(&mc, "q_proj,down_proj", 0, true, &back, &err); /* nothing fused: rsLoRA stays */
    REQUIRE(text, "%s", err.msg);
    CHECK(strstr(text, "\"lora_alpha\": 8,") && strstr(text, "\"use_rslora\": true"), "%s", text);
    free(text);
}

/* What PEFT 0.21 on transformers v5 cannot load is refused before training. */
TEST(moe_expert_targets_peft_cannot_load_are_refused)
{
    ct_model_config mc;
    moe_config(&mc, 2, "[]");
    ct_lora_config l = {.r = 4, .lora_alpha = 8};
    ct_error err = {0};
    const char *bad[][3] = {{"q_proj", "gate_proj", NULL}, {"gate_proj", "up_proj", NULL}};
    for (int i = 0; i < 2; i++) {
        l.n_target_modules = 0;
        for (int k = 0; k < 3 && bad[i][k]; k++) strcpy(l.target_modules[l.n_target_modules++], bad[i][k]);
        CHECK(adapter_check_peft(&mc, &l, &err) == CT_ERR_INPUT && strstr(err.msg, "lora.target_modules"),
              "case %d: %s", i, err.msg);
    }
    strcpy(l.target_modules[l.n_target_modules++], "down_proj");
    CHECK(adapter_check_peft(&mc, &l, &err) == CT_OK, "gate, up and down: %s", err.msg);
    moe_config(&mc, 2, "[0, 1]"); /* no sparse layer: nothing is fused */
    l.n_target_modules = 1;
    strcpy(l.target_modules[0], "gate_proj");
    CHECK(adapter_check_peft(&mc, &l, &err) == CT_OK, "dense qwen3_moe: %s", err.msg);
}

TEST(a_target_modules_regex_for_some_layers_only_is_an_input_error)
{
    char dir[] = "/tmp/ctune_adapter_XXXXXX", path[64];
    REQUIRE(mkdtemp(dir), "temp dir");
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f, "%s", path);
    fputs("{\"peft_type\": \"LORA\", \"r\": 4, "
          "\"target_modules\": \"model\\\\.layers\\\\.0\\\\.self_attn\\\\.q_proj\"}", f);
    fclose(f);
    ct_lora_config c;
    ct_error err = {0};
    CHECK(adapter_read_config(dir, &c, &err) == CT_ERR_INPUT && strstr(err.msg, "in some layers only"), "%s",
          err.msg);
    remove(path);
    rmdir(dir);
}

TEST(a_target_modules_regex_finds_the_gated_deltanet_projections_under_linear_attn)
{
    char dir[] = "/tmp/ctune_adapter_XXXXXX", path[64];
    REQUIRE(mkdtemp(dir), "temp dir");
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f, "%s", path);
    fputs("{\"peft_type\": \"LORA\", \"r\": 4, "
          "\"target_modules\": \".*\\\\.linear_attn\\\\.(in_proj_qkv|out_proj)\"}", f);
    fclose(f);
    ct_lora_config c;
    ct_error err = {0};
    int rc = adapter_read_config(dir, &c, &err);
    CHECK(rc == CT_OK, "%s", err.msg);
    bool qkv = false, out = false, other = false;
    for (int i = 0; rc == CT_OK && i < c.n_target_modules; i++) {
        qkv |= !strcmp(c.target_modules[i], "in_proj_qkv");
        out |= !strcmp(c.target_modules[i], "out_proj");
        other |= strcmp(c.target_modules[i], "in_proj_qkv") && strcmp(c.target_modules[i], "out_proj");
    }
    CHECK(rc != CT_OK || (qkv && out && !other), "targets read: %d (in_proj_qkv %d, out_proj %d, others %d)",
          c.n_target_modules, qkv, out, other);
    remove(path);
    rmdir(dir);
}

TEST(a_target_modules_regex_finds_the_shared_expert_and_its_gate)
{
    char dir[] = "/tmp/ctune_adapter_XXXXXX", path[64];
    REQUIRE(mkdtemp(dir), "temp dir");
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f, "%s", path);
    fputs("{\"peft_type\": \"LORA\", \"r\": 4, "
          "\"target_modules\": \".*\\\\.shared_expert\\\\.up_proj|.*\\\\.mlp\\\\.shared_expert_gate\"}", f);
    fclose(f);
    ct_lora_config c;
    ct_error err = {0};
    int rc = adapter_read_config(dir, &c, &err);
    CHECK(rc == CT_OK, "%s", err.msg);
    bool up = false, sg = false, other = false;
    for (int i = 0; rc == CT_OK && i < c.n_target_modules; i++) {
        up |= !strcmp(c.target_modules[i], "up_proj");
        sg |= !strcmp(c.target_modules[i], "shared_expert_gate");
        other |= strcmp(c.target_modules[i], "up_proj") && strcmp(c.target_modules[i], "shared_expert_gate");
    }
    CHECK(rc != CT_OK || (up && sg && !other), "targets read: %d (up_proj %d, shared_expert_gate %d, others %d)",
          c.n_target_modules, up, sg, other);
    remove(path);
    rmdir(dir);
}

/* The case folders named on the command line (see the file comment). */
static struct {
    const char *dir;
    parity_bounds tol;
    ct_backend *(*be_new)(ct_error *);
} the_case;

TEST(case_matches_hf_peft_documents_one_by_one)
{
    check_parity_within(the_case.dir, false, false, the_case.tol, the_case.be_new);
}
TEST(case_packed_batch_matches_hf_peft)
{
    check_parity_within(the_case.dir, true, false, the_case.tol, the_case.be_new);
}

static int usage(void)
{
    fprintf(stderr, "usage: test_hf_parity [--device cpu|cuda] [--tol-loss X] [--tol-grad Y] [--unpacked-only] "
                    "CASE...\n");
    return 2;
}

static int run_cases(int argc, char **argv)
{
    the_case.tol = fp32_bounds;
    bool unpacked_only = false;
    int i = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--unpacked-only")) {
            unpacked_only = true;
        } else if (i + 1 < argc && !strcmp(argv[i], "--device")) {
            if (!strcmp(argv[++i], "cuda")) the_case.be_new = backend_cuda_new;
            else if (strcmp(argv[i], "cpu")) return usage();
        } else if (i + 1 < argc && (!strcmp(argv[i], "--tol-loss") || !strcmp(argv[i], "--tol-grad"))) {
            double *v = argv[i][6] == 'l' ? &the_case.tol.loss : &the_case.tol.grad;
            *v = strtod(argv[++i], &end);
            if (*end || !(*v > 0)) return usage();
        } else {
            return usage();
        }
    }
    if (i == argc) return usage();
    for (; i < argc; i++) {
        the_case.dir = argv[i];
        RUN(case_matches_hf_peft_documents_one_by_one);
        if (!unpacked_only) RUN(case_packed_batch_matches_hf_peft);
    }
    return check_summary();
}

int main(int argc, char **argv)
{
    if (argc > 1) return run_cases(argc, argv);
    RUN(llama_loss_and_lora_gradients_match_hf_peft_documents_one_by_one);
    RUN(llama_packed_batch_matches_hf_peft);
    RUN(qwen3_loss_and_lora_gradients_match_hf_peft_documents_one_by_one);
    RUN(qwen3_packed_batch_matches_hf_peft);
    RUN(qwen3_moe_loss_and_lora_gradients_match_hf_peft_documents_one_by_one);
    RUN(qwen3_moe_packed_batch_matches_hf_peft);
    RUN(gpt_oss_loss_and_lora_gradients_match_hf_peft_documents_one_by_one);
    RUN(gpt_oss_packed_batch_matches_hf_peft);
    RUN(mixtral_loss_and_lora_gradients_match_hf_peft_documents_one_by_one);
    RUN(mixtral_packed_batch_matches_hf_peft);
    RUN(qwen3_nf4_loss_and_lora_gradients_match_hf_peft_bnb_documents_one_by_one);
    RUN(qwen3_nf4_packed_batch_matches_hf_peft_bnb);
    RUN(llama_fp4_loss_and_lora_gradients_match_hf_peft_bnb_documents_one_by_one);
    RUN(llama_fp4_packed_batch_matches_hf_peft_bnb);
    RUN(qwen3_nf4_quantized_on_load_matches_hf_peft_bnb_documents_one_by_one);
    RUN(qwen3_nf4_quantized_on_load_packed_batch_matches_hf_peft_bnb);
    RUN(gpt_oss_mxfp4_loss_and_lora_gradients_match_hf_peft_dequantized_documents_one_by_one);
    RUN(gpt_oss_mxfp4_packed_batch_matches_hf_peft_dequantized);
    RUN(qwen3_fp8_loss_and_lora_gradients_match_hf_peft_dequantized_documents_one_by_one);
    RUN(qwen3_fp8_packed_batch_matches_hf_peft_dequantized);
    RUN(qwen3_fp8_quantized_on_load_matches_hf_peft_documents_one_by_one);
    RUN(qwen3_fp8_quantized_on_load_packed_batch_matches_hf_peft);
    RUN(qwen3_5_loss_and_lora_gradients_match_hf_peft_documents_one_by_one);
    RUN(qwen3_5_packed_batch_matches_hf_peft);
    RUN(qwen3_5_moe_loss_and_lora_gradients_match_hf_peft_documents_one_by_one);
    RUN(qwen3_5_moe_packed_batch_matches_hf_peft);
    RUN(qwen3_next_loss_and_lora_gradients_match_hf_peft_documents_one_by_one);
    RUN(qwen3_next_packed_batch_matches_hf_peft);
    RUN(router_aux_loss_matches_hf_load_balancing_loss);
    RUN(qwen3_moe_dense_layers_mlp_lora_is_named_as_target_parameters_and_reads_back);
    RUN(qwen3_moe_attention_only_adapter_keeps_its_list_and_dropout);
    RUN(all_sparse_qwen3_moe_adapter_keeps_the_per_expert_list);
    RUN(rslora_on_fused_experts_is_written_as_its_scale);
    RUN(moe_expert_targets_peft_cannot_load_are_refused);
    RUN(a_target_modules_regex_for_some_layers_only_is_an_input_error);
    RUN(a_target_modules_regex_finds_the_gated_deltanet_projections_under_linear_attn);
    RUN(a_target_modules_regex_finds_the_shared_expert_and_its_gate);
    return check_summary();
}
