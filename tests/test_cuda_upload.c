/* test_cuda_upload.c — the batch upload (backend.h, "batch upload") writes from
 * the copy stream into memory that alloc has just handed out: the copy must land
 * after alloc's zero-fill, not be wiped by it. The allocations are large (up to
 * 24 GiB: the activation arena of a 32k-token micro-batch is of that size), so a
 * zero-fill still running when the copy lands takes milliseconds and shows.
 * Without a GPU every test reports "skip NAME: skipped: no GPU". */
#include "backend.h"
#include "check.h"

#include <stdint.h>

static ct_backend *gpu;

#define NEED_GPU() do { if (!gpu) SKIP("skipped: no GPU"); } while (0)

enum { TAIL = 4 << 20 }; /* bytes uploaded at the end of the allocation */

/* Allocates `bytes` (half the free memory, at most 24 GiB), uploads a pattern
 * into its last TAIL bytes through upload slot `slot` at once, and returns how
 * many bytes came back different (0 when right); -1 when memory is short. */
static long upload_into_fresh(size_t bytes, int slot, uint8_t seed)
{
    void *big = gpu->alloc(gpu, bytes);
    if (!big) return -1;
    bool pinned = false;
    uint8_t *host = gpu->host_alloc(gpu, TAIL, &pinned);
    uint8_t *back = ct_malloc(TAIL);
    for (size_t i = 0; i < TAIL; i++) host[i] = (uint8_t)(seed + i * 31 + (i >> 12)) | 1; /* never 0 */
    char *dst = (char *)big + bytes - TAIL;
    gpu->upload_async(gpu, dst, host, TAIL, slot);
    gpu->upload_wait(gpu, slot);
    gpu->download(gpu, back, dst, TAIL);
    long wrong = 0;
    for (size_t i = 0; i < TAIL; i++) wrong += back[i] != host[i];
    gpu->upload_release(gpu, slot);
    gpu->host_free(gpu, host, pinned);
    free(back);
    gpu->free(gpu, big);
    return wrong;
}

static size_t big_size(void)
{
    size_t free_b = gpu->memory_free(gpu), cap = (size_t)24 << 30;
    size_t want = free_b / 2 < cap ? free_b / 2 : cap;
    return want / TAIL * TAIL;
}

TEST(first_upload_into_a_fresh_allocation_survives_its_zero_fill)
{
    NEED_GPU();
    long wrong = upload_into_fresh(big_size(), 0, 7);
    REQUIRE(wrong >= 0, "could not allocate %zu bytes", big_size());
    CHECK(wrong == 0, "%ld of %d uploaded bytes were overwritten by the zero-fill", wrong, TAIL);
}

/* A second graph (eval after train, a retry at a smaller size) takes a new
 * allocation after the upload slots have been used and released before it. */
TEST(upload_into_a_second_allocation_survives_its_zero_fill)
{
    NEED_GPU();
    for (int slot = 0; slot < CT_UPLOAD_SLOTS; slot++) {
        long wrong = upload_into_fresh(big_size(), slot, (uint8_t)(11 + slot));
        REQUIRE(wrong >= 0, "could not allocate %zu bytes", big_size());
        CHECK(wrong == 0, "slot %d: %ld of %d uploaded bytes were overwritten by the zero-fill", slot, wrong, TAIL);
    }
}

TEST(alloc_returns_zeros)
{
    NEED_GPU();
    size_t n = (size_t)64 << 20;
    uint8_t *back = ct_malloc(n);
    void *p = gpu->alloc(gpu, n);
    REQUIRE(p != NULL, "could not allocate %zu bytes", n);
    gpu->download(gpu, back, p, n);
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++) nonzero += back[i] != 0;
    CHECK(nonzero == 0, "%zu of %zu bytes not zero", nonzero, n);
    gpu->free(gpu, p);
    free(back);
}

int main(void)
{
    ct_error err = {0};
    gpu = backend_cuda_new(&err);
    if (!gpu) printf("# CUDA backend unavailable: %s\n", err.msg);
    RUN(alloc_returns_zeros);
    RUN(first_upload_into_a_fresh_allocation_survives_its_zero_fill);
    RUN(upload_into_a_second_allocation_survives_its_zero_fill);
    if (gpu) gpu->destroy(gpu);
    return check_summary();
}
