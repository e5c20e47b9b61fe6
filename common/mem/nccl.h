/* NCCL point-to-point pairs: the GPU data plane between two stages on different nodes
 * (docs/MULTINODE.md section 4). One pair = one NCCL communicator of 2 ranks (or 1, a
 * self test), created NON-BLOCKING (ncclConfig_t.blocking = 0), so no call here waits
 * for the peer: a stage's event loop keeps its heartbeats while the peer connects, and
 * a dead peer never hangs it (nccl_pair_abort). Two implementations, picked by the build:
 *   CUDA builds (common/mem/cuda/nccl_cuda.c, CUDA=1): NCCL (-lnccl).
 *   CPU builds (common/mem/nccl.c): every call fails with DL_ENOTSUP ("this build has
 *     no CUDA/NCCL"); the destroys accept NULL and do nothing.
 *
 * The id (ncclUniqueId, NCCL_PAIR_ID_BYTES opaque bytes) is made by rank 0 and travels on
 * the control plane (proto `nccl_id`, type 24); it holds the address of a bootstrap
 * listener NCCL starts in rank 0's process, which rank 1 must be able to reach.
 * NCCL_NVLS_ENABLE is never touched here (the environment is left as it is).
 *
 * Threading: a pair is not thread-safe. Every call on one pair comes from one thread at a
 * time (a stage uses its loop thread for init / poll / abort and its compute thread for
 * send / recv, never both at once: the loop only polls a pair that is not yet ready, the
 * compute thread only uses a ready one). A group (begin, sends / recvs, end) is per
 * thread in NCCL: all on one thread. Different pairs may be used from different threads.
 * Blocking: none of these calls waits for the peer. nccl_pair_abort returns once NCCL
 * has torn the communicator down (bounded; tests/gpu/test_nccl_pair.c measures it),
 * nccl_pair_wait and nccl_pair_destroy at most their timeout (+ an abort).
 * Errors: 0 or a negative dl_err; NCCL errors are DL_ECUDA with the pair's name, the NCCL
 * error string and ncclGetLastError's text in dl_errmsg(). */
#ifndef DL_MEM_NCCL_H
#define DL_MEM_NCCL_H

#include <stddef.h>
#include <stdint.h>

#define NCCL_PAIR_ID_BYTES 128             /* sizeof(ncclUniqueId) = DL_PROTO_NCCL_ID_BYTES */
#define NCCL_PAIR_RANKS_MAX 64             /* nranks of one communicator = DL_PROTO_NCCL_RANKS_MAX */
#define NCCL_PAIR_DESTROY_TIMEOUT_MS 5000  /* nccl_pair_destroy: finalize, then abort */

typedef struct nccl_pair nccl_pair_t;

/* 1 in a CUDA build (NCCL linked), 0 in a CPU-only build. */
int nccl_available(void);

/* A fresh unique id (ncclGetUniqueId) into id[NCCL_PAIR_ID_BYTES]; also starts NCCL's
 * bootstrap listener in this process (rank 0 is this process). Any thread; no CUDA
 * context needed. CPU: DL_ENOTSUP. */
int nccl_id_new(uint8_t id[NCCL_PAIR_ID_BYTES]);

/* Starts joining communicator `id` as rank `rank` of `nranks` (1..NCCL_PAIR_RANKS_MAX:
 * 2 for a target/drafter pair, 1 + k for the step communicator; 0 <= rank < nranks)
 * on CUDA device `device`, non-blocking: returns at once with *out set (owned by the
 * caller: nccl_pair_abort or nccl_pair_destroy) while NCCL connects in the background;
 * nccl_pair_poll says when it is ready. The calling thread's current device is restored
 * on return. Errors: DL_EINVAL (nranks / rank / NULL), DL_ECUDA (the init
 * failed at once; *out = NULL), DL_ENOMEM. CPU: DL_ENOTSUP, *out = NULL. */
int nccl_pair_init(nccl_pair_t **out, const uint8_t id[NCCL_PAIR_ID_BYTES], int nranks, int rank,
                   int device);

/* The pair's state (ncclCommGetAsyncError): 0 ready (connected; every operation issued
 * so far is enqueued on its stream), DL_EAGAIN still connecting or still enqueuing,
 * DL_ECUDA failed (NCCL's error, naming the pair): the pair is unusable, abort it.
 * Cheap (no system call): fine from a libuv timer. */
int nccl_pair_poll(nccl_pair_t *p);

/* nccl_pair_poll every millisecond until it is not DL_EAGAIN, at most timeout_ms ms:
 * its result, or DL_ETIMEDOUT. Blocks the calling thread: not for the loop thread. */
int nccl_pair_wait(nccl_pair_t *p, int timeout_ms);

/* Groups the sends and recvs issued between them into one NCCL group (ncclGroupStart /
 * ncclGroupEnd), so a send and a recv of one pair (or of several pairs) cannot deadlock
 * each other; a send / recv outside a group is a group of its own. end returns 0 (all
 * enqueued on their streams), DL_EAGAIN (NCCL is still enqueuing, e.g. connecting the
 * peer on first use: poll until 0 before the next call on the pair and before queueing
 * work that must follow the transfer on its stream) or DL_ECUDA. Same thread for begin,
 * the calls and end. Nested groups are allowed (NCCL counts them). */
int nccl_pair_group_begin(void);
int nccl_pair_group_end(nccl_pair_t *p);

/* ncclSend / ncclRecv of `bytes` bytes (ncclUint8; count is a size_t in NCCL, so no
 * chunking) from / into device memory `buf` on CUDA stream `stream` (cudaStream_t; NULL
 * = the legacy default stream), to / from rank `peer` (0..nranks-1; itself in a
 * 1-rank pair, which needs the send and the recv in one group). Stream-ordered: the
 * transfer runs after the work queued on `stream` before it, and work queued after it
 * waits for it; `buf` stays valid and (send) unchanged until the stream passes it.
 * Both ranks must issue matching calls (same bytes, same order). The pair must be
 * ready (nccl_pair_poll 0), else DL_ESTATE. Returns like nccl_pair_group_end (inside a
 * group: 0, the group's end says the rest). Errors: DL_EINVAL (peer, NULL buf with
 * bytes > 0), DL_ESTATE, DL_ECUDA. */
int nccl_pair_send(nccl_pair_t *p, const void *buf, size_t bytes, int peer, void *stream);
int nccl_pair_recv(nccl_pair_t *p, void *buf, size_t bytes, int peer, void *stream);

/* ncclCommAbort: drops the pair at once, whatever its state (mid-init, a transfer pending
 * to a dead peer, failed); never waits for the peer. Transfers not yet done are lost and
 * their buffers' contents undefined; the stream's later work runs. *p = NULL; NULL and
 * *p == NULL are accepted. The other pairs of the process are not touched. */
void nccl_pair_abort(nccl_pair_t **p);

/* Orderly close: waits (polling, at most NCCL_PAIR_DESTROY_TIMEOUT_MS) for the issued
 * operations (ncclCommFinalize), then ncclCommDestroy; a pair that is not ready, fails or
 * times out is aborted instead (DL_ETIMEDOUT / DL_ECUDA returned, the pair freed all the
 * same). *p = NULL; NULL and *p == NULL give 0. Blocks: call from the compute thread or
 * at shutdown, not from the loop. */
int nccl_pair_destroy(nccl_pair_t **p);

/* "nccl pair 1a2b3c4d (rank 0 of 2, GPU 0)": the id's hash, for logs. Valid as long as
 * the pair. */
const char *nccl_pair_name(const nccl_pair_t *p);

/* ncclBroadcast of `bytes` bytes (ncclUint8) from rank `root`'s `buf` into every other
 * rank's `buf` (device memory; in place on the root), on `stream`, stream-ordered as
 * nccl_pair_send. A collective: every rank of the communicator issues it, in the same
 * order as its other collectives. Returns and fails like nccl_pair_send (DL_EINVAL:
 * root out of range or NULL buf). CPU: DL_ENOTSUP. */
int nccl_pair_bcast(nccl_pair_t *p, void *buf, size_t bytes, int root, void *stream);

/* A second communicator of the same ranks (ncclCommSplit, color 0, key = rank), non-
 * blocking like nccl_pair_init: *out is returned at once (owned by the caller) and
 * nccl_pair_poll says when it is ready. A collective on `parent`: every rank calls it,
 * once parent polled ready, as its next call on parent. Its operations are ordered
 * independently of the parent's, so a broadcast on one cannot wait behind a send on the
 * other (the step communicator's weights vs gradients, docs/MULTINODE.md section 4).
 * Errors: DL_EINVAL, DL_ESTATE (parent not ready), DL_ECUDA; *out = NULL then.
 * CPU: DL_ENOTSUP. */
int nccl_pair_split(nccl_pair_t *parent, nccl_pair_t **out);

/* Completion marks: a CUDA event (no timing) recorded after the transfers queued on a
 * stream, queried without waiting, so a stage's loop learns that a receive landed (or a
 * broadcast left) from a timer and never blocks on a stream a dead peer holds up.
 *   nccl_mark_new: *ev owned by the caller (nccl_mark_destroy; NULL accepted).
 *   nccl_mark_record: cudaEventRecord(ev, stream).
 *   nccl_mark_done: 0 the work recorded before it is done, DL_EAGAIN not yet, DL_ECUDA.
 * Any thread; the calling thread's current device must be the stream's. CPU: DL_ENOTSUP
 * (destroy: nothing). */
int nccl_mark_new(void **ev);
int nccl_mark_record(void *ev, void *stream);
int nccl_mark_done(void *ev);
void nccl_mark_destroy(void *ev);

/* ---- the step communicator's rules (pure; both builds; tests/unit/test_nccl_step.c) ----
 * The optimizer is rank 0; the live GPU drafters on other nodes are ranks 1..k in stage-id
 * order. The optimizer makes a new communicator (a new id, sent to each member as proto
 * `nccl_id`) whenever that set changes: a member's new incarnation, a death, a rebalance. */

#define NCCL_STEP_MEMBERS_MAX (NCCL_PAIR_RANKS_MAX - 1)

typedef struct {
    uint32_t stage_id;         /* a drafter's stage id */
    uint64_t incarnation;      /* from its hello */
} nccl_member_t;

typedef struct {
    int n;                                      /* members: ranks 1..n */
    nccl_member_t m[NCCL_STEP_MEMBERS_MAX];     /* by rank - 1: stage-id order */
} nccl_members_t;

/* The member set of n candidates (any order): sorted by stage id; a stage id listed
 * twice keeps its highest incarnation. 0, or DL_ERANGE (over NCCL_STEP_MEMBERS_MAX
 * distinct stages; *out holds the first ones) / DL_EINVAL (NULL, n < 0). */
int nccl_step_members(const nccl_member_t *cand, int n, nccl_members_t *out);

/* The rank (1..n) of drafter (stage_id, incarnation) in s, or -1 (not a member, or
 * another incarnation of it). */
int nccl_step_rank(const nccl_members_t *s, uint32_t stage_id, uint64_t incarnation);

/* 1 when a and b are the same set (same stages, same incarnations): no rebuild. */
int nccl_step_same(const nccl_members_t *a, const nccl_members_t *b);

/* A drafter's check of an `nccl_id` for the step communicator: for this drafter (me,
 * my_inc), from the optimizer's incarnation owner_inc, with (nranks, rank) well formed.
 * last_owner_inc: the optimizer incarnation of the newest id taken (0 none). Ids of one
 * optimizer incarnation arrive in the order it made them (one connection), so the latest
 * is the newest; one of an older optimizer incarnation, or for another incarnation of
 * this drafter, is stale. 1 take it (abort the old communicator), 0 stale (drop it),
 * DL_EINVAL malformed (nranks outside 2..NCCL_PAIR_RANKS_MAX, rank outside 1..nranks-1). */
int nccl_step_id_fresh(uint32_t me, uint64_t my_inc, uint64_t last_owner_inc, uint32_t peer_id,
                       uint64_t peer_inc, uint64_t owner_inc, uint32_t nranks, uint32_t rank);

#endif
