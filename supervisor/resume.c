/* `draftline run --resume`: the settings not given default to the run's, a run dir with
 * nothing to continue is reused as fresh, and the settings and data are checked against
 * the checkpoint before anything is written (see launch_int.h). */
#include "supervisor/launch_int.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/model/target.h"
#include "common/pipe/rbplan.h"
#include "common/rundir/rundir.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* --- the --resume check -----------------------------------------------------
 * `draftline run --resume` continues a run exactly, so every setting the checkpoint's
 * state, data order, micro-batch numbering or drafter shape depends on must be the
 * run's. Checked here, before any stage starts and before anything is written, from
 * state.bin's header (ckpt_state_hdr_t: seed, K, and the settings recorded since
 * CKPT_SETTINGS_V1), the drafter's config.json (shapes: every checkpoint has it) and
 * cursor.bin (dataset fingerprint, batching options). Each mismatch is one line on
 * stderr naming the flag, both values, why, and the flag to rerun with. Free to change:
 * --max-steps (warned: the LR schedule), --lr/--warmup-steps/--weight-decay/--clip
 * (warned: the continuation is no longer the uninterrupted run's), topology, threads,
 * inbox sizes, --save-every, --progress-every, --prefetch, --hs-min-ready, eval. */

typedef struct {
    const char *dir;   /* the resolved checkpoint dir */
    int n;             /* mismatches reported */
} rcheck_t;

static void rc_mismatch(rcheck_t *r, const char *flag, const char *want, const char *have, const char *why) {
    fprintf(stderr, "draftline run: --resume %s: %s %s does not match the checkpoint's %s (%s); rerun with %s %s\n",
            r->dir, flag, want, have, why, flag, have);
    r->n++;
}

/* One setting the checkpoint records, compared field by field between two run_config_t:
 * what the run asks for and what the checkpoint holds. Table order is the order of the
 * lines on stderr. */
enum {
    RF_U32 = 0, RF_U64 = 1, RF_F64 = 2,    /* the field's type */
    RF_WARN = 4,         /* free to change: a warning, not a refusal */
    RF_SETTINGS = 8,     /* recorded since CKPT_SETTINGS_V1 only */
    RF_SAME_TB = 16,     /* compared only when the token budgets match (the packing) */
    RF_KNOWN = 32,       /* compared only when the checkpoint's value is known (not 0) */
};

typedef struct {
    const char *flag;
    size_t off;          /* in run_config_t */
    unsigned flags;
    const char *why;     /* refusals: why it must match */
} rfield_t;

#define RFIELD(f, fl, flags, why) { fl, offsetof(run_config_t, f), (flags), why }
static const rfield_t RESUME_FIELDS[] = {
    RFIELD(seed, "--seed", RF_U64, "the data order, the anchors and the initialisation depend on it"),
    RFIELD(mbs_per_step, "--micro-batches-per-step", RF_U32, "the cursor and the micro-batch numbering depend on it"),
    RFIELD(token_budget, "--token-budget", RF_U32 | RF_SETTINGS, "the cursor and micro-batch numbering depend on it"),
    RFIELD(max_len, "--max-len", RF_U32 | RF_SETTINGS | RF_SAME_TB, "the packing of the micro-batches depends on it"),
    RFIELD(num_anchors, "--num-anchors", RF_U32 | RF_SETTINGS, "the blocks trained per sequence depend on it"),
    RFIELD(epochs, "--epochs", RF_U32 | RF_SETTINGS, "the data order depends on it"),
    RFIELD(drafter_layers, "--drafter-layers", RF_U32 | RF_KNOWN, "the drafter's shape and parameter count depend on it"),
    RFIELD(block_size, "--block-size", RF_U32 | RF_KNOWN, "the drafter's training blocks depend on it"),
    RFIELD(lr, "--lr", RF_F64 | RF_WARN, NULL),
    RFIELD(warmup_steps, "--warmup-steps", RF_U64 | RF_WARN, NULL),
    RFIELD(weight_decay, "--weight-decay", RF_F64 | RF_WARN, NULL),
    RFIELD(clip, "--clip", RF_F64 | RF_WARN, NULL),
};
#undef RFIELD

/* The value of field f of c as a double (warnings print "%.9g") and as a u64 (refusals). */
static double rf_f64(const run_config_t *c, const rfield_t *f) {
    const char *p = (const char *)c + f->off;
    if ((f->flags & 3) == RF_F64) { double v; memcpy(&v, p, sizeof v); return v; }
    if ((f->flags & 3) == RF_U64) { uint64_t v; memcpy(&v, p, sizeof v); return (double)v; }
    uint32_t v; memcpy(&v, p, sizeof v); return (double)v;
}
static uint64_t rf_u64(const run_config_t *c, const rfield_t *f) {
    const char *p = (const char *)c + f->off;
    if ((f->flags & 3) == RF_U64) { uint64_t v; memcpy(&v, p, sizeof v); return v; }
    uint32_t v; memcpy(&v, p, sizeof v); return v;
}

/* One entry of RESUME_FIELDS: a refusal line (counted in r->n) or a warning. */
static void rc_field(rcheck_t *r, const rfield_t *f, const run_config_t *want, const run_config_t *have) {
    if (f->flags & RF_WARN) {
        double w = rf_f64(want, f), h = rf_f64(have, f);
        if (w != h)
            log_warn("--resume: %s changes from %.9g (the checkpoint's) to %.9g: allowed, but the continuation "
                     "is no longer the uninterrupted run's; pass %s %.9g to keep it", f->flag, h, w, f->flag, h);
        return;
    }
    uint64_t w = rf_u64(want, f), h = rf_u64(have, f);
    if ((f->flags & RF_KNOWN) && h == 0) return;
    if (w == h) return;
    char a[32], b[32];
    snprintf(a, sizeof a, "%llu", (unsigned long long)w);
    snprintf(b, sizeof b, "%llu", (unsigned long long)h);
    rc_mismatch(r, f->flag, a, b, f->why);
}

/* What checkpoint r->dir recorded, as a run_config_t: state.bin's header h, the drafter
 * shape from config.json (every checkpoint has it; else the header's, else 0 = unknown).
 * *have_settings: h records the run settings (CKPT_SETTINGS_V1); cc / *have_cfg: the
 * checkpoint's drafter config when config.json reads. */
static void ckpt_run_config(rcheck_t *r, const ckpt_state_hdr_t *h, run_config_t *have, drafter_config_t *cc,
                            int *have_cfg, int *have_settings) {
    runcfg_init(have);
    *have_settings = h->settings == CKPT_SETTINGS_V1;
    have->seed = h->seed;
    have->mbs_per_step = (uint32_t)h->mbs_per_step;
    if (*have_settings) {
        have->token_budget = h->token_budget;
        have->max_len = h->max_len;
        have->num_anchors = h->num_anchors;
        have->epochs = h->epochs;
        have->target_fp = h->target_fp;
    } else {
        log_warn("--resume %s: the checkpoint predates recorded run settings: --token-budget, --max-len, "
                 "--num-anchors, --epochs and the target model's identity are not checked (the dataset and "
                 "batching options are, from cursor.bin)", r->dir);
    }
    memset(cc, 0, sizeof *cc);
    *have_cfg = dflash_config_load(r->dir, cc) == 0;
    have->drafter_layers = *have_cfg ? (uint32_t)cc->n_layers : *have_settings ? h->drafter_layers : 0;
    have->block_size = *have_cfg ? (uint32_t)cc->B : *have_settings ? h->block_size : 0;
    if (!*have_cfg) log_warn("--resume %s: config.json unreadable (%s)%s", r->dir, dl_errmsg(),
                             *have_settings ? "" : ": the drafter shape is not checked");
    have->lr = h->lr;
    have->warmup_steps = (uint64_t)h->warmup_steps;
    have->weight_decay = h->wd;
    have->clip = h->clip;
}

/* The target: its shapes (config.json) first, then, when they match, its fingerprint
 * (recorded since CKPT_SETTINGS_V1; 0 on either side = not checked). */
static void rc_target(rcheck_t *r, const run_opts_t *o, const drafter_config_t *dc, const drafter_config_t *cc,
                      int have_cfg, uint64_t want_fp, uint64_t have_fp) {
    if (have_cfg && (cc->D != dc->D || cc->V != dc->V || cc->H != dc->H || cc->Hkv != dc->Hkv || cc->hd != dc->hd ||
                     cc->F != dc->F || cc->n_target_layers != dc->n_target_layers)) {
        char a[160], b[160];
        snprintf(a, sizeof a, "(hidden %d, %d layers, heads %d/%d, head dim %d, MLP %d, vocabulary %d)", dc->D,
                 dc->n_target_layers, dc->H, dc->Hkv, dc->hd, dc->F, dc->V);
        snprintf(b, sizeof b, "(hidden %d, %d layers, heads %d/%d, head dim %d, MLP %d, vocabulary %d)", cc->D,
                 cc->n_target_layers, cc->H, cc->Hkv, cc->hd, cc->F, cc->V);
        fprintf(stderr, "draftline run: --resume %s: --target-model %s %s does not match the checkpoint's target "
                        "%s (the drafter's shapes are the target's); rerun with the run's --target-model\n",
                r->dir, o->target_model, a, b);
        r->n++;
        return;
    }
    if (have_fp && want_fp && have_fp != want_fp) {
        fprintf(stderr, "draftline run: --resume %s: --target-model %s (fingerprint %016llx) does not match the "
                        "checkpoint's target (fingerprint %016llx): same shapes, other weights (another model, "
                        "fine-tune or quantisation; the features the drafter learns from depend on it); rerun "
                        "with the run's --target-model\n",
                r->dir, o->target_model, (unsigned long long)want_fp, (unsigned long long)have_fp);
        r->n++;
    }
}

/* The settings that need no data: the run's configuration (want, from L; the max_len
 * compared is the effective one, min(--max-len, --token-budget), as the checkpoint
 * records it) against the checkpoint's (state.bin header h and config.json of r->dir),
 * through RESUME_FIELDS; then the target (dc: the requested drafter config, want's
 * target_fp: its fingerprint, 0 when it could not be taken). Mismatches counted in r->n. */
static void resume_check_settings(rcheck_t *r, const launch_t *L, const ckpt_state_hdr_t *h,
                                  const drafter_config_t *dc) {
    static run_config_t want, have;   /* ~25 KB each: not on the stack */
    sup__run_config(L, &want);
    if (want.max_len == 0 || want.max_len > want.token_budget) want.max_len = want.token_budget;
    drafter_config_t cc;
    int have_cfg, have_settings;
    ckpt_run_config(r, h, &have, &cc, &have_cfg, &have_settings);
    for (size_t i = 0; i < sizeof RESUME_FIELDS / sizeof RESUME_FIELDS[0]; i++) {
        const rfield_t *f = &RESUME_FIELDS[i];
        if ((f->flags & RF_SETTINGS) && !have_settings) continue;
        if ((f->flags & RF_SAME_TB) && have.token_budget != want.token_budget) continue;
        if (f->flags & RF_WARN) continue;   /* after the target */
        rc_field(r, f, &want, &have);
    }
    rc_target(r, L->o, dc, &cc, have_cfg, want.target_fp, have.target_fp);
    for (size_t i = 0; i < sizeof RESUME_FIELDS / sizeof RESUME_FIELDS[0]; i++)
        if (RESUME_FIELDS[i].flags & RF_WARN) rc_field(r, &RESUME_FIELDS[i], &want, &have);
}

/* The data: cursor.bin of checkpoint r->dir against the cursor of micro-batch 0 of the
 * requested cache and batching options (want). have_settings: the header's explicit
 * settings were checked (an options-hash mismatch is then reported only when they all
 * matched). Mismatches counted in r->n. */
static void resume_check_data(rcheck_t *r, const run_opts_t *o, const char *cache, const batcher_cursor_t *want,
                              int batching_reported) {
    char p[4300];
    snprintf(p, sizeof p, "%s/cursor.bin", r->dir);
    uint8_t buf[BATCHER_CURSOR_BYTES];
    FILE *f = fopen(p, "rb");
    size_t got = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    batcher_cursor_t c;
    if (got != sizeof buf || batcher_cursor_decode(buf, got, &c) < 0) {
        log_warn("--resume %s: no readable cursor.bin: the dataset is not checked (the loader starts at the "
                 "checkpoint's step)", r->dir);
        return;
    }
    if (c.data_fingerprint != want->data_fingerprint) {
        fprintf(stderr, "draftline run: --resume %s: --data %s (cache %s, fingerprint %016llx) does not match the "
                        "checkpoint's dataset (fingerprint %016llx: other samples, or prepared with another "
                        "tokenizer; the cursor indexes it); rerun with the run's --data\n",
                r->dir, o->data, cache, (unsigned long long)want->data_fingerprint,
                (unsigned long long)c.data_fingerprint);
        r->n++;
    }
    if (c.opts_hash != want->opts_hash && !batching_reported) {
        fprintf(stderr, "draftline run: --resume %s: the batching options (--token-budget %d, --max-len, "
                        "--micro-batches-per-step %d, --epochs %d, shuffle buffer, split) do not match the "
                        "checkpoint's cursor (the micro-batches and their numbering depend on them); rerun with "
                        "the run's settings\n", r->dir, o->token_budget, o->mbs_per_step, o->epochs);
        r->n++;
    }
}

/* The run dir a checkpoint dir belongs to (<run>/checkpoints/step_N: its ../..) into
 * out; "" when ckpt is not under a checkpoints/ dir. */
static void run_dir_of_ckpt(const char *ckpt, char *out, size_t cap) {
    out[0] = 0;
    const char *last = NULL;
    for (const char *p = strstr(ckpt, "/checkpoints/"); p; p = strstr(p + 1, "/checkpoints/")) last = p;
    if (last) snprintf(out, cap, "%.*s", (int)(last - ckpt), ckpt);
    else if (!strncmp(ckpt, "checkpoints/", 12)) snprintf(out, cap, ".");
    if (last && last == ckpt) snprintf(out, cap, "/");
}

/* --target-precision from the run's run.json j (of run_dir): not given, the recorded one
 * (logged); given and different, the flag wins, with a warning naming both (the drafter
 * then learns from other features than the checkpoint's). No record (runs before it was
 * written): left as it is (bf16 unless given), as before; an unknown value (an empty
 * string too): the same, with a warning. */
static void resume_precision(run_opts_t *o, const rundir_run_t *j, const char *run_dir) {
    int rec;
    if (!j->has_target_precision) return;
    char rj[4200];
    if (rundir_path(rj, sizeof rj, run_dir, RUNDIR_RUN_JSON) < 0) snprintf(rj, sizeof rj, "run.json");
    if (target_precision_parse(j->target_precision, &rec) < 0) {
        log_warn("--resume: %s: target_precision '%s' is neither bf16 nor fp8: ignored (%s)", rj,
                 j->target_precision, target_precision_name(o->target_precision));
        return;
    }
    if (!o->given[RUN_O_TP - RUN_O_TM]) {
        o->target_precision = rec;
        log_info("--resume: target precision %s, as recorded in %s", target_precision_name(rec), rj);
    } else if (o->target_precision != rec) {
        log_warn("--resume: --target-precision %s given, but the run trained with target precision %s "
                 "(recorded in %s): using %s, so the drafter now learns from other features than the "
                 "checkpoint's; leave the flag out (or pass --target-precision %s) to keep the run's",
                 target_precision_name(o->target_precision), target_precision_name(rec), rj,
                 target_precision_name(o->target_precision), target_precision_name(rec));
    }
}

/* The placement flags: given one, the placement is the user's (none of the run's is taken). */
static const struct { int code; const char *flag; } k_place_flags[] = {
    {RUN_O_TG, "--target-gpus"}, {RUN_O_DG, "--drafter-gpus"}, {RUN_O_DEV, "--device"},
    {RUN_O_NT, "--targets"}, {RUN_O_ND, "--drafters"},
};

/* Whether a placement flag was given (by a flag or --config). */
static int placement_given(const run_opts_t *o) {
    for (size_t i = 0; i < sizeof k_place_flags / sizeof k_place_flags[0]; i++)
        if (o->given[k_place_flags[i].code - RUN_O_TM]) return 1;
    return 0;
}

/* --resume without a placement flag: the run's placement from its run.json j (read from
 * run_dir). GPU runs: --target-gpus /
 * --drafter-gpus of the live topology (o->resume_tgpus / resume_dgpus hold the text); CPU
 * runs: --targets / --drafters when they differ from the default. Appends the flags taken
 * to taken (cap bytes, *n used). Only for a run.json that was read (an unreadable one is
 * warned about by the caller, naming the placement). A placement flag given: nothing taken,
 * said when the run recorded one. Refused (-1, said on stderr): a multi-node run (its nodes must be named
 * again), a recorded placement that draftline does not write (hand-edited: no GPU list,
 * a count outside 1..64, a device other than cpu / cuda or none). */
static int resume_placement(run_opts_t *o, const rundir_run_t *j, const char *run_dir, char *taken, size_t cap,
                            size_t *n) {
    char given[600] = "", num[16];
    for (size_t i = 0; i < sizeof k_place_flags / sizeof k_place_flags[0]; i++) {
        int c = k_place_flags[i].code;
        if (!o->given[c - RUN_O_TM]) continue;
        snprintf(num, sizeof num, "%d", c == RUN_O_NT ? o->targets : o->drafters);
        const char *v = c == RUN_O_TG ? o->target_gpus : c == RUN_O_DG ? o->drafter_gpus : c == RUN_O_DEV ? o->device
                        : c == RUN_O_NT && o->target_place ? o->target_place
                        : c == RUN_O_ND && o->drafter_place ? o->drafter_place : num;
        size_t u = strlen(given);
        snprintf(given + u, sizeof given - u, "%s%s %s", u ? " " : "", k_place_flags[i].flag, v ? v : "");
    }
    int gpu = !strcmp(j->device, "cuda"), cpu = !strcmp(j->device, "cpu");
    char tg[512], dg[512];
    rbplan_format_gpus(j->target_gpus, j->n_target_gpus, tg, sizeof tg);
    rbplan_format_gpus(j->drafter_gpus, j->n_drafter_gpus, dg, sizeof dg);
    if (given[0]) {   /* the user's: said as a warning, with what the run had */
        if (j->n_nodes > 0)
            log_warn("--resume: placement given (%s): the run's, across nodes, is not taken", given);
        else if (gpu && j->n_target_gpus > 0 && j->n_drafter_gpus > 0)
            log_warn("--resume: placement given (%s): the run's --target-gpus %s --drafter-gpus %s is not taken "
                     "(flags not given have their defaults)", given, tg, dg);
        else if (cpu && j->targets > 0 && j->drafters > 0)
            log_warn("--resume: placement given (%s): the run's --targets %d --drafters %d is not taken (flags not "
                     "given have their defaults)", given, j->targets, j->drafters);
        return 0;
    }
    char rj[4200], bad[256] = "";
    snprintf(rj, sizeof rj, "%s/%s", run_dir, RUNDIR_RUN_JSON);
    if (j->n_nodes > 0) {
        fprintf(stderr, "draftline run: --resume: the run ran across nodes (\"nodes\" in %s): its placement is not "
                        "taken; give it again: --listen HOST:PORT and --targets / --drafters or --target-gpus / "
                        "--drafter-gpus naming the nodes (docs/MULTINODE.md), or a placement on this host alone\n",
                rj);
        return -1;
    }
    if (!j->device[0]) snprintf(bad, sizeof bad, "no \"device\"");
    else if (!gpu && !cpu) snprintf(bad, sizeof bad, "\"device\" is '%s', neither cpu nor cuda", j->device);
    else if (gpu && j->n_target_gpus < 1) snprintf(bad, sizeof bad, "\"device\" is cuda but \"target_gpus\" is empty");
    else if (gpu && j->n_drafter_gpus < 1) snprintf(bad, sizeof bad, "\"device\" is cuda but \"drafter_gpus\" is empty");
    else if (cpu && (j->targets < 1 || j->targets > PIPE_MAX_TARGETS))
        snprintf(bad, sizeof bad, "\"targets\" is %d, outside 1..%d", j->targets, PIPE_MAX_TARGETS);
    else if (cpu && (j->drafters < 1 || j->drafters > PIPE_MAX_DRAFTERS))
        snprintf(bad, sizeof bad, "\"drafters\" is %d, outside 1..%d", j->drafters, PIPE_MAX_DRAFTERS);
    if (bad[0]) {
        fprintf(stderr, "draftline run: --resume: %s: %s (draftline does not write that): the run's placement is "
                        "unknown; give it (--target-gpus / --drafter-gpus, or --device cpu with --targets / "
                        "--drafters), or restore run.json\n", rj, bad);
        return -1;
    }
    int w;
    if (gpu) {
        o->target_gpus = strcpy(o->resume_tgpus, tg);
        o->drafter_gpus = strcpy(o->resume_dgpus, dg);
        w = snprintf(taken + *n, *n < cap ? cap - *n : 0, " --target-gpus %s --drafter-gpus %s", tg, dg);
        if (access("/dev/nvidiactl", F_OK) != 0)
            log_warn("--resume: the run's GPUs (--target-gpus %s --drafter-gpus %s, from %s) are taken, but this "
                     "host shows no NVIDIA driver (/dev/nvidiactl): give --device cpu to go on on the CPU",
                     tg, dg, rj);
    } else {
        char t[64] = "";
        if (j->targets != o->targets) snprintf(t, sizeof t, " --targets %d", (o->targets = j->targets));
        if (j->drafters != o->drafters)
            snprintf(t + strlen(t), sizeof t - strlen(t), " --drafters %d", (o->drafters = j->drafters));
        w = snprintf(taken + *n, *n < cap ? cap - *n : 0, "%s", t);
    }
    if (w > 0) *n = *n + (size_t)w < cap ? *n + (size_t)w : cap - 1;
    return 0;
}

/* --resume: every setting not given by a flag or --config takes the run's value, so
 * `draftline run --resume DIR` alone continues the run: from the checkpoint ckdir ("" when
 * none) and its state.bin header h (NULL when none): --seed, --micro-batches-per-step,
 * --lr, --warmup-steps, --weight-decay, --clip, --max-steps, and (CKPT_SETTINGS_V1)
 * --token-budget, --max-len, --num-anchors, --epochs, --block-size, --drafter-layers
 * (older checkpoints: the last two from its config.json); from <run_dir>/run.json
 * ("" / missing: skipped; keys written since these defaults exist): --target-model,
 * --data (the data cache the run trained on; else <run_dir>/data.dlc when it exists),
 * the placement when no placement flag was given (GPU runs: --target-gpus / --drafter-gpus
 * of the live topology; CPU runs: --targets / --drafters; multi-node runs: warned, not
 * taken), --save-every, --keep-checkpoints, --deterministic, --target-precision
 * (resume_precision), --mps, --gpu-turns.
 * Explicit settings are left as given (the --resume check compares them). Appends " --flag value" per setting taken to taken (cap bytes). */
static int resume_defaults(run_opts_t *o, const char *ckdir, const ckpt_state_hdr_t *h, const char *run_dir,
                           char *taken, size_t cap) {
    size_t n = strlen(taken);
    /* TAKE(code, fmt, args): when the flag was not given, formats args into taken; the
     * assignments written into args (o->x = recorded) therefore happen only then */
#define TAKE(code, ...) do { if (!o->given[(code) - RUN_O_TM]) {                                     \
        int w_ = snprintf(taken + n, n < cap ? cap - n : 0, __VA_ARGS__);                          \
        if (w_ > 0) n = n + (size_t)w_ < cap ? n + (size_t)w_ : cap - 1; } } while (0)
    if (h) {
        TAKE(RUN_O_SEED, " --seed %llu", (unsigned long long)(o->seed = (int64_t)h->seed));
        TAKE(RUN_O_K, " --micro-batches-per-step %d", (o->mbs_per_step = (int)h->mbs_per_step));
        if (h->settings == CKPT_SETTINGS_V1) {
            TAKE(RUN_O_TB, " --token-budget %d", (o->token_budget = (int)h->token_budget));
            TAKE(RUN_O_ML, " --max-len %d", (o->max_len = (int)h->max_len));
            TAKE(RUN_O_NA, " --num-anchors %d", (o->num_anchors = (int)h->num_anchors));
            TAKE(RUN_O_EP, " --epochs %d", (o->epochs = (int)h->epochs));
            TAKE(RUN_O_DL, " --drafter-layers %d", (o->drafter_layers = (int)h->drafter_layers));
            TAKE(RUN_O_BS, " --block-size %d", (o->block_size = (int)h->block_size));
        } else {
            drafter_config_t cc;
            memset(&cc, 0, sizeof cc);
            if (dflash_config_load(ckdir, &cc) == 0) {
                TAKE(RUN_O_DL, " --drafter-layers %d", (o->drafter_layers = cc.n_layers));
                TAKE(RUN_O_BS, " --block-size %d", (o->block_size = cc.B));
            }
        }
        TAKE(RUN_O_LR, " --lr %.9g", (o->lr = h->lr));
        TAKE(RUN_O_WU, " --warmup-steps %lld", (long long)(o->warmup_steps = (int64_t)h->warmup_steps));
        TAKE(RUN_O_WD, " --weight-decay %.9g", (o->weight_decay = h->wd));
        TAKE(RUN_O_CL, " --clip %.9g", (o->clip = h->clip));
        if (h->max_steps > 0) TAKE(RUN_O_MS, " --max-steps %lld", (long long)(o->max_steps = (int64_t)h->max_steps));
    }
    if (!run_dir[0]) {
        /* the precision is recorded in run.json only: a checkpoint outside its run dir
         * would otherwise go on in bf16 without a word */
        if (ckdir[0] && !o->given[RUN_O_TP - RUN_O_TM])
            log_warn("--resume %s: not in a run dir (no run.json): target precision %s; pass "
                     "--target-precision fp8 if the run trained with it", ckdir,
                     target_precision_name(o->target_precision));
        if (ckdir[0] && !placement_given(o))
            log_warn("--resume %s: not in a run dir (no run.json): the placement is the default (CPU, --targets %d "
                     "--drafters %d) unless given", ckdir, o->targets, o->drafters);
        return 0;
    }
    /* an unreadable or malformed run.json counts as empty: the defaults stay, said with the
     * reason (one bad key loses every setting in it, the target model and precision too) */
    rundir_run_t *j = malloc(sizeof *j);
    if (!j) return 0;
    int rrc = rundir_run_read(run_dir, j), placed = placement_given(o);
    if (rrc < 0) {
        if (rrc != DL_ENOENT) {
            /* the placement cannot default: a GPU run would go on on the CPU */
            if (!placed) {
                fprintf(stderr, "draftline run: --resume: %s: the run's placement is unknown; give it "
                                "(--target-gpus / --drafter-gpus, or --device cpu with --targets / --drafters), or "
                                "restore run.json\n", dl_errmsg());
                free(j);
                return 2;
            }
            log_warn("--resume: %s: the run's --target-model, --data, --save-every, --keep-checkpoints, "
                     "--deterministic, --target-precision, --mps and --gpu-turns are not taken from it (pass them)", dl_errmsg());
        } else if (!placed) {
            log_warn("--resume: %s has no run.json: the placement is the default (CPU, --targets %d --drafters %d) "
                     "unless given", run_dir, o->targets, o->drafters);
        }
        rundir_run_init(j);
    }
    if (j->target_model[0] && !o->given[RUN_O_TM - RUN_O_TM]) {
        if (access(j->target_model, R_OK) == 0) {
            snprintf(o->target_model, sizeof o->target_model, "%s", j->target_model);
            TAKE(RUN_O_TM, " --target-model %s", o->target_model);
        } else {
            log_warn("--resume: the run's target model %s (run.json) is not readable: using %s (pass "
                     "--target-model)", j->target_model, o->target_model);
        }
    }
    if (!o->given[RUN_O_DATA - RUN_O_TM]) {
        if (j->data[0] && access(j->data, R_OK) == 0)
            snprintf(o->resume_data, sizeof o->resume_data, "%s", j->data);
        else {
            if (rundir_path(o->resume_data, sizeof o->resume_data, run_dir, "data.dlc") < 0 ||
                access(o->resume_data, R_OK) != 0) o->resume_data[0] = 0;
        }
        if (o->resume_data[0]) {
            o->data = o->resume_data;
            TAKE(RUN_O_DATA, " --data %s", o->data);
        }
    }
    if (rrc == 0 && resume_placement(o, j, run_dir, taken, cap, &n) < 0) {
        free(j);
        return 2;
    }
    if (!h && rrc == 0) {   /* no checkpoint: the step settings run.json records */
        if (j->max_steps > 0)
            TAKE(RUN_O_MS, " --max-steps %lld", (long long)(o->max_steps = j->max_steps));
        if (j->micro_batches_per_step > 0 && j->micro_batches_per_step <= 4096)
            TAKE(RUN_O_K, " --micro-batches-per-step %d", (o->mbs_per_step = (int)j->micro_batches_per_step));
    }
    if (j->save_every >= 0)
        TAKE(RUN_O_SE, " --save-every %lld", (long long)(o->save_every = j->save_every));
    if (j->keep_checkpoints > 0 && j->keep_checkpoints <= INT32_MAX)
        TAKE(RUN_O_KC, " --keep-checkpoints %lld", (long long)(o->keep_checkpoints = j->keep_checkpoints));
    if (j->deterministic == 1 && !o->given[RUN_O_DET - RUN_O_TM]) {
        o->deterministic = 1;
        TAKE(RUN_O_DET, " --deterministic");
    }
    resume_precision(o, j, run_dir);
    if (j->mps[0] && !o->given[RUN_O_MPS - RUN_O_TM]) {
        int m;
        if (sup_mps_parse(j->mps, &m) == 0) {
            if (m != o->mps) TAKE(RUN_O_MPS, " --mps %s", sup_mps_name(o->mps = m));   /* (off: as now) */
        }
        else log_warn("--resume: run.json \"mps\" '%s' is not off, auto or on: ignored (--mps %s)", j->mps,
                      sup_mps_name(o->mps));
    }
    if (j->gpu_turns[0] && !o->given[RUN_O_GT - RUN_O_TM]) {
        if (!strcmp(j->gpu_turns, "on") || !strcmp(j->gpu_turns, "off")) {
            int g = !strcmp(j->gpu_turns, "on");
            if (g != o->gpu_turns) TAKE(RUN_O_GT, " --gpu-turns %s", (o->gpu_turns = g) ? "on" : "off");   /* (on: as now) */
        } else
            log_warn("--resume: run.json \"gpu_turns\" '%s' is not on or off: ignored (--gpu-turns %s)", j->gpu_turns,
                     o->gpu_turns ? "on" : "off");
    }
    free(j);
    return 0;
#undef TAKE
}

/* A multi-node run whose optimizer ran on another node keeps its checkpoints there
 * (docs/MULTINODE.md section 6): run_dir's run.json names that node and its run dir.
 * Returns 1 with node[ncap] and dir[cap] (that node's run dir), else 0. */
static int remote_ckpt_home(const char *run_dir, char *node, size_t ncap, char *dir, size_t cap) {
    rundir_run_t *j = malloc(sizeof *j);
    int found = 0;
    if (j && rundir_run_read(run_dir, j) == 0) {
        for (int i = 0; i < j->n_stages && !found; i++) {
            const rundir_stage_t *e = &j->stages[i];
            if (strcmp(e->name, "optimizer") || !e->node[0] || !strcmp(e->node, "head")) continue;
            for (int k = 0; k < j->n_nodes; k++)
                if (!strcmp(j->nodes[k].name, e->node) && j->nodes[k].run_dir[0]) {
                    snprintf(node, ncap, "%s", e->node);
                    snprintf(dir, cap, "%s", j->nodes[k].run_dir);
                    found = 1;
                }
        }
    }
    free(j);
    return found;
}

/* --resume DIR of a multi-node run dir without checkpoints of its own: the checkpoint is
 * the one on the optimizer's node when it can be read here (a shared filesystem, or the
 * same host); o->resume becomes it and --out stays DIR. Else refused (2), naming the node
 * and path: a run that applied steps is never started fresh. 0 when not that case. */
static int resume_remote(launch_t *L) {
    run_opts_t *o = L->o;
    static char ck[4096], head_dir[4096];
    char node[64], dir[4096];
    if (ckpt_resolve(o->resume, ck, sizeof ck) == 0 || !remote_ckpt_home(o->resume, node, sizeof node, dir, sizeof dir))
        return 0;
    if (ckpt_resolve(dir, ck, sizeof ck) < 0) {
        fprintf(stderr, "draftline run: --resume %s: this multi-node run's optimizer ran on node %s, so its "
                        "checkpoints are in %s/checkpoints on that node, which this host cannot read: make that "
                        "path readable here at the same path (a shared filesystem), or copy it here to that "
                        "path, then rerun (the optimizer resumes from it on node %s)\n", o->resume, node, dir, node);
        return 2;
    }
    snprintf(head_dir, sizeof head_dir, "%s", o->resume);
    if (!o->out) o->out = head_dir;
    log_info("--resume %s: its optimizer ran on node %s: resuming from %s", head_dir, node, ck);
    o->resume = ck;
    return 0;
}

int sup__resume_take_defaults(launch_t *L) {
    run_opts_t *o = L->o;
    if (!o->resume) return 0;
    struct stat rs;
    if (stat(o->resume, &rs) != 0) {
        fprintf(stderr, "draftline run: --resume %s: %s\n", o->resume, strerror(errno));
        return 2;
    }
    if (!S_ISDIR(rs.st_mode)) {
        fprintf(stderr, "draftline run: --resume %s: a file, not a run dir or a checkpoint dir (runs/<run> or "
                        "runs/<run>/checkpoints/step_<N>)\n", o->resume);
        return 2;
    }
    const char *asked = o->resume;   /* a multi-node run dir: its run.json, not the checkpoint's dir */
    int rr = resume_remote(L);
    if (rr) return rr;
    char ck[4096] = "", rj[4200];
    ckpt_state_hdr_t h;
    int have_ck = ckpt_resolve(o->resume, ck, sizeof ck) == 0;
    /* nothing of a checkpoint is trusted before its files pass their checksums and its
     * header its range checks (one line naming the file; no default taken from it) */
    unsigned unverified = 0;
    if (have_ck && ckpt_verify(ck, &unverified) < 0) {
        fprintf(stderr, "draftline run: --resume: %s\n", dl_errmsg());
        return 2;
    }
    if (unverified & (CKPT_UNVERIFIED_STATE | CKPT_UNVERIFIED_MODEL))
        log_warn("--resume %s: written before checksums: %s%s%s not verified", ck,
                 unverified & CKPT_UNVERIFIED_STATE ? "state.bin" : "",
                 (unverified & CKPT_UNVERIFIED_STATE) && (unverified & CKPT_UNVERIFIED_MODEL) ? " and " : "",
                 unverified & CKPT_UNVERIFIED_MODEL ? "model.safetensors" : "");
    int have_h = have_ck && ckpt_read_hdr(ck, &h) == 0;
    int have_rj = rundir_path(rj, sizeof rj, o->resume, RUNDIR_RUN_JSON) == 0 && access(rj, F_OK) == 0;
    if (asked != o->resume) snprintf(L->resume_run, sizeof L->resume_run, "%s", asked);
    else if (have_ck) run_dir_of_ckpt(ck, L->resume_run, sizeof L->resume_run);
    else if (have_rj) snprintf(L->resume_run, sizeof L->resume_run, "%s", o->resume);
    char taken[8192] = "";
    if (resume_defaults(o, ck, have_h ? &h : NULL, L->resume_run, taken, sizeof taken)) return 2;
    if (!o->out && L->resume_run[0]) {
        size_t n = strlen(taken);
        snprintf(taken + n, sizeof taken - n, " --out %s", L->resume_run);
    }
    if (taken[0])
        log_info("--resume %s: not given, so taken from the %s:%s", have_ck ? ck : o->resume,
                 have_h ? "checkpoint and its run" : "run", taken);
    return 0;
}

/* A fresh start under --resume: the training settings only a checkpoint records (the
 * recipe) fall back to their defaults where not given now; said on the console with their
 * values, so that a run restarted without its flags does not train another recipe silently. */
static void recipe_warn(const run_opts_t *o) {
    char s[640] = "";
    size_t n = 0;
#define RW(code, ...) do { if (!o->given[(code) - RUN_O_TM] && n < sizeof s) {                     \
        int w_ = snprintf(s + n, sizeof s - n, __VA_ARGS__); if (w_ > 0) n += (size_t)w_; } } while (0)
    RW(RUN_O_TB, " --token-budget %d", o->token_budget);
    if (o->max_len > 0) RW(RUN_O_ML, " --max-len %d", o->max_len);
    else RW(RUN_O_ML, " --max-len (the token budget)");
    RW(RUN_O_NA, " --num-anchors %d", o->num_anchors);
    RW(RUN_O_BS, " --block-size %d", o->block_size);
    RW(RUN_O_DL, " --drafter-layers %d", o->drafter_layers);
    RW(RUN_O_EP, " --epochs %d", o->epochs);
    RW(RUN_O_LR, " --lr %g", o->lr);
    RW(RUN_O_WU, " --warmup-steps %lld", (long long)o->warmup_steps);
    RW(RUN_O_WD, " --weight-decay %g", o->weight_decay);
    RW(RUN_O_CL, " --clip %g", o->clip);
    RW(RUN_O_SEED, " --seed %lld", (long long)o->seed);
#undef RW
    if (s[0])
        log_warn("--resume %s: a run's training settings are recorded in its checkpoints, and this one saved "
                 "none: not given now, these are the defaults, not necessarily the run's (stop and pass the "
                 "run's own if they differ):%s", o->resume, s);
}

/* A dir whose run saved no checkpoint and applied no step (e.g. Ctrl-C while the
 * stages were starting) holds nothing to continue: it is reused as a fresh run,
 * with or without --resume (its steps.jsonl and metrics.jsonl are started anew). */
int sup__resume_fresh(launch_t *L) {
    run_opts_t *o = L->o;
    const char *out = L->out;
    char prev[4200], cp[4096];
    struct stat sb;
    int fits = rundir_path(prev, sizeof prev, out, RUNDIR_STEPS) == 0;
    int has_steps = fits && stat(prev, &sb) == 0 && sb.st_size > 0;
    int has_prev = fits && access(prev, F_OK) == 0;
    has_prev |= rundir_path(prev, sizeof prev, out, RUNDIR_RUN_JSON) == 0 && access(prev, F_OK) == 0;
    int has_ckpt = ckpt_resolve(o->resume ? o->resume : out, cp, sizeof cp) == 0;
    if (o->resume && !has_ckpt) {
        if (!has_steps && (!strcmp(o->resume, out) || has_prev)) {
            log_info("--resume %s: the run saved no checkpoint and applied no step: starting it fresh in %s",
                     o->resume, out);
            recipe_warn(o);
            o->resume = NULL;
            L->reuse_fresh = has_prev;
        } else if (ckpt_resolve(o->resume, cp, sizeof cp) < 0 &&
                   snprintf(prev, sizeof prev, "%s/" RUNDIR_LATEST, o->resume) > 0 && access(prev, F_OK) == 0) {
            /* latest names a checkpoint that is gone or has no state.bin: say so (the
             * others are still there to resume from) */
            fprintf(stderr, "draftline run: %s (%s): resume from another checkpoint with --resume "
                            "%s/checkpoints/step_<N>\n", dl_errmsg(), prev, o->resume);
            return 2;
        } else {
            fprintf(stderr, "draftline run: --resume %s: no checkpoint to resume from (no state.bin and no "
                            "checkpoints/latest)%s\n", o->resume,
                    has_steps ? "; the run applied steps but saved none: start a fresh run with another --out" : "");
            return 2;
        }
    } else if (!o->resume && has_prev) {
        if (has_steps || has_ckpt) {
            fprintf(stderr, "draftline run: --out %s holds a previous run (%s): choose another "
                            "--out, or continue it with `draftline run --resume %s`\n", out,
                    has_ckpt ? "a checkpoint" : "steps.jsonl", out);
            return 2;
        }
        log_info("--out %s: the previous run there saved no checkpoint and applied no step: reusing it as "
                 "a fresh run", out);
        L->reuse_fresh = 1;
    }
    return 0;
}

/* Resumed from step `step` into run dir `out`: checkpoints of higher steps there are the
 * run's training past it, which this run rewinds. Said on the console: they are kept
 * (ckpt_prune leaves steps past `latest`), a checkpoint this run writes at one of their
 * steps replaces it, and steps.jsonl loses the lines past `step` (the optimizer's log). */
static void newer_ckpts_say(const char *out, uint64_t step) {
    char root[4200];
    snprintf(root, sizeof root, "%s/checkpoints", out);
    DIR *d = opendir(root);
    if (!d) return;
    unsigned long long hi = 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned long long s;
        char tail;
        char sb[4480];
        struct stat st;
        if (sscanf(e->d_name, "step_%llu%c", &s, &tail) != 1 || s <= step) continue;
        snprintf(sb, sizeof sb, "%s/%s/state.bin", root, e->d_name);
        if (stat(sb, &st) == 0 && S_ISREG(st.st_mode)) {   /* a checkpoint, not a stray dir */
            n++;
            if (s > hi) hi = s;
        }
    }
    closedir(d);
    if (n > 0)
        log_warn("--resume: step %llu is behind %d newer checkpoint(s) in %s (up to step_%llu): training goes on "
                 "from step %llu; they are kept, except that a checkpoint this run writes at the same step "
                 "replaces one, and steps.jsonl's lines past step %llu are dropped",
                 (unsigned long long)step, n, root, hi, (unsigned long long)step, (unsigned long long)step);
}

/* the checkpoint to resume: read (and checked) before anything is written */
int sup__resume_read(launch_t *L) {
    run_opts_t *o = L->o;
    if (!o->resume) return 0;
    if (ckpt_resolve(o->resume, L->resume_dir, sizeof L->resume_dir) < 0) {
        fprintf(stderr, "draftline run: %s\n", dl_errmsg());
        return 2;
    }
    ckpt_state_hdr_t h;
    char sp[4300];
    snprintf(sp, sizeof sp, "%s/state.bin", L->resume_dir);
    if (ckpt_read_hdr(L->resume_dir, &h) < 0 || ckpt_hdr_validate(&h, sp) < 0) {
        fprintf(stderr, "draftline run: --resume %s: unreadable training state (%s)\n", L->resume_dir, dl_errmsg());
        return 2;
    }
    L->start_step = h.step;
    L->resume_hdr = h;
    L->have_resume_hdr = 1;
    newer_ckpts_say(L->out, h.step);
    return 0;
}

int sup__resume_check_early(launch_t *L, const drafter_config_t *dc) {
    run_opts_t *o = L->o;
    if (!L->have_resume_hdr) return 0;
    uint64_t tfp = 0;
    if (ckpt_target_fingerprint(o->target_model, &tfp) < 0) {
        log_warn("--target-model %s: %s (the target is not fingerprinted)", o->target_model, dl_errmsg());
        tfp = 0;
    }
    L->target_fp = tfp;
    rcheck_t r = {L->resume_dir, 0};
    resume_check_settings(&r, L, &L->resume_hdr, dc);
    L->batching_reported = r.n > 0;
    /* the data too when its cache is known without preparing (a .dlc, or the
     * run dir's prepared one) */
    char early[4300] = "";
    if (sup__ends_with(o->data, ".dlc")) snprintf(early, sizeof early, "%s", o->data);
    else {
        snprintf(early, sizeof early, "%s/data.dlc", L->out);   /* what the data preparation reuses */
        if (access(early, R_OK) != 0) early[0] = 0;
    }
    if (early[0]) {
        batcher_cursor_t want;
        if (sup__requested_cursor(o, early, &want, NULL) < 0) {
            fprintf(stderr, "draftline run: %s\n", dl_errmsg());
            return 1;
        }
        resume_check_data(&r, o, early, &want, L->batching_reported);
        L->data_checked = 1;
    }
    if (r.n > 0) {
        fprintf(stderr, "draftline run: --resume %s: refused: %d setting(s) differ from the checkpoint's "
                        "(nothing was started or written)\n", L->resume_dir, r.n);
        return 2;
    }
    /* version 2: model.safetensors' tensor table is the one the optimizer reads the master by */
    if (ckpt_verify_layout(L->resume_dir, dc) < 0) {
        fprintf(stderr, "draftline run: --resume: %s (nothing was started or written)\n", dl_errmsg());
        return 2;
    }
    return 0;
}

int sup__resume_check_late(launch_t *L, const batcher_cursor_t *cur) {
    if (!L->have_resume_hdr || L->data_checked) return 0;
    rcheck_t r = {L->resume_dir, 0};
    resume_check_data(&r, L->o, L->cache, cur, L->batching_reported);
    if (r.n > 0) {
        fprintf(stderr, "draftline run: --resume %s: refused: the data differs from the checkpoint's "
                        "(no stage was started)\n", L->resume_dir);
        if (strcmp(L->sock, L->out) != 0) rmdir(L->sock);
        return 2;
    }
    return 0;
}
