/* draftline wire protocol codec: validation. One walker checks every field of
 * a message against its descriptor (range, length, printable strings); one
 * function per type checks the cross-field rules of PROTOCOL.md. The decoder
 * runs the same proto_validate as the encoder.
 */
#include "proto/codec_int.h"

#include "common/base/err.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------- validation */

static int check_str(const char *tn, const char *fn, const char *s, uint32_t min_n, uint32_t max_n,
                     int flags) {
    size_t n = strnlen(s, (size_t)max_n + 1);
    if (n > max_n) return dl_seterr(DL_EPROTO, "%s.%s: not NUL-terminated within %u chars", tn, fn, max_n);
    if (n < min_n) return dl_seterr(DL_EPROTO, "%s.%s: empty", tn, fn);
    if (flags & FL_PRINTABLE) {
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)s[i];
            if (c < 0x20 || c > 0x7e)
                return dl_seterr(DL_EPROTO, "%s.%s: byte 0x%02x at %zu is not printable ASCII", tn, fn, c, i);
        }
    }
    return 0;
}

static int check_double(const char *tn, const char *fn, long idx, double v, const field_t *f) {
    char where[24] = "";
    if (idx >= 0) snprintf(where, sizeof where, "[%ld]", idx);
    if (!isfinite(v)) {
        if (f->flags & FL_NONFINITE) return 0;
        return dl_seterr(DL_EPROTO, "%s.%s%s: %g is not finite", tn, fn, where, v);
    }
    if (v < f->dlo || v > f->dhi)
        return dl_seterr(DL_EPROTO, "%s.%s%s: %g out of range [%g, %g]", tn, fn, where, v, f->dlo, f->dhi);
    return 0;
}

static int validate_field(const proto_msg_t *m, const field_t *f, const char *tn) {
    const char *fn = f->name;
    switch ((kind_t)f->kind) {
    case K_U32: case K_U64: case K_ENUM: {
        uint64_t v = get_u(m, f);
        if (v < f->ulo || v > f->uhi)
            return dl_seterr(DL_EPROTO, "%s.%s: %llu out of range [%llu, %llu]", tn, fn,
                             (unsigned long long)v, (unsigned long long)f->ulo, (unsigned long long)f->uhi);
        return 0;
    }
    case K_I32: {
        int32_t v; memcpy(&v, (const char *)m + f->off, 4);
        if (v < f->slo || v > f->shi)
            return dl_seterr(DL_EPROTO, "%s.%s: %d out of range [%lld, %lld]", tn, fn, v,
                             (long long)f->slo, (long long)f->shi);
        return 0;
    }
    case K_F64: {
        double v; memcpy(&v, (const char *)m + f->off, 8);
        return check_double(tn, fn, -1, v, f);
    }
    case K_STR:
        return check_str(tn, fn, (const char *)m + f->off, f->min_n, f->max_n, f->flags);
    case K_PSTR: {
        uint32_t n = get_n(m, f);
        const char *p = get_ptr(m, f);
        if (n > f->max_n) return dl_seterr(DL_EPROTO, "%s.%s: string of %u bytes, at most %u", tn, fn, n, f->max_n);
        if (n < f->min_n) return dl_seterr(DL_EPROTO, "%s.%s: empty", tn, fn);
        if (n && !p) return dl_seterr(DL_EPROTO, "%s.%s: NULL string of %u bytes", tn, fn, n);
        if (n && memchr(p, 0, n)) return dl_seterr(DL_EPROTO, "%s.%s: string contains a NUL byte", tn, fn);
        for (uint32_t i = 0; (f->flags & FL_PRINTABLE) && i < n; i++) {
            unsigned char ch = (unsigned char)p[i];
            if (ch < 0x20 || ch > 0x7e)
                return dl_seterr(DL_EPROTO, "%s.%s: byte 0x%02x at %u is not printable ASCII", tn, fn, ch, i);
        }
        return 0;
    }
    case K_OPAQUE: {
        uint32_t n = get_n(m, f);
        if (n != 0 && n != f->max_n)
            return dl_seterr(DL_EPROTO, "%s.%s: length %u, expected 0 or %u", tn, fn, n, f->max_n);
        return 0;
    }
    case K_DIMS: {
        uint32_t n = get_n(m, f);
        if (n < f->min_n || n > f->max_n)
            return dl_seterr(DL_EPROTO, "%s.%s: %u dims, expected %u..%u", tn, fn, n, f->min_n, f->max_n);
        const uint64_t *d = (const uint64_t *)((const char *)m + f->off);
        for (uint32_t i = 0; i < n; i++) {
            if (d[i] < f->ulo || d[i] > f->uhi)
                return dl_seterr(DL_EPROTO, "%s.%s[%u]: %llu out of range [%llu, %llu]", tn, fn, i,
                                 (unsigned long long)d[i], (unsigned long long)f->ulo,
                                 (unsigned long long)f->uhi);
        }
        return 0;
    }
    case K_METRICS: {
        uint32_t n = get_n(m, f);
        if (n > f->max_n)
            return dl_seterr(DL_EPROTO, "%s.%s: %u entries, at most %u", tn, fn, n, f->max_n);
        const proto_metric_t *mt = (const proto_metric_t *)((const char *)m + f->off);
        for (uint32_t i = 0; i < n; i++) {
            char fname[32];
            snprintf(fname, sizeof fname, "metrics[%u].name", i);
            DL_TRY(check_str(tn, fname, mt[i].name, 1, DL_PROTO_NAME_MAX, FL_PRINTABLE));
        }
        return 0;
    }
    case K_I32BIN: case K_U8BIN: case K_U64S: case K_I64S: case K_F32S: {
        uint32_t n = get_n(m, f);
        const void *p = get_ptr(m, f);
        if (n < f->min_n || n > f->max_n)
            return dl_seterr(DL_EPROTO, "%s.%s: %u elements, expected %u..%u", tn, fn, n, f->min_n, f->max_n);
        if (n > 0 && !p) return dl_seterr(DL_EPROTO, "%s.%s: NULL array of %u elements", tn, fn, n);
        for (uint32_t i = 0; i < n; i++) {
            switch ((kind_t)f->kind) {
            case K_I32BIN: {
                int32_t v = ((const int32_t *)p)[i];
                if (v < f->slo || v > f->shi)
                    return dl_seterr(DL_EPROTO, "%s.%s[%u]: %d out of range [%lld, %lld]", tn, fn, i, v,
                                     (long long)f->slo, (long long)f->shi);
                break;
            }
            case K_U8BIN: {
                uint8_t v = ((const uint8_t *)p)[i];
                if (v < f->ulo || v > f->uhi)
                    return dl_seterr(DL_EPROTO, "%s.%s[%u]: %u out of range [%llu, %llu]", tn, fn, i, v,
                                     (unsigned long long)f->ulo, (unsigned long long)f->uhi);
                break;
            }
            case K_U64S: {
                uint64_t v = ((const uint64_t *)p)[i];
                if (v < f->ulo || v > f->uhi)
                    return dl_seterr(DL_EPROTO, "%s.%s[%u]: %llu out of range [%llu, %llu]", tn, fn, i,
                                     (unsigned long long)v, (unsigned long long)f->ulo,
                                     (unsigned long long)f->uhi);
                break;
            }
            case K_I64S: {
                int64_t v = ((const int64_t *)p)[i];
                if (v < f->slo || v > f->shi)
                    return dl_seterr(DL_EPROTO, "%s.%s[%u]: %lld out of range [%lld, %lld]", tn, fn, i,
                                     (long long)v, (long long)f->slo, (long long)f->shi);
                break;
            }
            default:
                DL_TRY(check_double(tn, fn, i, ((const float *)p)[i], f));
                break;
            }
        }
        return 0;
    }
    }
    return dl_seterr(DL_EPROTO, "%s.%s: internal: unknown field kind %d", tn, fn, f->kind);
}

static int check_strictly_increasing(const char *tn, const char *fn, const uint64_t *v, uint32_t n) {
    for (uint32_t i = 1; i < n; i++) {
        if (v[i] <= v[i - 1])
            return dl_seterr(DL_EPROTO, "%s.%s[%u]: %llu not greater than previous %llu (must be strictly "
                             "increasing)", tn, fn, i, (unsigned long long)v[i], (unsigned long long)v[i - 1]);
    }
    return 0;
}

int proto__check_micro_batch(const proto_msg_t *m, const char *tn) {
    const proto_micro_batch_t *b = &m->micro_batch;
    if (b->mb_in_step >= b->mbs_in_step)
        return dl_seterr(DL_EPROTO, "%s.mb_in_step: %u not below mbs_in_step %u", tn, b->mb_in_step,
                         b->mbs_in_step);
    if (b->n_seq_lens != b->n_seqs)
        return dl_seterr(DL_EPROTO, "%s.seq_lens: %u entries, n_seqs is %u", tn, b->n_seq_lens, b->n_seqs);
    if (b->n_loss_mask != b->n_tokens)
        return dl_seterr(DL_EPROTO, "%s.loss_mask: %u entries, tokens has %u", tn, b->n_loss_mask, b->n_tokens);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < b->n_seq_lens; i++) sum += (uint64_t)b->seq_lens[i];
    if (sum != b->n_tokens)
        return dl_seterr(DL_EPROTO, "%s.seq_lens: sum %llu != tokens length %u", tn, (unsigned long long)sum,
                         b->n_tokens);
    return 0;
}

int proto__check_slab_export(const proto_msg_t *m, const char *tn) {
    const proto_slab_export_t *s = &m->slab_export;
    bool has_handle = s->handle_len != 0, has_shm = s->shm_name[0] != 0;
    if (has_handle == has_shm)
        return dl_seterr(DL_EPROTO, "%s.handle: exactly one of handle (CUDA IPC) and shm_name must be set "
                         "(handle %u bytes, shm_name '%s')", tn, s->handle_len, s->shm_name);
    return 0;
}

int proto__check_hidden_states_ready(const proto_msg_t *m, const char *tn) {
    const proto_hidden_states_ready_t *h = &m->hidden_states_ready;
    uint64_t T = h->shape[0], cols = h->shape[1];
    if (T > DL_PROTO_MAX_TOKENS)
        return dl_seterr(DL_EPROTO, "%s.shape[0]: %llu tokens, at most %u", tn, (unsigned long long)T,
                         DL_PROTO_MAX_TOKENS);
    if (cols % h->n_feat != 0)
        return dl_seterr(DL_EPROTO, "%s.shape[1]: %llu not a multiple of n_feat %u", tn,
                         (unsigned long long)cols, h->n_feat);
    if (h->n_seqs > T)
        return dl_seterr(DL_EPROTO, "%s.n_seqs: %u sequences in %llu tokens", tn, h->n_seqs,
                         (unsigned long long)T);
    if (h->mb_in_step >= h->mbs_in_step)
        return dl_seterr(DL_EPROTO, "%s.mb_in_step: %u not below mbs_in_step %u", tn, h->mb_in_step,
                         h->mbs_in_step);
    if (h->n_tokens != T)
        return dl_seterr(DL_EPROTO, "%s.tokens: %u entries, shape[0] is %llu", tn, h->n_tokens,
                         (unsigned long long)T);
    if (h->n_seq_lens != h->n_seqs)
        return dl_seterr(DL_EPROTO, "%s.seq_lens: %u entries, n_seqs is %u", tn, h->n_seq_lens, h->n_seqs);
    if (h->n_loss_mask != T)
        return dl_seterr(DL_EPROTO, "%s.loss_mask: %u entries, shape[0] is %llu", tn, h->n_loss_mask,
                         (unsigned long long)T);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < h->n_seq_lens; i++) sum += (uint64_t)h->seq_lens[i];
    if (sum != T)
        return dl_seterr(DL_EPROTO, "%s.seq_lens: sum %llu != shape[0] %llu", tn, (unsigned long long)sum,
                         (unsigned long long)T);
    /* T <= 2^21, cols <= 2^32, size <= 4: the product does not overflow 64 bits */
    uint64_t feat = T * cols * proto_dtype_size(h->dtype);
    if (feat > h->bytes)
        return dl_seterr(DL_EPROTO, "%s.shape: features [0, %llu) end past bytes %llu", tn,
                         (unsigned long long)feat, (unsigned long long)h->bytes);
    return 0;
}

int proto__check_gradients_ready(const proto_msg_t *m, const char *tn) {
    const proto_gradients_ready_t *g = &m->gradients_ready;
    DL_TRY(check_strictly_increasing(tn, "mbs", g->mbs, g->n_mbs));
    if (g->bytes != 4 * g->n_params)
        return dl_seterr(DL_EPROTO, "%s.bytes: %llu, expected 4 * n_params = %llu", tn,
                         (unsigned long long)g->bytes, (unsigned long long)(4 * g->n_params));
    return 0;
}

int proto__check_weights_version(const proto_msg_t *m, const char *tn) {
    const proto_weights_version_t *w = &m->weights_version;
    uint64_t want = w->n_params * proto_dtype_size(w->dtype);
    if (w->bytes != want)
        return dl_seterr(DL_EPROTO, "%s.bytes: %llu, expected n_params * %s size = %llu", tn,
                         (unsigned long long)w->bytes, proto_dtype_name(w->dtype), (unsigned long long)want);
    return 0;
}

/* PLACEMENT: [n_t, n_d, n_t target nodes, n_d drafter nodes], counts 1..DL_PROTO_MAX_PLACE,
 * nodes 0..DL_PROTO_MAX_NODES-1. */
static int check_placement(const proto_control_t *c, const char *tn) {
    if (c->n_ints < 2)
        return dl_seterr(DL_EPROTO, "%s.ints: placement needs [n_targets, n_drafters, nodes...], got %u ints", tn,
                         c->n_ints);
    for (uint32_t i = 0; i < 2; i++)
        if (c->ints[i] < 1 || c->ints[i] > (int64_t)DL_PROTO_MAX_PLACE)
            return dl_seterr(DL_EPROTO, "%s.ints[%u]: %lld %s out of range [1, %u]", tn, i, (long long)c->ints[i],
                             i ? "drafters" : "targets", DL_PROTO_MAX_PLACE);
    if ((int64_t)c->n_ints != 2 + c->ints[0] + c->ints[1])
        return dl_seterr(DL_EPROTO, "%s.ints: placement of %lld targets and %lld drafters needs %lld ints, got %u", tn,
                         (long long)c->ints[0], (long long)c->ints[1], (long long)(2 + c->ints[0] + c->ints[1]),
                         c->n_ints);
    for (uint32_t i = 2; i < c->n_ints; i++)
        if (c->ints[i] < 0 || c->ints[i] >= (int64_t)DL_PROTO_MAX_NODES)
            return dl_seterr(DL_EPROTO, "%s.ints[%u]: node %lld out of range [0, %u]", tn, i, (long long)c->ints[i],
                             DL_PROTO_MAX_NODES - 1);
    return 0;
}

int proto__check_control(const proto_msg_t *m, const char *tn) {
    const proto_control_t *c = &m->control;
    switch (c->op) {
    case PROTO_CTL_ROUTE: case PROTO_CTL_REBALANCE:
        if (c->n_ints % 2)
            return dl_seterr(DL_EPROTO, "%s.ints: %s needs pairs, got %u ints", tn, proto_ctl_op_name(c->op),
                             c->n_ints);
        for (uint32_t i = 0; i < c->n_ints; i++) {
            int64_t v = c->ints[i];
            bool role = c->op == PROTO_CTL_REBALANCE && (i % 2) == 1;
            int64_t lo = role ? 1 : 0, hi = role ? PROTO_ROLE_COUNT_ - 1 : DL_PROTO_MAX_STAGE_ID;
            if (v < lo || v > hi)
                return dl_seterr(DL_EPROTO, "%s.ints[%u]: %lld out of range [%lld, %lld] for %s", tn, i,
                                 (long long)v, (long long)lo, (long long)hi, proto_ctl_op_name(c->op));
        }
        return 0;
    case PROTO_CTL_PLACEMENT:
        return check_placement(c, tn);
    case PROTO_CTL_MEMBERSHIP:
        for (uint32_t i = 0; i < c->n_ints; i++) {
            if (c->ints[i] < 0 || c->ints[i] > DL_PROTO_MAX_STAGE_ID)
                return dl_seterr(DL_EPROTO, "%s.ints[%u]: stage id %lld out of range [0, %u]", tn, i,
                                 (long long)c->ints[i], DL_PROTO_MAX_STAGE_ID);
        }
        return 0;
    default:
        return 0;
    }
}

int proto__check_applied(const proto_msg_t *m, const char *tn) {
    return check_strictly_increasing(tn, "mbs", m->applied.mbs, m->applied.n_mbs);
}

/* Rebalance: counts (CPU) xor both GPU lists (GPU); other ops carry no arguments. */
int proto__check_ctl_request(const proto_msg_t *m, const char *tn) {
    const proto_ctl_request_t *r = &m->ctl_request;
    bool counts = r->targets || r->drafters, lists = r->n_target_gpus || r->n_drafter_gpus;
    if (r->op != PROTO_CTLREQ_REBALANCE) {
        if (counts || lists || r->target_place[0] || r->drafter_place[0])
            return dl_seterr(DL_EPROTO, "%s.targets: %s takes no targets, drafters, GPU lists or places", tn,
                             proto_ctlreq_op_name(r->op));
        return 0;
    }
    if (strchr(r->target_place, ' ') || strchr(r->drafter_place, ' '))
        return dl_seterr(DL_EPROTO, "%s.target_place: a placement has no space", tn);
    if (counts && lists)
        return dl_seterr(DL_EPROTO, "%s.targets: rebalance gives counts or GPU lists, not both", tn);
    if (lists && (!r->n_target_gpus || !r->n_drafter_gpus))
        return dl_seterr(DL_EPROTO, "%s.target_gpus: a GPU rebalance needs both lists", tn);
    if (!lists && (r->targets < 1 || r->drafters < 1))
        return dl_seterr(DL_EPROTO, "%s.targets: rebalance needs targets and drafters >= 1 (or GPU lists)", tn);
    return 0;
}

/* A field of lines ("a\nb\n", the last '\n' optional; line k = node k or GPU k):
 * none empty (an empty line would shift the indexes of the ones after it), bytes
 * 0x21..0x7e. *lines: their count. */
static int check_lines(const char *tn, const char *fn, const char *p, uint32_t n, uint32_t *lines) {
    uint32_t k = 0, len = 0;
    for (uint32_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '\n') {
            if (!len) return dl_seterr(DL_EPROTO, "%s.%s: line %u is empty", tn, fn, k);
            k++;
            len = 0;
        } else if (ch < 0x21 || ch > 0x7e) {
            return dl_seterr(DL_EPROTO, "%s.%s: byte 0x%02x at %u is not printable ASCII (no space)", tn, fn,
                             ch, i);
        } else {
            len++;
        }
    }
    *lines = k + (len > 0);
    return 0;
}

int proto__check_run_config(const proto_msg_t *m, const char *tn) {
    const proto_run_config_t *c = &m->run_config;
    if (c->max_len == 1)
        return dl_seterr(DL_EPROTO, "%s.max_len: 1 (0 = no limit, else >= 2)", tn);
    if (c->n_target_drafters != c->n_target_gpus)
        return dl_seterr(DL_EPROTO, "%s.target_drafters: %u entries for %u targets", tn,
                         c->n_target_drafters, c->n_target_gpus);
    for (uint32_t i = 0; i < c->n_target_drafters; i++) {
        if (c->target_drafters[i] >= (int64_t)c->n_drafter_gpus)
            return dl_seterr(DL_EPROTO, "%s.target_drafters[%u]: drafter %lld of %u", tn, i,
                             (long long)c->target_drafters[i], c->n_drafter_gpus);
    }
    if (c->drafter >= (int32_t)c->n_drafter_gpus)
        return dl_seterr(DL_EPROTO, "%s.drafter: drafter %d of %u", tn, c->drafter, c->n_drafter_gpus);
    if (c->n_target_nodes != c->n_target_gpus)
        return dl_seterr(DL_EPROTO, "%s.target_nodes: %u entries for %u targets", tn, c->n_target_nodes,
                         c->n_target_gpus);
    if (c->n_drafter_nodes != c->n_drafter_gpus)
        return dl_seterr(DL_EPROTO, "%s.drafter_nodes: %u entries for %u drafters", tn, c->n_drafter_nodes,
                         c->n_drafter_gpus);
    if (c->net_port != 0 && c->net_port < 1024)
        return dl_seterr(DL_EPROTO, "%s.net_port: %u (0, or 1024..65335)", tn, c->net_port);
    /* every node index used must have an address line (net_port 0: all on node 0) */
    uint32_t lines;
    DL_TRY(check_lines(tn, "node_addrs", c->node_addrs, c->n_node_addrs, &lines));
    int64_t maxn = c->node > c->loader_node ? c->node : c->loader_node;
    if (c->optimizer_node > maxn) maxn = c->optimizer_node;
    for (uint32_t i = 0; i < c->n_target_nodes; i++) if (c->target_nodes[i] > maxn) maxn = c->target_nodes[i];
    for (uint32_t i = 0; i < c->n_drafter_nodes; i++) if (c->drafter_nodes[i] > maxn) maxn = c->drafter_nodes[i];
    if (c->net_port == 0 && maxn > 0)
        return dl_seterr(DL_EPROTO, "%s.net_port: 0 (one host) but node %lld used", tn, (long long)maxn);
    if (c->net_port != 0 && (int64_t)lines <= maxn)
        return dl_seterr(DL_EPROTO, "%s.node_addrs: %u addresses, node %lld used", tn, lines, (long long)maxn);
    return 0;
}

/* A node name is a bus id: no space (FL_PRINTABLE admits 0x20). */
static int check_node_name(const char *s, const char *tn, const char *field) {
    for (const char *p = s; *p; p++)
        if (*p == ' ' || *p == ':' || *p == ',')
            return dl_seterr(DL_EPROTO, "%s.%s: '%s' has a space, ':' or ','", tn, field, s);
    return 0;
}

int proto__check_node_hello(const proto_msg_t *m, const char *tn) {
    const proto_node_hello_t *h = &m->node_hello;
    DL_TRY(check_node_name(h->name, tn, "name"));
    uint32_t lines;
    DL_TRY(check_lines(tn, "gpu_uuids", h->gpu_uuids, h->n_gpu_uuids, &lines));
    if (lines != h->n_gpu_free_mib)
        return dl_seterr(DL_EPROTO, "%s.gpu_free_mib: %u entries for %u GPUs", tn, h->n_gpu_free_mib, lines);
    return 0;
}

int proto__check_node_spawn(const proto_msg_t *m, const char *tn) {
    const proto_node_spawn_t *s = &m->node_spawn;
    static const char *const exes[] = {"loader", "target_worker", "drafter_worker", "optimizer"};
    int ok = 0;
    for (size_t i = 0; i < sizeof exes / sizeof exes[0]; i++) ok |= !strcmp(s->exe, exes[i]);
    if (!ok)
        return dl_seterr(DL_EPROTO, "%s.exe: '%s' is not a stage executable "
                         "(loader|target_worker|drafter_worker|optimizer)", tn, s->exe);
    if (strncmp(s->sup_endpoint, "tcp://", 6) != 0)
        return dl_seterr(DL_EPROTO, "%s.sup_endpoint: '%s' is not tcp://", tn, s->sup_endpoint);
    return 0;
}

int proto__check_node_signal(const proto_msg_t *m, const char *tn) {
    if (m->node_signal.signum != 9 && m->node_signal.signum != 15)
        return dl_seterr(DL_EPROTO, "%s.signum: %d (SIGTERM 15 or SIGKILL 9 only)", tn, m->node_signal.signum);
    return 0;
}

/* nccl_id: a full id (an empty one would init a communicator nobody else joins),
 * the receiver a rank of the communicator, never the drafter's own stage. */
int proto__check_nccl_id(const proto_msg_t *m, const char *tn) {
    const proto_nccl_id_t *x = &m->nccl_id;
    if (x->id_len != DL_PROTO_NCCL_ID_BYTES)
        return dl_seterr(DL_EPROTO, "%s.id: length %u, expected %u", tn, x->id_len, DL_PROTO_NCCL_ID_BYTES);
    if (x->rank >= x->nranks)
        return dl_seterr(DL_EPROTO, "%s.rank: %u, not below nranks %u", tn, x->rank, x->nranks);
    if (x->peer_id == x->owner_id)
        return dl_seterr(DL_EPROTO, "%s.peer_id: %u is the owner itself", tn, x->peer_id);
    return 0;
}

int proto_validate(const proto_msg_t *m) {
    if (!m) return dl_seterr(DL_EINVAL, "proto_validate: NULL message");
    const msgdef_t *d = def_of((uint64_t)m->type);
    if (!d) return dl_seterr(DL_EPROTO, "message: unknown type %u", (unsigned)m->type);
    const char *tn = proto_type_name(m->type);
    for (uint32_t i = 0; i < d->n_fields; i++) DL_TRY(validate_field(m, &d->fields[i], tn));
    return d->check ? d->check(m, tn) : 0;
}
