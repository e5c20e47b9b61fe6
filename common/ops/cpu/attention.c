/* Causal self-attention over packed variable-length sequences (the target's
 * prefill). Plain reference: one (sequence, head) pair per OpenMP task, scores
 * of one query row at a time (memory per thread: max_seqlen floats). */
#include <math.h>
#include <stdlib.h>

#include "common/ops/cpu/cpu.h"

/* q (T,H,hd), k v (T,Hkv,hd), out (T,H,hd); token t of sequence s attends to
 * [cu[s], t]; head h reads kv head h / (H/Hkv); scale 1/sqrt(hd). */
void ops_cpu_attention_varlen_forward(const ops_ctx_t *c, void *out_, const void *q_,
                                      const void *k_, const void *v_, const int32_t *cu,
                                      int nseq, int max_seqlen, int T, int H, int Hkv, int hd) {
    float *out = out_;
    const float *q = q_, *k = k_, *v = v_;
    const float scale = 1.0f / sqrtf((float)hd);
    const int group = H / Hkv;
    (void)T;
#pragma omp parallel num_threads(ops_cpu__threads(c))
    {
        float *p = malloc((size_t)(max_seqlen > 0 ? max_seqlen : 1) * sizeof(float));
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int s = 0; s < nseq; s++) {
            for (int h = 0; h < H; h++) {
                int t0 = cu[s], t1 = cu[s + 1], hk = h / group;
                for (int t = t0; t < t1; t++) {
                    const float *qt = q + ((long)t * H + h) * hd;
                    float mx = -INFINITY;
                    for (int u = t0; u <= t; u++) {
                        const float *ku = k + ((long)u * Hkv + hk) * hd;
                        float sc = 0.0f;
                        _Pragma("omp simd reduction(+ : sc)")
                        for (int i = 0; i < hd; i++) sc += qt[i] * ku[i];
                        sc *= scale;
                        p[u - t0] = sc;
                        if (sc > mx) mx = sc;
                    }
                    float sum = 0.0f;
                    for (int u = t0; u <= t; u++) {
                        p[u - t0] = expf(p[u - t0] - mx);
                        sum += p[u - t0];
                    }
                    float inv = 1.0f / sum;
                    float *ot = out + ((long)t * H + h) * hd;
                    for (int i = 0; i < hd; i++) ot[i] = 0.0f;
                    for (int u = t0; u <= t; u++) {
                        const float *vu = v + ((long)u * Hkv + hk) * hd;
                        float pu = p[u - t0] * inv;
                        _Pragma("omp simd")
                        for (int i = 0; i < hd; i++) ot[i] += pu * vu[i];
                    }
                }
            }
        }
        free(p);
    }
}
