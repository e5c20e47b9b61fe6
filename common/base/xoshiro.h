/* One step of xoshiro256** (Blackman & Vigna, 2018): the generator of rng.h, header-only
 * for C and CUDA (__host__ __device__), so the host's rng_u64 and the device's seeded init
 * (common/ops/cuda/init.cu) draw with the same code. s: the 4-word state, advanced. */
#ifndef DL_BASE_XOSHIRO_H
#define DL_BASE_XOSHIRO_H

#include <stdint.h>

#ifdef __CUDACC__
#define XOSHIRO_HD __host__ __device__ __forceinline__
#else
#define XOSHIRO_HD static inline
#endif

XOSHIRO_HD uint64_t xoshiro_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

XOSHIRO_HD uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t result = xoshiro_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = xoshiro_rotl(s[3], 45);
    return result;
}

#endif
