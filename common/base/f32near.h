/* Is a double's rounding to float at risk from a small error in the double?
 *
 * A value v computed twice by two math libraries (glibc on the host, CUDA's on a GPU)
 * differs by a few units in the last place of a double (2^-52 relative; CUDA documents
 * log within 1 ulp and cos within 2). Rounded to float (24 bits) both give the same float
 * unless v lies that close to a midpoint between two floats, where the two roundings may
 * go to different sides. f32_near_midpoint says when v is within rel * |v| of such a
 * midpoint; a caller that needs the host's bits recomputes exactly those values on the
 * host. With rel = 2^-40 (4096 double ulps: far above any library's error) a value is
 * flagged with probability about 2^-15.
 *
 * Header-only, C and CUDA (__host__ __device__): the GPU flags its values with the same
 * code a CPU test checks. Exact arithmetic only (the midpoint of two adjacent floats is
 * exact in double), no libm. */
#ifndef DL_BASE_F32NEAR_H
#define DL_BASE_F32NEAR_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define F32NEAR_HD __host__ __device__ __forceinline__
#else
#define F32NEAR_HD static inline
#endif

#define F32NEAR_REL 0x1p-40   /* the margin the drafter's init uses (drafter.c) */

/* The float next to f away from zero, or toward zero when `away` is 0 (f finite; f 0:
 * away only). */
F32NEAR_HD float f32near_step(float f, int away) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = away ? u + 1 : u - 1;   /* magnitude bits: +1 is the next float away from zero */
    float g;
    memcpy(&g, &u, 4);
    return g;
}

/* 1 when |v - m| <= rel * |v| for the midpoint m between the two floats around v (v not
 * itself a float), i.e. when a value within rel * |v| of v may round to another float
 * than v does (round to nearest). 0 for v exactly a float, for 0 and for non-finite v.
 * From rel = 2^-24 on every value that is not exactly a float is flagged (tests use 1.0:
 * such a value rounds the same on any machine, so "every normal" means every one that
 * could differ). */
F32NEAR_HD int f32_near_midpoint(double v, double rel) {
    if (!(v == v) || v == 0.0) return 0;
    double a = v < 0 ? -v : v;
    if (a > 3.4028234663852886e38) return 0;   /* beyond FLT_MAX: not a float rounding */
    float f = (float)a;                         /* round to nearest */
    double fd = (double)f;
    if (fd == a) return 0;
    /* the other float around a: away from zero when f is below a, else toward zero */
    double gd = (double)f32near_step(f, fd < a);
    double m = (fd + gd) * 0.5;                 /* exact: two floats' sum fits 25 bits */
    double d = a > m ? a - m : m - a;
    return d <= rel * a;
}

#endif
