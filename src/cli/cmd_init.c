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
 * Memory: tensors are generated and written one shard (<= --max-shard-bytes,
 * default 5 GB) at a time. st_writer_add copies, but each generated buffer is
 * freed right after it is added, so the peak is about one shard plus one tensor
 * (an 8B model needs ~6 GB of RAM, not 16 or 32). We therefore shard ourselves in
 * spec order (layer by layer) instead of st_writer_save_sharded, which needs the
 * whole model in one writer; the file names and index are the sharded layout of
 * docs/ARCHITECTURE.md, "safetensors". */
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
#include "safetensors.h"

#define CHUNK ((size_t)1 << 20)                 /* elements per independently seeded draw */
#define DEFAULT_MAX_SHARD_BYTES ((size_t)5000000000) /* huggingface_hub's "5GB" */
#define MAX_THREADS 64

typedef struct gen_tensor {
    const ct_tensor_spec *spec;
    size_t index;        /* position in the full spec list: the seed stream */
    size_t numel;
    size_t first_chunk;  /* first global chunk number of this tensor in the shard */
    uint16_t *data;      /* bf16, numel */
} gen_tensor;

typedef struct gen_work {
    gen_tensor *t;
    size_t nt, nchunks;
    atomic_size_t next;
    uint64_t seed;
    float std;
} gen_work;

static void fill_chunk(gen_work *w, size_t c)
{
    size_t lo = 0, hi = w->nt; /* last tensor whose first_chunk <= c */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (w->t[mid].first_chunk <= c) lo = mid; else hi = mid;
    }
    gen_tensor *t = &w->t[lo];
    size_t local = c - t->first_chunk, begin = local * CHUNK;
    size_t end = begin + CHUNK < t->numel ? begin + CHUNK : t->numel;
    ct_tensor_kind kind = t->spec->kind;
    if (kind == CT_TENSOR_NORM || kind == CT_TENSOR_DT_BIAS || kind == CT_TENSOR_SINKS || kind == CT_TENSOR_NORM_ZERO) {
        uint16_t v = ct_f32_to_bf16(kind == CT_TENSOR_NORM || kind == CT_TENSOR_DT_BIAS ? 1.0f : 0.0f);
        for (size_t j = begin; j < end; j++) t->data[j] = v;
        return;
    }
    ct_rng r;
    ct_rng_seed(&r, ct_hash64(ct_hash64(w->seed, t->index), local));
    if (kind == CT_TENSOR_A_LOG) { /* A ~ U(0.01, 16): kept away from 0 so log A is finite */
        for (size_t j = begin; j < end; j++) {
            float u = (float)(ct_rng_u64(&r) >> 40) * (1.0f / 16777216.0f);
            t->data[j] = ct_f32_to_bf16(logf(0.01f + 15.99f * u));
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
        t->data[j] = ct_f32_to_bf16(rad * c);
        if (j + 1 < end) t->data[j + 1] = ct_f32_to_bf16(rad * s);
    }
}

static void *gen_worker(void *arg)
{
    gen_work *w = arg;
    for (size_t c; (c = atomic_fetch_add(&w->next, 1)) < w->nchunks;) fill_chunk(w, c);
    return NULL;
}

/* Fills every tensor of one shard in parallel. */
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

static int write_shard(const ct_tensor_spec *specs, size_t first, size_t end, const char *path,
                       uint64_t seed, float std, ct_error *err)
{
    gen_work w = {.nt = end - first, .seed = seed, .std = std};
    w.t = ct_calloc(w.nt, sizeof *w.t);
    for (size_t i = 0; i < w.nt; i++) {
        gen_tensor *t = &w.t[i];
        t->spec = &specs[first + i];
        t->index = first + i;
        t->numel = model_tensor_numel(t->spec);
        t->first_chunk = w.nchunks;
        t->data = ct_malloc(t->numel * sizeof *t->data);
        w.nchunks += ct_ceil_div(t->numel, CHUNK);
    }
    atomic_init(&w.next, 0);
    generate(&w);
    st_writer *sw = st_writer_new();
    int rc = CT_OK;
    for (size_t i = 0; i < w.nt; i++) {
        if (rc == CT_OK) rc = st_writer_add(sw, w.t[i].spec->name, CT_DTYPE_BF16, w.t[i].spec->ndim,
                                           w.t[i].spec->shape, w.t[i].data, err);
        free(w.t[i].data);
    }
    if (rc == CT_OK) rc = st_writer_save(sw, path, err);
    st_writer_free(sw);
    free(w.t);
    return rc;
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

/* Writes the weights; *nfiles receives the number of safetensors files. */
static int write_weights(const ct_tensor_spec *specs, size_t n, const char *dir, size_t max_shard,
                         uint64_t seed, float std, size_t *nfiles, ct_error *err)
{
    /* Greedy in spec order: a shard closes when the next tensor would overflow it;
     * a tensor larger than the limit gets a shard of its own. */
    size_t *shard_of = ct_malloc(n * sizeof *shard_of);
    size_t nshards = 0, cur = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t bytes = model_tensor_numel(&specs[i]) * 2;
        if (nshards == 0 || (cur > 0 && cur + bytes > max_shard)) { nshards++; cur = 0; }
        cur += bytes;
        total += bytes;
        shard_of[i] = nshards - 1;
    }
    *nfiles = nshards;
    json_writer idx;
    json_writer_init(&idx);
    json_write_rawf(&idx, "{\"metadata\":{\"total_size\":%zu},\"weight_map\":{", total);
    int rc = CT_OK;
    char name[64];
    for (size_t s = 0, i = 0; s < nshards && rc == CT_OK; s++) {
        size_t first = i;
        while (i < n && shard_of[i] == s) i++;
        if (nshards == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, nshards);
        for (size_t k = first; k < i; k++) {
            json_write_raw(&idx, k ? ",\n" : "\n");
            json_write_string(&idx, specs[k].name);
            json_write_raw(&idx, ":");
            json_write_string(&idx, name);
        }
        char *path = join(dir, name);
        rc = write_shard(specs, first, i, path, seed, std, err);
        if (rc == CT_OK && nshards > 1) fprintf(stderr, "init: wrote %s\n", path);
        free(path);
    }
    json_write_raw(&idx, "\n}}\n");
    if (rc == CT_OK && nshards > 1) {
        char *path = join(dir, "model.safetensors.index.json");
        rc = ct_write_file_atomic(path, idx.buf, idx.len, err);
        free(path);
    }
    json_writer_free(&idx);
    free(shard_of);
    return rc;
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
    const char *config = NULL, *out = NULL, *seed_s = NULL, *max_shard_s = NULL;
    const cli_opt opts[] = {
        {"--config", "CONFIG.json", "an HF config.json, or a folder holding one", .str = &config, .required = true},
        {"--out", "DIR", "the model folder to write; it must not hold a model yet", .str = &out, .required = true},
        {"--seed", "S", "seed of the random weights (default 0)", .str = &seed_s},
        {"--max-shard-bytes", "N", "largest safetensors file before sharding (default 5000000000)",
         .str = &max_shard_s},
        {0}};
    const cli_cmd cmd = {"init", "init --config CONFIG.json --out DIR [--seed S]", opts};
    uint64_t seed = 0, max_shard = DEFAULT_MAX_SHARD_BYTES;
    int rc = cli_parse(&cmd, argc, argv, NULL, err);
    if (rc) return rc;
    if (seed_s && (rc = parse_u64("--seed", seed_s, &seed, err))) return rc;
    if (max_shard_s && (rc = parse_u64("--max-shard-bytes", max_shard_s, &max_shard, err))) return rc;
    if (max_shard == 0) return CT_FAIL_INPUT(err, "--max-shard-bytes must be positive");

    /* Keep the input bytes: DIR/config.json must be exactly what HF will read. */
    struct stat st;
    char *config_path = stat(config, &st) == 0 && S_ISDIR(st.st_mode) ? join(config, "config.json") : ct_strdup(config);
    size_t len;
    char *text = NULL;
    if ((rc = cli_check_file(config_path, err)) == CT_OK && !(text = ct_read_file(config_path, &len, err)))
        rc = CT_ERR_INPUT;
    ct_model_config mc;
    if (rc == CT_OK) rc = model_config_parse(&mc, text, len, config_path, err);
    static const char *model_files[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
    for (int i = 0; i < 3 && rc == CT_OK; i++)
        if (exists(out, model_files[i]))
            rc = CT_FAIL_INPUT(err, "%s already holds a model (%s); refusing to overwrite it "
                               "(HINT: choose a new --out folder or delete the old one)", out, model_files[i]);
    if (rc == CT_OK) rc = ct_mkdirs(out, err);

    size_t n = 0, nfiles = 0;
    ct_tensor_spec *specs = rc == CT_OK ? model_tensor_specs(&mc, &n) : NULL;
    double t0 = ct_now();
    if (rc == CT_OK) rc = write_weights(specs, n, out, (size_t)max_shard, seed, (float)mc.initializer_range, &nfiles, err);
    /* config.json last: a folder with a config is a complete model */
    if (rc == CT_OK) {
        char *p = join(out, "config.json");
        rc = ct_write_file_atomic(p, text, len, err);
        free(p);
    }
    if (rc == CT_OK) {
        ct_param_counts c = model_param_counts(&mc);
        printf("init: %s: %s (%s), %zu parameters (%.3g GB bf16), %zu tensors in %zu file%s, seed %" PRIu64 ", %.1f s\n",
               out, mc.model_type, mc.architectures[0] ? mc.architectures : "-", c.total, 2e-9 * (double)c.total, n,
               nfiles, nfiles == 1 ? "" : "s", seed, ct_now() - t0);
    }
    free(specs);
    free(text);
    free(config_path);
    return rc;
}
