/* DFlash block attention (arXiv 2602.06036): each block of B query tokens sees
 * a window of context keys/values (the target features projected by this
 * layer's k/v_proj; the caller picks rows strictly before the anchor) and all B
 * keys/values of its own block, bidirectionally; blocks never see each other.
 * Plain reference: one (block, kv head) pair per OpenMP task; the query heads of
 * a GQA group run inside it so block K/V gradients have a single writer. The
 * key index space of block j is [0, ctx_len[j]) -> context rows, then
 * [ctx_len[j], ctx_len[j] + B) -> the block's own rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/ops/cpu/cpu.h"

static int attn_block__max_ctx(const int32_t *ctx_len, int Nb) {
    int m = 0;
    for (int j = 0; j < Nb; j++)
        if (ctx_len[j] > m) m = ctx_len[j];
    return m;
}

/* Key (or value) row u of block j for kv head hk. */
static inline const float *attn_block__row(const float *xc, const float *xb, int u, int cl,
                                           int cs, int j, int B, int Hkv, int hk, int hd) {
    if (u < cl) return xc + ((long)(cs + u) * Hkv + hk) * hd;
    return xb + (((long)j * B + (u - cl)) * Hkv + hk) * hd;
}

/* out (Nb*B,H,hd) = softmax(q k^T * scale) v over the visible keys; lse (Nb*B,H)
 * = log sum exp of the scaled scores (saved when non-NULL). */
void ops_cpu_attention_block_forward(const ops_ctx_t *c, void *out_, float *lse, const void *q_,
                                     const void *kb_, const void *vb_, const void *kc_,
                                     const void *vc_, const int32_t *ctx_start,
                                     const int32_t *ctx_len, int Nb, int B, int Tc, int H,
                                     int Hkv, int hd) {
    float *out = out_;
    const float *q = q_, *kb = kb_, *vb = vb_, *kc = kc_, *vc = vc_;
    const float scale = 1.0f / sqrtf((float)hd);
    const int group = H / Hkv;
    const int maxk = attn_block__max_ctx(ctx_len, Nb) + B;
    (void)Tc;
#pragma omp parallel num_threads(ops_cpu__threads(c))
    {
        float *p = malloc((size_t)maxk * sizeof(float));
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int j = 0; j < Nb; j++) {
            for (int hk = 0; hk < Hkv; hk++) {
                int cs = ctx_start[j], cl = ctx_len[j], nk = cl + B;
                for (int h = hk * group; h < (hk + 1) * group; h++) {
                    for (int r = 0; r < B; r++) {
                        long row = (long)j * B + r;
                        const float *qr = q + (row * H + h) * hd;
                        float mx = -INFINITY;
                        for (int u = 0; u < nk; u++) {
                            const float *ku = attn_block__row(kc, kb, u, cl, cs, j, B, Hkv, hk, hd);
                            float sc = 0.0f;
                            _Pragma("omp simd reduction(+ : sc)")
                            for (int i = 0; i < hd; i++) sc += qr[i] * ku[i];
                            sc *= scale;
                            p[u] = sc;
                            if (sc > mx) mx = sc;
                        }
                        float sum = 0.0f;
                        for (int u = 0; u < nk; u++) {
                            p[u] = expf(p[u] - mx);
                            sum += p[u];
                        }
                        if (lse) lse[row * H + h] = mx + logf(sum);
                        float inv = 1.0f / sum;
                        float *orow = out + (row * H + h) * hd;
                        for (int i = 0; i < hd; i++) orow[i] = 0.0f;
                        for (int u = 0; u < nk; u++) {
                            const float *vu = attn_block__row(vc, vb, u, cl, cs, j, B, Hkv, hk, hd);
                            float pu = p[u] * inv;
                            _Pragma("omp simd")
                            for (int i = 0; i < hd; i++) orow[i] += pu * vu[i];
                        }
                    }
                }
            }
        }
        free(p);
    }
}

/* Standard softmax-attention backward (as FlashAttention-2, Dao 2023, Alg. 2):
 *   P = exp(S - lse), Di = rowsum(dO * O), dV = P^T dO, dP = dO V^T,
 *   dS = P * (dP - Di), dQ = scale dS K, dK = scale dS^T Q.
 * dq, dkb, dvb, dkc, dvc assigned. Context rows can be seen by many blocks, so
 * each thread sums its dkc/dvc into a private (Tc,Hkv,hd) buffer, reduced at
 * the end in thread order (deterministic for a fixed thread count). lse may be
 * NULL (recomputed). */
void ops_cpu_attention_block_backward(const ops_ctx_t *c, void *dq_, void *dkb_, void *dvb_,
                                      void *dkc_, void *dvc_, const void *dout_, const void *out_,
                                      const float *lse, const void *q_, const void *kb_,
                                      const void *vb_, const void *kc_, const void *vc_,
                                      const int32_t *ctx_start, const int32_t *ctx_len, int Nb,
                                      int B, int Tc, int H, int Hkv, int hd) {
    float *dq = dq_, *dkb = dkb_, *dvb = dvb_, *dkc = dkc_, *dvc = dvc_;
    const float *dout = dout_, *out = out_, *q = q_, *kb = kb_, *vb = vb_, *kc = kc_, *vc = vc_;
    const float scale = 1.0f / sqrtf((float)hd);
    const int group = H / Hkv;
    const int maxk = attn_block__max_ctx(ctx_len, Nb) + B;
    const size_t nctx = (size_t)Tc * Hkv * hd;
    const int nt = ops_cpu__threads(c);
    float *part = NULL; /* (nt, 2, Tc*Hkv*hd): per-thread dkc, dvc */
    if (nctx) part = calloc((size_t)nt * 2 * nctx, sizeof(float));
    if (dq) memset(dq, 0, (size_t)Nb * B * H * hd * sizeof(float));
    if (dkb) memset(dkb, 0, (size_t)Nb * B * Hkv * hd * sizeof(float));
    if (dvb) memset(dvb, 0, (size_t)Nb * B * Hkv * hd * sizeof(float));
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num();
        float *p = malloc((size_t)maxk * 2 * sizeof(float)), *dp = p + maxk;
        float *my_dkc = part ? part + (size_t)tid * 2 * nctx : NULL;
        float *my_dvc = part ? my_dkc + nctx : NULL;
#pragma omp for schedule(static) collapse(2)
        for (int j = 0; j < Nb; j++) {
            for (int hk = 0; hk < Hkv; hk++) {
                int cs = ctx_start[j], cl = ctx_len[j], nk = cl + B;
                for (int h = hk * group; h < (hk + 1) * group; h++) {
                    for (int r = 0; r < B; r++) {
                        long row = (long)j * B + r;
                        const float *qr = q + (row * H + h) * hd;
                        const float *dor = dout + (row * H + h) * hd;
                        const float *orow = out + (row * H + h) * hd;
                        float mx = -INFINITY;
                        for (int u = 0; u < nk; u++) {
                            const float *ku = attn_block__row(kc, kb, u, cl, cs, j, B, Hkv, hk, hd);
                            float sc = 0.0f;
                            _Pragma("omp simd reduction(+ : sc)")
                            for (int i = 0; i < hd; i++) sc += qr[i] * ku[i];
                            p[u] = sc * scale;
                            if (p[u] > mx) mx = p[u];
                        }
                        float l;
                        if (lse) {
                            l = lse[row * H + h];
                        } else {
                            float sum = 0.0f;
                            for (int u = 0; u < nk; u++) sum += expf(p[u] - mx);
                            l = mx + logf(sum);
                        }
                        float di = 0.0f;
                        for (int i = 0; i < hd; i++) di += dor[i] * orow[i];
                        for (int u = 0; u < nk; u++) {
                            p[u] = expf(p[u] - l);
                            const float *vu = attn_block__row(vc, vb, u, cl, cs, j, B, Hkv, hk, hd);
                            float d = 0.0f;
                            _Pragma("omp simd reduction(+ : d)")
                            for (int i = 0; i < hd; i++) d += dor[i] * vu[i];
                            dp[u] = p[u] * (d - di) * scale; /* dS * scale */
                        }
                        float *dqr = dq ? dq + (row * H + h) * hd : NULL;
                        for (int u = 0; u < nk; u++) {
                            float *dku, *dvu;
                            const float *ku = attn_block__row(kc, kb, u, cl, cs, j, B, Hkv, hk, hd);
                            if (u < cl) {
                                size_t off = ((size_t)(cs + u) * Hkv + hk) * hd;
                                dku = my_dkc ? my_dkc + off : NULL;
                                dvu = my_dvc ? my_dvc + off : NULL;
                            } else {
                                size_t off = (((size_t)j * B + (u - cl)) * Hkv + hk) * hd;
                                dku = dkb ? dkb + off : NULL;
                                dvu = dvb ? dvb + off : NULL;
                            }
                            const float dpu = dp[u], pu = p[u];
                            if (dqr) {
                                _Pragma("omp simd")
                                for (int i = 0; i < hd; i++) dqr[i] += dpu * ku[i];
                            }
                            if (dku) {
                                _Pragma("omp simd")
                                for (int i = 0; i < hd; i++) dku[i] += dpu * qr[i];
                            }
                            if (dvu) {
                                _Pragma("omp simd")
                                for (int i = 0; i < hd; i++) dvu[i] += pu * dor[i];
                            }
                        }
                    }
                }
            }
        }
        free(p);
    }
    if (nctx) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (size_t e = 0; e < nctx; e++) {
            float sk = 0.0f, sv = 0.0f;
            for (int t = 0; t < nt; t++) {
                sk += part[(size_t)t * 2 * nctx + e];
                sv += part[(size_t)t * 2 * nctx + nctx + e];
            }
            if (dkc) dkc[e] = sk;
            if (dvc) dvc[e] = sv;
        }
    }
    free(part);
}
