/* Unicode NFC normalization (UAX #15: canonical decomposition, canonical
 * ordering, canonical composition), for tokenizers whose tokenizer.json has an
 * NFC normalizer (Qwen2/3). Tables: nfc_tables.h, generated from Python's
 * unicodedata by gen_nfc_tables.py. Internal to common/data. */
#ifndef DL_DATA_NFC_H
#define DL_DATA_NFC_H

#include <stddef.h>
#include <stdint.h>

/* NFC of s[0..n) (valid UTF-8). Returns 0 with *out = NULL when s is already
 * NFC (nothing allocated). Otherwise *out (malloc'd, NUL-terminated, *out_len
 * bytes) and *map (malloc'd, *out_len + 1 entries): map[k] is the byte offset in
 * s of the character that output byte k came from (map[*out_len] = n).
 * Returns DL_ENOMEM on allocation failure. */
int nfc_normalize(const char *s, size_t n, char **out, size_t *out_len, uint32_t **map);

#endif
