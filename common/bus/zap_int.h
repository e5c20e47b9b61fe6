/* common/bus private: the CURVE socket options and the ZAP handler of a ZeroMQ context (zap.c).
 * Not for use outside common/bus: bus_opts_t.curve is the public switch.
 *
 * libzmq (4.3) authenticates a CURVE client only if a ZAP handler (RFC 27) is bound on
 * inproc://zeromq.zap.01 in the server socket's context; without one any client that knows the
 * server's public key gets in. So the first CURVE server bus on a context starts a handler there
 * (a ROUTER on the bus's loop, ZMQ_FD edge-triggered like a bus) and the last one to close stops
 * it, before the context is terminated. It answers "200" only to CURVE clients that proved the
 * run's client public key, "400" to everything else in the bus's ZAP domain ("draftline"); a
 * request of another domain (an ipc/inproc socket sharing the context: libzmq 4.3 asks the
 * handler about NULL-mechanism handshakes too when one exists) gets "200", as it would without
 * a handler. A refusal is logged at WARN once per peer address. */
#ifndef DL_BUS_ZAP_INT_H
#define DL_BUS_ZAP_INT_H

#include <uv.h>

#include "common/bus/curve.h"

#define BUS_ZAP_DOMAIN "draftline"
#define BUS_HANDSHAKE_IVL_MS 5000      /* a tcp peer that does not finish the ZMTP/CURVE
                                        * handshake within this is dropped (libzmq: 30000) */
#define BUS_ZAP_LOGGED_MAX 64          /* peer addresses whose refusal was logged, per handler */

typedef struct bus_zap bus_zap_t;

/* Sets the CURVE options of a new socket (before any bind/connect) and, for a server
 * (server != 0: ROUTER/PUB), acquires the ZAP handler of ctx, created on loop if this is the
 * first CURVE server bus of ctx. Server: ZMQ_CURVE_SERVER, the server secret key, the ZAP domain,
 * ZMQ_ZAP_ENFORCE_DOMAIN where libzmq has it (a draft option). Client: the server public key and
 * the client keypair. Both: ZMQ_HANDSHAKE_IVL BUS_HANDSHAKE_IVL_MS. *zap_out (server only, else
 * NULL) is released with bus__zap_release. name is the bus's, for messages.
 * Errors: DL_ENOTSUP (no CURVE in libzmq), DL_EIO (ZeroMQ/libuv), DL_ENOMEM, DL_ESTATE (ctx
 * already has a handler on another loop or for another client key). */
int bus__curve_setup(void *sock, int server, const bus_curve_keys_t *k, void *ctx, uv_loop_t *loop,
                     const char *name, bus_zap_t **zap_out);

/* Drops one reference; the last one closes the handler's socket at once (so zmq_ctx_term of its
 * context does not wait on it) and frees the rest from the loop's close callbacks. Nulls *zap_p;
 * NULL or *zap_p NULL: no-op. */
void bus__zap_release(bus_zap_t **zap_p);

/* Requests answered by ctx's handler so far (0 and 0 when it has none); for tests and logs. */
void bus__zap_counts(void *ctx, unsigned long long *accepted, unsigned long long *refused);

#endif
