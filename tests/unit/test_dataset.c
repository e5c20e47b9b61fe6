/* common/data/dataset: every record form, .gz, JSON array streaming (brackets
 * and quotes inside strings, line numbers), bad records reported with
 * file:line and skipped (strict: fatal), and the real ShareGPT / GSM8K files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/data/dataset.h"

static char g_dir[64];

static int setup(void **state) {
    (void)state;
    log_init("test_dataset", LOG_ERROR); /* skipped-line warnings are expected */
    snprintf(g_dir, sizeof g_dir, "/tmp/dl_dataset_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char JSONL[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"be nice\"}, {\"role\": \"user\", \"content\": \"hi\"},"
    " {\"role\": \"assistant\", \"content\": \"hello\"}]}\n"
    "\n"
    "{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}, {\"from\": \"gpt\", \"value\": \"a\"}]}\r\n"
    "{\"text\": \"plain text\"}\n"
    "{\"question\": \"1+1?\", \"answer\": \"2\", \"id\": 5}\n"
    "{\"messages\": [{\"role\": \"user\", \"content\": \"broken\"\n"          /* line 6: invalid JSON */
    "{\"conversations\": [{\"from\": \"alien\", \"value\": \"x\"}]}\n"        /* line 7: unknown from */
    "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"part1 \"}, "
    "{\"type\": \"text\", \"text\": \"part2\"}]}, {\"role\": \"assistant\", \"content\": \"ok\"}]}\n"
    "[1, 2]\n"                                                                   /* line 9: not an object */
    "{\"text\": \"last, no newline\"}";

static void write_file(const char *path, const char *s, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(s, 1, n, f), n);
    fclose(f);
}

static void check_jsonl_samples(const char *path) {
    ds_opts_t o = {.prompt_field = "question", .response_field = "answer"};
    ds_reader_t *r = NULL;
    assert_int_equal(ds_open(path, &o, &r), 0);
    ds_sample_t s = {0};
    assert_int_equal(ds_next(r, &s), 1);
    assert_int_equal(s.n_msgs, 3);
    assert_string_equal(s.msgs[0].role, "system");
    assert_string_equal(s.msgs[2].role, "assistant");
    assert_int_equal(s.msgs[2].content_len, 5);
    assert_memory_equal(s.msgs[2].content, "hello", 5);
    assert_int_equal(ds_next(r, &s), 1);
    assert_int_equal(s.n_msgs, 2);
    assert_string_equal(s.msgs[0].role, "user");
    assert_string_equal(s.msgs[1].role, "assistant");
    assert_string_equal(s.msgs[1].content, "a");
    assert_int_equal(ds_next(r, &s), 1);
    assert_true(s.is_text);
    assert_string_equal(s.text, "plain text");
    assert_int_equal(ds_next(r, &s), 1);
    assert_false(s.is_text);
    assert_string_equal(s.msgs[0].content, "1+1?");
    assert_string_equal(s.msgs[1].role, "assistant");
    assert_string_equal(s.msgs[1].content, "2");
    assert_int_equal(ds_next(r, &s), 1); /* lines 6, 7 skipped */
    assert_string_equal(s.msgs[0].content, "part1 part2");
    assert_int_equal(ds_skipped(r), 2);
    assert_int_equal(ds_next(r, &s), 1); /* line 9 skipped */
    assert_true(s.is_text);
    assert_string_equal(s.text, "last, no newline");
    assert_int_equal(ds_next(r, &s), 0);
    assert_int_equal(ds_skipped(r), 3);
    assert_int_equal(ds_bytes_read(r), sizeof JSONL - 1);
    ds_sample_free(&s);
    ds_close(&r);
    assert_null(r);
}

static void test_jsonl_and_gz(void **state) {
    (void)state;
    char p[128], pg[128];
    snprintf(p, sizeof p, "%s/mixed.jsonl", g_dir);
    write_file(p, JSONL, sizeof JSONL - 1);
    check_jsonl_samples(p);
    snprintf(pg, sizeof pg, "%s/mixed.jsonl.gz", g_dir);
    gzFile gz = gzopen(pg, "wb");
    assert_non_null(gz);
    assert_int_equal(gzwrite(gz, JSONL, sizeof JSONL - 1), (int)(sizeof JSONL - 1));
    gzclose(gz);
    check_jsonl_samples(pg);

    /* strict: the first bad record is fatal, naming file and line */
    ds_opts_t o = {.prompt_field = "question", .response_field = "answer", .strict = 1};
    ds_reader_t *r = NULL;
    ds_sample_t s = {0};
    assert_int_equal(ds_open(p, &o, &r), 0);
    int rc;
    while ((rc = ds_next(r, &s)) == 1) {}
    assert_int_equal(rc, DL_EFORMAT);
    char want[160];
    snprintf(want, sizeof want, "%s:6: invalid JSON", p);
    assert_non_null(strstr(dl_errmsg(), want));
    ds_close(&r);
    /* forced format: a text record is bad for openai */
    ds_opts_t o2 = {.format = DS_OPENAI};
    assert_int_equal(ds_open(p, &o2, &r), 0);
    int n = 0;
    while ((rc = ds_next(r, &s)) == 1) n++;
    assert_int_equal(rc, 0);
    assert_int_equal(n, 2); /* record 1 and the parts record */
    ds_close(&r);
    ds_sample_free(&s);
    /* fields format without field names is refused; a missing file is ENOENT */
    ds_opts_t o3 = {.format = DS_FIELDS};
    assert_int_equal(ds_open(p, &o3, &r), DL_EINVAL);
    assert_int_equal(ds_open("/nonexistent.jsonl", &o2, &r), DL_ENOENT);
    ds_format_t f;
    assert_int_equal(ds_parse_format("sharegpt", &f), 0);
    assert_int_equal(f, DS_SHAREGPT);
    assert_int_equal(ds_parse_format("csv", &f), DL_EINVAL);
}

static void test_json_array(void **state) {
    (void)state;
    static const char ARR[] =
        "\xEF\xBB\xBF  [\n"
        "  {\"id\": \"a]\", \"conversations\": [\n"
        "     {\"from\": \"human\", \"value\": \"tricky } ] { [ \\\" \\\\\"},\n"
        "     {\"from\": \"gpt\", \"value\": \"line1\\nline2\"}]},\n"
        "  {\"conversations\": \"oops\"},\n"                          /* line 5: bad */
        "  {\"conversations\": [{\"from\": \"human\", \"value\": \"x\"}, {\"from\": \"gpt\", \"value\": \"y\"}]}\n"
        "]\n";
    char p[128];
    snprintf(p, sizeof p, "%s/arr.json", g_dir);
    write_file(p, ARR, sizeof ARR - 1);
    ds_reader_t *r = NULL;
    ds_sample_t s = {0};
    assert_int_equal(ds_open(p, NULL, &r), 0);
    const char *rec;
    size_t len;
    uint64_t line;
    assert_int_equal(ds_next_raw(r, &rec, &len, &line), 1);
    assert_int_equal(line, 2);
    assert_int_equal(rec[0], '{');
    assert_int_equal(rec[len - 1], '}');
    assert_int_equal(ds_parse(NULL, rec, len, &s), 0);
    assert_string_equal(s.msgs[0].content, "tricky } ] { [ \" \\");
    assert_string_equal(s.msgs[1].content, "line1\nline2");
    assert_int_equal(ds_next_raw(r, &rec, &len, &line), 1);
    assert_int_equal(line, 5);
    assert_int_equal(ds_parse(NULL, rec, len, &s), DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "conversations"));
    assert_int_equal(ds_next_raw(r, &rec, &len, &line), 1);
    assert_int_equal(line, 6);
    assert_int_equal(ds_next_raw(r, &rec, &len, &line), 0);
    ds_close(&r);
    /* a truncated array is an error, not a silent end */
    write_file(p, ARR, 60);
    assert_int_equal(ds_open(p, NULL, &r), 0);
    int rc;
    while ((rc = ds_next(r, &s)) == 1) {}
    assert_int_equal(rc, DL_EFORMAT);
    assert_non_null(strstr(dl_errmsg(), "unterminated"));
    ds_close(&r);
    ds_sample_free(&s);
}

/* The real files in ../shared/data, read in place. */
static void test_real_files(void **state) {
    (void)state;
    char d[4096], p[4200];
    assert_int_equal(paths_shared_data(d, sizeof d), 0);
    snprintf(p, sizeof p, "%s/sharegpt_sample/dummy_conversation.json", d);
    if (access(p, R_OK) != 0) {
        fprintf(stderr, "skip: %s absent\n", p);
        skip();
    }
    ds_reader_t *r = NULL;
    ds_sample_t s = {0};
    assert_int_equal(ds_open(p, NULL, &r), 0);
    int n = 0, turns = 0;
    while (ds_next(r, &s) == 1) {
        if (n == 0) {
            assert_string_equal(s.msgs[0].content, "Who are you?");
            assert_string_equal(s.msgs[1].role, "assistant");
        }
        turns += s.n_msgs;
        n++;
    }
    assert_int_equal(n, 500);
    assert_int_equal(turns, 2000);
    assert_int_equal(ds_skipped(r), 0);
    ds_close(&r);
    snprintf(p, sizeof p, "%s/gsm8k/train.jsonl", d);
    ds_opts_t o = {.format = DS_FIELDS, .prompt_field = "question", .response_field = "answer", .strict = 1};
    assert_int_equal(ds_open(p, &o, &r), 0);
    n = 0;
    while (ds_next(r, &s) == 1) n++;
    assert_int_equal(n, 7473);
    ds_close(&r);
    snprintf(p, sizeof p, "%s/humaneval/HumanEval.jsonl.gz", d);
    ds_opts_t oh = {.prompt_field = "prompt", .response_field = "canonical_solution", .strict = 1};
    assert_int_equal(ds_open(p, &oh, &r), 0);
    n = 0;
    while (ds_next(r, &s) == 1) n++;
    assert_int_equal(n, 164);
    ds_close(&r);
    ds_sample_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonl_and_gz),
        cmocka_unit_test(test_json_array),
        cmocka_unit_test(test_real_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
