/* Test support: the fixture shared by the pipeline integration tests.
 *
 * A tiny random Llama-shaped target (HF dir: config.json + model.safetensors; L=4, D=64, H=4,
 * Hkv=2, hd=16, F=128, the real SmolLM2 vocabulary size V=49152 so the real tokenizer's ids
 * fit; float32, tied embeddings; norms 1, other weights 0.05 * N(0,1) from rng seed 77) and a
 * data cache of the first n GSM8K training samples prepared with the embedded model's tokenizer
 * and chat template. cmocka-free: usable from any test binary.
 */
#ifndef DL_TESTS_SUPPORT_PIPELINE_FIXTURE_H
#define DL_TESTS_SUPPORT_PIPELINE_FIXTURE_H

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

/* Number of '\n' in the file at path; 0 when it cannot be opened. */
int pf_count_lines(const char *path);

/* Group teardown of the pipeline tests: proc_kill_all(), then rm -rf root unless
 * $DL_KEEP_TEST_DIR is set (a failure to remove is printed to stderr). */
void pf_teardown(const char *root);

#endif
