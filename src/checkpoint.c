/* checkpoint.c — see checkpoint.h. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"
#include "safetensors.h"

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0) nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* The step of a folder named exactly "checkpoint-DIGITS", else -1. */
static long long checkpoint_step_of(const char *name)
{
    if (strncmp(name, "checkpoint-", 11) != 0 || !name[11]) return -1;
    long long v = 0;
    for (const char *p = name + 11; *p; p++) {
        if (*p < '0' || *p > '9' || v > 1000000000000LL) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* Steps of every complete checkpoint in dir, ascending. */
static long long *list_checkpoints(const char *dir, size_t *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    size_t cap = 16;
    long long *steps = ct_malloc(cap * sizeof *steps);
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s = checkpoint_step_of(e->d_name);
        if (s < 0) continue;
        char state[CT_PATH_MAX + 300];
        snprintf(state, sizeof state, "%s/%s/trainer_state.safetensors", dir, e->d_name);
        if (access(state, R_OK) != 0) continue;
        if (*n == cap) steps = ct_realloc(steps, (cap *= 2) * sizeof *steps);
        steps[(*n)++] = s;
    }
    closedir(d);
    for (size_t i = 1; i < *n; i++)
        for (size_t j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            long long t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return steps;
}

bool checkpoint_find_latest(const char *output_dir, char *path, size_t len)
{
    size_t n;
    long long *steps = list_checkpoints(output_dir, &n);
    bool found = n > 0;
    if (found) snprintf(path, len, "%s/checkpoint-%lld", output_dir, steps[n - 1]);
    free(steps);
    return found;
}

static int write_state(const char *dir, const ct_lora *lo, ct_backend *be, const ct_trainer_state *st,
                       ct_error *err)
{
    size_t bytes = lo->n_params * sizeof(float);
    float *m = ct_malloc(bytes), *v = ct_malloc(bytes);
    be->download(be, m, lo->m, bytes);
    be->download(be, v, lo->v, bytes);
    int64_t counters[6] = {st->step, st->total_steps, (int64_t)st->data.epoch, (int64_t)st->data.window,
                           (int64_t)st->data.bin, (int64_t)st->data.batches_done};
    double stats[2] = {st->tokens_seen, st->elapsed};
    int64_t n = (int64_t)lo->n_params, six = 6, two = 2;
    char path[CT_PATH_MAX + 64];
    st_writer *w = st_writer_new();
    int rc = st_writer_add(w, "exp_avg", CT_DTYPE_F32, 1, &n, m, err);
    if (!rc) rc = st_writer_add(w, "exp_avg_sq", CT_DTYPE_F32, 1, &n, v, err);
    if (!rc) rc = st_writer_add(w, "counters", CT_DTYPE_I64, 1, &six, counters, err);
    if (!rc) rc = st_writer_add(w, "stats", CT_DTYPE_F64, 1, &two, stats, err);
    snprintf(path, sizeof path, "%s/trainer_state.safetensors", dir);
    if (!rc) rc = st_writer_save(w, path, err);
    st_writer_free(w);
    free(m);
    free(v);
    if (rc) return rc;
    /* A readable copy for people and scripts; the .safetensors is what resume reads. */
    json_writer j;
    json_writer_init(&j);
    json_write_rawf(&j, "{\"step\": %lld, \"total_steps\": %lld, \"epoch\": %llu, \"window\": %llu, \"bin\": %llu, "
                        "\"batches_done\": %llu, \"tokens_seen\": %.0f, \"elapsed\": %.3f}\n",
                    (long long)st->step, (long long)st->total_steps, (unsigned long long)st->data.epoch,
                    (unsigned long long)st->data.window, (unsigned long long)st->data.bin,
                    (unsigned long long)st->data.batches_done, st->tokens_seen, st->elapsed);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    rc = ct_write_file_atomic(path, j.buf, j.len, err);
    json_writer_free(&j);
    return rc;
}

int checkpoint_save(const char *output_dir, const ct_lora *lo, const ct_model *m, const ct_trainer_state *st,
                    const char *base_model, int save_total_limit, ct_error *err)
{
    char final[CT_PATH_MAX + 64], tmp[CT_PATH_MAX + 80], old[CT_PATH_MAX + 80];
    snprintf(final, sizeof final, "%s/checkpoint-%lld", output_dir, (long long)st->step);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    snprintf(old, sizeof old, "%s.old", final);
    rm_rf(tmp);
    int rc = ct_mkdirs(tmp, err);
    if (!rc) rc = lora_save_peft(lo, m, tmp, base_model, err);
    if (!rc) rc = write_state(tmp, lo, m->be, st, err);
    if (rc) {
        rm_rf(tmp);
        return rc;
    }
    /* Same step saved again (a resumed run): move the old one aside first, so
     * some complete checkpoint exists at every instant. */
    rm_rf(old);
    struct stat sb;
    if (stat(final, &sb) == 0 && rename(final, old) != 0)
        return CT_FAIL_RUNTIME(err, "%s: cannot move aside (%s)", final, strerror(errno));
    if (rename(tmp, final) != 0)
        return CT_FAIL_RUNTIME(err, "%s: cannot rename into place (%s)", tmp, strerror(errno));
    rm_rf(old);
    if (save_total_limit > 0) {
        size_t n;
        long long *steps = list_checkpoints(output_dir, &n);
        for (size_t i = 0; i + (size_t)save_total_limit < n; i++) {
            char victim[CT_PATH_MAX + 64];
            snprintf(victim, sizeof victim, "%s/checkpoint-%lld", output_dir, steps[i]);
            rm_rf(victim);
        }
        free(steps);
    }
    return CT_OK;
}

int checkpoint_load(const char *dir, ct_lora *lo, const ct_model *m, ct_trainer_state *st, ct_error *err)
{
    int rc = lora_load_peft(lo, m, dir, err);
    if (rc) return rc;
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/trainer_state.safetensors", dir);
    st_reader *r = st_open(path, err);
    if (!r) return err->code;
    int64_t n = (int64_t)lo->n_params, six = 6, two = 2;
    const st_tensor *m1, *v1, *c, *s;
    rc = st_expect(r, "exp_avg", CT_DTYPE_F32, 1, &n, &m1, err);
    if (!rc) rc = st_expect(r, "exp_avg_sq", CT_DTYPE_F32, 1, &n, &v1, err);
    if (!rc) rc = st_expect(r, "counters", CT_DTYPE_I64, 1, &six, &c, err);
    if (!rc) rc = st_expect(r, "stats", CT_DTYPE_F64, 1, &two, &s, err);
    if (!rc) {
        m->be->upload(m->be, lo->m, m1->data, m1->nbytes);
        m->be->upload(m->be, lo->v, v1->data, v1->nbytes);
        int64_t k[6];
        double d[2];
        memcpy(k, c->data, sizeof k);
        memcpy(d, s->data, sizeof d);
        if (k[0] < 0 || k[2] < 0 || k[3] < 0 || k[4] < 0 || k[5] < 0) {
            rc = CT_FAIL_INPUT(err, "%s: negative counters", path);
        } else {
            st->step = k[0];
            st->total_steps = k[1];
            st->data = (ct_data_pos){(uint64_t)k[2], (uint64_t)k[3], (uint64_t)k[4], (uint64_t)k[5]};
            st->tokens_seen = d[0];
            st->elapsed = d[1];
        }
    }
    st_close(r);
    return rc;
}
