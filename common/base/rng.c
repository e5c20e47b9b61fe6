#include "common/base/rng.h"
#include "common/base/xoshiro.h"

#include <math.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(rng_t *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

uint64_t rng_u64(rng_t *r) { return xoshiro_next(r->s); }

/* The GF(2)-linear image of state s under j. */
static void jump_vec(const rng_jump_t *j, const uint64_t s[4], uint64_t out[4]) {
    uint64_t o[4] = {0, 0, 0, 0};
    for (int w = 0; w < 4; w++)
        for (uint64_t bits = s[w]; bits; bits &= bits - 1) {
            const uint64_t *c = j->col[64 * w + __builtin_ctzll(bits)];
            o[0] ^= c[0], o[1] ^= c[1], o[2] ^= c[2], o[3] ^= c[3];
        }
    memcpy(out, o, sizeof o);
}

/* out = a after b (out may not alias a or b). */
static void jump_compose(const rng_jump_t *a, const rng_jump_t *b, rng_jump_t *out) {
    for (int k = 0; k < 256; k++) jump_vec(a, b->col[k], out->col[k]);
}

void rng_jump_make(rng_jump_t *j, uint64_t n) {
    rng_jump_t p, t;    /* p: the map of 2^i draws */
    memset(&p, 0, sizeof p);
    memset(j, 0, sizeof *j);
    for (int k = 0; k < 256; k++) {
        rng_t r = {{0, 0, 0, 0}};
        r.s[k / 64] = 1ull << (k % 64);
        (void)rng_u64(&r);
        memcpy(p.col[k], r.s, sizeof r.s);
        j->col[k][k / 64] = 1ull << (k % 64);    /* identity: 0 draws */
    }
    for (; n; n >>= 1) {
        if (n & 1) {
            jump_compose(&p, j, &t);
            *j = t;
        }
        if (n > 1) {
            jump_compose(&p, &p, &t);
            p = t;
        }
    }
}

void rng_jump_apply(const rng_jump_t *j, rng_t *r) { jump_vec(j, r->s, r->s); }

uint64_t rng_below(rng_t *r, uint64_t n) {
    if (n <= 1) return 0;
    __uint128_t m = (__uint128_t)rng_u64(r) * n;
    uint64_t l = (uint64_t)m;
    if (l < n) {
        uint64_t t = -n % n;
        while (l < t) {
            m = (__uint128_t)rng_u64(r) * n;
            l = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

float rng_uniform(rng_t *r) { return (float)(rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

double rng_normal_f64(uint64_t a, uint64_t b) {
    double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

float rng_normal(rng_t *r) {
    uint64_t a = rng_u64(r);
    uint64_t b = rng_u64(r);
    return (float)rng_normal_f64(a, b);
}

uint64_t rng_mix(uint64_t seed, uint64_t a, uint64_t b) {
    uint64_t x = seed;
    uint64_t h = splitmix64(&x);
    x = h ^ a;
    h = splitmix64(&x);
    x = h ^ b;
    return splitmix64(&x);
}

void rng_shuffle_u32(rng_t *r, uint32_t *idx, uint64_t n) {
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = rng_below(r, i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}
