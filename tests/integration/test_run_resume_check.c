/* `draftline run --resume` checks the requested settings against the checkpoint before
 * any stage starts (tools/cmd_run.c, the --resume check), on the tiny random Llama-shaped
 * target of test_pipeline and 60 GSM8K samples:
 *
 *  - a 2-step run with --save-every 1 (checkpoints step_1, step_2);
 *  - --resume with a different --token-budget, --drafter-layers, --seed, --num-anchors,
 *    dataset (a 40-sample cache), target weights (a copy of the tiny target with one
 *    sampled byte changed), or two of them at once: each refused in < 5 s with exit 2,
 *    one line per mismatching flag naming both values and the flag to rerun with; no
 *    stage started (no "draftline run <id>:" start line) and the out dir byte for byte
 *    and mtime for mtime as it was (every file, the checkpoints too);
 *  - --resume with the same settings, a bigger --max-steps and a changed --save-every /
 *    --progress-every: runs to step 4 (steps.jsonl 4 lines, checkpoints/latest step_4);
 *  - an old checkpoint (state.bin written before the settings were recorded: the
 *    settings bytes zeroed): warned, and a different --token-budget is still refused
 *    (from cursor.bin's batching options) and a different --drafter-layers (from
 *    config.json);
 *  - the settings not given default to the run's: a 4-step --deterministic run A
 *    (checkpoints step_2, step_4) and two copies of it cut back to step_2 (what Ctrl-C at
 *    step 2 leaves: checkpoints/latest step_2, steps.jsonl 2 lines): `--resume B
 *    --max-steps 4` alone and `--resume D/checkpoints/step_2` alone (--max-steps, --out,
 *    --data, --target-model and every training setting from the checkpoint and run.json)
 *    both end with A's step_4 state.bin bitwise and A's losses of steps 2 and 3, steps.jsonl
 *    0..3 in order; an explicit mismatching --token-budget is still refused.
 * Every child has a hard timeout and is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/pipe/ckpt.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static pf_fixture_t fx;
static char cache40[300], out[400];

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlrr", 60) < 0) return -1;
    snprintf(cache40, sizeof cache40, "%s/gsm8k40.dlc", fx.root);
    snprintf(out, sizeof out, "%s/run", fx.root);
    if (pf_write_cache(fx.root, 40, cache40) < 0) {
        fprintf(stderr, "fixture: %s\n", dl_errmsg());
        return -1;
    }
    proc_watchdog(110);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* Runs a (argv, log) to the end (pf_run_draftline): its exit code, its wall time in *secs
 * (may be NULL). */
static int spawn_run(pf_run_args_t *a, int timeout_s, double *secs) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int code = pf_run_draftline(a, NULL, timeout_s, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (secs) *secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return code;
}

/* `draftline run` + the tiny settings + `--out out --resume out` (when resume) + extra
 * (NULL-terminated; later flags override the fixed ones), to the end; returns its exit
 * code and its wall time in *secs. */
static int run_draftline(const char *log, int resume, const char *const *extra, int timeout_s, double *secs) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    a.argv[n++] = "run";
    const char *fixed[] = {"--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                           "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                           "--drafter-layers", "1", "--lr", "3e-3", "--seed", "5",
                           "--progress-every", "1", "--threads", "1", "--out", out, NULL};
    for (int i = 0; fixed[i]; i++) a.argv[n++] = (char *)fixed[i];
    if (resume) { a.argv[n++] = "--resume"; a.argv[n++] = out; }
    for (int i = 0; extra[i]; i++) a.argv[n++] = (char *)extra[i];
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    return spawn_run(&a, timeout_s, secs);
}

/* `draftline run` + args only (NULL-terminated), to the end: its exit code. */
static int run_only(const char *log, const char *const *args, int timeout_s) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    a.argv[n++] = "run";
    for (int i = 0; args[i]; i++) a.argv[n++] = (char *)args[i];
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    return spawn_run(&a, timeout_s, NULL);
}

/* Appends to sig a line per entry under dir (recursively, in name order): path, type,
 * size, mtime (ns), and an FNV-1a hash of a file's bytes. */
static void tree_sig(const char *dir, char **sig, size_t *len) {
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, alphasort);
    assert_true(n >= 0);
    for (int i = 0; i < n; i++) {
        const char *nm = ents[i]->d_name;
        if (strcmp(nm, ".") != 0 && strcmp(nm, "..") != 0) {
            char p[1200];
            snprintf(p, sizeof p, "%s/%s", dir, nm);
            struct stat st;
            assert_int_equal(lstat(p, &st), 0);
            uint64_t h = 0xcbf29ce484222325ull;
            if (S_ISREG(st.st_mode)) {
                char *b = pf_slurp(p, NULL);
                assert_non_null(b);
                for (off_t k = 0; k < st.st_size; k++) { h ^= (uint8_t)b[k]; h *= 0x100000001b3ull; }
                free(b);
            }
            char line[1400];
            int m = snprintf(line, sizeof line, "%s %o %lld %lld.%09ld %016llx\n", p, (unsigned)st.st_mode,
                             (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
                             (unsigned long long)h);
            *sig = realloc(*sig, *len + (size_t)m + 1);
            assert_non_null(*sig);
            memcpy(*sig + *len, line, (size_t)m + 1);
            *len += (size_t)m;
            if (S_ISDIR(st.st_mode)) tree_sig(p, sig, len);
        }
        free(ents[i]);
    }
    free(ents);
}

static char *snapshot_of(const char *dir) {
    char *sig = NULL;
    size_t len = 0;
    tree_sig(dir, &sig, &len);
    assert_non_null(sig);
    return sig;
}

static char *snapshot(void) {
    char *sig = NULL;
    size_t len = 0;
    tree_sig(out, &sig, &len);
    assert_non_null(sig);
    return sig;
}

/* --resume with extra: exit 2 in < 5 s, each of wants[] in the output, no stage started,
 * the out dir unchanged. */
static void expect_refused(const char *name, const char *const *extra, const char *const *wants) {
    char log[500];
    snprintf(log, sizeof log, "%s/%s.out", fx.root, name);
    char *before = snapshot();
    double secs = 0;
    int code = run_draftline(log, 1, extra, 30, &secs);
    char *txt = pf_slurp(log, NULL);
    assert_non_null(txt);
    if (code != 2) fprintf(stderr, "%s: exit %d\n%s\n", name, code, txt);
    assert_int_equal(code, 2);
    assert_true(secs < 5.0);
    for (int i = 0; wants[i]; i++) {
        if (!strstr(txt, wants[i])) fprintf(stderr, "%s: missing \"%s\" in:\n%s\n", name, wants[i], txt);
        assert_non_null(strstr(txt, wants[i]));
    }
    assert_null(strstr(txt, "draftline run "));   /* the start line: no stage was started */
    char *after = snapshot();
    if (strcmp(before, after) != 0) fprintf(stderr, "%s: out dir changed:\n%s---\n%s\n", name, before, after);
    assert_string_equal(before, after);
    free(before);
    free(after);
    free(txt);
}

static void test_resume_check(void **state) {
    (void)state;
    char log[500], p[1400];
    /* the run to resume: 2 steps, a checkpoint after each */
    snprintf(log, sizeof log, "%s/train.out", fx.root);
    {
        const char *extra[] = {"--max-steps", "2", "--save-every", "1", NULL};
        int code = run_draftline(log, 0, extra, 60, NULL);
        if (code != 0) { char *t = pf_slurp(log, NULL); fprintf(stderr, "%s\n", t ? t : ""); free(t); }
        assert_int_equal(code, 0);
    }
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    assert_int_equal(pf_count_lines(p), 2);
    char ck[700];
    snprintf(ck, sizeof ck, "%s/checkpoints/step_2", out);
    ckpt_state_hdr_t h;
    assert_int_equal(ckpt_read_hdr(ck, &h), 0);
    assert_int_equal(h.step, 2);
    assert_int_equal(h.settings, CKPT_SETTINGS_V1);
    assert_int_equal(h.token_budget, 256);
    assert_int_equal(h.max_len, 256);
    assert_int_equal(h.num_anchors, 8);
    assert_int_equal(h.epochs, 1);
    assert_int_equal(h.block_size, 4);
    assert_int_equal(h.drafter_layers, 1);
    uint64_t tfp = 0;
    assert_int_equal(ckpt_target_fingerprint(fx.model_dir, &tfp), 0);
    assert_true(tfp != 0);
    assert_true(h.target_fp == tfp);

    char want[700];
    snprintf(want, sizeof want, "--resume %s/checkpoints/step_2: --token-budget 512 does not match the "
                                "checkpoint's 256", out);
    {
        const char *extra[] = {"--token-budget", "512", "--max-steps", "4", NULL};
        const char *wants[] = {want, "rerun with --token-budget 256", "refused: 1 setting(s)", NULL};
        expect_refused("tb", extra, wants);
    }
    {
        const char *extra[] = {"--drafter-layers", "2", "--max-steps", "4", NULL};
        const char *wants[] = {"--drafter-layers 2 does not match the checkpoint's 1",
                               "rerun with --drafter-layers 1", NULL};
        expect_refused("dl", extra, wants);
    }
    {   /* two at once: both named */
        const char *extra[] = {"--seed", "6", "--num-anchors", "16", "--max-steps", "4", NULL};
        const char *wants[] = {"--seed 6 does not match the checkpoint's 5", "rerun with --seed 5",
                               "--num-anchors 16 does not match the checkpoint's 8", "refused: 2 setting(s)", NULL};
        expect_refused("seed", extra, wants);
    }
    {   /* another dataset (40 of the samples): cursor.bin's fingerprint */
        const char *extra[] = {"--data", cache40, "--max-steps", "4", NULL};
        const char *wants[] = {"does not match the checkpoint's dataset", "rerun with the run's --data", NULL};
        expect_refused("data", extra, wants);
    }
    {   /* a target of the same shapes with other weights: a copy of the tiny model with one
         * byte changed at a sampled offset of its weights (sample 10 of 64) */
        char other[400], cmd[1000], st[500];
        snprintf(other, sizeof other, "%s/tiny2", fx.root);
        snprintf(cmd, sizeof cmd, "cp -r %s %s", fx.model_dir, other);
        assert_int_equal(system(cmd), 0);
        snprintf(st, sizeof st, "%s/model.safetensors", other);
        struct stat sb;
        assert_int_equal(stat(st, &sb), 0);
        FILE *mf = fopen(st, "r+b");
        assert_non_null(mf);
        long at = (long)(((uint64_t)sb.st_size - 4096) / 63 * 10 + 100);
        assert_int_equal(fseek(mf, at, SEEK_SET), 0);
        int byte = fgetc(mf);
        assert_int_equal(fseek(mf, at, SEEK_SET), 0);
        assert_int_not_equal(fputc(byte ^ 0x40, mf), EOF);
        assert_int_equal(fclose(mf), 0);
        uint64_t fp2 = 0;
        assert_int_equal(ckpt_target_fingerprint(other, &fp2), 0);
        assert_true(fp2 != tfp);
        const char *extra[] = {"--target-model", other, "--max-steps", "4", NULL};
        const char *wants[] = {"same shapes, other weights", "rerun with the run's --target-model", NULL};
        expect_refused("target", extra, wants);
    }
    /* the same settings, more steps, other --save-every / --progress-every: continues */
    snprintf(log, sizeof log, "%s/resume.out", fx.root);
    {
        const char *extra[] = {"--max-steps", "4", "--save-every", "3", "--progress-every", "2", NULL};
        double secs = 0;
        int code = run_draftline(log, 1, extra, 60, &secs);
        char *txt = pf_slurp(log, NULL);
        if (code != 0) fprintf(stderr, "%s\n", txt ? txt : "");
        assert_int_equal(code, 0);
        assert_non_null(strstr(txt, "steps 2..4"));
        assert_null(strstr(txt, "does not match"));
        free(txt);
    }
    assert_int_equal(pf_count_lines(p), 4);
    snprintf(p, sizeof p, "%s/checkpoints/latest", out);
    char *latest = pf_slurp(p, NULL);
    assert_non_null(latest);
    assert_string_equal(latest, "step_4\n");
    free(latest);

    /* an old checkpoint: the settings bytes zeroed as before they were recorded */
    snprintf(ck, sizeof ck, "%s/checkpoints/step_4", out);
    assert_int_equal(ckpt_read_hdr(ck, &h), 0);
    snprintf(p, sizeof p, "%s/state.bin", ck);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    size_t off = offsetof(ckpt_state_hdr_t, settings);
    static const uint8_t zero[64];
    assert_int_equal(fseek(f, (long)off, SEEK_SET), 0);
    assert_int_equal(fwrite(zero, 1, sizeof h - off, f), sizeof h - off);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(ckpt_read_hdr(ck, &h), 0);
    assert_int_equal(h.settings, 0);
    {
        const char *extra[] = {"--token-budget", "512", "--max-steps", "6", NULL};
        const char *wants[] = {"predates recorded run settings", "the batching options (--token-budget 512",
                               "do not match the checkpoint's cursor", NULL};
        expect_refused("old_tb", extra, wants);
    }
    {
        const char *extra[] = {"--drafter-layers", "2", "--max-steps", "6", NULL};
        const char *wants[] = {"predates recorded run settings",
                               "--drafter-layers 2 does not match the checkpoint's 1", NULL};
        expect_refused("old_dl", extra, wants);
    }
}

static int same_bytes(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0 || sa.st_size != sb.st_size) return 0;
    char *x = pf_slurp(a, NULL), *y = pf_slurp(b, NULL);
    int same = x && y && memcmp(x, y, (size_t)sa.st_size) == 0;
    free(x);
    free(y);
    return same;
}

/* A copy of run dir from at dir to, cut back to step 2 as Ctrl-C at step 2 leaves it:
 * checkpoints/latest names step_2, step_4 is gone, steps.jsonl holds steps 0 and 1. */
static void copy_cut_to_step2(const char *from, const char *to) {
    char cmd[1200], p[700];
    snprintf(cmd, sizeof cmd, "cp -r %s %s && rm -r %s/checkpoints/step_4", from, to, to);
    assert_int_equal(system(cmd), 0);
    snprintf(p, sizeof p, "%s/checkpoints/latest", to);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("step_2\n", f);
    assert_int_equal(fclose(f), 0);
    snprintf(p, sizeof p, "%s/steps.jsonl", to);
    char *txt = pf_slurp(p, NULL);
    assert_non_null(txt);
    char *third = strstr(txt, "{\"step\":2,");
    assert_non_null(third);
    f = fopen(p, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(txt, 1, (size_t)(third - txt), f), (size_t)(third - txt));
    assert_int_equal(fclose(f), 0);
    free(txt);
    assert_int_equal(pf_count_lines(p), 2);
}

/* dir's step_4 state.bin is A's bitwise, its steps.jsonl holds steps 0..3 in order, and
 * its lines of steps 2 and 3 are A's up to the timestamp. */
static void expect_as_uninterrupted(const char *a_dir, const char *dir) {
    char x[700], y[700];
    snprintf(x, sizeof x, "%s/checkpoints/step_4/state.bin", a_dir);
    snprintf(y, sizeof y, "%s/checkpoints/step_4/state.bin", dir);
    assert_true(same_bytes(x, y));
    snprintf(x, sizeof x, "%s/steps.jsonl", a_dir);
    snprintf(y, sizeof y, "%s/steps.jsonl", dir);
    assert_int_equal(pf_count_lines(y), 4);
    char *ta = pf_slurp(x, NULL), *tb = pf_slurp(y, NULL);
    assert_non_null(ta);
    assert_non_null(tb);
    const char *at = tb;
    for (int s = 0; s < 4; s++) {   /* continuous: each step once, in order, one per line */
        char key[32];
        snprintf(key, sizeof key, "{\"step\":%d,", s);
        assert_true(!strncmp(at, key, strlen(key)));
        at = strchr(at, '\n');
        assert_non_null(at);
        at++;
    }
    for (int s = 2; s < 4; s++) {
        char key[32];
        snprintf(key, sizeof key, "{\"step\":%d,", s);
        const char *la = strstr(ta, key), *lb = strstr(tb, key);
        assert_non_null(la);
        assert_non_null(lb);
        const char *ea = strstr(la, "\"t\":"), *eb = strstr(lb, "\"t\":");
        assert_non_null(ea);
        assert_int_equal(ea - la, eb - lb);
        assert_memory_equal(la, lb, (size_t)(ea - la));
    }
    free(ta);
    free(tb);
}

/* --resume alone: every setting not given is the run's (checkpoint, run.json). */
static void test_resume_defaults(void **state) {
    (void)state;
    char a_dir[400], b_dir[400], d_dir[400], d_ck[500], log[500], p[700];
    snprintf(a_dir, sizeof a_dir, "%s/full", fx.root);
    snprintf(b_dir, sizeof b_dir, "%s/cut_b", fx.root);
    snprintf(d_dir, sizeof d_dir, "%s/cut_d", fx.root);
    snprintf(d_ck, sizeof d_ck, "%s/checkpoints/step_2", d_dir);
    /* A: the uninterrupted run, every setting given */
    snprintf(log, sizeof log, "%s/full.out", fx.root);
    {
        const char *args[] = {"--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                              "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                              "--drafter-layers", "1", "--lr", "3e-3", "--seed", "5", "--threads", "1",
                              "--max-steps", "4", "--save-every", "2", "--deterministic", "--out", a_dir, NULL};
        int code = run_only(log, args, 60);
        if (code != 0) { char *t = pf_slurp(log, NULL); fprintf(stderr, "%s\n", t ? t : ""); free(t); }
        assert_int_equal(code, 0);
    }
    {   /* run.json records what --resume defaults to: absolute target and data cache */
        char rp[PATH_MAX], want[PATH_MAX + 64];
        snprintf(p, sizeof p, "%s/run.json", a_dir);
        char *rj = pf_slurp(p, NULL);
        assert_non_null(rj);
        assert_non_null(realpath(fx.model_dir, rp));
        snprintf(want, sizeof want, "\"target_model\":\t\"%s\"", rp);
        assert_non_null(strstr(rj, want));
        assert_non_null(realpath(fx.cache, rp));
        snprintf(want, sizeof want, "\"data\":\t\"%s\"", rp);
        assert_non_null(strstr(rj, want));
        assert_non_null(strstr(rj, "\"save_every\":\t2"));
        assert_non_null(strstr(rj, "\"deterministic\":\ttrue"));
        free(rj);
    }
    copy_cut_to_step2(a_dir, b_dir);
    copy_cut_to_step2(a_dir, d_dir);
    /* an explicit mismatch is still refused, nothing written */
    snprintf(log, sizeof log, "%s/cut_tb.out", fx.root);
    {
        char *before = snapshot_of(d_dir);
        const char *args[] = {"--resume", d_ck, "--token-budget", "512", NULL};
        int code = run_only(log, args, 30);
        char *txt = pf_slurp(log, NULL);
        assert_non_null(txt);
        if (code != 2) fprintf(stderr, "exit %d\n%s\n", code, txt);
        assert_int_equal(code, 2);
        assert_non_null(strstr(txt, "--token-budget 512 does not match the checkpoint's 256"));
        assert_non_null(strstr(txt, "refused: 1 setting(s)"));
        assert_null(strstr(txt, "draftline run "));
        char *after = snapshot_of(d_dir);
        assert_string_equal(before, after);
        free(before);
        free(after);
        free(txt);
    }
    /* B: --resume RUN_DIR --max-steps 4, nothing else */
    snprintf(log, sizeof log, "%s/cut_b.out", fx.root);
    {
        const char *args[] = {"--resume", b_dir, "--max-steps", "4", NULL};
        int code = run_only(log, args, 60);
        char *txt = pf_slurp(log, NULL);
        if (code != 0) fprintf(stderr, "%s\n", txt ? txt : "");
        assert_int_equal(code, 0);
        assert_non_null(strstr(txt, "not given, so taken from the checkpoint and its run:"));
        assert_non_null(strstr(txt, " --token-budget 256 --max-len 256 --num-anchors 8"));
        assert_non_null(strstr(txt, " --seed 5 "));
        assert_non_null(strstr(txt, " --deterministic"));
        assert_null(strstr(txt, " --max-steps 4"));   /* given: not listed */
        assert_non_null(strstr(txt, "steps 2..4"));
        assert_null(strstr(txt, "does not match"));
        assert_null(strstr(txt, "changes from"));
        free(txt);
    }
    expect_as_uninterrupted(a_dir, b_dir);
    /* D: --resume CKPT_DIR alone (--out is the checkpoint's run, --max-steps its 4) */
    snprintf(log, sizeof log, "%s/cut_d.out", fx.root);
    {
        const char *args[] = {"--resume", d_ck, NULL};
        int code = run_only(log, args, 60);
        char *txt = pf_slurp(log, NULL);
        if (code != 0) fprintf(stderr, "%s\n", txt ? txt : "");
        assert_int_equal(code, 0);
        char want[600];
        assert_non_null(strstr(txt, " --max-steps 4 "));
        snprintf(want, sizeof want, " --save-every 2 --deterministic --out %s", d_dir);
        if (!strstr(txt, want)) fprintf(stderr, "missing \"%s\" in:\n%s\n", want, txt);
        assert_non_null(strstr(txt, want));
        assert_non_null(strstr(txt, "steps 2..4"));
        free(txt);
    }
    expect_as_uninterrupted(a_dir, d_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_check),
        cmocka_unit_test(test_resume_defaults),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
