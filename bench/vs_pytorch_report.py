#!/usr/bin/env python3
"""The figures of bench/vs_pytorch.sh: reads its runs.jsonl (one line per command: the
PyTorch loop's JSON report, or a draftline run dir) and prints, per draftline run,
  vs-pytorch steady X.XXx wall Y.YYx             (label "ref": the issue's line)
  vs-pytorch[LABEL] steady X.XXx wall Y.YYx ...   (others)
then writes every figure to OUT_JSON.

Steady state, both sides: target tokens of steps WARMUP..last over the time from the end
of step WARMUP-1 to the end of the last step (draftline: steps.jsonl "tokens" is
cumulative and "t" the time the step was applied; PyTorch: its per-step wall times),
except that draftline's window ends one step earlier: its last step's line is written
after the final checkpoint (20-30 s at 8B shapes), which the PyTorch loop does not write;
that time counts in the wall figure.
Wall: the run's target tokens over the wall time of its whole command. Samples/s: the
sequences of the same steps (draftline's from the Python port of its batcher, whose
micro-batches are draftline's own) over the same time; per GPU (one GPU here) next to
SpecForge's published 50.1 samples/s on 8 x H200 (6.3 per GPU).

usage: vs_pytorch_report.py RUNS_JSONL OUT_JSON   (env WARMUP, default 2)
"""
import json
import os
import statistics
import sys

SPECFORGE_PER_GPU = 50.1 / 8


def draftline_figures(r, warmup):
    steps = [json.loads(x) for x in open(os.path.join(r["run"], "steps.jsonl")) if x.strip()]
    plan = json.load(open(r["plan"]))
    f = {"steps": len(steps), "cmd_wall_s": r["cmd_wall_s"], "rc": r["rc"]}
    if not steps:
        return f
    f["tokens_total"] = steps[-1]["tokens"]
    f["wall_tokens_per_s"] = steps[-1]["tokens"] / r["cmd_wall_s"]
    f["first_step_applied_s"] = steps[0]["t"]
    gaps = [b["t"] - a["t"] for a, b in zip(steps, steps[1:])]
    if gaps:
        f["median_step_s"] = statistics.median(gaps[max(warmup - 1, 0):] or gaps)
        f["max_step_gap_s"] = max(gaps)
    if len(steps) > warmup + 1 >= 2:
        s0, s1 = steps[warmup - 1], steps[-2]   # the last step carries the final checkpoint
        secs = s1["t"] - s0["t"]
        f["steady_tokens_per_s"] = (s1["tokens"] - s0["tokens"]) / secs
        seqs = plan.get("seqs", [])
        if len(seqs) >= len(steps):
            f["steady_samples_per_s"] = sum(seqs[s["step"]] for s in steps[warmup:-1]) / secs
    f["anchors_per_seq_planned"] = sum(plan["blocks"][:len(steps)]) / max(sum(plan.get("seqs", [1])[:len(steps)]), 1)
    return f


def ratio(a, b):
    return a / b if a and b else None


def fmt(x):
    return f"{x:.2f}x" if x else "n/a"


def main():
    runs = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
    warmup = int(os.environ.get("WARMUP", "2"))
    pt = {r["label"]: r for r in runs if r["side"] == "pytorch"}
    out = []
    for r in runs:
        if r["side"] != "draftline":
            continue
        d = draftline_figures(r, warmup)
        p = pt.get(r["pt_label"], {})
        rep = p.get("report") or {}
        pf = dict(rep)
        if rep:
            pf["cmd_wall_s"] = p["cmd_wall_s"]
            pf["cmd_wall_tokens_per_s"] = rep["tokens_total"] / p["cmd_wall_s"]
        c = {"label": r["label"], "draftline": d, "pytorch": pf, "pytorch_rc": p.get("rc"),
             "steady_ratio": ratio(d.get("steady_tokens_per_s"), pf.get("steady_tokens_per_s")),
             "wall_ratio": ratio(d.get("wall_tokens_per_s"), pf.get("cmd_wall_tokens_per_s"))}
        out.append(c)
        tag = "" if r["label"] == "ref" else f"[{r['label']}]"
        extra = ""
        if r["label"].startswith("sf"):
            extra = (f" samples/s per GPU draftline {d.get('steady_samples_per_s', 0):.1f} pytorch "
                     f"{pf.get('steady_samples_per_s', 0):.1f} (SpecForge {SPECFORGE_PER_GPU:.1f})")
        print(f"vs-pytorch{tag} steady {fmt(c['steady_ratio'])} wall {fmt(c['wall_ratio'])}{extra}")
        print(f"  draftline: steady {d.get('steady_tokens_per_s', 0):,.0f} tok/s, wall "
              f"{d.get('wall_tokens_per_s', 0):,.0f} tok/s ({d['cmd_wall_s']:.1f} s, {d['steps']} steps, "
              f"median step {d.get('median_step_s', 0):.2f} s, max gap {d.get('max_step_gap_s', 0):.2f} s)")
        if pf:
            print(f"  pytorch:   steady {pf['steady_tokens_per_s']:,.0f} tok/s, wall "
                  f"{pf['cmd_wall_tokens_per_s']:,.0f} tok/s ({pf['cmd_wall_s']:.1f} s, {pf['steps']} steps, "
                  f"median step {pf['median_step_s']:.2f} s = target {pf['median_target_s']:.2f} + drafter "
                  f"{pf['median_drafter_s']:.2f}, peak {pf.get('peak_alloc_gib', 0):.1f} GiB, padding "
                  f"{100 * pf['padding_share']:.0f}%)")
        else:
            print(f"  pytorch:   no report (rc {p.get('rc')})")
    json.dump({"warmup": warmup, "comparisons": out}, open(sys.argv[2], "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
