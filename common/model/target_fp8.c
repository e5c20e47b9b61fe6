/* FP8 (E4M3) linear weights of the target's decoder layers. See target_fp8.h; the
 * numerics (row-wise scales, saturating round-to-nearest-even) are ops.h's fp8_* ops. */
#include "common/model/target_fp8.h"

#include <string.h>

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/model/target.h"

int target_precision_parse(const char *s, int *out) {
    if (!strcmp(s, "bf16")) *out = TARGET_PRECISION_BF16;
    else if (!strcmp(s, "fp8")) *out = TARGET_PRECISION_FP8;
    else return dl_seterr(DL_EINVAL, "--target-precision '%s': expected bf16 or fp8", s);
    return 0;
}

const char *target_precision_name(int p) { return p == TARGET_PRECISION_FP8 ? "fp8" : "bf16"; }

/* (N, K) of weight i (target.c's tlayer_t shapes). */
static void w_shape(const model_config_t *m, int i, int *N, int *K) {
    int qd = m->H * m->hd, kd = m->Hkv * m->hd;
    switch (i) {
    case TFP8_Q: *N = qd; *K = m->D; break;
    case TFP8_K: case TFP8_V: *N = kd; *K = m->D; break;
    case TFP8_O: *N = m->D; *K = qd; break;
    case TFP8_G: case TFP8_U: *N = m->F; *K = m->D; break;
    default: *N = m->D; *K = m->F; break;
    }
}

int target_fp8__check(const ops_ctx_t *c, const model_config_t *m) {
    if (m->n_experts > 0)
        return dl_seterr(DL_ENOTSUP, "--target-precision fp8: MoE targets (%d experts) are not "
                         "supported (experts stay bf16); use bf16", m->n_experts);
    for (int i = 0; i < TFP8_N; i++) {
        int N, K;
        w_shape(m, i, &N, &K);
        int rc = c->impl->fp8_check(c, K, N);
        if (rc < 0) return rc;
    }
    return 0;
}

int target_fp8__layer_new(const ops_ctx_t *c, const model_config_t *m, void **w[TFP8_N],
                          target_fp8_layer_t *out, size_t *weight_bytes) {
    const ops_impl_t *o = c->impl;
    size_t ab = ops_act_bytes(c);
    for (int i = 0; i < TFP8_N; i++) {
        target_fp8_w_t *f = &out->w[i];
        w_shape(m, i, &f->N, &f->K);
        size_t n = (size_t)f->N * f->K;
        f->q = o->malloc_(c, n);
        f->s = o->malloc_(c, (size_t)f->N * sizeof(float));
        if (!f->q || !f->s)
            return dl_seterr(DL_ENOMEM, "fp8 target: cannot allocate %zu bytes for a (%d, %d) "
                             "weight on the %s backend", n, f->N, f->K, o->name);
        o->fp8_quantize_rows(c, f->q, f->s, *w[i], f->N, f->K);
        o->free_(c, *w[i]);   /* synchronises on CUDA: the quantization has read it */
        *w[i] = NULL;
        *weight_bytes = *weight_bytes - n * ab + n + (size_t)f->N * sizeof(float);
    }
    return 0;
}

void target_fp8__layer_free(const ops_ctx_t *c, target_fp8_layer_t *f) {
    for (int i = 0; i < TFP8_N; i++) {
        if (f->w[i].q) c->impl->free_(c, f->w[i].q);
        if (f->w[i].s) c->impl->free_(c, f->w[i].s);
        f->w[i].q = NULL;
        f->w[i].s = NULL;
    }
}

int target_fp8__scratch_new(const ops_ctx_t *c, const model_config_t *m, int max_tokens,
                            int mlp_chunk, target_fp8_scratch_t *s) {
    size_t w = (size_t)(m->D > m->H * m->hd ? m->D : m->H * m->hd);
    size_t bytes = (size_t)max_tokens * w;
    if ((size_t)mlp_chunk * m->F > bytes) bytes = (size_t)mlp_chunk * m->F;
    s->qx = c->impl->malloc_(c, bytes);
    s->sx = c->impl->malloc_(c, (size_t)max_tokens * sizeof(float));
    if (!s->qx || !s->sx)
        return dl_seterr(DL_ENOMEM, "fp8 target: cannot allocate %zu bytes of quantized "
                         "activations on the %s backend (lower --token-budget)", bytes,
                         c->impl->name);
    return 0;
}

void target_fp8__scratch_free(const ops_ctx_t *c, target_fp8_scratch_t *s) {
    if (s->qx) c->impl->free_(c, s->qx);
    if (s->sx) c->impl->free_(c, s->sx);
    s->qx = NULL;
    s->sx = NULL;
}

void target_fp8__linear(const ops_ctx_t *c, target_fp8_scratch_t *s, void *out, const void *in,
                        int requant, const target_fp8_w_t *w, const void *bias, int M) {
    if (requant) c->impl->fp8_quantize_rows(c, s->qx, s->sx, in, M, w->K);
    c->impl->fp8_matmul_forward(c, out, s->qx, s->sx, w->q, w->s, bias, M, w->K, w->N);
}
