/* common.h — what every ctune module shares: error values, checked allocation,
 * overflow-safe size arithmetic, bf16 conversion, a seeded RNG and a
 * counter-based hash (so the CPU and CUDA backends draw identical dropout masks).
 *
 * Errors are values (docs/ARCHITECTURE.md): a function that can fail on user input returns
 * CT_OK or an error code and fills a ct_error with one line naming the file and
 * what is wrong. Only main() turns an error into an exit code. */
#ifndef CT_COMMON_H
#define CT_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    CT_OK = 0,
    CT_ERR_RUNTIME = 1, /* the machine failed us: out of memory, I/O error, device error */
    CT_ERR_INPUT = 2,   /* the user's input is wrong: config, shard, model file, CLI */
};

typedef struct ct_error {
    int code;        /* CT_ERR_* of the last failure, CT_OK if none */
    char msg[1024];  /* one line, no trailing newline */
} ct_error;

/* Formats a one-line message into err (err may be NULL) and returns code. */
int ct_fail(ct_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define CT_FAIL_INPUT(err, ...)   ct_fail((err), CT_ERR_INPUT, __VA_ARGS__)
#define CT_FAIL_RUNTIME(err, ...) ct_fail((err), CT_ERR_RUNTIME, __VA_ARGS__)

/* Allocation that cannot return NULL: on failure prints file:line, the size and a
 * HINT, then exits 1 (out of host memory is not recoverable inside a step). */
void *ct_malloc_at(size_t n, const char *file, int line);
void *ct_calloc_at(size_t count, size_t size, const char *file, int line);
void *ct_realloc_at(void *p, size_t n, const char *file, int line);
char *ct_strdup_at(const char *s, const char *file, int line);
#define ct_malloc(n)      ct_malloc_at((n), __FILE__, __LINE__)
#define ct_calloc(c, s)   ct_calloc_at((c), (s), __FILE__, __LINE__)
#define ct_realloc(p, n)  ct_realloc_at((p), (n), __FILE__, __LINE__)
#define ct_strdup(s)      ct_strdup_at((s), __FILE__, __LINE__)

/* Programming errors (not user errors): print file:line and the message, abort. */
#define CT_ASSERT(cond, ...) do { if (!(cond)) ct_assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__); } while (0)
void ct_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));

/* Overflow-safe size arithmetic: return false (and leave *out alone) on overflow. */
bool ct_size_mul(size_t a, size_t b, size_t *out);
bool ct_size_add(size_t a, size_t b, size_t *out);

/* bf16 <-> fp32, round to nearest even; NaN stays NaN. */
uint16_t ct_f32_to_bf16(float f);
float    ct_bf16_to_f32(uint16_t h);
float    ct_f16_to_f32(uint16_t h);   /* IEEE half, subnormals, inf and NaN included */

/* xoshiro256** seeded by splitmix64: deterministic across machines for a seed.
 * The state is plain data so a checkpoint can save and restore it. */
typedef struct ct_rng { uint64_t s[4]; } ct_rng;
void     ct_rng_seed(ct_rng *r, uint64_t seed);
uint64_t ct_rng_u64(ct_rng *r);
double   ct_rng_uniform(ct_rng *r);              /* [0, 1) */
uint64_t ct_rng_below(ct_rng *r, uint64_t n);    /* [0, n), unbiased; n > 0 */
float    ct_rng_normal(ct_rng *r);               /* N(0, 1), Box-Muller */

/* Stateless hash of (seed, index) -> uniform [0, 1) in float, identical on host and
 * device (the CUDA backend reimplements the same arithmetic). Used for dropout. */
uint64_t ct_hash64(uint64_t seed, uint64_t index);
static inline float ct_hash_uniform(uint64_t seed, uint64_t index)
{
    return (float)(ct_hash64(seed, index) >> 40) * (1.0f / 16777216.0f);
}

/* Wall-clock seconds from a monotonic clock. */
double ct_now(void);

/* Reads a whole file into a NUL-terminated buffer (caller frees). On failure
 * returns NULL and fills err with "PATH: reason". */
char *ct_read_file(const char *path, size_t *len, ct_error *err);
/* The same, but a file of more than max bytes is CT_ERR_INPUT ("PATH: larger
 * than the MAX-byte limit ..."): caps what untrusted small files (configs,
 * JSON) can make us read into memory. */
char *ct_read_file_max(const char *path, size_t max, size_t *len, ct_error *err);

/* Writes data to PATH atomically: PATH.tmp, fsync, rename, fsync of the folder.
 * Nothing is left at PATH on failure except what was there before. */
int ct_write_file_atomic(const char *path, const void *data, size_t len, ct_error *err);

/* The same for a file made of n pieces written one after another (no image of
 * the whole file is built). */
typedef struct ct_piece { const void *data; size_t len; } ct_piece;
int ct_write_pieces_atomic(const char *path, const ct_piece *pieces, int n, ct_error *err);

/* cp as 1-4 bytes of UTF-8 at out; returns the count. */
size_t ct_utf8_encode(char *out, uint32_t cp);

/* mkdir -p. */
int ct_mkdirs(const char *path, ct_error *err);

/* rm -rf PATH: a file, or a folder and everything below it (links are removed,
 * not followed); nothing happens when PATH does not exist. */
void ct_remove_tree(const char *path);

static inline size_t ct_ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

#endif
