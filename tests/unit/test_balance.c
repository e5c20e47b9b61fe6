/* balance (common/pipe/balance.h): the `--balance auto` planner. Expected splits are
 * worked out by hand from pred(N, M) = min(N x target_rate, M x drafter_rate) over the
 * splits N + M = units with 1 <= M <= N: the bad start (1 target + 3 drafters
 * with slow targets), a balanced run that stays, a gain under the threshold, the
 * drafters as the limit, neither role busy, unknown rates, and invalid input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/pipe/balance.h"

#include <math.h>
#include <string.h>

static balance_in_t in_of(int n, int m, double rt, double rd, double bt, double bd) {
    return (balance_in_t){.n_targets = n, .n_drafters = m, .units = n + m, .target_rate = rt,
                          .drafter_rate = rd, .target_busy = bt, .drafter_busy = bd, .min_gain = 0.15,
                          .busy_floor = 0.5};
}

static void test_slow_targets_move(void **state) {
    (void)state;
    balance_plan_t p;
    /* 1+3, targets 100 tok/s, drafters 300: pred 1+3 = 100; 2+2 = min(200, 600) = 200;
     * 3+1 = min(300, 300) = 300 (the best) */
    balance_in_t in = in_of(1, 3, 100, 300, 0.98, 0.30);
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_MOVE);
    assert_int_equal(p.n_targets, 3);
    assert_int_equal(p.n_drafters, 1);
    assert_true(fabs(p.now_pred - 100) < 1e-9 && fabs(p.best_pred - 300) < 1e-9);
    assert_non_null(strstr(p.why, "1+3 predicts 100 tok/s (targets limit), 3+1 300 tok/s"));
    /* the start: 1 target feeding 1 of 3 drafters (2 idle): pred 1+3 = min(100,
     * 1 x 300) = 100, whatever the drafters' count */
    in = in_of(1, 3, 100, 50, 0.98, 0.30);
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_true(fabs(p.now_pred - 50) < 1e-9);    /* min(100, 1 x 50): the one fed drafter */
    assert_int_equal(p.verdict, BALANCE_MOVE);    /* 2+2 = min(200, 100) = 100 */
    assert_int_equal(p.n_targets, 2);
    in = in_of(1, 3, 100, 300, 0.98, 0.30);
    /* drafters 150: 2+2 = min(200, 300) = 200 beats 3+1 = min(300, 150) = 150 */
    in.drafter_rate = 150;
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_MOVE);
    assert_int_equal(p.n_targets, 2);
    assert_int_equal(p.n_drafters, 2);
}

/* CPU runs: the cores cap every prediction. 2+2 with targets 160 and drafters 400 tok/s per
 * busy s: 2+2 = min(320, 800) = 320, 3+1 = min(480, 400) = 400 (+25%: a move); with the
 * cores allowing 330 tok/s both are at most 330 (+3%): kept, the cores named. */
static void test_cpu_cap(void **state) {
    (void)state;
    balance_plan_t p;
    balance_in_t in = in_of(2, 2, 160, 400, 0.95, 0.6);
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_MOVE);
    assert_int_equal(p.n_targets, 3);
    in.cpu_cap = 330;
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_KEEP);
    assert_int_equal(p.n_targets, 2);
    assert_true(fabs(p.now_pred - 320) < 1e-9 && fabs(p.best_pred - 330) < 1e-9);
    assert_non_null(strstr(p.why, "the cores allow 330 tok/s"));
    /* a cap above every prediction changes nothing */
    in.cpu_cap = 1000;
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_MOVE);
    assert_true(fabs(p.best_pred - 400) < 1e-9);
    /* the cap is the limit named when it binds the live split */
    in = in_of(1, 3, 100, 300, 0.98, 0.30);
    in.cpu_cap = 80;
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_KEEP);
    assert_non_null(strstr(p.why, "(the cores limit)"));
}

static void test_keep(void **state) {
    (void)state;
    balance_plan_t p;
    /* 2+2 with equal rates is the best of 2+2 and 3+1 */
    balance_in_t in = in_of(2, 2, 100, 100, 0.9, 0.9);
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_KEEP);
    assert_int_equal(p.n_targets, 2);
    assert_non_null(strstr(p.why, "(the best)"));
    /* 3+3, targets 100, drafters 110: 3+3 = 300, 4+2 = min(400, 220) = 220: keep */
    in = in_of(3, 3, 100, 110, 0.9, 0.8);
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_KEEP);
    /* 2+2 with targets 100 and drafters 220: 2+2 = 200, 3+1 = min(300, 220) = 220, a 10%
     * gain, under the 15% threshold: keep */
    in = in_of(2, 2, 100, 220, 0.9, 0.5);
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_KEEP);
    assert_int_equal(p.n_targets, 2);
    assert_true(fabs(p.best_pred - 220) < 1e-9);
    assert_non_null(strstr(p.why, "gain below the threshold"));
}

static void test_drafters_limit(void **state) {
    (void)state;
    balance_plan_t p;
    /* 5+3 with drafters at 100 and targets at 400: 5+3 = 300; 4+4 = min(1600, 400) = 400 */
    balance_in_t in = in_of(5, 3, 400, 100, 0.4, 0.99);
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_MOVE);
    assert_int_equal(p.n_targets, 4);
    assert_int_equal(p.n_drafters, 4);
    assert_non_null(strstr(p.why, "(drafters limit)"));
}

static void test_no_decision(void **state) {
    (void)state;
    balance_plan_t p;
    balance_in_t in = in_of(1, 3, 100, 300, 0.2, 0.1);
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_NOT_LIMITED);
    assert_int_equal(p.n_targets, 1);
    in = in_of(1, 3, NAN, 300, 0.9, 0.9);
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_UNKNOWN);
    in.target_rate = 0;
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_UNKNOWN);
    /* one unit each: 1+1 is the only split */
    in = in_of(1, 1, 10, 1000, 0.9, 0.1);
    assert_int_equal(balance_plan(&in, &p), 0);
    assert_int_equal(p.verdict, BALANCE_KEEP);
}

static void test_invalid(void **state) {
    (void)state;
    balance_plan_t p;
    balance_in_t in = in_of(1, 3, 100, 300, 0.9, 0.9);
    in.units = 5;
    assert_int_equal(balance_plan(&in, &p), DL_EINVAL);
    in = in_of(0, 3, 100, 300, 0.9, 0.9);
    assert_int_equal(balance_plan(&in, &p), DL_EINVAL);
    in = in_of(1, 3, 100, 300, 0.9, 0.9);
    in.min_gain = -1;
    assert_int_equal(balance_plan(&in, &p), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "balance: split 1+3"));
    assert_string_equal(balance_verdict_name(BALANCE_MOVE), "move");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slow_targets_move), cmocka_unit_test(test_cpu_cap),
        cmocka_unit_test(test_keep),
        cmocka_unit_test(test_drafters_limit),    cmocka_unit_test(test_no_decision),
        cmocka_unit_test(test_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
