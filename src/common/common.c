/* common.c — see common.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int ct_fail(ct_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

static void out_of_memory(size_t n, const char *file, int line)
{
    fprintf(stderr, "ctune: %s:%d: out of host memory allocating %zu bytes\n"
                    "HINT: lower data.tokens_per_micro_batch or free host memory\n", file, line, n);
    exit(CT_ERR_RUNTIME);
}

void *ct_malloc_at(size_t n, const char *file, int line)
{
    void *p = malloc(n ? n : 1);
    if (!p) out_of_memory(n, file, line);
    return p;
}

void *ct_calloc_at(size_t count, size_t size, const char *file, int line)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) out_of_memory(count * size, file, line);
    return p;
}

void *ct_realloc_at(void *p, size_t n, const char *file, int line)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) out_of_memory(n, file, line);
    return q;
}

char *ct_strdup_at(const char *s, const char *file, int line)
{
    size_t n = strlen(s) + 1;
    char *d = ct_malloc_at(n, file, line);
    memcpy(d, s, n);
    return d;
}

void ct_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    fprintf(stderr, "ctune: internal error at %s:%d (%s): ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nHINT: this is a bug in ctune; please report it with the command that ran\n");
    abort();
}

bool ct_size_mul(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

bool ct_size_add(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

uint16_t ct_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float ct_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float ct_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = (float)man * (1.0f / 16777216.0f); /* zero or subnormal: man * 2^-24, exact */
        return sign ? -f : f;
    }
    uint32_t u = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ct_rng_seed(ct_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t ct_rng_u64(ct_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ct_rng_uniform(ct_rng *r) { return (double)(ct_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

uint64_t ct_rng_below(ct_rng *r, uint64_t n)
{
    /* Rejection sampling keeps the draw unbiased for any n. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = ct_rng_u64(r); while (x >= limit);
    return x % n;
}

float ct_rng_normal(ct_rng *r)
{
    double u1 = ct_rng_uniform(r), u2 = ct_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t ct_hash64(uint64_t seed, uint64_t index)
{
    uint64_t x = seed ^ (index * 0xd1b54a32d192ed03ull);
    return splitmix64(&x);
}

double ct_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

char *ct_read_file(const char *path, size_t *len, ct_error *err)
{
    return ct_read_file_max(path, SIZE_MAX - 1, len, err);
}

char *ct_read_file_max(const char *path, size_t max, size_t *len, ct_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        CT_FAIL_INPUT(err, "%s: cannot open (%s)", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) { /* fopen opens a folder; reading it then fails */
        fclose(f);
        CT_FAIL_INPUT(err, "%s: is a folder, not a file", path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = ct_malloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = ct_realloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
        if (n > max) {
            fclose(f);
            free(buf);
            CT_FAIL_INPUT(err, "%s: larger than the %zu-byte limit for this kind of file (not the file it should be?)",
                          path, max);
            return NULL;
        }
    }
    int bad = ferror(f), e = errno;
    fclose(f);
    if (bad) {
        free(buf);
        CT_FAIL_INPUT(err, "%s: read error (%s)", path, strerror(e));
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static int fsync_dir_of(const char *path)
{
    char *copy = ct_strdup(path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    free(copy);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* write(2) until all of n bytes are out; -1 with errno on failure. */
static int write_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int ct_write_pieces_atomic(const char *path, const ct_piece *pieces, int n, ct_error *err)
{
    size_t plen = strlen(path);
    char *tmp = ct_malloc(plen + 8);
    snprintf(tmp, plen + 8, "%s.tmp", path);
    int rc = CT_OK, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = CT_FAIL_RUNTIME(err, "%s: cannot create (%s)", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    for (int i = 0; i < n && !rc; i++)
        if (write_all(fd, pieces[i].data, pieces[i].len) != 0)
            rc = CT_FAIL_RUNTIME(err, "%s: write failed (%s)", tmp, strerror(errno));
    if (!rc && fsync(fd) != 0) rc = CT_FAIL_RUNTIME(err, "%s: fsync/close failed (%s)", tmp, strerror(errno));
    if (close(fd) != 0 && !rc) rc = CT_FAIL_RUNTIME(err, "%s: fsync/close failed (%s)", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = CT_FAIL_RUNTIME(err, "%s: rename to %s failed (%s)", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    else fsync_dir_of(path);
    free(tmp);
    return rc;
}

int ct_write_file_atomic(const char *path, const void *data, size_t len, ct_error *err)
{
    const ct_piece one = {data, len};
    return ct_write_pieces_atomic(path, &one, 1, err);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

void ct_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0) nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int ct_mkdirs(const char *path, ct_error *err)
{
    if (!path[0]) return CT_FAIL_INPUT(err, "an empty folder name");
    char *buf = ct_strdup(path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                int rc = CT_FAIL_RUNTIME(err, "%s: cannot create folder (%s)", buf, strerror(errno));
                free(buf);
                return rc;
            }
            *p = c;
            if (c == 0) break;
        }
    }
    free(buf);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return CT_FAIL_RUNTIME(err, "%s: not a folder", path);
    return CT_OK;
}

size_t ct_utf8_encode(char *out, uint32_t cp)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | cp >> 6); o[1] = (unsigned char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}
