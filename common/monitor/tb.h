/* TensorBoard event files: a run's scalars (loss, lr, grad norm, tokens/s, accuracy per
 * block position) as <run>/tb/events.out.tfevents.<unix s>.<host>, so TensorBoard
 * (`tensorboard --logdir <run>/tb`) shows draftline runs.
 *
 * Format, encoded by hand (no protobuf dependency; field numbers from TensorFlow's
 * tensorflow/core/util/event.proto and tensorflow/core/framework/summary.proto):
 *   record  = uint64 len (LE) | uint32 masked_crc32c(len bytes) | data[len] |
 *             uint32 masked_crc32c(data)             (TFRecord, tensorflow/core/lib/io/record_writer.cc)
 *   masked  = ((crc >> 15) | (crc << 17)) + 0xa282ead8, crc = CRC-32C (Castagnoli)
 *   Event   = 1: double wall_time (s since the epoch), 2: int64 step,
 *             3: string file_version ("brain.Event:2", the file's first record),
 *             5: Summary summary
 *   Summary = 1: repeated Value value;  Value = 1: string tag, 2: float simple_value
 * Fields at their proto3 default (0, "") are left out, as protobuf's serializer does
 * (not simple_value, file_version, summary: oneof members are written when set),
 * so the bytes equal those of TensorBoard's own writer (tests/fixtures/tb).
 * Each new writer is a new file (a resumed run adds one; TensorBoard reads them all). */
#ifndef DL_MONITOR_TB_H
#define DL_MONITOR_TB_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of data[n], masked as TFRecord stores it. */
uint32_t mon_tb_masked_crc(const void *data, size_t n);

/* Encodes an Event into buf[cap]: wall_time (s), step, and either file_version (a
 * string, tag NULL) or one Summary value tag = simple_value v (file_version NULL).
 * Returns its length, or 0 when it does not fit. */
size_t mon_tb_event(uint8_t *buf, size_t cap, double wall_time, int64_t step, const char *file_version,
                    const char *tag, float v);

/* The TFRecord framing of data[n] into out[cap] (n + 16 bytes); its length, or 0. */
size_t mon_tb_frame(uint8_t *out, size_t cap, const uint8_t *data, size_t n);

typedef struct mon_tb mon_tb_t;

/* Creates <dir>/tb/ (0755) and the file events.out.tfevents.<unix s>.<hostname> in it,
 * with its file_version record. NULL + dl_errmsg (DL_EIO with errno's text, DL_ERANGE
 * for a path too long, DL_ENOMEM). */
mon_tb_t *mon_tb_open(const char *dir, double wall_time);
/* Appends scalar tag = v at step (wall_time: s since the epoch). Non-finite v is left out
 * (TensorBoard draws no NaN). Flushed by mon_tb_flush. 0 or DL_EIO. */
int mon_tb_scalar(mon_tb_t *w, double wall_time, int64_t step, const char *tag, double v);
/* Flushes what was appended (one step's scalars at a time). 0 or DL_EIO. */
int mon_tb_flush(mon_tb_t *w);
/* Closes the file; *w = NULL; a NULL or already closed handle is fine. */
void mon_tb_close(mon_tb_t **w);

#endif
