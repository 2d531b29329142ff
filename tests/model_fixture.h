/* model_fixture.h — tiny random-weight model folders and hand-made batches for
 * the graph and trainer tests (header-only; each test binary includes it once). */
#ifndef CT_MODEL_FIXTURE_H
#define CT_MODEL_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model_config.h"
#include "packer.h"
#include "safetensors.h"

/* A llama with GQA 2:1, tied embeddings, 2 layers. */
static const char *const fixture_llama_json =
    "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 48, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
    " \"max_position_embeddings\": 256, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\"}";

/* A qwen3 with per-head q/k norm, GQA 4:1, untied head, 2 layers. */
static const char *const fixture_qwen3_json =
    "{\"model_type\": \"qwen3\", \"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 40, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
    " \"max_position_embeddings\": 256, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}";

/* A qwen2 (q/k/v biases) with llama3 rope scaling. */
static const char *const fixture_qwen2_json =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48,"
    " \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 4,"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"max_position_embeddings\": 256,"
    " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
    " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64},"
    " \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}";

/* qwen3_moe: 3 layers, layer 1 dense (mlp_only_layers), E = 4, K = 2, no renormalisation. */
static const char *const fixture_qwen3_moe_json =
    "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 40,"
    " \"moe_intermediate_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
    " \"norm_topk_prob\": false, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [1],"
    " \"router_aux_loss_coef\": 0.05, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
    " \"max_position_embeddings\": 256, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}";

/* mixtral: 2 layers, E = 4, K = 2 (always renormalised), GQA 2:1. */
static const char *const fixture_mixtral_json =
    "{\"model_type\": \"mixtral\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 24,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"router_aux_loss_coef\": 0.02,"
    " \"rms_norm_eps\": 1e-5, \"rope_theta\": 1000000.0, \"sliding_window\": null,"
    " \"max_position_embeddings\": 256, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}";

/* gpt_oss: 2 layers (sliding window 4, then full), sinks, biases, yarn rope,
 * E = 4, K = 2; matrices N(0, initializer_range 0.4) so that some SwiGLU
 * inputs pass the limit 7 and clamp (ctune, as transformers, takes no other limit). */
static const char *const fixture_gpt_oss_json =
    "{\"model_type\": \"gpt_oss\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 16,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8,"
    " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"sliding_window\": 4, \"swiglu_limit\": 7.0,"
    " \"rope_theta\": 150000.0, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": 32.0,"
    " \"beta_slow\": 1.0, \"truncate\": false, \"original_max_position_embeddings\": 64},"
    " \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 256, \"tie_word_embeddings\": false,"
    " \"initializer_range\": 0.4}";

/* Writes DIR/config.json and random bf16 weights (norm weights near 1, biases
 * small, matrices N(0, 0.2), or N(0, initializer_range) where the JSON gives
 * one, so activations are far from trivial). */
static int fixture_write_model(const char *dir, const char *json, uint64_t seed)
{
    ct_error err = {0};
    if (ct_mkdirs(dir, &err)) return -1;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (ct_write_file_atomic(path, json, strlen(json), &err)) return -1;
    ct_model_config mc;
    if (model_config_parse(&mc, json, strlen(json), "fixture", &err)) {
        printf("fixture config: %s\n", err.msg);
        return -1;
    }
    size_t n;
    ct_tensor_spec *specs = model_tensor_specs(&mc, &n);
    st_writer *w = st_writer_new();
    ct_rng rng;
    ct_rng_seed(&rng, seed);
    float sd = strstr(json, "\"initializer_range\"") ? (float)mc.initializer_range : 0.2f;
    for (size_t i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < specs[i].ndim; d++) numel *= (size_t)specs[i].shape[d];
        uint16_t *data = ct_malloc(numel * 2);
        bool is_norm = strstr(specs[i].name, "norm") != NULL;
        bool is_bias = strstr(specs[i].name, "bias") != NULL;
        for (size_t j = 0; j < numel; j++) {
            float v = ct_rng_normal(&rng);
            data[j] = ct_f32_to_bf16(is_norm ? 1.0f + 0.1f * v : is_bias ? 0.05f * v : sd * v);
        }
        if (st_writer_add(w, specs[i].name, CT_DTYPE_BF16, specs[i].ndim, specs[i].shape, data, &err)) return -1;
        free(data);
    }
    free(specs);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_writer_save(w, path, &err);
    st_writer_free(w);
    if (rc) printf("fixture save: %s\n", err.msg);
    return rc ? -1 : 0;
}

/* Builds a batch from documents (tokens only; every token a label) the way the
 * packer does: positions restart, targets are the next token of the same doc. */
static void fixture_batch(ct_batch *b, const int32_t *const *docs, const int *lens, int n_docs)
{
    int T = 0;
    b->n_docs = n_docs;
    b->max_seqlen = 0;
    b->n_targets = 0;
    b->cu_seqlens[0] = 0;
    for (int d = 0; d < n_docs; d++) {
        for (int i = 0; i < lens[d]; i++) {
            b->tokens[T + i] = docs[d][i];
            b->positions[T + i] = i;
            b->targets[T + i] = i + 1 < lens[d] ? docs[d][i + 1] : CT_IGNORE;
            if (b->targets[T + i] != CT_IGNORE) {
                b->target_rows[b->n_targets] = T + i;
                b->target_ids[b->n_targets] = b->targets[T + i];
                b->n_targets++;
            }
        }
        T += lens[d];
        b->cu_seqlens[d + 1] = T;
        if (lens[d] > b->max_seqlen) b->max_seqlen = lens[d];
    }
    b->n_tokens = T;
}

#endif
