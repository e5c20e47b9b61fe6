/* draftline wire protocol codec, internal: what proto/codec.c (scan, encode,
 * decode), proto/codec_desc.c (the descriptor tables and names) and
 * proto/codec_check.c (validation) share. Not for use outside proto/.
 *
 * One descriptor table per message type (proto__defs) drives encode, decode
 * and validation, so the encoder and the decoder cannot disagree about a field.
 */
#ifndef DL_PROTO_CODEC_INT_H
#define DL_PROTO_CODEC_INT_H

#include "proto/msg.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    K_U32,      /* uint32_t, wire uint */
    K_U64,      /* uint64_t, wire uint */
    K_I32,      /* int32_t, wire int */
    K_ENUM,     /* 4-byte enum, wire uint */
    K_F64,      /* double, wire float32|float64 */
    K_STR,      /* char[max_n+1], wire str */
    K_PSTR,     /* const char * + uint32_t len, wire str (no NUL inside; decoded NUL-terminated) */
    K_OPAQUE,   /* uint8_t[max_n] + uint32_t len at n_off, wire bin (len 0 or max_n) */
    K_I32BIN,   /* const int32_t * + uint32_t count, wire bin little-endian */
    K_U8BIN,    /* const uint8_t * + uint32_t count, wire bin */
    K_U64S,     /* const uint64_t * + uint32_t count, wire array of uint */
    K_I64S,     /* const int64_t * + uint32_t count, wire array of int */
    K_F32S,     /* const float * + uint32_t count, wire array of float */
    K_DIMS,     /* uint64_t[DL_PROTO_MAX_DIMS] + uint32_t ndim at n_off, wire array of uint */
    K_METRICS,  /* proto_metric_t[] + uint32_t count, wire array of [str, float] */
} kind_t;

enum { FL_NONFINITE = 1, FL_PRINTABLE = 2 };

typedef struct {
    const char *name;
    uint8_t kind, flags;
    uint32_t off;               /* value, array pointer or inline array */
    uint32_t n_off;             /* uint32_t count (arrays, opaque len, ndim) */
    uint32_t min_n, max_n;      /* element count (arrays) or length (str) bounds */
    uint64_t ulo, uhi;          /* unsigned value / element range */
    int64_t slo, shi;           /* signed value / element range */
    double dlo, dhi;            /* float range (finite values) */
} field_t;

typedef int (*check_fn)(const proto_msg_t *m, const char *tn);

/* Cross-field rules (proto/codec_check.c), one per type that has any: 0 or
 * DL_EPROTO naming "<tn>.<field>". Field ranges are already checked. */
int proto__check_micro_batch(const proto_msg_t *m, const char *tn);
int proto__check_slab_export(const proto_msg_t *m, const char *tn);
int proto__check_hidden_states_ready(const proto_msg_t *m, const char *tn);
int proto__check_gradients_ready(const proto_msg_t *m, const char *tn);
int proto__check_weights_version(const proto_msg_t *m, const char *tn);
int proto__check_control(const proto_msg_t *m, const char *tn);
int proto__check_applied(const proto_msg_t *m, const char *tn);
int proto__check_ctl_request(const proto_msg_t *m, const char *tn);
int proto__check_run_config(const proto_msg_t *m, const char *tn);
int proto__check_nccl_id(const proto_msg_t *m, const char *tn);
int proto__check_node_hello(const proto_msg_t *m, const char *tn);
int proto__check_node_spawn(const proto_msg_t *m, const char *tn);
int proto__check_node_signal(const proto_msg_t *m, const char *tn);

typedef struct {
    const field_t *fields;
    uint32_t n_fields;
    check_fn check;
} msgdef_t;

/* The descriptor of each type, indexed by proto_type_t (proto/codec_desc.c);
 * entry 0 and reserved type numbers are unused (no fields: unknown type). */
extern const msgdef_t proto__defs[PROTO_TYPE_COUNT_];

static inline const msgdef_t *def_of(uint64_t type) {
    return (type >= 1 && type < PROTO_TYPE_COUNT_ && proto__defs[type].fields) ? &proto__defs[type] : NULL;
}

/* Typed access to a field of a message through its descriptor (memcpy keeps it
 * free of aliasing and alignment questions). */
static inline uint64_t get_u(const proto_msg_t *m, const field_t *f) {
    const char *p = (const char *)m + f->off;
    if (f->kind == K_U64) { uint64_t v; memcpy(&v, p, 8); return v; }
    uint32_t v; memcpy(&v, p, 4); return v;
}
static inline uint32_t get_n(const proto_msg_t *m, const field_t *f) {
    uint32_t n; memcpy(&n, (const char *)m + f->n_off, 4); return n;
}
static inline const void *get_ptr(const proto_msg_t *m, const field_t *f) {
    const void *p; memcpy(&p, (const char *)m + f->off, sizeof p); return p;
}
static inline void *field_addr(proto_msg_t *m, const field_t *f) { return (char *)m + f->off; }

#endif
