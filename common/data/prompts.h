/* Prompt sets for evaluation and response regeneration, read as they come.
 *
 * Each JSON record (JSON Lines, optionally .gz, or a JSON array file: the
 * dataset.h reader) becomes one prompt: an optional system message and the
 * user turns, in order (assistant turns are dropped: eval and regen produce
 * their own). The form is detected per record by its fields, in this order:
 *   "messages": [{role, content}]        OpenAI chat (content: string or parts [{"text"}])
 *   "conversations": [{from, value}]     ShareGPT (human/user -> user, system -> system;
 *                                        gpt/assistant/chatgpt/bing/bard/model skipped)
 *   "turns": ["...", ...]                MT-Bench question.jsonl (each string a user turn)
 *   "prompt": "..."                      HumanEval (the code prompt is the user turn)
 *   "question": "..."                    GSM8K
 *   "instruction": "..." (+ "input")     Alpaca-style (joined by a blank line)
 * A record with none of these, or without a user turn, is skipped with a warning
 * naming file:line (never fatal), so the prompt stream is a pure function of
 * the file: the same file gives the same prompts in the same order (regen's
 * resume counts on it).
 */
#ifndef DL_DATA_PROMPTS_H
#define DL_DATA_PROMPTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/data/chat.h"
#include "common/data/tokenizer.h"

typedef enum {
    PROMPT_OPENAI = 0, PROMPT_SHAREGPT, PROMPT_TURNS, PROMPT_PROMPT, PROMPT_QUESTION,
    PROMPT_INSTRUCTION
} prompt_kind_t;

/* One prompt. msgs[0] is the system message when has_system; the rest are
 * user messages. Strings are owned by the prompt (NUL-terminated). */
typedef struct {
    prompt_kind_t kind;
    int has_system;
    int n_msgs;
    chat_msg_t *msgs;
    uint64_t line;          /* 1-based line of the record in its file */
    char *buf_;             /* owned storage of the message texts */
} prompt_t;

void prompt_free(prompt_t *p);
/* Number of user turns. */
static inline int prompt_n_turns(const prompt_t *p) { return p->n_msgs - (p->has_system ? 1 : 0); }

/* Field the kind was detected by ("messages", "turns", "question", ...). */
const char *prompt_kind_name(prompt_kind_t k);

/* Parses one JSON record (rec, len bytes) into *out (freed first). Returns 0,
 * or DL_EFORMAT with a reason (no known field, no user turn, bad JSON). */
int prompt_parse(const char *rec, size_t len, prompt_t *out);

typedef struct prompt_reader prompt_reader_t;

/* Streams prompts from path (.jsonl, .jsonl.gz, or a JSON array file).
 * DL_EIO / DL_ENOENT naming the path. */
int prompt_reader_open(const char *path, prompt_reader_t **out);
void prompt_reader_close(prompt_reader_t **r);
/* Next prompt into *out: 1, 0 at the end, <0 on an I/O error. Bad records are
 * skipped (warn log) and counted. */
int prompt_reader_next(prompt_reader_t *r, prompt_t *out);
uint64_t prompt_reader_skipped(const prompt_reader_t *r);

/* A loaded set (the first `limit` prompts of a file; limit <= 0: all). */
typedef struct {
    int n;
    prompt_t *items;
} prompt_set_t;

int prompt_set_load(const char *path, int limit, prompt_set_t *out);
void prompt_set_free(prompt_set_t *s);

/* Token ids of the prompt for generation with chat template ct: the system
 * message (if any) and user turns [0, n_turns) interleaved with the given
 * assistant replies (replies[i] for turn i < n_turns - 1; may be NULL when
 * n_turns == 1), then the assistant header (generation prompt). Appended to
 * *ids. n_turns in [1, prompt_n_turns(p)]. DL_EINVAL / tokenizer errors. */
int prompt_encode(const prompt_t *p, int n_turns, const char *const *replies,
                  const chat_template_t *ct, const tok_t *tok, tok_ids_t *ids);

#endif
