/* Internal to the target (common/model/target.c, target_fp8.c): the FP8 (E4M3) linear
 * weights of the decoder layers, for target_opts_t.precision == TARGET_PRECISION_FP8.
 * q, k, v, o, gate, up and down are quantized once at load with one f32 scale per output
 * channel (ops.h fp8_quantize_rows) and their act copies freed; every forward quantizes
 * the layer's inputs per token and runs ops.h fp8_matmul_forward. Embedding, LM head,
 * norms and attention stay in act. Not a public header. */
#ifndef DL_MODEL_TARGET_FP8_H
#define DL_MODEL_TARGET_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/config.h"
#include "common/ops/ops.h"

enum { TFP8_Q, TFP8_K, TFP8_V, TFP8_O, TFP8_G, TFP8_U, TFP8_D, TFP8_N };

/* One quantized linear weight on the backend: q (N, K) e4m3, s (N) f32. */
typedef struct {
    uint8_t *q;
    float *s;
    int N, K;
} target_fp8_w_t;

typedef struct {
    target_fp8_w_t w[TFP8_N];   /* all q NULL: the layer runs in act */
} target_fp8_layer_t;

/* The quantized input of the current linear: qx (rows, K) e4m3, sx (rows) f32. */
typedef struct {
    uint8_t *qx;
    float *sx;
} target_fp8_scratch_t;

/* 0 when the model's linear shapes can run fp8 on backend c, else DL_ENOTSUP naming why
 * (MoE targets; the backend's fp8_check: GPU below sm_89, sizes not multiples of 16,
 * no cuBLASLt algorithm). */
int target_fp8__check(const ops_ctx_t *c, const model_config_t *m);

/* Quantizes layer weights *w[TFP8_Q..TFP8_D] (act on the backend, (N, K) each as in
 * target.c's tlayer_t; dense layers only) into *out and frees the act copies (the
 * pointers are set to NULL). *weight_bytes is adjusted. 0 or DL_ENOMEM. */
int target_fp8__layer_new(const ops_ctx_t *c, const model_config_t *m, void **w[TFP8_N],
                          target_fp8_layer_t *out, size_t *weight_bytes);
void target_fp8__layer_free(const ops_ctx_t *c, target_fp8_layer_t *f);

/* Scratch for inputs of up to max_tokens rows of max(D, H*hd) and mlp_chunk rows of F. */
int target_fp8__scratch_new(const ops_ctx_t *c, const model_config_t *m, int max_tokens,
                            int mlp_chunk, target_fp8_scratch_t *s);
void target_fp8__scratch_free(const ops_ctx_t *c, target_fp8_scratch_t *s);

/* out (M, w->N) act = in (M, w->K) act . W^T + bias through FP8: `in` is quantized per
 * token into s first unless requant is 0 (s still holds the quantized `in` of the
 * previous call: q, k, v share one input, so do gate and up). */
void target_fp8__linear(const ops_ctx_t *c, target_fp8_scratch_t *s, void *out, const void *in,
                        int requant, const target_fp8_w_t *w, const void *bias, int M);

#endif
