/* Streaming dataset readers: chat samples out of JSON Lines (optionally .gz) or
 * one JSON array file, record by record, never the whole file in memory.
 *
 * Record forms (format DS_AUTO picks per record, in this order):
 *   openai:   {"messages":[{"role":..,"content":..},...]}
 *   sharegpt: {"conversations":[{"from":..,"value":..},...]}  from: human/user ->
 *             user, gpt/assistant/chatgpt/bing/bard/model -> assistant, system
 *   fields:   {prompt_field: "...", response_field: "..."} -> user, assistant
 *             (only when the fields are configured)
 *   text:     {"text": "..."}  (raw text; every token is trained)
 * A file whose first non-blank byte is '[' is a JSON array: its elements are
 * split out by an incremental bracket/string scanner and parsed one by one.
 *
 * A bad record (invalid JSON, missing/mistyped field) is reported at warn level
 * as "file:line: reason" (line of its first byte) and skipped; with strict it is
 * an error (DL_EFORMAT, same detail).
 */
#ifndef DL_DATA_DATASET_H
#define DL_DATA_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "common/data/chat.h"

typedef enum { DS_AUTO = 0, DS_OPENAI, DS_SHAREGPT, DS_TEXT, DS_FIELDS } ds_format_t;

typedef struct {
    ds_format_t format;
    const char *prompt_field;    /* DS_FIELDS / auto: e.g. "question" (NULL = unset) */
    const char *response_field;  /* e.g. "answer" */
    const char *system_field;    /* optional system prompt field, NULL = none */
    int strict;                  /* 1: a bad record is fatal */
} ds_opts_t;

/* One parsed sample. Strings point into `buf_` (owned); valid until the next
 * ds_parse/ds_next on the same sample or ds_sample_free. */
typedef struct {
    int is_text;          /* 1: `text` sample (no chat formatting) */
    const char *text;     /* is_text: the text (NUL-terminated), text_len bytes */
    size_t text_len;
    chat_msg_t *msgs;     /* !is_text: n_msgs messages */
    int n_msgs, cap_msgs;
    char *buf_;           /* owned storage */
    size_t buf_len_, buf_cap_;
} ds_sample_t;

void ds_sample_free(ds_sample_t *s);

typedef struct ds_reader ds_reader_t;

/* Opens path (".gz" -> zlib, else plain; "-" not supported). opts is copied
 * (field name strings must outlive the reader). A name ending in .gz whose
 * first bytes are not the gzip magic is DL_EFORMAT "PATH: not a gzip file". */
int ds_open(const char *path, const ds_opts_t *opts, ds_reader_t **out);
void ds_close(ds_reader_t **r);

/* Next raw record: *rec points at its JSON text (rec_len bytes, NUL-terminated,
 * valid until the next call), *line its 1-based line number. Blank lines are
 * skipped. Returns 1 (record), 0 (end), or <0 (I/O error, or an unterminated
 * array element: DL_EFORMAT). */
int ds_next_raw(ds_reader_t *r, const char **rec, size_t *rec_len, uint64_t *line);

/* Parses one record (pure; thread-safe with distinct samples). Returns 0 or
 * DL_EFORMAT with detail (without file:line; callers prefix it). */
int ds_parse(const ds_opts_t *opts, const char *rec, size_t rec_len, ds_sample_t *out);

/* ds_next_raw + ds_parse, skipping (and counting) bad records unless strict.
 * Returns 1 (sample), 0 (end), <0 error ("file:line: reason"). */
int ds_next(ds_reader_t *r, ds_sample_t *out);

/* Records a bad record (warn log for the first 10, skip count; ds_close logs
 * "... N more bad lines" for the rest) or, with strict, returns
 * DL_EFORMAT "file:line: <dl_errmsg>". For callers that parse themselves
 * (parallel prepare). */
int ds_report_bad(ds_reader_t *r, uint64_t line, const char *why);

/* Records that line's sample lost n_bytes bytes the tokenizer cannot encode
 * (tok_ids_t.n_dropped; byte: the first of them): a warn log "file:line: ..." for
 * the first 10 such lines, counted for the rest (ds_close logs "... N more"); the
 * sample is kept. With strict, DL_EFORMAT with the same detail. */
int ds_report_dropped(ds_reader_t *r, uint64_t line, uint64_t n_bytes, int byte);

uint64_t ds_skipped(const ds_reader_t *r);
/* Bytes consumed from the (decompressed) stream so far. */
uint64_t ds_bytes_read(const ds_reader_t *r);
const char *ds_path(const ds_reader_t *r);

/* "auto|openai|sharegpt|text|fields" -> format; DL_EINVAL otherwise. */
int ds_parse_format(const char *s, ds_format_t *out);

#endif
