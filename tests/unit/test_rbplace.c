/* Placements that name nodes (docs/MULTINODE.md sections 1 and 6): the parser `draftline
 * run` and `draftline rebalance` share (common/pipe/rbplan.h rbplan_parse_place), the GPU
 * pairs rule, the plan with nodes, and a stage's run configuration taking a CONTROL
 * PLACEMENT (common/pipe/runcfg.h runcfg_apply_placement). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/pipe/rbplan.h"
#include "common/pipe/runcfg.h"

#include <stdio.h>
#include <string.h>

static void table(rbplan_nodes_t *t, int fixed) {
    memset(t, 0, sizeof *t);
    t->fixed = fixed;
    t->n = fixed ? 3 : 1;
    snprintf(t->name[0], sizeof t->name[0], "head");
    snprintf(t->name[1], sizeof t->name[1], "a");
    snprintf(t->name[2], sizeof t->name[2], "b");
}

static void test_parse_place(void **state) {
    (void)state;
    rbplan_nodes_t t;
    int out[RBPLAN_MAX], node[RBPLAN_MAX];
    /* counts: a bare count is the head's; a prefix holds until the next one */
    table(&t, 1);
    assert_int_equal(rbplan_parse_place("--targets", "2", 1, &t, out, node, RBPLAN_MAX), 2);
    assert_int_equal(node[0], 0); assert_int_equal(node[1], 0); assert_int_equal(out[0], -1);
    assert_int_equal(rbplan_parse_place("--targets", "1,a:2,b:1", 1, &t, out, node, RBPLAN_MAX), 4);
    assert_int_equal(node[0], 0); assert_int_equal(node[1], 1); assert_int_equal(node[2], 1);
    assert_int_equal(node[3], 2);
    assert_int_equal(rbplan_parse_place("--drafters", "b:1,head:1", 1, &t, out, node, RBPLAN_MAX), 2);
    assert_int_equal(node[0], 2); assert_int_equal(node[1], 0);
    /* GPU lists: ordinals and ranges */
    assert_int_equal(rbplan_parse_place("--target-gpus", "a:0-2,b:5", 0, &t, out, node, RBPLAN_MAX), 4);
    assert_int_equal(out[0], 0); assert_int_equal(out[2], 2); assert_int_equal(out[3], 5);
    assert_int_equal(node[2], 1); assert_int_equal(node[3], 2);
    /* a fixed table refuses a name it does not hold, listing the ones it does */
    assert_int_equal(rbplan_parse_place("--drafters", "zz:1", 1, &t, out, node, RBPLAN_MAX), DL_ENOENT);
    assert_string_equal(dl_errmsg(), "--drafters zz:1: node zz is not in this run's node table (head, a, b)");
    assert_int_equal(t.n, 3);
    /* an open table (draftline run) adds it */
    table(&t, 0);
    assert_int_equal(rbplan_parse_place("--targets", "c:1,a:1", 1, &t, out, node, RBPLAN_MAX), 2);
    assert_int_equal(t.n, 3);
    assert_string_equal(t.name[1], "c"); assert_int_equal(node[1], 2);
    /* malformed entries, named by flag and value */
    static const char *const bad[] = {"a:0", "a:", ":1", "a:x", "a b:1", "a:65"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(rbplan_parse_place("--targets", bad[i], 1, &t, out, node, RBPLAN_MAX), DL_EINVAL);
        assert_non_null(strstr(dl_errmsg(), "--targets"));
    }
    assert_int_equal(rbplan_parse_place("--target-gpus", "a:3-1", 0, &t, out, node, RBPLAN_MAX), DL_EINVAL);
    assert_int_equal(rbplan_parse_place("--targets", "a:3", 1, &t, out, node, 2), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "too many processes"));
}

static void test_pairs_and_plan(void **state) {
    (void)state;
    rbplan_nodes_t t;
    table(&t, 1);
    int tn[2] = {1, 2}, dn[2] = {1, 1};
    /* target1 on b, its drafter1 on a */
    assert_int_equal(rbplan_gpu_pairs_local(tn, 2, dn, 2, 1, &t, 0), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "target1 on node b and its drafter1 on node a"));
    assert_int_equal(rbplan_gpu_pairs_local(tn, 2, dn, 2, 1, &t, RBPLAN_CROSS_HIDDEN), 0);   /* nccl_cross */
    tn[1] = 1; dn[1] = 2;
    assert_int_equal(rbplan_gpu_pairs_local(tn, 1, dn, 2, 1, &t, 0), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "drafter1 on node b and the optimizer (with drafter0) on node a"));
    assert_int_equal(rbplan_gpu_pairs_local(tn, 1, dn, 2, 1, &t, RBPLAN_CROSS_HIDDEN), DL_EINVAL);
    assert_int_equal(rbplan_gpu_pairs_local(tn, 1, dn, 2, 1, &t, RBPLAN_CROSS_GRADS), 0);
    /* CPU plan: a node change is a move, the rest keeps */
    int live[RBPLAN_MAX] = {1, 1}, cg[RBPLAN_MAX], cn[RBPLAN_MAX] = {1, 1}, wg[2] = {-1, -1}, wt[2] = {1, 2};
    int dlive[RBPLAN_MAX] = {1, 1}, dcn[RBPLAN_MAX] = {2, 2}, wd[2] = {2, 0};
    for (int i = 0; i < RBPLAN_MAX; i++) cg[i] = -1;
    rbplan_t p;
    assert_int_equal(rbplan_make_placed(live, cg, cn, dlive, cg, dcn, wg, wt, 2, wg, wd, 2, &p), 0);
    assert_int_equal(p.target[0], RBPLAN_KEEP); assert_int_equal(p.target[1], RBPLAN_MOVE);
    assert_int_equal(p.drafter[0], RBPLAN_KEEP); assert_int_equal(p.drafter[1], RBPLAN_MOVE);
    assert_int_equal(p.target_node[1], 2); assert_int_equal(p.drafter_node[1], 0);
    assert_int_equal(p.n_keep, 2); assert_int_equal(p.n_move, 2);
    /* one target fewer, a third drafter: retire and start */
    assert_int_equal(rbplan_make_placed(live, cg, cn, dlive, cg, dcn, wg, wt, 1, (int[]){-1, -1, -1},
                                        (int[]){2, 2, 0}, 3, &p), 0);
    assert_int_equal(p.target[1], RBPLAN_RETIRE); assert_int_equal(p.drafter[2], RBPLAN_START);
    assert_int_equal(p.n_keep, 3);
    wt[1] = RBPLAN_MAX_NODES;
    assert_int_equal(rbplan_make_placed(live, cg, cn, dlive, cg, dcn, wg, wt, 2, wg, wd, 2, &p), DL_EINVAL);
}

static void test_apply_placement(void **state) {
    (void)state;
    run_config_t c;
    runcfg_init(&c);
    c.net_port = 29500;
    c.n_nodes = 3;
    c.n_targets = 2; c.n_drafters = 2;
    c.node = 1;
    c.target_node[0] = c.target_node[1] = 1;
    c.drafter_node[0] = c.drafter_node[1] = 2;
    int64_t same[] = {2, 2, 1, 1, 2, 2};
    assert_int_equal(runcfg_apply_placement(&c, same, 6), 0);
    /* target1 to b, drafter1 to the head, a third target on a */
    int64_t p[] = {3, 2, 1, 2, 1, 2, 0};
    assert_int_equal(runcfg_apply_placement(&c, p, 7), 1);
    assert_int_equal(c.n_targets, 3);
    assert_int_equal(runcfg_stage_node(&c, PIPE_ID_TARGET0 + 1), 2);
    assert_int_equal(runcfg_stage_node(&c, PIPE_ID_TARGET0 + 2), 1);
    assert_int_equal(runcfg_stage_node(&c, PIPE_ID_DRAFTER0 + 1), 0);
    assert_int_equal(c.target_gpu[2], -1);
    assert_int_equal(c.target_drafter[2], 0);
    assert_int_equal(c.node, 1);   /* a running stage does not move */
    char ep[128];
    snprintf(c.node_addr[0], sizeof c.node_addr[0], "10.0.0.1");
    assert_int_equal(runcfg_endpoint(&c, "/tmp", "drafter1", ep, sizeof ep), 0);
    assert_string_equal(ep, "tcp://10.0.0.1:29601");
    /* refused, c unchanged: a node past the table, a wrong length */
    int64_t far[] = {1, 1, 3, 0};
    assert_int_equal(runcfg_apply_placement(&c, far, 4), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "node 3 of target 0"));
    assert_int_equal(runcfg_apply_placement(&c, p, 6), DL_EINVAL);
    assert_int_equal(c.n_targets, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_place),
        cmocka_unit_test(test_pairs_and_plan),
        cmocka_unit_test(test_apply_placement),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
