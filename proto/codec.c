/* draftline wire protocol codec: the engine (scan, encode, decode).
 *
 * Each message type is a table of field descriptors (proto/codec_desc.c: name,
 * kind, offset in proto_msg_t, range). One walker encodes, one parses, one
 * validates (proto/codec_check.c), so the encoder and the decoder cannot
 * disagree about a field. Decoding is two-layered: a byte-level scan
 * (proto__scan) bounds the msgpack structure (no truncation, no trailing bytes,
 * object count and depth limits) before msgpack-c builds its object tree, so a
 * hostile header such as "array of 2^32 elements" costs nothing.
 */
#include "proto/codec.h"
#include "proto/codec_int.h"

#include "common/base/err.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

void proto_msg_init(proto_msg_t *m, proto_type_t type) {
    memset(m, 0, sizeof *m);
    m->type = type;
    m->version = DL_PROTO_VERSION;
    if (type == PROTO_HELLO) m->hello.proto_version = DL_PROTO_VERSION;
}

void proto_msg_free(proto_msg_t *m) {
    if (!m || !m->owned_) return;
    const msgdef_t *d = def_of((uint64_t)m->type);
    if (d) {
        for (uint32_t i = 0; i < d->n_fields; i++) {
            const field_t *f = &d->fields[i];
            if (f->kind >= K_I32BIN && f->kind <= K_F32S) {
                void *null = NULL;
                memcpy(field_addr(m, f), &null, sizeof null);
                memset((char *)m + f->n_off, 0, 4);
            }
        }
    }
    free(m->owned_);
    m->owned_ = NULL;
}

/* ------------------------------------------------------------ encoding */

typedef struct {
    msgpack_sbuffer *sb;   /* either append to sb ... */
    char *buf;             /* ... or write into buf[0..cap) */
    size_t cap, len;
    int err;
} writer_t;

static int writer_cb(void *data, const char *p, size_t n) {
    writer_t *w = data;
    if (n == 0) return 0;
    if (n > DL_PROTO_MAX_BYTES - w->len) { w->err = 1; return -1; }
    if (w->sb) {
        if (msgpack_sbuffer_write(w->sb, p, n) != 0) { w->err = 2; return -1; }
    } else {
        if (n > w->cap - w->len) { w->err = 3; return -1; }
        memcpy(w->buf + w->len, p, n);
    }
    w->len += n;
    return 0;
}

#define PK(expr) do { if ((expr) != 0) return -1; } while (0)

static int pack_bin(msgpack_packer *pk, const void *p, size_t n) {
    PK(msgpack_pack_bin(pk, n));
    if (n) PK(msgpack_pack_bin_body(pk, p, n));
    return 0;
}

static int pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    PK(msgpack_pack_str(pk, n));
    if (n) PK(msgpack_pack_str_body(pk, s, n));
    return 0;
}

static int pack_field(msgpack_packer *pk, const proto_msg_t *m, const field_t *f) {
    const char *base = (const char *)m + f->off;
    uint32_t n = (f->kind >= K_OPAQUE) ? get_n(m, f) : 0;
    switch ((kind_t)f->kind) {
    case K_U32: case K_U64: case K_ENUM: return msgpack_pack_uint64(pk, get_u(m, f));
    case K_I32: { int32_t v; memcpy(&v, base, 4); return msgpack_pack_int64(pk, v); }
    case K_F64: { double v; memcpy(&v, base, 8); return msgpack_pack_double(pk, v); }
    case K_STR: return pack_str(pk, base);
    case K_PSTR: {
        uint32_t len = get_n(m, f);
        PK(msgpack_pack_str(pk, len));
        if (len) PK(msgpack_pack_str_body(pk, get_ptr(m, f), len));
        return 0;
    }
    case K_OPAQUE: return pack_bin(pk, base, n);
    case K_I32BIN: {
        const int32_t *p = get_ptr(m, f);
        PK(msgpack_pack_bin(pk, (size_t)n * 4));
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (n) PK(msgpack_pack_bin_body(pk, p, (size_t)n * 4));
#else
        for (uint32_t i = 0; i < n; i++) {
            uint32_t le = __builtin_bswap32((uint32_t)p[i]);
            PK(msgpack_pack_bin_body(pk, &le, 4));
        }
#endif
        return 0;
    }
    case K_U8BIN: return pack_bin(pk, get_ptr(m, f), n);
    case K_U64S: {
        const uint64_t *p = get_ptr(m, f);
        PK(msgpack_pack_array(pk, n));
        for (uint32_t i = 0; i < n; i++) PK(msgpack_pack_uint64(pk, p[i]));
        return 0;
    }
    case K_I64S: {
        const int64_t *p = get_ptr(m, f);
        PK(msgpack_pack_array(pk, n));
        for (uint32_t i = 0; i < n; i++) PK(msgpack_pack_int64(pk, p[i]));
        return 0;
    }
    case K_F32S: {
        const float *p = get_ptr(m, f);
        PK(msgpack_pack_array(pk, n));
        for (uint32_t i = 0; i < n; i++) PK(msgpack_pack_float(pk, p[i]));
        return 0;
    }
    case K_DIMS: {
        const uint64_t *d = (const uint64_t *)base;
        PK(msgpack_pack_array(pk, n));
        for (uint32_t i = 0; i < n; i++) PK(msgpack_pack_uint64(pk, d[i]));
        return 0;
    }
    case K_METRICS: {
        const proto_metric_t *mt = (const proto_metric_t *)base;
        PK(msgpack_pack_array(pk, n));
        for (uint32_t i = 0; i < n; i++) {
            PK(msgpack_pack_array(pk, 2));
            PK(pack_str(pk, mt[i].name));
            PK(msgpack_pack_double(pk, mt[i].value));
        }
        return 0;
    }
    }
    return -1;
}

static int encode_with(const proto_msg_t *m, writer_t *w) {
    DL_TRY(proto_validate(m));
    const msgdef_t *d = def_of((uint64_t)m->type);
    msgpack_packer pk;
    msgpack_packer_init(&pk, w, writer_cb);
    int rc = msgpack_pack_array(&pk, 2 + d->n_fields);
    if (!rc) rc = msgpack_pack_uint64(&pk, (uint64_t)m->type);
    if (!rc) rc = msgpack_pack_uint64(&pk, DL_PROTO_VERSION);
    for (uint32_t i = 0; !rc && i < d->n_fields; i++) rc = pack_field(&pk, m, &d->fields[i]);
    if (!rc) return 0;
    const char *tn = proto_type_name(m->type);
    switch (w->err) {
    case 1: return dl_seterr(DL_ERANGE, "%s: encoding exceeds DL_PROTO_MAX_BYTES (%u)", tn, DL_PROTO_MAX_BYTES);
    case 2: return dl_seterr(DL_ENOMEM, "%s: msgpack buffer allocation failed", tn);
    case 3: return dl_seterr(DL_ERANGE, "%s: encoding needs more than the buffer's %zu bytes", tn, w->cap);
    default: return dl_seterr(DL_EPROTO, "%s: msgpack packing failed", tn);
    }
}

int proto_encode(const proto_msg_t *m, msgpack_sbuffer *sb) {
    if (!m || !sb) return dl_seterr(DL_EINVAL, "proto_encode: NULL argument");
    size_t start = sb->size;
    writer_t w = { .sb = sb };
    int rc = encode_with(m, &w);
    if (rc < 0) sb->size = start;
    return rc;
}

int proto_encode_to(const proto_msg_t *m, void *buf, size_t cap, size_t *out_len) {
    if (!m || (!buf && cap) || !out_len) return dl_seterr(DL_EINVAL, "proto_encode_to: NULL argument");
    writer_t w = { .buf = buf, .cap = cap };
    *out_len = 0;
    DL_TRY(encode_with(m, &w));
    *out_len = w.len;
    return 0;
}

/* ---------------------------------------------------- structure scan */

static uint64_t be_read(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* Decodes the msgpack header at p[pos]: header size, payload bytes that follow
 * it, and the number of child objects (arrays, maps). Returns 0 or DL_EPROTO. */
static int mp_header(const uint8_t *p, size_t len, size_t pos, size_t *hdr, uint64_t *payload, uint64_t *kids) {
    uint8_t b = p[pos];
    size_t lenbytes = 0, extra = 0;   /* bytes of length field, then fixed bytes after it */
    uint64_t fixed = 0, mul = 0;      /* payload when fixed; kid multiplier for containers */
    *kids = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) { *hdr = 1; *payload = 0; return 0; }
    if (b <= 0x8f) { *hdr = 1; *payload = 0; *kids = 2u * (b & 0x0f); return 0; }
    if (b <= 0x9f) { *hdr = 1; *payload = 0; *kids = b & 0x0f; return 0; }
    if (b <= 0xbf) { *hdr = 1; *payload = b & 0x1f; return 0; }
    switch (b) {
    case 0xc4: case 0xd9: lenbytes = 1; break;               /* bin8, str8 */
    case 0xc5: case 0xda: lenbytes = 2; break;               /* bin16, str16 */
    case 0xc6: case 0xdb: lenbytes = 4; break;               /* bin32, str32 */
    case 0xc7: lenbytes = 1; extra = 1; break;               /* ext8 (+type byte) */
    case 0xc8: lenbytes = 2; extra = 1; break;
    case 0xc9: lenbytes = 4; extra = 1; break;
    case 0xca: fixed = 4; break;  case 0xcb: fixed = 8; break;
    case 0xcc: case 0xd0: fixed = 1; break;
    case 0xcd: case 0xd1: fixed = 2; break;
    case 0xce: case 0xd2: fixed = 4; break;
    case 0xcf: case 0xd3: fixed = 8; break;
    case 0xd4: fixed = 2; break;  case 0xd5: fixed = 3; break;  case 0xd6: fixed = 5; break;
    case 0xd7: fixed = 9; break;  case 0xd8: fixed = 17; break;  /* fixext: type + data */
    case 0xdc: lenbytes = 2; mul = 1; break;                  /* array16 */
    case 0xdd: lenbytes = 4; mul = 1; break;                  /* array32 */
    case 0xde: lenbytes = 2; mul = 2; break;                  /* map16 */
    case 0xdf: lenbytes = 4; mul = 2; break;                  /* map32 */
    default:
        return dl_seterr(DL_EPROTO, "message: invalid msgpack byte 0x%02x at offset %zu", b, pos);
    }
    size_t h = 1 + lenbytes + extra;
    if (h > len - pos)
        return dl_seterr(DL_EPROTO, "message: truncated: header at offset %zu needs %zu bytes, %zu left",
                         pos, h, len - pos);
    uint64_t n = lenbytes ? be_read(p + pos + 1, lenbytes) : 0;
    *hdr = h;
    if (mul) { *payload = 0; *kids = mul * n; }
    else *payload = lenbytes ? n : fixed;
    return 0;
}

/* Walks one msgpack object covering exactly buf[0..len). Bounds the object
 * count and depth and rejects truncation and trailing bytes, so that msgpack-c
 * afterwards allocates at most DL_PROTO_MAX_OBJECTS objects. */
static int proto__scan(const uint8_t *p, size_t len) {
    uint64_t rem[DL_PROTO_MAX_DEPTH + 1];
    unsigned depth = 0;
    size_t pos = 0, objects = 0;
    rem[0] = 1;
    for (;;) {
        while (depth > 0 && rem[depth] == 0) depth--;
        if (depth == 0 && rem[0] == 0) break;
        if (pos >= len)
            return dl_seterr(DL_EPROTO, "message: truncated at byte %zu (%llu more object(s) expected)", pos,
                             (unsigned long long)rem[depth]);
        size_t hdr = 0; uint64_t payload = 0, kids = 0;
        DL_TRY(mp_header(p, len, pos, &hdr, &payload, &kids));
        if (++objects > DL_PROTO_MAX_OBJECTS)
            return dl_seterr(DL_EPROTO, "message: more than %u msgpack objects", DL_PROTO_MAX_OBJECTS);
        rem[depth]--;
        pos += hdr;
        if (payload > len - pos)
            return dl_seterr(DL_EPROTO, "message: truncated: %llu-byte payload at offset %zu, %zu bytes left",
                             (unsigned long long)payload, pos, len - pos);
        pos += (size_t)payload;
        if (kids) {
            if (kids > len - pos)
                return dl_seterr(DL_EPROTO, "message: truncated: container of %llu objects at offset %zu, "
                                 "%zu bytes left", (unsigned long long)kids, pos - hdr, len - pos);
            if (depth + 1 > DL_PROTO_MAX_DEPTH)
                return dl_seterr(DL_EPROTO, "message: nested deeper than %u", DL_PROTO_MAX_DEPTH);
            rem[++depth] = kids;
        }
    }
    if (pos != len)
        return dl_seterr(DL_EPROTO, "message: %zu trailing bytes after the message (at offset %zu)", len - pos, pos);
    return 0;
}

static int rd_u8(const uint8_t *p, size_t len, size_t *pos, uint8_t *v) {
    if (*pos >= len) return -1;
    *v = p[(*pos)++];
    return 0;
}

/* Reads a non-negative msgpack integer at p[*pos]: fixint, uint8..64, or
 * int8..64 holding a value >= 0 (msgpack-c decodes those as uints too). */
static int rd_uint(const uint8_t *p, size_t len, size_t *pos, uint64_t *v) {
    uint8_t b;
    if (rd_u8(p, len, pos, &b)) return -1;
    if (b <= 0x7f) { *v = b; return 0; }
    bool is_signed = b >= 0xd0 && b <= 0xd3;
    size_t n = (b == 0xcc || b == 0xd0) ? 1 : (b == 0xcd || b == 0xd1) ? 2 : (b == 0xce || b == 0xd2) ? 4
             : (b == 0xcf || b == 0xd3) ? 8 : 0;
    if (!n || n > len - *pos) return -1;
    if (is_signed && (p[*pos] & 0x80)) return -1;   /* negative */
    *v = be_read(p + *pos, n);
    *pos += n;
    return 0;
}

int proto_peek(const void *buf, size_t len, uint32_t *type, uint32_t *version) {
    const uint8_t *p = buf;
    size_t pos = 0;
    uint8_t b;
    uint64_t t, v;
    if (!buf || rd_u8(p, len, &pos, &b)) return dl_seterr(DL_EPROTO, "message: empty");
    size_t skip = (b >= 0x90 && b <= 0x9f) ? 0 : b == 0xdc ? 2 : b == 0xdd ? 4 : SIZE_MAX;
    uint64_t n = (b >= 0x90 && b <= 0x9f) ? (b & 0x0f) : 0;
    if (skip == SIZE_MAX) return dl_seterr(DL_EPROTO, "message: expected array, got byte 0x%02x", b);
    if (skip > len - pos) return dl_seterr(DL_EPROTO, "message: truncated envelope");
    if (skip) { n = be_read(p + pos, skip); pos += skip; }
    if (n < 2) return dl_seterr(DL_EPROTO, "message: array of %llu elements, need type and version",
                                (unsigned long long)n);
    if (rd_uint(p, len, &pos, &t) || rd_uint(p, len, &pos, &v) || t > UINT32_MAX || v > UINT32_MAX)
        return dl_seterr(DL_EPROTO, "message: envelope type/version are not uint32");
    if (type) *type = (uint32_t)t;
    if (version) *version = (uint32_t)v;
    return 0;
}

/* ------------------------------------------------------------ decoding */

static const char *otype(const msgpack_object *o) {
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return "uint";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "negative int";
    case MSGPACK_OBJECT_FLOAT32: return "float32";
    case MSGPACK_OBJECT_FLOAT64: return "float64";
    case MSGPACK_OBJECT_STR: return "str";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_BIN: return "bin";
    case MSGPACK_OBJECT_EXT: return "ext";
    }
    return "?";
}

/* Decoding context: names the field in errors ("type.field[idx]"). */
typedef struct {
    const char *tn, *fn;
} dctx_t;

static int bad_type(const dctx_t *c, long idx, const char *want, const msgpack_object *o) {
    if (idx >= 0) return dl_seterr(DL_EPROTO, "%s.%s[%ld]: expected %s, got %s", c->tn, c->fn, idx, want, otype(o));
    return dl_seterr(DL_EPROTO, "%s.%s: expected %s, got %s", c->tn, c->fn, want, otype(o));
}

static int obj_uint(const dctx_t *c, long idx, const msgpack_object *o, uint64_t max, uint64_t *v) {
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return bad_type(c, idx, "uint", o);
    if (o->via.u64 > max) {
        if (idx >= 0)
            return dl_seterr(DL_EPROTO, "%s.%s[%ld]: %llu does not fit in %llu", c->tn, c->fn, idx,
                             (unsigned long long)o->via.u64, (unsigned long long)max);
        return dl_seterr(DL_EPROTO, "%s.%s: %llu does not fit in %llu", c->tn, c->fn,
                         (unsigned long long)o->via.u64, (unsigned long long)max);
    }
    *v = o->via.u64;
    return 0;
}

static int obj_int(const dctx_t *c, long idx, const msgpack_object *o, int64_t lo, int64_t hi, int64_t *v) {
    int64_t x;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX) goto range;
        x = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        x = o->via.i64;
    } else {
        return bad_type(c, idx, "int", o);
    }
    if (x < lo || x > hi) goto range;
    *v = x;
    return 0;
range:
    if (idx >= 0) return dl_seterr(DL_EPROTO, "%s.%s[%ld]: integer out of range [%lld, %lld]", c->tn, c->fn,
                                   idx, (long long)lo, (long long)hi);
    return dl_seterr(DL_EPROTO, "%s.%s: integer out of range [%lld, %lld]", c->tn, c->fn, (long long)lo,
                     (long long)hi);
}

static int obj_float(const dctx_t *c, long idx, const msgpack_object *o, double *v) {
    if (o->type != MSGPACK_OBJECT_FLOAT32 && o->type != MSGPACK_OBJECT_FLOAT64)
        return bad_type(c, idx, "float", o);
    *v = o->via.f64;
    return 0;
}

static int obj_str(const dctx_t *c, const msgpack_object *o, char *dst, uint32_t max_n) {
    if (o->type != MSGPACK_OBJECT_STR) return bad_type(c, -1, "str", o);
    uint32_t n = o->via.str.size;
    if (n > max_n) return dl_seterr(DL_EPROTO, "%s.%s: string of %u bytes, at most %u", c->tn, c->fn, n, max_n);
    if (n && memchr(o->via.str.ptr, 0, n))
        return dl_seterr(DL_EPROTO, "%s.%s: string contains a NUL byte", c->tn, c->fn);
    if (n) memcpy(dst, o->via.str.ptr, n);
    dst[n] = 0;
    return 0;
}

/* Element count and element size of an array-kind field as it appears on the
 * wire, or 0 elements when the object's type is wrong (reported later). */
static size_t wire_array_bytes(const field_t *f, const msgpack_object *o) {
    switch ((kind_t)f->kind) {
    case K_PSTR:   /* the bytes and a NUL, even when empty (never a NULL string) */
        if (o->type != MSGPACK_OBJECT_STR || o->via.str.size > f->max_n) return 0;
        return (size_t)o->via.str.size + 1;
    case K_I32BIN:
        if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size % 4 || o->via.bin.size / 4 > f->max_n) return 0;
        return o->via.bin.size;
    case K_U8BIN:
        if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size > f->max_n) return 0;
        return o->via.bin.size;
    case K_U64S: case K_I64S:
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > f->max_n) return 0;
        return (size_t)o->via.array.size * 8;
    case K_F32S:
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > f->max_n) return 0;
        return (size_t)o->via.array.size * 4;
    default:
        return 0;
    }
}

static void set_array(proto_msg_t *m, const field_t *f, void *p, uint32_t n) {
    memcpy(field_addr(m, f), &p, sizeof p);
    memcpy((char *)m + f->n_off, &n, 4);
}

/* Parses one field from o into m: checks the wire type and that the value fits
 * its C storage; ranges are left to validate_field. Arrays take their storage
 * from *arena (sized beforehand by wire_array_bytes). */
static int parse_field(proto_msg_t *m, const field_t *f, const msgpack_object *o, const char *tn, char **arena) {
    dctx_t c = { tn, f->name };
    void *dst = field_addr(m, f);
    switch ((kind_t)f->kind) {
    case K_U32: case K_ENUM: {
        uint64_t v = 0;
        DL_TRY(obj_uint(&c, -1, o, UINT32_MAX, &v));
        uint32_t v32 = (uint32_t)v;
        memcpy(dst, &v32, 4);
        return 0;
    }
    case K_U64: {
        uint64_t v = 0;
        DL_TRY(obj_uint(&c, -1, o, UINT64_MAX, &v));
        memcpy(dst, &v, 8);
        return 0;
    }
    case K_I32: {
        int64_t v = 0;
        DL_TRY(obj_int(&c, -1, o, INT32_MIN, INT32_MAX, &v));
        int32_t v32 = (int32_t)v;
        memcpy(dst, &v32, 4);
        return 0;
    }
    case K_F64: {
        double v = 0;
        DL_TRY(obj_float(&c, -1, o, &v));
        memcpy(dst, &v, 8);
        return 0;
    }
    case K_STR:
        return obj_str(&c, o, dst, f->max_n);
    case K_PSTR: {
        if (o->type != MSGPACK_OBJECT_STR) return bad_type(&c, -1, "str", o);
        uint32_t n = o->via.str.size;
        if (n > f->max_n) return dl_seterr(DL_EPROTO, "%s.%s: string of %u bytes, at most %u", tn, f->name, n, f->max_n);
        char *a = *arena;
        DL_TRY(obj_str(&c, o, a, f->max_n));
        *arena += ((size_t)n + 1 + 7) & ~(size_t)7;
        set_array(m, f, a, n);
        return 0;
    }
    case K_OPAQUE: {
        if (o->type != MSGPACK_OBJECT_BIN) return bad_type(&c, -1, "bin", o);
        uint32_t n = o->via.bin.size;
        if (n > f->max_n) return dl_seterr(DL_EPROTO, "%s.%s: %u bytes, expected 0 or %u", tn, f->name, n, f->max_n);
        if (n) memcpy(dst, o->via.bin.ptr, n);
        memcpy((char *)m + f->n_off, &n, 4);
        return 0;
    }
    case K_I32BIN: {
        if (o->type != MSGPACK_OBJECT_BIN) return bad_type(&c, -1, "bin", o);
        uint32_t sz = o->via.bin.size;
        if (sz % 4) return dl_seterr(DL_EPROTO, "%s.%s: %u bytes, not a multiple of 4 (int32 LE)", tn, f->name, sz);
        uint32_t n = sz / 4;
        if (n > f->max_n)
            return dl_seterr(DL_EPROTO, "%s.%s: %u elements, at most %u", tn, f->name, n, f->max_n);
        int32_t *a = n ? (int32_t *)*arena : NULL;
        for (uint32_t i = 0; i < n; i++) {
            const uint8_t *b = (const uint8_t *)o->via.bin.ptr + 4 * (size_t)i;
            a[i] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
        }
        if (n) *arena += ((size_t)n * 4 + 7) & ~(size_t)7;
        set_array(m, f, a, n);
        return 0;
    }
    case K_U8BIN: {
        if (o->type != MSGPACK_OBJECT_BIN) return bad_type(&c, -1, "bin", o);
        uint32_t n = o->via.bin.size;
        if (n > f->max_n)
            return dl_seterr(DL_EPROTO, "%s.%s: %u elements, at most %u", tn, f->name, n, f->max_n);
        uint8_t *a = n ? (uint8_t *)*arena : NULL;
        if (n) memcpy(a, o->via.bin.ptr, n);
        if (n) *arena += ((size_t)n + 7) & ~(size_t)7;
        set_array(m, f, a, n);
        return 0;
    }
    case K_U64S: case K_I64S: case K_F32S: {
        if (o->type != MSGPACK_OBJECT_ARRAY) return bad_type(&c, -1, "array", o);
        uint32_t n = o->via.array.size;
        if (n > f->max_n)
            return dl_seterr(DL_EPROTO, "%s.%s: %u elements, at most %u", tn, f->name, n, f->max_n);
        size_t esz = f->kind == K_F32S ? 4 : 8;
        void *a = n ? *arena : NULL;
        for (uint32_t i = 0; i < n; i++) {
            const msgpack_object *e = &o->via.array.ptr[i];
            if (f->kind == K_U64S) {
                DL_TRY(obj_uint(&c, i, e, UINT64_MAX, &((uint64_t *)a)[i]));
            } else if (f->kind == K_I64S) {
                DL_TRY(obj_int(&c, i, e, INT64_MIN, INT64_MAX, &((int64_t *)a)[i]));
            } else {
                double v = 0;
                DL_TRY(obj_float(&c, i, e, &v));
                if (isfinite(v) && fabs(v) > FLT_MAX)
                    return dl_seterr(DL_EPROTO, "%s.%s[%u]: %g does not fit in float32", tn, f->name, i, v);
                ((float *)a)[i] = (float)v;
            }
        }
        if (n) *arena += ((size_t)n * esz + 7) & ~(size_t)7;
        set_array(m, f, a, n);
        return 0;
    }
    case K_DIMS: {
        if (o->type != MSGPACK_OBJECT_ARRAY) return bad_type(&c, -1, "array", o);
        uint32_t n = o->via.array.size;
        if (n > DL_PROTO_MAX_DIMS)
            return dl_seterr(DL_EPROTO, "%s.%s: %u dims, at most %u", tn, f->name, n, DL_PROTO_MAX_DIMS);
        uint64_t *d = dst;
        for (uint32_t i = 0; i < n; i++) DL_TRY(obj_uint(&c, i, &o->via.array.ptr[i], UINT64_MAX, &d[i]));
        memcpy((char *)m + f->n_off, &n, 4);
        return 0;
    }
    case K_METRICS: {
        if (o->type != MSGPACK_OBJECT_ARRAY) return bad_type(&c, -1, "array", o);
        uint32_t n = o->via.array.size;
        if (n > f->max_n) return dl_seterr(DL_EPROTO, "%s.%s: %u entries, at most %u", tn, f->name, n, f->max_n);
        proto_metric_t *mt = dst;
        for (uint32_t i = 0; i < n; i++) {
            const msgpack_object *e = &o->via.array.ptr[i];
            char fname[40];
            if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 2) {
                if (e->type == MSGPACK_OBJECT_ARRAY)
                    return dl_seterr(DL_EPROTO, "%s.%s[%u]: array of %u, expected [name, value]", tn, f->name,
                                     i, e->via.array.size);
                return bad_type(&c, i, "array [name, value]", e);
            }
            snprintf(fname, sizeof fname, "%s[%u].name", f->name, i);
            dctx_t cn = { tn, fname };
            DL_TRY(obj_str(&cn, &e->via.array.ptr[0], mt[i].name, DL_PROTO_NAME_MAX));
            snprintf(fname, sizeof fname, "%s[%u].value", f->name, i);
            DL_TRY(obj_float(&cn, -1, &e->via.array.ptr[1], &mt[i].value));
        }
        memcpy((char *)m + f->n_off, &n, 4);
        return 0;
    }
    }
    return dl_seterr(DL_EPROTO, "%s.%s: internal: unknown field kind %d", tn, f->name, f->kind);
}

static int decode_object(const msgpack_object *root, proto_msg_t *out) {
    if (root->type != MSGPACK_OBJECT_ARRAY)
        return dl_seterr(DL_EPROTO, "message: expected array [type, version, ...], got %s", otype(root));
    uint32_t n = root->via.array.size;
    const msgpack_object *el = root->via.array.ptr;
    if (n < 2)
        return dl_seterr(DL_EPROTO, "message: array of %u elements, need at least type and version", n);
    dctx_t c = { "message", "type" };
    uint64_t type = 0, version = 0;
    DL_TRY(obj_uint(&c, -1, &el[0], UINT32_MAX, &type));
    c.fn = "version";
    DL_TRY(obj_uint(&c, -1, &el[1], UINT32_MAX, &version));
    if (version != DL_PROTO_VERSION)
        return dl_seterr(DL_EPROTO, "message: protocol version %llu, this build speaks %u",
                         (unsigned long long)version, DL_PROTO_VERSION);
    const msgdef_t *d = def_of(type);
    if (!d) return dl_seterr(DL_EPROTO, "message: unknown type %llu", (unsigned long long)type);
    const char *tn = proto_type_name((proto_type_t)type);
    if (n != 2 + d->n_fields)
        return dl_seterr(DL_EPROTO, "%s: %u fields, expected %u", tn, n - 2, d->n_fields);
    out->type = (proto_type_t)type;
    out->version = (uint32_t)version;

    size_t need = 0;
    for (uint32_t i = 0; i < d->n_fields; i++)
        need += (wire_array_bytes(&d->fields[i], &el[2 + i]) + 7) & ~(size_t)7;
    char *arena = NULL;
    if (need) {
        out->owned_ = malloc(need);
        if (!out->owned_) return dl_seterr(DL_ENOMEM, "%s: %zu bytes for arrays", tn, need);
        arena = out->owned_;
    }
    for (uint32_t i = 0; i < d->n_fields; i++) DL_TRY(parse_field(out, &d->fields[i], &el[2 + i], tn, &arena));
    return proto_validate(out);
}

int proto_decode(const void *buf, size_t len, proto_msg_t *out) {
    if (!out) return dl_seterr(DL_EINVAL, "proto_decode: NULL output");
    memset(out, 0, sizeof *out);
    if (!buf || len == 0) return dl_seterr(DL_EPROTO, "message: empty");
    if (len > DL_PROTO_MAX_BYTES)
        return dl_seterr(DL_EPROTO, "message: %zu bytes, over the limit of %u", len, DL_PROTO_MAX_BYTES);
    DL_TRY(proto__scan(buf, len));

    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(&up, buf, len, &off);
    int rc;
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR) rc = dl_seterr(DL_ENOMEM, "message: msgpack out of memory");
    else if (ur != MSGPACK_UNPACK_SUCCESS || off != len)
        rc = dl_seterr(DL_EPROTO, "message: msgpack parse failed (%d) at offset %zu", (int)ur, off);
    else rc = decode_object(&up.data, out);
    msgpack_unpacked_destroy(&up);
    if (rc < 0) {
        free(out->owned_);
        memset(out, 0, sizeof *out);
    }
    return rc;
}
