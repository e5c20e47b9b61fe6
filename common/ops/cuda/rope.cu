// Rotary position embedding (Su et al. 2021), HF rotate_half layout, in place on
// x (N, nh, hd) bf16: the pair (x[i], x[i+hd/2]) rotates by angle
// pos[n]*inv_freq[i] (angle rounded to f32 as HF computes it; accurate sincosf).
// Backward is the rotation by -angle (the transpose).
#include "common/ops/cuda/cuda_common.cuh"

__global__ void rope_kernel(bf16 *x, const int32_t *pos, const float *inv_freq, int N, int nh,
                            int hd, float sign) {
    int half = hd / 2;
    size_t total = (size_t)N * nh * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t nhh = idx / half;  // n * nh + h
        int n = (int)(nhh / nh);
        float sn, cs;
        sincosf(rope_angle(pos[n], inv_freq[i]), &sn, &cs);
        sn *= sign;
        bf16 *p = x + nhh * hd;
        float a = __bfloat162float(p[i]), b = __bfloat162float(p[i + half]);
        p[i] = __float2bfloat16_rn(rot_a(a, b, cs, sn));
        p[i + half] = __float2bfloat16_rn(rot_b(a, b, cs, sn));
    }
}

static void rope_launch(const ops_ctx_t *c, void *x, const int32_t *pos, const float *inv_freq,
                        int N, int nh, int hd, float sign) {
    size_t total = (size_t)N * nh * (hd / 2);
    if (!total) return;
    rope_kernel<<<cuda_blocks(total, 256), 256, 0, cuda_stream(c)>>>((bf16 *)x, pos, inv_freq, N,
                                                                     nh, hd, sign);
    cuda_check_launch();
}

void cuda_rope_forward(const ops_ctx_t *c, void *x, const int32_t *pos, const float *inv_freq,
                       int N, int nh, int hd) {
    rope_launch(c, x, pos, inv_freq, N, nh, hd, 1.0f);
}

void cuda_rope_backward(const ops_ctx_t *c, void *dx, const int32_t *pos, const float *inv_freq,
                        int N, int nh, int hd) {
    rope_launch(c, dx, pos, inv_freq, N, nh, hd, -1.0f);
}
