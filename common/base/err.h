/* Error codes and error detail.
 *
 * Every fallible function returns 0 or a negative dl_err code. The code says
 * what kind of failure; the detail string (dl_errmsg) says what and where, e.g.
 * "gsm8k/train.jsonl:17: field 'answer': expected string". Detail is kept per
 * thread (like errno), so it is valid until the next dl_seterr on that thread.
 */
#ifndef DL_BASE_ERR_H
#define DL_BASE_ERR_H

#include <stdarg.h>

typedef enum {
    DL_OK        = 0,
    DL_EINVAL    = -1,   /* bad argument, flag or input value */
    DL_ENOMEM    = -2,   /* host or device allocation failed */
    DL_EIO       = -3,   /* read/write/open failed (errno in detail) */
    DL_EPROTO    = -4,   /* malformed or unexpected message */
    DL_ETIMEDOUT = -5,   /* deadline passed (peer death, test timeout) */
    DL_ENOTSUP   = -6,   /* unsupported architecture, dtype, version, feature */
    DL_ECUDA     = -7,   /* CUDA / cuBLAS / NCCL error */
    DL_ERANGE    = -8,   /* value or length out of its allowed range */
    DL_EFORMAT   = -9,   /* malformed file (GGUF, safetensors, JSON, dataset line) */
    DL_ENOENT    = -10,  /* file, tensor, key or peer not found */
    DL_EAGAIN    = -11,  /* no room / no data now; try later (credit, inbox full) */
    DL_ECLOSED   = -12,  /* peer or socket closed / shutting down */
    DL_ESTATE    = -13,  /* call not valid in the current state */
    DL_ENAN      = -14,  /* NaN/Inf in loss or gradients */
    DL_ERR_COUNT_ = 15
} dl_err;

/* Short name of a code ("invalid argument", ...). Never NULL; unknown codes
 * give "unknown error". */
const char *dl_strerror(int code);

/* Sets this thread's error detail (printf format) and returns `code`, so a
 * caller can write `return dl_seterr(DL_EINVAL, "--lr: '%s' is not a number", s);` */
int dl_seterr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int dl_vseterr(int code, const char *fmt, va_list ap);

/* Prefixes the current detail with more context: "ctx: old detail". A detail that
 * already starts with "ctx: " (or is "ctx") is left as it is, so a path is not named
 * twice ("x.dlc: x.dlc: bad magic"). Returns code. */
int dl_wraperr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* This thread's detail of the last error ("" if none). */
const char *dl_errmsg(void);
void dl_clearerr(void);

/* Propagate a negative return code. */
#define DL_TRY(expr) do { int dl_rc_ = (expr); if (dl_rc_ < 0) return dl_rc_; } while (0)

#endif
