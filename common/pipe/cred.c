/* Run membership credentials (see cred.h). */
#include "common/pipe/cred.h"

#include "common/base/err.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

int cred_secret_new(uint8_t secret[CRED_BYTES]) {
    if (sodium_init() < 0) return dl_seterr(DL_EIO, "libsodium: initialisation failed");
    randombytes_buf(secret, CRED_BYTES);
    return 0;
}

/* HMAC-SHA256(key, msg[0..n)) into out. */
static void hmac(const uint8_t key[CRED_BYTES], const char *msg, int n, uint8_t out[CRED_BYTES]) {
    crypto_auth_hmacsha256_state h;
    crypto_auth_hmacsha256_init(&h, key, CRED_BYTES);
    crypto_auth_hmacsha256_update(&h, (const unsigned char *)msg, (unsigned long long)n);
    crypto_auth_hmacsha256_final(&h, out);
    sodium_memzero(&h, sizeof h);
}

void cred_stage(const uint8_t secret[CRED_BYTES], const char *run_id, uint32_t stage_id,
                uint64_t incarnation, uint8_t out[CRED_BYTES]) {
    char msg[64];
    int n = snprintf(msg, sizeof msg, "%s:%" PRIu32 ":%" PRIu64, run_id, stage_id, incarnation);
    hmac(secret, msg, n, out);
}

void cred_peer_key(const uint8_t secret[CRED_BYTES], const char *run_id, uint8_t out[CRED_BYTES]) {
    char msg[64];
    int n = snprintf(msg, sizeof msg, "peers:%s", run_id);
    hmac(secret, msg, n, out);
}

void cred_peer_token(const uint8_t key[CRED_BYTES], const char *run_id, uint32_t stage_id,
                     uint64_t incarnation, uint32_t to_id, uint8_t out[CRED_BYTES]) {
    char msg[96];
    int n = snprintf(msg, sizeof msg, "peer:%s:%" PRIu32 ":%" PRIu64 ":%" PRIu32, run_id, stage_id,
                     incarnation, to_id);
    hmac(key, msg, n, out);
}

int cred_equal(const uint8_t *a, size_t n_a, const uint8_t b[CRED_BYTES]) {
    return n_a == CRED_BYTES && sodium_memcmp(a, b, CRED_BYTES) == 0;
}

void cred_to_hex(const uint8_t c[CRED_BYTES], char out[CRED_HEX_LEN + 1]) {
    sodium_bin2hex(out, CRED_HEX_LEN + 1, c, CRED_BYTES);
}

int cred_from_hex(const char *hex, uint8_t out[CRED_BYTES]) {
    uint8_t tmp[CRED_BYTES];
    size_t n = 0;
    if (!hex || strlen(hex) != CRED_HEX_LEN ||
        sodium_hex2bin(tmp, sizeof tmp, hex, CRED_HEX_LEN, NULL, &n, NULL) != 0 || n != CRED_BYTES)
        return dl_seterr(DL_EINVAL, "credential: not %u hex digits", CRED_HEX_LEN);
    memcpy(out, tmp, CRED_BYTES);
    return 0;
}
