/* optim.cu — gradient norm and AdamW on fp32 LoRA parameters.
 *
 * sum_squares: out[0] += sum(g^2). A fixed grid of SUMSQ_BLOCKS blocks writes one
 * double partial each into a buffer allocated once, then one block adds them up
 * in a fixed order: the result does not depend on timing (no atomics), so
 * gradients norms, clipping and hence training are bit-reproducible run to run.
 *
 * adamw: torch.optim.AdamW (single-tensor path) after clip_grad_norm_, exactly as
 * backend.h and the CPU backend state it: the clip coefficient is computed by
 * each thread from norm_sq[0] on the device (no host sync); bias corrections are
 * computed on the host in double, as torch does from a Python float step. A
 * non-finite norm_sq makes every thread return at once: the step is skipped
 * (optim.h's non-finite guard), with no host sync to decide it. */
#include "ct_cuda.cuh"

#include <math.h>

#define SUMSQ_THREADS 256

// ---- kernels ----

__global__ void sum_squares_partial_kernel(double *partials, const float *g, size_t n)
{
    __shared__ double sh[SUMSQ_THREADS];
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)g[i] * g[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = SUMSQ_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

__global__ void sum_squares_final_kernel(float *out, const double *partials, int n)
{
    __shared__ double sh[SUMSQ_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += partials[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = SUMSQ_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] += (float)sh[0];
}

__global__ void adamw_kernel(float *p, const float *grad, float *m, float *v, size_t n,
                             const float *norm_sq, float max_norm, float decay, float b1, float b2,
                             float eps, float step_size, float bc2_sqrt)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !isfinite(norm_sq[0])) return; /* a NaN/inf gradient: skip the step (optim.h's guard) */
    float clip = 1.0f;
    if (max_norm > 0.0f) {
        float c = max_norm / (sqrtf(norm_sq[0]) + 1e-6f);
        clip = c < 1.0f ? c : 1.0f;
    }
    float gi = clip * grad[i];
    float pi = p[i] * decay;
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
}

// ---- launchers ----

void cuda_sum_squares(ct_backend *be, float *out, const float *g, size_t n)
{
    cuda_ctx *c = ctx_of(be);
    sum_squares_partial_kernel<<<SUMSQ_BLOCKS, SUMSQ_THREADS, 0, c->stream>>>(c->partials, g, n);
    LAUNCH_CHECK();
    sum_squares_final_kernel<<<1, SUMSQ_THREADS, 0, c->stream>>>(out, c->partials, SUMSQ_BLOCKS);
    LAUNCH_CHECK();
}

void cuda_adamw(ct_backend *be, float *p, const float *grad, float *m, float *v, size_t n,
                const float *norm_sq, float max_norm, float lr, float b1, float b2, float eps,
                float wd, int step)
{
    CT_ASSERT(step >= 1, "adamw: step must start at 1, got %d", step);
    if (n == 0) return;
    float decay = (float)(1.0 - (double)lr * wd);
    float step_size = (float)(lr / (1.0 - pow(b1, step)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(b2, step));
    adamw_kernel<<<grid_for(n, 256), 256, 0, ctx_of(be)->stream>>>(
        p, grad, m, v, n, norm_sq, max_norm, decay, b1, b2, eps, step_size, bc2_sqrt);
    LAUNCH_CHECK();
}
