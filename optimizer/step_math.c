/* The optimizer's step math: the step's gradient and norm, AdamW over the tensors
 * (opt_int.h). */
#include "optimizer/opt_int.h"

float opt_step_grad(const ops_ctx_t *ops, int gpu, const float *const *g, uint64_t K, float inv_w,
                    size_t P, int g0_here, float *gs, float *norm_sq, const float **gsrc,
                    float *gscale) {
    const ops_impl_t *x = ops->impl;
    float nsq;
    *gsrc = gs;
    *gscale = 1.0f;
    if (gpu && K == 1 && g0_here) {
        /* one micro-batch in this GPU's memory: read where it is, times inv_w
         * (sumsq_scaled, adamw_pub round the product as f32_add_scale does): the same bits,
         * two passes fewer. A peer GPU's is read once, into gs, below. */
        *gsrc = g[0];
        *gscale = inv_w;
        x->sumsq_scaled(ops, norm_sq, g[0], inv_w, P);
        x->download(ops, &nsq, norm_sq, sizeof nsq);
    } else if (gpu) {
        /* gs = ((g0 + g1) + g2 ...) * inv_w, one pass per micro-batch, on the device */
        x->f32_add_scale(ops, gs, g[0], K > 1 ? g[1] : NULL, K <= 2 ? inv_w : 1.0f, P);
        for (uint64_t j = 2; j < K; j++)
            x->f32_add_scale(ops, gs, gs, g[j], j == K - 1 ? inv_w : 1.0f, P);
        x->sumsq(ops, norm_sq, gs, P, 0);
        x->download(ops, &nsq, norm_sq, sizeof nsq);
    } else {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < P; i++) {
            float s = g[0][i];
            for (uint64_t j = 1; j < K; j++) s += g[j][i];
            gs[i] = s * inv_w;
        }
        x->sumsq(ops, norm_sq, gs, P, 0);
        nsq = norm_sq[0];
    }
    return nsq;
}

void opt_step_adamw(const ops_ctx_t *ops, const drafter_t *layout, const opt_adamw_t *a,
                    float *master, float *pub, const float *gsrc, float gscale, float *m, float *v,
                    const float *norm_sq) {
    int nt = drafter_n_tensors(layout);
    for (int t = 0; t < nt; t++) {
        const drafter_tensor_t *y = drafter_tensor(layout, t);
        size_t o = y->offset;
        ops->impl->adamw_pub(ops, master + o, pub + o, gsrc + o, gscale, m + o, v + o, y->numel,
                             a->lr, a->b1, a->b2, a->eps, y->n_dims == 2 ? a->wd : 0.0f, a->t,
                             norm_sq, a->clip);
    }
}
