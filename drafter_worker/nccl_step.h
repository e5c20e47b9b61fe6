/* drafter_worker: gradients to and weights from a GPU optimizer on another node by NCCL
 * (nccl_step.c; docs/MULTINODE.md sections 4-5). Only with the test hook nccl_cross=1
 * (read once at start-up, dw__nccl_init); without it such a placement is refused as
 * before (dw__xfer_init, the head). Every call is on the loop thread. */
#ifndef DL_DRAFTER_WORKER_NCCL_STEP_H
#define DL_DRAFTER_WORKER_NCCL_STEP_H

#include "drafter_worker/dw_int.h"

#define DW_NSTEP_POLL_MS 10
#define DW_NSTEP_ENQ_WAIT_MS 2000    /* NCCL still enqueuing (first use); < the 3 s heartbeat */
#define DW_NSTEP_READY_MS 30000      /* a generation not ready after this: aborted here */

/* After dw__nccl_init, before dw__xfer_init: W->nstep set when the hook is on, this is a
 * GPU drafter and the optimizer is on another node (else NULL, 0). Errors: DL_ENOMEM, a
 * bus error (logged). */
int dw__nstep_init(dw_t *W);
/* The optimizer's slab_export (weights) is in W->wslab: the device mirror of its size
 * (W->wmirror, owned here). 0, or DL_ENOMEM (logged). */
int dw__nstep_export(dw_t *W);
/* An `nccl_id` from the optimizer: a newer generation aborts the old communicators,
 * forgets the loaded weights (W->version = -1: nothing is computed until the new
 * generation's broadcast) and joins; a stale or malformed one is dropped (logged).
 * W->nstep == NULL: logged as unexpected. */
void dw__nstep_on_id(dw_t *W, const proto_nccl_id_t *x);
/* weights_version v: 0 not by NCCL (W->nstep NULL: load as before); 1 its bytes come
 * into the mirror by the broadcast posted now on the compute stream (or already came in
 * this generation): load them; -1 not loadable (no ready generation, an older version,
 * a failed broadcast): ignored. */
int dw__nstep_weights(dw_t *W, const proto_weights_version_t *v);
/* gradients_ready m of the micro-batch just computed: 0 not by NCCL (dw__send_grads);
 * 1 handled: its slot is sent (ncclSend on the compute stream) and m announced, or
 * dropped (computed with weights of an aborted generation; logged). */
int dw__nstep_send(dw_t *W, const proto_msg_t *m);
/* slab_data from the optimizer while weights come by NCCL: refused (1), else 0. */
int dw__nstep_refuse(dw_t *W, const proto_slab_data_t *d);
/* Shutdown: timer stopped, communicators aborted, the mirror freed (W->wmirror NULL). */
void dw__nstep_fini(dw_t *W);

#endif
