/* `draftline mkmodel --tokenizer DIR` says when the tokenizer's vocabulary is not the model's
 * (the fixture tokenizer: 3,012 ids; tiny-qwen3: 151,936): a random model outputs ids the
 * tokenizer cannot decode, and generate/eval stopped at the first one with "tok_decode: id
 * ... out of [0, 3012)" and no word at mkmodel time (the 2026-12-02 review). The tokenizer
 * files are still copied. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char root[] = "/tmp/dl_mkmodel_cliXXXXXX";

static void test_tokenizer_vocab_note(void **state) {
    (void)state;
    const char *bin = getenv("DL_BIN_DIR") ? getenv("DL_BIN_DIR") : "bin";
    char cmd[1400];
    snprintf(cmd, sizeof cmd,
             "timeout 60 '%s/draftline' mkmodel --config tiny-qwen3 --out '%s/m' "
             "--tokenizer tests/fixtures/tokenizer/qwen3_style > '%s/out.txt' 2>&1", bin, root, root);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char p[600];
    snprintf(p, sizeof p, "%s/out.txt", root);
    char *buf = pf_slurp(p, NULL);
    assert_non_null(buf);
    printf("%s", buf);
    assert_non_null(strstr(buf, "has 3012 token ids, the model's vocabulary 151936"));
    assert_non_null(strstr(buf, "ids 3012..151935, which the tokenizer cannot decode"));
    snprintf(p, sizeof p, "%s/m/tokenizer.json", root);
    free(buf);
    assert_int_equal(access(p, R_OK), 0);
}

int main(void) {
    proc_watchdog(90);
    if (!mkdtemp(root)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenizer_vocab_note),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) rc = rc ? rc : 1;
    return rc;
}
