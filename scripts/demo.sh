#!/usr/bin/env bash
# `make demo` (the Makefile has already checked deps, fetched the embedded model and
# built bin/ with DL_BIN_DIR set): trains a DFlash drafter for SmolLM2-135M-Instruct
# on GSM8K with the multi-process pipeline (loader -> target -> drafter -> optimizer),
# then prints where the drafter checkpoint is and inspects it.
#
# CPU defaults (README "Demo"): 1 target + 1 drafter process, 1 drafter layer,
# block size 8, 16 anchors per sequence, 1024-token micro-batches, lr 1e-3 with
# 3 warmup steps, 60 steps. Override with DL_DEMO_STEPS / DL_DEMO_OUT.
set -euo pipefail
BIN="${DL_BIN_DIR:-bin}"
DATA="${DL_SHARED_DATA:-../shared/data}/gsm8k/train.jsonl"
STEPS="${DL_DEMO_STEPS:-60}"
OUT="${DL_DEMO_OUT:-runs/demo-$(date -u +%Y%m%d-%H%M%S)}"

[ -f "$DATA" ] || { echo "demo: $DATA not found (set DL_SHARED_DATA)" >&2; exit 1; }
# GPU when the build has CUDA and a GPU answers (target and drafter processes share GPU 0),
# else CPU. Same drafter shape on both; the GPU run takes bigger micro-batches.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
   "$BIN/draftline" version | grep -q cuda; then
  echo "demo: GPU found: target and drafter processes on GPU 0"
  WHERE=(--target-gpus 0 --drafter-gpus 0 --token-budget 8192 --num-anchors 64)
else
  echo "demo: no GPU (or a CPU-only build): 1 target + 1 drafter process on CPU"
  WHERE=(--device cpu --targets 1 --drafters 1 --token-budget 1024 --num-anchors 16)
fi

start=$(date +%s)
"$BIN/draftline" run "${WHERE[@]}" \
  --data "$DATA" --prompt-field question --response-field answer \
  --drafter-layers 1 --block-size 8 \
  --lr 1e-3 --warmup-steps 3 --max-steps "$STEPS" --save-every 30 \
  --seed 0 --out "$OUT"
end=$(date +%s)

ckpt="$OUT/checkpoints/$(cat "$OUT/checkpoints/latest")"
echo
echo "demo: trained in $((end - start)) s; drafter checkpoint: $ckpt"
echo "      (model.safetensors + config.json in the DFlash layout; state.bin, cursor.bin to --resume)"
if "$BIN/draftline" --help 2>/dev/null | grep -qE '^ +inspect '; then
  "$BIN/draftline" inspect "$ckpt"
fi
