/* The drafter's parallel seeded init (common/model/drafter.c, init_weights) against the
 * sequential loop it replaced, bitwise, on a drafter with odd sizes whose normal stream
 * crosses DRAFTER_INIT_CHUNK boundaries inside tensors (checked); rng_jump_t against
 * n sequential rng_u64 draws; drafter_new_opts no_init: zeros, same layout; layout_only:
 * the same tensor table, no buffer, drafter_init_master bitwise the init. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jump),
        cmocka_unit_test(test_parallel_init_bitwise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
