/* cmd_merge.c — `ctune merge`: base model + LoRA adapter -> a merged model folder
 * that loads anywhere a plain HF checkpoint does (no PEFT needed).
 *
 * For every adapter pair lora_A (R, in), lora_B (out, R) of module M, the base
 * tensor M.weight (out, in) becomes bf16(W + (B @ A) * scaling), with the product
 * and the sum in fp32 and one rounding at the end (PEFT rounds the delta to the
 * weight dtype first, then adds: two roundings). scaling = alpha / r, or
 * alpha / sqrt(r) with rsLoRA, from adapter_config.json. Every other floating
 * tensor is written as bf16 too; integer tensors are copied as they are. A
 * lora_B's rows are in its base weight's row order (PEFT's, and ctune's on disk:
 * it permutes gated attention's q_proj and qwen3_next's grouped in_proj_qkvz /
 * in_proj_ba only in memory), so every pair merges row for row, whatever the
 * weight's layout.
 *
 * gpt_oss's experts are 3-D parameters [E, in, out] (for x @ W), adapted in
 * PEFT's target_parameters layout (docs/ARCHITECTURE.md, "PEFT adapters"): one
 * pair per parameter,
 * lora_A [R*E, in] with expert e's rows at e*R, lora_B [out, R*E] with expert
 * e's column j at j*E + e; W[e] gains (B_e @ A_e)^T * scaling. The pair's keys
 * name the experts module: "experts.base_layer" is gate_up_proj when both
 * parameters are targeted (PEFT nests its wrapper inside down_proj's), plain
 * "experts" is down_proj, or the one parameter targeted.
 *
 * A 4-bit base (bitsandbytes NF4/FP4 Linear4bit tensors) merges as PEFT's
 * merge does: each 4-bit weight is decoded (code * absmax, fp32) and written
 * in bf16, with its delta when adapted; its quant_state tensors are dropped
 * and config.json loses its quantization_config, so the output is a plain
 * bf16 checkpoint. An FP8 base the same way: decode(q) * scale_inv, its
 * weight_scale_inv tensors dropped.
 *
 * The output keeps the input's layout: the same tensor names in files of the
 * same names (one model.safetensors, or the shards plus a rewritten
 * model.safetensors.index.json), and a copy of every other file of the model
 * folder (config.json, tokenizer files). Memory: one shard at a time. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adapter.h"
#include "commands.h"
#include "json.h"
#include "fp8.h"
#include "quant4.h"
#include "safetensors.h"

#define INDEX_NAME "model.safetensors.index.json"

typedef struct merge_pair {
    const st_tensor *base, *A, *B;
    int experts;          /* > 0: base is an expert parameter [experts, in, out] */
} merge_pair;

/* The suffixes of a bitsandbytes 4-bit weight's quant_state tensors. */
static const char *const quant_state_suffixes[] = {
    ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".quant_state.bitsandbytes__nf4",
    ".quant_state.bitsandbytes__fp4"};

/* A weight of r stored quantized (bitsandbytes 4-bit or FP8), written in bf16. */
static bool is_quantized(const st_reader *r, const char *name)
{
    return quant4_is_quantized(r, name) || fp8_is_quantized(r, name);
}

/* True when NAME is part of the quant_state of a 4-bit weight of r, or the
 * scale_inv of an FP8 one. */
static bool is_quant_state(const st_reader *r, const char *name)
{
    size_t n = strlen(name);
    static const char fp8_scale[] = "_scale_inv";
    if (n > sizeof fp8_scale - 1 && !strcmp(name + n - (sizeof fp8_scale - 1), fp8_scale)) {
        char w[1024];
        snprintf(w, sizeof w, "%.*s", (int)(n - (sizeof fp8_scale - 1)), name);
        if (fp8_is_quantized(r, w)) return true;
    }
    for (size_t i = 0; i < sizeof quant_state_suffixes / sizeof quant_state_suffixes[0]; i++) {
        size_t k = strlen(quant_state_suffixes[i]);
        if (n <= k || strcmp(name + n - k, quant_state_suffixes[i])) continue;
        char w[1024];
        snprintf(w, sizeof w, "%.*s", (int)(n - k), name);
        if (quant4_is_quantized(r, w)) return true;
    }
    return false;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}


static bool is_float(ct_dtype d) { return d == CT_DTYPE_BF16 || d == CT_DTYPE_F16 || d == CT_DTYPE_F32; }

/* A float tensor as fp32 (caller frees); the mmap'd data need not be aligned. */
static float *to_f32(const st_tensor *t)
{
    float *out = ct_malloc(t->numel * sizeof(float) + 4);
    const unsigned char *s = t->data;
    for (size_t i = 0; i < t->numel; i++) {
        if (t->dtype == CT_DTYPE_F32) {
            memcpy(&out[i], s + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            out[i] = t->dtype == CT_DTYPE_BF16 ? ct_bf16_to_f32(h) : ct_f16_to_f32(h);
        }
    }
    return out;
}

/* The base tensor's values as fp32 (a 4-bit or FP8 weight decoded) and its
 * shape; NULL (err set) when its quant_state or scales are broken. */
static float *base_f32(const st_reader *r, const st_tensor *t, int *ndim, int64_t *shape, ct_error *err)
{
    if (fp8_is_quantized(r, t->name) && t->ndim == 2) {
        size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
        float *s = ct_malloc(fp8_blocks(rows) * fp8_blocks(cols) * sizeof(float)), *v = NULL;
        const uint8_t *q;
        if (!fp8_read_weight(r, t->name, t->shape[0], t->shape[1], &q, s, err)) {
            v = ct_malloc(rows * cols * sizeof(float));
            fp8_dequantize_blocks(v, q, s, rows, cols);
            *ndim = 2;
            memcpy(shape, t->shape, 2 * sizeof(int64_t));
        }
        free(s);
        return v;
    }
    if (!quant4_is_quantized(r, t->name)) {
        *ndim = t->ndim;
        memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        return to_f32(t);
    }
    quant4_info info;
    float *v;
    if (quant4_load_f32(r, t->name, &info, &v, err)) return NULL;
    *ndim = info.ndim;
    memcpy(shape, info.shape, sizeof(int64_t) * (size_t)info.ndim);
    return v;
}

static bool targets(const ct_lora_config *lc, const char *projection)
{
    for (int k = 0; k < lc->n_target_modules; k++)
        if (!strcmp(lc->target_modules[k], projection)) return true;
    return false;
}

/* The base parameter a target_parameters pair adapts (see the file comment):
 * writes its name to name and its projection (gate_proj for gate_up_proj) to
 * *projection; NULL when module names no experts module. */
static const st_tensor *expert_param(const st_reader *base, const char *module, const ct_lora_config *lc,
                                     char *name, size_t len, const char **projection)
{
    static const char inner[] = ".experts.base_layer", outer[] = ".experts";
    size_t n = strlen(module);
    bool gate_up;
    if (has_suffix(module, inner)) {
        n -= sizeof inner - 1 - (sizeof outer - 1);
        gate_up = true;
    } else if (has_suffix(module, outer)) {
        gate_up = !targets(lc, "down_proj");
    } else {
        return NULL;
    }
    *projection = gate_up ? "gate_proj" : "down_proj";
    snprintf(name, len, "%.*s.%s", (int)n, module, gate_up ? "gate_up_proj" : "down_proj");
    return st_find(base, name);
}

/* Checks the shapes of a pair against its base tensor: 2-D A (R, in), B (out, R)
 * on W (out, in), or the target_parameters layout on an expert parameter. */
static bool pair_fits(const st_tensor *A, const st_tensor *B, const st_tensor *W, int R, bool expert)
{
    if (A->ndim != 2 || B->ndim != 2) return false;
    if (!expert)
        return W->ndim == 2 && A->shape[0] == R && B->shape[1] == R && A->shape[1] == W->shape[1] &&
               B->shape[0] == W->shape[0];
    /* an expert count of 0 (a crafted file) would divide by zero in the merge */
    int64_t RE = W->ndim == 3 && W->shape[0] > 0 && W->shape[0] <= 1 << 16 ? (int64_t)R * W->shape[0] : -1;
    return RE > 0 && A->shape[0] == RE && B->shape[1] == RE && A->shape[1] == W->shape[1] &&
           B->shape[0] == W->shape[2];
}

static void format_shape(char *buf, size_t cap, const st_tensor *t)
{
    size_t off = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && off < cap; d++)
        off += (size_t)snprintf(buf + off, cap - off, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (off < cap) snprintf(buf + off, cap - off, "]");
}

/* Pairs every lora_A/lora_B of the adapter with its base tensor, checking names,
 * shapes and the configured rank and targets. */
static int match_pairs(const st_reader *base, const st_reader *ad, const char *ad_path, const ct_lora_config *lc,
                       merge_pair **pairs_out, size_t *n_out, ct_error *err)
{
    static const char prefix[] = "base_model.model.";
    size_t n = st_count(ad), np = 0;
    merge_pair *pairs = ct_calloc(n + 1, sizeof *pairs);
    int rc = CT_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        const st_tensor *t = st_at(ad, i);
        if (strncmp(t->name, prefix, sizeof prefix - 1) ||
            !(has_suffix(t->name, ".lora_A.weight") || has_suffix(t->name, ".lora_B.weight"))) {
            rc = CT_FAIL_INPUT(err, "%s: tensor '%s' is not a PEFT LoRA weight "
                               "(base_model.model.MODULE.lora_A.weight or .lora_B.weight)", ad_path, t->name);
            break;
        }
        if (has_suffix(t->name, ".lora_B.weight")) continue; /* found from its A */
        char module[512], name[600];
        size_t len = strlen(t->name) - (sizeof prefix - 1) - strlen(".lora_A.weight");
        if (len >= sizeof module) {
            rc = CT_FAIL_INPUT(err, "%s: tensor name '%s' is too long", ad_path, t->name);
            break;
        }
        memcpy(module, t->name + sizeof prefix - 1, len);
        module[len] = 0;
        snprintf(name, sizeof name, "%s%s.lora_B.weight", prefix, module);
        const st_tensor *B = st_find(ad, name);
        snprintf(name, sizeof name, "%s.weight", module);
        const st_tensor *W = st_find(base, name);
        /* A multimodal wrapper (qwen3_5, qwen3_5_moe) keeps its language model under
         * model.language_model.; PEFT names the modules of its causal-LM class,
         * which loads that prefix as model. (transformers' key mapping). */
        if (!W && !strncmp(module, "model.", 6)) {
            snprintf(name, sizeof name, "model.language_model.%s.weight", module + 6);
            if (!(W = st_find(base, name))) snprintf(name, sizeof name, "%s.weight", module);
        }
        const char *leaf = strrchr(module, '.') ? strrchr(module, '.') + 1 : module;
        const char *projection = config_canonical_module(leaf);
        if (!W) {
            const st_tensor *P = expert_param(base, module, lc, name, sizeof name, &projection);
            W = P && P->ndim == 3 ? P : NULL;
        }
        bool expert = W && W->ndim == 3;
        char ws[64], as[64], bs[64];
        st_tensor Wv; /* W as its values read: a 4-bit weight's real shape */
        quant4_info qi;
        bool q4 = W && quant4_is_quantized(base, W->name);
        if (W) Wv = *W;
        if (q4 && !(rc = quant4_read_info(base, W->name, &qi, err))) {
            Wv.ndim = qi.ndim;
            memcpy(Wv.shape, qi.shape, sizeof qi.shape);
            Wv.dtype = CT_DTYPE_F32;
        }
        if (W && fp8_is_quantized(base, W->name)) Wv.dtype = CT_DTYPE_F32; /* decoded by base_f32 */
        if (rc) break;
        if (!B) rc = CT_FAIL_INPUT(err, "%s: '%s' has no lora_B", ad_path, t->name);
        else if (!W) rc = CT_FAIL_INPUT(err, "%s: the base model has no tensor '%s' for '%s'", ad_path, name, t->name);
        else if (!targets(lc, projection))
            rc = CT_FAIL_INPUT(err, "%s: '%s' is not in adapter_config.json's %s", ad_path, t->name,
                               expert ? "target_parameters" : "target_modules");
        else if (!is_float(t->dtype) || !is_float(B->dtype) || !is_float(Wv.dtype))
            rc = CT_FAIL_INPUT(err, "%s: '%s': LoRA and base weights must be BF16, F16 or F32 (or bitsandbytes 4-bit, or FP8)",
                               ad_path, module);
        else if (!pair_fits(t, B, &Wv, lc->r, expert)) {
            format_shape(as, sizeof as, t);
            format_shape(bs, sizeof bs, B);
            format_shape(ws, sizeof ws, &Wv);
            rc = CT_FAIL_INPUT(err, "%s: '%s': lora_A %s and lora_B %s do not fit the base weight %s '%s' with r = %d",
                               ad_path, module, as, bs, ws, W->name, lc->r);
        } else {
            pairs[np++] = (merge_pair){W, t, B, expert ? (int)W->shape[0] : 0};
        }
    }
    /* Every B must have had its A. */
    for (size_t i = 0; i < n && !rc; i++) {
        const st_tensor *t = st_at(ad, i);
        if (!has_suffix(t->name, ".lora_B.weight")) continue;
        bool found = false;
        for (size_t k = 0; k < np && !found; k++) found = pairs[k].B == t;
        if (!found) rc = CT_FAIL_INPUT(err, "%s: '%s' has no lora_A", ad_path, t->name);
    }
    if (!rc && np == 0) rc = CT_FAIL_INPUT(err, "%s: holds no LoRA weights", ad_path);
    if (rc) {
        free(pairs);
        return rc;
    }
    *pairs_out = pairs;
    *n_out = np;
    return CT_OK;
}

/* bf16(W + (B @ A) * scale), each element's product summed in fp32 over r. */
static uint16_t *merged_weight(const merge_pair *p, const float *W, const int64_t *shape, float scale)
{
    size_t out = (size_t)shape[0], in = (size_t)shape[1], R = (size_t)p->A->shape[0];
    float *A = to_f32(p->A), *B = to_f32(p->B);
    uint16_t *merged = ct_malloc(out * in * sizeof(uint16_t));
    #pragma omp parallel
    {
        float *delta = ct_malloc(in * sizeof(float));
        #pragma omp for schedule(static)
        for (size_t o = 0; o < out; o++) {
            memset(delta, 0, in * sizeof(float));
            for (size_t r = 0; r < R; r++) {
                float b = B[o * R + r];
                const float *a = A + r * in;
                for (size_t i = 0; i < in; i++) delta[i] += b * a[i];
            }
            for (size_t i = 0; i < in; i++) merged[o * in + i] = ct_f32_to_bf16(W[o * in + i] + delta[i] * scale);
        }
        free(delta);
    }
    free(A);
    free(B);
    return merged;
}

/* An expert parameter [E, in, out]: bf16(W[e] + (B_e @ A_e)^T * scale), with
 * A_e = rows e*R.. of A [R*E, in] and B_e = columns j*E + e of B [out, R*E]. */
static uint16_t *merged_expert_param(const merge_pair *p, float scale)
{
    size_t E = (size_t)p->experts, in = (size_t)p->base->shape[1], out = (size_t)p->base->shape[2];
    size_t R = (size_t)p->A->shape[0] / E;
    float *W = to_f32(p->base), *A = to_f32(p->A), *B = to_f32(p->B);
    uint16_t *merged = ct_malloc(E * in * out * sizeof(uint16_t));
    #pragma omp parallel for schedule(static)
    for (size_t ei = 0; ei < E * in; ei++) {
        size_t e = ei / in, i = ei % in;
        for (size_t o = 0; o < out; o++) {
            float delta = 0;
            for (size_t j = 0; j < R; j++) delta += B[o * R * E + j * E + e] * A[(e * R + j) * in + i];
            merged[ei * out + o] = ct_f32_to_bf16(W[ei * out + o] + delta * scale);
        }
    }
    free(W);
    free(A);
    free(B);
    return merged;
}

/* Adds t to w as bf16 (merged with its pair when it has one) or, for integer
 * tensors, as it is. Returns the bytes written. */
static int add_tensor(st_writer *w, const st_reader *r, const st_tensor *t, const merge_pair *pairs, size_t np,
                      float scale, size_t *bytes, ct_error *err)
{
    const merge_pair *p = NULL;
    for (size_t k = 0; k < np && !p; k++)
        if (pairs[k].base == t) p = &pairs[k];
    if (is_quant_state(r, t->name)) return CT_OK; /* its weight is written in bf16 */
    bool q4 = is_quantized(r, t->name);
    if (!is_float(t->dtype) && !q4) {
        *bytes += t->nbytes;
        return st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, err);
    }
    uint16_t *data;
    int ndim = t->ndim;
    int64_t shape[ST_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    size_t numel = t->numel;
    if (p && p->experts) {
        data = merged_expert_param(p, scale);
    } else if (p || q4) {
        float *W = base_f32(r, t, &ndim, shape, err);
        if (!W) return err->code;
        numel = 1;
        for (int d = 0; d < ndim; d++) numel *= (size_t)shape[d];
        if (p) {
            data = merged_weight(p, W, shape, scale);
        } else {
            data = ct_malloc(numel * sizeof(uint16_t) + 2);
            for (size_t i = 0; i < numel; i++) data[i] = ct_f32_to_bf16(W[i]);
        }
        free(W);
    } else {
        data = ct_malloc(t->numel * sizeof(uint16_t) + 2);
        if (t->dtype == CT_DTYPE_BF16) {
            memcpy(data, t->data, t->nbytes);
        } else {
            float *f = to_f32(t);
            for (size_t i = 0; i < t->numel; i++) data[i] = ct_f32_to_bf16(f[i]);
            free(f);
        }
    }
    /* A merged model must not be written with NaN or Inf in it (an adapter's
     * huge lora_alpha, a broken base): cheap to count here, costly to find later. */
    size_t bad = 0;
    for (size_t i = 0; i < numel; i++) bad += (data[i] & 0x7f80) == 0x7f80;
    if (bad) {
        free(data);
        if (p)
            return CT_FAIL_INPUT(err, "%s: merging the adapter gives %zu non-finite values of %zu (scaling %g from "
                                 "the adapter's lora_alpha and r; expected a finite merged weight)", t->name, bad,
                                 numel, (double)scale);
        return CT_FAIL_INPUT(err, "%s: the base model holds %zu non-finite values of %zu (expected finite weights)",
                             t->name, bad, numel);
    }
    *bytes += numel * 2;
    int rc = st_writer_add(w, t->name, CT_DTYPE_BF16, ndim, shape, data, err);
    free(data);
    return rc;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static bool is_regular(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* One past the end of the JSON value that starts at text[i] (a string, an
 * object, an array, or a scalar ended by a comma, a bracket or a space). */
static size_t json_skip(const char *text, size_t len, size_t i)
{
    int depth = 0;
    for (; i < len; i++) {
        char ch = text[i];
        if (ch == '"') { /* to the closing quote */
            for (i++; i < len && text[i] != '"'; i++)
                if (text[i] == '\\') i++;
            if (depth == 0) return i + 1;
        } else if (ch == '{' || ch == '[') {
            depth++;
        } else if (ch == '}' || ch == ']') {
            if (depth == 0) return i;
            if (--depth == 0) return i + 1;
        } else if (depth == 0 && (ch == ',' || ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t')) {
            return i;
        }
    }
    return len;
}

/* config.json without its top-level "quantization_config" member (the merged
 * weights are bf16): the text is kept as written otherwise. *len is updated. */
static void strip_quantization_config(char *text, size_t *len)
{
    static const char key[] = "\"quantization_config\"";
    size_t n = *len, i = 0;
    int depth = 0;
    size_t last_sep = 0; /* the ',' or '{' before the current member */
    while (i < n) {
        char ch = text[i];
        if (ch == '"') {
            size_t end = json_skip(text, n, i);
            if (depth == 1 && end - i == sizeof key - 1 && !memcmp(text + i, key, sizeof key - 1)) {
                size_t v = end;
                while (v < n && (text[v] == ' ' || text[v] == ':' || text[v] == '\n' || text[v] == '\t')) v++;
                size_t vend = json_skip(text, n, v), cut0 = last_sep, cut1 = vend;
                if (text[last_sep] == '{') { /* the first member: drop the comma after it instead */
                    cut0 = last_sep + 1;
                    while (cut1 < n && text[cut1] != ',' && text[cut1] != '}') cut1++;
                    if (cut1 < n && text[cut1] == ',') cut1++;
                }
                memmove(text + cut0, text + cut1, n - cut1);
                *len = n - (cut1 - cut0);
                return;
            }
            i = end;
            continue;
        }
        if (ch == '{' || ch == '[') {
            if (++depth == 1) last_sep = i;
        } else if (ch == '}' || ch == ']') {
            depth--;
        } else if (ch == ',' && depth == 1) {
            last_sep = i;
        }
        i++;
    }
}

/* Copies every other plain file of the model folder (config.json, tokenizer
 * files, generation_config.json): the merged folder is a complete model. */
static int copy_side_files(const char *model, const char *out, ct_error *err)
{
    DIR *d = opendir(model);
    if (!d) return CT_FAIL_INPUT(err, "%s: cannot list the folder", model);
    struct dirent *e;
    int rc = CT_OK;
    while (!rc && (e = readdir(d))) {
        if (e->d_name[0] == '.' || has_suffix(e->d_name, ".safetensors") || !strcmp(e->d_name, INDEX_NAME)) continue;
        char src[CT_PATH_MAX + 300], dst[CT_PATH_MAX + 300];
        snprintf(src, sizeof src, "%s/%s", model, e->d_name);
        snprintf(dst, sizeof dst, "%s/%s", out, e->d_name);
        if (!is_regular(src)) continue;
        size_t len;
        char *data = ct_read_file(src, &len, err);
        if (data && !strcmp(e->d_name, "config.json")) strip_quantization_config(data, &len);
        if (!data) rc = err->code;
        else rc = ct_write_file_atomic(dst, data, len, err);
        free(data);
    }
    closedir(d);
    return rc;
}

static int write_index(const st_reader *base, const char *out, size_t total, ct_error *err)
{
    json_writer j;
    json_writer_init(&j);
    json_write_rawf(&j, "{\n  \"metadata\": {\n    \"total_size\": %zu\n  },\n  \"weight_map\": {", total);
    for (size_t i = 0, k = 0; i < st_count(base); i++) {
        const st_tensor *t = st_at(base, i);
        if (is_quant_state(base, t->name)) continue;
        json_write_raw(&j, k++ ? ",\n    " : "\n    ");
        json_write_string(&j, t->name);
        json_write_raw(&j, ": ");
        json_write_string(&j, base_name(t->file));
    }
    json_write_raw(&j, "\n  }\n}\n");
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/" INDEX_NAME, out);
    int rc = ct_write_file_atomic(path, j.buf, j.len, err);
    json_writer_free(&j);
    return rc;
}

/* One output file per input file, in the order of the sorted tensor names. */
static int write_files(const st_reader *base, const char *out, const merge_pair *pairs, size_t np, float scale,
                       size_t *total, ct_error *err)
{
    size_t n = st_count(base), n_files = 0;
    const char **files = ct_calloc(n + 1, sizeof *files);
    for (size_t i = 0; i < n; i++) {
        const char *f = st_at(base, i)->file;
        bool seen = false;
        for (size_t k = 0; k < n_files && !seen; k++) seen = !strcmp(files[k], f);
        if (!seen) files[n_files++] = f;
    }
    int rc = CT_OK;
    for (size_t k = 0; k < n_files && !rc; k++) {
        st_writer *w = st_writer_new();
        size_t count = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            const st_tensor *t = st_at(base, i);
            if (strcmp(t->file, files[k])) continue;
            rc = add_tensor(w, base, t, pairs, np, scale, total, err);
            count += !is_quant_state(base, t->name);
        }
        char path[CT_PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", out, base_name(files[k]));
        if (!rc) rc = st_writer_save(w, path, err);
        if (!rc) fprintf(stderr, "merge: %s: %zu tensors written\n", base_name(files[k]), count);
        st_writer_free(w);
    }
    free(files);
    return rc;
}

/* Every file goes into OUT.partial, which becomes OUT by one rename once it is
 * complete: a merge that stops half way (a full disk, a kill) leaves no folder
 * that looks like a model, and the next try clears the stale OUT.partial. */
static int write_merged(const st_reader *base, const char *model, const char *out, const merge_pair *pairs,
                        size_t np, float scale, ct_error *err)
{
    /* OUT/ names OUT: without the slash, OUT.partial is a sibling, not a child */
    char dir[CT_PATH_MAX], tmp[CT_PATH_MAX + 16], single[CT_PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s", out);
    for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--) dir[n - 1] = 0;
    out = dir;
    snprintf(tmp, sizeof tmp, "%s.partial", out);
    ct_remove_tree(tmp);
    size_t total = 0;
    int rc = ct_mkdirs(tmp, err);
    if (!rc) rc = write_files(base, tmp, pairs, np, scale, &total, err);
    snprintf(single, sizeof single, "%s/model.safetensors", model);
    if (!rc && !is_regular(single)) rc = write_index(base, tmp, total, err);
    if (!rc) rc = copy_side_files(model, tmp, err);
    if (!rc && rmdir(out) != 0 && errno != ENOENT)
        rc = CT_FAIL_RUNTIME(err, "%s: cannot replace the empty folder (%s)", out, strerror(errno));
    if (!rc && rename(tmp, out) != 0)
        rc = CT_FAIL_RUNTIME(err, "%s: cannot rename to %s (%s)", tmp, out, strerror(errno));
    if (rc) ct_remove_tree(tmp);
    return rc;
}

int cmd_merge(int argc, char **argv, ct_error *err)
{
    const char *model = NULL, *adapter = NULL, *out = NULL;
    const cli_opt opts[] = {
        {"--model", "DIR", "the base model folder (config.json + safetensors)", .str = &model, .required = true},
        {"--adapter", "DIR", "the PEFT LoRA adapter folder", .str = &adapter, .required = true},
        {"--out", "DIR", "the merged model folder to write (new or empty)", .str = &out, .required = true},
        {0}};
    const cli_cmd cmd = {"merge", "merge --model DIR --adapter DIR --out DIR", opts};
    int rc = cli_parse(&cmd, argc, argv, NULL, err);
    if (rc) return rc;
    if (!*out || strlen(out) >= CT_PATH_MAX) return CT_FAIL_INPUT(err, "--out: an empty or over-long folder name");
    /* a FIFO among the inputs is refused here rather than block a reader */
    if ((rc = cli_check_model_dir(model, err)) || (rc = cli_check_adapter_dir(adapter, err))) return rc;
    ct_lora_config lc;
    rc = adapter_read_config(adapter, &lc, err);
    if (rc) return rc;
    float scale = (float)config_lora_scaling(&lc);
    st_reader *base = st_open(model, err);
    if (!base) return err->code;
    char ad_path[CT_PATH_MAX + 64];
    snprintf(ad_path, sizeof ad_path, "%s/adapter_model.safetensors", adapter);
    st_reader *ad = st_open(ad_path, err);
    merge_pair *pairs = NULL;
    size_t np = 0;
    rc = ad ? match_pairs(base, ad, ad_path, &lc, &pairs, &np, err) : err->code;
    if (!rc) rc = cli_check_new_dir(out, "merge", err);
    if (!rc) rc = write_merged(base, model, out, pairs, np, scale, err);
    if (!rc)
        printf("merged %zu LoRA modules (r %d, scaling %g) into %s\n", np, lc.r, (double)scale, out);
    free(pairs);
    if (ad) st_close(ad);
    st_close(base);
    return rc;
}
