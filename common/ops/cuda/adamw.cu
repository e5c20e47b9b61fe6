// Global grad-norm pieces and AdamW (Loshchilov & Hutter 2019) as
// torch.optim.AdamW after torch.nn.utils.clip_grad_norm_ scaling, with no host
// syncs: the clip scale is computed on the device from norm_sq.
//   sumsq: out[0] (+)= sum x^2, two passes (per-block partials in the context's
//          partials buffer, then one block sums them in a fixed order):
//          deterministic, no atomics. sumsq_scaled: the same over x * scale.
//   adamw_pub: AdamW on grad * gscale, the new weights also into pub (the optimizer's
//          published weights), one pass.
#include <math.h>
#include <stdint.h>

#include "common/ops/cuda/cuda_common.cuh"

#define SUMSQ_THREADS 256

// x * scale: one rounded f32 multiply (the bits of f32_add_scale(y, x, NULL, scale)); scale
// 1 leaves x as it is.
__device__ __forceinline__ float scaled(float x, float scale) { return __fmul_rn(x, scale); }

__global__ void sumsq_partial_kernel(float *partials, const float *x, float scale, size_t n) {
    __shared__ float sh[32];
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float y = scaled(x[i], scale);
        s += y * y;
    }
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

static void sumsq_launch(const ops_ctx_t *c, float *out, const float *x, float scale, size_t n,
                         int accumulate) {
    cudaStream_t s = cuda_stream(c);
    int P = (int)cuda_blocks(n, SUMSQ_THREADS * 8, CUDA_PARTIALS);
    float *part = cuda_state(c)->partials;
    if (n) {
        sumsq_partial_kernel<<<P, SUMSQ_THREADS, 0, s>>>(part, x, scale, n);
        cuda_check_launch();
    } else {
        P = 0;
    }
    sumsq_final_kernel<<<1, SUMSQ_THREADS, 0, s>>>(out, part, P, accumulate);
    cuda_check_launch();
}

void cuda_sumsq(const ops_ctx_t *c, float *out, const float *x, size_t n, int accumulate) {
    sumsq_launch(c, out, x, 1.0f, n, accumulate);
}

void cuda_sumsq_scaled(const ops_ctx_t *c, float *out, const float *x, float scale, size_t n) {
    sumsq_launch(c, out, x, scale, n, 0);
}

// The AdamW constants of one step: step = lr / (1 - b1^t), bc2s = sqrt(1 - b2^t)
// (host-computed in double), gscale the gradient's scale (adamw_pub; 1 for adamw). The
// clip scale sc comes from norm_sq on the device (adamw_clip).
struct adamw_k {
    float lr, b1, b2, eps, wd, step, bc2s, gscale;
};

// One element: its moments updated in place, the new weight returned.
__device__ __forceinline__ float adamw_one(const adamw_k &k, float sc, float grad, float &m,
                                           float &v, float p) {
    float g = scaled(grad, k.gscale) * sc;
    float mi = k.b1 * m + (1.0f - k.b1) * g;
    float vi = k.b2 * v + (1.0f - k.b2) * g * g;
    m = mi;
    v = vi;
    p = p * (1.0f - k.lr * k.wd);
    p -= k.step * mi / (sqrtf(vi) / k.bc2s + k.eps);
    return p;
}

__device__ __forceinline__ float adamw_clip(const float *norm_sq, float max_norm) {
    if (max_norm > 0.0f && norm_sq) {
        float cl = max_norm / (sqrtf(norm_sq[0]) + 1e-6f);
        return cl < 1.0f ? cl : 1.0f;
    }
    return 1.0f;
}

// Element-wise, one element a thread per grid stride (any alignment).
__global__ void adamw_kernel(float *master, float *pub, bf16 *work, const float *grad, float *m,
                             float *v, size_t n, adamw_k k, const float *norm_sq,
                             float max_norm) {
    float sc = adamw_clip(norm_sq, max_norm);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float p = adamw_one(k, sc, grad[i], m[i], v[i], master[i]);
        master[i] = p;
        if (pub) pub[i] = p;
        if (work) work[i] = __float2bfloat16_rn(p);
    }
}

// The same, four elements a thread by 16-byte loads and stores (master, pub, grad, m, v
// 16-byte aligned; n4 = n / 4 groups; the caller does the tail): the same bits.
__global__ void adamw4_kernel(float4 *master, float4 *pub, bf16 *work, const float4 *grad,
                              float4 *m, float4 *v, size_t n4, adamw_k k, const float *norm_sq,
                              float max_norm) {
    float sc = adamw_clip(norm_sq, max_norm);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 g = grad[i], mi = m[i], vi = v[i], p = master[i];
        p.x = adamw_one(k, sc, g.x, mi.x, vi.x, p.x);
        p.y = adamw_one(k, sc, g.y, mi.y, vi.y, p.y);
        p.z = adamw_one(k, sc, g.z, mi.z, vi.z, p.z);
        p.w = adamw_one(k, sc, g.w, mi.w, vi.w, p.w);
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        if (pub) pub[i] = p;
        if (work) {
            work[4 * i] = __float2bfloat16_rn(p.x);
            work[4 * i + 1] = __float2bfloat16_rn(p.y);
            work[4 * i + 2] = __float2bfloat16_rn(p.z);
            work[4 * i + 3] = __float2bfloat16_rn(p.w);
        }
    }
}

static void adamw_launch(const ops_ctx_t *c, float *master, float *pub, void *work,
                         const float *grad, float gscale, float *m, float *v, size_t n,
                         float lr, float b1, float b2, float eps, float wd, int t,
                         const float *norm_sq, float max_norm) {
    if (!n) return;
    double bc1 = 1.0 - pow((double)b1, t), bc2 = 1.0 - pow((double)b2, t);
    adamw_k k = {lr, b1, b2, eps, wd, (float)(lr / bc1), (float)sqrt(bc2), gscale};
    cudaStream_t s = cuda_stream(c);
    size_t n4 = 0;
    if (aligned16(master) && aligned16(grad) && aligned16(m) && aligned16(v) &&
        (!pub || aligned16(pub))) {
        n4 = n / 4;
        if (n4) {
            adamw4_kernel<<<cuda_blocks(n4, 256, 8192), 256, 0, s>>>(
                (float4 *)master, (float4 *)pub, (bf16 *)work, (const float4 *)grad, (float4 *)m,
                (float4 *)v, n4, k, norm_sq, max_norm);
            cuda_check_launch();
        }
    }
    size_t o = 4 * n4;   // the tail (or all of it when a pointer is not 16-byte aligned)
    if (o < n) {
        adamw_kernel<<<cuda_blocks(n - o, 256, 8192), 256, 0, s>>>(
            master + o, pub ? pub + o : NULL, work ? (bf16 *)work + o : NULL, grad + o, m + o,
            v + o, n - o, k, norm_sq, max_norm);
        cuda_check_launch();
    }
}

void cuda_adamw(const ops_ctx_t *c, float *master, void *work, const float *grad, float *m,
                float *v, size_t n, float lr, float b1, float b2, float eps, float wd, int t,
                const float *norm_sq, float max_norm) {
    adamw_launch(c, master, NULL, work, grad, 1.0f, m, v, n, lr, b1, b2, eps, wd, t, norm_sq,
                 max_norm);
}

void cuda_adamw_pub(const ops_ctx_t *c, float *master, float *pub, const float *grad,
                    float gscale, float *m, float *v, size_t n, float lr, float b1, float b2,
                    float eps, float wd, int t, const float *norm_sq, float max_norm) {
    adamw_launch(c, master, pub, NULL, grad, gscale, m, v, n, lr, b1, b2, eps, wd, t, norm_sq,
                 max_norm);
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
