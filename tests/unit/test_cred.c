/* common/pipe/cred: the membership credential against an independent HMAC-SHA256
 * (Python's hmac module), hex round trip, constant-time comparison rules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/err.h"
#include "common/pipe/cred.h"

#include <stdio.h>
#include <string.h>

/* python3 -c "import hmac,hashlib; print(hmac.new(bytes(range(32)), b'r20260101.ab:201:3',
 *             hashlib.sha256).hexdigest())" */
static const char KAT_STAGE[] = "58049f790a556e0bf166ad3b7d1c0ddf5176136b67005fa09abeed67c312b4e9";

static void test_cred_known_answer(void **state) {
    (void)state;
    uint8_t secret[CRED_BYTES], c[CRED_BYTES], want[CRED_BYTES];
    for (unsigned i = 0; i < CRED_BYTES; i++) secret[i] = (uint8_t)i;
    cred_stage(secret, "r20260101.ab", 201, 3, c);
    assert_int_equal(cred_from_hex(KAT_STAGE, want), 0);
    assert_memory_equal(c, want, CRED_BYTES);
    char hex[CRED_HEX_LEN + 1];
    cred_to_hex(c, hex);
    assert_string_equal(hex, KAT_STAGE);
    assert_int_equal(cred_equal(c, CRED_BYTES, want), 1);
    /* another stage, incarnation, run or secret: another credential */
    uint8_t o[CRED_BYTES];
    cred_stage(secret, "r20260101.ab", 201, 4, o);
    assert_int_equal(cred_equal(o, CRED_BYTES, want), 0);
    cred_stage(secret, "r20260101.ab", 202, 3, o);
    assert_int_equal(cred_equal(o, CRED_BYTES, want), 0);
    cred_stage(secret, "r20260101.ac", 201, 3, o);
    assert_int_equal(cred_equal(o, CRED_BYTES, want), 0);
    secret[31] ^= 1;
    cred_stage(secret, "r20260101.ab", 201, 3, o);
    assert_int_equal(cred_equal(o, CRED_BYTES, want), 0);
    /* no credential, or a short one, is never equal */
    assert_int_equal(cred_equal(c, 0, want), 0);
    assert_int_equal(cred_equal(c, CRED_BYTES - 1, want), 0);
}

static void test_cred_hex_and_secret(void **state) {
    (void)state;
    uint8_t c[CRED_BYTES], keep[CRED_BYTES];
    memset(c, 7, sizeof c);
    memcpy(keep, c, sizeof c);
    assert_int_equal(cred_from_hex("", c), DL_EINVAL);
    assert_int_equal(cred_from_hex(KAT_STAGE + 1, c), DL_EINVAL);            /* 63 digits */
    char bad[CRED_HEX_LEN + 1];
    memcpy(bad, KAT_STAGE, sizeof bad);
    bad[10] = 'g';
    assert_int_equal(cred_from_hex(bad, c), DL_EINVAL);
    assert_int_equal(cred_from_hex(NULL, c), DL_EINVAL);
    assert_memory_equal(c, keep, CRED_BYTES);                        /* untouched on error */
    uint8_t s1[CRED_BYTES], s2[CRED_BYTES];
    assert_int_equal(cred_secret_new(s1), 0);
    assert_int_equal(cred_secret_new(s2), 0);
    assert_memory_not_equal(s1, s2, CRED_BYTES);                     /* 2^-256 to fail */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cred_known_answer),
        cmocka_unit_test(test_cred_hex_and_secret),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
