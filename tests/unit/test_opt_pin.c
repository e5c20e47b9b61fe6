/* The checkpoint writer's pinning in pieces (optimizer/ckpt_write.c, ockw_host_pin /
 * ockw_host_unpin) with dev_host_register / dev_host_unregister / dev_set replaced by
 * recorders here (no GPU needed; the pointers are never touched): a pin that fails at
 * piece k unregisters exactly pieces 0..k-1 and nothing else, a pin of unaligned memory
 * (one piece) that fails unregisters nothing, a full pin is undone piece by piece, and a
 * stop undoes what was done. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define dev_host_register t_register
#define dev_host_unregister t_unregister
#define dev_set t_dev_set
#include "optimizer/ckpt_write.c"

static int fail_at = -1, n_reg, n_unreg, stop_after = -1;
static uintptr_t reg[16], unreg[16];
static atomic_int *stop_hold;   /* set to OCKW_PIN_STOP once piece stop_after is registered */

int t_dev_set(int gpu) { (void)gpu; return 0; }

int t_register(void *p, size_t bytes) {
    (void)bytes;
    if (n_reg == fail_at) return dl_seterr(DL_ECUDA, "test: register refused");
    if (n_reg < 16) reg[n_reg] = (uintptr_t)p;
    if (n_reg == stop_after && stop_hold) atomic_store(stop_hold, OCKW_PIN_STOP);
    n_reg++;
    return 0;
}

void t_unregister(void *p) {
    if (n_unreg < 16) unreg[n_unreg] = (uintptr_t)p;
    n_unreg++;
}

static int pin(uintptr_t p, size_t bytes, int fail) {
    fail_at = fail, n_reg = n_unreg = 0;
    return ockw_host_pin((float *)p, bytes, 0, "test buffer", NULL);
}

static void test_pin_pieces(void **state) {
    (void)state;
    const uintptr_t a = (uintptr_t)1 << 32;   /* page-aligned: pieces of OCKW_PIN_CHUNK */
    const size_t bytes = 3 * (size_t)OCKW_PIN_CHUNK + 100;
    /* all pieces, then undone piece by piece */
    assert_int_equal(pin(a, bytes, -1), 1);
    assert_int_equal(n_reg, 4);
    for (int k = 0; k < 4; k++) assert_true(reg[k] == a + (uintptr_t)k * OCKW_PIN_CHUNK);
    ockw_host_unpin((float *)a, bytes);
    assert_int_equal(n_unreg, 4);
    for (int k = 0; k < 4; k++) assert_true(unreg[k] == a + (uintptr_t)k * OCKW_PIN_CHUNK);
    /* piece k refused: pieces 0..k-1 undone, nothing else */
    for (int k = 0; k < 4; k++) {
        assert_int_equal(pin(a, bytes, k), 0);
        assert_int_equal(n_reg, k);
        assert_int_equal(n_unreg, k);
        for (int i = 0; i < k; i++) assert_true(unreg[i] == a + (uintptr_t)i * OCKW_PIN_CHUNK);
    }
    /* unaligned memory: one piece; refused, nothing was registered, nothing undone */
    assert_int_equal(pin(a + 4, bytes, 0), 0);
    assert_int_equal(n_reg, 0);
    assert_int_equal(n_unreg, 0);
    assert_int_equal(pin(a + 4, bytes, -1), 1);
    assert_int_equal(n_reg, 1);
    ockw_host_unpin((float *)(a + 4), bytes);
    assert_int_equal(n_unreg, 1);
    assert_true(unreg[0] == a + 4);
    /* gpu < 0 or NULL: nothing */
    fail_at = -1, n_reg = n_unreg = 0;
    assert_int_equal(ockw_host_pin((float *)a, bytes, -1, "test buffer", NULL), 0);
    assert_int_equal(ockw_host_pin(NULL, bytes, 0, "test buffer", NULL), 0);
    ockw_host_unpin(NULL, bytes);
    assert_int_equal(n_reg + n_unreg, 0);
}

/* A stop (the writer destroyed): before the first piece nothing is registered; after
 * piece 1 the two pieces are undone; either way 0 (pageable) and no warning line needed. */
static void test_pin_stop(void **state) {
    (void)state;
    const uintptr_t a = (uintptr_t)1 << 32;
    const size_t bytes = 3 * (size_t)OCKW_PIN_CHUNK + 100;
    atomic_int h;
    atomic_store(&h, OCKW_PIN_STOP);
    fail_at = -1, n_reg = n_unreg = 0;
    assert_int_equal(ockw_host_pin((float *)a, bytes, 0, "test buffer", &h), 0);
    assert_int_equal(n_reg + n_unreg, 0);
    atomic_store(&h, OCKW_PIN_RUN);
    stop_hold = &h, stop_after = 1, n_reg = n_unreg = 0;
    assert_int_equal(ockw_host_pin((float *)a, bytes, 0, "test buffer", &h), 0);
    assert_int_equal(n_reg, 2);
    assert_int_equal(n_unreg, 2);
    assert_true(unreg[0] == a && unreg[1] == a + OCKW_PIN_CHUNK);
    stop_hold = NULL, stop_after = -1;
}

int main(void) {
    log_init("optimizer", LOG_INFO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pin_pieces),
        cmocka_unit_test(test_pin_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
