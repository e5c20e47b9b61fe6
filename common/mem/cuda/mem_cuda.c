/* CUDA IPC slabs and interprocess events (see mem_cuda.h). Built only with CUDA=1. */
#include "common/mem/cuda/mem_cuda.h"
#include "common/base/err.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

static int cu_err(cudaError_t e, const char *what) {
    return dl_seterr(DL_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}
#define CU(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return cu_err(e_, #call); } while (0)

int mem_cuda_uuid(int device, char *uuid, size_t cap) {
    struct cudaDeviceProp p;
    CU(cudaGetDeviceProperties(&p, device));
    const unsigned char *u = (const unsigned char *)p.uuid.bytes;
    int n = snprintf(uuid, cap,
                     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                     u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                     u[12], u[13], u[14], u[15]);
    if (n < 0 || (size_t)n >= cap) return dl_seterr(DL_ERANGE, "uuid buffer too small");
    return 0;
}

int mem_cuda_alloc_export(int device, size_t bytes, void **dptr, uint8_t ipc[64], char *uuid,
                          size_t cap) {
    CU(cudaSetDevice(device));
    CU(cudaMalloc(dptr, bytes));
    CU(cudaMemset(*dptr, 0, bytes));
    cudaIpcMemHandle_t h;
    _Static_assert(sizeof h == 64, "cudaIpcMemHandle_t is 64 bytes");
    CU(cudaIpcGetMemHandle(&h, *dptr));
    memcpy(ipc, &h, 64);
    return mem_cuda_uuid(device, uuid, cap);
}

void mem_cuda_free(void *dptr) { if (dptr) cudaFree(dptr); }

int mem_cuda_open(int device, const uint8_t ipc[64], void **dptr) {
    CU(cudaSetDevice(device));
    cudaIpcMemHandle_t h;
    memcpy(&h, ipc, 64);
    CU(cudaIpcOpenMemHandle(dptr, h, cudaIpcMemLazyEnablePeerAccess));
    return 0;
}

void mem_cuda_close(void *dptr) { if (dptr) cudaIpcCloseMemHandle(dptr); }

int mem_cuda_host_register(void *p, size_t bytes) {
    CU(cudaHostRegister(p, bytes, cudaHostRegisterPortable));
    return 0;
}

void mem_cuda_host_unregister(void *p) { if (p) cudaHostUnregister(p); }

int mem_cuda_host_alloc(void **p, size_t bytes) {
    *p = NULL;
    CU(cudaHostAlloc(p, bytes, cudaHostAllocPortable));
    return 0;
}

void mem_cuda_host_free(void *p) { if (p) cudaFreeHost(p); }

int mem_cuda_event_create(void **ev, uint8_t handle[64]) {
    cudaEvent_t e;
    CU(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming));
    cudaIpcEventHandle_t h;
    _Static_assert(sizeof h == 64, "cudaIpcEventHandle_t is 64 bytes");
    CU(cudaIpcGetEventHandle(&h, e));
    memcpy(handle, &h, 64);
    *ev = e;
    return 0;
}

int mem_cuda_event_open(const uint8_t handle[64], void **ev) {
    cudaIpcEventHandle_t h;
    memcpy(&h, handle, 64);
    cudaEvent_t e;
    CU(cudaIpcOpenEventHandle(&e, h));
    *ev = e;
    return 0;
}

void mem_cuda_event_destroy(void *ev) { if (ev) cudaEventDestroy((cudaEvent_t)ev); }

int mem_cuda_event_record(void *ev, void *stream) {
    CU(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream));
    return 0;
}

int mem_cuda_stream_wait(void *stream, void *ev) {
    CU(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0));
    return 0;
}

int mem_cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream) {
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
    return 0;
}

int mem_cuda_stream_sync(void *stream) {
    CU(cudaStreamSynchronize((cudaStream_t)stream));
    return 0;
}

int mem_cuda_stream_new(int device, void **stream) {
    CU(cudaSetDevice(device));
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = s;
    return 0;
}

void mem_cuda_stream_destroy(void *stream) { if (stream) cudaStreamDestroy((cudaStream_t)stream); }

int mem_cuda_set_device(int device) {
    CU(cudaSetDevice(device));
    return 0;
}
