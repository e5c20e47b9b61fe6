// Per-head q/k RMSNorm + RoPE fused (the drafter's attention inputs: Qwen3
// q_norm/k_norm, then apply_rotary_pos_emb), one memory pass each way instead of
// the two of rmsnorm.cu + rope.cu. CPU twin: ops/cpu/qknorm_rope.c (the
// composition of the two ops). Per head row x (hd) of token n, with
// r = rsqrt(mean(x^2) + eps) and angle pos[n]*inv_freq[i] (f32, accurate sincosf,
// as rope.cu):
//   forward   z = x * r * w;  y = rotate(z)                 (rotate_half layout)
//   backward  g = rotate^T(dy);  dx = r * (g*w - x*r*mean(g*w*x*r))  (assigned)
//             dweight (hd) f32 += sum_rows g * x * r
// All in f32 with one bf16 rounding of the output: unlike rmsnorm_forward, the
// normalised value is not rounded to bf16 before the weight and the rotation, and
// the backward does not round the rotated gradient (slightly more exact than the
// two unfused ops; same results within bf16 rounding).
// Fast path (hd 64, 128, 256; 4-byte aligned pointers): a warp per token, its
// cos/sin in registers for all nh heads, QR_U head rows in flight; each lane owns
// the same columns of every row, so its dweight partials stay in registers.
// General path (any even hd): a warp per head row, dweight partials per warp in
// global scratch. Either way dweight = fixed-order sum of per-warp partials (no
// atomics: deterministic for a given device).
#include "common/ops/cuda/cuda_common.cuh"

#define QR_WARPS 8  // warps per block
#define QR_U 4      // head rows in flight per warp (fast path)

// V consecutive bf16 <-> f32 (V = 1, 2 or 4; p aligned to 2*min(V,2) bytes).
template <int V>
__device__ __forceinline__ void qr_load(float *f, const bf16 *p) {
    if constexpr (V == 1) {
        f[0] = __bfloat162float(*p);
    } else {
#pragma unroll
        for (int k = 0; k < V / 2; k++) {
            float2 t = __bfloat1622float2(((const __nv_bfloat162 *)p)[k]);
            f[2 * k] = t.x;
            f[2 * k + 1] = t.y;
        }
    }
}
template <int V>
__device__ __forceinline__ void qr_store(bf16 *p, const float *f) {
    if constexpr (V == 1) {
        *p = __float2bfloat16_rn(f[0]);
    } else {
#pragma unroll
        for (int k = 0; k < V / 2; k++)
            ((__nv_bfloat162 *)p)[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    }
}

// x rounded to bf16 and back (one bf16 store and load of the unfused kernels).
__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// ---- fast path: hd = 64*V; lane owns columns [V*lane, V*lane+V) of each half.
// EXACT (V = 2 only): the bits of rmsnorm_forward then rope_forward (the target's q/k):
// the sum of squares in rmsnorm_fwd_fast<32>'s order for C = 128 (its lane owns the same
// column pairs 2*lane and 64 + 2*lane), the normalised value rounded to bf16 before the
// weight and the product rounded again before the rotation, as the two kernels do.
template <int V, bool EXACT = false>
__global__ void __launch_bounds__(QR_WARPS * 32)
qk_fwd_fast(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, float eps,
            const int32_t *pos, const float *inv_freq, int N, int nh) {
    static_assert(!EXACT || V == 2, "EXACT matches rmsnorm_fwd_fast<32> for hd 128 only");
    constexpr int HD = 64 * V, HALF = 32 * V;
    const int lane = threadIdx.x & 31, i0 = lane * V;
    float w1[V], w2[V], fr[V];
    qr_load<V>(w1, w + i0);
    qr_load<V>(w2, w + HALF + i0);
#pragma unroll
    for (int v = 0; v < V; v++) fr[v] = inv_freq[i0 + v];
    for (int n = blockIdx.x * QR_WARPS + (threadIdx.x >> 5); n < N; n += gridDim.x * QR_WARPS) {
        float cs[V], sn[V];
#pragma unroll
        for (int v = 0; v < V; v++) sincosf(rope_angle(pos[n], fr[v]), &sn[v], &cs[v]);
        for (int h0 = 0; h0 < nh; h0 += QR_U) {
            float a[QR_U][V], b[QR_U][V], ss[QR_U];
#pragma unroll
            for (int u = 0; u < QR_U; u++) {  // all loads first: out may alias inp
                ss[u] = 0.0f;
                if (h0 + u < nh) {            // warp-uniform
                    const bf16 *x = inp + ((size_t)n * nh + h0 + u) * HD;
                    qr_load<V>(a[u], x + i0);
                    qr_load<V>(b[u], x + HALF + i0);
                    if constexpr (EXACT) {
                        ss[u] = __fadd_rn(ss[u], sumsq2(a[u][0], a[u][1]));
                        ss[u] = __fadd_rn(ss[u], sumsq2(b[u][0], b[u][1]));
                    } else {
#pragma unroll
                        for (int v = 0; v < V; v++) ss[u] += a[u][v] * a[u][v] + b[u][v] * b[u][v];
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < QR_U; u++) ss[u] = warp_sum(ss[u]);
#pragma unroll
            for (int u = 0; u < QR_U; u++) {
                if (h0 + u >= nh) break;
                const size_t row = (size_t)n * nh + h0 + u;
                const float r = rsqrtf(ss[u] / HD + eps);
                if (rstd && lane == 0) rstd[row] = r;
                float ya[V], yb[V];
#pragma unroll
                for (int v = 0; v < V; v++) {
                    if constexpr (EXACT) {
                        float za = bf16_round(bf16_round(a[u][v] * r) * w1[v]);
                        float zb = bf16_round(bf16_round(b[u][v] * r) * w2[v]);
                        ya[v] = rot_a(za, zb, cs[v], sn[v]);
                        yb[v] = rot_b(za, zb, cs[v], sn[v]);
                    } else {
                        float za = a[u][v] * r * w1[v], zb = b[u][v] * r * w2[v];
                        ya[v] = za * cs[v] - zb * sn[v];
                        yb[v] = zb * cs[v] + za * sn[v];
                    }
                }
                qr_store<V>(out + row * HD + i0, ya);
                qr_store<V>(out + row * HD + HALF + i0, yb);
            }
        }
    }
}

// part: (gridDim.x * QR_WARPS, HD) f32 per-warp dweight partials (NULL: no dweight).
template <int V>
__global__ void __launch_bounds__(QR_WARPS * 32)
qk_bwd_fast(bf16 *dinp, float *part, const bf16 *dout, const bf16 *inp, const bf16 *w,
            const float *rstd, float eps, const int32_t *pos, const float *inv_freq, int N,
            int nh) {
    constexpr int HD = 64 * V, HALF = 32 * V;
    const int lane = threadIdx.x & 31, i0 = lane * V;
    float w1[V], w2[V], fr[V], dw1[V], dw2[V];
    qr_load<V>(w1, w + i0);
    qr_load<V>(w2, w + HALF + i0);
#pragma unroll
    for (int v = 0; v < V; v++) fr[v] = inv_freq[i0 + v], dw1[v] = 0.0f, dw2[v] = 0.0f;
    for (int n = blockIdx.x * QR_WARPS + (threadIdx.x >> 5); n < N; n += gridDim.x * QR_WARPS) {
        float cs[V], sn[V];
#pragma unroll
        for (int v = 0; v < V; v++) {
            sincosf(rope_angle(pos[n], fr[v]), &sn[v], &cs[v]);
            sn[v] = -sn[v];  // the transpose: rotation by -angle
        }
        for (int h0 = 0; h0 < nh; h0 += QR_U) {
            float a[QR_U][V], b[QR_U][V], ga[QR_U][V], gb[QR_U][V], ss[QR_U], dot[QR_U], r[QR_U];
#pragma unroll
            for (int u = 0; u < QR_U; u++) {  // all loads first: dinp may alias dout
                ss[u] = 0.0f, dot[u] = 0.0f, r[u] = 1.0f;
                if (h0 + u < nh) {            // warp-uniform
                    const size_t row = (size_t)n * nh + h0 + u;
                    const bf16 *x = inp + row * HD, *dy = dout + row * HD;
                    float da[V], db[V];
                    qr_load<V>(a[u], x + i0);
                    qr_load<V>(b[u], x + HALF + i0);
                    qr_load<V>(da, dy + i0);
                    qr_load<V>(db, dy + HALF + i0);
                    if (rstd) r[u] = rstd[row];
#pragma unroll
                    for (int v = 0; v < V; v++) {
                        ga[u][v] = da[v] * cs[v] - db[v] * sn[v];
                        gb[u][v] = db[v] * cs[v] + da[v] * sn[v];
                        ss[u] += a[u][v] * a[u][v] + b[u][v] * b[u][v];
                        dot[u] += ga[u][v] * w1[v] * a[u][v] + gb[u][v] * w2[v] * b[u][v];
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < QR_U; u++) {
                dot[u] = warp_sum(dot[u]);
                if (!rstd) r[u] = rsqrtf(warp_sum(ss[u]) / HD + eps);  // grid-uniform branch
            }
#pragma unroll
            for (int u = 0; u < QR_U; u++) {
                if (h0 + u >= nh) break;
                const size_t row = (size_t)n * nh + h0 + u;
                const float ru = r[u], mean = dot[u] * ru / HD;
                float xa[V], xb[V];
#pragma unroll
                for (int v = 0; v < V; v++) {
                    dw1[v] += ga[u][v] * a[u][v] * ru;
                    dw2[v] += gb[u][v] * b[u][v] * ru;
                    xa[v] = ru * (ga[u][v] * w1[v] - a[u][v] * ru * mean);
                    xb[v] = ru * (gb[u][v] * w2[v] - b[u][v] * ru * mean);
                }
                if (dinp) {
                    qr_store<V>(dinp + row * HD + i0, xa);
                    qr_store<V>(dinp + row * HD + HALF + i0, xb);
                }
            }
        }
    }
    if (part) {
        float *pw = part + ((size_t)blockIdx.x * QR_WARPS + (threadIdx.x >> 5)) * HD;
#pragma unroll
        for (int v = 0; v < V; v++) pw[i0 + v] = dw1[v], pw[HALF + i0 + v] = dw2[v];
    }
}

// ---- general path: a warp per head row (any even hd).
__global__ void __launch_bounds__(QR_WARPS * 32)
qk_fwd_general(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, float eps,
               const int32_t *pos, const float *inv_freq, int N, int nh, int hd) {
    const int lane = threadIdx.x & 31, half = hd / 2;
    const size_t rows = (size_t)N * nh;
    for (size_t row = (size_t)blockIdx.x * QR_WARPS + (threadIdx.x >> 5); row < rows;
         row += (size_t)gridDim.x * QR_WARPS) {
        const bf16 *x = inp + row * hd;
        bf16 *y = out + row * hd;
        float ss = 0.0f;
        for (int i = lane; i < hd; i += 32) {
            float v = __bfloat162float(x[i]);
            ss += v * v;
        }
        const float r = rsqrtf(warp_sum(ss) / hd + eps);  // every lane has read the row
        if (rstd && lane == 0) rstd[row] = r;
        const float p = (float)pos[row / nh];
        for (int i = lane; i < half; i += 32) {
            float sn, cs;
            sincosf(p * inv_freq[i], &sn, &cs);
            float za = __bfloat162float(x[i]) * r * __bfloat162float(w[i]);
            float zb = __bfloat162float(x[i + half]) * r * __bfloat162float(w[i + half]);
            y[i] = __float2bfloat16_rn(za * cs - zb * sn);
            y[i + half] = __float2bfloat16_rn(zb * cs + za * sn);
        }
    }
}

// part: (gridDim.x * QR_WARPS, hd) f32 per-warp dweight partials (NULL: none); a
// lane only touches its own columns i and i + hd/2 of its warp's partial row.
__global__ void __launch_bounds__(QR_WARPS * 32)
qk_bwd_general(bf16 *dinp, float *part, const bf16 *dout, const bf16 *inp, const bf16 *w,
               const float *rstd, float eps, const int32_t *pos, const float *inv_freq, int N,
               int nh, int hd) {
    const int lane = threadIdx.x & 31, half = hd / 2;
    const size_t rows = (size_t)N * nh;
    float *pw = part ? part + ((size_t)blockIdx.x * QR_WARPS + (threadIdx.x >> 5)) * hd : NULL;
    if (pw)
        for (int i = lane; i < half; i += 32) pw[i] = 0.0f, pw[i + half] = 0.0f;
    for (size_t row = (size_t)blockIdx.x * QR_WARPS + (threadIdx.x >> 5); row < rows;
         row += (size_t)gridDim.x * QR_WARPS) {
        const bf16 *x = inp + row * hd, *dy = dout + row * hd;
        const float p = (float)pos[row / nh];
        float r;
        if (rstd) {
            r = rstd[row];
        } else {
            float ss = 0.0f;
            for (int i = lane; i < hd; i += 32) {
                float v = __bfloat162float(x[i]);
                ss += v * v;
            }
            r = rsqrtf(warp_sum(ss) / hd + eps);
        }
        float dot = 0.0f;
        for (int i = lane; i < half; i += 32) {
            float sn, cs;
            sincosf(p * inv_freq[i], &sn, &cs);
            float da = __bfloat162float(dy[i]), db = __bfloat162float(dy[i + half]);
            float ga = da * cs + db * sn, gb = db * cs - da * sn;
            dot += ga * __bfloat162float(w[i]) * __bfloat162float(x[i]) +
                   gb * __bfloat162float(w[i + half]) * __bfloat162float(x[i + half]);
        }
        const float mean = warp_sum(dot) * r / hd;  // every lane has read dy: dinp may alias it
        for (int i = lane; i < half; i += 32) {
            float sn, cs;
            sincosf(p * inv_freq[i], &sn, &cs);
            float da = __bfloat162float(dy[i]), db = __bfloat162float(dy[i + half]);
            float ga = da * cs + db * sn, gb = db * cs - da * sn;
            float xa = __bfloat162float(x[i]), xb = __bfloat162float(x[i + half]);
            if (pw) pw[i] += ga * xa * r, pw[i + half] += gb * xb * r;
            if (dinp) {
                dinp[row * hd + i] = __float2bfloat16_rn(r * (ga * __bfloat162float(w[i]) - xa * r * mean));
                dinp[row * hd + i + half] =
                    __float2bfloat16_rn(r * (gb * __bfloat162float(w[i + half]) - xb * r * mean));
            }
        }
    }
}

// dweight[i] += sum of the P partial rows of column i: one block per column, each
// thread a fixed strided share, then block_sum's fixed tree (deterministic).
__global__ void qk_colsum_kernel(float *dweight, const float *part, int P, int C) {
    __shared__ float sh[32];
    const int i = blockIdx.x;
    float s = 0.0f;
    for (int p = threadIdx.x; p < P; p += blockDim.x) s += part[(size_t)p * C + i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) dweight[i] += s;
}

// V of the fast path for hd (0: general path): 4-byte aligned pointers for bf16 pairs.
static int qr_fast_v(int hd, const void *a, const void *b, const void *c2, const void *d) {
    uintptr_t m = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c2 | (uintptr_t)d;
    if (hd == 64) return 1;
    if ((m & 3u) != 0) return 0;
    return hd == 128 ? 2 : hd == 256 ? 4 : 0;
}

// Blocks for `warps` warp-sized work items: at most one resident wave (the loops
// are grid-strided), at least 1.
template <typename K>
static int qr_blocks(const ops_ctx_t *c, K kernel, size_t warps) {
    int per_sm = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, QR_WARPS * 32, 0));
    size_t cap = (size_t)(per_sm > 0 ? per_sm : 1) * cuda_state(c)->num_sms;
    size_t want = (warps + QR_WARPS - 1) / QR_WARPS;
    return (int)(want < cap ? (want > 0 ? want : 1) : cap);
}

template <int V, bool EXACT = false>
static void qr_fwd_fast_launch(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                               const void *weight, float eps, const int32_t *pos,
                               const float *inv_freq, int N, int nh) {
    int blocks = qr_blocks(c, qk_fwd_fast<V, EXACT>, (size_t)N);
    qk_fwd_fast<V, EXACT><<<blocks, QR_WARPS * 32, 0, cuda_stream(c)>>>(
        (bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)weight, eps, pos, inv_freq, N, nh);
}

// ops.h qk_norm_rope_forward_exact: the fused EXACT kernel where rmsnorm_forward takes
// its team-32 fast path with the same column pairs (hd 128, 4-byte aligned pointers),
// else the two ops themselves. out may alias inp (rows are read before they are written).
void cuda_qk_norm_rope_forward_exact(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                                     const void *weight, float eps, const int32_t *pos,
                                     const float *inv_freq, int N, int nh, int hd) {
    if (N <= 0 || nh <= 0 || hd <= 0) return;
    if (hd == 128 && qr_fast_v(hd, out, inp, weight, inp) == 2) {
        qr_fwd_fast_launch<2, true>(c, out, rstd, inp, weight, eps, pos, inv_freq, N, nh);
        cuda_check_launch();
        return;
    }
    cuda_rmsnorm_forward(c, out, rstd, inp, weight, eps, N * nh, hd);
    cuda_rope_forward(c, out, pos, inv_freq, N, nh, hd);
}

void cuda_qk_norm_rope_forward(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                               const void *weight, float eps, const int32_t *pos,
                               const float *inv_freq, int N, int nh, int hd) {
    if (N <= 0 || nh <= 0 || hd <= 0) return;
    switch (qr_fast_v(hd, out, inp, weight, inp)) {
    case 1: qr_fwd_fast_launch<1>(c, out, rstd, inp, weight, eps, pos, inv_freq, N, nh); break;
    case 2: qr_fwd_fast_launch<2>(c, out, rstd, inp, weight, eps, pos, inv_freq, N, nh); break;
    case 4: qr_fwd_fast_launch<4>(c, out, rstd, inp, weight, eps, pos, inv_freq, N, nh); break;
    default: {
        int blocks = qr_blocks(c, qk_fwd_general, (size_t)N * nh);
        qk_fwd_general<<<blocks, QR_WARPS * 32, 0, cuda_stream(c)>>>(
            (bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)weight, eps, pos, inv_freq, N,
            nh, hd);
    }
    }
    cuda_check_launch();
}

// Per-warp partials of the backward kernel: scratch for `blocks` blocks, or NULL.
static float *qr_part(const ops_ctx_t *c, const float *dweight, int blocks, int hd) {
    if (!dweight) return NULL;
    return (float *)cuda_scratch(c, (size_t)blocks * QR_WARPS * hd * sizeof(float));
}

template <int V>
static int qr_bwd_fast_launch(const ops_ctx_t *c, void *dinp, const float *dweight, float **part,
                              const void *dout, const void *inp, const void *weight,
                              const float *rstd, float eps, const int32_t *pos,
                              const float *inv_freq, int N, int nh) {
    int blocks = qr_blocks(c, qk_bwd_fast<V>, (size_t)N);
    *part = qr_part(c, dweight, blocks, 64 * V);
    qk_bwd_fast<V><<<blocks, QR_WARPS * 32, 0, cuda_stream(c)>>>(
        (bf16 *)dinp, *part, (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)weight, rstd,
        eps, pos, inv_freq, N, nh);
    return blocks;
}

void cuda_qk_norm_rope_backward(const ops_ctx_t *c, void *dinp, float *dweight,
                                const void *dout, const void *inp, const void *weight,
                                const float *rstd, const int32_t *pos, const float *inv_freq,
                                float eps, int N, int nh, int hd) {
    if (N <= 0 || nh <= 0 || hd <= 0 || (!dinp && !dweight)) return;
    float *part = NULL;
    int blocks;
    switch (qr_fast_v(hd, dinp ? dinp : dout, dout, inp, weight)) {
    case 1:
        blocks = qr_bwd_fast_launch<1>(c, dinp, dweight, &part, dout, inp, weight, rstd, eps, pos,
                                       inv_freq, N, nh);
        break;
    case 2:
        blocks = qr_bwd_fast_launch<2>(c, dinp, dweight, &part, dout, inp, weight, rstd, eps, pos,
                                       inv_freq, N, nh);
        break;
    case 4:
        blocks = qr_bwd_fast_launch<4>(c, dinp, dweight, &part, dout, inp, weight, rstd, eps, pos,
                                       inv_freq, N, nh);
        break;
    default:
        blocks = qr_blocks(c, qk_bwd_general, (size_t)N * nh);
        part = qr_part(c, dweight, blocks, hd);
        qk_bwd_general<<<blocks, QR_WARPS * 32, 0, cuda_stream(c)>>>(
            (bf16 *)dinp, part, (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)weight,
            rstd, eps, pos, inv_freq, N, nh, hd);
    }
    cuda_check_launch();
    if (dweight) {
        qk_colsum_kernel<<<hd, 256, 0, cuda_stream(c)>>>(dweight, part, blocks * QR_WARPS, hd);
        cuda_check_launch();
    }
}
