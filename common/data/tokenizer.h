/* Byte-level BPE tokenizer (GPT-2 family: Llama-3, Qwen2/3, SmolLM2).
 *
 * Pipeline of encode, as in Hugging Face `tokenizers` (tokenizers/src/models/bpe,
 * pre_tokenizers/byte_level.rs, split.rs, digits.rs):
 *   1. added/special tokens are matched first (leftmost, longest) and emitted as
 *      their ids; the text between them goes through steps 2-4;
 *   2. pre-tokenizer: a chain of regex splits (PCRE2, UTF-8 + Unicode properties,
 *      JIT when available), each "Isolated": matches and the gaps between them
 *      become pieces. The known regexes (GPT-2, Llama-3, Qwen2, digits) run on
 *      a stand-in text whose classes come from Unicode 16.0, as in `tokenizers`
 *      (uclass.h); a custom Split regex runs on the text with PCRE2's tables;
 *   3. each piece's bytes start as one symbol per byte (the GPT-2 byte-to-unicode
 *      mapping is undone at load, so the vocab is keyed by raw bytes);
 *   4. adjacent pairs are merged by lowest merge rank until none applies
 *      (min-heap over a linked list of symbols). With `ignore_merges` (Llama-3)
 *      a piece that is itself in the vocab is emitted directly.
 * Decode concatenates each id's raw bytes (added tokens: their literal text).
 *
 * Normalizers: "NFC" (Qwen2/3; also applied for GGUF pre "qwen2", as HF does)
 * is applied to the text between added tokens (nfc.c, utf8proc: Unicode 15);
 * offsets point into the caller's unnormalized text. Other normalizers give
 * DL_ENOTSUP at load.
 *
 * Thread safety: a loaded tok_t is read-only; tok_encode/tok_decode may run on
 * many threads at once.
 */
#ifndef DL_DATA_TOKENIZER_H
#define DL_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tok tok_t;

/* Growable id vector (optionally with byte offsets). Zero-initialise, then
 * append with tok_encode; free with tok_ids_free. */
typedef struct {
    int32_t *ids;     /* (n) token ids */
    uint32_t *offs;   /* (n) byte offset of each token's first byte in the encoded
                         text; only filled when want_offsets was set */
    size_t n, cap;
    int want_offsets;
    size_t n_dropped;     /* bytes the vocabulary has no token for (invalid UTF-8 such as
                             0xC0, 0xFE, 0xFF for SmolLM2), dropped by tok_encode; counted
                             across calls, the caller resets it */
    int dropped_byte;     /* the first such byte (0..255), valid when n_dropped > 0 */
} tok_ids_t;

void tok_ids_free(tok_ids_t *v);
/* Ensures room for `extra` more ids; 0 or DL_ENOMEM. */
int tok_ids_reserve(tok_ids_t *v, size_t extra);
/* Appends one id (offset `off` when offsets are on). */
int tok_ids_push(tok_ids_t *v, int32_t id, uint32_t off);

/* Loads a Hugging Face tokenizer.json (model.type "BPE" with byte-level
 * pre-tokenization). Supported pre_tokenizer forms: ByteLevel (use_regex: GPT-2
 * regex), Sequence of Split(Regex, Isolated) / Digits(individual_digits) /
 * ByteLevel. If a tokenizer_config.json sits next to it, its chat_template is
 * kept (tok_chat_template). Errors: DL_EIO, DL_EFORMAT (naming the field),
 * DL_ENOTSUP (a model/pre-tokenizer this code does not implement). */
int tok_load_json(const char *path, tok_t **out);

/* Loads from GGUF metadata: tokenizer.ggml.model must be "gpt2";
 * tokenizer.ggml.{tokens,merges,token_type,pre,bos_token_id,eos_token_id,
 * padding_token_id} and tokenizer.chat_template. token_type 3 (control) and 4
 * (user defined) become added tokens. `pre` names the regex set as llama.cpp
 * does (llama-vocab.cpp): "gpt2"/"default", "llama-bpe"/"llama3", "qwen2",
 * "smollm"; others give DL_ENOTSUP. */
int tok_load_gguf(const char *path, tok_t **out);

/* Dispatch on the file: *.gguf -> tok_load_gguf, a directory -> its
 * tokenizer.json, otherwise tok_load_json. */
int tok_load(const char *path, tok_t **out);

void tok_destroy(tok_t **t);

/* Encodes text[0..len) (UTF-8; invalid UTF-8 is not rejected: the regex runs
 * without UTF checks only on valid text, invalid bytes are byte-encoded, and a byte
 * the vocabulary has no token for is dropped and counted in out->n_dropped). Appends to
 * *out. parse_special: 1 matches added/special tokens in the text (HF default),
 * 0 treats all text as plain. Offsets, when out->want_offsets, are byte offsets
 * relative to `text` plus `base_off`. Returns 0, DL_ENOMEM, DL_EFORMAT (regex
 * engine failure). */
int tok_encode(const tok_t *t, const char *text, size_t len, int parse_special,
               uint32_t base_off, tok_ids_t *out);

/* Decodes ids[n] to a malloc'd NUL-terminated string (*out, length *out_len;
 * caller frees). skip_special: 1 drops special added tokens. Unknown ids give
 * DL_ERANGE. */
int tok_decode(const tok_t *t, const int32_t *ids, size_t n, int skip_special, char **out,
               size_t *out_len);

/* Vocabulary size (largest id + 1). */
int32_t tok_n_vocab(const tok_t *t);
/* Id of an exact token string (raw bytes for BPE tokens, literal text for added
 * tokens), or -1. */
int32_t tok_token_id(const tok_t *t, const char *s);
/* Raw bytes of token id (not NUL-terminated): NULL if id out of range. */
const char *tok_token_bytes(const tok_t *t, int32_t id, size_t *len);
/* 1 if id is a special added token. */
int tok_is_special(const tok_t *t, int32_t id);
/* Special ids from the model metadata, -1 when unknown. */
int32_t tok_bos_id(const tok_t *t);
int32_t tok_eos_id(const tok_t *t);
int32_t tok_pad_id(const tok_t *t);
/* Chat template source (Jinja) from the GGUF or tokenizer_config.json, or NULL. */
const char *tok_chat_template(const tok_t *t);
/* Short name of the pre-tokenizer ("gpt2", "llama3", "qwen2", "smollm", "custom"). */
const char *tok_pre_name(const tok_t *t);
/* 64-bit FNV-1a fingerprint over vocab bytes, merges, added tokens and regexes:
 * two tokenizers with the same fingerprint encode identically. */
uint64_t tok_fingerprint(const tok_t *t);

#endif
