/* Internal declarations of the CPU backend (common/ops/cpu/): one file per
 * operation, forward and backward side by side; impl.c gathers them into the
 * ops_cpu_impl table. Signatures are those of ops_impl_t (common/ops/ops.h);
 * act is fp32 on this backend. Not a public header: model code calls through
 * ctx->impl. */
#ifndef DL_OPS_CPU_CPU_H
#define DL_OPS_CPU_CPU_H

#include <omp.h>
#include <stddef.h>
#include <stdint.h>

#include "common/ops/ops.h"

/* OpenMP team size for a CPU context: ctx->nthreads, or the library default. */
static inline int ops_cpu__threads(const ops_ctx_t *c) {
    return (c && c->nthreads > 0) ? c->nthreads : omp_get_max_threads();
}

/* memory.c */
void *ops_cpu_malloc(const ops_ctx_t *c, size_t bytes);
void ops_cpu_free(const ops_ctx_t *c, void *p);
void ops_cpu_memset0(const ops_ctx_t *c, void *p, size_t bytes);
void ops_cpu_copy(const ops_ctx_t *c, void *dst, const void *src, size_t bytes);
/* add.c (optimizer helper): out = (a + b) * scale, f32 */
void ops_cpu_f32_add_scale(const ops_ctx_t *c, float *out, const float *a, const float *b,
                           float scale, size_t n);
/* copy2d.c (model helper) */
void ops_cpu_copy2d(const ops_ctx_t *c, void *dst, size_t dst_pitch, const void *src,
                    size_t src_pitch, size_t width_bytes, size_t rows);
void ops_cpu_upload(const ops_ctx_t *c, void *dst, const void *src_host, size_t bytes);
void *ops_cpu_host_alloc(const ops_ctx_t *c, size_t bytes);
void ops_cpu_download(const ops_ctx_t *c, void *dst_host, const void *src, size_t bytes);
void ops_cpu_sync(const ops_ctx_t *c);
void ops_cpu_upload_act(const ops_ctx_t *c, void *dst_act, const float *src_host, size_t n);
void ops_cpu_download_act(const ops_ctx_t *c, float *dst_host, const void *src_act, size_t n);
void ops_cpu_act_to_f32(const ops_ctx_t *c, float *dst, const void *src_act, size_t n);
void ops_cpu_f32_to_act(const ops_ctx_t *c, void *dst_act, const float *src, size_t n);

/* init.c: the seeded normal init (ops.h normal_init; the host init of the drafter) */
int ops_cpu_normal_init(const ops_ctx_t *c, float *dst, const ops_normal_seg_t *seg, int n_seg,
                        const uint64_t *states, size_t n_chunks, size_t chunk, uint64_t G, float scale,
                        double near_rel, ops_normal_near_t *near, size_t near_cap, size_t *n_near);

/* matmul.c */
void ops_cpu_matmul_forward(const ops_ctx_t *c, void *out, const void *inp, const void *weight,
                            const void *bias, int M, int K, int N);
void ops_cpu_matmul_forward_res(const ops_ctx_t *c, void *out, const void *inp,
                                const void *weight, const void *bias, const void *res, int M,
                                int K, int N);
void ops_cpu_matmul_backward(const ops_ctx_t *c, void *dinp, float *dweight, float *dbias,
                             const void *dout, const void *inp, const void *weight,
                             int M, int K, int N, int dinp_acc);
/* rmsnorm.c; _rstd: 1 / sqrt(mean(x[0..C)^2) + eps), the rstd rmsnorm_forward saves */
float ops_cpu__rmsnorm_rstd(const float *x, int C, float eps);
void ops_cpu_add_rmsnorm_forward(const ops_ctx_t *c, void *x, void *out, float *rstd,
                                 const void *res, const void *weight, float eps, int N, int C);
void ops_cpu_rmsnorm_forward(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                             const void *weight, float eps, int N, int C);
void ops_cpu_rmsnorm_backward(const ops_ctx_t *c, void *dinp, float *dweight, const void *dout,
                              const void *inp, const void *weight, const float *rstd, int N,
                              int C);
/* rope.c */
void ops_cpu_rope_forward(const ops_ctx_t *c, void *x, const int32_t *pos, const float *inv_freq,
                          int N, int nh, int hd);
void ops_cpu_rope_backward(const ops_ctx_t *c, void *dx, const int32_t *pos,
                           const float *inv_freq, int N, int nh, int hd);
/* qknorm_rope.c (per-head q/k norm + rope; the composition of the two above) */
void ops_cpu_qk_norm_rope_forward(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                                  const void *weight, float eps, const int32_t *pos,
                                  const float *inv_freq, int N, int nh, int hd);
void ops_cpu_qk_norm_rope_backward(const ops_ctx_t *c, void *dinp, float *dweight,
                                   const void *dout, const void *inp, const void *weight,
                                   const float *rstd, const int32_t *pos, const float *inv_freq,
                                   float eps, int N, int nh, int hd);
/* swiglu.c */
void ops_cpu_swiglu_forward(const ops_ctx_t *c, void *out, const void *gate, const void *up,
                            size_t n);
void ops_cpu_swiglu_backward(const ops_ctx_t *c, void *dgate, void *dup, const void *dout,
                             const void *gate, const void *up, size_t n);
/* embedding.c */
void ops_cpu_embedding_forward(const ops_ctx_t *c, void *out, const int32_t *ids,
                               const void *table, int T, int C);
/* add.c */
void ops_cpu_add(const ops_ctx_t *c, void *out, const void *a, const void *b, size_t n);
void ops_cpu_axpy(const ops_ctx_t *c, void *y, float alpha, const void *x, size_t n);
/* attention.c */
void ops_cpu_attention_varlen_forward(const ops_ctx_t *c, void *out, const void *q,
                                      const void *k, const void *v, const int32_t *cu_seqlens,
                                      int nseq, int max_seqlen, int T, int H, int Hkv, int hd);
/* attention_block.c */
void ops_cpu_attention_block_forward(const ops_ctx_t *c, void *out, float *lse, const void *q,
                                     const void *kb, const void *vb, const void *kc,
                                     const void *vc, const int32_t *ctx_start,
                                     const int32_t *ctx_len, int Nb, int B, int Tc, int H,
                                     int Hkv, int hd);
void ops_cpu_attention_block_backward(const ops_ctx_t *c, void *dq, void *dkb, void *dvb,
                                      void *dkc, void *dvc, const void *dout, const void *out,
                                      const float *lse, const void *q, const void *kb,
                                      const void *vb, const void *kc, const void *vc,
                                      const int32_t *ctx_start, const int32_t *ctx_len, int Nb,
                                      int B, int Tc, int H, int Hkv, int hd);
/* xent.c */
void ops_cpu_xent_forward_backward(const ops_ctx_t *c, void *logits, float *loss, float *correct,
                                   const int32_t *targets, const float *w, float grad_scale,
                                   int N, int V);
/* adamw.c */
void ops_cpu_sumsq(const ops_ctx_t *c, float *out, const float *x, size_t n, int accumulate);
void ops_cpu_adamw(const ops_ctx_t *c, float *master, void *work, const float *grad, float *m,
                   float *v, size_t n, float lr, float b1, float b2, float eps, float wd, int t,
                   const float *norm_sq, float max_norm);
void ops_cpu_sumsq_scaled(const ops_ctx_t *c, float *out, const float *x, float scale, size_t n);
void ops_cpu_adamw_pub(const ops_ctx_t *c, float *master, float *pub, const float *grad,
                       float gscale, float *m, float *v, size_t n, float lr, float b1, float b2,
                       float eps, float wd, int t, const float *norm_sq, float max_norm);
/* moe.c (target MoE layers) */
void ops_cpu_moe_route(const ops_ctx_t *c, int32_t *idx, float *w, const void *logits, int T,
                       int E, int k, int norm);
void ops_cpu_moe_permute(const ops_ctx_t *c, int32_t *offsets, int32_t *tok, int32_t *inv,
                         const int32_t *idx, int T, int E, int k);
void ops_cpu_moe_combine(const ops_ctx_t *c, void *out, const void *y, const int32_t *inv,
                         const float *w, int T, int k, int D);
/* fp8.c (target --target-precision fp8) */
void ops_cpu_fp8_quantize_rows(const ops_ctx_t *c, uint8_t *q, float *s, const void *x, int R,
                               int K);
void ops_cpu_fp8_matmul_forward(const ops_ctx_t *c, void *out, const uint8_t *qx,
                                const float *sx, const uint8_t *qw, const float *sw,
                                const void *bias, int M, int K, int N);
int ops_cpu_fp8_check(const ops_ctx_t *c, int K, int N);

#endif
