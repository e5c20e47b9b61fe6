#!/usr/bin/env bash
# Issue 8 at scale: is a drafter trained by `draftline run` on the target's own
# (regenerated) responses better than the same drafter before training?
#
# usage (repo root on the GPU machine, bundle unpacked in bundle/):
#   MODEL=/path/SmolLM2-135M-Instruct.Q4_1.gguf [SHARED=../shared/data] [OUT=/tmp/tau-out] \
#       bash scripts/gpu_tau.sh
#   (or MODEL_PARTS="gpucarry/smol.part.*" [MODEL_SHA256=...] instead of MODEL: see below)
# CPU dry run of the same flow (tiny sizes; binaries from $BIN, default bin/):
#   DEVICE=cpu BIN=/tmp/b/bin bash scripts/gpu_tau.sh
#
# Steps (each under a hard `timeout`; ~7 min wall on one H200 with the defaults):
#  a) `draftline regen --device cuda` (greedy, batched, resumable, --max-seconds
#     REGEN_S) over three prompt sources at once, processes sharing the GPU:
#     GSM8K train questions (all but the last GSM_HOLD, held out for eval; in
#     GSM8K_SHARDS interleaved shards, one process each), the
#     ShareGPT sample's user turns (multi-turn: each turn sees the regenerated
#     earlier replies), and ~800 generic chat / Python-coding prompts from
#     scripts/synth_prompts.py (templates x topics; SYNTH=0 leaves them out).
#     MT-Bench and HumanEval are never trained on: they are the held-out sets.
#     While regen runs, the random-weights drafter is evaluated (tau only): it is
#     exactly the trained drafter's step 0, because `eval --drafter random --seed
#     S --drafter-layers L --block-size B` builds the pipeline's drafter config
#     (pipe_drafter_config) and initialises it with drafter_new(seed S), as the
#     optimizer of `draftline run --seed S` does before step 1.
#  b) `draftline run --target-gpus 0 --drafter-gpus 0` on the regenerated jsonl
#     (OpenAI messages; loss on the assistant turns; the optimizer runs on the
#     drafter's GPU), --max-steps from the time budget TRAIN_S and an assumed
#     rate TRAIN_TOK_S (target tokens/s; the report prints the measured one, set
#     it from that next time), capped by EPOCHS; checkpoints every SAVE_EVERY steps so a timeout still
#     leaves one (the latest is evaluated).
#     The random drafter's evals (tau only, EVAL_N prompts per set, at most
#     EVAL_SET_S s each) decide the prompt counts the trained drafter gets.
#  c) `draftline eval --device cuda` of the trained checkpoint on MT-Bench
#     (first turns), HumanEval prompts and the held-out GSM8K questions, on the
#     same prompts as the random drafter (greedy, --max-new-tokens EVAL_MAX_NEW;
#     the three sets concurrently: tau does not depend on timing);
#     then a timing run on TIMING_SET's first TIMING_N prompts that also decodes
#     target-only (greedy check: output == target-only; speedup with
#     --timing-repeats EVAL_REPEATS, per-prompt medians).
#  d) a table on stdout and $OUT/tau.json (scripts/gpu_tau_report.py: tau per set
#     before/after, train time, samples regenerated, steps, training tokens/s,
#     decode tokens/s, the commands); logs in $OUT/logs.tgz. An early exit
#     (failure, SIGTERM) still writes tau.json with what exists.
# fp8 features (issue 14 item 3): TRAIN_PRECISIONS="bf16 fp8" (default "bf16": one drafter,
# as above) trains one drafter per precision on the SAME regenerated data (one regen), with
# the same seed, steps and flags; only `draftline run --target-precision` differs (none for
# bf16). Each is evaluated against the bf16 target (eval without --target-precision) on the
# same prompts; the random drafter is shared; the timing run (and its greedy check) is done
# for the first precision only; the trained evals of all precisions run concurrently. Files
# per precision P: $W/run_P, train_P.log, eval/trained_P_<set>.json; the report adds a
# side-by-side table (loss: mean of the first / last 10 steps of steps.jsonl; accuracy:
# acc_mean of the last 10; steps; target tok/s; tau per set) and "by_precision" in tau.json.
# With more than one precision on cuda the defaults are cut to fit ~8 min of wall on one
# H200 (regen ~2 min, each training ~1-1.5 min, evals ~1 min; each still overridable):
#   REGEN_S=100 TRAIN_S=80 EVAL_SET_S=35 TIMING_N=4 TIMING_S=20 EVAL_REPEATS=2
# Every size is an environment variable (defaults below, per DEVICE). A rerun with
# the same W (default /tmp/tau-work) resumes the regen files, so data accumulates
# over runs; the training run and the evals start fresh.
# Exit status: 0 when every step ran and the greedy check matched.
set -u
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
SHARED=${SHARED:-../shared/data}
OUT=${OUT:-/tmp/tau-out}
W=${W:-/tmp/tau-work}
TRAIN_PRECISIONS=${TRAIN_PRECISIONS:-bf16}
NPREC=0
for p in $TRAIN_PRECISIONS; do
    case $p in bf16|fp8) NPREC=$((NPREC + 1));; *) echo "gpu_tau: TRAIN_PRECISIONS: '$p' is not bf16 or fp8" >&2; exit 2;; esac
done
[ "$NPREC" -gt 0 ] || { echo "gpu_tau: TRAIN_PRECISIONS is empty" >&2; exit 2; }
FIRST_PREC=${TRAIN_PRECISIONS%% *}
if [ "$DEVICE" = cuda ] && [ "$NPREC" -gt 1 ]; then
    # ~8 min for two trainings (see the header); the rest as below
    : "${REGEN_S:=100}" "${TRAIN_S:=80}" "${EVAL_SET_S:=35}" "${TIMING_N:=4}" "${TIMING_S:=20}" "${EVAL_REPEATS:=2}"
fi
if [ "$DEVICE" = cuda ]; then
    . bundle/env.sh
    export NCCL_NVLS_ENABLE=0
    DL=${DL:-bundle/bin/draftline}
    DEV="--device cuda"
    TOPO="--target-gpus 0 --drafter-gpus 0 --inbox-gb 1"
    # sizes for one H200 (see the step list above)
    : "${REGEN_S:=140}" "${REGEN_BATCH:=256}" "${REGEN_MAX_NEW:=256}" "${REGEN_CTX:=1024}" "${GSM8K_SHARDS:=3}"
    : "${GSM_HOLD:=200}" "${EVAL_N:=48}" "${EVAL_MAX_NEW:=128}" "${EVAL_SET_S:=50}" "${EVAL_REPEATS:=3}"
    : "${TIMING_N:=8}" "${TIMING_S:=30}"
    : "${TRAIN_S:=140}" "${TRAIN_TOK_S:=200000}" "${TOKEN_BUDGET:=16384}" "${EPOCHS:=12}"
    : "${DRAFTER_LAYERS:=2}" "${BLOCK:=8}" "${ANCHORS:=32}" "${LR:=2e-3}" "${WARMUP:=30}" "${SAVE_EVERY:=200}"
    : "${TRAIN_EXTRA:=}"
else
    DL=${DL:-${BIN:-bin}/draftline}
    DEV="--device cpu --threads 1"
    TOPO="--device cpu --threads 1"
    [ -n "${MODEL_PARTS:-}" ] || : "${MODEL:=$HOME/.cache/draftline/SmolLM2-135M-Instruct.Q4_1.gguf}"
    : "${REGEN_S:=20}" "${REGEN_BATCH:=4}" "${REGEN_MAX_NEW:=32}" "${REGEN_CTX:=512}" "${GSM8K_SHARDS:=2}"
    : "${GSM_HOLD:=20}" "${EVAL_N:=2}" "${EVAL_MAX_NEW:=16}" "${EVAL_SET_S:=30}" "${EVAL_REPEATS:=2}"
    : "${TIMING_N:=2}" "${TIMING_S:=30}"
    : "${TRAIN_S:=40}" "${TRAIN_TOK_S:=100}" "${TOKEN_BUDGET:=512}" "${EPOCHS:=2}"
    : "${DRAFTER_LAYERS:=1}" "${BLOCK:=8}" "${ANCHORS:=8}" "${LR:=2e-3}" "${WARMUP:=0}" "${SAVE_EVERY:=2}"
    : "${TRAIN_EXTRA:=}" "${SYNTH_N:=6}"
fi
# the 98 MB GGUF is over the device tool's 64 MiB carry limit: carry it split
# (split -b 50M M.gguf gpucarry/smol.part.) and pass MODEL_PARTS="gpucarry/smol.part.*";
# the parts are joined into $W/model.gguf (checked against MODEL_SHA256 when set)
if [ -z "${MODEL:-}" ] && [ -n "${MODEL_PARTS:-}" ]; then
    mkdir -p "$W"
    cat $MODEL_PARTS > "$W/model.gguf" || { echo "gpu_tau: cannot join $MODEL_PARTS" >&2; exit 2; }
    MODEL=$W/model.gguf
    if [ -n "${MODEL_SHA256:-}" ] && [ "$(sha256sum < "$MODEL" | cut -d' ' -f1)" != "$MODEL_SHA256" ]; then
        echo "gpu_tau: $MODEL (joined from $MODEL_PARTS) does not match MODEL_SHA256" >&2; exit 2
    fi
fi
: "${MODEL:?set MODEL to the SmolLM2-135M-Instruct GGUF (or MODEL_PARTS to its split parts)}"
: "${TIMING_SET:=mt_bench}"
SEED=${SEED:-0}
GSM=$SHARED/gsm8k/train.jsonl
SGPT=$SHARED/sharegpt_sample/dummy_conversation.json
MTB=$SHARED/mt_bench/question.jsonl
HEV=$SHARED/humaneval/HumanEval.jsonl.gz
for f in "$DL" "$MODEL" "$GSM" "$SGPT" "$MTB" "$HEV"; do
    [ -e "$f" ] || { echo "gpu_tau: $f not found" >&2; exit 2; }
done
mkdir -p "$OUT" "$W" "$W/pids"
# a rerun in the same W resumes the regen files (more samples); everything else is fresh
rm -rf "$W"/pids/* "$W/eval" "$W/run" "$W"/run_*
# the files of precision $1: today's names for one precision, else suffixed _$1
ptag() { [ "$NPREC" -gt 1 ] && echo "_$1"; }
# pvar NAME P: the value of ${NAME_P} ("" when unset)
pvar() { local v="$1_$2"; echo "${!v:-}"; }
SETS="mt_bench humaneval gsm8k_heldout"
FAILED=0
T_ALL=$(date +%s.%N)
[ "$DEVICE" = cuda ] && nvidia-smi -L
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
CMDS="$W/commands.txt"; : > "$CMDS"
# step <label> <timeout s> <log> cmd...: runs cmd under timeout, logs, records the command
step() {
    local label=$1 tmo=$2 log=$3
    shift 3
    echo "$label: $*" >> "$CMDS"
    # timeout puts the command in its own process group: its pid is kept in
    # $W/pids/ while it runs so that an early exit can stop it (see cleanup)
    timeout -k 10 "$tmo" "$@" > "$log" 2>&1 &
    local tp=$!
    : > "$W/pids/$tp"
    wait $tp
    local rc=$?
    rm -f "$W/pids/$tp"
    [ $rc = 0 ] || { echo "!! $label: rc=$rc (log $log)"; tail -n 8 "$log"; }
    return $rc
}
pack() { for f in "$W"/regen_*.jsonl; do [ -f "$f" ] && head -n 5 "$f" > "$OUT/$(basename "$f" .jsonl).head.jsonl"; done
        local r runs=""
        for r in $(cd "$W" && ls -d run run_* 2>/dev/null); do runs="$runs ./$r/logs ./$r/metrics.jsonl ./$r/steps.jsonl"; done
        (cd "$W" && tar czf "$OUT/logs.tgz" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.dlc' \
          --exclude='*.jsonl' ./*.log ./commands.txt $runs ./eval 2>/dev/null); }
# stops the steps still running (timeout forwards the TERM to its command)
cleanup() { local f; for f in "$W"/pids/*; do [ -f "$f" ] && kill -TERM "${f##*/}" 2>/dev/null; rm -f "$f"; done; }
REPORTED=0
trap 'rc=$?; cleanup; [ $REPORTED = 1 ] || report; pack; exit $rc' EXIT
trap 'exit 143' TERM INT

# ---- d) report: a table and $OUT/tau.json (also on an early exit: what exists so far) ----
report() {
    W="$W" OUT_JSON="$OUT/tau.json" SETS="$SETS" DEVICE="$DEVICE" MODEL="$MODEL" T_ALL="$T_ALL" \
    N_GSM="${N_GSM:-0}" N_SGPT="${N_SGPT:-0}" N_SYN="${N_SYN:-0}" REGEN_WALL="${REGEN_WALL:-0}" \
    REGEN_BATCH="$REGEN_BATCH" REGEN_MAX_NEW="$REGEN_MAX_NEW" REGEN_S="$REGEN_S" TRAIN_WALL="${TRAIN_WALL:-0}" \
    CKPT="${CKPT:-}" MAX_STEPS="${MAX_STEPS:-0}" EPOCHS="$EPOCHS" TOKEN_BUDGET="$TOKEN_BUDGET" BLOCK="$BLOCK" \
    ANCHORS="$ANCHORS" DRAFTER_LAYERS="$DRAFTER_LAYERS" LR="$LR" TRAIN_PRECISIONS="$TRAIN_PRECISIONS" \
    python3 scripts/gpu_tau_report.py
}

# ---- prompt sets: GSM8K split into a regen part and a held-out eval part --------
NGSM=$(wc -l < "$GSM")
head -n $((NGSM - GSM_HOLD)) "$GSM" > "$W/gsm_train.jsonl"
# GSM8K_SHARDS regen processes over interleaved shards (regen is host-bound: the
# logits of every sequence come to the host each step, so more processes use more cores)
for ((i = 0; i < GSM8K_SHARDS; i++)); do
    awk -v n="$GSM8K_SHARDS" -v i="$i" '(NR - 1) % n == i' "$W/gsm_train.jsonl" > "$W/gsm_train_$i.jsonl"
done
tail -n "$GSM_HOLD" "$GSM" > "$W/gsm_heldout.jsonl"
set_file() { case $1 in mt_bench) echo "$MTB";; humaneval) echo "$HEV";; gsm8k_heldout) echo "$W/gsm_heldout.jsonl";; esac; }
mkdir -p "$W/eval"
EV_COMMON="--target-model $MODEL $DEV --max-new-tokens $EVAL_MAX_NEW --drafter-layers $DRAFTER_LAYERS --block-size $BLOCK --seed $SEED"

# ---- a) regen (GSM8K || ShareGPT || synthetic) || random-drafter eval ----------------
echo "== a) regen ($DEVICE, ${REGEN_S}s budget, batch $REGEN_BATCH, max new $REGEN_MAX_NEW) + random-drafter tau"
RG_COMMON="--target-model $MODEL $DEV --batch $REGEN_BATCH --max-new-tokens $REGEN_MAX_NEW --max-ctx $REGEN_CTX --max-seconds $REGEN_S"
T_A=$(now)
P1=
for ((i = 0; i < GSM8K_SHARDS; i++)); do
    step regen_gsm8k_$i $((REGEN_S + 40)) "$W/regen_gsm8k_$i.log" $DL regen $RG_COMMON --data "$W/gsm_train_$i.jsonl" \
        --out "$W/regen_gsm8k_$i.jsonl" &
    P1="$P1 $!"
done
step regen_sharegpt $((REGEN_S + 40)) "$W/regen_sharegpt.log" $DL regen $RG_COMMON --data "$SGPT" \
    --out "$W/regen_sharegpt.jsonl" &
P2=$!
P4=
if [ "${SYNTH:-1}" != 0 ]; then
    python3 scripts/synth_prompts.py "$W/synth_prompts.jsonl" ${SYNTH_N:-} 2>/dev/null
    step regen_synth $((REGEN_S + 40)) "$W/regen_synth.log" $DL regen $RG_COMMON --data "$W/synth_prompts.jsonl" \
        --out "$W/regen_synth.jsonl" &
    P4=$!
fi
(
    rc=0
    for s in $SETS; do
        step "eval_random_$s" $((EVAL_SET_S + 30)) "$W/eval_random_$s.log" $DL eval $EV_COMMON --drafter random \
            --data "$(set_file $s)" --num-prompts "$EVAL_N" --no-baseline --timing-repeats 1 \
            --max-seconds "$EVAL_SET_S" --json "$W/eval/random_$s.json" || rc=1
    done
    exit $rc
) &
P3=$!
for p in $P1; do wait $p || FAILED=1; done
wait $P2 || FAILED=1
[ -n "$P4" ] && { wait $P4 || FAILED=1; }
REGEN_WALL=$(since "$T_A")
wait $P3 || FAILED=1
PHASE_A=$(since "$T_A")
# a timeout kill may leave a partial last line: regen itself truncates it (--limit 0 does nothing else)
for f in $(cd "$W" && ls regen_*.jsonl 2>/dev/null | sed 's/\.jsonl$//'); do
    [ -f "$W/$f.jsonl" ] && $DL regen --data "$GSM" --out "$W/$f.jsonl" --limit 0 > /dev/null 2>&1
done
N_GSM=$(cat "$W"/regen_gsm8k_*.jsonl 2>/dev/null | wc -l)
N_SGPT=$(cat "$W/regen_sharegpt.jsonl" 2>/dev/null | wc -l)
N_SYN=$(cat "$W/regen_synth.jsonl" 2>/dev/null | wc -l)
cat "$W"/regen_gsm8k_*.jsonl "$W/regen_sharegpt.jsonl" "$W/regen_synth.jsonl" > "$W/train.jsonl" 2>/dev/null
grep -h "regen done\|max-seconds" "$W"/regen_*.log
echo "regenerated: $N_GSM GSM8K + $N_SGPT ShareGPT + $N_SYN synthetic samples in ${REGEN_WALL}s (phase a ${PHASE_A}s)"
[ "$N_GSM" -gt 0 ] || { echo "!! no regenerated samples"; exit 1; }

# ---- b) train: one drafter per precision, the same data, seed, steps and flags ----------
MAX_STEPS=$(python3 -c "print(max(1, int($TRAIN_S * $TRAIN_TOK_S / $TOKEN_BUDGET)))")
# train_one P: `draftline run` of precision P into $W/run$(ptag P); exports TRAIN_WALL_P,
# CKPT_P (the latest checkpoint, "" when none) for the report
train_one() {
    local p=$1 t
    t=$(ptag "$p")
    local prec_flag=""
    [ "$p" = bf16 ] || prec_flag="--target-precision $p"
    echo "== b) draftline run ($TOPO${prec_flag:+ $prec_flag}): up to $MAX_STEPS steps (= ${TRAIN_S}s at an assumed $TRAIN_TOK_S tok/s), <= $EPOCHS epochs"
    rm -rf "$W/run$t"
    local t0 rc=0
    t0=$(now)
    step "train$t" $((TRAIN_S + 60)) "$W/train$t.log" $DL run --target-model "$MODEL" --data "$W/train.jsonl" $TOPO \
        --out "$W/run$t" --token-budget "$TOKEN_BUDGET" --block-size "$BLOCK" --num-anchors "$ANCHORS" \
        --drafter-layers "$DRAFTER_LAYERS" --lr "$LR" --warmup-steps "$WARMUP" --epochs "$EPOCHS" \
        --max-steps "$MAX_STEPS" --save-every "$SAVE_EVERY" --seed "$SEED" --progress-every 10 $prec_flag $TRAIN_EXTRA || rc=1
    local wall latest ck=""
    wall=$(since "$t0")
    grep -E "^summary|^checkpoint|capped|GPU mode" "$W/train$t.log"
    latest=$(cat "$W/run$t/checkpoints/latest" 2>/dev/null)
    [ -n "$latest" ] && [ -f "$W/run$t/checkpoints/$latest/config.json" ] && ck="$W/run$t/checkpoints/$latest"
    export "TRAIN_WALL_$p=$wall" "CKPT_$p=$ck"
    if [ -z "$ck" ]; then echo "!! no checkpoint in $W/run$t"; return 1; fi
    echo "trained drafter${t:+ ($p)}: $ck (${wall}s wall)"
    return $rc
}
for p in $TRAIN_PRECISIONS; do train_one "$p" || FAILED=1; done
TRAIN_WALL=$(pvar TRAIN_WALL "$FIRST_PREC")
CKPT=$(pvar CKPT "$FIRST_PREC")
ANY=0
for p in $TRAIN_PRECISIONS; do [ -n "$(pvar CKPT "$p")" ] && ANY=1; done
[ $ANY = 1 ] || exit 1

# ---- c) trained-drafter eval ---------------------------------------------------------
# tau on exactly the prompts the random drafter got (same --num-prompts, no time
# limit), against the bf16 target whatever the drafter was trained on; then one timing
# run (first precision's drafter): TIMING_SET's first TIMING_N prompts with
# target-only decoding too (greedy check, speedup, --timing-repeats EVAL_REPEATS).
if [ "$NPREC" -gt 1 ]; then echo "== c) eval of the drafters trained on ${TRAIN_PRECISIONS// /, } features, against the bf16 target"
else echo "== c) eval of $CKPT"; fi
# (tau does not depend on timing: every set of every precision runs concurrently on the GPU)
PIDS=
for p in $TRAIN_PRECISIONS; do
    ck=$(pvar CKPT "$p")
    [ -n "$ck" ] || continue
    t=$(ptag "$p")
    for s in $SETS; do
        n=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['prompts'])" "$W/eval/random_$s.json" 2>/dev/null || echo "$EVAL_N")
        step "eval_trained${t}_$s" $((EVAL_SET_S * 2 + 30)) "$W/eval_trained${t}_$s.log" $DL eval $EV_COMMON --drafter "$ck" \
            --data "$(set_file $s)" --num-prompts "$n" --no-baseline --timing-repeats 1 \
            --json "$W/eval/trained${t}_$s.json" &
        PIDS="$PIDS $!"
    done
done
for p in $PIDS; do wait $p || FAILED=1; done
for p in $TRAIN_PRECISIONS; do
    t=$(ptag "$p")
    for s in $SETS; do grep -E "^tau" "$W/eval_trained${t}_$s.log" 2>/dev/null | sed "s/^/  $s${t:+ ($p)}: /"; done
done
if [ -n "$CKPT" ]; then
    step "eval_timing_$TIMING_SET" $((TIMING_S + 40)) "$W/eval_timing.log" $DL eval $EV_COMMON --drafter "$CKPT" \
        --data "$(set_file $TIMING_SET)" --num-prompts "$TIMING_N" --timing-repeats "$EVAL_REPEATS" \
        --max-seconds "$TIMING_S" --json "$W/eval/timing.json" || FAILED=1
    grep -E "^eval|^tau|^decode|^greedy|^stopped" "$W/eval_timing.log" | sed "s/^/  timing: /"
else
    echo "!! no timing run: the $FIRST_PREC drafter has no checkpoint"
fi
REPORTED=1
report || FAILED=1
echo "FAILED=$FAILED"
exit $FAILED
