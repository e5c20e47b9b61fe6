/* Prepared cache writer and reader (see prepare.h). Records are read serially
 * in chunks, parsed + tokenized in parallel (OpenMP, dynamic schedule), and
 * written in input order. */
#include "common/data/prepare.h"

#include "common/base/err.h"
#include "common/base/log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(dlc_header_t) == 128, "dlc header is 128 bytes");

#define DLC_ALIGN 64u

typedef struct {
    int32_t *ids;
    uint8_t *mask;
    uint32_t n;
    uint64_t n_asst;
    int rc;
    char err[256];
} result_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Tokenizes one record into r (owned arrays). */
static void tokenize_one(const tok_t *t, const prep_opts_t *o, const char *rec, size_t len, ds_sample_t *s,
                         tok_ids_t *ids, uint8_t **mask, size_t *mask_cap, result_t *r) {
    ids->n = 0;
    int rc = ds_parse(&o->ds, rec, len, s);
    uint64_t na = 0;
    if (rc == 0) {
        if (s->is_text) {
            rc = tok_encode(t, s->text, s->text_len, 1, 0, ids);
            if (rc == 0 && *mask_cap < ids->n) {
                uint8_t *nm = realloc(*mask, ids->n * 2);
                if (!nm) rc = dl_seterr(DL_ENOMEM, "prepare: mask");
                else { *mask = nm; *mask_cap = ids->n * 2; }
            }
            if (rc == 0) { memset(*mask, 1, ids->n); na = ids->n; }
        } else if (!o->chat) {
            rc = dl_seterr(DL_EINVAL, "prepare: chat sample but no chat template");
        } else {
            rc = chat_encode(o->chat, t, s->msgs, s->n_msgs, ids, mask, mask_cap, &na);
        }
    }
    if (rc == 0 && ids->n > UINT32_MAX / 2) rc = dl_seterr(DL_EFORMAT, "sample of %zu tokens", ids->n);
    r->rc = rc;
    if (rc < 0) {
        snprintf(r->err, sizeof r->err, "%s", dl_errmsg());
        return;
    }
    r->n = (uint32_t)ids->n;
    r->n_asst = na;
    r->ids = malloc(ids->n * sizeof *r->ids + 1);
    r->mask = malloc(ids->n + 1);
    if (!r->ids || !r->mask) {
        r->rc = DL_ENOMEM;
        snprintf(r->err, sizeof r->err, "prepare: sample of %zu tokens", ids->n);
        return;
    }
    memcpy(r->ids, ids->ids, ids->n * sizeof *r->ids);
    memcpy(r->mask, *mask, ids->n);
}

static int write_all(FILE *f, const void *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, f) != n) return dl_seterr(DL_EIO, "%s: write: %s", path, strerror(errno));
    return 0;
}

static int pad_to(FILE *f, uint64_t *off, const char *path) {
    static const char zeros[DLC_ALIGN];
    uint64_t p = (*off + DLC_ALIGN - 1) / DLC_ALIGN * DLC_ALIGN;
    DL_TRY(write_all(f, zeros, (size_t)(p - *off), path));
    *off = p;
    return 0;
}

/* The top-level field names of a JSON object record into buf ("a, b, c"),
 * or "" when rec is not a JSON object. */
/* The field names of a JSON object record into buf (", "-separated), and into hint
 * what to pass instead: --prompt-field/--response-field when two string fields look
 * like a prompt and a response (known names first, else the only two string fields),
 * or `draftline regen` for prompt-only records (a "turns" list, a lone prompt). */
static void record_fields(const char *rec, size_t len, char *buf, size_t cap, char *hint, size_t hcap) {
    static const char *const pnames[] = {"question", "prompt", "instruction", "input", "query", "problem", NULL};
    static const char *const rnames[] = {"answer", "response", "output", "completion", "canonical_solution",
                                         "solution", "chosen", NULL};
    buf[0] = 0;
    hint[0] = 0;
    cJSON *root = cJSON_ParseWithLength(rec, len);
    if (cJSON_IsObject(root)) {
        size_t n = 0;
        int nstr = 0, turns = 0;
        const char *s1 = NULL, *s2 = NULL, *p = NULL, *r = NULL;
        const cJSON *it;
        cJSON_ArrayForEach(it, root) {
            if (!it->string) continue;
            int w = snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", it->string);
            if (w < 0 || (size_t)w >= cap - n) buf[n] = 0;
            else n += (size_t)w;
            if (cJSON_IsArray(it) && !strcmp(it->string, "turns")) turns = 1;
            if (!cJSON_IsString(it)) continue;
            if (nstr == 0) s1 = it->string; else if (nstr == 1) s2 = it->string;
            nstr++;
            for (int i = 0; !p && pnames[i]; i++) if (!strcmp(it->string, pnames[i])) p = it->string;
            for (int i = 0; !r && rnames[i]; i++) if (!strcmp(it->string, rnames[i])) r = it->string;
        }
        if (!p || !r) { p = r = NULL; if (nstr == 2) { p = s1; r = s2; } }
        if (p && r)
            snprintf(hint, hcap, "use --prompt-field %s --response-field %s (or --format openai|sharegpt|text)", p, r);
        else if (turns || nstr <= 1)
            snprintf(hint, hcap, "prompt-only records have no response to train on: generate one with "
                                 "`draftline regen --data FILE --out OUT.jsonl`, then prepare OUT.jsonl");
    }
    cJSON_Delete(root);
}

/* DL_EFORMAT for a run that produced no samples, with a hint from the first
 * skipped record's fields (skip_fields, skip_hint) when it is a JSON object. */
static int no_samples_error(const prep_opts_t *o, uint64_t skipped, const char *skip_fields, const char *skip_hint,
                            const char *skip_why) {
    if (skipped == 0)
        return dl_seterr(DL_EFORMAT, "0 samples from %s: the file has no records", o->data_path);
    if (skip_fields[0]) {
        if (skip_hint[0] && (!o->ds.prompt_field || !strncmp(skip_hint, "prompt-only", 11)))
            return dl_seterr(DL_EFORMAT, "0 samples from %s (%llu bad lines, first: %s); its records have fields %s: %s",
                             o->data_path, (unsigned long long)skipped, skip_why, skip_fields, skip_hint);
        return dl_seterr(DL_EFORMAT, "0 samples from %s (%llu bad lines, first: %s); its records have fields %s",
                         o->data_path, (unsigned long long)skipped, skip_why, skip_fields);
    }
    return dl_seterr(DL_EFORMAT, "0 samples from %s (%llu bad lines, first: %s): not JSON Lines / a JSON array of records?",
                     o->data_path, (unsigned long long)skipped, skip_why);
}

int prep_run(const tok_t *t, const prep_opts_t *o, prep_stats_t *st) {
    double t0 = now_s();
    memset(st, 0, sizeof *st);
    ds_reader_t *rd = NULL;
    FILE *out = NULL, *mtmp = NULL;
    char tmp[4096];
    uint64_t *index = NULL;
    size_t index_cap = 0;
    char *arena = NULL;
    size_t arena_cap = 0;
    size_t *rec_off = NULL;
    uint64_t *rec_line = NULL;
    result_t *res = NULL;
    int rc = 0;
    uint32_t chunk = o->chunk_records ? o->chunk_records : 2048;
    int nt = o->n_threads > 0 ? o->n_threads : omp_get_max_threads();

    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", o->out_path, (int)getpid()) >= (int)sizeof tmp)
        return dl_seterr(DL_ERANGE, "--out: path too long");
    { /* refused before the data is read: the rename at the end would fail */
        struct stat ost, dst;
        size_t ol = strlen(o->out_path);
        int have_out = stat(o->out_path, &ost) == 0;
        if ((have_out && S_ISDIR(ost.st_mode)) || (ol && o->out_path[ol - 1] == '/'))
            return dl_seterr(DL_EINVAL, "--out %s is a directory: name the cache file (e.g. %s%sdata.dlc)",
                             o->out_path, o->out_path, ol && o->out_path[ol - 1] == '/' ? "" : "/");
        /* the rename replaces --out: only an earlier cache (or an empty file) may go */
        if (have_out && stat(o->data_path, &dst) == 0 && dst.st_dev == ost.st_dev && dst.st_ino == ost.st_ino)
            return dl_seterr(DL_EINVAL, "--out %s is the --data file itself: it would be overwritten", o->out_path);
        if (have_out && S_ISREG(ost.st_mode) && ost.st_size > 0) {
            char magic[8] = {0};
            FILE *f = fopen(o->out_path, "rb");
            size_t k = f ? fread(magic, 1, sizeof magic, f) : 0;
            if (f) fclose(f);
            if (k != sizeof magic || memcmp(magic, DLC_MAGIC, 8) != 0)
                return dl_seterr(DL_EINVAL, "--out %s exists and is not a draftline cache: not overwritten (remove "
                                 "it or pick another --out)", o->out_path);
        }
    }
    if ((rc = ds_open(o->data_path, &o->ds, &rd)) < 0) return rc;
    out = fopen(tmp, "wb");
    if (!out) { rc = dl_seterr(DL_EIO, "%s: %s", tmp, strerror(errno)); goto done; }
    setvbuf(out, NULL, _IOFBF, 1 << 20);
    mtmp = tmpfile();
    if (!mtmp) { rc = dl_seterr(DL_EIO, "prepare: temp file for masks: %s", strerror(errno)); goto done; }
    rec_off = malloc((chunk + 1) * sizeof *rec_off);
    rec_line = malloc(chunk * sizeof *rec_line);
    res = calloc(chunk, sizeof *res);
    index_cap = 1024;
    index = malloc(index_cap * sizeof *index);
    if (!rec_off || !rec_line || !res || !index) { rc = dl_seterr(DL_ENOMEM, "prepare: chunk buffers"); goto done; }
    index[0] = 0;

    dlc_header_t h;
    memset(&h, 0, sizeof h);
    uint64_t off = sizeof h;
    if ((rc = write_all(out, &h, sizeof h, tmp)) < 0) goto done;
    if ((rc = pad_to(out, &off, tmp)) < 0) goto done;
    uint64_t ids_off = off, ntok = 0, nasst = 0, nsamp = 0;
    uint32_t maxlen = 0;
    char skip_fields[256] = "", skip_why[256] = "", skip_hint[256] = "";

    for (int eof = 0; !eof;) {
        /* 1. read a chunk of raw records (serial) */
        uint32_t n = 0;
        size_t used = 0;
        while (n < chunk) {
            const char *rec;
            size_t len;
            uint64_t line;
            int r = ds_next_raw(rd, &rec, &len, &line);
            if (r < 0) { rc = r; goto done; }
            if (r == 0) { eof = 1; break; }
            if (used + len + 1 > arena_cap) {
                size_t cap = arena_cap ? arena_cap : (1u << 20);
                while (cap < used + len + 1) cap *= 2;
                char *na = realloc(arena, cap);
                if (!na) { rc = dl_seterr(DL_ENOMEM, "prepare: chunk of %zu bytes", cap); goto done; }
                arena = na;
                arena_cap = cap;
            }
            memcpy(arena + used, rec, len);
            arena[used + len] = 0;
            rec_off[n] = used;
            rec_line[n] = line;
            used += len + 1;
            n++;
            rec_off[n] = used;
        }
        if (n == 0) break;
        /* 2. parse + tokenize (parallel, each record independent) */
#pragma omp parallel num_threads(nt)
        {
            ds_sample_t s = {0};
            tok_ids_t ids = {0};
            uint8_t *mask = NULL;
            size_t mask_cap = 0;
#pragma omp for schedule(dynamic, 8)
            for (uint32_t i = 0; i < n; i++)
                tokenize_one(t, o, arena + rec_off[i], rec_off[i + 1] - rec_off[i] - 1, &s, &ids, &mask, &mask_cap,
                             &res[i]);
            ds_sample_free(&s);
            tok_ids_free(&ids);
            free(mask);
        }
        /* 3. write in order (serial) */
        for (uint32_t i = 0; i < n; i++) {
            result_t *r = &res[i];
            if (rc == 0 && r->rc == DL_EFORMAT) {
                if (ds_skipped(rd) == 0 && nsamp == 0) {
                    snprintf(skip_why, sizeof skip_why, "line %llu: %s", (unsigned long long)rec_line[i], r->err);
                    record_fields(arena + rec_off[i], rec_off[i + 1] - rec_off[i] - 1, skip_fields, sizeof skip_fields,
                                  skip_hint, sizeof skip_hint);
                }
                rc = ds_report_bad(rd, rec_line[i], r->err);
            } else if (rc == 0 && r->rc < 0) {
                rc = dl_seterr(r->rc, "%s:%llu: %s", o->data_path, (unsigned long long)rec_line[i], r->err);
            } else if (rc == 0 && r->n == 0) {
                if (ds_skipped(rd) == 0 && nsamp == 0)
                    snprintf(skip_why, sizeof skip_why, "line %llu: sample has no tokens", (unsigned long long)rec_line[i]);
                rc = ds_report_bad(rd, rec_line[i], "sample has no tokens");
            } else if (rc == 0) {
                if ((rc = write_all(out, r->ids, r->n * sizeof *r->ids, tmp)) == 0 &&
                    (rc = write_all(mtmp, r->mask, r->n, "mask temp file")) == 0) {
                    if (nsamp + 2 > index_cap) {
                        index_cap *= 2;
                        uint64_t *ni = realloc(index, index_cap * sizeof *ni);
                        if (!ni) rc = dl_seterr(DL_ENOMEM, "prepare: index of %zu", index_cap);
                        else index = ni;
                    }
                    if (rc == 0) {
                        ntok += r->n;
                        nasst += r->n_asst;
                        if (r->n > maxlen) maxlen = r->n;
                        index[++nsamp] = ntok;
                    }
                }
            }
            free(r->ids);
            free(r->mask);
            memset(r, 0, sizeof *r);
        }
        if (rc < 0) goto done;
    }
    if (nsamp == 0) { rc = no_samples_error(o, ds_skipped(rd), skip_fields, skip_hint, skip_why); goto done; }
    off = ids_off + ntok * sizeof(int32_t);
    if ((rc = pad_to(out, &off, tmp)) < 0) goto done;
    uint64_t mask_off = off;
    if (fflush(mtmp) != 0 || fseek(mtmp, 0, SEEK_SET) != 0) { rc = dl_seterr(DL_EIO, "mask temp file: %s", strerror(errno)); goto done; }
    {
        char buf[1 << 16];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, mtmp)) > 0)
            if ((rc = write_all(out, buf, k, tmp)) < 0) goto done;
        if (ferror(mtmp)) { rc = dl_seterr(DL_EIO, "mask temp file: read"); goto done; }
    }
    off = mask_off + ntok;
    if ((rc = pad_to(out, &off, tmp)) < 0) goto done;
    uint64_t index_off = off;
    if ((rc = write_all(out, index, (nsamp + 1) * sizeof *index, tmp)) < 0) goto done;

    memcpy(h.magic, DLC_MAGIC, 8);
    h.version = DLC_VERSION;
    h.header_size = sizeof h;
    h.n_samples = nsamp;
    h.n_tokens = ntok;
    h.n_assistant = nasst;
    h.n_skipped = ds_skipped(rd);
    h.tok_fingerprint = tok_fingerprint(t);
    h.ids_off = ids_off;
    h.mask_off = mask_off;
    h.index_off = index_off;
    h.n_vocab = tok_n_vocab(t);
    h.chat_family = o->chat ? (uint32_t)o->chat->family : 0;
    h.max_sample_len = maxlen;
    if (fseek(out, 0, SEEK_SET) != 0 || (rc = write_all(out, &h, sizeof h, tmp)) < 0) {
        rc = rc ? rc : dl_seterr(DL_EIO, "%s: seek", tmp);
        goto done;
    }
    if (fflush(out) != 0 || fsync(fileno(out)) != 0) { rc = dl_seterr(DL_EIO, "%s: fsync: %s", tmp, strerror(errno)); goto done; }
    if (fclose(out) != 0) { out = NULL; rc = dl_seterr(DL_EIO, "%s: close: %s", tmp, strerror(errno)); goto done; }
    out = NULL;
    if (rename(tmp, o->out_path) != 0) {
        rc = dl_seterr(DL_EIO, "rename %s -> %s: %s", tmp, o->out_path, strerror(errno));
        unlink(tmp);
        goto done;
    }
    { /* make the rename durable */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", o->out_path);
        char *sl = strrchr(dir, '/');
        if (sl) *sl = 0; else snprintf(dir, sizeof dir, ".");
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) { (void)fsync(dfd); close(dfd); }
    }
    st->samples = nsamp;
    st->tokens = ntok;
    st->assistant_tokens = nasst;
    st->skipped = ds_skipped(rd);
    st->bytes_in = ds_bytes_read(rd);
    st->max_len = maxlen;
    st->seconds = now_s() - t0;
done:
    if (out) { fclose(out); unlink(tmp); }
    if (mtmp) fclose(mtmp);
    if (res)
        for (uint32_t i = 0; i < chunk; i++) { free(res[i].ids); free(res[i].mask); }
    free(res);
    free(rec_off);
    free(rec_line);
    free(arena);
    free(index);
    ds_close(&rd);
    return rc;
}

/* ---- reader --------------------------------------------------------------------- */

struct dlc {
    const uint8_t *map;
    size_t size;
    const dlc_header_t *h;
    const int32_t *ids;
    const uint8_t *mask;
    const uint64_t *index;
};

int dlc_open(const char *path, dlc_t **out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dl_seterr(errno == ENOENT ? DL_ENOENT : DL_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return dl_seterr(DL_EIO, "%s: stat: %s", path, strerror(errno)); }
    size_t size = (size_t)st.st_size;
    if (size < sizeof(dlc_header_t)) { close(fd); return dl_seterr(DL_EFORMAT, "%s: %zu bytes, shorter than the header", path, size); }
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return dl_seterr(DL_EIO, "%s: mmap: %s", path, strerror(errno));
    const dlc_header_t *h = m;
    int rc = 0;
#define BAD(...) do { rc = dl_seterr(DL_EFORMAT, __VA_ARGS__); goto bad; } while (0)
    if (memcmp(h->magic, DLC_MAGIC, 8)) BAD("%s: not a draftline cache (magic)", path);
    if (h->version != DLC_VERSION) BAD("%s: cache version %u, this build reads %u (re-run prepare)", path, h->version, DLC_VERSION);
    if (h->header_size != sizeof *h) BAD("%s: header_size %u", path, h->header_size);
    if (h->n_tokens > size / 5 || h->n_samples > size / 8) BAD("%s: counts larger than the file", path);
    /* each offset within the file first, so the sums below cannot wrap */
    if (h->ids_off > size || h->mask_off > size || h->index_off > size)
        BAD("%s: section offsets out of bounds (ids %llu, mask %llu, index %llu, size %zu)", path,
            (unsigned long long)h->ids_off, (unsigned long long)h->mask_off, (unsigned long long)h->index_off, size);
    if (h->ids_off < sizeof *h || h->ids_off % 4 || h->ids_off + h->n_tokens * 4 > h->mask_off ||
        h->mask_off + h->n_tokens > h->index_off || h->index_off % 8 ||
        h->index_off + (h->n_samples + 1) * 8 > size)
        BAD("%s: section offsets out of bounds (ids %llu, mask %llu, index %llu, size %zu)", path,
            (unsigned long long)h->ids_off, (unsigned long long)h->mask_off, (unsigned long long)h->index_off, size);
    const uint64_t *idx = (const uint64_t *)((const uint8_t *)m + h->index_off);
    if (idx[0] != 0 || idx[h->n_samples] != h->n_tokens) BAD("%s: index does not span the tokens", path);
    for (uint64_t i = 0; i < h->n_samples; i++)
        if (idx[i + 1] < idx[i] || idx[i + 1] - idx[i] > UINT32_MAX) BAD("%s: index[%llu] not monotonic", path, (unsigned long long)i + 1);
#undef BAD
    dlc_t *c = calloc(1, sizeof *c);
    if (!c) { rc = dl_seterr(DL_ENOMEM, "dlc_open"); goto bad; }
    c->map = m;
    c->size = size;
    c->h = h;
    c->ids = (const int32_t *)((const uint8_t *)m + h->ids_off);
    c->mask = (const uint8_t *)m + h->mask_off;
    c->index = idx;
    *out = c;
    return 0;
bad:
    munmap(m, size);
    return rc;
}

void dlc_close(dlc_t **cp) {
    if (!cp || !*cp) return;
    munmap((void *)(*cp)->map, (*cp)->size);
    free(*cp);
    *cp = NULL;
}

const dlc_header_t *dlc_header(const dlc_t *c) { return c->h; }
uint64_t dlc_n_samples(const dlc_t *c) { return c->h->n_samples; }
uint64_t dlc_n_tokens(const dlc_t *c) { return c->h->n_tokens; }

int dlc_sample(const dlc_t *c, uint64_t i, const int32_t **ids, const uint8_t **mask, uint32_t *len) {
    if (i >= c->h->n_samples)
        return dl_seterr(DL_ERANGE, "dlc_sample: %llu >= %llu samples", (unsigned long long)i,
                         (unsigned long long)c->h->n_samples);
    uint64_t a = c->index[i];
    if (ids) *ids = c->ids + a;
    if (mask) *mask = c->mask + a;
    if (len) *len = (uint32_t)(c->index[i + 1] - a);
    return 0;
}

uint32_t dlc_sample_len(const dlc_t *c, uint64_t i) {
    return i < c->h->n_samples ? (uint32_t)(c->index[i + 1] - c->index[i]) : 0;
}
