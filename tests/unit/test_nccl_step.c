/* common/mem/nccl.h, the step communicator's rules (pure, both builds): who is rank what
 * (stage-id order, whatever the order the drafters said hello in), when the optimizer
 * makes a new generation (a new incarnation, a death, a rebalance; not a repeated
 * hello), which id a drafter takes and which it drops as stale or malformed; and, in a
 * CPU build, that the NCCL calls added for it fail with DL_ENOTSUP. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/mem/nccl.h"

#include <string.h>

static void test_ranks_in_stage_id_order(void **state) {
    (void)state;
    nccl_member_t cand[] = {{103, 1}, {101, 2}, {102, 1}};
    nccl_members_t s;
    assert_int_equal(nccl_step_members(cand, 3, &s), 0);
    assert_int_equal(s.n, 3);
    assert_int_equal(s.m[0].stage_id, 101);
    assert_int_equal(s.m[1].stage_id, 102);
    assert_int_equal(s.m[2].stage_id, 103);
    assert_int_equal(nccl_step_rank(&s, 101, 2), 1);
    assert_int_equal(nccl_step_rank(&s, 102, 1), 2);
    assert_int_equal(nccl_step_rank(&s, 103, 1), 3);
    assert_int_equal(nccl_step_rank(&s, 101, 1), -1);   /* an earlier incarnation: not a member */
    assert_int_equal(nccl_step_rank(&s, 104, 1), -1);
    assert_int_equal(nccl_step_rank(NULL, 101, 2), -1);
    /* a stage listed twice keeps its newest incarnation */
    nccl_member_t dup[] = {{101, 1}, {101, 3}, {101, 2}};
    assert_int_equal(nccl_step_members(dup, 3, &s), 0);
    assert_int_equal(s.n, 1);
    assert_int_equal(nccl_step_rank(&s, 101, 3), 1);
    /* nobody on another node: an empty set, no communicator */
    assert_int_equal(nccl_step_members(NULL, 0, &s), 0);
    assert_int_equal(s.n, 0);
    assert_int_equal(nccl_step_members(NULL, 2, &s), DL_EINVAL);
    assert_int_equal(nccl_step_members(cand, -1, &s), DL_EINVAL);
}

static void test_too_many_members(void **state) {
    (void)state;
    nccl_member_t cand[NCCL_STEP_MEMBERS_MAX + 2];
    for (int i = 0; i < NCCL_STEP_MEMBERS_MAX + 2; i++) cand[i] = (nccl_member_t){(uint32_t)(200 - i), 1};
    nccl_members_t s;
    assert_int_equal(nccl_step_members(cand, NCCL_STEP_MEMBERS_MAX + 2, &s), DL_ERANGE);
    assert_int_equal(s.n, NCCL_STEP_MEMBERS_MAX);
    for (int j = 1; j < s.n; j++) assert_true(s.m[j - 1].stage_id < s.m[j].stage_id);
}

/* The optimizer's rebuild rule: a new set (of live remote drafters) iff it differs. */
static void test_when_to_rebuild(void **state) {
    (void)state;
    nccl_member_t a[] = {{100, 1}, {101, 1}};
    nccl_member_t hello_again[] = {{101, 1}, {100, 1}};         /* repeated hellos, other order */
    nccl_member_t restarted[] = {{100, 1}, {101, 2}};           /* drafter 1's new incarnation */
    nccl_member_t died[] = {{100, 1}};                          /* drafter 1 dead or retired */
    nccl_member_t joined[] = {{100, 1}, {101, 1}, {102, 1}};    /* a rebalance added one */
    nccl_members_t cur, s;
    assert_int_equal(nccl_step_members(a, 2, &cur), 0);
    assert_int_equal(nccl_step_members(hello_again, 2, &s), 0);
    assert_int_equal(nccl_step_same(&cur, &s), 1);
    assert_int_equal(nccl_step_members(restarted, 2, &s), 0);
    assert_int_equal(nccl_step_same(&cur, &s), 0);
    assert_int_equal(nccl_step_members(died, 1, &s), 0);
    assert_int_equal(nccl_step_same(&cur, &s), 0);
    assert_int_equal(nccl_step_members(joined, 3, &s), 0);
    assert_int_equal(nccl_step_same(&cur, &s), 0);
    /* the optimizer forces a new generation after a failure with n = -1 */
    s = cur;
    s.n = -1;
    assert_int_equal(nccl_step_same(&cur, &s), 0);
}

/* A drafter's take-or-drop of an nccl_id (me = 101, incarnation 3). */
static void test_id_fresh_or_stale(void **state) {
    (void)state;
    /* the first id of optimizer incarnation 1: taken */
    assert_int_equal(nccl_step_id_fresh(101, 3, 0, 101, 3, 1, 3, 2), 1);
    /* a later id of the same optimizer incarnation (arrival order = making order) */
    assert_int_equal(nccl_step_id_fresh(101, 3, 1, 101, 3, 1, 2, 1), 1);
    /* a restarted optimizer's id: taken; then one of the old optimizer: stale */
    assert_int_equal(nccl_step_id_fresh(101, 3, 1, 101, 3, 2, 2, 1), 1);
    assert_int_equal(nccl_step_id_fresh(101, 3, 2, 101, 3, 1, 2, 1), 0);
    /* for an earlier incarnation of this drafter, or another drafter: stale */
    assert_int_equal(nccl_step_id_fresh(101, 3, 1, 101, 2, 1, 2, 1), 0);
    assert_int_equal(nccl_step_id_fresh(101, 3, 1, 102, 3, 1, 2, 1), 0);
    /* malformed ranks: rank 0 is the optimizer's, rank < nranks, 2..64 ranks */
    assert_int_equal(nccl_step_id_fresh(101, 3, 0, 101, 3, 1, 2, 0), DL_EINVAL);
    assert_int_equal(nccl_step_id_fresh(101, 3, 0, 101, 3, 1, 2, 2), DL_EINVAL);
    assert_int_equal(nccl_step_id_fresh(101, 3, 0, 101, 3, 1, 1, 0), DL_EINVAL);
    assert_int_equal(nccl_step_id_fresh(101, 3, 0, 101, 3, 1, NCCL_PAIR_RANKS_MAX + 1, 1), DL_EINVAL);
    assert_int_equal(nccl_step_id_fresh(101, 3, 0, 101, 3, 1, NCCL_PAIR_RANKS_MAX, NCCL_PAIR_RANKS_MAX - 1), 1);
}

/* What a CPU build says for the calls the step communicator adds (CUDA builds: the
 * one-GPU test tests/gpu/test_nccl_step.c runs them). */
static void test_cpu_build_refuses(void **state) {
    (void)state;
    if (nccl_available()) skip();
    nccl_pair_t *p = (nccl_pair_t *)(uintptr_t)1;   /* set to NULL by the call */
    assert_int_equal(nccl_pair_split(NULL, &p), DL_ENOTSUP);
    assert_null(p);
    assert_int_equal(nccl_pair_bcast(NULL, NULL, 0, 0, NULL), DL_ENOTSUP);
    void *ev = (void *)(uintptr_t)1;
    assert_int_equal(nccl_mark_new(&ev), DL_ENOTSUP);
    assert_null(ev);
    assert_int_equal(nccl_mark_record(NULL, NULL), DL_ENOTSUP);
    assert_int_equal(nccl_mark_done(NULL), DL_ENOTSUP);
    nccl_mark_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranks_in_stage_id_order),
        cmocka_unit_test(test_too_many_members),
        cmocka_unit_test(test_when_to_rebuild),
        cmocka_unit_test(test_id_fresh_or_stale),
        cmocka_unit_test(test_cpu_build_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
