/* GPU benchmarks of the CUDA ops backend (common/ops/cuda):
 *   1. measured bf16 GEMM peak: cuBLASLt through matmul_forward, 8192^3, TFLOP/s
 *      (random data: zeros run faster and would flatter the peak);
 *   2. device-to-device copy bandwidth (bytes read + written);
 *   3. per-op timings at pipeline shapes (Qwen3-8B: D=4096, F=12288, H=32,
 *      Hkv=8, hd=128, V=151936): linear layers fwd/bwd, RMSNorm, SwiGLU, xent,
 *      AdamW, varlen causal attention at T=65536 mixed lengths, DFlash block
 *      attention at Nb*B=65536 (B=16, 8 sequences x 4096 context, 512 anchors).
 * Times are medians of CUDA-event-timed repetitions after warm-up.
 * Usage: bench_ops [--quick] [--attention-only] (the last: only the two attention
 * benchmarks, e.g. under ncu). Prints "SKIP: ..." and exits 0 without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/rng.h"
#include "common/ops/ops.h"
#ifdef DL_CUDA
#include "common/ops/cuda/ops_cuda.h"
#endif

#ifndef DL_CUDA
int main(void) {
    printf("SKIP: bench_ops: built without CUDA\n");
    return 0;
}
#else
#include <cuda_runtime_api.h>

static ops_ctx_t C;
static cudaEvent_t ev0, ev1;

#define REPS_MAX 64
/* Median milliseconds of `reps` timed runs of STMT after `warm` untimed ones. */
#define TIME_MS(out_ms, warm, reps, STMT)                                   \
    do {                                                                    \
        float t_[REPS_MAX];                                                 \
        for (int w_ = 0; w_ < (warm); w_++) { STMT; }                       \
        for (int r_ = 0; r_ < (reps); r_++) {                               \
            cudaEventRecord(ev0, (cudaStream_t)C.stream);                   \
            STMT;                                                           \
            cudaEventRecord(ev1, (cudaStream_t)C.stream);                   \
            cudaEventSynchronize(ev1);                                      \
            cudaEventElapsedTime(&t_[r_], ev0, ev1);                        \
        }                                                                   \
        qsort(t_, (reps), sizeof(float), cmpf);                             \
        (out_ms) = t_[(reps) / 2];                                          \
    } while (0)

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}
static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Device act buffer of n uniform values in [-scale, scale) (fast LCG, not rng quality). */
static void *rand_act(size_t n, float scale, uint64_t seed) {
    const size_t chunk = 1u << 24;
    float *h = malloc(chunk * sizeof(float));
    void *d = C.impl->malloc_(&C, n * 2);
    if (!d || !h) { fprintf(stderr, "bench_ops: out of memory (%zu elements)\n", n); exit(1); }
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        for (size_t i = 0; i < m; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            h[i] = scale * ((float)(s >> 40) * (2.0f / 16777216.0f) - 1.0f);
        }
        C.impl->upload_act(&C, (char *)d + off * 2, h, m);
    }
    free(h);
    return d;
}
static void *dev_f32(size_t n, float val) {
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = val;
    void *d = C.impl->malloc_(&C, n * 4);
    C.impl->upload(&C, d, h, n * 4);
    free(h);
    return d;
}
static void *dev_raw(const void *h, size_t bytes) {
    void *d = C.impl->malloc_(&C, bytes);
    C.impl->upload(&C, d, h, bytes);
    return d;
}

static double peak_tflops = 0.0;

static void report(const char *what, float ms, double flops, double bytes) {
    printf("  %-58s %9.3f ms", what, ms);
    if (flops > 0) {
        double tf = flops / (ms * 1e-3) / 1e12;
        printf("  %7.1f TFLOP/s", tf);
        if (peak_tflops > 0) printf(" (%4.1f%% of measured peak)", 100.0 * tf / peak_tflops);
    }
    if (bytes > 0) printf("  %7.0f GB/s", bytes / (ms * 1e-3) / 1e9);
    printf("\n");
    fflush(stdout);
}

static void bench_gemm_peak(void) {
    const int n = 8192;
    void *a = rand_act((size_t)n * n, 1.0f, 1), *b = rand_act((size_t)n * n, 1.0f, 2);
    void *c = C.impl->malloc_(&C, (size_t)n * n * 2);
    float ms;
    TIME_MS(ms, 5, 20, C.impl->matmul_forward(&C, c, a, b, NULL, n, n, n));
    double fl = 2.0 * n * n * (double)n;
    peak_tflops = fl / (ms * 1e-3) / 1e12;
    printf("GEMM peak (bf16 in, f32 accumulate, cuBLASLt, 8192^3, random data): %.3f ms = %.1f "
           "TFLOP/s\n", ms, peak_tflops);
    C.impl->free_(&C, a); C.impl->free_(&C, b); C.impl->free_(&C, c);
}

static void bench_copy(void) {
    size_t bytes = (size_t)4 << 30;
    void *a = C.impl->malloc_(&C, bytes), *b = C.impl->malloc_(&C, bytes);
    C.impl->memset0(&C, a, bytes);
    float ms;
    TIME_MS(ms, 2, 10, C.impl->copy(&C, b, a, bytes));
    printf("device copy 4 GiB: %.3f ms = %.0f GB/s (read + write)\n", ms, 2.0 * bytes / (ms * 1e-3) / 1e9);
    C.impl->free_(&C, a); C.impl->free_(&C, b);
}

static void bench_linear(int M, int K, int N) {
    char name[128];
    void *x = rand_act((size_t)M * K, 1.0f, 3), *w = rand_act((size_t)N * K, 0.02f, 4);
    void *y = rand_act((size_t)M * N, 1.0f, 5), *dx = C.impl->malloc_(&C, (size_t)M * K * 2);
    float *dw = dev_f32((size_t)N * K, 0.0f);
    float ms;
    double fl = 2.0 * M * (double)K * N;
    TIME_MS(ms, 3, 10, C.impl->matmul_forward(&C, y, x, w, NULL, M, K, N));
    snprintf(name, sizeof name, "linear fwd        M=%d K=%d N=%d", M, K, N);
    report(name, ms, fl, 0);
    TIME_MS(ms, 3, 10, C.impl->matmul_backward(&C, dx, NULL, NULL, y, x, w, M, K, N, 0));
    snprintf(name, sizeof name, "linear bwd dinp   M=%d K=%d N=%d", M, K, N);
    report(name, ms, fl, 0);
    TIME_MS(ms, 3, 10, C.impl->matmul_backward(&C, NULL, dw, NULL, y, x, w, M, K, N, 0));
    snprintf(name, sizeof name, "linear bwd dW+=f32 M=%d K=%d N=%d", M, K, N);
    report(name, ms, fl, 0);
    C.impl->free_(&C, x); C.impl->free_(&C, w); C.impl->free_(&C, y); C.impl->free_(&C, dx);
    C.impl->free_(&C, dw);
}

static void bench_pointwise(void) {
    const int N = 65536, D = 4096, F = 12288;
    float ms;
    void *x = rand_act((size_t)N * D, 1.0f, 6), *w = rand_act(D, 1.0f, 7);
    void *y = C.impl->malloc_(&C, (size_t)N * D * 2), *dx = C.impl->malloc_(&C, (size_t)N * D * 2);
    float *rstd = dev_f32(N, 0.0f), *dw = dev_f32(D, 0.0f);
    TIME_MS(ms, 3, 10, C.impl->rmsnorm_forward(&C, y, rstd, x, w, 1e-6f, N, D));
    report("rmsnorm fwd (65536, 4096)", ms, 0, 2.0 * N * D * 2);
    TIME_MS(ms, 3, 10, C.impl->rmsnorm_backward(&C, dx, dw, y, x, w, rstd, N, D));
    report("rmsnorm bwd (65536, 4096) incl. dweight", ms, 0, 3.0 * N * D * 2);
    C.impl->free_(&C, x); C.impl->free_(&C, y); C.impl->free_(&C, dx);
    C.impl->free_(&C, w); C.impl->free_(&C, rstd); C.impl->free_(&C, dw);

    size_t n = (size_t)N * F;
    void *g = rand_act(n, 2.0f, 8), *u = rand_act(n, 1.0f, 9), *o = C.impl->malloc_(&C, n * 2);
    TIME_MS(ms, 3, 10, C.impl->swiglu_forward(&C, o, g, u, n));
    report("swiglu fwd (65536, 12288)", ms, 0, 3.0 * n * 2);
    TIME_MS(ms, 3, 10, C.impl->swiglu_backward(&C, g, u, o, g, u, n));  /* in place, as allowed */
    report("swiglu bwd (65536, 12288) in place", ms, 0, 5.0 * n * 2);
    TIME_MS(ms, 3, 10, C.impl->add(&C, o, o, g, n));
    report("add (65536*12288)", ms, 0, 3.0 * n * 2);
    C.impl->free_(&C, g); C.impl->free_(&C, u); C.impl->free_(&C, o);

    const int NX = 4096, V = 151936;
    void *lg = rand_act((size_t)NX * V, 4.0f, 10);
    int32_t *tg = malloc(NX * 4);
    for (int i = 0; i < NX; i++) tg[i] = (i * 7919) % V;
    int32_t *dtg = dev_raw(tg, NX * 4);
    float *wt = dev_f32(NX, 1.0f), *loss = dev_f32(NX, 0.0f), *cor = dev_f32(NX, 0.0f);
    TIME_MS(ms, 2, 10, C.impl->xent_forward_backward(&C, lg, loss, cor, dtg, wt, 1e-4f, NX, V));
    report("xent fwd+bwd chunk (4096, 151936)", ms, 0, 2.0 * NX * (double)V * 2);
    free(tg);
    C.impl->free_(&C, lg); C.impl->free_(&C, dtg); C.impl->free_(&C, wt);
    C.impl->free_(&C, loss); C.impl->free_(&C, cor);

    size_t np = (size_t)100 << 20;
    float *ms_ = dev_f32(np, 0.1f), *gr = dev_f32(np, 0.01f), *m = dev_f32(np, 0.0f);
    float *v = dev_f32(np, 0.0f), *ns = dev_f32(1, 0.0f);
    void *work = C.impl->malloc_(&C, np * 2);
    TIME_MS(ms, 2, 10, C.impl->sumsq(&C, ns, gr, np, 0));
    report("sumsq (100M f32)", ms, 0, 4.0 * np);
    TIME_MS(ms, 2, 10,
            C.impl->adamw(&C, ms_, work, gr, m, v, np, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.01f, 1, ns, 1.0f));
    report("adamw (100M params, bf16 work copy)", ms, 0, np * (4.0 * 4 + 3 * 4 + 2));
    /* the optimizer's step on one micro-batch (K = 1), per 100M parameters: the passes it
     * made until 2026-12-04 (gradient * 1/W into a sum buffer, its norm, AdamW, the copy to
     * the published weights) against the fused ones (norm of the scaled gradient, AdamW
     * writing the published weights): the same bits (gpu_test_ops_cuda test_adamw_pub) */
    float *gs = dev_f32(np, 0.0f), *pub = dev_f32(np, 0.0f);
    TIME_MS(ms, 2, 10,
            (C.impl->f32_add_scale(&C, gs, gr, NULL, 0.5f, np), C.impl->sumsq(&C, ns, gs, np, 0),
             C.impl->adamw(&C, ms_, NULL, gs, m, v, np, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.01f, 1, ns, 1.0f),
             C.impl->copy(&C, pub, ms_, np * 4)));
    report("optimizer step, 4 passes (100M)", ms, 0, np * 4.0 * (2 + 1 + 7 + 2));
    TIME_MS(ms, 2, 10,
            (C.impl->sumsq_scaled(&C, ns, gr, 0.5f, np),
             C.impl->adamw_pub(&C, ms_, pub, gr, 0.5f, m, v, np, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.01f, 1,
                               ns, 1.0f)));
    report("optimizer step, fused (100M)", ms, 0, np * 4.0 * (1 + 8));
    TIME_MS(ms, 2, 10, C.impl->f32_to_act(&C, work, pub, np));
    report("f32_to_act (100M, the drafter's new weights)", ms, 0, np * 6.0);
    C.impl->free_(&C, ms_); C.impl->free_(&C, gr); C.impl->free_(&C, m); C.impl->free_(&C, v);
    C.impl->free_(&C, ns); C.impl->free_(&C, work); C.impl->free_(&C, gs); C.impl->free_(&C, pub);
}

static void bench_attention_varlen(int quick) {
    const int H = 32, Hkv = 8, hd = 128;
    /* 65536 tokens in mixed lengths 128..4096 (fixed seed) */
    int32_t cu[1024];
    int nseq = 0, T = 0, maxl = 0;
    rng_t r;
    rng_seed(&r, 7);
    cu[0] = 0;
    while (T < 65536) {
        int L = 128 + (int)rng_below(&r, 4096 - 128 + 1);
        if (T + L > 65536) L = 65536 - T;
        T += L;
        cu[++nseq] = T;
        if (L > maxl) maxl = L;
    }
    double pairs = 0;
    for (int s = 0; s < nseq; s++) {
        double L = cu[s + 1] - cu[s];
        pairs += L * (L + 1) / 2;
    }
    void *q = rand_act((size_t)T * H * hd, 1.0f, 11), *k = rand_act((size_t)T * Hkv * hd, 1.0f, 12);
    void *v = rand_act((size_t)T * Hkv * hd, 1.0f, 13), *o = C.impl->malloc_(&C, (size_t)T * H * hd * 2);
    int32_t *dcu = dev_raw(cu, (size_t)(nseq + 1) * 4);
    float ms;
    char name[128];
    for (int variant = 1; variant <= OPS_CUDA_ATTN_VARLEN_VARIANTS; variant++) {
        if (ops_cuda_attention_varlen_resolve(variant, hd) != variant) continue;  /* runs another */
        TIME_MS(ms, 2, quick ? 3 : 10,
                ops_cuda_attention_varlen_forward_variant(&C, variant, o, q, k, v, dcu, nseq, maxl,
                                                          T, H, Hkv, hd));
        snprintf(name, sizeof name, "attention varlen kernel v%d T=%d (%d seqs 128..4096)", variant,
                 T, nseq);
        report(name, ms, 4.0 * hd * H * pairs, 0);
    }
    TIME_MS(ms, 2, quick ? 3 : 10,
            C.impl->attention_varlen_forward(&C, o, q, k, v, dcu, nseq, maxl, T, H, Hkv, hd));
    snprintf(name, sizeof name, "attention varlen causal fwd T=%d (%d seqs 128..4096) H=32/8", T, nseq);
    report(name, ms, 4.0 * hd * H * pairs, 0);
    /* 8 x 4096 (the HF baseline batch of issue 3) */
    int32_t cu8[9];
    for (int s = 0; s <= 8; s++) cu8[s] = s * 4096;
    int32_t *dcu8 = dev_raw(cu8, sizeof cu8);
    for (int variant = 1; variant <= OPS_CUDA_ATTN_VARLEN_VARIANTS; variant++) {
        if (ops_cuda_attention_varlen_resolve(variant, hd) != variant) continue;
        TIME_MS(ms, 2, quick ? 3 : 10,
                ops_cuda_attention_varlen_forward_variant(&C, variant, o, q, k, v, dcu8, 8, 4096,
                                                          T, H, Hkv, hd));
        snprintf(name, sizeof name, "attention varlen kernel v%d T=65536 (8 x 4096)", variant);
        report(name, ms, 4.0 * hd * H * 8 * (4096.0 * 4097 / 2), 0);
    }
    TIME_MS(ms, 2, quick ? 3 : 10,
            C.impl->attention_varlen_forward(&C, o, q, k, v, dcu8, 8, 4096, T, H, Hkv, hd));
    report("attention varlen causal fwd T=65536 (8 x 4096) H=32/8", ms,
           4.0 * hd * H * 8 * (4096.0 * 4097 / 2), 0);
    C.impl->free_(&C, q); C.impl->free_(&C, k); C.impl->free_(&C, v); C.impl->free_(&C, o);
    C.impl->free_(&C, dcu); C.impl->free_(&C, dcu8);
}

static void bench_attention_block(int quick) {
    const int H = 32, Hkv = 8, hd = 128, B = 16, nseq = 8, L = 4096, per = 512;
    const int Nb = nseq * per, Tc = nseq * L;
    int32_t *cs = malloc(Nb * 4), *cl = malloc(Nb * 4);
    rng_t r;
    rng_seed(&r, 9);
    double keys = 0;
    for (int s = 0; s < nseq; s++) {
        for (int a = 0; a < per; a++) {  /* anchors spread over [1, L - B] */
            int anchor = 1 + (int)rng_below(&r, L - B);
            cs[s * per + a] = s * L;
            cl[s * per + a] = anchor;  /* context strictly before the anchor */
            keys += anchor + B;
        }
        qsort(cl + s * per, per, sizeof *cl, cmp_i32);  /* sorted per sequence, as the drafter */
    }
    size_t nq = (size_t)Nb * B * H * hd, nkb = (size_t)Nb * B * Hkv * hd, nkc = (size_t)Tc * Hkv * hd;
    void *q = rand_act(nq, 1.0f, 14), *kb = rand_act(nkb, 1.0f, 15), *vb = rand_act(nkb, 1.0f, 16);
    void *kc = rand_act(nkc, 1.0f, 17), *vc = rand_act(nkc, 1.0f, 18), *dout = rand_act(nq, 1.0f, 19);
    void *o = C.impl->malloc_(&C, nq * 2), *dq = C.impl->malloc_(&C, nq * 2);
    void *dkb = C.impl->malloc_(&C, nkb * 2), *dvb = C.impl->malloc_(&C, nkb * 2);
    void *dkc = C.impl->malloc_(&C, nkc * 2), *dvc = C.impl->malloc_(&C, nkc * 2);
    float *lse = dev_f32((size_t)Nb * B * H, 0.0f);
    int32_t *dcs = dev_raw(cs, Nb * 4), *dcl = dev_raw(cl, Nb * 4);
    double fwd_fl = 4.0 * hd * H * B * keys;
    float ms;
    char name[160];
    for (int variant = 1; variant <= OPS_CUDA_ATTN_BLOCK_VARIANTS; variant++) {
        ops_cuda_attention_block_variant(variant);
        TIME_MS(ms, 2, quick ? 3 : 10,
                C.impl->attention_block_forward(&C, o, lse, q, kb, vb, kc, vc, dcs, dcl, Nb, B, Tc,
                                                H, Hkv, hd));
        snprintf(name, sizeof name, "block attention v%d fwd", variant);
        report(name, ms, fwd_fl, 0);
        TIME_MS(ms, 1, 3,
                C.impl->attention_block_backward(&C, dq, NULL, NULL, NULL, NULL, dout, o, lse, q,
                                                 kb, vb, kc, vc, dcs, dcl, Nb, B, Tc, H, Hkv, hd));
        snprintf(name, sizeof name, "block attention v%d dQ pass (1.5 x fwd FLOPs)", variant);
        report(name, ms, 1.5 * fwd_fl, 0);
        TIME_MS(ms, 1, 3,
                C.impl->attention_block_backward(&C, NULL, dkb, dvb, dkc, dvc, dout, o, lse, q, kb,
                                                 vb, kc, vc, dcs, dcl, Nb, B, Tc, H, Hkv, hd));
        snprintf(name, sizeof name, "block attention v%d dK/dV pass (2 x fwd FLOPs)", variant);
        report(name, ms, 2.0 * fwd_fl, 0);
    }
    ops_cuda_attention_block_variant(0);
    printf("block attention: the default (v%d) below\n", ops_cuda_attention_block_variant(-1));
    TIME_MS(ms, 2, quick ? 3 : 10,
            C.impl->attention_block_forward(&C, o, lse, q, kb, vb, kc, vc, dcs, dcl, Nb, B, Tc, H,
                                            Hkv, hd));
    report("block attention fwd Nb*B=65536 B=16 ctx 8x4096, 512 anchors", ms, fwd_fl, 0);
    TIME_MS(ms, 1, quick ? 3 : 5,
            C.impl->attention_block_backward(&C, dq, dkb, dvb, dkc, dvc, dout, o, lse, q, kb, vb,
                                             kc, vc, dcs, dcl, Nb, B, Tc, H, Hkv, hd));
    report("block attention bwd (useful FLOPs = 2.5 x fwd)", ms, 2.5 * fwd_fl, 0);
    TIME_MS(ms, 1, 3,
            C.impl->attention_block_backward(&C, dq, NULL, NULL, NULL, NULL, dout, o, lse, q, kb, vb,
                                             kc, vc, dcs, dcl, Nb, B, Tc, H, Hkv, hd));
    report("  of which dQ pass (recomputes S, dP: 1.5 x fwd FLOPs)", ms, 1.5 * fwd_fl, 0);
    TIME_MS(ms, 1, 3,
            C.impl->attention_block_backward(&C, NULL, dkb, dvb, dkc, dvc, dout, o, lse, q, kb, vb,
                                             kc, vc, dcs, dcl, Nb, B, Tc, H, Hkv, hd));
    report("  of which dK/dV pass (2 x fwd FLOPs)", ms, 2.0 * fwd_fl, 0);
    free(cs); free(cl);
    void *bufs[] = {q, kb, vb, kc, vc, dout, o, dq, dkb, dvb, dkc, dvc, lse, dcs, dcl};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) C.impl->free_(&C, bufs[i]);
}

/* Per-head q/k norm + RoPE at the drafter's shapes (N = 65536 rows, hd 128; nh 32: q,
 * nh 8: block keys), fused (one kernel each way) against the unfused pair
 * rmsnorm + rope. GB/s counts the bf16 tensor bytes the op must move once (fwd: read
 * inp, write out; bwd: read dout and inp, write dinp), whatever the passes. */
static void bench_qk_norm_rope(int quick) {
    const int N = 65536, hd = 128, nhs[2] = {32, 8};
    const int reps = quick ? 3 : 10;
    rope_params_t rp = {.theta = 1e6};
    float inv[64];
    ops_rope_inv_freq(&rp, hd, inv);
    int32_t *pos = malloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) pos[i] = (i / 16) * 7 % 4096 + i % 16; /* DFlash-like rows */
    int32_t *dpos = dev_raw(pos, (size_t)N * 4);
    float *dinv = dev_raw(inv, sizeof inv);
    for (int k = 0; k < 2; k++) {
        const int nh = nhs[k];
        const size_t rows = (size_t)N * nh, n = rows * hd;
        char name[128];
        float ms;
        void *x = rand_act(n, 2.0f, 11), *w = rand_act(hd, 1.0f, 12), *dy = rand_act(n, 1.0f, 13);
        void *y = C.impl->malloc_(&C, n * 2), *dx = C.impl->malloc_(&C, n * 2);
        void *t = C.impl->malloc_(&C, n * 2);
        float *rstd = dev_f32(rows, 0.0f), *dw = dev_f32(hd, 0.0f);
        TIME_MS(ms, 3, reps,
                C.impl->qk_norm_rope_forward(&C, y, rstd, x, w, 1e-6f, dpos, dinv, N, nh, hd));
        snprintf(name, sizeof name, "qk norm+rope fwd fused   (%d, %d, %d)", N, nh, hd);
        report(name, ms, 0, 2.0 * n * 2);
        TIME_MS(ms, 3, reps, {
            C.impl->rmsnorm_forward(&C, y, rstd, x, w, 1e-6f, (int)rows, hd);
            C.impl->rope_forward(&C, y, dpos, dinv, N, nh, hd);
        });
        snprintf(name, sizeof name, "qk norm+rope fwd unfused (%d, %d, %d)", N, nh, hd);
        report(name, ms, 0, 2.0 * n * 2);
        TIME_MS(ms, 3, reps,
                C.impl->qk_norm_rope_backward(&C, dx, dw, dy, x, w, rstd, dpos, dinv, 1e-6f, N, nh,
                                              hd));
        snprintf(name, sizeof name, "qk norm+rope bwd fused   (%d, %d, %d) incl. dweight", N, nh,
                 hd);
        report(name, ms, 0, 3.0 * n * 2);
        /* unfused: rope_backward in place on t (as the drafter did on dout); t starts as a
         * copy of dout, and rotating it again each repetition moves the same bytes */
        C.impl->copy(&C, t, dy, n * 2);
        TIME_MS(ms, 3, reps, {
            C.impl->rope_backward(&C, t, dpos, dinv, N, nh, hd);
            C.impl->rmsnorm_backward(&C, dx, dw, t, x, w, rstd, (int)rows, hd);
        });
        snprintf(name, sizeof name, "qk norm+rope bwd unfused (%d, %d, %d) incl. dweight", N, nh,
                 hd);
        report(name, ms, 0, 3.0 * n * 2);
        void *bufs[] = {x, w, dy, y, dx, t, rstd, dw};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) C.impl->free_(&C, bufs[i]);
    }
    free(pos);
    C.impl->free_(&C, dpos);
    C.impl->free_(&C, dinv);
}

int main(int argc, char **argv) {
    int quick = 0, attention_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--attention-only") == 0) {
            attention_only = 1;
        } else {
            fprintf(stderr, "bench_ops: unknown argument '%s' (usage: bench_ops [--quick] "
                    "[--attention-only])\n", argv[i]);
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: bench_ops: no CUDA device\n");
        return 0;
    }
    if (ops_cuda_init(&C, 0) != 0) {
        printf("SKIP: bench_ops: ops_cuda_init failed\n");
        return 0;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
           prop.totalGlobalMem / 1073741824.0);
    cudaEventCreate(&ev0);
    cudaEventCreate(&ev1);
    if (!attention_only) {
        bench_gemm_peak();
        bench_copy();
    }
    printf("per-op timings (Qwen3-8B shapes):\n");
    if (!attention_only) {
        bench_linear(65536, 4096, 4096);
        bench_linear(65536, 4096, 12288);
        bench_linear(65536, 12288, 4096);
        bench_pointwise();
    }
    bench_attention_varlen(quick);
    bench_attention_block(quick);
    if (!attention_only) bench_qk_norm_rope(quick);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_ops: CUDA error: %s\n", cudaGetErrorString(e));
        return 1;
    }
    ops_ctx_destroy(&C);
    return 0;
}
#endif
