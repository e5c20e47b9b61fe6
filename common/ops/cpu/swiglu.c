/* SwiGLU gate (Shazeer 2020): out = silu(gate) * up, silu(g) = g * sigmoid(g). */
#include <math.h>

#include "common/ops/cpu/cpu.h"

void ops_cpu_swiglu_forward(const ops_ctx_t *c, void *out_, const void *gate_, const void *up_,
                            size_t n) {
    float *out = out_;
    const float *g = gate_, *u = up_;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-g[i]));
        out[i] = g[i] * s * u[i];
    }
}

/* dgate = dout * up * sig * (1 + g (1 - sig)),  dup = dout * silu(g)  (assigned;
 * either may be NULL; they may alias gate/up/dout elementwise). */
void ops_cpu_swiglu_backward(const ops_ctx_t *c, void *dgate_, void *dup_, const void *dout_,
                             const void *gate_, const void *up_, size_t n) {
    float *dg = dgate_, *du = dup_;
    const float *dy = dout_, *g = gate_, *u = up_;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i], ui = u[i], d = dy[i];
        float s = 1.0f / (1.0f + expf(-gi));
        if (dg) dg[i] = d * ui * s * (1.0f + gi * (1.0f - s));
        if (du) du[i] = d * gi * s;
    }
}
