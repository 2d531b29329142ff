/* test_cuda_nccl.c — NCCL as dist.c uses it (nccl.h): loaded at run time, a
 * communicator from a unique id, the fp32 sum all-reduce queued on the CUDA
 * backend's stream, in order with the backend's own work. One process, one
 * GPU (world 1: NCCL refuses two ranks on one GPU), so the sum is the input.
 * A library that cannot be loaded must fail with a message saying what to
 * install, and a library without NCCL's functions is refused by name;
 * without a GPU the GPU tests report "skipped: no GPU". */
#include "backend.h"
#include "check.h"
#include "nccl.h"

static ct_backend *gpu;
static ct_nccl *nccl;
static ct_error load_err;

#define NEED_GPU() do { if (!gpu) SKIP("skipped: no GPU"); } while (0)
#define NEED_NCCL() do { if (!nccl) SKIP("skipped: no libnccl.so.2 (%s)", load_err.msg); } while (0)

TEST(a_missing_nccl_is_a_clear_error)
{
    ct_error err = {0};
    ct_nccl *n = nccl_load_from("libnccl-not-installed.so.2", &err);
    CHECK(!n, "a library that does not exist was loaded");
    CHECK(err.code == CT_ERR_RUNTIME, "code %d", err.code);
    CHECK(strstr(err.msg, "libnccl-not-installed.so.2") && strstr(err.msg, "LD_LIBRARY_PATH"), "message: %s", err.msg);
    nccl_close(n, 0);
}

TEST(a_library_that_is_not_nccl_is_a_clear_error)
{
    ct_error err = {0};
    ct_nccl *n = nccl_load_from("libz.so.1", &err);
    CHECK(!n, "zlib was taken for NCCL");
    CHECK(err.code == CT_ERR_RUNTIME && strstr(err.msg, "libz.so.1 has no ncclGetVersion"), "message: %s", err.msg);
    nccl_close(n, 0);
}

TEST(sum_over_one_rank_queued_after_the_backends_work_is_that_work)
{
    NEED_GPU();
    NEED_NCCL();
    ct_error err = {0};
    unsigned char id[CT_NCCL_ID_BYTES];
    REQUIRE(nccl_unique_id(nccl, id, &err) == CT_OK, "%s", err.msg);
    REQUIRE(nccl_comm_init(nccl, 1, id, 0, &err) == CT_OK, "%s", err.msg);
    enum { N = 3 << 20 };
    float *host = ct_malloc(N * sizeof(float)), *back = ct_malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++) host[i] = (float)((int)(i % 2001) - 1000) * 0.37f;
    float *x = gpu->alloc(gpu, N * sizeof(float));
    REQUIRE(x, "out of device memory");
    /* upload, then zero the first half on the stream: the sum must see both */
    gpu->upload(gpu, x, host, N * sizeof(float));
    gpu->zero(gpu, x, N / 2 * sizeof(float));
    REQUIRE(nccl_sum_f32(nccl, x, N, gpu->native_stream(gpu), &err) == CT_OK, "%s", err.msg);
    gpu->download(gpu, back, x, N * sizeof(float));
    size_t wrong = 0;
    for (size_t i = 0; i < N; i++) wrong += back[i] != (i < N / 2 ? 0.0f : host[i]);
    CHECK(wrong == 0, "%zu of %d values differ from the input", wrong, N);
    CHECK(!strncmp(nccl_version(nccl), "NCCL 2.", 7), "version '%s'", nccl_version(nccl));
    gpu->free(gpu, x);
    free(host);
    free(back);
}

int main(void)
{
    ct_error err = {0};
    gpu = backend_cuda_new(&err);
    if (!gpu) printf("# CUDA backend unavailable: %s\n", err.msg);
    nccl = nccl_load(&load_err);
    RUN(a_missing_nccl_is_a_clear_error);
    RUN(a_library_that_is_not_nccl_is_a_clear_error);
    RUN(sum_over_one_rank_queued_after_the_backends_work_is_that_work);
    nccl_close(nccl, 0);
    if (gpu) gpu->destroy(gpu);
    return check_summary();
}
