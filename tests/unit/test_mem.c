/* common/mem: slabs over POSIX shared memory (create, export, open in another
 * process, unlink, sweep), the handle cache (one open per slab and incarnation)
 * and the inbox allocator (byte bound, no overlap, coalescing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/base/rng.h"
#include "common/mem/hcache.h"
#include "common/mem/inbox.h"
#include "common/mem/slab.h"
#include "common/pipe/layout.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char run_id[17];

static int setup(void **state) {
    (void)state;
    snprintf(run_id, sizeof run_id, "t%x", (unsigned)getpid());
    return 0;
}

static int teardown(void **state) {
    (void)state;
    slab_sweep(run_id);
    return 0;
}

static void test_slab_roundtrip_across_fork(void **state) {
    (void)state;
    slab_t *s = NULL;
    assert_int_equal(slab_create(&s, SLAB_HOST, run_id, "drafter0", 0, 1, 7, "inbox", 1 << 20, -1, 0), 0);
    assert_int_equal(slab_count(run_id), 1);
    assert_true(slab_is_owner(s));
    assert_int_equal(slab_handle(s)->slab_id, 7);
    uint8_t *p = slab_ptr(s);
    for (int i = 0; i < 1 << 20; i++) assert_int_equal(p[i], 0); /* zero-filled */
    slab_handle_t h = *slab_handle(s);
    /* A second object of the same name is refused, never reused. */
    slab_t *dup = NULL;
    assert_int_equal(slab_create(&dup, SLAB_HOST, run_id, "drafter0", 0, 1, 7, "inbox", 64, -1, 0), DL_EIO);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        slab_t *c = NULL;
        if (slab_open(&c, &h, -1) != 0) _exit(2);
        uint8_t *q = slab_ptr(c);
        for (int i = 0; i < 4096; i++) q[i] = (uint8_t)(i * 7 + 1);
        slab_destroy(&c); /* peer: unmap only */
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (int i = 0; i < 4096; i++) assert_int_equal(p[i], (uint8_t)(i * 7 + 1));
    assert_int_equal(slab_count(run_id), 1); /* the peer did not unlink */
    slab_destroy(&s);
    assert_null(s);
    slab_destroy(&s); /* harmless */
    assert_int_equal(slab_count(run_id), 0);
    /* The owner is gone: opening its handle fails with ENOENT (peer died). */
    slab_t *c = NULL;
    assert_int_equal(slab_open(&c, &h, -1), DL_ENOENT);
}

static void test_slab_bad_input(void **state) {
    (void)state;
    slab_t *s = NULL;
    assert_int_equal(slab_create(&s, SLAB_HOST, run_id, "a/b", 0, 1, 0, "x", 64, -1, 0), DL_EINVAL);
    assert_int_equal(slab_create(&s, SLAB_HOST, run_id, "ok", 0, 1, 0, "x", 0, -1, 0), DL_EINVAL);
    slab_handle_t h;
    memset(&h, 'A', sizeof h); /* no terminators anywhere */
    assert_int_equal(slab_open(&s, &h, -1), DL_EPROTO);
    memset(&h, 0, sizeof h);
    strcpy(h.name, "/etc-passwd");
    h.bytes = 10;
    assert_int_equal(slab_open(&s, &h, -1), DL_EPROTO);
    /* GPU check: host slabs pass, a CUDA slab of another GPU fails loudly. */
    memset(&h, 0, sizeof h);
    h.kind = SLAB_CUDA;
    strcpy(h.gpu_uuid, "GPU-aaaa");
    assert_int_equal(slab_check_gpu(&h, "GPU-aaaa"), 0);
    assert_int_equal(slab_check_gpu(&h, "GPU-bbbb"), DL_EINVAL);
    assert_non_null(strstr(dl_errmsg(), "GPU-bbbb"));
#ifndef DL_CUDA
    assert_int_equal(slab_create(&s, SLAB_CUDA, run_id, "d", 0, 1, 0, "x", 64, 0, 0), DL_ENOTSUP);
#endif
}

static void test_sweep_after_crash(void **state) {
    (void)state;
    pid_t pid = fork();
    if (pid == 0) {
        slab_t *a, *b;
        if (slab_create(&a, SLAB_HOST, run_id, "target1", 1, 3, 0, "x", 4096, -1, 0)) _exit(2);
        if (slab_create(&b, SLAB_HOST, run_id, "target1", 1, 3, 1, "y", 4096, -1, 0)) _exit(2);
        raise(SIGKILL); /* crash without unlinking */
    }
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(slab_count(run_id), 2);
    assert_int_equal(slab_sweep(run_id), 2);
    assert_int_equal(slab_count(run_id), 0);
}

static void test_hcache_opens_once_per_incarnation(void **state) {
    (void)state;
    slab_t *a1, *b1, *a2;
    assert_int_equal(slab_create(&a1, SLAB_HOST, run_id, "drafter0", 0, 1, 0, "gpu", 8192, -1, 0), 0);
    assert_int_equal(slab_create(&b1, SLAB_HOST, run_id, "drafter1", 1, 1, 0, "gpu", 8192, -1, 0), 0);
    hcache_t *hc;
    assert_int_equal(hcache_new(&hc, -1), 0);
    void *p, *q;
    for (int i = 0; i < 1000; i++) { /* the hot loop */
        assert_int_equal(hcache_get(hc, slab_handle(a1), &p), 0);
        assert_int_equal(hcache_get(hc, slab_handle(b1), &q), 0);
    }
    assert_int_equal(hcache_opens(hc), 2);
    assert_int_equal(hcache_size(hc), 2);
    ((char *)slab_ptr(a1))[5] = 42;
    assert_int_equal(((char *)p)[5], 42);
    /* drafter0 restarts: new incarnation, the stale mapping is replaced. */
    slab_destroy(&a1);
    assert_int_equal(slab_create(&a2, SLAB_HOST, run_id, "drafter0", 0, 2, 0, "gpu", 8192, -1, 0), 0);
    assert_int_equal(hcache_get(hc, slab_handle(a2), &p), 0);
    assert_int_equal(hcache_opens(hc), 3);
    assert_int_equal(hcache_size(hc), 2);
    ((char *)slab_ptr(a2))[9] = 7;
    assert_int_equal(((char *)p)[9], 7);
    /* drafter1 dies: its mapping is dropped. */
    assert_int_equal(hcache_drop_owner(hc, 1), 1);
    assert_int_equal(hcache_size(hc), 1);
    hcache_destroy(&hc);
    assert_null(hc);
    slab_destroy(&a2);
    slab_destroy(&b1);
    assert_int_equal(slab_count(run_id), 0);
}

static void test_inbox_basic(void **state) {
    (void)state;
    inbox_t *ib;
    uint64_t cap[2] = {4096, 1024};
    assert_int_equal(inbox_new(&ib, cap, 16), 0);
    inbox_slot_t a, b, c, d;
    assert_int_equal(inbox_alloc(ib, 3000, 1, &a), 0);    /* rounds to 3072 */
    assert_int_equal(a.bytes, 3072);
    assert_int_equal(a.tier, INBOX_GPU);
    assert_int_equal(inbox_alloc(ib, 1024, 1, &b), 0);
    assert_int_equal(b.tier, INBOX_GPU);
    assert_int_equal(b.offset, 3072);
    assert_int_equal(inbox_alloc(ib, 1000, 0, &c), DL_EAGAIN); /* GPU full, host not allowed */
    assert_int_equal(inbox_alloc(ib, 1000, 1, &c), 0);
    assert_int_equal(c.tier, INBOX_HOST);
    assert_int_equal(inbox_alloc(ib, 1, 1, &d), DL_EAGAIN);
    assert_int_equal(inbox_alloc(ib, 5000, 1, &d), DL_ERANGE); /* can never fit */
    assert_int_equal(inbox_alloc(ib, 0, 1, &d), DL_EINVAL);
    assert_int_equal(inbox_used(ib, INBOX_GPU), 4096);
    assert_int_equal(inbox_used(ib, INBOX_HOST), 1024);
    assert_int_equal(inbox_free(ib, a.id), 0);
    assert_int_equal(inbox_free(ib, a.id), DL_ENOENT);
    assert_int_equal(inbox_free(ib, b.id), 0);
    assert_int_equal(inbox_largest_free(ib, INBOX_GPU), 4096); /* coalesced */
    assert_int_equal(inbox_high_water(ib), 5120);
    inbox_destroy(&ib);
    assert_null(ib);
}

/* An inbox slot holds the features only (ids, lengths and mask travel in
 * hidden_states_ready): T x row x act bytes, rounded up to the inbox alignment, and
 * tiers sized for exactly N such slots grant N of them at once, not N + 1. */
static void test_inbox_slot_sizing(void **state) {
    (void)state;
    pipe_layout_t l = pipe_layout(256, 64, 4);          /* CPU: f32 features */
    assert_int_equal(l.feat_bytes, 65536);
    assert_int_equal(l.bytes, 65536);
    l = pipe_layout(3, 40, 2);                           /* bf16, rounded up */
    assert_int_equal(l.feat_bytes, 240);
    assert_int_equal(l.bytes, INBOX_ALIGN);
    l = pipe_layout(1000, 2 * 576, 2);
    assert_int_equal(l.feat_bytes, 2304000);
    assert_int_equal(l.bytes, 2304000);                  /* already a multiple of 256 */
    assert_int_equal(pipe_layout(7, 9, 4).bytes, 256);
    assert_int_equal(pipe_layout(65, 1, 4).bytes, 512);
    /* the test_pipeline inbox-bound case: 256 tokens x 64 f32 features; GPU tier
     * 0.000127 GiB, host tier 0.0000635 GiB, both floored to 256 bytes */
    uint64_t slot = pipe_layout(256, 64, 4).bytes;
    uint64_t cap[2] = {(uint64_t)(0.000127 * 1073741824.0) / 256 * 256,
                       (uint64_t)(0.0000635 * 1073741824.0) / 256 * 256};
    assert_int_equal(cap[0] / slot, 2);
    assert_int_equal(cap[1] / slot, 1);
    inbox_t *ib;
    assert_int_equal(inbox_new(&ib, cap, 16), 0);
    inbox_slot_t s[4];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(inbox_alloc(ib, slot, 1, &s[i]), 0);
        assert_int_equal(s[i].bytes, slot);
        assert_int_equal(s[i].tier, i < 2 ? INBOX_GPU : INBOX_HOST);
    }
    assert_int_equal(inbox_alloc(ib, slot, 1, &s[3]), DL_EAGAIN);
    assert_int_equal(inbox_used(ib, INBOX_GPU), 2 * slot);
    assert_int_equal(inbox_used(ib, INBOX_HOST), slot);
    assert_int_equal(inbox_high_water(ib), 3 * slot);
    inbox_destroy(&ib);
}

/* Random alloc/free: live slots never overlap, stay inside their tier, and the
 * bytes in use never exceed the sum of the capacities. */
static void test_inbox_random_bound(void **state) {
    (void)state;
    inbox_t *ib;
    uint64_t cap[2] = {1 << 20, 256 << 10};
    enum { MAXS = 64 };
    assert_int_equal(inbox_new(&ib, cap, MAXS), 0);
    rng_t r;
    rng_seed(&r, 1234);
    inbox_slot_t live[MAXS];
    int nlive = 0, grants = 0, refusals = 0;
    for (int it = 0; it < 20000; it++) {
        if (nlive > 0 && (rng_below(&r, 3) == 0 || nlive == MAXS)) {
            int k = (int)rng_below(&r, (uint64_t)nlive);
            assert_int_equal(inbox_free(ib, live[k].id), 0);
            live[k] = live[--nlive];
        } else {
            inbox_slot_t s;
            int rc = inbox_alloc(ib, 1 + rng_below(&r, 200000), 1, &s);
            if (rc == DL_EAGAIN) { refusals++; continue; }
            assert_int_equal(rc, 0);
            grants++;
            assert_true(s.offset + s.bytes <= cap[s.tier]);
            for (int j = 0; j < nlive; j++)
                if (live[j].tier == s.tier)
                    assert_true(s.offset + s.bytes <= live[j].offset ||
                                live[j].offset + live[j].bytes <= s.offset);
            live[nlive++] = s;
        }
        uint64_t used = 0, sum = 0;
        for (int j = 0; j < nlive; j++) sum += live[j].bytes;
        used = inbox_used(ib, INBOX_GPU) + inbox_used(ib, INBOX_HOST);
        assert_int_equal(used, sum);
        assert_true(used <= cap[0] + cap[1]);
        assert_int_equal(inbox_live(ib), nlive);
    }
    assert_true(grants > 1000 && refusals > 100);
    assert_true(inbox_high_water(ib) <= cap[0] + cap[1]);
    while (nlive) assert_int_equal(inbox_free(ib, live[--nlive].id), 0);
    assert_int_equal(inbox_largest_free(ib, INBOX_GPU), cap[0]);
    assert_int_equal(inbox_largest_free(ib, INBOX_HOST), cap[1]);
    inbox_destroy(&ib);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slab_roundtrip_across_fork),
        cmocka_unit_test(test_slab_bad_input),
        cmocka_unit_test(test_sweep_after_crash),
        cmocka_unit_test(test_hcache_opens_once_per_incarnation),
        cmocka_unit_test(test_inbox_basic),
        cmocka_unit_test(test_inbox_slot_sizing),
        cmocka_unit_test(test_inbox_random_bound),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
