/* CUDA implementation of common/mem/dev.h: each function is the mem_cuda_* call of
 * the same name (cuda/mem_cuda.c), unchanged. Built only with CUDA=1. */
#include "common/mem/dev.h"
#include "common/mem/cuda/mem_cuda.h"

/* Empty unless DL_CUDA: the Makefile's `$(filter %/cuda/%, ...)` has two '%' (only the first is
 * a wildcard), so the .c files under cuda/ are compiled into CPU builds too, where this file must not define
 * the dev_* that common/mem/dev.c defines. */
#ifdef DL_CUDA

_Static_assert(DEV_EVENT_BYTES == 64, "mem_cuda event handles are 64 bytes");

int dev_available(void) { return 1; }
int dev_set(int device) { return mem_cuda_set_device(device); }
int dev_uuid(int device, char *uuid, size_t cap) { return mem_cuda_uuid(device, uuid, cap); }
int dev_stream_new(int device, void **stream) { return mem_cuda_stream_new(device, stream); }
void dev_stream_destroy(void *stream) { mem_cuda_stream_destroy(stream); }
int dev_stream_sync(void *stream) { return mem_cuda_stream_sync(stream); }
int dev_stream_wait(void *stream, void *ev) { return mem_cuda_stream_wait(stream, ev); }

int dev_copy_async(void *dst, const void *src, size_t bytes, void *stream) {
    return mem_cuda_memcpy_async(dst, src, bytes, stream);
}

int dev_host_alloc(void **p, size_t bytes) { return mem_cuda_host_alloc(p, bytes); }
void dev_host_free(void *p) { mem_cuda_host_free(p); }
int dev_host_register(void *p, size_t bytes) { return mem_cuda_host_register(p, bytes); }
void dev_host_unregister(void *p) { mem_cuda_host_unregister(p); }

int dev_event_create(void **ev, uint8_t handle[DEV_EVENT_BYTES]) { return mem_cuda_event_create(ev, handle); }
int dev_event_open(const uint8_t handle[DEV_EVENT_BYTES], void **ev) { return mem_cuda_event_open(handle, ev); }
void dev_event_destroy(void *ev) { mem_cuda_event_destroy(ev); }
int dev_event_record(void *ev, void *stream) { return mem_cuda_event_record(ev, stream); }
#endif
