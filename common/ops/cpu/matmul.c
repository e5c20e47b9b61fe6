/* Linear layer on CPU: OpenBLAS sgemm (its own thread pool; ops_cpu_init sets
 * its thread count). Weight layout is torch.nn.Linear's (N out, K in). */
#include <cblas.h>

#include "common/ops/cpu/cpu.h"

/* out (M,N) = inp (M,K) . weight (N,K)^T + bias (N) (bias may be NULL). */
void ops_cpu_matmul_forward(const ops_ctx_t *c, void *out_, const void *inp_, const void *weight_,
                            const void *bias_, int M, int K, int N) {
    float *out = out_;
    const float *inp = inp_, *weight = weight_, *bias = bias_;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (long i = 0; i < (long)M * N; i++) out[i] = 0.0f;
    } else if (M == 1) {
        /* Decoding (one token): OpenBLAS < 0.3.27 packs the whole weight for sgemm even
         * when M == 1; sgemv streams it once (about 3x faster, memory-bound). */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, weight, K, inp, 1, 0.0f, out, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, inp, K, weight, K,
                    0.0f, out, N);
    }
    if (bias) {
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) out[(long)m * N + n] += bias[n];
    }
}

/* dinp (M,K) = dout (M,N) . weight (N,K)   (assigned)
 * dweight (N,K) += dout^T . inp            (accumulated)
 * dbias (N) += column sums of dout         (accumulated). Any grad may be NULL. */
void ops_cpu_matmul_backward(const ops_ctx_t *c, void *dinp_, float *dweight, float *dbias,
                             const void *dout_, const void *inp_, const void *weight_,
                             int M, int K, int N) {
    float *dinp = dinp_;
    const float *dout = dout_, *inp = inp_, *weight = weight_;
    if (M <= 0 || K <= 0) return;
    if (dinp) {
        if (N <= 0) {
            for (long i = 0; i < (long)M * K; i++) dinp[i] = 0.0f;
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dout, N, weight,
                        K, 0.0f, dinp, K);
        }
    }
    if (N <= 0) return;
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dout, N, inp, K, 1.0f,
                    dweight, K);
    if (dbias) {
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
        for (int n = 0; n < N; n++) {
            double s = 0.0;
            for (int m = 0; m < M; m++) s += dout[(long)m * N + n];
            dbias[n] += (float)s;
        }
    }
}
