/* common/monitor/tb.h, TensorBoard event files, against an independent reference:
 * tests/fixtures/tb/scalars.tfevents, written by TensorBoard's own RecordWriter and
 * protobuf (tests/fixtures/tb/make_fixture.py lists its events). Our encoding of the same
 * events, framed, must equal it byte for byte (frame CRCs, Event and Summary encoding);
 * CRC-32C against its check value; a writer's file starts with the file_version record
 * and holds one record per finite scalar. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/monitor/tb.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *fixtures_dir(void) {
    const char *d = getenv("DL_FIXTURES_DIR");
    return d ? d : "tests/fixtures";
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static uint8_t buf[1 << 16];
    *n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return buf;
}

static void test_crc32c_check_value(void **state) {
    (void)state;
    /* CRC-32C("123456789") = 0xe3069283 (RFC 3720 appendix B.4's polynomial); masked as TFRecord does */
    uint32_t c = 0xe3069283u;
    assert_int_equal(mon_tb_masked_crc("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

static void test_same_bytes_as_tensorboard(void **state) {
    (void)state;
    char p[512];
    snprintf(p, sizeof p, "%s/tb/scalars.tfevents", fixtures_dir());
    size_t n = 0;
    const uint8_t *ref = slurp(p, &n);
    assert_non_null(ref);
    static const struct { const char *tag; float v; int64_t step; double t; } S[] = {
        {"loss", 7.25f, 0, 1700000001.5}, {"lr", 0.0003f, 1, 1700000002.25},
        {"acc/pos_1", 0.125f, 300, 1700000003.0}, {"tokens_per_s", 0.0f, 70000, 1700000004.0},
        {"grad_norm", -2.5f, 2, 1700000005.0}};
    uint8_t mine[4096], ev[512];
    size_t m = 0;
    size_t e = mon_tb_event(ev, sizeof ev, 1700000000.0, 0, "brain.Event:2", NULL, 0);
    assert_true(e > 0);
    m += mon_tb_frame(mine + m, sizeof mine - m, ev, e);
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++) {
        e = mon_tb_event(ev, sizeof ev, S[i].t, S[i].step, NULL, S[i].tag, S[i].v);
        assert_true(e > 0);
        size_t r = mon_tb_frame(mine + m, sizeof mine - m, ev, e);
        assert_int_equal(r, e + 16);
        m += r;
    }
    assert_int_equal(m, n);
    for (size_t i = 0; i < n; i++) {
        if (mine[i] != ref[i]) fprintf(stderr, "byte %zu: 0x%02x, TensorBoard's 0x%02x\n", i, mine[i], ref[i]);
        assert_int_equal(mine[i], ref[i]);
    }
}

static void test_writer_file(void **state) {
    (void)state;
    char dir[] = "/tmp/dltb-XXXXXX";
    assert_non_null(mkdtemp(dir));
    mon_tb_t *w = mon_tb_open(dir, 1700000000.0);
    assert_non_null(w);
    assert_int_equal(mon_tb_scalar(w, 1700000001.0, 3, "loss", 2.5), 0);
    assert_int_equal(mon_tb_scalar(w, 1700000001.0, 3, "grad_norm", NAN), 0);   /* left out */
    assert_int_equal(mon_tb_flush(w), 0);
    mon_tb_close(&w);
    mon_tb_close(&w);
    char tb[600], name[300] = "";
    snprintf(tb, sizeof tb, "%s/tb", dir);
    DIR *d = opendir(tb);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d))) if (!strncmp(de->d_name, "events.out.tfevents.1700000000.", 31)) snprintf(name, sizeof name, "%s", de->d_name);
    closedir(d);
    assert_true(name[0]);
    char p[1000];
    snprintf(p, sizeof p, "%s/%s", tb, name);
    size_t n = 0;
    const uint8_t *b = slurp(p, &n);
    assert_non_null(b);
    uint8_t ev[256], rec[300];
    size_t e = mon_tb_event(ev, sizeof ev, 1700000000.0, 0, "brain.Event:2", NULL, 0);
    size_t r1 = mon_tb_frame(rec, sizeof rec, ev, e);
    assert_true(n > r1);
    assert_memory_equal(b, rec, r1);
    e = mon_tb_event(ev, sizeof ev, 1700000001.0, 3, NULL, "loss", 2.5f);
    size_t r2 = mon_tb_frame(rec, sizeof rec, ev, e);
    assert_int_equal(n, r1 + r2);
    assert_memory_equal(b + r1, rec, r2);
    unlink(p);
    rmdir(tb);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_check_value),
        cmocka_unit_test(test_same_bytes_as_tensorboard),
        cmocka_unit_test(test_writer_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
