/* Resources of what died are released while the run goes on (issue 15 item 9):
 *
 *  - a 2+2 CPU run on the tiny target of test_pipeline (60 GSM8K samples): drafter0 is
 *    killed with SIGKILL twice, each time once its successor is up; afterwards /dev/shm
 *    holds only objects of the live incarnations (every "dl-<run>-<stage>-<inc>-*" has the
 *    stage's current incarnation; the old code kept both dead drafter0 incarnations' inbox
 *    and gradient slabs until the run ended), no stage process maps a dead drafter0
 *    incarnation's object any more, and the run still finishes with nothing left;
 *  - `draftline prepare` interrupted by SIGINT while it writes leaves no
 *    "<out>.tmp.<pid>" behind (the old code left the partial cache).
 * Every child has a hard timeout and is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/clock.h"
#include "common/rundir/rundir.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlsh", 60) < 0) return -1;
    proc_watchdog(500);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

static rundir_run_t rj;   /* large: not on the stack */

/* pid and incarnation of stage `name` in out/run.json; 0 when not found. */
static int stage_of(const char *out, const char *name, uint64_t *inc) {
    if (rundir_run_read(out, &rj) < 0) return 0;
    for (int i = 0; i < rj.n_stages; i++)
        if (!strcmp(rj.stages[i].name, name)) {
            *inc = (uint64_t)rj.stages[i].incarnation;
            return rj.stages[i].pid;
        }
    return 0;
}

/* Waits until drafter0 runs as incarnation `want` and its log says it is up (serving its
 * inbox: its metrics reached the supervisor at least twice since). Returns its pid, 0 on timeout. */
static int wait_drafter0(const char *out, uint64_t want, double timeout_s) {
    double t0 = clock_mono_s();
    while (clock_mono_s() - t0 < timeout_s) {
        uint64_t inc = 0;
        int pid = stage_of(out, "drafter0", &inc);
        if (pid > 0 && inc == want) {
            char p[600], needle[64];
            snprintf(p, sizeof p, "%s/metrics.jsonl", out);
            snprintf(needle, sizeof needle, "\"stage\":\"drafter0\",\"stage_id\":100,\"incarnation\":%llu",
                     (unsigned long long)want);
            if (pf_wait_for_text(p, needle, 0.2)) { sleep(2); return pid; }
        }
        usleep(100000);
    }
    return 0;
}

/* Objects of run `id` in /dev/shm whose incarnation is not the stage's current one (by
 * out/run.json); prints each. */
static int stale_objects(const char *out, const char *id) {
    DIR *d = opendir("/dev/shm");
    assert_non_null(d);
    char prefix[80];
    snprintf(prefix, sizeof prefix, "dl-%s-", id);
    int n = 0, all = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
        all++;
        char stage[64];
        unsigned long long inc;
        if (sscanf(e->d_name + strlen(prefix), "%63[^-]-%llu-", stage, &inc) != 2) continue;
        uint64_t cur = 0;
        if (stage_of(out, stage, &cur) && cur == inc) continue;
        printf("stale: /dev/shm/%s (current incarnation of %s: %llu)\n", e->d_name, stage, (unsigned long long)cur);
        n++;
    }
    closedir(d);
    printf("%d object(s) of run %s in /dev/shm, %d stale\n", all, id, n);
    assert_true(all > 0);   /* the run is live: its stages' objects are there (else this proves nothing) */
    return n;
}

/* Stage processes of out/run.json that still map an object of drafter0's incarnations < inc. */
static int old_mappings(const char *out, const char *id, uint64_t inc) {
    assert_int_equal(rundir_run_read(out, &rj), 0);
    int n = 0;
    for (int i = 0; i < rj.n_stages; i++) {
        if (rj.stages[i].pid <= 0) continue;
        char p[64];
        snprintf(p, sizeof p, "/proc/%d/maps", rj.stages[i].pid);
        char *maps = pf_slurp(p, NULL);
        if (!maps) continue;
        for (uint64_t k = 1; k < inc; k++) {
            char needle[96];
            snprintf(needle, sizeof needle, "dl-%s-drafter0-%llu-", id, (unsigned long long)k);
            if (strstr(maps, needle)) { printf("%s still maps %s*\n", rj.stages[i].name, needle); n++; }
        }
        free(maps);
    }
    return n;
}

static void test_dead_drafter_shm_released(void **state) {
    (void)state;
    static pf_run_args_t a;
    char out[300], log[380], p[600], id[64];
    snprintf(out, sizeof out, "%s/kill", fx.root);
    snprintf(log, sizeof log, "%s/kill.console", fx.root);
    memset(&a, 0, sizeof a);
    char *argv[] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                    "--token-budget", "256", "--block-size", "4", "--num-anchors", "8", "--drafter-layers", "1",
                    "--threads", "1", "--targets", "2", "--drafters", "2", "--max-steps", "150", "--epochs", "4",
                    "--out", out, NULL};
    for (int i = 0; argv[i]; i++) a.argv[i] = argv[i];
    snprintf(a.log, sizeof a.log, "%s", log);
    proc_t run;
    /* every forward 250 ms longer: the run (~40 s) outlasts the two kills and restarts
     * (~10 s) however fast this machine trains the tiny model (150 steps take ~7 s without) */
    setenv("DL_TEST_HOOKS", "target.forward_delay_ms=250", 1);
    assert_int_equal(proc_spawn(&run, "draftline run", pf_run_child, &a), 0);
    unsetenv("DL_TEST_HOOKS");
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    for (int i = 0; i < 12000 && pf_count_lines(p) < 2; i++) usleep(10000);
    assert_true(pf_count_lines(p) >= 2);
    int pid = wait_drafter0(out, 1, 30);
    assert_true(pid > 0);
    snprintf(id, sizeof id, "%s", rj.run_id);
    for (uint64_t k = 1; k <= 2; k++) {
        assert_int_equal(kill(pid, SIGKILL), 0);
        pid = wait_drafter0(out, k + 1, 60);
        assert_true(pid > 0);
    }
    int stale = stale_objects(out, id), mapped = old_mappings(out, id, 3);
    int code = pf_run_finish(&run, log, out, 240, NULL);
    assert_int_equal(stale, 0);
    assert_int_equal(mapped, 0);
    assert_int_equal(code, 0);
    assert_int_equal(pf_count_lines(p), 150);
}

/* A dataset big enough that prepare runs a few seconds on one thread. */
static void write_big_jsonl(const char *path) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 40000; i++) {
        fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"question %d: how many apples are left when",
                i);
        for (int k = 0; k < 12; k++) fprintf(f, " %d apples are eaten out of %d baskets", i * 7 + k, k + 3);
        fprintf(f, "?\"},{\"role\":\"assistant\",\"content\":\"answer %d: count them one by one", i);
        for (int k = 0; k < 12; k++) fprintf(f, " then %d more", i + k);
        fprintf(f, ".\"}]}\n");
    }
    assert_int_equal(fclose(f), 0);
}

/* The name of a "big.dlc.tmp.*" file in dir, or 0 when none. */
static int find_tmp(const char *dir, char *name, size_t cap) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int found = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, "big.dlc.tmp.", 12)) { snprintf(name, cap, "%s", e->d_name); found = 1; }
    closedir(d);
    return found;
}

static void test_prepare_sigint_no_tmp(void **state) {
    (void)state;
    char dir[300], data[400], outp[400], tmp[256];
    snprintf(dir, sizeof dir, "%s/prep", fx.root);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(data, sizeof data, "%s/big.jsonl", dir);
    snprintf(outp, sizeof outp, "%s/big.dlc", dir);
    write_big_jsonl(data);
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    char *argv[] = {fx.exe, "prepare", "--data", data, "--out", outp, "--threads", "1", NULL};
    for (int i = 0; argv[i]; i++) a.argv[i] = argv[i];
    snprintf(a.log, sizeof a.log, "%s/prepare.out", fx.root);
    proc_t pr;
    assert_int_equal(proc_spawn(&pr, "draftline prepare", pf_run_child, &a), 0);
    int seen = 0;
    for (int i = 0; i < 3000 && !(seen = find_tmp(dir, tmp, sizeof tmp)); i++) usleep(5000);
    assert_true(seen);
    usleep(300000);   /* writing, not just opened */
    assert_int_equal(kill(pr.pid, SIGINT), 0);
    int code = -1;
    assert_int_equal(proc_wait(&pr, 30000, &code), 0);
    proc_kill(&pr);
    printf("prepare after SIGINT: exit %d\n", code);
    assert_int_equal(code, 128 + SIGINT);   /* ended by the signal, as before */
    int left = find_tmp(dir, tmp, sizeof tmp);
    if (left) printf("left behind: %s/%s\n", dir, tmp);
    assert_false(left);
    assert_int_not_equal(access(outp, F_OK), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prepare_sigint_no_tmp),
        cmocka_unit_test(test_dead_drafter_shm_released),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
