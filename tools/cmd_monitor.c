/* draftline monitor: attaches to a live run through its control socket (a
 * subscription to the relayed metrics, seeded by the supervisor's recent history, and a
 * status request per refresh: common/monitor/live.h); a run that does not answer (it
 * ended, or was copied from elsewhere) by following <run>/metrics.jsonl and
 * <run>/steps.jsonl and reading <run>/run.json. Three modes:
 *   (default)            ncurses TUI, redrawn every --interval-s
 *   --once               one plain-text snapshot on stdout, for scripts
 *   --prometheus-port P  serve the run's latest metrics on http://HOST:P/metrics
 * The snapshot and the diagnosis are common/monitor/{report,diag}.c. */
#include "tools/commands.h"

#include "common/base/cli.h"
#include "common/base/clock.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/monitor/diag.h"
#include "common/monitor/live.h"
#include "common/monitor/nvml.h"
#include "common/monitor/prom.h"
#include "common/monitor/report.h"
#include "common/monitor/run.h"
#include "common/rundir/rundir.h"

#include <getopt.h>
#include <math.h>
#include <ncurses.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define MON_MAX_GPUS 64

static void monitor_usage(FILE *f) {
    fprintf(f,
            "usage: draftline monitor --run DIR [--once] [--stall-s S] [--interval-s S] [--window-s S]\n"
            "                         [--wait-share X] [--max-steps N] [--no-nvml]\n"
            "                         [--prometheus-port P [--prometheus-host ADDR]]\n\n"
            "Attaches to a run: a live one through its control socket, a finished one through\n"
            "DIR/run.json, DIR/metrics.jsonl and DIR/steps.jsonl:\n"
            "per-stage throughput, phase shares and a stall diagnosis (ok, starved = waiting for\n"
            "input, back-pressured = waiting for credit, stuck = neither and no progress for\n"
            "--stall-s), the bottleneck with the rebalance it suggests, the drafters' inbox fill,\n"
            "GPU utilisation and memory (NVML, when present; not on a CPU run), loss,\n"
            "per-position accuracy, ETA.\n\n"
            "  --run DIR              run directory (`draftline run --out DIR`)\n"
            "  --once                 print one text snapshot and exit (no terminal UI)\n"
            "  --stall-s S            no progress for S seconds = stalled (default 60)\n"
            "  --interval-s S         refresh period (default 1)\n"
            "  --window-s S           history window of the phase shares (default 10)\n"
            "  --wait-share X         a wait share of at least X counts as waiting (default 0.5)\n"
            "  --max-steps N          for the ETA (default: DIR/run.json or the optimizer's log)\n"
            "  --prometheus-port P    serve Prometheus text format on P until Ctrl-C\n"
            "                         (with --once: print the Prometheus text once and exit)\n"
            "  --prometheus-host A    IPv4 address to bind (default 0.0.0.0)\n"
            "  --no-nvml              do not query GPUs\n"
            "TUI keys: q quit, up/down/PgUp/PgDn scroll. Not a terminal (redirected, piped): as --once.\n");
}

typedef struct {
    const char *dir;
    int once, no_nvml;
    double interval_s;
    mon_diag_opts_t diag;
    uint64_t max_steps;
    int prom_port;
    const char *prom_host;
} mon_args_t;

typedef struct {
    mon_args_t a;
    mon_run_t *run;
    mon_live_t *live;                       /* the control socket's feed; NULL: the files */
    mon_topo_t topo;
    mon_nvml_t *nvml;
    int nvml_tried;                         /* opened once, after run.json said the device */
    const char *nvml_why;
    char nvml_err[200];
    mon_gpu_t gpus[MON_MAX_GPUS];
    int n_gpus;
} mon_ctx_t;

/* The run stopped answering (it ended): from now on its files, read from the top
 * into a fresh picture (the live one's history would mix with the replayed lines). */
static void ctx_to_files(mon_ctx_t *C) {
    mon_live_destroy(&C->live);
    mon_run_t *r = mon_run_open(C->a.dir);
    if (!r) { log_warn("monitor: %s (keeping the last live picture)", dl_errmsg()); return; }
    mon_run_destroy(&C->run);
    C->run = r;
}

/* NVML, opened the first time the device is known not to be the CPU (a CPU run never
 * calls it: no GPU figures to show, no library error to print). */
static void ctx_nvml(mon_ctx_t *C) {
    if (C->nvml_tried || C->topo.cpu_run) return;
    C->nvml_tried = 1;
    if (C->a.no_nvml) { C->nvml_why = "--no-nvml"; return; }
    C->nvml = mon_nvml_open(NULL);
    if (!C->nvml) {
        snprintf(C->nvml_err, sizeof C->nvml_err, "%s", dl_errmsg());
        C->nvml_why = C->nvml_err;
    }
}

/* New metrics in: the subscription's queue, or the files' appends. */
static void ctx_pump(mon_ctx_t *C) {
    if (C->live && mon_live_drain(C->live, C->run) < 0) ctx_to_files(C);
    if (!C->live) mon_run_poll(C->run);
}

static void ctx_refresh(mon_ctx_t *C) {
    mon_topo_t t = {0};
    if (C->live && mon_live_refresh(C->live, C->run, &t) < 0) {
        memset(&t, 0, sizeof t);
        ctx_to_files(C);
    }
    if (!C->live) {
        mon_run_poll(C->run);
        mon_topo_read(C->a.dir, &t);        /* absent run.json is fine */
    }
    if (C->a.max_steps) t.max_steps = C->a.max_steps;
    C->topo = t;
    C->n_gpus = 0;
    ctx_nvml(C);
    if (C->nvml) {
        int n = mon_nvml_count(C->nvml);
        for (int i = 0; i < n && C->n_gpus < MON_MAX_GPUS; i++)
            if (mon_nvml_query(C->nvml, i, &C->gpus[C->n_gpus]) == 0) C->n_gpus++;
    }
}

static int ctx_report(mon_ctx_t *C, int cols, char **text) {
    mon_report_opts_t ro = {0};
    ro.wall = clock_wall_s();
    double live = 3 * C->a.interval_s > 10 ? 3 * C->a.interval_s : 10;
    ro.now = mon_report_now(C->run, ro.wall, live);
    ro.diag = C->a.diag;
    ro.topo = C->topo;
    ro.gpus = C->nvml ? C->gpus : NULL;
    ro.n_gpus = C->n_gpus;
    ro.nvml_why = C->nvml_why;
    ro.cols = cols;
    return mon_report(C->run, &ro, text);
}

/* ------------------------------------------------------------ Prometheus mode */

typedef struct {
    mon_ctx_t *C;
    prom_server_t *srv;
    uv_timer_t timer, pump;
    uv_signal_t sig_int, sig_term;
} prom_mode_t;

static int prom_render(void *arg, char **text, size_t *len) {
    mon_ctx_t *C = arg;
    ctx_pump(C);                            /* serve what arrived right now */
    double wall = clock_wall_s();
    double live = 3 * C->a.interval_s > 10 ? 3 * C->a.interval_s : 10;
    return mon_prom_render(C->run, mon_report_now(C->run, wall, live), &C->a.diag, &C->topo, text, len);
}

static void prom_tick(uv_timer_t *t) {
    prom_mode_t *P = t->data;
    ctx_refresh(P->C);
}

static void prom_pump(uv_timer_t *t) {
    prom_mode_t *P = t->data;
    ctx_pump(P->C);                         /* the subscription's heartbeats */
}

static void prom_stop(uv_signal_t *s, int signum) {
    prom_mode_t *P = s->data;
    log_info("signal %d: stopping the Prometheus server", signum);
    prom_server_destroy(&P->srv);
    uv_close((uv_handle_t *)&P->timer, NULL);
    uv_close((uv_handle_t *)&P->pump, NULL);
    uv_close((uv_handle_t *)&P->sig_int, NULL);
    uv_close((uv_handle_t *)&P->sig_term, NULL);
}

static int run_prometheus(mon_ctx_t *C) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    prom_mode_t P = {0};
    P.C = C;
    P.srv = prom_server_new_at(&loop, C->a.prom_host, C->a.prom_port, prom_render, C);
    if (!P.srv) {
        log_rc(DL_EIO, "monitor --prometheus-port");
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
        return 1;
    }
    uv_timer_init(&loop, &P.timer);
    P.timer.data = &P;
    uv_timer_start(&P.timer, prom_tick, 0, (uint64_t)(C->a.interval_s * 1000));
    uv_timer_init(&loop, &P.pump);
    P.pump.data = &P;
    uv_timer_start(&P.pump, prom_pump, MON_LIVE_PUMP_MS, MON_LIVE_PUMP_MS);
    uv_signal_init(&loop, &P.sig_int);
    uv_signal_init(&loop, &P.sig_term);
    P.sig_int.data = P.sig_term.data = &P;
    uv_signal_start(&P.sig_int, prom_stop, SIGINT);
    uv_signal_start(&P.sig_term, prom_stop, SIGTERM);
    printf("serving http://%s:%d/metrics for run %s (Ctrl-C stops)\n", C->a.prom_host,
           prom_server_port(P.srv), C->a.dir);
    fflush(stdout);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return 0;
}

/* ------------------------------------------------------------------------ TUI */

static volatile sig_atomic_t tui_quit;
static void tui_on_signal(int s) { (void)s; tui_quit = 1; }

static int line_attr(const char *l) {
    if (strstr(l, ": stuck") || strstr(l, ": silent")) return COLOR_PAIR(1) | A_BOLD;
    if (strstr(l, ": starved") || strstr(l, ": back-pressured")) return COLOR_PAIR(2);
    if (!strncmp(l, "bottleneck:", 11) || !strncmp(l, "training:", 9)) return A_BOLD;
    if (!strncmp(l, "STAGE ", 6) || !strncmp(l, "INBOX ", 6) || !strncmp(l, "GPU ", 4)) return A_UNDERLINE;
    return 0;
}

/* A key, or ERR at `next` (monotonic s); a live run's subscription is pumped every
 * MON_LIVE_PUMP_MS meanwhile (its heartbeats, and the metrics queue stays short). */
static int tui_getch(mon_ctx_t *C, double next) {
    for (;;) {
        int ms = (int)((next - clock_mono_s()) * 1000);
        if (C->live && ms > MON_LIVE_PUMP_MS) ms = MON_LIVE_PUMP_MS;
        timeout(ms < 10 ? 10 : ms);
        int ch = getch();
        if (C->live) ctx_pump(C);
        if (ch != ERR || tui_quit || clock_mono_s() >= next) return ch;
    }
}

static int run_tui(mon_ctx_t *C) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = tui_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (!initscr()) { fprintf(stderr, "monitor: cannot start the terminal UI (try --once)\n"); return 1; }
    cbreak();
    noecho();
    keypad(stdscr, TRUE);
    curs_set(0);
    if (has_colors()) {
        start_color();
        use_default_colors();
        init_pair(1, COLOR_RED, -1);
        init_pair(2, COLOR_YELLOW, -1);
    }
    int scroll = 0;
    double next = 0;
    while (!tui_quit) {
        double now = clock_mono_s();
        if (now >= next) {
            ctx_refresh(C);
            next = now + C->a.interval_s;
        }
        int rows, cols;
        getmaxyx(stdscr, rows, cols);       /* the terminal's (TIOCGWINSZ, else $COLUMNS) */
        char *text = NULL;
        if (ctx_report(C, cols, &text) < 0) break;
        erase();
        char clock_s[32];
        time_t t = (time_t)clock_wall_s();
        strftime(clock_s, sizeof clock_s, "%H:%M:%S", localtime(&t));
        attron(A_REVERSE);
        mvprintw(0, 0, " draftline monitor  %s  stall %.0fs  q: quit ", clock_s, C->a.diag.stall_s);
        attroff(A_REVERSE);
        int y = 1, idx = 0;
        for (char *l = text, *e; l && *l && y < rows; l = e ? e + 1 : NULL, idx++) {
            e = strchr(l, '\n');
            if (e) *e = 0;
            if (idx < scroll) continue;
            int at = line_attr(l);
            attron(at);
            mvaddnstr(y++, 0, l, cols);
            attroff(at);
        }
        free(text);
        refresh();
        int ch = tui_getch(C, next);
        if (ch == 'q' || ch == 'Q') break;
        if (ch == KEY_DOWN || ch == 'j') scroll++;
        if ((ch == KEY_UP || ch == 'k') && scroll > 0) scroll--;
        if (ch == KEY_NPAGE) scroll += rows - 2;
        if (ch == KEY_PPAGE) scroll = scroll > rows - 2 ? scroll - (rows - 2) : 0;
    }
    endwin();
    return 0;
}

/* --------------------------------------------------------------------- main */

int cmd_monitor(int argc, char **argv) {
    static const struct option opts[] = {
        {"run", required_argument, 0, 'r'}, {"once", no_argument, 0, '1'},
        {"stall-s", required_argument, 0, 's'}, {"interval-s", required_argument, 0, 'i'},
        {"window-s", required_argument, 0, 'w'}, {"wait-share", required_argument, 0, 'x'},
        {"max-steps", required_argument, 0, 'm'}, {"prometheus-port", required_argument, 0, 'p'},
        {"prometheus-host", required_argument, 0, 'H'}, {"no-nvml", no_argument, 0, 'N'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    mon_ctx_t C;
    memset(&C, 0, sizeof C);
    C.a.interval_s = 1;
    C.a.prom_port = -1;
    C.a.prom_host = "0.0.0.0";
    mon_diag_opts_default(&C.a.diag);
    int c, rc = 0;
    int64_t i64;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'r': C.a.dir = optarg; break;
        case '1': C.a.once = 1; break;
        case 's': rc = cli_parse_f64("--stall-s", optarg, 0.1, 1e7, &C.a.diag.stall_s); break;
        case 'i': rc = cli_parse_f64("--interval-s", optarg, 0.05, 3600, &C.a.interval_s); break;
        case 'w': rc = cli_parse_f64("--window-s", optarg, 0.5, 3600, &C.a.diag.window_s); break;
        case 'x': rc = cli_parse_f64("--wait-share", optarg, 0.01, 1, &C.a.diag.wait_share); break;
        case 'm': rc = cli_parse_i64("--max-steps", optarg, 1, INT64_MAX, &i64); if (!rc) C.a.max_steps = (uint64_t)i64; break;
        case 'p': rc = cli_parse_int("--prometheus-port", optarg, 0, 65535, &C.a.prom_port); break;
        case 'H': C.a.prom_host = optarg; break;
        case 'N': C.a.no_nvml = 1; break;
        case 'h': monitor_usage(stdout); return 0;
        default: monitor_usage(stderr); return 2;
        }
        if (rc < 0) { cli_error("monitor", dl_errmsg()); return 2; }
    }
    if (!C.a.dir || optind < argc) { monitor_usage(stderr); return 2; }
    if (!C.a.once && C.a.prom_port < 0 && !isatty(STDOUT_FILENO)) {
        /* redirected or piped: the TUI would write escape codes there until killed */
        fprintf(stderr, "monitor: stdout is not a terminal: printing one snapshot (as --once)\n");
        C.a.once = 1;
    }
    if (C.a.once) { /* a snapshot of nothing is a wrong --run, not an empty table */
        char p1[4200], p2[4200];
        if (rundir_path(p1, sizeof p1, C.a.dir, RUNDIR_RUN_JSON) < 0 ||
            rundir_path(p2, sizeof p2, C.a.dir, RUNDIR_METRICS) < 0 ||
            (access(p1, F_OK) != 0 && access(p2, F_OK) != 0)) {
            fprintf(stderr, "monitor: %s: not a draftline run dir (no run.json / metrics.jsonl)\n", C.a.dir);
            return 1;
        }
    }
    C.run = mon_run_open(C.a.dir);
    if (!C.run) return log_rc(DL_ENOENT, "monitor"), 1;
    mon_live_open(C.a.dir, C.run, &C.live);     /* not live (no answer): the files */
    int ret;
    if (C.a.prom_port >= 0 && C.a.once) {
        ctx_refresh(&C);
        char *text = NULL;
        size_t len = 0;
        if (prom_render(&C, &text, &len) < 0) {
            log_rc(DL_ENOMEM, "monitor --prometheus-port --once");
            ret = 1;
        } else {
            fwrite(text, 1, len, stdout);
            ret = 0;
        }
        free(text);
    } else if (C.a.prom_port >= 0) {
        ctx_refresh(&C);
        ret = run_prometheus(&C);
    } else if (C.a.once) {
        ctx_refresh(&C);
        char *text = NULL;
        if (ctx_report(&C, 0, &text) < 0) {     /* a file, a pipe or a terminal's own wrap: never cut */
            log_rc(DL_ENOMEM, "monitor");
            ret = 1;
        } else {
            fputs(text, stdout);
            ret = 0;
        }
        free(text);
    } else {
        ret = run_tui(&C);
    }
    mon_nvml_close(&C.nvml);
    mon_live_destroy(&C.live);
    mon_run_destroy(&C.run);
    return ret;
}
