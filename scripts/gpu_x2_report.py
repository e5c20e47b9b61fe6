#!/usr/bin/env python3
"""Report of scripts/gpu_x2.sh (issue 17): $OUT/x2.json and a table on stdout. stdlib only.

usage: gpu_x2_report.py --out OUT --work W [--device gpu|cpu] [--failed 0|1] [--total-s S]

Per phase (W/<phase>.out is the head's output, W/<phase>[-a|-b]/ the run dirs):
  steady_tokens_per_s, wall_tokens_per_s, wall_s, startup_s, restarts  the summary line
  s_per_step, steps, loss_step0_1, each_step_once                       steps.jsonl (the
                                          optimizer's node: the head's dir or an agent's)
  feature_bytes_per_token    the drafter log's "slot B bytes (T tokens x F features)": B / T
  hidden_bytes_per_s         cross: feature_bytes_per_token x steady tokens/s, COMPUTED FROM
                             THE SHAPES (NCCL sends are not counted by the xfer metrics);
                             CPU: also xfer_bytes_out of the targets / their uptime (measured)
  opt_step_s_per_step        the optimizer's step_s metric (sum of the micro-batch gradients
                             in micro-batch order, AdamW, the new weights into the slab) / steps
  grad_bytes_per_remote_mb, weights_bytes_per_step   P x 4 (fp32 gradient slot, fp32 weights
                             slab half) from the optimizer log's parameter count
  nccl                       the stage logs' step communicator / NCCL pair lines (count, first
                             ones), and whether NCCL said "via NET/Socket" (the network transport)
kill: the events (kill, lost, restart, rejoined; wall clock), the loader's "every micro-batch
  up to N applied" and "stopped: issued X (Y re-issued), Z applied", the NCCL lines after the
  kill with their time from it; recover_s: kill -> the optimizer's step communicator generation
  ready again after b rejoined (GPU), else kill -> drafter1's new incarnation's hello to the
  optimizer (CPU); the first step applied after the rejoin, and the largest step gap.
Comparisons: cross / alone (steady, wall; goal >= 0.9), step 0/1 losses cross vs alone,
mirror vs mirror_ipc s/step (the NCCL gradient and weights path's cost per step).
"""
import argparse
import glob
import json
import os
import re

from report_common import SUMMARY, jsonl, read, wall  # scripts/report_common.py

PHASES = ["alone", "cross", "mirror", "mirror_ipc", "kill"]
NCCL_RE = re.compile(r"step communicator|NCCL pair|nccl_id|ncclComm|ready \(drafter|aborted|joining")


def stage_logs(w, ph):
    return sorted(glob.glob(f"{w}/{ph}/logs/*.log") + glob.glob(f"{w}/{ph}-[ab]/logs/*.log"))


def first_match(paths, rx):
    for p in paths:
        m = re.search(rx, read(p), re.M)
        if m:
            return m
    return None


def phase_report(w, ph):
    head = read(f"{w}/{ph}.out")
    r = {}
    if not head:
        return None
    m = SUMMARY.search(head)
    if m:
        r.update(steps_summary=int(m.group(1)), steady_tokens_per_s=float(m.group(2)),
                 wall_tokens_per_s=float(m.group(3)), wall_s=float(m.group(4)), startup_s=float(m.group(5)),
                 restarts=int(m.group(6)))
    else:
        r["error"] = "no summary line"
        r["head_tail"] = head.splitlines()[-8:]
    steps = []
    for d in (f"{w}/{ph}", f"{w}/{ph}-a", f"{w}/{ph}-b"):
        if os.path.exists(f"{d}/steps.jsonl"):
            steps = jsonl(f"{d}/steps.jsonl")
            r["steps_file"] = f"{d}/steps.jsonl"
            break
    if steps:
        ids = [s["step"] for s in steps]
        r["steps"] = len(set(ids))
        r["each_step_once"] = len(ids) == len(set(ids)) and sorted(ids) == list(range(len(ids)))
        r["loss_step0_1"] = [s["loss"] for s in steps[:2]]
        if len(steps) >= 6:
            a, z = steps[2], steps[-2]
            r["s_per_step"] = round((z["t"] - a["t"]) / (z["step"] - a["step"]), 3)
        gaps = [b["t"] - a["t"] for a, b in zip(steps, steps[1:])]
        if gaps:
            r["step_gap_max_s"] = round(max(gaps), 2)
            r["step_gap_median_s"] = round(sorted(gaps)[len(gaps) // 2], 2)
    logs = stage_logs(w, ph)
    m = first_match(logs, r"slot (\d+) bytes \((\d+) tokens x (\d+) features\)")
    if m:
        r["feature_bytes_per_token"] = round(int(m.group(1)) / int(m.group(2)), 1)
        r["features_per_token"] = int(m.group(3))
    m = first_match(logs, r"drafter: .*? (\d+) parameters")
    if m:
        p = int(m.group(1))
        r["drafter_parameters"] = p
        r["grad_bytes_per_remote_mb"] = 4 * p
        r["weights_bytes_per_step"] = 4 * p
    mets = jsonl(f"{w}/{ph}/metrics.jsonl")
    last = {}
    for x in mets:
        key = (x.get("stage"), x.get("incarnation"))
        last[key] = x
    opt = [x for (s, _), x in last.items() if s == "optimizer"]
    if opt and r.get("steps"):
        r["opt_step_s_per_step"] = round(sum(x.get("step_s", 0) for x in opt) / r["steps"], 4)
    tx = [x for (s, _), x in last.items() if str(s).startswith("target")]
    out_b = sum(x.get("xfer_bytes_out", 0) for x in tx)
    if out_b:
        up = max(x.get("uptime_s", 0) for x in tx)
        r["xfer_bytes_out_targets"] = out_b
        r["xfer_bytes_per_s_measured"] = round(out_b / up, 1) if up else None
    if ph in ("cross",) and r.get("steady_tokens_per_s") and r.get("feature_bytes_per_token"):
        r["hidden_bytes_per_s_from_shapes"] = round(r["steady_tokens_per_s"] * r["feature_bytes_per_token"], 1)
    if ph in ("mirror", "kill") and r.get("s_per_step") and r.get("grad_bytes_per_remote_mb"):
        # K=2 mirrored: one micro-batch per step from drafter1 (b), one weights broadcast
        r["grad_weights_bytes_per_s_from_shapes"] = round(
            (r["grad_bytes_per_remote_mb"] + r["weights_bytes_per_step"]) / r["s_per_step"], 1)
    nl = []
    net = False
    for p in logs:
        for line in read(p).splitlines():
            if "via NET/Socket" in line:
                net = True
            if NCCL_RE.search(line) and "NCCL INFO" not in line:
                nl.append((wall(line), os.path.basename(p)[:-4], line[line.find("]") + 1:].strip()[:200]))
    r["nccl_net_socket_seen"] = net
    r["nccl_lines"] = len(nl)
    r["nccl_first"] = [f"{s}: {t}" for _, s, t in sorted(nl, key=lambda x: x[0] or 0)[:6]]
    r["_nccl"] = nl
    return r


def kill_report(w, out, r):
    ev = {e["event"]: e["t"] for e in jsonl(f"{out}/events.jsonl") if e.get("phase") == "kill"}
    k = ev.get("kill")
    r["events_s_after_kill"] = {n: round(t - k, 2) for n, t in ev.items()} if k else {}
    loader = read(f"{w}/kill/logs/loader.log")
    m = re.findall(r"every micro-batch up to (\d+) applied", loader)
    r["loader_all_applied_up_to"] = int(m[-1]) if m else None
    m = re.search(r"stopped: issued (\d+) \((\d+) re-issued\), (\d+) applied", loader)
    if m:
        r["loader_issued_reissued_applied"] = [int(m.group(i)) for i in (1, 2, 3)]
    km = re.search(r"(\d+) micro-batches per step", read(f"{w}/kill-a/logs/optimizer.log"))
    ia = r.get("loader_issued_reissued_applied")
    if km and ia and r.get("steps"):
        want = int(km.group(1)) * r["steps"]
        r["every_mb_applied_once"] = bool(r.get("each_step_once")) and ia[2] == want and \
            r.get("loader_all_applied_up_to") == want
    if k:
        after = [(t - k, s, x) for t, s, x in r["_nccl"] if t and t >= k - 1]
        r["nccl_after_kill"] = [f"+{d:.2f}s {s}: {x}" for d, s, x in sorted(after)[:16]]
        rej = ev.get("rejoined", k)
        opt = read(f"{w}/kill-a/logs/optimizer.log").splitlines()
        for line in opt:
            t = wall(line)
            if t and t > rej and " applied: loss" in line:
                r["first_step_after_rejoin_s"] = round(t - k, 2)
                break
        # back: drafter1's new incarnation says hello to the optimizer (then, on GPUs, the
        # step communicator's new generation is ready with it): the time to recover
        for line in opt:
            t = wall(line)
            if t and t > k and re.search(r"hello from drafter1\S* \(drafter \d+, incarnation ([2-9]|\d\d)", line):
                r["drafter1_back_s"] = round(t - k, 2)
                break
        for line in opt:
            t = wall(line)
            if t and t > rej and re.search(r"step communicator generation \d+ ready", line):
                r["nccl_generation_ready_s"] = round(t - k, 2)
                break
        r["recover_s"] = r.get("nccl_generation_ready_s", r.get("drafter1_back_s"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--failed", type=int, default=0)
    ap.add_argument("--total-s", type=float, default=None)
    a = ap.parse_args()
    rep = {"device": a.device, "failed": a.failed, "total_s": a.total_s,
           "phases_run": jsonl(f"{a.out}/phases.jsonl"), "runs": {}}
    for ph in PHASES:
        r = phase_report(a.work, ph)
        if r is None:
            continue
        if ph == "kill":
            kill_report(a.work, a.out, r)
        r.pop("_nccl", None)
        rep["runs"][ph] = r
    R = rep["runs"]
    cmp = {}

    def ratio(x, y, k):
        if x in R and y in R and R[x].get(k) and R[y].get(k):
            return round(R[x][k] / R[y][k], 4)
        return None
    cmp["cross_over_alone_steady"] = ratio("cross", "alone", "steady_tokens_per_s")
    cmp["cross_over_alone_wall"] = ratio("cross", "alone", "wall_tokens_per_s")
    if "cross" in R and "alone" in R and R["cross"].get("loss_step0_1") and R["alone"].get("loss_step0_1"):
        cmp["loss_step0_1_cross_minus_alone"] = [round(c - b, 6) for c, b in
                                                 zip(R["cross"]["loss_step0_1"], R["alone"]["loss_step0_1"])]
    if "mirror" in R and "mirror_ipc" in R and R["mirror"].get("s_per_step") and R["mirror_ipc"].get("s_per_step"):
        cmp["mirror_nccl_minus_ipc_s_per_step"] = round(R["mirror"]["s_per_step"] - R["mirror_ipc"]["s_per_step"], 3)
    cmp["mirror_over_ipc_steady"] = ratio("mirror", "mirror_ipc", "steady_tokens_per_s")
    rep["compare"] = cmp
    with open(f"{a.out}/x2.json", "w") as f:
        json.dump(rep, f, indent=1)
    cols = ["steady_tokens_per_s", "wall_tokens_per_s", "wall_s", "startup_s", "s_per_step", "steps",
            "each_step_once", "restarts", "opt_step_s_per_step", "nccl_net_socket_seen"]
    print("phase       " + " ".join(f"{c[:14]:>14}" for c in cols))
    for ph, r in R.items():
        print(f"{ph:11} " + " ".join(f"{str(r.get(c, '-'))[:14]:>14}" for c in cols))
    for ph, r in R.items():
        print(f"{ph}: loss step 0/1 {r.get('loss_step0_1')}"
              + (f", hidden bytes/s (from shapes) {r['hidden_bytes_per_s_from_shapes']:.4g}"
                 if "hidden_bytes_per_s_from_shapes" in r else "")
              + (f", xfer bytes/s (measured) {r['xfer_bytes_per_s_measured']:.4g}"
                 if r.get("xfer_bytes_per_s_measured") else ""))
    if "kill" in R:
        k = R["kill"]
        print(f"kill: events {k.get('events_s_after_kill')}, recover {k.get('recover_s')} s (drafter1 back "
              f"{k.get('drafter1_back_s')} s, NCCL generation ready {k.get('nccl_generation_ready_s')} s), "
              f"loader up to {k.get('loader_all_applied_up_to')} applied, issued/re-issued/applied "
              f"{k.get('loader_issued_reissued_applied')}, every micro-batch applied once: "
              f"{k.get('every_mb_applied_once')}, largest step gap {k.get('step_gap_max_s')} s")
        for line in k.get("nccl_after_kill", [])[:8]:
            print("  " + line)
    print("compare: " + json.dumps(cmp))
    print(f"report: {a.out}/x2.json")


if __name__ == "__main__":
    main()
