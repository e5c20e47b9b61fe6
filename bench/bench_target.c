/* GPU benchmark of the target forward (common/model/target.c on the CUDA backend).
 *
 * Usage: bench_target --model DIR [--tokens 65536] [--reps 5] [--capture 5] [--profile]
 *                     [--load-only] [--json FILE]
 *   DIR: an HF model dir, e.g. made by `draftline mkmodel --config qwen3-8b --out DIR`
 *   (or --config qwen3-30b-a3b: a Qwen3-MoE target).
 *   --json: also write the figures (and the mixed batch's lengths) to FILE.
 *
 * Measures, in one run:
 *   1. the bf16 GEMM peak of this GPU (cuBLASLt via matmul_forward, 8192^3, random
 *      data), the denominator of MFU;
 *   2. target_forward over a packed micro-batch of --tokens tokens (default 65,536),
 *      random ids, two batches: T/4096 sequences of 4096 (16 x 4096 at 65,536), and mixed lengths
 *      (uniform 128..4096, seeded, summing to T), each in two modes:
 *        capture: the DFlash use: outputs of --capture layers (default ids
 *                 [1, 9, 17, 25, 33] for 36 layers) into (T, 5*D); the layers after
 *                 the last captured one are skipped (34 of 36 layers run);
 *        full:    the same capture plus every layer and the final norm (36 layers;
 *                 what a Hugging Face base-model forward computes; no LM head).
 * FLOPs (useful, per forward) = sum over the layers that run of
 *      2 * T * P_layer + 4 * hd * H * sum_s L_s (L_s + 1) / 2
 * with P_layer = D*(H*hd + 2*Hkv*hd) + H*hd*D + 3*D*F the layer's matmul parameters
 * (norms and biases negligible), i.e. 2 * params * tokens + causal attention
 * (QK^T and PV over the visible keys). MFU = FLOPs / time / measured GEMM peak.
 * MoE layers (Qwen3-MoE): 3*D*F is replaced by the router, D*E per token, and the routed
 * experts: 3*D*Fm per (token, expert) row routed, counted from the warm-up forward's
 * per-expert token counts (target_moe_route_counts; = T * top-k): active parameters only.
 * The routing balance of that forward is printed: max / mean tokens per expert, per MoE
 * layer (mean over layers, and the worst layer).
 * Times: median of --reps CUDA-event-timed forwards after one warm-up.
 * --profile: afterwards, the ops of one decoder layer as target.c's layer_forward
 * issues them (random weights of the model's shapes, the mixed batch), each timed
 * alone (median of --reps), with its share of the layer: where a layer's time goes.
 * --load-only: start-up costs only, then exit: target_load of the whole model and of
 *   its embedding / LM head (embed_only, the drafter worker's), each timed with GB/s
 *   (run twice: the first may read the disk, the second the page cache), and
 *   drafter_new of a 5-layer drafter for this model on the CPU backend (the optimizer's
 *   layout and seeded init) with its init and without (drafter_new_opts no_init).
 * --precision fp8: the target's decoder linears in E4M3 (target_opts_t.precision); the
 *   FP8 GEMM peak (cuBLASLt E4M3, 8192^3 through fp8_matmul_forward) is measured too and
 *   each row is followed by its MFU against that peak; the MFU column stays against the
 *   bf16 peak (the useful FLOPs are the same; H200 dense peaks: bf16 989, fp8 1979 TFLOP/s).
 * --feature-error [--device cpu|cuda] [--text FILE]: no timing; the same batch through
 *   the bf16 and the fp8 target, every layer captured: per layer ||fp8 - bf16|| / ||bf16||
 *   and max|fp8 - bf16| / max|bf16| (DFlash's default capture layers marked *). Token ids:
 *   FILE's bytes tokenized with the model's tokenizer (real text; needs real weights, e.g.
 *   the embedded SmolLM2 GGUF), in sequences of 2048, else random ids. --device cpu runs
 *   without a GPU (fp32 vs the fp8 emulation; SmolLM2-sized models).
 * --attn-variant N: the causal attention kernel (ops_cuda_attention_varlen_variant: 1, 2, 3;
 *   0 or absent: the default); the line "causal attention kernel" says which runs.
 * --gemm-picks 0|1: cuBLASLt's per-shape picks (ops_cuda_gemm_picks; 1, the default) or
 *   always the heuristic's first choice (0); the line "causal attention kernel" says which.
 * Prints "SKIP: ..." and exits 0 without CUDA or without --model. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/data/tokenizer.h"
#include "common/model/config.h"
#include "common/model/drafter.h"
#include "common/model/target.h"
#include "common/model/target_moe.h"
#include "common/pipe/model.h"
#include "common/ops/ops.h"
#include "common/ops/cuda/ops_cuda.h"

#ifndef DL_CUDA
int main(void) {
    printf("SKIP: bench_target: built without CUDA\n");
    return 0;
}
#else
#include <cjson/cJSON.h>
#include <cuda_runtime_api.h>

static ops_ctx_t C;

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void *rand_act(size_t n, uint64_t seed) {
    const size_t chunk = 1u << 24;
    float *h = malloc(chunk * sizeof(float));
    void *d = C.impl->malloc_(&C, n * 2);
    if (!d || !h) { fprintf(stderr, "bench_target: out of memory\n"); exit(1); }
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        for (size_t i = 0; i < m; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            h[i] = (float)(s >> 40) * (2.0f / 16777216.0f) - 1.0f;
        }
        C.impl->upload_act(&C, (char *)d + off * 2, h, m);
    }
    free(h);
    return d;
}

static double gemm_peak(void) {
    const int n = 8192;
    void *a = rand_act((size_t)n * n, 1), *b = rand_act((size_t)n * n, 2);
    void *c = C.impl->malloc_(&C, (size_t)n * n * 2);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float t[20];
    for (int i = 0; i < 5; i++) C.impl->matmul_forward(&C, c, a, b, NULL, n, n, n);
    for (int i = 0; i < 20; i++) {
        cudaEventRecord(e0, (cudaStream_t)C.stream);
        C.impl->matmul_forward(&C, c, a, b, NULL, n, n, n);
        cudaEventRecord(e1, (cudaStream_t)C.stream);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&t[i], e0, e1);
    }
    qsort(t, 20, sizeof(float), cmpf);
    double tf = 2.0 * n * n * (double)n / (t[10] * 1e-3) / 1e12;
    printf("GEMM peak (bf16, cuBLASLt, 8192^3, random data): %.3f ms = %.1f TFLOP/s\n", t[10], tf);
    C.impl->free_(&C, a); C.impl->free_(&C, b); C.impl->free_(&C, c);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return tf;
}

/* Median ms of reps runs of STMT (after one warm-up), CUDA events on C's stream. */
#define PROF(label, STMT)                                                                 \
    do {                                                                                  \
        float t_[64];                                                                     \
        STMT;                                                                             \
        for (int r_ = 0; r_ < reps; r_++) {                                               \
            cudaEventRecord(e0, (cudaStream_t)C.stream);                                  \
            STMT;                                                                         \
            cudaEventRecord(e1, (cudaStream_t)C.stream);                                  \
            cudaEventSynchronize(e1);                                                     \
            cudaEventElapsedTime(&t_[r_], e0, e1);                                        \
        }                                                                                 \
        qsort(t_, (size_t)reps, sizeof(float), cmpf);                                     \
        names[n] = (label);                                                               \
        ms[n++] = t_[reps / 2];                                                           \
    } while (0)

/* One decoder layer's ops at T tokens (same order and shapes as layer_forward in
 * common/model/target.c, MLP in chunks of mlp_chunk rows), each timed alone. */
static void profile_layer(const model_config_t *m, int T, int mlp_chunk, const int32_t *d_pos,
                          const int32_t *d_cu, int nseq, int maxlen, void *feat, int ncap,
                          int reps) {
    const ops_impl_t *o = C.impl;
    int D = m->D, H = m->H, Hkv = m->Hkv, hd = m->hd, F = m->F, qd = H * hd, kd = Hkv * hd;
    size_t t = (size_t)T;
    void *x = rand_act(t * D, 11), *xn = rand_act(t * D, 12), *q = rand_act(t * qd, 13);
    void *k = rand_act(t * kd, 14), *v = rand_act(t * kd, 15), *att = rand_act(t * qd, 16);
    void *g = rand_act((size_t)mlp_chunk * F, 17), *u = rand_act((size_t)mlp_chunk * F, 18);
    void *hm = rand_act((size_t)mlp_chunk * F, 19);
    void *wn = rand_act((size_t)D, 20), *whd = rand_act((size_t)hd, 21);
    void *wq = rand_act((size_t)qd * D, 22), *wk = rand_act((size_t)kd * D, 23);
    void *wv = rand_act((size_t)kd * D, 24), *wo = rand_act((size_t)D * qd, 25);
    void *wg = rand_act((size_t)F * D, 26), *wu = rand_act((size_t)F * D, 27);
    void *wd = rand_act((size_t)D * F, 28);
    float *inv = C.impl->malloc_(&C, (size_t)hd / 2 * 4), *invh = malloc((size_t)hd / 2 * 4);
    ops_rope_inv_freq(&m->rope, hd, invh);
    C.impl->upload(&C, inv, invh, (size_t)hd / 2 * 4);
    free(invh);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const char *names[32];
    float ms[32];   /* at most 32 PROF lines */
    int n = 0;
    size_t rowb = (size_t)D * 2;
    PROF("residual add + input rmsnorm", o->add_rmsnorm_forward(&C, x, xn, NULL, xn, wn, m->eps, T, D));
    PROF("q_proj", o->matmul_forward(&C, q, xn, wq, NULL, T, D, qd));
    PROF("k_proj", o->matmul_forward(&C, k, xn, wk, NULL, T, D, kd));
    PROF("v_proj", o->matmul_forward(&C, v, xn, wv, NULL, T, D, kd));
    PROF("q/k norm + rope", (o->qk_norm_rope_forward_exact(&C, att, NULL, q, whd, m->eps, d_pos, inv, T, H, hd),
                             o->qk_norm_rope_forward_exact(&C, k, NULL, k, whd, m->eps, d_pos, inv, T, Hkv, hd)));
    /* the two ops it replaces, for reference (not in the sum) */
    PROF("  unfused: q/k norm (ref.)", (o->rmsnorm_forward(&C, att, NULL, q, whd, m->eps, T * H, hd),
                                        o->rmsnorm_forward(&C, k, NULL, k, whd, m->eps, T * Hkv, hd)));
    PROF("  unfused: rope q/k (ref.)", (o->rope_forward(&C, q, d_pos, inv, T, H, hd),
                                        o->rope_forward(&C, k, d_pos, inv, T, Hkv, hd)));
    PROF("attention varlen", o->attention_varlen_forward(&C, att, q, k, v, d_cu, nseq, maxlen, T, H,
                                                         Hkv, hd));
    PROF("o_proj", o->matmul_forward(&C, xn, att, wo, NULL, T, qd, D));
    PROF("residual add + post rmsnorm", o->add_rmsnorm_forward(&C, x, xn, NULL, xn, wn, m->eps, T, D));
    /* the two ops each replaces, for reference (not in the sum) */
    PROF("  unfused: add (ref.)", o->add(&C, x, x, xn, t * D));
    PROF("  unfused: rmsnorm (ref.)", o->rmsnorm_forward(&C, xn, NULL, x, wn, m->eps, T, D));
    PROF("gate_proj (chunks)", for (int r0 = 0; r0 < T; r0 += mlp_chunk)
             o->matmul_forward(&C, g, (char *)xn + (size_t)r0 * rowb, wg, NULL,
                               T - r0 < mlp_chunk ? T - r0 : mlp_chunk, D, F));
    PROF("up_proj (chunks)", for (int r0 = 0; r0 < T; r0 += mlp_chunk)
             o->matmul_forward(&C, u, (char *)xn + (size_t)r0 * rowb, wu, NULL,
                               T - r0 < mlp_chunk ? T - r0 : mlp_chunk, D, F));
    PROF("swiglu (chunks)", for (int r0 = 0; r0 < T; r0 += mlp_chunk)
             o->swiglu_forward(&C, hm, g, u, (size_t)(T - r0 < mlp_chunk ? T - r0 : mlp_chunk) * F));
    PROF("down_proj (chunks)", for (int r0 = 0; r0 < T; r0 += mlp_chunk)
             o->matmul_forward(&C, (char *)xn + (size_t)r0 * rowb, hm, wd, NULL,
                               T - r0 < mlp_chunk ? T - r0 : mlp_chunk, F, D));
    /* the same gate GEMM unchunked (M = T): does the 16k-row chunking cost speed? */
    void *gbig = C.impl->malloc_(&C, t * F * 2);
    if (gbig) {
        PROF("gate_proj (M = T, reference)", o->matmul_forward(&C, gbig, xn, wg, NULL, T, D, F));
        C.impl->free_(&C, gbig);
    }
    if (o->copy2d)
        PROF("capture copy (one layer)", o->copy2d(&C, feat, (size_t)ncap * rowb, x, rowb, rowb, t));
    double tot = 0;  /* the layer: every op but the references and the copy */
    for (int i = 0; i < n; i++)
        if (!strstr(names[i], "ref") && strncmp(names[i], "capture", 7)) tot += ms[i];
    printf("profile: one layer's ops at T = %d (MLP chunk %d rows), each timed alone:\n", T, mlp_chunk);
    for (int i = 0; i < n; i++) printf("  %-30s %8.3f ms  %5.1f%%\n", names[i], ms[i], 100 * ms[i] / tot);
    printf("  %-30s %8.3f ms (layer ops; shares are of this)\n", "sum", tot);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    void *bufs[] = {x, xn, q, k, v, att, g, u, hm, wn, whd, wq, wk, wv, wo, wg, wu, wd, inv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) C.impl->free_(&C, bufs[i]);
}

/* ---- FP8 (--precision fp8, --feature-error); separate from the bf16 paths above. */

/* FP8 GEMM peak: 8192^3 E4M3 through fp8_matmul_forward (cuBLASLt), TFLOP/s. */
static double fp8_gemm_peak(void) {
    const int n = 8192;
    void *a = rand_act((size_t)n * n, 3), *b = rand_act((size_t)n * n, 4);
    uint8_t *qa = C.impl->malloc_(&C, (size_t)n * n), *qb = C.impl->malloc_(&C, (size_t)n * n);
    float *sa = C.impl->malloc_(&C, (size_t)n * 4), *sb = C.impl->malloc_(&C, (size_t)n * 4);
    void *c = C.impl->malloc_(&C, (size_t)n * n * 2);
    if (C.impl->fp8_check(&C, n, n) < 0) { printf("fp8 GEMM: %s\n", dl_errmsg()); return 0; }
    C.impl->fp8_quantize_rows(&C, qa, sa, a, n, n);
    C.impl->fp8_quantize_rows(&C, qb, sb, b, n, n);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float t[20];
    for (int i = 0; i < 5; i++) C.impl->fp8_matmul_forward(&C, c, qa, sa, qb, sb, NULL, n, n, n);
    for (int i = 0; i < 20; i++) {
        cudaEventRecord(e0, (cudaStream_t)C.stream);
        C.impl->fp8_matmul_forward(&C, c, qa, sa, qb, sb, NULL, n, n, n);
        cudaEventRecord(e1, (cudaStream_t)C.stream);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&t[i], e0, e1);
    }
    qsort(t, 20, sizeof(float), cmpf);
    double tf = 2.0 * n * n * (double)n / (t[10] * 1e-3) / 1e12;
    printf("GEMM peak (fp8 E4M3, cuBLASLt, outer-vector scales, 8192^3): %.3f ms = %.1f TFLOP/s\n",
           t[10], tf);
    void *bufs[] = {a, b, qa, qb, sa, sb, c};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) C.impl->free_(&C, bufs[i]);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return tf;
}

/* After a table row of an fp8 target: its MFU against the FP8 peak. */
static void fp8_row_note(double tflops, double peak8) {
    if (peak8 > 0) printf("%52s(fp8: %.1f%% of the fp8 GEMM peak %.0f TFLOP/s)\n", "", 100 * tflops / peak8, peak8);
}

/* T token ids: text_path tokenized with the model's tokenizer (repeated to fill T), or
 * random ids below V. 0, or -1 after a message. */
static int fe_ids(const char *model, const char *text_path, int V, int T, int32_t *ids) {
    if (!text_path) {
        rng_t r;
        rng_seed(&r, 20261202);
        for (int i = 0; i < T; i++) ids[i] = (int32_t)rng_below(&r, (uint64_t)V);
        return 0;
    }
    tok_t *tok = NULL;
    FILE *f = fopen(text_path, "rb");
    if (!f || tok_load(model, &tok) < 0) { fprintf(stderr, "bench_target: --text: %s\n", f ? dl_errmsg() : text_path); return -1; }
    size_t cap = (size_t)T * 8 + 4096;
    char *buf = malloc(cap);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    tok_ids_t v = {0};
    int rc = tok_encode(tok, buf, n, 0, 0, &v);
    free(buf);
    tok_destroy(&tok);
    if (rc < 0 || v.n == 0) { fprintf(stderr, "bench_target: --text: no tokens\n"); tok_ids_free(&v); return -1; }
    for (int i = 0; i < T; i++) ids[i] = v.ids[(size_t)i % v.n];
    printf("text %s: %zu tokens (%s)\n", text_path, v.n, v.n >= (size_t)T ? "first T used" : "repeated to T");
    tok_ids_free(&v);
    return 0;
}

/* Features of every layer (T, L*D), downloaded to f32, of model at precision prec. */
static float *fe_forward(ops_ctx_t *c, const char *model, int prec, const int32_t *ids, const int32_t *cu,
                         int nseq, int T, int L, int D) {
    target_opts_t o = {.max_tokens = T, .max_seqs = nseq, .n_capture = L, .precision = prec};
    for (int i = 0; i < L; i++) o.capture_ids[i] = i;
    target_t *t = NULL;
    if (target_load(model, c, &o, &t)) { fprintf(stderr, "bench_target: %s\n", dl_errmsg()); return NULL; }
    size_t n = (size_t)T * L * D;
    void *f = c->impl->malloc_(c, n * ops_act_bytes(c));
    float *h = malloc(n * sizeof *h);
    if (!f || !h || target_forward_host(t, ids, NULL, cu, nseq, T, f, NULL)) {
        fprintf(stderr, "bench_target: feature forward: %s\n", dl_errmsg());
        return NULL;
    }
    c->impl->download_act(c, h, f, n);
    c->impl->free_(c, f);
    target_destroy(&t);
    return h;
}

/* --feature-error: per-layer error of fp8 features vs bf16 (see the header). */
static int feature_error(const char *model, const char *device, const char *text, int T, int ncap) {
    ops_ctx_t c;
    if (ops_init_named(&c, device, 0, 0)) { printf("SKIP: bench_target: %s\n", dl_errmsg()); return 0; }
    target_opts_t o0 = {.max_tokens = 1, .max_seqs = 1, .embed_only = 1};
    target_t *t0 = NULL;
    if (target_load(model, &c, &o0, &t0)) { fprintf(stderr, "bench_target: %s\n", dl_errmsg()); return 1; }
    model_config_t m = *target_config(t0);
    target_destroy(&t0);
    int L = m.L, D = m.D, nseq = (T + 2047) / 2048, def[TARGET_MAX_CAPTURE] = {0};
    if (L > TARGET_MAX_CAPTURE || target_default_layer_ids(L, ncap, def)) { fprintf(stderr, "bench_target: L %d\n", L); return 1; }
    int32_t *ids = malloc((size_t)T * 4), *cu = malloc(((size_t)nseq + 1) * 4);
    for (int s = 0; s <= nseq; s++) cu[s] = s * 2048 < T ? s * 2048 : T;
    if (fe_ids(model, text, m.V, T, ids) < 0) return 1;
    printf("feature error, fp8 vs %s target: %s (%s), %d tokens in %d sequences\n",
           c.backend == OPS_CPU ? "fp32" : "bf16", model, device, T, nseq);
    float *a = fe_forward(&c, model, TARGET_PRECISION_BF16, ids, cu, nseq, T, L, D);
    float *b = a ? fe_forward(&c, model, TARGET_PRECISION_FP8, ids, cu, nseq, T, L, D) : NULL;
    if (!b) return 1;
    printf("%6s %12s %12s\n", "layer", "norm_rel", "max_rel");
    for (int l = 0; l < L; l++) {
        double num = 0, den = 0, dmax = 0, amax = 0;
        for (int r = 0; r < T; r++)
            for (int k = 0; k < D; k++) {
                size_t i = ((size_t)r * L + l) * D + k;
                double d = (double)b[i] - a[i];
                num += d * d, den += (double)a[i] * a[i];
                dmax = fmax(dmax, fabs(d)), amax = fmax(amax, fabs(a[i]));
            }
        int star = 0;
        for (int i = 0; i < ncap; i++) star |= def[i] == l;
        printf("%5d%s %12.3e %12.3e\n", l, star ? "*" : " ", sqrt(num / (den > 0 ? den : 1)),
               dmax / (amax > 0 ? amax : 1));
    }
    free(a); free(b); free(ids); free(cu);
    ops_ctx_destroy(&c);
    return 0;
}

/* Useful FLOPs of layer l over a forward of T tokens: 2 * T * (attention matmul params)
 * + causal attention 4 * hd * H * attn_pairs, plus the MLP: dense 2 * T * 3 * D * F; MoE
 * the router 2 * T * D * E and the routed experts 2 * rows * 3 * D * Fm, rows = the
 * (token, expert) pairs routed in that layer (counts, from the forward itself; T * k when
 * counts is NULL, the same number). Only the experts actually used count: active params. */
static double layer_flops(const model_config_t *m, int l, int T, double attn_pairs,
                          const int64_t *counts) {
    double D = m->D, Q = (double)m->H * m->hd, KV = (double)m->Hkv * m->hd;
    double f = 2.0 * T * (D * (Q + 2 * KV) + Q * D) + 4.0 * m->hd * m->H * attn_pairs;
    if (!model_config_layer_moe(m, l)) return f + 2.0 * T * 3 * D * m->F;
    double rows = (double)T * m->top_k;
    if (counts) {
        rows = 0;
        for (int e = 0; e < m->n_experts; e++) rows += (double)counts[(size_t)l * m->n_experts + e];
    }
    return f + 2.0 * T * D * m->n_experts + 2.0 * rows * 3 * D * m->moe_F;
}

/* Batch 0: T/4096 sequences of 4096 (the rest as one more); batch 1: mixed lengths uniform
 * in 128..4096 (seed 7). Fills cu (nseq+1), pos (T), *maxlen, *pairs (sum L(L+1)/2);
 * returns nseq. */
static int make_batch(int batch, int T, int32_t *cu, int32_t *pos, int *maxlen, double *pairs) {
    int nseq = 0;
    cu[0] = 0;
    if (batch == 0) {
        for (int s = 0; s < T / 4096; s++, nseq++) cu[nseq + 1] = cu[nseq] + 4096;
        if (cu[nseq] < T) { cu[nseq + 1] = T; nseq++; }
    } else {
        rng_t rl;
        rng_seed(&rl, 7);
        while (cu[nseq] < T) {
            int len = 128 + (int)rng_below(&rl, 4096 - 128 + 1), left = T - cu[nseq];
            if (left - len < 128) len = left; /* last one takes the rest (<= 4095 + 128) */
            if (len > 4096) { len = left / 2; }
            cu[nseq + 1] = cu[nseq] + len;
            nseq++;
        }
    }
    *maxlen = 0;
    *pairs = 0;
    for (int s = 0; s < nseq; s++) {
        int n = cu[s + 1] - cu[s];
        if (n > *maxlen) *maxlen = n;
        *pairs += (double)n * (n + 1) / 2;
        for (int i = 0; i < n; i++) pos[cu[s] + i] = i;
    }
    return nseq;
}

typedef struct {
    target_t *t;
    const int32_t *d_ids, *d_pos, *d_cu;
    int T, nseq, maxlen, reps;
    void *feat, *hid;
    double pairs, peak, peak8;   /* peak8: the fp8 GEMM peak (0: bf16 target) */
    cJSON *rows;       /* array the results go to (NULL: none) */
} bench_run_t;

/* Prints the routing balance of counts (one forward) and adds it to row. */
static void report_balance(const model_config_t *m, const int64_t *counts, cJSON *row) {
    double *ratio = calloc((size_t)m->L, sizeof *ratio), mean = 0;
    int worst, n = 0;
    int64_t routed;
    double w = target_moe_balance(m, counts, ratio, &worst, &routed);
    cJSON *arr = row ? cJSON_AddArrayToObject(row, "balance_per_layer") : NULL;
    for (int l = 0; l < m->L; l++) {
        if (ratio[l] > 0) mean += ratio[l], n++;
        if (arr) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ratio[l]));
    }
    if (n) mean /= n;
    printf("         routing balance (max / mean tokens per expert, %d MoE layers run): mean %.2f, "
           "worst %.2f at layer %d; %lld (token, expert) rows\n", n, mean, w, worst,
           (long long)routed);
    if (row) {
        cJSON_AddNumberToObject(row, "balance_mean", mean);
        cJSON_AddNumberToObject(row, "balance_worst", w);
        cJSON_AddNumberToObject(row, "balance_worst_layer", worst);
        cJSON_AddNumberToObject(row, "routed_rows", (double)routed);
    }
    free(ratio);
}

/* One (batch, mode): warm-up forward (routing counted on an MoE target), then reps timed
 * forwards; prints the row. mode 0: capture (layers up to the last captured), 1: full. */
static int run_mode(bench_run_t *b, const char *bname, int mode, int last, cudaEvent_t e0,
                    cudaEvent_t e1) {
    const model_config_t *m = target_config(b->t);
    int nl = mode == 0 ? last + 1 : m->L, moe = m->n_experts > 0;
    void *h = mode == 0 ? NULL : b->hid;
    float ts[64];
    if (moe && target_moe_count_routes(b->t, 1)) return -1;
    if (target_forward(b->t, b->d_ids, b->d_pos, b->d_cu, b->nseq, b->maxlen, b->T, b->feat, h)) return -1;
    cudaStreamSynchronize((cudaStream_t)C.stream);
    if (moe) target_moe_count_routes(b->t, 0);
    const int64_t *counts = moe ? target_moe_route_counts(b->t) : NULL;
    double fl = 0;
    for (int l = 0; l < nl; l++) fl += layer_flops(m, l, b->T, b->pairs, counts);
    for (int i = 0; i < b->reps; i++) {
        cudaEventRecord(e0, (cudaStream_t)C.stream);
        target_forward(b->t, b->d_ids, b->d_pos, b->d_cu, b->nseq, b->maxlen, b->T, b->feat, h);
        cudaEventRecord(e1, (cudaStream_t)C.stream);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ts[i], e0, e1);
    }
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return dl_seterr(DL_ECUDA, "CUDA: %s", cudaGetErrorString(err));
    qsort(ts, (size_t)b->reps, sizeof(float), cmpf);
    double ms = ts[b->reps / 2], tf = fl / (ms * 1e-3) / 1e12;
    printf("%-8s %-8s %5d %6d %9.2f %11.0f %9.1f %6.1f%%\n", bname, mode == 0 ? "capture" : "full",
           b->nseq, nl, ms, b->T / (ms * 1e-3), tf, 100 * tf / b->peak);
    fp8_row_note(tf, b->peak8);
    cJSON *row = b->rows ? cJSON_CreateObject() : NULL;
    if (row) {
        cJSON_AddStringToObject(row, "batch", bname);
        cJSON_AddStringToObject(row, "mode", mode == 0 ? "capture" : "full");
        cJSON_AddNumberToObject(row, "seqs", b->nseq);
        cJSON_AddNumberToObject(row, "layers", nl);
        cJSON_AddNumberToObject(row, "tokens", b->T);
        cJSON_AddNumberToObject(row, "ms", ms);
        cJSON_AddNumberToObject(row, "tokens_per_s", b->T / (ms * 1e-3));
        cJSON_AddNumberToObject(row, "tflop", fl / 1e12);
        cJSON_AddNumberToObject(row, "tflops", tf);
        cJSON_AddNumberToObject(row, "mfu", tf / b->peak);
        cJSON_AddItemToArray(b->rows, row);
    }
    if (moe) report_balance(m, counts, row);
    fflush(stdout);
    return 0;
}

static void print_model(const char *model, const model_config_t *m, const target_t *t,
                        const target_opts_t *o, int ncap) {
    printf("model %s: L %d, D %d, H %d/%d, hd %d, F %d, V %d; %.2f GB of %s weights; capture [", model,
           m->L, m->D, m->H, m->Hkv, m->hd, m->F, m->V, target_weight_bytes(t) / 1e9,
           target_precision_name(target_opts(t)->precision));
    for (int i = 0; i < ncap; i++) printf("%s%d", i ? ", " : "", o->capture_ids[i]);
    printf("]\n");
    if (m->n_experts > 0)
        printf("MoE: %d experts, top-%d, expert F %d, %d of %d layers MoE; %.3f B parameters, "
               "%.3f B active per token (FLOPs count the routed experts only)\n",
               m->n_experts, m->top_k, m->moe_F, model_config_n_moe_layers(m), m->L,
               model_config_n_params(m) / 1e9, model_config_n_active_params(m) / 1e9);
}

static cJSON *json_model(const char *model, const model_config_t *m, double peak, int T) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "bench", "bench_target");
    cJSON_AddStringToObject(j, "model", model);
    cJSON_AddNumberToObject(j, "layers", m->L);
    cJSON_AddNumberToObject(j, "experts", m->n_experts);
    cJSON_AddNumberToObject(j, "top_k", m->top_k);
    cJSON_AddNumberToObject(j, "params", (double)model_config_n_params(m));
    cJSON_AddNumberToObject(j, "active_params", (double)model_config_n_active_params(m));
    cJSON_AddNumberToObject(j, "gemm_peak_tflops", peak);
    cJSON_AddNumberToObject(j, "tokens", T);
    cJSON_AddArrayToObject(j, "rows");
    return j;
}

static int write_json(const char *path, cJSON *j) {
    char *txt = cJSON_Print(j);
    FILE *f = txt ? fopen(path, "w") : NULL;
    int ok = f && fputs(txt, f) >= 0 && fputc('\n', f) != EOF;
    if (f) ok = fclose(f) == 0 && ok;
    free(txt);
    if (!ok) fprintf(stderr, "bench_target: cannot write %s\n", path);
    return ok ? 0 : -1;
}

/* --load-only (see the top): prints the start-up timings; 0 or 1. */
static int load_only(const char *model, const model_config_t *cfg, target_opts_t o) {
    for (int embed_only = 0; embed_only < 2; embed_only++) {
        o.embed_only = embed_only;
        for (int k = 0; k < 2; k++) {
            target_t *t = NULL;
            double t0 = clock_mono_s();
            if (target_load(model, &C, &o, &t)) { fprintf(stderr, "bench_target: %s\n", dl_errmsg()); return 1; }
            double dt = clock_mono_s() - t0;
            printf("target_load%s (run %d): %.2f s, %.2f GB of weights, %.2f GB/s\n", embed_only ? " embed_only" : "",
                   k + 1, dt, target_weight_bytes(t) / 1e9, target_weight_bytes(t) / 1e9 / dt);
            target_destroy(&t);
        }
    }
    drafter_config_t dc;
    if (pipe_drafter_config(cfg, 5, 0, 16, &dc)) { fprintf(stderr, "bench_target: %s\n", dl_errmsg()); return 1; }
    ops_ctx_t cpu;
    ops_cpu_init(&cpu, 0);
    static const float no_embedding[1];
    for (int no_init = 0; no_init < 2; no_init++) {
        drafter_new_opts_t dopt = {.no_init = no_init};
        drafter_t *d = NULL;
        double t0 = clock_mono_s();
        if (drafter_new_opts(&cpu, &dc, no_embedding, no_embedding, 1, 1, 0, &dopt, &d)) {
            fprintf(stderr, "bench_target: %s\n", dl_errmsg());
            return 1;
        }
        printf("drafter_new (CPU, 5 layers, %zu parameters)%s: %.2f s\n", drafter_n_params(d),
               no_init ? " no_init" : " seeded init", clock_mono_s() - t0);
        drafter_destroy(&d);
    }
    ops_ctx_destroy(&cpu);
    return 0;
}

int main(int argc, char **argv) {
    const char *model = NULL, *json = NULL, *device = "cuda", *text = NULL;
    int load = 0, prec = TARGET_PRECISION_BF16, ferr = 0;
    int T = 65536, reps = 5, ncap = 5, profile = 0, variant = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--capture") && i + 1 < argc) ncap = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--quick")) reps = 2;
        else if (!strcmp(argv[i], "--profile")) profile = 1;
        else if (!strcmp(argv[i], "--load-only")) load = 1;
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            if (target_precision_parse(argv[++i], &prec)) { fprintf(stderr, "bench_target: %s\n", dl_errmsg()); return 2; }
        } else if (!strcmp(argv[i], "--feature-error")) ferr = 1;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc) text = argv[++i];
        else if (!strcmp(argv[i], "--gemm-picks") && i + 1 < argc) {
            const char *a = argv[++i];
            if (strcmp(a, "0") && strcmp(a, "1")) {
                fprintf(stderr, "bench_target: --gemm-picks '%s': expected 0 or 1\n", a);
                return 2;
            }
            ops_cuda_gemm_picks(a[0] == '1');
        } else if (!strcmp(argv[i], "--attn-variant") && i + 1 < argc) {
            const char *a = argv[++i];
            char *end;
            long n = strtol(a, &end, 10);
            if (end == a || *end || n < 0 || n > OPS_CUDA_ATTN_VARLEN_VARIANTS) {
                fprintf(stderr, "bench_target: --attn-variant '%s': expected 0..%d\n", a,
                        OPS_CUDA_ATTN_VARLEN_VARIANTS);
                return 2;
            }
            variant = (int)n;
        }
    }
    if (ferr && model) return feature_error(model, device, text, T == 65536 ? 8192 : T, ncap);
    if (reps < 1 || reps > 50) reps = 5;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: bench_target: no CUDA device\n");
        return 0;
    }
    if (!model) {
        printf("SKIP: bench_target: no --model (make one: draftline mkmodel --config qwen3-8b --out DIR;"
               " DL_BENCH_MODEL=DIR make bench)\n");
        return 0;
    }
    if (ops_cuda_init(&C, 0) != 0) {
        printf("SKIP: bench_target: ops_cuda_init: %s\n", dl_errmsg());
        return 0;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    ops_cuda_attention_varlen_variant(variant);
    double peak = gemm_peak(), peak8 = prec == TARGET_PRECISION_FP8 ? fp8_gemm_peak() : 0;

    model_config_t cfg;
    if (model_config_from_hf_dir(model, &cfg)) { fprintf(stderr, "bench_target: %s\n", dl_errmsg()); return 1; }
    {
        int want = ops_cuda_attention_varlen_variant(-1);
        int runs = ops_cuda_attention_varlen_resolve(want, cfg.hd);
        printf("causal attention kernel: variant %d", want);
        if (runs != want) printf(" (head dim %d or this GPU: variant %d runs)", cfg.hd, runs);
        printf("; GEMM picks %s", ops_cuda_gemm_picks(-1) ? "on" : "off");
        printf("\n");
    }
    target_opts_t o = {.max_tokens = T, .max_seqs = T / 128 + 1, .n_capture = ncap, .precision = prec};
    if (target_default_layer_ids(cfg.L, ncap, o.capture_ids)) { fprintf(stderr, "%s\n", dl_errmsg()); return 1; }
    if (load) return load_only(model, &cfg, o);
    target_t *t = NULL;
    double tl = clock_mono_s();
    if (target_load(model, &C, &o, &t)) { fprintf(stderr, "bench_target: %s\n", dl_errmsg()); return 1; }
    tl = clock_mono_s() - tl;
    const model_config_t *m = target_config(t);
    print_model(model, m, t, &o, ncap);
    printf("target loaded in %.1f s: %.2f GB of weights, %.2f GB/s\n", tl, target_weight_bytes(t) / 1e9,
           target_weight_bytes(t) / 1e9 / tl);
    int last = 0;
    for (int i = 0; i < ncap; i++)
        if (o.capture_ids[i] > last) last = o.capture_ids[i];
    cJSON *js = json ? json_model(model, m, peak, T) : NULL;
    if (js) cJSON_AddNumberToObject(js, "load_s", tl);

    int32_t *ids = malloc((size_t)T * 4), *cu = malloc(((size_t)T / 128 + 2) * 4);
    rng_t r;
    rng_seed(&r, 20261130);
    for (int i = 0; i < T; i++) ids[i] = (int32_t)rng_below(&r, (uint64_t)m->V);
    size_t ab = 2;
    void *feat = C.impl->malloc_(&C, (size_t)T * ncap * m->D * ab);
    void *hid = C.impl->malloc_(&C, (size_t)T * m->D * ab);
    int32_t *d_ids = C.impl->malloc_(&C, (size_t)T * 4), *d_pos = C.impl->malloc_(&C, (size_t)T * 4);
    int32_t *d_cu = C.impl->malloc_(&C, ((size_t)T / 128 + 2) * 4), *pos = malloc((size_t)T * 4);
    if (!feat || !hid || !d_ids || !d_pos || !d_cu) { fprintf(stderr, "bench_target: out of memory\n"); return 1; }
    C.impl->upload(&C, d_ids, ids, (size_t)T * 4);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    printf("%-8s %-8s %5s %6s %9s %11s %9s %7s\n", "batch", "mode", "seqs", "layers", "ms", "tokens/s",
           "TFLOP/s", "MFU");
    bench_run_t b = {.t = t, .d_ids = d_ids, .d_pos = d_pos, .d_cu = d_cu, .T = T, .reps = reps,
                     .feat = feat, .hid = hid, .peak = peak, .peak8 = peak8,
                     .rows = js ? cJSON_GetObjectItem(js, "rows") : NULL};
    for (int batch = 0; batch < 2; batch++) {
        b.nseq = make_batch(batch, T, cu, pos, &b.maxlen, &b.pairs);
        if (batch == 1) {
            cJSON *ml = js ? cJSON_AddArrayToObject(js, "mixed_lengths") : NULL;
            printf("mixed lengths:");
            for (int s = 0; s < b.nseq; s++) {
                printf("%s%d", s ? "," : " ", cu[s + 1] - cu[s]);
                if (ml) cJSON_AddItemToArray(ml, cJSON_CreateNumber(cu[s + 1] - cu[s]));
            }
            printf("\n");
        }
        C.impl->upload(&C, d_cu, cu, ((size_t)b.nseq + 1) * 4);
        C.impl->upload(&C, d_pos, pos, (size_t)T * 4);
        char bname[32];
        if (batch == 0) snprintf(bname, sizeof bname, "%dx4096", T / 4096);
        else snprintf(bname, sizeof bname, "mixed");
        for (int mode = 0; mode < 2; mode++)
            if (run_mode(&b, bname, mode, last, e0, e1)) {
                fprintf(stderr, "bench_target: %s\n", dl_errmsg());
                return 1;
            }
    }
    size_t fr, tot;
    cudaMemGetInfo(&fr, &tot);
    if (profile && m->n_experts > 0)
        printf("profile: dense layer ops only; skipped for an MoE target\n");
    else if (profile) /* 16384: TARGET_MLP_CHUNK of common/model/target.c */
        profile_layer(m, T, T < 16384 ? T : 16384, d_pos, d_cu, b.nseq, b.maxlen, feat, ncap, reps);
    printf("device memory in use: %.1f GiB of %.1f GiB\n", (tot - fr) / 1073741824.0, tot / 1073741824.0);
    if (js) {
        cJSON_AddNumberToObject(js, "device_mem_gib", (tot - fr) / 1073741824.0);
        int rc = write_json(json, js);
        cJSON_Delete(js);
        if (rc) return 1;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    C.impl->free_(&C, feat); C.impl->free_(&C, hid); C.impl->free_(&C, d_ids);
    C.impl->free_(&C, d_pos); C.impl->free_(&C, d_cu);
    free(ids), free(cu), free(pos);
    target_destroy(&t);
    ops_ctx_destroy(&C);
    return 0;
}
#endif
