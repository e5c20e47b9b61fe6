#!/usr/bin/env bash
# The reference work (Qwen3-8B-shaped random target, 8 x 4096 tokens, 512 anchors, block 16,
# 5-layer drafter; scripts/gpu_pipeline.sh ref, 1 GPU) with this tree's bundle and with an older
# build's stage programs, in one device call, so the two figures share a machine (issue 12:
# "no slower than before").
# usage (repo root on the GPU machine; bundle/ unpacked; the older build's bin/ at $OLD_BIN):
#   OLD_BIN=gpucarry/old/bin LONG=gpucarry/long.dlc bash scripts/gpu_refcmp.sh
# REPEAT=N makes N rounds (new, old). Writes $OUT/refcmp.json: per run the steady-state target tokens/s (steps.jsonl: tokens and
# time from step 2 to step N-2, away from the start-up and the final checkpoint), seconds per
# step, the summary's wall-clock tokens/s, the time to the first step, and the step 0/1 losses.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/refcmp-out}; mkdir -p "$OUT"
: "${OLD_BIN:?set OLD_BIN to the bin dir of the older build}"
rm -rf bundle_old && mkdir -p bundle_old && cp -r "$OLD_BIN" bundle_old/bin && ln -sfn "$PWD/bundle/lib" bundle_old/lib \
    && cp bundle/env.sh bundle_old/
sed 's#bundle/#bundle_old/#g' scripts/gpu_pipeline.sh > scripts/.gpu_pipeline_old.sh
export REF_RUNS=1gpu BIG_TIMEOUT=${BIG_TIMEOUT:-240} BIG_STEPS=${BIG_STEPS:-16}
# REPEAT rounds of new then old (default 1), so machine drift shows as round-to-round spread
for i in $(seq 1 "${REPEAT:-1}"); do
    for b in new old; do
        mkdir -p /tmp/rc-$b$i "$OUT/$b$i"
        [ -e /tmp/rc-new1/qwen3-8b ] && ln -sfn /tmp/rc-new1/qwen3-8b /tmp/rc-$b$i/qwen3-8b 2>/dev/null
        s=scripts/gpu_pipeline.sh; [ $b = old ] && s=scripts/.gpu_pipeline_old.sh
        OUT=$OUT/$b$i W=/tmp/rc-$b$i bash $s ref > "$OUT/$b$i.log" 2>&1
    done
done
python3 - "$OUT" <<'PY'
import json, re, sys
out = sys.argv[1]; rep = {}
import glob, os
for w in sorted(glob.glob("/tmp/rc-*[0-9]")):
    b = os.path.basename(w)[3:]
    run = f"{w}/ref_1gpu"
    try:
        L = [json.loads(l) for l in open(run + "/steps.jsonl")]
    except OSError:
        rep[b] = {"error": "no steps.jsonl"}; continue
    t = {d["step"]: d["t"] for d in L}; tok = {d["step"]: d["tokens"] for d in L}
    a, z = 2, max(t) - 1
    log = open(f"{w}/ref_1gpu.out").read()
    m = re.search(r"^summary: .*?([0-9.]+) target tokens/s over ([0-9.]+) s", log, re.M)
    f = re.search(r"^\[ *([0-9]+)s\] step 1/", log, re.M)
    rep[b] = {"steady_tokens_per_s": round((tok[z] - tok[a]) / (t[z] - t[a]), 1),
              "s_per_step": round((t[z] - t[a]) / (z - a), 3),
              "wall_tokens_per_s": float(m.group(1)) if m else None,
              "wall_s": float(m.group(2)) if m else None,
              "first_step_progress_s": int(f.group(1)) if f else None,
              "loss_step0_1": [L[0]["loss"], L[1]["loss"]], "steps": len(L)}
def mean(k):
    v = [r["steady_tokens_per_s"] for n, r in rep.items() if n.startswith(k) and "steady_tokens_per_s" in r]
    return sum(v) / len(v) if v else None
if mean("new") and mean("old"):
    rep["new_over_old"] = round(mean("new") / mean("old"), 4)
json.dump(rep, open(out + "/refcmp.json", "w"), indent=1); print(json.dumps(rep, indent=1))
PY
