/* Global grad-norm pieces and the AdamW update (Loshchilov & Hutter 2019), as
 * torch.optim.AdamW (decoupled decay, bias-corrected moments) preceded by
 * torch.nn.utils.clip_grad_norm_ scaling. */
#include <math.h>
#include <stdlib.h>

#include "common/ops/cpu/cpu.h"

/* out[0] (+)= sum x^2, accumulated in double. Deterministic whatever the thread count:
 * fixed chunks of SUMSQ_CHUNK elements are summed sequentially (in parallel across
 * chunks) and the chunk sums added in chunk order (an OpenMP reduction combines the
 * threads' sums in arrival order: a 1-ulp run-to-run difference in the gradient norm,
 * hence in the clip scale and the weights). */
#define SUMSQ_CHUNK 65536
/* sum of (x * scale)^2 over x (n), the product rounded to f32 first (scale 1: x itself,
 * exactly), in double, in that fixed chunk order. */
static double sumsq_chunks(const ops_ctx_t *c, const float *x, float scale, size_t n) {
    size_t nc = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double one, *part = nc > 1 ? malloc(nc * sizeof *part) : &one;
    if (!part) abort();   /* a few KB per GB of parameters; ops errors abort (ops.h) */
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static) if (nc > 1)
    for (size_t k = 0; k < nc; k++) {
        size_t i1 = (k + 1) * SUMSQ_CHUNK < n ? (k + 1) * SUMSQ_CHUNK : n;
        double p = 0.0;
        for (size_t i = k * SUMSQ_CHUNK; i < i1; i++) {
            float y = x[i] * scale;
            p += (double)y * y;
        }
        part[k] = p;
    }
    double s = 0.0;
    for (size_t k = 0; k < nc; k++) s += part[k];
    if (part != &one) free(part);
    return s;
}

void ops_cpu_sumsq(const ops_ctx_t *c, float *out, const float *x, size_t n, int accumulate) {
    double s = sumsq_chunks(c, x, 1.0f, n);
    out[0] = accumulate ? (float)(out[0] + s) : (float)s;
}

/* out[0] = sum (x * scale)^2, the product rounded to f32 first (as f32_add_scale). */
void ops_cpu_sumsq_scaled(const ops_ctx_t *c, float *out, const float *x, float scale,
                          size_t n) {
    out[0] = (float)sumsq_chunks(c, x, scale, n);
}

static void adamw_cpu(const ops_ctx_t *c, float *master, float *work, float *pub,
                      const float *grad, float gscale, float *m, float *v, size_t n, float lr,
                      float b1, float b2, float eps, float wd, int t, const float *norm_sq,
                      float max_norm) {
    float s = 1.0f;
    if (max_norm > 0.0f && norm_sq) {
        float cl = max_norm / (sqrtf(norm_sq[0]) + 1e-6f);
        s = cl < 1.0f ? cl : 1.0f;
    }
    const double bc1 = 1.0 - pow((double)b1, t), bc2 = 1.0 - pow((double)b2, t);
    const float step = (float)(lr / bc1), bc2s = (float)sqrt(bc2);
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = grad[i] * gscale;   /* rounded: a separate statement */
        float g = gi * s;
        m[i] = b1 * m[i] + (1.0f - b1) * g;
        v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        float p = master[i] * (1.0f - lr * wd);
        p -= step * m[i] / (sqrtf(v[i]) / bc2s + eps);
        master[i] = p;
        if (work && work != master) work[i] = p;
        if (pub) pub[i] = p;
    }
}

void ops_cpu_adamw(const ops_ctx_t *c, float *master, void *work, const float *grad, float *m,
                   float *v, size_t n, float lr, float b1, float b2, float eps, float wd, int t,
                   const float *norm_sq, float max_norm) {
    adamw_cpu(c, master, work, NULL, grad, 1.0f, m, v, n, lr, b1, b2, eps, wd, t, norm_sq,
              max_norm);
}

void ops_cpu_adamw_pub(const ops_ctx_t *c, float *master, float *pub, const float *grad,
                       float gscale, float *m, float *v, size_t n, float lr, float b1, float b2,
                       float eps, float wd, int t, const float *norm_sq, float max_norm) {
    adamw_cpu(c, master, NULL, pub, grad, gscale, m, v, n, lr, b1, b2, eps, wd, t, norm_sq,
              max_norm);
}
