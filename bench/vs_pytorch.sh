#!/usr/bin/env bash
# draftline vs the PyTorch loop a user would write (issue 14), in ONE device call.
#
# usage (repo root on the GPU machine, the bundle unpacked; see bench/NOTES.md):
#   tar xJf gpucarry/bundle.tar.xz && . bundle/env.sh && bash bench/vs_pytorch.sh
#   (or `make bench-vs-pytorch` where the bundle's draftline is on PATH / in bundle/bin)
# env:
#   WORK=ref|sf|both   ref (default): 8 x 4096 tokens per micro-batch, 512 anchors per
#                      sequence, block 16, 5-layer drafter, 1 micro-batch per step ($LONG);
#                      sf: ~600-token samples ($SF), 256 anchors, budget(s) $SF_BUDGETS
#   STEPS=40           steps per run (both sides); WARMUP=2 steps left out of the steady state
#   PRECISION="bf16"   draftline's target precision(s), e.g. "bf16 fp8" (fp8 needs
#                      `draftline run --target-precision`: skipped with a message if absent);
#                      the PyTorch side is always bf16
#   MPS="off"          draftline's --mps value(s), each run for each precision, e.g. "off auto"
#                      (target and drafter share GPU 0: with auto/on they run side by side
#                      under a CUDA MPS daemon; label suffix -mps, -mps-on)
#   TURNS="on"         draftline's --gpu-turns value(s), each run for each precision and MPS
#                      value, e.g. "on off" (off: the driver time-slices the shared GPU;
#                      label suffix -turns-off)
#   BUDGET_S=570       the whole call's time budget (the device call is limited to 600 s): a
#                      run that cannot start with PHASE_MIN_S left is skipped, each run gets
#                      the time that is left as its timeout
#   SF_BUDGETS="16384" token budgets of the sf work (e.g. "16384 32768")
#   LONG=gpucarry/long.dlc SF=gpucarry/sf.dlc OUT=/tmp/vs-out W=/tmp/vs PT_FLAGS=""
#   KEEP_CHECKPOINTS=0 each draftline run's checkpoints (under $W) are removed after the
#                      run (its logs and steps.jsonl stay); 1 keeps them
#   (for a CPU check of this script: MODEL=DIR (no mkmodel), DL_FLAGS (default: GPU 0 for
#   both stages, --threads 8 --inbox-gb 6), REF_SHAPE="BUDGET MAXLEN ANCHORS" (default
#   "32768 4096 512"), SF_ANCHORS=256, DRAFTER_LAYERS=5, PT_FLAGS="--device cpu")
# Prints the time of each phase and, per work, one line
#   vs-pytorch steady X.XXx wall Y.YYx            (ref, bf16: the issue's figure)
#   vs-pytorch[LABEL] steady X.XXx wall Y.YYx ...  (other works / precisions)
# and writes $OUT/vs_pytorch.json (both sides' figures, one object per comparison) and
# $OUT/logs.tgz. Steady state, both sides: target tokens of steps WARMUP..last over the
# time from the end of step WARMUP-1 to the end of the last step (draftline: steps.jsonl,
# whose t is the time each step was applied; PyTorch: its per-step wall times), except
# that draftline's window ends one step earlier: its last step's line comes after the
# final checkpoint (bench/vs_pytorch_report.py). Wall: the target tokens of the run over
# the wall time of the whole command (process start, model load, compile or start-up,
# every step, draftline's final checkpoint and shutdown).
# -h / --help prints this header and exits (any other argument is refused: settings are env).
set -u
case "${1:-}" in
  -h|--help) sed -n '2,/^set -u$/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0;;
  "") ;;
  *) echo "vs_pytorch.sh: no arguments (settings are environment variables; --help lists them)" >&2; exit 2;;
esac
cd "$(dirname "$0")/.."
[ -n "${DL_BUNDLE_ENV:-}" ] || { [ -f bundle/env.sh ] && . bundle/env.sh; }
export NCCL_NVLS_ENABLE=0
# the PyTorch side: what a user sets against fragmentation (steps of varying shapes)
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
DL=${DL:-$(command -v draftline || echo bundle/bin/draftline)}
[ -x "$DL" ] || DL=bin/draftline
PY=${PY:-python3}
WORK=${WORK:-ref}; STEPS=${STEPS:-40}; WARMUP=${WARMUP:-2}; PRECISION=${PRECISION:-bf16}; MPS=${MPS:-off}
TURNS=${TURNS:-on}
[ -n "${PRECISION// }" ] && [ -n "${MPS// }" ] && [ -n "${TURNS// }" ] || { echo "vs_pytorch.sh: PRECISION, MPS and TURNS must name at least one value each" >&2; exit 2; }
BUDGET_S=${BUDGET_S:-570}; PHASE_MIN_S=${PHASE_MIN_S:-60}; SF_BUDGETS=${SF_BUDGETS:-16384}
LONG=${LONG:-gpucarry/long.dlc}; SF=${SF:-gpucarry/sf.dlc}
OUT=${OUT:-/tmp/vs-out}; W=${W:-/tmp/vs}; MODEL=${MODEL:-$W/qwen3-8b}
DL_FLAGS=${DL_FLAGS:---target-gpus 0 --drafter-gpus 0 --threads 8 --inbox-gb 6}
REF_SHAPE=${REF_SHAPE:-32768 4096 512}; SF_ANCHORS=${SF_ANCHORS:-256}; DRAFTER_LAYERS=${DRAFTER_LAYERS:-5}
mkdir -p "$OUT" "$W"
: > "$OUT/runs.jsonl"
T0=$(date +%s.%N)
now() { $PY -c "import time; print(f'{time.time() - $T0:.1f}')"; }
left() { $PY -c "import time; print(int($BUDGET_S - (time.time() - $T0)))"; }
say() { echo "[$(now) s] $*"; }
pack() { (cd "$W" && tar czf "$OUT/logs.tgz" --exclude='*.safetensors' --exclude='data.dlc' \
          --exclude='checkpoints' ./*.log ./*.out ./dl_*/logs ./dl_*/steps.jsonl 2>/dev/null); }
trap pack EXIT

say "draftline: $DL ($($DL version 2>&1 | head -1)); python: $($PY -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -1)"
command -v nvidia-smi > /dev/null && nvidia-smi -L

# phase: the Qwen3-8B-shaped random target, once
if [ ! -f "$MODEL/config.json" ]; then
    s=$(now)
    $DL mkmodel --config qwen3-8b --out "$MODEL" > "$W/mkmodel.log" 2>&1 || { tail -5 "$W/mkmodel.log"; exit 1; }
    say "phase mkmodel: $($PY -c "print(f'{$(now) - $s:.1f}')") s"
fi

# one comparison: LABEL DATA BUDGET MAXLEN ANCHORS (PyTorch once, then draftline per precision and MPS value)
compare() {
    local label=$1 data=$2 budget=$3 maxlen=$4 anchors=$5
    local common="--token-budget $budget --max-len $maxlen --num-anchors $anchors --block-size 16 --drafter-layers $DRAFTER_LAYERS"
    local plan
    plan=$($PY bench/pytorch_dflash.py --data "$data" --steps "$STEPS" $common --plan-only) || { echo "plan failed"; return 1; }
    echo "$plan" > "$W/plan_$label.json"
    local epochs
    epochs=$($PY -c "import json,sys; print(json.load(open('$W/plan_$label.json'))['epochs'])")
    local lt; lt=$(left)
    if [ "$lt" -lt "$PHASE_MIN_S" ]; then say "SKIP $label pytorch: ${lt} s left of BUDGET_S"; return 0; fi
    say "phase $label pytorch: pytorch_dflash.py $common --steps $STEPS (timeout ${lt} s)"
    local s; s=$(date +%s.%N)
    timeout "$lt" $PY bench/pytorch_dflash.py --target-model "$MODEL" --data "$data" --steps "$STEPS" \
        --warmup "$WARMUP" --label "$label" $common ${PT_FLAGS:-} > "$W/pt_$label.out" 2> "$W/pt_$label.log"
    local rc=$? e; e=$(date +%s.%N)
    if [ $rc != 0 ] && grep -q "OutOfMemoryError" "$W/pt_$label.log" && [ "$(left)" -ge 240 ]; then
        say "pytorch $label: out of memory; again with --checkpoint-layers (activation checkpointing)"
        lt=$(left); s=$(date +%s.%N)
        timeout "$lt" $PY bench/pytorch_dflash.py --target-model "$MODEL" --data "$data" --steps "$STEPS" \
            --warmup "$WARMUP" --label "$label" $common ${PT_FLAGS:-} --checkpoint-layers \
            > "$W/pt_$label.out" 2> "$W/pt_$label.log"
        rc=$?; e=$(date +%s.%N)
    fi
    grep -E "^pytorch_dflash|^step (0|1|2|$((STEPS - 1))):" "$W/pt_$label.log"
    [ $rc = 0 ] || { echo "!! pytorch $label rc=$rc"; grep -E "Error|error" "$W/pt_$label.log" | tail -5; }
    echo "{\"side\":\"pytorch\",\"label\":\"$label\",\"rc\":$rc,\"cmd_wall_s\":$($PY -c "print($e - $s)"),\"report\":$(tail -n 1 "$W/pt_$label.out" | grep '^{' || echo null)}" >> "$OUT/runs.jsonl"
    say "phase $label pytorch done (rc $rc)"
    for run in $(for p in $PRECISION; do for m in $MPS; do for t in $TURNS; do echo "$p/$m/$t"; done; done; done); do
        local prec=${run%%/*} mps=${run#*/} turns=${run##*/} pflag="" dl_label=$label
        mps=${mps%/*}
        if [ "$prec" != bf16 ]; then
            if ! $DL run --help 2>&1 | grep -q -- "--target-precision"; then
                say "SKIP $label $prec: this draftline has no --target-precision"; continue
            fi
            pflag="--target-precision $prec"; dl_label=$label-$prec
        fi
        if [ "$mps" != off ]; then
            if ! $DL run --help 2>&1 | grep -q -- "--mps"; then
                say "SKIP $dl_label --mps $mps: this draftline has no --mps"; continue
            fi
            pflag="$pflag --mps $mps"; dl_label=$dl_label-mps; [ "$mps" = auto ] || dl_label=$dl_label-$mps
        fi
        if [ "$turns" != on ]; then
            if ! $DL run --help 2>&1 | grep -q -- "--gpu-turns"; then
                say "SKIP $dl_label --gpu-turns $turns: this draftline has no --gpu-turns"; continue
            fi
            pflag="$pflag --gpu-turns $turns"; dl_label=$dl_label-turns-$turns
        fi
        lt=$(left)
        if [ "$lt" -lt "$PHASE_MIN_S" ]; then say "SKIP $dl_label draftline: ${lt} s left of BUDGET_S"; continue; fi
        rm -rf "$W/dl_$dl_label"
        say "phase $dl_label draftline: run $common --max-steps $STEPS --epochs $epochs${pflag:+ $pflag} (timeout ${lt} s)"
        s=$(date +%s.%N)
        timeout "$lt" $DL run --target-model "$MODEL" --data "$data" $DL_FLAGS \
            --out "$W/dl_$dl_label" --progress-every 5 $common \
            --micro-batches-per-step 1 --max-steps "$STEPS" --epochs "$epochs" $pflag > "$W/dl_$dl_label.out" 2>&1
        rc=$?; e=$(date +%s.%N)
        grep -E "^summary|^checkpoint" "$W/dl_$dl_label.out"
        grep -hE "anchors|passes|micro-batches computed|dead" "$W/dl_$dl_label"/logs/*.log 2>/dev/null | head -6
        [ $rc = 0 ] || { echo "!! draftline $dl_label rc=$rc"; tail -n 8 "$W/dl_$dl_label.out"; }
        if [ "${KEEP_CHECKPOINTS:-0}" != 1 ] && [ -d "$W/dl_$dl_label/checkpoints" ]; then
            # the figures come from steps.jsonl and the logs; an 8B-shaped run's checkpoints
            # are ~13 GB each, and a few runs fill a small disk (the next phase's mkmodel
            # failed so once)
            say "removed $(du -sh "$W/dl_$dl_label/checkpoints" | cut -f1) of checkpoints of $dl_label (KEEP_CHECKPOINTS=1 keeps them)"
            rm -rf "$W/dl_$dl_label/checkpoints"
        fi
        echo "{\"side\":\"draftline\",\"label\":\"$dl_label\",\"pt_label\":\"$label\",\"rc\":$rc,\"cmd_wall_s\":$($PY -c "print($e - $s)"),\"run\":\"$W/dl_$dl_label\",\"plan\":\"$W/plan_$label.json\"}" >> "$OUT/runs.jsonl"
        say "phase $dl_label draftline done (rc $rc)"
    done
}

case "$WORK" in ref|both) compare ref "$LONG" $REF_SHAPE ;; esac
case "$WORK" in sf|both) for b in $SF_BUDGETS; do compare "sf-$b" "$SF" "$b" "$b" "$SF_ANCHORS"; done ;; esac

WARMUP=$WARMUP $PY bench/vs_pytorch_report.py "$OUT/runs.jsonl" "$OUT/vs_pytorch.json"
say "done"
