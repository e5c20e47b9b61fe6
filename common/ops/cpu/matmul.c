/* Linear layer on CPU: OpenBLAS sgemm. Weight layout is torch.nn.Linear's (N out, K in).
 *
 * Threading: OpenBLAS runs single-threaded (ops_cpu_init) and each GEMM is split into
 * column or row slices across our own OpenMP team. Two pools (OpenMP workers spin-waiting
 * after every parallel region + OpenBLAS's pthread workers) oversubscribe the cores: on 2
 * cores a SmolLM2 decode step went from 50 ms to 1 s, every BLAS call waiting for a
 * scheduler tick. One pool avoids that. */
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

#include "common/ops/cpu/cpu.h"

/* Below this many multiply-adds a GEMM runs on the calling thread alone. */
#define MATMUL_SPLIT_MIN_MACS (1L << 18)

/* Slice [*a, *b) of n items for thread t of nt, aligned to 16 items. */
static inline void matmul__slice(int n, int t, int nt, int *a, int *b) {
    int blocks = (n + 15) / 16;
    *a = (int)((long)blocks * t / nt) * 16;
    *b = (int)((long)blocks * (t + 1) / nt) * 16;
    if (*a > n) *a = n;
    if (*b > n) *b = n;
}

static inline int matmul__team(const ops_ctx_t *c, long macs) {
    return macs < MATMUL_SPLIT_MIN_MACS ? 1 : ops_cpu__threads(c);
}

/* C (M,N) = A (M,K) . B (N,K)^T (+= when beta = 1); lda K, ldb K, ldc N. */
static void matmul__nt(const ops_ctx_t *c, int M, int N, int K, const float *A, const float *B,
                       float beta, float *C) {
    int nt = matmul__team(c, (long)M * N * K);
    int by_rows = M >= 64 * nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads(), a, b;
        matmul__slice(by_rows ? M : N, t, n, &a, &b);
        if (b > a) {
            if (by_rows)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b - a, N, K, 1.0f,
                            A + (long)a * K, K, B, K, beta, C + (long)a * N, N);
            else if (M == 1)
                /* decoding: OpenBLAS < 0.3.27 packs the whole weight for sgemm even when
                 * M == 1; sgemv streams it once (about 3x faster, memory-bound) */
                cblas_sgemv(CblasRowMajor, CblasNoTrans, b - a, K, 1.0f, B + (long)a * K, K, A, 1,
                            beta, C + a, 1);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, b - a, K, 1.0f, A, K,
                            B + (long)a * K, K, beta, C + a, N);
        }
    }
}

/* out (M,N) = inp (M,K) . weight (N,K)^T + bias (N) (bias may be NULL). */
void ops_cpu_matmul_forward(const ops_ctx_t *c, void *out_, const void *inp_, const void *weight_,
                            const void *bias_, int M, int K, int N) {
    float *out = out_;
    const float *inp = inp_, *weight = weight_, *bias = bias_;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (long i = 0; i < (long)M * N; i++) out[i] = 0.0f;
    } else {
        matmul__nt(c, M, N, K, inp, weight, 0.0f, out);
    }
    if (bias) {
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) out[(long)m * N + n] += bias[n];
    }
}

/* out (M,N) = inp . weight^T + bias + res: matmul_forward, then add exactly as
 * ops_cpu_add (same bits as the two calls); res == out: the product goes through a
 * temporary first. */
void ops_cpu_matmul_forward_res(const ops_ctx_t *c, void *out, const void *inp,
                                const void *weight, const void *bias, const void *res, int M,
                                int K, int N) {
    if (M <= 0 || N <= 0) return;
    size_t n = (size_t)M * N;
    if (!res) {
        ops_cpu_matmul_forward(c, out, inp, weight, bias, M, K, N);
    } else if (res != out) {
        ops_cpu_matmul_forward(c, out, inp, weight, bias, M, K, N);
        ops_cpu_add(c, out, out, res, n);
    } else {
        float *p = malloc(n * sizeof(float));
        if (!p) abort(); /* host scratch; ops errors abort (ops.h) */
        ops_cpu_matmul_forward(c, p, inp, weight, bias, M, K, N);
        ops_cpu_add(c, out, out, p, n);
        free(p);
    }
}

/* dinp (M,K) = dout (M,N) . weight (N,K), M, K >= 1 (N <= 0: zeros). */
static void matmul__dinp(const ops_ctx_t *c, float *dinp, const float *dout, const float *weight,
                         int M, int K, int N) {
    if (N <= 0) {
        for (long i = 0; i < (long)M * K; i++) dinp[i] = 0.0f;
        return;
    }
    /* split the K columns of dinp (and of weight) */
    int nt = matmul__team(c, (long)M * N * K);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int a, b;
        matmul__slice(K, omp_get_thread_num(), omp_get_num_threads(), &a, &b);
        if (b > a)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, b - a, N, 1.0f, dout, N,
                        weight + a, K, 0.0f, dinp + a, K);
    }
}

/* dinp (M,K) = dout (M,N) . weight (N,K)   (assigned; dinp_acc: added onto dinp as
 *                                           ops_cpu_add(dinp, dinp, product) does)
 * dweight (N,K) += dout^T . inp            (accumulated)
 * dbias (N) += column sums of dout         (accumulated). Any grad may be NULL. */
void ops_cpu_matmul_backward(const ops_ctx_t *c, void *dinp_, float *dweight, float *dbias,
                             const void *dout_, const void *inp_, const void *weight_,
                             int M, int K, int N, int dinp_acc) {
    float *dinp = dinp_;
    const float *dout = dout_, *inp = inp_, *weight = weight_;
    if (M <= 0 || K <= 0) return;
    if (dinp && !dinp_acc) {
        matmul__dinp(c, dinp, dout, weight, M, K, N);
    } else if (dinp) {
        /* OpenBLAS with beta = 1 would add partial sums per K block: other bits */
        size_t n = (size_t)M * K;
        float *p = malloc(n * sizeof(float));
        if (!p) abort(); /* host scratch; ops errors abort (ops.h) */
        matmul__dinp(c, p, dout, weight, M, K, N);
        ops_cpu_add(c, dinp, dinp, p, n);
        free(p);
    }
    if (N <= 0) return;
    if (dweight) {
        /* split the N rows of dweight (columns of dout) */
        int nt = matmul__team(c, (long)M * N * K);
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            int a, b;
            matmul__slice(N, omp_get_thread_num(), omp_get_num_threads(), &a, &b);
            if (b > a)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, b - a, K, M, 1.0f, dout + a, N,
                            inp, K, 1.0f, dweight + (long)a * K, K);
        }
    }
    if (dbias) {
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
        for (int n = 0; n < N; n++) {
            double s = 0.0;
            for (int m = 0; m < M; m++) s += dout[(long)m * N + n];
            dbias[n] += (float)s;
        }
    }
}
