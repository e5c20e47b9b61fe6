// RMSNorm (Zhang & Sennrich 2019) as HF LlamaRMSNorm / Qwen3RMSNorm in bf16:
//   rstd = 1/sqrt(mean(x^2) + eps) in f32;  out = bf16(w * bf16(x * rstd))
// (HF normalises in f32, casts to the input dtype, then multiplies by the
// weight). Backward with xhat = x*rstd, g = dout*w:
//   dinp = rstd * (g - xhat * mean(g*xhat))  (assigned; may alias dout)
//   dweight (C) f32 += sum_rows dout * xhat  (per-block partial sums in shared
//   memory, then a deterministic column reduction over blocks)
// One warp per row; rows are independent.
#include "common/ops/cuda/cuda_common.cuh"

#define RMS_WARPS 8

__global__ void rmsnorm_fwd_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w,
                                   float eps, int N, int C) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int n = blockIdx.x * RMS_WARPS + warp; n < N; n += gridDim.x * RMS_WARPS) {
        const bf16 *x = inp + (size_t)n * C;
        bf16 *y = out + (size_t)n * C;
        float ss = 0.0f;
        for (int i = lane; i < C; i += 32) {
            float v = __bfloat162float(x[i]);
            ss += v * v;
        }
        ss = warp_sum(ss);
        float r = rsqrtf(ss / C + eps);
        if (rstd && lane == 0) rstd[n] = r;
        for (int i = lane; i < C; i += 32) {
            float xn = __bfloat162float(__float2bfloat16_rn(__bfloat162float(x[i]) * r));
            y[i] = __float2bfloat16_rn(xn * __bfloat162float(w[i]));
        }
    }
}

void cuda_rmsnorm_forward(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                          const void *weight, float eps, int N, int C) {
    if (N <= 0 || C <= 0) return;
    int blocks = (N + RMS_WARPS - 1) / RMS_WARPS;
    if (blocks > 16 * cuda_state(c)->num_sms) blocks = 16 * cuda_state(c)->num_sms;
    rmsnorm_fwd_kernel<<<blocks, RMS_WARPS * 32, 0, cuda_stream(c)>>>(
        (bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)weight, eps, N, C);
    cuda_check_launch();
}

// part: (gridDim.x, C) f32 partial dweight sums (NULL: no dweight); when
// use_smem is 0 (C too large for shared memory) partials go straight to part.
__global__ void rmsnorm_bwd_kernel(bf16 *dinp, float *part, const bf16 *dout, const bf16 *inp,
                                   const bf16 *w, const float *rstd, int N, int C, int use_smem) {
    extern __shared__ float dw_sh[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *mypart = part ? part + (size_t)blockIdx.x * C : NULL;
    if (part) {
        float *z = use_smem ? dw_sh : mypart;
        for (int i = threadIdx.x; i < C; i += blockDim.x) z[i] = 0.0f;
        __syncthreads();
    }
    for (int n = blockIdx.x * RMS_WARPS + warp; n < N; n += gridDim.x * RMS_WARPS) {
        const bf16 *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        float r;
        if (rstd) {
            r = rstd[n];
        } else {
            float ss = 0.0f;
            for (int i = lane; i < C; i += 32) {
                float v = __bfloat162float(x[i]);
                ss += v * v;
            }
            r = rsqrtf(warp_sum(ss) / C + 1e-6f);
        }
        float dot = 0.0f;
        for (int i = lane; i < C; i += 32)
            dot += __bfloat162float(dy[i]) * __bfloat162float(w[i]) * __bfloat162float(x[i]);
        float mean = warp_sum(dot) * r / C;
        for (int i = lane; i < C; i += 32) {
            float xi = __bfloat162float(x[i]), dyi = __bfloat162float(dy[i]);
            if (part) {
                if (use_smem) atomicAdd(&dw_sh[i], dyi * xi * r);
                else atomicAdd(&mypart[i], dyi * xi * r);
            }
            if (dinp) dinp[(size_t)n * C + i] =
                          __float2bfloat16_rn(r * (dyi * __bfloat162float(w[i]) - xi * r * mean));
        }
    }
    if (part && use_smem) {
        __syncthreads();
        for (int i = threadIdx.x; i < C; i += blockDim.x) mypart[i] = dw_sh[i];
    }
}

// dweight[i] += sum over P partial rows, in a fixed order.
__global__ void colsum_f32_kernel(float *dweight, const float *part, int P, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C) return;
    float s = 0.0f;
    for (int p = 0; p < P; p++) s += part[(size_t)p * C + i];
    dweight[i] += s;
}

void cuda_rmsnorm_backward(const ops_ctx_t *c, void *dinp, float *dweight, const void *dout,
                           const void *inp, const void *weight, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    cudaStream_t s = cuda_stream(c);
    int blocks = (N + RMS_WARPS - 1) / RMS_WARPS;
    int cap = 2 * cuda_state(c)->num_sms;
    if (blocks > cap) blocks = cap;
    float *part = dweight ? (float *)cuda_scratch(c, (size_t)blocks * C * sizeof(float)) : NULL;
    int use_smem = dweight && (size_t)C * sizeof(float) <= 48 * 1024;
    size_t smem = use_smem ? (size_t)C * sizeof(float) : 0;
    rmsnorm_bwd_kernel<<<blocks, RMS_WARPS * 32, smem, s>>>((bf16 *)dinp, part, (const bf16 *)dout,
                                                            (const bf16 *)inp,
                                                            (const bf16 *)weight, rstd, N, C,
                                                            use_smem);
    cuda_check_launch();
    if (dweight) {
        colsum_f32_kernel<<<(C + 255) / 256, 256, 0, s>>>(dweight, part, blocks, C);
        cuda_check_launch();
    }
}
