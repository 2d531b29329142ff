/* checkpoint.c — see checkpoint.h.
 *
 * What makes a checkpoint safe to resume from, in the order a save happens:
 *  1. every file is written into checkpoint-STEP.tmp/ (each file fsync'd);
 *  2. manifest.json is written last: each file's size and CRC32, read back from
 *     the disk (so it vouches for what is there, not for what we meant to write);
 *  3. the folder is renamed into place (atomically swapped with an older save of
 *     the same step), then the parent folder is fsync'd.
 * A kill at any moment leaves either no checkpoint-STEP or a complete one, and a
 * later disk fault or a partial copy is caught by the manifest: resume skips any
 * checkpoint whose manifest is missing or does not match, and says so. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zlib.h>

#include "json.h"
#include "safetensors.h"

#define MANIFEST_NAME "manifest.json"
#define MANIFEST_FORMAT "ctune-checkpoint-manifest"
#define MAX_FILES 64 /* a checkpoint holds 6 files; more means it is not ours */

static void fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return;
    fsync(fd);
    close(fd);
}

// ---- manifest ----

/* Size and CRC32 (zlib) of the file at PATH, read in 1 MiB blocks. */
static int file_crc(const char *path, size_t *size, uint32_t *crc, ct_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return CT_FAIL_RUNTIME(err, "%s: cannot open (%s)", path, strerror(errno));
    unsigned char *buf = ct_malloc((size_t)1 << 20);
    uLong c = crc32(0L, Z_NULL, 0);
    size_t n = 0, got;
    while ((got = fread(buf, 1, (size_t)1 << 20, f)) > 0) {
        c = crc32(c, buf, (uInt)got);
        n += got;
    }
    int bad = ferror(f);
    fclose(f);
    free(buf);
    if (bad) return CT_FAIL_RUNTIME(err, "%s: read error", path);
    *size = n;
    *crc = (uint32_t)c;
    return CT_OK;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A manifest entry's name: a file of the checkpoint folder itself (no '/', not
 * "." or ".."), without control characters or an embedded NUL, since it is
 * printed in one-line errors. */
static bool plain_file_name(const json_value *name)
{
    if (!name->string_len || strlen(name->string) != name->string_len || strchr(name->string, '/') ||
        !strcmp(name->string, ".") || !strcmp(name->string, ".."))
        return false;
    for (const unsigned char *c = (const unsigned char *)name->string; *c; c++)
        if (*c < 0x20 || *c == 0x7f) return false;
    return true;
}

/* Writes DIR/manifest.json listing every other regular file of DIR, by name. */
static int write_manifest(const char *dir, long long step, ct_error *err)
{
    DIR *d = opendir(dir);
    if (!d) return CT_FAIL_RUNTIME(err, "%s: cannot list (%s)", dir, strerror(errno));
    char *names[MAX_FILES];
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < MAX_FILES;) {
        char path[CT_PATH_MAX + 320];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && strcmp(e->d_name, MANIFEST_NAME) != 0)
            names[n++] = ct_strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_name);
    json_writer w;
    json_writer_init(&w);
    json_write_rawf(&w, "{\"format\": \"%s\", \"version\": 1, \"step\": %lld, \"files\": [", MANIFEST_FORMAT, step);
    int rc = CT_OK;
    for (size_t i = 0; i < n; i++) {
        char path[CT_PATH_MAX + 320];
        size_t size = 0;
        uint32_t crc = 0;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (!rc) rc = file_crc(path, &size, &crc, err);
        json_write_raw(&w, i ? ",\n  {\"name\": " : "\n  {\"name\": ");
        json_write_string(&w, names[i]);
        json_write_rawf(&w, ", \"size\": %zu, \"crc32\": %u}", size, crc);
        free(names[i]);
    }
    json_write_raw(&w, "\n]}\n");
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST_NAME);
    if (!rc) rc = ct_write_file_atomic(path, w.buf, w.len, err);
    json_writer_free(&w);
    return rc;
}

int checkpoint_verify(const char *dir, ct_error *err)
{
    char path[CT_PATH_MAX + 320];
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST_NAME);
    struct stat st;
    if (stat(dir, &st) != 0)
        return CT_FAIL_INPUT(err, "%s: does not exist (expected a checkpoint folder, OUTPUT_DIR/checkpoint-STEP)", dir);
    if (!S_ISDIR(st.st_mode))
        return CT_FAIL_INPUT(err, "%s: not a folder (expected a checkpoint folder, OUTPUT_DIR/checkpoint-STEP)", dir);
    if (stat(path, &st) != 0)
        return CT_FAIL_INPUT(err, "%s: no %s (an incomplete checkpoint: it was not fully written)", dir, MANIFEST_NAME);
    size_t len;
    char *text = ct_read_file_max(path, (size_t)1 << 20, &len, err);
    if (!text) return CT_ERR_INPUT;
    json_doc *doc = json_parse(text, len, path, err);
    free(text);
    if (!doc) return CT_ERR_INPUT;
    const json_value *root = json_root(doc);
    const json_value *fmt = json_get_type(root, "format", JSON_STRING);
    const json_value *files = json_get_type(root, "files", JSON_ARRAY);
    int rc = CT_OK;
    if (!fmt || strcmp(fmt->string, MANIFEST_FORMAT) != 0 || !files || files->count == 0)
        rc = CT_FAIL_INPUT(err, "%s: not a ctune checkpoint manifest (expected format %s and a list of files)", path,
                           MANIFEST_FORMAT);
    for (size_t i = 0; !rc && i < files->count; i++) {
        const json_value *f = files->items[i];
        const json_value *name = json_get_type(f, "name", JSON_STRING);
        const json_value *size = json_get_type(f, "size", JSON_NUMBER);
        const json_value *crc = json_get_type(f, "crc32", JSON_NUMBER);
        /* names stay inside the folder and print on one line: the manifest is read
         * from untrusted disks too */
        if (!name || !size || !crc || !size->is_integer || !crc->is_integer || !plain_file_name(name)) {
            rc = CT_FAIL_INPUT(err, "%s: entry %zu is not {name, size, crc32}", path, i);
            break;
        }
        char fpath[CT_PATH_MAX + 320];
        snprintf(fpath, sizeof fpath, "%s/%s", dir, name->string);
        size_t got_size;
        uint32_t got_crc;
        if (stat(fpath, &st) != 0) {
            rc = CT_FAIL_INPUT(err, "%s: missing (the manifest lists it)", fpath);
        } else if ((long long)st.st_size != size->integer) {
            rc = CT_FAIL_INPUT(err, "%s: %lld bytes, the manifest says %lld (truncated or replaced)", fpath,
                               (long long)st.st_size, size->integer);
        } else if (file_crc(fpath, &got_size, &got_crc, err) != CT_OK) {
            rc = CT_ERR_INPUT; /* an unreadable file: this checkpoint is unusable, not the run */
            if (err) err->code = rc;
        } else if ((long long)got_crc != crc->integer) {
            rc = CT_FAIL_INPUT(err, "%s: CRC32 %08x, the manifest says %08llx (corrupt)", fpath, got_crc,
                               (unsigned long long)crc->integer);
        }
    }
    json_free(doc);
    return rc ? CT_ERR_INPUT : CT_OK;
}

// ---- finding checkpoints ----

/* The step of a folder named "checkpoint-DIGITS" (*old = false) or
 * "checkpoint-DIGITS.old" (*old = true: a save moved it aside), else -1. */
static long long checkpoint_step_of(const char *name, bool *old)
{
    if (strncmp(name, "checkpoint-", 11) != 0 || !name[11]) return -1;
    long long v = 0;
    const char *p = name + 11;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > 1000000000000LL) return -1;
        v = v * 10 + (*p - '0');
    }
    if (p == name + 11) return -1;
    *old = !strcmp(p, ".old");
    return *p && !*old ? -1 : v;
}

typedef struct ckpt_entry { long long step; bool old; } ckpt_entry;

/* Ascending by step; for one step the .old folder first, so that walking the
 * list backwards tries the folder in place before the one moved aside. */
static int cmp_entry(const void *a, const void *b)
{
    const ckpt_entry *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return (int)y->old - (int)x->old;
}

/* Every checkpoint-STEP (and .old) folder in dir, ascending by step. */
static ckpt_entry *list_checkpoints(const char *dir, size_t *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    size_t cap = 16;
    ckpt_entry *v = ct_malloc(cap * sizeof *v);
    for (struct dirent *e; (e = readdir(d));) {
        bool old = false;
        long long s = checkpoint_step_of(e->d_name, &old);
        if (s < 0) continue;
        if (*n == cap) v = ct_realloc(v, (cap *= 2) * sizeof *v);
        v[(*n)++] = (ckpt_entry){s, old};
    }
    closedir(d);
    qsort(v, *n, sizeof *v, cmp_entry);
    return v;
}

static void entry_path(char *buf, size_t len, const char *dir, const ckpt_entry *e)
{
    snprintf(buf, len, "%s/checkpoint-%lld%s", dir, e->step, e->old ? ".old" : "");
}

bool checkpoint_find_latest(const char *output_dir, char *path, size_t len, FILE *notes)
{
    size_t n;
    ckpt_entry *v = list_checkpoints(output_dir, &n);
    bool found = false;
    for (size_t i = n; i-- > 0 && !found;) {
        ct_error why = {0};
        entry_path(path, len, output_dir, &v[i]);
        if (checkpoint_verify(path, &why) == CT_OK) found = true;
        else if (notes) fprintf(notes, "note: skipping %s: %s\n", path, why.msg);
    }
    free(v);
    return found;
}

/* True for "checkpoint-DIGITS[.old]SUFFIX": a folder only a save or a rotation
 * of ours makes. */
static bool is_ours_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    if (n <= k || strcmp(name + n - k, suffix) != 0) return false;
    char base[320];
    snprintf(base, sizeof base, "%.*s", (int)(n - k), name);
    bool old = false;
    return checkpoint_step_of(base, &old) >= 0;
}

void checkpoint_clean_stale(const char *output_dir, FILE *notes)
{
    DIR *d = opendir(output_dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_ours_with(e->d_name, ".tmp") && !is_ours_with(e->d_name, ".deleting")) continue;
        char path[CT_PATH_MAX + 320];
        snprintf(path, sizeof path, "%s/%s", output_dir, e->d_name);
        ct_remove_tree(path);
        if (notes) fprintf(notes, "note: removed %s (left by a run killed while it %s)\n", path,
                           is_ours_with(e->d_name, ".tmp") ? "saved a checkpoint" : "deleted an old checkpoint");
    }
    closedir(d);
}

// ---- saving ----

/* Free bytes for an unprivileged writer in dir, or SIZE_MAX when unknown. */
static size_t free_bytes(const char *dir)
{
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) return SIZE_MAX;
    unsigned long long b = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
    return b > SIZE_MAX ? SIZE_MAX : (size_t)b;
}

size_t checkpoint_bytes(const ct_lora *lo)
{
    /* adapter + two AdamW moments in fp32, plus headers and the small files */
    return 3 * lo->n_params * sizeof(float) + ((size_t)1 << 20);
}

int checkpoint_probe_dir(const char *output_dir, ct_error *err)
{
    ct_error why = {0};
    if (ct_mkdirs(output_dir, &why) != CT_OK)
        return CT_FAIL_INPUT(err, "output_dir %s: cannot be created: %s (expected a folder this user can create)",
                             output_dir, why.msg);
    /* A real write + fsync: creating the file alone would pass on a full disk. */
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/.ctune-write-probe", output_dir);
    static const char probe[4096];
    errno = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644), e = 0;
    if (fd < 0 || write(fd, probe, sizeof probe) != (ssize_t)sizeof probe || fsync(fd) != 0) e = errno ? errno : EIO;
    if (fd >= 0) close(fd);
    unlink(path);
    if (!e) return CT_OK;
    bool full = e == ENOSPC || e == EDQUOT;
    if (full) return CT_FAIL_RUNTIME(err, "output_dir %s: no space left (%s) (HINT: free space or choose another "
                                     "output_dir)", output_dir, strerror(e));
    return CT_FAIL_INPUT(err, "output_dir %s: not writable: cannot write a file in it (%s) (expected a folder this "
                         "user can write)", output_dir, strerror(e));
}

int checkpoint_check_space(const char *output_dir, const ct_lora *lo, ct_error *err)
{
    size_t need = checkpoint_bytes(lo), have = free_bytes(output_dir);
    if (have < need)
        return CT_FAIL_RUNTIME(err, "output_dir %s: %.1f MiB free, but one checkpoint needs about %.1f MiB "
                               "(HINT: free space or choose another output_dir)", output_dir,
                               have / 1048576.0, need / 1048576.0);
    return CT_OK;
}

/* The counters and the logging window are F64/I64 tensors, which the writer
 * puts before the F32 moments (it orders by dtype size), so the moments stay
 * the file's last bytes, in the same place in every checkpoint of a run. */
static int write_state(const char *dir, const float *m, const float *v, size_t n_params, const ct_trainer_state *st,
                       ct_error *err)
{
    int64_t counters[6] = {st->step, st->total_steps, (int64_t)st->data.epoch, (int64_t)st->data.window,
                           (int64_t)st->data.bin, (int64_t)st->data.batches_done};
    double stats[2] = {st->tokens_seen, st->elapsed};
    const ct_log_window *lw = &st->window;
    double window[6] = {lw->loss_sum, lw->aux_sum, lw->loss, lw->targets, lw->tokens, (double)lw->micro_batches};
    const ct_guard_state *g = &st->guard;
    int64_t guard[6] = {g->streak, g->streak_start, g->skipped, g->skipped_since_log, g->first_step, g->used};
    double ring[1 + 2 * CT_GUARD_MAX];
    ring[0] = g->last_norm_sq;
    for (int64_t i = 0; i < 2 * g->used; i++) ring[1 + i] = g->ring[i];
    int64_t crc = st->data_crc32;
    int64_t n = (int64_t)n_params, six = 6, two = 2, one = 1, n_ring = 1 + 2 * g->used;
    char path[CT_PATH_MAX + 64];
    st_writer *w = st_writer_new();
    int rc = st_writer_add(w, "exp_avg", CT_DTYPE_F32, 1, &n, m, err);
    if (!rc) rc = st_writer_add(w, "exp_avg_sq", CT_DTYPE_F32, 1, &n, v, err);
    if (!rc) rc = st_writer_add(w, "counters", CT_DTYPE_I64, 1, &six, counters, err);
    if (!rc) rc = st_writer_add(w, "stats", CT_DTYPE_F64, 1, &two, stats, err);
    if (!rc) rc = st_writer_add(w, "log_window", CT_DTYPE_F64, 1, &six, window, err);
    if (!rc) rc = st_writer_add(w, "guard", CT_DTYPE_I64, 1, &six, guard, err);
    if (!rc) rc = st_writer_add(w, "guard_ring", CT_DTYPE_F64, 1, &n_ring, ring, err);
    if (!rc) rc = st_writer_add(w, "data_crc32", CT_DTYPE_I64, 1, &one, &crc, err);
    snprintf(path, sizeof path, "%s/trainer_state.safetensors", dir);
    if (!rc) rc = st_writer_save(w, path, err);
    st_writer_free(w);
    if (rc) return rc;
    /* A readable copy for people and scripts; the .safetensors is what resume reads. */
    json_writer j;
    json_writer_init(&j);
    json_write_rawf(&j, "{\"step\": %lld, \"total_steps\": %lld, \"epoch\": %llu, \"window\": %llu, \"bin\": %llu, "
                        "\"batches_done\": %llu, \"tokens_seen\": %.0f, \"elapsed\": %.3f, \"data_crc32\": %u}\n",
                    (long long)st->step, (long long)st->total_steps, (unsigned long long)st->data.epoch,
                    (unsigned long long)st->data.window, (unsigned long long)st->data.bin,
                    (unsigned long long)st->data.batches_done, st->tokens_seen, st->elapsed, st->data_crc32);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    rc = ct_write_file_atomic(path, j.buf, j.len, err);
    json_writer_free(&j);
    return rc;
}

/* Puts the complete folder TMP at FINAL. When FINAL exists (the same step saved
 * again by a resumed run) the two are swapped atomically where the filesystem
 * can (RENAME_EXCHANGE); elsewhere FINAL moves to FINAL.old first, which
 * checkpoint_find_latest takes when a kill lands between the two renames. */
static int put_in_place(const char *tmp, const char *final, const char *old, ct_error *err)
{
    struct stat sb;
    if (stat(final, &sb) != 0) {
        if (rename(tmp, final) != 0)
            return CT_FAIL_RUNTIME(err, "%s: cannot rename into place (%s)", tmp, strerror(errno));
        ct_remove_tree(old);
        return CT_OK;
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        ct_remove_tree(tmp);
        return CT_OK;
    }
    ct_remove_tree(old);
    if (rename(final, old) != 0)
        return CT_FAIL_RUNTIME(err, "%s: cannot move aside (%s)", final, strerror(errno));
    if (rename(tmp, final) != 0)
        return CT_FAIL_RUNTIME(err, "%s: cannot rename into place (%s)", tmp, strerror(errno));
    ct_remove_tree(old);
    return CT_OK;
}

/* The tensor holding flat index i of params (or of a moment, laid out alike):
 * "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight element 17". */
static void param_name(const ct_lora *lo, size_t i, char *out, size_t len)
{
    snprintf(out, len, "element %zu", i);
    for (int l = 0; l < lo->n_layers; l++)
        for (int mod = 0; mod < CT_MOD_COUNT; mod++) {
            const ct_lora_slot *s = lora_slot(lo, l, (ct_module)mod);
            if (!s->experts || i < s->offset) continue;
            size_t a = (size_t)s->experts * lo->R * s->in, b = (size_t)s->experts * s->out * lo->R;
            if (i - s->offset >= a + b) continue;
            bool is_B = i - s->offset >= a;
            size_t k = is_B ? i - s->offset - a : i - s->offset, per = is_B ? b / s->experts : a / s->experts;
            char name[256];
            if (s->experts == 1) {
                lora_tensor_name(name, sizeof name, l, (ct_module)mod, is_B);
                snprintf(out, len, "%s element %zu", name, k);
            } else {
                snprintf(out, len, "layer %d %s expert %zu lora_%c element %zu", l, model_module_name((ct_module)mod),
                         k / per, is_B ? 'B' : 'A', k % per);
            }
            return;
        }
}

/* True when every value of HOST (laid out as params) is finite, and >= 0 when
 * nonneg; else false with "TENSOR element K is VALUE" in what. */
static bool values_ok(const ct_lora *lo, const float *host, bool nonneg, char *what, size_t len)
{
    for (size_t i = 0; i < lo->n_params; i++) {
        if (isfinite(host[i]) && !(nonneg && host[i] < 0)) continue;
        char name[400];
        param_name(lo, i, name, sizeof name);
        if (isnan(host[i])) snprintf(what, len, "%s is nan", name); /* not "-nan": the sign of a NaN means nothing */
        else snprintf(what, len, "%s is %g", name, host[i]);
        return false;
    }
    return true;
}

/* Downloads params, m and v and checks that each is finite (v >= 0 too): the
 * guard reads the device only every few steps, so a save checks for itself.
 * On success *m_out and *v_out hold the moments (the caller frees them). */
static int download_checked(const ct_lora *lo, const ct_model *m, const char *output_dir, long long step,
                            float **m_out, float **v_out, ct_error *err)
{
    ct_backend *be = m->be;
    size_t bytes = lo->n_params * sizeof(float);
    const float *dev[3] = {lo->params, lo->m, lo->v};
    const char *label[3] = {"LoRA weights", "AdamW exp_avg", "AdamW exp_avg_sq"};
    float *host[3] = {NULL, NULL, NULL};
    int rc = CT_OK;
    for (int i = 0; i < 3 && !rc; i++) {
        char what[400];
        host[i] = ct_malloc(bytes);
        be->download(be, host[i], dev[i], bytes);
        if (!values_ok(lo, host[i], i == 2, what, sizeof what))
            rc = CT_FAIL_RUNTIME(err, "checkpoint at step %lld not saved: the %s are not finite after the "
                                 "optimizer update (%s); the checkpoints already in %s are untouched and the newest "
                                 "holds the last good state (HINT: lower training.learning_rate or "
                                 "training.weight_decay, then rerun to resume from it)", step, label[i], what,
                                 output_dir);
        if (i == 0) {
            free(host[0]); /* lora_save_peft downloads its own copy */
            host[0] = NULL;
        }
    }
    if (rc) {
        free(host[1]);
        free(host[2]);
        return rc;
    }
    *m_out = host[1];
    *v_out = host[2];
    return CT_OK;
}

int checkpoint_save(const char *output_dir, const ct_lora *lo, const ct_model *m, const ct_trainer_state *st,
                    const char *run_config, const char *base_model, int save_total_limit, ct_error *err)
{
    char final[CT_PATH_MAX + 64], tmp[CT_PATH_MAX + 80], old[CT_PATH_MAX + 80], path[CT_PATH_MAX + 96];
    snprintf(final, sizeof final, "%s/checkpoint-%lld", output_dir, (long long)st->step);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    snprintf(old, sizeof old, "%s.old", final);
    snprintf(path, sizeof path, "%s/run_config.yaml", tmp);
    float *mo = NULL, *v = NULL;
    int rc = download_checked(lo, m, output_dir, (long long)st->step, &mo, &v, err);
    if (rc) return rc;
    ct_remove_tree(tmp);
    rc = ct_mkdirs(tmp, err);
    if (!rc) rc = lora_save_peft(lo, m, tmp, base_model, err);
    if (!rc) rc = write_state(tmp, mo, v, lo->n_params, st, err);
    if (!rc) rc = ct_write_file_atomic(path, run_config, strlen(run_config), err);
    if (!rc) rc = write_manifest(tmp, (long long)st->step, err);
    if (!rc) fsync_path(tmp);
    if (!rc) rc = put_in_place(tmp, final, old, err);
    free(mo);
    free(v);
    if (rc) {
        ct_remove_tree(tmp);
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return CT_FAIL_RUNTIME(err, "checkpoint at step %lld not saved: %s; the checkpoints already in %s are "
                               "untouched (HINT: free space in %s and rerun: training resumes from the newest one)",
                               (long long)st->step, why, output_dir, output_dir);
    }
    fsync_path(output_dir);
    if (save_total_limit > 0) {
        size_t n;
        ckpt_entry *e = list_checkpoints(output_dir, &n);
        /* Renamed before removal: a kill mid-delete leaves no half checkpoint-STEP
         * (checkpoint_clean_stale removes the .deleting folder on the next start). */
        for (size_t i = 0; i + (size_t)save_total_limit < n; i++) {
            if (e[i].step == (long long)st->step) continue;
            char victim[CT_PATH_MAX + 64], doomed[CT_PATH_MAX + 80];
            entry_path(victim, sizeof victim, output_dir, &e[i]);
            snprintf(doomed, sizeof doomed, "%s.deleting", victim);
            ct_remove_tree(doomed);
            if (rename(victim, doomed) == 0) ct_remove_tree(doomed);
        }
        free(e);
    }
    return CT_OK;
}

// ---- loading ----

/* CT_ERR_INPUT "PATH: TENSOR: FIELD is V (expected LO .. HI)" unless lo <= v <= hi. */
static int check_range(const char *path, const char *tensor, const char *field, long long v, long long lo,
                       long long hi, ct_error *err)
{
    if (v >= lo && v <= hi) return CT_OK;
    return CT_FAIL_INPUT(err, "%s: %s: %s is %lld (expected %lld .. %lld; the file was edited or is not ctune's)",
                         path, tensor, field, v, lo, hi);
}

/* The same for a count kept in a double: a whole number in [0, hi]. */
static int check_count(const char *path, const char *tensor, const char *field, double v, double hi,
                       ct_error *err)
{
    if (isfinite(v) && v >= 0 && v <= hi && v == floor(v)) return CT_OK;
    return CT_FAIL_INPUT(err, "%s: %s: %s is %g (expected a whole number in 0 .. %.0f; the file was edited or "
                         "is not ctune's)", path, tensor, field, v, hi);
}

/* A float saved as a double: any float value, NaN and inf included, but no
 * finite double beyond float range (converting one is undefined behaviour). */
static int check_float(const char *path, const char *tensor, const char *field, double v, ct_error *err)
{
    if (!isfinite(v) || fabs(v) <= FLT_MAX) return CT_OK;
    return CT_FAIL_INPUT(err, "%s: %s: %s is %g (expected an fp32 value; the file was edited or is not ctune's)",
                         path, tensor, field, v);
}

static int read_counters(const char *path, const st_reader *r, ct_trainer_state *st, ct_error *err)
{
    int64_t six = 6, two = 2, k[6];
    double d[2];
    const st_tensor *c, *s;
    int rc = st_expect(r, "counters", CT_DTYPE_I64, 1, &six, &c, err);
    if (!rc) rc = st_expect(r, "stats", CT_DTYPE_F64, 1, &two, &s, err);
    if (rc) return rc;
    memcpy(k, c->data, sizeof k);
    memcpy(d, s->data, sizeof d);
    /* The loop counts steps in an int and asks for step + 1. */
    rc = check_range(path, "counters", "step", k[0], 0, INT_MAX - 1, err);
    if (!rc) rc = check_range(path, "counters", "total_steps", k[1], 1, INT_MAX, err);
    /* every step takes >= 1 micro-batch, every epoch holds >= 1 */
    if (!rc) rc = check_range(path, "counters", "batches_done", k[5], k[0], INT64_MAX, err);
    if (!rc) rc = check_range(path, "counters", "epoch", k[2], 0, k[5], err);
    if (!rc) rc = check_range(path, "counters", "window", k[3], 0, INT64_MAX, err);
    if (!rc) rc = check_range(path, "counters", "bin", k[4], 0, INT64_MAX, err);
    if (!rc) rc = check_count(path, "stats", "tokens_seen", d[0], 1e18, err);
    if (!rc && !(isfinite(d[1]) && d[1] >= 0))
        rc = CT_FAIL_INPUT(err, "%s: stats: elapsed is %g (expected seconds >= 0)", path, d[1]);
    if (rc) return rc;
    st->step = k[0];
    st->total_steps = k[1];
    st->data = (ct_data_pos){(uint64_t)k[2], (uint64_t)k[3], (uint64_t)k[4], (uint64_t)k[5]};
    st->tokens_seen = d[0];
    st->elapsed = d[1];
    return CT_OK;
}

/* The logging window, the guard and the data CRC; absent in older checkpoints. */
static int read_run_state(const char *path, const st_reader *r, ct_trainer_state *st, ct_error *err)
{
    if (!st_find(r, "log_window")) return CT_OK;
    int64_t six = 6, one = 1, g[6], crc;
    double w[6];
    const st_tensor *tw, *tg, *tr, *tc;
    int rc = st_expect(r, "log_window", CT_DTYPE_F64, 1, &six, &tw, err);
    if (!rc) rc = st_expect(r, "guard", CT_DTYPE_I64, 1, &six, &tg, err);
    if (!rc) rc = st_expect(r, "data_crc32", CT_DTYPE_I64, 1, &one, &tc, err);
    if (rc) return rc;
    memcpy(w, tw->data, sizeof w);
    memcpy(g, tg->data, sizeof g);
    memcpy(&crc, tc->data, sizeof crc);
    long long step = st->step;
    /* the sums may be NaN (a skipped non-finite step is in the window); the counts may not */
    rc = check_count(path, "log_window", "tokens", w[4], st->tokens_seen, err);
    if (!rc) rc = check_count(path, "log_window", "targets", w[3], w[4], err);
    if (!rc) rc = check_count(path, "log_window", "micro_batches", w[5], (double)st->data.batches_done, err);
    /* the unread slots are those of the steps up to this one, which start at 1 */
    if (!rc) rc = check_range(path, "guard", "used", g[5], 0, step < CT_GUARD_MAX ? step : CT_GUARD_MAX, err);
    if (!rc && g[5] > 0) rc = check_range(path, "guard", "first_step", g[4], step - g[5] + 1, step - g[5] + 1, err);
    if (!rc) rc = check_range(path, "guard", "streak", g[0], 0, step, err);
    if (!rc) rc = check_range(path, "guard", "streak_start", g[1], 0, step, err);
    if (!rc) rc = check_range(path, "guard", "skipped", g[2], 0, step, err);
    if (!rc) rc = check_range(path, "guard", "skipped_since_log", g[3], 0, g[2], err);
    if (!rc) rc = check_range(path, "data_crc32", "value", crc, 0, UINT32_MAX, err);
    if (!rc) rc = check_float(path, "log_window", "loss_sum", w[0], err);
    if (!rc) rc = check_float(path, "log_window", "aux_sum", w[1], err);
    if (rc) return rc;
    int64_t n_ring = 1 + 2 * g[5]; /* only now: g[5] is unchecked when an earlier check failed */
    rc = st_expect(r, "guard_ring", CT_DTYPE_F64, 1, &n_ring, &tr, err);
    if (rc) return rc;
    double ring[1 + 2 * CT_GUARD_MAX];
    memcpy(ring, tr->data, (size_t)n_ring * sizeof(double));
    for (int64_t i = 0; i < n_ring && !rc; i++) rc = check_float(path, "guard_ring", "a value", ring[i], err);
    if (rc) return rc;
    st->window = (ct_log_window){.loss_sum = (float)w[0], .aux_sum = (float)w[1], .loss = w[2], .targets = w[3],
                                 .tokens = w[4], .micro_batches = (int64_t)w[5]};
    ct_guard_state *gs = &st->guard;
    *gs = (ct_guard_state){.streak = g[0], .streak_start = g[1], .skipped = g[2], .skipped_since_log = g[3],
                           .first_step = g[4], .used = g[5], .last_norm_sq = (float)ring[0]};
    for (int64_t i = 0; i < 2 * g[5]; i++) gs->ring[i] = (float)ring[1 + i];
    st->data_crc32 = (uint32_t)crc;
    st->has_run_state = true;
    return CT_OK;
}

int checkpoint_read_state(const char *dir, ct_trainer_state *st, ct_error *err)
{
    int rc = checkpoint_verify(dir, err);
    if (rc) return rc;
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/trainer_state.safetensors", dir);
    st_reader *r = st_open(path, err);
    if (!r) return err->code;
    ct_trainer_state s = {0};
    rc = read_counters(path, r, &s, err);
    if (!rc) rc = read_run_state(path, r, &s, err);
    st_close(r);
    if (!rc) *st = s;
    return rc;
}

int checkpoint_load_weights(const char *dir, ct_lora *lo, const ct_model *m, ct_error *err)
{
    int rc = lora_load_peft(lo, m, dir, err);
    if (rc) return rc;
    char path[CT_PATH_MAX + 64], what[600];
    float *host = ct_malloc(lo->n_params * sizeof(float));
    m->be->download(m->be, host, lo->params, lo->n_params * sizeof(float));
    if (!values_ok(lo, host, false, what, sizeof what)) {
        free(host);
        return CT_FAIL_INPUT(err, "%s/adapter_model.safetensors: %s (expected finite weights)", dir, what);
    }
    snprintf(path, sizeof path, "%s/trainer_state.safetensors", dir);
    st_reader *r = st_open(path, err);
    if (!r) {
        free(host);
        return err->code;
    }
    int64_t n = (int64_t)lo->n_params;
    const char *names[2] = {"exp_avg", "exp_avg_sq"};
    float *dev[2] = {lo->m, lo->v};
    for (int i = 0; i < 2 && !rc; i++) {
        const st_tensor *t;
        rc = st_expect(r, names[i], CT_DTYPE_F32, 1, &n, &t, err);
        if (rc) break;
        memcpy(host, t->data, t->nbytes);
        if (!values_ok(lo, host, i == 1, what, sizeof what))
            rc = CT_FAIL_INPUT(err, "%s: %s: %s (expected finite values%s)", path, names[i], what,
                               i == 1 ? " >= 0: a second moment is a mean of squares" : "");
        else
            m->be->upload(m->be, dev[i], host, t->nbytes);
    }
    free(host);
    st_close(r);
    return rc;
}
