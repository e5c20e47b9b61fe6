/* Run membership credentials (issue 15 item 17, docs/ARCHITECTURE.md "Membership").
 * Encryption (CURVE on tcp://) says who may read the wire, not who is a stage of the
 * run: any process of the same user reaches the ipc sockets, anyone with the key file
 * the tcp ones. So the supervisor makes a random 32-byte run secret at start and hands
 * each stage it starts (itself or through a node agent) its credential
 *   cred = HMAC-SHA256(secret, "<run id>:<stage id>:<incarnation>")
 * in the inherited environment variable DL_STAGE_CRED (64 hex digits; read and unset at
 * once by stage_args: never on a command line, never in a log). Every hello and config
 * request to the supervisor carries it; the supervisor recomputes it for the claimed
 * stage id and incarnation and refuses a mismatch (PROTO_ERROR, no route, no config).
 * HMAC-SHA256 is libsodium's crypto_auth_hmacsha256 (RFC 2104 / FIPS 198-1); the
 * comparison is constant-time (sodium_memcmp). */
#ifndef DL_PIPE_CRED_H
#define DL_PIPE_CRED_H

#include <stddef.h>
#include <stdint.h>

#define CRED_BYTES 32u                 /* secret, credential and peer key size */
#define CRED_HEX_LEN (2 * CRED_BYTES)  /* hex form, without the NUL */
#define CRED_ENV "DL_STAGE_CRED"       /* the environment variable a stage inherits */

/* Fills secret with CRED_BYTES random bytes (libsodium randombytes_buf). Returns 0, or
 * DL_EIO when libsodium cannot be initialised (dl_errmsg says so). */
int cred_secret_new(uint8_t secret[CRED_BYTES]);

/* The credential of incarnation `incarnation` of stage `stage_id` (PIPE_ID_*) in run
 * run_id (NUL-terminated, <= 16 chars): HMAC-SHA256(secret, "<run_id>:<stage_id>:<inc>")
 * with both numbers in decimal. out: CRED_BYTES. */
void cred_stage(const uint8_t secret[CRED_BYTES], const char *run_id, uint32_t stage_id,
                uint64_t incarnation, uint8_t out[CRED_BYTES]);

/* 1 when a (n_a bytes) equals b (CRED_BYTES), compared in constant time; 0 when
 * not, and when n_a != CRED_BYTES (a message without a credential). */
int cred_equal(const uint8_t *a, size_t n_a, const uint8_t b[CRED_BYTES]);

/* Stage-to-stage membership (docs/ARCHITECTURE.md "Membership"). The run's peer key
 *   key = HMAC-SHA256(secret, "peers:<run_id>")
 * is what the supervisor gives each verified stage (CONTROL PROTO_CTL_PEERS before its
 * RUN_CONFIG); it lets a stage make its own hello tokens and check those of its peers
 * without the run secret. out: CRED_BYTES. */
void cred_peer_key(const uint8_t secret[CRED_BYTES], const char *run_id, uint8_t out[CRED_BYTES]);

/* The token that incarnation `incarnation` of stage `stage_id` puts in its hello to
 * stage `to_id` (PIPE_ID_*):
 *   HMAC-SHA256(key, "peer:<run_id>:<stage_id>:<incarnation>:<to_id>")
 * Bound to the receiver, so a token seen by one server is worth nothing at another.
 * out: CRED_BYTES. */
void cred_peer_token(const uint8_t key[CRED_BYTES], const char *run_id, uint32_t stage_id,
                     uint64_t incarnation, uint32_t to_id, uint8_t out[CRED_BYTES]);

/* Hex form (lower case, NUL-terminated: out holds CRED_HEX_LEN + 1 bytes). */
void cred_to_hex(const uint8_t c[CRED_BYTES], char out[CRED_HEX_LEN + 1]);
/* Parses exactly CRED_HEX_LEN hex digits. Returns 0, or DL_EINVAL (out untouched). */
int cred_from_hex(const char *hex, uint8_t out[CRED_BYTES]);

#endif
