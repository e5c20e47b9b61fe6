/* RMSNorm (Zhang & Sennrich 2019), as HF LlamaRMSNorm / Qwen3RMSNorm:
 *   y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/ops/cpu/cpu.h"

float ops_cpu__rmsnorm_rstd(const float *x, int C, float eps) {
    double ss = 0.0;
    for (int i = 0; i < C; i++) ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / C + eps));
}

/* out (N,C) = inp * rstd * weight (C); rstd (N) saved when non-NULL. out may alias inp. */
void ops_cpu_rmsnorm_forward(const ops_ctx_t *c, void *out_, float *rstd, const void *inp_,
                             const void *weight_, float eps, int N, int C) {
    float *out = out_;
    const float *inp = inp_, *w = weight_;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (long)n * C;
        float *y = out + (long)n * C;
        float r = ops_cpu__rmsnorm_rstd(x, C, eps);
        if (rstd) rstd[n] = r;
        for (int i = 0; i < C; i++) y[i] = x[i] * r * w[i];
    }
}

/* With xhat = x * rstd and g = dout * w:
 *   dinp = rstd * (g - xhat * mean(g * xhat))    (assigned; may alias dout)
 *   dweight += sum_rows dout * xhat              (accumulated)
 * rstd may be NULL (then recomputed with eps = 1e-6; pass the saved one to be exact).
 * dweight is deterministic for a given thread count: each thread sums its static
 * share of the rows into its own partial, and the partials are added to dweight in
 * thread order after the parallel region (an `omp critical` in arrival order made
 * the last bits vary from run to run: tests/unit/test_carryover.c). */
void ops_cpu_rmsnorm_backward(const ops_ctx_t *c, void *dinp_, float *dweight, const void *dout_,
                              const void *inp_, const void *weight_, const float *rstd, int N,
                              int C) {
    float *dinp = dinp_;
    const float *dout = dout_, *inp = inp_, *w = weight_;
    int nt = ops_cpu__threads(c);
    /* (nt, C) per-thread partials; a thread the runtime does not start leaves zeros */
    float *part = dweight ? calloc((size_t)nt * C, sizeof(float)) : NULL;
    if (dweight && !part) nt = 1; /* out of memory: one thread, straight into dweight */
#pragma omp parallel num_threads(nt)
    {
        float *dw_local = part ? part + (size_t)omp_get_thread_num() * C : dweight;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (long)n * C, *dy = dout + (long)n * C;
            float r = rstd ? rstd[n] : ops_cpu__rmsnorm_rstd(x, C, 1e-6f);
            double dot = 0.0;
            for (int i = 0; i < C; i++) dot += (double)dy[i] * w[i] * x[i] * r;
            float mean = (float)(dot / C);
            if (dw_local)
                for (int i = 0; i < C; i++) dw_local[i] += dy[i] * x[i] * r;
            if (dinp) {
                float *dx = dinp + (long)n * C;
                for (int i = 0; i < C; i++) dx[i] = r * (dy[i] * w[i] - x[i] * r * mean);
            }
        }
    }
    if (part) {
        for (int t = 0; t < nt; t++)
            for (int i = 0; i < C; i++) dweight[i] += part[(size_t)t * C + i];
        free(part);
    }
}

/* x = x + res, then out = rmsnorm(x): the two ops (ops.h add_rmsnorm_forward). */
void ops_cpu_add_rmsnorm_forward(const ops_ctx_t *c, void *x, void *out, float *rstd,
                                 const void *res, const void *weight, float eps, int N, int C) {
    ops_cpu_add(c, x, x, res, (size_t)N * C);
    ops_cpu_rmsnorm_forward(c, out, rstd, x, weight, eps, N, C);
}
