/* Rotary position embedding (Su et al. 2021), HF rotate_half layout: the pair
 * (x[i], x[i + hd/2]) is rotated by angle pos * inv_freq[i].
 * HF computes freqs = inv_freq * pos in fp32, then cos/sin; we round the angle
 * to fp32 the same way and take cos/sin in double. */
#include <math.h>

#include "common/ops/cpu/cpu.h"

static void rope__apply(const ops_ctx_t *c, float *x, const int32_t *pos, const float *inv_freq,
                        int N, int nh, int hd, float sign) {
    int half = hd / 2;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < half; i++) {
            float ang = (float)pos[n] * inv_freq[i];
            float cs = (float)cos((double)ang), sn = sign * (float)sin((double)ang);
            for (int h = 0; h < nh; h++) {
                float *p = x + ((long)n * nh + h) * hd;
                float a = p[i], b = p[i + half];
                p[i] = a * cs - b * sn;
                p[i + half] = b * cs + a * sn;
            }
        }
    }
}

/* In place on x (N,nh,hd): x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin. */
void ops_cpu_rope_forward(const ops_ctx_t *c, void *x, const int32_t *pos, const float *inv_freq,
                          int N, int nh, int hd) {
    rope__apply(c, x, pos, inv_freq, N, nh, hd, 1.0f);
}

/* In place on dx (N,nh,hd): the transpose of the rotation = rotation by -angle. */
void ops_cpu_rope_backward(const ops_ctx_t *c, void *dx, const int32_t *pos,
                           const float *inv_freq, int N, int nh, int hd) {
    rope__apply(c, dx, pos, inv_freq, N, nh, hd, -1.0f);
}
