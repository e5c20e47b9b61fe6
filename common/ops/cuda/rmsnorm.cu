// RMSNorm (Zhang & Sennrich 2019) as HF LlamaRMSNorm / Qwen3RMSNorm in bf16:
//   rstd = 1/sqrt(mean(x^2) + eps) in f32;  out = bf16(w * bf16(x * rstd))
// (HF normalises in f32, casts to the input dtype, then multiplies by the
// weight). Backward with xhat = x*rstd, g = dout*w:
//   dinp = rstd * (g - xhat * mean(g*xhat))  (assigned; may alias dout)
//   dweight (C) f32 += sum_rows dout * xhat  (per-block partial sums in shared
//   memory, then a deterministic column reduction over blocks)
// Vector path (C % 8 == 0, 16-byte aligned, 256 <= C <= 8192): a team of 32..256 threads per
// row, 16-byte accesses, row and dweight partials in registers. Fast path (C even, 4-byte
// aligned): a warp or a block per row with bf16 pairs; general path (odd C, unaligned,
// very wide rows): one warp per row.
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
            ss = __fadd_rn(ss, sumsq2(xv[c].x, xv[c].y));   // qknorm_rope.cu EXACT: same order
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

// ---- vector path: C % 8 == 0, 16-byte aligned rows and pointers, C/8 <= 4 * TEAM.
// A team of TEAM threads (32..256, a warp or several) per row, each thread owning up to
// RMS_VPT 16-byte chunks (8 bf16) at fixed columns, so the row sits in registers and the
// backward's dweight partials too. The bf16-pair path above reached 2.7 TB/s forward and
// 2.0 TB/s backward (4-byte accesses; the backward at 2 blocks per SM).
#define RMS_VPT 4

// Sum over a team, in a fixed order: warp sums, then the team's warps in order. Every
// thread of the block calls it the same number of times (the row loops are block-uniform).
template <int TEAM>
__device__ __forceinline__ float rms_team_sum(float v, float *sh) {
    v = warp_sum(v);
    if constexpr (TEAM == 32) {
        return v;
    } else {
        constexpr int W = TEAM / 32;
        const int wid = threadIdx.x >> 5, t0 = (wid / W) * W;
        __syncthreads();  // the last call's readers are done with sh
        if ((threadIdx.x & 31) == 0) sh[wid] = v;
        __syncthreads();
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < W; k++) s += sh[t0 + k];
        return s;
    }
}

// ADD (add_rmsnorm_forward): the row is first inp + res, rounded to bf16 as cuda_add and
// stored back to xo, then normalised. Each thread reads its own chunks of inp and res
// before it writes the same chunks of xo and out, so xo may alias inp and out res.
template <int TEAM, bool ADD>
__global__ void __launch_bounds__(256)
rmsnorm_fwd_vec(uint4 *out, float *rstd, const uint4 *inp, const uint4 *w, float eps, int N,
                int C, uint4 *xo, const uint4 *res) {
    __shared__ float sh[8];
    const int C8 = C / 8, teams = 256 / TEAM, team = threadIdx.x / TEAM, lt = threadIdx.x % TEAM;
    for (int n0 = blockIdx.x * teams; n0 < N; n0 += gridDim.x * teams) {
        const int n = n0 + team;
        const bool row_ok = n < N;
        uint4 xv[RMS_VPT];
        float ss = 0.0f;
#pragma unroll
        for (int c = 0; c < RMS_VPT; c++) {
            const int i = lt + c * TEAM;
            xv[c] = (row_ok && i < C8) ? inp[(size_t)n * C8 + i] : make_uint4(0, 0, 0, 0);
            float f[8];
            bf16x8_unpack(f, xv[c]);
            if (ADD && row_ok && i < C8) {
                float r[8];
                bf16x8_unpack(r, res[(size_t)n * C8 + i]);
#pragma unroll
                for (int k = 0; k < 8; k++) f[k] += r[k];
                xv[c] = bf16x8_pack(f);   // the bits of add_vec_kernel
                xo[(size_t)n * C8 + i] = xv[c];
                bf16x8_unpack(f, xv[c]);
            }
#pragma unroll
            for (int k = 0; k < 8; k++) ss += f[k] * f[k];
        }
        ss = rms_team_sum<TEAM>(ss, sh);
        const float r = rsqrtf(ss / C + eps);
        if (!row_ok) continue;
        if (rstd && lt == 0) rstd[n] = r;
#pragma unroll
        for (int c = 0; c < RMS_VPT; c++) {
            const int i = lt + c * TEAM;
            if (i < C8) {
                float f[8], g[8];
                bf16x8_unpack(f, xv[c]);
                bf16x8_unpack(g, w[i]);
#pragma unroll
                for (int k = 0; k < 8; k++)
                    f[k] = __bfloat162float(__float2bfloat16_rn(f[k] * r)) * g[k];
                out[(size_t)n * C8 + i] = bf16x8_pack(f);
            }
        }
    }
}

// part: (gridDim.x * teams, C) f32 per-team dweight partials (NULL: none).
template <int TEAM>
__global__ void __launch_bounds__(256)
rmsnorm_bwd_vec(uint4 *dinp, float *part, const uint4 *dout, const uint4 *inp, const uint4 *w,
                const float *rstd, int N, int C) {
    __shared__ float sh[8];
    const int C8 = C / 8, teams = 256 / TEAM, team = threadIdx.x / TEAM, lt = threadIdx.x % TEAM;
    float dw[RMS_VPT][8];
#pragma unroll
    for (int c = 0; c < RMS_VPT; c++)
#pragma unroll
        for (int k = 0; k < 8; k++) dw[c][k] = 0.0f;
    for (int n0 = blockIdx.x * teams; n0 < N; n0 += gridDim.x * teams) {
        const int n = n0 + team;
        const bool row_ok = n < N;
        uint4 xv[RMS_VPT], dv[RMS_VPT];
        float ss = 0.0f, dot = 0.0f;
#pragma unroll
        for (int c = 0; c < RMS_VPT; c++) {
            const int i = lt + c * TEAM;
            const bool ok = row_ok && i < C8;
            xv[c] = ok ? inp[(size_t)n * C8 + i] : make_uint4(0, 0, 0, 0);
            dv[c] = ok ? dout[(size_t)n * C8 + i] : make_uint4(0, 0, 0, 0);
            if (ok) {
                float x[8], d[8], g[8];
                bf16x8_unpack(x, xv[c]);
                bf16x8_unpack(d, dv[c]);
                bf16x8_unpack(g, w[i]);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    ss += x[k] * x[k];
                    dot += d[k] * g[k] * x[k];
                }
            }
        }
        float r;
        if (rstd) {
            r = row_ok ? rstd[n] : 1.0f;
            dot = rms_team_sum<TEAM>(dot, sh);
        } else {
            ss = rms_team_sum<TEAM>(ss, sh);
            dot = rms_team_sum<TEAM>(dot, sh);
            r = rsqrtf(ss / C + 1e-6f);
        }
        if (!row_ok) continue;
        const float mean = dot * r / C;
#pragma unroll
        for (int c = 0; c < RMS_VPT; c++) {
            const int i = lt + c * TEAM;
            if (i < C8) {
                float x[8], d[8], g[8];
                bf16x8_unpack(x, xv[c]);
                bf16x8_unpack(d, dv[c]);
                bf16x8_unpack(g, w[i]);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    dw[c][k] += d[k] * x[k] * r;
                    x[k] = r * (d[k] * g[k] - x[k] * r * mean);
                }
                if (dinp) dinp[(size_t)n * C8 + i] = bf16x8_pack(x);
            }
        }
    }
    if (part) {
        float *pp = part + ((size_t)blockIdx.x * teams + team) * C;
#pragma unroll
        for (int c = 0; c < RMS_VPT; c++) {
            const int i = lt + c * TEAM;
            if (i < C8) {
                ((float4 *)(pp + 8 * i))[0] = make_float4(dw[c][0], dw[c][1], dw[c][2], dw[c][3]);
                ((float4 *)(pp + 8 * i))[1] = make_float4(dw[c][4], dw[c][5], dw[c][6], dw[c][7]);
            }
        }
    }
}

// dweight[i] += the P partial rows' sum for column i: 32 columns x 8 row groups per
// block (coalesced rows), then the 8 groups in order (deterministic).
__global__ void colsum8_f32_kernel(float *dweight, const float *part, int P, int C) {
    __shared__ float sh[8][33];
    const int i = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (i < C)
        for (int p = threadIdx.y; p < P; p += 8) s += part[(size_t)p * C + i];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && i < C) {
        float t = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
        dweight[i] += t;
    }
}

// Team size of the vector path for C (0: not taken): C % 8 == 0, every pointer 16-byte
// aligned, 256 <= C <= 8 * RMS_VPT * 256.
static int rms_vec_team(int C, const void *a, const void *b, const void *c2, const void *d) {
    uintptr_t m = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c2 | (uintptr_t)d;
    if (C % 8 != 0 || C / 8 < 32 || (m & 15u) != 0) return 0;  // narrow rows: lanes idle
    for (int team = 32; team <= 256; team *= 2)
        if (C / 8 <= RMS_VPT * team) return team;
    return 0;
}

// Launches of the vector path (blocks: a few resident waves at most; the loops stride).
template <int TEAM>
static void rms_fwd_vec_launch(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                               const void *weight, float eps, int N, int C, void *xo = NULL,
                               const void *res = NULL) {
    const int teams = 256 / TEAM, cap = 8 * cuda_state(c)->num_sms;
    int blocks = (N + teams - 1) / teams;
    if (blocks > cap) blocks = cap;
    if (res)
        rmsnorm_fwd_vec<TEAM, true><<<blocks, 256, 0, cuda_stream(c)>>>(
            (uint4 *)out, rstd, (const uint4 *)inp, (const uint4 *)weight, eps, N, C,
            (uint4 *)xo, (const uint4 *)res);
    else
        rmsnorm_fwd_vec<TEAM, false><<<blocks, 256, 0, cuda_stream(c)>>>(
            (uint4 *)out, rstd, (const uint4 *)inp, (const uint4 *)weight, eps, N, C, NULL, NULL);
    cuda_check_launch();
}

template <int TEAM>
static void rms_bwd_vec_launch(const ops_ctx_t *c, void *dinp, float *dweight, const void *dout,
                               const void *inp, const void *weight, const float *rstd, int N,
                               int C) {
    const int teams = 256 / TEAM, cap = 2 * cuda_state(c)->num_sms;  // 104 registers: 2 per SM
    int blocks = (N + teams - 1) / teams;
    if (blocks > cap) blocks = cap;
    const int P = blocks * teams;
    float *part = dweight ? (float *)cuda_scratch(c, (size_t)P * C * sizeof(float)) : NULL;
    rmsnorm_bwd_vec<TEAM><<<blocks, 256, 0, cuda_stream(c)>>>(
        (uint4 *)dinp, part, (const uint4 *)dout, (const uint4 *)inp, (const uint4 *)weight, rstd,
        N, C);
    cuda_check_launch();
    if (dweight) {
        colsum8_f32_kernel<<<(C + 31) / 32, dim3(32, 8), 0, cuda_stream(c)>>>(dweight, part, P, C);
        cuda_check_launch();
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
    switch (rms_vec_team(C, out, inp, weight, inp)) {
    case 32: rms_fwd_vec_launch<32>(c, out, rstd, inp, weight, eps, N, C); return;
    case 64: rms_fwd_vec_launch<64>(c, out, rstd, inp, weight, eps, N, C); return;
    case 128: rms_fwd_vec_launch<128>(c, out, rstd, inp, weight, eps, N, C); return;
    case 256: rms_fwd_vec_launch<256>(c, out, rstd, inp, weight, eps, N, C); return;
    default: break;
    }
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

// x = x + res (as cuda_add), then out = rmsnorm(x): one pass on the vector path (the same
// team as cuda_rmsnorm_forward's, hence its bits), else the two ops.
void cuda_add_rmsnorm_forward(const ops_ctx_t *c, void *x, void *out, float *rstd,
                              const void *res, const void *weight, float eps, int N, int C) {
    if (N <= 0 || C <= 0) return;
    const void *p = (const void *)((uintptr_t)x | (uintptr_t)res);
    switch (rms_vec_team(C, out, x, weight, p)) {
    case 32: rms_fwd_vec_launch<32>(c, out, rstd, x, weight, eps, N, C, x, res); return;
    case 64: rms_fwd_vec_launch<64>(c, out, rstd, x, weight, eps, N, C, x, res); return;
    case 128: rms_fwd_vec_launch<128>(c, out, rstd, x, weight, eps, N, C, x, res); return;
    case 256: rms_fwd_vec_launch<256>(c, out, rstd, x, weight, eps, N, C, x, res); return;
    default: break;
    }
    c->impl->add(c, x, x, res, (size_t)N * C);
    cuda_rmsnorm_forward(c, out, rstd, x, weight, eps, N, C);
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
    const void *d0 = dinp ? dinp : dout;
    switch (rms_vec_team(C, d0, dout, inp, weight)) {
    case 32: rms_bwd_vec_launch<32>(c, dinp, dweight, dout, inp, weight, rstd, N, C); return;
    case 64: rms_bwd_vec_launch<64>(c, dinp, dweight, dout, inp, weight, rstd, N, C); return;
    case 128: rms_bwd_vec_launch<128>(c, dinp, dweight, dout, inp, weight, rstd, N, C); return;
    case 256: rms_bwd_vec_launch<256>(c, dinp, dweight, dout, inp, weight, rstd, N, C); return;
    default: break;
    }
    int team = rms_fast_team(C, d0, dout, inp, weight);
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
