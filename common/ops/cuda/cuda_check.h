/* Error checks for CUDA runtime and cuBLAS(Lt) calls (llm.c style): a small
 * function behind a macro that passes file and line. A failed check logs
 * "file:line: what: error string" and aborts the stage (the supervisor restarts
 * it); ops.h documents this contract. Usable from C and CUDA C++.
 *
 *   cuda_check(cudaMemcpyAsync(...));
 *   kernel<<<g, b, 0, s>>>(...); cuda_check_launch();
 *   cublas_check(cublasLtMatmul(...));
 */
#ifndef DL_OPS_CUDA_CUDA_CHECK_H
#define DL_OPS_CUDA_CUDA_CHECK_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Log and abort(). Never returns. */
void cuda_check_fail_(const char *what, const char *errstr, const char *file, int line)
    __attribute__((noreturn));

static inline void cuda_check_(cudaError_t e, const char *what, const char *file, int line) {
    if (e != cudaSuccess) cuda_check_fail_(what, cudaGetErrorString(e), file, line);
}

static inline void cublas_check_(cublasStatus_t s, const char *what, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) cuda_check_fail_(what, cublasLtGetStatusString(s), file, line);
}

#ifdef __cplusplus
}
#endif

#define cuda_check(call) cuda_check_((call), #call, __FILE__, __LINE__)
/* After every kernel launch: catches bad launch configurations at once (and,
 * asynchronously, earlier faults). */
#define cuda_check_launch() cuda_check_(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
#define cublas_check(call) cublas_check_((call), #call, __FILE__, __LINE__)

#endif
