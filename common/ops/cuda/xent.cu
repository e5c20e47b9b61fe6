// Cross-entropy forward + backward on one (N, V) bf16 chunk of logits, in place
// (ops.h): one block per row, f32 softmax math; 16-byte accesses where V % 8 == 0.
//   pass 1: online max / sum-exp and argmax (ties to the lowest index)
//   pass 2: dlogits = w * grad_scale * (softmax - onehot(target))
// loss[n] = w * (lse - logit[target]); rows with w == 0 get zero gradients and
// zero loss; correct[n] = argmax == target for every row. loss/correct may be NULL.
#include <math.h>

#include "common/ops/cuda/cuda_common.cuh"

#define XENT_THREADS 1024

// Running (max m, sum-exp s relative to m) and (best value bv, its index bi) of a
// thread, merged with another's; bi ties go to the lowest index.
struct xent_acc {
    float m, s, bv;
    int bi;
};

__device__ __forceinline__ void xent_merge(xent_acc &a, float m2, float s2, float v2, int i2) {
    float mn = fmaxf(a.m, m2);
    a.s = (a.m == -INFINITY ? 0.0f : a.s * __expf(a.m - mn)) +
          (m2 == -INFINITY ? 0.0f : s2 * __expf(m2 - mn));
    a.m = mn;
    if (v2 > a.bv || (v2 == a.bv && i2 < a.bi)) { a.bv = v2; a.bi = i2; }
}

__device__ __forceinline__ void xent_warp_reduce(xent_acc &a) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        xent_merge(a, __shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o),
                   __shfl_xor_sync(0xffffffffu, a.bv, o), __shfl_xor_sync(0xffffffffu, a.bi, o));
}

// 8 consecutive logits from a 16-byte aligned load: their max (and its lowest index),
// then one rescale of the running sum and 8 exps.
__device__ __forceinline__ void xent_take8(xent_acc &a, uint4 u, int i0) {
    float v[8];
    bf16x8_unpack(v, u);
    float cm = v[0];
    int ci = 0;
#pragma unroll
    for (int k = 1; k < 8; k++)
        if (v[k] > cm) { cm = v[k]; ci = k; }
    if (cm > a.bv) { a.bv = cm; a.bi = i0 + ci; }  // i0 increases per thread: first max kept
    if (cm > a.m) { a.s = a.m == -INFINITY ? 0.0f : a.s * __expf(a.m - cm); a.m = cm; }
#pragma unroll
    for (int k = 0; k < 8; k++) a.s += __expf(v[k] - a.m);
}

// One block per row. VEC: V % 8 == 0 and 16-byte aligned rows, so every access is a
// 16-byte load or store of 8 logits (the scalar loop reached ~40% of the memory
// bandwidth on the LM-head chunks); otherwise one logit at a time.
template <bool VEC>
__global__ void __launch_bounds__(XENT_THREADS)
xent_kernel(bf16 *logits, float *loss, float *correct, const int32_t *targets, const float *w,
            float grad_scale, int V) {
    __shared__ float sh_m[32], sh_s[32], sh_v[32];
    __shared__ int sh_i[32];
    __shared__ float sh_xt, sh_lse;
    __shared__ int sh_am;
    int n = blockIdx.x, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    bf16 *x = logits + (size_t)n * V;
    int tg = targets[n];
    float wn = w[n];
    if (tid == 0) sh_xt = __bfloat162float(x[tg]);
    xent_acc a = {-INFINITY, 0.0f, -INFINITY, 0x7fffffff};
    if constexpr (VEC) {
        const uint4 *x8 = (const uint4 *)x;
        const int n8 = V / 8;
        int j = tid;
        for (; j + blockDim.x < n8; j += 2 * blockDim.x) {  // two loads in flight
            uint4 u0 = x8[j], u1 = x8[j + blockDim.x];
            xent_take8(a, u0, 8 * j);
            xent_take8(a, u1, 8 * (j + blockDim.x));
        }
        if (j < n8) xent_take8(a, x8[j], 8 * j);
    } else {
        for (int i = tid; i < V; i += blockDim.x) {
            float v = __bfloat162float(x[i]);
            if (v > a.bv) { a.bv = v; a.bi = i; }  // i increases per thread: first max kept
            if (v > a.m) { a.s = a.s * __expf(a.m - v) + 1.0f; a.m = v; }
            else a.s += __expf(v - a.m);
        }
    }
    xent_warp_reduce(a);
    if (lane == 0) { sh_m[wid] = a.m; sh_s[wid] = a.s; sh_v[wid] = a.bv; sh_i[wid] = a.bi; }
    __syncthreads();
    if (wid == 0) {
        int nw = blockDim.x >> 5;
        a.m = lane < nw ? sh_m[lane] : -INFINITY;
        a.s = lane < nw ? sh_s[lane] : 0.0f;
        a.bv = lane < nw ? sh_v[lane] : -INFINITY;
        a.bi = lane < nw ? sh_i[lane] : 0x7fffffff;
        xent_warp_reduce(a);
        if (lane == 0) {
            sh_lse = a.m + logf(a.s);
            sh_am = a.bi;
        }
    }
    __syncthreads();
    float lse = sh_lse;
    if (tid == 0) {
        if (correct) correct[n] = sh_am == tg ? 1.0f : 0.0f;
        if (loss) loss[n] = wn == 0.0f ? 0.0f : wn * (lse - sh_xt);
    }
    // dlogits = gs * softmax - gs * onehot (same formula per element either path)
    float gs = wn * grad_scale;
    if constexpr (VEC) {
        uint4 *x8 = (uint4 *)x;
        for (int j = tid; j < V / 8; j += blockDim.x) {
            float f[8];
            bf16x8_unpack(f, x8[j]);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float g = 0.0f;
                if (wn != 0.0f) {
                    g = gs * __expf(f[k] - lse);
                    if (8 * j + k == tg) g -= gs;
                }
                f[k] = g;
            }
            x8[j] = bf16x8_pack(f);
        }
    } else {
        for (int i = tid; i < V; i += blockDim.x) {
            float g = 0.0f;
            if (wn != 0.0f) {
                g = gs * __expf(__bfloat162float(x[i]) - lse);
                if (i == tg) g -= gs;
            }
            x[i] = __float2bfloat16_rn(g);
        }
    }
}

void cuda_xent_forward_backward(const ops_ctx_t *c, void *logits, float *loss, float *correct,
                                const int32_t *targets, const float *w, float grad_scale, int N,
                                int V) {
    if (N <= 0 || V <= 0) return;
    if (V % 8 == 0 && ((uintptr_t)logits & 15u) == 0)
        xent_kernel<true><<<N, XENT_THREADS, 0, cuda_stream(c)>>>((bf16 *)logits, loss, correct,
                                                                  targets, w, grad_scale, V);
    else
        xent_kernel<false><<<N, XENT_THREADS, 0, cuda_stream(c)>>>((bf16 *)logits, loss, correct,
                                                                   targets, w, grad_scale, V);
    cuda_check_launch();
}
