/* Bytes the vocabulary cannot encode (issue 15 item 11): tok_encode counts them in
 * tok_ids_t.n_dropped (SmolLM2 has no token for 0xC0, 0xFE, 0xFF), and `draftline
 * prepare` warns "file:line: N bytes ... dropped" once per line, for the first 10
 * such lines, then "... N more lines" (before: nothing was said). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/data/tokenizer.h"

static int have_model(char *model, size_t cap) {
    if (paths_default_model(model, cap) < 0 || access(model, R_OK) != 0) {
        fprintf(stderr, "skip: %s absent (run `make model`)\n", model);
        return 0;
    }
    return 1;
}

static void test_n_dropped(void **state) {
    (void)state;
    char model[4096];
    if (!have_model(model, sizeof model)) skip();
    tok_t *t = NULL;
    assert_int_equal(tok_load_gguf(model, &t), 0);
    tok_ids_t v = {0};
    assert_int_equal(tok_encode(t, "h\xc3\xa9llo world", 12, 1, 0, &v), 0);
    assert_int_equal(v.n_dropped, 0);
    size_t n_ok = v.n;
    /* the same text with three bytes SmolLM2 has no token for */
    v.n = 0;
    assert_int_equal(tok_encode(t, "h\xc3\xa9l\xc0lo\xfe w\xfforld", 15, 1, 0, &v), 0);
    assert_int_equal(v.n_dropped, 3);
    assert_int_equal(v.dropped_byte, 0xC0);
    char *back;
    size_t bl;
    assert_int_equal(tok_decode(t, v.ids, v.n, 0, &back, &bl), 0);
    assert_string_equal(back, "h\xc3\xa9llo world");
    free(back);
    /* counted across calls until the caller resets it; a lone byte too */
    assert_int_equal(tok_encode(t, "\xff", 1, 1, 0, &v), 0);
    assert_int_equal(v.n_dropped, 4);
    assert_int_equal(v.dropped_byte, 0xC0);
    assert_true(n_ok > 0);
    tok_ids_free(&v);
    tok_destroy(&t);
}

static void test_prepare_warns(void **state) {
    (void)state;
    const char *bin = getenv("DL_BIN_DIR");
    char model[4096], exe[4200], dir[] = "/tmp/dl_tokdrop_XXXXXX", data[128], cmd[9000];
    if (!bin) { fprintf(stderr, "skip: DL_BIN_DIR not set (make test sets it)\n"); skip(); }
    if (!have_model(model, sizeof model)) skip();
    snprintf(exe, sizeof exe, "%s/draftline", bin);
    if (access(exe, X_OK) != 0) { fprintf(stderr, "skip: %s absent\n", exe); skip(); }
    assert_non_null(mkdtemp(dir));
    snprintf(data, sizeof data, "%s/bad.jsonl", dir);
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    fputs("{\"text\": \"a clean line\"}\n", f);                           /* line 1 */
    fputs("{\"text\": \"three \xc0 bad \xfe bytes \xff here\"}\n", f);    /* line 2 */
    for (int i = 0; i < 12; i++) fprintf(f, "{\"text\": \"line %d \xff\"}\n", i + 3); /* lines 3..14 */
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s prepare --data %s --format text --out %s/bad.dlc 2>%s/err >/dev/null", exe, data,
             dir, dir);
    assert_int_equal(WEXITSTATUS(system(cmd)), 0);
    char errp[200], buf[16384];
    snprintf(errp, sizeof errp, "%s/err", dir);
    f = fopen(errp, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char want[512];
    snprintf(want, sizeof want, "%s:2: 3 bytes the tokenizer cannot encode (invalid UTF-8, first 0xC0) dropped", data);
    if (!strstr(buf, want)) fail_msg("no \"%s\" in:\n%s", want, buf);
    snprintf(want, sizeof want, "%s:3: 1 byte the tokenizer cannot encode (invalid UTF-8, first 0xFF)", data);
    assert_non_null(strstr(buf, want));
    snprintf(want, sizeof want, "%s:1:", data);
    assert_null(strstr(buf, want));
    snprintf(want, sizeof want, "%s:12:", data); /* the 11th such line: counted, not shown */
    assert_null(strstr(buf, want));
    int lines = 0;
    for (const char *p = buf; (p = strstr(p, "cannot encode (invalid")); p++) lines++;
    assert_int_equal(lines, 10);
    assert_non_null(strstr(buf, "... 3 more lines with bytes the tokenizer cannot encode"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_n_dropped),
        cmocka_unit_test(test_prepare_warns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
