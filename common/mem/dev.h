/* Device side of the stages' data plane: what a stage does with its GPU besides the
 * math (ops) and the slabs (slab.h). Streams, interprocess events, async copies and
 * the calling thread's device, behind one API with two implementations:
 *   CUDA builds (common/mem/cuda/dev_cuda.c, CUDA=1): the CUDA runtime calls of
 *     common/mem/cuda/mem_cuda.h, one for one.
 *   CPU builds (common/mem/dev.c): ordering calls are no-ops, copies are memcpy,
 *     and what needs a GPU (dev_uuid, dev_stream_new) fails with DL_ENOTSUP.
 * A stream or event is an opaque pointer (cudaStream_t / cudaEvent_t); NULL is the
 * default stream, and every destroy accepts NULL. Functions return 0 or a negative
 * error code (DL_ECUDA naming the call and the CUDA error string). Never called
 * before a stage forks: the supervisor never initialises CUDA. */
#ifndef DL_MEM_DEV_H
#define DL_MEM_DEV_H

#include <stddef.h>
#include <stdint.h>

#define DEV_EVENT_BYTES 64   /* sizeof(cudaIpcEventHandle_t): an event's wire form */

/* 1 in a CUDA build (a GPU may be used), 0 in a CPU-only build. */
int dev_available(void);

/* cudaSetDevice(device) for the calling thread (the current device is per thread: a
 * stage's libuv worker thread calls this before its first CUDA work). CPU: no-op. */
int dev_set(int device);

/* UUID string of `device` ("GPU-xxxxxxxx-xxxx-...") into uuid[cap]; DL_ERANGE when it
 * does not fit. CPU: DL_ENOTSUP. */
int dev_uuid(int device, char *uuid, size_t cap);

/* A non-blocking stream on `device` (cudaStreamNonBlocking); *stream owned by the
 * caller, destroy with dev_stream_destroy. CPU: DL_ENOTSUP. */
int dev_stream_new(int device, void **stream);
void dev_stream_destroy(void *stream);

/* cudaStreamSynchronize(stream): waits for this stream only (never device-wide).
 * CPU: no-op. */
int dev_stream_sync(void *stream);

/* cudaStreamWaitEvent(stream, ev): work queued on `stream` afterwards runs after the
 * work `ev` recorded (no host wait). CPU: no-op. */
int dev_stream_wait(void *stream, void *ev);

/* cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream): the direction is
 * inferred from the pointers (UVA), so it covers device -> peer device (an IPC-mapped
 * slab on another GPU), host -> device and device -> host; pageable host memory is
 * staged by the driver. CPU: memcpy, done on return. */
int dev_copy_async(void *dst, const void *src, size_t bytes, void *stream);

/* Page-locked host memory (cudaHostAlloc, cudaHostAllocPortable): the destination of
 * dev_copy_async copies the driver does not stage, so a device -> host copy runs at
 * full bus speed and truly asynchronously. *p owned by the caller, freed with
 * dev_host_free (NULL accepted). Allocation pins every page: seconds for tens of GB,
 * so not on a loop thread. CPU: malloc. Errors: DL_ECUDA / DL_ENOMEM, *p = NULL. */
int dev_host_alloc(void **p, size_t bytes);
void dev_host_free(void *p);

/* Page-locks `bytes` of existing host memory at p (cudaHostRegister, portable), so
 * dev_copy_async copies within that range run at bus speed and truly asynchronously.
 * One call holds the driver for the pinning of all its pages (about 0.5 s per GB), so
 * big buffers are pinned in pieces (page-aligned, none sharing a page); undo each piece
 * with dev_host_unregister(its p) before freeing the memory. CPU: nothing, 0.
 * Errors: DL_ECUDA. */
int dev_host_register(void *p, size_t bytes);
void dev_host_unregister(void *p);

/* Interprocess event (cudaEventInterprocess | cudaEventDisableTiming), created once by
 * its owner; handle[DEV_EVENT_BYTES] is what goes on the wire. *ev owned by the caller.
 * CPU: *ev = NULL and a zero handle. */
int dev_event_create(void **ev, uint8_t handle[DEV_EVENT_BYTES]);
/* A peer's event from its handle (cudaIpcOpenEventHandle); destroy when its owner's
 * incarnation is gone. CPU: *ev = NULL. */
int dev_event_open(const uint8_t handle[DEV_EVENT_BYTES], void **ev);
void dev_event_destroy(void *ev);
/* cudaEventRecord(ev, stream). CPU: no-op. */
int dev_event_record(void *ev, void *stream);

#endif
