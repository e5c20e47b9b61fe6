#!/usr/bin/env bash
# Issue 16 on one H200 in one device call: Qwen3-30B-A3B shapes (random weights made there),
# draftline's target forward against Hugging Face transformers on the same batches, then the
# pipeline end to end.
#
# usage (repo root on the GPU machine, bundle/ unpacked with bench/ and the stage programs,
# the reference data at $LONG):
#   [PARTS="test bench hf pipe"] [LAYERS=auto|N] [DRY=1] bash scripts/gpu_moe.sh
# Phases (each timed, each printed as "== phase NAME: ... s rc"):
#   test   bundle/tests/gpu_test_moe_gemm_cuda and gpu_test_target_cuda (the MoE GEMM path
#          against the CPU; the qwen3_moe fixture end to end): the figures mean nothing if
#          these fail (the other phases still run)
#   mk     draftline mkmodel --config qwen3-30b-a3b --layers $LAYERS into $MODEL (skipped when
#          $MODEL/config.json already has that many layers: a warm machine reuses it);
#          always run before the others when they need the model
#   bench  bench_target --tokens 32768 (8 x 4096 and the mixed batch, capture and full;
#          active-parameter MFU, routing balance) -> $OUT/bench_target.json
#   hf     bench/hf_target.py --config qwen3-30b-a3b on the same batches (bench_target's mixed
#          lengths; HF_EXPERTS="default" or e.g. "default,eager") -> $OUT/hf_target.json
#   pipe   draftline run with the MoE target and a 5-layer drafter (hidden size = the target's,
#          2048) on $LONG with the reference flags of scripts/gpu_pipeline.sh ref, 1 GPU,
#          $STEPS steps: steady (steps 2..N-2) and wall tokens/s (the whole command) -> $OUT
# Where the model lives: the full model is 61 GB (bf16) and the GPU machine's disk has about
# 45 GB free. LAYERS=auto takes all 48 layers on /dev/shm (tmpfs, RAM) when it has room,
# else the most layers that fit on the roomier of /dev/shm and $W's disk (2 GiB margin);
# LAYERS=N forces N (the place is still picked by room). MODEL_DIR=... forces the place.
# Per-layer figures (MFU, ms per layer) carry over from fewer layers; totals do not.
# Budget: the device call has 600 s; BUDGET_S (default 570) is shared by the phases in order,
# each capped (TEST_CAP, MK_CAP, BENCH_CAP, HF_CAP, PIPE_CAP s) and by what is left; a phase that
# cannot get MIN_PHASE_S (60; the pipeline PIPE_MIN_S) is skipped and reported so. Estimated for
# 48 layers (mkmodel ~0.4 GB/s, loads ~0.65 GB/s as measured for Qwen3-8B): mk ~155 s, bench
# ~125 s, hf ~60 s, pipe ~170 s: if it does not all fit, the model stays where it was written
# and a second call on the warm machine (PARTS="pipe") reuses it.
# Output: $OUT/gpu_moe.json (phases, times, where the model was, the figures), $OUT/*.log.
# DRY=1 prints the commands (and the place/layers decision) without running anything.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/moe-out}; W=${W:-/tmp/moe}
PARTS=${PARTS:-test bench hf pipe}
BUDGET_S=${BUDGET_S:-570}; MIN_PHASE_S=${MIN_PHASE_S:-60}
TEST_CAP=${TEST_CAP:-90}; MK_CAP=${MK_CAP:-300}; BENCH_CAP=${BENCH_CAP:-200}; HF_CAP=${HF_CAP:-200}; PIPE_CAP=${PIPE_CAP:-300}
REPS=${REPS:-3}; STEPS=${STEPS:-14}; LONG=${LONG:-gpucarry/long.dlc}
HF_EXPERTS=${HF_EXPERTS:-default}; LAYERS=${LAYERS:-auto}; DRY=${DRY:-0}
DL=${DL:-bundle/bin/draftline}; BENCH=${BENCH:-bundle/bench/bench_target}; PY=${PY:-python3}
FULL_LAYERS=48
# bf16 bytes of qwen3-30b-a3b (mkmodel preset): per decoder layer (attention 18,874,368 +
# norms 4,352 + router 262,144 + 128 experts x 3 x 2048 x 768 = 623,120,640 params) and the
# rest (embedding + LM head 2 x 151,936 x 2048 + final norm 2048); 48 layers: 61.06 GB
PER_LAYER_B=1246241280; FIXED_B=1244663808; MARGIN_B=$((2 << 30))

mkdir -p "$OUT"
[ "$DRY" = 1 ] || mkdir -p "$W"
[ "$DRY" = 1 ] || { [ -f bundle/env.sh ] && . bundle/env.sh; }
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-16}
T0=$(date +%s.%N)
PHASES=$OUT/phases.jsonl; : > "$PHASES"

elapsed() { echo "$(date +%s.%N) $T0" | awk '{printf "%.1f", $1 - $2}'; }
left() { echo "$BUDGET_S $(elapsed)" | awk '{printf "%d", $1 - $2}'; }
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
avail_b() { df -B1 --output=avail "$1" 2>/dev/null | tail -n 1 | tr -d ' '; }
need_b() { echo $((FIXED_B + $1 * PER_LAYER_B + MARGIN_B)); }
fit_layers() {  # most layers (<= 48) that fit in $1 bytes
    local n=$(( ($1 - FIXED_B - MARGIN_B) / PER_LAYER_B ))
    [ "$n" -gt $FULL_LAYERS ] && n=$FULL_LAYERS
    [ "$n" -lt 0 ] && n=0
    echo $n
}

# phase NAME CAP cmd...: runs cmd under the smaller of CAP and what is left of the budget,
# output to $OUT/NAME.log; appends {"phase", "s", "rc", "limit_s"} to $PHASES
phase() {
    local name=$1 cap=$2 lim rc t1
    shift 2
    lim=$(left); [ "$lim" -gt "$cap" ] && lim=$cap
    if [ "$DRY" = 1 ]; then
        echo "DRY $name (limit ${lim}s): $*"
        echo "{\"phase\": \"$name\", \"dry\": true, \"limit_s\": $lim}" >> "$PHASES"
        return 0
    fi
    if [ "$lim" -lt "${PHASE_MIN:-$MIN_PHASE_S}" ]; then
        echo "== phase $name: skipped, ${lim}s left of the budget"
        echo "{\"phase\": \"$name\", \"skipped\": \"budget\", \"left_s\": $lim}" >> "$PHASES"
        return 1
    fi
    echo "== phase $name (limit ${lim}s, at +$(elapsed)s): $*"
    t1=$(date +%s.%N)
    timeout --kill-after=15 "$lim" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    local s; s=$(echo "$(date +%s.%N) $t1" | awk '{printf "%.1f", $1 - $2}')
    echo "== phase $name: ${s}s rc=$rc$([ $rc = 124 ] && echo ' (timed out)')"
    echo "{\"phase\": \"$name\", \"s\": $s, \"rc\": $rc, \"limit_s\": $lim}" >> "$PHASES"
    tail -n 25 "$OUT/$name.log"
    return $rc
}

# ---- where the model lives, and how many layers ----
SHM_B=$(avail_b /dev/shm); SHM_B=${SHM_B:-0}
DISK_B=$(avail_b "$(dirname "$W")"); DISK_B=${DISK_B:-0}
if [ -n "${MODEL_DIR:-}" ]; then
    MODEL=$MODEL_DIR; PLACE=given; ROOM=$(avail_b "$(dirname "$MODEL")"); ROOM=${ROOM:-0}
elif [ "$SHM_B" -ge "$(need_b $FULL_LAYERS)" ] || [ "$SHM_B" -ge "$DISK_B" ]; then
    MODEL=/dev/shm/dl-qwen3-30b-a3b; PLACE=tmpfs; ROOM=$SHM_B
else
    MODEL=$W/qwen3-30b-a3b; PLACE=disk; ROOM=$DISK_B
fi
# a model already there counts as room
[ -f "$MODEL/config.json" ] && ROOM=$((ROOM + $(du -sb "$MODEL" | cut -f1)))
if [ "$LAYERS" = auto ]; then LAYERS=$(fit_layers "$ROOM"); fi
echo "model: $MODEL ($PLACE), $LAYERS of $FULL_LAYERS layers, $(need_b "$LAYERS") bytes needed with margin;" \
     "room $ROOM bytes (/dev/shm $SHM_B, disk $DISK_B)"
if [ "$LAYERS" -lt 1 ]; then echo "gpu_moe: no room for even one layer"; exit 1; fi

FAILED=0
if has test; then
    phase test "$TEST_CAP" bash -c 'bundle/tests/gpu_test_moe_gemm_cuda && bundle/tests/gpu_test_target_cuda' \
        || FAILED=1
fi
have_model() { [ -f "$MODEL/config.json" ] && grep -q "\"num_hidden_layers\":[[:space:]]*$LAYERS," "$MODEL/config.json"; }
if has bench || has pipe || has mk; then
    if [ "$DRY" != 1 ] && have_model; then
        echo "== phase mk: reusing $MODEL ($LAYERS layers)"
        echo "{\"phase\": \"mk\", \"reused\": true}" >> "$PHASES"
    else
        phase mk "$MK_CAP" $DL mkmodel --config qwen3-30b-a3b --layers "$LAYERS" --out "$MODEL" --force \
            || { echo "gpu_moe: mkmodel failed"; FAILED=1; PARTS=${PARTS//bench/}; PARTS=${PARTS//pipe/}; }
    fi
fi

LENS=""
if has bench; then
    phase bench "$BENCH_CAP" $BENCH --model "$MODEL" --tokens 32768 --reps "$REPS" --json "$OUT/bench_target.json" \
        || FAILED=1
    [ -f "$OUT/bench.log" ] && LENS=$(grep '^mixed lengths:' "$OUT/bench.log" | cut -d' ' -f3)
fi
if has hf; then
    [ -z "$LENS" ] && echo "note: no bench_target mixed lengths: hf_target draws its own mixed batch"
    phase hf "$HF_CAP" $PY bench/hf_target.py --config qwen3-30b-a3b --layers "$LAYERS" --tokens 32768 \
        --reps "$REPS" --experts "$HF_EXPERTS" --json "$OUT/hf_target.json" ${LENS:+--lengths "$LENS"} || FAILED=1
fi
if has pipe; then
    [ "$DRY" = 1 ] || rm -rf "$W/pipe"
    # the reference flags of scripts/gpu_pipeline.sh ref, 1 GPU
    # a cut-off run measures nothing: start it only with PIPE_MIN_S left (default 60 + 3 s per
    # layer: two loads of the target at ~0.65 GB/s, 14 steps, the final checkpoint)
    PHASE_MIN=${PIPE_MIN_S:-$((60 + 3 * LAYERS))} phase pipe "$PIPE_CAP" $DL run --target-model "$MODEL" --data "$LONG" --target-gpus 0 --drafter-gpus 0 \
        --out "$W/pipe" --progress-every 5 --token-budget 32768 --max-len 4096 --block-size 16 \
        --num-anchors 512 --drafter-layers 5 --threads 8 --inbox-gb 6 --micro-batches-per-step 1 \
        --max-steps "$STEPS" || FAILED=1
    if [ "$DRY" != 1 ] && [ -d "$W/pipe/logs" ]; then
        grep -hE "loaded|dead|ERROR" "$W/pipe"/logs/*.log | head -20
        (cd "$W" && tar czf "$OUT/pipe_logs.tgz" pipe/logs pipe/steps.jsonl pipe/metrics.jsonl 2>/dev/null)
    fi
fi

[ "$DRY" = 1 ] && { echo "DRY: report -> $OUT/gpu_moe.json"; exit 0; }
$PY scripts/gpu_moe_report.py --out "$OUT" --pipe "$W/pipe" --model "$MODEL" --place "$PLACE" \
    --layers "$LAYERS" --full-layers $FULL_LAYERS --total-s "$(elapsed)" --failed $FAILED
echo "FAILED=$FAILED total $(elapsed)s"
exit $FAILED
