/* CPU implementation of common/mem/dev.h: a CPU-only build has no device, so ordering
 * is a no-op and a copy is done when it returns. CUDA builds use cuda/dev_cuda.c. */
#include "common/mem/dev.h"
#include "common/base/err.h"

#include <stdlib.h>
#include <string.h>

#ifndef DL_CUDA
int dev_available(void) { return 0; }

int dev_set(int device) {
    (void)device;
    return 0;
}

int dev_uuid(int device, char *uuid, size_t cap) {
    if (cap) uuid[0] = 0;
    return dl_seterr(DL_ENOTSUP, "dev_uuid(device %d): this build has no CUDA", device);
}

int dev_stream_new(int device, void **stream) {
    *stream = NULL;
    return dl_seterr(DL_ENOTSUP, "dev_stream_new(device %d): this build has no CUDA", device);
}

void dev_stream_destroy(void *stream) { (void)stream; }

int dev_stream_sync(void *stream) {
    (void)stream;
    return 0;
}

int dev_stream_wait(void *stream, void *ev) {
    (void)stream; (void)ev;
    return 0;
}

int dev_copy_async(void *dst, const void *src, size_t bytes, void *stream) {
    (void)stream;
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

int dev_host_alloc(void **p, size_t bytes) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? 0 : dl_seterr(DL_ENOMEM, "dev_host_alloc: %zu bytes", bytes);
}

void dev_host_free(void *p) { free(p); }

int dev_host_register(void *p, size_t bytes) {
    (void)p; (void)bytes;
    return 0;
}

void dev_host_unregister(void *p) { (void)p; }

int dev_event_create(void **ev, uint8_t handle[DEV_EVENT_BYTES]) {
    *ev = NULL;
    memset(handle, 0, DEV_EVENT_BYTES);
    return 0;
}

int dev_event_open(const uint8_t handle[DEV_EVENT_BYTES], void **ev) {
    (void)handle;
    *ev = NULL;
    return 0;
}

void dev_event_destroy(void *ev) { (void)ev; }

int dev_event_record(void *ev, void *stream) {
    (void)ev; (void)stream;
    return 0;
}
#endif
