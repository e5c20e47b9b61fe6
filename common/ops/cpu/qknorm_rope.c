/* Per-head q/k RMSNorm followed by RoPE (Qwen3 q_norm/k_norm, then
 * apply_rotary_pos_emb), forward and backward. On CPU this is exactly the
 * composition of rmsnorm.c and rope.c, so the drafter computes the same bits as
 * with the two calls (tests/integration/test_run_reference_ckpt); the CUDA
 * backend fuses the two passes into one kernel each way (cuda/qknorm_rope.cu). */
#include <stdlib.h>
#include <string.h>

#include "common/ops/cpu/cpu.h"

/* out (N,nh,hd) = rope(rmsnorm(inp) * weight) per head row; rstd (N*nh) saved when
 * non-NULL. out may alias inp. */
void ops_cpu_qk_norm_rope_forward(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                                  const void *weight, float eps, const int32_t *pos,
                                  const float *inv_freq, int N, int nh, int hd) {
    ops_cpu_rmsnorm_forward(c, out, rstd, inp, weight, eps, N * nh, hd);
    ops_cpu_rope_forward(c, out, pos, inv_freq, N, nh, hd);
}

/* rope_backward of dout into dinp (a copy: dout is left as it is unless dinp aliases
 * it), then rmsnorm_backward in place on dinp. rstd NULL: recomputed with eps, the
 * values rmsnorm_forward saves. dinp NULL: a host temporary (dweight only). */
void ops_cpu_qk_norm_rope_backward(const ops_ctx_t *c, void *dinp, float *dweight,
                                   const void *dout, const void *inp, const void *weight,
                                   const float *rstd, const int32_t *pos, const float *inv_freq,
                                   float eps, int N, int nh, int hd) {
    const size_t rows = (size_t)N * nh, n = rows * hd;
    if (!dinp && !dweight) return;
    float *g = dinp ? dinp : malloc((n ? n : 1) * sizeof(float));
    float *rs = NULL;
    if (!g) abort(); /* host scratch; ops errors abort (ops.h) */
    if (!rstd) {
        rs = malloc((rows ? rows : 1) * sizeof(float));
        if (!rs) abort();
        const float *x = inp;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
        for (long r = 0; r < (long)rows; r++) rs[r] = ops_cpu__rmsnorm_rstd(x + r * hd, hd, eps);
        rstd = rs;
    }
    if (g != dout) memcpy(g, dout, n * sizeof(float));
    ops_cpu_rope_backward(c, g, pos, inv_freq, N, nh, hd);
    ops_cpu_rmsnorm_backward(c, dinp ? g : NULL, dweight, g, inp, weight, rstd, N * nh, hd);
    free(rs);
    if (g != dinp) free(g);
}
