/* fuzz_model.h — the models fuzz_adapter and fuzz_checkpoint read adapters
 * against: the config.json of each tests/fixtures/parity_* model (the seeds'
 * adapters were trained on them) and the qwen3_moe of tests/model_fixture.h
 * (layer 1 dense), on a backend of plain host memory. The LoRA readers only
 * allocate, upload and download, so no weights are loaded and no kernel runs. */
#ifndef CT_FUZZ_MODEL_H
#define CT_FUZZ_MODEL_H

#include <string.h>

#include "fuzz.h"
#include "model.h"
#include "safetensors.h"

enum { FUZZ_LLAMA, FUZZ_QWEN3, FUZZ_QWEN3_MOE, FUZZ_QWEN3_MOE_DENSE, FUZZ_MIXTRAL, FUZZ_GPT_OSS, FUZZ_N_MODELS };

static const char *const fuzz_model_json[FUZZ_N_MODELS] = {
    "{\"model_type\": \"llama\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-05,"
    " \"rope_theta\": 10000.0, \"max_position_embeddings\": 256, \"tie_word_embeddings\": true}",
    "{\"model_type\": \"qwen3\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 40,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 8,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"max_position_embeddings\": 256,"
    " \"tie_word_embeddings\": false}",
    "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 40,"
    " \"moe_intermediate_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"num_key_value_heads\": 2,"
    " \"head_dim\": 8, \"num_experts\": 8, \"num_experts_per_tok\": 2, \"norm_topk_prob\": false,"
    " \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"router_aux_loss_coef\": 0.001, \"rms_norm_eps\": 1e-06,"
    " \"rope_theta\": 1000000.0, \"max_position_embeddings\": 256, \"tie_word_embeddings\": false}",
    "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 40,"
    " \"moe_intermediate_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"norm_topk_prob\": false,"
    " \"decoder_sparse_step\": 1, \"mlp_only_layers\": [1], \"router_aux_loss_coef\": 0.05, \"rms_norm_eps\": 1e-06,"
    " \"rope_theta\": 1000000.0, \"max_position_embeddings\": 256, \"tie_word_embeddings\": false}",
    "{\"model_type\": \"mixtral\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 24,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8,"
    " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"router_aux_loss_coef\": 0.02, \"sliding_window\": null,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0, \"max_position_embeddings\": 256,"
    " \"tie_word_embeddings\": false}",
    "{\"model_type\": \"gpt_oss\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 16,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8,"
    " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"experts_per_token\": 2,"
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"sliding_window\": 4, \"swiglu_limit\": 7.0,"
    " \"attention_bias\": true, \"rms_norm_eps\": 1e-05, \"rope_theta\": 150000, \"rope_scaling\": {\"beta_fast\": 32.0,"
    " \"beta_slow\": 1.0, \"factor\": 4.0, \"original_max_position_embeddings\": 32, \"rope_type\": \"yarn\","
    " \"truncate\": false}, \"max_position_embeddings\": 256, \"router_aux_loss_coef\": 0.9,"
    " \"tie_word_embeddings\": false}",
};

/* Bytes the host backend has handed out, and a cap a target may set (0: none):
 * an adapter reader must not ask for more LoRA memory than its file can fill. */
static size_t fuzz_host_bytes, fuzz_host_cap;

static void *fuzz_host_alloc(ct_backend *be, size_t bytes)
{
    fuzz_host_bytes += bytes;
    FUZZ_ASSERT(!fuzz_host_cap || fuzz_host_bytes <= fuzz_host_cap, "%zu bytes of backend memory asked for, "
                "more than the input's files can fill (%zu)", fuzz_host_bytes, fuzz_host_cap);
    return calloc(1, bytes ? bytes : 1);
}
static void fuzz_host_free(ct_backend *be, void *p) { free(p); }
static void fuzz_host_copy(ct_backend *be, void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

static ct_backend fuzz_host_backend = {
    .name = "host",
    .alloc = fuzz_host_alloc,
    .free = fuzz_host_free,
    .upload = fuzz_host_copy,
    .download = fuzz_host_copy,
};

/* Model i (FUZZ_LLAMA ..) with its config parsed and no weights; parsed once. */
static inline const ct_model *fuzz_model(int i)
{
    static ct_model models[FUZZ_N_MODELS];
    static bool parsed[FUZZ_N_MODELS];
    if (!parsed[i]) {
        ct_error err;
        const char *json = fuzz_model_json[i];
        FUZZ_ASSERT(model_config_parse(&models[i].cfg, json, strlen(json), "fuzz model", &err) == CT_OK,
                    "model %d: %s", i, err.msg);
        models[i].be = &fuzz_host_backend;
        parsed[i] = true;
    }
    return &models[i];
}

/* Every tensor of the file at BACK_PATH (written by ctune) is the one of the
 * same name at IN_PATH, byte for byte, and neither has more. */
static inline void fuzz_same_tensors(const char *in_path, const char *back_path)
{
    ct_error err;
    st_reader *in = st_open(in_path, &err), *back = st_open(back_path, &err);
    FUZZ_ASSERT(in && back, "%s", err.msg);
    FUZZ_ASSERT(st_count(in) == st_count(back), "%zu tensors read, %zu written", st_count(in), st_count(back));
    for (size_t i = 0; i < st_count(back); i++) {
        const st_tensor *b = st_at(back, i), *a = st_find(in, b->name);
        bool same = a && a->dtype == b->dtype && a->ndim == b->ndim && a->nbytes == b->nbytes;
        for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
        FUZZ_ASSERT(same && !memcmp(a->data, b->data, a->nbytes), "%s: written back differently", b->name);
    }
    st_close(in);
    st_close(back);
}

#endif
