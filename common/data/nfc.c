/* NFC normalization, after the sample code of UAX #15 (Unicode Normalization
 * Forms), section 14 / the composition algorithm of the Unicode Standard 3.11. */
#include "common/data/nfc.h"

#include "common/base/err.h"
#include "common/data/nfc_tables.h"

#include <stdlib.h>
#include <string.h>

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7, LCOUNT = 19, VCOUNT = 21, TCOUNT = 28,
       NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

static int ccc(uint32_t c) {
    if (c < 0x300) return 0;
    size_t lo = 0, hi = N_ELEMS(nfc_ccc);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (c < nfc_ccc[m][0]) hi = m;
        else if (c > nfc_ccc[m][1]) lo = m + 1;
        else return (int)nfc_ccc[m][2];
    }
    return 0;
}

static const uint32_t *decomp(uint32_t c, uint32_t *len) {
    if (c < 0xC0) return NULL;
    size_t lo = 0, hi = N_ELEMS(nfc_dec);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (c < nfc_dec[m][0]) hi = m;
        else if (c > nfc_dec[m][0]) lo = m + 1;
        else { *len = nfc_dec[m][2]; return nfc_dec_pool + nfc_dec[m][1]; }
    }
    return NULL;
}

static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    uint64_t k = ((uint64_t)a << 21) | b;
    size_t lo = 0, hi = N_ELEMS(nfc_comp_key);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (k < nfc_comp_key[m]) hi = m;
        else if (k > nfc_comp_key[m]) lo = m + 1;
        else return nfc_comp_val[m];
    }
    return 0;
}

static int dec_utf8(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if ((size_t)len > n) { *cp = 0xFFFD; return 1; }
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) v = (v << 6) | (s[i] & 0x3F);
    *cp = v;
    return len;
}

static int enc_utf8(uint32_t c, char *o) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | (c >> 6)); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12)); o[1] = (char)(0x80 | ((c >> 6) & 0x3F)); o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18)); o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F)); o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

int nfc_normalize(const char *s, size_t n, char **out, size_t *out_len, uint32_t **map) {
    *out = NULL;
    *out_len = n;
    if (map) *map = NULL;
    /* every code point below U+0300 is NFC-stable and composes with nothing before it */
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0xCC) i++;
    if (i == n) return 0;
    /* decompose: code points with their source offset and length; a full
     * decomposition is at most 18 code points per input one (U+FDFA); 4 suffices
     * for canonical ones, allocate 4 per input byte to be safe */
    size_t cap = n * 4 + 4;
    uint32_t *cp = malloc(cap * sizeof *cp), *src = malloc(cap * sizeof *src);
    uint8_t *slen = malloc(cap);
    if (!cp || !src || !slen) { free(cp); free(src); free(slen); return dl_seterr(DL_ENOMEM, "nfc: %zu bytes", n); }
    size_t m = 0;
    for (size_t p = 0; p < n;) {
        uint32_t c, dl;
        int l = dec_utf8((const unsigned char *)s + p, n - p, &c);
        const uint32_t *d;
        if (c >= SBASE && c < SBASE + SCOUNT) {
            uint32_t si = c - SBASE, t = TBASE + si % TCOUNT;
            cp[m] = LBASE + si / NCOUNT; src[m] = (uint32_t)p; slen[m++] = (uint8_t)l;
            cp[m] = VBASE + (si % NCOUNT) / TCOUNT; src[m] = (uint32_t)p; slen[m++] = (uint8_t)l;
            if (t != TBASE) { cp[m] = t; src[m] = (uint32_t)p; slen[m++] = (uint8_t)l; }
        } else if ((d = decomp(c, &dl)) != NULL) {
            for (uint32_t k = 0; k < dl; k++) { cp[m] = d[k]; src[m] = (uint32_t)p; slen[m++] = (uint8_t)l; }
        } else {
            cp[m] = c; src[m] = (uint32_t)p; slen[m++] = (uint8_t)l;
        }
        p += (size_t)l;
    }
    /* canonical ordering: stable insertion sort of each run of non-starters by ccc */
    for (size_t k = 1; k < m; k++) {
        int kc = ccc(cp[k]);
        if (kc == 0) continue;
        size_t j = k;
        while (j > 0) {
            int pc = ccc(cp[j - 1]);
            if (pc == 0 || pc <= kc) break;
            uint32_t tc = cp[j]; cp[j] = cp[j - 1]; cp[j - 1] = tc;
            uint32_t ts = src[j]; src[j] = src[j - 1]; src[j - 1] = ts;
            uint8_t tl = slen[j]; slen[j] = slen[j - 1]; slen[j - 1] = tl;
            j--;
        }
    }
    /* canonical composition */
    size_t starter = 0, w = 1;
    int last = m ? ccc(cp[0]) : 0;
    int have_starter = m && last == 0;
    if (last != 0) last = 256;
    for (size_t k = 1; k < m; k++) {
        uint32_t c = cp[k];
        int kc = ccc(c);
        uint32_t comp = have_starter ? compose(cp[starter], c) : 0;
        if (comp && (last < kc || last == 0)) {
            cp[starter] = comp;
            continue;
        }
        if (kc == 0) { starter = w; have_starter = 1; }
        last = kc;
        cp[w] = c; src[w] = src[k]; slen[w] = slen[k];
        w++;
    }
    m = w;
    /* encode; compare with the input */
    char *o = malloc(m * 4 + 1);
    uint32_t *mp = map ? malloc((m * 4 + 1) * sizeof *mp) : NULL;
    if (!o || (map && !mp)) { free(o); free(mp); free(cp); free(src); free(slen); return dl_seterr(DL_ENOMEM, "nfc"); }
    size_t on = 0;
    for (size_t k = 0; k < m; k++) {
        int l = enc_utf8(cp[k], o + on);
        if (mp)
            for (int j = 0; j < l; j++) mp[on + (size_t)j] = src[k] + (uint32_t)(j < slen[k] ? j : slen[k] - 1);
        on += (size_t)l;
    }
    o[on] = 0;
    free(cp);
    free(src);
    free(slen);
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
