/* test_fp8_base.c — FP8 frozen bases on the CPU backend (model.c's loader,
 * model_weight, the dequant_fp8 op): base_precision fp8 (quantize on load) and
 * folders stored in FP8 (quant_method fp8).
 *
 * The oracle: a folder whose quantizable weights (every nn.Linear of a layer,
 * and the routed experts of qwen3_moe and mixtral) were quantized and decoded
 * here, tensor by tensor in the file's order, with fp8_quantize_blocks and
 * fp8_dequantize_blocks (test_fp8 checks those against transformers), and
 * stored as fp32. On the CPU an FP8 weight decodes to exactly those values,
 * whether it is held in FP8 (every part of a fused weight on whole 128-row
 * blocks) or rounded through FP8 at load, so every FP8 load must give the
 * rounded folder's loss and LoRA gradients bit for bit. m.fp8_weights says
 * which weights were held in FP8; a loss that differs from the unquantized
 * model's keeps the comparison from passing vacuously. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "fp8.h"
#include "graph.h"
#include "lora_step.h"
#include "model_fixture.h"

/* Dims on 128-row blocks: q|k|v (256 | 128 | 128) and gate|up (384 | 384) fuse whole blocks. */
#define LLAMA_JSON(I)                                                                                             \
    "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 64,"                 \
    " \"hidden_size\": 256, \"intermediate_size\": " #I ", \"num_hidden_layers\": 2, \"num_attention_heads\": 2," \
    " \"num_key_value_heads\": 1, \"head_dim\": 128, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"           \
    " \"max_position_embeddings\": 256, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\"}"

/* Layer 0 sparse (E = 4, experts of 128 rows), layer 1 dense. */
static const char *const qwen3_moe_json =
    "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 64, \"hidden_size\": 256, \"intermediate_size\": 384,"
    " \"moe_intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 1, \"head_dim\": 128, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
    " \"norm_topk_prob\": false, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [1],"
    " \"router_aux_loss_coef\": 0.05, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
    " \"max_position_embeddings\": 256, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}";

static const char *const mixtral_json =
    "{\"model_type\": \"mixtral\", \"vocab_size\": 64, \"hidden_size\": 256, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
    " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"router_aux_loss_coef\": 0.02,"
    " \"rms_norm_eps\": 1e-5, \"rope_theta\": 1000000.0, \"sliding_window\": null,"
    " \"max_position_embeddings\": 256, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}";

/* Gated attention with head_dim 128: q_proj's query and gate rows move as whole blocks. */
static const char *const qwen3_5_json =
    "{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 64, \"hidden_size\": 256, \"intermediate_size\": 384,"
    " \"num_hidden_layers\": 2, \"layer_types\": [\"linear_attention\", \"full_attention\"],"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 128, \"linear_conv_kernel_dim\": 4,"
    " \"linear_key_head_dim\": 128, \"linear_num_key_heads\": 1, \"linear_num_value_heads\": 2,"
    " \"linear_value_head_dim\": 128, \"rms_norm_eps\": 1e-6, \"rope_parameters\": {\"partial_rotary_factor\": 0.25,"
    " \"rope_theta\": 10000.0, \"rope_type\": \"default\"}, \"max_position_embeddings\": 256,"
    " \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}";

static char llama_dir[64], llama320_dir[64], tiny_dir[64], moe_dir[64], mixtral_dir[64], qwen3_5_dir[64];

static bool has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* A weight base_precision fp8 quantizes: an nn.Linear of a layer (the shared
 * expert's and its gate included) or a per-expert projection; not embeddings,
 * lm_head, norms, biases or routers (mlp.gate, block_sparse_moe.gate). */
static bool quantizable(const char *name)
{
    static const char *const mods[] = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                                       "gate_proj.weight", "up_proj.weight", "down_proj.weight", "in_proj_qkv.weight",
                                       "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight",
                                       "in_proj_qkvz.weight", "in_proj_ba.weight", "out_proj.weight",
                                       "shared_expert_gate.weight", "w1.weight", "w2.weight", "w3.weight"};
    if (!strstr(name, "layers.")) return false;
    for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) {
        size_t a = strlen(name), b = strlen(mods[i]);
        if (a > b && !strcmp(name + a - b, mods[i]) && name[a - b - 1] == '.') return true;
    }
    return false;
}

/* Which quantizable weights a test expects held in FP8 (the rest rounded at load). */
static bool held_all(const char *name) { return quantizable(name); }

static bool held_but_gate_up(const char *name)
{
    return quantizable(name) && !has_suffix(name, "gate_proj.weight") && !has_suffix(name, "up_proj.weight");
}

/* GDN's in_proj_b and _a (Hv rows each) end off the block rows of [qkv | z | b | a]. */
static bool held_but_gdn_in(const char *name) { return quantizable(name) && !strstr(name, "linear_attn.in_proj_"); }

/* Below 128 rows only a weight of one tensor fits (its one partial block is
 * the last): o_proj, out_proj, a dense or shared expert's down_proj. */
static bool held_single_tensor(const char *name)
{
    return has_suffix(name, "o_proj.weight") || has_suffix(name, "out_proj.weight") ||
           (has_suffix(name, "down_proj.weight") && !strstr(name, ".experts."));
}

static size_t held_numel(const char *dir, bool (*held)(const char *))
{
    ct_error err = {0};
    st_reader *r = st_open(dir, &err);
    size_t n = 0;
    for (size_t i = 0; r && i < st_count(r); i++)
        if (held(st_at(r, i)->name)) n += st_at(r, i)->numel;
    if (r) st_close(r);
    return n;
}

static float *tensor_f32(const st_tensor *t)
{
    float *f = ct_malloc(t->numel * sizeof(float));
    for (size_t i = 0; i < t->numel; i++) {
        uint16_t h;
        memcpy(&h, (const char *)t->data + 2 * i, 2);
        f[i] = ct_bf16_to_f32(h);
    }
    return f;
}

/* What a stored FP8 folder gets wrong in one tensor (FAULT_NO_CONFIG: in config.json). */
typedef enum {
    FAULT_NONE,
    FAULT_NO_CONFIG,    /* FP8 tensors, config.json without quantization_config */
    FAULT_SCALE_SHAPE,  /* NAME_scale_inv with its grid transposed */
    FAULT_HUGE_SCALE,   /* scale_inv 1e38 on the first block */
    FAULT_TRANSPOSED    /* NAME stored (cols, rows), a consistent FP8 pair of the wrong shape */
} fp8_fault;

/* NAME's FP8 pair as fp8_write_weight writes it, with FAULT in it. */
static int add_fp8(st_writer *w, const char *name, const float *x, int64_t rows, int64_t cols, fp8_fault fault,
                   ct_error *err)
{
    if (fault == FAULT_TRANSPOSED) return fp8_write_weight(w, name, x, cols, rows, err);
    if (fault != FAULT_SCALE_SHAPE && fault != FAULT_HUGE_SCALE) return fp8_write_weight(w, name, x, rows, cols, err);
    int64_t shape[2] = {rows, cols}, grid[2] = {(int64_t)fp8_blocks((size_t)rows), (int64_t)fp8_blocks((size_t)cols)};
    uint8_t *q = ct_malloc((size_t)(rows * cols));
    float *s = ct_malloc((size_t)(grid[0] * grid[1]) * sizeof(float));
    int rc = fp8_quantize_blocks(q, s, x, (size_t)rows, (size_t)cols, err);
    if (fault == FAULT_HUGE_SCALE) s[0] = 1e38f;
    bool swap = fault == FAULT_SCALE_SHAPE;
    int64_t sshape[2] = {grid[swap], grid[!swap]};
    char sname[300];
    snprintf(sname, sizeof sname, "%s_scale_inv", name);
    if (!rc) rc = st_writer_add(w, name, CT_DTYPE_F8_E4M3, 2, shape, q, err);
    if (!rc) rc = st_writer_add(w, sname, CT_DTYPE_F32, 2, sshape, s, err);
    free(q);
    free(s);
    return rc;
}

/* DST from the bf16 folder SRC: its quantizable weights stored in FP8 with
 * fp8_config_text's quantization_config (stored; FAULT in tensor FAULT_AT or,
 * FAULT_NO_CONFIG, in config.json), or quantized and decoded in fp32 (the
 * rounded folder); every other tensor as it is. */
static int write_folder(const char *src, const char *dst, bool stored, fp8_fault fault, const char *fault_at)
{
    ct_error err = {0};
    char path[1024];
    st_reader *r = st_open(src, &err);
    if (!r) return printf("%s\n", err.msg), -1;
    st_writer *w = st_writer_new();
    int rc = 0;
    for (size_t i = 0; i < st_count(r) && !rc; i++) {
        const st_tensor *t = st_at(r, i);
        if (!quantizable(t->name) || t->dtype != CT_DTYPE_BF16 || t->ndim != 2) {
            rc = st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, &err);
            continue;
        }
        size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
        float *x = tensor_f32(t);
        if (stored) {
            fp8_fault f = fault_at && !strcmp(t->name, fault_at) ? fault : FAULT_NONE;
            rc = add_fp8(w, t->name, x, t->shape[0], t->shape[1], f, &err);
        } else {
            uint8_t *q = ct_malloc(rows * cols);
            float *s = ct_malloc(fp8_blocks(rows) * fp8_blocks(cols) * sizeof(float));
            rc = fp8_quantize_blocks(q, s, x, rows, cols, &err);
            if (!rc) fp8_dequantize_blocks(x, q, s, rows, cols);
            if (!rc) rc = st_writer_add(w, t->name, CT_DTYPE_F32, 2, t->shape, x, &err);
            free(q);
            free(s);
        }
        free(x);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    if (!rc) rc = st_writer_save(w, path, &err);
    bool with_config = stored && fault != FAULT_NO_CONFIG;
    size_t len, out_len = 0;
    snprintf(path, sizeof path, "%s/config.json", src);
    char *text = rc ? NULL : ct_read_file(path, &len, &err);
    char *cfg = text && with_config ? fp8_config_text(text, len, path, &out_len, &err) : NULL;
    snprintf(path, sizeof path, "%s/config.json", dst);
    if (!text || (with_config && !cfg)) rc = -1;
    else rc = ct_write_file_atomic(path, with_config ? cfg : text, with_config ? out_len : len, &err);
    if (rc) printf("writing %s: %s\n", dst, err.msg);
    free(text);
    free(cfg);
    st_writer_free(w);
    st_close(r);
    return rc;
}

static void remove_dir(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

/* base_precision fp8 on SRC equals the rounded folder bit for bit, and holds
 * in FP8 exactly the weights HELD names. */
static void check_on_load(const char *src, bool (*held)(const char *))
{
    char dst[] = "/tmp/ctune_fp8r_XXXXXX";
    REQUIRE(mkdtemp(dst), "mkdtemp");
    REQUIRE(write_folder(src, dst, false, FAULT_NONE, NULL) == 0, "writing the rounded folder from %s", src);
    ct_load_options opt = {.fp8 = true};
    float *gq = NULL, *gr = NULL, *g0 = NULL;
    size_t nq, nr, n0, f8, f8r, f80;
    double lq = lora_step(src, &opt, &gq, &nq, NULL, &f8);
    double lr = lora_step(dst, NULL, &gr, &nr, NULL, &f8r);
    double l0 = lora_step(src, NULL, &g0, &n0, NULL, &f80);
    REQUIRE(isfinite(lq) && isfinite(lr) && isfinite(l0) && nq == nr, "losses %g %g %g", lq, lr, l0);
    CHECK(lq == lr, "%s: loss %.9g (FP8 on load) vs %.9g (rounded folder)", src, lq, lr);
    CHECK(!memcmp(gq, gr, nq * sizeof(float)), "%s: LoRA gradients differ from the rounded folder's", src);
    CHECK(lq != l0, "%s: FP8 changed nothing (loss %.9g both): the comparison would be vacuous", src, lq);
    CHECK(f8r == 0 && f80 == 0, "dense folders hold %zu, %zu FP8 weights", f8r, f80);
    size_t want = held_numel(src, held);
    CHECK(f8 == want, "%s: %zu weights held in FP8, expected %zu", src, f8, want);
    free(gq); free(gr); free(g0);
    remove_dir(dst);
}

TEST(fp8_on_load_of_block_aligned_llama_equals_the_rounded_folder)
{
    check_on_load(llama_dir, held_all);
}

TEST(gate_up_not_on_block_rows_rounds_at_load_and_down_is_held)
{
    /* up_proj starts at row 320 of gate|up; down_proj (256, 320) is one part, its last column block partial */
    check_on_load(llama320_dir, held_but_gate_up);
}

TEST(routed_experts_are_quantized_and_held_in_fp8)
{
    check_on_load(moe_dir, held_all);
    check_on_load(mixtral_dir, held_all);
}

TEST(gated_q_rows_move_as_whole_fp8_blocks)
{
    check_on_load(qwen3_5_dir, held_but_gdn_in);
}

TEST(small_models_round_fused_weights_and_hold_single_tensors)
{
    /* gated q rows (moving inside a block), qwen3_5's four GDN projections,
     * qwen3_next's grouped ones, its experts and shared expert's gate|up (parts off
     * the block rows) round at load */
    check_on_load(tiny_dir, held_single_tensor);
    check_on_load("tests/fixtures/parity_qwen3_5/model", held_single_tensor);
    check_on_load("tests/fixtures/parity_qwen3_next/model", held_single_tensor);
}

TEST(a_stored_fp8_folder_equals_quantizing_on_load)
{
    const char *srcs[] = {llama_dir, llama320_dir, moe_dir, qwen3_5_dir};
    for (size_t k = 0; k < sizeof srcs / sizeof srcs[0]; k++) {
        char dst[] = "/tmp/ctune_fp8s_XXXXXX", rnd[] = "/tmp/ctune_fp8r_XXXXXX";
        REQUIRE(mkdtemp(dst) && mkdtemp(rnd), "mkdtemp");
        REQUIRE(write_folder(srcs[k], dst, true, FAULT_NONE, NULL) == 0 &&
                    write_folder(srcs[k], rnd, false, FAULT_NONE, NULL) == 0,
                "folders of %s", srcs[k]);
        ct_load_options opt = {.fp8 = true};
        float *gs = NULL, *gq = NULL, *gr = NULL;
        size_t ns, nq, nr, f8s, f8q, f8r;
        double ls = lora_step(dst, NULL, &gs, &ns, NULL, &f8s), lq = lora_step(srcs[k], &opt, &gq, &nq, NULL, &f8q);
        double lr = lora_step(rnd, NULL, &gr, &nr, NULL, &f8r);
        REQUIRE(isfinite(ls) && isfinite(lq) && isfinite(lr) && ns == nq && ns == nr, "losses %g %g %g", ls, lq, lr);
        CHECK(ls == lq && !memcmp(gs, gq, ns * sizeof(float)), "%s: stored FP8 loss %.9g vs on load %.9g%s", srcs[k],
              ls, lq, ls == lq ? " (gradients differ)" : "");
        CHECK(ls == lr && !memcmp(gs, gr, ns * sizeof(float)), "%s: stored FP8 loss %.9g vs rounded %.9g%s", srcs[k],
              ls, lr, ls == lr ? " (gradients differ)" : "");
        CHECK(f8s == f8q && f8s > 0, "%s: FP8 weights %zu (stored) vs %zu (on load)", srcs[k], f8s, f8q);
        ct_model m;
        ct_error err = {0};
        ct_backend *be = backend_cpu_new();
        CHECK(model_load_with(&m, be, dst, &opt, &err) == CT_ERR_INPUT && strstr(err.msg, "already quantized"),
              "base_precision fp8 on an FP8 folder: %s", err.msg);
        be->destroy(be);
        free(gs); free(gq); free(gr);
        remove_dir(dst);
        remove_dir(rnd);
    }
}

/* Loading SRC stored in FP8 with FAULT at tensor AT fails with CT_ERR_INPUT naming WHAT and AT. */
static void check_fault(const char *src, fp8_fault fault, const char *at, const char *what)
{
    char dst[] = "/tmp/ctune_fp8f_XXXXXX";
    REQUIRE(mkdtemp(dst), "mkdtemp");
    REQUIRE(write_folder(src, dst, true, fault, at) == 0, "writing the FP8 folder of %s", src);
    ct_model m;
    ct_error err = {0};
    ct_backend *be = backend_cpu_new();
    int rc = model_load_with(&m, be, dst, NULL, &err);
    CHECK(rc == CT_ERR_INPUT && strstr(err.msg, what) && strstr(err.msg, at), "fault %d at %s: rc %d, '%s'",
          (int)fault, at, rc, err.msg);
    if (rc == CT_OK) model_free(&m);
    be->destroy(be);
    remove_dir(dst);
}

TEST(a_scale_grid_of_the_wrong_shape_is_refused)
{
    /* k_proj (128, 256): its grid (1, 2) stored as (2, 1) */
    check_fault(llama_dir, FAULT_SCALE_SHAPE, "model.layers.1.self_attn.k_proj.weight", "weight_scale_inv': shape");
}

TEST(fp8_tensors_without_a_quantization_config_are_refused)
{
    check_fault(llama_dir, FAULT_NO_CONFIG, "model.layers.0.self_attn.q_proj.weight",
                "is stored in FP8 but config.json has no fp8 quantization_config");
}

TEST(scales_that_decode_to_non_finite_weights_are_refused)
{
    check_fault(llama_dir, FAULT_HUGE_SCALE, "model.layers.0.self_attn.v_proj.weight", "would decode to non-finite");
    /* gate|up of the 320-row llama is decoded at load rather than held */
    check_fault(llama320_dir, FAULT_HUGE_SCALE, "model.layers.0.mlp.gate_proj.weight", "non-finite values");
}

TEST(an_fp8_weight_of_the_wrong_shape_is_refused)
{
    check_fault(llama_dir, FAULT_TRANSPOSED, "model.layers.1.mlp.down_proj.weight", "shape");
    /* also where it would be decoded at load: up_proj (256, 320) in place of (320, 256) */
    check_fault(llama320_dir, FAULT_TRANSPOSED, "model.layers.1.mlp.up_proj.weight", "shape");
}

TEST(fp8_quantization_configs_ctune_cannot_read_are_refused)
{
    static const char *const cases[][2] = {
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}", "weight_block_size must be [128, 128]"},
        {"{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\"}", "activation_scheme must be \"dynamic\""},
        {"{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}", "fmt must be \"e4m3\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1200];
        snprintf(json, sizeof json, "%.*s, \"quantization_config\": %s}", (int)strlen(fixture_llama_json) - 1,
                 fixture_llama_json, cases[i][0]);
        ct_model_config mc;
        ct_error err = {0};
        CHECK(model_config_parse(&mc, json, strlen(json), "config.json", &err) == CT_ERR_INPUT &&
                  strstr(err.msg, cases[i][1]) && strstr(err.msg, "config.json"),
              "case %zu: %s", i, err.msg);
    }
}

TEST(a_backend_without_dequant_fp8_refuses_fp8_bases)
{
    char dst[] = "/tmp/ctune_fp8b_XXXXXX";
    REQUIRE(mkdtemp(dst), "mkdtemp");
    REQUIRE(write_folder(llama_dir, dst, true, FAULT_NONE, NULL) == 0, "writing the FP8 folder");
    ct_load_options opt = {.fp8 = true};
    for (int k = 0; k < 2; k++) { /* a stored FP8 folder; base_precision fp8 on a bf16 one */
        ct_backend *be = backend_cpu_new();
        be->dequant_fp8 = NULL;
        ct_model m;
        ct_error err = {0};
        int rc = model_load_with(&m, be, k == 0 ? dst : llama_dir, k == 0 ? NULL : &opt, &err);
        CHECK(rc == CT_ERR_INPUT && strstr(err.msg, "not supported on the cpu backend"), "case %d: rc %d, '%s'", k, rc,
              err.msg);
        if (rc == CT_OK) model_free(&m);
        be->destroy(be);
    }
    remove_dir(dst);
}

int main(void)
{
    char *dirs[] = {llama_dir, llama320_dir, tiny_dir, moe_dir, mixtral_dir, qwen3_5_dir};
    const char *jsons[] = {LLAMA_JSON(384), LLAMA_JSON(320), fixture_llama_json, qwen3_moe_json, mixtral_json,
                           qwen3_5_json};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(dirs[i], sizeof llama_dir, "/tmp/ctune_fp8base_%zu_XXXXXX", i);
        CT_ASSERT(mkdtemp(dirs[i]) && !fixture_write_model(dirs[i], jsons[i], 20 + i), "fixture model %zu", i);
    }
    RUN(fp8_on_load_of_block_aligned_llama_equals_the_rounded_folder);
    RUN(gate_up_not_on_block_rows_rounds_at_load_and_down_is_held);
    RUN(routed_experts_are_quantized_and_held_in_fp8);
    RUN(gated_q_rows_move_as_whole_fp8_blocks);
    RUN(small_models_round_fused_weights_and_hold_single_tensors);
    RUN(a_stored_fp8_folder_equals_quantizing_on_load);
    RUN(a_scale_grid_of_the_wrong_shape_is_refused);
    RUN(fp8_tensors_without_a_quantization_config_are_refused);
    RUN(scales_that_decode_to_non_finite_weights_are_refused);
    RUN(an_fp8_weight_of_the_wrong_shape_is_refused);
    RUN(fp8_quantization_configs_ctune_cannot_read_are_refused);
    RUN(a_backend_without_dequant_fp8_refuses_fp8_bases);
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) remove_dir(dirs[i]);
    return check_summary();
}
