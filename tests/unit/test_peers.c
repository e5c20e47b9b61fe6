/* common/pipe/peers: a stage's peer registry (add on hello, a new incarnation
 * replaces the old one and is reported, liveness, lookup by id and stage id, full). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/pipe/peers.h"

#include <stdio.h>
#include <string.h>

static void test_peers_hello_and_restart(void **state) {
    (void)state;
    static peers_t r;
    peers_init(&r);
    assert_int_equal(peers_find(&r, "target0"), -1);
    int a = peers_add(&r, "target0");
    int b = peers_add(&r, "target1");
    assert_int_equal(a, 0);
    assert_int_equal(b, 1);
    assert_int_equal(peers_add(&r, "target0"), a);      /* known id: same index */
    assert_int_equal(r.p[a].incarnation, 0);
    assert_int_equal(r.p[a].alive, 1);
    uint64_t old = 99;
    assert_int_equal(peers_hello(&r, a, 200, 1, &old), PEERS_NEW);
    assert_int_equal(old, 0);
    assert_int_equal(peers_hello(&r, a, 200, 1, &old), PEERS_SAME);
    assert_int_equal(old, 1);
    /* dead, then back with a new incarnation under the same bus id */
    r.p[a].alive = 0;
    assert_int_equal(peers_alive(&r), 1);
    assert_int_equal(peers_hello(&r, a, 200, 3, &old), PEERS_RESTARTED);
    assert_int_equal(old, 1);
    assert_int_equal(r.p[a].incarnation, 3);
    assert_int_equal(r.p[a].alive, 1);
    assert_int_equal(peers_find(&r, "target0"), a);      /* the index is kept */
    assert_int_equal(peers_hello(&r, b, 201, 2, NULL), PEERS_NEW);
    assert_int_equal(peers_by_stage(&r, 201), b);
    assert_int_equal(peers_by_stage(&r, 200), a);
    assert_int_equal(peers_by_stage(&r, 202), -1);
    assert_int_equal(peers_alive(&r), 2);
}

static void test_peers_full_and_bad_id(void **state) {
    (void)state;
    static peers_t r;
    peers_init(&r);
    char id[32];
    for (int i = 0; i < PEERS_MAX; i++) {
        snprintf(id, sizeof id, "p%d", i);
        assert_int_equal(peers_add(&r, id), i);
    }
    assert_int_equal(peers_add(&r, "one-more"), -1);
    assert_int_equal(peers_add(&r, "p7"), 7);           /* known ids still resolve */
    peers_init(&r);
    char longid[BUS_ID_MAX + 2];
    memset(longid, 'x', sizeof longid - 1);
    longid[sizeof longid - 1] = 0;
    assert_int_equal(peers_add(&r, longid), -1);
    assert_int_equal(r.n, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peers_hello_and_restart),
        cmocka_unit_test(test_peers_full_and_bad_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
