/* Slab bytes across nodes: slab_data chunks, then the announcement (xfer.h). */
#include "common/pipe/xfer.h"

#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "proto/codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* an encoded slab_data: the chunk plus its header fields (a few dozen bytes) */
#define XFER_BUF_BYTES ((size_t)DL_PROTO_MAX_CHUNK + 4096)

typedef struct job {
    struct job *next;
    char peer[BUS_ID_MAX + 1];     /* "" on a DEALER */
    xfer_range_t r;
    const uint8_t *src;            /* borrowed until done */
    size_t n, sent;                /* bytes of the range, bytes handed to the bus */
    uint8_t *ann;                  /* the encoded announcement (owned; NULL: none) */
    size_t ann_len;
    xfer_done_cb done;
    void *arg;
} job_t;

struct xfer {
    bus_t *bus;
    uint64_t *bytes_out;
    job_t *head, *tail;
    size_t n_jobs;
    int in_pump;                   /* a done callback's xfer_send must not re-enter */
    uint8_t *buf;                  /* one encoded chunk (XFER_BUF_BYTES) */
};

xfer_t *xfer_new(bus_t *bus, uint64_t *bytes_out) {
    xfer_t *x = calloc(1, sizeof *x);
    if (x) x->buf = malloc(XFER_BUF_BYTES);
    if (!x || !x->buf) {
        free(x);
        dl_seterr(DL_ENOMEM, "xfer: sender buffers");
        return NULL;
    }
    x->bus = bus;
    x->bytes_out = bytes_out;
    return x;
}

static void job_free(job_t *j) {
    free(j->ann);
    free(j);
}

void xfer_destroy(xfer_t **x_p) {
    if (!x_p || !*x_p) return;
    xfer_t *x = *x_p;
    for (job_t *j = x->head, *n; j; j = n) { n = j->next; job_free(j); }
    free(x->buf);
    free(x);
    *x_p = NULL;
}

size_t xfer_pending(const xfer_t *x) { return x ? x->n_jobs : 0; }

/* Removes the head job and tells its owner how it ended. */
static void job_end(xfer_t *x, int status) {
    job_t *j = x->head;
    x->head = j->next;
    if (!x->head) x->tail = NULL;
    x->n_jobs--;
    xfer_done_cb cb = j->done;
    void *arg = j->arg;
    job_free(j);
    if (cb) cb(x, status, arg);
}

/* The head job's next step: one chunk, or the announcement. Returns bus_send's code
 * (0: progress made). */
static int job_step(xfer_t *x, job_t *j) {
    const char *peer = j->peer[0] ? j->peer : NULL;
    if (j->sent < j->n) {
        size_t c = j->n - j->sent;
        if (c > DL_PROTO_MAX_CHUNK) c = DL_PROTO_MAX_CHUNK;
        proto_msg_t m;
        proto_msg_init(&m, PROTO_SLAB_DATA);
        m.slab_data.owner_id = j->r.owner_id;
        m.slab_data.owner_inc = j->r.owner_inc;
        m.slab_data.slab_id = j->r.slab_id;
        m.slab_data.offset = j->r.offset + j->sent;
        m.slab_data.data = j->src + j->sent;
        m.slab_data.n_data = (uint32_t)c;
        size_t len;
        int rc = proto_encode_to(&m, x->buf, XFER_BUF_BYTES, &len);
        if (rc < 0) return rc;
        rc = bus_send(x->bus, peer, x->buf, len);
        if (rc < 0) return rc;
        j->sent += c;
        if (x->bytes_out) *x->bytes_out += c;
        return 0;
    }
    int rc = j->ann ? bus_send(x->bus, peer, j->ann, j->ann_len) : 0;
    if (rc == 0) job_end(x, 0);
    return rc;
}

static void pump(xfer_t *x) {
    if (x->in_pump) return;
    x->in_pump = 1;
    while (x->head) {
        int rc = job_step(x, x->head);
        if (rc == DL_EAGAIN) break;     /* xfer_resume goes on */
        if (rc < 0) {
            log_warn("slab_data to %s on %s: %s: the rest of the range and its announcement are dropped",
                     x->head->peer[0] ? x->head->peer : "upstream", bus_name(x->bus), dl_strerror(rc));
            job_end(x, rc);
        }
    }
    x->in_pump = 0;
}

void xfer_resume(xfer_t *x) {
    if (x) pump(x);
}

int xfer_send(xfer_t *x, const char *peer, const xfer_range_t *r, const void *src, size_t n,
              const proto_msg_t *msg, xfer_done_cb done, void *arg) {
    if (n == 0 || r->offset > DL_PROTO_MAX_OFFSET || n > DL_PROTO_MAX_OFFSET - r->offset)
        return dl_seterr(DL_EINVAL, "xfer: range [%llu, +%zu) of slab %u", (unsigned long long)r->offset, n,
                         r->slab_id);
    if (peer && strlen(peer) > BUS_ID_MAX) return dl_seterr(DL_EINVAL, "xfer: peer id too long");
    job_t *j = calloc(1, sizeof *j);
    if (!j) return dl_seterr(DL_ENOMEM, "xfer: job");
    if (msg) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        int rc = proto_encode(msg, &sb);
        if (rc < 0) {
            log_error("encode %s: %s", proto_type_name(msg->type), dl_errmsg());
            msgpack_sbuffer_destroy(&sb);
            free(j);
            return rc;
        }
        j->ann = (uint8_t *)sb.data;   /* msgpack_sbuffer's storage is malloc'd: ours now */
        j->ann_len = sb.size;
    }
    snprintf(j->peer, sizeof j->peer, "%s", peer ? peer : "");
    j->r = *r;
    j->src = src;
    j->n = n;
    j->done = done;
    j->arg = arg;
    if (x->tail) x->tail->next = j;
    else x->head = j;
    x->tail = j;
    x->n_jobs++;
    pump(x);
    return 0;
}

/* ---- receiving ---- */

int xfer_check(const proto_slab_data_t *d, const xfer_dest_t *dst) {
    if (!dst || !dst->base)
        return dl_seterr(DL_ENOENT, "slab %u of owner %u (incarnation %llu) is not known here", d->slab_id,
                         d->owner_id, (unsigned long long)d->owner_inc);
    if (d->owner_id != dst->owner_id || d->owner_inc != dst->owner_inc)
        return dl_seterr(DL_EPROTO, "owner %u incarnation %llu, expected owner %u incarnation %llu", d->owner_id,
                         (unsigned long long)d->owner_inc, dst->owner_id, (unsigned long long)dst->owner_inc);
    if (d->slab_id != dst->slab_id)
        return dl_seterr(DL_EPROTO, "slab id %u, expected %u", d->slab_id, dst->slab_id);
    uint64_t end = d->offset + d->n_data;   /* no overflow: offset <= 2^48, n_data <= 4 MiB */
    if (end > dst->bytes)
        return dl_seterr(DL_EPROTO, "range [%llu, %llu) outside the slab of %llu bytes",
                         (unsigned long long)d->offset, (unsigned long long)end, (unsigned long long)dst->bytes);
    if (dst->win_bytes && (d->offset < dst->win_off || end > dst->win_off + dst->win_bytes))
        return dl_seterr(DL_EPROTO, "range [%llu, %llu) outside the window [%llu, %llu) this sender may write",
                         (unsigned long long)d->offset, (unsigned long long)end, (unsigned long long)dst->win_off,
                         (unsigned long long)(dst->win_off + dst->win_bytes));
    return 0;
}

static void refused(xfer_rx_t *rx, const char *who, const char *from, const proto_slab_data_t *d, const char *why) {
    rx->refused++;
    double now = clock_mono_s();
    if (rx->last_log_s > 0 && now - rx->last_log_s < 1.0) { rx->unlogged++; return; }
    log_warn("%s: slab_data from %s (owner %u, slab %u, [%llu, +%u)) refused: %s (%llu refused so far)", who,
             from && *from ? from : "upstream", d->owner_id, d->slab_id, (unsigned long long)d->offset, d->n_data,
             why, (unsigned long long)rx->refused);
    rx->last_log_s = now;
    rx->unlogged = 0;
}

void xfer_refuse(xfer_rx_t *rx, const char *who, const char *from, const proto_slab_data_t *d, const char *why) {
    refused(rx, who, from, d, why);
}

int xfer_recv(xfer_rx_t *rx, const char *who, const char *from, const proto_slab_data_t *d,
              const xfer_dest_t *dst) {
    int rc = xfer_check(d, dst);
    if (rc < 0) {
        char why[400];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        refused(rx, who, from, d, why);
        return rc;
    }
    memcpy(dst->base + d->offset, d->data, d->n_data);
    rx->bytes_in += d->n_data;
    rx->chunks_in++;
    return 0;
}
