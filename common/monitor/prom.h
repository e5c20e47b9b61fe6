/* Prometheus: the latest metrics of every stage in the text exposition format
 * (https://prometheus.io/docs/instrumenting/exposition_formats/, version 0.0.4), and
 * a minimal HTTP/1.0 server for GET /metrics on a libuv loop (the supervisor's, or
 * `draftline monitor --prometheus-port`'s).
 *
 * Naming: every stage metric becomes draftline_<name>{stage="drafter0",role="drafter"}
 * with the name sanitised to [a-zA-Z0-9_] (other bytes -> '_'); the cumulative phase
 * timings <phase>_s become counters draftline_<phase>_seconds_total, every other
 * metric is a gauge (a "_s" suffix is spelled "_seconds"). Added by the renderer:
 *   draftline_stage_up{stage,role}              1 unless the stage is silent/stopped
 *   draftline_stage_incarnation{stage,role}     incarnation number
 *   draftline_stage_state{stage,role,state}     1 for the current state
 *   draftline_stage_diagnosis{stage,role,diagnosis}  1 for the stall diagnosis
 *   draftline_stage_last_seen_seconds{stage,role}    seconds since its last metrics
 *   draftline_train_step, _loss, _grad_norm, _lr, _tokens_total, _accuracy_mean,
 *   draftline_train_accuracy{position="k"}       from the latest applied step
 *   draftline_bottleneck{role}                   1 for the bottleneck role, if any
 * Samples carry no timestamps (Prometheus stamps them at scrape time). Non-finite
 * values are written NaN / +Inf / -Inf as the format spells them.
 */
#ifndef DL_MONITOR_PROM_H
#define DL_MONITOR_PROM_H

#include "common/monitor/diag.h"
#include "common/monitor/run.h"

#include <stddef.h>
#include <uv.h>

/* Renders run as seen at wall time now (s) into a malloc'd NUL-terminated string
 * (*text, *len bytes without the NUL; the caller frees). diag/topo may be NULL
 * (defaults; topology counted from the run). Returns 0 or DL_ENOMEM. */
int mon_prom_render(const mon_run_t *run, double now, const mon_diag_opts_t *diag,
                    const mon_topo_t *topo, char **text, size_t *len);

/* A ready prom_render_cb for a mon_run_t (arg): renders it at the wall clock with
 * the default diagnosis options and the topology counted from the run (plus
 * <run->dir>/run.json when run->dir is set). The supervisor's whole integration:
 *   S->mon = mon_run_new();                                      (start-up)
 *   S->prom = prom_server_new(&S->loop, port, mon_prom_render_run, S->mon);
 *   mon_run_ingest_proto(S->mon, peer, &msg.metrics);            (on every METRICS)
 *   prom_server_destroy(&S->prom);                               (with the other handles)
 *   mon_run_destroy(&S->mon);                                    (after the last uv_run) */
int mon_prom_render_run(void *arg, char **text, size_t *len);

/* Writes a Prometheus metric name for `name` into out (cap bytes): prefix + name with
 * bytes outside [a-zA-Z0-9_] replaced by '_' (a leading digit gets a '_'). */
void mon_prom_sanitize(const char *prefix, const char *name, char *out, size_t cap);

/* Server. The render callback returns a malloc'd body (*text, *len), which the server
 * frees after sending; a negative return is answered 500. Called on the loop thread
 * once per GET /metrics. */
typedef int (*prom_render_cb)(void *arg, char **text, size_t *len);
typedef struct prom_server prom_server_t;

/* Listens on 0.0.0.0:port (port 0: an ephemeral port, see prom_server_port). NULL
 * with dl_errmsg (DL_EIO: bind/listen failed, e.g. port in use). */
prom_server_t *prom_server_new(uv_loop_t *loop, int port, prom_render_cb cb, void *arg);
/* The same on a given IPv4 address ("127.0.0.1"). */
prom_server_t *prom_server_new_at(uv_loop_t *loop, const char *host, int port, prom_render_cb cb,
                                  void *arg);
/* The port actually bound. */
int prom_server_port(const prom_server_t *s);
/* Requests answered so far (any status). */
uint64_t prom_server_requests(const prom_server_t *s);
/* Closes the listener and every connection; memory is freed by the close callbacks,
 * so the loop must run once more (as after bus_destroy). Nulls *s_p. */
void prom_server_destroy(prom_server_t **s_p);

#endif
