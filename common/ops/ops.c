/* Backend constructors and backend-independent helpers of common/ops/ops.h. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "common/base/err.h"
#include "common/ops/ops.h"

extern const ops_impl_t ops_cpu_impl;

/* OpenBLAS's thread-count setter (declared in its cblas.h; repeated so another
 * CBLAS header still compiles). */
void openblas_set_num_threads(int num_threads);

void ops_cpu_init(ops_ctx_t *c, int nthreads) {
    memset(c, 0, sizeof(*c));
    c->backend = OPS_CPU;
    c->impl = &ops_cpu_impl;
    c->device = -1;
    c->nthreads = nthreads > 0 ? nthreads : 0;
    /* OpenBLAS runs single-threaded: matmul.c splits each GEMM across our OpenMP team
     * (one thread pool; two oversubscribe the cores, see matmul.c). */
    openblas_set_num_threads(1);
}

#ifndef DL_CUDA
int ops_cuda_init(ops_ctx_t *c, int device) {
    (void)c;
    return dl_seterr(DL_ENOTSUP, "ops_cuda_init(device %d): this build has no CUDA (built with "
                                 "CUDA=0 or without nvcc)", device);
}
#endif

int ops_init_named(ops_ctx_t *c, const char *device, int gpu, int nthreads) {
    if (!strcmp(device, "cuda")) return ops_cuda_init(c, gpu);
    if (strcmp(device, "cpu")) return dl_seterr(DL_EINVAL, "device '%s': expected cpu or cuda", device);
    ops_cpu_init(c, nthreads);
    return 0;
}

#ifdef DL_CUDA
/* Releases what ops_cuda_init created (common/ops/cuda/ops_cuda.cu). */
void ops_cuda_ctx_destroy(ops_ctx_t *c);
#endif

void ops_ctx_destroy(ops_ctx_t *c) {
    if (!c) return;
#ifdef DL_CUDA
    if (c->backend == OPS_CUDA && c->impl) ops_cuda_ctx_destroy(c);
#endif
    memset(c, 0, sizeof(*c));
}

/* transformers modeling_rope_utils: _compute_default_rope_parameters
 *   inv_freq[i] = 1 / theta^(2i/hd)
 * and _compute_llama3_parameters:
 *   wavelen = 2 pi / inv_freq; low = old_ctx / low_freq_factor, high = old_ctx / high_freq_factor
 *   wavelen > low  -> inv_freq / factor
 *   wavelen < high -> inv_freq
 *   otherwise      -> (1 - s) inv_freq / factor + s inv_freq,
 *                     s = (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
 * HF does this in fp32; we compute in double and round once (differences < 1 ulp-ish). */
void ops_rope_inv_freq(const rope_params_t *p, int hd, float *inv_freq_host) {
    for (int i = 0; i < hd / 2; i++) {
        double f = 1.0 / pow(p->theta, (double)(2 * i) / hd);
        if (p->llama3) {
            double old = p->original_max_position_embeddings;
            double low_wl = old / p->low_freq_factor, high_wl = old / p->high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                f = f / p->factor;
            } else if (wl >= high_wl) {
                double s = (old / wl - p->low_freq_factor) /
                           (p->high_freq_factor - p->low_freq_factor);
                f = (1.0 - s) * f / p->factor + s * f;
            }
        }
        inv_freq_host[i] = (float)f;
    }
}
