/* FP8 (E4M3) linear on CPU: the exact emulation that the CUDA path (cuBLASLt FP8 GEMM,
 * common/ops/cuda/matmul_fp8.cu) is tested against. Quantization is bitwise
 * __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); the GEMM multiplies the E4M3
 * values as fp32 (every product of two E4M3 values is exact in fp32), sums in fp32
 * through the ordinary sgemm, then applies the per-row and per-column scales. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "common/ops/cpu/cpu.h"

#define FP8_E4M3_MAX 448.0f

uint8_t ops_fp8_e4m3_from_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    float a = fabsf(x);
    if (isnan(a)) return (uint8_t)(sign | 0x7fu);
    if (a > FP8_E4M3_MAX) return (uint8_t)(sign | 0x7eu);   /* SATFINITE (inf too) */
    if (a < 0x1p-6f) {
        /* subnormal range: multiples of 2^-9; a * 512 is exact, rintf rounds half to even
         * (default mode); 8 * 2^-9 = 2^-6 is the smallest normal, whose code is 0x08 */
        return (uint8_t)(sign | (uint8_t)rintf(a * 512.0f));
    }
    uint32_t b;
    memcpy(&b, &a, 4);
    int e = (int)(b >> 23) - 127;                    /* -6 .. 8 */
    uint32_t m = b & 0x7fffffu, r = m >> 20, rem = m & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) r++;
    if (r == 8) { r = 0; e++; }                      /* a <= 448 keeps e <= 8, r <= 6 at e 8 */
    return (uint8_t)(sign | (uint8_t)((e + 7) << 3) | (uint8_t)r);
}

float ops_fp8_e4m3_to_f32(uint8_t v) {
    int e = (v >> 3) & 15, m = v & 7;
    float a;
    if (e == 15 && m == 7) a = NAN;
    else if (e == 0) a = ldexpf((float)m, -9);
    else a = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return (v & 0x80u) ? -a : a;
}

void ops_cpu_fp8_quantize_rows(const ops_ctx_t *c, uint8_t *q, float *s, const void *x_, int R,
                               int K) {
    const float *x = x_;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (int r = 0; r < R; r++) {
        const float *row = x + (size_t)r * K;
        float amax = 0.0f;
        for (int k = 0; k < K; k++) amax = fmaxf(amax, fabsf(row[k]));
        float sc = amax > 0.0f ? amax / FP8_E4M3_MAX : 1.0f;
        s[r] = sc;
        uint8_t *qr = q + (size_t)r * K;
        for (int k = 0; k < K; k++) qr[k] = ops_fp8_e4m3_from_f32(row[k] / sc);
    }
}

/* E4M3 bytes (n) -> their values (n) f32. */
static void fp8__decode(const ops_ctx_t *c, float *dst, const uint8_t *src, size_t n) {
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = ops_fp8_e4m3_to_f32((uint8_t)i);
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = lut[src[i]];
}

void ops_cpu_fp8_matmul_forward(const ops_ctx_t *c, void *out_, const uint8_t *qx,
                                const float *sx, const uint8_t *qw, const float *sw,
                                const void *bias_, int M, int K, int N) {
    float *out = out_;
    const float *bias = bias_;
    if (M <= 0 || N <= 0) return;
    float *xf = malloc((size_t)M * K * sizeof(float));
    float *wf = malloc((size_t)N * K * sizeof(float));
    if (!xf || !wf) abort();   /* host scratch of an emulation path; as upload_act on CUDA */
    fp8__decode(c, xf, qx, (size_t)M * K);
    fp8__decode(c, wf, qw, (size_t)N * K);
    ops_cpu_matmul_forward(c, out, xf, wf, NULL, M, K, N);
    free(xf);
    free(wf);
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (int m = 0; m < M; m++) {
        float *o = out + (size_t)m * N;
        for (int n = 0; n < N; n++) {
            float v = o[n] * sx[m] * sw[n];
            o[n] = bias ? v + bias[n] : v;
        }
    }
}

int ops_cpu_fp8_check(const ops_ctx_t *c, int K, int N) {
    (void)c;
    if (K < 1 || N < 1) return dl_seterr(DL_ENOTSUP, "fp8 linear: shape (%d, %d)", N, K);
    return 0;
}
