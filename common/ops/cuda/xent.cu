// Cross-entropy forward + backward on one (N, V) bf16 chunk of logits, in place
// (ops.h): one block per row, f32 softmax math.
//   pass 1: online max / sum-exp and argmax (ties to the lowest index)
//   pass 2: dlogits = w * grad_scale * (softmax - onehot(target))
// loss[n] = w * (lse - logit[target]); rows with w == 0 get zero gradients and
// zero loss; correct[n] = argmax == target for every row. loss/correct may be NULL.
#include <math.h>

#include "common/ops/cuda/cuda_common.cuh"

#define XENT_THREADS 1024

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
    float m = -INFINITY, s = 0.0f, bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = tid; i < V; i += blockDim.x) {
        float v = __bfloat162float(x[i]);
        if (v > bv) { bv = v; bi = i; }  // i increases per thread: first max kept
        if (v > m) { s = s * __expf(m - v) + 1.0f; m = v; }
        else s += __expf(v - m);
    }
    // warp reduce (m, s) and (bv, bi)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
        int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
        float mn = fmaxf(m, m2);
        s = (m == -INFINITY ? 0.0f : s * __expf(m - mn)) + (m2 == -INFINITY ? 0.0f : s2 * __expf(m2 - mn));
        m = mn;
        if (v2 > bv || (v2 == bv && i2 < bi)) { bv = v2; bi = i2; }
    }
    if (lane == 0) { sh_m[wid] = m; sh_s[wid] = s; sh_v[wid] = bv; sh_i[wid] = bi; }
    __syncthreads();
    if (wid == 0) {
        int nw = blockDim.x >> 5;
        m = lane < nw ? sh_m[lane] : -INFINITY;
        s = lane < nw ? sh_s[lane] : 0.0f;
        bv = lane < nw ? sh_v[lane] : -INFINITY;
        bi = lane < nw ? sh_i[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
            int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            float mn = fmaxf(m, m2);
            s = (m == -INFINITY ? 0.0f : s * __expf(m - mn)) + (m2 == -INFINITY ? 0.0f : s2 * __expf(m2 - mn));
            m = mn;
            if (v2 > bv || (v2 == bv && i2 < bi)) { bv = v2; bi = i2; }
        }
        if (lane == 0) {
            sh_lse = m + logf(s);
            sh_am = bi;
        }
    }
    __syncthreads();
    float lse = sh_lse;
    if (tid == 0) {
        if (correct) correct[n] = sh_am == tg ? 1.0f : 0.0f;
        if (loss) loss[n] = wn == 0.0f ? 0.0f : wn * (lse - sh_xt);
    }
    float gs = wn * grad_scale;
    for (int i = tid; i < V; i += blockDim.x) {
        float g = 0.0f;
        if (wn != 0.0f) {
            g = gs * __expf(__bfloat162float(x[i]) - lse);
            if (i == tg) g -= gs;
        }
        x[i] = __float2bfloat16_rn(g);
    }
}

void cuda_xent_forward_backward(const ops_ctx_t *c, void *logits, float *loss, float *correct,
                                const int32_t *targets, const float *w, float grad_scale, int N,
                                int V) {
    if (N <= 0 || V <= 0) return;
    xent_kernel<<<N, XENT_THREADS, 0, cuda_stream(c)>>>((bf16 *)logits, loss, correct, targets, w,
                                                        grad_scale, V);
    cuda_check_launch();
}
