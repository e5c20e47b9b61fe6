// CUDA backend of common/ops/ops.h: context life cycle, memory, dtype
// conversions, the small elementwise ops (add, axpy, embedding) and the impl
// table. act = bf16, statistics and parameter gradients f32.
//
// Nothing here runs at load time: CUDA is first touched in ops_cuda_init, so a
// process may fork() before it (the stages fork workers).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ops/cuda/cuda_common.cuh"

extern "C" {
#include "common/base/log.h"
}

#define OPS_CUDA_WORKSPACE_BYTES (32u << 20)  // cuBLASLt's advice for Hopper

extern "C" void cuda_check_fail_(const char *what, const char *errstr, const char *file,
                                 int line) {
    log_msg(LOG_ERROR, file, line, "CUDA: %s: %s", what, errstr);
    fprintf(stderr, "%s:%d: CUDA: %s: %s\n", file, line, what, errstr);
    abort();
}

void *cuda_scratch(const ops_ctx_t *c, size_t bytes) {
    ops_cuda_state *st = cuda_state(c);
    if (bytes <= st->scratch_bytes) return st->scratch;
    size_t want = bytes + bytes / 4 + 4096;
    if (st->scratch) cuda_check(cudaFreeAsync(st->scratch, cuda_stream(c)));
    st->scratch = NULL;
    cuda_check(cudaMallocAsync(&st->scratch, want, cuda_stream(c)));
    st->scratch_bytes = want;
    return st->scratch;
}

// ---------------------------------------------------------------- memory
static void *cuda_malloc_(const ops_ctx_t *c, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky-free error state
        dl_seterr(DL_ENOMEM, "cudaMalloc(%zu bytes) on device %d failed", bytes, c->device);
        return NULL;
    }
    return p;
}
static void cuda_free_(const ops_ctx_t *c, void *p) {
    if (!p) return;
    cuda_check(cudaStreamSynchronize(cuda_stream(c)));  // p may still be in use on the stream
    cuda_check(cudaFree(p));
}
static void cuda_memset0(const ops_ctx_t *c, void *p, size_t bytes) {
    if (bytes) cuda_check(cudaMemsetAsync(p, 0, bytes, cuda_stream(c)));
}
static void cuda_copy(const ops_ctx_t *c, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src)
        cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream(c)));
}
// Strided 2-D copy (ops.h copy2d): one cudaMemcpy2DAsync, not one copy per row
// (the target writes each captured layer's (T, D) output into a column block of
// the (T, n*D) feature matrix: 65,536 rows per layer at a 64k-token batch).
static void cuda_copy2d(const ops_ctx_t *c, void *dst, size_t dst_pitch, const void *src,
                        size_t src_pitch, size_t width_bytes, size_t rows) {
    if (!rows || !width_bytes) return;
    cuda_check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width_bytes, rows,
                                 cudaMemcpyDeviceToDevice, cuda_stream(c)));
}
// upload/download are synchronous for the host buffer (it may be reused or
// freed on return, as with memcpy on the CPU backend).
static void cuda_upload(const ops_ctx_t *c, void *dst, const void *src_host, size_t bytes) {
    if (!bytes) return;
    cuda_check(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, cuda_stream(c)));
    cuda_check(cudaStreamSynchronize(cuda_stream(c)));
}
static void cuda_download(const ops_ctx_t *c, void *dst_host, const void *src, size_t bytes) {
    if (!bytes) return;
    cuda_check(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, cuda_stream(c)));
    cuda_check(cudaStreamSynchronize(cuda_stream(c)));
}
static void cuda_sync(const ops_ctx_t *c) { cuda_check(cudaStreamSynchronize(cuda_stream(c))); }
// Pinned host memory for bulk uploads (host_alloc/host_free/upload_async, ops.h).
static void *cuda_host_alloc(const ops_ctx_t *c, size_t bytes) {
    (void)c;
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();   // not sticky: clear it, the caller handles NULL
        return NULL;
    }
    return p;
}
static void cuda_host_free(const ops_ctx_t *c, void *p) {
    (void)c;
    if (p) cuda_check(cudaFreeHost(p));
}
static void cuda_upload_async(const ops_ctx_t *c, void *dst, const void *src_host, size_t bytes) {
    if (!bytes) return;
    cuda_check(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, cuda_stream(c)));
}

// ---------------------------------------------------------------- conversions
__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}
__global__ void bf16_to_f32_kernel(float *dst, const bf16 *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}
// The same, four elements a thread (src 16-byte, dst 8-byte aligned; n4 groups of 4).
__global__ void f32_to_bf16x4_kernel(uint2 *dst, const float4 *src, size_t n4) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 f = src[i];
        __nv_bfloat162 a = __floats2bfloat162_rn(f.x, f.y), b = __floats2bfloat162_rn(f.z, f.w);
        dst[i] = make_uint2(*(uint32_t *)&a, *(uint32_t *)&b);
    }
}
static void cuda_f32_to_act(const ops_ctx_t *c, void *dst, const float *src, size_t n) {
    if (!n) return;
    size_t n4 = aligned16(src) && ((uintptr_t)dst & 7) == 0 ? n / 4 : 0;
    if (n4) {
        f32_to_bf16x4_kernel<<<cuda_blocks(n4, 256), 256, 0, cuda_stream(c)>>>(
            (uint2 *)dst, (const float4 *)src, n4);
        cuda_check_launch();
    }
    if (4 * n4 < n) {   // the tail, or all of it unaligned
        f32_to_bf16_kernel<<<cuda_blocks(n - 4 * n4, 256), 256, 0, cuda_stream(c)>>>(
            (bf16 *)dst + 4 * n4, src + 4 * n4, n - 4 * n4);
        cuda_check_launch();
    }
}
static void cuda_act_to_f32(const ops_ctx_t *c, float *dst, const void *src, size_t n) {
    if (!n) return;
    bf16_to_f32_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream(c)>>>(dst, (const bf16 *)src, n);
    cuda_check_launch();
}
// Host-side round-to-nearest-even f32 -> bf16 (NaN kept quiet).
static uint16_t host_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static void cuda_upload_act(const ops_ctx_t *c, void *dst, const float *src_host, size_t n) {
    if (!n) return;
    uint16_t *tmp = (uint16_t *)malloc(n * 2);
    if (!tmp) {
        fprintf(stderr, "ops cuda upload_act: out of host memory (%zu elements)\n", n);
        abort();
    }
    for (size_t i = 0; i < n; i++) tmp[i] = host_f32_to_bf16(src_host[i]);
    cuda_upload(c, dst, tmp, n * 2);
    free(tmp);
}
static void cuda_download_act(const ops_ctx_t *c, float *dst_host, const void *src, size_t n) {
    if (!n) return;
    uint16_t *tmp = (uint16_t *)malloc(n * 2);
    if (!tmp) {
        fprintf(stderr, "ops cuda download_act: out of host memory (%zu elements)\n", n);
        abort();
    }
    cuda_download(c, tmp, src, n * 2);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)tmp[i] << 16;
        memcpy(&dst_host[i], &u, 4);
    }
    free(tmp);
}

// ---------------------------------------------------------------- add, axpy
// 8 bf16 per 16-byte access when every pointer is 16-byte aligned and n % 8 == 0,
// else one element per thread.
__global__ void add_vec_kernel(uint4 *out, const uint4 *a, const uint4 *b, size_t n8) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 x = a[i], y = b[i], r;
        const __nv_bfloat162 *xp = (const __nv_bfloat162 *)&x, *yp = (const __nv_bfloat162 *)&y;
        __nv_bfloat162 *rp = (__nv_bfloat162 *)&r;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 fx = __bfloat1622float2(xp[k]), fy = __bfloat1622float2(yp[k]);
            rp[k] = __floats2bfloat162_rn(fx.x + fy.x, fx.y + fy.y);
        }
        out[i] = r;
    }
}
__global__ void add_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}
static void cuda_add(const ops_ctx_t *c, void *out, const void *a, const void *b, size_t n) {
    if (!n) return;
    if (n % 8 == 0 && aligned16(out) && aligned16(a) && aligned16(b))
        add_vec_kernel<<<cuda_blocks(n / 8, 256), 256, 0, cuda_stream(c)>>>(
            (uint4 *)out, (const uint4 *)a, (const uint4 *)b, n / 8);
    else
        add_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream(c)>>>((bf16 *)out, (const bf16 *)a,
                                                                   (const bf16 *)b, n);
    cuda_check_launch();
}

__global__ void axpy_vec_kernel(uint4 *y, float alpha, const uint4 *x, size_t n8) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 xv = x[i], yv = y[i];
        const __nv_bfloat162 *xp = (const __nv_bfloat162 *)&xv;
        __nv_bfloat162 *yp = (__nv_bfloat162 *)&yv;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 fx = __bfloat1622float2(xp[k]), fy = __bfloat1622float2(yp[k]);
            yp[k] = __floats2bfloat162_rn(fy.x + alpha * fx.x, fy.y + alpha * fx.y);
        }
        y[i] = yv;
    }
}
__global__ void axpy_kernel(bf16 *y, float alpha, const bf16 *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + alpha * __bfloat162float(x[i]));
}
static void cuda_axpy(const ops_ctx_t *c, void *y, float alpha, const void *x, size_t n) {
    if (!n) return;
    if (n % 8 == 0 && aligned16(y) && aligned16(x))
        axpy_vec_kernel<<<cuda_blocks(n / 8, 256), 256, 0, cuda_stream(c)>>>(
            (uint4 *)y, alpha, (const uint4 *)x, n / 8);
    else
        axpy_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream(c)>>>((bf16 *)y, alpha,
                                                                    (const bf16 *)x, n);
    cuda_check_launch();
}

// ---------------------------------------------------------------- embedding
// One block per token row; 16-byte copies when rows are 16-byte aligned.
__global__ void embedding_kernel(bf16 *out, const int32_t *ids, const bf16 *table, int C,
                                 int vec) {
    int t = blockIdx.x;
    const bf16 *src = table + (size_t)ids[t] * C;
    bf16 *dst = out + (size_t)t * C;
    if (vec) {
        const uint4 *s = (const uint4 *)src;
        uint4 *d = (uint4 *)dst;
        for (int i = threadIdx.x; i < C / 8; i += blockDim.x) d[i] = s[i];
    } else {
        for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
    }
}
static void cuda_embedding_forward(const ops_ctx_t *c, void *out, const int32_t *ids,
                                   const void *table, int T, int C) {
    if (T <= 0 || C <= 0) return;
    int vec = C % 8 == 0 && aligned16(out) && aligned16(table);
    embedding_kernel<<<T, 128, 0, cuda_stream(c)>>>((bf16 *)out, ids, (const bf16 *)table, C, vec);
    cuda_check_launch();
}

// qknorm_rope.cu (fused per-head q/k norm + rope; declared here, its only user)
void cuda_qk_norm_rope_forward(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                               const void *weight, float eps, const int32_t *pos,
                               const float *inv_freq, int N, int nh, int hd);
void cuda_qk_norm_rope_backward(const ops_ctx_t *c, void *dinp, float *dweight,
                                const void *dout, const void *inp, const void *weight,
                                const float *rstd, const int32_t *pos, const float *inv_freq,
                                float eps, int N, int nh, int hd);
void cuda_qk_norm_rope_forward_exact(const ops_ctx_t *c, void *out, float *rstd, const void *inp,
                                     const void *weight, float eps, const int32_t *pos,
                                     const float *inv_freq, int N, int nh, int hd);

// init.cu (the seeded normal init of the drafter's master weights)
extern "C" int cuda_normal_init(const ops_ctx_t *c, float *dst, const ops_normal_seg_t *seg,
                                int n_seg, const uint64_t *states, size_t n_chunks, size_t chunk,
                                uint64_t G, float scale, double near_rel, ops_normal_near_t *near,
                                size_t near_cap, size_t *n_near);

// ---------------------------------------------------------------- table, life cycle
static const ops_impl_t cuda_impl_template = {
    "cuda",
    cuda_malloc_,
    cuda_free_,
    cuda_memset0,
    cuda_copy,
    cuda_upload,
    cuda_download,
    cuda_sync,
    cuda_upload_act,
    cuda_download_act,
    cuda_act_to_f32,
    cuda_f32_to_act,
    cuda_matmul_forward,
    cuda_matmul_backward,
    cuda_rmsnorm_forward,
    cuda_rmsnorm_backward,
    cuda_rope_forward,
    cuda_rope_backward,
    cuda_swiglu_forward,
    cuda_swiglu_backward,
    cuda_embedding_forward,
    cuda_add,
    cuda_axpy,
    cuda_attention_varlen_forward,
    cuda_attention_block_forward,
    cuda_attention_block_backward,
    cuda_xent_forward_backward,
    cuda_sumsq,
    cuda_adamw,
    cuda_copy2d,
    cuda_f32_add_scale,
    cuda_moe_route,
    cuda_moe_permute,
    cuda_moe_combine,
    cuda_host_alloc,
    cuda_host_free,
    cuda_upload_async,
    cuda_fp8_quantize_rows,
    cuda_fp8_matmul_forward,
    cuda_fp8_check,
    cuda_qk_norm_rope_forward,
    cuda_qk_norm_rope_backward,
    cuda_matmul_forward_res,
    cuda_qk_norm_rope_forward_exact,
    cuda_normal_init,
    cuda_sumsq_scaled,
    cuda_adamw_pub,
    cuda_add_rmsnorm_forward,
};

#define INIT_TRY(call)                                                                     \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            rc = dl_seterr(DL_ECUDA, "ops_cuda_init(device %d): %s: %s", device, #call,    \
                           cudaGetErrorString(e_));                                        \
            goto fail;                                                                     \
        }                                                                                  \
    } while (0)

extern "C" int ops_cuda_init(ops_ctx_t *c, int device) {
    int rc = 0, ndev = 0;
    cudaStream_t stream = NULL;
    cublasLtHandle_t lt = NULL;
    void *ws = NULL;
    ops_cuda_state *st = NULL;
    memset(c, 0, sizeof(*c));
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0)
        return dl_seterr(DL_ENOENT, "ops_cuda_init(device %d): no CUDA device (%s)", device,
                         e != cudaSuccess ? cudaGetErrorString(e) : "count is 0");
    if (device < 0 || device >= ndev)
        return dl_seterr(DL_EINVAL, "ops_cuda_init: device %d out of range [0, %d)", device, ndev);
    INIT_TRY(cudaSetDevice(device));
    st = (ops_cuda_state *)calloc(1, sizeof(*st));
    if (!st) return dl_seterr(DL_ENOMEM, "ops_cuda_init: out of host memory");
    st->impl = cuda_impl_template;
    INIT_TRY(cudaDeviceGetAttribute(&st->num_sms, cudaDevAttrMultiProcessorCount, device));
    INIT_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    INIT_TRY(cudaMalloc(&ws, OPS_CUDA_WORKSPACE_BYTES));
    INIT_TRY(cudaMalloc((void **)&st->partials, CUDA_PARTIALS * sizeof(float)));
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
        rc = dl_seterr(DL_ECUDA, "ops_cuda_init(device %d): cublasLtCreate failed", device);
        goto fail;
    }
    c->backend = OPS_CUDA;
    c->impl = &st->impl;
    c->device = device;
    c->stream = stream;
    c->blas = lt;
    c->workspace = ws;
    c->workspace_bytes = OPS_CUDA_WORKSPACE_BYTES;
    return 0;
fail:
    if (ws) cudaFree(ws);
    if (st && st->partials) cudaFree(st->partials);
    if (stream) cudaStreamDestroy(stream);
    free(st);
    memset(c, 0, sizeof(*c));
    return rc;
}

// Called by ops_ctx_destroy (common/ops/ops.c) for CUDA contexts.
extern "C" void ops_cuda_ctx_destroy(ops_ctx_t *c) {
    if (!c || c->backend != OPS_CUDA || !c->impl) return;
    ops_cuda_state *st = cuda_state(c);
    cudaSetDevice(c->device);
    if (c->stream) cudaStreamSynchronize(cuda_stream(c));
    cuda_gemm_plans_destroy(st);
    cuda_fp8_state_destroy(st);
    if (st->scratch) cudaFreeAsync(st->scratch, cuda_stream(c));
    if (c->stream) cudaStreamSynchronize(cuda_stream(c));
    if (st->partials) cudaFree(st->partials);
    if (c->workspace) cudaFree(c->workspace);
    if (c->blas) cublasLtDestroy((cublasLtHandle_t)c->blas);
    if (c->stream) cudaStreamDestroy(cuda_stream(c));
    free(st);
    c->impl = NULL;
    c->stream = c->blas = c->workspace = NULL;
}
