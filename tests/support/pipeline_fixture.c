/* Test support: the fixture shared by the pipeline integration tests (test_pipeline,
 * test_pipeline_ops, test_pipeline_eval, test_run_cli, test_run_resume_check,
 * test_run_keep_ckpt, gpu test_pipeline_gpu): a tiny random Llama-shaped target, a small
 * prepared GSM8K cache and running `draftline` to its end with the leftover checks.
 * cmocka-free; depends on the library and tests/support/proc only. */
#include "tests/support/pipeline_fixture.h"

#include "common/base/err.h"
#include "common/base/paths.h"
#include "common/base/rng.h"
#include "common/data/chat.h"
#include "common/data/prepare.h"
#include "common/data/tokenizer.h"
#include "common/mem/slab.h"
#include "common/model/config.h"
#include "common/format/safetensors.h"
#include "common/rundir/rundir.h"
#include "tests/support/proc.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

int pf_write_tiny_model(const char *dir) {
    model_config_t c;
    memset(&c, 0, sizeof c);
    c.family = MODEL_LLAMA;
    c.L = 4; c.D = 64; c.H = 4; c.Hkv = 2; c.hd = 16; c.F = 128; c.V = 49152;
    c.eps = 1e-5f; c.rope.theta = 10000; c.max_pos = 2048; c.tie_embeddings = 1;
    c.bos_id = 1; c.eos_ids[0] = 2; c.n_eos = 1;
    snprintf(c.arch, sizeof c.arch, "LlamaForCausalLM");
    snprintf(c.dtype, sizeof c.dtype, "float32");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
    char p[400];
    snprintf(p, sizeof p, "%s/config.json", dir);
    char *js = model_config_to_json(&c);
    FILE *f = fopen(p, "w");
    if (!js || !f) return -1;
    fputs(js, f);
    fclose(f);
    free(js);
    struct { char name[96]; int64_t r, k; int norm; } t[64];
    int n = 0;
#define T(nm, R, K, N) do { snprintf(t[n].name, sizeof t[n].name, "%s", nm); t[n].r = R; t[n].k = K; t[n].norm = N; n++; } while (0)
    T("model.embed_tokens.weight", c.V, c.D, 0);
    for (int l = 0; l < c.L; l++) {
        char b[96];
#define L_(s, R, K, N) do { snprintf(b, sizeof b, "model.layers.%d.%s", l, s); T(b, R, K, N); } while (0)
        L_("input_layernorm.weight", c.D, 0, 1);
        L_("self_attn.q_proj.weight", c.H * c.hd, c.D, 0);
        L_("self_attn.k_proj.weight", c.Hkv * c.hd, c.D, 0);
        L_("self_attn.v_proj.weight", c.Hkv * c.hd, c.D, 0);
        L_("self_attn.o_proj.weight", c.D, c.H * c.hd, 0);
        L_("post_attention_layernorm.weight", c.D, 0, 1);
        L_("mlp.gate_proj.weight", c.F, c.D, 0);
        L_("mlp.up_proj.weight", c.F, c.D, 0);
        L_("mlp.down_proj.weight", c.D, c.F, 0);
#undef L_
    }
    T("model.norm.weight", c.D, 0, 1);
#undef T
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    st_writer_t *w;
    if (st_writer_new(p, &w) < 0) return -1;
    for (int i = 0; i < n; i++) {
        int64_t shape[2] = {t[i].r, t[i].k};
        if (st_writer_add(w, t[i].name, "F32", t[i].k ? 2 : 1, shape) < 0) return -1;
    }
    rng_t r;
    rng_seed(&r, 77);
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)t[i].r * (size_t)(t[i].k ? t[i].k : 1);
        float *x = malloc(cnt * 4);
        for (size_t j = 0; j < cnt; j++) x[j] = t[i].norm ? 1.0f : 0.05f * rng_normal(&r);
        int rc = st_writer_write(w, x, cnt * 4);
        free(x);
        if (rc < 0) return -1;
    }
    return st_writer_finish(&w);
}

int pf_write_cache(const char *root, int n_samples, const char *path) {
    return pf_write_cache_tok(root, n_samples, path, NULL);
}

int pf_write_cache_tok(const char *root, int n_samples, const char *path, const char *tokenizer) {
    char data[1024], src[1200], small[400];
    if (paths_shared_data(data, sizeof data) < 0) return -1;
    snprintf(src, sizeof src, "%s/gsm8k/train.jsonl", data);
    snprintf(small, sizeof small, "%s/gsm8k%d.jsonl", root, n_samples);
    FILE *in = fopen(src, "r"), *out = fopen(small, "w");
    if (!in || !out) return -1;
    char *line = NULL;
    size_t cap = 0;
    for (int i = 0; i < n_samples && getline(&line, &cap, in) > 0; i++) fputs(line, out);
    free(line);
    fclose(in);
    fclose(out);
    char gguf[1024];
    tok_t *t = NULL;
    chat_template_t ct;
    if (!tokenizer) {
        if (paths_default_model(gguf, sizeof gguf) < 0) return -1;
        tokenizer = gguf;
    }
    if (tok_load(tokenizer, &t) < 0 || chat_template_from_tok(t, &ct) < 0) return -1;
    prep_opts_t po;
    memset(&po, 0, sizeof po);
    po.data_path = small;
    po.ds.prompt_field = "question";
    po.ds.response_field = "answer";
    po.chat = &ct;
    po.n_threads = 1;
    po.out_path = path;
    prep_stats_t st;
    int rc = prep_run(t, &po, &st);
    tok_destroy(&t);
    return rc;
}

int pf_run_child(void *arg, int report_fd) {
    (void)report_fd;
    pf_run_args_t *a = arg;
    if (a->cwd[0] && chdir(a->cwd) != 0) return 126;
    int fd = open(a->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return 126;
    dup2(fd, 1);
    dup2(fd, 2);
    execv(a->argv[0], a->argv);
    return 127;
}

int pf_count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

int pf_count_in(const char *path, const char *needle) {
    char *txt = pf_slurp(path, NULL);
    if (!txt) return -1;
    int n = 0;
    for (const char *p = strstr(txt, needle); p; p = strstr(p + 1, needle)) n++;
    free(txt);
    return n;
}

void pf_teardown(const char *root) {
    proc_kill_all();
    if (getenv("DL_KEEP_TEST_DIR")) return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
}

int pf_fixture_setup(pf_fixture_t *fx, const char *prefix, int n_samples) {
    memset(fx, 0, sizeof *fx);
    if (n_samples > 0) {
        char gguf[1024];
        if (paths_default_model(gguf, sizeof gguf) < 0 || access(gguf, R_OK) != 0) {
            fprintf(stderr, "embedded model missing (make model): its tokenizer prepares the data\n");
            return -1;
        }
    }
    const char *b = getenv("DL_BIN_DIR");
    snprintf(fx->bin, sizeof fx->bin, "%s", b && *b ? b : "bin");
    if (fx->bin[0] != '/') {   /* children may run in other dirs */
        char cwd[512], t[1024];
        if (getcwd(cwd, sizeof cwd) && strlen(cwd) + strlen(fx->bin) + 2 < sizeof t) {
            memcpy(t, fx->bin, strlen(fx->bin) + 1);
            snprintf(fx->bin, sizeof fx->bin, "%s/%.500s", cwd, t);
        }
    }
    snprintf(fx->exe, sizeof fx->exe, "%s/draftline", fx->bin);
    snprintf(fx->root, sizeof fx->root, "/tmp/%.200s-%d", prefix, (int)getpid());
    if (mkdir(fx->root, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "fixture: mkdir %s: %s\n", fx->root, strerror(errno));
        return -1;
    }
    snprintf(fx->model_dir, sizeof fx->model_dir, "%s/tiny", fx->root);
    if (pf_write_tiny_model(fx->model_dir) < 0) {
        fprintf(stderr, "fixture: %s\n", dl_errmsg());
        return -1;
    }
    if (n_samples > 0) {
        snprintf(fx->cache, sizeof fx->cache, "%s/gsm8k%d.dlc", fx->root, n_samples);
        if (pf_write_cache(fx->root, n_samples, fx->cache) < 0) {
            fprintf(stderr, "fixture: %s\n", dl_errmsg());
            return -1;
        }
    }
    return 0;
}

int pf_run_finish(proc_t *p, const char *log, const char *out, int timeout_s, char *run_id) {
    int code = -1;
    int rc = proc_wait(p, timeout_s * 1000, &code);
    int left = kill(-p->pid, 0) == 0;   /* nothing of the run's process group may be left */
    if (left) kill(-p->pid, SIGKILL);   /* proc_kill skips a reaped leader's group */
    proc_kill(p);
    int shm_left = 0;
    if (run_id) {
        run_id[0] = 0;
        FILE *f = fopen(log, "r");
        char line[2048];
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "draftline run %16[0-9a-f]:", run_id) == 1) break;
        if (f) fclose(f);
        if (run_id[0]) {
            shm_left = slab_count(run_id);
            slab_sweep(run_id);   /* clean even when the caller's assertion fails */
        }
    }
    if (out && (rc != 0 || code != 0)) {
        char cmd[1600];
        snprintf(cmd, sizeof cmd, "tail -n 30 '%s'; tail -n 30 '%s'/logs/*.log", log, out);
        if (system(cmd) != 0) {}
    }
    int err = 0;
    if (rc == DL_ETIMEDOUT)
        err = dl_seterr(DL_ETIMEDOUT, "%s: still running after %d s (killed)", p->name, timeout_s);
    else if (rc != 0)
        err = rc;   /* proc_wait's DL_EINVAL / DL_EIO, its message kept */
    else if (left)
        err = dl_seterr(DL_ESTATE, "%s: a process of its group was left after it exited", p->name);
    else if (shm_left != 0)
        err = dl_seterr(DL_ESTATE, "%s: run %s left %d shared-memory objects", p->name, run_id, shm_left);
    if (err) {
        fprintf(stderr, "pf_run_finish: %s\n", dl_errmsg());
        return err;
    }
    return code;
}

int pf_run_draftline(const pf_run_args_t *a, const char *out, int timeout_s, char *run_id) {
    proc_t p;
    if (proc_spawn(&p, "draftline run", pf_run_child, (void *)a) < 0) {
        if (run_id) run_id[0] = 0;
        fprintf(stderr, "pf_run_draftline: spawn %s failed\n", a->argv[0]);
        return dl_seterr(DL_EIO, "spawn %s failed", a->argv[0]);
    }
    return pf_run_finish(&p, a->log, out, timeout_s, run_id);
}

char *pf_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        b = malloc((size_t)n + 1);
        if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    }
    fclose(f);
    if (!b) return NULL;
    b[n] = 0;
    if (len) *len = (size_t)n;
    return b;
}

int pf_step_losses(const char *run, double *loss, int cap) {
    char p[4200];
    snprintf(p, sizeof p, "%s/steps.jsonl", run);
    char *txt = pf_slurp(p, NULL);
    if (!txt) return -1;
    int n = 0;
    for (char *l = strtok(txt, "\n"); l && n < cap; l = strtok(NULL, "\n")) {
        rundir_step_rec_t r;
        if (rundir_steps_parse_line(l, strlen(l), &r) < 0) { n = -1; break; }
        loss[n++] = r.loss;
    }
    free(txt);
    return n;
}

int pf_same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = pf_slurp(a, &na), *y = pf_slurp(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

int pf_inbox_within(const char *out, double limit, double *high) {
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    *high = 0;
    char *txt = pf_slurp(path, NULL);
    if (!txt) return dl_seterr(DL_EIO, "%s: cannot read", path);
    int seen = 0, rc = 0, ln = 0;
    char *save = NULL;
    for (char *l = strtok_r(txt, "\n", &save); l && rc == 0; l = strtok_r(NULL, "\n", &save)) {
        ln++;
        cJSON *j = cJSON_Parse(l);
        if (!j) { rc = dl_seterr(DL_EFORMAT, "%s:%d: not JSON", path, ln); break; }
        const cJSON *hw = cJSON_GetObjectItem(j, "inbox_high_water");
        if (hw) {
            seen++;
            const cJSON *sl = cJSON_GetObjectItem(j, "inbox_slabs_bytes");
            const cJSON *gb = cJSON_GetObjectItem(j, "inbox_gpu_bytes");
            const cJSON *hb = cJSON_GetObjectItem(j, "inbox_host_bytes");
            if (!cJSON_IsNumber(hw) || !cJSON_IsNumber(sl) || !cJSON_IsNumber(gb) || !cJSON_IsNumber(hb)) {
                rc = dl_seterr(DL_EFORMAT, "%s:%d: an inbox line without inbox_slabs_bytes, "
                               "inbox_gpu_bytes, inbox_host_bytes or a numeric inbox_high_water", path, ln);
            } else {
                double slabs = sl->valuedouble, used = gb->valuedouble + hb->valuedouble;
                if (slabs > limit || used > limit || hw->valuedouble > limit)
                    rc = dl_seterr(DL_ERANGE, "%s:%d: inbox slabs %.0f B, in use %.0f B, high water %.0f B: "
                                   "over the bound %.0f B", path, ln, slabs, used, hw->valuedouble, limit);
                if (hw->valuedouble > *high) *high = hw->valuedouble;
            }
        }
        cJSON_Delete(j);
    }
    free(txt);
    if (rc < 0) {
        fprintf(stderr, "pf_inbox_within: %s\n", dl_errmsg());
        return rc;
    }
    return seen;
}

int pf_free_port_span(void) {
    for (int attempt = 0; attempt < 50; attempt++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t n = sizeof a;
        if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(s, (struct sockaddr *)&a, &n) != 0) {
            if (s >= 0) close(s);
            continue;
        }
        close(s);
        int base = ntohs(a.sin_port);
        if (base < 1024 || base > 65535 - 170) continue;
        int ok = 1;
        for (int p = base; ok && p < base + 164; p++) {
            int t = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in b = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p),
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            ok = t >= 0 && bind(t, (struct sockaddr *)&b, sizeof b) == 0;
            if (t >= 0) close(t);
        }
        if (ok) return base;
    }
    return -1;
}

int pf_wait_for_text(const char *path, const char *needle, double timeout_s) {
    for (int i = 0; i < (int)(timeout_s * 10); i++) {
        char *t = pf_slurp(path, NULL);
        int hit = t && strstr(t, needle);
        free(t);
        if (hit) return 1;
        usleep(100000);
    }
    return 0;
}

void pf_set_argv(pf_run_args_t *a, const char *const *argv) {
    int i = 0;
    for (; argv[i]; i++) a->argv[i] = (char *)argv[i];
    a->argv[i] = NULL;
}

void pf_show(const char *path) {
    char *t = pf_slurp(path, NULL);
    printf("--- %s ---\n%s\n", path, t ? t : "(none)");
    free(t);
}
