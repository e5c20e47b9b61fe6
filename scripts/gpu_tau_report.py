#!/usr/bin/env python3
"""Report of scripts/gpu_tau.sh: prints the tau table and writes $OUT_JSON.

Inputs (environment, set by gpu_tau.sh): W (work dir: eval/{random,trained}_<set>.json,
eval/timing.json from `draftline eval --json`, run/steps.jsonl from `draftline run`,
commands.txt), SETS, the regen counts and sizes, TRAIN_WALL, CKPT, T_ALL (start time,
epoch seconds). Missing pieces (an early exit) are reported as null / '-'.
TRAIN_PRECISIONS with more than one precision P (issue 14 item 3): one drafter per P in
run_P/, eval/trained_P_<set>.json, TRAIN_WALL_P, CKPT_P; "train" and each set's "trained"
stay the first precision's, "by_precision" holds every one, and a side-by-side table
follows (loss: mean of the first / last 10 steps; acc: mean acc_mean of the last 10).
Exit 1 when the timing run's greedy check found a prompt that differs from
target-only decoding."""
import json
import os
import sys
import time

E = os.environ


def num(k, default=0.0):
    try:
        return float(E.get(k, default))
    except ValueError:
        return default


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fmt(x, spec=".3f"):
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def mean(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return sum(xs) / len(xs) if xs else None


def train_of(w, run, wall_key, ckpt_key):
    """The training summary of run dir w/run (steps.jsonl) with its wall and checkpoint."""
    steps = []
    try:
        with open(os.path.join(w, run, "steps.jsonl")) as f:
            steps = [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError):
        pass
    last = steps[-1] if steps else {}
    train = {
        "wall_s": num(wall_key), "checkpoint": E.get(ckpt_key) or None,
        "steps": last.get("step", -1) + 1, "max_steps": int(num("MAX_STEPS")), "epochs_cap": int(num("EPOCHS")),
        "token_budget": int(num("TOKEN_BUDGET")), "block_size": int(num("BLOCK")), "anchors": int(num("ANCHORS")),
        "drafter_layers": int(num("DRAFTER_LAYERS")), "lr": num("LR"), "last_step": last,
    }
    # steps.jsonl: "tokens" is cumulative target tokens, "t" seconds since the run began
    if len(steps) >= 2 and steps[-1].get("t", 0) > steps[0].get("t", 0):
        train["target_tokens_per_s"] = (steps[-1]["tokens"] - steps[0]["tokens"]) / (steps[-1]["t"] - steps[0]["t"])
        train["first_loss"], train["last_loss"] = steps[0].get("loss"), steps[-1].get("loss")
        train["last_acc_mean"] = steps[-1].get("acc_mean")
    return train, steps


def side_by_side(rep, sets):
    """The per-precision table (stdout) of rep["by_precision"]."""
    precs = list(rep["by_precision"])
    print(f"{'precision':<9} {'steps':>5} {'tok/s':>8} {'loss first10':>12} {'loss last10':>11} {'acc last10':>10}  "
          + " ".join(f"{'tau ' + s:>18}" for s in sets))
    for p in precs:
        t = rep["by_precision"][p]["train"]
        taus = [(rep["by_precision"][p]["eval"].get(s) or {}).get("tau") for s in sets]
        print(f"{p:<9} {t['steps']:>5} {fmt(t.get('target_tokens_per_s'), '.0f'):>8} {fmt(t.get('loss_first10')):>12} "
              f"{fmt(t.get('loss_last10')):>11} {fmt(t.get('acc_mean_last10')):>10}  "
              + " ".join(f"{fmt(x):>18}" for x in taus))
    r = [(rep["eval"][s].get("random") or {}).get("tau") for s in sets]
    print(f"{'random':<9} {'-':>5} {'-':>8} {'-':>12} {'-':>11} {'-':>10}  " + " ".join(f"{fmt(x):>18}" for x in r))
    print("(every drafter evaluated against the bf16 target on the same prompts; only --target-precision of "
          "`draftline run` differs)")
    if any(rep["by_precision"][p]["train"]["steps"] < 20 for p in precs):
        print("(fewer than 20 steps: the first-10 and last-10 loss windows overlap)")


def main():
    w = E["W"]
    sets = E.get("SETS", "").split()
    precs = E.get("TRAIN_PRECISIONS", "bf16").split() or ["bf16"]
    multi = len(precs) > 1
    tag = {p: f"_{p}" if multi else "" for p in precs}
    train, _ = train_of(w, "run" + tag[precs[0]], f"TRAIN_WALL_{precs[0]}" if multi else "TRAIN_WALL",
                        f"CKPT_{precs[0]}" if multi else "CKPT")
    try:
        with open(os.path.join(w, "commands.txt")) as f:
            commands = f.read().splitlines()
    except OSError:
        commands = []
    rep = {
        "device": E.get("DEVICE"), "model": E.get("MODEL"), "total_wall_s": round(time.time() - num("T_ALL", time.time()), 1),
        "regen": {"gsm8k_samples": int(num("N_GSM")), "sharegpt_samples": int(num("N_SGPT")),
                  "synthetic_samples": int(num("N_SYN")), "wall_s": num("REGEN_WALL"), "batch": int(num("REGEN_BATCH")),
                  "max_new_tokens": int(num("REGEN_MAX_NEW")), "max_seconds": num("REGEN_S")},
        "train": train, "eval": {}, "timing": load(os.path.join(w, "eval", "timing.json")), "commands": commands,
    }
    if multi:
        rep["precisions"] = precs
        rep["by_precision"] = {}
        for p in precs:
            tp, steps = train_of(w, "run" + tag[p], f"TRAIN_WALL_{p}", f"CKPT_{p}")
            losses = [x.get("loss") for x in steps]
            tp["loss_first10"], tp["loss_last10"] = mean(losses[:10]), mean(losses[-10:])
            tp["acc_mean_last10"] = mean([x.get("acc_mean") for x in steps[-10:]])
            tp["target_precision"] = p
            ev = {s: load(os.path.join(w, "eval", f"trained{tag[p]}_{s}.json")) for s in sets}
            rep["by_precision"][p] = {"train": tp, "eval": ev}
        rep["train"] = rep["by_precision"][precs[0]]["train"]
        print(f"(the table below: the {precs[0]} drafter; every precision side by side after it)")
    print(f"{'set':<15} {'prompts':>7} {'new tok':>7} {'tau random':>10} {'tau trained':>11} {'gain':>7}  "
          "accept-length histogram (trained, 1..B)")
    for s in sets:
        r = load(os.path.join(w, "eval", f"random_{s}.json"))
        t = load(os.path.join(w, "eval", f"trained{tag[precs[0]]}_{s}.json"))
        rep["eval"][s] = {"random": r, "trained": t}
        rt, tt = (r or {}).get("tau"), (t or {}).get("tau")
        gain = f"{tt - rt:+.3f}" if isinstance(rt, (int, float)) and isinstance(tt, (int, float)) else "-"
        if r and t and r.get("prompts") != t.get("prompts"):
            gain += " (different prompt counts)"
        x = t or r or {}
        print(f"{s:<15} {x.get('prompts', '-'):>7} {x.get('new_tokens', '-'):>7} {fmt(rt):>10} {fmt(tt):>11} {gain:>7}  "
              f"{(t or {}).get('accept_len_hist', '-')}")
    tm = rep["timing"]
    ok = True
    if tm:
        ok = tm.get("greedy_matched") == tm.get("greedy_compared")
        print(f"timing ({tm.get('prompts')} prompts, median of {tm.get('timing_repeats')} runs each): tau "
              f"{fmt(tm.get('tau'))}, decode {fmt(tm.get('spec_decode_tok_s'), '.1f')} tok/s with the drafter vs "
              f"{fmt(tm.get('base_decode_tok_s'), '.1f')} target-only, speedup {fmt(tm.get('speedup'), '.2f')}x; greedy "
              f"{tm.get('greedy_matched')}/{tm.get('greedy_compared')} identical to target-only")
    rg = rep["regen"]
    print(f"regen: {rg['gsm8k_samples']} GSM8K + {rg['sharegpt_samples']} ShareGPT + {rg['synthetic_samples']} synthetic "
          f"samples in {rg['wall_s']:.0f} s; train: {train['steps']} steps in {train['wall_s']:.0f} s"
          + (f", {train['target_tokens_per_s']:.0f} target tok/s, loss {train['first_loss']:.3f} -> "
             f"{train['last_loss']:.3f}" if "target_tokens_per_s" in train else "")
          + f"; total {rep['total_wall_s']:.0f} s")
    if multi:
        side_by_side(rep, sets)
    with open(E["OUT_JSON"], "w") as f:
        json.dump(rep, f, indent=1)
    print("wrote", E["OUT_JSON"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
