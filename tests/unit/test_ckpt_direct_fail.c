/* Failed checkpoint writes through common/base/dio.c (ckpt_write: state.bin by dio_pwrite
 * spans, model.safetensors by st_writer_new_direct), in each mode of dio.h, each in a fresh
 * process of this binary (DL_TEST_HOOKS is read once per process). A file size limit
 * (RLIMIT_FSIZE, SIGXFSZ ignored: writes past it fail with EFBIG, as a full disk fails
 * with ENOSPC) makes the writes fail:
 *   - state.bin only (the limit between the sizes of model.safetensors and state.bin),
 *     then both files (a 1000-byte limit): ckpt_write fails naming the error, leaves no
 *     step_N.tmp (nor step_N), and every fd it opened is closed;
 *   - with the limit lifted, the same process writes the checkpoint and reads it back
 *     at once (ckpt_read: the arrays bitwise), and its fds are still all closed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/data/batcher.h"
#include "common/model/dflash_ckpt.h"
#include "common/model/drafter.h"
#include "common/ops/ops.h"
#include "common/pipe/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define STEP 3

static char root[512];

static const char *const modes[] = {"", "dio.mode=1", "dio.mode=2,dio.bounce_kib=12", "dio.mode=3,dio.bounce_kib=8"};
#define N_MODES (sizeof modes / sizeof modes[0])

/* ---- the child side ---- */

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static int exists(const char *dir, const char *name) {
    char p[800];
    struct stat sb;
    snprintf(p, sizeof p, "%s/checkpoints/%s", dir, name);
    return stat(p, &sb) == 0;
}

static int set_fsize(rlim_t n) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) != 0) return -1;
    rl.rlim_cur = n;
    return setrlimit(RLIMIT_FSIZE, &rl);
}

static drafter_t *fixture_drafter(ops_ctx_t *ops) {
    drafter_config_t c;
    if (dflash_config_load("tests/fixtures/drafter", &c) < 0) return NULL;
    ops_cpu_init(ops, 1);
    static const float no_embed[1];
    drafter_new_opts_t lo = {.layout_only = 1};
    drafter_t *d = NULL;
    if (drafter_new_opts(ops, &c, no_embed, no_embed, 1, 1, 0, &lo, &d) < 0) return NULL;
    return d;
}

/* ckpt_write of arr (master, m, v) into dir under a file size limit (0: none); 0 when it
 * did what the limit says (failed cleanly, or wrote a checkpoint that reads back), else
 * a code naming the failed check */
static int write_under(const char *dir, drafter_t *d, float *const arr[3], rlim_t limit) {
    size_t P = drafter_n_params(d);
    ckpt_state_hdr_t h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = CKPT_VERSION;
    h.header_bytes = sizeof h;
    h.step = STEP;
    h.n_params = P;
    h.seed = 4;
    h.mbs_per_step = 2;
    h.lr = 1e-3, h.max_steps = 10, h.clip = 1;
    int fds = count_fds();
    if (set_fsize(limit ? limit : RLIM_INFINITY) != 0) return 20;
    int rc = ckpt_write(dir, d, &h, arr[0], arr[1], arr[2], NULL, NULL, 0);
    if (set_fsize(RLIM_INFINITY) != 0) return 21;
    if (count_fds() != fds) return 22;                      /* an fd left open */
    if (limit) {
        if (rc >= 0) return 23;
        if (!strstr(dl_errmsg(), strerror(EFBIG))) return 24;   /* the error named */
        if (exists(dir, "step_3.tmp") || exists(dir, "step_3")) return 25;   /* no half checkpoint */
        return 0;
    }
    if (rc < 0 || exists(dir, "step_3.tmp") || !exists(dir, "step_3")) return 26;
    char p[800];
    snprintf(p, sizeof p, "%s/checkpoints/step_%d", dir, STEP);
    float *got[3];
    for (int i = 0; i < 3; i++) got[i] = malloc(P * 4);
    int ok = got[0] && got[1] && got[2] && ckpt_read(p, d, &h, got[0], got[1], got[2], NULL) == 0;
    for (int i = 0; i < 3 && ok; i++) ok = memcmp(got[i], arr[i], P * 4) == 0;
    for (int i = 0; i < 3; i++) free(got[i]);
    return ok ? 0 : 27;
}

static int child_main(const char *dir) {
    signal(SIGXFSZ, SIG_IGN);   /* a write past the limit fails with EFBIG instead */
    ops_ctx_t ops;
    drafter_t *d = fixture_drafter(&ops);
    if (!d) return 9;
    size_t P = drafter_n_params(d);
    float *arr[3] = {malloc(P * 4), malloc(P * 4), malloc(P * 4)};
    if (!arr[0] || !arr[1] || !arr[2]) return 10;
    rng_t r;
    rng_seed(&r, 5);
    for (size_t i = 0; i < P; i++) {
        arr[0][i] = rng_normal(&r) * 0.02f;
        arr[1][i] = rng_normal(&r) * 1e-3f;
        arr[2][i] = rng_normal(&r) * rng_normal(&r) * 1e-6f;
    }
    /* model.safetensors: 4P bytes and a header of a few KiB; state.bin: 168 + 8P */
    int rc = write_under(dir, d, arr, (rlim_t)(sizeof(ckpt_state_hdr_t) + 6 * P));
    if (rc == 0) rc = write_under(dir, d, arr, 1000);
    if (rc == 0) rc = write_under(dir, d, arr, 0);
    for (int i = 0; i < 3; i++) free(arr[i]);
    drafter_destroy(&d);
    return rc;
}

/* ---- the parent side ---- */

static int spawn(const char *dir, const char *hooks) {
    pid_t pid = fork();
    if (pid == 0) {
        if (*hooks) setenv("DL_TEST_HOOKS", hooks, 1);
        else unsetenv("DL_TEST_HOOKS");
        execl("/proc/self/exe", "test_ckpt_direct_fail", "child", dir, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int setup(void **state) {
    (void)state;
    snprintf(root, sizeof root, "build/tests/dl_diofail_XXXXXX");
    if (mkdtemp(root)) return 0;
    snprintf(root, sizeof root, "/tmp/dl_diofail_XXXXXX");
    return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_failed_writes(void **state) {
    (void)state;
    for (size_t k = 0; k < N_MODES; k++) {
        char dir[700];
        snprintf(dir, sizeof dir, "%s/m%zu", root, k);
        assert_int_equal(mkdir(dir, 0755), 0);
        int rc = spawn(dir, modes[k]);
        if (rc != 0) print_message("mode '%s': child exit %d\n", modes[k], rc);
        assert_int_equal(rc, 0);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "child")) return child_main(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_writes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
