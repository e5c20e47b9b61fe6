/* Checkpoint files written with O_DIRECT (common/base/dio.c, used by ckpt_write for
 * state.bin and by st_writer_new_direct for model.safetensors) hold the bytes of the
 * buffered path. Each writer runs in a fresh process of this binary (DL_TEST_HOOKS is read
 * once per process), under each mode of dio.h:
 *   - dio_pwrite of a known pattern in ranges that start and end off the 4 KiB grid (1
 *     byte, inside one block, across blocks, a last partial block; the file 5 x 64 KiB +
 *     1234 bytes) from 3 threads, from unaligned memory: the file is the pattern, its size
 *     exact; auto mode takes O_DIRECT in a directory whose file system accepts it (probed:
 *     build/tests, then /tmp), dio.mode=2 (bounce path on a buffered fd, 12 KiB bounce)
 *     routes the whole blocks through the bounce on any file system, dio.mode=1 none,
 *     dio.mode=3 falls back to buffered after its first (failed) direct write;
 *   - ckpt_write of the small drafter of tests/fixtures/drafter (layout only, random
 *     master, m, v): state.bin (168-byte header: every span starts off the grid),
 *     model.safetensors and config.json are bitwise those of dio.mode=1 (the path before
 *     O_DIRECT) in auto mode, dio.mode=2 with a 12 KiB bounce, dio.mode=3; ckpt_read gives
 *     the arrays back;
 *   - failed writes (a file size limit: EFBIG, as a full disk fails with ENOSPC), state.bin
 *     alone then both files, in every mode but the last: no step_N.tmp, no fd left open,
 *     the error named; then the same process writes and reads the checkpoint back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/dio.h"
#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/data/batcher.h"
#include "common/model/dflash_ckpt.h"
#include "common/model/drafter.h"
#include "common/ops/ops.h"
#include "common/pipe/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define FILE_BYTES (5u * 65536u + 1234u)
#define STEP 3

static char root[512];
static int direct_ok;   /* root's file system takes O_DIRECT */

static const char *const modes[] = {"", "dio.mode=1", "dio.mode=2,dio.bounce_kib=12", "dio.mode=3,dio.bounce_kib=8",
                                    "dio.bounce_kib=12"};
#define N_MODES (sizeof modes / sizeof modes[0])

/* ---- the child side: one writer, in a process whose DL_TEST_HOOKS is set ---- */

static void pattern(uint8_t *p, size_t n) {
    rng_t r;
    rng_seed(&r, 99);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rng_u64(&r) >> 56);
}

typedef struct { dio_file_t *f; const uint8_t *src; const uint64_t *cut; int first, step, n_cut, rc; } job_t;

static void *ranges(void *arg) {
    job_t *j = arg;
    dio_bounce_t b = {0};
    for (int i = j->first; i + 1 < j->n_cut && !j->rc; i += j->step)
        j->rc = dio_pwrite(j->f, &b, j->src + j->cut[i], (size_t)(j->cut[i + 1] - j->cut[i]), j->cut[i]);
    dio_bounce_free(&b);
    return NULL;
}

/* dir/pattern.bin by dio_pwrite; dir/direct.txt: the bytes that went through the second fd */
static int child_dio(const char *dir) {
    static const uint64_t cut[] = {0, 1, 168, 4096, 4097, 8190, 12288, 20000, 65536 * 2 + 7, 65536 * 3,
                                   65536 * 3 + 4096, 65536 * 5, FILE_BYTES - 1, FILE_BYTES};
    uint8_t *mem = malloc(FILE_BYTES + 3), *src = mem + 3;   /* off the page grid on purpose */
    if (!mem) return 2;
    pattern(src, FILE_BYTES);
    char p[700];
    snprintf(p, sizeof p, "%s/pattern.bin", dir);
    dio_file_t *f;
    if (dio_open(p, FILE_BYTES, &f) < 0) return 3;
    job_t j[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        j[i] = (job_t){f, src, cut, i, 3, (int)(sizeof cut / sizeof cut[0]), 0};
        if (pthread_create(&th[i], NULL, ranges, &j[i]) != 0) return 4;
    }
    int rc = 0;
    for (int i = 0; i < 3; i++) { pthread_join(th[i], NULL); rc |= j[i].rc; }
    unsigned long long nd = dio_direct_bytes(f);
    if (rc || dio_fsync(f) < 0 || dio_close(&f) < 0) return 5;
    free(mem);
    snprintf(p, sizeof p, "%s/direct.txt", dir);
    FILE *o = fopen(p, "w");
    if (!o) return 6;
    fprintf(o, "%llu\n", nd);
    return fclose(o) == 0 ? 0 : 7;
}

/* the fixture's random master, m, v (P each) */
static void fixture_state(size_t P, float *w, float *m, float *v) {
    rng_t r;
    rng_seed(&r, 5);
    for (size_t i = 0; i < P; i++) {
        w[i] = rng_normal(&r) * 0.02f;
        m[i] = rng_normal(&r) * 1e-3f;
        v[i] = rng_normal(&r) * rng_normal(&r) * 1e-6f;
    }
}

/* the state.bin header of a step-STEP checkpoint of P parameters */
static ckpt_state_hdr_t fixture_header(size_t P) {
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
    return h;
}

/* a checkpoint of the fixture drafter's random master, m, v into dir (ckpt_write) */
static int child_ckpt(const char *dir, drafter_t *d, float *w, float *m, float *v) {
    size_t P = drafter_n_params(d);
    fixture_state(P, w, m, v);
    ckpt_state_hdr_t h = fixture_header(P);
    batcher_cursor_t bc;
    memset(&bc, 0, sizeof bc);
    bc.next_mb = STEP * 2;
    bc.seed = 4;
    uint8_t cur[BATCHER_CURSOR_BYTES];
    batcher_cursor_encode(&bc, cur);
    return ckpt_write(dir, d, &h, w, m, v, cur, NULL, 0) < 0 ? 8 : 0;
}

/* ---- failed writes (test_failed_writes): a file size limit (RLIMIT_FSIZE, SIGXFSZ
 * ignored: writes past it fail with EFBIG, as a full disk fails with ENOSPC) ---- */

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

/* ckpt_write of arr (master, m, v) into dir under a file size limit (0: none); 0 when it
 * did what the limit says (failed cleanly, or wrote a checkpoint that reads back), else
 * a code naming the failed check */
static int write_under(const char *dir, drafter_t *d, float *const arr[3], rlim_t limit) {
    size_t P = drafter_n_params(d);
    ckpt_state_hdr_t h = fixture_header(P);
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

/* state.bin failing alone, then both files, then the limit lifted in the same process */
static int child_fail(const char *dir, drafter_t *d, float *w, float *m, float *v) {
    signal(SIGXFSZ, SIG_IGN);   /* a write past the limit fails with EFBIG instead */
    size_t P = drafter_n_params(d);
    fixture_state(P, w, m, v);
    float *const arr[3] = {w, m, v};
    /* model.safetensors: 4P bytes and a header of a few KiB; state.bin: 168 + 8P */
    int rc = write_under(dir, d, arr, (rlim_t)(sizeof(ckpt_state_hdr_t) + 6 * P));
    if (rc == 0) rc = write_under(dir, d, arr, 1000);
    if (rc == 0) rc = write_under(dir, d, arr, 0);
    return rc;
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

static int child_main(const char *what, const char *dir) {
    if (!strcmp(what, "dio")) return child_dio(dir);
    ops_ctx_t ops;
    drafter_t *d = fixture_drafter(&ops);
    if (!d) return 9;
    size_t P = drafter_n_params(d);
    float *w = malloc(P * 4), *m = malloc(P * 4), *v = malloc(P * 4);
    int rc = !(w && m && v) ? 10 : !strcmp(what, "fail") ? child_fail(dir, d, w, m, v) : child_ckpt(dir, d, w, m, v);
    free(w), free(m), free(v);
    drafter_destroy(&d);
    return rc;
}

/* ---- the parent side ---- */

/* runs `self child <what> <dir>` with DL_TEST_HOOKS=hooks ("" unsets it); its exit code */
static int spawn(const char *what, const char *dir, const char *hooks) {
    pid_t pid = fork();
    if (pid == 0) {
        if (*hooks) setenv("DL_TEST_HOOKS", hooks, 1);
        else unsetenv("DL_TEST_HOOKS");
        execl("/proc/self/exe", "test_ckpt_direct", "child", what, dir, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    uint8_t *b = malloc(*n ? *n : 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* 1 when dir's file system takes an O_DIRECT write of one aligned block */
static int probe_direct(const char *dir) {
    char p[700];
    snprintf(p, sizeof p, "%s/probe", dir);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644), ok = 0;
    void *b = NULL;
    if (fd >= 0 && posix_memalign(&b, DIO_ALIGN, DIO_ALIGN) == 0) {
        memset(b, 0, DIO_ALIGN);
        ok = pwrite(fd, b, DIO_ALIGN, 0) == (ssize_t)DIO_ALIGN;
    }
    free(b);
    if (fd >= 0) close(fd);
    unlink(p);
    return ok;
}

static int setup(void **state) {
    (void)state;
    static const char *const cand[] = {"build/tests", "/tmp"};
    for (size_t i = 0; i < 2 && !direct_ok; i++) {
        char t[512];
        snprintf(t, sizeof t, "%s/dl_dio_XXXXXX", cand[i]);
        if (!mkdtemp(t)) continue;
        if (!root[0] || probe_direct(t)) {
            if (root[0]) rmdir(root);
            snprintf(root, sizeof root, "%s", t);
            direct_ok = probe_direct(t);
        } else rmdir(t);
    }
    if (!root[0]) return -1;
    if (!direct_ok) print_message("no directory here takes O_DIRECT: the direct path runs as its fallback\n");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_dio_ranges(void **state) {
    (void)state;
    uint8_t *want = malloc(FILE_BYTES);
    assert_non_null(want);
    pattern(want, FILE_BYTES);
    for (size_t k = 0; k < N_MODES; k++) {
        char dir[700], p[760];
        snprintf(dir, sizeof dir, "%s/dio%zu", root, k);
        assert_int_equal(mkdir(dir, 0755), 0);
        assert_int_equal(spawn("dio", dir, modes[k]), 0);
        size_t n;
        snprintf(p, sizeof p, "%s/pattern.bin", dir);
        uint8_t *got = slurp(p, &n);
        assert_int_equal(n, FILE_BYTES);
        assert_memory_equal(got, want, FILE_BYTES);
        free(got);
        snprintf(p, sizeof p, "%s/direct.txt", dir);
        FILE *f = fopen(p, "r");
        assert_non_null(f);
        unsigned long long nd = 0;
        assert_int_equal(fscanf(f, "%llu", &nd), 1);
        fclose(f);
        /* whole blocks took the second fd; dio.mode=3: at most those of threads already under way */
        int through = k == 2 || ((k == 0 || k == 4) && direct_ok);
        if (through) assert_true(nd > 0);
        if (k == 1 || (k != 2 && !direct_ok)) assert_int_equal(nd, 0);
        assert_true(nd % DIO_ALIGN == 0 && nd < FILE_BYTES);
    }
    free(want);
}

static void same_file(const char *a, const char *b, const char *name) {
    char pa[800], pb[800];
    snprintf(pa, sizeof pa, "%s/checkpoints/step_%d/%s", a, STEP, name);
    snprintf(pb, sizeof pb, "%s/checkpoints/step_%d/%s", b, STEP, name);
    size_t na, nb;
    uint8_t *x = slurp(pa, &na), *y = slurp(pb, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x), free(y);
}

static void test_ckpt_bytes(void **state) {
    (void)state;
    char ref[700];
    snprintf(ref, sizeof ref, "%s/ckpt1", root);
    assert_int_equal(spawn("ckpt", ref, modes[1]), 0);   /* buffered: the reference */
    ops_ctx_t ops;
    drafter_t *d = fixture_drafter(&ops);
    assert_non_null(d);
    size_t P = drafter_n_params(d);
    char p[800];
    snprintf(p, sizeof p, "%s/checkpoints/step_%d/state.bin", ref, STEP);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal((size_t)sb.st_size, sizeof(ckpt_state_hdr_t) + 8 * P);
    static const size_t others[] = {0, 2, 3};
    for (size_t i = 0; i < 3; i++) {
        char dir[700];
        snprintf(dir, sizeof dir, "%s/ckpt%zu", root, others[i]);
        assert_int_equal(spawn("ckpt", dir, modes[others[i]]), 0);
        same_file(ref, dir, "state.bin");
        same_file(ref, dir, "model.safetensors");
        same_file(ref, dir, "config.json");
        same_file(ref, dir, "cursor.bin");
        snprintf(p, sizeof p, "%s/checkpoints/step_%d", dir, STEP);
        float *w = malloc(P * 4), *m = malloc(P * 4), *v = malloc(P * 4);
        ckpt_state_hdr_t h;
        assert_int_equal(ckpt_read(p, d, &h, w, m, v, NULL), 0);
        assert_int_equal(h.step, STEP);
        free(w), free(m), free(v);
    }
    drafter_destroy(&d);
}

/* Failed checkpoint writes in each mode but the last: ckpt_write fails naming the error
 * (EFBIG), leaves no step_N.tmp (nor step_N) and closes every fd it opened; with the limit
 * lifted the same process writes the checkpoint and reads it back bitwise at once. */
static void test_failed_writes(void **state) {
    (void)state;
    for (size_t k = 0; k + 1 < N_MODES; k++) {
        char dir[700];
        snprintf(dir, sizeof dir, "%s/fail%zu", root, k);
        assert_int_equal(mkdir(dir, 0755), 0);
        int rc = spawn("fail", dir, modes[k]);
        if (rc != 0) print_message("mode '%s': child exit %d\n", modes[k], rc);
        assert_int_equal(rc, 0);
    }
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "child")) return child_main(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dio_ranges),
        cmocka_unit_test(test_ckpt_bytes),
        cmocka_unit_test(test_failed_writes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
