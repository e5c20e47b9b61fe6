/* The pre-tokenizer's character classes on current Unicode.
 *
 * Hugging Face `tokenizers` 0.23 matches its Split regexes with Oniguruma's
 * Unicode 16.0 tables; Debian's PCRE2 10.42 has Unicode 14.0 tables, so letters
 * and digits added since (CJK Ext. H/I, Kawi, Garay, ...) split differently
 * (issue 15 item 10). The classes here come from a table generated from
 * Unicode 16.0 (uclass_gen.py -> uclass_tab.h), independent of the PCRE2 and
 * utf8proc the machine has.
 *
 * uclass_premap lets PCRE2 keep matching the known pre-tokenizer regexes while
 * its own tables never decide: each non-ASCII code point becomes a stand-in of
 * the same class and the same UTF-8 length, one that every PCRE2 since Unicode
 * 3.1 classifies alike, so the match boundaries on the stand-in text are those
 * of the original text under Unicode 16.0, byte for byte.
 */
#ifndef DL_DATA_UCLASS_H
#define DL_DATA_UCLASS_H

#include <stddef.h>
#include <stdint.h>

/* Classes as the GPT-2 family regexes see them: \p{L}, \p{N}, \s (outside
 * ASCII: Z* and U+0085, as Oniguruma), anything else. Disjoint. */
enum { UCLASS_OTHER = 0, UCLASS_L = 1, UCLASS_N = 2, UCLASS_SPACE = 3 };

/* Class of code point cp (any value; > U+10FFFF and surrogates: UCLASS_OTHER). */
int uclass_of(uint32_t cp);

/* Unicode version of the class table ("16.0.0"). */
const char *uclass_unicode_version(void);

/* Decodes one UTF-8 sequence at s[0..n) into *cp; returns its length 1..4, or 0
 * when it is invalid (overlong, surrogate, > U+10FFFF, truncated, stray byte). */
int uclass_utf8_dec(const unsigned char *s, size_t n, uint32_t *cp);

/* out[0..n) = s[0..n) with every non-ASCII code point replaced by its class's
 * stand-in of the same UTF-8 length (ASCII and U+017F, which (?i) folds to 's',
 * are kept). s must be valid UTF-8 (callers check); out must not overlap s.
 * Returns 1 when some byte changed, 0 when out equals s. */
int uclass_premap(const char *s, size_t n, char *out);

#endif
