/* Follows an append-only text file line by line, like `tail -F`: delivers each
 * complete line once; keeps a partial last line until its newline arrives; starts
 * over from the top when the file is truncated (size below what was read) or
 * rotated (the path now names another inode: the old file is read to its end
 * first). The file may not exist yet. Not thread-safe; one reader per mon_tail_t. */
#ifndef DL_MONITOR_TAIL_H
#define DL_MONITOR_TAIL_H

#include <stddef.h>
#include <stdint.h>

#define MON_TAIL_LINE_MAX (1u << 20)    /* longer lines are skipped and counted */

typedef struct mon_tail mon_tail_t;
/* line: len bytes without the '\n' (or "\r\n"); line[len] == '\0'. Valid only during
 * the call. */
typedef void (*mon_tail_line_cb)(const char *line, size_t len, void *arg);

/* path is copied. NULL on out of memory. */
mon_tail_t *mon_tail_new(const char *path);
void mon_tail_destroy(mon_tail_t **t_p);
/* Reads what is new and calls cb for every complete line. Returns the number of lines
 * delivered (>= 0), or DL_EIO (read error; detail names the file). A missing file is
 * 0 lines, not an error. */
int mon_tail_poll(mon_tail_t *t, mon_tail_line_cb cb, void *arg);
/* Times the file was seen truncated or rotated. */
uint64_t mon_tail_resets(const mon_tail_t *t);
/* Lines skipped because they were longer than MON_TAIL_LINE_MAX. */
uint64_t mon_tail_skipped(const mon_tail_t *t);

#endif
