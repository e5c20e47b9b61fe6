/* ckpt_prune (checkpoint retention, --keep-checkpoints) on hand-made checkpoint dirs:
 * which dirs are candidates (complete: step_<digits>, a dir, state.bin whose header step is
 * the name's and whose n_params is the layout's, config.json, model.safetensors, nothing
 * else), that the oldest go first, that `latest`, the checkpoints past it and the protected (resumed-from) dir
 * stay, that leftovers of a failed removal (step_N.deleting) are cleaned, and that keep 0
 * or an unreadable `latest` removes nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/paths.h"
#include "common/pipe/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void put(const char *dir, const char *name, const void *b, size_t n) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* <out>/checkpoints/<name> with state.bin (header: step, n_params) and, per flag, the
 * public files */
static void make_ckpt(const char *out, const char *name, uint64_t step, uint64_t n_params, int with_model) {
    char d[600];
    snprintf(d, sizeof d, "%s/checkpoints/%s", out, name);
    assert_int_equal(paths_mkdir_p(d, 0755), 0);
    ckpt_state_hdr_t h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = 1;
    h.header_bytes = sizeof h;
    h.step = step;
    h.n_params = n_params;
    put(d, "state.bin", &h, sizeof h);
    put(d, "config.json", "{}", 2);
    if (with_model) put(d, "model.safetensors", "x", 1);
}

static void set_latest(const char *out, const char *name) {
    char d[600];
    snprintf(d, sizeof d, "%s/checkpoints", out);
    char line[64];
    int n = snprintf(line, sizeof line, "%s\n", name);
    put(d, "latest", line, (size_t)n);
}

static int exists(const char *out, const char *name) {
    char p[600];
    snprintf(p, sizeof p, "%s/checkpoints/%s", out, name);
    struct stat st;
    return lstat(p, &st) == 0;
}

static void test_prune(void **state) {
    (void)state;
    char out[300], p[600];
    snprintf(out, sizeof out, "%s/run", root);
    for (int s = 1; s <= 6; s++) {
        char n[32];
        snprintf(n, sizeof n, "step_%d", s);
        make_ckpt(out, n, (uint64_t)s, 10, 1);
    }
    make_ckpt(out, "step_0", 0, 10, 0);          /* incomplete: no model.safetensors */
    make_ckpt(out, "step_7", 7, 11, 1);          /* another layout's n_params */
    make_ckpt(out, "step_10", 9, 10, 1);         /* header step is not the name's */
    make_ckpt(out, "step_11", 11, 10, 1);        /* a foreign file in it */
    snprintf(p, sizeof p, "%s/checkpoints/step_11", out);
    put(p, "notes.txt", "mine", 4);
    make_ckpt(out, "step_4x", 4, 10, 1);         /* not step_<digits> */
    make_ckpt(out, "step_3.deleting", 3, 10, 1); /* an earlier failed removal */
    snprintf(p, sizeof p, "%s/checkpoints/step_12", out);
    assert_int_equal(symlink("step_6", p), 0);   /* a link */

    /* keep 0 (keep all), or latest missing: nothing removed */
    assert_int_equal(ckpt_prune(out, 0, 10, NULL), 0);
    assert_true(ckpt_prune(out, 2, 10, NULL) < 0);
    for (int s = 1; s <= 6; s++) { char n[32]; snprintf(n, sizeof n, "step_%d", s); assert_true(exists(out, n)); }

    /* keep 2, latest step_6, resumed from step_1 (named through another path): 2..5 go */
    set_latest(out, "step_6");
    char protect[600];
    snprintf(protect, sizeof protect, "%s/checkpoints/../checkpoints/step_1", out);
    assert_int_equal(ckpt_prune(out, 2, 10, protect), 4);
    assert_true(exists(out, "step_1"));
    assert_true(exists(out, "step_6"));
    for (int s = 2; s <= 5; s++) { char n[32]; snprintf(n, sizeof n, "step_%d", s); assert_false(exists(out, n)); }
    assert_false(exists(out, "step_3.deleting"));
    assert_false(exists(out, "step_5.deleting"));
    const char *left[] = {"step_0", "step_7", "step_10", "step_11", "step_11/notes.txt", "step_4x", "step_12", NULL};
    for (int i = 0; left[i]; i++) assert_true(exists(out, left[i]));

    /* the protection lifted (a newer checkpoint exists): keep 1 removes step_1, not latest */
    assert_int_equal(ckpt_prune(out, 1, 10, NULL), 1);
    assert_false(exists(out, "step_1"));
    assert_true(exists(out, "step_6"));
    /* at the limit: nothing more */
    assert_int_equal(ckpt_prune(out, 1, 10, NULL), 0);
    assert_true(exists(out, "step_6"));
    /* latest is never removed, even when it is the oldest, nor a checkpoint past it (a run
     * resumed from step_6 of a run that had gone on to step_8: step_8 holds the
     * furthest-trained weights until the resumed run writes its own step_8) */
    make_ckpt(out, "step_8", 8, 10, 1);
    assert_int_equal(ckpt_prune(out, 1, 10, NULL), 0);
    assert_true(exists(out, "step_6"));
    assert_true(exists(out, "step_8"));
    /* the resumed run's step_8 (latest now): step_6 goes */
    set_latest(out, "step_8");
    assert_int_equal(ckpt_prune(out, 1, 10, NULL), 1);
    assert_false(exists(out, "step_6"));
    assert_true(exists(out, "step_8"));
}

static int setup(void **state) {
    (void)state;
    snprintf(root, sizeof root, "/tmp/dlprune-%d", (int)getpid());
    return mkdir(root, 0700);
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (!getenv("DL_KEEP_TEST_DIR") && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_prune)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
