/* CUDA side of common/mem (compiled only with nvcc present: DL_CUDA builds).
 * Device memory slabs exported with cudaIpcGetMemHandle, opened by peers with
 * cudaIpcOpenMemHandle(cudaIpcMemLazyEnablePeerAccess), interprocess events
 * (cudaEventInterprocess | cudaEventDisableTiming) and page-locking of shared
 * host memory (cudaHostRegister). Every function returns 0 or DL_ECUDA naming the
 * call and the CUDA error string. Never called before a stage forks: the
 * supervisor never initialises CUDA. */
#ifndef DL_MEM_CUDA_H
#define DL_MEM_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* cudaMalloc(bytes) on `device`, zero it, export the IPC handle (64 bytes) and the
 * device's UUID ("GPU-...") into uuid[cap]. */
int mem_cuda_alloc_export(int device, size_t bytes, void **dptr, uint8_t ipc[64], char *uuid,
                          size_t cap);
void mem_cuda_free(void *dptr);
/* cudaIpcOpenMemHandle on `device`. Counted by the caller (hcache). */
int mem_cuda_open(int device, const uint8_t ipc[64], void **dptr);
void mem_cuda_close(void *dptr);
int mem_cuda_host_register(void *p, size_t bytes);
void mem_cuda_host_unregister(void *p);
/* cudaHostAlloc(bytes, cudaHostAllocPortable): page-locked host memory; free with
 * mem_cuda_host_free (NULL accepted). */
int mem_cuda_host_alloc(void **p, size_t bytes);
void mem_cuda_host_free(void *p);
/* UUID string of `device` ("GPU-xxxxxxxx-xxxx-...") */
int mem_cuda_uuid(int device, char *uuid, size_t cap);

/* Interprocess event: created once per inbox slot by the owner. */
int mem_cuda_event_create(void **ev, uint8_t handle[64]);
int mem_cuda_event_open(const uint8_t handle[64], void **ev);
void mem_cuda_event_destroy(void *ev);
int mem_cuda_event_record(void *ev, void *stream);
int mem_cuda_stream_wait(void *stream, void *ev);

/* cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream): the direction is
 * inferred from the pointers (UVA), so it covers device->peer device (an
 * IPC-mapped slab on another GPU: NVLink/PCIe copy), host->device and
 * device->host; pageable host memory is staged by the driver. */
int mem_cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream);
/* cudaStreamSynchronize(stream): waits for this stream only (never device-wide). */
int mem_cuda_stream_sync(void *stream);
/* A non-blocking stream on `device` (cudaStreamNonBlocking); destroy with
 * mem_cuda_stream_destroy. */
int mem_cuda_stream_new(int device, void **stream);
void mem_cuda_stream_destroy(void *stream);
/* cudaSetDevice(device) for the calling thread (the current device is per thread:
 * a stage's libuv worker thread calls this before its first CUDA work). */
int mem_cuda_set_device(int device);

#endif
