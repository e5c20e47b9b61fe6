/* GPU benchmark of DFlash drafter training (common/model/drafter.c on CUDA).
 *
 * Usage: bench_drafter [--model DIR] [--seqs 8] [--seqlen 4096] [--anchors 512]
 *                      [--layers 5] [--reps 5] [--loss-chunk BLOCKS (default: the drafter's, 16)]
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
 * AdamW moments). Time: median of --reps CUDA-event-timed steps after one warm-up. */
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

int main(int argc, char **argv) {
    const char *model = NULL;
    int nseq = 8, seqlen = 4096, nanch = 512, layers = 5, reps = 5, chunk = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--seqs") && i + 1 < argc) nseq = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seqlen") && i + 1 < argc) seqlen = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--anchors") && i + 1 < argc) nanch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--loss-chunk") && i + 1 < argc) chunk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) reps = 2;
    }
    if (reps < 1 || reps > 50) reps = 5;
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
    if (drafter_new(&C, &cfg, embed, lm, T, maxb, 1, &d)) { fprintf(stderr, "bench_drafter: %s\n", dl_errmsg()); return 1; }
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
    drafter_destroy(&d);
    C.impl->free_(&C, m1); C.impl->free_(&C, m2); C.impl->free_(&C, nsq);
    C.impl->free_(&C, embed); C.impl->free_(&C, lm); C.impl->free_(&C, feat);
    free(cu), free(ids), free(anch), free(mask);
    ops_ctx_destroy(&C);
    return 0;
}
#endif
