/* Supervisor, supervisor_run: the loop, signals, the stop and the summary (see supervisor.h). */
#include "supervisor/sup_int.h"
#include "common/pipe/cred.h"
#include "supervisor/nodes.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/testhook.h"
#include "common/mem/slab.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void sup__begin_stop(sup_t *S, const char *why) {
    if (S->stopping) return;
    S->stopping = 1;
    S->t_stop = clock_mono_s();
    log_info("stopping the pipeline: %s", why);
    if (S->rb.running) {
        S->rb.running = 0;
        snprintf(S->rb.status, sizeof S->rb.status, "rejected");
        snprintf(S->rb.message, sizeof S->rb.message, "the run stopped during the rebalance");
        sup__ctl_rb_update(S, NULL);
    }
    prom_server_destroy(&S->prom);
    sup__write_run_json(S);
    for (int i = 0; i < S->n; i++) {
        sstage_t *x = &S->st[i];
        x->restart_at = 0;
        if (x->exited || x->pid <= 0) continue;
        /* an optimizer on another node is asked with CONTROL STOP, not SIGTERM: a signal
         * closes its connection to us at once, and the metrics that say its final
         * checkpoint was written (ckpt_step: how the head knows it) would never come; the
         * 60 s SIGKILL below still bounds it */
        if (x->spec->stage_id == PIPE_ID_OPTIMIZER && sup__opt_remote(S) && x->helloed)
            sup__send_ctl(S, x, PROTO_CTL_STOP, NULL, 0);
        else
            sup__kill(S, x, SIGTERM);
    }
    if (S->ev.pid > 0) kill(S->ev.pid, SIGTERM);   /* the eval child stops with the run */
}

static void on_signal(uv_signal_t *h, int signum) {
    sup_t *S = h->data;
    if (signum == SIGCHLD) { sup__reap(S); return; }
    sup__on_stop_signal(S, signum);
}

void sup__on_stop_signal(sup_t *S, int signum) {
    /* the same Ctrl-C can arrive twice (e.g. through timeout(1)): only a later one kills */
    if (S->stopping && clock_mono_s() - S->t_stop < 2.0) return;
    if (S->stopping && !S->sum->signal) {
        /* already stopping on its own (reached --max-steps: `draftline stop` raced the
         * end): the final checkpoint is being written, so this first signal neither
         * kills the stages nor makes the finished run an interrupted one */
        S->sum->signal = signum;
        S->t_stop = clock_mono_s();
        log_info("signal %d: the run is already stopping; a second signal kills every stage", signum);
        return;
    }
    if (S->stopping) {
        log_warn("second signal: killing every stage");
        for (int i = 0; i < S->n; i++) if (S->st[i].pid > 0) sup__kill(S, &S->st[i], SIGKILL);
        if (S->ev.pid > 0) kill(S->ev.pid, SIGKILL);
        return;
    }
    S->sum->interrupted = 1;
    if (!S->sum->signal) S->sum->signal = signum;
    sup__begin_stop(S, S->stop_by ? S->stop_by
                       : signum == SIGINT ? "interrupted (Ctrl-C); stages write a final checkpoint" : "SIGTERM");
}

static void on_tick(uv_timer_t *t) {
    sup_t *S = t->data;
    double now = clock_mono_s();
    sup__reap(S);
    for (int i = 0; i < S->n; i++) {
        sstage_t *x = &S->st[i];
        if (x->exited && x->restart_at > 0 && now >= x->restart_at && !S->stopping && x->active) sup__spawn(S, x);
    }
    if (S->stopping) {
        int alive = 0;
        for (int i = 0; i < S->n; i++) alive += !S->st[i].exited;
        alive += S->ev.pid > 0;
        if (!alive) {
            uv_timer_stop(&S->tick);
            uv_close((uv_handle_t *)&S->tick, NULL);
            uv_close((uv_handle_t *)&S->sig_int, NULL);
            uv_close((uv_handle_t *)&S->sig_term, NULL);
            uv_close((uv_handle_t *)&S->sig_chld, NULL);
            sup__nodes_run_over(S);
            sup__progress_final(S);   /* the last step's line, before the summary */
            bus_close(S->bus, NULL, NULL);
            if (S->pub) bus_close(S->pub, NULL, NULL);
            /* every stage is gone: run.json says so before the clients waiting for
             * the stop hear "stopped" */
            S->done = 1;
            sup__write_run_json(S);
            sup__ctl_close(S);
            return;
        }
        if (now - S->t_stop > 60) {
            for (int i = 0; i < S->n; i++)
                if (S->st[i].pid > 0) { log_warn("%s did not stop in 60 s: SIGKILL", S->st[i].spec->name); sup__kill(S, &S->st[i], SIGKILL); }
            if (S->ev.pid > 0) kill(S->ev.pid, SIGKILL);
        }
        return;
    }
    sup__nodes_tick(S, now);
    sup__rb_tick(S);
    sup__balance_tick(S, now);
    sup__ev_poll(S);
    sup__progress_tick(S, now);
    sup__stall_check(S, now);
}

/* The summary's loss means and throughput (steady, wall: sup__rates) at the run's end. */
static void sum_figures(const sup_t *S, sup_summary_t *sum) {
    /* the first and last 10 losses; under 20 steps, halves that do not overlap (one step:
     * both are it) */
    uint64_t n = S->n_losses;
    uint64_t k = n >= 20 ? 10 : n >= 2 ? n / 2 : n;
    sum->loss_first10 = sup__mean_range(S->losses, 0, k);
    sum->loss_last10 = sup__mean_range(S->losses, n - k, n);
    sum->n_first = sum->n_last = (int)k;
    sum->tokens = (uint64_t)S->tokens;
    /* steady state: from the first applied step to the last (model loading excluded), on
     * the supervisor's clock (the optimizer's own restarts with each incarnation), with
     * the tokens of the steps that survive an optimizer restart (relay.c) */
    sum->seconds = S->have_step ? S->t_last_step - S->t_first_step : 0;
    sum->tokens_per_s = sum->seconds > 0 ? (S->tokens - S->tokens_first) / sum->seconds : 0;
    sup_rates_t r;
    sup__rates(S, clock_mono_s(), &r);
    sum->steady_tokens_per_s = r.steady;
    sum->steady_from = r.from;
    sum->steady_to = r.to;
    snprintf(sum->steady_note, sizeof sum->steady_note, "%s", r.note);
    sum->wall_tokens_per_s = r.wall;
    sum->wall_s = r.wall_s;
    sum->startup_s = r.startup_s;
    sum->final_ckpt_s = r.final_ckpt_s;
    sum->final_ckpt_with_stop = S->final_ckpt_with_stop;
}

/* One supervisor per run dir: the caller (cmd_run) holds the exclusive flock on
 * <out>/run.lock for the whole run (taken there, before the dir is touched: a second
 * flock here, on another fd of the same process, would conflict with it). */
int supervisor_run(const sup_opts_t *o, sup_summary_t *sum) {
    static sup_t S;
    memset(&S, 0, sizeof S);
    memset(sum, 0, sizeof *sum);
    S.o = o;
    S.sum = sum;
    int64_t strip = 0;   /* test hook (see sup_t.strip_gpu), read once before any spawn */
    S.strip_gpu = testhook_i64("strip_gpu", &strip) == 1 && strip == 1;
    S.losses = calloc(SUP_LOSS_HIST, sizeof(double));
    S.step_t = calloc(SUP_LOSS_HIST, sizeof(double));
    S.step_tok = calloc(SUP_LOSS_HIST, sizeof(double));
    S.last_applied = (int64_t)o->start_step - 1;
    S.opt_ckpt_step = -1;
    S.ckpt_failed_step = -1;
    if (!S.losses || !S.step_t || !S.step_tok) {
        free(S.losses); free(S.step_t); free(S.step_tok);
        return dl_seterr(DL_ENOMEM, "supervisor: out of memory");
    }
    DL_TRY(cred_secret_new(S.secret));   /* membership: each stage's credential derives from it */
    uv_loop_init(&S.loop);
    S.metrics = rundir_metrics_open(o->out_dir);
    if (!S.metrics) log_warn("%s (no metrics.jsonl for this run)", dl_errmsg());
    char ep[320];
    DL_TRY(sup__sup_endpoint(o, ep, sizeof ep));
    int64_t fake = 0;    /* test hook (see sup_t.fake_nodes), read once before any spawn */
    S.fake_nodes = o->listen_port && testhook_i64("fake_nodes", &fake) == 1 && fake == 1;
    if (S.fake_nodes && 1 + o->n_targets + o->n_drafters > RUNCFG_NODES_MAX)
        return dl_seterr(DL_EINVAL, "test hook fake_nodes: %d targets + %d drafters need more than %d nodes",
                         o->n_targets, o->n_drafters, RUNCFG_NODES_MAX);
    snprintf(S.nodes[0].addr, sizeof S.nodes[0].addr, "%s", o->listen_host ? o->listen_host : "");
    S.nodes[0].up = 1;
    bus_opts_t bo = {0};
    bo.kind = BUS_ROUTER;
    bo.name = "supervisor";
    bo.curve = o->listen_port ? o->keys : NULL;
    bo.linger_ms = o->listen_port ? 1000 : 0;   /* the agents' "run over" gets out at the end */
    bo.heartbeat_interval_ms = PIPE_HEARTBEAT_MS;
    bo.heartbeat_timeout_ms = PIPE_DEAD_MS;
    bo.goodbye = 1;   /* its stages hear an orderly close, not a death */
    S.bus = bus_new(&S.loop, &bo);
    if (!S.bus) return DL_EIO;
    DL_TRY(bus_bind(S.bus, ep));
    bus_on_message(S.bus, sup__on_msg, &S);
    bus_on_peer_dead(S.bus, sup__nodes_on_dead, &S);
    bus_on_peer_new(S.bus, sup__nodes_on_new, &S);
    sup__nodes_init(&S);
    S.nt = o->n_targets;
    S.nd = o->n_drafters;
    S.mon = mon_run_new();
    /* the metrics relay: every stage's METRICS payload on one PUB (topic = stage name) */
    if (bus_endpoint(o->sock_dir, "metrics", ep, sizeof ep) == 0) {
        bus_opts_t po = {0};
        po.kind = BUS_PUB;
        po.name = "metrics";
        S.pub = bus_new(&S.loop, &po);
        if (S.pub && bus_bind(S.pub, ep) < 0) { log_warn("metrics relay %s: %s", ep, dl_errmsg()); bus_destroy(&S.pub); }
    }
    if (o->metrics_port >= 0 && S.mon) {
        S.prom = prom_server_new(&S.loop, o->metrics_port, mon_prom_render_run, S.mon);
        if (!S.prom) log_warn("--metrics-port %d: %s (no Prometheus endpoint)", o->metrics_port, dl_errmsg());
        else {
            S.prom_port = prom_server_port(S.prom);
            log_info("Prometheus metrics on http://0.0.0.0:%d/metrics", S.prom_port);
        }
    }
    sup__ctl_start(&S);
    /* SIGCHLD, SIGINT, SIGTERM through the loop */
    uv_signal_init(&S.loop, &S.sig_int); S.sig_int.data = &S;
    uv_signal_init(&S.loop, &S.sig_term); S.sig_term.data = &S;
    uv_signal_init(&S.loop, &S.sig_chld); S.sig_chld.data = &S;
    uv_signal_start(&S.sig_int, on_signal, SIGINT);
    uv_signal_start(&S.sig_term, on_signal, SIGTERM);
    uv_signal_start(&S.sig_chld, on_signal, SIGCHLD);
    uv_timer_init(&S.loop, &S.tick);
    S.tick.data = &S;
    S.t0 = clock_mono_s();
    sup__progress_init(&S);
    S.ev.last_ckpt = sup__ev_latest_step(&S);   /* a resumed run's checkpoint is not evaluated again */
    {
        /* rebalance requests travel on the control socket now; a request file left by
         * an older `draftline rebalance` is never applied */
        char rq[4200];
        snprintf(rq, sizeof rq, "%s/rebalance.request", o->out_dir);
        if (unlink(rq) == 0) log_warn("removed a stale %s (left by an earlier `draftline rebalance`); not applied", rq);
    }
    S.n = o->n_stages;
    for (int i = 0; i < S.n; i++) S.st[i].spec = &o->stages[i];
    for (int i = 0; i < S.n; i++) S.gpu_mode |= is_target(&S.st[i]) && sup__spec_gpu(S.st[i].spec) >= 0;
    if (!sup__nodes_defer_start(&S))   /* multi-node: once every node joined (sup__nodes_tick) */
        for (int i = 0; i < S.n; i++) sup__spawn(&S, &S.st[i]);
    uv_timer_start(&S.tick, on_tick, 200, 200);
    uv_run(&S.loop, UV_RUN_DEFAULT);
    bus_destroy(&S.bus);
    bus_destroy(&S.pub);
    bus_destroy(&S.ctl.bus);
    prom_server_destroy(&S.prom);
    uv_run(&S.loop, UV_RUN_DEFAULT);
    mon_run_destroy(&S.mon);
    S.done = 1;
    sup__write_run_json(&S);
    uv_loop_close(&S.loop);
    rundir_metrics_close(&S.metrics);
    int swept = slab_sweep(o->run_id);
    if (swept > 0) log_warn("removed %d leftover shared-memory object(s) of run %s", swept, o->run_id);
    sum->steps = S.have_step ? S.last_step_seen + 1 : o->start_step;
    /* a signal that arrived as the last step was applied (`draftline stop` racing
     * --max-steps) did not cut the run short: it finished its steps */
    if (sum->interrupted && sum->steps >= o->max_steps) sum->interrupted = 0, sum->signal = 0;
    uint64_t n = S.n_losses;
    sum_figures(&S, sum);
    sum->failed = S.failed;
    char name[128];
    uint64_t latest_step = 0;
    int have_latest;
    if (sup__opt_remote(&S)) {   /* the optimizer's node has them: what it reported */
        have_latest = sup__latest_ckpt(&S, sum->checkpoint, sizeof sum->checkpoint, &latest_step) == 0;
        sstage_t *O = sup__by_id(&S, PIPE_ID_OPTIMIZER);
        if (O) snprintf(sum->checkpoint_node, sizeof sum->checkpoint_node, "%s", o->node_names[O->spec->node]);
    } else {
        int lr = rundir_latest_read(o->out_dir, name, sizeof name, &latest_step);
        if (lr >= 0) snprintf(sum->checkpoint, sizeof sum->checkpoint, "%s/checkpoints/%s", o->out_dir, name);
        have_latest = lr == 1;
    }
    /* a skipped step (NaN/Inf loss) keeps the weights: a run whose every surviving step
     * was skipped trained nothing, and its checkpoint is the initial drafter */
    uint64_t finite = 0;
    for (uint64_t i = 0; i < n; i++) finite += isfinite(S.losses[i]) != 0;
    free(S.losses);
    free(S.step_t);
    free(S.step_tok);
    /* a failed run's result is a checkpoint this run wrote, never the one it started from */
    if (S.failed && (!have_latest || latest_step <= o->start_step)) sum->checkpoint[0] = 0;
    int nrc = sup__nodes_result(&S);
    if (nrc < 0) return nrc;
    if (!S.failed && !sum->interrupted && n > 0 && finite == 0) {
        sum->failed = 1;
        return dl_seterr(DL_ESTATE, "every one of the %llu steps was skipped (loss NaN/Inf): nothing was trained "
                         "(see %s/logs/optimizer.log)", (unsigned long long)n, o->out_dir);
    }
    /* The optimizer logs a failed checkpoint write (disk full) and goes on; a run whose
     * last applied step has no checkpoint must not end as a success. */
    if (!S.failed && sum->steps > o->start_step && (!have_latest || latest_step < sum->steps)) {
        sum->failed = 1;
        return dl_seterr(DL_EIO, "the final checkpoint (step_%llu) was not written (disk full? see %s/logs/optimizer.log); "
                         "the last saved one is %s", (unsigned long long)sum->steps, o->out_dir,
                         sum->checkpoint[0] ? sum->checkpoint : "(none)");
    }
    return S.failed ? dl_seterr(DL_ESTATE, "the run failed (a stage died beyond its restarts, or the optimizer died; see above and %s/logs)", o->out_dir) : 0;
}
