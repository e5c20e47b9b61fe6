#!/usr/bin/env bash
# GPU pipeline runs of `draftline run` (issue 6), as made on the device machines.
#
# usage (repo root on the GPU machine, with the bundle unpacked in bundle/ and a
# prepared cache at $DATA):  bash scripts/gpu_pipeline.sh small|big
#   small: random-weight tiny-qwen3 and qwen3-0.6b (draftline mkmodel), 1 GPU
#          (target and drafter on GPU 0) and, when 2 GPUs are present, 2 GPUs
#          (target on 0, drafter on 1), then the memory bound: 3 target
#          processes sharing GPU 0 feeding 1 drafter on GPU 1 (GPU 0 alone on a
#          1-GPU machine) with a small --inbox-gb + --host-inbox-gb.
#   big:   a Qwen3-8B-shaped random target with a 5-layer drafter, 2 GPUs then 1.
#   smol:  the embedded SmolLM2 GGUF ($SMOL): 1 GPU, 2 GPUs, 3 targets -> 1 drafter bound.
#   ref:   the same target and drafter on the reference work (8 x 4096 tokens, 512
#          anchors per sequence, block 16) from long sequences ($LONG): 1 GPU, 2 GPUs
#          split, 2 GPUs each with a target and a drafter.
#   anchors: the reference work on 1 GPU at --num-anchors 512 and 1024 ($ANCHORS): one
#          drafter pass and two (issue 14 item 1).
# Each run: nvidia-smi sampling (utilization.gpu every 0.5 s) during the run, then
# scripts/gpu_pipeline_report.py (tokens/s, standalone stage rates, efficiency,
# waits, handle opens, inbox high water vs the bound, GPU busy %), one JSON line
# per run in $OUT/report.jsonl; the logs are packed into $OUT/logs.tgz.
set -u
cd "$(dirname "$0")/.."
. bundle/env.sh
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/gp-out}; W=${W:-/tmp/gp}; DATA=${DATA:-gpucarry/gsm8k.dlc}
mkdir -p "$OUT" "$W"
DL=bundle/bin/draftline
NGPU=$(nvidia-smi -L | wc -l)
nvidia-smi -L
FAILED=0

mk() { [ -f "$W/$1/config.json" ] || $DL mkmodel --config "$1" --out "$W/$1" > "$W/mk-$1.log" 2>&1; }

one() {  # label target-gpus drafter-gpus model timeout [run flags...]
    local label=$1 tg=$2 dg=$3 model=$4 tmo=$5
    shift 5
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu --format=csv,noheader,nounits -lms 500 \
        > "$W/$label.smi" 2>/dev/null &
    local smi=$!
    echo "== $label: draftline run --target-model $model --target-gpus $tg --drafter-gpus $dg $*"
    timeout "$tmo" $DL run --target-model "$W/$model" --data "$DATA" --target-gpus "$tg" \
        --drafter-gpus "$dg" --out "$W/$label" --progress-every 5 "$@" > "$W/$label.out" 2>&1
    local rc=$?
    kill $smi 2>/dev/null; wait $smi 2>/dev/null
    grep -E "^summary|^checkpoint|GPU mode" "$W/$label.out"
    python3 scripts/gpu_pipeline_report.py "$W/$label" "$W/$label.smi" "$label" | tee -a "$OUT/report.jsonl"
    local rrc=${PIPESTATUS[0]}
    if [ $rc != 0 ] || [ $rrc != 0 ]; then
        FAILED=1
        echo "!! $label: run rc=$rc report rc=$rrc"
        tail -n 15 "$W/$label.out"
        for f in "$W/$label"/logs/*.log; do echo "--- $f"; grep -E "ERROR|error|WARN" "$f" | head -5; tail -n 3 "$f"; done
    fi
    return $rc
}

pack() { (cd "$W" && tar czf "$OUT/logs.tgz" --exclude='*.safetensors' --exclude='*.bin' --exclude='data.dlc' \
          ./*.out ./*.smi ./*/logs ./*/metrics.jsonl ./*/steps.jsonl 2>/dev/null); }
trap pack EXIT

case "${1:-small}" in
small)
    mk tiny-qwen3; mk qwen3-0.6b
    one tiny_1gpu 0 0 tiny-qwen3 60 --token-budget 4096 --block-size 16 --num-anchors 16 \
        --micro-batches-per-step 2 --max-steps 20 --inbox-gb 0.25 || exit 1
    [ "$NGPU" -ge 2 ] && { one tiny_2gpu 0 1 tiny-qwen3 60 --token-budget 4096 --block-size 16 \
        --num-anchors 16 --micro-batches-per-step 2 --max-steps 20 --inbox-gb 0.25 || exit 1; }
    Q="--token-budget 16384 --block-size 16 --num-anchors 32 --drafter-layers 1 --micro-batches-per-step 4"
    one q06_1gpu 0 0 qwen3-0.6b 90 $Q --max-steps 30 --inbox-gb 2
    [ "$NGPU" -ge 2 ] && one q06_2gpu 0 1 qwen3-0.6b 90 $Q --max-steps 30 --inbox-gb 2
    D=0; [ "$NGPU" -ge 2 ] && D=1
    # memory bound: 3 targets -> 1 drafter; 2 GPU slots (0.07 GiB) + 1 host slot (0.04 GiB) of 32 MiB
    one q06_bound 0,0,0 $D qwen3-0.6b 90 $Q --max-steps 15 --inbox-gb 0.07 --host-inbox-gb 0.04
    ;;
q06)
    mk qwen3-0.6b
    Q="--token-budget 16384 --block-size 16 --num-anchors 32 --drafter-layers 1 --micro-batches-per-step 4"
    one q06_1gpu_t 0 0 qwen3-0.6b 40 $Q --max-steps 30 --inbox-gb 2
    [ "$NGPU" -ge 2 ] && one q06_2gpu_t 0 1 qwen3-0.6b 40 $Q --max-steps 30 --inbox-gb 2
    ;;
big)
    mk qwen3-8b
    B="--token-budget 32768 --block-size 16 --num-anchors 64 --drafter-layers 5 --micro-batches-per-step 2 --threads 8"
    # BIG_RUNS: which of 2gpu / 1gpu to make (default both; a 1-GPU machine skips 2gpu)
    for r in ${BIG_RUNS:-2gpu 1gpu}; do
        if [ $r = 2gpu ] && [ "$NGPU" -ge 2 ]; then one q8b_2gpu 0 1 qwen3-8b ${BIG_TIMEOUT:-200} $B --max-steps ${BIG_STEPS:-6} --inbox-gb 6; fi
        if [ $r = 1gpu ]; then one q8b_1gpu 0 0 qwen3-8b ${BIG_TIMEOUT:-200} $B --max-steps ${BIG_STEPS:-6} --inbox-gb 6; fi
    done
    ;;
ref)
    # the reference work of issue 6 (8 x 4096 tokens, 512 anchors per sequence, block 16,
    # one optimizer step per batch of each GPU's drafter) on long sequences ($LONG: bench/make_long_data.py
    # output prepared with `draftline prepare`): 1 GPU, 2 GPUs split (target 0, drafter 1)
    # and 2 GPUs each running a target and a drafter (gradients of drafter 1 read by the
    # optimizer on GPU 0 over NVLink)
    mk qwen3-8b
    LONG=${LONG:-gpucarry/long.dlc}
    R="--token-budget 32768 --max-len 4096 --block-size 16 --num-anchors 512 --drafter-layers 5 --threads 8 --inbox-gb 6"
    for r in ${REF_RUNS:-1gpu split mirror}; do
        case $r in
        1gpu) DATA=$LONG one ref_1gpu 0 0 qwen3-8b ${BIG_TIMEOUT:-200} $R --micro-batches-per-step 1 --max-steps ${BIG_STEPS:-16} ;;
        split) [ "$NGPU" -ge 2 ] && DATA=$LONG one ref_split 0 1 qwen3-8b ${BIG_TIMEOUT:-200} $R --micro-batches-per-step 1 --max-steps ${BIG_STEPS:-16} ;;
        mirror) [ "$NGPU" -ge 2 ] && DATA=$LONG one ref_mirror 0,1 0,1 qwen3-8b ${BIG_TIMEOUT:-200} $R --micro-batches-per-step 2 --max-steps ${BIG_STEPS:-16} ;;
        esac
    done
    ;;
anchors)
    # --num-anchors past one drafter pass (issue 14 item 1): the reference work on 1 GPU
    # with 512 anchors per sequence (4,096 blocks: one pass) and 1,024 (8,192 blocks: two
    # passes); the drafter log's pass line and its final count
    mk qwen3-8b
    LONG=${LONG:-gpucarry/long.dlc}
    R="--token-budget 32768 --max-len 4096 --block-size 16 --drafter-layers 5 --threads 8 --inbox-gb 6"
    for a in ${ANCHORS:-512 1024}; do
        DATA=$LONG one ref_a$a 0 0 qwen3-8b ${BIG_TIMEOUT:-240} $R --num-anchors $a --micro-batches-per-step 1 \
            --max-steps ${BIG_STEPS:-16}
        grep -hE "passes|micro-batches computed" "$W/ref_a$a/logs/drafter0.log" | head -3
    done
    ;;
smol)
    # the embedded SmolLM2-135M-Instruct GGUF ($SMOL) on GSM8K ($DATA prepared with its
    # tokenizer): 1 GPU, 2 GPUs (target 0, drafter 1), and the memory bound with 3 target
    # processes sharing GPU 0 feeding 1 drafter on GPU 1 (2 GPU slots + 1 host slot)
    ln -sf "$(readlink -f "${SMOL:?set SMOL to the SmolLM2 GGUF}")" "$W/smollm2.gguf"
    S="--token-budget 16384 --block-size 8 --num-anchors 32 --drafter-layers 2 --micro-batches-per-step 1"
    one smol_1gpu 0 0 smollm2.gguf 90 $S --max-steps 200 --inbox-gb 1
    [ "$NGPU" -ge 2 ] && one smol_2gpu 0 1 smollm2.gguf 90 $S --max-steps 200 --inbox-gb 1
    [ "$NGPU" -ge 2 ] && one smol_bound 0,0,0 1 smollm2.gguf 90 $S --max-steps 100 --inbox-gb 0.2 --host-inbox-gb 0.1
    ;;
esac
echo "FAILED=$FAILED"
