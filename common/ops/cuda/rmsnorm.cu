// RMSNorm (Zhang & Sennrich 2019) as HF LlamaRMSNorm / Qwen3RMSNorm in bf16:
//   rstd = 1/sqrt(mean(x^2) + eps) in f32;  out = bf16(w * bf16(x * rstd))
// (HF normalises in f32, casts to the input dtype, then multiplies by the
// weight). Backward with xhat = x*rstd, g = dout*w:
//   dinp = rstd * (g - xhat * mean(g*xhat))  (assigned; may alias dout)
//   dweight (C) f32 += sum_rows dout * xhat  (per-block partial sums in shared
//   memory, then a deterministic column reduction over blocks)
// Fast path: a warp or a block per row with the row in registers (below);
// general path (odd C, unaligned, very wide rows): one warp per row.
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

// ---- fast path: a team (one warp, or a whole 256-thread block) per row, rows
// read once as bf16 pairs into registers, each thread owning fixed column pairs
// (so dweight partial sums stay in registers: no atomics). Needs C even,
// C/2 <= 16*TEAM, 4-byte aligned pointers; otherwise the kernels above.
#define RMS_CPT 16  // column pairs per thread

template <int TEAM>
__device__ __forceinline__ float team_sum(float v, float *sh) {
    if (TEAM == 32) return warp_sum(v);
    return block_sum(v, sh);
}

template <int TEAM>
__global__ void __launch_bounds__(256)
rmsnorm_fwd_fast(__nv_bfloat162 *out, float *rstd, const __nv_bfloat162 *inp,
                 const __nv_bfloat162 *w, float eps, int N, int C) {
    __shared__ float sh[32];
    const int C2 = C / 2, teams = blockDim.x / TEAM, team = threadIdx.x / TEAM;
    const int lt = threadIdx.x % TEAM;
    for (int n0 = blockIdx.x * teams; n0 < N; n0 += gridDim.x * teams) {
        const int n = n0 + team;  // TEAM == blockDim: every thread of the block on one row
        const bool row_ok = n < N;
        const __nv_bfloat162 *x = inp + (size_t)n * C2;
        float2 xv[RMS_CPT];
        float ss = 0.0f;
#pragma unroll
        for (int c = 0; c < RMS_CPT; c++) {
            int i = lt + c * TEAM;
            xv[c] = (row_ok && i < C2) ? __bfloat1622float2(x[i]) : make_float2(0.0f, 0.0f);
            ss += xv[c].x * xv[c].x + xv[c].y * xv[c].y;
        }
        ss = team_sum<TEAM>(ss, sh);
        float r = rsqrtf(ss / C + eps);
        if (!row_ok) continue;  // TEAM == 32 only (warp-uniform); a block team has n < N
        if (rstd && lt == 0) rstd[n] = r;
        __nv_bfloat162 *y = out + (size_t)n * C2;
#pragma unroll
        for (int c = 0; c < RMS_CPT; c++) {
            int i = lt + c * TEAM;
            if (i < C2) {
                float2 wv = __bfloat1622float2(w[i]);
                float a = __bfloat162float(__float2bfloat16_rn(xv[c].x * r));
                float b = __bfloat162float(__float2bfloat16_rn(xv[c].y * r));
                y[i] = __floats2bfloat162_rn(a * wv.x, b * wv.y);
            }
        }
    }
}

// part: (gridDim.x * teams, C) f32 per-team dweight partials (NULL: none).
template <int TEAM>
__global__ void __launch_bounds__(256)
rmsnorm_bwd_fast(__nv_bfloat162 *dinp, float *part, const __nv_bfloat162 *dout,
                 const __nv_bfloat162 *inp, const __nv_bfloat162 *w, const float *rstd, int N,
                 int C) {
    __shared__ float sh[32];
    const int C2 = C / 2, teams = blockDim.x / TEAM, team = threadIdx.x / TEAM;
    const int lt = threadIdx.x % TEAM;
    float2 dw[RMS_CPT];
#pragma unroll
    for (int c = 0; c < RMS_CPT; c++) dw[c] = make_float2(0.0f, 0.0f);
    for (int n0 = blockIdx.x * teams; n0 < N; n0 += gridDim.x * teams) {
        const int n = n0 + team;
        const bool row_ok = n < N;
        const __nv_bfloat162 *x = inp + (size_t)n * C2, *dy = dout + (size_t)n * C2;
        float2 xv[RMS_CPT];
        float ss = 0.0f, dot = 0.0f;
#pragma unroll
        for (int c = 0; c < RMS_CPT; c++) {
            int i = lt + c * TEAM;
            xv[c] = make_float2(0.0f, 0.0f);
            if (row_ok && i < C2) {
                xv[c] = __bfloat1622float2(x[i]);
                float2 d = __bfloat1622float2(dy[i]), wv = __bfloat1622float2(w[i]);
                ss += xv[c].x * xv[c].x + xv[c].y * xv[c].y;
                dot += d.x * wv.x * xv[c].x + d.y * wv.y * xv[c].y;
            }
        }
        float r;
        if (rstd) {
            r = row_ok ? rstd[n] : 1.0f;
            dot = team_sum<TEAM>(dot, sh);
        } else {
            // both sums in one pass: reduce (ss, dot) one after the other
            ss = team_sum<TEAM>(ss, sh);
            dot = team_sum<TEAM>(dot, sh);
            r = rsqrtf(ss / C + 1e-6f);
        }
        if (!row_ok) continue;
        float mean = dot * r / C;
        __nv_bfloat162 *dx = dinp ? dinp + (size_t)n * C2 : nullptr;
#pragma unroll
        for (int c = 0; c < RMS_CPT; c++) {
            int i = lt + c * TEAM;
            if (i < C2) {
                float2 d = __bfloat1622float2(dy[i]), wv = __bfloat1622float2(w[i]);
                dw[c].x += d.x * xv[c].x * r;
                dw[c].y += d.y * xv[c].y * r;
                if (dx)
                    dx[i] = __floats2bfloat162_rn(r * (d.x * wv.x - xv[c].x * r * mean),
                                                  r * (d.y * wv.y - xv[c].y * r * mean));
            }
        }
    }
    if (part) {
        float2 *pp = (float2 *)(part + ((size_t)blockIdx.x * teams + team) * C);
#pragma unroll
        for (int c = 0; c < RMS_CPT; c++) {
            int i = lt + c * TEAM;
            if (i < C2) pp[i] = dw[c];
        }
    }
}

static int rms_fast_team(int C, const void *a, const void *b, const void *c2, const void *d) {
    uintptr_t m = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c2 | (uintptr_t)d;
    if (C % 2 != 0 || (m & 3u) != 0) return 0;
    if (C / 2 <= RMS_CPT * 32) return 32;
    if (C / 2 <= RMS_CPT * 256) return 256;
    return 0;
}

void cuda_rmsnorm_forward(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                          const void *weight, float eps, int N, int C) {
    if (N <= 0 || C <= 0) return;
    int team = rms_fast_team(C, out, inp, weight, inp);
    if (team) {
        int teams = 256 / team, blocks = (N + teams - 1) / teams;
        if (blocks > 8 * cuda_state(c)->num_sms) blocks = 8 * cuda_state(c)->num_sms;
        if (team == 32)
            rmsnorm_fwd_fast<32><<<blocks, 256, 0, cuda_stream(c)>>>(
                (__nv_bfloat162 *)out, rstd, (const __nv_bfloat162 *)inp,
                (const __nv_bfloat162 *)weight, eps, N, C);
        else
            rmsnorm_fwd_fast<256><<<blocks, 256, 0, cuda_stream(c)>>>(
                (__nv_bfloat162 *)out, rstd, (const __nv_bfloat162 *)inp,
                (const __nv_bfloat162 *)weight, eps, N, C);
        cuda_check_launch();
        return;
    }
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
    int team = rms_fast_team(C, dinp ? dinp : dout, dout, inp, weight);
    if (team) {
        int teams = 256 / team, blocks = (N + teams - 1) / teams;
        if (blocks > 2 * cuda_state(c)->num_sms) blocks = 2 * cuda_state(c)->num_sms;
        int P = blocks * teams;
        float *part = dweight ? (float *)cuda_scratch(c, (size_t)P * C * sizeof(float)) : NULL;
        if (team == 32)
            rmsnorm_bwd_fast<32><<<blocks, 256, 0, s>>>(
                (__nv_bfloat162 *)dinp, part, (const __nv_bfloat162 *)dout,
                (const __nv_bfloat162 *)inp, (const __nv_bfloat162 *)weight, rstd, N, C);
        else
            rmsnorm_bwd_fast<256><<<blocks, 256, 0, s>>>(
                (__nv_bfloat162 *)dinp, part, (const __nv_bfloat162 *)dout,
                (const __nv_bfloat162 *)inp, (const __nv_bfloat162 *)weight, rstd, N, C);
        cuda_check_launch();
        if (dweight) {
            colsum_f32_kernel<<<(C + 255) / 256, 256, 0, s>>>(dweight, part, P, C);
            cuda_check_launch();
        }
        return;
    }
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
