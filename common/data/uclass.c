/* Pre-tokenizer character classes (see uclass.h). */
#include "common/data/uclass.h"

#include <string.h>

#include "common/data/uclass_tab.h"

/* Index of the last run whose first code point is <= cp (cp <= U+10FFFF). */
static size_t run_index(uint32_t cp) {
    uint32_t b = cp >> 8;
    size_t lo = uclass_block[b], hi = b + 1 < 0x1100 ? (size_t)uclass_block[b + 1] + 1 : UCLASS_N_RUNS;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((uclass_runs[mid] >> 2) <= cp) lo = mid;
        else hi = mid;
    }
    return lo;
}

int uclass_of(uint32_t cp) { return cp > 0x10FFFF ? UCLASS_OTHER : (int)(uclass_runs[run_index(cp)] & 3); }

const char *uclass_unicode_version(void) { return UCLASS_UNICODE; }

int uclass_utf8_dec(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    int len = (c >= 0xF0 && c < 0xF8) ? 4 : (c >= 0xE0) ? 3 : (c >= 0xC2 && c < 0xE0) ? 2 : 0;
    if (c >= 0xF8) len = 0;
    if (!len || (size_t)len > n) return 0;
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && v < 0x800) || (len == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
        (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

/* Stand-ins by [class][UTF-8 length - 2], all assigned in Unicode 3.1 or before:
 * L: U+00E9 U+4E00 U+20000; N: U+0660 U+0966 U+1D7CE; space: U+00A0 U+3000 (no
 * space needs 4 bytes); other: U+00A7 U+20AC U+1F600. */
static const char *const stand_in[4][3] = {
    {"\xC2\xA7", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"},
    {"\xC3\xA9", "\xE4\xB8\x80", "\xF0\xA0\x80\x80"},
    {"\xD9\xA0", "\xE0\xA5\xA6", "\xF0\x9D\x9F\x8E"},
    {"\xC2\xA0", "\xE3\x80\x80", NULL},
};

int uclass_premap(const char *s, size_t n, char *out) {
    const unsigned char *u = (const unsigned char *)s;
    uint32_t run_lo = 1, run_hi = 0; /* the last looked-up run [run_lo, run_hi) */
    int run_cls = 0, changed = 0;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { out[i] = s[i]; i++; continue; }
        uint32_t cp;
        int len = uclass_utf8_dec(u + i, n - i, &cp);
        if (len < 2) { out[i] = s[i]; i++; continue; } /* not valid UTF-8: callers never pass it */
        if (cp < run_lo || cp >= run_hi) {
            size_t lo = run_index(cp);
            run_lo = uclass_runs[lo] >> 2;
            run_hi = lo + 1 < UCLASS_N_RUNS ? uclass_runs[lo + 1] >> 2 : 0x110000;
            run_cls = (int)(uclass_runs[lo] & 3);
        }
        if (cp == 0x17F) memcpy(out + i, s + i, 2); /* LATIN SMALL LETTER LONG S: (?i:'s) matches it */
        else { memcpy(out + i, stand_in[run_cls][len - 2], (size_t)len); changed = 1; }
        i += (size_t)len;
    }
    return changed;
}
