/* draftline wire protocol: msgpack codec (msgpack-c, -lmsgpackc).
 *
 * Wire form (PROTOCOL.md): one msgpack array [type, version, field_1, ...,
 * field_n], fields in the order of the structs in proto/msg.h. Bulk numeric
 * arrays (micro_batch tokens, seq_lens, loss_mask) are little-endian bin; other
 * lists are msgpack arrays.
 *
 * Ownership: the encoder only reads the message (array pointers stay the
 * caller's). proto_decode copies every array into one heap block owned by the
 * decoded message (msg->owned_), released by proto_msg_free; strings are copied
 * into the message's fixed char arrays. The input buffer is not referenced after
 * proto_decode returns.
 */
#ifndef DL_PROTO_CODEC_H
#define DL_PROTO_CODEC_H

#include <msgpack.h>
#include <stddef.h>

#include "proto/msg.h"

/* Appends the encoding of *m to sb. Validates first (proto_validate).
 * Errors: DL_EPROTO (invalid field, detail names it), DL_ERANGE (encoding over
 * DL_PROTO_MAX_BYTES), DL_ENOMEM. On error sb->size is unchanged. */
int proto_encode(const proto_msg_t *m, msgpack_sbuffer *sb);

/* Encodes *m into buf[0..cap); *out_len = bytes written. Same errors as
 * proto_encode, plus DL_ERANGE when cap is too small. */
int proto_encode_to(const proto_msg_t *m, void *buf, size_t cap, size_t *out_len);

/* Decodes exactly one message from buf[0..len) into *out (which it
 * initialises; on error *out holds no storage and needs no free). Validates
 * total size (<= DL_PROTO_MAX_BYTES), msgpack structure (no truncation, no
 * trailing bytes, at most DL_PROTO_MAX_OBJECTS objects, depth <=
 * DL_PROTO_MAX_DEPTH), the version, the type, the arity, every field's type and
 * range and the cross-field rules. Errors: DL_EPROTO with detail such as
 * "hidden_states_ready.shape[1]: expected uint, got str"; DL_ENOMEM.
 * Never reads outside buf[0..len). On success call proto_msg_free(out). */
int proto_decode(const void *buf, size_t len, proto_msg_t *out);

/* Reads only the envelope (type, version) without validating the rest, e.g.
 * to answer a peer of another version with an error. Returns 0 or DL_EPROTO. */
int proto_peek(const void *buf, size_t len, uint32_t *type, uint32_t *version);

#endif
