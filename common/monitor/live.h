/* The monitor's feed of a live run: a client of the supervisor's control socket
 * (supervisor/ctl.c, common/rundir/ctl.h) instead of the run dir's files.
 *
 *   subscribe  -> "ok" whose text is the supervisor's recent history as metrics.jsonl
 *                 lines (each stage's last samples, the optimizer's last step lines),
 *                 then every METRICS message the supervisor relays
 *   status     -> the topology and state (run.json's object) for each refresh
 *
 * Everything lands in a mon_run_t exactly as the file tail would put it (the history
 * through mon_run_ingest_metrics_line, the live messages through
 * mon_run_ingest_proto, named by the topology's stage ids), so the diagnosis and the
 * report do not know which feed they got. Nothing in the run dir is read while the run
 * answers (logs/optimizer.log only when the run has no max_steps); a run that does not
 * answer is not live and the caller falls back to the files.
 *
 * Single-threaded; the subscription lives while the client pumps it (mon_live_drain or
 * mon_live_refresh) at least every RUNDIR_CTL_DEAD_MS: the supervisor forgets a
 * subscriber silent for that long.
 */
#ifndef DL_MONITOR_LIVE_H
#define DL_MONITOR_LIVE_H

#include "common/monitor/diag.h"
#include "common/monitor/run.h"

#define MON_LIVE_PUMP_MS 200    /* how often a waiting monitor pumps the subscription */

typedef struct mon_live mon_live_t;

/* Subscribes to the live run in dir and ingests the history of the reply into run
 * (borrowed). *out: the feed (destroy with mon_live_destroy), NULL on error. Returns 0,
 * or the run is not live: DL_ENOENT (no socket), DL_ECLOSED (a dead socket),
 * DL_ETIMEDOUT (no answer in RUNDIR_CTL_ANSWER_MS), DL_EAGAIN (too many subscribers),
 * or DL_ENOMEM / DL_EIO / DL_EPROTO. */
int mon_live_open(const char *dir, mon_run_t *run, mon_live_t **out);

/* One status round trip (up to RUNDIR_CTL_ANSWER_MS): the topology into *topo (reset
 * first; mon_topo_parse), every METRICS message received meanwhile into run. Returns 0,
 * DL_ECLOSED / DL_ETIMEDOUT (the run ended: fall back to the files), DL_EPROTO (a
 * malformed answer) or DL_ENOMEM. */
int mon_live_refresh(mon_live_t *L, mon_run_t *run, mon_topo_t *topo);

/* Ingests every message already received, without waiting (keeps the heartbeats
 * going). Returns the number of METRICS messages ingested (>= 0) or DL_ECLOSED (the
 * supervisor went silent: the run ended). */
int mon_live_drain(mon_live_t *L, mon_run_t *run);

/* Closes the subscription and frees *L; nulls it. NULL is fine. */
void mon_live_destroy(mon_live_t **L);

#endif
