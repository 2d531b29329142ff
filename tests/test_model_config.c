/* test_model_config.c — config.json parsing, RoPE frequencies, HF tensor specs,
 * parameter counts and checkpoint checking (src/formats/model_config.h). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "json.h"
#include "model.h"
#include "model_config.h"

static int parse_text(ct_model_config *mc, const char *text, ct_error *err)
{
    return model_config_parse(mc, text, strlen(text), "test.json", err);
}

static const ct_tensor_spec *find_spec(const ct_tensor_spec *s, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s[i].name, name)) return &s[i];
    return NULL;
}

static bool spec_is(const ct_tensor_spec *s, int ndim, int64_t a, int64_t b, int64_t c)
{
    const int64_t want[3] = {a, b, c};
    if (!s || s->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (s->shape[i] != want[i]) return false;
    return true;
}

#define LLAMA_BASE "\"model_type\":\"llama\",\"vocab_size\":1000,\"hidden_size\":256,\"intermediate_size\":512," \
                   "\"num_hidden_layers\":2,\"num_attention_heads\":8"

TEST(shipped_tiny_config_parses)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/tiny", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.arch == CT_ARCH_LLAMA, "arch %d", mc.arch);
    CHECK(!strcmp(mc.architectures, "LlamaForCausalLM"), "%s", mc.architectures);
    CHECK(mc.vocab_size == 384 && mc.hidden_size == 128 && mc.intermediate_size == 384, "sizes");
    CHECK(mc.num_hidden_layers == 4 && mc.num_attention_heads == 4 && mc.num_key_value_heads == 2, "heads");
    CHECK(mc.head_dim == 32, "head_dim %d", mc.head_dim);
    CHECK(mc.tie_word_embeddings, "tied");
    CHECK(mc.rms_norm_eps == 1e-5 && mc.rope.theta == 10000.0, "eps %g theta %g", mc.rms_norm_eps, mc.rope.theta);
    CHECK(!mc.attention_bias && !mc.o_proj_bias && !mc.qk_norm && mc.num_experts == 0, "flags");
    CHECK(!strcmp(mc.torch_dtype, "bfloat16"), "%s", mc.torch_dtype);
}

TEST(shipped_qwen3_0_6b_config_parses)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/qwen3-0.6b/config.json", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.arch == CT_ARCH_QWEN3 && mc.qk_norm, "qwen3 with qk norm");
    CHECK(mc.vocab_size == 151936 && mc.hidden_size == 1024 && mc.intermediate_size == 3072, "sizes");
    CHECK(mc.num_hidden_layers == 28 && mc.num_attention_heads == 16 && mc.num_key_value_heads == 8, "heads");
    CHECK(mc.head_dim == 128 && mc.tie_word_embeddings && mc.rope.theta == 1e6, "head_dim %d", mc.head_dim);
    CHECK(mc.sliding_window == 0 && !mc.layer_sliding[27], "use_sliding_window false means no window");
    CHECK(mc.max_position_embeddings == 40960, "%d", mc.max_position_embeddings);
}

TEST(shipped_llama3_1_8b_config_parses)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/llama3.1-8b", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.head_dim == 128 && mc.num_key_value_heads == 8 && !mc.tie_word_embeddings, "shape");
    CHECK(mc.rope.type == CT_ROPE_LLAMA3 && mc.rope.factor == 8 && mc.rope.low_freq_factor == 1 &&
          mc.rope.high_freq_factor == 4 && mc.rope.original_max_position_embeddings == 8192, "llama3 rope");
    CHECK(mc.rope.theta == 500000.0, "theta %g", mc.rope.theta);
}

TEST(shipped_qwen3_30b_a3b_config_parses)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/qwen3-30b-a3b", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.arch == CT_ARCH_QWEN3_MOE && mc.num_experts == 128 && mc.num_experts_per_tok == 8, "experts");
    CHECK(mc.moe_intermediate_size == 768 && mc.norm_topk_prob, "moe I %d", mc.moe_intermediate_size);
    CHECK(mc.layer_sparse[0] && mc.layer_sparse[47], "every layer sparse");
    CHECK(mc.num_key_value_heads == 4 && mc.head_dim == 128, "heads");
}

TEST(shipped_gpt_oss_20b_config_parses)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/gpt-oss-20b", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.arch == CT_ARCH_GPT_OSS && mc.num_experts == 32 && mc.num_experts_per_tok == 4, "experts");
    CHECK(mc.attention_bias && mc.o_proj_bias && mc.attention_sinks, "biases and sinks");
    CHECK(mc.sliding_window == 128 && mc.layer_sliding[0] && !mc.layer_sliding[1] && mc.layer_sliding[22], "layers");
    CHECK(mc.swiglu_limit == 7.0 && mc.rms_norm_eps == 1e-5, "limit %g", mc.swiglu_limit);
    CHECK(mc.rope.type == CT_ROPE_YARN && mc.rope.factor == 32 && !mc.rope.truncate &&
          mc.rope.original_max_position_embeddings == 4096, "yarn");
}

TEST(shipped_tiny_variants_parse)
{
    ct_model_config q, m;
    ct_error err = {0};
    REQUIRE(model_config_load(&q, "configs/models/tiny-qwen3", &err) == CT_OK, "%s", err.msg);
    CHECK(q.num_attention_heads == 8 && q.num_key_value_heads == 2 && q.head_dim == 32 && !q.tie_word_embeddings, "qwen3");
    REQUIRE(model_config_load(&m, "configs/models/tiny-moe", &err) == CT_OK, "%s", err.msg);
    CHECK(m.num_experts == 8 && m.num_experts_per_tok == 2 && m.moe_intermediate_size == 64 && m.norm_topk_prob, "moe");
    CHECK(m.vocab_size == 384 && m.head_dim == 32, "vocab %d", m.vocab_size);
}

TEST(absent_head_dim_and_kv_heads_take_family_defaults)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(parse_text(&mc, "{" LLAMA_BASE "}", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.head_dim == 32 && mc.num_key_value_heads == 8, "llama: hd %d kv %d", mc.head_dim, mc.num_key_value_heads);
    CHECK(mc.rms_norm_eps == 1e-6 && mc.rope.theta == 10000, "eps %g theta %g", mc.rms_norm_eps, mc.rope.theta);
    CHECK(mc.initializer_range == 0.02, "init %g", mc.initializer_range);
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":8,"
                            "\"num_hidden_layers\":1,\"num_attention_heads\":2}", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.head_dim == 128, "qwen3 head_dim defaults to 128, got %d", mc.head_dim);
    /* GptOssConfig: 64 when absent, hidden/heads for an explicit null */
    const char *g = "{\"model_type\":\"gpt_oss\",\"vocab_size\":10,\"hidden_size\":96,\"intermediate_size\":8,"
                    "\"num_hidden_layers\":1,\"num_attention_heads\":3,\"num_local_experts\":4%s}";
    char buf[512];
    snprintf(buf, sizeof buf, g, "");
    REQUIRE(parse_text(&mc, buf, &err) == CT_OK, "%s", err.msg);
    CHECK(mc.head_dim == 64, "gpt_oss head_dim defaults to 64, got %d", mc.head_dim);
    snprintf(buf, sizeof buf, g, ",\"head_dim\":null");
    REQUIRE(parse_text(&mc, buf, &err) == CT_OK, "%s", err.msg);
    CHECK(mc.head_dim == 32, "gpt_oss head_dim null is hidden/heads, got %d", mc.head_dim);
}

TEST(unsupported_model_type_lists_supported)
{
    ct_model_config mc;
    ct_error err = {0};
    int rc = parse_text(&mc, "{\"model_type\":\"bert\",\"vocab_size\":10}", &err);
    CHECK(rc == CT_ERR_INPUT, "rc %d", rc);
    CHECK(strstr(err.msg, "test.json: model_type 'bert' is not supported (supported: llama, mistral, qwen2, "
                          "qwen3, qwen3_moe, mixtral, gpt_oss, qwen3_5, qwen3_5_text, qwen3_5_moe, "
                          "qwen3_5_moe_text, qwen3_next)") != NULL, "%s", err.msg);
}

TEST(invalid_configs_name_file_and_key)
{
    ct_model_config mc;
    ct_error err = {0};
    CHECK(parse_text(&mc, "{\"model_type\":\"llama\",\"vocab_size\":10}", &err) == CT_ERR_INPUT &&
          strstr(err.msg, "test.json") && strstr(err.msg, "hidden_size"), "%s", err.msg);
    CHECK(parse_text(&mc, "{" LLAMA_BASE ",\"num_key_value_heads\":3}", &err) == CT_ERR_INPUT &&
          strstr(err.msg, "num_key_value_heads"), "%s", err.msg);
    CHECK(parse_text(&mc, "{" LLAMA_BASE ",\"hidden_act\":\"gelu\"}", &err) == CT_ERR_INPUT &&
          strstr(err.msg, "hidden_act"), "%s", err.msg);
    CHECK(parse_text(&mc, "{" LLAMA_BASE ",\"head_dim\":33}", &err) == CT_ERR_INPUT && strstr(err.msg, "head_dim"),
          "%s", err.msg);
    CHECK(parse_text(&mc, "{" LLAMA_BASE ",\"vocab_size\":0}", &err) == CT_ERR_INPUT && strstr(err.msg, "vocab_size"),
          "%s", err.msg);
    CHECK(parse_text(&mc, "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":8,"
                          "\"num_hidden_layers\":600,\"num_attention_heads\":2}", &err) == CT_ERR_INPUT &&
          strstr(err.msg, "num_hidden_layers"), "%s", err.msg);
    CHECK(parse_text(&mc, "{" LLAMA_BASE ",\"rope_scaling\":{\"rope_type\":\"longrope\",\"factor\":2}}", &err) ==
          CT_ERR_INPUT && strstr(err.msg, "'longrope' is not supported (supported: default, linear, dynamic, llama3, yarn)"),
          "%s", err.msg);
    CHECK(parse_text(&mc, "{" LLAMA_BASE ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}", &err) ==
          CT_ERR_INPUT && strstr(err.msg, "low_freq_factor"), "%s", err.msg);
    CHECK(parse_text(&mc, "{" LLAMA_BASE ",\"hidden_size\":\"big\"}", &err) == CT_ERR_INPUT, "wrong type accepted");
}

TEST(sliding_window_follows_each_family)
{
    ct_model_config mc;
    ct_error err = {0};
    const char *m = "{\"model_type\":\"mistral\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":8,"
                    "\"num_hidden_layers\":2,\"num_attention_heads\":2%s}";
    char buf[512];
    snprintf(buf, sizeof buf, m, "");
    REQUIRE(parse_text(&mc, buf, &err) == CT_OK, "%s", err.msg);
    CHECK(mc.sliding_window == 4096 && mc.layer_sliding[1], "mistral default window %d", mc.sliding_window);
    snprintf(buf, sizeof buf, m, ",\"sliding_window\":null");
    REQUIRE(parse_text(&mc, buf, &err) == CT_OK, "%s", err.msg);
    CHECK(mc.sliding_window == 0 && !mc.layer_sliding[0], "null window means none");
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen2\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":8,"
                            "\"num_hidden_layers\":4,\"num_attention_heads\":2,\"use_sliding_window\":true,"
                            "\"sliding_window\":256,\"max_window_layers\":2}", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.sliding_window == 256 && !mc.layer_sliding[1] && mc.layer_sliding[2], "qwen2 layers >= max_window_layers");
}

/* Where transformers' model code reads a config differently from its siblings
 * (found by scripts/random_parity.py), ctune follows it or refuses the file. */
TEST(qwen3_moe_with_use_sliding_window_slides_every_layer_as_transformers)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":32,"
                            "\"num_hidden_layers\":3,\"num_attention_heads\":2,\"head_dim\":32,\"num_experts\":4,"
                            "\"num_experts_per_tok\":2,\"moe_intermediate_size\":16,\"use_sliding_window\":true,"
                            "\"sliding_window\":5,\"max_window_layers\":2}", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.sliding_window == 5 && mc.layer_sliding[0] && mc.layer_sliding[1] && mc.layer_sliding[2],
          "every layer slides (window %d)", mc.sliding_window);
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":32,"
                            "\"num_hidden_layers\":3,\"num_attention_heads\":2,\"head_dim\":32,\"num_experts\":4,"
                            "\"num_experts_per_tok\":2,\"moe_intermediate_size\":16,\"sliding_window\":5}", &err) == CT_OK,
            "%s", err.msg);
    CHECK(mc.sliding_window == 0 && !mc.layer_sliding[0], "no window without use_sliding_window");
}

#define GPT_OSS_BASE "\"model_type\":\"gpt_oss\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":32," \
                     "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"head_dim\":32,\"num_local_experts\":8"

TEST(gpt_oss_without_rope_scaling_takes_transformers_default_yarn)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(parse_text(&mc, "{" GPT_OSS_BASE "}", &err) == CT_OK, "%s", err.msg);
    const ct_rope_config *rp = &mc.rope;
    CHECK(rp->type == CT_ROPE_YARN && rp->factor == 32.0 && rp->beta_fast == 32.0 && rp->beta_slow == 1.0 &&
          !rp->truncate && rp->original_max_position_embeddings == 4096 && rp->theta == 150000.0,
          "type %d factor %g betas %g %g truncate %d orig %d theta %g", rp->type, rp->factor, rp->beta_fast,
          rp->beta_slow, rp->truncate, rp->original_max_position_embeddings, rp->theta);
    REQUIRE(parse_text(&mc, "{" GPT_OSS_BASE ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2}}", &err) == CT_OK,
            "%s", err.msg);
    CHECK(mc.rope.type == CT_ROPE_LINEAR, "a given rope_scaling wins (type %d)", mc.rope.type);
}

TEST(gpt_oss_top_k_and_swiglu_limit_other_than_transformers_are_refused)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(parse_text(&mc, "{" GPT_OSS_BASE ",\"experts_per_token\":4}", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.num_experts_per_tok == 4, "top-k %d", mc.num_experts_per_tok);
    REQUIRE(parse_text(&mc, "{" GPT_OSS_BASE ",\"experts_per_token\":2,\"num_experts_per_tok\":2}", &err) == CT_OK,
            "%s", err.msg);
    CHECK(mc.num_experts_per_tok == 2, "top-k %d", mc.num_experts_per_tok);
    err = (ct_error){0};
    CHECK(parse_text(&mc, "{" GPT_OSS_BASE ",\"experts_per_token\":2}", &err) == CT_ERR_INPUT &&
          strstr(err.msg, "test.json: key 'experts_per_token' is 2 but num_experts_per_tok is 4 (its default)"), "%s",
          err.msg);
    err = (ct_error){0};
    CHECK(parse_text(&mc, "{" GPT_OSS_BASE ",\"swiglu_limit\":1.5}", &err) == CT_ERR_INPUT &&
          strstr(err.msg, "test.json: key 'swiglu_limit' is 1.5") && strstr(err.msg, "expected 7.0"), "%s", err.msg);
}

TEST(qwen3_moe_sparse_layers_follow_step_and_mlp_only_layers)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":32,"
                            "\"num_hidden_layers\":4,\"num_attention_heads\":2,\"head_dim\":32,\"num_experts\":4,"
                            "\"num_experts_per_tok\":2,\"moe_intermediate_size\":16,\"decoder_sparse_step\":2,"
                            "\"mlp_only_layers\":[3]}", &err) == CT_OK, "%s", err.msg);
    CHECK(!mc.layer_sparse[0] && mc.layer_sparse[1] && !mc.layer_sparse[2] && !mc.layer_sparse[3], "sparse layers");
    CHECK(!mc.norm_topk_prob, "qwen3_moe norm_topk_prob defaults to false");
}

TEST(rope_default_and_linear_frequencies)
{
    ct_model_config mc;
    ct_error err = {0};
    float inv[64], scale;
    REQUIRE(model_config_load(&mc, "configs/models/tiny", &err) == CT_OK, "%s", err.msg);
    REQUIRE(model_rope_dim(&mc) == 32, "dim %d", model_rope_dim(&mc));
    model_rope_inv_freq(&mc, inv, &scale);
    CHECK(inv[0] == 1.0f && scale == 1.0f, "inv0 %g scale %g", inv[0], scale);
    CHECK(check_rel_err(inv[1], 0.5623413251903491, 0) < 1e-6, "10000^(-2/32) got %.9g", inv[1]); /* 10^(-1/4) */
    REQUIRE(parse_text(&mc, "{" LLAMA_BASE ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":4}}", &err) == CT_OK,
            "%s", err.msg);
    model_rope_inv_freq(&mc, inv, &scale);
    CHECK(check_rel_err(inv[1], 0.5623413251903491 / 4, 0) < 1e-6, "linear divides by factor: %.9g", inv[1]);
    REQUIRE(parse_text(&mc, "{" LLAMA_BASE ",\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":4}}", &err) == CT_OK,
            "%s", err.msg);
    model_rope_inv_freq(&mc, inv, &scale);
    CHECK(check_rel_err(inv[1], 0.5623413251903491, 0) < 1e-6, "dynamic equals default: %.9g", inv[1]);
}

TEST(rope_llama3_bands_match_hand_computed_values)
{
    ct_model_config mc;
    ct_error err = {0};
    float inv[64], scale;
    REQUIRE(model_config_load(&mc, "configs/models/llama3.1-8b", &err) == CT_OK, "%s", err.msg);
    model_rope_inv_freq(&mc, inv, &scale);
    /* high band (wavelen 2pi < 8192/4): unchanged */
    CHECK(inv[0] == 1.0f && scale == 1.0f, "inv0 %g", inv[0]);
    /* mid band, i=32: inv = 500000^-0.5 = 1.41421356e-3, wavelen 4442.88,
     * s = (8192/4442.88 - 1)/3 = 0.281286, (1-s)*inv/8 + s*inv = 5.24846e-4 */
    CHECK(check_rel_err(inv[32], 5.248461609929547e-4, 0) < 1e-5, "mid band %.9g", inv[32]);
    /* low band, i=63: wavelen 2.56e6 > 8192: 500000^(-63/64)/8 = 3.06893e-7 */
    CHECK(check_rel_err(inv[63], 3.068925988914511e-7, 0) < 1e-5, "low band %.9g", inv[63]);
}

TEST(rope_yarn_is_finite_with_derived_attention_factor)
{
    ct_model_config mc;
    ct_error err = {0};
    float inv[32], scale;
    REQUIRE(model_config_load(&mc, "configs/models/gpt-oss-20b", &err) == CT_OK, "%s", err.msg);
    REQUIRE(model_rope_dim(&mc) == 64, "dim %d", model_rope_dim(&mc));
    model_rope_inv_freq(&mc, inv, &scale);
    CHECK(check_rel_err(scale, 0.1 * log(32.0) + 1.0, 0) < 1e-6, "attention factor %.9g", scale);
    for (int i = 0; i < 32; i++) {
        CHECK(isfinite(inv[i]) && inv[i] > 0, "inv[%d] = %g", i, inv[i]);
        if (i) CHECK(inv[i] < inv[i - 1], "not decreasing at %d", i);
    }
    CHECK(inv[0] == 1.0f, "fastest frequency is extrapolated: %g", inv[0]);
    CHECK(check_rel_err(inv[31], 3.0235114281192144e-07, 0) < 1e-5, "slowest is interpolated (/32): %.9g", inv[31]);
}

TEST(rope_parameters_v5_read_like_legacy)
{
    ct_model_config a, b;
    ct_error err = {0};
    float ia[64], ib[64], sa, sb;
    REQUIRE(model_config_load(&a, "configs/models/llama3.1-8b", &err) == CT_OK, "%s", err.msg);
    REQUIRE(parse_text(&b, "{\"model_type\":\"llama\",\"vocab_size\":128256,\"hidden_size\":4096,\"intermediate_size\":14336,"
                           "\"num_hidden_layers\":32,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
                           "\"max_position_embeddings\":131072,\"rope_parameters\":{\"rope_type\":\"llama3\","
                           "\"rope_theta\":500000.0,\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                           "\"original_max_position_embeddings\":8192}}", &err) == CT_OK, "%s", err.msg);
    CHECK(b.rope.type == CT_ROPE_LLAMA3 && b.rope.theta == 500000.0, "type %d theta %g", b.rope.type, b.rope.theta);
    model_rope_inv_freq(&a, ia, &sa);
    model_rope_inv_freq(&b, ib, &sb);
    CHECK(memcmp(ia, ib, sizeof ia) == 0 && sa == sb, "v5 frequencies differ from legacy");
}

TEST(tensor_specs_tiny_llama_tied_has_no_lm_head)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/tiny", &err) == CT_OK, "%s", err.msg);
    size_t n;
    ct_tensor_spec *s = model_tensor_specs(&mc, &n);
    CHECK(n == 1 + 4 * 9 + 1, "count %zu", n);
    CHECK(spec_is(find_spec(s, n, "model.embed_tokens.weight"), 2, 384, 128, 0), "embed");
    CHECK(spec_is(find_spec(s, n, "model.layers.3.self_attn.k_proj.weight"), 2, 64, 128, 0), "k_proj");
    CHECK(spec_is(find_spec(s, n, "model.layers.0.self_attn.o_proj.weight"), 2, 128, 128, 0), "o_proj");
    CHECK(spec_is(find_spec(s, n, "model.layers.1.mlp.down_proj.weight"), 2, 128, 384, 0), "down");
    CHECK(spec_is(find_spec(s, n, "model.norm.weight"), 1, 128, 0, 0), "norm");
    CHECK(find_spec(s, n, "lm_head.weight") == NULL, "tied model has no lm_head");
    CHECK(find_spec(s, n, "model.layers.0.self_attn.q_proj.bias") == NULL, "no bias");
    free(s);
}

TEST(tensor_specs_qwen2_has_qkv_biases_only)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen2\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":8,"
                            "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":2}", &err) == CT_OK,
            "%s", err.msg);
    size_t n;
    ct_tensor_spec *s = model_tensor_specs(&mc, &n);
    CHECK(spec_is(find_spec(s, n, "model.layers.0.self_attn.q_proj.bias"), 1, 64, 0, 0), "q bias");
    CHECK(spec_is(find_spec(s, n, "model.layers.0.self_attn.v_proj.bias"), 1, 32, 0, 0), "v bias");
    CHECK(find_spec(s, n, "model.layers.0.self_attn.o_proj.bias") == NULL, "qwen2 o_proj has no bias");
    CHECK(spec_is(find_spec(s, n, "lm_head.weight"), 2, 10, 64, 0), "untied lm_head");
    free(s);
}

TEST(tensor_specs_qwen3_has_qk_norms)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/tiny-qwen3", &err) == CT_OK, "%s", err.msg);
    size_t n;
    ct_tensor_spec *s = model_tensor_specs(&mc, &n);
    const ct_tensor_spec *qn = find_spec(s, n, "model.layers.1.self_attn.q_norm.weight");
    CHECK(spec_is(qn, 1, 32, 0, 0) && qn->kind == CT_TENSOR_NORM, "q_norm");
    CHECK(spec_is(find_spec(s, n, "model.layers.1.self_attn.k_norm.weight"), 1, 32, 0, 0), "k_norm");
    CHECK(spec_is(find_spec(s, n, "model.layers.0.self_attn.q_proj.weight"), 2, 256, 128, 0), "q_proj 8x32");
    CHECK(n == 1 + 2 * 11 + 2, "count %zu", n);
    free(s);
}

TEST(tensor_specs_qwen3_moe_has_router_and_experts)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/tiny-moe", &err) == CT_OK, "%s", err.msg);
    size_t n;
    ct_tensor_spec *s = model_tensor_specs(&mc, &n);
    CHECK(spec_is(find_spec(s, n, "model.layers.0.mlp.gate.weight"), 2, 8, 128, 0), "router");
    const ct_tensor_spec *d = find_spec(s, n, "model.layers.1.mlp.experts.7.down_proj.weight");
    CHECK(spec_is(d, 2, 128, 64, 0) && d->expert, "expert down");
    CHECK(spec_is(find_spec(s, n, "model.layers.1.mlp.experts.0.up_proj.weight"), 2, 64, 128, 0), "expert up");
    CHECK(find_spec(s, n, "model.layers.0.mlp.gate_proj.weight") == NULL, "no dense MLP in a sparse layer");
    CHECK(n == 1 + 2 * (8 + 1 + 8 * 3) + 2, "count %zu", n);
    free(s);
}

TEST(tensor_specs_mixtral_uses_block_sparse_moe_names)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(parse_text(&mc, "{\"model_type\":\"mixtral\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":96,"
                            "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_local_experts\":4}", &err) == CT_OK,
            "%s", err.msg);
    size_t n;
    ct_tensor_spec *s = model_tensor_specs(&mc, &n);
    CHECK(spec_is(find_spec(s, n, "model.layers.0.block_sparse_moe.gate.weight"), 2, 4, 64, 0), "gate");
    CHECK(spec_is(find_spec(s, n, "model.layers.0.block_sparse_moe.experts.3.w1.weight"), 2, 96, 64, 0), "w1");
    CHECK(spec_is(find_spec(s, n, "model.layers.0.block_sparse_moe.experts.3.w2.weight"), 2, 64, 96, 0), "w2");
    CHECK(mc.num_experts_per_tok == 2 && mc.norm_topk_prob, "mixtral defaults");
    free(s);
}

TEST(tensor_specs_gpt_oss_bf16_layout)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/gpt-oss-20b", &err) == CT_OK, "%s", err.msg);
    size_t n;
    ct_tensor_spec *s = model_tensor_specs(&mc, &n);
    const char *p = "model.layers.5.";
    char name[160];
#define AT(suffix) (snprintf(name, sizeof name, "%s%s", p, suffix), find_spec(s, n, name))
    CHECK(spec_is(AT("self_attn.sinks"), 1, 64, 0, 0), "sinks");
    CHECK(spec_is(AT("self_attn.q_proj.weight"), 2, 4096, 2880, 0), "q_proj");
    CHECK(spec_is(AT("self_attn.o_proj.bias"), 1, 2880, 0, 0), "o bias");
    CHECK(spec_is(AT("mlp.router.weight"), 2, 32, 2880, 0), "router");
    CHECK(spec_is(AT("mlp.router.bias"), 1, 32, 0, 0), "router bias");
    CHECK(spec_is(AT("mlp.experts.gate_up_proj"), 3, 32, 2880, 5760), "gate_up");
    CHECK(spec_is(AT("mlp.experts.gate_up_proj_bias"), 2, 32, 5760, 0), "gate_up bias");
    CHECK(spec_is(AT("mlp.experts.down_proj"), 3, 32, 2880, 2880), "down");
    CHECK(spec_is(AT("mlp.experts.down_proj_bias"), 2, 32, 2880, 0), "down bias");
#undef AT
    CHECK(spec_is(find_spec(s, n, "lm_head.weight"), 2, 201088, 2880, 0), "lm_head");
    free(s);
}

TEST(param_counts_qwen3_0_6b_follow_config_math)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/qwen3-0.6b", &err) == CT_OK, "%s", err.msg);
    ct_param_counts c = model_param_counts(&mc);
    size_t V = 151936, H = 1024, I = 3072, L = 28, Q = 16 * 128, KV = 8 * 128, D = 128;
    size_t matmul = L * (2 * Q * H + 2 * KV * H + 3 * H * I);
    CHECK(c.total == V * H + matmul + L * (2 * H + 2 * D) + H, "total %zu", c.total);
    CHECK(c.total > 590000000 && c.total < 600000000, "total %zu not ~0.6B", c.total);
    CHECK(c.embedding == V * H, "embedding %zu", c.embedding);
    CHECK(c.per_token_active == matmul + V * H, "N %zu (LM head counts though tied)", c.per_token_active);
}

TEST(param_counts_moe_count_active_experts_only)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/qwen3-30b-a3b", &err) == CT_OK, "%s", err.msg);
    ct_param_counts c = model_param_counts(&mc);
    size_t H = 2048, L = 48, V = 151936;
    size_t attn = 2 * 4096 * H + 2 * 512 * H, router = 128 * H, experts8 = 8 * 3 * H * 768;
    CHECK(c.per_token_active == L * (attn + router + experts8) + V * H, "N %zu", c.per_token_active);
    CHECK(c.total > 30000000000ull && c.total < 31000000000ull, "total %zu not ~30.5B", c.total);
    REQUIRE(model_config_load(&mc, "configs/models/gpt-oss-20b", &err) == CT_OK, "%s", err.msg);
    c = model_param_counts(&mc);
    CHECK(c.total > 20500000000ull && c.total < 21500000000ull, "gpt-oss total %zu not ~20.9B", c.total);
}

/* Writes a tiny checkpoint from the spec, with one tensor optionally reshaped. */
static int write_tiny(const char *path, const ct_model_config *mc, const char *skip, const char *reshape, ct_error *err)
{
    size_t n;
    ct_tensor_spec *s = model_tensor_specs(mc, &n);
    st_writer *w = st_writer_new();
    int rc = CT_OK;
    for (size_t i = 0; i < n && rc == CT_OK; i++) {
        if (skip && !strcmp(s[i].name, skip)) continue;
        int64_t shape[4];
        memcpy(shape, s[i].shape, sizeof shape);
        if (reshape && !strcmp(s[i].name, reshape)) shape[0] += 1;
        size_t numel = 1;
        for (int d = 0; d < s[i].ndim; d++) numel *= (size_t)shape[d];
        uint16_t *data = calloc(numel, 2);
        rc = st_writer_add(w, s[i].name, CT_DTYPE_BF16, s[i].ndim, shape, data, err);
        free(data);
    }
    if (rc == CT_OK) rc = st_writer_save(w, path, err);
    st_writer_free(w);
    free(s);
    return rc;
}

TEST(check_weights_accepts_spec_and_names_bad_tensor)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/tiny", &err) == CT_OK, "%s", err.msg);
    char path[] = "/tmp/ct_test_mc_XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0, "mkstemp");
    close(fd);
    const char *bad = "model.layers.2.mlp.up_proj.weight";
    for (int mode = 0; mode < 3; mode++) {
        REQUIRE(write_tiny(path, &mc, mode == 1 ? bad : NULL, mode == 2 ? bad : NULL, &err) == CT_OK, "%s", err.msg);
        st_reader *r = st_open(path, &err);
        REQUIRE(r, "%s", err.msg);
        int rc = model_check_weights(&mc, r, &err);
        if (mode == 0) CHECK(rc == CT_OK, "%s", err.msg);
        else CHECK(rc == CT_ERR_INPUT && strstr(err.msg, bad), "mode %d: %s", mode, err.msg);
        if (mode == 2) CHECK(strstr(err.msg, "[385, 128]") && strstr(err.msg, path), "%s", err.msg);
        st_close(r);
    }
    unlink(path);
}

/* ---- Gated DeltaNet hybrids ---- */

#define Q35_BASE "\"vocab_size\":384,\"hidden_size\":128,\"num_hidden_layers\":8,\"num_attention_heads\":4"

static int parse_fmt(ct_model_config *mc, ct_error *err, const char *fmt, const char *a, const char *b)
{
    char buf[2048];
    snprintf(buf, sizeof buf, fmt, a, b);
    return parse_text(mc, buf, err);
}

TEST(shipped_qwen3_5_9b_config_parses_through_text_config)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/qwen3.5-9b", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.arch == CT_ARCH_QWEN3_5 && mc.gdn && !strcmp(mc.model_type, "qwen3_5"), "arch %d", mc.arch);
    CHECK(!strcmp(mc.architectures, "Qwen3_5ForConditionalGeneration"), "%s", mc.architectures);
    CHECK(!strcmp(mc.tensor_prefix, "model.language_model."), "%s", mc.tensor_prefix);
    CHECK(mc.hidden_size == 4096 && mc.num_hidden_layers == 32 && mc.intermediate_size == 12288, "sizes");
    CHECK(mc.vocab_size == 248320 && !mc.tie_word_embeddings, "vocab %d", mc.vocab_size);
    CHECK(mc.num_attention_heads == 16 && mc.num_key_value_heads == 4 && mc.head_dim == 256, "attention");
    CHECK(mc.linear_num_key_heads == 16 && mc.linear_num_value_heads == 32 && mc.linear_key_head_dim == 128 &&
          mc.linear_value_head_dim == 128 && mc.linear_conv_kernel_dim == 4, "linear heads");
    int linear = 0;
    for (int l = 0; l < 32; l++) linear += mc.layer_linear[l];
    CHECK(linear == 24 && !mc.layer_linear[3] && mc.layer_linear[4] && !mc.layer_linear[31], "%d GDN layers", linear);
    CHECK(model_rope_dim(&mc) == 64 && mc.rope.theta == 1e7, "rotary dim %d", model_rope_dim(&mc));
    CHECK(mc.mrope_interleaved && mc.mrope_section[0] == 11 && mc.mrope_section[2] == 10, "mrope");
    CHECK(mc.attn_output_gate && mc.qk_norm && mc.norm_zero_centred && !mc.gdn_grouped_proj, "flags");
    CHECK(mc.mtp_num_hidden_layers == 1 && mc.num_experts == 0, "mtp %d", mc.mtp_num_hidden_layers);
    size_t n;
    ct_tensor_spec *s = model_tensor_specs(&mc, &n);
    CHECK(spec_is(find_spec(s, n, "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"), 2, 8192, 4096, 0),
          "in_proj_qkv [8192, 4096]");
    CHECK(spec_is(find_spec(s, n, "model.language_model.layers.3.self_attn.q_proj.weight"), 2, 8192, 4096, 0),
          "gated q_proj [2 * 16 * 256, 4096]");
    CHECK(find_spec(s, n, "lm_head.weight") && !find_spec(s, n, "model.language_model.layers.3.linear_attn.A_log"),
          "lm_head at top level; no GDN tensors in attention layers");
    free(s);
}

TEST(shipped_gdn_moe_configs_parse)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/qwen3.5-35b-a3b", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.arch == CT_ARCH_QWEN3_5_MOE && mc.num_experts == 256 && mc.num_experts_per_tok == 8, "experts");
    CHECK(mc.moe_intermediate_size == 512 && mc.shared_expert_intermediate_size == 512 && mc.norm_topk_prob, "moe");
    CHECK(mc.intermediate_size == 0 && mc.layer_sparse[0] && mc.layer_sparse[39], "every layer sparse");
    ct_param_counts c = model_param_counts(&mc);
    CHECK(c.total > 34000000000ull && c.total < 35500000000ull, "total %zu not ~35B (text part)", c.total);
    CHECK(c.per_token_active > 2500000000ull && c.per_token_active < 3500000000ull, "N %zu not ~3B", c.per_token_active);
    REQUIRE(model_config_load(&mc, "configs/models/qwen3-next-80b-a3b", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.arch == CT_ARCH_QWEN3_NEXT && mc.gdn_grouped_proj && !strcmp(mc.tensor_prefix, "model."), "next");
    CHECK(mc.num_experts == 512 && mc.num_experts_per_tok == 10 && mc.layer_linear[0] && !mc.layer_linear[3], "layout");
    c = model_param_counts(&mc);
    CHECK(c.total > 79000000000ull && c.total < 81000000000ull, "total %zu not ~80B", c.total);
    size_t n;
    ct_tensor_spec *s = model_tensor_specs(&mc, &n);
    CHECK(spec_is(find_spec(s, n, "model.layers.0.linear_attn.in_proj_qkvz.weight"), 2, 12288, 2048, 0), "qkvz");
    CHECK(spec_is(find_spec(s, n, "model.layers.0.linear_attn.in_proj_ba.weight"), 2, 64, 2048, 0), "ba");
    CHECK(spec_is(find_spec(s, n, "model.layers.0.linear_attn.conv1d.weight"), 3, 8192, 1, 4), "conv");
    CHECK(spec_is(find_spec(s, n, "model.layers.0.linear_attn.out_proj.weight"), 2, 2048, 4096, 0), "out_proj");
    CHECK(spec_is(find_spec(s, n, "model.layers.0.mlp.shared_expert_gate.weight"), 2, 1, 2048, 0), "shared gate");
    free(s);
}

TEST(gdn_absent_fields_take_transformers_defaults)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen3_5_text\"," Q35_BASE ",\"intermediate_size\":256}", &err) == CT_OK,
            "%s", err.msg);
    CHECK(mc.head_dim == 256 && mc.num_key_value_heads == 4, "hd %d kv %d", mc.head_dim, mc.num_key_value_heads);
    CHECK(mc.linear_num_key_heads == 16 && mc.linear_num_value_heads == 32 && mc.linear_key_head_dim == 128 &&
          mc.linear_value_head_dim == 128 && mc.linear_conv_kernel_dim == 4, "linear defaults");
    CHECK(mc.rope.partial_rotary_factor == 0.25 && mc.rope.theta == 10000 && model_rope_dim(&mc) == 64, "rope");
    CHECK(mc.layer_linear[0] && !mc.layer_linear[3] && !mc.layer_linear[7], "full_attention_interval 4");
    CHECK(mc.rms_norm_eps == 1e-6 && !mc.tie_word_embeddings && mc.max_position_embeddings == 32768, "misc");
    CHECK(!strcmp(mc.tensor_prefix, "model."), "text-only prefix %s", mc.tensor_prefix);
    /* partial_rotary_factor inside rope_parameters wins, as in HF */
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen3_5_text\"," Q35_BASE ",\"intermediate_size\":256,"
                            "\"partial_rotary_factor\":0.25,\"rope_parameters\":{\"rope_type\":\"default\","
                            "\"partial_rotary_factor\":0.5,\"rope_theta\":1e6}}", &err) == CT_OK, "%s", err.msg);
    CHECK(model_rope_dim(&mc) == 128 && mc.rope.theta == 1e6, "rotary dim %d", model_rope_dim(&mc));
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen3_5_moe_text\"," Q35_BASE "}", &err) == CT_OK, "%s", err.msg);
    CHECK(mc.num_key_value_heads == 2 && mc.num_experts == 256 && mc.num_experts_per_tok == 8, "moe defaults");
    CHECK(mc.moe_intermediate_size == 512 && mc.shared_expert_intermediate_size == 512 && mc.intermediate_size == 0,
          "moe sizes");
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen3_next\"," Q35_BASE ",\"mlp_only_layers\":[1]}", &err) == CT_OK,
            "%s", err.msg);
    CHECK(mc.num_experts == 512 && mc.num_experts_per_tok == 10 && mc.norm_topk_prob, "next experts");
    CHECK(mc.intermediate_size == 5632 && !mc.layer_sparse[1] && mc.layer_sparse[0], "next mlp_only_layers");
    CHECK(mc.gdn_grouped_proj && mc.num_key_value_heads == 2, "next layout");
}

/* qwen3_next's in_proj_qkvz rows [q_g k_g v_g z_g] per key head g and in_proj_ba
 * rows [b_g a_g] map one to one onto the fused order [all q | all k | all v |
 * all z] and [all b | all a], value heads g r .. g r + r - 1 in group g. */
TEST(qwen3_next_grouped_rows_map_one_to_one_onto_the_contiguous_order)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/tiny-qwen3-next", &err) == CT_OK, "%s", err.msg);
    REQUIRE(mc.linear_num_key_heads == 2 && mc.linear_num_value_heads == 4 && mc.linear_key_head_dim == 32 &&
            mc.linear_value_head_dim == 32, "tiny-qwen3-next's GDN shape changed");
    int qkvz = model_gdn_conv_dim(&mc) + model_gdn_value_dim(&mc), ba = 2 * mc.linear_num_value_heads;
    int hits[512] = {0};
    REQUIRE(qkvz <= 512, "%d rows", qkvz);
    for (int i = 0; i < qkvz; i++) {
        int r = model_gdn_qkvz_row(&mc, i);
        if (r >= 0 && r < qkvz) hits[r]++;
    }
    bool one_to_one = true;
    for (int r = 0; r < qkvz; r++) one_to_one &= hits[r] == 1;
    CHECK(one_to_one, "in_proj_qkvz rows are not a permutation");
    /* a group is 2 dk + 2 r dv = 192 rows; key_dim 64, conv_dim 256 */
    CHECK(model_gdn_qkvz_row(&mc, 0) == 0 && model_gdn_qkvz_row(&mc, 32) == 64, "group 0: q, k");
    CHECK(model_gdn_qkvz_row(&mc, 192 + 31) == 63 && model_gdn_qkvz_row(&mc, 192 + 32) == 96, "group 1: q, k");
    CHECK(model_gdn_qkvz_row(&mc, 192 + 64) == 128 + 64, "group 1's v: value head 2");
    CHECK(model_gdn_qkvz_row(&mc, 192 + 128) == 256 + 64 && model_gdn_qkvz_row(&mc, 383) == 383, "group 1's z");
    int b_hits[8] = {0};
    for (int i = 0; i < ba; i++) b_hits[model_gdn_ba_row(&mc, i)]++;
    one_to_one = true;
    for (int r = 0; r < ba; r++) one_to_one &= b_hits[r] == 1;
    CHECK(one_to_one, "in_proj_ba rows are not a permutation");
    CHECK(model_gdn_ba_row(&mc, 1) == 1 && model_gdn_ba_row(&mc, 2) == 4 && model_gdn_ba_row(&mc, 5) == 3 &&
          model_gdn_ba_row(&mc, 7) == 7, "b, a of groups 0 and 1");
}

TEST(gdn_wrapper_reads_text_config_like_text_only)
{
    static const char *inner = "\"vocab_size\":384,\"hidden_size\":128,\"num_hidden_layers\":4,"
                               "\"num_attention_heads\":4,\"head_dim\":64,\"intermediate_size\":256,"
                               "\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,"
                               "\"linear_key_head_dim\":32,\"linear_value_head_dim\":32";
    ct_model_config w, t;
    ct_error err = {0};
    REQUIRE(parse_fmt(&w, &err, "{\"model_type\":\"qwen3_5\",\"vision_config\":{\"depth\":1},"
                      "\"text_config\":{\"model_type\":\"qwen3_5_text\",%s}%s}", inner, "") == CT_OK, "%s", err.msg);
    REQUIRE(parse_fmt(&t, &err, "{\"model_type\":\"qwen3_5_text\",%s%s}", inner, "") == CT_OK, "%s", err.msg);
    CHECK(!strcmp(w.tensor_prefix, "model.language_model.") && !strcmp(t.tensor_prefix, "model."), "prefixes");
    CHECK(w.arch == t.arch && w.hidden_size == t.hidden_size && w.linear_num_value_heads == t.linear_num_value_heads,
          "same model");
    size_t nw, nt;
    ct_tensor_spec *sw = model_tensor_specs(&w, &nw), *st = model_tensor_specs(&t, &nt);
    REQUIRE(nw == nt, "%zu vs %zu tensors", nw, nt);
    for (size_t i = 0; i < nw; i++) {
        const char *tail = strncmp(st[i].name, "model.", 6) ? st[i].name : st[i].name + 6;
        bool ok = !strcmp(sw[i].name, st[i].name) ||
                  (!strncmp(sw[i].name, "model.language_model.", 21) && !strcmp(sw[i].name + 21, tail));
        CHECK(ok, "%s vs %s", sw[i].name, st[i].name);
    }
    free(sw);
    free(st);
}

TEST(gdn_layer_types_win_over_full_attention_interval)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":8,"
                            "\"num_hidden_layers\":4,\"num_attention_heads\":2,\"num_key_value_heads\":2,\"full_attention_interval\":2}", &err) == CT_OK,
            "%s", err.msg);
    CHECK(mc.layer_linear[0] && !mc.layer_linear[1] && mc.layer_linear[2] && !mc.layer_linear[3], "interval 2");
    REQUIRE(parse_text(&mc, "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":8,"
                            "\"num_hidden_layers\":4,\"num_attention_heads\":2,\"num_key_value_heads\":2,\"full_attention_interval\":2,"
                            "\"layer_types\":[\"full_attention\",\"linear_attention\",\"mamba\",\"attention\"]}", &err) == CT_OK,
            "%s", err.msg);
    CHECK(!mc.layer_linear[0] && mc.layer_linear[1] && mc.layer_linear[2] && !mc.layer_linear[3],
          "layer_types (legacy names too)");
}

TEST(gdn_refusals_name_file_and_key)
{
    static const struct { const char *extra, *key; } cases[] = {
        {",\"linear_num_key_heads\":3", "linear_num_value_heads (32) is not a multiple of linear_num_key_heads (3)"},
        {",\"linear_conv_kernel_dim\":0", "'linear_conv_kernel_dim' must be positive"},
        {",\"linear_conv_kernel_dim\":9", "'linear_conv_kernel_dim' is 9, more than the 8"},
        {",\"linear_value_head_dim\":4096", "'linear_value_head_dim' is 4096"},
        {",\"full_attention_interval\":0", "'full_attention_interval' must be positive"},
        {",\"layer_types\":[\"linear_attention\"]", "'layer_types' has 1 entries"},
        {",\"layer_types\":[\"linear_attention\",\"sliding_attention\",\"full_attention\",\"full_attention\","
         "\"a\",\"b\",\"c\",\"d\"]", "layer_types[1]: expected \"linear_attention\" or \"full_attention\""},
        {",\"attn_output_gate\":false", "'attn_output_gate' is false"},
        {",\"mtp_num_hidden_layers\":-1", "'mtp_num_hidden_layers' must be >= 0"},
        {",\"rope_parameters\":{\"mrope_section\":[11,11]}", "'mrope_section': expected an array of 3"},
        {",\"rope_parameters\":{\"mrope_section\":[11,11,11]}", "'mrope_section' sums to 33, more than the 32"},
    };
    ct_model_config mc;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ct_error err = {0};
        int rc = parse_fmt(&mc, &err, "{\"model_type\":\"qwen3_5_text\"," Q35_BASE ",\"intermediate_size\":256%s%s}",
                           cases[i].extra, "");
        CHECK(rc == CT_ERR_INPUT && strstr(err.msg, "test.json: ") && strstr(err.msg, cases[i].key), "%s: %s",
              cases[i].extra, err.msg);
    }
    ct_error err = {0};
    CHECK(parse_text(&mc, "{\"model_type\":\"qwen3_5\"}", &err) == CT_ERR_INPUT &&
          strstr(err.msg, "test.json: key 'text_config' is missing"), "%s", err.msg);
    CHECK(parse_text(&mc, "{\"model_type\":\"qwen3_5_moe\",\"text_config\":{" Q35_BASE ",\"linear_num_key_heads\":5}}",
                     &err) == CT_ERR_INPUT && strstr(err.msg, "test.json: text_config: linear_num_value_heads"), "%s", err.msg);
    CHECK(parse_text(&mc, "{\"model_type\":\"qwen3_5\",\"tie_word_embeddings\":true,\"text_config\":{" Q35_BASE
                          ",\"intermediate_size\":8}}", &err) == CT_ERR_INPUT &&
          strstr(err.msg, "text_config: key 'tie_word_embeddings' is false but the wrapper's is true (its default)"),
          "%s", err.msg);
    CHECK(parse_text(&mc, "{\"model_type\":\"qwen3_5_moe_text\"," Q35_BASE ",\"shared_expert_intermediate_size\":0}",
                     &err) == CT_ERR_INPUT && strstr(err.msg, "'shared_expert_intermediate_size' must be positive"),
          "%s", err.msg);
}

/* The fixture lists what transformers' save_pretrained writes for the config
 * (scripts/gdn_model_fixtures.py): the specs must hold exactly those tensors. */
static void check_specs_match_fixture(const char *name)
{
    char cfg[256], fix[256];
    snprintf(cfg, sizeof cfg, "configs/models/%s", name);
    snprintf(fix, sizeof fix, "tests/fixtures/gdn_models/%s.json", name);
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, cfg, &err) == CT_OK, "%s", err.msg);
    json_doc *doc = json_parse_file(fix, &err);
    REQUIRE(doc, "%s", err.msg);
    const json_value *want = json_get_type(json_root(doc), "tensors", JSON_OBJECT);
    size_t n;
    ct_tensor_spec *s = model_tensor_specs(&mc, &n);
    CHECK(want && want->count == n, "%s: %zu tensors in the spec, %zu in the fixture", name, n, want ? want->count : 0);
    for (size_t i = 0; want && i < n; i++) {
        const json_value *shape = json_get_type(want, s[i].name, JSON_ARRAY);
        bool same = shape && shape->count == (size_t)s[i].ndim;
        for (int d = 0; same && d < s[i].ndim; d++) same = shape->items[d]->integer == s[i].shape[d];
        CHECK(same, "%s: %s: not in the fixture with the spec's shape", name, s[i].name);
    }
    free(s);
    json_free(doc);
}

TEST(gdn_tensor_specs_equal_what_transformers_saves)
{
    check_specs_match_fixture("tiny-qwen3_5");
    check_specs_match_fixture("tiny-qwen3_5-text");
    check_specs_match_fixture("tiny-qwen3_5-moe");
    check_specs_match_fixture("tiny-qwen3-next");
}

TEST(gdn_param_counts_leave_conv_and_gates_out_of_n)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/tiny-qwen3_5-text", &err) == CT_OK, "%s", err.msg);
    ct_param_counts c = model_param_counts(&mc);
    size_t V = 384, H = 128, I = 256, Hv = 4, Kd = 64, Vd = 128, conv = 2 * Kd + Vd, W = 4, dv = 32, D = 64;
    size_t gdn_mm = conv * H + Vd * H + 2 * Hv * H + H * Vd, attn_mm = 2 * 256 * H + 2 * 128 * H + H * 256;
    size_t mlp = 3 * H * I, matmul = 3 * gdn_mm + attn_mm + 4 * mlp;
    size_t other = 3 * (conv * W + 2 * Hv + dv) + 2 * D + 4 * 2 * H + H;
    CHECK(c.per_token_active == matmul + V * H, "N %zu, want %zu", c.per_token_active, matmul + V * H);
    CHECK(c.total == matmul + other + 2 * V * H, "total %zu, want %zu", c.total, matmul + other + 2 * V * H);
}

TEST(check_weights_names_fused_experts_it_cannot_read_yet)
{
    ct_model_config mc;
    ct_error err = {0};
    REQUIRE(model_config_load(&mc, "configs/models/tiny-qwen3_5-moe", &err) == CT_OK, "%s", err.msg);
    char path[] = "/tmp/ct_test_mc_XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0, "mkstemp");
    close(fd);
    size_t n;
    ct_tensor_spec *s = model_tensor_specs(&mc, &n);
    st_writer *w = st_writer_new();
    static uint16_t zeros[8 * 128 * 128];
    int rc = st_writer_add(w, "model.language_model.layers.0.mlp.experts.gate_up_proj", CT_DTYPE_BF16, 3,
                           (const int64_t[]){8, 128, 128}, zeros, &err);
    for (size_t i = 0; i < n && rc == CT_OK; i++)
        if (!s[i].expert) rc = st_writer_add(w, s[i].name, CT_DTYPE_BF16, s[i].ndim, s[i].shape, zeros, &err);
    if (rc == CT_OK) rc = st_writer_save(w, path, &err);
    st_writer_free(w);
    free(s);
    REQUIRE(rc == CT_OK, "%s", err.msg);
    st_reader *r = st_open(path, &err);
    REQUIRE(r, "%s", err.msg);
    CHECK(model_check_weights(&mc, r, &err) == CT_ERR_INPUT &&
          strstr(err.msg, "layers.0.mlp.experts.0.gate_proj.weight is missing: the experts are stored fused"), "%s", err.msg);
    st_close(r);
    unlink(path);
}

int main(void)
{
    RUN(shipped_tiny_config_parses);
    RUN(shipped_qwen3_0_6b_config_parses);
    RUN(shipped_llama3_1_8b_config_parses);
    RUN(shipped_qwen3_30b_a3b_config_parses);
    RUN(shipped_gpt_oss_20b_config_parses);
    RUN(shipped_tiny_variants_parse);
    RUN(absent_head_dim_and_kv_heads_take_family_defaults);
    RUN(unsupported_model_type_lists_supported);
    RUN(invalid_configs_name_file_and_key);
    RUN(sliding_window_follows_each_family);
    RUN(qwen3_moe_with_use_sliding_window_slides_every_layer_as_transformers);
    RUN(gpt_oss_without_rope_scaling_takes_transformers_default_yarn);
    RUN(gpt_oss_top_k_and_swiglu_limit_other_than_transformers_are_refused);
    RUN(qwen3_moe_sparse_layers_follow_step_and_mlp_only_layers);
    RUN(rope_default_and_linear_frequencies);
    RUN(rope_llama3_bands_match_hand_computed_values);
    RUN(rope_yarn_is_finite_with_derived_attention_factor);
    RUN(rope_parameters_v5_read_like_legacy);
    RUN(tensor_specs_tiny_llama_tied_has_no_lm_head);
    RUN(tensor_specs_qwen2_has_qkv_biases_only);
    RUN(tensor_specs_qwen3_has_qk_norms);
    RUN(tensor_specs_qwen3_moe_has_router_and_experts);
    RUN(tensor_specs_mixtral_uses_block_sparse_moe_names);
    RUN(tensor_specs_gpt_oss_bf16_layout);
    RUN(param_counts_qwen3_0_6b_follow_config_math);
    RUN(param_counts_moe_count_active_experts_only);
    RUN(check_weights_accepts_spec_and_names_bad_tensor);
    RUN(shipped_qwen3_5_9b_config_parses_through_text_config);
    RUN(shipped_gdn_moe_configs_parse);
    RUN(gdn_absent_fields_take_transformers_defaults);
    RUN(qwen3_next_grouped_rows_map_one_to_one_onto_the_contiguous_order);
    RUN(gdn_wrapper_reads_text_config_like_text_only);
    RUN(gdn_layer_types_win_over_full_attention_interval);
    RUN(gdn_refusals_name_file_and_key);
    RUN(gdn_tensor_specs_equal_what_transformers_saves);
    RUN(gdn_param_counts_leave_conv_and_gates_out_of_n);
    RUN(check_weights_names_fused_experts_it_cannot_read_yet);
    return check_summary();
}
