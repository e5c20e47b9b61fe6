/* common/data/dataset: a NUL in a JSON string ("\u0000", or a raw 0x00 byte inside a
 * string) is part of the text: every record form keeps all of the string's bytes
 * (issue 15 item 5: strlen cut "1\u00002" to "1"), an escaped backslash before
 * "u0000" is not a NUL, and `prepare` tokenizes the whole string, NUL included, as
 * the tokenizer encodes U+0000 (SmolLM2 tokenizer; skipped when it is not here). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/paths.h"
#include "common/data/dataset.h"
#include "common/data/prepare.h"

#define LIT(s) s, sizeof s - 1

static void parse_ok(const char *rec, size_t n, ds_sample_t *s) {
    int rc = ds_parse(NULL, rec, n, s);
    if (rc != 0) fprintf(stderr, "ds_parse: %s\n", dl_errmsg());
    assert_int_equal(rc, 0);
}

static void test_text_nul(void **state) {
    (void)state;
    ds_sample_t s = {0};
    parse_ok(LIT("{\"text\": \"1\\u00002\"}"), &s);
    assert_true(s.is_text);
    assert_int_equal(s.text_len, 3);
    assert_memory_equal(s.text, "1\0" "2", 3);
    /* two NULs, one at each end */
    parse_ok(LIT("{\"text\": \"\\u0000mid\\u0000\"}"), &s);
    assert_int_equal(s.text_len, 5);
    assert_memory_equal(s.text, "\0mid\0", 5);
    /* an escaped backslash followed by u0000 is the six characters \u0000 */
    parse_ok(LIT("{\"text\": \"a\\\\u0000b\"}"), &s);
    assert_int_equal(s.text_len, 8);
    assert_memory_equal(s.text, "a\\u0000b", 8);
    /* a raw NUL byte inside the string (not valid JSON, but read as text before) */
    parse_ok(LIT("{\"text\": \"x\0y\"}"), &s);
    assert_int_equal(s.text_len, 3);
    assert_memory_equal(s.text, "x\0y", 3);
    /* a raw 0xFF elsewhere in the record does not clash with the NUL */
    parse_ok(LIT("{\"text\": \"\xff\\u0000\xfe\"}"), &s);
    assert_int_equal(s.text_len, 3);
    assert_memory_equal(s.text, "\xff\0\xfe", 3);
    ds_sample_free(&s);
}

static void test_chat_nul(void **state) {
    (void)state;
    ds_sample_t s = {0};
    parse_ok(LIT("{\"messages\": [{\"role\": \"user\", \"content\": \"q\\u0000?\"},"
                 " {\"role\": \"assistant\", \"content\": \"ans\\u0000wer tail\"}]}"), &s);
    assert_int_equal(s.n_msgs, 2);
    assert_int_equal(s.msgs[0].content_len, 3);
    assert_memory_equal(s.msgs[0].content, "q\0?", 3);
    assert_int_equal(s.msgs[1].content_len, 12);
    assert_memory_equal(s.msgs[1].content, "ans\0wer tail", 12);
    assert_string_equal(s.msgs[1].role, "assistant");
    /* OpenAI content parts, concatenated */
    parse_ok(LIT("{\"messages\": [{\"role\": \"assistant\", \"content\": [{\"type\": \"text\", \"text\": \"a\\u0000\"},"
                 " {\"type\": \"text\", \"text\": \"b\"}]}]}"), &s);
    assert_int_equal(s.msgs[0].content_len, 3);
    assert_memory_equal(s.msgs[0].content, "a\0b", 3);
    /* ShareGPT */
    parse_ok(LIT("{\"conversations\": [{\"from\": \"human\", \"value\": \"h\\u0000i\"},"
                 " {\"from\": \"gpt\", \"value\": \"ans\\u0000wer tail\"}]}"), &s);
    assert_int_equal(s.msgs[1].content_len, 12);
    assert_memory_equal(s.msgs[1].content, "ans\0wer tail", 12);
    /* fields */
    ds_opts_t o = {.format = DS_FIELDS, .prompt_field = "q", .response_field = "a"};
    assert_int_equal(ds_parse(&o, LIT("{\"q\": \"1\\u00002\", \"a\": \"ans\\u0000wer tail\"}"), &s), 0);
    assert_int_equal(s.msgs[0].content_len, 3);
    assert_memory_equal(s.msgs[0].content, "1\0" "2", 3);
    assert_int_equal(s.msgs[1].content_len, 12);
    assert_memory_equal(s.msgs[1].content, "ans\0wer tail", 12);
    ds_sample_free(&s);
}

/* prepare: the cache's tokens are the tokenizer's encoding of the whole string */
static void test_prepare_nul(void **state) {
    (void)state;
    char model[4096];
    tok_t *t = NULL;
    chat_template_t ct;
    if (paths_default_model(model, sizeof model) < 0 || access(model, R_OK) != 0 || tok_load(model, &t) < 0 ||
        chat_template_from_tok(t, &ct) < 0) {
        tok_destroy(&t);
        skip();
    }
    char dir[64] = "/tmp/dl_dsnul_XXXXXX", in[128], out[128];
    assert_non_null(mkdtemp(dir));
    snprintf(in, sizeof in, "%s/d.jsonl", dir);
    snprintf(out, sizeof out, "%s/d.dlc", dir);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    fputs("{\"text\": \"1\\u00002\"}\n"
          "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": "
          "\"ans\\u0000wer tail\"}]}\n", f);
    fclose(f);
    prep_opts_t po = {.data_path = in, .chat = &ct, .n_threads = 1, .out_path = out};
    prep_stats_t st;
    assert_int_equal(prep_run(t, &po, &st), 0);
    dlc_t *c = NULL;
    assert_int_equal(dlc_open(out, &c), 0);
    assert_int_equal(dlc_n_samples(c), 2);
    const int32_t *ids;
    const uint8_t *mask;
    uint32_t n;
    /* text: exactly the encoding of "1\0" "2" (3 bytes) */
    tok_ids_t want = {0};
    assert_int_equal(tok_encode(t, "1\0" "2", 3, 1, 0, &want), 0);
    assert_int_equal(dlc_sample(c, 0, &ids, &mask, &n), 0);
    assert_int_equal(n, want.n);
    assert_memory_equal(ids, want.ids, n * sizeof *ids);
    /* chat: the trained (assistant) tokens decode to the whole turn, NUL included */
    assert_int_equal(dlc_sample(c, 1, &ids, &mask, &n), 0);
    int32_t tr[256];
    size_t k = 0;
    for (uint32_t i = 0; i < n && k < 256; i++)
        if (mask[i]) tr[k++] = ids[i];
    char *txt = NULL;
    size_t tl = 0;
    assert_int_equal(tok_decode(t, tr, k, 1, &txt, &tl), 0);
    assert_non_null(memmem(txt, tl, "ans\0wer tail", 12));
    free(txt);
    tok_ids_free(&want);
    dlc_close(&c);
    tok_destroy(&t);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    log_init("test_dataset_nul", LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_nul),
        cmocka_unit_test(test_chat_nul),
        cmocka_unit_test(test_prepare_nul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
