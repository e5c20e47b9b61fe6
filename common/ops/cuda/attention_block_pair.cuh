// DFlash block attention, forward and dQ: the "pair" kernel (attention_block.cu's variant
// 1, and variant 2's fallback), included by attention_block.cu.
//
// Why: a thread block per block (its 16 queries x the 4 heads of a GQA group, 64 rows,
// each warp 16 rows; the first kernel, since removed) fetches every K/V tile from L2 once
// per block, and every K/V fragment read from shared memory feeds 2 tensor-core ops
// (measured 14.3 against 10.0 ms forward on 8 x 4096, 512 anchors). Blocks of one
// sequence see nested prefixes of the same context (block j: [seq start, anchor_j)), and
// the drafter sorts its anchors per sequence, so consecutive blocks see nearly the same
// keys. Here a thread block takes TWO consecutive blocks (ja = 2x, ja + 1) of one kv head
// and each warp 32 rows: two 16-row m-tiles of ONE block (two heads of its group, or two
// 16-query chunks), as the varlen kernel's variant 1: each K/V tile is fetched once per
// pair, each fragment feeds 4 tensor-core ops.
//
// Key tiles (BN keys, uniform over the thread block): the context rows of the two
// blocks, walked as one interval when they overlap or touch (the DFlash case) and as two
// otherwise, then ceil(B / (BN/2)) "own" tiles holding block ja's own rows in the first
// BN/2 tile rows and block ja+1's in the last BN/2. A warp computes a tile only when some
// of its keys are visible to the warp's block ([klo, khi) in tile columns), masking the
// rest; so every visible key of a block is visited exactly once.
//
// Task of warp w in thread block (x, hk, z): wt = z*ABP_WARPS + w, WT = ceil(T/2) with
// T = group * nqc m-tiles per block (m = hg*nqc + qc). sel = wt / WT picks the block
// (ja + sel), m-tiles 2*(wt % WT) and +1 (the second is idle when T is odd).
#pragma once

#define ABP_WARPS 4

// S = Q K^T for the warp's two m-tiles (Q: Qw, 32 x LD shared rows) against a BN-key tile
// Ks (BN x LD shared): sc[2][BN/8][4] f32 C fragments, raw (unscaled).
template <int HDP, int BN>
__device__ __forceinline__ void abp_scores(float (*sc)[BN / 8][4], const bf16 *Qw,
                                           const bf16 *Ks, int lane) {
    constexpr int LD = HDP + 8;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int n = 0; n < BN / 8; n++)
            sc[i][n][0] = sc[i][n][1] = sc[i][n][2] = sc[i][n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HDP / 16; kk++) {
        uint32_t a0[4], a1[4];
        ldsm_a<LD>(a0, Qw, 0, kk * 16, lane);
        ldsm_a<LD>(a1, Qw, 16, kk * 16, lane);
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt += 2) {
            uint32_t b0[2], b1[2];
            ldsm_b_nk<LD>(b0, b1, Ks, nt * 8, kk * 16, lane);
            mma_bf16_16816(sc[0][nt], a0, b0);
            mma_bf16_16816(sc[0][nt + 1], a0, b1);
            mma_bf16_16816(sc[1][nt], a1, b0);
            mma_bf16_16816(sc[1][nt + 1], a1, b1);
        }
    }
}

// Sets the columns of one m-tile's score tile outside [klo, khi) to `fill`.
template <int NT>
__device__ __forceinline__ void abp_mask(float (*sc)[4], int klo, int khi, float fill, int t) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int col = nt * 8 + 2 * t + (e & 1);
            if (col < klo || col >= khi) sc[nt][e] = fill;
        }
}

// acc[i] += P_i V for both m-tiles (P in sc as C fragments; V: Vs, BN x LD shared).
template <int HDP, int BN>
__device__ __forceinline__ void abp_pv(float (*acc)[HDP / 8][4], float (*sc)[BN / 8][4],
                                       const bf16 *Vs, int lane) {
    constexpr int LD = HDP + 8;
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        uint32_t a0[4], a1[4];
        c_to_a(a0, sc[0][2 * kk], sc[0][2 * kk + 1]);
        c_to_a(a1, sc[1][2 * kk], sc[1][2 * kk + 1]);
#pragma unroll
        for (int nt = 0; nt < HDP / 8; nt += 2) {
            uint32_t b0[2], b1[2];
            ldsm_b_kn<LD>(b0, b1, Vs, kk * 16, nt * 8, lane);
            mma_bf16_16816(acc[0][nt], a0, b0);
            mma_bf16_16816(acc[0][nt + 1], a0, b1);
            mma_bf16_16816(acc[1][nt], a1, b0);
            mma_bf16_16816(acc[1][nt + 1], a1, b1);
        }
    }
}

// Backward (dQ) step of both m-tiles on one tile, sc holding S on entry: P = exp2(S*scale*
// log2e - lse2) (0 outside [klo, khi) when need_mask), dP = dO V^T (dO: dOw, 32 x LD
// shared), dS = P (dP - Dr), acc[i] += dS K (unscaled; the caller multiplies by scale).
template <int HDP, int BN>
__device__ __forceinline__ void abp_dq_tile(float (*sc)[BN / 8][4], float (*acc)[HDP / 8][4],
                                            const bf16 *dOw, const bf16 *Ks, const bf16 *Vs,
                                            const float (*lse2)[2], const float (*Dr)[2],
                                            int klo, int khi, bool need_mask, float scale_log2,
                                            int lane, int t) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[i][nt][e] = exp2f(sc[i][nt][e] * scale_log2 - lse2[i][e >> 1]);
        if (need_mask) abp_mask<BN / 8>(sc[i], klo, khi, 0.0f, t);
    }
    float dp[2][BN / 8][4];
    abp_scores<HDP, BN>(dp, dOw, Vs, lane);  // dO V^T: the same product shape as Q K^T
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) sc[i][nt][e] *= dp[i][nt][e] - Dr[i][e >> 1];
    abp_pv<HDP, BN>(acc, sc, Ks, lane);  // dS K: the same product shape as P V
}

// The key tiles of a pair of blocks (ja, ja+1) (uniform over the thread block): the
// context rows of the blocks served (need0, need1), walked as one interval [alo, ahi)
// when their windows overlap or touch, else as [alo, ahi) then [blo, bhi), in BN-key
// tiles; then ceil(B / (BN/2)) own tiles (block ja's own rows in the first BN/2 tile
// rows, ja+1's in the last BN/2).
template <int BN>
struct abp_tiles {
    static constexpr int HALF = BN / 2;
    int alo = 0, ahi = 0, blo = 0, bhi = 0, n1 = 0, n2 = 0, ntile = 0;
    __device__ __forceinline__ abp_tiles(const int32_t *ctx_start, const int32_t *ctx_len, int ja,
                                         bool need0, bool need1, int B) {
        int lo0 = 0, hi0 = 0, lo1 = 0, hi1 = 0;
        if (need0) { lo0 = ctx_start[ja]; hi0 = lo0 + ctx_len[ja]; }
        if (need1) { lo1 = ctx_start[ja + 1]; hi1 = lo1 + ctx_len[ja + 1]; }
        alo = lo0, ahi = hi0;
        if (lo0 >= hi0) {
            alo = lo1, ahi = hi1;
        } else if (lo1 < hi1) {
            if (max(lo0, lo1) <= min(hi0, hi1)) {
                alo = min(lo0, lo1), ahi = max(hi0, hi1);
            } else if (lo1 < lo0) {
                alo = lo1, ahi = hi1, blo = lo0, bhi = hi0;
            } else {
                blo = lo1, bhi = hi1;
            }
        }
        n1 = ahi > alo ? (ahi - alo + BN - 1) / BN : 0;
        n2 = bhi > blo ? (bhi - blo + BN - 1) / BN : 0;
        ntile = n1 + n2 + (B + HALF - 1) / HALF;
    }
    // Tile it: context keys k0.. (rows < kend) and -1, or the own tile's index.
    __device__ __forceinline__ int tile(int it, int *k0, int *kend) const {
        if (it < n1) { *k0 = alo + it * BN; *kend = ahi; return -1; }
        if (it < n1 + n2) { *k0 = blo + (it - n1) * BN; *kend = bhi; return -1; }
        *k0 = *kend = 0;
        return it - n1 - n2;
    }
    // Columns [*klo, *khi) of tile it visible to block ja + sel, whose context window is
    // [vlo, vhi) (empty when *klo >= *khi).
    __device__ __forceinline__ void window(int it, int sel, int vlo, int vhi, int B, int *klo,
                                           int *khi) const {
        int k0, kend;
        const int own = tile(it, &k0, &kend);
        if (own < 0) {
            *klo = max(vlo - k0, 0);
            *khi = min(min(vhi, kend) - k0, BN);
        } else {
            *klo = sel * HALF;
            *khi = *klo + min(HALF, B - own * HALF);
        }
    }
};

template <int HDP, bool BWD, int BN>
__global__ void __launch_bounds__(128)
attn_block_pair_kernel(bf16 *out, float *lse, bf16 *dq, const bf16 *dout, const float *lse_in,
                       const float *Dvec, const bf16 *q, const bf16 *kb, const bf16 *vb,
                       const bf16 *kc, const bf16 *vc, const int32_t *ctx_start,
                       const int32_t *ctx_len, int Nb, int B, int H, int Hkv, int hd,
                       float scale, int vec) {
    constexpr int LD = HDP + 8, HALF = BN / 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *KV = (bf16 *)smem_raw;              // 2 stages x (K tile, V tile), BN rows each
    bf16 *Qs = KV + 4 * BN * LD;              // ABP_WARPS x 32 rows
    bf16 *dOs = Qs + ABP_WARPS * 32 * LD;     // BWD only
    const int hk = blockIdx.y, group = H / Hkv, nqc = (B + 15) / 16;
    const int T = group * nqc, WT = (T + 1) / 2;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int ja = 2 * blockIdx.x;
    const int wt_lo = blockIdx.z * ABP_WARPS, wt = wt_lo + warp;
    const int wt_hi = min(wt_lo + ABP_WARPS, 2 * WT);  // this thread block's warp tasks
    const int sel = wt / WT, j = ja + sel, m0 = 2 * (wt % WT);
    const bool wact = sel < 2 && j < Nb;
    const bool need0 = wt_lo < WT, need1 = wt_hi > WT && ja + 1 < Nb;
    const size_t qstride = (size_t)H * hd, kstride = (size_t)Hkv * hd;
    const float scale_log2 = scale * ATTN_LOG2E;

    const abp_tiles<BN> tl(ctx_start, ctx_len, ja, need0, need1, B);
    const int ntile = tl.ntile;
    auto issue = [&](int it) {
        int k0, kend;
        const int own = tl.tile(it, &k0, &kend);
        bf16 *Ks = KV + (it & 1) * 2 * BN * LD, *Vs = Ks + BN * LD;
        auto rowp = [&](const bf16 *xc, const bf16 *xb, int r) -> const bf16 * {
            if (own < 0) {
                int cr = k0 + r;
                return cr < kend ? xc + (size_t)cr * kstride + (size_t)hk * hd : nullptr;
            }
            int s = r / HALF, u = own * HALF + r % HALF;
            bool ok = u < B && (s == 0 ? need0 : need1);
            return ok ? xb + ((size_t)(ja + s) * B + u) * kstride + (size_t)hk * hd : nullptr;
        };
        load_rows_async<HDP, BN>(Ks, [&](int r) { return rowp(kc, kb, r); }, hd, vec, tid,
                                 blockDim.x, q);
        load_rows_async<HDP, BN>(Vs, [&](int r) { return rowp(vc, vb, r); }, hd, vec, tid,
                                 blockDim.x, q);
    };
    // global query row of m-tile i's fragment row r (head in *hh), or -1
    auto qrow = [&](int i, int r, int *hh) -> long {
        int m = m0 + i;
        if (!wact || m >= T) return -1;
        *hh = hk * group + m / nqc;
        int rr = (m % nqc) * 16 + r;
        return rr < B ? (long)j * B + rr : -1;
    };
    bf16 *Qw = Qs + warp * 32 * LD, *dOw = dOs + warp * 32 * LD;
    load_rows_async<HDP, 32>(Qw, [&](int r) -> const bf16 * {
        int h = 0;
        long row = qrow(r >> 4, r & 15, &h);
        return row >= 0 ? q + row * qstride + (size_t)h * hd : nullptr;
    }, hd, vec, lane, 32, q);
    if (BWD)
        load_rows_async<HDP, 32>(dOw, [&](int r) -> const bf16 * {
            int h = 0;
            long row = qrow(r >> 4, r & 15, &h);
            return row >= 0 ? dout + row * qstride + (size_t)h * hd : nullptr;
        }, hd, vec, lane, 32, q);
    issue(0);
    cp_async_commit();

    float lse2[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, Dr[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    if (BWD) {
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int h = 0;
                long row = qrow(i, g + 8 * e, &h);
                lse2[i][e] = row >= 0 ? lse_in[row * H + h] * ATTN_LOG2E : INFINITY;
                Dr[i][e] = row >= 0 ? Dvec[row * H + h] : 0.0f;
            }
    }
    const int vlo = wact ? ctx_start[j] : 0, vhi = wact ? vlo + ctx_len[j] : 0;
    float acc[2][HDP / 8][4];  // O (forward) or dQ (backward), per m-tile
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int n = 0; n < HDP / 8; n++)
            acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0.0f;
    float mrow[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
    float lrow[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};

    for (int it = 0; it < ntile; it++) {
        if (it + 1 < ntile) {
            issue(it + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        int klo, khi;  // the warp's visible tile columns [klo, khi)
        tl.window(it, sel, vlo, vhi, B, &klo, &khi);
        if (wact && klo < khi) {
            const bf16 *Ks = KV + (it & 1) * 2 * BN * LD, *Vs = Ks + BN * LD;
            const bool need_mask = klo > 0 || khi < BN;
            float sc[2][BN / 8][4];
            abp_scores<HDP, BN>(sc, Qw, Ks, lane);
            if (!BWD) {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    if (need_mask) abp_mask<BN / 8>(sc[i], klo, khi, -INFINITY, t);
                    // masked columns are -inf already: no mask inside (queries INT_MAX)
                    online_softmax_tile<BN, HDP>(sc[i], mrow[i], lrow[i], acc[i], 0, INT_MAX,
                                                 INT_MAX, INT_MAX, false, scale_log2, t);
                }
                abp_pv<HDP, BN>(acc, sc, Vs, lane);
            } else {
                abp_dq_tile<HDP, BN>(sc, acc, dOw, Ks, Vs, lse2, Dr, klo, khi, need_mask,
                                     scale_log2, lane, t);
            }
        }
        __syncthreads();  // this stage is refilled two iterations on
    }
    if (!wact) return;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (m0 + i >= T) continue;
        const int h = hk * group + (m0 + i) / nqc;
        auto rowi = [&](int r) -> long {
            int hh = 0;
            return qrow(i, r, &hh);
        };
        if (!BWD) {
            ab_q_write_fwd<HDP>(out, lse, acc[i], mrow[i], lrow[i], rowi, H, h, hd, qstride, g, t);
        } else if (dq) {
            store_rows<HDP>(acc[i], scale, scale, [&](int r) -> bf16 * {
                long row = rowi(r);
                return row >= 0 ? dq + row * qstride + (size_t)h * hd : nullptr;
            }, hd, g, t);
        }
    }
}
