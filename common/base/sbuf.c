/* Growable text buffer (sbuf.h). */
#include "common/base/sbuf.h"

#include "common/base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sbuf_printf(sbuf_t *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) { b->oom = 1; return; }
        if (b->p && (size_t)n < room) { b->len += (size_t)n; return; }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = cap;
    }
}

int sbuf_take(sbuf_t *b, char **text, size_t *len) {
    if (!b->oom && !b->p) sbuf_printf(b, "%s", "");
    if (b->oom) {
        free(b->p);
        memset(b, 0, sizeof *b);
        return dl_seterr(DL_ENOMEM, "out of memory building a text report");
    }
    *text = b->p;
    *len = b->len;
    memset(b, 0, sizeof *b);
    return 0;
}
