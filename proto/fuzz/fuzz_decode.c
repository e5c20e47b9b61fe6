/* libFuzzer target for proto_decode (built by scripts/fuzz.sh with clang
 * -fsanitize=fuzzer,address,undefined; not part of the library build).
 *
 * Properties checked on every input, beyond "no crash, no out-of-bounds read,
 * no undefined behaviour, no leak":
 *   - decode returns 0 or DL_EPROTO, with a non-empty error detail on failure;
 *   - an accepted message passes proto_validate, encodes, decodes again, and
 *     re-encodes to the same bytes (the codec is a fixed point after one trip);
 *   - proto_peek agrees with decode about type and version.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "proto/codec.h"

#define CHECK(cond, what) do { if (!(cond)) { fprintf(stderr, "fuzz_decode: %s (%s)\n", what, dl_errmsg()); abort(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    proto_msg_t m;
    int rc = proto_decode(data, size, &m);
    if (rc != 0) {
        CHECK(rc == DL_EPROTO, "decode failed with a code other than DL_EPROTO");
        CHECK(dl_errmsg()[0] != 0, "decode failed without an error detail");
        CHECK(m.owned_ == NULL, "failed decode left storage behind");
        return 0;
    }
    uint32_t t = 0, v = 0;
    CHECK(proto_peek(data, size, &t, &v) == 0, "peek refused a message decode accepted");
    CHECK(t == (uint32_t)m.type && v == DL_PROTO_VERSION, "peek disagrees with decode");
    CHECK(proto_validate(&m) == 0, "decoded message does not validate");

    msgpack_sbuffer a, b;
    msgpack_sbuffer_init(&a);
    msgpack_sbuffer_init(&b);
    CHECK(proto_encode(&m, &a) == 0, "decoded message does not encode");
    proto_msg_t m2;
    CHECK(proto_decode(a.data, a.size, &m2) == 0, "re-encoded message does not decode");
    CHECK(proto_encode(&m2, &b) == 0, "second encode failed");
    CHECK(a.size == b.size && memcmp(a.data, b.data, a.size) == 0, "encode(decode(x)) is not a fixed point");
    proto_msg_free(&m2);
    proto_msg_free(&m);
    msgpack_sbuffer_destroy(&a);
    msgpack_sbuffer_destroy(&b);
    return 0;
}
