/* Streaming dataset readers (see dataset.h). zlib's gzread reads plain files
 * transparently, so one code path serves .jsonl and .jsonl.gz. */
#include "common/data/dataset.h"

#include "common/base/err.h"
#include "common/base/log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define DS_READ_CHUNK (256u << 10)
#define DS_MAX_WARN 10u /* bad lines printed one by one; the rest are counted at close */
#define DS_MAX_RECORD (1u << 30) /* one record above 1 GiB is a broken file, not data */

struct ds_reader {
    char *path;
    ds_opts_t opts;
    gzFile gz;
    unsigned char *buf;       /* read buffer */
    size_t pos, end;
    int eof;
    int array;                /* 1: one JSON array file */
    int array_done;
    uint64_t line;            /* current line (1-based) at buf[pos] */
    uint64_t bytes;
    uint64_t skipped;
    uint64_t dropped_lines;   /* lines whose sample lost bytes the tokenizer cannot encode */
    char *rec;                /* current record */
    size_t rec_len, rec_cap;
};

static int fill(ds_reader_t *r) {
    if (r->eof) return 0;
    if (r->pos < r->end) memmove(r->buf, r->buf + r->pos, r->end - r->pos);
    r->end -= r->pos;
    r->pos = 0;
    int n = gzread(r->gz, r->buf + r->end, (unsigned)(DS_READ_CHUNK - r->end));
    if (n < 0) {
        int ze;
        const char *m = gzerror(r->gz, &ze);
        return dl_seterr(DL_EIO, "%s: read: %s", r->path, ze == Z_ERRNO ? strerror(errno) : m);
    }
    if (n == 0) r->eof = 1;
    r->end += (size_t)n;
    r->bytes += (uint64_t)n;
    return n;
}

static int rec_put(ds_reader_t *r, const void *p, size_t n) {
    if (r->rec_len + n + 1 > r->rec_cap) {
        if (r->rec_len + n + 1 > DS_MAX_RECORD)
            return dl_seterr(DL_EFORMAT, "%s:%llu: record longer than %u bytes", r->path,
                             (unsigned long long)r->line, DS_MAX_RECORD);
        size_t cap = r->rec_cap ? r->rec_cap : 4096;
        while (cap < r->rec_len + n + 1) cap *= 2;
        char *nr = realloc(r->rec, cap);
        if (!nr) return dl_seterr(DL_ENOMEM, "%s: record buffer %zu", r->path, cap);
        r->rec = nr;
        r->rec_cap = cap;
    }
    memcpy(r->rec + r->rec_len, p, n);
    r->rec_len += n;
    r->rec[r->rec_len] = 0;
    return 0;
}

int ds_open(const char *path, const ds_opts_t *opts, ds_reader_t **out) {
    ds_reader_t *r = calloc(1, sizeof *r);
    if (!r) return dl_seterr(DL_ENOMEM, "ds_open");
    r->path = strdup(path);
    r->buf = malloc(DS_READ_CHUNK);
    if (!r->path || !r->buf) { ds_close(&r); return dl_seterr(DL_ENOMEM, "ds_open"); }
    if (opts) r->opts = *opts;
    if (r->opts.format == DS_FIELDS && (!r->opts.prompt_field || !r->opts.response_field)) {
        ds_close(&r);
        return dl_seterr(DL_EINVAL, "dataset format 'fields' needs --prompt-field and --response-field");
    }
    size_t plen = strlen(path);
    if (plen > 3 && !strcmp(path + plen - 3, ".gz")) {
        /* gzread would read a non-gzip file as plain text: a .gz name that is not
         * gzip is a mistake worth stopping on (magic 1f 8b, RFC 1952) */
        FILE *gf = fopen(path, "rb");
        if (gf) {
            unsigned char mg[2] = {0, 0};
            size_t k = fread(mg, 1, 2, gf);
            fclose(gf);
            if (k < 2 || mg[0] != 0x1f || mg[1] != 0x8b) {
                ds_close(&r);
                return dl_seterr(DL_EFORMAT, "%s: not a gzip file (name ends in .gz)", path);
            }
        }
    }
    r->gz = gzopen(path, "rb");
    if (!r->gz) {
        int e = errno;
        ds_close(&r);
        return dl_seterr(e == ENOENT ? DL_ENOENT : DL_EIO, "%s: %s", path, strerror(e ? e : EIO));
    }
    gzbuffer(r->gz, DS_READ_CHUNK);
    r->line = 1;
    /* sniff: first non-blank byte '[' -> JSON array */
    for (;;) {
        while (r->pos < r->end) {
            unsigned char c = r->buf[r->pos];
            if (c == '\n') { r->line++; r->pos++; }
            else if (c == ' ' || c == '\t' || c == '\r') r->pos++;
            else if (c == 0xEF && r->end - r->pos >= 3 && r->buf[r->pos + 1] == 0xBB && r->buf[r->pos + 2] == 0xBF)
                r->pos += 3; /* UTF-8 BOM */
            else {
                if (c == '[') { r->array = 1; r->pos++; }
                *out = r;
                return 0;
            }
        }
        int n = fill(r);
        if (n < 0) { ds_close(&r); return n; }
        if (n == 0) { *out = r; return 0; } /* empty file */
    }
}

void ds_close(ds_reader_t **rp) {
    if (!rp || !*rp) return;
    ds_reader_t *r = *rp;
    if (r->gz) gzclose(r->gz);
    if (r->skipped > DS_MAX_WARN)
        log_warn("%s: ... %llu more bad lines (not shown)", r->path,
                 (unsigned long long)(r->skipped - DS_MAX_WARN));
    if (r->dropped_lines > DS_MAX_WARN)
        log_warn("%s: ... %llu more lines with bytes the tokenizer cannot encode (not shown)", r->path,
                 (unsigned long long)(r->dropped_lines - DS_MAX_WARN));
    free(r->buf);
    free(r->rec);
    free(r->path);
    free(r);
    *rp = NULL;
}

/* JSON Lines: the next non-blank line. */
static int next_line(ds_reader_t *r, uint64_t *line) {
    for (;;) {
        r->rec_len = 0;
        uint64_t start_line = r->line;
        int got = 0;
        for (;;) {
            if (r->pos == r->end) {
                int n = fill(r);
                if (n < 0) return n;
                if (n == 0) break;
            }
            unsigned char *nl = memchr(r->buf + r->pos, '\n', r->end - r->pos);
            size_t take = nl ? (size_t)(nl - (r->buf + r->pos)) : r->end - r->pos;
            DL_TRY(rec_put(r, r->buf + r->pos, take));
            r->pos += take;
            got = 1;
            if (nl) { r->pos++; r->line++; break; }
        }
        if (!got && r->eof) return 0;
        /* strip \r and blanks */
        size_t b = 0, e = r->rec_len;
        while (b < e && (r->rec[b] == ' ' || r->rec[b] == '\t' || r->rec[b] == '\r')) b++;
        while (e > b && (r->rec[e - 1] == ' ' || r->rec[e - 1] == '\t' || r->rec[e - 1] == '\r')) e--;
        if (b == e) {
            if (r->eof && r->pos == r->end) return 0;
            continue;
        }
        if (b) memmove(r->rec, r->rec + b, e - b);
        r->rec_len = e - b;
        r->rec[r->rec_len] = 0;
        *line = start_line;
        return 1;
    }
}

static int getb(ds_reader_t *r) {
    if (r->pos == r->end) {
        int n = fill(r);
        if (n <= 0) return n < 0 ? n : -1000; /* -1000: end of input */
    }
    int c = r->buf[r->pos++];
    if (c == '\n') r->line++;
    return c;
}

/* JSON array: the next element, scanned by bracket depth outside strings. */
static int next_element(ds_reader_t *r, uint64_t *line) {
    if (r->array_done) return 0;
    r->rec_len = 0;
    int c;
    for (;;) { /* skip blanks and the separating comma */
        c = getb(r);
        if (c == -1000) return dl_seterr(DL_EFORMAT, "%s:%llu: unterminated JSON array", r->path, (unsigned long long)r->line);
        if (c < 0) return c;
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ',') continue;
        if (c == ']') { r->array_done = 1; return 0; }
        break;
    }
    *line = r->line;
    int depth = 0, in_str = 0, esc = 0;
    char small[4096];
    size_t sn = 0;
    for (;;) {
        if (sn == sizeof small) { DL_TRY(rec_put(r, small, sn)); sn = 0; }
        small[sn++] = (char)c;
        if (in_str) {
            if (esc) esc = 0;
            else if (c == '\\') esc = 1;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth <= 0) break;
        } else if (depth == 0 && (c == ',')) {
            sn--; /* scalar element ended */
            break;
        }
        c = getb(r);
        if (c == -1000)
            return dl_seterr(DL_EFORMAT, "%s:%llu: unterminated element of the JSON array", r->path,
                             (unsigned long long)*line);
        if (c < 0) return c;
        if (depth == 0 && !in_str && c == ']') { r->array_done = 1; break; }
    }
    DL_TRY(rec_put(r, small, sn));
    if (r->rec_len == 0) DL_TRY(rec_put(r, "", 0));
    return 1;
}

int ds_next_raw(ds_reader_t *r, const char **rec, size_t *rec_len, uint64_t *line) {
    int rc = r->array ? next_element(r, line) : next_line(r, line);
    if (rc <= 0) return rc;
    *rec = r->rec;
    *rec_len = r->rec_len;
    return 1;
}

/* ---- parsing ------------------------------------------------------------------- */

void ds_sample_free(ds_sample_t *s) {
    free(s->msgs);
    free(s->buf_);
    memset(s, 0, sizeof *s);
}

static int ds_parse_json(const ds_opts_t *opts, const char *rec, size_t rec_len, ds_sample_t *out);

/* A JSON string's length: its real one, since ds_parse never lets cJSON hold a NUL
 * inside a string (nul_copy). */
static size_t json_len(const cJSON *s) { return strlen(s->valuestring); }

typedef struct { const char *role; size_t role_len; const char *content; size_t len; int parts; const cJSON *arr; } pend_t;

/* String content, or an OpenAI list of parts [{"type":"text","text":...}] (concatenated). */
static int content_of(const cJSON *c, pend_t *p, const char *what) {
    if (cJSON_IsString(c)) { p->content = c->valuestring; p->len = json_len(c); return 0; }
    if (cJSON_IsNull(c) || !c) { p->content = ""; p->len = 0; return 0; }
    if (cJSON_IsArray(c)) {
        const cJSON *it;
        size_t n = 0;
        cJSON_ArrayForEach(it, c) {
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(it, "text");
            if (!cJSON_IsString(tx)) return dl_seterr(DL_EFORMAT, "%s: content part without \"text\"", what);
            n += json_len(tx);
        }
        p->parts = 1;
        p->arr = c;
        p->len = n;
        return 0;
    }
    return dl_seterr(DL_EFORMAT, "%s: expected a string", what);
}

static const char *sharegpt_role(const char *from) {
    if (!strcmp(from, "human") || !strcmp(from, "user")) return "user";
    if (!strcmp(from, "gpt") || !strcmp(from, "assistant") || !strcmp(from, "chatgpt") || !strcmp(from, "bing") ||
        !strcmp(from, "bard") || !strcmp(from, "model"))
        return "assistant";
    if (!strcmp(from, "system")) return "system";
    return NULL;
}

static int sample_build(ds_sample_t *s, const pend_t *p, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += p[i].role_len + 1 + p[i].len + 1;
    if (total + 1 > s->buf_cap_) {
        char *nb = realloc(s->buf_, total + 1);
        if (!nb) return dl_seterr(DL_ENOMEM, "dataset: sample of %zu bytes", total);
        s->buf_ = nb;
        s->buf_cap_ = total + 1;
    }
    if (n > s->cap_msgs) {
        chat_msg_t *nm = realloc(s->msgs, (size_t)n * sizeof *nm);
        if (!nm) return dl_seterr(DL_ENOMEM, "dataset: %d messages", n);
        s->msgs = nm;
        s->cap_msgs = n;
    }
    char *o = s->buf_;
    for (int i = 0; i < n; i++) {
        memcpy(o, p[i].role, p[i].role_len);
        o[p[i].role_len] = 0;
        s->msgs[i].role = o;
        o += p[i].role_len + 1;
        s->msgs[i].content = o;
        s->msgs[i].content_len = p[i].len;
        if (p[i].parts) {
            const cJSON *it;
            cJSON_ArrayForEach(it, p[i].arr) {
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(it, "text");
                size_t l = json_len(tx);
                memcpy(o, tx->valuestring, l);
                o += l;
            }
        } else {
            memcpy(o, p[i].content, p[i].len);
            o += p[i].len;
        }
        *o++ = 0;
    }
    s->buf_len_ = (size_t)(o - s->buf_);
    s->n_msgs = n;
    s->is_text = 0;
    return 0;
}

static int parse_obj(const ds_opts_t *o, const cJSON *root, ds_sample_t *out) {
    if (!cJSON_IsObject(root)) return dl_seterr(DL_EFORMAT, "record is not a JSON object");
    ds_format_t f = o->format;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    const cJSON *conv = cJSON_GetObjectItemCaseSensitive(root, "conversations");
    if (f == DS_AUTO) {
        if (msgs) f = DS_OPENAI;
        else if (conv) f = DS_SHAREGPT;
        else if (o->prompt_field && o->response_field && cJSON_GetObjectItemCaseSensitive(root, o->prompt_field)) f = DS_FIELDS;
        else if (cJSON_GetObjectItemCaseSensitive(root, "text")) f = DS_TEXT;
        else
            return dl_seterr(DL_EFORMAT, "record has none of \"messages\", \"conversations\", \"text\"%s",
                             o->prompt_field ? " or the prompt field" : "");
    }
    pend_t stack[16], *p = stack;
    int n = 0, rc = 0;
    if (f == DS_TEXT) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "text");
        if (!cJSON_IsString(t)) return dl_seterr(DL_EFORMAT, "field \"text\": expected a string");
        size_t l = json_len(t);
        if (l + 1 > out->buf_cap_) {
            char *nb = realloc(out->buf_, l + 1);
            if (!nb) return dl_seterr(DL_ENOMEM, "dataset: text of %zu bytes", l);
            out->buf_ = nb;
            out->buf_cap_ = l + 1;
        }
        memcpy(out->buf_, t->valuestring, l + 1);
        out->is_text = 1;
        out->text = out->buf_;
        out->text_len = l;
        out->n_msgs = 0;
        return 0;
    }
    if (f == DS_FIELDS) {
        if (!o->prompt_field || !o->response_field)
            return dl_seterr(DL_EINVAL, "format 'fields' needs --prompt-field and --response-field");
        const char *names[3] = {o->system_field, o->prompt_field, o->response_field};
        const char *roles[3] = {"system", "user", "assistant"};
        for (int i = 0; i < 3; i++) {
            if (!names[i]) continue;
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, names[i]);
            if (!v && i == 0) continue;
            if (!cJSON_IsString(v))
                return dl_seterr(DL_EFORMAT, "field \"%s\": %s", names[i], v ? "expected a string" : "missing");
            p[n++] = (pend_t){roles[i], strlen(roles[i]), v->valuestring, json_len(v), 0, NULL};
        }
        return sample_build(out, p, n);
    }
    const cJSON *arr = f == DS_OPENAI ? msgs : conv;
    const char *fname = f == DS_OPENAI ? "messages" : "conversations";
    if (!cJSON_IsArray(arr)) return dl_seterr(DL_EFORMAT, "field \"%s\": %s", fname, arr ? "expected an array" : "missing");
    int cnt = cJSON_GetArraySize(arr);
    if (cnt == 0) return dl_seterr(DL_EFORMAT, "field \"%s\": empty", fname);
    if (cnt > 16) {
        p = malloc((size_t)cnt * sizeof *p);
        if (!p) return dl_seterr(DL_ENOMEM, "dataset: %d messages", cnt);
    }
    const cJSON *m;
    char what[64];
    cJSON_ArrayForEach(m, arr) {
        snprintf(what, sizeof what, "%s[%d]", fname, n);
        if (!cJSON_IsObject(m)) { rc = dl_seterr(DL_EFORMAT, "%s: expected an object", what); goto done; }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, f == DS_OPENAI ? "role" : "from");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, f == DS_OPENAI ? "content" : "value");
        if (f == DS_SHAREGPT && !role && !content) { /* some ShareGPT dumps use role/content */
            role = cJSON_GetObjectItemCaseSensitive(m, "role");
            content = cJSON_GetObjectItemCaseSensitive(m, "content");
        }
        if (!cJSON_IsString(role)) { rc = dl_seterr(DL_EFORMAT, "%s: role/from missing", what); goto done; }
        const char *r = role->valuestring;
        if (f == DS_SHAREGPT) {
            r = sharegpt_role(role->valuestring);
            if (!r) { rc = dl_seterr(DL_EFORMAT, "%s: unknown \"from\" '%s'", what, role->valuestring); goto done; }
        }
        if (f == DS_SHAREGPT && !cJSON_IsString(content)) {
            rc = dl_seterr(DL_EFORMAT, "%s: \"value\": %s", what, content ? "expected a string" : "missing");
            goto done;
        }
        p[n] = (pend_t){r, strlen(r), NULL, 0, 0, NULL};
        if ((rc = content_of(content, &p[n], what)) < 0) goto done;
        n++;
    }
    rc = sample_build(out, p, n);
done:
    if (p != stack) free(p);
    return rc;
}

/* cJSON decodes "\u0000" into a NUL inside valuestring and keeps no length, so a
 * strlen would cut the string there (issue 15). A record holding a NUL inside a string
 * (the escape, or a raw 0x00 byte) is therefore parsed from a copy in which each such
 * NUL is one byte `sent` that the record does not hold and that no JSON escape produces
 * (cJSON writes escapes as valid UTF-8, which never holds 0xC0, 0xC1 or 0xF5..0xFF);
 * the sample's bytes map it back to NUL (ds_unmask), and every string's length is then
 * its real one. Returns 0 with *copy NULL (no NUL: parse rec as is), 0 with *copy
 * (malloc'd, *copy_len bytes) and *sent, DL_EFORMAT (every candidate byte is in the
 * record) or DL_ENOMEM. */
static int nul_copy(const char *rec, size_t n, char **copy, size_t *copy_len, int *sent) {
    static const unsigned char cand[] = {0xFF, 0xFE, 0xFD, 0xFC, 0xFB, 0xFA, 0xF9, 0xF8, 0xF7, 0xF6, 0xF5, 0xC1, 0xC0};
    unsigned char seen[256] = {0};
    int nuls = 0, in_str = 0;
    *copy = NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)rec[i];
        seen[c] = 1;
        if (!in_str) { in_str = c == '"'; continue; }
        if (c == '"') in_str = 0;
        else if (c == 0) nuls++;
        else if (c == '\\' && i + 1 < n) {
            if (i + 5 < n && !memcmp(rec + i + 1, "u0000", 5)) nuls++;
            seen[(unsigned char)rec[++i]] = 1;
        }
    }
    if (!nuls) return 0;
    size_t k = 0;
    while (k < sizeof cand && seen[cand[k]]) k++;
    if (k == sizeof cand)
        return dl_seterr(DL_EFORMAT, "a NUL in a string, in a record that holds every byte 0xC0, 0xC1, 0xF5..0xFF");
    char *o = malloc(n + 1);
    if (!o) return dl_seterr(DL_ENOMEM, "dataset: record of %zu bytes", n);
    size_t w = 0;
    in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = rec[i];
        if (!in_str) { in_str = c == '"'; o[w++] = c; continue; }
        if (c == '"') in_str = 0;
        if (c == 0) { o[w++] = (char)cand[k]; continue; }
        if (c == '\\' && i + 5 < n && !memcmp(rec + i + 1, "u0000", 5)) { o[w++] = (char)cand[k]; i += 5; continue; }
        o[w++] = c;
        if (c == '\\' && i + 1 < n) o[w++] = rec[++i];
    }
    o[w] = 0;
    *copy = o;
    *copy_len = w;
    *sent = cand[k];
    return 0;
}

/* The sample's bytes (text, or roles and contents) with nul_copy's byte back to NUL. */
static void ds_unmask(ds_sample_t *s, int sent) {
    size_t n = s->is_text ? s->text_len : s->buf_len_;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s->buf_[i] == (unsigned char)sent) s->buf_[i] = 0;
}

int ds_parse(const ds_opts_t *opts, const char *rec, size_t rec_len, ds_sample_t *out) {
    char *copy = NULL;
    size_t copy_len = 0;
    int sent = -1;
    DL_TRY(nul_copy(rec, rec_len, &copy, &copy_len, &sent));
    if (copy) { rec = copy; rec_len = copy_len; }
    int rc = ds_parse_json(opts, rec, rec_len, out);
    if (rc == 0 && copy) ds_unmask(out, sent);
    free(copy);
    return rc;
}

static int ds_parse_json(const ds_opts_t *opts, const char *rec, size_t rec_len, ds_sample_t *out) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(rec, rec_len, &end, 0);
    if (!root) {
        const char *ep = cJSON_GetErrorPtr();
        long off = ep && ep >= rec && ep <= rec + rec_len ? (long)(ep - rec) : -1;
        return dl_seterr(DL_EFORMAT, "invalid JSON near byte %ld", off);
    }
    if (end) {
        const char *e = end, *lim = rec + rec_len;
        while (e < lim && (*e == ' ' || *e == '\t' || *e == '\r' || *e == '\n' || *e == 0)) e++;
        if (e < lim) {
            cJSON_Delete(root);
            return dl_seterr(DL_EFORMAT, "trailing data after the JSON value at byte %ld", (long)(end - rec));
        }
    }
    int rc = parse_obj(opts ? opts : &(ds_opts_t){0}, root, out);
    cJSON_Delete(root);
    return rc;
}

int ds_report_bad(ds_reader_t *r, uint64_t line, const char *why) {
    if (r->opts.strict) return dl_seterr(DL_EFORMAT, "%s:%llu: %s", r->path, (unsigned long long)line, why);
    r->skipped++;
    if (r->skipped <= DS_MAX_WARN)
        log_warn("%s:%llu: %s (skipped)", r->path, (unsigned long long)line, why);
    return 0;
}

int ds_report_dropped(ds_reader_t *r, uint64_t line, uint64_t n_bytes, int byte) {
    char why[160];
    snprintf(why, sizeof why, "%llu byte%s the tokenizer cannot encode (invalid UTF-8, first 0x%02X) dropped",
             (unsigned long long)n_bytes, n_bytes == 1 ? "" : "s", byte & 0xFF);
    if (r->opts.strict) return dl_seterr(DL_EFORMAT, "%s:%llu: %s", r->path, (unsigned long long)line, why);
    if (++r->dropped_lines <= DS_MAX_WARN)
        log_warn("%s:%llu: %s from the sample", r->path, (unsigned long long)line, why);
    return 0;
}

int ds_next(ds_reader_t *r, ds_sample_t *out) {
    for (;;) {
        const char *rec;
        size_t len;
        uint64_t line;
        int rc = ds_next_raw(r, &rec, &len, &line);
        if (rc <= 0) return rc;
        rc = ds_parse(&r->opts, rec, len, out);
        if (rc == 0) return 1;
        if (rc != DL_EFORMAT) return rc;
        char why[512];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        DL_TRY(ds_report_bad(r, line, why));
    }
}

uint64_t ds_skipped(const ds_reader_t *r) { return r->skipped; }
uint64_t ds_bytes_read(const ds_reader_t *r) { return r->bytes - (r->end - r->pos); }
const char *ds_path(const ds_reader_t *r) { return r->path; }

int ds_parse_format(const char *s, ds_format_t *out) {
    static const char *names[] = {"auto", "openai", "sharegpt", "text", "fields"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) { *out = (ds_format_t)i; return 0; }
    return dl_seterr(DL_EINVAL, "--format: '%s' (auto, openai, sharegpt, text, fields)", s);
}
