/* The client side of a run's control socket (the supervisor's ZeroMQ ROUTER,
 * supervisor/ctl.c): `draftline status|stop|rebalance|monitor` connect to it, send
 * a CTL_REQUEST (proto/msg.h) and read the CTL_REPLY messages (and, after a
 * subscribe, the relayed METRICS messages). Works from any host that reaches the
 * endpoint and needs nothing writable in the run dir.
 *
 * Endpoint: run.json's "control" key; a run.json without it (older runs), or with a
 * relative ipc path (relative to the supervisor's working directory: a `--out runs/x`
 * run's own <out>/ctl.sock), means ipc://<run>/ctl.sock (RUNDIR_CTL_NAME). A run whose socket does not answer within
 * a short timeout, or has no socket, is not live: the callers then print from the
 * files (status, monitor) or say the run is not running (stop, rebalance).
 *
 * One client = one libuv loop + one bus DEALER, driven only inside rundir_ctl_recv
 * (single-threaded, not thread-safe). Errors: DL_ENOENT (no socket file for an ipc
 * endpoint), DL_ETIMEDOUT (no message in time), DL_ECLOSED (the supervisor went
 * silent for RUNDIR_CTL_DEAD_MS: it exited), DL_EPROTO (an undecodable message),
 * DL_EIO / DL_ENOMEM (ZeroMQ, libuv, memory).
 */
#ifndef DL_RUNDIR_CTL_H
#define DL_RUNDIR_CTL_H

#include "proto/msg.h"

#include <stddef.h>
#include <stdint.h>

#define RUNDIR_CTL_NAME "ctl"               /* bus_endpoint name: <dir>/ctl.sock */
#define RUNDIR_CTL_HEARTBEAT_MS 200         /* client <-> supervisor heartbeats */
#define RUNDIR_CTL_DEAD_MS 3000             /* silence after which the other side is gone */
#define RUNDIR_CTL_ANSWER_MS 3000           /* a live supervisor answers within this */

typedef struct rundir_ctl rundir_ctl_t;

/* The control endpoint of run dir `dir` into ep (cap bytes): run.json's "control"
 * when it is not a relative ipc path, else ipc://<dir>/ctl.sock. Returns 0, DL_ERANGE (does not fit), DL_EINVAL (a
 * malformed run.json; a missing one is fine: the default). */
int rundir_ctl_endpoint(const char *dir, char *ep, size_t cap);

/* Connects to endpoint (ZeroMQ syntax) into *out (NULL on error). For ipc:// the
 * socket file must exist (DL_ENOENT otherwise) and accept a connection (DL_ECLOSED:
 * a file left by a killed supervisor): the run is not live. Returns 0 or an error
 * (dl_errmsg names the endpoint). */
int rundir_ctl_connect(const char *endpoint, rundir_ctl_t **out);
/* Closes the socket (unsent messages dropped) and frees *c; nulls it. NULL is fine. */
void rundir_ctl_destroy(rundir_ctl_t **c);

/* Encodes and sends req (borrowed; validated first: DL_EPROTO). Returns 0 or an error. */
int rundir_ctl_send(rundir_ctl_t *c, const proto_ctl_request_t *req);

/* Sends len raw payload bytes as they are (no encoding, no checks): for tests of the
 * supervisor's handling of malformed requests. Returns 0 or bus_send's error. */
int rundir_ctl_send_raw(rundir_ctl_t *c, const void *buf, size_t len);

/* Waits up to timeout_ms (< 0: forever) for the next message from the supervisor and
 * decodes it into *m (a CTL_REPLY, an ERROR answering a refused request, or a METRICS
 * of a subscription; free with proto_msg_free). Heartbeats flow while it waits.
 * Returns 0, DL_ETIMEDOUT, DL_ECLOSED or DL_EPROTO (see above). */
int rundir_ctl_recv(rundir_ctl_t *c, proto_msg_t *m, int timeout_ms);

/* The request in one call: connects to dir's endpoint, sends req, waits up to
 * timeout_ms for the CTL_REPLY with req->id (an ERROR reply is returned as its code
 * with dl_errmsg = its message) into *reply (free with proto_msg_free). *cp: when not
 * NULL, the connection is handed back for further replies (caller destroys; on error
 * it is destroyed and *cp NULL). Returns 0 or the errors above. */
int rundir_ctl_call(const char *dir, const proto_ctl_request_t *req, int timeout_ms, proto_msg_t *reply,
                    rundir_ctl_t **cp);

/* A reply's text as a malloc'd NUL-terminated string (NULL: out of memory). */
char *rundir_ctl_text(const proto_ctl_reply_t *r);

#endif
