/* CPU implementation of common/mem/nccl.h: a CPU-only build has no NCCL, so every call
 * that would need it fails with DL_ENOTSUP and the destroys do nothing. CUDA builds use
 * cuda/nccl_cuda.c (this file is empty there, as dev.c is). */
#include "common/mem/nccl.h"
#include "common/base/err.h"

#include <stddef.h>

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
#endif
