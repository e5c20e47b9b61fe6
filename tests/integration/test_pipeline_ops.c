/* Operating a live run on CPU, multi-process, with the tiny random target of
 * test_pipeline: live rebalance, crash recovery under random kill -9 (optimizer
 * included), the monitor's stall diagnosis on a stage hung on purpose, the
 * Prometheus endpoint of a real `draftline run --metrics-port` and the metrics
 * relay files.
 *
 *  - rebalance 2+2 -> 3+1 -> 2+2 while training: every step applied once
 *    (steps.jsonl), the final weights bitwise equal to a run that never rebalanced;
 *  - chaos: 20 seeded kill -9 of random stages (loader, optimizer, drafters,
 *    targets): the run finishes, every step applied once, final weights bitwise
 *    equal to the undisturbed run's, no process or shared-memory object left;
 *  - a drafter hung on purpose (hook drafter0.stall_after_mbs) is reported stuck by
 *    `draftline monitor --once` within --stall-s, the drafter no target feeds is
 *    starved, not stuck; the Prometheus endpoint is scraped over TCP; every line of
 *    metrics.jsonl parses.
 * Every run has a hard timeout; the run's process group is killed and reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/base/rng.h"
#include "common/data/chat.h"
#include "common/data/prepare.h"
#include "common/data/tokenizer.h"
#include "common/model/config.h"
#include "common/model/dflash_ckpt.h"
#include "common/model/drafter.h"
#include "common/format/safetensors.h"
#include "common/pipe/ckpt.h"
#include "common/pipe/model.h"
#include "tests/support/pipeline_fixture.h"
#include "tests/support/proc.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pf_fixture_t fx;

/* ---- fixtures made once ---- */

static int group_setup(void **state) {
    (void)state;
    if (pf_fixture_setup(&fx, "dlops", 300) < 0) return -1;
    proc_watchdog(480);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pf_teardown(fx.root);
    return 0;
}

/* ---- running `draftline run` ---- */

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <zmq.h>

#include "proto/codec.h"

/* Subscribes to the run's metrics relay (run.json metrics_endpoint) and returns how
 * many METRICS messages (decoded, topic = the stage's name) arrived in `seconds`;
 * *saw_drafter0 is set when one came from drafter0. */
static int relay_count(const char *endpoint, double seconds, int *saw_drafter0) {
    void *ctx = zmq_ctx_new();
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    int to = 200, n = 0, linger = 0;
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &to, sizeof to);
    zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    if (zmq_connect(sub, endpoint) != 0) { zmq_close(sub); zmq_ctx_term(ctx); return -1; }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t0 = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9, t = t0;
    while (t - t0 < seconds) {
        zmq_msg_t f[3];
        int nf = 0, more = 1;
        while (more && nf < 3) {
            zmq_msg_init(&f[nf]);
            if (zmq_msg_recv(&f[nf], sub, 0) < 0) { zmq_msg_close(&f[nf]); break; }
            more = zmq_msg_more(&f[nf]);
            nf++;
        }
        if (nf == 3) {
            proto_msg_t m;
            if (proto_decode(zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), &m) == 0) {
                if (m.type == PROTO_METRICS) {
                    n++;
                    if (zmq_msg_size(&f[0]) == 8 && !memcmp(zmq_msg_data(&f[0]), "drafter0", 8)) *saw_drafter0 = 1;
                }
                proto_msg_free(&m);
            }
        }
        for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    }
    zmq_close(sub);
    zmq_ctx_term(ctx);
    return n;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Starts `draftline run` with the tiny settings plus extra args (NULL-ended). */
static void run_start(proc_t *p, const char *out, const char *log, ...) {
    static pf_run_args_t a;
    memset(&a, 0, sizeof a);
    int n = 0;
    a.argv[n++] = fx.exe;
    a.argv[n++] = "run";
    const char *fixed[] = {"--target-model", fx.model_dir, "--data", fx.cache, "--device", "cpu",
                           "--token-budget", "256", "--block-size", "4", "--num-anchors", "8",
                           "--drafter-layers", "1", "--lr", "3e-3", "--micro-batches-per-step", "2",
                           "--seed", "5", "--progress-every", "1", "--threads", "1", "--out", out, NULL};
    for (int i = 0; fixed[i]; i++) a.argv[n++] = (char *)fixed[i];
    va_list ap;
    va_start(ap, log);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;) a.argv[n++] = (char *)s;
    va_end(ap);
    a.argv[n] = NULL;
    snprintf(a.log, sizeof a.log, "%s", log);
    assert_int_equal(proc_spawn(p, "draftline run", pf_run_child, &a), 0);
}

/* Waits for the run (pf_run_finish, log tails when want is 0 and it failed); asserts
 * it exited with `want`, left no process of its group and no shared-memory object of
 * its run id. */
static void run_finish(proc_t *p, const char *out, const char *log, int timeout_s, int want) {
    char id[17] = "";
    int code = pf_run_finish(p, log, want == 0 ? out : NULL, timeout_s, id);
    assert_int_equal(code, want);
    assert_true(id[0]);
}

/* steps.jsonl holds steps 0..n-1, each exactly once, in order (the ledger: step s
 * is micro-batches s*K..s*K+K-1, applied once). */
static void assert_ledger(const char *out, int n) {
    char p[500];
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    size_t len;
    char *txt = pf_slurp(p, &len);
    assert_non_null(txt);
    int k = 0;
    for (char *l = strtok(txt, "\n"); l; l = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(l);
        assert_non_null(j);
        assert_int_equal((int)cJSON_GetObjectItem(j, "step")->valuedouble, k);
        cJSON_Delete(j);
        k++;
    }
    free(txt);
    assert_int_equal(k, n);
}

static void assert_same_weights(const char *a, const char *b, int step) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/checkpoints/step_%d/model.safetensors", a, step);
    snprintf(pb, sizeof pb, "%s/checkpoints/step_%d/model.safetensors", b, step);
    assert_true(pf_same_file(pa, pb));
    snprintf(pa, sizeof pa, "%s/checkpoints/step_%d/state.bin", a, step);
    snprintf(pb, sizeof pb, "%s/checkpoints/step_%d/state.bin", b, step);
    assert_true(pf_same_file(pa, pb));
}

/* Runs a `draftline` command, its stdout into *out (caller frees); returns the exit code. */
static int draftline_cmd(char **out, const char *args) {
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "timeout 90 %s/draftline %s 2>&1", fx.bin, args);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    size_t r;
    while (b && (r = fread(b + n, 1, cap - 1 - n, f)) > 0) n += r;
    if (b) b[n] = 0;
    int st = pclose(f);
    if (out) *out = b;
    else free(b);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs `draftline <fmt...>` (printf-formatted arguments), copies its output to stderr,
 * asserts its exit code is `code` and returns the output (caller frees). */
static char *cmd_expect(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *cmd_expect(int code, const char *fmt, ...) {
    char args[1500];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    char *txt = NULL;
    int rc = draftline_cmd(&txt, args);
    fprintf(stderr, "%s", txt ? txt : "");
    assert_int_equal(rc, code);
    assert_non_null(txt);
    return txt;
}

static int steps_done(const char *out) {
    char p[500];
    snprintf(p, sizeof p, "%s/steps.jsonl", out);
    return pf_count_lines(p);
}

static int wait_steps(const char *out, int n, double timeout_s) {
    double t0 = now_s();
    while (steps_done(out) < n) {
        if (now_s() - t0 > timeout_s) return -1;
        usleep(50000);
    }
    return 0;
}

#define MAX_STEPS "120"

static char base_out[400];

/* the undisturbed 2+2 run both the rebalance and the chaos runs are compared with */
static void baseline(void) {
    if (base_out[0]) return;
    char log[400];
    snprintf(base_out, sizeof base_out, "%s/base", fx.root);
    snprintf(log, sizeof log, "%s/base.out", fx.root);
    proc_t p;
    double t0 = now_s();
    run_start(&p, base_out, log, "--targets", "2", "--drafters", "2", "--max-steps", MAX_STEPS,
              "--save-every", "2", "--deterministic", NULL);
    run_finish(&p, base_out, log, 120, 0);
    fprintf(stderr, "baseline 2+2, %s steps: %.1f s\n", MAX_STEPS, now_s() - t0);
    assert_ledger(base_out, atoi(MAX_STEPS));
}

static void test_rebalance(void **state) {
    (void)state;
    baseline();
    char out[400], log[400], args[1200];
    snprintf(out, sizeof out, "%s/rb", fx.root);
    snprintf(log, sizeof log, "%s/rb.out", fx.root);
    proc_t p;
    run_start(&p, out, log, "--targets", "2", "--drafters", "2", "--max-steps", MAX_STEPS, "--save-every", "2",
              "--deterministic", "--inbox-gb", "0.01", NULL);
    assert_int_equal(wait_steps(out, 4, 60), 0);
    char *txt = NULL;
    /* GPU-mode requests: malformed lists are usage errors (2) before anything is
     * written; a well-formed GPU placement is refused by this CPU run's supervisor (1) */
    static const struct { const char *flags, *says; int rc; } gpu_req[] = {
        {"--target-gpus 0,0", "both --target-gpus", 2},
        {"--target-gpus '' --drafter-gpus 1", "--target-gpus: empty GPU list", 2},
        {"--target-gpus 0,x --drafter-gpus 1", "entry 1 is not a number", 2},
        {"--target-gpus 0 --drafter-gpus 1024", "out of range", 2},
        {"--target-gpus 0 --drafter-gpus 1 --targets 2", "for CPU runs", 2},
        {"--target-gpus 0,0 --drafter-gpus 1", "this run is in CPU mode", 1},
    };
    for (size_t i = 0; i < sizeof gpu_req / sizeof *gpu_req; i++) {
        snprintf(args, sizeof args, "rebalance --run %s %s --wait 30", out, gpu_req[i].flags);
        int grc = draftline_cmd(&txt, args);
        fprintf(stderr, "%s", txt ? txt : "");
        assert_int_equal(grc, gpu_req[i].rc);
        assert_non_null(strstr(txt, gpu_req[i].says));
        free(txt);
    }
    txt = cmd_expect(0, "status --run %s", out);
    assert_non_null(strstr(txt, "on cpu;"));
    assert_null(strstr(txt, "placement:"));   /* no GPU placement line on CPU */
    assert_non_null(strstr(txt, " gpu "));    /* the GPU column, "-" for CPU stages */
    free(txt);
    txt = cmd_expect(0, "rebalance --run %s --targets 3 --drafters 1 --wait 60", out);
    free(txt);
    txt = cmd_expect(0, "status --run %s", out);
    assert_non_null(strstr(txt, "target2 -> drafter0"));
    assert_non_null(strstr(txt, "target1 -> drafter0"));
    assert_non_null(strstr(txt, "retired"));
    free(txt);
    int at = steps_done(out);
    assert_int_equal(wait_steps(out, at + 3, 60), 0);
    txt = cmd_expect(0, "rebalance --run %s --targets 2 --drafters 2 --wait 60", out);
    free(txt);
    run_finish(&p, out, log, 120, 0);
    assert_ledger(out, atoi(MAX_STEPS));
    assert_same_weights(base_out, out, atoi(MAX_STEPS));
}

/* pid of a stage from run.json (0 when not running) */
static pid_t run_json_pid(const char *out, const char *stage) {
    char p[500];
    snprintf(p, sizeof p, "%s/run.json", out);
    size_t len;
    char *txt = pf_slurp(p, &len);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    pid_t pid = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "stages")) {
        const cJSON *n = cJSON_GetObjectItem(e, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, stage)) pid = (pid_t)cJSON_GetObjectItem(e, "pid")->valuedouble;
    }
    cJSON_Delete(j);
    return pid;
}

static void test_chaos(void **state) {
    (void)state;
    baseline();
    char out[400], log[400];
    snprintf(out, sizeof out, "%s/chaos", fx.root);
    snprintf(log, sizeof log, "%s/chaos.out", fx.root);
    proc_t p;
    double t0 = now_s();
    run_start(&p, out, log, "--targets", "2", "--drafters", "2", "--max-steps", MAX_STEPS, "--save-every", "2",
              "--deterministic", "--max-restarts", "100", NULL);
    assert_int_equal(wait_steps(out, 1, 60), 0);
    static const char *const victims[] = {"loader", "optimizer", "drafter0", "drafter1", "target0", "target1"};
    rng_t r;
    rng_seed(&r, 2026);
    int kills = 0, opt_kills = 0;
    /* kills go on up to the last step (the optimizer checkpoints the last step before it
     * announces it, so even a kill during the final stop loses nothing) */
    while (kills < 20 && steps_done(out) < atoi(MAX_STEPS) && now_s() - t0 < 100) {
        const char *v = victims[rng_u64(&r) % 6];
        pid_t pid = run_json_pid(out, v);
        if (pid <= 0 || kill(pid, SIGKILL) != 0) { usleep(50000); continue; }
        kills++;
        opt_kills += !strcmp(v, "optimizer");
        /* the next kill once the pipeline moved again and 0.1-0.5 s passed (at most 6 s) */
        int at = steps_done(out);
        double t1 = now_s(), wait = 0.1 + (double)(rng_u64(&r) % 400) / 1000.0;
        while (now_s() - t1 < 6 && (steps_done(out) <= at || now_s() - t1 < wait)) usleep(20000);
    }
    fprintf(stderr, "chaos: %d kills (%d of the optimizer) in %.1f s\n", kills, opt_kills, now_s() - t0);
    run_finish(&p, out, log, 150, 0);
    assert_true(kills >= 20);
    /* time from an optimizer's death to the first step its successor applied */
    FILE *f = fopen(log, "r");
    char line[2048];
    double worst = 0;
    int recoveries = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *q = strstr(line, " applied ");
        double s;
        if (strstr(line, "optimizer recovery:") && q && sscanf(q, " applied %lf s", &s) == 1) {
            recoveries++;
            if (s > worst) worst = s;
        }
    }
    if (f) fclose(f);
    fprintf(stderr, "chaos: %d optimizer recoveries, the slowest %.2f s to its first step\n", recoveries, worst);
    assert_true(worst < 10);
    assert_ledger(out, atoi(MAX_STEPS));
    assert_same_weights(base_out, out, atoi(MAX_STEPS));
}

static int http_get(int port, char *buf, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
    const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
    if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) { close(fd); return -1; }
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)r;
    buf[n] = 0;
    close(fd);
    return (int)n;
}

static void test_stall_monitor_prometheus(void **state) {
    (void)state;
    char out[400], log[400], args[1200];
    snprintf(out, sizeof out, "%s/stall", fx.root);
    snprintf(log, sizeof log, "%s/stall.out", fx.root);
    proc_t p;
    /* 1 target feeds drafter0 only; drafter0 hangs after 4 micro-batches (test hook) */
    setenv("DL_TEST_HOOKS", "drafter0.stall_after_mbs=4", 1);
    run_start(&p, out, log, "--targets", "1", "--drafters", "2", "--max-steps", "50",
              "--metrics-port", "0", NULL);
    unsetenv("DL_TEST_HOOKS");
    char dlog[500];
    snprintf(dlog, sizeof dlog, "%s/logs/drafter0.log", out);
    double t0 = now_s(), t_hang = 0;
    while (now_s() - t0 < 60 && !t_hang) {
        size_t len;
        char *t = pf_slurp(dlog, &len);
        if (t && strstr(t, "hanging on purpose")) t_hang = now_s();
        free(t);
        usleep(50000);
    }
    assert_true(t_hang > 0);
    /* Prometheus: the port is in run.json */
    char rj[500];
    snprintf(rj, sizeof rj, "%s/run.json", out);
    size_t len;
    char *txt = pf_slurp(rj, &len);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    int port = (int)cJSON_GetObjectItem(j, "metrics_port")->valuedouble;
    char endpoint[600];
    snprintf(endpoint, sizeof endpoint, "%s", cJSON_GetObjectItem(j, "metrics_endpoint")->valuestring);
    cJSON_Delete(j);
    assert_true(port > 0);
    /* the relay: 5 stages publish once a second */
    int saw0 = 0;
    int relayed = relay_count(endpoint, 2.5, &saw0);
    fprintf(stderr, "metrics relay %s: %d messages in 2.5 s\n", endpoint, relayed);
    assert_true(relayed >= 5);
    assert_true(saw0);
    static char body[1 << 20];
    /* every stage's first metrics (published once a second) */
    for (double t1 = now_s(); now_s() - t1 < 10; usleep(200000)) {
        assert_true(http_get(port, body, sizeof body) > 0);
        if (strstr(body, "draftline_stage_up{stage=\"drafter0\"") && strstr(body, "draftline_stage_up{stage=\"target0\""))
            break;
    }
    assert_non_null(strstr(body, "HTTP/1.0 200"));
    assert_non_null(strstr(body, "draftline_stage_up{stage=\"drafter0\""));
    assert_non_null(strstr(body, "draftline_gpu_index{stage=\"target0\""));
    assert_non_null(strstr(body, "draftline_wait_credit_seconds_total{stage=\"target0\""));
    /* the monitor: drafter0 stuck within --stall-s (3 s) + the metrics interval */
    double t_stuck = 0;
    char *snap = NULL;
    while (now_s() - t_hang < 20 && !t_stuck) {
        free(snap);
        snap = NULL;
        snprintf(args, sizeof args, "monitor --run %s --once --stall-s 3", out);
        draftline_cmd(&snap, args);
        char *d0 = snap ? strstr(snap, "\ndrafter0") : NULL;
        char *eol = d0 ? strchr(d0 + 1, '\n') : NULL;
        if (eol) *eol = 0;
        if (d0 && strstr(d0, "stuck")) t_stuck = now_s();
        if (eol) *eol = '\n';
        if (!t_stuck) usleep(250000);
    }
    fprintf(stderr, "%s", snap ? snap : "");
    fprintf(stderr, "drafter0 reported stuck %.1f s after it hung (--stall-s 3)\n", t_stuck - t_hang);
    assert_true(t_stuck > 0);
    assert_true(t_stuck - t_hang < 3 + 3.5);
    char *d1 = strstr(snap, "\ndrafter1");
    assert_non_null(d1);
    char *eol = strchr(d1 + 1, '\n');
    if (eol) *eol = 0;
    assert_non_null(strstr(d1, "starved"));
    assert_null(strstr(d1, "stuck"));
    free(snap);
    snprintf(args, sizeof args, "stop --run %s --wait 30", out);
    draftline_cmd(NULL, args);
    run_finish(&p, out, log, 60, 143);   /* stopped by SIGTERM (`draftline stop`): 128 + 15 */
    /* metrics.jsonl: every line parses */
    char mp[500];
    snprintf(mp, sizeof mp, "%s/metrics.jsonl", out);
    txt = pf_slurp(mp, &len);
    assert_non_null(txt);
    int lines = 0;
    for (char *l = strtok(txt, "\n"); l; l = strtok(NULL, "\n")) {
        cJSON *x = cJSON_Parse(l);
        assert_non_null(x);
        cJSON_Delete(x);
        lines++;
    }
    free(txt);
    assert_true(lines > 10);
}

#ifdef DL_CUDA
/* name's pid, gpu and incarnation from run.json (-1 each when absent); process into proc */
static void run_json_stage(const char *out, const char *name, int *pid, int *gpu, int *inc, char *proc, size_t cap) {
    char p[500];
    snprintf(p, sizeof p, "%s/run.json", out);
    size_t len;
    char *txt = pf_slurp(p, &len);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    *pid = *gpu = *inc = -1;
    if (proc) snprintf(proc, cap, "?");
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "stages")) {
        const cJSON *n = cJSON_GetObjectItem(e, "name");
        if (!cJSON_IsString(n) || strcmp(n->valuestring, name) != 0) continue;
        *pid = (int)cJSON_GetObjectItem(e, "pid")->valuedouble;
        *gpu = (int)cJSON_GetObjectItem(e, "gpu")->valuedouble;
        *inc = (int)cJSON_GetObjectItem(e, "incarnation")->valuedouble;
        if (proc) snprintf(proc, cap, "%s", cJSON_GetObjectItem(e, "process")->valuestring);
    }
    cJSON_Delete(j);
}
#endif

/* A GPU run's placement and live GPU rebalance, with CPU stages: in CUDA builds the
 * supervisor's test hook strip_gpu (DL_TEST_HOOKS=strip_gpu=1) clears the GPU fields of the
 * run configuration it sends each stage (runcfg_clear_gpus),
 * so everything the supervisor does for GPU runs (placement in run.json/status,
 * per-index keep/start/move/retire, the moved stage's restart, refusals) runs on a
 * machine without GPUs.
 * 0 / 1 -> 0,0 / 1 (target1 starts on GPU 0, target0 and drafter0 keep their
 * processes) -> 1 / 0,0 (target0 and drafter0 move: new processes; target1 retires,
 * drafter1 starts) -> 1 / 0 (drafter1 drains and retires). Every step applied once;
 * --deterministic: the final weights equal the undisturbed 2+2 CPU run's, bitwise. */
static void test_rebalance_gpu_placement(void **state) {
    (void)state;
#ifndef DL_CUDA
    skip();   /* `draftline run --target-gpus` needs a CUDA build */
#else
    baseline();
    char out[400], log[400], proc[32];
    snprintf(out, sizeof out, "%s/rbgpu", fx.root);
    snprintf(log, sizeof log, "%s/rbgpu.out", fx.root);
    setenv("DL_TEST_HOOKS", "strip_gpu=1", 1);
    proc_t p;
    run_start(&p, out, log, "--target-gpus", "0", "--drafter-gpus", "1", "--max-steps", MAX_STEPS, "--save-every",
              "2", "--deterministic", NULL);
    unsetenv("DL_TEST_HOOKS");
    assert_int_equal(wait_steps(out, 3, 60), 0);
    int t0pid, d0pid, pid, gpu, inc;
    run_json_stage(out, "target0", &t0pid, &gpu, &inc, NULL, 0);
    assert_int_equal(gpu, 0);
    run_json_stage(out, "drafter0", &d0pid, &gpu, &inc, NULL, 0);
    assert_int_equal(gpu, 1);
    run_json_stage(out, "optimizer", &pid, &gpu, &inc, NULL, 0);
    fprintf(stderr, "optimizer gpu %d\n", gpu);
    char *txt = NULL;
    /* a CPU-style request on a GPU run: refused, naming the placement */
    txt = cmd_expect(1, "rebalance --run %s --targets 2 --drafters 1 --wait 30", out);
    assert_non_null(strstr(txt, "this run is in GPU mode"));
    assert_non_null(strstr(txt, "now --target-gpus 0 --drafter-gpus 1"));
    free(txt);
    /* 1-1 -> 2 targets sharing GPU 0 */
    txt = cmd_expect(0, "rebalance --run %s --target-gpus 0,0 --drafter-gpus 1 --wait 60", out);
    assert_non_null(strstr(txt, "1+1 -> 2+1 in"));
    assert_non_null(strstr(txt, "2 kept, 1 started, 0 moved, 0 retired"));
    free(txt);
    run_json_stage(out, "target0", &pid, &gpu, &inc, NULL, 0);
    assert_int_equal(pid, t0pid);   /* kept: same process */
    assert_int_equal(inc, 1);
    run_json_stage(out, "drafter0", &pid, &gpu, &inc, NULL, 0);
    assert_int_equal(pid, d0pid);
    run_json_stage(out, "target1", &pid, &gpu, &inc, proc, sizeof proc);
    assert_int_equal(gpu, 0);
    assert_string_equal(proc, "running");
    txt = cmd_expect(0, "status --run %s", out);
    assert_non_null(strstr(txt, "on cuda;"));
    assert_non_null(strstr(txt, "placement: target GPUs 0,0, drafter GPUs 1"));
    assert_non_null(strstr(txt, "target1 -> drafter0"));
    free(txt);
    int at = steps_done(out);
    assert_int_equal(wait_steps(out, at + 3, 60), 0);
    /* moves: target0 0 -> 1 and drafter0 1 -> 0 restart there; target1 retires, drafter1 starts */
    txt = cmd_expect(0, "rebalance --run %s --target-gpus 1 --drafter-gpus 0,0 --wait 60", out);
    assert_non_null(strstr(txt, "2+1 -> 1+2 in"));
    assert_non_null(strstr(txt, "0 kept, 1 started, 2 moved, 1 retired"));
    free(txt);
    run_json_stage(out, "target0", &pid, &gpu, &inc, proc, sizeof proc);
    assert_int_equal(gpu, 1);
    assert_int_equal(inc, 2);
    assert_true(pid > 0 && pid != t0pid);
    assert_string_equal(proc, "running");
    run_json_stage(out, "drafter0", &pid, &gpu, &inc, NULL, 0);
    assert_int_equal(gpu, 0);
    assert_true(pid > 0 && pid != d0pid);
    run_json_stage(out, "drafter1", &pid, &gpu, &inc, NULL, 0);
    assert_int_equal(gpu, 0);
    run_json_stage(out, "target1", &pid, &gpu, &inc, proc, sizeof proc);
    assert_string_equal(proc, "retired");
    at = steps_done(out);
    assert_int_equal(wait_steps(out, at + 3, 60), 0);
    /* the drafter count back to 1: drafter1 drains and retires, the rest is kept */
    txt = cmd_expect(0, "rebalance --run %s --target-gpus 1 --drafter-gpus 0 --wait 60", out);
    assert_non_null(strstr(txt, "2 kept, 0 started, 0 moved, 1 retired"));
    free(txt);
    run_json_stage(out, "drafter1", &pid, &gpu, &inc, proc, sizeof proc);
    assert_string_equal(proc, "retired");
    run_finish(&p, out, log, 120, 0);
    assert_ledger(out, atoi(MAX_STEPS));
    assert_same_weights(base_out, out, atoi(MAX_STEPS));
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stall_monitor_prometheus),
        cmocka_unit_test(test_rebalance),
        cmocka_unit_test(test_chaos),
        cmocka_unit_test(test_rebalance_gpu_placement),
    };
    const char *only = getenv("DL_TEST_CASE");   /* e.g. DL_TEST_CASE=test_chaos */
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
