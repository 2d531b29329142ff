/* offload.cu — what the memory plan, activation offload and batch upload need
 * from the GPU: free memory, an up-front scratch reservation, page-locked host
 * memory, and device<->host copies on a second stream (backend.h, "activation
 * offload" and "batch upload").
 *
 * Ordering without host waits: a store or load first records compute_mark on
 * the compute stream and makes the copy stream wait for it (so the copy sees
 * every write queued before it), then copies and records slot_done[slot];
 * offload_wait makes the compute stream wait for slot_done[slot]. Re-recording
 * an event is safe: a wait binds to the record that preceded it. */
#include "ct_cuda.cuh"

extern "C" {
#include "hooks.h"
}

#include <stdio.h>
#include <stdlib.h>

void cuda_offload_init(cuda_ctx *c)
{
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&c->compute_mark, cudaEventDisableTiming));
    for (int i = 0; i < CT_OFFLOAD_SLOTS; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&c->slot_done[i], cudaEventDisableTiming));
    for (int i = 0; i < CT_UPLOAD_SLOTS; i++) {
        CUDA_CHECK(cudaEventCreateWithFlags(&c->upload_released[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&c->upload_done[i], cudaEventDisableTiming));
    }
}

void cuda_offload_destroy(cuda_ctx *c)
{
    CUDA_CHECK(cudaStreamSynchronize(c->copy_stream));
    for (int i = 0; i < CT_OFFLOAD_SLOTS; i++) CUDA_CHECK(cudaEventDestroy(c->slot_done[i]));
    for (int i = 0; i < CT_UPLOAD_SLOTS; i++) {
        CUDA_CHECK(cudaEventDestroy(c->upload_released[i]));
        CUDA_CHECK(cudaEventDestroy(c->upload_done[i]));
    }
    CUDA_CHECK(cudaEventDestroy(c->compute_mark));
    CUDA_CHECK(cudaStreamDestroy(c->copy_stream));
}

static size_t cuda_memory_free(ct_backend *be)
{
    size_t free_b = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    return free_b;
}

static bool cuda_reserve_scratch(ct_backend *be, size_t bytes)
{
    cuda_ctx *c = ctx_of(be);
    if (bytes <= c->scratch_bytes) return true;
    /* Ask first, so that running out is an answer here rather than a fatal error
     * inside cuda_scratch; the memory is then taken for good (freed at exit). */
    void *p = NULL;
    cudaError_t e = cudaMallocAsync(&p, bytes, c->stream);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return false;
    }
    CUDA_CHECK(e);
    /* Zero-filled once, as the arena is, so that no op can read what another
     * process left there: and compute-sanitizer's initcheck, which does not
     * record cuBLASLt's stores, flagged the loss reading the logits a GEMM had
     * written into unfilled scratch (the loss equalled the CPU backend's). */
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, c->stream));
    if (c->scratch) CUDA_CHECK(cudaFreeAsync(c->scratch, c->stream));
    c->scratch = p;
    c->scratch_bytes = bytes;
    return true;
}

/* Page-locked where the driver gives it (never under the test hook
 * CTUNE_INJECT_PIN_FAIL, hooks.h), else pageable. */
static void *cuda_host_alloc(ct_backend *be, size_t bytes, bool *pinned)
{
    void *p = NULL;
    if (!hooks_get()->inject_pin_fail && cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) == cudaSuccess) {
        *pinned = true;
        return p;
    }
    (void)cudaGetLastError();
    *pinned = false;
    return malloc(bytes ? bytes : 1);
}

static void cuda_host_free(ct_backend *be, void *p, bool pinned)
{
    if (!p) return;
    if (pinned) CUDA_CHECK(cudaFreeHost(p));
    else free(p);
}

static void copy_after_compute(cuda_ctx *c, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                               int slot)
{
    CT_ASSERT(slot >= 0 && slot < CT_OFFLOAD_SLOTS, "offload slot %d out of range", slot);
    CUDA_CHECK(cudaEventRecord(c->compute_mark, c->stream));
    CUDA_CHECK(cudaStreamWaitEvent(c->copy_stream, c->compute_mark, 0));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, c->copy_stream));
    CUDA_CHECK(cudaEventRecord(c->slot_done[slot], c->copy_stream));
}

static void cuda_offload_store(ct_backend *be, void *host_dst, const void *src, size_t bytes, int slot)
{
    copy_after_compute(ctx_of(be), host_dst, src, bytes, cudaMemcpyDeviceToHost, slot);
}

static void cuda_offload_load(ct_backend *be, void *dst, const void *host_src, size_t bytes, int slot)
{
    copy_after_compute(ctx_of(be), dst, host_src, bytes, cudaMemcpyHostToDevice, slot);
}

static void cuda_offload_wait(ct_backend *be, int slot)
{
    cuda_ctx *c = ctx_of(be);
    CT_ASSERT(slot >= 0 && slot < CT_OFFLOAD_SLOTS, "offload slot %d out of range", slot);
    CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->slot_done[slot], 0));
}

static void check_upload_slot(int slot)
{
    CT_ASSERT(slot >= 0 && slot < CT_UPLOAD_SLOTS, "upload slot %d out of range", slot);
}

static void cuda_upload_release(ct_backend *be, int slot)
{
    check_upload_slot(slot);
    CUDA_CHECK(cudaEventRecord(ctx_of(be)->upload_released[slot], ctx_of(be)->stream));
}

/* Waits only for the compute that read this slot's set last, not for the work
 * queued since: the copy overlaps the current micro-batch. */
static void cuda_upload_async(ct_backend *be, void *dst, const void *host_src, size_t bytes, int slot)
{
    cuda_ctx *c = ctx_of(be);
    check_upload_slot(slot);
    CUDA_CHECK(cudaStreamWaitEvent(c->copy_stream, c->upload_released[slot], 0));
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, c->copy_stream));
    CUDA_CHECK(cudaEventRecord(c->upload_done[slot], c->copy_stream));
}

static void cuda_upload_wait(ct_backend *be, int slot)
{
    check_upload_slot(slot);
    CUDA_CHECK(cudaStreamWaitEvent(ctx_of(be)->stream, ctx_of(be)->upload_done[slot], 0));
}

static bool cuda_upload_host_wait(ct_backend *be, int slot)
{
    cuda_ctx *c = ctx_of(be);
    check_upload_slot(slot);
    cudaError_t e = cudaEventQuery(c->upload_done[slot]);
    if (e == cudaSuccess) return false;
    if (e != cudaErrorNotReady) CUDA_CHECK(e);
    (void)cudaGetLastError(); /* not-ready is an answer, not an error */
    CUDA_CHECK(cudaEventSynchronize(c->upload_done[slot]));
    return true;
}

void cuda_fill_offload_ops(ct_backend *be)
{
    be->upload_release = cuda_upload_release;
    be->upload_async = cuda_upload_async;
    be->upload_wait = cuda_upload_wait;
    be->upload_host_wait = cuda_upload_host_wait;
    be->memory_free = cuda_memory_free;
    be->reserve_scratch = cuda_reserve_scratch;
    be->host_alloc = cuda_host_alloc;
    be->host_free = cuda_host_free;
    be->offload_store = cuda_offload_store;
    be->offload_load = cuda_offload_load;
    be->offload_wait = cuda_offload_wait;
}
