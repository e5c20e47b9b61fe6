/* TensorBoard event files (see tb.h for the format and its sources). */
#include "common/monitor/tb.h"
#include "common/base/err.h"
#include "common/base/paths.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct mon_tb {
    FILE *f;
    char path[4400];
};

/* CRC-32C, reflected polynomial 0x82f63b78, bit by bit: a few hundred bytes per step. */
static uint32_t crc32c(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
    }
    return c ^ 0xffffffffu;
}

uint32_t mon_tb_masked_crc(const void *data, size_t n) {
    uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* Protobuf wire format: a varint, a tag (field << 3 | wire type), little-endian fixed. */
static size_t put_varint(uint8_t *b, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) { b[n++] = (uint8_t)(v | 0x80); v >>= 7; }
    b[n++] = (uint8_t)v;
    return n;
}

static size_t put_le(uint8_t *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
    return (size_t)bytes;
}

size_t mon_tb_event(uint8_t *buf, size_t cap, double wall_time, int64_t step, const char *file_version,
                    const char *tag, float v) {
    size_t lt = tag ? strlen(tag) : 0, lf = file_version ? strlen(file_version) : 0;
    if (lt > 1000 || lf > 1000 || cap < 64 + lt + lf) return 0;
    size_t n = 0;
    if (wall_time != 0) {                       /* 1: double wall_time */
        uint64_t u;
        memcpy(&u, &wall_time, 8);
        buf[n++] = 0x09;
        n += put_le(buf + n, u, 8);
    }
    if (step != 0) { buf[n++] = 0x10; n += put_varint(buf + n, (uint64_t)step); }   /* 2: int64 step */
    if (file_version) {                         /* 3: string file_version */
        buf[n++] = 0x1a;
        n += put_varint(buf + n, lf);
        memcpy(buf + n, file_version, lf);
        return n + lf;
    }
    /* Value = 1: tag, 2: float simple_value (fixed32) */
    uint8_t val[1100];
    size_t m = 0;
    if (lt) { val[m++] = 0x0a; m += put_varint(val + m, lt); memcpy(val + m, tag, lt); m += lt; }
    uint32_t u;                                 /* in a oneof: written even when 0 */
    memcpy(&u, &v, 4);
    val[m++] = 0x15;
    m += put_le(val + m, u, 4);
    /* 5: Summary summary { 1: Value value } */
    uint8_t sum[1110];
    size_t k = 0;
    sum[k++] = 0x0a;
    k += put_varint(sum + k, m);
    memcpy(sum + k, val, m);
    k += m;
    buf[n++] = 0x2a;
    n += put_varint(buf + n, k);
    memcpy(buf + n, sum, k);
    return n + k;
}

size_t mon_tb_frame(uint8_t *out, size_t cap, const uint8_t *data, size_t n) {
    if (cap < n + 16) return 0;
    uint8_t len[8];
    put_le(len, n, 8);
    memcpy(out, len, 8);
    put_le(out + 8, mon_tb_masked_crc(len, 8), 4);
    memcpy(out + 12, data, n);
    put_le(out + 12 + n, mon_tb_masked_crc(data, n), 4);
    return n + 16;
}

static int put_event(mon_tb_t *w, const uint8_t *ev, size_t n) {
    uint8_t rec[1400];
    size_t r = mon_tb_frame(rec, sizeof rec, ev, n);
    if (!r || fwrite(rec, 1, r, w->f) != r) return dl_seterr(DL_EIO, "%s: %s", w->path, strerror(errno));
    return 0;
}

mon_tb_t *mon_tb_open(const char *dir, double wall_time) {
    mon_tb_t *w = calloc(1, sizeof *w);
    if (!w) { dl_seterr(DL_ENOMEM, "tb: out of memory"); return NULL; }
    char host[256] = "localhost", d[4200];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    int nd = snprintf(d, sizeof d, "%s/tb", dir);
    int np = snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s", d, (long long)wall_time, host);
    if (nd < 0 || (size_t)nd >= sizeof d || np < 0 || (size_t)np >= sizeof w->path) {
        free(w);
        dl_seterr(DL_ERANGE, "%s/tb: path too long", dir);
        return NULL;
    }
    if (paths_mkdir_p(d, 0755) < 0 || !(w->f = fopen(w->path, "ab"))) {
        if (!w->f && errno) dl_seterr(DL_EIO, "%s: %s", w->path, strerror(errno));
        free(w);
        return NULL;
    }
    uint8_t ev[128];
    size_t n = mon_tb_event(ev, sizeof ev, wall_time, 0, "brain.Event:2", NULL, 0);
    if (put_event(w, ev, n) < 0 || mon_tb_flush(w) < 0) { mon_tb_close(&w); return NULL; }
    return w;
}

int mon_tb_scalar(mon_tb_t *w, double wall_time, int64_t step, const char *tag, double v) {
    if (!isfinite(v)) return 0;
    uint8_t ev[1200];
    size_t n = mon_tb_event(ev, sizeof ev, wall_time, step, NULL, tag, (float)v);
    if (!n) return dl_seterr(DL_EINVAL, "tb: tag '%.40s...' too long", tag);
    return put_event(w, ev, n);
}

int mon_tb_flush(mon_tb_t *w) {
    if (fflush(w->f) != 0 || ferror(w->f)) {
        clearerr(w->f);
        return dl_seterr(DL_EIO, "%s: %s", w->path, strerror(errno));
    }
    return 0;
}

void mon_tb_close(mon_tb_t **w) {
    if (!w || !*w) return;
    if ((*w)->f) fclose((*w)->f);
    free(*w);
    *w = NULL;
}
