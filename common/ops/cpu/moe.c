/* Mixture-of-experts helpers (transformers Qwen3MoeTopKRouter / Qwen3MoeExperts): router
 * top-k, counting-sort permutation by expert, weighted combine. See ops.h. */
#include <math.h>
#include <string.h>

#include "common/ops/cpu/cpu.h"

/* softmax in f32 (max-subtracted, as torch), then k passes of argmax over the experts not
 * yet taken; a strictly greater p wins, so ties go to the lower expert id. */
void ops_cpu_moe_route(const ops_ctx_t *c, int32_t *idx, float *w, const void *logits_, int T,
                       int E, int k, int norm) {
    const float *logits = logits_;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static) if (T > 64)
    for (int t = 0; t < T; t++) {
        const float *x = logits + (size_t)t * E;
        int32_t *it = idx + (size_t)t * k;
        float *wt = w + (size_t)t * k;
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) mx = x[e] > mx ? x[e] : mx;
        for (int e = 0; e < E; e++) sum += expf(x[e] - mx);
        float picked = 0.0f;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= it[i] == e;
                if (!taken && (best < 0 || x[e] > x[best])) best = e;
            }
            it[j] = best;
            wt[j] = expf(x[best] - mx) / sum;
            picked += wt[j];
        }
        if (norm)
            for (int j = 0; j < k; j++) wt[j] /= picked;
    }
}

void ops_cpu_moe_permute(const ops_ctx_t *c, int32_t *offsets, int32_t *tok, int32_t *inv,
                         const int32_t *idx, int T, int E, int k) {
    (void)c;
    int R = T * k;
    memset(offsets, 0, (size_t)(E + 1) * sizeof *offsets);
    for (int i = 0; i < R; i++) offsets[idx[i] + 1]++;
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
    /* place in entry order: stable. offsets[e] is used as the cursor, then restored */
    for (int i = 0; i < R; i++) {
        int r = offsets[idx[i]]++;
        tok[r] = i / k;
        inv[i] = r;
    }
    for (int e = E; e > 0; e--) offsets[e] = offsets[e - 1];
    offsets[0] = 0;
}

void ops_cpu_moe_combine(const ops_ctx_t *c, void *out_, const void *y_, const int32_t *inv,
                         const float *w, int T, int k, int D) {
    float *out = out_;
    const float *y = y_;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static) if (T > 16)
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * D;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int j = 0; j < k; j++) {
            const float *yr = y + (size_t)inv[t * k + j] * D;
            float wj = w[t * k + j];
            for (int d = 0; d < D; d++) o[d] += wj * yr[d];
        }
    }
}
