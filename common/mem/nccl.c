/* CPU implementation of common/mem/nccl.h: a CPU-only build has no NCCL, so every call
 * that would need it fails with DL_ENOTSUP and the destroys do nothing. CUDA builds use
 * cuda/nccl_cuda.c for those. The step communicator's membership rules (pure) are here
 * for both builds. */
#include "common/mem/nccl.h"
#include "common/base/err.h"

#include <stddef.h>
#include <string.h>

int nccl_step_members(const nccl_member_t *cand, int n, nccl_members_t *out) {
    if (!out || n < 0 || (n > 0 && !cand)) return dl_seterr(DL_EINVAL, "nccl_step_members: NULL or n %d", n);
    out->n = 0;
    int over = 0;
    for (int i = 0; i < n; i++) {
        nccl_member_t c = cand[i];
        int j = 0;
        while (j < out->n && out->m[j].stage_id < c.stage_id) j++;
        if (j < out->n && out->m[j].stage_id == c.stage_id) {
            if (c.incarnation > out->m[j].incarnation) out->m[j].incarnation = c.incarnation;
            continue;
        }
        if (out->n == NCCL_STEP_MEMBERS_MAX) { over = 1; continue; }
        memmove(&out->m[j + 1], &out->m[j], (size_t)(out->n - j) * sizeof out->m[0]);
        out->m[j] = c;
        out->n++;
    }
    if (over) return dl_seterr(DL_ERANGE, "nccl_step_members: over %d drafters", NCCL_STEP_MEMBERS_MAX);
    return 0;
}

int nccl_step_rank(const nccl_members_t *s, uint32_t stage_id, uint64_t incarnation) {
    if (!s) return -1;
    for (int j = 0; j < s->n; j++)
        if (s->m[j].stage_id == stage_id) return s->m[j].incarnation == incarnation ? j + 1 : -1;
    return -1;
}

int nccl_step_same(const nccl_members_t *a, const nccl_members_t *b) {
    if (a->n != b->n) return 0;
    for (int j = 0; j < a->n; j++)
        if (a->m[j].stage_id != b->m[j].stage_id || a->m[j].incarnation != b->m[j].incarnation) return 0;
    return 1;
}

int nccl_step_id_fresh(uint32_t me, uint64_t my_inc, uint64_t last_owner_inc, uint32_t peer_id,
                       uint64_t peer_inc, uint64_t owner_inc, uint32_t nranks, uint32_t rank) {
    if (nranks < 2 || nranks > NCCL_PAIR_RANKS_MAX || rank < 1 || rank >= nranks)
        return dl_seterr(DL_EINVAL, "nccl_id: rank %u of %u", rank, nranks);
    if (peer_id != me || peer_inc != my_inc) return 0;   /* another drafter, or an earlier me */
    return owner_inc >= last_owner_inc;                  /* an older optimizer's: stale */
}

#ifndef DL_CUDA
#define NO_NCCL(what) dl_seterr(DL_ENOTSUP, "%s: this build has no CUDA/NCCL (build with CUDA=1)", what)

int nccl_available(void) { return 0; }

int nccl_id_new(uint8_t id[NCCL_PAIR_ID_BYTES]) {
    (void)id;
    return NO_NCCL("nccl_id_new");
}

int nccl_pair_init(nccl_pair_t **out, const uint8_t id[NCCL_PAIR_ID_BYTES], int nranks, int rank,
                   int device) {
    (void)id; (void)nranks; (void)rank; (void)device;
    if (out) *out = NULL;
    return NO_NCCL("nccl_pair_init");
}

int nccl_pair_poll(nccl_pair_t *p) {
    (void)p;
    return NO_NCCL("nccl_pair_poll");
}

int nccl_pair_wait(nccl_pair_t *p, int timeout_ms) {
    (void)p; (void)timeout_ms;
    return NO_NCCL("nccl_pair_wait");
}

int nccl_pair_group_begin(void) { return NO_NCCL("nccl_pair_group_begin"); }

int nccl_pair_group_end(nccl_pair_t *p) {
    (void)p;
    return NO_NCCL("nccl_pair_group_end");
}

int nccl_pair_send(nccl_pair_t *p, const void *buf, size_t bytes, int peer, void *stream) {
    (void)p; (void)buf; (void)bytes; (void)peer; (void)stream;
    return NO_NCCL("nccl_pair_send");
}

int nccl_pair_recv(nccl_pair_t *p, void *buf, size_t bytes, int peer, void *stream) {
    (void)p; (void)buf; (void)bytes; (void)peer; (void)stream;
    return NO_NCCL("nccl_pair_recv");
}

void nccl_pair_abort(nccl_pair_t **p) {
    if (p) *p = NULL;
}

int nccl_pair_destroy(nccl_pair_t **p) {
    if (p) *p = NULL;
    return 0;
}

const char *nccl_pair_name(const nccl_pair_t *p) {
    (void)p;
    return "nccl pair (no NCCL in this build)";
}

int nccl_pair_bcast(nccl_pair_t *p, void *buf, size_t bytes, int root, void *stream) {
    (void)p; (void)buf; (void)bytes; (void)root; (void)stream;
    return NO_NCCL("nccl_pair_bcast");
}

int nccl_pair_split(nccl_pair_t *parent, nccl_pair_t **out) {
    (void)parent;
    if (out) *out = NULL;
    return NO_NCCL("nccl_pair_split");
}

int nccl_mark_new(void **ev) {
    if (ev) *ev = NULL;
    return NO_NCCL("nccl_mark_new");
}

int nccl_mark_record(void *ev, void *stream) {
    (void)ev; (void)stream;
    return NO_NCCL("nccl_mark_record");
}

int nccl_mark_done(void *ev) {
    (void)ev;
    return NO_NCCL("nccl_mark_done");
}

void nccl_mark_destroy(void *ev) { (void)ev; }
#endif
