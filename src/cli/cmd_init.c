/* cmd_init.c — `ctune init --config CONFIG.json --out DIR [--seed S]`: a model
 * folder with random bf16 weights under HF names, so tests and benchmarks run on
 * real shapes without downloading checkpoints (the protocol of BENCHMARKS.md).
 *
 * Values: norms 1.0 (q/k norms too), sinks 0, every other tensor (embeddings,
 * linear weights and biases) N(0, initializer_range). HF zero-inits biases; we
 * draw them small instead so that tests against HF exercise the bias paths.
 * Gated DeltaNet hybrids as their _init_weights: zero-centred norms 0 (they
 * scale by 1 + w), the gated GDN norm 1, dt_bias 1, A_log = log U(0.01, 16),
 * conv1d N(0, initializer_range). MTP weights are not written (HF drops them).
 *
 * Determinism: chunk c of tensor t (CHUNK elements) is drawn from a generator
 * seeded by hash(hash(seed, t), c), so the bytes depend on the seed and the
 * config only, not on the number of threads or the shard size.
 *
 * --quantize nf4|fp4 writes the same values as a bitsandbytes 4-bit folder
 * (docs/quantization.md) without the bf16 one: each tensor is drawn in bf16,
 * then quantized, so `init` then `quantize` gives the same bytes; fp8 the FP8
 * folder (docs/fp8.md) the same way.
 *
 * Memory: tensors are generated and written one shard (<= --max-shard-bytes,
 * default 5 GB) at a time by model_write.h. st_writer_add copies, but each
 * generated buffer is freed right after it is added, so the peak is about one
 * shard plus one tensor (an 8B model needs ~6 GB of RAM, not 16 or 32). */
#include <stdatomic.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "json.h"
#include "model_config.h"
#include "model_write.h"
#include "fp8.h"
#include "mxfp4.h"
#include "safetensors.h"

#define CHUNK ((size_t)1 << 20)                 /* elements per independently seeded draw */
#define DEFAULT_MAX_SHARD_BYTES ((size_t)5000000000) /* huggingface_hub's "5GB" */
#define MAX_THREADS 64

typedef struct gen_work {
    const ct_tensor_spec *spec;
    size_t index;        /* position in the full spec list: the seed stream */
    size_t numel, nchunks;
    uint16_t *data;      /* bf16, numel */
    atomic_size_t next;
    uint64_t seed;
    float std;
} gen_work;

static void fill_chunk(gen_work *w, size_t c)
{
    size_t begin = c * CHUNK;
    size_t end = begin + CHUNK < w->numel ? begin + CHUNK : w->numel;
    ct_tensor_kind kind = w->spec->kind;
    if (kind == CT_TENSOR_NORM || kind == CT_TENSOR_DT_BIAS || kind == CT_TENSOR_SINKS || kind == CT_TENSOR_NORM_ZERO) {
        uint16_t v = ct_f32_to_bf16(kind == CT_TENSOR_NORM || kind == CT_TENSOR_DT_BIAS ? 1.0f : 0.0f);
        for (size_t j = begin; j < end; j++) w->data[j] = v;
        return;
    }
    ct_rng r;
    ct_rng_seed(&r, ct_hash64(ct_hash64(w->seed, w->index), c));
    if (kind == CT_TENSOR_A_LOG) { /* A ~ U(0.01, 16): kept away from 0 so log A is finite */
        for (size_t j = begin; j < end; j++) {
            float u = (float)(ct_rng_u64(&r) >> 40) * (1.0f / 16777216.0f);
            w->data[j] = ct_f32_to_bf16(logf(0.01f + 15.99f * u));
        }
        return;
    }
    /* Box-Muller in float, both outputs, two 24-bit uniforms from one draw: ~4x
     * faster than ct_rng_normal, and init time is spent here (30B values for a
     * 30B model). The 5.8 sigma tail cut is irrelevant for a random init. */
    for (size_t j = begin; j < end; j += 2) {
        uint64_t x = ct_rng_u64(&r);
        float u1 = (float)((x >> 40) + 1) * (1.0f / 16777216.0f); /* (0, 1]: log is finite */
        float u2 = (float)(x & 0xffffff) * (1.0f / 16777216.0f);
        float rad = w->std * sqrtf(-2.0f * logf(u1)), s, c;
        sincosf(6.2831853f * u2, &s, &c);
        w->data[j] = ct_f32_to_bf16(rad * c);
        if (j + 1 < end) w->data[j + 1] = ct_f32_to_bf16(rad * s);
    }
}

static void *gen_worker(void *arg)
{
    gen_work *w = arg;
    for (size_t c; (c = atomic_fetch_add(&w->next, 1)) < w->nchunks;) fill_chunk(w, c);
    return NULL;
}

/* Fills one tensor, its chunks in parallel. */
static void generate(gen_work *w)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (size_t)cpus;
    if (n > w->nchunks) n = w->nchunks;
    pthread_t th[MAX_THREADS];
    size_t started = 0;
    for (; started + 1 < n; started++)
        if (pthread_create(&th[started], NULL, gen_worker, w) != 0) break;
    gen_worker(w); /* the calling thread works too; fewer threads only slow it down */
    for (size_t i = 0; i < started; i++) pthread_join(th[i], NULL);
}

typedef struct gen_source {
    const ct_tensor_spec *specs;
    uint64_t seed;
    float std;
} gen_source;

static int gen_fill(void *ctx, size_t i, uint16_t *bf16, ct_error *err)
{
    const gen_source *src = ctx;
    gen_work w = {.spec = &src->specs[i], .index = i, .numel = model_tensor_numel(&src->specs[i]), .data = bf16,
                  .seed = src->seed, .std = src->std};
    w.nchunks = ct_ceil_div(w.numel, CHUNK);
    atomic_init(&w.next, 0);
    generate(&w);
    return CT_OK;
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = ct_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool exists(const char *dir, const char *name)
{
    char *p = join(dir, name);
    bool yes = access(p, F_OK) == 0;
    free(p);
    return yes;
}

static int parse_u64(const char *flag, const char *s, uint64_t *out, ct_error *err)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || s[0] == '-')
        return CT_FAIL_INPUT(err, "%s: expected a non-negative integer, found '%s' (see ctune init --help)", flag, s);
    *out = v;
    return CT_OK;
}

int cmd_init(int argc, char **argv, ct_error *err)
{
    const char *config = NULL, *out = NULL, *seed_s = NULL, *max_shard_s = NULL, *quant_s = NULL, *bs_s = NULL;
    bool no_dq = false;
    const cli_opt opts[] = {
        {"--config", "CONFIG.json", "an HF config.json, or a folder holding one", .str = &config, .required = true},
        {"--out", "DIR", "the model folder to write; it must not hold a model yet", .str = &out, .required = true},
        {"--seed", "S", "seed of the random weights (default 0)", .str = &seed_s},
        {"--max-shard-bytes", "N", "largest safetensors file before sharding (default 5000000000)",
         .str = &max_shard_s},
        {"--quantize", "FORMAT", "write a quantized folder: nf4 or fp4 (bitsandbytes; see ctune quantize), mxfp4 "
         "(gpt_oss experts, as the Hub's checkpoints) or fp8 (E4M3 in 128x128 blocks)", .str = &quant_s},
        {"--blocksize", "N", "with --quantize: elements per scale, 32..4096 (default 64)", .str = &bs_s},
        {"--no-double-quant", NULL, "with --quantize: keep the scales in fp32", .flag = &no_dq},
        {0}};
    const cli_cmd cmd = {"init", "init --config CONFIG.json --out DIR [--seed S] [--quantize nf4|fp4|mxfp4|fp8]",
                         opts};
    uint64_t seed = 0, max_shard = DEFAULT_MAX_SHARD_BYTES;
    int rc = cli_parse(&cmd, argc, argv, NULL, err);
    if (rc) return rc;
    if (seed_s && (rc = parse_u64("--seed", seed_s, &seed, err))) return rc;
    if (max_shard_s && (rc = parse_u64("--max-shard-bytes", max_shard_s, &max_shard, err))) return rc;
    if (max_shard == 0) return CT_FAIL_INPUT(err, "--max-shard-bytes must be positive");
    bool mx = quant_s && !strcmp(quant_s, "mxfp4"), fp8 = quant_s && !strcmp(quant_s, "fp8");
    model_write_format f = {.form = mx ? MODEL_WRITE_MXFP4 : fp8 ? MODEL_WRITE_FP8 : quant_s ? MODEL_WRITE_4BIT
                                                                                        : MODEL_WRITE_BF16};
    const quant4_write_opts *q = &f.quant4;
    if (f.form != MODEL_WRITE_4BIT && (bs_s || no_dq))
        return CT_FAIL_INPUT(err, "%s needs --quantize nf4 or fp4 (see ctune init --help)",
                             bs_s ? "--blocksize" : "--no-double-quant");
    if (f.form == MODEL_WRITE_4BIT && (rc = model_write_parse_quant("--quantize", quant_s, bs_s, no_dq, &f.quant4, err)))
        return rc;

    /* Keep the input bytes: DIR/config.json must be exactly what HF will read
     * (a 4-bit folder's gains its quantization_config, the rest kept). */
    struct stat st;
    char *config_path = stat(config, &st) == 0 && S_ISDIR(st.st_mode) ? join(config, "config.json") : ct_strdup(config);
    size_t len;
    char *text = NULL;
    if ((rc = cli_check_file(config_path, err)) == CT_OK && !(text = ct_read_file(config_path, &len, err)))
        rc = CT_ERR_INPUT;
    ct_model_config mc;
    if (rc == CT_OK) rc = model_config_parse(&mc, text, len, config_path, err);
    if (rc == CT_OK && mx && mc.arch != CT_ARCH_GPT_OSS)
        rc = CT_FAIL_INPUT(err, "%s: --quantize mxfp4 is the format of gpt_oss's experts; model_type %s has none "
                           "(use nf4 or fp4)", config_path, mc.model_type);
    if (rc == CT_OK && quant_s) {
        size_t qlen;
        json_writer qc;
        json_writer_init(&qc);
        if (mx) mxfp4_write_config(&qc);
        char *qtext = mx    ? config_text_with_quantization(text, len, config_path, qc.buf, qc.len, &qlen, err)
                      : fp8 ? fp8_config_text(text, len, config_path, &qlen, err)
                            : quant4_config_text(text, len, config_path, q, &qlen, err);
        json_writer_free(&qc);
        if (!qtext) rc = err->code;
        free(text);
        text = qtext;
        len = qlen;
    }
    static const char *model_files[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
    for (int i = 0; i < 3 && rc == CT_OK; i++)
        if (exists(out, model_files[i]))
            rc = CT_FAIL_INPUT(err, "%s already holds a model (%s); refusing to overwrite it "
                               "(HINT: choose a new --out folder or delete the old one)", out, model_files[i]);
    if (rc == CT_OK) rc = ct_mkdirs(out, err);

    size_t n = 0, nfiles = 0;
    ct_tensor_spec *specs = rc == CT_OK ? model_tensor_specs(&mc, &n) : NULL;
    double t0 = ct_now();
    gen_source src = {specs, seed, (float)mc.initializer_range};
    if (rc == CT_OK)
        rc = model_write_weights(specs, n, out, (size_t)max_shard, &f, gen_fill, &src, "init", &nfiles, err);
    /* config.json last: a folder with a config is a complete model */
    if (rc == CT_OK) {
        char *p = join(out, "config.json");
        rc = ct_write_file_atomic(p, text, len, err);
        free(p);
    }
    if (rc == CT_OK) {
        ct_param_counts c = model_param_counts(&mc);
        char format[64];
        if (mx) snprintf(format, sizeof format, "experts mxfp4");
        else if (fp8) snprintf(format, sizeof format, "fp8, 128x128 blocks");
        else if (quant_s) snprintf(format, sizeof format, "%s, blocksize %zu%s", quant4_type_name(q->type), q->blocksize,
                                   q->double_quant ? ", double quant" : "");
        else snprintf(format, sizeof format, "%.3g GB bf16", 2e-9 * (double)c.total);
        printf("init: %s: %s (%s), %zu parameters (%s), %zu tensors in %zu file%s, seed %" PRIu64 ", %.1f s\n",
               out, mc.model_type, mc.architectures[0] ? mc.architectures : "-", c.total, format, n,
               nfiles, nfiles == 1 ? "" : "s", seed, ct_now() - t0);
    }
    free(specs);
    free(text);
    free(config_path);
    return rc;
}
