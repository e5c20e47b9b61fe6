/* Seeded random numbers.
 *
 * rng_t is xoshiro256** (Blackman & Vigna, 2018) seeded through splitmix64, so a
 * 64-bit seed gives a full state. rng_mix is a stateless hash of (seed, a, b) for
 * things that must be a pure function of their coordinates, e.g. the shuffle of
 * epoch e or the anchors of micro-batch mb: rng_seed(&r, rng_mix(seed, e, mb)).
 * Same seed, same sequence on every machine (integer-only except rng_uniform /
 * rng_normal, which are IEEE-exact for the same inputs).
 */
#ifndef DL_BASE_RNG_H
#define DL_BASE_RNG_H

#include <stdint.h>

typedef struct { uint64_t s[4]; } rng_t;

void rng_seed(rng_t *r, uint64_t seed);
uint64_t rng_u64(rng_t *r);
/* Uniform in [0, n), unbiased (Lemire's method); n >= 1. */
uint64_t rng_below(rng_t *r, uint64_t n);
/* Uniform float in [0, 1) with 24 random bits. */
float rng_uniform(rng_t *r);
/* Standard normal (Box-Muller; uses two uniforms per call, discards the second). */
float rng_normal(rng_t *r);
/* rng_normal's value before its rounding to float, from its two draws a (first) and b:
 * rng_normal(r) == (float)rng_normal_f64(a, b). In double: sqrt(-2 log u1) cos(2 pi u2),
 * u1 = ((a >> 11) + 1) * 2^-53 in [2^-53, 1] (the source's constant 1 / 9007199254740993.0
 * rounds to 2^-53; u1 = 1 gives +-0), u2 = (b >> 11) * 2^-53, with this machine's libm log
 * and cos (glibc's). The drafter's init on a GPU (drafter_init_master_on) recomputes with it
 * the normals whose rounding the device's log / cos could have changed. */
double rng_normal_f64(uint64_t a, uint64_t b);
/* Jump-ahead (xoshiro256**'s state update is linear over GF(2)): the map of n rng_u64
 * draws as a 256x256 bit matrix (8 KiB, column j the image of state bit j). Made in
 * O(log n) matrix products (a few ms); rng_jump_apply(j, r) then moves r exactly as n
 * rng_u64 calls would, in about a microsecond. So a long stream can be cut into chunks
 * whose start states are found without drawing every number before them (the drafter's
 * parallel init). */
typedef struct { uint64_t col[256][4]; } rng_jump_t;
void rng_jump_make(rng_jump_t *j, uint64_t n);
void rng_jump_apply(const rng_jump_t *j, rng_t *r);
/* Stateless 64-bit hash of (seed, a, b) (splitmix64 finaliser chain). */
uint64_t rng_mix(uint64_t seed, uint64_t a, uint64_t b);
/* Fisher-Yates shuffle of idx[n] in place. */
void rng_shuffle_u32(rng_t *r, uint32_t *idx, uint64_t n);

#endif
