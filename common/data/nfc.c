/* NFC normalization with utf8proc's Unicode data and primitives; the steps are
 * those of UAX #15 / the Unicode Standard, section 3.11 (D109-D117): full
 * canonical decomposition (utf8proc_decompose_char), canonical ordering by
 * combining class (utf8proc_get_property), canonical composition of each
 * unblocked (starter, character) pair (utf8proc_normalize_utf32 on the pair).
 * The steps run here rather than in one utf8proc_map call because the caller
 * needs each output byte's source offset, which utf8proc_map does not report,
 * and because utf8proc 2.8 composes <LV syllable, U+11A7> (see pair_compose). */
#include "common/data/nfc.h"

#include "common/base/err.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* a code point of the decomposed text, with the byte offset and UTF-8 length of
 * the input character it came from */
typedef struct {
    utf8proc_int32_t cp;
    uint32_t src;
    uint8_t len;
} nfc_cp_t;

static int ccc(utf8proc_int32_t c) { return utf8proc_get_property(c)->combining_class; }

/* Primary composite of the pair (a, b), or 0. U+11A7 (= TBase, not a trailing
 * consonant: Unicode 3.12, TCount) never composes; utf8proc 2.8 wrongly composes
 * <LV, U+11A7> to LV, dropping the U+11A7 (JuliaStrings/utf8proc#317, fixed
 * after 2.8). UTF8PROC_STABLE keeps composition exclusions decomposed. */
static utf8proc_int32_t pair_compose(utf8proc_int32_t a, utf8proc_int32_t b) {
    if (b == 0x11A7) return 0;
    utf8proc_int32_t pair[2] = {a, b};
    return utf8proc_normalize_utf32(pair, 2, UTF8PROC_STABLE | UTF8PROC_COMPOSE) == 1 ? pair[0] : 0;
}

/* Full canonical decomposition of s[0..n) into *cps (malloc'd, *m entries). */
static int decompose(const char *s, size_t n, nfc_cp_t **cps, size_t *m) {
    size_t cap = n + 16, k = 0;
    nfc_cp_t *v = malloc(cap * sizeof *v);
    if (!v) return dl_seterr(DL_ENOMEM, "nfc: %zu bytes", n);
    for (size_t p = 0; p < n;) {
        utf8proc_int32_t c, d[8];
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + p, (utf8proc_ssize_t)(n - p), &c);
        if (l <= 0 || c < 0) {
            free(v);
            return dl_seterr(DL_EINVAL, "nfc: invalid UTF-8 at byte %zu of %zu", p, n);
        }
        /* no canonical decomposition is longer than 4 code points (Unicode 15) */
        utf8proc_ssize_t dl = utf8proc_decompose_char(c, d, 8, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, NULL);
        if (dl < 1 || dl > 8) {
            free(v);
            return dl_seterr(DL_EINVAL, "nfc: decomposing U+%04X at byte %zu: %s", (unsigned)c, p,
                             dl < 0 ? utf8proc_errmsg(dl) : "over 8 code points");
        }
        if (k + (size_t)dl > cap) {
            cap *= 2;
            nfc_cp_t *nv = realloc(v, cap * sizeof *v);
            if (!nv) { free(v); return dl_seterr(DL_ENOMEM, "nfc: %zu code points", cap); }
            v = nv;
        }
        for (utf8proc_ssize_t j = 0; j < dl; j++) v[k++] = (nfc_cp_t){d[j], (uint32_t)p, (uint8_t)l};
        p += (size_t)l;
    }
    *cps = v;
    *m = k;
    return 0;
}

int nfc_normalize(const char *s, size_t n, char **out, size_t *out_len, uint32_t **map) {
    *out = NULL;
    *out_len = n;
    if (map) *map = NULL;
    /* every code point below U+0300 is NFC-stable and composes with nothing before it */
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0xCC) i++;
    if (i == n) return 0;
    if (n >= UINT32_MAX) return dl_seterr(DL_ERANGE, "nfc: %zu bytes (offsets are 32-bit)", n);
    nfc_cp_t *v = NULL;
    size_t m = 0;
    DL_TRY(decompose(s, n, &v, &m));
    /* canonical ordering (D108): stable sort of each run of non-starters by ccc */
    for (size_t k = 1; k < m; k++) {
        int kc = ccc(v[k].cp);
        if (kc == 0) continue;
        for (size_t j = k; j > 0; j--) {
            int pc = ccc(v[j - 1].cp);
            if (pc == 0 || pc <= kc) break;
            nfc_cp_t t = v[j]; v[j] = v[j - 1]; v[j - 1] = t;
        }
    }
    /* canonical composition (D117): c joins the last starter unless blocked by a
     * character in between with ccc 0 or >= ccc(c); the composite keeps the
     * starter's source */
    size_t starter = 0, w = m ? 1 : 0;
    int last = m ? ccc(v[0].cp) : 0, have_starter = m && last == 0;
    if (last != 0) last = 256;
    for (size_t k = 1; k < m; k++) {
        int kc = ccc(v[k].cp);
        utf8proc_int32_t comp = have_starter && (last < kc || last == 0) ? pair_compose(v[starter].cp, v[k].cp) : 0;
        if (comp) {
            v[starter].cp = comp;
            continue;
        }
        if (kc == 0) { starter = w; have_starter = 1; }
        last = kc;
        v[w++] = v[k];
    }
    m = w;
    /* encode; compare with the input */
    char *o = malloc(m * 4 + 1);
    uint32_t *mp = map ? malloc((m * 4 + 1) * sizeof *mp) : NULL;
    if (!o || (map && !mp)) { free(o); free(mp); free(v); return dl_seterr(DL_ENOMEM, "nfc: %zu code points", m); }
    size_t on = 0;
    for (size_t k = 0; k < m; k++) {
        utf8proc_ssize_t l = utf8proc_encode_char(v[k].cp, (utf8proc_uint8_t *)o + on);
        if (mp)
            for (utf8proc_ssize_t j = 0; j < l; j++)
                mp[on + (size_t)j] = v[k].src + (uint32_t)(j < v[k].len ? j : v[k].len - 1);
        on += (size_t)l;
    }
    o[on] = 0;
    free(v);
    if (on == n && !memcmp(o, s, n)) { free(o); free(mp); return 0; }
    if (mp) {
        /* canonical reordering can move a mark before an earlier one: make the map
         * non-decreasing (suffix minimum), so a token starts at its cluster */
        mp[on] = (uint32_t)n;
        for (size_t k = on; k-- > 0;)
            if (mp[k] > mp[k + 1]) mp[k] = mp[k + 1];
        *map = mp;
    }
    *out = o;
    *out_len = on;
    return 0;
}
