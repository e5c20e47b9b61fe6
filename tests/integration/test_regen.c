/* draftline regen, end to end as real processes ($DL_BIN_DIR/draftline, default bin),
 * on the first GSM8K questions with the embedded SmolLM2 (greedy, CPU, one thread):
 *  - an uninterrupted run writes exactly --limit valid OpenAI-style lines whose user
 *    turns are the GSM8K questions in file order and whose assistant turns are
 *    non-empty;
 *  - a second run is killed with SIGKILL after its first batch is on disk, a partial
 *    line is appended (what a kill inside a write leaves), and a restart completes
 *    it: exactly --limit valid lines, no duplicates, byte-identical to the
 *    uninterrupted run (greedy decoding is deterministic and batch-independent);
 *  - a third start finds nothing to do and leaves the file as it is;
 *  - --max-seconds already spent stops after one batch; a rerun completes the file
 *    byte-identical to the uninterrupted run;
 *  - a foreign --out keeps every byte (its partial last line is refused, not cut); a
 *    --data with no usable prompt fails (exit 1) and leaves no empty --out.
 * Exit 77 (skip) when the model or ../shared/data/gsm8k is absent. Hard timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/base/paths.h"
#include "tests/support/proc.h"

#define LIMIT 6
#define TIMEOUT_MS 120000

static char g_bin[1024], g_data[1100], g_dir[256];

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

static int count_lines(const char *path) {
    char *b = slurp(path, NULL);
    if (!b) return 0;
    int n = 0;
    for (char *p = b; *p; p++) n += *p == '\n';
    free(b);
    return n;
}

static int spawn_regen(proc_t *p, const char *out) {
    char *argv[] = {"draftline", "regen", "--data", g_data, "--out", (char *)out,
                    "--max-new-tokens", "16", "--batch", "2", "--limit", "6", "--threads", "1", NULL};
    return proc_spawn_exec(p, "regen", g_bin, argv);
}

static int run_regen(const char *out) {
    proc_t p;
    memset(&p, 0, sizeof p);
    assert_int_equal(spawn_regen(&p, out), 0);
    int code = -1;
    assert_int_equal(proc_wait(&p, TIMEOUT_MS, &code), 0);
    proc_kill(&p);
    return code;
}

/* The same command with --max-seconds S. */
static int run_regen_max_seconds(const char *out, const char *secs) {
    char *argv[] = {"draftline", "regen", "--data", g_data, "--out", (char *)out,
                    "--max-new-tokens", "16", "--batch", "2", "--limit", "6", "--threads", "1",
                    "--max-seconds", (char *)secs, NULL};
    proc_t p;
    memset(&p, 0, sizeof p);
    assert_int_equal(proc_spawn_exec(&p, "regen", g_bin, argv), 0);
    int code = -1;
    assert_int_equal(proc_wait(&p, TIMEOUT_MS, &code), 0);
    proc_kill(&p);
    return code;
}

/* The first n "question" fields of the GSM8K file. */
static void questions(char **q, int n) {
    FILE *f = fopen(g_data, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    for (int i = 0; i < n; i++) {
        assert_true(getline(&line, &cap, f) > 0);
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        q[i] = strdup(cJSON_GetObjectItem(j, "question")->valuestring);
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
}

static void check_output(const char *path) {
    char *q[LIMIT];
    questions(q, LIMIT);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, f) > 0) {
        assert_true(n < LIMIT);
        cJSON *j = cJSON_Parse(line);
        if (!j) fail_msg("%s: line %d is not valid JSON", path, n + 1);
        cJSON *m = cJSON_GetObjectItem(j, "messages");
        assert_int_equal(cJSON_GetArraySize(m), 2);
        cJSON *u = cJSON_GetArrayItem(m, 0), *a = cJSON_GetArrayItem(m, 1);
        assert_string_equal(cJSON_GetObjectItem(u, "role")->valuestring, "user");
        assert_string_equal(cJSON_GetObjectItem(a, "role")->valuestring, "assistant");
        /* in order, so no duplicates and none missing */
        assert_string_equal(cJSON_GetObjectItem(u, "content")->valuestring, q[n]);
        assert_true(strlen(cJSON_GetObjectItem(a, "content")->valuestring) > 0);
        cJSON_Delete(j);
        n++;
    }
    free(line);
    fclose(f);
    assert_int_equal(n, LIMIT);
    for (int i = 0; i < LIMIT; i++) free(q[i]);
}

static void test_regen_kill_resume(void **state) {
    (void)state;
    char ref[512], out[512];
    snprintf(ref, sizeof ref, "%s/ref.jsonl", g_dir);
    snprintf(out, sizeof out, "%s/out.jsonl", g_dir);
    assert_int_equal(run_regen(ref), 0);
    check_output(ref);

    /* kill -9 once the first batch is on disk */
    proc_t p;
    memset(&p, 0, sizeof p);
    assert_int_equal(spawn_regen(&p, out), 0);
    int lines = 0, code = -1;
    struct timespec ts = {0, 20 * 1000 * 1000};
    for (int waited = 0; waited < TIMEOUT_MS; waited += 20) {
        lines = count_lines(out);
        if (lines >= 2) break;
        nanosleep(&ts, NULL);
    }
    assert_int_equal(proc_signal(&p, SIGKILL), 0);
    assert_int_equal(proc_wait(&p, 10000, &code), 0);
    proc_kill(&p);
    assert_int_equal(code, 128 + SIGKILL);  /* killed, not finished */
    lines = count_lines(out);
    fprintf(stderr, "killed with %d complete lines on disk\n", lines);
    assert_true(lines >= 2 && lines < LIMIT);
    /* what a kill in the middle of a write leaves */
    FILE *f = fopen(out, "a");
    fputs("{\"messages\":[{\"role\":\"user\",\"cont", f);
    fclose(f);

    assert_int_equal(run_regen(out), 0);
    check_output(out);
    size_t la, lb;
    char *a = slurp(ref, &la), *b = slurp(out, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(b);
    /* nothing left to do */
    assert_int_equal(run_regen(out), 0);
    b = slurp(out, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    /* resume validates the lines it keeps: one without an assistant turn is an error naming it */
    char bad[512];
    snprintf(bad, sizeof bad, "%s/bad.jsonl", g_dir);
    f = fopen(bad, "w");
    fputs("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\"}]}\n"
          "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}\n", f);
    fclose(f);
    fprintf(stderr, "(expected: the ERROR line below is a negative test's)\n");
    assert_int_equal(run_regen(bad), 1);
    assert_int_equal(count_lines(bad), 2); /* untouched */
}

/* --max-seconds: a budget already spent after the first batch stops there (exit 0,
 * exactly one batch of whole lines); running again without it resumes to the same
 * bytes as the uninterrupted run of test_regen_kill_resume. */
static void test_regen_max_seconds(void **state) {
    (void)state;
    char ref[512], out[512];
    snprintf(ref, sizeof ref, "%s/ref.jsonl", g_dir);
    snprintf(out, sizeof out, "%s/budget.jsonl", g_dir);
    assert_int_equal(run_regen_max_seconds(out, "0.000001"), 0);
    assert_int_equal(count_lines(out), 2);  /* --batch 2: the batch in flight completes */
    assert_int_equal(run_regen(out), 0);
    size_t la, lb;
    char *a = slurp(ref, &la), *b = slurp(out, &lb);
    assert_non_null(a);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
}

/* `draftline regen --data IN --out OUT` with these IN and OUT; returns the exit code. */
static int run_regen_on(const char *in, const char *out) {
    char *argv[] = {"draftline", "regen", "--data", (char *)in, "--out", (char *)out,
                    "--max-new-tokens", "4", "--batch", "1", "--limit", "1", "--threads", "1", NULL};
    proc_t p;
    memset(&p, 0, sizeof p);
    assert_int_equal(proc_spawn_exec(&p, "regen", g_bin, argv), 0);
    int code = -1;
    assert_int_equal(proc_wait(&p, TIMEOUT_MS, &code), 0);
    proc_kill(&p);
    return code;
}

/* An --out that is not regen output keeps every byte: a last line without a newline
 * that is not the start of a regen line is refused, not truncated (it was, before the
 * complete lines were even checked); a --data with no usable prompt is an error (exit
 * 1) and leaves no empty --out behind; a missing --data creates no --out. */
static void test_regen_foreign_and_empty(void **state) {
    (void)state;
    static const char *const foreign[] = {"notes without newline",
                                          "{\"messages\":[]}\nnot json and no newline"};
    char out[512], in[512];
    snprintf(out, sizeof out, "%s/foreign.txt", g_dir);
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(out, "wb");
        assert_non_null(f);
        fputs(foreign[i], f);
        fclose(f);
        fprintf(stderr, "(expected: the ERROR line below is a negative test's)\n");
        assert_int_equal(run_regen_on(g_data, out), 1);
        size_t n;
        char *b = slurp(out, &n);
        assert_non_null(b);
        assert_int_equal(n, strlen(foreign[i]));
        assert_memory_equal(b, foreign[i], n);
        free(b);
    }
    snprintf(in, sizeof in, "%s/noprompt.jsonl", g_dir);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    fputs("{\"foo\": \"bar\"}\n{broken\n", f);
    fclose(f);
    snprintf(out, sizeof out, "%s/empty_out.jsonl", g_dir);
    fprintf(stderr, "(expected: the ERROR line below is a negative test's)\n");
    assert_int_equal(run_regen_on(in, out), 1);
    assert_int_not_equal(access(out, F_OK), 0);
    fprintf(stderr, "(expected: the ERROR line below is a negative test's)\n");
    assert_int_equal(run_regen_on("/nonexistent/in.jsonl", out), 1);
    assert_int_not_equal(access(out, F_OK), 0);
}

/* --max-ctx past the model's context (SmolLM2: 8192 positions) is refused (exit 2)
 * after the model's config is read, and no --out is created. */
static void test_regen_max_ctx_past_context(void **state) {
    (void)state;
    char out[512];
    snprintf(out, sizeof out, "%s/too_long.jsonl", g_dir);
    char *argv[] = {"draftline", "regen", "--data", g_data, "--out", out, "--max-ctx", "100000",
                    "--max-new-tokens", "4", "--batch", "1", "--limit", "1", "--threads", "1", NULL};
    proc_t p;
    memset(&p, 0, sizeof p);
    assert_int_equal(proc_spawn_exec(&p, "regen", g_bin, argv), 0);
    int code = -1;
    assert_int_equal(proc_wait(&p, TIMEOUT_MS, &code), 0);
    proc_kill(&p);
    assert_int_equal(code, 2);
    assert_int_not_equal(access(out, F_OK), 0);
}

int main(void) {
    char model[1024], shared[1024];
    if (paths_default_model(model, sizeof model) < 0 || access(model, R_OK) != 0) {
        fprintf(stderr, "SKIP: the embedded model is absent (run `make model`)\n");
        return 77;
    }
    if (paths_shared_data(shared, sizeof shared) < 0) return 77;
    snprintf(g_data, sizeof g_data, "%s/gsm8k/train.jsonl", shared);
    if (access(g_data, R_OK) != 0) {
        fprintf(stderr, "SKIP: %s absent\n", g_data);
        return 77;
    }
    const char *b = getenv("DL_BIN_DIR");
    snprintf(g_bin, sizeof g_bin, "%s/draftline", b ? b : "bin");
    if (access(g_bin, X_OK) != 0) {
        fprintf(stderr, "%s not found (set DL_BIN_DIR)\n", g_bin);
        return 1;
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/dl-test-regen-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    proc_watchdog(300);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_regen_kill_resume),
                                       cmocka_unit_test(test_regen_max_seconds),
                                       cmocka_unit_test(test_regen_foreign_and_empty),
                                       cmocka_unit_test(test_regen_max_ctx_past_context)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    proc_watchdog(0);
    proc_kill_all();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return rc;
}
