/* The drafter's parallel seeded init (common/model/drafter.c, init_weights) against the
 * sequential loop it replaced, bitwise, on a drafter with odd sizes whose normal stream
 * crosses DRAFTER_INIT_CHUNK boundaries inside tensors (checked); rng_jump_t against
 * n sequential rng_u64 draws; drafter_new_opts no_init: zeros, same layout; layout_only:
 * the same tensor table, no buffer, drafter_init_master bitwise the init; the device
 * path of drafter_init_master_on (near-midpoint normals recomputed on the host) through a
 * fake device on the CPU, and f32_near_midpoint itself. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "common/base/f32near.h"
#include "common/base/rng.h"
#include "common/model/drafter.h"
#include "common/ops/ops.h"

static void test_jump(void **state) {
    (void)state;
    uint64_t ns[] = {0, 1, 2, 63, 64, 1000, 131072, 131077};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        rng_t a, b;
        rng_seed(&a, 12345 + k);
        b = a;
        for (uint64_t i = 0; i < ns[k]; i++) (void)rng_u64(&a);
        rng_jump_t *j = malloc(sizeof *j);
        rng_jump_make(j, ns[k]);
        rng_jump_apply(j, &b);
        free(j);
        assert_memory_equal(a.s, b.s, sizeof a.s);
        assert_true(rng_u64(&a) == rng_u64(&b));
    }
}

/* odd sizes: about 4.6 chunks of normals over 2 layers */
static void odd_config(drafter_config_t *c) {
    drafter_config_defaults(c);
    c->D = 100, c->H = 5, c->Hkv = 1, c->hd = 20, c->F = 333, c->V = 37;
    c->n_target_layers = 8, c->max_position_embeddings = 64, c->rms_eps = 1e-6f;
    c->rope.theta = 10000.0;
    c->n_layers = 2, c->n_feat = 3;
    c->target_layer_ids[0] = 1, c->target_layer_ids[1] = 3, c->target_layer_ids[2] = 5;
    c->B = 4, c->mask_token_id = 1;
}

static void test_parallel_init_bitwise(void **state) {
    (void)state;
    ops_ctx_t c;
    ops_cpu_init(&c, 0);
    drafter_config_t cfg;
    odd_config(&cfg);
    float *emb = calloc((size_t)cfg.V * cfg.D, sizeof(float));
    drafter_t *d = NULL;
    assert_int_equal(drafter_new(&c, &cfg, emb, emb, 8, 2, 77, &d), 0);
    size_t P = drafter_n_params(d);
    float *ref = malloc(P * sizeof(float));
    memset(ref, 0xff, P * sizeof(float));
    /* the sequential loop of the old drafter_new */
    rng_t r;
    rng_seed(&r, 77);
    size_t g = 0;
    int mid = 0, n2 = 0;
    for (int i = 0; i < drafter_n_tensors(d); i++) {
        const drafter_tensor_t *t = drafter_tensor(d, i);
        if (t->n_dims == 2) {
            n2++;
            /* a chunk boundary strictly inside this tensor */
            size_t next = (g / DRAFTER_INIT_CHUNK + 1) * DRAFTER_INIT_CHUNK;
            if (next > g && next < g + t->numel) mid++;
            g += t->numel;
        }
        for (size_t e = 0; e < t->numel; e++) ref[t->offset + e] = t->n_dims == 2 ? 0.02f * rng_normal(&r) : 1.0f;
    }
    assert_true(n2 >= 10);
    assert_true(g > 4 * DRAFTER_INIT_CHUNK);
    assert_true(mid >= 3);
    assert_memory_equal(drafter_master(d), ref, P * sizeof(float));
    drafter_destroy(&d);

    /* no_init: the same layout, zeros */
    drafter_new_opts_t o = {.no_init = 1};
    assert_int_equal(drafter_new_opts(&c, &cfg, emb, emb, 8, 2, 77, &o, &d), 0);
    assert_int_equal(drafter_n_params(d), P);
    const float *m = drafter_master(d);
    for (size_t i = 0; i < P; i++) assert_true(m[i] == 0.0f);
    drafter_upload_master(d, ref);
    assert_memory_equal(drafter_master(d), ref, P * sizeof(float));
    drafter_destroy(&d);

    /* layout_only (the optimizer's): the same tensor table, no buffer; drafter_init_master
     * writes the same init into the caller's vector */
    drafter_t *full = NULL;
    assert_int_equal(drafter_new(&c, &cfg, emb, emb, 8, 2, 77, &full), 0);
    drafter_new_opts_t lo = {.layout_only = 1};
    assert_int_equal(drafter_new_opts(&c, &cfg, emb, emb, 1, 1, 77, &lo, &d), 0);
    assert_int_equal(drafter_n_params(d), P);
    assert_int_equal(drafter_n_tensors(d), drafter_n_tensors(full));
    for (int i = 0; i < drafter_n_tensors(d); i++)
        assert_memory_equal(drafter_tensor(d, i), drafter_tensor(full, i), sizeof(drafter_tensor_t));
    assert_null(drafter_master(d));
    assert_null(drafter_grads(d));
    float *h = malloc(P * sizeof(float));
    memset(h, 0xff, P * sizeof(float));
    assert_int_equal(drafter_init_master(d, 77, h), 0);
    assert_memory_equal(h, ref, P * sizeof(float));
    drafter_destroy(&d);
    drafter_destroy(&full);
    free(h);
    free(ref);
    free(emb);
    ops_ctx_destroy(&c);
}

/* f32_near_midpoint (common/base/f32near.h) on values built from the floats around
 * them: exactly a float, exactly a midpoint, one double ulp either side, a quarter of the
 * way; then the property the device init relies on, over 1M of the stream's doubles: any
 * value within 64 double ulps of v that rounds to another float than v is flagged. */
static void test_near_midpoint(void **state) {
    (void)state;
    float fs[] = {1.0f, 0.75f, 3.0e-3f, 1.9e-24f, 123456.7f, 1.0e30f, 0x1p-140f};
    for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
        for (int sg = -1; sg <= 1; sg += 2) {
            float f = fs[k] * (float)sg;
            double lo = f, hi = nextafterf(f, f > 0 ? INFINITY : -INFINITY);
            double m = (lo + hi) / 2;
            assert_false(f32_near_midpoint(lo, F32NEAR_REL));
            assert_true(f32_near_midpoint(m, F32NEAR_REL));
            assert_true(f32_near_midpoint(nextafter(m, 0), F32NEAR_REL));
            assert_true(f32_near_midpoint(nextafter(m, 2 * m), F32NEAR_REL));
            assert_false(f32_near_midpoint(lo + (hi - lo) / 4, F32NEAR_REL));
            assert_true(f32_near_midpoint(lo + (hi - lo) / 4, 1.0));   /* 1.0: everything */
        }
    }
    /* both sides of a binade boundary 2^k: below it the floats are twice as dense (but
     * among the subnormals, k <= -126) */
    int ks[] = {-140, -126, -60, -1, 0, 1, 23, 24, 100};
    for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
        for (int sg = -1; sg <= 1; sg += 2) {
            double hi = sg * ldexp(1.0, ks[k]), lo = nextafterf((float)hi, 0.0f);
            double up = nextafterf((float)hi, (float)(2 * hi)), below = (lo + hi) / 2, above = (hi + up) / 2;
            assert_true(f32_near_midpoint(below, F32NEAR_REL));
            assert_true(f32_near_midpoint(above, F32NEAR_REL));
            assert_false(f32_near_midpoint(hi, F32NEAR_REL));
            assert_false(f32_near_midpoint(lo + (hi - lo) / 4, F32NEAR_REL));
            assert_false(f32_near_midpoint(hi + (up - hi) / 4, F32NEAR_REL));
        }
    }
    assert_true(f32_near_midpoint(0x1p-150, F32NEAR_REL));   /* between 0 and the least subnormal */
    assert_false(f32_near_midpoint(0.0, 1.0));
    assert_false(f32_near_midpoint(NAN, 1.0));
    /* against brute force over 1M of the stream's doubles: flagged exactly when a value
     * rel * |v| away on either side rounds to another float (rel 2^-40, and 2^-30 where
     * ~1,000 times more are flagged) */
    rng_t r;
    rng_seed(&r, 5);
    int flagged = 0, flagged30 = 0;
    for (int i = 0; i < 1000000; i++) {
        uint64_t a = rng_u64(&r), b = rng_u64(&r);
        double v = rng_normal_f64(a, b), av = fabs(v);
        for (int w = 0; w < 2; w++) {
            double rel = w ? 0x1p-30 : F32NEAR_REL;
            int near = f32_near_midpoint(v, rel);
            int brute = (float)(v - rel * av) != (float)v || (float)(v + rel * av) != (float)v;
            assert_int_equal(near, brute);
            if (w) flagged30 += near; else flagged += near;
        }
    }
    /* expected ~1M * 2^-15.5 = 22 flagged at 2^-40: far below the device list's room
     * (G * 2^-13 + 4096, drafter.c) */
    assert_true(flagged >= 1 && flagged < 200);
    assert_true(flagged30 > 10000 && flagged30 < 60000);
}

/* A fake device for drafter_init_master_on's device path on the CPU: the CPU backend's
 * normal_init (ops/cpu/init.c), then every value it listed written one float ulp off (as a
 * device whose log / cos rounded it the other way), so the host must rewrite exactly
 * those. */
static ops_impl_t g_fake;
static const ops_impl_t *g_cpu_impl;
static int g_fake_overflow;   /* the fake says its list overflowed */
static int fake_normal_init(const ops_ctx_t *c, float *dst, const ops_normal_seg_t *seg, int n_seg,
                            const uint64_t *states, size_t n_chunks, size_t chunk, uint64_t G, float scale,
                            double near_rel, ops_normal_near_t *near, size_t near_cap, size_t *n_near) {
    int rc = g_cpu_impl->normal_init(c, dst, seg, n_seg, states, n_chunks, chunk, G, scale, near_rel, near,
                                     near_cap, n_near);
    for (size_t j = 0; j < *n_near && j < near_cap; j++)
        dst[near[j].index] = near[j].value = nextafterf(near[j].value, INFINITY);
    if (g_fake_overflow) *n_near = near_cap + 1, rc = DL_ERANGE;
    return rc;
}

static void test_init_on_device_path(void **state) {
    (void)state;
    ops_ctx_t cpu;
    ops_cpu_init(&cpu, 0);
    g_cpu_impl = cpu.impl;
    g_fake = *cpu.impl;
    g_fake.normal_init = fake_normal_init;
    ops_ctx_t fake = cpu;
    fake.backend = OPS_CUDA;   /* not the CPU: drafter_init_master_on takes the device path */
    fake.impl = &g_fake;
    drafter_config_t cfg;
    odd_config(&cfg);
    static const float emb[1] = {0};
    drafter_t *d = NULL;
    drafter_new_opts_t lo = {.layout_only = 1};
    assert_int_equal(drafter_new_opts(&cpu, &cfg, emb, emb, 1, 1, 77, &lo, &d), 0);
    size_t P = drafter_n_params(d);
    float *ref = malloc(P * sizeof(float)), *got = malloc(P * sizeof(float));
    assert_int_equal(drafter_init_master(d, 77, ref), 0);
    double rels[] = {0, 1e-9, 1.0};   /* the default margin; a wide one; every normal */
    for (int k = 0; k < 3; k++) {
        memset(got, 0xff, P * sizeof(float));
        drafter_init_info_t ii;
        assert_int_equal(drafter_init_master_on(d, 77, &fake, got, rels[k], &ii), 0);
        assert_memory_equal(got, ref, P * sizeof(float));
        assert_int_equal(ii.on_device, 1);
        assert_true(ii.normals > 4 * DRAFTER_INIT_CHUNK && ii.normals < P);
        assert_true(ii.fixed == ii.near);   /* the fake got every flagged one wrong */
        if (k == 1) assert_true(ii.near > 100);
        if (k == 2) assert_true(ii.near <= ii.normals && ii.near >= ii.normals - ii.normals / 1000);
    }
    /* the device's list overflows: the host init, uploaded, and said */
    g_fake_overflow = 1;
    memset(got, 0xff, P * sizeof(float));
    drafter_init_info_t io;
    assert_int_equal(drafter_init_master_on(d, 77, &fake, got, 0, &io), 0);
    g_fake_overflow = 0;
    assert_memory_equal(got, ref, P * sizeof(float));
    assert_int_equal(io.on_device, 0);
    assert_int_equal(io.overflow, 1);
    /* the CPU backend: the host loop itself */
    memset(got, 0xff, P * sizeof(float));
    assert_int_equal(drafter_init_master_on(d, 77, &cpu, got, 0, NULL), 0);
    assert_memory_equal(got, ref, P * sizeof(float));
    free(ref);
    free(got);
    drafter_destroy(&d);
    ops_ctx_destroy(&cpu);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jump),
        cmocka_unit_test(test_parallel_init_bitwise),
        cmocka_unit_test(test_near_midpoint),
        cmocka_unit_test(test_init_on_device_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
