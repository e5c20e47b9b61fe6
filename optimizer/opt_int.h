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

#include "common/model/drafter.h"
#include "common/ops/ops.h"
#include "common/pipe/ckpt.h"
#include "common/pipe/peers.h"
#include "common/pipe/stage.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
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

/* ---- the checkpoint writer (ckpt_write.c) ----
 * A checkpoint is a snapshot, then a write. The snapshot copies the step's state
 * (master, m, v: P f32 each) into buffers of the writer's own, reused. On GPU they are
 * the optimizer's host start-up copies (ockw_host_buffer: the resume read into them, the
 * upload came from them; owned by the writer from ockw_new on) and the ones not needed at
 * start-up, all pinned in pieces on a thread ockw_new starts, which the first snapshot
 * joins (long done but for the shortest runs); async device-to-host copies on a copy stream of
 * its own, waited for on a libuv worker thread. On CPU, malloc'd at the first checkpoint
 * and filled by a memcpy in parallel chunks on that thread. No step may be applied
 * while the snapshot is pending (ockw_holds_steps); once it is complete (`snapped`),
 * steps go on while the files are written from the snapshot on a worker thread
 * (ckpt_write, then the retention). A checkpoint asked for while the previous one is
 * still being written waits for it (logged with how long). The loop thread never
 * copies, writes nor fsyncs state. A final checkpoint (then != OCKW_THEN_NONE) on CPU
 * writes from the state itself (no step follows it): no snapshot copy. */
typedef struct ockw ockw_t;

/* What follows a checkpoint (handed back in `done`). */
enum { OCKW_THEN_NONE, OCKW_THEN_PUBLISH, OCKW_THEN_STOP };

typedef struct {
    const char *out;           /* the run's out dir (checkpoints/ under it) */
    drafter_t *layout;         /* layout_only: its tensor table and config (read only) */
    size_t P;                  /* parameters */
    int gpu;                   /* -1: the state is host memory */
    int64_t keep;              /* --keep-checkpoints (0: keep all) */
    const char *resume_dir;    /* the checkpoint resumed from ("" if none), kept from the
                                  retention until a newer step is written */
    uint64_t resume_step;
    int64_t delay_ms;          /* test hook optimizer.ckpt_delay_ms: each write that much slower */
    int64_t fail_step;         /* test hook optimizer.ckpt_fail_step: that step's write fails (-1 none) */
    float *snap[3];            /* GPU: the snapshot buffers (master, m, v; P f32 host from
                                  ockw_host_buffer), owned by the writer from ockw_new on; a
                                  NULL one is allocated, and every one not pinned yet is
                                  pinned, on the writer's thread. CPU: NULL */
    int pinned[3];             /* GPU: which of snap are pinned already (1: ockw_host_pin) */
} ockw_cfg_t;

/* Loop-thread news. snapped: the snapshot is complete, steps may be applied again.
 * done: the checkpoint of `step` was written (rc 0: last_dir names it) or not (rc < 0,
 * already logged): `then` as given to ockw_start. */
typedef struct {
    void (*snapped)(void *arg);
    void (*done)(void *arg, uint64_t step, int rc, int then);
    void *arg;
} ockw_cb_t;

/* The figures of the last checkpoint written (steps.jsonl, the final step's metrics). */
typedef struct {
    uint64_t step;
    double waited_s;           /* for the previous write before its snapshot */
    double snap_s, write_s;    /* snapshot; files + retention */
} ockw_times_t;

/* Host memory for `bytes` of the state (`what` names it in messages): page-aligned,
 * pageable (posix_memalign; free with free after ockw_host_unpin where pinned). NULL
 * (logged) when out of memory. */
float *ockw_host_buffer(size_t bytes, const char *what);
/* Values of ockw_host_pin's hold. */
enum { OCKW_PIN_RUN = 0, OCKW_PIN_HOLD = 1, OCKW_PIN_STOP = 2 };
/* Page-locks p (bytes; from ockw_host_buffer) for gpu in 64 MiB pieces
 * (dev_host_register; about 0.5 s per GB, holding the driver for one piece at a time, so
 * never on a loop thread). Before each piece it waits while *hold is OCKW_PIN_HOLD, and at
 * OCKW_PIN_STOP it undoes the pieces done and returns 0 quietly (hold NULL: neither).
 * Returns 1 when pinned; 0 for gpu < 0, or when pinning fails: then a warning says the
 * checkpoints' snapshots will hold the steps longer. */
int ockw_host_pin(float *p, size_t bytes, int gpu, const char *what, const atomic_int *hold);
/* Undoes ockw_host_pin (NULL accepted); the memory stays, to be freed. */
void ockw_host_unpin(float *p, size_t bytes);

/* A writer on `loop` (the stage's, its address only: usable before stage_init); cfg's
 * strings are not copied (they outlive it), its snapshot buffers are taken over. GPU:
 * the NULL ones are allocated (ockw_host_buffer) and all are pinned (ockw_host_pin) on a
 * thread started here, while the steps run; the first snapshot joins it (ockw_destroy stops
 * it after the piece in progress). CPU: the buffers come at the first checkpoint. Returns 0 or
 * DL_ENOMEM (the buffers given are freed all the same). */
int ockw_new(ockw_t **out, uv_loop_t *loop, const ockw_cfg_t *cfg, const ockw_cb_t *cb);
/* Holds (on 1) or releases (on 0) the pinning of the snapshot buffers between pieces:
 * the optimizer holds it while it applies a step, whose CUDA calls would otherwise wait
 * for the piece being pinned, each time the thread took the driver again (step 0 came
 * 0.9 s after the drafter's gradients with 256 MiB pieces and no hold, H200). At most the
 * piece in progress is waited for. Any thread; NULL accepted. */
void ockw_pin_hold(ockw_t *w, int on);
/* Joins the allocation thread; frees the snapshot buffers and the copy stream; *w = NULL;
 * NULL accepted. Only when nothing is in flight (!ockw_busy). */
void ockw_destroy(ockw_t **w);

/* Starts the checkpoint of header h (step, schedule, settings; crc filled by ckpt_write)
 * with the state master, m, v (P f32 each, on the backend: device memory on GPU; they
 * must hold step h->step and not change until `snapped`) and the loader cursor (40
 * bytes, copied; NULL: none). GPU: the step's work on the compute stream is complete
 * (apply_step synchronises it). Queued behind a write in flight. Never blocks. */
void ockw_start(ockw_t *w, const ckpt_state_hdr_t *h, const uint8_t *cursor, const float *master,
                const float *m, const float *v, int then);
/* 1 while a started checkpoint's snapshot is not complete: no step may be applied. */
int ockw_holds_steps(const ockw_t *w);
/* 1 while a checkpoint is queued, snapshotting or writing. NULL: 0. */
int ockw_busy(const ockw_t *w);
/* The final dir of the last checkpoint written ("" before any). */
const char *ockw_last_dir(const ockw_t *w);
/* Times of the last checkpoint written; 0 (and *t untouched) before any. */
int ockw_times(const ockw_t *w, ockw_times_t *t);

/* The optimizer's --help text into f (opt_usage.c; stage_args prints it). */
void opt_usage(FILE *f);
/* The learning rate of step `step` (0-based): linear warmup over `warmup` steps to `lr`,
 * then cosine decay to 10% of it at step max_steps - 1 (held there after); lr itself when
 * max_steps <= warmup + 1. Pure (opt_usage.c). */
double opt_lr_at(double lr, uint64_t warmup, uint64_t max_steps, uint64_t step);

/* ---- The step's math (step_math.c). */
/* The step's gradient and its squared norm. g[0..K): the micro-batches' gradients (P f32
 * each; on the device when gpu, else host), summed in micro-batch order and times inv_w
 * as f32_add_scale does (bitwise reproducible). Where that takes a pass over the
 * parameters, into gs (P f32, the backend's); with K == 1 on a GPU whose memory holds
 * g[0] (g0_here) no pass: the sum is g[0] * inv_w, read where it is. *gsrc, *gscale: what
 * AdamW reads (gs and 1, or g[0] and inv_w: adamw_pub's gscale). norm_sq: 1 f32 of the
 * backend, left holding the squared norm (adamw's clip reads it there). Returns the
 * squared norm (a GPU: after a download, which waits for the stream). */
float opt_step_grad(const ops_ctx_t *ops, int gpu, const float *const *g, uint64_t K, float inv_w,
                    size_t P, int g0_here, float *gs, float *norm_sq, const float **gsrc,
                    float *gscale);

/* AdamW's settings of one step. */
typedef struct {
    float lr, b1, b2, eps, wd;   /* wd on the 2-D tensors only */
    int t;                       /* the step, from 1 */
    float clip;                  /* max global norm (<= 0: none) */
} opt_adamw_t;

/* AdamW over every tensor of the layout (ops adamw_pub): master, m, v (P f32) updated,
 * the new weights also into pub (P f32); the gradient read from gsrc times gscale;
 * norm_sq (1 f32) as opt_step_grad left it. All on the backend; queued, not waited for. */
void opt_step_adamw(const ops_ctx_t *ops, const drafter_t *layout, const opt_adamw_t *a,
                    float *master, float *pub, const float *gsrc, float gscale, float *m, float *v,
                    const float *norm_sq);

#endif
