/* GPU benchmark of DFlash drafter training (common/model/drafter.c on CUDA).
 *
 * Usage: bench_drafter [--model DIR] [--seqs 8] [--seqlen 4096] [--anchors 512]
 *                      [--layers 5] [--reps 5] [--loss-chunk BLOCKS (default: the drafter's, 64)]
 *                      [--profile] [--attn-variant N] [--keep-up] [--gemm-picks 0|1]
 *   The drafter's shapes come from the target's config.json (--model, e.g. a dir made
 *   by `draftline mkmodel --config qwen3-8b`), or the qwen3-8b preset without it
 *   (D 4096, H 32/8, hd 128, F 12288, V 151,936, 36 target layers).
 *
 * One training step = drafter_zero_grad + drafter_forward_backward (forward, chunked
 * loss over the frozen LM head, backward) + global grad norm (sumsq) + AdamW over the
 * flat parameter vector + (AdamW writes the bf16 working weights). Batch: --seqs
 * sequences x --seqlen target tokens (random ids, loss mask all 1), random target
 * features (T, 5*D), --anchors anchors per sequence (drafter_sample_anchors), B 16:
 * 8 x 4096 x 512 -> 65,536 block tokens. The embedding and LM head (V, D) bf16 are
 * random and separate (Qwen3-8B is untied), as a target in the same process would
 * lend them.
 * FLOPs: drafter_step_flops (useful only: block tokens, injected context K/V, fc, LM
 * head; 3x forward for trained matmuls, 2x for fc and the LM head; attention over
 * the visible keys exactly; no recomputation). MFU against the bf16 GEMM peak
 * measured in the same run. Memory: device memory in use after the steps
 * (cudaMemGetInfo; every buffer is allocated up front, so this is the peak; it
 * includes the CUDA context, cuBLASLt workspace, embedding and LM head, features,
 * AdamW moments). Time: median of --reps CUDA-event-timed steps after one warm-up.
 * --attn-variant N: the block-attention kernels (ops_cuda_attention_block_variant: 1 =
 *   mma.sync, 2 = Hopper wgmma, 3 = 2 with the FA3-style forward, 4 = 3 with Q and dO in
 *   registers in dQ; 0 or absent: the default).
 * --gemm-picks 0|1: cuBLASLt's per-shape picks (ops_cuda_gemm_picks; 1, the default) or
 *   always the heuristic's first choice (0).
 * --keep-up: the drafter keeps each layer's MLP up projection for the backward
 *   (drafter_new_opts keep_up, as the drafter worker runs it) instead of recomputing it.
 * --profile: then one more step with each op timed by CUDA events, printed as a table
 * (op class, calls, ms, % of the step, TFLOP/s of GEMMs and attention). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/model/config.h"
#include "common/model/drafter.h"
#include "common/model/mkmodel.h"
#include "common/ops/ops.h"
#include "common/ops/cuda/ops_cuda.h"

#ifndef DL_CUDA
int main(void) {
    printf("SKIP: bench_drafter: built without CUDA\n");
    return 0;
}
#else
#include <cuda_runtime_api.h>

static ops_ctx_t C;

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void *rand_act(size_t n, float scale, uint64_t seed) {
    const size_t chunk = 1u << 24;
    float *h = malloc(chunk * sizeof(float));
    void *d = C.impl->malloc_(&C, n * 2);
    if (!d || !h) { fprintf(stderr, "bench_drafter: out of memory (%zu elements)\n", n); exit(1); }
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

static double gemm_peak(void) {
    const int n = 8192;
    void *a = rand_act((size_t)n * n, 1.0f, 1), *b = rand_act((size_t)n * n, 1.0f, 2);
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

/* ---- --profile: one more step with every op timed by CUDA events.
 * The ops table is copied and its compute entries wrapped: each call records an event
 * before and after itself on the ops stream, keyed by a label (op, and for GEMMs K x N and
 * which gradients: one row per call site class of the drafter). Events between the ops
 * serialize nothing that the stream did not already order; they add ~2 us per op. Useful
 * FLOPs: 2MKN per GEMM (per output of a backward), attention as drafter_step_flops counts
 * it. Prints a table sorted by time; the sum is the step's op time (launch gaps excluded). */
#define PROF_MAX 16384
typedef struct { char label[64]; double ms, tflop; int calls; } prof_row_t;
static ops_impl_t prof_impl;
static const ops_impl_t *prof_inner;
/* the wrapped calls go to the inner table with a ctx that still holds it: the CUDA backend
 * finds its state through ctx->impl (cuda_state) */
static ops_ctx_t prof_ctx;
static cudaEvent_t prof_e0[PROF_MAX], prof_e1[PROF_MAX];
static char prof_label[PROF_MAX][64];
static double prof_flops[PROF_MAX];
static int prof_n;
static double prof_attn_sum_ctx; /* sum over blocks of ctx_len, for attention FLOPs */

static void prof_begin(const char *label, double flops) {
    if (prof_n >= PROF_MAX) return;
    snprintf(prof_label[prof_n], sizeof prof_label[0], "%s", label);
    prof_flops[prof_n] = flops;
    cudaEventRecord(prof_e0[prof_n], (cudaStream_t)C.stream);
}
static void prof_end(void) {
    if (prof_n >= PROF_MAX) return;
    cudaEventRecord(prof_e1[prof_n], (cudaStream_t)C.stream);
    prof_n++;
}
#define PROF_WRAP(label, flops, call) do { prof_begin(label, flops); call; prof_end(); } while (0)

static void p_memset0(const ops_ctx_t *c, void *p, size_t n) {
    PROF_WRAP("memset0", 0, prof_inner->memset0(&prof_ctx, p, n));
}
static void p_upload(const ops_ctx_t *c, void *d, const void *s, size_t n) {
    PROF_WRAP("upload (batch indices)", 0, prof_inner->upload(&prof_ctx, d, s, n));
}
static void p_mm_fwd(const ops_ctx_t *c, void *o, const void *i, const void *w, const void *b, int M,
                     int K, int N) {
    char l[64];
    snprintf(l, sizeof l, "gemm fwd K=%d N=%d", K, N);
    PROF_WRAP(l, 2.0 * M * K * N, prof_inner->matmul_forward(&prof_ctx, o, i, w, b, M, K, N));
}
static void p_mm_fwd_res(const ops_ctx_t *c, void *o, const void *i, const void *w, const void *b,
                         const void *r, int M, int K, int N) {
    char l[64];
    snprintf(l, sizeof l, "gemm fwd+res K=%d N=%d", K, N);
    PROF_WRAP(l, 2.0 * M * K * N,
              prof_inner->matmul_forward_res(&prof_ctx, o, i, w, b, r, M, K, N));
}
static void p_mm_bwd(const ops_ctx_t *c, void *di, float *dw, float *db, const void *dout,
                     const void *inp, const void *w, int M, int K, int N, int acc) {
    char l[64];
    snprintf(l, sizeof l, "gemm bwd%s%s K=%d N=%d", di ? (acc ? " dinp+=" : " dinp") : "",
             dw ? " dW" : "", K, N);
    PROF_WRAP(l, 2.0 * M * K * N * ((di != NULL) + (dw != NULL)),
              prof_inner->matmul_backward(&prof_ctx, di, dw, db, dout, inp, w, M, K, N, acc));
}
static void p_rms_fwd(const ops_ctx_t *c, void *o, float *r, const void *i, const void *w, float e,
                      int N, int C_) {
    PROF_WRAP(C_ < 1024 ? "rmsnorm fwd (q/k heads)" : "rmsnorm fwd", 0,
              prof_inner->rmsnorm_forward(&prof_ctx, o, r, i, w, e, N, C_));
}
static void p_rms_bwd(const ops_ctx_t *c, void *di, float *dw, const void *d, const void *i,
                      const void *w, const float *r, int N, int C_) {
    PROF_WRAP(C_ < 1024 ? "rmsnorm bwd (q/k heads)" : "rmsnorm bwd", 0,
              prof_inner->rmsnorm_backward(&prof_ctx, di, dw, d, i, w, r, N, C_));
}
static void p_rope_fwd(const ops_ctx_t *c, void *x, const int32_t *p, const float *f, int N, int nh,
                       int hd) {
    PROF_WRAP("rope fwd", 0, prof_inner->rope_forward(&prof_ctx, x, p, f, N, nh, hd));
}
static void p_rope_bwd(const ops_ctx_t *c, void *x, const int32_t *p, const float *f, int N, int nh,
                       int hd) {
    PROF_WRAP("rope bwd", 0, prof_inner->rope_backward(&prof_ctx, x, p, f, N, nh, hd));
}
static void p_qkr_fwd(const ops_ctx_t *c, void *o, float *r, const void *i, const void *w, float e,
                      const int32_t *p, const float *f, int N, int nh, int hd) {
    PROF_WRAP("q/k norm+rope fwd", 0,
              prof_inner->qk_norm_rope_forward(&prof_ctx, o, r, i, w, e, p, f, N, nh, hd));
}
static void p_qkr_bwd(const ops_ctx_t *c, void *di, float *dw, const void *d, const void *i,
                      const void *w, const float *r, const int32_t *p, const float *f, float e,
                      int N, int nh, int hd) {
    PROF_WRAP("q/k norm+rope bwd", 0,
              prof_inner->qk_norm_rope_backward(&prof_ctx, di, dw, d, i, w, r, p, f, e, N, nh, hd));
}
static void p_swi_fwd(const ops_ctx_t *c, void *o, const void *g, const void *u, size_t n) {
    PROF_WRAP("swiglu fwd", 0, prof_inner->swiglu_forward(&prof_ctx, o, g, u, n));
}
static void p_swi_bwd(const ops_ctx_t *c, void *dg, void *du, const void *d, const void *g,
                      const void *u, size_t n) {
    PROF_WRAP("swiglu bwd", 0, prof_inner->swiglu_backward(&prof_ctx, dg, du, d, g, u, n));
}
static void p_emb(const ops_ctx_t *c, void *o, const int32_t *ids, const void *t, int T, int C_) {
    PROF_WRAP("embedding", 0, prof_inner->embedding_forward(&prof_ctx, o, ids, t, T, C_));
}
static void p_add(const ops_ctx_t *c, void *o, const void *a, const void *b, size_t n) {
    PROF_WRAP("add", 0, prof_inner->add(&prof_ctx, o, a, b, n));
}
static void p_attn_fwd(const ops_ctx_t *c, void *o, float *lse, const void *q, const void *kb,
                       const void *vb, const void *kc, const void *vc, const int32_t *cs,
                       const int32_t *cl, int Nb, int B, int Tc, int H, int Hkv, int hd) {
    double fl = 4.0 * hd * H * B * (prof_attn_sum_ctx + (double)Nb * B);
    PROF_WRAP("block attention fwd", fl,
              prof_inner->attention_block_forward(&prof_ctx, o, lse, q, kb, vb, kc, vc, cs, cl, Nb, B, Tc,
                                                  H, Hkv, hd));
}
static void p_attn_bwd(const ops_ctx_t *c, void *dq, void *dkb, void *dvb, void *dkc, void *dvc,
                       const void *dout, const void *out, const float *lse, const void *q,
                       const void *kb, const void *vb, const void *kc, const void *vc,
                       const int32_t *cs, const int32_t *cl, int Nb, int B, int Tc, int H, int Hkv,
                       int hd) {
    double fl = 2.5 * 4.0 * hd * H * B * (prof_attn_sum_ctx + (double)Nb * B);
    PROF_WRAP("block attention bwd", fl,
              prof_inner->attention_block_backward(&prof_ctx, dq, dkb, dvb, dkc, dvc, dout, out, lse, q,
                                                   kb, vb, kc, vc, cs, cl, Nb, B, Tc, H, Hkv, hd));
}
static void p_xent(const ops_ctx_t *c, void *lg, float *loss, float *corr, const int32_t *t,
                   const float *w, float gs, int N, int V) {
    PROF_WRAP("xent fwd+bwd", 0, prof_inner->xent_forward_backward(&prof_ctx, lg, loss, corr, t, w, gs, N, V));
}
static void p_copy2d(const ops_ctx_t *c, void *d, size_t dp, const void *s, size_t sp, size_t w,
                     size_t rows) {
    PROF_WRAP("copy2d (loss rows)", 0, prof_inner->copy2d(&prof_ctx, d, dp, s, sp, w, rows));
}
static void p_sumsq(const ops_ctx_t *c, float *o, const float *x, size_t n, int acc) {
    PROF_WRAP("grad norm (sumsq)", 0, prof_inner->sumsq(&prof_ctx, o, x, n, acc));
}
static void p_adamw(const ops_ctx_t *c, float *ms, void *wk, const float *g, float *m, float *v,
                    size_t n, float lr, float b1, float b2, float eps, float wd, int t,
                    const float *nsq, float mx) {
    PROF_WRAP("adamw", 0, prof_inner->adamw(&prof_ctx, ms, wk, g, m, v, n, lr, b1, b2, eps, wd, t, nsq, mx));
}

/* Installs the wrapped table in C (the drafter holds &C, so its next calls go through it).
 * Every entry the drafter calls that launches work must be wrapped: an unwrapped CUDA entry
 * would get &C, whose impl is then this table, and find no CUDA state through it. */
static void prof_install(double sum_ctx) {
    prof_inner = C.impl;
    prof_ctx = C;
    prof_impl = *C.impl;
    prof_impl.memset0 = p_memset0, prof_impl.upload = p_upload;
    prof_impl.matmul_forward = p_mm_fwd, prof_impl.matmul_backward = p_mm_bwd;
    prof_impl.matmul_forward_res = p_mm_fwd_res;
    prof_impl.rmsnorm_forward = p_rms_fwd, prof_impl.rmsnorm_backward = p_rms_bwd;
    prof_impl.rope_forward = p_rope_fwd, prof_impl.rope_backward = p_rope_bwd;
    prof_impl.qk_norm_rope_forward = p_qkr_fwd, prof_impl.qk_norm_rope_backward = p_qkr_bwd;
    prof_impl.swiglu_forward = p_swi_fwd, prof_impl.swiglu_backward = p_swi_bwd;
    prof_impl.embedding_forward = p_emb, prof_impl.add = p_add;
    prof_impl.attention_block_forward = p_attn_fwd, prof_impl.attention_block_backward = p_attn_bwd;
    prof_impl.xent_forward_backward = p_xent, prof_impl.sumsq = p_sumsq, prof_impl.adamw = p_adamw;
    prof_impl.copy2d = p_copy2d;
    for (int i = 0; i < PROF_MAX; i++) cudaEventCreate(&prof_e0[i]), cudaEventCreate(&prof_e1[i]);
    prof_attn_sum_ctx = sum_ctx;
    prof_n = 0;
    C.impl = &prof_impl;
}

static int prof_cmp(const void *a, const void *b) {
    double x = ((const prof_row_t *)a)->ms, y = ((const prof_row_t *)b)->ms;
    return (x < y) - (x > y);
}

/* Prints the table of the events recorded since prof_install (step_ms: the step's
 * event-timed length, for the % column and the gaps line) and restores C's table. */
static void prof_report(double step_ms) {
    cudaStreamSynchronize((cudaStream_t)C.stream);
    prof_row_t *rows = calloc(PROF_MAX, sizeof *rows);
    int nr = 0;
    double sum = 0;
    for (int i = 0; i < prof_n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, prof_e0[i], prof_e1[i]);
        int r = 0;
        while (r < nr && strcmp(rows[r].label, prof_label[i])) r++;
        if (r == nr) snprintf(rows[nr++].label, sizeof rows[0].label, "%s", prof_label[i]);
        rows[r].ms += ms, rows[r].tflop += prof_flops[i] / 1e12, rows[r].calls++;
        sum += ms;
    }
    qsort(rows, (size_t)nr, sizeof *rows, prof_cmp);
    printf("profile of one step (%d ops%s): op time %.1f ms of the step's %.1f ms\n", prof_n,
           prof_n >= PROF_MAX ? ", TRUNCATED" : "", sum, step_ms);
    printf("| op | calls | ms | %% of step | TFLOP | TFLOP/s |\n| --- | --- | --- | --- | --- | --- |\n");
    for (int r = 0; r < nr; r++) {
        printf("| %s | %d | %.2f | %.1f%% |", rows[r].label, rows[r].calls, rows[r].ms,
               100 * rows[r].ms / step_ms);
        if (rows[r].tflop > 0)
            printf(" %.2f | %.0f |\n", rows[r].tflop, rows[r].tflop / (rows[r].ms * 1e-3));
        else
            printf(" | |\n");
    }
    printf("| (gaps between ops) | | %.2f | %.1f%% | | |\n", step_ms - sum, 100 * (step_ms - sum) / step_ms);
    free(rows);
    C.impl = prof_inner;
}

/* The integer value v of flag, in [lo, hi]; exits 2 naming both otherwise. */
static int arg_int(const char *flag, const char *v, int lo, int hi) {
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        fprintf(stderr, "bench_drafter: %s '%s': expected an integer in [%d, %d]\n", flag, v, lo, hi);
        exit(2);
    }
    return (int)x;
}

/* The kernel choices among the arguments: --attn-variant N (into *variant) and
 * --gemm-picks 0|1 (ops_cuda_gemm_picks). 1 when argv[*i] was one of them (*i past its value). */
static int kernel_arg(int argc, char **argv, int *i, int *variant) {
    if (*i + 1 >= argc) return 0;
    if (!strcmp(argv[*i], "--attn-variant"))
        *variant = arg_int("--attn-variant", argv[++*i], 0, OPS_CUDA_ATTN_BLOCK_VARIANTS);
    else if (!strcmp(argv[*i], "--gemm-picks"))
        ops_cuda_gemm_picks(arg_int("--gemm-picks", argv[++*i], 0, 1));
    else
        return 0;
    return 1;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines survive an abort (output to a file) */
    const char *model = NULL;
    int nseq = 8, seqlen = 4096, nanch = 512, layers = 5, reps = 5, chunk = 0, profile = 0,
        variant = 0, keep_up = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--seqs") && i + 1 < argc) nseq = arg_int("--seqs", argv[++i], 1, 4096);
        else if (!strcmp(argv[i], "--seqlen") && i + 1 < argc) seqlen = arg_int("--seqlen", argv[++i], 1, 1048576);
        else if (!strcmp(argv[i], "--anchors") && i + 1 < argc) nanch = arg_int("--anchors", argv[++i], 1, 65536);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = arg_int("--layers", argv[++i], 1, 64);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = arg_int("--reps", argv[++i], 1, 50);
        else if (!strcmp(argv[i], "--loss-chunk") && i + 1 < argc) chunk = arg_int("--loss-chunk", argv[++i], 1, 65536);
        else if (!strcmp(argv[i], "--quick")) reps = 2;
        else if (!strcmp(argv[i], "--profile")) profile = 1;
        else if (!strcmp(argv[i], "--keep-up")) keep_up = 1;
        else if (!kernel_arg(argc, argv, &i, &variant)) {
            fprintf(stderr, "bench_drafter: unknown argument '%s' (see the header of bench/bench_drafter.c)\n", argv[i]);
            return 2;
        }
    }
    ops_cuda_attention_block_variant(variant);
    printf("block attention kernels: variant %d; GEMM picks %s\n",
           ops_cuda_attention_block_variant(-1), ops_cuda_gemm_picks(-1) ? "on" : "off");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: bench_drafter: no CUDA device\n");
        return 0;
    }
    size_t fr0, tot;
    if (ops_cuda_init(&C, 0) != 0) {
        printf("SKIP: bench_drafter: ops_cuda_init: %s\n", dl_errmsg());
        return 0;
    }
    cudaMemGetInfo(&fr0, &tot);
    double peak = gemm_peak();
    model_config_t tc;
    if (model ? model_config_from_hf_dir(model, &tc) : mkmodel_preset("qwen3-8b", &tc)) {
        fprintf(stderr, "bench_drafter: %s\n", dl_errmsg());
        return 1;
    }
    drafter_config_t cfg;
    drafter_config_defaults(&cfg);
    drafter_config_from_target(&cfg, &tc);
    cfg.n_layers = layers;
    if (chunk > 0) cfg.loss_chunk_blocks = chunk;
    cfg.mask_token_id = tc.V > DRAFTER_MASK_TOKEN_QWEN3 ? DRAFTER_MASK_TOKEN_QWEN3 : tc.V - 1;
    if (drafter_config_finish(&cfg)) { fprintf(stderr, "bench_drafter: %s\n", dl_errmsg()); return 1; }
    int T = nseq * seqlen, maxb = nseq * nanch;
    printf("drafter: %d layers, D %d, H %d/%d, hd %d, F %d, V %d, B %d, loss chunk %d blocks, "
           "features of target layers [", cfg.n_layers, cfg.D, cfg.H, cfg.Hkv, cfg.hd, cfg.F, cfg.V,
           cfg.B, cfg.loss_chunk_blocks);
    for (int i = 0; i < cfg.n_feat; i++) printf("%s%d", i ? ", " : "", cfg.target_layer_ids[i]);
    printf("]\nbatch: %d x %d target tokens, %d anchors each\n", nseq, seqlen, nanch);

    void *embed = rand_act((size_t)cfg.V * cfg.D, 0.05f, 3), *lm = rand_act((size_t)cfg.V * cfg.D, 0.02f, 4);
    void *feat = rand_act((size_t)T * cfg.n_feat * cfg.D, 1.0f, 5);
    drafter_t *d = NULL;
    drafter_new_opts_t dopts = {.keep_up = keep_up};
    if (drafter_new_opts(&C, &cfg, embed, lm, T, maxb, 1, &dopts, &d)) return fprintf(stderr, "bench_drafter: %s\n", dl_errmsg()), 1;
    size_t np = drafter_n_params(d);
    float *m1 = C.impl->malloc_(&C, np * 4), *m2 = C.impl->malloc_(&C, np * 4), *nsq = C.impl->malloc_(&C, 4);
    if (!m1 || !m2 || !nsq) { fprintf(stderr, "bench_drafter: out of memory (AdamW moments)\n"); return 1; }
    C.impl->memset0(&C, m1, np * 4);
    C.impl->memset0(&C, m2, np * 4);
    int32_t *cu = malloc(((size_t)nseq + 1) * 4), *ids = malloc((size_t)T * 4), *anch = malloc((size_t)maxb * 4);
    uint8_t *mask = malloc((size_t)T);
    rng_t r;
    rng_seed(&r, 20261130);
    cu[0] = 0;
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + seqlen;
    for (int i = 0; i < T; i++) ids[i] = (int32_t)rng_below(&r, (uint64_t)cfg.V), mask[i] = 1;
    int nb = drafter_sample_anchors(cu, nseq, mask, cfg.B, nanch, &r, anch, maxb);
    if (nb < 1) { fprintf(stderr, "bench_drafter: anchors: %s\n", dl_errmsg()); return 1; }
    double sum_ctx = 0;
    for (int j = 0; j < nb; j++) sum_ctx += anch[j] - cu[anch[j] / seqlen];
    double fl = drafter_step_flops(&cfg, T, nb, sum_ctx);
    printf("params %.3f B trainable; %d blocks = %d block tokens; useful FLOPs per step %.1f TFLOP\n",
           np / 1e9, nb, nb * cfg.B, fl / 1e12);
    drafter_batch_t b = {.T = T, .nseq = nseq, .cu_seqlens = cu, .ids = ids, .loss_mask = mask,
                         .features = feat, .n_blocks = nb, .anchors = anch};
    cudaEvent_t e0, e1, e2;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventCreate(&e2);
    float ts[64], tf_[64];
    drafter_stats_t st;
    for (int i = -1; i < reps; i++) {
        cudaEventRecord(e0, (cudaStream_t)C.stream);
        drafter_zero_grad(d);
        if (drafter_forward_backward(d, &b, 0.0f, &st)) { fprintf(stderr, "bench_drafter: %s\n", dl_errmsg()); return 1; }
        cudaEventRecord(e1, (cudaStream_t)C.stream);
        C.impl->sumsq(&C, nsq, drafter_grads(d), np, 0);
        C.impl->adamw(&C, drafter_master(d), drafter_weights(d), drafter_grads(d), m1, m2, np, 1e-5f,
                      0.9f, 0.95f, 1e-8f, 0.0f, i + 2, nsq, 1.0f);
        cudaEventRecord(e2, (cudaStream_t)C.stream);
        cudaEventSynchronize(e2);
        if (i >= 0) {
            cudaEventElapsedTime(&ts[i], e0, e2);
            cudaEventElapsedTime(&tf_[i], e0, e1);
        }
        if (i <= 0) printf("  step %d: loss %.4f, position-1 accuracy %.4f\n", i + 1,
                           st.loss_sum / st.weight_sum, st.count[1] > 0 ? st.correct[1] / st.count[1] : 0);
    }
    /* forward alone (activations kept; no loss): where the step's time goes */
    float tfw[64];
    for (int i = -1; i < reps; i++) {
        cudaEventRecord(e0, (cudaStream_t)C.stream);
        drafter_forward(d, &b);
        cudaEventRecord(e1, (cudaStream_t)C.stream);
        cudaEventSynchronize(e1);
        if (i >= 0) cudaEventElapsedTime(&tfw[i], e0, e1);
    }
    qsort(tfw, (size_t)reps, sizeof(float), cmpf);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) { fprintf(stderr, "CUDA: %s\n", cudaGetErrorString(err)); return 1; }
    qsort(ts, (size_t)reps, sizeof(float), cmpf);
    qsort(tf_, (size_t)reps, sizeof(float), cmpf);
    double ms = ts[reps / 2], msf = tf_[reps / 2];
    size_t fr;
    cudaMemGetInfo(&fr, &tot);
    printf("step (fwd+bwd+AdamW): %.1f ms = %.0f block tokens/s, %.0f target tokens/s, %.1f TFLOP/s, "
           "MFU %.1f%%\n", ms, nb * cfg.B / (ms * 1e-3), T / (ms * 1e-3), fl / (ms * 1e-3) / 1e12,
           100 * fl / (ms * 1e-3) / 1e12 / peak);
    printf("  of which forward+loss+backward: %.1f ms (MFU %.1f%%), AdamW+norm: %.1f ms; "
           "drafter_forward alone (no loss): %.1f ms\n", msf, 100 * fl / (msf * 1e-3) / 1e12 / peak,
           ms - msf, tfw[reps / 2]);
    printf("device memory in use: %.2f GiB (this process's buffers: %.2f GiB; + context)\n",
           (tot - fr) / 1073741824.0, (double)(fr0 - fr) / 1073741824.0);
    if (profile) {
        float pms = 0;
        prof_install(sum_ctx);
        cudaEventRecord(e0, (cudaStream_t)C.stream);
        drafter_zero_grad(d);
        if (drafter_forward_backward(d, &b, 0.0f, &st)) { fprintf(stderr, "bench_drafter: %s\n", dl_errmsg()); return 1; }
        C.impl->sumsq(&C, nsq, drafter_grads(d), np, 0);
        C.impl->adamw(&C, drafter_master(d), drafter_weights(d), drafter_grads(d), m1, m2, np, 1e-5f,
                      0.9f, 0.95f, 1e-8f, 0.0f, reps + 2, nsq, 1.0f);
        cudaEventRecord(e2, (cudaStream_t)C.stream);
        cudaEventSynchronize(e2);
        cudaEventElapsedTime(&pms, e0, e2);
        prof_report(pms);
    }
    drafter_destroy(&d);
    C.impl->free_(&C, m1); C.impl->free_(&C, m2); C.impl->free_(&C, nsq);
    C.impl->free_(&C, embed); C.impl->free_(&C, lm); C.impl->free_(&C, feat);
    free(cu), free(ids), free(anch), free(mask);
    ops_ctx_destroy(&C);
    return 0;
}
#endif
