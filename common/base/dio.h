/* Checkpoint-sized file writes with O_DIRECT where the file system takes it.
 *
 * A dio_file_t is one file opened for writing twice: a buffered fd and, when the file
 * system accepts it, an O_DIRECT fd of the same file. dio_pwrite writes bytes
 * [off, off + n): the whole DIO_ALIGN blocks inside go through the direct fd, memcpy'd
 * in chunks into the caller's bounce buffer (aligned memory, as O_DIRECT wants; the
 * caller's memory may be pinned CUDA memory that O_DIRECT cannot take); the partial
 * block at each end (head, tail) goes through the buffered fd. Calls on disjoint ranges
 * never share a block between the two fds (a block partly in a range is only ever written
 * buffered), so the page cache and the direct writes never overlap; the bytes are those
 * of plain pwrite calls.
 *
 * Fallback: when open(O_DIRECT) fails (tmpfs, some overlay fs) or a direct pwrite fails
 * with EINVAL / EOPNOTSUPP, the file is written buffered from there on (log_debug, once
 * per process); the bytes are the same. Each file logs (debug) its mode when closed.
 *
 * Test hooks (common/base/testhook.h), read once per process:
 *   dio.mode=1  every write plain pwrite on the buffered fd (the path before O_DIRECT);
 *   dio.mode=2  the bounce/split path on a second fd opened without O_DIRECT (the
 *               arithmetic runs on any file system);
 *   dio.mode=3  as auto, but the first direct pwrite of each file fails with EINVAL;
 *   dio.bounce_kib=K  bounce buffers of K KiB (rounded up to DIO_ALIGN).
 * Thread-safe: one dio_file_t may take dio_pwrite calls from several threads at once
 * (disjoint ranges), each thread with its own dio_bounce_t.
 */
#ifndef DL_BASE_DIO_H
#define DL_BASE_DIO_H

#include <stddef.h>
#include <stdint.h>

#define DIO_ALIGN 4096u                 /* bytes: file offsets, lengths, memory (at least the page size) */
#define DIO_BOUNCE_BYTES (32u << 20)    /* bytes of one thread's bounce buffer */

typedef struct dio_file dio_file_t;

/* One thread's bounce buffer: zero it ({0}) before use; allocated (posix_memalign) on the
 * first direct write that needs it, freed by dio_bounce_free. Owned by its thread. */
typedef struct {
    uint8_t *p;
    size_t n;   /* bytes, a multiple of DIO_ALIGN */
} dio_bounce_t;

/* Creates (O_CREAT | O_TRUNC, 0644) path for writing; *out owned by the caller
 * (dio_close). size: the file's final size in bytes when known (0: unknown), reserved with
 * fallocate when the direct fd is open (concurrent direct writes into reserved blocks run
 * in parallel on ext4; a failed reserve is ignored). DL_EIO naming the path (errno kept),
 * DL_ENOMEM. */
int dio_open(const char *path, uint64_t size, dio_file_t **out);
/* Reserves size bytes for f (its final size, fallocate) when the direct fd is open; a
 * failed reserve is ignored. Call before the writes. */
void dio_reserve(dio_file_t *f, uint64_t size);
/* Writes n bytes of src at file offset off (see above); the ranges of all calls on f
 * are disjoint. 0, or DL_EIO "write <path>: <strerror>" with errno kept (ENOSPC, EIO for
 * a write of 0 bytes). */
int dio_pwrite(dio_file_t *f, dio_bounce_t *b, const void *src, size_t n, uint64_t off);
/* fsync of each fd used. 0, or DL_EIO with errno kept. */
int dio_fsync(dio_file_t *f);
/* Closes both fds, logs (debug) the mode and the bytes written each way, frees *fp and
 * nulls it (NULL or *fp NULL: nothing). 0, or DL_EIO with errno kept. */
int dio_close(dio_file_t **fp);
/* Bytes written through the direct fd so far (0 when buffered). */
uint64_t dio_direct_bytes(const dio_file_t *f);
void dio_bounce_free(dio_bounce_t *b);

#endif
