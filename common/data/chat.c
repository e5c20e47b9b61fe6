/* Chat templates (see chat.h). The renderings follow the Jinja templates of
 * SmolLM2-135M-Instruct (GGUF tokenizer.chat_template), Qwen2/3 (ChatML) and
 * Meta-Llama-3-8B-Instruct (tokenizer_config.json). */
#include "common/data/chat.h"

#include "common/base/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SMOLLM2_SYSTEM[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

const char *chat_family_name(chat_family_t f) {
    return f == CHAT_LLAMA3 ? "llama3" : "chatml";
}

int chat_template_by_name(const char *name, chat_template_t *out) {
    memset(out, 0, sizeof *out);
    if (!strcmp(name, "chatml") || !strcmp(name, "qwen") || !strcmp(name, "qwen2") || !strcmp(name, "qwen3")) {
        out->family = CHAT_CHATML;
        return 0;
    }
    if (!strcmp(name, "smollm2") || !strcmp(name, "smollm")) {
        out->family = CHAT_CHATML;
        snprintf(out->default_system, sizeof out->default_system, "%s", SMOLLM2_SYSTEM);
        return 0;
    }
    if (!strcmp(name, "llama3") || !strcmp(name, "llama-3")) {
        out->family = CHAT_LLAMA3;
        return 0;
    }
    return dl_seterr(DL_EINVAL, "--chat-template: unknown template '%s' (chatml, qwen, smollm2, llama3)", name);
}

/* Finds the literal default system prompt in a ChatML template: the text
 * between "<|im_start|>system" + newline (real or escaped) and "<|im_end|>",
 * when it is plain text (no Jinja expression). */
static void find_default_system(const char *tpl, char *out, size_t cap) {
    const char *p = tpl;
    out[0] = 0;
    while ((p = strstr(p, "<|im_start|>system")) != NULL) {
        p += strlen("<|im_start|>system");
        if (*p == '\n') p++;
        else if (p[0] == '\\' && p[1] == 'n') p += 2;
        else continue;
        const char *e = strstr(p, "<|im_end|>");
        if (!e || e == p) continue;
        size_t n = (size_t)(e - p);
        if (memchr(p, '\'', n) || memchr(p, '"', n) || memchr(p, '{', n) || memchr(p, '}', n) ||
            memchr(p, '+', n) || memchr(p, '\\', n) || n >= cap)
            continue;
        memcpy(out, p, n);
        out[n] = 0;
        return;
    }
}

int chat_template_from_tok(const tok_t *t, chat_template_t *out) {
    memset(out, 0, sizeof *out);
    const char *tpl = tok_chat_template(t);
    if (tpl && strstr(tpl, "<|im_start|>")) {
        out->family = CHAT_CHATML;
        find_default_system(tpl, out->default_system, sizeof out->default_system);
        return 0;
    }
    if (tpl && strstr(tpl, "<|start_header_id|>")) {
        out->family = CHAT_LLAMA3;
        return 0;
    }
    if (tok_token_id(t, "<|im_start|>") >= 0 && tok_token_id(t, "<|im_end|>") >= 0) {
        out->family = CHAT_CHATML;
        return 0;
    }
    if (tok_token_id(t, "<|start_header_id|>") >= 0 && tok_token_id(t, "<|eot_id|>") >= 0) {
        out->family = CHAT_LLAMA3;
        return 0;
    }
    return dl_seterr(DL_ENOTSUP, "chat template: neither ChatML nor Llama-3 (no template, no <|im_start|> or "
                                 "<|start_header_id|> token); pass --chat-template");
}

/* ---- rendering ---------------------------------------------------------------- */

typedef struct { char *s; size_t n, cap; } sbuf_t;

static int sb_put(sbuf_t *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) return dl_seterr(DL_ENOMEM, "chat: %zu bytes", cap);
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}
#define SB_LIT(b, lit) sb_put((b), (lit), sizeof(lit) - 1)

/* Python str.isspace() for the code point starting at s (length *l). */
static int py_space(const unsigned char *s, size_t n, size_t *l) {
    *l = 1;
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0 && n >= 2) { cp = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu); *l = 2; }
    else if ((c & 0xF0) == 0xE0 && n >= 3) { cp = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu); *l = 3; }
    else return 0;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Jinja `trim` (Python str.strip()). */
static void trim(const char **s, size_t *n) {
    const unsigned char *p = (const unsigned char *)*s;
    size_t len = *n, l;
    while (len && py_space(p, len, &l)) { p += l; len -= l; }
    /* from the end: step back over one code point at a time */
    for (;;) {
        if (!len) break;
        size_t k = len - 1;
        while (k > 0 && (p[k] & 0xC0) == 0x80) k--;
        if (py_space(p + k, len - k, &l) && l == len - k) len = k;
        else break;
    }
    *s = (const char *)p;
    *n = len;
}

int chat_render(const chat_template_t *ct, const chat_msg_t *msgs, int n, int add_generation_prompt,
                char **text, size_t *len, uint32_t **spans, int *n_spans) {
    sbuf_t b = {0};
    uint32_t *sp = NULL;
    int nsp = 0, rc = 0;
    if (spans) {
        sp = malloc(sizeof *sp * 2 * (size_t)(n > 0 ? n : 1));
        if (!sp) return dl_seterr(DL_ENOMEM, "chat: spans");
    }
    if ((rc = sb_put(&b, "", 0)) < 0) goto fail;
    for (int i = 0; i < n; i++) {
        const chat_msg_t *m = &msgs[i];
        const char *c = m->content ? m->content : "";
        size_t cl = m->content ? m->content_len : 0;
        int is_asst = !strcmp(m->role, "assistant");
        if (ct->family == CHAT_CHATML) {
            if (i == 0 && ct->default_system[0] && strcmp(m->role, "system")) {
                if ((rc = SB_LIT(&b, "<|im_start|>system\n")) < 0 ||
                    (rc = sb_put(&b, ct->default_system, strlen(ct->default_system))) < 0 ||
                    (rc = SB_LIT(&b, "<|im_end|>\n")) < 0)
                    goto fail;
            }
            if ((rc = SB_LIT(&b, "<|im_start|>")) < 0 || (rc = sb_put(&b, m->role, strlen(m->role))) < 0 ||
                (rc = SB_LIT(&b, "\n")) < 0)
                goto fail;
            size_t start = b.n;
            if ((rc = sb_put(&b, c, cl)) < 0 || (rc = SB_LIT(&b, "<|im_end|>")) < 0) goto fail;
            if (is_asst && sp) { sp[2 * nsp] = (uint32_t)start; sp[2 * nsp + 1] = (uint32_t)b.n; nsp++; }
            if ((rc = SB_LIT(&b, "\n")) < 0) goto fail;
        } else {
            if (i == 0 && (rc = SB_LIT(&b, "<|begin_of_text|>")) < 0) goto fail;
            trim(&c, &cl);
            if ((rc = SB_LIT(&b, "<|start_header_id|>")) < 0 || (rc = sb_put(&b, m->role, strlen(m->role))) < 0 ||
                (rc = SB_LIT(&b, "<|end_header_id|>\n\n")) < 0)
                goto fail;
            size_t start = b.n;
            if ((rc = sb_put(&b, c, cl)) < 0 || (rc = SB_LIT(&b, "<|eot_id|>")) < 0) goto fail;
            if (is_asst && sp) { sp[2 * nsp] = (uint32_t)start; sp[2 * nsp + 1] = (uint32_t)b.n; nsp++; }
        }
    }
    if (add_generation_prompt) {
        rc = ct->family == CHAT_CHATML ? SB_LIT(&b, "<|im_start|>assistant\n")
                                       : SB_LIT(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        if (rc < 0) goto fail;
    }
    if (b.n > UINT32_MAX) { rc = dl_seterr(DL_ERANGE, "chat: conversation of %zu bytes (max 4 GiB)", b.n); goto fail; }
    *text = b.s;
    if (len) *len = b.n;
    if (spans) { *spans = sp; *n_spans = nsp; }
    return 0;
fail:
    free(b.s);
    free(sp);
    return rc;
}

int chat_encode(const chat_template_t *ct, const tok_t *t, const chat_msg_t *msgs, int n, tok_ids_t *ids,
                uint8_t **mask, size_t *mask_cap, uint64_t *n_assistant) {
    char *text = NULL;
    size_t len;
    uint32_t *sp = NULL;
    int nsp = 0;
    DL_TRY(chat_render(ct, msgs, n, 0, &text, &len, &sp, &nsp));
    size_t n0 = ids->n;
    tok_ids_t v = {.want_offsets = 1};
    int rc = tok_encode(t, text, len, 1, 0, &v);
    if (rc < 0) goto done;
    if ((rc = tok_ids_reserve(ids, v.n)) < 0) goto done;
    if (*mask_cap < n0 + v.n) {
        size_t cap = (n0 + v.n) * 2;
        uint8_t *nm = realloc(*mask, cap);
        if (!nm) { rc = dl_seterr(DL_ENOMEM, "chat: mask of %zu", cap); goto done; }
        *mask = nm;
        *mask_cap = cap;
    }
    uint64_t na = 0;
    int s = 0;
    for (size_t i = 0; i < v.n; i++) {
        uint32_t o = v.offs[i];
        while (s < nsp && o >= sp[2 * s + 1]) s++;
        uint8_t m = (s < nsp && o >= sp[2 * s]) ? 1 : 0;
        (*mask)[n0 + i] = m;
        na += m;
        if ((rc = tok_ids_push(ids, v.ids[i], o)) < 0) goto done;
    }
    if (n_assistant) *n_assistant = na;
done:
    tok_ids_free(&v);
    free(text);
    free(sp);
    return rc;
}

int chat_encode_prompt(const chat_template_t *ct, const tok_t *t, const chat_msg_t *msgs, int n, tok_ids_t *ids) {
    char *text = NULL;
    size_t len;
    DL_TRY(chat_render(ct, msgs, n, 1, &text, &len, NULL, NULL));
    int rc = tok_encode(t, text, len, 1, 0, ids);
    free(text);
    return rc;
}
