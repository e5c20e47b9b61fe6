/* Chat formatting and loss masks.
 *
 * Families (the text each renders, identical to transformers'
 * apply_chat_template with the model's template):
 *   CHAT_CHATML (Qwen2/3, SmolLM2): "<|im_start|>{role}\n{content}<|im_end|>\n" per
 *     message; an optional default system prompt is inserted when the first
 *     message is not a system one (SmolLM2-Instruct: "You are a helpful AI
 *     assistant named SmolLM, trained by Hugging Face"); generation prompt
 *     "<|im_start|>assistant\n".
 *   CHAT_LLAMA3: "<|begin_of_text|>" then per message
 *     "<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>";
 *     generation prompt "<|start_header_id|>assistant<|end_header_id|>\n\n".
 *
 * Loss mask: the whole rendered conversation is tokenized in one pass (so
 * tokens are exactly those of tokenizing the rendered text); a token gets mask
 * 1 when its first byte lies inside an assistant message's content or its
 * end-of-turn token (<|im_end|> / <|eot_id|>), 0 elsewhere (headers, system,
 * user, the "\n" after end-of-turn).
 */
#ifndef DL_DATA_CHAT_H
#define DL_DATA_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/data/tokenizer.h"

typedef enum { CHAT_CHATML = 0, CHAT_LLAMA3 = 1 } chat_family_t;

#define CHAT_SYSTEM_MAX 1024

typedef struct {
    chat_family_t family;
    char default_system[CHAT_SYSTEM_MAX]; /* "" = none */
} chat_template_t;

typedef struct {
    const char *role;     /* "system", "user", "assistant" (others rendered as given) */
    const char *content;  /* UTF-8, not necessarily NUL-terminated */
    size_t content_len;
} chat_msg_t;

/* Selects the template from the tokenizer: its chat_template source when
 * present (ChatML if it mentions <|im_start|>, Llama-3 if <|start_header_id|>;
 * a literal default system prompt is extracted from the branch taken when
 * messages[0] is not a system message), otherwise from its special tokens.
 * DL_ENOTSUP when neither identifies a family. */
int chat_template_from_tok(const tok_t *t, chat_template_t *out);

/* Forced by name: "chatml" (no default system), "qwen" (= chatml), "smollm2"
 * (chatml + SmolLM2's default system prompt), "llama3". DL_EINVAL otherwise. */
int chat_template_by_name(const char *name, chat_template_t *out);

/* Renders msgs[n] to text (malloc'd, NUL-terminated, *len). add_generation_prompt
 * appends the assistant header (used by `draftline generate`). If spans is not
 * NULL it gets a malloc'd array of 2*(*n_spans) byte offsets [start,end) of the
 * trained regions (assistant content + end-of-turn token). */
int chat_render(const chat_template_t *ct, const chat_msg_t *msgs, int n, int add_generation_prompt,
                char **text, size_t *len, uint32_t **spans, int *n_spans);

/* Renders and tokenizes msgs[n]; appends ids to *ids and one mask byte per id
 * to *mask (caller-owned growable buffer: *mask realloc'd, *mask_cap updated).
 * *n_assistant gets the number of mask-1 tokens. */
int chat_encode(const chat_template_t *ct, const tok_t *t, const chat_msg_t *msgs, int n,
                tok_ids_t *ids, uint8_t **mask, size_t *mask_cap, uint64_t *n_assistant);

/* Prompt for generation: renders msgs[n] with the generation prompt and
 * tokenizes it into *ids (appended). */
int chat_encode_prompt(const chat_template_t *ct, const tok_t *t, const chat_msg_t *msgs, int n,
                       tok_ids_t *ids);

const char *chat_family_name(chat_family_t f);

#endif
