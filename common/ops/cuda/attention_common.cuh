// Warp-level tensor-core helpers shared by the attention kernels
// (attention.cu, attention_block.cu): mma.sync m16n8k16 bf16 -> f32 and the
// fragment loads from padded shared-memory tiles.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16" for .bf16), lane = 4*g + t:
//   A (16x16, row): a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..),
//                   a3 (row g+8, k 2t+8..)
//   B (16x8, col):  b0 (k 2t..2t+1, col g), b1 (k 2t+8..2t+9, col g)
//   C (16x8) f32:   c0,c1 (row g, cols 2t, 2t+1), c2,c3 (row g+8, cols 2t, 2t+1)
// The lower 16 bits of a packed register hold the lower k index. A C tile pair
// (16 x 16) converts to an A fragment in registers (the FlashAttention-2 trick).
//
// Tiles in shared memory are row-major with row stride LD = HDP + 8 elements
// (16-byte padding): the 32-bit fragment loads below are bank-conflict free.
#pragma once

#include "common/ops/cuda/cuda_common.cuh"

#define ATTN_LOG2E 1.4426950408889634f
#define ATTN_LN2 0.6931471805599453f

__device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4],
                                               const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t ld_u32(const bf16 *p) { return *(const uint32_t *)p; }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
__device__ __forceinline__ uint32_t pack_bf16_raw(bf16 lo, bf16 hi) {
    return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}

// A fragment: rows r0..r0+15, k columns k0..k0+15 of a row-major tile.
template <int LD>
__device__ __forceinline__ void frag_a(uint32_t a[4], const bf16 *s, int r0, int k0, int g,
                                       int t) {
    a[0] = ld_u32(s + (r0 + g) * LD + k0 + 2 * t);
    a[1] = ld_u32(s + (r0 + g + 8) * LD + k0 + 2 * t);
    a[2] = ld_u32(s + (r0 + g) * LD + k0 + 2 * t + 8);
    a[3] = ld_u32(s + (r0 + g + 8) * LD + k0 + 2 * t + 8);
}
// B fragment with B[k][n] = s[n][k] (e.g. K^T from a K tile): n0..n0+7, k0..k0+15.
template <int LD>
__device__ __forceinline__ void frag_b_nk(uint32_t b[2], const bf16 *s, int n0, int k0, int g,
                                          int t) {
    b[0] = ld_u32(s + (n0 + g) * LD + k0 + 2 * t);
    b[1] = ld_u32(s + (n0 + g) * LD + k0 + 2 * t + 8);
}
// B fragment with B[k][n] = s[k][n] (e.g. V from a V tile): k0..k0+15, n0..n0+7.
template <int LD>
__device__ __forceinline__ void frag_b_kn(uint32_t b[2], const bf16 *s, int k0, int n0, int g,
                                          int t) {
    const bf16 *p = s + (k0 + 2 * t) * LD + n0 + g;
    b[0] = pack_bf16_raw(p[0], p[LD]);
    b[1] = pack_bf16_raw(p[8 * LD], p[9 * LD]);
}
// A fragment from two f32 C tiles (cols 0..7 and 8..15 of a 16x16 block).
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

// ---- ldmatrix fragment loads (one instruction serves two mma operands) ----
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const bf16 *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
// A fragment (rows r0..r0+15, k0..k0+15), same result as frag_a.
template <int LD>
__device__ __forceinline__ void ldsm_a(uint32_t a[4], const bf16 *s, int r0, int k0, int lane) {
    int mi = lane >> 3;
    ldsm_x4(a, s + (r0 + (lane & 7) + (mi & 1) * 8) * LD + k0 + (mi >> 1) * 8);
}
// B fragments with B[k][n] = s[n][k] for n tiles n0..n0+7 (b0) and n0+8..n0+15 (b1),
// k0..k0+15; same results as frag_b_nk at n0 and n0+8.
template <int LD>
__device__ __forceinline__ void ldsm_b_nk(uint32_t b0[2], uint32_t b1[2], const bf16 *s, int n0,
                                          int k0, int lane) {
    int mi = lane >> 3;
    uint32_t r[4];
    ldsm_x4(r, s + (n0 + (lane & 7) + (mi >> 1) * 8) * LD + k0 + (mi & 1) * 8);
    b0[0] = r[0]; b0[1] = r[1]; b1[0] = r[2]; b1[1] = r[3];
}
// B fragments with B[k][n] = s[k][n], k0..k0+15, n tiles n0 (b0) and n0+8 (b1);
// same results as frag_b_kn at n0 and n0+8.
template <int LD>
__device__ __forceinline__ void ldsm_b_kn(uint32_t b0[2], uint32_t b1[2], const bf16 *s, int k0,
                                          int n0, int lane) {
    int mi = lane >> 3;
    uint32_t r[4];
    ldsm_x4_t(r, s + (k0 + (lane & 7) + (mi & 1) * 8) * LD + n0 + (mi >> 1) * 8);
    b0[0] = r[0]; b0[1] = r[1]; b1[0] = r[2]; b1[1] = r[3];
}

// ---- cp.async (global -> shared without registers; zero-fill when !valid) ----
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Copies ROWS rows of hd elements into a tile (ROWS x LD), zero-filling columns
// >= hd and rows whose pointer is NULL. rowptr(r) gives the source row. Threads
// tid0, tid0+nthr, ... take part. vec: 16-byte copies (hd % 8 == 0, aligned).
template <int HDP, int ROWS, typename RowFn>
__device__ __forceinline__ void load_rows(bf16 *dst, RowFn rowptr, int hd, bool vec, int tid0,
                                          int nthr) {
    constexpr int LD = HDP + 8;
    if (vec) {
        constexpr int CH = HDP / 8;
        for (int idx = tid0; idx < ROWS * CH; idx += nthr) {
            int r = idx / CH, ch = idx % CH;
            const bf16 *src = rowptr(r);
            uint4 val = make_uint4(0, 0, 0, 0);
            if (src && ch * 8 < hd) val = *(const uint4 *)(src + ch * 8);
            *(uint4 *)(dst + r * LD + ch * 8) = val;
        }
    } else {
        for (int idx = tid0; idx < ROWS * HDP; idx += nthr) {
            int r = idx / HDP, col = idx % HDP;
            const bf16 *src = rowptr(r);
            dst[r * LD + col] = (src && col < hd) ? src[col] : __float2bfloat16_rn(0.0f);
        }
    }
}

// Writes a warp's 16 x HDP f32 accumulator (C fragments o[HDP/8][4]) times mul
// as bf16 rows; rowptr(r) (r in 0..15) gives the destination or NULL to skip.
template <int HDP, typename RowFn>
__device__ __forceinline__ void store_rows(const float (*o)[4], float mul0, float mul1,
                                           RowFn rowptr, int hd, int g, int t) {
    bf16 *pa = rowptr(g), *pb = rowptr(g + 8);
#pragma unroll
    for (int nt = 0; nt < HDP / 8; nt++) {
        int col = nt * 8 + 2 * t;
        if (col < hd) {
            if (pa) pa[col] = __float2bfloat16_rn(o[nt][0] * mul0);
            if (pb) pb[col] = __float2bfloat16_rn(o[nt][2] * mul1);
        }
        if (col + 1 < hd) {
            if (pa) pa[col + 1] = __float2bfloat16_rn(o[nt][1] * mul0);
            if (pb) pb[col + 1] = __float2bfloat16_rn(o[nt][3] * mul1);
        }
    }
}

// Padded head dim served by the tensor-core kernels.
static inline int attn_hdp(int hd) {
    if (hd <= 32) return 32;
    if (hd <= 64) return 64;
    if (hd <= 96) return 96;
    if (hd <= 128) return 128;
    return 0;
}

// As load_rows, but with cp.async when vec (the copy completes at the next
// cp_async_wait + barrier); `safe` is any valid global address (used, never
// read, for zero-filled chunks). Without vec it falls back to plain stores.
template <int HDP, int ROWS, typename RowFn>
__device__ __forceinline__ void load_rows_async(bf16 *dst, RowFn rowptr, int hd, bool vec,
                                                int tid0, int nthr, const bf16 *safe) {
    constexpr int LD = HDP + 8;
    if (vec) {
        constexpr int CH = HDP / 8;
        for (int idx = tid0; idx < ROWS * CH; idx += nthr) {
            int r = idx / CH, ch = idx % CH;
            const bf16 *src = rowptr(r);
            bool ok = src && ch * 8 < hd;
            cp_async16(dst + r * LD + ch * 8, ok ? src + ch * 8 : safe, ok);
        }
    } else {
        load_rows<HDP, ROWS>(dst, rowptr, hd, false, tid0, nthr);
    }
}

// One online-softmax step (FlashAttention-2) for a warp's 16 x BN score tile sc
// (C fragments, raw Q.K^T), without the rescale of the output: scales to the log2
// domain, masks key > query (causal; pass INT_MAX as queries for none) and key >= L,
// updates the running max mrow and (per-thread partial) sum lrow of rows g and g+8,
// leaves the unnormalised probabilities in sc and the factors the output accumulator of
// rows g, g+8 must be multiplied by in al[0], al[1] (exp2 of old max - new max).
template <int BN, bool FTZ = false>
__device__ __forceinline__ void online_softmax_p(float (*sc)[4], float *mrow, float *lrow,
                                                 float *al, int k0, int qa, int qb, int L,
                                                 bool need_mask, float scale_log2, int t) {
    auto ex2 = [](float x) {
        if (!FTZ) return exp2f(x);
        float y;
        asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
        return y;
    };
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float val = sc[nt][e] * scale_log2;
            if (need_mask) {
                int key = k0 + nt * 8 + 2 * t + (e & 1);
                int qr = e < 2 ? qa : qb;
                if (key > qr || key >= L) val = -INFINITY;
            }
            sc[nt][e] = val;
        }
        mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    float mn0 = fmaxf(mrow[0], mx0), mn1 = fmaxf(mrow[1], mx1);
    float mu0 = mn0 == -INFINITY ? 0.0f : mn0, mu1 = mn1 == -INFINITY ? 0.0f : mn1;
    float al0 = ex2(mrow[0] - mu0), al1 = ex2(mrow[1] - mu1);
    mrow[0] = mn0;
    mrow[1] = mn1;
    float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < BN / 8; nt++) {
        sc[nt][0] = ex2(sc[nt][0] - mu0);
        sc[nt][1] = ex2(sc[nt][1] - mu0);
        sc[nt][2] = ex2(sc[nt][2] - mu1);
        sc[nt][3] = ex2(sc[nt][3] - mu1);
        ls0 += sc[nt][0] + sc[nt][1];
        ls1 += sc[nt][2] + sc[nt][3];
    }
    lrow[0] = lrow[0] * al0 + ls0;
    lrow[1] = lrow[1] * al1 + ls1;
    al[0] = al0;
    al[1] = al1;
}

// Multiplies a warp's 16 x HDP output accumulator (C fragments) by al[0] (row g), al[1]
// (row g + 8).
template <int HDP>
__device__ __forceinline__ void rescale_rows(float (*o)[4], const float *al) {
#pragma unroll
    for (int nt = 0; nt < HDP / 8; nt++) {
        o[nt][0] *= al[0];
        o[nt][1] *= al[0];
        o[nt][2] *= al[1];
        o[nt][3] *= al[1];
    }
}

// One online-softmax step (FlashAttention-2): online_softmax_p, then the output
// accumulator o rescaled (rescale_rows).
template <int BN, int HDP>
__device__ __forceinline__ void online_softmax_tile(float (*sc)[4], float *mrow, float *lrow,
                                                    float (*o)[4], int k0, int qa, int qb, int L,
                                                    bool need_mask, float scale_log2, int t) {
    float al[2];
    online_softmax_p<BN>(sc, mrow, lrow, al, k0, qa, qb, L, need_mask, scale_log2, t);
    rescale_rows<HDP>(o, al);
}
