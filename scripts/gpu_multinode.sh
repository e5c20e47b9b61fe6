#!/usr/bin/env bash
# Issue 13 on one H200: the reference work (Qwen3-8B-shaped random target, 8 x 4096 tokens,
# 512 anchors, block 16, 5-layer drafter; scripts/gpu_pipeline.sh ref) run by `draftline run`
# alone, and by a multi-node head on this machine's loopback with one node agent that owns
# the GPU (target and drafter placed on the agent, so they pair by CUDA IPC there; the
# optimizer follows drafter 0 onto the agent). Head and agent are "two hosts": separate run
# dirs, every endpoint tcp:// with CURVE.
# usage (repo root on the GPU machine; bundle/ unpacked):
#   LONG=gpucarry/long.dlc [REPEAT=2] [STEPS=16] bash scripts/gpu_multinode.sh
# Writes $OUT/multinode.json: per run the steady-state tokens/s (steps.jsonl, steps 2..N-2),
# s/step, the summary's wall tokens/s, step 0/1 losses; and multi_over_alone.
set -u
cd "$(dirname "$0")/.."
. bundle/env.sh
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mn-out}; W=${W:-/tmp/mn}; LONG=${LONG:-gpucarry/long.dlc}; STEPS=${STEPS:-16}
mkdir -p "$OUT" "$W"
DL=bundle/bin/draftline
[ -f "$W/qwen3-8b/config.json" ] || $DL mkmodel --config qwen3-8b --out "$W/qwen3-8b" > "$W/mk.log" 2>&1
R="--target-model $W/qwen3-8b --data $LONG --token-budget 32768 --max-len 4096 --block-size 16 --num-anchors 512
   --drafter-layers 5 --threads 8 --inbox-gb 6 --micro-batches-per-step 1 --max-steps $STEPS --progress-every 5"
PORT=${PORT:-29500}
alone() {  # $1 label
    timeout 300 $DL run $R --target-gpus 0 --drafter-gpus 0 --out "$W/$1" > "$W/$1.out" 2>&1
    echo "$1 rc=$?"; grep -E '^summary' "$W/$1.out"
}
multi() {  # $1 label: head here, agent "n1" owning GPU 0
    rm -rf "$W/$1" "$W/$1-n1"
    timeout 320 $DL run $R --listen 127.0.0.1:$PORT --nodes 1 --join-timeout 60 \
        --target-gpus n1:0 --drafter-gpus n1:0 --out "$W/$1" > "$W/$1.out" 2>&1 &
    local head=$!
    for _ in $(seq 100); do [ -s "$W/$1/node.key" ] && break; sleep 0.2; done
    timeout 330 $DL node --join 127.0.0.1:$PORT --key "$W/$1/node.key" --name n1 --run-dir "$W/$1-n1" \
        > "$W/$1-agent.out" 2>&1 &
    local agent=$!
    wait $head; local rc=$?
    kill -TERM $agent 2>/dev/null; wait $agent 2>/dev/null
    echo "$1 rc=$rc"; grep -E '^summary' "$W/$1.out"; tail -n 3 "$W/$1-agent.out"
    PORT=$((PORT + 200))
}
for i in $(seq 1 "${REPEAT:-1}"); do alone alone$i; multi multi$i; done
python3 - "$OUT" "$W" <<'PY'
import glob, json, os, re, sys
out, w = sys.argv[1], sys.argv[2]; rep = {}
for o in sorted(glob.glob(w + "/*[0-9].out")):
    b = os.path.basename(o)[:-4]
    cands = [f"{w}/{b}/steps.jsonl", f"{w}/{b}-n1/steps.jsonl"]   # the optimizer's node
    L = None
    for c in cands:
        if os.path.exists(c): L = [json.loads(l) for l in open(c)]; break
    log = open(o).read()
    m = re.search(r"^summary: .*?([0-9.]+) target tokens/s over ([0-9.]+) s", log, re.M)
    if not L or len(L) < 6: rep[b] = {"error": "no steps", "summary": bool(m)}; continue
    t = {d["step"]: d["t"] for d in L}; tok = {d["step"]: d["tokens"] for d in L}
    a, z = 2, max(t) - 1
    rep[b] = {"steady_tokens_per_s": round((tok[z] - tok[a]) / (t[z] - t[a]), 1),
              "s_per_step": round((t[z] - t[a]) / (z - a), 3),
              "wall_tokens_per_s": float(m.group(1)) if m else None, "wall_s": float(m.group(2)) if m else None,
              "loss_step0_1": [L[0]["loss"], L[1]["loss"]], "steps": len(L)}
def mean(k):
    v = [r["steady_tokens_per_s"] for n, r in rep.items() if n.startswith(k) and "steady_tokens_per_s" in r]
    return sum(v) / len(v) if v else None
if mean("multi") and mean("alone"): rep["multi_over_alone"] = round(mean("multi") / mean("alone"), 4)
json.dump(rep, open(out + "/multinode.json", "w"), indent=1); print(json.dumps(rep, indent=1))
PY
(cd "$W" && tar czf "$OUT/logs.tgz" ./*.out ./*/logs ./*/metrics.jsonl ./*/steps.jsonl 2>/dev/null)
