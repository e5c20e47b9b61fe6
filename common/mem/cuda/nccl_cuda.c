/* NCCL implementation of common/mem/nccl.h (non-blocking communicators). Built only with
 * CUDA=1. NCCL's rule for non-blocking communicators: after any call returns
 * ncclInProgress, ncclCommGetAsyncError must say ncclSuccess before the next NCCL call on
 * that communicator and before work that depends on it is queued on its streams; `ready`
 * below mirrors that (0 after ncclInProgress, 1 once polled to ncclSuccess). */
#include "common/mem/nccl.h"
#include "common/base/err.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DL_CUDA

_Static_assert(NCCL_PAIR_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId is 128 bytes");
_Static_assert(sizeof(ncclUniqueId) == NCCL_PAIR_ID_BYTES, "ncclUniqueId is 128 bytes");

struct nccl_pair {
    ncclComm_t comm;    /* a split's: NULL until NCCL completes it (non-blocking), then set by NCCL */
    ncclComm_t parent;  /* a split's parent communicator while comm is NULL (polled instead), else NULL */
    int nranks, rank, device;
    int ready;          /* the last ncclCommGetAsyncError said ncclSuccess */
    int failed;         /* a dl_err once NCCL reported an error (sticky: abort the pair) */
    char name[64];
};

/* Depth of this thread's nccl_pair_group_begin: mirrors NCCL's own per-thread group
 * depth, so a send / recv knows whether it must make its own group. */
static __thread int t_group_depth;

int nccl_available(void) { return 1; }

static int nc_err(const nccl_pair_t *p, ncclResult_t r, const char *what) {
    const char *last = ncclGetLastError(p ? p->comm : NULL);
    return dl_seterr(DL_ECUDA, "%s: %s: %s%s%s", p ? p->name : "nccl", what, ncclGetErrorString(r),
                     last && last[0] ? ": " : "", last ? last : "");
}

static uint32_t id_hash(const uint8_t *id) {
    uint32_t h = 2166136261u;   /* FNV-1a */
    for (int i = 0; i < NCCL_PAIR_ID_BYTES; i++) h = (h ^ id[i]) * 16777619u;
    return h;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int nccl_id_new(uint8_t id[NCCL_PAIR_ID_BYTES]) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nc_err(NULL, r, "ncclGetUniqueId");
    memcpy(id, u.internal, NCCL_PAIR_ID_BYTES);
    return 0;
}

int nccl_pair_init(nccl_pair_t **out, const uint8_t id[NCCL_PAIR_ID_BYTES], int nranks, int rank,
                   int device) {
    if (!out) return dl_seterr(DL_EINVAL, "nccl_pair_init: NULL out");
    *out = NULL;
    if (!id || nranks < 1 || nranks > NCCL_PAIR_RANKS_MAX || rank < 0 || rank >= nranks || device < 0)
        return dl_seterr(DL_EINVAL, "nccl_pair_init: rank %d of %d on GPU %d (1..%d ranks)", rank, nranks, device,
                         NCCL_PAIR_RANKS_MAX);
    nccl_pair_t *p = calloc(1, sizeof *p);
    if (!p) return dl_seterr(DL_ENOMEM, "nccl_pair_init: out of memory");
    p->nranks = nranks; p->rank = rank; p->device = device;
    snprintf(p->name, sizeof p->name, "nccl pair %08x (rank %d of %d, GPU %d)", id_hash(id), rank, nranks,
             device);
    int prev = -1;
    cudaError_t ce = cudaGetDevice(&prev);
    if (ce == cudaSuccess) ce = cudaSetDevice(device);
    if (ce != cudaSuccess) {
        int rc = dl_seterr(DL_ECUDA, "%s: cudaSetDevice(%d): %s", p->name, device, cudaGetErrorString(ce));
        free(p);
        return rc;
    }
    ncclUniqueId u;
    memcpy(u.internal, id, NCCL_PAIR_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;   /* returns at once; nccl_pair_poll follows the connection */
    ncclResult_t r = ncclCommInitRankConfig(&p->comm, nranks, u, rank, &cfg);
    if (prev >= 0 && prev != device) (void)cudaSetDevice(prev);
    if (r != ncclSuccess && r != ncclInProgress) {
        int rc = nc_err(p, r, "ncclCommInitRankConfig");
        if (p->comm) ncclCommAbort(p->comm);
        free(p);
        return rc;
    }
    p->ready = 0;   /* even on ncclSuccess: the first poll confirms it */
    *out = p;
    return 0;
}

int nccl_pair_poll(nccl_pair_t *p) {
    if (!p) return dl_seterr(DL_EINVAL, "nccl_pair_poll: NULL pair");
    if (p->failed) return dl_seterr(p->failed, "%s: failed earlier: abort it", p->name);
    ncclResult_t st = ncclInProgress;
    if (!p->comm) {
        /* a non-blocking ncclCommSplit in flight: NCCL writes the new communicator when it
         * completes, and until then its state is the parent's (measured on an H200: polling
         * the NULL child fails "comm argument is NULL") */
        ncclResult_t r = p->parent ? ncclCommGetAsyncError(p->parent, &st) : ncclInvalidArgument;
        if (r != ncclSuccess) st = r;
        if (st == ncclInProgress || (st == ncclSuccess && !__atomic_load_n(&p->comm, __ATOMIC_ACQUIRE)))
            return DL_EAGAIN;
        if (st != ncclSuccess) {
            p->failed = DL_ECUDA;
            return nc_err(p, st, "ncclCommSplit (its parent's state)");
        }
        p->parent = NULL;
    }
    ncclResult_t r = ncclCommGetAsyncError(p->comm, &st);
    if (r != ncclSuccess) st = r;
    if (st == ncclInProgress) { p->ready = 0; return DL_EAGAIN; }
    if (st != ncclSuccess) {
        p->ready = 0;
        p->failed = DL_ECUDA;
        return nc_err(p, st, "ncclCommGetAsyncError");
    }
    p->ready = 1;
    return 0;
}

int nccl_pair_wait(nccl_pair_t *p, int timeout_ms) {
    double t_end = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        int rc = nccl_pair_poll(p);
        if (rc != DL_EAGAIN) return rc;
        if (now_ms() >= t_end)
            return dl_seterr(DL_ETIMEDOUT, "%s: not ready after %d ms", p->name, timeout_ms);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

int nccl_pair_group_begin(void) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nc_err(NULL, r, "ncclGroupStart");
    t_group_depth++;
    return 0;
}

/* ncclGroupEnd's result as the header says; the pair is not ready until polled after
 * ncclInProgress. */
static int group_end_result(nccl_pair_t *p, ncclResult_t r) {
    if (r == ncclSuccess) return 0;
    if (r == ncclInProgress) { if (p) p->ready = 0; return DL_EAGAIN; }
    if (p) { p->ready = 0; p->failed = DL_ECUDA; }
    return nc_err(p, r, "ncclGroupEnd");
}

int nccl_pair_group_end(nccl_pair_t *p) {
    if (t_group_depth <= 0) return dl_seterr(DL_ESTATE, "nccl_pair_group_end: no group begun on this thread");
    t_group_depth--;
    return group_end_result(p, ncclGroupEnd());
}

static int p2p_check(nccl_pair_t *p, const void *buf, size_t bytes, int peer, const char *what) {
    if (!p) return dl_seterr(DL_EINVAL, "%s: NULL pair", what);
    if (p->failed) return dl_seterr(p->failed, "%s: %s: failed earlier: abort it", p->name, what);
    if (!p->ready) return dl_seterr(DL_ESTATE, "%s: %s before the pair is ready (poll until 0)", p->name, what);
    if (peer < 0 || peer >= p->nranks) return dl_seterr(DL_EINVAL, "%s: %s to rank %d", p->name, what, peer);
    if (!buf && bytes) return dl_seterr(DL_EINVAL, "%s: %s of %zu bytes from NULL", p->name, what, bytes);
    return 0;
}

/* One ncclSend / ncclRecv, in the caller's group or in a group of its own. */
static int p2p(nccl_pair_t *p, int is_send, void *buf, size_t bytes, int peer, void *stream) {
    const char *what = is_send ? "ncclSend" : "ncclRecv";
    DL_TRY(p2p_check(p, buf, bytes, peer, what));
    int own = t_group_depth == 0;
    if (own) {
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) return nc_err(p, r, "ncclGroupStart");
    }
    ncclResult_t r = is_send ? ncclSend(buf, bytes, ncclUint8, peer, p->comm, (cudaStream_t)stream)
                             : ncclRecv(buf, bytes, ncclUint8, peer, p->comm, (cudaStream_t)stream);
    if (r != ncclSuccess && r != ncclInProgress) {
        int rc = nc_err(p, r, what);
        if (own) (void)ncclGroupEnd();   /* closes the group; the failed op was not added */
        return rc;
    }
    if (!own) return 0;
    return group_end_result(p, ncclGroupEnd());
}

int nccl_pair_send(nccl_pair_t *p, const void *buf, size_t bytes, int peer, void *stream) {
    return p2p(p, 1, (void *)buf, bytes, peer, stream);
}

int nccl_pair_recv(nccl_pair_t *p, void *buf, size_t bytes, int peer, void *stream) {
    return p2p(p, 0, buf, bytes, peer, stream);
}

void nccl_pair_abort(nccl_pair_t **pp) {
    if (!pp || !*pp) return;
    nccl_pair_t *p = *pp;
    *pp = NULL;
    if (p->comm) (void)ncclCommAbort(p->comm);
    /* a split still in flight: NCCL may yet write p->comm (until its parent is aborted,
     * which the caller does next): the few bytes of p are left allocated rather than
     * risk that write into freed memory */
    if (!p->comm && p->parent) return;
    free(p);
}

int nccl_pair_destroy(nccl_pair_t **pp) {
    if (!pp || !*pp) return 0;
    nccl_pair_t *p = *pp;
    int rc = nccl_pair_wait(p, NCCL_PAIR_DESTROY_TIMEOUT_MS);
    if (rc == 0) {
        ncclResult_t r = ncclCommFinalize(p->comm);
        if (r == ncclSuccess || r == ncclInProgress) rc = nccl_pair_wait(p, NCCL_PAIR_DESTROY_TIMEOUT_MS);
        else rc = nc_err(p, r, "ncclCommFinalize");
    }
    if (rc != 0) {   /* not ready, failed or stuck: abort (never waits for the peer) */
        nccl_pair_abort(pp);
        return rc;
    }
    ncclResult_t r = ncclCommDestroy(p->comm);
    if (r != ncclSuccess) rc = nc_err(p, r, "ncclCommDestroy");
    *pp = NULL;
    free(p);
    return rc;
}

const char *nccl_pair_name(const nccl_pair_t *p) { return p ? p->name : "nccl pair (none)"; }

int nccl_pair_bcast(nccl_pair_t *p, void *buf, size_t bytes, int root, void *stream) {
    DL_TRY(p2p_check(p, buf, bytes, root, "ncclBroadcast"));
    ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, p->comm, (cudaStream_t)stream);
    if (r != ncclSuccess && r != ncclInProgress) {
        p->ready = 0;
        p->failed = DL_ECUDA;
        return nc_err(p, r, "ncclBroadcast");
    }
    if (t_group_depth > 0 || r == ncclSuccess) return 0;   /* in a group: its end says the rest */
    p->ready = 0;
    return DL_EAGAIN;
}

int nccl_pair_split(nccl_pair_t *parent, nccl_pair_t **out) {
    if (!out) return dl_seterr(DL_EINVAL, "nccl_pair_split: NULL out");
    *out = NULL;
    if (!parent) return dl_seterr(DL_EINVAL, "nccl_pair_split: NULL parent");
    if (parent->failed || !parent->ready)
        return dl_seterr(DL_ESTATE, "%s: split before it is ready (poll until 0)", parent->name);
    nccl_pair_t *p = calloc(1, sizeof *p);
    if (!p) return dl_seterr(DL_ENOMEM, "nccl_pair_split: out of memory");
    p->nranks = parent->nranks; p->rank = parent->rank; p->device = parent->device;
    snprintf(p->name, sizeof p->name, "%.50s/split", parent->name);
    int prev = -1;
    cudaError_t ce = cudaGetDevice(&prev);
    if (ce == cudaSuccess) ce = cudaSetDevice(p->device);
    if (ce != cudaSuccess) {
        int rc = dl_seterr(DL_ECUDA, "%s: cudaSetDevice(%d): %s", p->name, p->device, cudaGetErrorString(ce));
        free(p);
        return rc;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    p->parent = parent->comm;
    ncclResult_t r = ncclCommSplit(parent->comm, 0, parent->rank, &p->comm, &cfg);
    if (prev >= 0 && prev != p->device) (void)cudaSetDevice(prev);
    if (r != ncclSuccess && r != ncclInProgress) {
        int rc = nc_err(parent, r, "ncclCommSplit");
        parent->ready = 0;
        parent->failed = DL_ECUDA;
        if (p->comm) ncclCommAbort(p->comm);
        free(p);
        return rc;
    }
    parent->ready = 0;   /* the parent is in the split until polled (NCCL's non-blocking rule) */
    *out = p;
    return 0;
}

int nccl_mark_new(void **ev) {
    if (!ev) return dl_seterr(DL_EINVAL, "nccl_mark_new: NULL");
    cudaEvent_t e = NULL;
    cudaError_t ce = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    *ev = ce == cudaSuccess ? (void *)e : NULL;
    if (ce != cudaSuccess) return dl_seterr(DL_ECUDA, "cudaEventCreateWithFlags: %s", cudaGetErrorString(ce));
    return 0;
}

int nccl_mark_record(void *ev, void *stream) {
    cudaError_t ce = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream);
    if (ce != cudaSuccess) return dl_seterr(DL_ECUDA, "cudaEventRecord: %s", cudaGetErrorString(ce));
    return 0;
}

int nccl_mark_done(void *ev) {
    cudaError_t ce = cudaEventQuery((cudaEvent_t)ev);
    if (ce == cudaSuccess) return 0;
    if (ce == cudaErrorNotReady) return DL_EAGAIN;
    return dl_seterr(DL_ECUDA, "cudaEventQuery: %s", cudaGetErrorString(ce));
}

void nccl_mark_destroy(void *ev) {
    if (ev) (void)cudaEventDestroy((cudaEvent_t)ev);
}

#endif
