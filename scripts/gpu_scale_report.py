#!/usr/bin/env python3
"""Report of scripts/gpu_scale.sh (issue 18): $OUT/scale.json and a table on stdout. stdlib only.

usage: gpu_scale_report.py --out OUT --work W [--device gpu|cpu] [--failed 0|1] [--total-s S]

Per run (OUT/runs.jsonl names them; W/<name>.out is `draftline run`'s output, W/<name>/ its dir):
  steady_tokens_per_s, wall_tokens_per_s, startup_s, restarts   the summary line
  tokens_per_s_per_gpu, efficiency     steady / G, and that over the 1-GPU run's (g1_1p1;
                                       from an earlier call: --base TOKENS_PER_S or FILE)
  each_step_once, steps, s_per_step    steps.jsonl
  opt_step_s_per_step                  the optimizer's step_s metric / steps: the gradient
                                       reduction (micro-batch order), AdamW and the weights
                                       publish (one host: gradients read over CUDA IPC)
  gpu_busy_pct, gpu_mem_max_mib        nvidia-smi samples (W/<name>.smi: epoch,index,util,MiB)
                                       between steps 2 and N-2 (the optimizer log's times)
  balance                              the supervisor's "balance:" and "rebalance ... done"
                                       lines, seconds from the run's first line; settled_on
                                       (the split after the last move) and settle_s
  live                                 rebalance events and `draftline rebalance` answers,
                                       the step gap across each (pause) against the median,
                                       GPU memory (max MiB per GPU) before, between, after
  loader                               "every micro-batch up to N applied", issued/re-issued/applied
"""
import argparse
import json
import os
import re

from report_common import SUMMARY, jsonl, read, wall  # scripts/report_common.py


def smi(path):
    rows = []
    for line in read(path).splitlines():
        p = line.split(",")
        try:
            rows.append((float(p[0]), int(p[1]), float(p[2]), float(p[3])))
        except (ValueError, IndexError):
            pass
    return rows


def gpu_stats(rows, t0, t1):
    busy, mem = {}, {}
    for t, i, u, m in rows:
        if t0 <= t <= t1:
            busy.setdefault(i, []).append(u)
            mem[i] = max(mem.get(i, 0), m)
    return ({str(i): round(sum(v) / len(v), 1) for i, v in sorted(busy.items())},
            {str(i): int(v) for i, v in sorted(mem.items())})


def step_times(w, name):
    """wall time of each applied step, from the optimizer log"""
    out = {}
    for line in read(f"{w}/{name}/logs/optimizer.log").splitlines():
        m = re.search(r"step (\d+) applied", line)
        t = wall(line)
        if m and t:
            out.setdefault(int(m.group(1)), t)
    return out


def run_report(w, meta):
    name = meta["name"]
    head = read(f"{w}/{name}.out")
    r = {k: meta[k] for k in ("gpus", "targets", "drafters", "k")}
    r["split"] = f"{meta['targets']}+{meta['drafters']}"
    m = SUMMARY.search(head)
    if m:
        r.update(steady_tokens_per_s=float(m.group(2)), wall_tokens_per_s=float(m.group(3)),
                 wall_s=float(m.group(4)), startup_s=float(m.group(5)), restarts=int(m.group(6)))
        r["tokens_per_s_per_gpu"] = round(r["steady_tokens_per_s"] / meta["gpus"], 1)
    else:
        r["error"] = "no summary line"
        r["head_tail"] = head.splitlines()[-8:]
    steps = jsonl(f"{w}/{name}/steps.jsonl")
    if steps:
        ids = [s["step"] for s in steps]
        r["steps"] = len(set(ids))
        r["each_step_once"] = len(ids) == len(set(ids)) and sorted(ids) == list(range(len(ids)))
        if len(steps) >= 6:
            r["s_per_step"] = round((steps[-2]["t"] - steps[2]["t"]) / (steps[-2]["step"] - steps[2]["step"]), 3)
    last = {}
    for x in jsonl(f"{w}/{name}/metrics.jsonl"):
        last[(x.get("stage"), x.get("incarnation"))] = x
    opt = [x for (s, _), x in last.items() if s == "optimizer"]
    if opt and r.get("steps"):
        r["opt_step_s_per_step"] = round(sum(x.get("step_s", 0) for x in opt) / r["steps"], 4)
    st = step_times(w, name)
    rows = smi(f"{w}/{name}.smi")
    if st and rows and len(st) >= 6:
        n = max(st)
        r["gpu_busy_pct"], r["gpu_mem_max_mib"] = gpu_stats(rows, st.get(2, min(st.values())), st.get(n - 1, st[n]))
    loader = read(f"{w}/{name}/logs/loader.log")
    m = re.findall(r"every micro-batch up to (\d+) applied", loader)
    mm = re.search(r"stopped: issued (\d+) \((\d+) re-issued\), (\d+) applied", loader)
    r["loader"] = {"all_applied_up_to": int(m[-1]) if m else None,
                   "issued_reissued_applied": [int(mm.group(i)) for i in (1, 2, 3)] if mm else None}
    lines = head.splitlines()
    t_first = next((wall(x) for x in lines if wall(x)), None)
    bal = []
    for x in lines:
        t = wall(x)
        if t and ("balance:" in x or re.search(r"rebalance \S+ (done|: )", x)):
            bal.append(f"+{t - t_first:.1f}s {x[x.find(']') + 1:].strip()[:240]}")
    if bal:
        r["balance"] = bal
    if "--balance auto" in meta.get("argv", ""):
        moves = [b for b in bal if "moving to" in b]
        dones = [b for b in bal if " done:" in b]
        r["settled_on"], r["settle_s"] = r["split"], 0.0    # no move: where it started
        if moves:
            mv = re.search(r"moving to (\d+) target\(s\) \+ (\d+) drafter", moves[-1])
            r["settled_on"] = f"{mv.group(1)}+{mv.group(2)}" if mv else None
            r["settle_s"] = float(dones[-1].split("s ")[0][1:]) if dones else None
    if meta.get("live"):
        ev = jsonl(f"{w}/{name}.events")
        r["rebalance_answers"] = [x for x in read(f"{w}/{name}.rebalance").splitlines() if x.strip()][-4:]
        gaps = sorted(b["t"] - a["t"] for a, b in zip(steps, steps[1:]))
        med = gaps[len(gaps) // 2] if gaps else None
        live = []
        starts = [e for e in ev if e["event"] == "rebalance"]
        done = [e for e in ev if e["event"] == "rebalance_done"]
        by_step = sorted(st.items())
        for i, e in enumerate(starts):
            d = done[i]["t"] if i < len(done) else None
            # the pause: the longest step gap (wall, optimizer log) that ends between the request and
            # two median step gaps after its answer
            end = (d or e["t"]) + 2 * (med or 0)
            win = [(b[1] - a[1]) for a, b in zip(by_step, by_step[1:]) if e["t"] <= b[1] <= end]
            live.append({"to": e["to"], "at_steps": e["at_steps"], "answer_s": round(d - e["t"], 2) if d else None,
                         "rc": done[i]["rc"] if i < len(done) else None,
                         "pause_s": round(max(win), 2) if win else None})
        r["live"] = live
        r["step_gap_median_s"] = round(med, 2) if med else None
        if rows and starts:
            t_end = max(x[0] for x in rows)
            cuts = [min(x[0] for x in rows)] + [e["t"] for e in starts] + [t_end]
            r["gpu_mem_max_mib_by_phase"] = [gpu_stats(rows, a, b)[1] for a, b in zip(cuts, cuts[1:])]
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--failed", type=int, default=0)
    ap.add_argument("--total-s", type=float, default=None)
    ap.add_argument("--base", default=None,
                    help="the 1-GPU tokens/s when this call has no g1_1p1: a number, or an earlier scale.json")
    a = ap.parse_args()
    rep = {"device": a.device, "failed": a.failed, "total_s": a.total_s,
           "phases_run": jsonl(f"{a.out}/phases.jsonl"), "runs": {}}
    for meta in jsonl(f"{a.out}/runs.jsonl"):
        rep["runs"][meta["name"]] = run_report(a.work, meta)
    R = rep["runs"]
    base = R.get("g1_1p1", {}).get("tokens_per_s_per_gpu")
    if base is None and a.base:
        try:
            base = float(a.base)
        except ValueError:
            if os.path.exists(a.base):
                base = json.load(open(a.base)).get("runs", {}).get("g1_1p1", {}).get("tokens_per_s_per_gpu")
    rep["one_gpu_tokens_per_s"] = base
    best = {}
    for n, r in R.items():
        if base and r.get("tokens_per_s_per_gpu"):
            r["efficiency"] = round(r["tokens_per_s_per_gpu"] / base, 4)
        if r.get("steady_tokens_per_s") and not n.startswith("live"):
            g = r["gpus"]
            if g not in best or r["steady_tokens_per_s"] > R[best[g]]["steady_tokens_per_s"]:
                best[g] = n
    rep["best_per_gpus"] = {str(g): {"run": n, "split": R[n].get("settled_on", R[n]["split"]),
                                     "efficiency": R[n].get("efficiency")} for g, n in sorted(best.items())}
    with open(f"{a.out}/scale.json", "w") as f:
        json.dump(rep, f, indent=1)
    cols = ["gpus", "split", "k", "steady_tokens_per_s", "tokens_per_s_per_gpu", "efficiency", "s_per_step",
            "startup_s", "each_step_once", "opt_step_s_per_step"]
    print(f"{'run':12} " + " ".join(f"{c[:12]:>12}" for c in cols) + "  gpu busy %")
    for n, r in R.items():
        print(f"{n:12} " + " ".join(f"{str(r.get(c, '-'))[:12]:>12}" for c in cols) + f"  {r.get('gpu_busy_pct', '-')}")
    for n, r in R.items():
        if "settled_on" in r:
            print(f"{n}: settled on {r.get('settled_on')} after {r.get('settle_s')} s")
        if "balance" in r:
            for b in r["balance"][:8]:
                print("   " + b)
        if "live" in r:
            print(f"{n}: step gap median {r.get('step_gap_median_s')} s; loader {r['loader']}")
            for x in r["live"]:
                print(f"   -> {x}")
            for x in r.get("rebalance_answers", []):
                print("   " + x[:240])
            if r.get("gpu_mem_max_mib_by_phase"):
                print(f"   GPU memory max MiB before / between / after: {r['gpu_mem_max_mib_by_phase']}")
    print("best per GPU count: " + json.dumps(rep["best_per_gpus"]))
    print(f"report: {a.out}/scale.json")


if __name__ == "__main__":
    main()
