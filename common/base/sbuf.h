/* A growable text buffer for building reports (monitor snapshot, Prometheus text).
 *
 *   sbuf_t b = {0};
 *   sbuf_printf(&b, "step %d\n", s);   // appends; grows by doubling (first 4 KiB)
 *   char *text; size_t len;
 *   if (sbuf_take(&b, &text, &len) < 0) ... // DL_ENOMEM; else text is the caller's (free())
 *
 * An allocation or formatting failure is sticky (b.oom): later appends do nothing and
 * sbuf_take reports it, so callers check once at the end. Not thread-safe. */
#ifndef DL_BASE_SBUF_H
#define DL_BASE_SBUF_H

#include <stddef.h>

typedef struct {
    char *p;        /* NUL-terminated text, NULL until the first append */
    size_t len;     /* bytes of text, without the NUL */
    size_t cap;     /* bytes allocated */
    int oom;        /* 1 after a failed allocation or vsnprintf */
} sbuf_t;

/* Appends printf-formatted text. On failure sets b->oom (sticky) and appends nothing. */
void sbuf_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Hands the text over: *text (NUL-terminated, never NULL: "" when nothing was appended;
 * the caller frees it) and *len. Returns 0, or DL_ENOMEM (after freeing the buffer)
 * when any append failed. b is left empty either way. */
int sbuf_take(sbuf_t *b, char **text, size_t *len);

#endif
