/* Prepared dataset cache (.dlc): tokenized samples + loss masks + offset index,
 * written once by `draftline prepare`, memory-mapped by the loader for O(1)
 * access to any sample.
 *
 * File layout (little-endian):
 *   [0, 128)        header: dlc_header_t
 *   ids_off         n_tokens  x int32  token ids, samples back to back
 *   mask_off        n_tokens  x uint8  loss mask (1 = trained token)
 *   index_off       (n_samples + 1) x uint64  token offset of each sample
 *                   (index[i]..index[i+1] are sample i's tokens)
 * Sections start at 64-byte aligned offsets. Written to "<out>.tmp.<pid>",
 * fsync'd, renamed over <out>.
 */
#ifndef DL_DATA_PREPARE_H
#define DL_DATA_PREPARE_H

#include <stddef.h>
#include <stdint.h>

#include "common/data/chat.h"
#include "common/data/dataset.h"
#include "common/data/tokenizer.h"

#define DLC_MAGIC "DLCACHE\0"
#define DLC_VERSION 1u

typedef struct {
    char magic[8];            /* DLC_MAGIC */
    uint32_t version;         /* DLC_VERSION */
    uint32_t header_size;     /* 128 */
    uint64_t n_samples;
    uint64_t n_tokens;
    uint64_t n_assistant;     /* tokens with mask 1 */
    uint64_t n_skipped;       /* bad records skipped */
    uint64_t tok_fingerprint; /* tok_fingerprint() of the tokenizer used */
    uint64_t ids_off, mask_off, index_off; /* byte offsets of the sections */
    int32_t n_vocab;
    uint32_t chat_family;     /* chat_family_t */
    uint32_t max_sample_len;  /* longest sample, tokens */
    uint8_t reserved[36];
} dlc_header_t;

typedef struct {
    const char *data_path;
    ds_opts_t ds;
    const chat_template_t *chat;  /* required for chat samples */
    int n_threads;                /* 0 = all cores (omp_get_max_threads) */
    uint32_t chunk_records;       /* records per parallel chunk; 0 = 2048 */
    const char *out_path;
    /* optional: called (on the calling thread) after each chunk is written with the
     * input bytes read so far, the records (samples + skipped), the tokens and the
     * seconds since the start; the caller decides how often to show it */
    void (*progress)(uint64_t bytes_in, uint64_t records, uint64_t tokens, double seconds, void *arg);
    void *progress_arg;
} prep_opts_t;

typedef struct {
    uint64_t samples, tokens, assistant_tokens, skipped, bytes_in;
    uint32_t max_len;
    double seconds;
} prep_stats_t;

/* Reads opts->data_path, tokenizes every sample (all threads, order kept) and
 * writes the cache atomically to opts->out_path. Samples that tokenize to 0
 * tokens are counted as skipped. 0 samples in all is DL_EFORMAT "0 samples from
 * FILE ..." with a hint (the first bad record's fields) and writes nothing. Errors: those of the dataset reader and tokenizer, plus DL_EIO. */
int prep_run(const tok_t *t, const prep_opts_t *opts, prep_stats_t *stats);

/* For a process whose job is prep_run (`draftline prepare`): SIGINT, SIGTERM and SIGHUP
 * first remove the cache file a prep_run is writing (out_path.tmp.<pid>, else left behind:
 * 70-100 MB for a big dataset), then end the process by the same signal as before (the
 * default action). Call once, before prep_run. Returns 0 or DL_EIO (sigaction failed). */
int prep_cleanup_on_signal(void);

/* --- reading ---------------------------------------------------------------- */

typedef struct dlc dlc_t;

/* Maps path read-only and validates header and index (sizes, monotonic index).
 * DL_EFORMAT naming the field on a bad file. */
int dlc_open(const char *path, dlc_t **out);
void dlc_close(dlc_t **c);

const dlc_header_t *dlc_header(const dlc_t *c);
uint64_t dlc_n_samples(const dlc_t *c);
uint64_t dlc_n_tokens(const dlc_t *c);
/* Sample i: ids/mask point into the mapping (valid until dlc_close), *len tokens.
 * DL_ERANGE if i >= n_samples. */
int dlc_sample(const dlc_t *c, uint64_t i, const int32_t **ids, const uint8_t **mask, uint32_t *len);
/* Length of sample i in tokens (0 if out of range). */
uint32_t dlc_sample_len(const dlc_t *c, uint64_t i);

/* The cache's contents, which dlc_open does not read (O(n_tokens)): every token id in
 * [0, vocab) (vocab <= 0 or above the header's n_vocab: n_vocab), every loss-mask byte 0
 * or 1, and the mask-1 count equal to n_assistant. Returns 0, or DL_EFORMAT "PATH:
 * sample S, token T: ..." for the first bad token. Run by `draftline run` before any
 * stage starts. */
int dlc_validate(const dlc_t *c, int32_t vocab);

/* The same check on n tokens of sample `sample` (ids / mask may be NULL; `at`: the
 * index of ids[0] in the sample, for the message): for a reader of single samples (the
 * loader's batcher_pack). */
int dlc_check_tokens(const dlc_t *c, uint64_t sample, const int32_t *ids, const uint8_t *mask, uint32_t n,
                     uint32_t at, int32_t vocab);

#endif
