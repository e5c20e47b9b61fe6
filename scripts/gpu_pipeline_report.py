#!/usr/bin/env python3
"""Summarises one `draftline run` on GPUs (scripts/gpu_pipeline.sh).

usage: gpu_pipeline_report.py RUN_DIR SMI_CSV LABEL [--inbox-cap-bytes N]

Reads RUN_DIR/metrics.jsonl (one line per stage per second, cumulative phase
times), RUN_DIR/steps.jsonl and SMI_CSV (nvidia-smi --query-gpu=timestamp,index,
utilization.gpu -lms 500) and prints one JSON object:
  tokens_per_s_e2e   target tokens of applied steps / wall time between the first
                     and the last applied step (steady state: from step 2 on)
  target_standalone  sum over target processes of tokens / forward_s (compute only)
  drafter_standalone sum over drafters of tokens / backward_s (fwd+bwd only)
  efficiency         e2e / min(standalone rates)
  waits              per stage: wait_input_s, wait_credit_s, copy_s, forward_s,
                     backward_s, step_s and uptime_s at the end
  opens              per stage: handle/event opens at the end and after warm-up;
                     the end count must not exceed the peer objects (slabs, events)
  inbox              drafter high water vs --inbox-gb + --host-inbox-gb (bytes)
  gpu_busy           mean utilization.gpu per GPU over the steady window
Exits 1 when the inbox bound or the handle-open check fails.
"""
import json
import sys
from datetime import datetime


def main():
    run, smi, label = sys.argv[1], sys.argv[2], sys.argv[3]
    recs = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if l.strip()]
    steps = [json.loads(l) for l in open(f"{run}/steps.jsonl") if l.strip()]
    last, warm = {}, {}
    nt = len({r.get("stage") for r in recs if str(r.get("stage")).startswith("target")})
    for r in recs:
        s = r.get("stage")
        last[s] = r
        # warm-up: a target has used each of its 4 events once; a drafter has seen
        # 4 micro-batches of every target (+4)
        done = r.get("done", r.get("computed", 0)) or 0
        need = 4 * nt + 4 if str(s).startswith("drafter") else 4
        if done >= need and s not in warm:
            warm[s] = r
    out = {"label": label, "steps": len(steps)}
    # e2e tokens/s over applied steps (wall clock of the optimizer's step records)
    # steps.jsonl: tokens is cumulative, t seconds since the first step's start
    ok = True
    if len(steps) >= 4:
        s0, s1 = steps[1], steps[-1]
        out["tokens_per_s_e2e"] = round((s1["tokens"] - s0["tokens"]) / (s1["t"] - s0["t"]), 1)
        out["steady_window_s"] = round(s1["t"] - s0["t"], 2)
        out["loss_first_last"] = [steps[0]["loss"], steps[-1]["loss"]]
        # step gaps (issue 14: none over 1.5x the median with --save-every) and the checkpoints'
        # snapshot / write times the optimizer put on the steps' lines
        gaps = sorted(b["t"] - a["t"] for a, b in zip(steps[1:-1], steps[2:-1]))
        if gaps:
            out["step_gap_median_max_s"] = [round(gaps[len(gaps) // 2], 3), round(gaps[-1], 3)]
        out["checkpoints"] = [{k: r[k] for k in r if k.startswith("ckpt_")} for r in steps if "ckpt_step" in r]
    tgt = drf = 0.0
    waits, opens = {}, {}
    for s, r in sorted(last.items()):
        if s is None:
            continue
        waits[s] = {k: round(r[k], 2) for k in ("wait_input_s", "wait_credit_s", "copy_s", "forward_s",
                                               "backward_s", "step_s", "uptime_s") if k in r}
        o = {k: r[k] for k in ("handle_opens", "event_opens") if k in r}
        if s in warm:
            o["at_warmup"] = {k: warm[s][k] for k in ("handle_opens", "event_opens") if k in warm[s]}
        # at most one open per peer object for the whole run: a target maps its
        # drafter's tiers (<= 2 slabs), a drafter the optimizer's weights slab (1) and
        # 4 events per target (the targets' event pools), the optimizer one gradient
        # slab per drafter
        nd = len([x for x in last if str(x).startswith("drafter")])
        lim = {"target": {"handle_opens": 2}, "drafter": {"handle_opens": 1, "event_opens": 4 * nt},
               "optimizer": {"handle_opens": nd}}
        for role, ks in lim.items():
            if str(s).startswith(role):
                for k, v in ks.items():
                    if (r.get(k) or 0) > v:
                        ok = False
                        o["MORE_OPENS_THAN_PEER_OBJECTS"] = True
        opens[s] = o
        if s.startswith("target") and r.get("forward_s"):
            # tokens of this target: tokens_per_s is a rate; done * mean tokens unknown,
            # so use the drafter's count below when absent
            if "tokens" in r:
                tgt += r["tokens"] / r["forward_s"]
        if s.startswith("drafter") and r.get("backward_s") and "tokens" in r:
            drf += r["tokens"] / r["backward_s"]
        if s.startswith("drafter"):
            cap = (r.get("inbox_gpu_cap", 0) or 0) + (r.get("inbox_host_cap", 0) or 0)
            out.setdefault("inbox", {})[s] = {"high_water": r.get("inbox_high_water"),
                                              "gpu_cap": r.get("inbox_gpu_cap"),
                                              "host_cap": r.get("inbox_host_cap"),
                                              "slabs_bytes": r.get("inbox_slabs_bytes")}
            # the allocator's caps are the tier slabs rounded down to 256 bytes each;
            # metrics are printed with 9 significant digits (%.9g)
            if r.get("inbox_high_water", 0) > cap or (r.get("inbox_slabs_bytes") or 0) > cap * (1 + 1e-8) + 512:
                ok = False
                out["inbox"][s]["BOUND_VIOLATED"] = True
    out["target_standalone"] = round(tgt, 1) if tgt else None
    out["drafter_standalone"] = round(drf, 1) if drf else None
    if tgt and drf and "tokens_per_s_e2e" in out:
        out["efficiency"] = round(out["tokens_per_s_e2e"] / min(tgt, drf), 3)
    out["waits"] = waits
    out["opens"] = opens
    # GPU busy over the steady window (second applied step .. last)
    busy = {}
    try:
        # wall-clock window: optimizer metrics from its first counted tokens to the end
        # (ends at the first line with the final token count: the final checkpoint, GBs of
        # master weights and moments written to disk, is not training time)
        opt = [r for r in recs if r.get("stage") == "optimizer" and (r.get("tokens") or 0) > 0]
        if len(opt) >= 2:
            last = next(r for r in opt if r["tokens"] == opt[-1]["tokens"])
            t0, t1 = opt[0]["ts"], last["ts"]
        else:
            t0, t1 = None, None
        for line in open(smi):
            p = [x.strip() for x in line.split(",")]
            if len(p) < 3:
                continue
            try:
                t = datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                g, u = int(p[1]), float(p[2])
            except ValueError:
                continue
            if t0 is not None and not (t0 <= t <= t1):
                continue
            busy.setdefault(g, []).append(u)
    except OSError:
        pass
    out["gpu_busy_pct"] = {g: round(sum(v) / len(v), 1) for g, v in busy.items() if v}
    out["checks_ok"] = ok
    print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
