/* Slab bytes across nodes (docs/MULTINODE.md, section 4): peers on different nodes
 * never map each other's slabs; the bytes of a range move as slab_data messages
 * (proto/msg.h, at most DL_PROTO_MAX_CHUNK bytes each) on the connection that then
 * carries the message announcing them (hidden_states_ready, gradients_ready,
 * weights_version), so arrival order is write order.
 *
 * Sender: one xfer_t per bus. xfer_send queues a job (the range's chunks, then the
 * announcement) and hands as much of it to the bus as the bus takes; when bus_send
 * says DL_EAGAIN (its outgoing queues are full) the rest stays pending, in FIFO order
 * over all jobs of that bus, and goes out from xfer_resume, which the stage calls
 * from its bus_on_writable callback (the stage owns the bus's callbacks). The source
 * bytes are NOT copied at xfer_send: they must stay valid and unchanged until the job
 * is done (its done callback ran, or xfer_pending(x) == 0); each user says how it
 * keeps that rule.
 *
 * Receiver: xfer_recv checks a slab_data against what the receiver knows of the
 * destination (owner and incarnation, slab id, range inside the slab and inside an
 * optional window, e.g. the slot granted to that sender) and copies it. A refused
 * chunk is counted and logged (rate-limited), never fatal.
 *
 * Threading: the loop's thread only (as the bus).
 */
#ifndef DL_PIPE_XFER_H
#define DL_PIPE_XFER_H

#include "common/bus/bus.h"
#include "proto/msg.h"

#include <stddef.h>
#include <stdint.h>

typedef struct xfer xfer_t;

/* Where a range lives on the owner's side: stage id and incarnation of the slab's
 * owner, its wire slab id, and the byte offset of the range in that slab. */
typedef struct {
    uint32_t owner_id;
    uint64_t owner_inc;
    uint32_t slab_id;
    uint64_t offset;               /* 0..DL_PROTO_MAX_OFFSET */
} xfer_range_t;

/* A job ended: status 0 (every chunk and the announcement handed to the bus) or the
 * bus's error that ended it (DL_ENOENT: the ROUTER peer is gone; DL_ECLOSED; ...:
 * the rest of the job was dropped, the announcement not sent). The source may be
 * reused from here on. May call xfer_send. */
typedef void (*xfer_done_cb)(xfer_t *x, int status, void *arg);

/* A sender on bus (borrowed: destroy the xfer before or with the bus). bytes_out
 * (may be NULL): a counter it adds every chunk's data bytes to once the bus took it
 * (the stage's xfer_bytes_out metric). NULL with dl_errmsg on allocation failure. */
xfer_t *xfer_new(bus_t *bus, uint64_t *bytes_out);

/* Frees the sender and nulls *x_p (NULL is fine). Pending jobs are dropped without
 * their done callbacks. */
void xfer_destroy(xfer_t **x_p);

/* Queues the job: bytes src[0..n) (n >= 1) as slab_data chunks of range r to peer
 * (a ROUTER peer id; NULL on a DEALER), then the announcement msg (encoded here:
 * msg's arrays need not outlive the call; NULL: none), and starts sending. src is
 * borrowed until the job is done (see above). done (may be NULL) runs when the job
 * ends, possibly before xfer_send returns. Returns 0 (sent or pending); DL_EPROTO
 * (msg does not encode, nothing queued), DL_EINVAL (n 0 or over the offset limit),
 * DL_ENOMEM. */
int xfer_send(xfer_t *x, const char *peer, const xfer_range_t *r, const void *src, size_t n,
              const proto_msg_t *msg, xfer_done_cb done, void *arg);

/* Sends what is pending, up to the next DL_EAGAIN. Call from the bus's
 * bus_on_writable callback. */
void xfer_resume(xfer_t *x);

/* Jobs not yet done (0: nothing pending, every source is free). */
size_t xfer_pending(const xfer_t *x);

/* ---- receiving ---- */

/* The destination of a slab_data: what the receiver expects (owner, incarnation,
 * slab id), its copy of the slab (base, bytes), and the window of it this sender
 * may write: [win_off, win_off + win_bytes); win_bytes 0 = the whole slab. */
typedef struct {
    uint32_t owner_id;
    uint64_t owner_inc;
    uint32_t slab_id;
    uint8_t *base;
    uint64_t bytes;
    uint64_t win_off, win_bytes;
} xfer_dest_t;

/* Receiver counters (zero-initialise); the log of refusals is rate-limited to one
 * line a second (each line gives the total refused so far). */
typedef struct {
    uint64_t bytes_in;             /* data bytes copied (the stage's xfer_bytes_in) */
    uint64_t chunks_in, refused;
    double last_log_s;
    uint64_t unlogged;             /* refusals not logged since the last line */
} xfer_rx_t;

/* 0 when d fits dst (owner, incarnation, slab id equal; [offset, offset + n_data)
 * inside the slab and the window); else DL_EPROTO with dl_errmsg naming what
 * differs. dst NULL: DL_ENOENT ("no such slab here"). */
int xfer_check(const proto_slab_data_t *d, const xfer_dest_t *dst);

/* xfer_check, then copies d's bytes to dst->base + offset and counts them. A refused
 * chunk is counted and logged (warn, at most once a second: "<who>: slab_data from
 * <from> refused: <why>") and DL_EPROTO / DL_ENOENT returned: the caller drops it. */
int xfer_recv(xfer_rx_t *rx, const char *who, const char *from, const proto_slab_data_t *d,
              const xfer_dest_t *dst);

/* Logs a refused slab_data the caller found no destination for (same rate limit,
 * same counter): why names the reason. */
void xfer_refuse(xfer_rx_t *rx, const char *who, const char *from, const proto_slab_data_t *d,
                 const char *why);

#endif
