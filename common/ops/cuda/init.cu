// Seeded normal init on the device (ops.h normal_init): the drafter's master weights,
// bitwise as the host's init once the caller has recomputed the listed near-midpoint
// normals (common/model/drafter.c, drafter_init_master_on).
//
// One thread per chunk of the stream: it starts from the chunk's xoshiro256** state
// (jumped ahead on the host, rng.h) and draws its normals in order, as the host's OpenMP
// chunks do. The Box-Muller is rng_normal_f64's expression, operation for operation, in
// double: the draws' conversions, the products by the same constants, IEEE sqrt, and
// CUDA's log and cos (within 1 and 2 double ulps of the true value; glibc's within about
// 1). Every product is an explicit __dmul_rn, which nvcc never contracts into an FMA: cos's
// argument in particular must be the host's bits (near cos's zeros a changed argument
// changes the value by more than any margin); the float steps are __double2float_rn and
// __fmul_rn, the host's conversion and multiply.
#include "common/ops/cuda/cuda_common.cuh"

#include "common/base/f32near.h"
#include "common/base/xoshiro.h"

#define INIT_THREADS 128

__global__ void normal_init_kernel(float *dst, const ops_normal_seg_t *seg, int n_seg,
                                   const uint64_t *states, size_t n_chunks, size_t chunk,
                                   uint64_t G, float scale, double near_rel,
                                   ops_normal_near_t *near, size_t near_cap,
                                   unsigned long long *n_near) {
    size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (k >= n_chunks) return;
    uint64_t s[4] = {states[4 * k], states[4 * k + 1], states[4 * k + 2], states[4 * k + 3]};
    uint64_t g = (uint64_t)k * chunk, g1 = g + chunk < G ? g + chunk : G;
    // the segment holding g: the last one with gstart <= g
    int lo = 0, hi = n_seg - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (seg[mid].gstart <= g) lo = mid; else hi = mid - 1;
    }
    int si = lo;
    while (g < g1) {
        while (g >= seg[si].gstart + seg[si].numel) si++;
        uint64_t a = xoshiro_next(s);
        uint64_t b = xoshiro_next(s);
        double u1 = __dmul_rn(__dadd_rn((double)(a >> 11), 1.0), 1.0 / 9007199254740993.0);
        double u2 = __dmul_rn((double)(b >> 11), 1.0 / 9007199254740992.0);
        double v = __dmul_rn(sqrt(__dmul_rn(-2.0, log(u1))), cos(__dmul_rn(6.283185307179586, u2)));
        float x = __fmul_rn(scale, __double2float_rn(v));
        uint64_t i = seg[si].offset + (g - seg[si].gstart);
        dst[i] = x;
        if (f32_near_midpoint(v, near_rel)) {
            unsigned long long slot = atomicAdd(n_near, 1ull);
            if (slot < near_cap) {
                ops_normal_near_t e;
                e.index = i;
                e.draw[0] = a;
                e.draw[1] = b;
                e.value = x;
                e.pad = 0;
                near[slot] = e;
            }
        }
        g++;
    }
}

extern "C" int cuda_normal_init(const ops_ctx_t *c, float *dst, const ops_normal_seg_t *seg,
                                int n_seg, const uint64_t *states, size_t n_chunks, size_t chunk,
                                uint64_t G, float scale, double near_rel, ops_normal_near_t *near,
                                size_t near_cap, size_t *n_near) {
    *n_near = 0;
    if (G == 0 || n_chunks == 0) return 0;
    if (n_seg < 1 || chunk == 0) return dl_seterr(DL_EINVAL, "normal_init: %d segments, chunk %zu", n_seg, chunk);
    cudaStream_t st = cuda_stream(c);
    size_t seg_b = (size_t)n_seg * sizeof *seg, st_b = n_chunks * 4 * sizeof(uint64_t);
    size_t near_b = near_cap * sizeof *near;
    // one device block: the count, the segments, the states, the near list
    size_t off_seg = 256, off_st = off_seg + ((seg_b + 255) & ~(size_t)255);
    size_t off_near = off_st + ((st_b + 255) & ~(size_t)255), total = off_near + near_b;
    char *buf = NULL;
    if (cudaMalloc(&buf, total) != cudaSuccess) {
        cudaGetLastError();
        return dl_seterr(DL_ENOMEM, "normal_init: cudaMalloc(%zu bytes) on device %d failed", total, c->device);
    }
    unsigned long long *cnt = (unsigned long long *)buf;
    cudaError_t e = cudaMemsetAsync(cnt, 0, sizeof *cnt, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(buf + off_seg, seg, seg_b, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(buf + off_st, states, st_b, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) {
        unsigned blocks = (unsigned)((n_chunks + INIT_THREADS - 1) / INIT_THREADS);
        normal_init_kernel<<<blocks, INIT_THREADS, 0, st>>>(
            dst, (const ops_normal_seg_t *)(buf + off_seg), n_seg, (const uint64_t *)(buf + off_st),
            n_chunks, chunk, G, scale, near_rel, (ops_normal_near_t *)(buf + off_near), near_cap, cnt);
        e = cudaGetLastError();
    }
    unsigned long long got = 0;
    if (e == cudaSuccess) e = cudaMemcpyAsync(&got, cnt, sizeof got, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    size_t keep = got < near_cap ? (size_t)got : near_cap;
    if (e == cudaSuccess && keep)
        e = cudaMemcpy(near, buf + off_near, keep * sizeof *near, cudaMemcpyDeviceToHost);
    cudaFree(buf);
    if (e != cudaSuccess) return dl_seterr(DL_ECUDA, "normal_init: %s", cudaGetErrorString(e));
    *n_near = (size_t)got;
    if (got > near_cap)
        return dl_seterr(DL_ERANGE, "normal_init: %llu normals near a float rounding midpoint, room for %zu",
                         got, near_cap);
    return 0;
}
