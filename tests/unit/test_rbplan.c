/* rbplan (common/pipe/rbplan.h): the GPU rebalance plan and GPU-list parsing the
 * supervisor applies to `draftline rebalance --target-gpus L --drafter-gpus L`. The
 * expected actions follow from the rules in rbplan.h, written out per case: the issue's
 * scenario 1-1 <-> 2 targets sharing a GPU, a move to another GPU, a drafter count
 * change, a no-op, and every malformed list / out-of-range request. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/pipe/rbplan.h"

#include <string.h>

static void none(int *v) { for (int i = 0; i < RBPLAN_MAX; i++) v[i] = -1; }

static void test_parse(void **state) {
    (void)state;
    int g[RBPLAN_MAX];
    assert_int_equal(rbplan_parse_gpus("--target-gpus", "0", g, RBPLAN_MAX), 1);
    assert_int_equal(g[0], 0);
    assert_int_equal(rbplan_parse_gpus("--target-gpus", "0,0,1", g, RBPLAN_MAX), 3);
    assert_int_equal(g[0], 0); assert_int_equal(g[1], 0); assert_int_equal(g[2], 1);
    assert_int_equal(rbplan_parse_gpus("--drafter-gpus", "7,1023", g, RBPLAN_MAX), 2);
    assert_int_equal(g[1], 1023);
    /* each malformed list is refused, naming the flag */
    static const char *const bad[] = {"", ",", "0,", ",0", "0,,1", "a", "0,x", "-1", "1024", "0 ,1", "0;1", "1.5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(rbplan_parse_gpus("--target-gpus", bad[i], g, RBPLAN_MAX), DL_EINVAL);
        assert_non_null(strstr(dl_errmsg(), "--target-gpus"));
    }
    assert_non_null(strstr((rbplan_parse_gpus("--drafter-gpus", "", g, 4), dl_errmsg()), "empty GPU list"));
    assert_int_equal(rbplan_parse_gpus("--drafter-gpus", "0,1,2,3", g, 4), 4);
    assert_int_equal(rbplan_parse_gpus("--drafter-gpus", "0,1,2,3,4", g, 4), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "more than 4"));
    char buf[64];
    int l[3] = {0, 0, 12};
    assert_string_equal(rbplan_format_gpus(l, 3, buf, sizeof buf), "0,0,12");
    assert_string_equal(rbplan_format_gpus(l, 0, buf, sizeof buf), "");
    assert_string_equal(rbplan_format_gpus(l, 3, buf, 4), "0,0");   /* truncated, terminated */
}

/* 1-1 (target0 on GPU 0, drafter0 on GPU 1) -> 2 targets sharing GPU 0 -> back */
static void test_share_and_back(void **state) {
    (void)state;
    int ct[RBPLAN_MAX], cd[RBPLAN_MAX];
    none(ct); none(cd);
    ct[0] = 0; cd[0] = 1;
    rbplan_t p;
    int tg[2] = {0, 0}, dg[1] = {1};
    assert_int_equal(rbplan_make(ct, cd, tg, 2, dg, 1, &p), 0);
    assert_int_equal(p.n_targets, 2); assert_int_equal(p.n_drafters, 1);
    assert_int_equal(p.target[0], RBPLAN_KEEP);
    assert_int_equal(p.target[1], RBPLAN_START);
    assert_int_equal(p.target_gpu[1], 0);
    assert_int_equal(p.drafter[0], RBPLAN_KEEP);
    for (int i = 2; i < RBPLAN_MAX; i++) assert_int_equal(p.target[i], RBPLAN_NONE);
    for (int i = 1; i < RBPLAN_MAX; i++) assert_int_equal(p.drafter[i], RBPLAN_NONE);
    assert_int_equal(p.n_keep, 2); assert_int_equal(p.n_start, 1);
    assert_int_equal(p.n_move, 0); assert_int_equal(p.n_retire, 0);
    /* back: target1 (live on GPU 0) retires, the rest keeps running */
    ct[1] = 0;
    assert_int_equal(rbplan_make(ct, cd, tg, 1, dg, 1, &p), 0);
    assert_int_equal(p.target[0], RBPLAN_KEEP);
    assert_int_equal(p.target[1], RBPLAN_RETIRE);
    assert_int_equal(p.target_gpu[1], -1);
    assert_int_equal(p.n_retire, 1); assert_int_equal(p.n_start + p.n_move, 0);
    /* and a retired index comes back on another GPU: started there */
    ct[1] = -1;
    int tg2[2] = {0, 1};
    assert_int_equal(rbplan_make(ct, cd, tg2, 2, dg, 1, &p), 0);
    assert_int_equal(p.target[1], RBPLAN_START);
    assert_int_equal(p.target_gpu[1], 1);
}

static void test_move_and_drafters(void **state) {
    (void)state;
    int ct[RBPLAN_MAX], cd[RBPLAN_MAX];
    none(ct); none(cd);
    ct[0] = 0; ct[1] = 1; cd[0] = 2; cd[1] = 3;
    rbplan_t p;
    /* 0,1 -> 2,3  ==>  1,0,0 -> 3: target0 moves to 1, target1 moves to 0, target2
     * starts on 0; drafter0 moves to 3, drafter1 retires (drains) */
    int tg[3] = {1, 0, 0}, dg[1] = {3};
    assert_int_equal(rbplan_make(ct, cd, tg, 3, dg, 1, &p), 0);
    assert_int_equal(p.target[0], RBPLAN_MOVE); assert_int_equal(p.target_gpu[0], 1);
    assert_int_equal(p.target[1], RBPLAN_MOVE); assert_int_equal(p.target_gpu[1], 0);
    assert_int_equal(p.target[2], RBPLAN_START);
    assert_int_equal(p.drafter[0], RBPLAN_MOVE); assert_int_equal(p.drafter_gpu[0], 3);
    assert_int_equal(p.drafter[1], RBPLAN_RETIRE);
    assert_int_equal(p.n_move, 3); assert_int_equal(p.n_start, 1); assert_int_equal(p.n_retire, 1);
    assert_int_equal(p.n_keep, 0);
    /* the same placement again: keep only */
    int tk[2] = {0, 1}, dk[2] = {2, 3};
    assert_int_equal(rbplan_make(ct, cd, tk, 2, dk, 2, &p), 0);
    assert_int_equal(p.n_keep, 4);
    assert_int_equal(p.n_start + p.n_move + p.n_retire, 0);
}

static void test_refused(void **state) {
    (void)state;
    int ct[RBPLAN_MAX], cd[RBPLAN_MAX], g[RBPLAN_MAX + 1];
    none(ct); none(cd);
    memset(g, 0, sizeof g);
    ct[0] = 0; cd[0] = 1;
    rbplan_t p;
    memset(&p, 0x5a, sizeof p);
    rbplan_t before = p;
    assert_int_equal(rbplan_make(ct, cd, g, 0, g, 1, &p), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "target"));
    assert_int_equal(rbplan_make(ct, cd, g, 1, g, 0, &p), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "drafter"));
    assert_int_equal(rbplan_make(ct, cd, g, RBPLAN_MAX + 1, g, 1, &p), DL_EINVAL);
    int neg[1] = {-1}, big[1] = {RBPLAN_MAX_GPU + 1};
    assert_int_equal(rbplan_make(ct, cd, neg, 1, g, 1, &p), DL_EINVAL);
    assert_int_equal(rbplan_make(ct, cd, g, 1, big, 1, &p), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "out of range"));
    assert_memory_equal(&p, &before, sizeof p);   /* a refused request leaves the plan alone */
    assert_int_equal(rbplan_make(ct, cd, g, RBPLAN_MAX, g, RBPLAN_MAX, &p), 0);
    assert_int_equal(p.n_start, 2 * RBPLAN_MAX - 2);
    assert_string_equal(rbplan_action_name(RBPLAN_MOVE), "move");
    assert_string_equal(rbplan_action_name(RBPLAN_NONE), "none");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_share_and_back),
        cmocka_unit_test(test_move_and_drafters),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
