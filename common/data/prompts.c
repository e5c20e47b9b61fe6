/* Prompt sets (MT-Bench, HumanEval, GSM8K, OpenAI/ShareGPT chat). See prompts.h. */
#include "common/data/prompts.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "common/data/dataset.h"

static const char *const k_kind_names[] = {"messages", "conversations", "turns",
                                           "prompt",   "question",      "instruction"};

const char *prompt_kind_name(prompt_kind_t k) {
    return (unsigned)k < sizeof k_kind_names / sizeof k_kind_names[0] ? k_kind_names[k] : "?";
}

void prompt_free(prompt_t *p) {
    if (!p) return;
    free(p->msgs);
    free(p->buf_);
    memset(p, 0, sizeof *p);
}

/* Pieces collected while walking the JSON, copied into one buffer at the end. */
typedef struct {
    int is_system;
    const char *a, *b;   /* text a, then (optional) "\n\n" + b */
} piece_t;

typedef struct {
    piece_t *v;
    int n, cap;
} pieces_t;

static int push(pieces_t *ps, int is_system, const char *a, const char *b) {
    if (ps->n == ps->cap) {
        int nc = ps->cap ? 2 * ps->cap : 8;
        piece_t *nv = realloc(ps->v, (size_t)nc * sizeof *nv);
        if (!nv) return dl_seterr(DL_ENOMEM, "prompts: out of memory");
        ps->v = nv;
        ps->cap = nc;
    }
    ps->v[ps->n++] = (piece_t){is_system, a, b};
    return 0;
}

/* Text of an OpenAI content: a string, or the "text" parts of an array joined
 * by nothing (as transformers' templates render text parts). Returned in a
 * cJSON-owned string when it is one; arrays are joined into *tmp (malloc'd). */
static const char *content_text(const cJSON *c, char **tmp) {
    if (cJSON_IsString(c)) return c->valuestring;
    if (!cJSON_IsArray(c)) return NULL;
    size_t n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "text");
        if (cJSON_IsString(t)) n += strlen(t->valuestring);
    }
    char *s = malloc(n + 1);
    if (!s) return NULL;
    size_t o = 0;
    cJSON_ArrayForEach(it, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "text");
        if (cJSON_IsString(t)) {
            size_t k = strlen(t->valuestring);
            memcpy(s + o, t->valuestring, k);
            o += k;
        }
    }
    s[o] = 0;
    free(*tmp);
    *tmp = s;
    return s;
}

/* Collects the pieces of one record; tmp strings owned by tmps (freed by caller). */
static int collect(const cJSON *root, prompt_kind_t *kind, pieces_t *ps, char **tmps, int ntmp) {
    const cJSON *x;
    if ((x = cJSON_GetObjectItemCaseSensitive(root, "messages")) && cJSON_IsArray(x)) {
        *kind = PROMPT_OPENAI;
        const cJSON *m;
        int i = 0;
        cJSON_ArrayForEach(m, x) {
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
            if (!cJSON_IsString(role))
                return dl_seterr(DL_EFORMAT, "messages[%d]: \"role\" missing or not a string", i);
            const char *r = role->valuestring;
            int sys = !strcmp(r, "system"), user = !strcmp(r, "user");
            if (sys || user) {
                if (sys && ps->n > 0) { i++; continue; } /* only a leading system message is kept */
                const char *t = content_text(cJSON_GetObjectItemCaseSensitive(m, "content"),
                                             &tmps[i < ntmp ? i : ntmp - 1]);
                if (!t) return dl_seterr(DL_EFORMAT, "messages[%d]: \"content\" missing or not text", i);
                DL_TRY(push(ps, sys, t, NULL));
            }
            i++;
        }
        return 0;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(root, "conversations")) && cJSON_IsArray(x)) {
        *kind = PROMPT_SHAREGPT;
        const cJSON *m;
        int i = 0;
        cJSON_ArrayForEach(m, x) {
            const cJSON *from = cJSON_GetObjectItemCaseSensitive(m, "from");
            const cJSON *val = cJSON_GetObjectItemCaseSensitive(m, "value");
            if (!cJSON_IsString(from) || !cJSON_IsString(val))
                return dl_seterr(DL_EFORMAT, "conversations[%d]: \"from\"/\"value\" missing or not strings", i);
            const char *f = from->valuestring;
            int sys = !strcmp(f, "system"), user = !strcmp(f, "human") || !strcmp(f, "user");
            if (sys && ps->n == 0) DL_TRY(push(ps, 1, val->valuestring, NULL));
            else if (user) DL_TRY(push(ps, 0, val->valuestring, NULL));
            i++;
        }
        return 0;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(root, "turns")) && cJSON_IsArray(x)) {
        *kind = PROMPT_TURNS;
        const cJSON *m;
        int i = 0;
        cJSON_ArrayForEach(m, x) {
            if (!cJSON_IsString(m)) return dl_seterr(DL_EFORMAT, "turns[%d]: not a string", i);
            DL_TRY(push(ps, 0, m->valuestring, NULL));
            i++;
        }
        return 0;
    }
    static const struct { const char *field; prompt_kind_t kind; } flat[] = {
        {"prompt", PROMPT_PROMPT}, {"question", PROMPT_QUESTION}, {"instruction", PROMPT_INSTRUCTION}};
    for (size_t k = 0; k < sizeof flat / sizeof flat[0]; k++) {
        x = cJSON_GetObjectItemCaseSensitive(root, flat[k].field);
        if (!x) continue;
        if (!cJSON_IsString(x)) return dl_seterr(DL_EFORMAT, "\"%s\": not a string", flat[k].field);
        *kind = flat[k].kind;
        const cJSON *sys = cJSON_GetObjectItemCaseSensitive(root, "system");
        if (cJSON_IsString(sys) && sys->valuestring[0]) DL_TRY(push(ps, 1, sys->valuestring, NULL));
        const cJSON *in = flat[k].kind == PROMPT_INSTRUCTION ? cJSON_GetObjectItemCaseSensitive(root, "input") : NULL;
        DL_TRY(push(ps, 0, x->valuestring, cJSON_IsString(in) && in->valuestring[0] ? in->valuestring : NULL));
        return 0;
    }
    return dl_seterr(DL_EFORMAT, "no prompt field (messages, conversations, turns, prompt, "
                     "question or instruction)");
}

int prompt_parse(const char *rec, size_t len, prompt_t *out) {
    prompt_free(out);
    cJSON *root = cJSON_ParseWithLength(rec, len);
    if (!root) return dl_seterr(DL_EFORMAT, "invalid JSON");
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dl_seterr(DL_EFORMAT, "record is not a JSON object");
    }
    enum { NTMP = 256 };
    char *tmps[NTMP] = {0};
    pieces_t ps = {0};
    prompt_kind_t kind = PROMPT_OPENAI;
    int rc = collect(root, &kind, &ps, tmps, NTMP);
    int n_user = 0;
    for (int i = 0; rc == 0 && i < ps.n; i++) n_user += !ps.v[i].is_system;
    if (rc == 0 && n_user == 0) rc = dl_seterr(DL_EFORMAT, "no user turn");
    if (rc == 0) {
        size_t total = 0;
        for (int i = 0; i < ps.n; i++)
            total += strlen(ps.v[i].a) + (ps.v[i].b ? 2 + strlen(ps.v[i].b) : 0) + 1;
        out->buf_ = malloc(total ? total : 1);
        out->msgs = calloc((size_t)(unsigned)ps.n, sizeof *out->msgs);
        if (!out->buf_ || !out->msgs) {
            rc = dl_seterr(DL_ENOMEM, "prompts: out of memory");
        } else {
            char *w = out->buf_;
            for (int i = 0; i < ps.n; i++) {
                char *start = w;
                size_t la = strlen(ps.v[i].a);
                memcpy(w, ps.v[i].a, la), w += la;
                if (ps.v[i].b) {
                    size_t lb = strlen(ps.v[i].b);
                    memcpy(w, "\n\n", 2), w += 2;
                    memcpy(w, ps.v[i].b, lb), w += lb;
                }
                *w++ = 0;
                out->msgs[i] = (chat_msg_t){ps.v[i].is_system ? "system" : "user", start,
                                            (size_t)(w - 1 - start)};
            }
            out->n_msgs = ps.n;
            out->has_system = ps.n > 0 && ps.v[0].is_system;
            out->kind = kind;
        }
    }
    for (int i = 0; i < NTMP; i++) free(tmps[i]);
    free(ps.v);
    cJSON_Delete(root);
    if (rc < 0) prompt_free(out);
    return rc;
}

struct prompt_reader {
    ds_reader_t *ds;
};

int prompt_reader_open(const char *path, prompt_reader_t **out) {
    *out = NULL;
    prompt_reader_t *r = calloc(1, sizeof *r);
    if (!r) return dl_seterr(DL_ENOMEM, "prompts: out of memory");
    ds_opts_t o = {0};
    int rc = ds_open(path, &o, &r->ds);
    if (rc < 0) {
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void prompt_reader_close(prompt_reader_t **rp) {
    if (!rp || !*rp) return;
    ds_close(&(*rp)->ds);
    free(*rp);
    *rp = NULL;
}

int prompt_reader_next(prompt_reader_t *r, prompt_t *out) {
    for (;;) {
        const char *rec;
        size_t len;
        uint64_t line;
        int rc = ds_next_raw(r->ds, &rec, &len, &line);
        if (rc <= 0) return rc;
        rc = prompt_parse(rec, len, out);
        if (rc == 0) {
            out->line = line;
            return 1;
        }
        if (rc != DL_EFORMAT) return rc;
        char why[512];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        DL_TRY(ds_report_bad(r->ds, line, why));
    }
}

uint64_t prompt_reader_skipped(const prompt_reader_t *r) { return ds_skipped(r->ds); }

int prompt_set_load(const char *path, int limit, prompt_set_t *out) {
    memset(out, 0, sizeof *out);
    prompt_reader_t *r = NULL;
    DL_TRY(prompt_reader_open(path, &r));
    int cap = 0, rc = 0;
    while (limit <= 0 || out->n < limit) {
        if (out->n == cap) {
            int nc = cap ? 2 * cap : 64;
            prompt_t *nv = realloc(out->items, (size_t)nc * sizeof *nv);
            if (!nv) { rc = dl_seterr(DL_ENOMEM, "prompts: out of memory"); break; }
            memset(nv + cap, 0, (size_t)(nc - cap) * sizeof *nv);
            out->items = nv;
            cap = nc;
        }
        rc = prompt_reader_next(r, &out->items[out->n]);
        if (rc <= 0) break;
        out->n++;
        rc = 0;
    }
    prompt_reader_close(&r);
    if (rc < 0) {
        prompt_set_free(out);
        return rc;
    }
    if (out->n == 0) return dl_seterr(DL_EFORMAT, "%s: no prompts found", path);
    return 0;
}

void prompt_set_free(prompt_set_t *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) prompt_free(&s->items[i]);
    free(s->items);
    memset(s, 0, sizeof *s);
}

int prompt_encode(const prompt_t *p, int n_turns, const char *const *replies,
                  const chat_template_t *ct, const tok_t *tok, tok_ids_t *ids) {
    if (n_turns < 1 || n_turns > prompt_n_turns(p))
        return dl_seterr(DL_EINVAL, "prompt_encode: %d turns (prompt has %d)", n_turns, prompt_n_turns(p));
    if (n_turns > 1 && !replies) return dl_seterr(DL_EINVAL, "prompt_encode: replies missing");
    int cap = 2 * n_turns + 1, n = 0;
    chat_msg_t *m = malloc((size_t)cap * sizeof *m);
    if (!m) return dl_seterr(DL_ENOMEM, "prompts: out of memory");
    int u = p->has_system ? 1 : 0;
    if (p->has_system) m[n++] = p->msgs[0];
    for (int t = 0; t < n_turns; t++) {
        m[n++] = p->msgs[u + t];
        if (t < n_turns - 1) m[n++] = (chat_msg_t){"assistant", replies[t], strlen(replies[t])};
    }
    int rc = chat_encode_prompt(ct, tok, m, n, ids);
    free(m);
    return rc;
}
