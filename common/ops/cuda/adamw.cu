// Global grad-norm pieces and AdamW (Loshchilov & Hutter 2019) as
// torch.optim.AdamW after torch.nn.utils.clip_grad_norm_ scaling, with no host
// syncs: the clip scale is computed on the device from norm_sq.
//   sumsq: out[0] (+)= sum x^2, two passes (per-block partials in the context's
//          partials buffer, then one block sums them in a fixed order):
//          deterministic, no atomics.
#include <math.h>

#include "common/ops/cuda/cuda_common.cuh"

#define SUMSQ_THREADS 256

__global__ void sumsq_partial_kernel(float *partials, const float *x, size_t n) {
    __shared__ float sh[32];
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += x[i] * x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(float *out, const float *partials, int P, int accumulate) {
    __shared__ float sh[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < P; i += blockDim.x) s += partials[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = accumulate ? out[0] + s : s;
}

void cuda_sumsq(const ops_ctx_t *c, float *out, const float *x, size_t n, int accumulate) {
    cudaStream_t s = cuda_stream(c);
    int P = (int)cuda_blocks(n, SUMSQ_THREADS * 8, CUDA_PARTIALS);
    float *part = cuda_state(c)->partials;
    if (n) {
        sumsq_partial_kernel<<<P, SUMSQ_THREADS, 0, s>>>(part, x, n);
        cuda_check_launch();
    } else {
        P = 0;
    }
    sumsq_final_kernel<<<1, SUMSQ_THREADS, 0, s>>>(out, part, P, accumulate);
    cuda_check_launch();
}

// step = lr / (1 - b1^t), bc2s = sqrt(1 - b2^t): host-computed in double.
__global__ void adamw_kernel(float *master, bf16 *work, const float *grad, float *m, float *v,
                             size_t n, float lr, float b1, float b2, float eps, float wd,
                             float step, float bc2s, const float *norm_sq, float max_norm) {
    float sc = 1.0f;
    if (max_norm > 0.0f && norm_sq) {
        float cl = max_norm / (sqrtf(norm_sq[0]) + 1e-6f);
        sc = cl < 1.0f ? cl : 1.0f;
    }
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i] * sc;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = master[i] * (1.0f - lr * wd);
        p -= step * mi / (sqrtf(vi) / bc2s + eps);
        master[i] = p;
        if (work) work[i] = __float2bfloat16_rn(p);
    }
}

void cuda_adamw(const ops_ctx_t *c, float *master, void *work, const float *grad, float *m,
                float *v, size_t n, float lr, float b1, float b2, float eps, float wd, int t,
                const float *norm_sq, float max_norm) {
    if (!n) return;
    double bc1 = 1.0 - pow((double)b1, t), bc2 = 1.0 - pow((double)b2, t);
    float step = (float)(lr / bc1), bc2s = (float)sqrt(bc2);
    adamw_kernel<<<cuda_blocks(n, 256, 8192), 256, 0, cuda_stream(c)>>>(
        master, (bf16 *)work, grad, m, v, n, lr, b1, b2, eps, wd, step, bc2s, norm_sq, max_norm);
    cuda_check_launch();
}

// out = (a + b) * scale in f32 (b NULL: a * scale), rounded add then rounded
// multiply (no FMA): bitwise the CPU twin (common/ops/cpu/add.c). The optimizer's
// in-order sum of per-micro-batch gradients; a/b may be peer-GPU IPC mappings.
__global__ void f32_add_scale_kernel(float *out, const float *a, const float *b, float scale,
                                     size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = b ? __fadd_rn(a[i], b[i]) : a[i];
        out[i] = __fmul_rn(s, scale);
    }
}

void cuda_f32_add_scale(const ops_ctx_t *c, float *out, const float *a, const float *b,
                        float scale, size_t n) {
    if (!n) return;
    f32_add_scale_kernel<<<cuda_blocks(n, 256, 8192), 256, 0, cuda_stream(c)>>>(out, a, b, scale, n);
    cuda_check_launch();
}
