#!/usr/bin/env bash
# Issue 17 on one 2-GPU host (nvidia-h200-x2) in ONE device call: the cross-node hidden-state
# and gradient paths over NCCL's network transport, against CUDA IPC, and a node's kill -9.
#
# Device command (one call, repo root, gpucarry/ holding the bundle and the data):
#   tar xJf gpucarry/bundle.tar.xz && . bundle/env.sh && bash scripts/gpu_x2.sh
# The bundle must come from a build WITHOUT RELEASE=1: the cross-node GPU paths are still
# behind the test hook nccl_cross=1 (docs/MULTINODE.md section 4), which RELEASE compiles out.
#
# usage: [PARTS="alone cross mirror mirror_ipc kill"] [STEPS=16] [DEVICE=gpu|cpu] [DRY=1]
#        bash scripts/gpu_x2.sh
# Work (every phase, GPU): a Qwen3-8B-shaped random target (`draftline mkmodel --config
# qwen3-8b`, in $W), $LONG (default gpucarry/long.dlc), --token-budget 32768 --max-len 4096
# --block-size 16 --num-anchors 512 --drafter-layers 5 --threads 8 --inbox-gb 6, seed 0.
# Phases (each time-boxed by `timeout` and by what is left of BUDGET_S; every process of a
# phase runs in a process group of its own, killed at the phase's end; none outlives it):
#   mk          mkmodel qwen3-8b (skipped when $W/qwen3-8b exists: a warm machine)    ~45-70 s
#   alone       `draftline run` alone, target GPU 0, drafter GPU 1 (CUDA IPC), K=1, STEPS ~50 s
#   cross       head on 127.0.0.1 (loader only) + agents a (CUDA_VISIBLE_DEVICES=0) and
#               b (=1): --target-gpus a:0 --drafter-gpus b:0, K=1, STEPS: hidden states by
#               ncclSend/ncclRecv, gradients and weights on the step communicator (the
#               optimizer is with drafter0 on b, so they stay local there)               ~55 s
#   mirror      --target-gpus a:0,b:0 --drafter-gpus a:0,b:0, K=2, STEPS: pairs local, the
#               gradients of drafter1 (b) and the weights to it by NCCL (optimizer on a) ~60 s
#   mirror_ipc  the same layout on one host (--target-gpus 0,1 --drafter-gpus 0,1, K=2): the
#               reference for mirror's gradient and weights path                         ~60 s
#   kill        mirror with KILL_STEPS; after KILL_AT steps kill -9 of agent b's process
#               group (the agent and its stages: a host lost), then b started again with the
#               same command once the head says "node b lost"                           ~110 s
# Estimates: start-up ~12 s, ~1.4 s per K=1 step on two GPUs (drafter step 1.36 s), ~2.5 s
# per K=2 mirrored step, final checkpoint ~4 s; all of it ~400 s with mk. BUDGET_S (560) is
# shared in order; a phase that cannot get its minimum is skipped and reported so.
# NCCL: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo
# NCCL_NVLS_ENABLE=0 for every phase (single-host phases use CUDA IPC, not NCCL);
# NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET into the stage logs (the report looks for
# "via NET/Socket" to prove the transport). DL_TEST_HOOKS=nccl_cross=1 for the node phases.
# DEVICE=cpu: the same flow on CPUs with a tiny-qwen3 model and a 200-sample GSM8K cache made
# here (CPU placement --targets/--drafters; the node phases move bytes as slab_data over tcp,
# not NCCL), default STEPS=10, KILL_STEPS=16, KILL_AT=4; DL defaults to bin-cpu/draftline.
# DRY=1 prints every command and runs nothing.
# Output: $OUT/x2.json (scripts/gpu_x2_report.py; a table on stdout), $OUT/phases.jsonl,
# $OUT/logs.tgz (heads' and agents' output, stage logs, metrics, steps).
set -u
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-gpu}; DRY=${DRY:-0}
PARTS=${PARTS:-alone cross mirror mirror_ipc kill}
OUT=${OUT:-/tmp/x2-out}; W=${W:-/tmp/x2}; PORT=${PORT:-29500}
BUDGET_S=${BUDGET_S:-560}; MIN_PHASE_S=${MIN_PHASE_S:-40}
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
export NCCL_DEBUG=${NCCL_DEBUG:-INFO} NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET}
if [ "$DEVICE" = gpu ]; then
    [ "$DRY" = 1 ] || { [ -f bundle/env.sh ] && . bundle/env.sh; }
    DL=${DL:-bundle/bin/draftline}; MKCFG=qwen3-8b; DATA=${LONG:-gpucarry/long.dlc}
    STEPS=${STEPS:-16}; KILL_STEPS=${KILL_STEPS:-24}; KILL_AT=${KILL_AT:-6}
    WORK="--token-budget 32768 --max-len 4096 --block-size 16 --num-anchors 512 --drafter-layers 5 --threads 8 --inbox-gb 6"
    PL_ALONE="--target-gpus 0 --drafter-gpus 1"; PL_CROSS="--target-gpus a:0 --drafter-gpus b:0"
    PL_MIRROR="--target-gpus a:0,b:0 --drafter-gpus a:0,b:0"; PL_MIRROR_IPC="--target-gpus 0,1 --drafter-gpus 0,1"
    CAP_RUN=${CAP_RUN:-150}; CAP_KILL=${CAP_KILL:-240}; MK_CAP=${MK_CAP:-150}
else
    DL=${DL:-bin-cpu/draftline}; MKCFG=tiny-qwen3; DATA=$W/gsm8k.dlc
    STEPS=${STEPS:-10}; KILL_STEPS=${KILL_STEPS:-16}; KILL_AT=${KILL_AT:-4}
    WORK="--token-budget 1024 --block-size 8 --num-anchors 16 --drafter-layers 1 --threads 1 --inbox-gb 0.25"
    PL_ALONE="--device cpu --targets 1 --drafters 1"; PL_CROSS="--device cpu --targets a:1 --drafters b:1"
    PL_MIRROR="--device cpu --targets a:1,b:1 --drafters a:1,b:1"; PL_MIRROR_IPC="--device cpu --targets 2 --drafters 2"
    CAP_RUN=${CAP_RUN:-120}; CAP_KILL=${CAP_KILL:-180}; MK_CAP=${MK_CAP:-60}
fi
MODEL=$W/$MKCFG
mkdir -p "$OUT"; [ "$DRY" = 1 ] || mkdir -p "$W"
PHASES=$OUT/phases.jsonl; : > "$PHASES"
T0=$(date +%s.%N)
now() { date +%s.%N; }
elapsed() { echo "$(now) $T0" | awk '{printf "%.1f", $1 - $2}'; }
left() { echo "$BUDGET_S $(elapsed)" | awk '{printf "%d", $1 - $2}'; }
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
limit() { local l; l=$(left); [ "$l" -gt "$1" ] && l=$1; echo "$l"; }   # min(cap, budget left)

GROUPS_LIVE=""   # process groups (leader pids) started by the running phase
start_group() {  # log cmd...: the command in a new session (its own process group); pid in $!
    local log=$1; shift
    setsid "$@" > "$log" 2>&1 < /dev/null &
    GROUPS_LIVE="$GROUPS_LIVE $!"
}
stop_groups() {  # TERM every group of the phase, KILL what is left after 10 s
    local g
    for g in $GROUPS_LIVE; do kill -TERM -- "-$g" 2>/dev/null; done
    for _ in $(seq 50); do
        local alive=0
        for g in $GROUPS_LIVE; do kill -0 -- "-$g" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.2
    done
    for g in $GROUPS_LIVE; do kill -KILL -- "-$g" 2>/dev/null; wait "$g" 2>/dev/null; done
    GROUPS_LIVE=""
}
trap 'stop_groups; exit 130' INT TERM
wait_file() { for _ in $(seq $(($2 * 5))); do [ -s "$1" ] && return 0; sleep 0.2; done; return 1; }
wait_text() { for _ in $(seq $(($3 * 5))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.2; done; return 1; }
lines() { local n; n=$(grep -c . "$1" 2>/dev/null); echo "${n:-0}"; }
event() { echo "{\"phase\": \"$1\", \"event\": \"$2\", \"t\": $(now)}" >> "$OUT/events.jsonl"; }
record() {  # name rc s limit
    echo "== phase $1: ${3}s rc=$2$([ "$2" = 124 ] && echo ' (timed out)')"
    echo "{\"phase\": \"$1\", \"s\": $3, \"rc\": $2, \"limit_s\": $4}" >> "$PHASES"
}
skip() { echo "== phase $1: skipped, $2 s left of the budget"; echo "{\"phase\": \"$1\", \"skipped\": \"budget\", \"left_s\": $2}" >> "$PHASES"; }

# ---- mk: the target (and the CPU mode's data) ----
if [ "$DRY" = 1 ]; then
    echo "DRY mk: $DL mkmodel --config $MKCFG --out $MODEL"
elif [ -f "$MODEL/config.json" ]; then
    echo "== phase mk: reusing $MODEL"; echo '{"phase": "mk", "reused": true}' >> "$PHASES"
else
    t1=$(now); timeout "$(limit "$MK_CAP")" $DL mkmodel --config $MKCFG --out "$MODEL" > "$OUT/mk.log" 2>&1
    rc=$?; record mk $rc "$(echo "$(now) $t1" | awk '{printf "%.1f", $1 - $2}')" "$MK_CAP"
    [ $rc = 0 ] || { tail -n 5 "$OUT/mk.log"; echo "gpu_x2: mkmodel failed"; exit 1; }
fi
if [ "$DEVICE" = cpu ] && [ "$DRY" != 1 ] && [ ! -s "$DATA" ]; then
    head -n 200 "${CPU_DATA:-/work/shared/data/gsm8k/train.jsonl}" > "$W/gsm8k.jsonl"
    $DL prepare --data "$W/gsm8k.jsonl" --out "$DATA" --prompt-field question --response-field answer \
        --threads 1 > "$OUT/prepare.log" 2>&1 || { echo "gpu_x2: prepare failed"; exit 1; }
fi
# --epochs: the kill phase's 24 steps of K=2 need 48 micro-batches (long.dlc holds 32)
R="--target-model $MODEL --data $DATA $WORK --epochs ${EPOCHS:-4} --progress-every 5"

# alone NAME K STEPS PLACEMENT: `draftline run` on this host
alone() {
    local name=$1 k=$2 steps=$3 pl=$4 lim
    local cmd="$DL run $R $pl --micro-batches-per-step $k --max-steps $steps --out $W/$name"
    lim=$(limit "$CAP_RUN")
    if [ "$DRY" = 1 ]; then echo "DRY $name (limit ${lim}s): $cmd"; return 0; fi
    [ "$lim" -lt "$MIN_PHASE_S" ] && { skip "$name" "$lim"; return 1; }
    rm -rf "${W:?}/$name"
    echo "== phase $name (limit ${lim}s, at +$(elapsed)s): $cmd"
    local t1; t1=$(now)
    start_group "$W/$name.out" timeout -k 10 "$lim" $cmd
    local head=$!; wait $head; local rc=$?
    stop_groups
    record "$name" $rc "$(echo "$(now) $t1" | awk '{printf "%.1f", $1 - $2}')" "$lim"
    grep -E '^summary|^checkpoint' "$W/$name.out"
    [ $rc = 0 ] || tail -n 15 "$W/$name.out"
    return $rc
}

agent() {  # NAME-of-phase NODE GPU LOG: a node agent (its own process group)
    local name=$1 node=$2 gpu=$3 log=$4 lim=$5
    local cmd="$DL node --join 127.0.0.1:$PORT --key $W/$name/node.key --name $node --run-dir $W/$name-$node"
    if [ "$DEVICE" = gpu ]; then start_group "$log" env CUDA_VISIBLE_DEVICES=$gpu DL_TEST_HOOKS=nccl_cross=1 timeout -k 5 "$lim" $cmd
    else start_group "$log" env DL_TEST_HOOKS=nccl_cross=1 timeout -k 5 "$lim" $cmd; fi
}

# multi NAME K STEPS PLACEMENT [KILL]: a head on 127.0.0.1 (loader) and agents a (GPU 0) and
# b (GPU 1); with KILL, agent b's group is killed after KILL_AT steps and started again
multi() {
    local name=$1 k=$2 steps=$3 pl=$4 kill=${5:-} lim cap=$CAP_RUN
    [ -n "$kill" ] && cap=$CAP_KILL
    local cmd="$DL run $R $pl --micro-batches-per-step $k --max-steps $steps --listen 127.0.0.1:$PORT --nodes 2 --join-timeout 60 --out $W/$name"
    lim=$(limit "$cap")
    if [ "$DRY" = 1 ]; then
        echo "DRY $name (limit ${lim}s): DL_TEST_HOOKS=nccl_cross=1 $cmd"
        echo "DRY $name:   CUDA_VISIBLE_DEVICES=0 DL_TEST_HOOKS=nccl_cross=1 $DL node --join 127.0.0.1:$PORT --key $W/$name/node.key --name a --run-dir $W/$name-a"
        echo "DRY $name:   CUDA_VISIBLE_DEVICES=1 DL_TEST_HOOKS=nccl_cross=1 $DL node --join 127.0.0.1:$PORT --key $W/$name/node.key --name b --run-dir $W/$name-b"
        [ -n "$kill" ] && echo "DRY $name:   after $KILL_AT steps: kill -9 of agent b's process group; after \"node b lost\": the same b command again"
        PORT=$((PORT + 200)); return 0
    fi
    [ "$lim" -lt "$MIN_PHASE_S" ] && { skip "$name" "$lim"; return 1; }
    rm -rf "${W:?}/$name" "$W/$name-a" "$W/$name-b"
    echo "== phase $name (limit ${lim}s, at +$(elapsed)s): DL_TEST_HOOKS=nccl_cross=1 $cmd"
    local t1; t1=$(now)
    start_group "$W/$name.out" env DL_TEST_HOOKS=nccl_cross=1 timeout -k 10 "$lim" $cmd
    local head=$!
    wait_file "$W/$name/node.key" 30 || echo "!! $name: no key file after 30 s"
    agent "$name" a 0 "$W/$name-agent-a.out" $((lim + 15))
    agent "$name" b 1 "$W/$name-agent-b.out" $((lim + 15))
    local bgrp=$!
    if [ -n "$kill" ]; then
        local steps_f=$W/$name-a/steps.jsonl   # the optimizer is with drafter0, on a
        for _ in $(seq $((lim * 5))); do
            [ "$(lines "$steps_f")" -ge "$KILL_AT" ] && break
            kill -0 "$head" 2>/dev/null || break
            sleep 0.2
        done
        event "$name" kill; kill -KILL -- "-$bgrp" 2>/dev/null; wait "$bgrp" 2>/dev/null
        echo "   killed agent b's group at step $(lines "$steps_f"), +$(elapsed)s"
        wait_text "$W/$name.out" "node b lost" 30 && event "$name" lost
        agent "$name" b 1 "$W/$name-agent-b2.out" $((lim + 15)); event "$name" restart
        wait_text "$W/$name.out" "node b rejoined" 60 && event "$name" rejoined
    fi
    wait $head; local rc=$?
    stop_groups
    record "$name" $rc "$(echo "$(now) $t1" | awk '{printf "%.1f", $1 - $2}')" "$lim"
    grep -E '^summary|^checkpoint' "$W/$name.out"
    [ $rc = 0 ] || { tail -n 15 "$W/$name.out"; tail -n 5 "$W/$name"-agent-*.out; }
    PORT=$((PORT + 200))
    return $rc
}

: > "$OUT/events.jsonl"
FAILED=0
has alone && { alone alone 1 "$STEPS" "$PL_ALONE" || FAILED=1; }
has cross && { multi cross 1 "$STEPS" "$PL_CROSS" || FAILED=1; }
has mirror && { multi mirror 2 "$STEPS" "$PL_MIRROR" || FAILED=1; }
has mirror_ipc && { alone mirror_ipc 2 "$STEPS" "$PL_MIRROR_IPC" || FAILED=1; }
has kill && { multi kill 2 "$KILL_STEPS" "$PL_MIRROR" kill || FAILED=1; }
[ "$DRY" = 1 ] && { echo "DRY: report -> $OUT/x2.json (python3 scripts/gpu_x2_report.py --out $OUT --work $W)"; exit 0; }
(cd "$W" && tar czf "$OUT/logs.tgz" --exclude='*.safetensors' --exclude='checkpoints' ./*.out ./*/logs \
    ./*/metrics.jsonl ./*/steps.jsonl ./*/run.json 2>/dev/null)
python3 scripts/gpu_x2_report.py --out "$OUT" --work "$W" --device "$DEVICE" --failed $FAILED \
    --total-s "$(elapsed)" || FAILED=1
echo "FAILED=$FAILED total $(elapsed)s"
exit $FAILED
