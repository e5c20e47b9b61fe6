/* Training checkpoints of the pipeline (written by the optimizer).
 *
 * <out>/checkpoints/step_<N>/   (N = optimizer steps applied)
 *   model.safetensors   the drafter in the public DFlash layout, F32: exactly the master
 *   config.json         weights (P f32, tensors in master order), and its config, both
 *                       written by dflash_ckpt_save (common/model/dflash_ckpt.h): what
 *                       DFlashDraftModel loads
 *   state.bin           exact training state, version 2: header + Adam m, v (P f32 each);
 *                       the master comes from model.safetensors (written once, not twice).
 *                       The header holds a CRC-32 of header + m + v and one of the master
 *                       bytes (ckpt_read, ckpt_verify). Version 1 (still read): header +
 *                       master + m + v, one CRC-32 of all of it.
 *   cursor.bin          loader cursor (batcher_cursor_encode, 40 bytes): the first
 *                       micro-batch of step N
 * Bytes per checkpoint: 12 P + a few KB (headers, config.json, cursor.bin); version 1:
 * 16 P + the same.
 * Atomic: written into step_<N>.tmp, every file fsync'd, the directory renamed,
 * then <out>/checkpoints/latest (text "step_<N>") replaced by rename. A crash
 * leaves either the old or the new checkpoint, never a torn one.
 */
#ifndef DL_PIPE_CKPT_H
#define DL_PIPE_CKPT_H

#include "common/model/drafter.h"

#include <stddef.h>
#include <stdint.h>

#define CKPT_MAGIC "DLSTATE1"
#define CKPT_VERSION 2           /* what ckpt_write writes: no master in state.bin */
#define CKPT_VERSION_MASTER 1    /* older: master between the header and m (read) */

typedef struct {
    char magic[8];
    uint32_t version;        /* CKPT_VERSION or CKPT_VERSION_MASTER */
    uint32_t header_bytes;   /* sizeof(ckpt_state_hdr_t) */
    uint64_t step;           /* steps applied */
    uint64_t n_params;
    uint64_t seed;
    uint64_t tokens;         /* target tokens trained on so far */
    uint64_t skipped_steps;  /* NaN/Inf steps skipped */
    uint64_t mbs_per_step;
    double lr, warmup_steps, max_steps, wd, clip;  /* schedule, for a check on resume */
    /* The run settings the continuation depends on, checked by `draftline run --resume`
     * before any stage starts (tools/cmd_run.c). Carved out of what was 64 reserved
     * zero bytes: settings == 0 (checkpoints written before they were recorded) means
     * none of the fields below is set. */
    uint32_t settings;       /* CKPT_SETTINGS_V1, or 0 */
    uint32_t token_budget;   /* --token-budget (tokens per micro-batch) */
    uint32_t max_len;        /* effective --max-len (<= token_budget) */
    uint32_t num_anchors;    /* --num-anchors */
    uint32_t epochs;         /* --epochs */
    uint32_t block_size;     /* --block-size */
    uint32_t drafter_layers; /* --drafter-layers */
    uint32_t reserved_u32;   /* 0 */
    uint64_t target_fp;      /* ckpt_target_fingerprint of --target-model (0: not recorded) */
    /* Carved out of the reserved bytes since checksums (issue 15): crc_kind 0 (a
     * checkpoint written before them: crc32 and reserved are 0, nothing is verified, a
     * warning says so) or CKPT_CRC32; crc32: zlib's CRC-32 of the header with crc32 = 0,
     * then the arrays that follow it (version 1: master, m, v; version 2: m, v). */
    uint32_t crc_kind;
    uint32_t crc32;
    /* Version 2 with CKPT_CRC32: zlib's CRC-32 of the master (P f32 in master order, which
     * is model.safetensors' data section byte for byte); else 0. */
    uint32_t master_crc32;
    uint8_t reserved[12];
} ckpt_state_hdr_t;

#define CKPT_SETTINGS_V1 1u
#define CKPT_CRC32 1u

_Static_assert(sizeof(ckpt_state_hdr_t) == 168, "state.bin header layout is on disk");

/* Writes a checkpoint of drafter d with weights master (P f32, host; read in place: only
 * d's tensor table and config are used, d may be layout_only), Adam moments m, v (P f32
 * host) and the loader cursor (40 bytes, may be NULL). hdr's version, crc_kind, crc32,
 * master_crc32 and reserved bytes are ignored: state.bin is version 2 with CKPT_CRC32.
 * As fast as the disk allows: model.safetensors + config.json (dflash_ckpt_save_host, into
 * a subdir of step_<N>.tmp, moved up after) on one thread while state.bin is written
 * by 4 threads (m, v in 2 spans each, pwrite at their offsets, 64 MiB writes, CRC-32 per
 * span combined in order) and 2 more take the master's CRC-32, one fsync per file; the
 * bytes are those of a sequential write. Blocks for the whole write (call it off any loop
 * thread); master, m, v must not change until it returns. Returns 0, or DL_EIO naming
 * the file; *dir_out (cap bytes, may be NULL) gets the final dir. */
int ckpt_write(const char *out_dir, drafter_t *d, const ckpt_state_hdr_t *hdr,
               const float *master, const float *m, const float *v, const uint8_t *cursor,
               char *dir_out, size_t cap);

/* Reads checkpoint dir `dir` of drafter d (its tensor table only: d may be layout_only)
 * into hdr and master/m/v (each P = drafter_n_params(d) f32, caller-allocated; the
 * header's n_params != P: DL_EFORMAT), and cursor.bin (40 bytes, cursor may be NULL).
 * state.bin: the header's fields range-checked (ckpt_hdr_validate), m, v (version 1:
 * master, m, v), its CRC-32, when recorded, checked against the bytes read. Version 2:
 * the master from model.safetensors, every tensor of d's table in master order, F32 and
 * of its exact shape (DL_EFORMAT naming the file and the tensor), then checked against
 * the header's master_crc32 when recorded. DL_EFORMAT naming the file on a mismatch. */
int ckpt_read(const char *dir, const drafter_t *d, ckpt_state_hdr_t *hdr, float *master, float *m,
              float *v, uint8_t *cursor);

/* Reads only the header of dir/state.bin into hdr (magic and header_bytes checked:
 * DL_EFORMAT; DL_ENOENT when missing). */
int ckpt_read_hdr(const char *dir, ckpt_state_hdr_t *hdr);

/* Range checks of every field of a state.bin header h (path names the file in the
 * message): version 1 or 2; n_params >= 1; skipped_steps <= step; micro-batches per step,
 * lr, warmup_steps, max_steps, weight decay, clip within the limits `draftline run`
 * accepts for their flags (tools/cmd_run.c; the doubles finite, the step counts whole);
 * settings 0 or CKPT_SETTINGS_V1, and with V1 token_budget, max_len (<= token_budget),
 * num_anchors, epochs, block_size, drafter_layers within their flags' limits;
 * crc_kind 0 or CKPT_CRC32; reserved bytes 0 (crc32 too when crc_kind is 0, master_crc32
 * too unless version 2 with CKPT_CRC32). Returns 0, or DL_EFORMAT "PATH: field 'NAME' =
 * VALUE: why" for the first bad field. */
int ckpt_hdr_validate(const ckpt_state_hdr_t *h, const char *path);

/* What ckpt_verify could not verify: files written before checksums existed. */
enum { CKPT_UNVERIFIED_STATE = 1, CKPT_UNVERIFIED_MODEL = 2, CKPT_NO_CURSOR = 4 };

/* Checks checkpoint dir before anything trusts it (`run --resume` before any stage
 * starts, `inspect`): state.bin's header (ckpt_hdr_validate), its size (header + 2 x
 * n_params f32; version 1: 3 x) and CRC-32 (when recorded); model.safetensors' data
 * CRC-32 (dflash_ckpt_verify_weights) and, version 2 with CKPT_CRC32, that CRC (recorded
 * in its __metadata__) against state.bin's master_crc32, so a model.safetensors of
 * another checkpoint is refused without a second read of it; cursor.bin's check word
 * (batcher_cursor_decode), its seed and its micro-batch (step x micro-batches per step)
 * against the header's. Reads every byte of state.bin and model.safetensors once (I/O
 * bound). *unverified (may be NULL) gets CKPT_UNVERIFIED_* / CKPT_NO_CURSOR bits for what
 * was not checked. Returns 0, or DL_ENOENT / DL_EIO / DL_EFORMAT with a one-line message
 * naming the file. */
int ckpt_verify(const char *dir, unsigned *unverified);

/* The rest of what ckpt_read needs of a version-2 checkpoint dir (call it after
 * ckpt_verify, which checks model.safetensors' data against state.bin's master_crc32
 * but knows no tensor table): model.safetensors' header holds every tensor of the
 * drafter of config dc (its layout_only table, built here: as the optimizer builds it)
 * as F32 of its shape at its place in the master (data offsets 4 x offset .. 4 x
 * (offset + numel)), so ckpt_read of a verified dir reads exactly the master the CRC
 * covers. A header edited into valid JSON (a tensor renamed, retyped, reshaped or moved)
 * is refused here, before any stage starts, instead of by the optimizer's ckpt_read.
 * Reads state.bin's header and model.safetensors' header only. Version 1: 0 (the master
 * is in state.bin; model.safetensors is not read back). Returns 0, or DL_ENOENT /
 * DL_EIO / DL_EFORMAT "PATH: tensor 'NAME' ..." naming the file and the tensor. */
int ckpt_verify_layout(const char *dir, const drafter_config_t *dc);

/* Fingerprint of a target model for the --resume check: FNV-1a 64 over, for a file
 * (GGUF), its size and 64 evenly spaced 4 KiB samples of its bytes; for a directory (HF
 * layout), the same over its config.json and each *.safetensors / *.gguf file in name
 * order (with the names). Cheap (<= 256 KiB read per file) and independent of the path,
 * so a moved or copied model keeps it; any change of size or of the sampled bytes (a
 * different model or quantisation) changes it. Never 0 on success. Returns 0, or DL_EIO
 * naming the file. */
int ckpt_target_fingerprint(const char *path, uint64_t *fp);

/* Resolves --resume PATH: a checkpoint dir (has state.bin), or a run dir (its
 * checkpoints/latest). Writes the checkpoint dir into out. DL_ENOENT if none. */
int ckpt_resolve(const char *path, char *out, size_t cap);

/* Checkpoint retention (`--keep-checkpoints N`, like HF Trainer's save_total_limit), run
 * by the optimizer right after ckpt_write made `latest` name a new checkpoint: removes the
 * oldest (lowest step) complete checkpoint dirs of <out_dir>/checkpoints until at most
 * `keep` remain. Never removes the one `latest` names, nor one of a higher step (left by
 * the run's training before it was resumed from an older checkpoint: the furthest-trained
 * weights stay until this run writes that step, which replaces them), nor `protect` (the dir the run
 * was resumed from, compared by real path; may be NULL; the caller passes it until a
 * newer checkpoint exists). Conservative: only a directory (not a link) named exactly
 * step_<digits> that holds state.bin (magic ok, header step == <digits>, n_params ==
 * expected_params), config.json, model.safetensors, optionally cursor.bin, and nothing
 * else is a candidate (and counted); anything else is left alone. A removal is a rename
 * to step_<N>.deleting (a reader sees the whole checkpoint or none), then its files and
 * the dir are deleted; leftovers of an earlier failed deletion (step_<N>.deleting with
 * only those files) are deleted again. A removal that fails is logged (warning) and
 * skipped. keep <= 0: nothing is done (keep all). Returns the number of checkpoints
 * removed, or DL_ENOENT / DL_EIO (latest or the directory unreadable: nothing removed). */
int ckpt_prune(const char *out_dir, int64_t keep, uint64_t expected_params, const char *protect);

#endif
