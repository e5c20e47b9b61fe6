/* Unicode NFC normalization (UAX #15: canonical decomposition, canonical
 * ordering, canonical composition), for tokenizers whose tokenizer.json has an
 * NFC normalizer (Qwen2/3). Unicode data and per-character primitives from
 * utf8proc (Debian libutf8proc 2.8: Unicode 15.0.0, utf8proc_unicode_version());
 * nfc.c tracks each character's source offset through the steps. Internal to
 * common/data. */
#ifndef DL_DATA_NFC_H
#define DL_DATA_NFC_H

#include <stddef.h>
#include <stdint.h>

/* NFC of s[0..n) (valid UTF-8, n < 2^32). Returns 0 with *out = NULL when s
 * is already NFC (nothing allocated). Otherwise *out (malloc'd, NUL-terminated,
 * *out_len bytes) and, when map is not NULL, *map (malloc'd, *out_len + 1
 * entries): map[k] is the byte offset in s of the character that output byte k
 * came from (a composite: its starter's; made non-decreasing, map[*out_len] = n).
 * Returns DL_ENOMEM on allocation failure, DL_EINVAL when s is not valid UTF-8
 * (overlong forms, surrogates and code points above U+10FFFF included; text
 * whose bytes are all below 0xCC, i.e. code points below U+0300, is returned
 * as NFC without being checked), DL_ERANGE when n >= 2^32. */
int nfc_normalize(const char *s, size_t n, char **out, size_t *out_len, uint32_t **map);

#endif
