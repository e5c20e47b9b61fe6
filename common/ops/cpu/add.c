/* Elementwise residual ops. */
#include "common/ops/cpu/cpu.h"

/* out (n) = a + b; out may alias a or b. */
void ops_cpu_add(const ops_ctx_t *c, void *out_, const void *a_, const void *b_, size_t n) {
    float *out = out_;
    const float *a = a_, *b = b_;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* y (n) += alpha * x. */
void ops_cpu_axpy(const ops_ctx_t *c, void *y_, float alpha, const void *x_, size_t n) {
    float *y = y_;
    const float *x = x_;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (size_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

/* out (n) f32 = (a + b) * scale (b NULL: a * scale): one rounded add, then one rounded
 * multiply ((a + b) * s has no FMA form; the CUDA twin spells it __fadd_rn / __fmul_rn),
 * so both backends give the same bits. */
void ops_cpu_f32_add_scale(const ops_ctx_t *c, float *out, const float *a, const float *b,
                           float scale, size_t n) {
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float s = b ? a[i] + b[i] : a[i];
        out[i] = s * scale;
    }
}
