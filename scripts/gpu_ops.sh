#!/usr/bin/env bash
# Operating a live GPU run (issue 7, GPU part), on a 2-GPU machine:
#   a) `draftline run` of a random-weight qwen3-0.6b (draftline mkmodel) with
#      --target-gpus 0 --drafter-gpus 1, nvidia-smi sampling memory.used and
#      utilization.gpu every 250 ms;
#   b) live rebalance to --target-gpus 0,0 --drafter-gpus 1 (a second target process
#      sharing GPU 0), some steps, and back to --target-gpus 0 --drafter-gpus 1: the
#      wall time of each (supervisor's figure and the command's), the steps applied
#      meanwhile, the longest gap between steps;
#   c) kill -9 of the drafter right after a step was applied (mid-step: it is
#      computing the next one): time to recover (kill -> first step applied after its
#      successor said hello; the supervisor logs its own figure, "drafter0 recovery:"),
#      GPU memory per GPU just before the kill vs after the recovery (must return to
#      the same level within MEM_TOL_MIB), and the low point while it was dead;
#   d) the run finishes (or, when the remaining steps would take more than
#      REMAIN_MAX_S, is stopped with `draftline stop`: a final checkpoint, exit 143);
#      the ledger: steps.jsonl holds every step 0..N-1 exactly once; no stage process
#      of the run left. Prints a summary, writes $OUT/gpu_ops.json, packs the logs into
#      $OUT/gpu_ops_logs.tgz; exits 1 on any failed check (with the stage logs' tails).
#
# usage (repo root on the GPU machine, bundle unpacked in bundle/, a prepared cache
# at $DATA):  bash scripts/gpu_ops.sh
# env: DATA (gpucarry/gsm8k.dlc), OUT (/tmp/go-out), W (work dir, /tmp/go), MODEL
# (qwen3-0.6b), MODEL_DIR ($W/$MODEL; made by mkmodel when it has no config.json), MAX_STEPS (200), EPOCHS (8; 25 steps per epoch with these flags),
# STEPS_PER_PHASE (8), RUN_TIMEOUT (200 s), REMAIN_MAX_S (60), MEM_TOL_MIB (512).
# Expected wall time ~2-3 min (mkmodel, ~20 s start-up, 200 steps of ~0.4 s, two
# rebalances and a recovery of a few s each); every command has a hard timeout.
# CPU_DRY=1: the same scenario on CPU (--device cpu, --targets/--drafters, tiny-qwen3,
# no nvidia-smi: memory checks n/a), to check the script itself; DL=path/to/draftline;
# CPU_DRY_SMI=1 also samples the `nvidia-smi` first in PATH (a stand-in, for the checks).
set -u
cd "$(dirname "$0")/.." || exit 1
CPU_DRY=${CPU_DRY:-0}
if [ "$CPU_DRY" = 1 ]; then
    DL=${DL:-bin/draftline}
    MODEL=${MODEL:-tiny-qwen3}
else
    # shellcheck disable=SC1091
    . bundle/env.sh
    DL=${DL:-bundle/bin/draftline}
    MODEL=${MODEL:-qwen3-0.6b}
fi
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/go-out}; W=${W:-/tmp/go}; DATA=${DATA:-gpucarry/gsm8k.dlc}
MAX_STEPS=${MAX_STEPS:-200}; EPOCHS=${EPOCHS:-8}; PHASE=${STEPS_PER_PHASE:-8}
RUN_TIMEOUT=${RUN_TIMEOUT:-200}; REMAIN_MAX_S=${REMAIN_MAX_S:-60}; MEM_TOL_MIB=${MEM_TOL_MIB:-512}
RUN=$W/ops
EV=$W/events.tsv
MODEL_DIR=${MODEL_DIR:-$W/$MODEL}
mkdir -p "$OUT" "$W"
rm -rf "$RUN" "$W"/rb*.out "$W"/rb*.json "$W"/status_*.txt "$W/run.out" "$W/smi.csv" "$EV"
FAILS=()
RUN_PID=; SMI_PID=
T_START=$(date +%s.%N)

now() { date +%s.%N; }
ev() { printf '%s\t%s\t%s\n' "$1" "$(now)" "${2:-}" >> "$EV"; }   # name, wall time, detail
say() { printf '[%6.1fs] %s\n' "$(awk -v a="$(now)" -v b="$T_START" 'BEGIN { print a - b }')" "$*"; }
fail() { FAILS+=("$*"); say "FAIL: $*"; }
nsteps() { if [ -f "$RUN/steps.jsonl" ]; then wc -l < "$RUN/steps.jsonl"; else echo 0; fi; }
run_alive() { [ -n "$RUN_PID" ] && kill -0 "$RUN_PID" 2>/dev/null; }

# wait_steps N TIMEOUT: until steps.jsonl has N lines; 1 when the run ended or timed out
wait_steps() {
    local n=$1 tmo=$2 t0
    t0=$(date +%s)
    while [ "$(nsteps)" -lt "$n" ]; do
        if ! run_alive; then say "the run ended at $(nsteps) step(s) while waiting for $n"; return 1; fi
        if [ $(( $(date +%s) - t0 )) -ge "$tmo" ]; then say "no $n steps in ${tmo} s (at $(nsteps))"; return 1; fi
        sleep 0.05
    done
    return 0
}

# stage_pid NAME: the pid of a stage from run.json (0 when not running)
stage_pid() {
    python3 - "$RUN/run.json" "$1" <<'PY' 2>/dev/null || echo 0
import json, sys
j = json.load(open(sys.argv[1]))
print(next((int(s["pid"]) for s in j.get("stages", []) if s["name"] == sys.argv[2]), 0))
PY
}

# shellcheck disable=SC2317  # (called by the EXIT trap)
cleanup() {
    [ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null
    if run_alive; then kill -TERM "$RUN_PID" 2>/dev/null; sleep 5; run_alive && kill -KILL "$RUN_PID" 2>/dev/null; fi
    (cd "$W" && tar czf "$OUT/gpu_ops_logs.tgz" --exclude='*.safetensors' --exclude='*.bin' \
        run.out smi.csv events.tsv rb*.out rb*.json status_*.txt ops/logs ops/metrics.jsonl ops/steps.jsonl \
        ops/run.json 2>/dev/null)
}
trap cleanup EXIT

# rebalance_result OUT STATUS: the supervisor's answer as the JSON of its reply text
# ({status, message, seconds, target_gpus, drafter_gpus}) from what `draftline rebalance`
# printed ("rebalance <id> <status>: <message>", the message saying "in X s") and the
# placement line of the `draftline status` that follows it (the live lists).
rebalance_result() {
    python3 - "$1" "$2" <<'PY'
import json, re, sys
res = {}
for l in open(sys.argv[1], errors="replace"):
    m = re.match(r"rebalance (\S+) (done|rejected|running): (.*)$", l.rstrip("\n"))
    if m and m.group(2) != "running":
        res = {"id": m.group(1), "status": m.group(2), "message": m.group(3)}
        s = re.search(r" in ([0-9.]+) s", m.group(3))
        if s: res["seconds"] = float(s.group(1))
try:
    for l in open(sys.argv[2], errors="replace"):
        for k in ("target", "drafter"):
            g = re.search(k + r" GPUs (\d+(?:,\d+)*)", l) if l.startswith("placement:") else None
            if g and res: res[k + "_gpus"] = g.group(1)
except OSError:
    pass
print(json.dumps(res))
PY
}

# rebalance LABEL ARGS...: one `draftline rebalance`, its output and result kept
rebalance() {
    local label=$1; shift
    say "rebalance $label: draftline rebalance --run $RUN $*"
    ev "${label}_req" "$*"
    timeout 150 "$DL" rebalance --run "$RUN" "$@" --wait 120 > "$W/$label.out" 2>&1
    local rc=$?
    ev "${label}_done" "rc=$rc"
    sed 's/^/    /' "$W/$label.out"
    [ $rc = 0 ] || fail "rebalance $label exited $rc: $(tail -n 1 "$W/$label.out")"
    timeout 20 "$DL" status --run "$RUN" > "$W/status_$label.txt" 2>&1
    rebalance_result "$W/$label.out" "$W/status_$label.txt" > "$W/$label.json"
    grep -E "^(topology|placement|routes|last rebalance)|^(target|drafter)[0-9]" "$W/status_$label.txt" | sed 's/^/    /'
    return $rc
}

if [ "$CPU_DRY" = 1 ]; then
    say "CPU_DRY=1: the scenario on CPU (no GPU, no memory figures)"
    PLACE0=(--device cpu --targets 1 --drafters 1); PLACE1=(--targets 2 --drafters 1); PLACE2=(--targets 1 --drafters 1)
    Q=(--token-budget 2048 --block-size 8 --num-anchors 8 --micro-batches-per-step 2 --inbox-gb 0.05 --threads 1)
else
    nvidia-smi -L
    NGPU=$(nvidia-smi -L | wc -l)
    [ "$NGPU" -ge 2 ] || { echo "gpu_ops.sh needs 2 GPUs (found $NGPU)"; exit 1; }
    # "0,0" is one GPU list, one array element
    # shellcheck disable=SC2054
    PLACE1=(--target-gpus 0,0 --drafter-gpus 1)
    PLACE0=(--target-gpus 0 --drafter-gpus 1)
    PLACE2=(--target-gpus 0 --drafter-gpus 1)
    Q=(--token-budget 16384 --block-size 16 --num-anchors 32 --drafter-layers 1 --micro-batches-per-step 4
       --inbox-gb 2)
fi

echo "gpu_ops.sh: issue 7 on the GPU machine: live rebalance 1-1 -> 2 targets sharing GPU 0 -> 1-1, then"
echo "  kill -9 of the drafter mid-step; figures: rebalance times, steps applied meanwhile, time to recover,"
echo "  GPU memory per GPU before the kill vs after the recovery (tolerance $MEM_TOL_MIB MiB), ledger."
echo "  model $MODEL, data $DATA, max steps $MAX_STEPS, $PHASE steps between actions; work dir $W, figures $OUT"

# ---- a) model, sampler, run ----
if [ ! -f "$MODEL_DIR/config.json" ]; then
    say "draftline mkmodel --config $MODEL --out $MODEL_DIR"
    timeout 120 "$DL" mkmodel --config "$MODEL" --out "$MODEL_DIR" > "$W/mk-$MODEL.log" 2>&1 ||
        { tail -n 5 "$W/mk-$MODEL.log"; echo "FAIL: mkmodel"; exit 1; }
fi
if [ "$CPU_DRY" != 1 ] || [ "${CPU_DRY_SMI:-0}" = 1 ]; then
    timeout $((RUN_TIMEOUT + 60)) nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu \
        --format=csv,noheader,nounits -lms 250 > "$W/smi.csv" 2>/dev/null &
    SMI_PID=$!
    ev smi_start
fi
sleep 1
ev run_start
say "draftline run --target-model $MODEL_DIR ${PLACE0[*]} ${Q[*]} --max-steps $MAX_STEPS --epochs $EPOCHS"
timeout "$RUN_TIMEOUT" "$DL" run --target-model "$MODEL_DIR" --data "$DATA" "${PLACE0[@]}" "${Q[@]}" \
    --max-steps "$MAX_STEPS" --epochs "$EPOCHS" --out "$RUN" --progress-every 5 > "$W/run.out" 2>&1 &
RUN_PID=$!

SCEN=1
if wait_steps "$PHASE" 120; then
    ev first_phase "$(nsteps)"
    say "$(nsteps) steps applied; GPU placement: ${PLACE0[*]}"
else
    fail "the run did not reach $PHASE steps"; SCEN=0
fi

# ---- b) rebalance 1-1 -> 2 targets sharing GPU 0 -> back ----
if [ $SCEN = 1 ]; then
    at=$(nsteps)
    rebalance rb1 "${PLACE1[@]}" || SCEN=0
    say "steps: $at at the request, $(nsteps) when it was done"
fi
if [ $SCEN = 1 ]; then
    at=$(nsteps)
    wait_steps $((at + PHASE)) 90 || { fail "no $PHASE steps after rebalance 1"; SCEN=0; }
fi
if [ $SCEN = 1 ]; then
    at=$(nsteps)
    rebalance rb2 "${PLACE2[@]}" || SCEN=0
    say "steps: $at at the request, $(nsteps) when it was done"
fi

# ---- c) kill -9 of the drafter mid-step ----
if [ $SCEN = 1 ]; then
    at=$(nsteps)
    wait_steps $((at + PHASE)) 90 || { fail "no $PHASE steps after rebalance 2"; SCEN=0; }
    sleep 1   # memory samples of the settled 1-1 placement
fi
if [ $SCEN = 1 ]; then
    at=$(nsteps)
    wait_steps $((at + 1)) 30 || { fail "no step before the kill"; SCEN=0; }
fi
if [ $SCEN = 1 ]; then
    sleep 0.1   # a step was just applied: the drafter is computing the next one
    pid=$(stage_pid drafter0)
    if [ "$pid" -gt 0 ] && grep -q drafter_worker "/proc/$pid/cmdline" 2>/dev/null; then
        at=$(nsteps)
        ev kill "$pid"
        kill -9 "$pid"
        say "kill -9 drafter0 (pid $pid) after step $((at - 1))"
        if wait_steps $((at + PHASE)) 120; then
            ev recovered "$(nsteps)"
            say "$(nsteps) steps applied; $(grep -o 'drafter0 recovery:.*' "$W/run.out" | tail -n 1)"
            sleep 3   # memory samples after the recovery
            ev mem_after
        else
            fail "no recovery: no $PHASE steps after the kill"
        fi
    else
        fail "drafter0 pid not found in $RUN/run.json (got '$pid')"
    fi
fi

# ---- d) finish ----
STOPPED=0
if run_alive; then
    python3 - "$RUN" "$MAX_STEPS" > "$W/remain.txt" <<'PY'
import json, sys, statistics
run, ms = sys.argv[1], int(sys.argv[2])
ts = [json.loads(l) for l in open(run + "/steps.jsonl") if l.strip()]
mx = json.load(open(run + "/run.json")).get("max_steps", ms)
dt = [b["t"] - a["t"] for a, b in zip(ts[-12:], ts[-11:]) if b["t"] > a["t"]]
print("%.1f" % ((mx - len(ts)) * (statistics.median(dt) if dt else 1.0)))
PY
    remain=$(cat "$W/remain.txt" 2>/dev/null || echo 0)
    if awk -v r="${remain:-0}" -v m="$REMAIN_MAX_S" 'BEGIN { exit !(r > m) }'; then
        say "about ${remain} s of steps left (> REMAIN_MAX_S=$REMAIN_MAX_S): draftline stop"
        ev stop
        timeout 90 "$DL" stop --run "$RUN" --wait 60 > "$W/stop.out" 2>&1 || fail "draftline stop: $(tail -n 1 "$W/stop.out")"
        STOPPED=1
    else
        say "about ${remain:-?} s of steps left: letting the run finish"
    fi
fi
wait "$RUN_PID"
RUN_RC=$?
RUN_PID=
ev run_end "rc=$RUN_RC"
[ -n "$SMI_PID" ] && { kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; SMI_PID=; }
grep -E "^summary|^checkpoint|GPU mode|recovery|rebalance .* done" "$W/run.out" | sed 's/^/    /'
if [ "$RUN_RC" = 124 ]; then fail "the run hit its ${RUN_TIMEOUT} s timeout"
elif [ "$RUN_RC" != 0 ] && ! { [ $STOPPED = 1 ] && [ "$RUN_RC" = 143 ]; }; then fail "draftline run exited $RUN_RC"
fi
sleep 1
left=$(pgrep -f -- "$RUN" | grep -cv "^$$\$")
[ "$left" = 0 ] || { fail "$left process(es) of the run still there"; pgrep -af -- "$RUN" | head; }

# ---- figures and checks ----
python3 - "$W" "$RUN" "$OUT/gpu_ops.json" "$STOPPED" "$MEM_TOL_MIB" "$CPU_DRY" "$SCEN" <<'PY'
import json, re, statistics, sys, datetime, os
W, RUN, OUTJ, STOPPED, TOL, DRY, SCEN = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", float(sys.argv[5]), sys.argv[6] == "1", sys.argv[7] == "1"
fails, R = [], {"stopped_early": STOPPED, "cpu_dry": DRY}
ev = {}
for l in open(W + "/events.tsv"):
    p = l.rstrip("\n").split("\t")
    ev.setdefault(p[0], (float(p[1]), p[2] if len(p) > 2 else ""))
# applied steps: the optimizer's "step" metrics (wall ts) and the ledger
step_ts = {}
for l in open(RUN + "/metrics.jsonl"):
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("stage") == "optimizer" and m.get("state") == "step" and "step" in m:
        step_ts.setdefault(int(m["step"]), m["ts"])
steps = [json.loads(l)["step"] for l in open(RUN + "/steps.jsonl") if l.strip()]
run = json.load(open(RUN + "/run.json"))
mx = run.get("max_steps", 0)
n_exp = (max(steps) + 1 if steps else 0) if STOPPED else mx
ok = sorted(steps) == list(range(n_exp))
dup = len(steps) - len(set(steps))
R["ledger"] = {"steps": len(steps), "expected": n_exp, "max_steps": mx, "duplicates": dup,
               "missing": len(set(range(n_exp)) - set(steps)), "ok": ok}
if not ok: fails.append("ledger: %d lines, %d duplicate(s), %d missing of 0..%d" % (len(steps), dup, R["ledger"]["missing"], n_exp - 1))
ts = sorted(step_ts.items())
tl = [t for _, t in ts]
gaps = [b - a for a, b in zip(tl, tl[1:])]
med = statistics.median(gaps) if gaps else float("nan")
R["step_time_median_s"] = med
def steps_in(a, b): return sum(1 for t in tl if a <= t <= b)
def max_gap(a, b):
    w = [t for t in tl if a <= t <= b]
    prev = [t for t in tl if t < a][-1:]
    nxt = [t for t in tl if t > b][:1]
    w = prev + w + nxt
    return max((y - x for x, y in zip(w, w[1:])), default=float("nan"))
# log lines "2026-12-01T00:04:21.123Z LEVEL who[pid] msg"
def log_time(line):
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z", line)
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp() if m else None
runlog = open(W + "/run.out", errors="replace").read().splitlines()
# nvidia-smi samples: per GPU [(t, MiB, util)]
smi, smi_lines = {}, 0
def smi_time(s):
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S.%f"):
        try: return datetime.datetime.strptime(s, fmt).timestamp()   # local time, as date(1)
        except ValueError: pass
    raise ValueError(s)
if os.path.exists(W + "/smi.csv"):
    for l in open(W + "/smi.csv"):
        p = [x.strip() for x in l.split(",")]
        smi_lines += 1
        try: smi.setdefault(int(p[1]), []).append((smi_time(p[0]), float(p[2]), float(p[3])))
        except (ValueError, IndexError): pass
    if not smi:
        fails.append("nvidia-smi: %d line(s) in smi.csv, none parsed (first: %r)" % (smi_lines, open(W + "/smi.csv").readline()[:120]))
    elif "smi_start" in ev:
        # the sampler's clock vs date(1): its first sample comes right after smi_start;
        # a time-zone mismatch (whole quarter hours) is taken out
        off = min(t for v in smi.values() for t, _, _ in v) - ev["smi_start"][0]
        shift = round(off / 900.0) * 900.0 if abs(off) > 300 else 0.0
        R["smi_clock_shift_s"] = shift
        if shift: smi = {g: [(t - shift, m, u) for t, m, u in v] for g, v in smi.items()}
def mem(g, a, b, f=statistics.median):
    v = [m for t, m, _ in smi.get(g, []) if a <= t <= b]
    return f(v) if v else None
t_run0 = ev.get("run_start", (0,))[0]
# b) rebalances
for lab in ("rb1", "rb2"):
    if lab + "_req" not in ev: continue
    a, b = ev[lab + "_req"][0], ev.get(lab + "_done", (ev[lab + "_req"][0],))[0]
    res = {}
    try: res = json.load(open(W + "/" + lab + ".json"))
    except (OSError, ValueError): pass
    r = {"request": ev[lab + "_req"][1], "status": res.get("status"), "message": res.get("message"),
         "seconds_supervisor": res.get("seconds"), "seconds_command": b - a,
         "steps_applied_during": steps_in(a, b), "max_step_gap_s": max_gap(a, b),
         "target_gpus": res.get("target_gpus"), "drafter_gpus": res.get("drafter_gpus")}
    if smi:
        r["mem_mib_before"] = {g: mem(g, a - 2, a) for g in smi}
        r["mem_mib_after"] = {g: mem(g, b + 1, b + 3) for g in smi}
    R[lab] = r
    if res.get("status") != "done": fails.append("%s: status %s (%s)" % (lab, res.get("status"), res.get("message")))
    if r["steps_applied_during"] == 0 and b - a > 3 * med + 1:
        fails.append("%s: no step applied during the %.1f s rebalance" % (lab, b - a))
want = {"rb1": ("0,0", "1"), "rb2": ("0", "1")} if not DRY else {}
for lab, (tg, dg) in want.items():
    if lab in R and (R[lab]["target_gpus"], R[lab]["drafter_gpus"]) != (tg, dg):
        fails.append("%s: placement after it %s / %s, wanted %s / %s" % (lab, R[lab]["target_gpus"], R[lab]["drafter_gpus"], tg, dg))
# c) kill -9 of the drafter
if "kill" in ev:
    tk = ev["kill"][0]
    before = [(s, t) for s, t in ts if t < tk]
    # the successor's hello: "drafter0 is up (pid P, incarnation K)" with K > 1 after the kill
    t_up = None
    for l in runlog:
        m = re.search(r"drafter0 is up \(pid \d+, incarnation (\d+)\)", l)
        t = log_time(l)
        if m and int(m.group(1)) > 1 and t and t > tk - 0.5: t_up = t; break
    after = [(s, t) for s, t in ts if t > (t_up if t_up else tk)]
    sup = [l for l in runlog if "drafter0 recovery:" in l]
    ms = re.search(r"up ([\d.]+) s after its death, step (\d+) applied ([\d.]+) s", sup[-1]) if sup else None
    k = {"killed_pid": int(ev["kill"][1]), "last_step_before_kill": before[-1][0] if before else None,
         "steps_applied_between_kill_and_successor_up": sum(1 for _, t in ts if tk < t <= (t_up or tk)),
         "successor_up_s": (t_up - tk) if t_up else None,
         "next_step_after_kill_s": next((t - tk for _, t in ts if t > tk), None),
         "first_step_after_recovery": after[0][0] if after else None,
         "time_to_recover_s": (after[0][1] - tk) if after else None,
         "step_gap_s": (after[0][1] - before[-1][1]) if after and before else None,
         "supervisor_up_s": float(ms.group(1)) if ms else None,
         "supervisor_recovery_s": float(ms.group(3)) if ms else None}
    if not after: fails.append("kill: no step applied after the drafter's successor came up")
    if not sup: fails.append("kill: the supervisor logged no 'drafter0 recovery:' line")
    if smi and after:
        tr = after[0][1]
        # after the recovery: the last 3 s before the script's mem_after mark (recovery +
        # STEPS_PER_PHASE steps + 3 s), at least 1 s after the first recovered step
        te = ev["mem_after"][0] if "mem_after" in ev else min(tr + 3.0, tl[-1] if tl else tr + 3.0)
        ta = max(tr + 1.0, te - 3.0)
        k["mem_mib_before_kill"], k["mem_mib_after_recovery"], k["mem_mib_low_while_dead"], k["mem_returned"] = {}, {}, {}, {}
        for g in sorted(smi):
            mb = mem(g, tk - 2.0, tk - 0.05)
            ma = mem(g, ta, te) or mem(g, tr + 0.25, tr + 3.0)
            lo = mem(g, tk, t_up or tr, min)
            k["mem_mib_before_kill"][g], k["mem_mib_after_recovery"][g], k["mem_mib_low_while_dead"][g] = mb, ma, lo
            okm = mb is not None and ma is not None and abs(ma - mb) <= TOL
            k["mem_returned"][g] = okm
            if not okm: fails.append("GPU %d memory: %s MiB before the kill, %s MiB after the recovery (tolerance %g MiB)" % (g, mb, ma, TOL))
    R["kill"] = k
elif SCEN:
    fails.append("no kill was made")
if smi:
    R["gpu_util_mean"] = {g: statistics.mean(u for _, _, u in v) for g, v in smi.items()}
    R["gpu_mem_max_mib"] = {g: max(m for _, m, _ in v) for g, v in smi.items()}
R["stages"] = [{k: s.get(k) for k in ("name", "gpu", "incarnation", "restarts", "process", "last_recovery_s")} for s in run.get("stages", [])]
R["fails"] = fails
R["ok"] = not fails
json.dump(R, open(OUTJ, "w"), indent=1, default=str)
# summary
f = lambda v, fmt="%.2f": "n/a" if v is None or v != v else fmt % v
print("\n==== gpu_ops summary (%s) ====" % ("CPU dry run" if DRY else "2 GPUs"))
print("ledger: %d steps applied, expected 0..%d each once: %s%s" % (len(steps), n_exp - 1, "OK" if ok else "FAIL",
      " (run stopped early with `draftline stop`)" if STOPPED else ""))
print("median step time %s s" % f(med, "%.3f"))
for lab, what in (("rb1", "1-1 -> 2 targets sharing GPU 0"), ("rb2", "2 targets -> 1-1")):
    r = R.get(lab)
    if not r: print("%s (%s): not made" % (lab, what)); continue
    print("%s %s: %s in %s s (supervisor: request to all stages up/retired), %s s command wall; %d step(s) applied meanwhile, longest gap %s s; now targets on GPUs %s, drafters on GPUs %s"
          % (lab, what, r["status"], f(r["seconds_supervisor"]), f(r["seconds_command"]), r["steps_applied_during"], f(r["max_step_gap_s"]), r["target_gpus"], r["drafter_gpus"]))
    if "mem_mib_before" in r: print("    GPU memory MiB before -> after: " + ", ".join("GPU%d %s -> %s" % (g, f(r["mem_mib_before"][g], "%.0f"), f(r["mem_mib_after"][g], "%.0f")) for g in sorted(r["mem_mib_before"])))
k = R.get("kill")
if k:
    print("kill -9 drafter0 (pid %d) after step %s: TIME TO RECOVER %s s (kill -> first step applied after its successor came up: step %s); successor up after %s s; supervisor's figures: up %s s, step %s s; gap between steps %s s vs median %s s; %d step(s) applied between the kill and the successor's hello (gradients already in), next step after the kill at +%s s"
          % (k["killed_pid"], k["last_step_before_kill"], f(k["time_to_recover_s"]), k["first_step_after_recovery"], f(k["successor_up_s"]),
             f(k["supervisor_up_s"]), f(k["supervisor_recovery_s"]), f(k["step_gap_s"]), f(med, "%.3f"),
             k["steps_applied_between_kill_and_successor_up"], f(k["next_step_after_kill_s"])))
    for g in sorted(k.get("mem_mib_before_kill", {})):
        print("    GPU%d memory MiB: %s before the kill, %s low while dead, %s after the recovery: %s" % (g, f(k["mem_mib_before_kill"][g], "%.0f"),
              f(k["mem_mib_low_while_dead"][g], "%.0f"), f(k["mem_mib_after_recovery"][g], "%.0f"), "returned" if k["mem_returned"][g] else "NOT returned"))
if "gpu_util_mean" in R:
    print("GPU utilization mean: " + ", ".join("GPU%d %.0f%%" % (g, u) for g, u in sorted(R["gpu_util_mean"].items())))
for x in fails: print("FAIL: " + x)
print("figures: " + OUTJ)
sys.exit(1 if fails else 0)
PY
PYRC=$?
[ $PYRC = 0 ] || FAILS+=("checks failed (see above)")
if [ ${#FAILS[@]} != 0 ]; then
    echo "==== FAILED: ${#FAILS[@]} problem(s) ===="
    for x in "${FAILS[@]}"; do echo "  - $x"; done
    echo "---- run output (tail)"; tail -n 25 "$W/run.out"
    for f in "$RUN"/logs/*.log; do
        [ -f "$f" ] || continue
        echo "---- $f"; grep -E "ERROR|error|WARN" "$f" | tail -n 5; tail -n 4 "$f"
    done
    exit 1
fi
echo "gpu_ops: all checks passed"
exit 0
