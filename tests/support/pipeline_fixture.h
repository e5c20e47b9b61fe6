/* Test support: the fixture shared by the pipeline integration tests.
 *
 * A tiny random Llama-shaped target (HF dir: config.json + model.safetensors; L=4, D=64, H=4,
 * Hkv=2, hd=16, F=128, the real SmolLM2 vocabulary size V=49152 so the real tokenizer's ids
 * fit; float32, tied embeddings; norms 1, other weights 0.05 * N(0,1) from rng seed 77) and a
 * data cache of the first n GSM8K training samples prepared with the embedded model's tokenizer
 * and chat template (pf_fixture_setup makes both under /tmp/<prefix>-<pid>); running a
 * `draftline` command to its end with the checks every pipeline test makes (time-out, nothing
 * of its process group left, no shared-memory object of its run left: pf_run_draftline,
 * pf_run_finish); small readers (pf_slurp, pf_same_file, pf_count_lines, pf_inbox_within).
 * cmocka-free: nothing here asserts; failures are returned (negative dl_err codes or -1) and
 * said on stderr, and the tests assert on the results. Usable from any test binary.
 */
#ifndef DL_TESTS_SUPPORT_PIPELINE_FIXTURE_H
#define DL_TESTS_SUPPORT_PIPELINE_FIXTURE_H

#include "tests/support/proc.h"

/* Writes the tiny target into dir (created if missing): dir/config.json and
 * dir/model.safetensors (~13 MB of F32). Returns 0 or a negative value (dl_errmsg() may say
 * why when a library call failed). */
int pf_write_tiny_model(const char *dir);

/* Copies the first n_samples lines of <paths_shared_data()>/gsm8k/train.jsonl to
 * root/gsm8k<n_samples>.jsonl and prepares them (prompt "question", response "answer",
 * the embedded model's tokenizer and chat template, 1 thread) into the cache file path.
 * Needs the embedded model (paths_default_model()). Returns 0 or a negative value. */
int pf_write_cache(const char *root, int n_samples, const char *path);
/* The same with the tokenizer (and its chat template) of `tokenizer` (a .gguf,
 * tokenizer.json or HF model dir); NULL: the embedded model's. */
int pf_write_cache_tok(const char *root, int n_samples, const char *path, const char *tokenizer);

/* Arguments of pf_run_child: argv (NULL-terminated, argv[0] the program's path), the log file
 * that gets the child's stdout and stderr (truncated), and a working dir (empty: stay). */
typedef struct {
    char *argv[80];
    char log[400];
    char cwd[400];
} pf_run_args_t;

/* proc_fn body (tests/support/proc.h) for proc_spawn: chdir to a->cwd if set, redirect stdout
 * and stderr to a->log, execv a->argv. Returns (as the exit code) 126 when the chdir or the
 * log open fails, 127 when execv fails; does not return on success. arg: pf_run_args_t *. */
int pf_run_child(void *arg, int report_fd);

/* a->argv = argv (borrowed, NULL-terminated, at most 79 entries), NULL-terminated. */
void pf_set_argv(pf_run_args_t *a, const char *const *argv);

/* Prints "--- path ---" and the file's whole text ("(none)" when it cannot be read):
 * a failing multi-process test shows the logs it looked at. */
void pf_show(const char *path);

/* Number of '\n' in the file at path; 0 when it cannot be opened. */
int pf_count_lines(const char *path);

/* Occurrences of needle (overlapping ones too) in the file at path; -1 when unreadable. */
int pf_count_in(const char *path, const char *needle);

/* The paths of one test binary's pipeline fixture, filled by pf_fixture_setup. */
typedef struct {
    char root[256];        /* /tmp/<prefix>-<pid>, created 0700; pf_teardown removes it */
    char model_dir[300];   /* root/tiny: the tiny target (pf_write_tiny_model) */
    char cache[1024];      /* root/gsm8k<n>.dlc (pf_write_cache), or "" when n_samples is 0 */
    char bin[1024];        /* $DL_BIN_DIR (default "bin"), made absolute against the cwd */
    char exe[1100];        /* bin/draftline */
} pf_fixture_t;

/* Group setup shared by the pipeline tests: fills *fx (see pf_fixture_t; prefix: a short
 * file-name word, at most 200 bytes used, e.g. "dlpt"), creates fx->root (an existing one is
 * reused),
 * writes the tiny target into fx->model_dir and, when n_samples > 0, first checks that the
 * embedded model (paths_default_model(); its tokenizer prepares the data) is readable, then
 * prepares the first n_samples GSM8K training samples into fx->cache. n_samples 0: no data
 * (a test making its own cache, e.g. with another tokenizer, sets fx->cache itself).
 * Does not arm proc_watchdog (each test picks its own bound). Returns 0, or -1 with the
 * reason printed to stderr (the fixture dir may then be partly written: pf_teardown(fx->root)
 * still removes it). */
int pf_fixture_setup(pf_fixture_t *fx, const char *prefix, int n_samples);

/* Waits up to timeout_s seconds for the child p (a `draftline` command spawned with
 * pf_run_child, its output in the file log), then checks that nothing of its process group
 * is left (what is left gets SIGKILL) and kills/reaps it (proc_kill) in every case. Then, when run_id is not NULL, reads
 * the run id from the first line of log that starts "draftline run <16 hex>:" into run_id
 * (17 bytes; "" when there is none) and, when one was found, counts the run's
 * shared-memory objects (slab_count) and removes them (slab_sweep) whatever the count.
 * When out (the run's --out dir) is not NULL and the child timed out or did not exit 0,
 * prints the last 30 lines of log and of each out/logs/<stage>.log to stdout.
 * cmocka-free: it asserts nothing. Returns the exit code (>= 0: the exit status, or 128 +
 * the signal that ended it), or a negative dl_err with a message on stderr (and in
 * dl_errmsg()), checked in this order: DL_ETIMEDOUT when the child outlived timeout_s
 * (its group is then killed), proc_wait's DL_EINVAL / DL_EIO (not spawned, waitpid
 * failed), DL_ESTATE when a process of its group was left after it
 * exited, DL_ESTATE when shared-memory objects of run_id were left. A caller that asserts
 * an exit code >= 0 therefore fails on any of these. p is reaped and its report pipe closed
 * on return: do not wait on it again. */
int pf_run_finish(proc_t *p, const char *log, const char *out, int timeout_s, char *run_id);

/* proc_spawn(&p, "draftline run", pf_run_child, a) then pf_run_finish(&p, a->log, out,
 * timeout_s, run_id): a whole `draftline` command (a->argv NULL-terminated, argv[0] the
 * binary, e.g. pf_fixture_t.exe; any subcommand; a->log its output) run to its end, at most
 * timeout_s seconds. a is only read. Returns as pf_run_finish, or DL_EIO (run_id then "")
 * when the fork failed. */
int pf_run_draftline(const pf_run_args_t *a, const char *out, int timeout_s, char *run_id);

/* Reads the whole file at path into a new NUL-terminated buffer (the caller frees it);
 * *len (may be NULL) gets its size in bytes, not counting the NUL. Returns NULL when the
 * file cannot be opened or read, or memory runs out. */
char *pf_slurp(const char *path, size_t *len);

/* The "loss" of each line of <run>/steps.jsonl into loss[0..cap) (NaN for a null loss),
 * parsed by rundir_steps_parse_line. Returns the number of lines read, or -1 when the file
 * cannot be read or a line is not a JSON object. */
int pf_step_losses(const char *run, double *loss, int cap);

/* 1 when the files at a and b can both be read and hold the same bytes, else 0. */
int pf_same_file(const char *a, const char *b);

/* Checks the drafter inbox memory bound in out/metrics.jsonl (a run's --out dir): every
 * line that has "inbox_high_water" (a drafter's metrics) must have inbox_slabs_bytes,
 * inbox_gpu_bytes + inbox_host_bytes and inbox_high_water each <= limit (bytes; e.g.
 * (--inbox-gb + --host-inbox-gb) * 2^30). *high gets the largest inbox_high_water seen
 * (0 when none; on an error, the largest up to that line). Returns the number of such lines
 * (>= 0), or DL_EIO (file unreadable),
 * DL_EFORMAT (a line that is not JSON, or an inbox line without one of those numbers) or
 * DL_ERANGE (a value over limit), with the file and line on stderr and in dl_errmsg(). */
int pf_inbox_within(const char *out, double limit, double *high);

/* Group teardown of the pipeline tests: proc_kill_all(), then rm -rf root unless
 * $DL_KEEP_TEST_DIR is set (a failure to remove is printed to stderr). */
void pf_teardown(const char *root);

/* A base port P such that P..P+163 (a multi-node run's span, docs/MULTINODE.md) can be
 * bound on 127.0.0.1 now: the kernel's pick for port 0, then every port of the span tried.
 * Ports can be taken between this check and their use (a rerun picks others). -1 when
 * 50 attempts found none. */
int pf_free_port_span(void);

/* 1 when the file at path holds needle within timeout_s (polled every 0.1 s), else 0. */
int pf_wait_for_text(const char *path, const char *needle, double timeout_s);

#endif
