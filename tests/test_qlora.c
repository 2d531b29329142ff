/* test_qlora.c — 4-bit frozen bases on the CPU backend (model.c's loader,
 * model_weight, the dequant4 op).
 *
 * The oracle for quantize-on-load: a folder whose quantizable weights were
 * quantized and decoded here, tensor by tensor in the file's order, with the
 * bitsandbytes functions of quant4.c (test_quant4 checks those bit for bit
 * against bitsandbytes), and stored as fp32. Loading the bf16 folder with
 * model_quantization must give the same loss and LoRA gradients, bit for bit:
 * on the CPU the 4-bit weights decode to exactly those fp32 values, whether
 * they are held in 4 bits (fused q|k|v, gate|up; the rows of gated attention's
 * q_proj and qwen3_next's grouped projections moved) or, where a block would
 * span rows that move, rounded through 4 bits at load. A check that the loss
 * differs from the unquantized model's keeps the comparison from passing
 * vacuously. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "graph.h"
#include "lora_step.h"
#include "model_fixture.h"
#include "json.h"
#include "mxfp4.h"
#include "quant4.h"
#include "quant4_write.h"

/* Which weights a test folder holds in 4 bits beyond HF's rule (flags). */
enum { Q_EXPERTS = 1, Q_SKIP_V = 2, Q_BF16_STORAGE = 4 };
static int q_flags;

static bool has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* A weight HF's bitsandbytes quantizes (an nn.Linear of a layer; routed
 * experts are parameters in transformers 5 and stay bf16), or with q_flags
 * Q_EXPERTS also per-expert Linear4bit experts (transformers 4's folders) and
 * with Q_SKIP_V not v_proj (llm_int8_skip_modules). */
static bool quantizable(const char *name)
{
    if ((q_flags & Q_SKIP_V) && has_suffix(name, "v_proj.weight")) return false;
    if ((q_flags & Q_EXPERTS) && strstr(name, ".experts.") && has_suffix(name, "_proj.weight")) return true;
    static const char *const mods[] = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                                       "gate_proj.weight", "up_proj.weight", "down_proj.weight", "in_proj_qkv.weight",
                                       "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight",
                                       "in_proj_qkvz.weight", "in_proj_ba.weight", "out_proj.weight",
                                       "shared_expert_gate.weight"};
    if (!strstr(name, "layers.") || (strstr(name, ".experts.") && !strstr(name, "shared_expert"))) return false;
    for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) {
        size_t a = strlen(name), b = strlen(mods[i]);
        if (a > b && !strcmp(name + a - b, mods[i]) && name[a - b - 1] == '.') return true;
    }
    return false;
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

/* DST: SRC's config and its tensors, the quantizable ones quantized and decoded (fp32). */
static int write_rounded(const char *src, const char *dst, quant4_type type, int bs, bool dq)
{
    ct_error err = {0};
    char path[1024], cmd[2200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/", dst, src, dst);
    if (system(cmd)) return -1;
    st_reader *r = st_open(src, &err);
    if (!r) return printf("%s\n", err.msg), -1;
    st_writer *w = st_writer_new();
    int rc = 0;
    for (size_t i = 0; i < st_count(r) && !rc; i++) {
        const st_tensor *t = st_at(r, i);
        if (!quantizable(t->name) || t->dtype != CT_DTYPE_BF16) {
            rc = st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, &err);
            continue;
        }
        size_t n = t->numel, nb = quant4_num_blocks(n, (size_t)bs);
        float *x = tensor_f32(t), *absmax = ct_malloc(nb * sizeof(float));
        uint8_t *codes = ct_malloc(quant4_packed_bytes(n));
        rc = quant4_quantize(codes, absmax, x, n, (size_t)bs, type, &err);
        if (!rc && dq) quant4_double_roundtrip(absmax, nb);
        if (!rc) quant4_dequantize(x, codes, absmax, n, (size_t)bs, type);
        if (!rc) rc = st_writer_add(w, t->name, CT_DTYPE_F32, t->ndim, t->shape, x, &err);
        free(x); free(absmax); free(codes);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    if (!rc) rc = st_writer_save(w, path, &err);
    if (rc) printf("%s\n", err.msg);
    st_writer_free(w);
    st_close(r);
    return rc;
}

/* Quantize-on-load of SRC equals the rounded folder bit for bit; q4_expected:
 * whether every quantizable weight should be held in 4 bits. */
static void check_on_load(const char *src, quant4_type type, int bs, bool dq, bool q4_expected)
{
    char dst[] = "/tmp/ctune_qlora_XXXXXX";
    REQUIRE(mkdtemp(dst), "mkdtemp");
    REQUIRE(write_rounded(src, dst, type, bs, dq) == 0, "writing the rounded folder from %s", src);
    ct_load_options opt = {.quantize = true, .type = type, .blocksize = bs, .double_quant = dq};
    float *gq = NULL, *gr = NULL, *g0 = NULL;
    size_t nq, nr, n0, q4, q4r, q40;
    double lq = lora_step(src, &opt, &gq, &nq, &q4, NULL);
    double lr = lora_step(dst, NULL, &gr, &nr, &q4r, NULL);
    double l0 = lora_step(src, NULL, &g0, &n0, &q40, NULL);
    REQUIRE(isfinite(lq) && isfinite(lr) && isfinite(l0) && nq == nr, "losses %g %g %g", lq, lr, l0);
    CHECK(lq == lr, "%s: loss %.9g (quantized on load) vs %.9g (rounded folder)", src, lq, lr);
    CHECK(!memcmp(gq, gr, nq * sizeof(float)), "%s: LoRA gradients differ from the rounded folder's", src);
    CHECK(lq != l0, "%s: quantizing changed nothing (loss %.9g both): the comparison would be vacuous", src, lq);
    CHECK(q4r == 0 && q40 == 0, "dense folders hold %zu, %zu 4-bit weights", q4r, q40);
    CHECK(q4_expected ? q4 > 0 : q4 == 0, "%s: %zu weights held in 4 bits (expected %s)", src, q4,
          q4_expected ? "some" : "none");
    free(gq); free(gr); free(g0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dst);
    if (system(cmd)) {}
}

/* From a bf16 gpt_oss folder SRC: MX, its experts in MXFP4 (mxfp4.h) with the
 * quantization_config the Hub's checkpoints carry, and DEC, the same experts
 * decoded (fp32, HF's [E, in, out] layout). */
static int write_mxfp4_pair(const char *src, const char *mx, const char *dec)
{
    ct_error err = {0};
    char path[1024];
    st_reader *r = st_open(src, &err);
    if (!r) return printf("%s\n", err.msg), -1;
    st_writer *wm = st_writer_new(), *wd = st_writer_new();
    int rc = 0;
    for (size_t i = 0; i < st_count(r) && !rc; i++) {
        const st_tensor *t = st_at(r, i);
        size_t n = strlen(t->name);
        bool expert = t->ndim == 3 && n > 5 && !strcmp(t->name + n - 5, "_proj");
        if (!expert) {
            rc = st_writer_add(wm, t->name, t->dtype, t->ndim, t->shape, t->data, &err);
            if (!rc) rc = st_writer_add(wd, t->name, t->dtype, t->ndim, t->shape, t->data, &err);
            continue;
        }
        size_t E = (size_t)t->shape[0], in = (size_t)t->shape[1], out = (size_t)t->shape[2];
        float *x = tensor_f32(t), *xt = ct_malloc(t->numel * sizeof(float)), *y = ct_malloc(t->numel * sizeof(float));
        for (size_t e = 0; e < E; e++) /* [E, in, out] -> (E, out, in) */
            for (size_t a = 0; a < in; a++)
                for (size_t o = 0; o < out; o++) xt[(e * out + o) * in + a] = x[(e * in + a) * out + o];
        rc = mxfp4_write_experts(wm, t->name, xt, (int64_t)E, (int64_t)out, (int64_t)in, &err);
        uint8_t *blocks = ct_malloc(t->numel / 2), *scales = ct_malloc(t->numel / 32);
        if (!rc) rc = mxfp4_quantize(blocks, scales, xt, E * out, in, &err);
        if (!rc) {
            mxfp4_dequantize(xt, blocks, scales, E * out, in);
            for (size_t e = 0; e < E; e++)
                for (size_t a = 0; a < in; a++)
                    for (size_t o = 0; o < out; o++) y[(e * in + a) * out + o] = xt[(e * out + o) * in + a];
            rc = st_writer_add(wd, t->name, CT_DTYPE_F32, t->ndim, t->shape, y, &err);
        }
        free(x); free(xt); free(y); free(blocks); free(scales);
    }
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s %s && cp %s/config.json %s/", mx, dec, src, dec);
    if (!rc && system(cmd)) rc = -1;
    snprintf(path, sizeof path, "%s/model.safetensors", mx);
    if (!rc) rc = st_writer_save(wm, path, &err);
    snprintf(path, sizeof path, "%s/model.safetensors", dec);
    if (!rc) rc = st_writer_save(wd, path, &err);
    if (!rc) { /* config.json + quantization_config */
        size_t len;
        snprintf(path, sizeof path, "%s/config.json", src);
        char *text = ct_read_file(path, &len, &err);
        json_writer j;
        json_writer_init(&j);
        mxfp4_write_config(&j);
        char *end = text ? strrchr(text, '}') : NULL;
        if (!end) rc = -1;
        else {
            json_writer out;
            json_writer_init(&out);
            json_write_rawf(&out, "%.*s, \"quantization_config\": %.*s}\n", (int)(end - text), text, (int)j.len, j.buf);
            snprintf(path, sizeof path, "%s/config.json", mx);
            rc = ct_write_file_atomic(path, out.buf, out.len, &err);
            json_writer_free(&out);
        }
        json_writer_free(&j);
        free(text);
    }
    if (rc) printf("mxfp4 folders: %s\n", err.msg);
    st_writer_free(wm);
    st_writer_free(wd);
    st_close(r);
    return rc;
}

static char llama_dir[64], qwen3_moe_dir[64], gpt_oss_dir[64];

/* SRC with its quantizable weights written in bitsandbytes' 4-bit form
 * (quant4_write, the writer of ctune quantize) into DST. */
static int write_bnb_folder(const char *src, const char *dst, const quant4_write_opts *o)
{
    ct_error err = {0};
    char path[1024];
    st_reader *r = st_open(src, &err);
    if (!r) return printf("%s\n", err.msg), -1;
    st_writer *w = st_writer_new();
    int rc = 0;
    size_t bytes = 0;
    for (size_t i = 0; i < st_count(r) && !rc; i++) {
        const st_tensor *t = st_at(r, i);
        if (!quantizable(t->name)) {
            rc = st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, &err);
            continue;
        }
        float *x = tensor_f32(t);
        rc = quant4_write_add(w, t->name, x, t->ndim, t->shape, o, &bytes, &err);
        free(x);
    }
    if (!rc && (q_flags & Q_BF16_STORAGE)) { /* bnb_4bit_quant_storage bf16: the same bytes as BF16 [n/4, 1] */
        st_writer *w2 = st_writer_new();
        snprintf(path, sizeof path, "%s/model.safetensors", dst);
        if (!(rc = st_writer_save(w, path, &err))) {
            st_reader *r2 = st_open(path, &err);
            for (size_t i = 0; r2 && i < st_count(r2) && !rc; i++) {
                const st_tensor *t = st_at(r2, i);
                bool packed = quant4_is_quantized(r2, t->name) && t->nbytes % 2 == 0;
                int64_t shape[2] = {(int64_t)t->nbytes / 2, 1};
                rc = packed ? st_writer_add(w2, t->name, CT_DTYPE_BF16, 2, shape, t->data, &err)
                            : st_writer_add(w2, t->name, t->dtype, t->ndim, t->shape, t->data, &err);
            }
            if (!r2) rc = -1;
            st_writer_free(w);
            w = w2;
            if (!rc) rc = st_writer_save(w, path, &err); /* w2 holds copies: r2 may close after */
            if (r2) st_close(r2);
            w2 = NULL;
        }
        if (w2) st_writer_free(w2);
    }
    size_t len, out_len;
    snprintf(path, sizeof path, "%s/config.json", src);
    char *text = rc ? NULL : ct_read_file(path, &len, &err);
    char *cfg = text ? quant4_config_text(text, len, path, o, &out_len, &err) : NULL;
    if (!cfg) rc = -1;
    snprintf(path, sizeof path, "%s/config.json", dst);
    if (!rc) rc = ct_write_file_atomic(path, cfg, out_len, &err);
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    if (!rc) rc = st_writer_save(w, path, &err);
    if (rc) printf("bnb folder: %s\n", err.msg);
    free(text);
    free(cfg);
    st_writer_free(w);
    st_close(r);
    return rc;
}

/* A stored folder against its rounded fp32 folder, with q_flags deciding
 * which weights are 4-bit: HF's rule with v_proj skipped (q|k|v then dense, its
 * q and k decoded at load), per-expert Linear4bit experts (held in 4 bits),
 * and bf16 quant storage. */
static void check_stored(const char *src, int flags)
{
    q_flags = flags;
    char dst[] = "/tmp/ctune_bnbs_XXXXXX", rnd[] = "/tmp/ctune_bnbr_XXXXXX";
    REQUIRE(mkdtemp(dst) && mkdtemp(rnd), "mkdtemp");
    quant4_write_opts o = {.type = QUANT4_NF4, .blocksize = 32, .double_quant = true};
    REQUIRE(write_bnb_folder(src, dst, &o) == 0 && write_rounded(src, rnd, o.type, 32, true) == 0, "folders of %s",
            src);
    float *gs = NULL, *gr = NULL;
    size_t ns, nr, q4s, q4r;
    double ls = lora_step(dst, NULL, &gs, &ns, &q4s, NULL), lr = lora_step(rnd, NULL, &gr, &nr, &q4r, NULL);
    REQUIRE(isfinite(ls) && isfinite(lr) && ns == nr, "losses %g %g", ls, lr);
    CHECK(ls == lr && !memcmp(gs, gr, ns * sizeof(float)), "%s (flags %d): stored loss %.9g vs rounded %.9g", src,
          flags, ls, lr);
    size_t want = 0; /* every 4-bit tensor is held in 4 bits but q and k beside a skipped v (decoded at load) */
    ct_error err = {0};
    st_reader *r = st_open(src, &err);
    for (size_t i = 0; r && i < st_count(r); i++) {
        const st_tensor *t = st_at(r, i);
        bool beside_v = (flags & Q_SKIP_V) &&
                        (has_suffix(t->name, "q_proj.weight") || has_suffix(t->name, "k_proj.weight"));
        if (quantizable(t->name) && !beside_v) want += t->numel;
    }
    if (r) st_close(r);
    CHECK(q4s == want, "%s (flags %d): %zu weights in 4 bits, expected %zu", src, flags, q4s, want);
    free(gs); free(gr);
    q_flags = 0;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", dst, rnd);
    if (system(cmd)) {}
}

TEST(skipped_modules_experts_and_bf16_storage_load_as_stored)
{
    check_stored(llama_dir, Q_SKIP_V);
    check_stored(llama_dir, Q_BF16_STORAGE);
    check_stored(qwen3_moe_dir, Q_EXPERTS);
}

TEST(a_stored_4_bit_folder_equals_quantizing_on_load)
{
    static const char *const srcs[] = {"tests/fixtures/parity_qwen3_5/model", "tests/fixtures/parity_qwen3_next/model"};
    for (int k = 0; k < 3; k++) {
        const char *src = k == 0 ? llama_dir : srcs[k - 1];
        char dst[] = "/tmp/ctune_bnb_XXXXXX";
        REQUIRE(mkdtemp(dst), "mkdtemp");
        quant4_write_opts o = {.type = k == 1 ? QUANT4_FP4 : QUANT4_NF4, .blocksize = 32, .double_quant = k != 1};
        REQUIRE(write_bnb_folder(src, dst, &o) == 0, "writing %s in 4 bits", src);
        ct_load_options opt = {.quantize = true, .type = o.type, .blocksize = 32, .double_quant = o.double_quant};
        float *gs = NULL, *gq = NULL;
        size_t ns, nq, q4s, q4q;
        double ls = lora_step(dst, NULL, &gs, &ns, &q4s, NULL), lq = lora_step(src, &opt, &gq, &nq, &q4q, NULL);
        REQUIRE(isfinite(ls) && isfinite(lq) && ns == nq, "losses %g %g", ls, lq);
        CHECK(ls == lq && !memcmp(gs, gq, ns * sizeof(float)), "%s: stored 4-bit loss %.9g vs on load %.9g%s", src, ls,
              lq, ls == lq ? " (gradients differ)" : "");
        CHECK(q4s == q4q && q4s > 0, "%s: 4-bit weights %zu (stored) vs %zu (on load)", src, q4s, q4q);
        ct_model m;
        ct_error err = {0};
        ct_backend *be = backend_cpu_new();
        CHECK(model_load_with(&m, be, dst, &opt, &err) == CT_ERR_INPUT && strstr(err.msg, "already quantized"),
              "model_quantization on a 4-bit folder: %s", err.msg);
        be->destroy(be);
        free(gs); free(gq);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dst);
        if (system(cmd)) {}
    }
}

/* The gpt_oss fixture with intermediate_size 32: MXFP4 needs whole blocks of 32 inputs. */
static const char *gpt_oss_json(void)
{
    static char json[2048];
    const char *at = strstr(fixture_gpt_oss_json, "\"intermediate_size\": 16");
    CT_ASSERT(at, "the gpt_oss fixture's intermediate_size");
    snprintf(json, sizeof json, "%.*s\"intermediate_size\": 32%s", (int)(at - fixture_gpt_oss_json), fixture_gpt_oss_json,
             at + strlen("\"intermediate_size\": 16"));
    return json;
}

TEST(gpt_oss_mxfp4_experts_equal_their_decoded_values)
{
    char mx[] = "/tmp/ctune_mxfp4_XXXXXX", dec[] = "/tmp/ctune_mxdec_XXXXXX";
    REQUIRE(mkdtemp(mx) && mkdtemp(dec), "mkdtemp");
    REQUIRE(write_mxfp4_pair(gpt_oss_dir, mx, dec) == 0, "writing the MXFP4 folders");
    float *gm = NULL, *gd = NULL;
    size_t nm, nd, q4m, q4d;
    double lm = lora_step(mx, NULL, &gm, &nm, &q4m, NULL), ld = lora_step(dec, NULL, &gd, &nd, &q4d, NULL);
    REQUIRE(isfinite(lm) && isfinite(ld) && nm == nd, "losses %g %g", lm, ld);
    CHECK(lm == ld, "loss %.9g (MXFP4) vs %.9g (decoded)", lm, ld);
    CHECK(!memcmp(gm, gd, nm * sizeof(float)), "LoRA gradients differ between the MXFP4 and the decoded folder");
    CHECK(q4m > 0 && q4d == 0, "4-bit weights: %zu (MXFP4), %zu (decoded)", q4m, q4d);
    free(gm); free(gd);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", mx, dec);
    if (system(cmd)) {}
}

TEST(nf4_on_load_equals_bitsandbytes_rounding_llama)
{
    check_on_load(llama_dir, QUANT4_NF4, 64, true, true);
}

TEST(fp4_without_double_quant_blocksize_32)
{
    check_on_load(llama_dir, QUANT4_FP4, 32, false, true);
}

TEST(qwen3_5_gated_q_rows_move_in_4_bits)
{
    /* blocksize 32 divides H = 32: q_proj's rows move as whole blocks */
    check_on_load("tests/fixtures/parity_qwen3_5/model", QUANT4_NF4, 32, true, true);
}

TEST(qwen3_5_blocks_spanning_moved_rows_round_at_load)
{
    /* blocksize 64 > H: gated q_proj's rows cannot move as blocks (rounded at load), the rest are 4-bit */
    check_on_load("tests/fixtures/parity_qwen3_5/model", QUANT4_NF4, 64, true, true);
}

TEST(qwen3_next_grouped_projections_and_shared_expert)
{
    check_on_load("tests/fixtures/parity_qwen3_next/model", QUANT4_NF4, 32, true, true);
}

TEST(moe_experts_stay_bf16_like_transformers_5)
{
    check_on_load(qwen3_moe_dir, QUANT4_NF4, 32, true, true);
}

TEST(quantization_configs_other_than_4_bit_are_refused)
{
    static const char *const cases[][2] = {
        {"{\"quant_method\": \"gptq\", \"bits\": 4}", "'gptq' is not supported"},
        {"{\"quant_method\": \"bitsandbytes\", \"load_in_8bit\": true}", "8-bit"},
        {"{\"load_in_4bit\": true}", "no quant_method"},
        {"[1]", "expected an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1200];
        snprintf(json, sizeof json, "%.*s, \"quantization_config\": %s}", (int)strlen(fixture_llama_json) - 1,
                 fixture_llama_json, cases[i][0]);
        ct_model_config mc;
        ct_error err = {0};
        CHECK(model_config_parse(&mc, json, strlen(json), "config.json", &err) == CT_ERR_INPUT &&
                  strstr(err.msg, cases[i][1]),
              "case %zu: %s", i, err.msg);
    }
}

int main(void)
{
    snprintf(llama_dir, sizeof llama_dir, "/tmp/ctune_qlora_llama_XXXXXX");
    snprintf(qwen3_moe_dir, sizeof qwen3_moe_dir, "/tmp/ctune_qlora_moe_XXXXXX");
    snprintf(gpt_oss_dir, sizeof gpt_oss_dir, "/tmp/ctune_qlora_gptoss_XXXXXX");
    CT_ASSERT(mkdtemp(llama_dir) && mkdtemp(qwen3_moe_dir) && mkdtemp(gpt_oss_dir), "mkdtemp");
    CT_ASSERT(!fixture_write_model(llama_dir, fixture_llama_json, 5) &&
                  !fixture_write_model(qwen3_moe_dir, fixture_qwen3_moe_json, 6) &&
                  !fixture_write_model(gpt_oss_dir, gpt_oss_json(), 8),
              "fixture models");
    RUN(nf4_on_load_equals_bitsandbytes_rounding_llama);
    RUN(fp4_without_double_quant_blocksize_32);
    RUN(qwen3_5_gated_q_rows_move_in_4_bits);
    RUN(qwen3_5_blocks_spanning_moved_rows_round_at_load);
    RUN(qwen3_next_grouped_projections_and_shared_expert);
    RUN(moe_experts_stay_bf16_like_transformers_5);
    RUN(quantization_configs_other_than_4_bit_are_refused);
    RUN(gpt_oss_mxfp4_experts_equal_their_decoded_values);
    RUN(a_stored_4_bit_folder_equals_quantizing_on_load);
    RUN(skipped_modules_experts_and_bf16_storage_load_as_stored);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s %s", llama_dir, qwen3_moe_dir, gpt_oss_dir);
    if (system(cmd)) {}
    return check_summary();
}
