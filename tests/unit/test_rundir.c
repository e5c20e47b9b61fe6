/* common/rundir: run.json written then read back field by field; the text of a known
 * run equals the supervisor's (a literal taken from a real `draftline run` of the code
 * before this module: tests/integration/test_run_keep_ckpt's resumed run); the
 * metrics/steps appenders write the lines the supervisor and optimizer wrote; the
 * readers give the documented error on malformed or truncated files, never a crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/rundir/ctl.h"
#include "common/rundir/rundir.h"

static char tmpdir[256];

static int setup_tmp(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dl-test-rundir-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state) {
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_in(const char *dir, const char *name, const char *text, size_t len) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fwrite(text, 1, len, f);
    fclose(f);
}

static char *slurp(const char *dir, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* run.json of the resumed run of test_run_keep_ckpt (supervisor of commit da37cf1) */
static const char REF_RUN_JSON[] =
    "{\n"
    "\t\"run_id\":\t\"ca368bd2\",\n"
    "\t\"device\":\t\"cpu\",\n"
    "\t\"targets\":\t1,\n"
    "\t\"drafters\":\t1,\n"
    "\t\"target_gpus\":\t[],\n"
    "\t\"drafter_gpus\":\t[],\n"
    "\t\"max_steps\":\t7,\n"
    "\t\"start_step\":\t5,\n"
    "\t\"micro_batches_per_step\":\t1,\n"
    "\t\"supervisor_pid\":\t12752,\n"
    "\t\"sock_dir\":\t\"/tmp/dlkc-12415/keep\",\n"
    "\t\"state\":\t\"stopped\",\n"
    "\t\"metrics_port\":\t-1,\n"
    "\t\"metrics_endpoint\":\t\"\",\n"
    "\t\"optimizer_recoveries\":\t0,\n"
    "\t\"target_model\":\t\"/tmp/dlkc-12415/tiny\",\n"
    "\t\"data\":\t\"/tmp/dlkc-12415/gsm8k60.dlc\",\n"
    "\t\"save_every\":\t1,\n"
    "\t\"keep_checkpoints\":\t2,\n"
    "\t\"deterministic\":\tfalse,\n"
    "\t\"stages\":\t[{\n"
    "\t\t\t\"name\":\t\"loader\",\n"
    "\t\t\t\"stage_id\":\t1,\n"
    "\t\t\t\"pid\":\t0,\n"
    "\t\t\t\"incarnation\":\t1,\n"
    "\t\t\t\"restarts\":\t0,\n"
    "\t\t\t\"gpu\":\t-1,\n"
    "\t\t\t\"process\":\t\"exited\"\n"
    "\t\t}, {\n"
    "\t\t\t\"name\":\t\"optimizer\",\n"
    "\t\t\t\"stage_id\":\t2,\n"
    "\t\t\t\"pid\":\t0,\n"
    "\t\t\t\"incarnation\":\t1,\n"
    "\t\t\t\"restarts\":\t0,\n"
    "\t\t\t\"gpu\":\t-1,\n"
    "\t\t\t\"process\":\t\"exited\"\n"
    "\t\t}, {\n"
    "\t\t\t\"name\":\t\"drafter0\",\n"
    "\t\t\t\"stage_id\":\t100,\n"
    "\t\t\t\"pid\":\t0,\n"
    "\t\t\t\"incarnation\":\t1,\n"
    "\t\t\t\"restarts\":\t0,\n"
    "\t\t\t\"gpu\":\t-1,\n"
    "\t\t\t\"process\":\t\"exited\"\n"
    "\t\t}, {\n"
    "\t\t\t\"name\":\t\"target0\",\n"
    "\t\t\t\"stage_id\":\t200,\n"
    "\t\t\t\"pid\":\t0,\n"
    "\t\t\t\"incarnation\":\t1,\n"
    "\t\t\t\"restarts\":\t0,\n"
    "\t\t\t\"gpu\":\t-1,\n"
    "\t\t\t\"process\":\t\"exited\"\n"
    "\t\t}],\n"
    "\t\"routes\":\t[[200, 100]]\n"
    "}\n";

static void ref_run(rundir_run_t *r) {
    rundir_run_init(r);
    snprintf(r->run_id, sizeof r->run_id, "ca368bd2");
    snprintf(r->device, sizeof r->device, "cpu");
    r->targets = r->drafters = 1;
    r->max_steps = 7, r->start_step = 5, r->micro_batches_per_step = 1;
    r->supervisor_pid = 12752;
    snprintf(r->sock_dir, sizeof r->sock_dir, "/tmp/dlkc-12415/keep");
    snprintf(r->state, sizeof r->state, "stopped");
    r->metrics_port = -1;
    r->optimizer_recoveries = 0;
    snprintf(r->target_model, sizeof r->target_model, "/tmp/dlkc-12415/tiny");
    snprintf(r->data, sizeof r->data, "/tmp/dlkc-12415/gsm8k60.dlc");
    r->save_every = 1, r->keep_checkpoints = 2, r->deterministic = 0;
    const char *names[] = {"loader", "optimizer", "drafter0", "target0"};
    const uint32_t ids[] = {1, 2, 100, 200};
    for (int i = 0; i < 4; i++) {
        rundir_stage_t *x = &r->stages[r->n_stages++];
        snprintf(x->name, sizeof x->name, "%s", names[i]);
        x->stage_id = ids[i];
        x->pid = 0, x->incarnation = 1, x->restarts = 0, x->gpu = -1;
        snprintf(x->process, sizeof x->process, "exited");
    }
    r->routes[0][0] = 200, r->routes[0][1] = 100, r->n_routes = 1;
}

static void test_run_json_text(void **state) {
    (void)state;
    rundir_run_t *r = malloc(sizeof *r), *b = malloc(sizeof *b);
    ref_run(r);
    char *txt = NULL;
    assert_int_equal(rundir_run_format(r, &txt), 0);
    assert_string_equal(txt, REF_RUN_JSON);
    free(txt);
    assert_int_equal(rundir_run_write(tmpdir, r), 0);
    assert_string_equal(slurp(tmpdir, RUNDIR_RUN_JSON), REF_RUN_JSON);
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s/run.json.tmp", tmpdir);
    assert_int_equal(access(tmp, F_OK) != 0, 1);        /* renamed into place */
    /* the reference text reads back to the same struct */
    assert_int_equal(rundir_run_read(tmpdir, b), 0);
    assert_int_equal(memcmp(r, b, sizeof *r), 0);
    free(r);
    free(b);
}

/* Every field, including the optional ones (GPU lists, rebalance, recovery times). */
static void test_run_json_roundtrip(void **state) {
    (void)state;
    rundir_run_t *r = malloc(sizeof *r), *b = malloc(sizeof *b);
    ref_run(r);
    snprintf(r->device, sizeof r->device, "cuda");
    r->targets = 2;
    r->target_gpus[0] = 0, r->target_gpus[1] = 1, r->n_target_gpus = 2;
    r->drafter_gpus[0] = 2, r->n_drafter_gpus = 1;
    r->max_steps = 5000000000LL;
    r->metrics_port = 9400;
    snprintf(r->metrics_endpoint, sizeof r->metrics_endpoint, "ipc:///tmp/dl-x/metrics");
    snprintf(r->control, sizeof r->control, "ipc:///tmp/dl-x/ctl.sock");
    r->optimizer_recoveries = 3;
    r->deterministic = 1;
    r->keep_checkpoints = 0;
    snprintf(r->mps, sizeof r->mps, "auto");
    snprintf(r->rebalance.id, sizeof r->rebalance.id, "rb-1-2");
    snprintf(r->rebalance.status, sizeof r->rebalance.status, "done");
    snprintf(r->rebalance.message, sizeof r->rebalance.message, "2+1 \"quoted\" \\ tab\t");
    r->rebalance.seconds = 1.25;
    r->stages[2].last_restart_up_s = 0.5;
    r->stages[2].last_recovery_s = 2.75;
    r->stages[2].pid = 4242, r->stages[2].incarnation = 2, r->stages[2].restarts = 1, r->stages[2].gpu = 2;
    snprintf(r->stages[2].process, sizeof r->stages[2].process, "running");
    r->routes[1][0] = 201, r->routes[1][1] = 100, r->n_routes = 2;
    assert_int_equal(rundir_run_write(tmpdir, r), 0);
    const char *t = slurp(tmpdir, RUNDIR_RUN_JSON);
    assert_non_null(strstr(t, "\"deterministic\":\ttrue"));
    assert_non_null(strstr(t, "\"mps\":\t\"auto\""));
    assert_non_null(strstr(t, "\"last_recovery_s\":\t2.75"));
    assert_non_null(strstr(t, "\"target_gpus\":\t[0, 1]"));
    assert_non_null(strstr(t, "\"metrics_endpoint\":\t\"ipc:///tmp/dl-x/metrics\",\n\t\"control\":\t\"ipc:///tmp/dl-x/ctl.sock\",\n"));
    assert_int_equal(rundir_run_read(tmpdir, b), 0);
    assert_int_equal(memcmp(r, b, sizeof *r), 0);
    const rundir_stage_t *x = rundir_run_stage(b, "drafter0");
    assert_non_null(x);
    assert_int_equal(x->pid, 4242);
    assert_null(rundir_run_stage(b, "drafter9"));
    /* optional keys left out when unset */
    r->target_model[0] = r->data[0] = r->rebalance.id[0] = r->control[0] = r->mps[0] = 0;
    assert_int_equal(rundir_run_write(tmpdir, r), 0);
    t = slurp(tmpdir, RUNDIR_RUN_JSON);
    assert_null(strstr(t, "target_model"));
    assert_null(strstr(t, "\"mps\""));
    assert_null(strstr(t, "\"data\""));
    assert_null(strstr(t, "rebalance"));
    assert_null(strstr(t, "control"));
    free(r);
    free(b);
}

/* A hand-written partial run.json (the monitor's fixtures) reads, absent keys "absent";
 * missing, malformed, truncated, mistyped files give the documented error. */
static void test_run_json_errors(void **state) {
    (void)state;
    rundir_run_t *r = malloc(sizeof *r);
    assert_int_equal(rundir_run_read(tmpdir, r), DL_ENOENT);
    int spid = 5;
    assert_int_equal(rundir_run_supervisor_pid(tmpdir, &spid), DL_ENOENT);
    assert_int_equal(spid, 0);
    const char *partial = "{\"device\": \"cpu\", \"targets\": 2, \"drafters\": 2, \"max_steps\": 100}\n";
    write_in(tmpdir, RUNDIR_RUN_JSON, partial, strlen(partial));
    assert_int_equal(rundir_run_read(tmpdir, r), 0);
    assert_int_equal(r->targets, 2);
    assert_int_equal(r->max_steps, 100);
    assert_int_equal(r->supervisor_pid, -1);
    assert_int_equal(r->start_step, -1);
    assert_int_equal(r->deterministic, -1);
    assert_int_equal(r->n_stages, 0);
    assert_string_equal(r->state, "");
    assert_int_equal(rundir_run_supervisor_pid(tmpdir, &spid), DL_ENOENT);
    assert_non_null(strstr(dl_errmsg(), "no supervisor_pid"));
    write_in(tmpdir, RUNDIR_RUN_JSON, REF_RUN_JSON, strlen(REF_RUN_JSON));
    assert_int_equal(rundir_run_supervisor_pid(tmpdir, &spid), 0);
    assert_int_equal(spid, 12752);
    /* every prefix of the reference text is malformed (only the whole is an object) */
    size_t n = strlen(REF_RUN_JSON);
    for (size_t k = 0; k + 2 < n; k += 7) {
        write_in(tmpdir, RUNDIR_RUN_JSON, REF_RUN_JSON, k);
        assert_int_equal(rundir_run_read(tmpdir, r), DL_EINVAL);
        assert_non_null(strstr(dl_errmsg(), "run.json"));
    }
    static const struct { const char *text, *key; } bad[] = {
        {"[1, 2]", "not a JSON object"},
        {"{\"supervisor_pid\": \"12\"}", "'supervisor_pid'"},
        {"{\"deterministic\": 1}", "'deterministic'"},
        {"{\"mps\": true}", "'mps'"},
        {"{\"stages\": [{\"name\": \"loader\"}, {\"name\": 7}]}", "'stages[1].name'"},
        {"{\"stages\": [{\"name\": \"a-very-long-stage-name-beyond-32-bytes\"}]}", "'stages[0].name'"},
        {"{\"stages\": [3]}", "'stages[0]'"},
        {"{\"stages\": {}}", "'stages'"},
        {"{\"routes\": [[200]]}", "'routes'"},
        {"{\"target_gpus\": [0, \"1\"]}", "'target_gpus'"},
        /* integers: whole and in range (hand edits are refused, not truncated) */
        {"{\"targets\": 2.9}", "'targets': expected an integer"},
        {"{\"targets\": 1e12}", "'targets': expected an integer"},
        {"{\"start_step\": 1e30}", "'start_step': expected an integer"},
        {"{\"target_gpus\": [-1]}", "'target_gpus': expected an array of CUDA ordinals (integers 0..1023)"},
        {"{\"drafter_gpus\": [0, 0.5]}", "'drafter_gpus': expected an array of CUDA ordinals"},
        {"{\"drafter_gpus\": [1024]}", "'drafter_gpus': expected an array of CUDA ordinals"},
        {"{\"rebalance\": {\"status\": 3}}", "'rebalance.status'"},
        {"{\"state\": \"a state string far too long\"}", "'state'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_in(tmpdir, RUNDIR_RUN_JSON, bad[i].text, strlen(bad[i].text));
        assert_int_equal(rundir_run_read(tmpdir, r), DL_EINVAL);
        assert_non_null(strstr(dl_errmsg(), bad[i].key));
        assert_non_null(strstr(dl_errmsg(), "run.json"));
    }
    /* 161 stages do not fit */
    char *big = malloc(161 * 16 + 32);
    size_t w = (size_t)sprintf(big, "{\"stages\": [");
    for (int i = 0; i < 161; i++) w += (size_t)sprintf(big + w, "%s{}", i ? "," : "");
    w += (size_t)sprintf(big + w, "]}");
    write_in(tmpdir, RUNDIR_RUN_JSON, big, w);
    assert_int_equal(rundir_run_read(tmpdir, r), DL_EINVAL);
    free(big);
    r->n_stages = RUNDIR_MAX_STAGES + 1;
    char *txt = NULL;
    assert_int_equal(rundir_run_format(r, &txt), DL_EINVAL);
    assert_null(txt);
    free(r);
}

/* The lines the supervisor's on_metrics wrote, and their parse. */
static void test_metrics_append_parse(void **state) {
    (void)state;
    rundir_metrics_t *w = rundir_metrics_open(tmpdir);
    assert_non_null(w);
    const char *names[] = {"wait_input_s", "wait_credit_s", "inbox_gpu_cap", "bad", "tokens"};
    const double vals[] = {0.167824876, 0, 268435456, NAN, 1139};
    assert_int_equal(rundir_metrics_append(w, 1796158722413000000ull, "drafter0", 100, 1, "stopping", names, vals, 5), 0);
    assert_int_equal(rundir_metrics_append(w, 1500000000ull, "we\"ird\\\n", 2, 3, "step", names, vals, 1), 0);
    const char *en[] = {"tau", "prompts"};
    const double ev[] = {1.5, 8};
    assert_int_equal(rundir_metrics_append_eval(w, 1700000000.25, 4, 2.5, en, ev, 2), 0);
    rundir_metrics_close(&w);
    assert_null(w);
    rundir_metrics_close(&w);
    const char *t = slurp(tmpdir, RUNDIR_METRICS);
    assert_string_equal(t,
        "{\"ts\":1796158722.413,\"stage\":\"drafter0\",\"stage_id\":100,\"incarnation\":1,\"state\":\"stopping\","
        "\"wait_input_s\":0.167824876,\"wait_credit_s\":0,\"inbox_gpu_cap\":268435456,\"bad\":null,\"tokens\":1139}\n"
        "{\"ts\":1.500,\"stage\":\"we\\\"ird\\\\\",\"stage_id\":2,\"incarnation\":3,\"state\":\"step\",\"wait_input_s\":0.167824876}\n"
        "{\"ts\":1700000000.25,\"stage\":\"eval\",\"state\":\"done\",\"step\":4,\"seconds\":2.5,\"tau\":1.5,\"prompts\":8}\n");
    rundir_metrics_rec_t rec;
    const char *l = strchr(t, '\n');
    assert_int_equal(rundir_metrics_parse_line(t, (size_t)(l - t), &rec), 0);
    assert_string_equal(rec.stage, "drafter0");
    assert_string_equal(rec.state, "stopping");
    assert_int_equal(rec.stage_id, 100);
    assert_int_equal(rec.incarnation, 1);
    assert_int_equal(rec.n, 5);
    assert_true(isnan(rundir_metrics_get(&rec, "bad")));
    assert_true(isnan(rundir_metrics_get(&rec, "absent")));
    assert_true(rundir_metrics_get(&rec, "tokens") == 1139);
    rundir_metrics_rec_free(&rec);
    static const char *const bad[] = {"", "{", "[]", "nul", "{\"ts\":1,\"stage\":\"a\"}",
                                      "{\"ts\":\"1\",\"stage\":\"a\",\"state\":\"x\"}", "{\"ts\":1,\"stage\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(rundir_metrics_parse_line(bad[i], strlen(bad[i]), &rec), DL_EINVAL);
        rundir_metrics_rec_free(&rec);
    }
}

/* Each stage's latest non-step line from the tail of the file; a torn first line (the
 * tail cut) and garbage are skipped. */
static void test_metrics_latest(void **state) {
    (void)state;
    rundir_metrics_rec_t *recs = NULL;
    int n = -1;
    assert_int_equal(rundir_metrics_latest(tmpdir, 0, &recs, &n), 0);     /* no file */
    assert_int_equal(n, 0);
    static const char text[] =
        "{\"ts\":1,\"stage\":\"loader\",\"stage_id\":1,\"incarnation\":1,\"state\":\"idle\",\"done\":1}\n"
        "{\"ts\":1,\"stage\":\"optimizer\",\"stage_id\":2,\"incarnation\":1,\"state\":\"idle\",\"step\":0}\n"
        "garbage\n"
        "{\"ts\":2,\"stage\":\"loader\",\"stage_id\":1,\"incarnation\":1,\"state\":\"blocked\",\"done\":2}\n"
        "{\"ts\":2,\"stage\":\"optimizer\",\"stage_id\":2,\"incarnation\":1,\"state\":\"step\",\"step\":1}\n"
        "{\"ts\":3,\"stage\":\"loader\",\"stage_id\":1,\"incarnation\":1,\"state\":\"idle\",\"done\":3}\n"
        "{\"ts\":3,\"stage\":\"target0\",\"stage_id\":200,\"incarnation\":1,\"state\":\"runn";
    write_in(tmpdir, RUNDIR_METRICS, text, strlen(text));
    assert_int_equal(rundir_metrics_latest(tmpdir, 0, &recs, &n), 0);
    assert_int_equal(n, 2);
    const rundir_metrics_rec_t *x = rundir_metrics_find(recs, n, "loader");
    assert_non_null(x);
    assert_true(rundir_metrics_get(x, "done") == 3);
    x = rundir_metrics_find(recs, n, "optimizer");
    assert_non_null(x);
    assert_string_equal(x->state, "idle");
    /* its step line (step 1, ts 2) is newer than its periodic one (count 0, ts 1): 2 applied */
    assert_true(rundir_metrics_get(x, "step") == 2);
    assert_null(rundir_metrics_find(recs, n, "target0"));
    rundir_metrics_latest_free(&recs, n);
    assert_null(recs);
    /* the last 150 bytes: starts inside a line */
    assert_int_equal(rundir_metrics_latest(tmpdir, 150, &recs, &n), 0);
    assert_int_equal(n, 1);
    assert_true(rundir_metrics_get(&recs[0], "done") == 3);
    rundir_metrics_latest_free(&recs, n);
}

static void test_steps(void **state) {
    (void)state;
    rundir_steps_t *w = rundir_steps_open(tmpdir, -1);
    assert_non_null(w);
    rundir_step_t s = {0, 11.1678465, 3.30623178, 0.003, 194, 0, 0, 0.3196};
    for (int k = 0; k < 4; k++) {
        s.step = (uint64_t)k;
        if (k == 2) s.loss = NAN, s.grad_norm = INFINITY, s.skipped = 1, s.acc_mean = 0.1234567;
        assert_int_equal(rundir_steps_append(w, &s), 0);
    }
    rundir_steps_close(&w);
    const char *t = slurp(tmpdir, RUNDIR_STEPS);
    const char *want =
        "{\"step\":0,\"loss\":11.1678465,\"grad_norm\":3.30623178,\"lr\":0.003,\"tokens\":194,\"skipped\":0,\"acc_mean\":0.000000,\"t\":0.320}\n"
        "{\"step\":1,\"loss\":11.1678465,\"grad_norm\":3.30623178,\"lr\":0.003,\"tokens\":194,\"skipped\":0,\"acc_mean\":0.000000,\"t\":0.320}\n"
        "{\"step\":2,\"loss\":null,\"grad_norm\":null,\"lr\":0.003,\"tokens\":194,\"skipped\":1,\"acc_mean\":0.123457,\"t\":0.320}\n"
        "{\"step\":3,\"loss\":null,\"grad_norm\":null,\"lr\":0.003,\"tokens\":194,\"skipped\":1,\"acc_mean\":0.123457,\"t\":0.320}\n";
    assert_string_equal(t, want);
    rundir_step_rec_t rec;
    assert_int_equal(rundir_steps_parse_line(want, strchr(want, '\n') - want, &rec), 0);
    assert_true(rec.step == 0 && rec.loss == 11.1678465 && rec.tokens == 194 && rec.skipped == 0 && rec.t == 0.32);
    assert_true(isnan(rec.acc[1]));
    const char *l3 = strstr(want, "{\"step\":2");
    assert_int_equal(rundir_steps_parse_line(l3, strchr(l3, '\n') - l3, &rec), 0);
    assert_true(isnan(rec.loss) && isnan(rec.grad_norm) && rec.skipped == 1);
    const char *acc = "{\"step\":7,\"acc_1\":0.5,\"acc_15\":0.25,\"acc_16\":1}  ";
    assert_int_equal(rundir_steps_parse_line(acc, strlen(acc), &rec), 0);
    assert_true(rec.step == 7 && rec.acc[1] == 0.5 && rec.acc[15] == 0.25 && isnan(rec.lr));
    assert_int_equal(rundir_steps_parse_line("{\"step\":", 8, &rec), DL_EINVAL);
    assert_int_equal(rundir_steps_parse_line("", 0, &rec), DL_EINVAL);
    /* a resumed optimizer from step 2: steps 2, 3 and a torn line go; a bad line stays */
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, RUNDIR_STEPS);
    FILE *f = fopen(p, "a");
    fputs("not json\n{\"step\":9,\"lo", f);
    fclose(f);
    w = rundir_steps_open(tmpdir, 2);
    assert_non_null(w);
    rundir_steps_close(&w);
    t = slurp(tmpdir, RUNDIR_STEPS);
    assert_int_equal(strncmp(t, want, (size_t)(strstr(want, "{\"step\":2") - want)), 0);
    assert_string_equal(strstr(t, "not json"), "not json\n");
}

static void test_latest(void **state) {
    (void)state;
    char name[64];
    uint64_t step = 99;
    assert_int_equal(rundir_latest_read(tmpdir, name, sizeof name, &step), DL_ENOENT);
    char p[512];
    snprintf(p, sizeof p, "%s/checkpoints", tmpdir);
    mkdir(p, 0755);
    write_in(tmpdir, RUNDIR_LATEST, "", 0);
    assert_int_equal(rundir_latest_read(tmpdir, name, sizeof name, &step), DL_ENOENT);
    write_in(tmpdir, RUNDIR_LATEST, "step_7\n", 7);
    assert_int_equal(rundir_latest_read(tmpdir, name, sizeof name, &step), 1);
    assert_string_equal(name, "step_7");
    assert_int_equal(step, 7);
    write_in(tmpdir, RUNDIR_LATEST, "final\r\n", 7);
    assert_int_equal(rundir_latest_read(tmpdir, name, sizeof name, &step), 0);
    assert_string_equal(name, "final");
    assert_int_equal(step, 0);
    assert_int_equal(rundir_latest_read(tmpdir, NULL, 0, NULL), 0);
    /* the writer: the exact bytes the reader and older versions expect, replacing what was
     * there, no latest.tmp left; a folder that does not exist is DL_EIO */
    assert_int_equal(rundir_latest_write(p, 12345678901ull), 0);
    assert_int_equal(rundir_latest_read(tmpdir, name, sizeof name, &step), 1);
    assert_int_equal(step, 12345678901ull);
    char q[600], buf[64] = "";
    snprintf(q, sizeof q, "%s/latest", p);
    FILE *f = fopen(q, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    assert_string_equal(buf, "step_12345678901\n");
    snprintf(q, sizeof q, "%s/latest.tmp", p);
    assert_int_equal(access(q, F_OK), -1);
    snprintf(q, sizeof q, "%s/nope", p);
    assert_int_equal(rundir_latest_write(q, 1), DL_EIO);
}

/* The control endpoint: run.json's "control" when absolute (the socket dir under /tmp
 * of a run dir too long for sun_path); a relative ipc path is relative to the
 * supervisor's working directory, unknown to a client elsewhere, and names the run
 * dir's own ctl.sock: the client finds it through the dir it was given. */
static void test_ctl_endpoint(void **state) {
    (void)state;
    char ep[600], want[600];
    snprintf(want, sizeof want, "ipc://%s/ctl.sock", tmpdir);
    assert_int_equal(rundir_ctl_endpoint(tmpdir, ep, sizeof ep), 0);    /* no run.json */
    assert_string_equal(ep, want);
    rundir_run_t *r = malloc(sizeof *r);
    ref_run(r);
    snprintf(r->control, sizeof r->control, "ipc:///tmp/dl-x/ctl.sock");
    assert_int_equal(rundir_run_write(tmpdir, r), 0);
    assert_int_equal(rundir_ctl_endpoint(tmpdir, ep, sizeof ep), 0);
    assert_string_equal(ep, "ipc:///tmp/dl-x/ctl.sock");
    snprintf(r->control, sizeof r->control, "ipc://runs/mine/ctl.sock");   /* `--out runs/mine` */
    assert_int_equal(rundir_run_write(tmpdir, r), 0);
    assert_int_equal(rundir_ctl_endpoint(tmpdir, ep, sizeof ep), 0);
    assert_string_equal(ep, want);
    free(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_run_json_text, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_run_json_roundtrip, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_run_json_errors, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_metrics_append_parse, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_metrics_latest, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_steps, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_latest, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_ctl_endpoint, setup_tmp, teardown_tmp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
