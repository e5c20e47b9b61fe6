/* Byte-level BPE (see tokenizer.h). Reference behaviour: Hugging Face
 * tokenizers (models/bpe/word.rs merge_all: min-heap on (rank, position)). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/data/tokenizer.h"

#include "common/base/err.h"
#include "common/data/nfc.h"
#include "common/data/uclass.h"
#include "common/format/gguf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TOK_MAX_STAGES 4

/* Pre-tokenizer regexes (HF tokenizer.json files of the models; llama.cpp
 * llama-vocab.cpp for the GGUF `pre` names). */
static const char RX_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char RX_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RX_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RX_DIGIT[] = "\\p{N}";

/* ---- hash maps ------------------------------------------------------------ */

static uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}
#define FNV0 0xcbf29ce484222325ull

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* bytes -> id, open addressing; entries index into the tok's token table. */
typedef struct { int32_t *slot; uint64_t mask; } strmap_t;
/* (a,b) -> (rank, merged id). */
typedef struct { uint64_t key; int32_t rank, id; } pair_ent_t;
typedef struct { pair_ent_t *e; uint64_t mask; } pairmap_t;

typedef struct {
    char *s;        /* raw bytes (NUL-terminated for convenience) */
    uint32_t len;
    uint8_t special, added, in_bpe; /* in_bpe: part of the BPE model's vocab */
} tok_entry_t;

typedef struct {
    char *s;
    uint32_t len;
    int32_t id;
    int special;
} added_t;

struct tok {
    tok_entry_t *tok;       /* (n_vocab) */
    int32_t n_vocab;
    strmap_t vocab;         /* BPE vocab (raw bytes) */
    pairmap_t merges;
    int32_t byte_id[256];
    added_t *added;
    int n_added;
    int16_t added_first[256]; /* 1 if some added token starts with this byte */
    pcre2_code *rx[TOK_MAX_STAGES];
    char *rx_src[TOK_MAX_STAGES];
    int n_rx;
    int ignore_merges;
    int nfc;                  /* normalizer NFC (Qwen2/3) */
    int premap;               /* every regex is a known one: match on uclass_premap'd text */
    int32_t bos, eos, pad;
    char *chat_template;
    char pre_name[16];
    uint64_t fingerprint;
};

static int strmap_init(strmap_t *m, uint64_t n) {
    uint64_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot) return dl_seterr(DL_ENOMEM, "tokenizer: vocab map of %llu slots", (unsigned long long)cap);
    memset(m->slot, 0xff, cap * sizeof *m->slot);
    m->mask = cap - 1;
    return 0;
}

static int32_t strmap_get(const tok_t *t, const char *s, size_t n) {
    uint64_t h = fnv1a(s, n, FNV0) & t->vocab.mask;
    for (;;) {
        int32_t id = t->vocab.slot[h];
        if (id < 0) return -1;
        const tok_entry_t *e = &t->tok[id];
        if (e->len == n && !memcmp(e->s, s, n)) return id;
        h = (h + 1) & t->vocab.mask;
    }
}

static void strmap_put(tok_t *t, int32_t id) {
    const tok_entry_t *e = &t->tok[id];
    uint64_t h = fnv1a(e->s, e->len, FNV0) & t->vocab.mask;
    for (;;) {
        int32_t cur = t->vocab.slot[h];
        if (cur < 0) { t->vocab.slot[h] = id; return; }
        if (t->tok[cur].len == e->len && !memcmp(t->tok[cur].s, e->s, e->len)) return; /* first wins */
        h = (h + 1) & t->vocab.mask;
    }
}

static int pairmap_init(pairmap_t *m, uint64_t n) {
    uint64_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    m->e = malloc(cap * sizeof *m->e);
    if (!m->e) return dl_seterr(DL_ENOMEM, "tokenizer: merge map of %llu slots", (unsigned long long)cap);
    for (uint64_t i = 0; i < cap; i++) m->e[i].rank = -1;
    m->mask = cap - 1;
    return 0;
}

static inline uint64_t pkey(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static void pairmap_put(pairmap_t *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t k = pkey(a, b), h = mix64(k) & m->mask;
    while (m->e[h].rank >= 0) {
        if (m->e[h].key == k) return; /* keep the lowest rank */
        h = (h + 1) & m->mask;
    }
    m->e[h] = (pair_ent_t){k, rank, id};
}

static inline const pair_ent_t *pairmap_get(const pairmap_t *m, int32_t a, int32_t b) {
    uint64_t k = pkey(a, b), h = mix64(k) & m->mask;
    while (m->e[h].rank >= 0) {
        if (m->e[h].key == k) return &m->e[h];
        h = (h + 1) & m->mask;
    }
    return NULL;
}

/* ---- GPT-2 byte <-> unicode ------------------------------------------------ */

/* cp_of_byte[b]: the code point GPT-2's bytes_to_unicode assigns to byte b. */
static void byte_unicode(uint32_t cp_of_byte[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_of_byte[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

/* Byte-level token string -> raw bytes, in place into out (cap >= n). Returns
 * the byte length, or -1 if a code point is outside the mapping. */
static long unmap_bytes(const int16_t *byte_of_cp, const char *s, size_t n, char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        int l = uclass_utf8_dec((const unsigned char *)s + i, n - i, &cp);
        if (!l || cp >= 324 || byte_of_cp[cp] < 0) return -1;
        out[o++] = (char)byte_of_cp[cp];
        i += (size_t)l;
    }
    return (long)o;
}

/* ---- construction ---------------------------------------------------------- */

typedef struct {
    tok_t *t;
    int16_t byte_of_cp[324];
} builder_t;

static int builder_init(builder_t *b, int32_t n_vocab) {
    uint32_t cp_of_byte[256];
    byte_unicode(cp_of_byte);
    for (int i = 0; i < 324; i++) b->byte_of_cp[i] = -1;
    for (int i = 0; i < 256; i++) b->byte_of_cp[cp_of_byte[i]] = (int16_t)i;
    tok_t *t = calloc(1, sizeof *t);
    if (!t) return dl_seterr(DL_ENOMEM, "tokenizer: alloc");
    b->t = t;
    t->bos = t->eos = t->pad = -1;
    t->n_vocab = n_vocab;
    t->tok = calloc((size_t)n_vocab, sizeof *t->tok);
    if (!t->tok) return dl_seterr(DL_ENOMEM, "tokenizer: %d tokens", n_vocab);
    return strmap_init(&t->vocab, (uint64_t)n_vocab);
}

/* Sets token id from its byte-level string (BPE vocab entry). */
static int builder_set_token(builder_t *b, int32_t id, const char *s, size_t n) {
    tok_t *t = b->t;
    if (id < 0 || id >= t->n_vocab) return dl_seterr(DL_EFORMAT, "tokenizer: token id %d out of range", id);
    if (t->tok[id].s) return dl_seterr(DL_EFORMAT, "tokenizer: duplicate token id %d", id);
    char *raw = malloc(n + 1);
    if (!raw) return dl_seterr(DL_ENOMEM, "tokenizer: token");
    long r = unmap_bytes(b->byte_of_cp, s, n, raw);
    if (r < 0) { memcpy(raw, s, n); r = (long)n; } /* not byte-level (e.g. a special token) */
    raw[r] = 0;
    t->tok[id].s = raw;
    t->tok[id].len = (uint32_t)r;
    t->tok[id].in_bpe = 1;
    return 0;
}

static int builder_add_added(builder_t *b, int32_t id, const char *s, size_t n, int special) {
    tok_t *t = b->t;
    if (id < 0 || id >= t->n_vocab) return dl_seterr(DL_EFORMAT, "tokenizer: added token id %d out of range", id);
    if (n == 0) return 0;
    added_t *na = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *na);
    if (!na) return dl_seterr(DL_ENOMEM, "tokenizer: added tokens");
    t->added = na;
    char *c = malloc(n + 1);
    if (!c) return dl_seterr(DL_ENOMEM, "tokenizer: added token");
    memcpy(c, s, n);
    c[n] = 0;
    t->added[t->n_added++] = (added_t){c, (uint32_t)n, id, special};
    t->added_first[(unsigned char)s[0]] = 1;
    tok_entry_t *e = &t->tok[id];
    if (!e->s) {
        e->s = strdup(c);
        if (!e->s) return dl_seterr(DL_ENOMEM, "tokenizer: added token");
        e->len = (uint32_t)n;
    }
    e->added = 1;
    e->special = (uint8_t)special;
    return 0;
}

static int builder_add_regex(builder_t *b, const char *src) {
    tok_t *t = b->t;
    if (t->n_rx >= TOK_MAX_STAGES) return dl_seterr(DL_ENOTSUP, "tokenizer: more than %d pre-tokenizer splits", TOK_MAX_STAGES);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return dl_seterr(DL_ENOTSUP, "tokenizer: pre-tokenizer regex at %zu: %s: %s", (size_t)eo, msg, src);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
    t->rx[t->n_rx] = re;
    t->rx_src[t->n_rx] = strdup(src);
    if (!t->rx_src[t->n_rx]) { pcre2_code_free(re); return dl_seterr(DL_ENOMEM, "tokenizer: regex"); }
    t->n_rx++;
    return 0;
}

/* Fills byte ids, vocab map, fingerprint; every id must have a string. */
static int builder_finish(builder_t *b) {
    tok_t *t = b->t;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!t->tok[i].s) {
            t->tok[i].s = strdup("");
            if (!t->tok[i].s) return dl_seterr(DL_ENOMEM, "tokenizer");
        }
    }
    for (int i = 0; i < 256; i++) {
        char c = (char)i;
        t->byte_id[i] = strmap_get(t, &c, 1);
    }
    /* longest added tokens first, so the first match at a position is the longest */
    for (int i = 1; i < t->n_added; i++)
        for (int j = i; j > 0 && t->added[j].len > t->added[j - 1].len; j--) {
            added_t x = t->added[j]; t->added[j] = t->added[j - 1]; t->added[j - 1] = x;
        }
    uint64_t h = FNV0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        h = fnv1a(t->tok[i].s, t->tok[i].len + 1, h);
        h = fnv1a(&t->tok[i].added, 1, h);
        h = fnv1a(&t->tok[i].special, 1, h);
    }
    for (uint64_t i = 0; i <= t->merges.mask; i++) /* order-independent: xor of entries */
        if (t->merges.e[i].rank >= 0) {
            const pair_ent_t *e = &t->merges.e[i];
            h ^= mix64(e->key ^ mix64(((uint64_t)(uint32_t)e->rank << 32) | (uint32_t)e->id));
        }
    for (int i = 0; i < t->n_rx; i++) h = fnv1a(t->rx_src[i], strlen(t->rx_src[i]) + 1, h);
    h = fnv1a(&t->ignore_merges, sizeof t->ignore_merges, h);
    h = fnv1a(&t->nfc, sizeof t->nfc, h);
    t->fingerprint = h;
    /* the known regexes depend on non-ASCII text only through \p{L}, \p{N}, \s
     * (see uclass.h); a custom one keeps PCRE2's own tables */
    static const char *const known[] = {RX_GPT2, RX_LLAMA3, RX_QWEN2, RX_DIGIT, "\\p{N}+"};
    t->premap = 1;
    for (int i = 0; i < t->n_rx; i++) {
        int k = 0;
        while (k < 5 && strcmp(t->rx_src[i], known[k])) k++;
        if (k == 5) t->premap = 0;
    }
    return 0;
}

static int set_pre(builder_t *b, const char *name) {
    tok_t *t = b->t;
    snprintf(t->pre_name, sizeof t->pre_name, "%s", name);
    if (!strcmp(name, "gpt2") || !strcmp(name, "default")) return builder_add_regex(b, RX_GPT2);
    if (!strcmp(name, "llama3") || !strcmp(name, "llama-bpe")) {
        snprintf(t->pre_name, sizeof t->pre_name, "llama3");
        t->ignore_merges = 1; /* llama.cpp: LLAMA3 pre sets ignore_merges like the HF json */
        return builder_add_regex(b, RX_LLAMA3);
    }
    if (!strcmp(name, "qwen2")) {
        t->nfc = 1; /* as Qwen2/3's tokenizer.json (llama.cpp does not normalize) */
        return builder_add_regex(b, RX_QWEN2);
    }
    if (!strcmp(name, "smollm")) {
        DL_TRY(builder_add_regex(b, RX_DIGIT));
        return builder_add_regex(b, RX_GPT2);
    }
    return dl_seterr(DL_ENOTSUP, "tokenizer: pre-tokenizer '%s' (known: gpt2, llama-bpe, qwen2, smollm)", name);
}

/* ---- tokenizer.json ---------------------------------------------------------- */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { dl_seterr(DL_EIO, "%s: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0 || st.st_size > (1l << 31)) {
        fclose(f);
        dl_seterr(DL_EIO, "%s: bad size", path);
        return NULL;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) { fclose(f); dl_seterr(DL_ENOMEM, "%s: %lld bytes", path, (long long)st.st_size); return NULL; }
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    if (n != (size_t)st.st_size) { free(buf); dl_seterr(DL_EIO, "%s: short read", path); return NULL; }
    buf[n] = 0;
    *len = n;
    return buf;
}

static int json_pre(builder_t *b, const cJSON *pt, const char *path) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(type)) return dl_seterr(DL_EFORMAT, "%s: pre_tokenizer.type missing", path);
    const char *ty = type->valuestring;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        if (!cJSON_IsArray(arr)) return dl_seterr(DL_EFORMAT, "%s: pre_tokenizer.pretokenizers missing", path);
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) DL_TRY(json_pre(b, it, path));
        return 0;
    }
    if (!strcmp(ty, "ByteLevel")) {
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(pt, "use_regex");
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(pt, "add_prefix_space");
        if (cJSON_IsTrue(ap)) return dl_seterr(DL_ENOTSUP, "%s: ByteLevel add_prefix_space=true", path);
        if (!ur || cJSON_IsTrue(ur)) return builder_add_regex(b, RX_GPT2);
        return 0;
    }
    if (!strcmp(ty, "Digits")) {
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "individual_digits")))
            return builder_add_regex(b, "\\p{N}+");
        return builder_add_regex(b, RX_DIGIT);
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
        const cJSON *inv = cJSON_GetObjectItemCaseSensitive(pt, "invert");
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") || cJSON_IsTrue(inv))
            return dl_seterr(DL_ENOTSUP, "%s: Split supported only with behavior Isolated, invert false", path);
        const cJSON *rx = pat ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
        if (!cJSON_IsString(rx)) return dl_seterr(DL_ENOTSUP, "%s: Split pattern must be a Regex", path);
        return builder_add_regex(b, rx->valuestring);
    }
    return dl_seterr(DL_ENOTSUP, "%s: pre_tokenizer type '%s'", path, ty);
}

static void tok_free(tok_t *t) {
    if (!t) return;
    if (t->tok)
        for (int32_t i = 0; i < t->n_vocab; i++) free(t->tok[i].s);
    free(t->tok);
    free(t->vocab.slot);
    free(t->merges.e);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].s);
    free(t->added);
    for (int i = 0; i < t->n_rx; i++) { pcre2_code_free(t->rx[i]); free(t->rx_src[i]); }
    free(t->chat_template);
    free(t);
}

void tok_destroy(tok_t **t) {
    if (!t || !*t) return;
    tok_free(*t);
    *t = NULL;
}

static int json_load(const char *path, const cJSON *root, tok_t **out) {
    builder_t b = {0};
    int rc = 0;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *mtype = model ? cJSON_GetObjectItemCaseSensitive(model, "type") : NULL;
    if (!model || (mtype && (!cJSON_IsString(mtype) || strcmp(mtype->valuestring, "BPE"))))
        return dl_seterr(DL_ENOTSUP, "%s: model.type must be BPE", path);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return dl_seterr(DL_EFORMAT, "%s: model.vocab / model.merges missing", path);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return dl_seterr(DL_ENOTSUP, "%s: byte_fallback BPE (sentencepiece style)", path);
    int32_t maxid = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1e8)
            return dl_seterr(DL_EFORMAT, "%s: model.vocab['%s']: bad id", path, it->string);
        if (it->valueint > maxid) maxid = it->valueint;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e8)
            return dl_seterr(DL_EFORMAT, "%s: added_tokens: bad id", path);
        if (id->valueint > maxid) maxid = id->valueint;
    }
    if (maxid < 0) return dl_seterr(DL_EFORMAT, "%s: empty vocab", path);
    if ((rc = builder_init(&b, maxid + 1)) < 0) goto fail;
    tok_t *t = b.t;
    cJSON_ArrayForEach(it, vocab)
        if ((rc = builder_set_token(&b, it->valueint, it->string, strlen(it->string))) < 0) goto fail;
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "special");
        if (!cJSON_IsString(c)) { rc = dl_seterr(DL_EFORMAT, "%s: added_tokens: content missing", path); goto fail; }
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "lstrip")) ||
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "rstrip")) ||
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "single_word"))) {
            rc = dl_seterr(DL_ENOTSUP, "%s: added token '%s' with lstrip/rstrip/single_word", path, c->valuestring);
            goto fail;
        }
        if ((rc = builder_add_added(&b, id->valueint, c->valuestring, strlen(c->valuestring), cJSON_IsTrue(sp))) < 0)
            goto fail;
    }
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->tok[i].in_bpe) strmap_put(t, i);
    if ((rc = pairmap_init(&t->merges, (uint64_t)cJSON_GetArraySize(merges) + 1)) < 0) goto fail;
    int32_t rank = 0;
    char *tmp = NULL;
    size_t tmpcap = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *bb;
        size_t la, lb;
        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring + 1, ' '); /* first char may itself be ' '? never: 'Ġ' */
            if (!sp) { rc = dl_seterr(DL_EFORMAT, "%s: merges[%d]: no space", path, rank); goto mfail; }
            a = it->valuestring; la = (size_t)(sp - a); bb = sp + 1; lb = strlen(bb);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring; la = strlen(a);
            bb = cJSON_GetArrayItem(it, 1)->valuestring; lb = strlen(bb);
        } else {
            rc = dl_seterr(DL_EFORMAT, "%s: merges[%d]: expected \"a b\" or [a, b]", path, rank);
            goto mfail;
        }
        if (la + lb + 1 > tmpcap) {
            tmpcap = (la + lb + 1) * 2;
            char *n = realloc(tmp, tmpcap);
            if (!n) { rc = dl_seterr(DL_ENOMEM, "tokenizer"); goto mfail; }
            tmp = n;
        }
        long ra = unmap_bytes(b.byte_of_cp, a, la, tmp);
        long rb = ra < 0 ? -1 : unmap_bytes(b.byte_of_cp, bb, lb, tmp + ra);
        if (ra < 0 || rb < 0) { rc = dl_seterr(DL_EFORMAT, "%s: merges[%d]: not byte-level", path, rank); goto mfail; }
        int32_t ia = strmap_get(t, tmp, (size_t)ra), ib = strmap_get(t, tmp + ra, (size_t)rb);
        int32_t im = strmap_get(t, tmp, (size_t)(ra + rb));
        if (ia < 0 || ib < 0 || im < 0) {
            rc = dl_seterr(DL_EFORMAT, "%s: merges[%d]: token not in vocab", path, rank);
            goto mfail;
        }
        pairmap_put(&t->merges, ia, ib, rank, im);
        rank++;
    }
    free(tmp);
    tmp = NULL;
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        const cJSON *nt = cJSON_GetObjectItemCaseSensitive(norm, "type");
        if (!cJSON_IsString(nt) || strcmp(nt->valuestring, "NFC")) {
            rc = dl_seterr(DL_ENOTSUP, "%s: normalizer '%s'", path, cJSON_IsString(nt) ? nt->valuestring : "?");
            goto fail;
        }
        t->nfc = 1;
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!pt || cJSON_IsNull(pt)) { rc = dl_seterr(DL_ENOTSUP, "%s: no pre_tokenizer (not byte-level BPE)", path); goto fail; }
    if ((rc = json_pre(&b, pt, path)) < 0) goto fail;
    /* name the regex set for humans */
    snprintf(t->pre_name, sizeof t->pre_name, "custom");
    if (t->n_rx == 1 && !strcmp(t->rx_src[0], RX_GPT2)) snprintf(t->pre_name, sizeof t->pre_name, "gpt2");
    if (t->n_rx == 1 && !strcmp(t->rx_src[0], RX_QWEN2)) snprintf(t->pre_name, sizeof t->pre_name, "qwen2");
    if (t->n_rx == 1 && !strcmp(t->rx_src[0], RX_LLAMA3)) snprintf(t->pre_name, sizeof t->pre_name, "llama3");
    if (t->n_rx == 2 && !strcmp(t->rx_src[0], RX_DIGIT) && !strcmp(t->rx_src[1], RX_GPT2))
        snprintf(t->pre_name, sizeof t->pre_name, "smollm");
    if ((rc = builder_finish(&b)) < 0) goto fail;
    *out = t;
    return 0;
mfail:
    free(tmp);
fail:
    tok_free(b.t);
    return rc;
}

static void load_config(tok_t *t, const char *json_path) {
    /* tokenizer_config.json next to tokenizer.json: chat_template, bos/eos/pad names */
    char p[4096];
    const char *slash = strrchr(json_path, '/');
    int dn = slash ? (int)(slash - json_path + 1) : 0;
    if (snprintf(p, sizeof p, "%.*stokenizer_config.json", dn, json_path) >= (int)sizeof p) return;
    size_t n;
    char *s = slurp(p, &n);
    if (!s) { dl_clearerr(); return; }
    cJSON *root = cJSON_ParseWithLength(s, n);
    free(s);
    if (!root) return;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (cJSON_IsString(ct)) t->chat_template = strdup(ct->valuestring);
    static const char *keys[3] = {"bos_token", "eos_token", "pad_token"};
    int32_t *dst[3] = {&t->bos, &t->eos, &t->pad};
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(v)) *dst[i] = tok_token_id(t, v->valuestring);
    }
    cJSON_Delete(root);
}

int tok_load_json(const char *path, tok_t **out) {
    size_t n;
    char *s = slurp(path, &n);
    if (!s) return DL_EIO;
    cJSON *root = cJSON_ParseWithLength(s, n);
    if (!root) {
        const char *ep = cJSON_GetErrorPtr();
        long off = ep ? (long)(ep - s) : -1;
        free(s);
        return dl_seterr(DL_EFORMAT, "%s: invalid JSON near byte %ld", path, off);
    }
    free(s);
    int rc = json_load(path, root, out);
    cJSON_Delete(root);
    if (rc == 0) load_config(*out, path);
    return rc;
}

/* ---- GGUF -------------------------------------------------------------------- */

int tok_load_gguf(const char *path, tok_t **out) {
    gguf_t *g = NULL;
    builder_t b = {0};
    gguf_str_t *strs = NULL;
    int32_t *types = NULL;
    char *tmp = NULL;
    int rc = gguf_open(path, &g);
    if (rc < 0) return rc;
    gguf_str_t model, pre;
    if ((rc = gguf_get_str(g, "tokenizer.ggml.model", &model)) < 0) goto done;
    if (model.len != 4 || memcmp(model.data, "gpt2", 4)) {
        rc = dl_seterr(DL_ENOTSUP, "%s: tokenizer.ggml.model '%.*s' (only gpt2 byte-level BPE)", path,
                       (int)model.len, model.data);
        goto done;
    }
    const gguf_kv_t *kt = gguf_find_kv(g, "tokenizer.ggml.tokens");
    const gguf_kv_t *km = gguf_find_kv(g, "tokenizer.ggml.merges");
    if (!kt || !km || kt->type != GGUF_TYPE_ARRAY || km->type != GGUF_TYPE_ARRAY || kt->arr_len == 0 ||
        kt->arr_len > (1u << 26) || km->arr_len > (1u << 26)) {
        rc = dl_seterr(DL_EFORMAT, "%s: tokenizer.ggml.tokens / merges missing or bad", path);
        goto done;
    }
    int32_t nv = (int32_t)kt->arr_len;
    uint64_t nm = km->arr_len;
    strs = malloc((nm > (uint64_t)nv ? nm : (uint64_t)nv) * sizeof *strs);
    types = malloc((size_t)nv * sizeof *types);
    if (!strs || !types) { rc = dl_seterr(DL_ENOMEM, "%s: vocab arrays", path); goto done; }
    if ((rc = gguf_get_str_array(g, "tokenizer.ggml.tokens", strs, (uint64_t)nv)) < 0) goto done;
    if (gguf_find_kv(g, "tokenizer.ggml.token_type")) {
        if ((rc = gguf_get_i32_array(g, "tokenizer.ggml.token_type", types, (uint64_t)nv)) < 0) goto done;
    } else {
        for (int32_t i = 0; i < nv; i++) types[i] = 1;
    }
    if ((rc = builder_init(&b, nv)) < 0) goto done;
    tok_t *t = b.t;
    for (int32_t i = 0; i < nv; i++) {
        /* llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte */
        if (types[i] == 3 || types[i] == 4) {
            if ((rc = builder_add_added(&b, i, strs[i].data, strs[i].len, types[i] == 3)) < 0) goto done;
        } else if ((rc = builder_set_token(&b, i, strs[i].data, strs[i].len)) < 0) {
            goto done;
        }
    }
    for (int32_t i = 0; i < nv; i++)
        if (t->tok[i].in_bpe) strmap_put(t, i);
    if ((rc = gguf_get_str_array(g, "tokenizer.ggml.merges", strs, nm)) < 0) goto done;
    if ((rc = pairmap_init(&t->merges, nm + 1)) < 0) goto done;
    size_t tmpcap = 0;
    for (uint64_t r = 0; r < nm; r++) {
        const char *s = strs[r].data;
        size_t n = strs[r].len, sp = 1;
        while (sp < n && s[sp] != ' ') sp++;
        if (sp >= n) { rc = dl_seterr(DL_EFORMAT, "%s: tokenizer.ggml.merges[%llu]: no space", path, (unsigned long long)r); goto done; }
        if (n + 1 > tmpcap) {
            tmpcap = 2 * n + 16;
            char *nt = realloc(tmp, tmpcap);
            if (!nt) { rc = dl_seterr(DL_ENOMEM, "tokenizer"); goto done; }
            tmp = nt;
        }
        long ra = unmap_bytes(b.byte_of_cp, s, sp, tmp);
        long rb = ra < 0 ? -1 : unmap_bytes(b.byte_of_cp, s + sp + 1, n - sp - 1, tmp + ra);
        int32_t ia = -1, ib = -1, im = -1;
        if (ra >= 0 && rb >= 0) {
            ia = strmap_get(t, tmp, (size_t)ra);
            ib = strmap_get(t, tmp + ra, (size_t)rb);
            im = strmap_get(t, tmp, (size_t)(ra + rb));
        }
        if (ia < 0 || ib < 0 || im < 0) {
            rc = dl_seterr(DL_EFORMAT, "%s: tokenizer.ggml.merges[%llu] '%.*s': token not in vocab", path,
                           (unsigned long long)r, (int)n, s);
            goto done;
        }
        pairmap_put(&t->merges, ia, ib, (int32_t)r, im);
    }
    if (gguf_get_str(g, "tokenizer.ggml.pre", &pre) == 0) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(pre.len < 63 ? pre.len : 63), pre.data);
        if ((rc = set_pre(&b, name)) < 0) goto done;
    } else {
        dl_clearerr();
        if ((rc = set_pre(&b, "gpt2")) < 0) goto done;
    }
    uint64_t v;
    if (gguf_get_u64(g, "tokenizer.ggml.bos_token_id", &v) == 0 && v < (uint64_t)nv) t->bos = (int32_t)v;
    if (gguf_get_u64(g, "tokenizer.ggml.eos_token_id", &v) == 0 && v < (uint64_t)nv) t->eos = (int32_t)v;
    if (gguf_get_u64(g, "tokenizer.ggml.padding_token_id", &v) == 0 && v < (uint64_t)nv) t->pad = (int32_t)v;
    gguf_str_t ct;
    if (gguf_get_str(g, "tokenizer.chat_template", &ct) == 0) {
        t->chat_template = strndup(ct.data, ct.len);
        if (!t->chat_template) { rc = dl_seterr(DL_ENOMEM, "tokenizer"); goto done; }
    }
    dl_clearerr();
    if ((rc = builder_finish(&b)) < 0) goto done;
    *out = t;
    b.t = NULL;
    rc = 0;
done:
    if (rc < 0) dl_wraperr(rc, "%s", rc == DL_ENOTSUP || rc == DL_EFORMAT ? "tokenizer" : "tokenizer (gguf)");
    tok_free(b.t);
    free(strs);
    free(types);
    free(tmp);
    gguf_close(&g);
    return rc;
}

int tok_load(const char *path, tok_t **out) {
    size_t n = strlen(path);
    struct stat st;
    if (stat(path, &st) != 0) return dl_seterr(DL_ENOENT, "tokenizer: %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        char p[4096];
        if (snprintf(p, sizeof p, "%s/tokenizer.json", path) >= (int)sizeof p)
            return dl_seterr(DL_ERANGE, "path too long: %s", path);
        return tok_load_json(p, out);
    }
    if (n > 5 && !strcmp(path + n - 5, ".gguf")) return tok_load_gguf(path, out);
    return tok_load_json(path, out);
}

/* ---- encode ------------------------------------------------------------------ */

void tok_ids_free(tok_ids_t *v) {
    free(v->ids);
    free(v->offs);
    v->ids = NULL;
    v->offs = NULL;
    v->n = v->cap = 0;
}

int tok_ids_reserve(tok_ids_t *v, size_t extra) {
    if (v->n + extra <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < v->n + extra) cap *= 2;
    int32_t *ni = realloc(v->ids, cap * sizeof *ni);
    if (!ni) return dl_seterr(DL_ENOMEM, "tokenizer: %zu ids", cap);
    v->ids = ni;
    if (v->want_offsets) {
        uint32_t *no = realloc(v->offs, cap * sizeof *no);
        if (!no) return dl_seterr(DL_ENOMEM, "tokenizer: %zu offsets", cap);
        v->offs = no;
    }
    v->cap = cap;
    return 0;
}

int tok_ids_push(tok_ids_t *v, int32_t id, uint32_t off) {
    if (v->n == v->cap) DL_TRY(tok_ids_reserve(v, 1));
    if (v->want_offsets && !v->offs) {
        v->offs = malloc(v->cap * sizeof *v->offs);
        if (!v->offs) return dl_seterr(DL_ENOMEM, "tokenizer: offsets");
    }
    v->ids[v->n] = id;
    if (v->want_offsets) v->offs[v->n] = off;
    v->n++;
    return 0;
}

typedef struct { int32_t id; int32_t prev, next; uint32_t start; } sym_t;
typedef struct { int32_t rank; int32_t pos; int32_t a, b; } cand_t;

typedef struct {
    const tok_t *t;
    tok_ids_t *out;
    pcre2_match_data *md[TOK_MAX_STAGES];
    char *map;              /* uclass_premap'd text (map_cap bytes) */
    size_t map_cap;
    sym_t *sym;
    cand_t *heap;
    size_t sym_cap, heap_cap;
} enc_t;

static inline int cand_less(const cand_t *x, const cand_t *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(cand_t *h, size_t *n, cand_t c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand_t heap_pop(cand_t *h, size_t *n) {
    cand_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cand_t *best = &last;
        if (l < *n && cand_less(&h[l], best)) { m = l; best = &h[l]; }
        if (r < *n && cand_less(&h[r], best)) { m = r; }
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static int bpe_piece(enc_t *e, const char *s, size_t n, uint32_t off) {
    const tok_t *t = e->t;
    if (n == 0) return 0;
    if (n == 1 || t->ignore_merges) {
        int32_t id = strmap_get(t, s, n);
        if (id >= 0) return tok_ids_push(e->out, id, off);
    }
    if (n > e->sym_cap) {
        size_t cap = n * 2;
        sym_t *ns = realloc(e->sym, cap * sizeof *ns);
        if (!ns) return dl_seterr(DL_ENOMEM, "tokenizer: %zu symbols", cap);
        e->sym = ns;
        cand_t *nh = realloc(e->heap, 2 * cap * sizeof *nh);
        if (!nh) return dl_seterr(DL_ENOMEM, "tokenizer: heap");
        e->heap = nh;
        e->sym_cap = cap;
        e->heap_cap = 2 * cap;
    }
    sym_t *sy = e->sym;
    for (size_t i = 0; i < n; i++)
        sy[i] = (sym_t){t->byte_id[(unsigned char)s[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, (uint32_t)i};
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const pair_ent_t *p = pairmap_get(&t->merges, sy[i].id, sy[i + 1].id);
        if (p) heap_push(e->heap, &hn, (cand_t){p->rank, (int32_t)i, sy[i].id, sy[i + 1].id});
    }
    while (hn > 0) {
        cand_t c = heap_pop(e->heap, &hn);
        sym_t *l = &sy[c.pos];
        if (l->id != c.a || l->next < 0) continue;
        sym_t *r = &sy[l->next];
        if (r->id != c.b) continue;
        const pair_ent_t *p = pairmap_get(&t->merges, c.a, c.b);
        l->id = p->id;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = c.pos;
        r->id = -2; /* dead */
        /* heap never exceeds 3n: n-1 initial pairs, at most 2 pushes per merge */
        if (l->prev >= 0) {
            const pair_ent_t *q = pairmap_get(&t->merges, sy[l->prev].id, l->id);
            if (q) heap_push(e->heap, &hn, (cand_t){q->rank, l->prev, sy[l->prev].id, l->id});
        }
        if (l->next >= 0) {
            const pair_ent_t *q = pairmap_get(&t->merges, l->id, sy[l->next].id);
            if (q) heap_push(e->heap, &hn, (cand_t){q->rank, c.pos, l->id, sy[l->next].id});
        }
    }
    for (int32_t i = 0; i >= 0; i = sy[i].next) {
        if (sy[i].id >= 0) DL_TRY(tok_ids_push(e->out, sy[i].id, off + sy[i].start));
        else if (!e->out->n_dropped++) e->out->dropped_byte = (unsigned char)s[sy[i].start]; /* no byte token */
    }
    return 0;
}

/* 1: valid UTF-8 (2: and all ASCII), 0: invalid. */
static int utf8_valid(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0x80) i++;
    if (i == n) return 2;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int l = uclass_utf8_dec((const unsigned char *)s + i, n - i, &cp);
        if (!l) return 0;
        i += (size_t)l;
    }
    return 1;
}

/* Splits s[0..n) with regex stage k ("Isolated": matches and gaps are pieces),
 * recursing into stage k+1, BPE at the end. The regex runs on m, s itself or its
 * uclass_premap (same length, same boundaries); BPE on s. */
static int split_stage(enc_t *e, int k, const char *s, const char *m, size_t n, uint32_t off) {
    const tok_t *t = e->t;
    if (k >= t->n_rx || n == 0) return bpe_piece(e, s, n, off);
    size_t pos = 0, last = 0;
    uint32_t opts = PCRE2_NO_UTF_CHECK;
    while (pos <= n) {
        int rc = pcre2_match(t->rx[k], (PCRE2_SPTR)m, n, pos, opts, e->md[k], NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(t->rx[k], (PCRE2_SPTR)m, n, pos, opts | PCRE2_NO_JIT, e->md[k], NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return dl_seterr(DL_EFORMAT, "tokenizer: regex match: %s", msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md[k]);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step one UTF-8 char */
            if (ms >= n) break;
            pos = ms + 1;
            while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (ms > last) DL_TRY(split_stage(e, k + 1, s + last, m + last, ms - last, off + (uint32_t)last));
        DL_TRY(split_stage(e, k + 1, s + ms, m + ms, me - ms, off + (uint32_t)ms));
        last = pos = me;
    }
    if (last < n) DL_TRY(split_stage(e, k + 1, s + last, m + last, n - last, off + (uint32_t)last));
    return 0;
}

/* Pre-tokenizes valid UTF-8 s[0..n): on its uclass_premap when t->premap. */
static int split_text(enc_t *e, const char *s, size_t n, uint32_t off, int ascii) {
    if (!e->t->premap || ascii) return split_stage(e, 0, s, s, n, off);
    if (n > e->map_cap) {
        char *nm = realloc(e->map, n);
        if (!nm) return dl_seterr(DL_ENOMEM, "tokenizer: %zu bytes", n);
        e->map = nm;
        e->map_cap = n;
    }
    return split_stage(e, 0, s, uclass_premap(s, n, e->map) ? e->map : s, n, off);
}

/* Plain text (no added tokens inside). */
static int encode_plain(enc_t *e, const char *s, size_t n, uint32_t off) {
    if (n == 0) return 0;
    int valid = utf8_valid(s, n);
    if (!valid) return bpe_piece(e, s, n, off); /* regex needs valid UTF-8 */
    if (!e->t->nfc) return split_text(e, s, n, off, valid == 2);
    char *ns;
    size_t nn;
    uint32_t *map = NULL;
    int rc = nfc_normalize(s, n, &ns, &nn, e->out->want_offsets ? &map : NULL);
    if (rc < 0) return rc;
    if (!ns) return split_text(e, s, n, off, valid == 2);
    size_t first = e->out->n;
    rc = split_text(e, ns, nn, 0, 0);
    if (rc == 0 && map) /* offsets back to the caller's (unnormalized) text */
        for (size_t i = first; i < e->out->n; i++) e->out->offs[i] = off + map[e->out->offs[i]];
    free(ns);
    free(map);
    return rc;
}

int tok_encode(const tok_t *t, const char *text, size_t len, int parse_special, uint32_t base_off,
               tok_ids_t *out) {
    enc_t e = {.t = t, .out = out};
    int rc = 0;
    for (int k = 0; k < t->n_rx; k++) {
        e.md[k] = pcre2_match_data_create_from_pattern(t->rx[k], NULL);
        if (!e.md[k]) { rc = dl_seterr(DL_ENOMEM, "tokenizer: match data"); goto done; }
    }
    if ((rc = tok_ids_reserve(out, len / 3 + 8)) < 0) goto done;
    size_t last = 0;
    if (parse_special && t->n_added) {
        for (size_t i = 0; i < len; i++) {
            if (!t->added_first[(unsigned char)text[i]]) continue;
            const added_t *hit = NULL;
            for (int a = 0; a < t->n_added; a++) {
                const added_t *ad = &t->added[a];
                if (ad->len <= len - i && ad->s[0] == text[i] && !memcmp(ad->s, text + i, ad->len)) {
                    hit = ad;
                    break;
                }
            }
            if (!hit) continue;
            if ((rc = encode_plain(&e, text + last, i - last, base_off + (uint32_t)last)) < 0) goto done;
            if ((rc = tok_ids_push(out, hit->id, base_off + (uint32_t)i)) < 0) goto done;
            i += hit->len - 1;
            last = i + 1;
        }
    }
    rc = encode_plain(&e, text + last, len - last, base_off + (uint32_t)last);
done:
    for (int k = 0; k < t->n_rx; k++) pcre2_match_data_free(e.md[k]);
    free(e.sym);
    free(e.heap);
    free(e.map);
    return rc;
}

int tok_decode(const tok_t *t, const int32_t *ids, size_t n, int skip_special, char **out, size_t *out_len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) return dl_seterr(DL_ERANGE, "tok_decode: id %d at %zu out of [0, %d)", ids[i], i, t->n_vocab);
        if (skip_special && t->tok[ids[i]].special) continue;
        total += t->tok[ids[i]].len;
    }
    char *s = malloc(total + 1);
    if (!s) return dl_seterr(DL_ENOMEM, "tok_decode: %zu bytes", total);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const tok_entry_t *e = &t->tok[ids[i]];
        if (skip_special && e->special) continue;
        memcpy(s + o, e->s, e->len);
        o += e->len;
    }
    s[o] = 0;
    *out = s;
    if (out_len) *out_len = o;
    return 0;
}

int32_t tok_n_vocab(const tok_t *t) { return t->n_vocab; }

int32_t tok_token_id(const tok_t *t, const char *s) {
    size_t n = strlen(s);
    for (int a = 0; a < t->n_added; a++)
        if (t->added[a].len == n && !memcmp(t->added[a].s, s, n)) return t->added[a].id;
    return strmap_get(t, s, n);
}

const char *tok_token_bytes(const tok_t *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->tok[id].len;
    return t->tok[id].s;
}

int tok_is_special(const tok_t *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->tok[id].special; }
int32_t tok_bos_id(const tok_t *t) { return t->bos; }
int32_t tok_eos_id(const tok_t *t) { return t->eos; }
int32_t tok_pad_id(const tok_t *t) { return t->pad; }
const char *tok_chat_template(const tok_t *t) { return t->chat_template; }
const char *tok_pre_name(const tok_t *t) { return t->pre_name; }
uint64_t tok_fingerprint(const tok_t *t) { return t->fingerprint; }
