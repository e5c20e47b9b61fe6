/* target_worker: hidden states to a GPU drafter on another node by NCCL (nccl_out.c;
 * docs/MULTINODE.md section 4). Only with the test hook nccl_cross=1 (read once at
 * start-up); without it the route is refused as before. */
#ifndef DL_TARGET_WORKER_NCCL_OUT_H
#define DL_TARGET_WORKER_NCCL_OUT_H

#include "proto/msg.h"

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct {
    int on;                    /* hook nccl_cross=1 and a GPU target */
    int gpu;
    struct nccl_pair *pair;    /* rank 1 of the routed drafter's pair, NULL none */
    int ready;                 /* polled ready (loop thread) */
    uint32_t owner_id;         /* the drafter (stage id) and incarnation of the pair */
    uint64_t owner_inc;
    int abort_pending;         /* dropped while a forward was in flight: abort after it */
    uv_timer_t timer;          /* polls a pair that is not ready */
    int timer_on;
    void (*on_ready)(void *arg);
    void *arg;
} tw_nccl_t;

/* Reads the hook; with it on a GPU target (gpu >= 0) starts the poll timer on `loop`.
 * on_ready(arg) runs on the loop when a pair becomes ready (the target pumps). 0, or
 * DL_ENOTSUP (hook set in a build without NCCL). */
int tw_nccl_init(tw_nccl_t *n, int gpu, uv_loop_t *loop, void (*on_ready)(void *arg), void *arg);
/* An nccl_id from the routed drafter: for this target incarnation (me, my_inc) and the
 * routed drafter (want, its incarnation drafter_inc, 0 = not known yet) it replaces the
 * pair (rank x->rank, non-blocking); anything else is logged and dropped. busy: a forward
 * is in flight (the old pair is then aborted after it). Loop thread. */
void tw_nccl_on_id(tw_nccl_t *n, const proto_nccl_id_t *x, uint32_t me, uint64_t my_inc, uint32_t want,
                   uint64_t drafter_inc, int busy);
/* 1 when the pair is ready for a forward's send. */
int tw_nccl_ready(const tw_nccl_t *n);
/* Compute thread, after the forward wrote `bytes` of features at device `buf` on
 * `stream`: ncclSend to rank 0, stream-ordered (the next forward on the stream waits
 * for it; buf must not be rewritten before). Waits only while NCCL enqueues (the first
 * send connects the channel). 0 or an error (then the pair is unusable: the loop drops it). */
int tw_nccl_send(tw_nccl_t *n, const void *buf, size_t bytes, void *stream);
/* The drafter is dead, restarted or no longer routed: the pair goes (aborted now, or
 * after the forward in flight when busy). */
void tw_nccl_drop(tw_nccl_t *n, int busy);
/* Loop thread, after each forward: performs a pending abort. */
void tw_nccl_after_work(tw_nccl_t *n);
/* Shutdown: the pair aborted, the timer closed. */
void tw_nccl_fini(tw_nccl_t *n);

#endif
