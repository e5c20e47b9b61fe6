#!/usr/bin/env python3
"""The report of scripts/gpu_moe.sh (issue 16 on one H200): $OUT/gpu_moe.json.

usage: gpu_moe_report.py --out OUT --pipe RUN_DIR --model DIR --place tmpfs|disk|given
                         --layers N --full-layers 48 --total-s S --failed 0|1

Reads OUT/phases.jsonl (one line per phase: s, rc, limit_s, or skipped), OUT/bench_target.json
and OUT/hf_target.json (when those phases ran), RUN_DIR/steps.jsonl and OUT/pipe.log (the
`draftline run` output). Pipeline figures:
  steady_tokens_per_s  target tokens from step 2 to step N-2 / their time (steps.jsonl: tokens
                       cumulative, t seconds), away from the start-up and the final checkpoint
  wall_tokens_per_s    all steps' target tokens / the whole `draftline run` command's seconds
                       (start-up, the last checkpoint and shutdown included)
  first_step_s         the progress line of step 1 ("[  Ns] step 1/")
  summary              the run's own summary line, as printed
Prints a short table and writes OUT/gpu_moe.json.
"""
import argparse
import json
import os
import re
import sys


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def pipe_figures(run, log_path, phase_s):
    out = {}
    try:
        steps = [json.loads(l) for l in open(os.path.join(run, "steps.jsonl")) if l.strip()]
    except OSError:
        return {"error": "no steps.jsonl"}
    out["steps"] = len(steps)
    if not steps:
        return out
    t = {d["step"]: d["t"] for d in steps}
    tok = {d["step"]: d["tokens"] for d in steps}
    a, z = 2, max(t) - 1
    if z > a and t[z] > t[a]:
        out["steady_tokens_per_s"] = round((tok[z] - tok[a]) / (t[z] - t[a]), 1)
        out["s_per_step"] = round((t[z] - t[a]) / (z - a), 3)
    out["tokens"] = steps[-1]["tokens"]
    if phase_s:
        out["run_s"] = phase_s
        out["wall_tokens_per_s"] = round(steps[-1]["tokens"] / phase_s, 1)
    if out.get("steady_tokens_per_s") and out.get("wall_tokens_per_s"):
        out["wall_over_steady"] = round(out["wall_tokens_per_s"] / out["steady_tokens_per_s"], 3)
    out["loss_first_last"] = [steps[0].get("loss"), steps[-1].get("loss")]
    try:
        log = open(log_path).read()
    except OSError:
        log = ""
    m = re.search(r"^summary: .*$", log, re.M)
    if m:
        out["summary"] = m.group(0)
    f = re.search(r"^\[ *([0-9]+)s\] step 1/", log, re.M)
    if f:
        out["first_step_s"] = int(f.group(1))
    out["dead_lines"] = len(re.findall(r"dead", log))
    return out


def table(rep):
    lines = []
    b, h = rep.get("bench_target") or {}, rep.get("hf_target") or {}
    hf_rows = {}
    for r in h.get("rows", []):
        hf_rows.setdefault(r["batch"], []).append(r)
    for r in b.get("rows", []):
        s = (f"draftline {r['batch']:7s} {r['mode']:7s} {r['layers']:2d} layers "
             f"{r['tokens_per_s']:9.0f} tok/s MFU {100 * r['mfu']:5.1f}%")
        if "balance_worst" in r:
            s += f"  balance mean {r['balance_mean']:.2f} worst {r['balance_worst']:.2f} (layer {r['balance_worst_layer']})"
        if r["mode"] == "full":
            for x in hf_rows.get(r["batch"], []):
                s += f"  | HF [{x['experts']}] {x['tokens_per_s']:.0f} tok/s MFU {100 * x['mfu']:.1f}%" \
                     f" -> {r['tokens_per_s'] / x['tokens_per_s']:.2f}x"
        lines.append(s)
    if not b:
        for r in h.get("rows", []):
            lines.append(f"HF {r['batch']} [{r['experts']}] {r['tokens_per_s']:.0f} tok/s MFU {100 * r['mfu']:.1f}%")
    p = rep.get("pipeline") or {}
    if p.get("steps"):
        lines.append(f"pipeline: {p['steps']} steps, steady {p.get('steady_tokens_per_s')} tok/s "
                     f"({p.get('s_per_step')} s/step), wall {p.get('wall_tokens_per_s')} tok/s over "
                     f"{p.get('run_s')} s, first step at {p.get('first_step_s')} s")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pipe", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--place", required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--full-layers", type=int, default=48)
    ap.add_argument("--total-s", type=float, default=0)
    ap.add_argument("--failed", type=int, default=0)
    a = ap.parse_args(argv)
    phases = []
    try:
        phases = [json.loads(l) for l in open(os.path.join(a.out, "phases.jsonl")) if l.strip()]
    except OSError:
        pass
    ps = {p["phase"]: p for p in phases}
    rep = {"model": a.model, "model_place": a.place, "layers": a.layers, "full_layers": a.full_layers,
           "total_s": a.total_s, "failed": a.failed, "phases": phases,
           "mkmodel_s": ps.get("mk", {}).get("s"),
           "bench_target": load_json(os.path.join(a.out, "bench_target.json")),
           "hf_target": load_json(os.path.join(a.out, "hf_target.json"))}
    if "pipe" in ps and "s" in ps["pipe"]:
        rep["pipeline"] = pipe_figures(a.pipe, os.path.join(a.out, "pipe.log"), ps["pipe"]["s"])
    with open(os.path.join(a.out, "gpu_moe.json"), "w") as f:
        json.dump(rep, f, indent=1)
    print(f"model {a.model} ({a.place}), {a.layers} of {a.full_layers} layers; mkmodel "
          f"{rep['mkmodel_s']} s; total {a.total_s} s")
    print(table(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
