/* common/bus/curve: the run's CURVE credential for tcp:// endpoints (docs/MULTINODE.md).
 *
 * A multi-node run has one key file, made by the head at start (`<out>/node.key`, or
 * `draftline run --key FILE`) with mode 0600, and given to every node agent
 * (`draftline node --key FILE`), which passes its path to the stages it starts. It holds
 * two CURVE keypairs in Z85 text (40 characters each):
 *   server: every ROUTER/PUB bound on tcp:// uses its secret key (ZMQ_CURVE_SERVER);
 *   client: every DEALER/SUB connecting to tcp:// uses it, and knows the server's
 *           public key (ZMQ_CURVE_SERVERKEY).
 * A server accepts a connection only when the client proved the run's client key (the
 * ZAP handler of common/bus/zap.c checks it): a peer without the file cannot connect at
 * all. The key file is the run's membership on the network; the per-stage credential
 * (which role a peer may take) is the hardening issue's and sits above this.
 *
 * File format (text, '#' comments, one "name value" per line, these four names once each):
 *   server_public <z85>  server_secret <z85>  client_public <z85>  client_secret <z85>
 */
#ifndef DL_BUS_CURVE_H
#define DL_BUS_CURVE_H

#define BUS_CURVE_KEY_CHARS 40          /* Z85 of a 32-byte key */

typedef struct {
    char server_public[BUS_CURVE_KEY_CHARS + 1], server_secret[BUS_CURVE_KEY_CHARS + 1];
    char client_public[BUS_CURVE_KEY_CHARS + 1], client_secret[BUS_CURVE_KEY_CHARS + 1];
} bus_curve_keys_t;

/* 1 when this libzmq was built with CURVE (zmq_has("curve")), else 0. */
int bus_curve_available(void);

/* Makes two new keypairs (zmq_curve_keypair) and writes them to path, created with
 * O_EXCL and mode 0600 (an existing file is refused: load it instead). Fills *out.
 * Errors: DL_ENOTSUP (no CURVE in libzmq), DL_EIO (file), each naming path. */
int bus_curve_keys_create(const char *path, bus_curve_keys_t *out);

/* Reads a key file into *out. Refused (DL_EINVAL, naming path and why): a symlink, not a
 * regular file owned by the effective uid, any group/other permission bit, a missing,
 * repeated or malformed key (not 40 Z85 chars), a public key that is not its secret's.
 * DL_ENOENT: no such file; DL_EIO: read error. */
int bus_curve_keys_load(const char *path, bus_curve_keys_t *out);

#endif
