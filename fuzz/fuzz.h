/* fuzz.h — shared by the libFuzzer targets in fuzz/ and by their replay in CI
 * (tests/test_fuzz_regressions.c).
 *
 * Each target file defines `int fuzz_NAME(const uint8_t *data, size_t size)`,
 * which feeds the bytes to one untrusted-input reader and checks what must hold
 * whatever the bytes are (no crash, no leak, printed forms read back).
 * CT_FUZZ_MAIN(fuzz_NAME) becomes libFuzzer's entry point only in the fuzz
 * build (-DCT_LIBFUZZER): without it the test binary can include every target
 * into one ordinary program and replay the saved crashing inputs. */
#ifndef CT_FUZZ_H
#define CT_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#ifdef CT_LIBFUZZER
#define CT_FUZZ_MAIN(fn) \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fn(data, size); }
#else
#define CT_FUZZ_MAIN(fn)
#endif

/* A broken invariant is a bug like a crash: abort, so libFuzzer saves the input. */
#define FUZZ_ASSERT(cond, ...) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant broken at %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); abort(); } } while (0)

/* The readers under test open paths and mmap them. An anonymous memory file
 * (memfd) gives them a real path, /proc/self/fd/N, without touching the disk:
 * one per process, rewritten for every input. */
static inline const char *fuzz_memfile(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("ctune-fuzz", 0);
        FUZZ_ASSERT(fd >= 0, "memfd_create failed");
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    FUZZ_ASSERT(ftruncate(fd, 0) == 0 && ftruncate(fd, (off_t)size) == 0, "ftruncate failed");
    for (size_t done = 0; done < size;) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        FUZZ_ASSERT(w > 0, "pwrite failed");
        done += (size_t)w;
    }
    return path;
}

/* Readers of a folder (an adapter, a checkpoint) get several files from one
 * input: the files' bytes joined by FUZZ_FILE_SEP, in an order each target
 * names. fuzz/run.sh and tests/test_fuzz_regressions.c join seed folders the
 * same way. */
#define FUZZ_FILE_SEP "\n--ctune-fuzz-file--\n"

/* Splits data at FUZZ_FILE_SEP into at most max parts (the last one keeps any
 * further separators); returns how many. */
static inline int fuzz_split(const uint8_t *data, size_t size, const uint8_t **part, size_t *len, int max)
{
    const size_t sep = sizeof FUZZ_FILE_SEP - 1;
    int n = 0;
    while (n + 1 < max) {
        const uint8_t *at = memmem(data, size, FUZZ_FILE_SEP, sep);
        if (!at) break;
        part[n] = data;
        len[n++] = (size_t)(at - data);
        size -= (size_t)(at - data) + sep;
        data = at + sep;
    }
    part[n] = data;
    len[n++] = size;
    return n;
}

/* An empty folder for one input, the same path for every input of a process
 * (under /dev/shm where there is one: no disk writes per input). */
static inline const char *fuzz_dir(void)
{
    static char path[64];
    struct stat st;
    snprintf(path, sizeof path, "%s/ctune-fuzz-%d", stat("/dev/shm", &st) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
    ct_remove_tree(path);
    FUZZ_ASSERT(mkdir(path, 0700) == 0, "cannot create %s", path);
    return path;
}

static inline void fuzz_write(const char *dir, const char *name, const uint8_t *data, size_t size)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    FUZZ_ASSERT(f && fwrite(data, 1, size, f) == size && fclose(f) == 0, "cannot write %s", path);
}

/* What every failing reader promises: an input error of one line. */
static inline void fuzz_input_error(int rc, const ct_error *err)
{
    FUZZ_ASSERT(rc == CT_ERR_INPUT, "error code %d, expected CT_ERR_INPUT: %s", rc, err->msg);
    FUZZ_ASSERT(err->msg[0] && !strchr(err->msg, '\n'), "not a one-line message: '%s'", err->msg);
}

#endif
