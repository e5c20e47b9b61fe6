/* optimizer: gradients and weights of GPU drafters on other nodes by NCCL (nccl_step.c;
 * docs/MULTINODE.md sections 4-5). Only with the test hook nccl_cross=1 (read once at
 * start-up; issue 17 switches it on with two GPUs); without it such a placement is
 * refused as before. The optimizer.c side calls these few hooks; the state is opaque.
 *
 * The step communicator: this optimizer is rank 0, the live GPU drafters on other nodes
 * ranks 1..k in stage-id order (nccl_step_members). Two NCCL communicators per
 * generation: the one made from the id (gradients: ncclRecv per micro-batch on the
 * gradient stream) and its split (weights: ncclBroadcast on the weights stream), so a
 * broadcast never waits behind a receive nor a receive behind a broadcast. Every NCCL
 * call is on the loop thread; nothing here waits for a peer: completion is a CUDA event
 * polled from a 10 ms timer. */
#ifndef DL_OPTIMIZER_OPT_INT_H
#define DL_OPTIMIZER_OPT_INT_H

#include "common/ops/ops.h"
#include "common/pipe/peers.h"
#include "common/pipe/stage.h"

#include <stddef.h>
#include <stdint.h>

#define ONS_POLL_MS 10           /* the generation's set-up, completions, membership */
#define ONS_OP_TIMEOUT_MS 30000  /* a receive or broadcast outstanding this long: the
                                    generation is aborted and made again */

typedef struct ons ons_t;

/* What the optimizer does on the module's news (loop thread). */
typedef struct {
    void (*landed)(void *arg);              /* every posted transfer is done: try the step */
    void (*lost)(void *arg, uint64_t k);    /* micro-batch slot k's bytes were lost: forget it */
    void (*ready)(void *arg);               /* a new generation is ready: weights to members */
    void *arg;
} ons_cb_t;

/* *out = NULL and 0 unless the hook nccl_cross=1 is set and the optimizer runs on a GPU
 * (gpu >= 0); else the module on `ops` (its device, its compute stream), reading the
 * drafters' registry `peers` (not owned; stable for the process) every ONS_POLL_MS.
 * P: parameters (f32); K: micro-batches per step; slot_stride: bytes between two slots
 * of a drafter's gradient slab (pipe_align256(P * 4)). Errors: DL_ENOTSUP (hook set in
 * a build without NCCL), DL_ENOMEM, a bus error; logged. */
int ons_new(ons_t **out, stage_t *st, bus_t *srv, ops_ctx_t *ops, int gpu, const peers_t *peers, size_t P,
            uint64_t K, const ons_cb_t *cb);
/* Aborts the communicators, frees the buffers; *n = NULL; NULL accepted. */
void ons_destroy(ons_t **n);

/* 1 when drafter pi (registry index) is a member of the current generation. NULL: 0. */
int ons_member(const ons_t *n, int pi);

/* The weights of `version` (bytes at device src, the version's half of the weights
 * slab, at byte offset `offset` of it) for member pi: broadcast once per version and
 * generation. 0 posted (or already): send weights_version; DL_EAGAIN the generation is
 * not ready (its ready callback sends them); < 0 failed (the generation is aborted). */
int ons_weights(ons_t *n, const void *src, size_t bytes, uint64_t version);

/* gradients_ready of member pi for micro-batch slot k at byte `offset` of its gradient
 * slab, `bytes` long: the receive into the landing buffer (laid out as the drafter's
 * slab) is posted; *base = the landing buffer (the gradient is at base + offset once
 * `landed`). n == NULL or pi not a member: 0, *base untouched (not by NCCL). < 0: not
 * taken (a member that has not echoed this generation's id, a range outside the
 * buffer): dropped, logged. */
int ons_take(ons_t *n, int pi, uint64_t k, uint64_t offset, uint64_t bytes, void **base);
/* After each gradients_ready of pi: a member's bytes that ons_take did not take are
 * received into a scratch buffer all the same (every send is matched, in order). */
void ons_drain(ons_t *n, int pi, uint64_t bytes);
/* The `nccl_id` echo of drafter pi (bus id `who`): its ranks of the current generation
 * are ready (control-plane order: its gradients_ready from here on have their sends on
 * this generation). Another generation's: ignored, logged. n == NULL: logged as
 * unexpected. */
void ons_echo(ons_t *n, int pi, const char *who, const proto_nccl_id_t *x);

/* 1 while a receive or a broadcast is outstanding (no step is applied then). */
int ons_busy(const ons_t *n);

#endif
