#!/usr/bin/env bash
# Issue 18 on one 8-GPU host (nvidia-h200-x8; nvidia-h200-x4: the first half): scaling of
# `draftline run` from 1 to 8 GPUs, target/drafter splits by hand and by --balance auto, and
# a live rebalance. It does not all fit one 600 s call: PARTS picks the phases.
#
# Device commands (repo root, gpucarry/ holding the bundle and the data):
#   8 GPUs, call 1 (~470 s): tar xJf gpucarry/bundle.tar.xz && . bundle/env.sh && PARTS="g1 g2 g4 g8" bash scripts/gpu_scale.sh
#   8 GPUs, call 2 (~480 s): tar xJf gpucarry/bundle.tar.xz && . bundle/env.sh && PARTS="auto4 auto8 live" bash scripts/gpu_scale.sh
#   4 GPUs, call 1 (~330 s): tar xJf gpucarry/bundle.tar.xz && . bundle/env.sh && PARTS="g1 g2 g4 auto4" bash scripts/gpu_scale.sh
#   4+ GPUs, issue 14 item 5 (~220 s): tar xJf gpucarry/bundle.tar.xz && . bundle/env.sh && PARTS="auto13" bash scripts/gpu_scale.sh
#   4 GPUs, call 2 (~220 s): tar xJf gpucarry/bundle.tar.xz && . bundle/env.sh && PARTS="live" bash scripts/gpu_scale.sh
# (a warm machine keeps $W/qwen3-8b: mk is then skipped; a fresh one makes it again, ~45-70 s)
# A call without g1 takes the 1-GPU figure for the efficiencies from BASE (call 1's
# one_gpu_tokens_per_s, e.g. BASE=13137, or a scale.json path).
#
# usage: [PARTS="g1 g2 g4 g8 auto4 auto8 live" (the default; also auto13)] [STEPS=12] [BASE=N] [DEVICE=gpu|cpu] [DRY=1]
#        bash scripts/gpu_scale.sh
# Work: the reference (Qwen3-8B-shaped random target from `draftline mkmodel --config qwen3-8b`,
# $LONG = gpucarry/long.dlc, --token-budget 32768 --max-len 4096 --block-size 16 --num-anchors
# 512 --drafter-layers 5 --threads 8 --inbox-gb 6), --micro-batches-per-step K = G x K_PER_GPU
# (default 1: one micro-batch of 32,768 tokens per GPU per step; 1 GPU: K = 1), so the work per
# step grows with the GPUs (weak scaling). Split t+d on G GPUs: targets on GPUs 0..t-1,
# drafters on t..G-1 (1 GPU: both on GPU 0). Phases (estimates from bench/NOTES.md: start-up
# ~12 s, ~2.4 s per 1-GPU step, a drafter micro-batch ~1.4 s; each run + ~5 s checkpoint/exit):
#   mk     mkmodel qwen3-8b into $W (skipped when there)                              ~45-70 s
#   g1     1 GPU (target and drafter on GPU 0), K=1                                    ~50 s
#   g2     1+1, K=2                                                                    ~55 s
#   g4     2+2 and 3+1 (SPLITS4), K=4                                                  ~110 s
#   g8     4+4, 5+3 (the split run by hand), 6+2 (SPLITS8), K=8                        ~200 s
#   auto4  --balance auto from 2+2 (--balance-every BAL_EVERY=20 s), AUTO_STEPS=24     ~120 s
#   auto13 --balance auto from 1+3 on 4 GPUs (the deliberately bad split of issue 14 item 5:
#          the one target is the bottleneck; 2+2 is the best split at these shapes)    ~150 s
#   auto8  --balance auto from 4+4: where it settles and how long (balance log lines)  ~150 s
#   live   4+4 -> 5+3 -> 4+4 by `draftline rebalance` (4-GPU host: 2+2 -> 3+1 -> 2+2), K=G:
#          the rebalances after LIVE_AT (6) and 2 x LIVE_AT steps of LIVE_STEPS (24);
#          pause, steps lost (each step once), memory per GPU                         ~150 s
# Phases needing more GPUs than the host has are skipped (said so). Every run: nvidia-smi
# (utilization.gpu, memory.used; epoch-stamped) every 0.5 s; BUDGET_S (560) shared in order,
# each run capped (CAP_RUN 150, CAP_LONG 220 s) and skipped below MIN_PHASE_S (40).
# Every run is a process group of its own, killed at its end; nothing outlives the script.
# DEVICE=cpu: the same flow with a tiny-qwen3 model, a 200-sample GSM8K cache made here and CPU
# processes standing in for GPUs (--device cpu --targets t --drafters d; rebalance by
# --targets/--drafters), as on a 4-GPU host; default STEPS=8; DL defaults to bin-cpu/draftline.
# DRY=1 prints every command and runs nothing.
# Output: $OUT/scale.json (scripts/gpu_scale_report.py; a table on stdout), $OUT/phases.jsonl,
# $OUT/logs.tgz.
set -u
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-gpu}; DRY=${DRY:-0}
PARTS=${PARTS:-g1 g2 g4 g8 auto4 auto8 live}
OUT=${OUT:-/tmp/scale-out}; W=${W:-/tmp/scale}
BUDGET_S=${BUDGET_S:-560}; MIN_PHASE_S=${MIN_PHASE_S:-40}
CAP_RUN=${CAP_RUN:-150}; CAP_LONG=${CAP_LONG:-220}; MK_CAP=${MK_CAP:-150}
K_PER_GPU=${K_PER_GPU:-1}; BAL_EVERY=${BAL_EVERY:-20}
SPLITS4=${SPLITS4:-2+2 3+1}; SPLITS8=${SPLITS8:-4+4 5+3 6+2}
export NCCL_NVLS_ENABLE=0
if [ "$DEVICE" = gpu ]; then
    [ "$DRY" = 1 ] || { [ -f bundle/env.sh ] && . bundle/env.sh; }
    DL=${DL:-bundle/bin/draftline}; MKCFG=qwen3-8b; DATA=${LONG:-gpucarry/long.dlc}
    STEPS=${STEPS:-12}; AUTO_STEPS=${AUTO_STEPS:-24}; LIVE_STEPS=${LIVE_STEPS:-24}; LIVE_AT=${LIVE_AT:-6}
    WORK="--token-budget 32768 --max-len 4096 --block-size 16 --num-anchors 512 --drafter-layers 5 --threads 8 --inbox-gb 6"
    if [ "$DRY" = 1 ]; then NGPU=${NGPU:-8}; else NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}; fi
else
    DL=${DL:-bin-cpu/draftline}; MKCFG=tiny-qwen3; DATA=$W/gsm8k.dlc
    STEPS=${STEPS:-8}; AUTO_STEPS=${AUTO_STEPS:-16}; LIVE_STEPS=${LIVE_STEPS:-18}; LIVE_AT=${LIVE_AT:-4}
    BAL_EVERY=${BAL_EVERY_CPU:-4}
    WORK="--token-budget 1024 --block-size 8 --num-anchors 16 --drafter-layers 1 --threads 1 --inbox-gb 0.25"
    NGPU=${NGPU:-4}; MK_CAP=60
fi
MODEL=$W/$MKCFG
mkdir -p "$OUT"; [ "$DRY" = 1 ] || mkdir -p "$W"
PHASES=$OUT/phases.jsonl; : > "$PHASES"; : > "$OUT/runs.jsonl"
T0=$(date +%s.%N)
now() { date +%s.%N; }
elapsed() { echo "$(now) $T0" | awk '{printf "%.1f", $1 - $2}'; }
left() { echo "$BUDGET_S $(elapsed)" | awk '{printf "%d", $1 - $2}'; }
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
limit() { local l; l=$(left); [ "$l" -gt "$1" ] && l=$1; echo "$l"; }
lines() { local n; n=$(grep -c . "$1" 2>/dev/null); echo "${n:-0}"; }
echo "gpu_scale: $NGPU GPU(s), PARTS=\"$PARTS\", DEVICE=$DEVICE"

GROUPS_LIVE=""
start_group() {  # log cmd...: in a new session (own process group); pid in $!
    local log=$1; shift
    setsid "$@" > "$log" 2>&1 < /dev/null &
    GROUPS_LIVE="$GROUPS_LIVE $!"
}
stop_groups() {
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

# the placement of t targets + d drafters on G GPUs (GPU: lists; CPU: process counts)
seqlist() { seq -s, "$1" "$2"; }
place() {
    local t=$1 d=$2 g=$3
    if [ "$DEVICE" = cpu ]; then echo "--device cpu --targets $t --drafters $d"
    elif [ "$g" = 1 ]; then echo "--target-gpus 0 --drafter-gpus 0"
    else echo "--target-gpus $(seqlist 0 $((t - 1))) --drafter-gpus $(seqlist "$t" $((t + d - 1)))"; fi
}
# t+d -> (t+1)+(d-1) as balance.c does it: the last drafter's GPU becomes a new target's
place_more_targets() {
    local t=$1 d=$2
    if [ "$DEVICE" = cpu ]; then echo "--targets $((t + 1)) --drafters $((d - 1))"
    else echo "--target-gpus $(seqlist 0 $((t - 1))),$((t + d - 1)) --drafter-gpus $(seqlist "$t" $((t + d - 2)))"; fi
}
place_back() {  # the placement t+d again, for `draftline rebalance`
    if [ "$DEVICE" = cpu ]; then echo "--targets $1 --drafters $2"
    else echo "--target-gpus $(seqlist 0 $(($1 - 1))) --drafter-gpus $(seqlist "$1" $(($1 + $2 - 1)))"; fi
}

smi_loop() {  # every 0.5 s: "epoch,index,util,mem_mib" per GPU
    while :; do
        local t; t=$(date +%s.%N)
        nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits 2>/dev/null \
            | sed "s/^/$t,/; s/ //g"
        sleep 0.5
    done
}

# ---- mk ----
if [ "$DRY" = 1 ]; then
    echo "DRY mk: $DL mkmodel --config $MKCFG --out $MODEL"
elif [ -f "$MODEL/config.json" ]; then
    echo "== phase mk: reusing $MODEL"; echo '{"phase": "mk", "reused": true}' >> "$PHASES"
else
    t1=$(now); timeout "$(limit "$MK_CAP")" $DL mkmodel --config $MKCFG --out "$MODEL" > "$OUT/mk.log" 2>&1
    rc=$?; s=$(echo "$(now) $t1" | awk '{printf "%.1f", $1 - $2}')
    echo "== phase mk: ${s}s rc=$rc"; echo "{\"phase\": \"mk\", \"s\": $s, \"rc\": $rc}" >> "$PHASES"
    [ $rc = 0 ] || { tail -n 5 "$OUT/mk.log"; echo "gpu_scale: mkmodel failed"; exit 1; }
fi
if [ "$DEVICE" = cpu ] && [ "$DRY" != 1 ] && [ ! -s "$DATA" ]; then
    head -n 200 "${CPU_DATA:-/work/shared/data/gsm8k/train.jsonl}" > "$W/gsm8k.jsonl"
    $DL prepare --data "$W/gsm8k.jsonl" --out "$DATA" --prompt-field question --response-field answer \
        --threads 1 > "$OUT/prepare.log" 2>&1 || { echo "gpu_scale: prepare failed"; exit 1; }
fi
# --epochs: enough passes over the data for the longest run (long.dlc: 256 sequences = 32
# micro-batches; 24 steps of K=8 need 6 passes), else --max-steps is capped to one epoch
R="--target-model $MODEL --data $DATA $WORK --epochs ${EPOCHS:-8} --progress-every 5"

# one NAME G T D STEPS CAP [LIVE] [run flags...]: one `draftline run`; LIVE=live makes the
# rebalances t+d -> (t+1)+(d-1) -> t+d after LIVE_AT and 2 x LIVE_AT steps
one() {
    local name=$1 g=$2 t=$3 d=$4 steps=$5 cap=$6 live=$7 lim k
    shift 7
    k=$((g * K_PER_GPU)); [ "$g" = 1 ] && k=1
    local cmd="$DL run $R $(place "$t" "$d" "$g") --micro-batches-per-step $k --max-steps $steps --out $W/$name $*"
    lim=$(limit "$cap")
    if [ "$NGPU" -lt "$g" ]; then
        echo "== phase $name: skipped, needs $g GPUs ($NGPU here)"
        echo "{\"phase\": \"$name\", \"skipped\": \"gpus\", \"gpus\": $g}" >> "$PHASES"; return 0
    fi
    if [ "$DRY" = 1 ]; then
        echo "DRY $name (limit ${lim}s): $cmd"
        [ -n "$live" ] && echo "DRY $name:   after $LIVE_AT steps: $DL rebalance --run $W/$name $(place_more_targets "$t" "$d") --wait 120" \
            && echo "DRY $name:   after $((2 * LIVE_AT)) steps: $DL rebalance --run $W/$name $(place_back "$t" "$d") --wait 120"
        return 0
    fi
    [ "$lim" -lt "$MIN_PHASE_S" ] && { echo "== phase $name: skipped, ${lim}s left"; echo "{\"phase\": \"$name\", \"skipped\": \"budget\", \"left_s\": $lim}" >> "$PHASES"; return 1; }
    rm -rf "${W:?}/$name" "$W/$name.events" "$W/$name.rebalance"
    echo "== phase $name (limit ${lim}s, at +$(elapsed)s): $cmd"
    echo "{\"name\": \"$name\", \"gpus\": $g, \"targets\": $t, \"drafters\": $d, \"k\": $k, \"steps\": $steps, \"live\": \"$live\", \"argv\": \"$*\"}" >> "$OUT/runs.jsonl"
    local t1; t1=$(now)
    [ "$DEVICE" = gpu ] && start_group "$W/$name.smi" bash -c "$(declare -f smi_loop); smi_loop"
    start_group "$W/$name.out" timeout -k 10 "$lim" $cmd
    local head=$!
    if [ -n "$live" ]; then
        local sf=$W/$name/steps.jsonl n at
        for at in "$LIVE_AT" $((2 * LIVE_AT)); do
            for _ in $(seq $((lim * 5))); do
                n=$(lines "$sf"); [ "$n" -ge "$at" ] && break
                kill -0 "$head" 2>/dev/null || break
                sleep 0.2
            done
            local to; if [ "$at" = "$LIVE_AT" ]; then to=$(place_more_targets "$t" "$d"); else to=$(place_back "$t" "$d"); fi
            echo "   at step $(lines "$sf") (+$(elapsed)s): draftline rebalance --run $W/$name $to"
            echo "{\"event\": \"rebalance\", \"t\": $(now), \"at_steps\": $(lines "$sf"), \"to\": \"$to\"}" >> "$W/$name.events"
            timeout 150 $DL rebalance --run "$W/$name" $to --wait 120 >> "$W/$name.rebalance" 2>&1
            echo "{\"event\": \"rebalance_done\", \"t\": $(now), \"rc\": $?}" >> "$W/$name.events"
            tail -n 1 "$W/$name.rebalance"
        done
    fi
    wait $head; local rc=$?
    stop_groups
    local s; s=$(echo "$(now) $t1" | awk '{printf "%.1f", $1 - $2}')
    echo "== phase $name: ${s}s rc=$rc$([ $rc = 124 ] && echo ' (timed out)')"
    echo "{\"phase\": \"$name\", \"s\": $s, \"rc\": $rc, \"limit_s\": $lim}" >> "$PHASES"
    grep -E '^summary|balance:' "$W/$name.out" | cut -c1-300
    [ $rc = 0 ] || tail -n 15 "$W/$name.out"
    return $rc
}

split() { one "g$1_$2p$3" "$1" "$2" "$3" "$STEPS" "$CAP_RUN" ""; }
FAILED=0
has g1 && { one g1_1p1 1 1 1 "$STEPS" "$CAP_RUN" "" || FAILED=1; }
has g2 && { split 2 1 1 || FAILED=1; }
if has g4; then for sp in $SPLITS4; do split 4 "${sp%+*}" "${sp#*+}" || FAILED=1; done; fi
if has g8; then for sp in $SPLITS8; do split 8 "${sp%+*}" "${sp#*+}" || FAILED=1; done; fi
has auto4 && { one auto4_2p2 4 2 2 "$AUTO_STEPS" "$CAP_LONG" "" --balance auto --balance-every "$BAL_EVERY" || FAILED=1; }
has auto13 && { one auto13_1p3 4 1 3 "$AUTO_STEPS" "$CAP_LONG" "" --balance auto --balance-every "$BAL_EVERY" || FAILED=1; }
has auto8 && { one auto8_4p4 8 4 4 "$AUTO_STEPS" "$CAP_LONG" "" --balance auto --balance-every "$BAL_EVERY" || FAILED=1; }
if has live; then
    if [ "$NGPU" -ge 8 ]; then one live8_4p4 8 4 4 "$LIVE_STEPS" "$CAP_LONG" live || FAILED=1
    else one live4_2p2 4 2 2 "$LIVE_STEPS" "$CAP_LONG" live || FAILED=1; fi
fi
[ "$DRY" = 1 ] && { echo "DRY: report -> $OUT/scale.json (python3 scripts/gpu_scale_report.py --out $OUT --work $W)"; exit 0; }
(cd "$W" && tar czf "$OUT/logs.tgz" --exclude='*.safetensors' --exclude='checkpoints' ./*.out ./*.smi \
    ./*.events ./*.rebalance ./*/logs ./*/metrics.jsonl ./*/steps.jsonl 2>/dev/null)
python3 scripts/gpu_scale_report.py --out "$OUT" --work "$W" --device "$DEVICE" --failed $FAILED \
    --total-s "$(elapsed)" ${BASE:+--base "$BASE"} || FAILED=1
echo "FAILED=$FAILED total $(elapsed)s"
exit $FAILED
