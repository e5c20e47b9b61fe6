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
#include <signal.h>
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
    uint64_t dropped;   /* bytes the tokenizer could not encode (tok_ids_t.n_dropped) */
    int dropped_byte;
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
    ids->n_dropped = 0;
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
    r->dropped = ids->n_dropped;
    r->dropped_byte = ids->dropped_byte;
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

/* One prep_run: the cache being written (tmp, renamed over out_path at the
 * end), the masks spooled to a temp file, the chunk buffers and the totals. */
typedef struct {
    const tok_t *t;
    const prep_opts_t *o;
    ds_reader_t *rd;
    FILE *out, *mtmp;
    char tmp[4096];
    uint64_t *index;        /* (nsamp + 1) token offsets */
    size_t index_cap;
    char *arena;            /* the chunk's raw records, each NUL-terminated */
    size_t arena_cap;
    size_t *rec_off;        /* (chunk + 1) record offsets into arena */
    uint64_t *rec_line;     /* (chunk) line number of each record */
    result_t *res;          /* (chunk) tokenized records */
    uint32_t chunk;
    int nt;
    uint64_t ids_off, ntok, nasst, nsamp;
    uint32_t maxlen;
    char skip_fields[256], skip_why[256], skip_hint[256];
} prep_ctx_t;

/* Refuses an --out that the rename at the end would fail on or should not
 * replace; runs before the data is read. */
static int check_out_path(const prep_opts_t *o) {
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
    return 0;
}

/* The cache file a prep_run is writing now (its tmp), for prep_cleanup_on_signal's
 * handler: process-wide because a signal handler has no context argument. */
static char g_sig_tmp[4096];
static volatile sig_atomic_t g_sig_tmp_live;

static void on_fatal_signal(int sig) {
    if (g_sig_tmp_live) unlink(g_sig_tmp);   /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

int prep_cleanup_on_signal(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        if (sigaction(sigs[i], &sa, NULL) != 0) return dl_seterr(DL_EIO, "sigaction: %s", strerror(errno));
    return 0;
}

/* Opens the temp outputs, allocates the chunk buffers and writes a zero
 * header (rewritten by prep_finish). */
static int prep_open(prep_ctx_t *c) {
    g_sig_tmp_live = 0;
    snprintf(g_sig_tmp, sizeof g_sig_tmp, "%s", c->tmp);
    g_sig_tmp_live = 1;   /* before the file exists: unlinking a missing one is harmless */
    c->out = fopen(c->tmp, "wb");
    if (!c->out) return dl_seterr(DL_EIO, "%s: %s", c->tmp, strerror(errno));
    setvbuf(c->out, NULL, _IOFBF, 1 << 20);
    c->mtmp = tmpfile();
    if (!c->mtmp) return dl_seterr(DL_EIO, "prepare: temp file for masks: %s", strerror(errno));
    c->rec_off = malloc((c->chunk + 1) * sizeof *c->rec_off);
    c->rec_line = malloc(c->chunk * sizeof *c->rec_line);
    c->res = calloc(c->chunk, sizeof *c->res);
    c->index_cap = 1024;
    c->index = malloc(c->index_cap * sizeof *c->index);
    if (!c->rec_off || !c->rec_line || !c->res || !c->index) return dl_seterr(DL_ENOMEM, "prepare: chunk buffers");
    c->index[0] = 0;

    dlc_header_t h;
    memset(&h, 0, sizeof h);
    uint64_t off = sizeof h;
    DL_TRY(write_all(c->out, &h, sizeof h, c->tmp));
    DL_TRY(pad_to(c->out, &off, c->tmp));
    c->ids_off = off;
    return 0;
}

/* Reads up to chunk raw records into the arena (serial); *n = records read,
 * *eof = 1 at the end of the data. */
static int prep_read_chunk(prep_ctx_t *c, uint32_t *n_out, int *eof) {
    uint32_t n = 0;
    size_t used = 0;
    while (n < c->chunk) {
        const char *rec;
        size_t len;
        uint64_t line;
        int r = ds_next_raw(c->rd, &rec, &len, &line);
        if (r < 0) return r;
        if (r == 0) { *eof = 1; break; }
        if (used + len + 1 > c->arena_cap) {
            size_t cap = c->arena_cap ? c->arena_cap : (1u << 20);
            while (cap < used + len + 1) cap *= 2;
            char *na = realloc(c->arena, cap);
            if (!na) return dl_seterr(DL_ENOMEM, "prepare: chunk of %zu bytes", cap);
            c->arena = na;
            c->arena_cap = cap;
        }
        memcpy(c->arena + used, rec, len);
        c->arena[used + len] = 0;
        c->rec_off[n] = used;
        c->rec_line[n] = line;
        used += len + 1;
        n++;
        c->rec_off[n] = used;
        *n_out = n;
    }
    return 0;
}

/* Parses + tokenizes records [0, n) of the chunk into res (parallel, each
 * record independent). */
static void prep_tokenize_chunk(prep_ctx_t *c, uint32_t n) {
    const tok_t *t = c->t;
    const prep_opts_t *o = c->o;
    const char *arena = c->arena;
    const size_t *rec_off = c->rec_off;
    result_t *res = c->res;
#pragma omp parallel num_threads(c->nt)
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
}

/* Appends one tokenized sample: ids to the cache, mask to the temp file, its
 * end offset to the index. */
static int prep_append(prep_ctx_t *c, const result_t *r) {
    int rc;
    if ((rc = write_all(c->out, r->ids, r->n * sizeof *r->ids, c->tmp)) == 0 &&
        (rc = write_all(c->mtmp, r->mask, r->n, "mask temp file")) == 0) {
        if (c->nsamp + 2 > c->index_cap) {
            c->index_cap *= 2;
            uint64_t *ni = realloc(c->index, c->index_cap * sizeof *ni);
            if (!ni) rc = dl_seterr(DL_ENOMEM, "prepare: index of %zu", c->index_cap);
            else c->index = ni;
        }
        if (rc == 0) {
            c->ntok += r->n;
            c->nasst += r->n_asst;
            if (r->n > c->maxlen) c->maxlen = r->n;
            c->index[++c->nsamp] = c->ntok;
        }
    }
    return rc;
}

/* Keeps why the first bad record was skipped, for no_samples_error (cut to
 * the 255 bytes of skip_why, as before). */
static void prep_note_skip(prep_ctx_t *c, unsigned long long line, const char *why) {
    size_t cap = sizeof c->skip_why;
    size_t k = (size_t)snprintf(c->skip_why, cap, "line %llu: ", line);   /* < 40 bytes */
    size_t n = strnlen(why, cap - 1 - k);
    memcpy(c->skip_why + k, why, n);
    c->skip_why[k + n] = 0;
}

/* Writes records [0, n) of the chunk in input order (serial), reporting bad
 * ones to the reader; frees every result, also after an error. */
static int prep_write_chunk(prep_ctx_t *c, uint32_t n) {
    int rc = 0;
    for (uint32_t i = 0; i < n; i++) {
        result_t *r = &c->res[i];
        const char *rec = c->arena + c->rec_off[i];
        size_t len = c->rec_off[i + 1] - c->rec_off[i] - 1;
        unsigned long long line = (unsigned long long)c->rec_line[i];
        if (rc == 0 && r->rc == DL_EFORMAT) {
            if (ds_skipped(c->rd) == 0 && c->nsamp == 0) {
                prep_note_skip(c, line, r->err);
                record_fields(rec, len, c->skip_fields, sizeof c->skip_fields, c->skip_hint, sizeof c->skip_hint);
            }
            rc = ds_report_bad(c->rd, c->rec_line[i], r->err);
        } else if (rc == 0 && r->rc < 0) {
            rc = dl_seterr(r->rc, "%s:%llu: %s", c->o->data_path, line, r->err);
        } else if (rc == 0 && r->n == 0) {
            if (ds_skipped(c->rd) == 0 && c->nsamp == 0)
                prep_note_skip(c, line, "sample has no tokens");
            rc = ds_report_bad(c->rd, c->rec_line[i], "sample has no tokens");
        } else if (rc == 0) {
            rc = prep_append(c, r);
            if (rc == 0 && r->dropped) rc = ds_report_dropped(c->rd, c->rec_line[i], r->dropped, r->dropped_byte);
        }
        free(r->ids);
        free(r->mask);
        memset(r, 0, sizeof *r);
    }
    return rc;
}

/* Copies the masks after the ids, writes the index and the real header,
 * fsyncs, closes and renames tmp over out_path (and fsyncs its directory). */
static int prep_finish(prep_ctx_t *c) {
    const prep_opts_t *o = c->o;
    int rc = 0;
    uint64_t off = c->ids_off + c->ntok * sizeof(int32_t);
    DL_TRY(pad_to(c->out, &off, c->tmp));
    uint64_t mask_off = off;
    if (fflush(c->mtmp) != 0 || fseek(c->mtmp, 0, SEEK_SET) != 0)
        return dl_seterr(DL_EIO, "mask temp file: %s", strerror(errno));
    {
        char buf[1 << 16];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, c->mtmp)) > 0) DL_TRY(write_all(c->out, buf, k, c->tmp));
        if (ferror(c->mtmp)) return dl_seterr(DL_EIO, "mask temp file: read");
    }
    off = mask_off + c->ntok;
    DL_TRY(pad_to(c->out, &off, c->tmp));
    uint64_t index_off = off;
    DL_TRY(write_all(c->out, c->index, (c->nsamp + 1) * sizeof *c->index, c->tmp));

    dlc_header_t h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, DLC_MAGIC, 8);
    h.version = DLC_VERSION;
    h.header_size = sizeof h;
    h.n_samples = c->nsamp;
    h.n_tokens = c->ntok;
    h.n_assistant = c->nasst;
    h.n_skipped = ds_skipped(c->rd);
    h.tok_fingerprint = tok_fingerprint(c->t);
    h.ids_off = c->ids_off;
    h.mask_off = mask_off;
    h.index_off = index_off;
    h.n_vocab = tok_n_vocab(c->t);
    h.chat_family = o->chat ? (uint32_t)o->chat->family : 0;
    h.max_sample_len = c->maxlen;
    if (fseek(c->out, 0, SEEK_SET) != 0 || (rc = write_all(c->out, &h, sizeof h, c->tmp)) < 0)
        return rc ? rc : dl_seterr(DL_EIO, "%s: seek", c->tmp);
    if (fflush(c->out) != 0 || fsync(fileno(c->out)) != 0)
        return dl_seterr(DL_EIO, "%s: fsync: %s", c->tmp, strerror(errno));
    if (fclose(c->out) != 0) { c->out = NULL; return dl_seterr(DL_EIO, "%s: close: %s", c->tmp, strerror(errno)); }
    c->out = NULL;
    if (rename(c->tmp, o->out_path) != 0) {
        rc = dl_seterr(DL_EIO, "rename %s -> %s: %s", c->tmp, o->out_path, strerror(errno));
        unlink(c->tmp);
        return rc;
    }
    { /* make the rename durable */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", o->out_path);
        char *sl = strrchr(dir, '/');
        if (sl) *sl = 0; else snprintf(dir, sizeof dir, ".");
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) { (void)fsync(dfd); close(dfd); }
    }
    return 0;
}

/* Releases everything prep_open and the chunks allocated; removes tmp when it
 * was not renamed. */
static void prep_close(prep_ctx_t *c) {
    if (c->out) { fclose(c->out); unlink(c->tmp); }
    g_sig_tmp_live = 0;   /* renamed over out_path, or removed */
    if (c->mtmp) fclose(c->mtmp);
    if (c->res)
        for (uint32_t i = 0; i < c->chunk; i++) { free(c->res[i].ids); free(c->res[i].mask); }
    free(c->res);
    free(c->rec_off);
    free(c->rec_line);
    free(c->arena);
    free(c->index);
    ds_close(&c->rd);
}

int prep_run(const tok_t *t, const prep_opts_t *o, prep_stats_t *st) {
    double t0 = now_s();
    memset(st, 0, sizeof *st);
    prep_ctx_t c;
    memset(&c, 0, sizeof c);
    c.t = t;
    c.o = o;
    c.chunk = o->chunk_records ? o->chunk_records : 2048;
    c.nt = o->n_threads > 0 ? o->n_threads : omp_get_max_threads();

    if (snprintf(c.tmp, sizeof c.tmp, "%s.tmp.%d", o->out_path, (int)getpid()) >= (int)sizeof c.tmp)
        return dl_seterr(DL_ERANGE, "--out: path too long");
    DL_TRY(check_out_path(o));
    int rc = ds_open(o->data_path, &o->ds, &c.rd);
    if (rc < 0) return rc;
    rc = prep_open(&c);
    for (int eof = 0; rc == 0 && !eof;) {
        uint32_t n = 0;
        if ((rc = prep_read_chunk(&c, &n, &eof)) < 0 || n == 0) break;
        prep_tokenize_chunk(&c, n);
        rc = prep_write_chunk(&c, n);
        if (rc == 0 && o->progress)
            o->progress(ds_bytes_read(c.rd), c.nsamp + ds_skipped(c.rd), c.ntok, now_s() - t0, o->progress_arg);
    }
    if (rc == 0 && c.nsamp == 0) rc = no_samples_error(o, ds_skipped(c.rd), c.skip_fields, c.skip_hint, c.skip_why);
    if (rc == 0) rc = prep_finish(&c);
    if (rc == 0) {
        st->samples = c.nsamp;
        st->tokens = c.ntok;
        st->assistant_tokens = c.nasst;
        st->skipped = ds_skipped(c.rd);
        st->bytes_in = ds_bytes_read(c.rd);
        st->max_len = c.maxlen;
        st->seconds = now_s() - t0;
    }
    prep_close(&c);
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
    char *path;
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
    if (h->n_vocab <= 0) BAD("%s: n_vocab %d (corrupt)", path, h->n_vocab);
    if (h->n_assistant > h->n_tokens) BAD("%s: n_assistant %llu more than the %llu tokens (corrupt)", path,
                                          (unsigned long long)h->n_assistant, (unsigned long long)h->n_tokens);
    if (h->n_tokens > size / 5 || h->n_samples > size / 8) BAD("%s: %llu tokens and %llu samples in its header, more than its %zu bytes hold: truncated or "
            "corrupt (run `draftline prepare` again)", path, (unsigned long long)h->n_tokens,
            (unsigned long long)h->n_samples, size);
    /* each offset within the file first, so the sums below cannot wrap */
    if (h->ids_off > size || h->mask_off > size || h->index_off > size)
        BAD("%s: section offsets out of bounds (ids %llu, mask %llu, index %llu, size %zu): truncated or corrupt "
            "(run `draftline prepare` again)", path,
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
    if (!(c->path = strdup(path))) { free(c); rc = dl_seterr(DL_ENOMEM, "dlc_open"); goto bad; }
    *out = c;
    return 0;
bad:
    munmap(m, size);
    return rc;
}

void dlc_close(dlc_t **cp) {
    if (!cp || !*cp) return;
    munmap((void *)(*cp)->map, (*cp)->size);
    free((*cp)->path);
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

int dlc_check_tokens(const dlc_t *c, uint64_t sample, const int32_t *ids, const uint8_t *mask, uint32_t n,
                     uint32_t at, int32_t vocab) {
    for (uint32_t j = 0; j < n; j++) {
        if (ids && (ids[j] < 0 || ids[j] >= vocab))
            return dl_seterr(DL_EFORMAT, "%s: sample %llu, token %u: id %d outside the vocabulary [0, %d) (corrupt "
                             "cache: prepare it again)", c->path, (unsigned long long)sample, at + j, ids[j], vocab);
        if (mask && mask[j] > 1)
            return dl_seterr(DL_EFORMAT, "%s: sample %llu, token %u: loss mask byte %u, not 0 or 1 (corrupt cache: "
                             "prepare it again)", c->path, (unsigned long long)sample, at + j, mask[j]);
    }
    return 0;
}

int dlc_validate(const dlc_t *c, int32_t vocab) {
    const dlc_header_t *h = c->h;
    if (vocab <= 0 || vocab > h->n_vocab) vocab = h->n_vocab;
    uint64_t asst = 0;
    for (uint64_t i = 0; i < h->n_samples; i++) {
        uint64_t a = c->index[i];
        uint32_t n = (uint32_t)(c->index[i + 1] - a);
        DL_TRY(dlc_check_tokens(c, i, c->ids + a, c->mask + a, n, 0, vocab));
        for (uint32_t j = 0; j < n; j++) asst += c->mask[a + j];
    }
    if (asst != h->n_assistant)
        return dl_seterr(DL_EFORMAT, "%s: %llu trained (mask 1) tokens, its header says %llu (corrupt cache: prepare "
                         "it again)", c->path, (unsigned long long)asst, (unsigned long long)h->n_assistant);
    return 0;
}
