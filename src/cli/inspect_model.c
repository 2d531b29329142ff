/* inspect_model.c — `ctune inspect MODEL_DIR`: what the config describes, what
 * it costs (parameters, FLOP-relevant N, a training memory estimate), and whether
 * the safetensors in the folder match it and hold finite values only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "memory_plan.h"
#include "model.h"
#include "model_config.h"
#include "quant4_write.h"
#include "safetensors.h"

#define EST_LORA_RANK 16
#define EST_TOKENS 16384 /* tokens per micro-batch */

static const char *rope_name(ct_rope_type t)
{
    switch (t) {
    case CT_ROPE_DEFAULT: return "default";
    case CT_ROPE_LINEAR: return "linear";
    case CT_ROPE_DYNAMIC: return "dynamic (= default at trained lengths)";
    case CT_ROPE_LLAMA3: return "llama3";
    case CT_ROPE_YARN: return "yarn";
    }
    return "?";
}

static double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

/* 836.7K, 596.0M, 8.03B: counts span six orders of magnitude across models. */
static const char *human(char *buf, size_t cap, double n)
{
    if (n >= 1e9) snprintf(buf, cap, "%.2fB", n * 1e-9);
    else if (n >= 1e6) snprintf(buf, cap, "%.1fM", n * 1e-6);
    else snprintf(buf, cap, "%.1fK", n * 1e-3);
    return buf;
}

/* Training memory for LoRA r16 on every linear weight (lm_head excluded) on the
 * CUDA backend, EST_TOKENS tokens per micro-batch, checkpointing on, no offload:
 *   weights     = 2 B x total parameters (bf16)
 *   LoRA        = 16 B x R x sum(d_in + d_out) over adapted matrices, experts one by one
 *                 (fp32 weight, gradient, Adam m and v)
 *   activations = what `ctune train` would allocate: graph_measure, the layout code
 *                 that allocates (saved layer inputs, one layer's working set,
 *                 backward scratch, batch metadata), plus the op workspace the
 *                 memory plan reserves (memory_plan_workspace, without LoRA terms).
 * The CUDA context and cuBLAS workspace are left out. */
static void print_memory_estimate(const ct_model_config *mc, const ct_param_counts *pc)
{
    size_t n;
    ct_tensor_spec *specs = model_tensor_specs(mc, &n);
    /* weights HF's bitsandbytes quantizes, those base_precision fp8 quantizes; the widest dense decode */
    double lora = 0, q4 = 0, f8 = 0, widest = 0;
    for (size_t i = 0; i < n; i++) {
        const ct_tensor_spec *s = &specs[i];
        if (quant4_should_quantize(s)) q4 += (double)model_tensor_numel(s);
        if (quant4_should_quantize(s) || (s->kind == CT_TENSOR_LINEAR && s->expert && s->ndim == 2))
            f8 += (double)model_tensor_numel(s);
        if (s->kind != CT_TENSOR_LINEAR) continue;
        /* [out, in] or, for fused experts, [E, in, out]: one matrix per leading index */
        double a = (double)s->shape[s->ndim - 2], b = (double)s->shape[s->ndim - 1];
        lora += (double)model_tensor_numel(s) / (a * b) * EST_LORA_RANK * (a + b);
    }
    free(specs);
    /* the shapes alone: a backend description with bf16 activations, no device */
    ct_backend shape_be = {.name = "cuda", .act_bytes = 2, .weight_bytes = 2};
    ct_model m = {.cfg = *mc, .be = &shape_be};
    ct_graph_options opt = {.capacity = EST_TOKENS, .checkpointing = true, .mlp_chunk = CT_MLP_CHUNK_TOKENS};
    ct_graph_sizes g;
    graph_measure(&m, &opt, &g);
    double weights = 2.0 * (double)pc->total, lora_b = 16.0 * lora;
    double saved = (double)g.saved_device, working = (double)(g.working + g.batch);
    double workspace = (double)memory_plan_workspace(&m, NULL, EST_TOKENS);
    char b[32];
    printf("  memory (plan)   %.3g GiB for LoRA r%d all-linear, %d tokens/micro-batch, checkpointing:\n",
           gib(weights + lora_b + saved + working + workspace), EST_LORA_RANK, EST_TOKENS);
    printf("                  weights %.3g + LoRA/Adam %.3g (%s params) + saved layer inputs %.3g"
           " + working set %.3g + workspace %.3g GiB\n",
           gib(weights), gib(lora_b), human(b, sizeof b, lora), gib(saved), gib(working), gib(workspace));
    if (q4 > 0 || f8 > 0) {
        /* the fused weights model_weight decodes: q|k|v (or the GDN input), gate|up */
        double H = mc->hidden_size, D = mc->head_dim;
        double qkv = ((mc->attn_output_gate ? 2 : 1) * mc->num_attention_heads + 2 * mc->num_key_value_heads) * D * H;
        int widest_mlp = mc->intermediate_size > mc->shared_expert_intermediate_size ? mc->intermediate_size
                                                                                     : mc->shared_expert_intermediate_size;
        double gu = 2.0 * widest_mlp * H;
        widest = qkv > gu ? qkv : gu;
        if (mc->gdn && model_gdn_proj_dim(mc) * H > widest) widest = model_gdn_proj_dim(mc) * H;
        /* 4-bit codes + an fp32 absmax per 64 (model.h: ct_qweight) + the bf16 decode buffer */
        double w4 = 2.0 * ((double)pc->total - q4) + q4 * (0.5 + 4.0 / 64) + 2 * widest;
        printf("  memory (nf4)    %.3g GiB with model_quantization: nf4 (%s weights in 4 bits): weights %.3g GiB\n",
               gib(w4 + lora_b + saved + working + workspace), human(b, sizeof b, q4), gib(w4));
        /* E4M3 bytes + an fp32 scale per 128x128 block; a stack of routed experts decodes whole */
        double stack = f8 > q4 ? 2.0 * mc->num_experts * mc->moe_intermediate_size * H : 0;
        double w8 = 2.0 * ((double)pc->total - f8) + f8 * (1.0 + 4.0 / 16384) + 2 * (stack > widest ? stack : widest);
        printf("  memory (fp8)    %.3g GiB with base_precision: fp8 (%s weights in FP8): weights %.3g GiB\n",
               gib(w8 + lora_b + saved + working + workspace), human(b, sizeof b, f8), gib(w8));
    }
}

/* Non-finite values of a floating tensor (NaN or Inf: every exponent bit set);
 * 0 for other dtypes. The data is unaligned in the mmap, hence memcpy. */
static size_t count_nonfinite(const st_tensor *t)
{
    size_t bad = 0;
    const unsigned char *p = t->data;
    if (t->dtype == CT_DTYPE_BF16 || t->dtype == CT_DTYPE_F16) {
        uint16_t e = t->dtype == CT_DTYPE_BF16 ? 0x7f80 : 0x7c00;
#pragma omp parallel for reduction(+ : bad)
        for (size_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            bad += (h & e) == e;
        }
    } else if (t->dtype == CT_DTYPE_F32) {
#pragma omp parallel for reduction(+ : bad)
        for (size_t i = 0; i < t->numel; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            bad += (u & 0x7f800000u) == 0x7f800000u;
        }
    }
    return bad;
}

/* Every weight finite: a NaN in a checkpoint would make every loss NaN. */
static int check_finite(const st_reader *r, ct_error *err)
{
    size_t bad_tensors = 0, first_bad = 0;
    const st_tensor *first = NULL;
    for (size_t i = 0; i < st_count(r); i++) {
        size_t bad = count_nonfinite(st_at(r, i));
        if (!bad) continue;
        if (!first) {
            first = st_at(r, i);
            first_bad = bad;
        }
        bad_tensors++;
    }
    if (!first) return CT_OK;
    printf("weights: %zu non-finite values in %s%s\n", first_bad, first->name,
           bad_tensors > 1 ? " (and in other tensors)" : "");
    return CT_FAIL_INPUT(err, "%s: tensor %s has %zu non-finite values (NaN or Inf; %zu tensor%s affected)",
                         first->file, first->name, first_bad, bad_tensors, bad_tensors == 1 ? "" : "s");
}

static int check_weights(const char *dir, const ct_model_config *mc, ct_error *err)
{
    size_t len = strlen(dir) + 40;
    char *single = ct_malloc(len), *index = ct_malloc(len);
    snprintf(single, len, "%s/model.safetensors", dir);
    snprintf(index, len, "%s/model.safetensors.index.json", dir);
    bool any = access(single, F_OK) == 0 || access(index, F_OK) == 0; /* links that do not resolve were refused first */
    free(single);
    free(index);
    if (!any) {
        printf("weights: none (config only)\n");
        return CT_OK;
    }
    st_reader *r = st_open(dir, err);
    if (!r) return err ? err->code : CT_ERR_INPUT;
    int rc = model_check_weights(mc, r, err);
    if (rc == CT_OK) rc = check_finite(r, err);
    if (rc == CT_OK) {
        size_t bytes = 0;
        for (size_t i = 0; i < st_count(r); i++) bytes += st_at(r, i)->nbytes;
        printf("weights: ok (%zu tensors, %.3g GB, all finite)\n", st_count(r), 1e-9 * (double)bytes);
    }
    st_close(r);
    return rc;
}

int inspect_model(const char *dir, ct_error *err)
{
    ct_model_config mc;
    int rc = cli_check_model_dir(dir, err); /* a link loop or a FIFO is an input error, before any reader */
    if (!rc) rc = model_config_load(&mc, dir, err);
    if (rc) return rc;
    const ct_rope_config *rp = &mc.rope;
    printf("model: %s\n", dir);
    printf("  architecture    %s (%s), %s\n", mc.model_type, mc.architectures[0] ? mc.architectures : "-", mc.torch_dtype);
    if (mc.quant_method != CT_QUANT_NONE)
        printf("  stored          %s (quantization_config; trained as stored: docs/quantization.md)\n",
               mc.quant_method == CT_QUANT_BNB4    ? "bitsandbytes 4-bit linear weights"
               : mc.quant_method == CT_QUANT_MXFP4 ? "MXFP4 experts"
                                                   : "FP8 (E4M3, 128x128 blocks) linear weights");
    if (mc.gdn) {
        int linear = 0;
        for (int l = 0; l < mc.num_hidden_layers; l++) linear += mc.layer_linear[l];
        printf("  layers          %d (%d Gated DeltaNet, %d gated full attention)\n", mc.num_hidden_layers, linear,
               mc.num_hidden_layers - linear);
    } else {
        printf("  layers          %d\n", mc.num_hidden_layers);
    }
    printf("  hidden          %d\n", mc.hidden_size);
    printf("  heads           %d q / %d kv x head_dim %d (GQA %d:1)%s%s%s%s\n", mc.num_attention_heads,
           mc.num_key_value_heads, mc.head_dim, mc.num_attention_heads / mc.num_key_value_heads,
           mc.qk_norm ? ", q/k norm" : "", mc.attention_bias ? (mc.o_proj_bias ? ", q/k/v/o bias" : ", q/k/v bias") : "",
           mc.attention_sinks ? ", sinks" : "", mc.attn_output_gate ? ", sigmoid output gate" : "");
    if (mc.gdn) {
        printf("  linear attn     %d k / %d v heads x %d / %d (GVA %d:1), conv width %d, %s projections\n",
               mc.linear_num_key_heads, mc.linear_num_value_heads, mc.linear_key_head_dim, mc.linear_value_head_dim,
               mc.linear_num_value_heads / mc.linear_num_key_heads, mc.linear_conv_kernel_dim,
               mc.gdn_grouped_proj ? "grouped qkvz/ba" : "contiguous qkv/z/b/a");
        printf("  norms           zero-centred RMSNorm (1 + w); gated RMSNorm on GDN output\n");
        printf("  tensors         under %s%s\n", mc.tensor_prefix,
               strcmp(mc.tensor_prefix, "model.") ? " (multimodal wrapper; vision tower ignored)" : "");
        if (mc.mtp_num_hidden_layers > 0)
            printf("  mtp             %d layer%s (not read; HF drops them too)\n", mc.mtp_num_hidden_layers,
                   mc.mtp_num_hidden_layers == 1 ? "" : "s");
    }
    if (mc.intermediate_size > 0) printf("  intermediate    %d\n", mc.intermediate_size);
    else printf("  intermediate    none (every layer MoE)\n");
    if (mc.num_experts > 0) {
        int sparse = 0;
        for (int l = 0; l < mc.num_hidden_layers; l++) sparse += mc.layer_sparse[l];
        printf("  experts         %d, top-%d, expert intermediate %d, %d of %d layers sparse", mc.num_experts,
               mc.num_experts_per_tok, mc.moe_intermediate_size, sparse, mc.num_hidden_layers);
        if (mc.shared_expert_intermediate_size > 0)
            printf(", gated shared expert %d", mc.shared_expert_intermediate_size);
        printf("\n");
    } else {
        printf("  experts         none (dense)\n");
    }
    printf("  vocab           %d (%s embeddings)\n", mc.vocab_size, mc.tie_word_embeddings ? "tied" : "untied");
    printf("  rope            %s, theta %g, rotary dim %d", rope_name(rp->type), rp->theta, model_rope_dim(&mc));
    if (rp->type != CT_ROPE_DEFAULT) printf(", factor %g", rp->factor);
    if (rp->type == CT_ROPE_LLAMA3 || rp->type == CT_ROPE_YARN)
        printf(", original max positions %d", rp->original_max_position_embeddings);
    if (mc.mrope_section[0] + mc.mrope_section[1] + mc.mrope_section[2] > 0)
        printf(", mrope [%d, %d, %d]%s (text: plain partial rope)", mc.mrope_section[0], mc.mrope_section[1],
               mc.mrope_section[2], mc.mrope_interleaved ? " interleaved" : "");
    printf("\n");
    if (mc.sliding_window > 0) {
        int sliding = 0;
        for (int l = 0; l < mc.num_hidden_layers; l++) sliding += mc.layer_sliding[l];
        printf("  sliding window  %d on %d of %d layers\n", mc.sliding_window, sliding, mc.num_hidden_layers);
    }
    ct_param_counts pc = model_param_counts(&mc);
    char b1[32], b2[32], b3[32];
    printf("  parameters      total %s, embedding %s, per-token active (N) %s\n", human(b1, sizeof b1, (double)pc.total),
           human(b2, sizeof b2, (double)pc.embedding), human(b3, sizeof b3, (double)pc.per_token_active));
    print_memory_estimate(&mc, &pc);
    return check_weights(dir, &mc, err);
}
