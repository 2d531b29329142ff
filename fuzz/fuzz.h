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
#include <sys/mman.h>
#include <unistd.h>

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

#endif
