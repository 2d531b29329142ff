/* backend_cuda_stub.c — backend_cuda_new for builds without nvcc: says why. */
#ifndef CT_HAVE_CUDA
#include "backend.h"

ct_backend *backend_cuda_new_with(const ct_cuda_options *opt, ct_error *err)
{
    CT_FAIL_RUNTIME(err, "this ctune was built without CUDA (nvcc was not found at build time)");
    return NULL;
}

ct_backend *backend_cuda_new(ct_error *err) { return backend_cuda_new_with(NULL, err); }
#endif
