#!/usr/bin/env bash
# Issue 14 on one H200 in one device call: the kernel tests that gate the drafter's CUDA path,
# the op and drafter-step benchmarks, and the 40-step reference run (start-up, steady, wall).
#
# usage (repo root on the GPU machine, bundle/ unpacked with the stage programs, the
# gpu tests and bench_ops/bench_drafter; the reference data at $LONG):
#   [OUT=dir] [LONG=gpucarry/long.dlc] [W=/tmp/perf] [CHUNKS="128 256"] [QUICK=1] [VS=1]
#   bash scripts/gpu_perf.sh
# (CHUNKS: bench_drafter again with each --loss-chunk, step time and memory; QUICK=1: no
# bench_ops; VS=1: the PyTorch comparison instead of steps 4 and 5, see 5)
# Steps (each printed with its rc and the time since the start):
#   1. draftline mkmodel --config qwen3-8b into $W/q8, in the background (45 s);
#   2. bundle/tests/gpu_test_ops_cuda (every block-attention variant and the fused q/k norm +
#      RoPE against the CPU), gpu_test_drafter_cuda, gpu_test_carryover_cuda,
#      gpu_test_pipeline_gpu (on $DLC, the GSM8K cache, where the bundle has no embedded
#      model; each 120 s at most, the pipeline test 240) -> $OUT/tests.txt;
#   3. bench_ops --quick (block attention per variant, q/k norm + RoPE fused vs separate)
#      -> $OUT/bench_ops.txt; bench_drafter --reps 3 --profile -> $OUT/bench_drafter.txt;
#   4. the disk the checkpoints go to ($W): 4 GiB written with fsync by dd, one stream
#      buffered, one stream O_DIRECT, four O_DIRECT streams at once -> in the output;
#   5. draftline run on the reference work (8 x 4096 tokens, 512 anchors, block 16, 5-layer
#      drafter, 40 steps, 1 GPU: the flags of bench/vs_pytorch.sh's ref phase, without the
#      PyTorch side) -> its summary line, the stages' start-up lines, $OUT/ref40.logs.tgz.
#      VS=1 instead: bench/vs_pytorch.sh on the model of step 1 (its files under $OUT/vs: the
#      issue's `vs-pytorch steady X wall Y` line), about 330 s: with QUICK=1 the whole call
#      fits one 600 s device call (about 420 s on a warm machine).
# About 330 s on a warm machine with the model made in the background. The device tool
# brings back at most 8 files: this writes at most 7 (tests.txt, bench_ops.txt,
# bench_drafter.txt, ref40.out and ref40.logs.tgz, or vs/ with 3) besides what the caller tees.
set -u
OUT=${OUT:-/tmp/perf-out}; LONG=${LONG:-gpucarry/long.dlc}; W=${W:-/tmp/perf}
DLC=${DLC:-gpucarry/gsm8k.dlc}
mkdir -p "$OUT" "$W"
T0=$(date +%s)
el() { echo "+$(( $(date +%s) - T0 ))s"; }
[ -d bundle ] && [ -f bundle/env.sh ] || { echo "gpu_perf.sh: no bundle/ here (make bundle, unpack it)" >&2; exit 2; }
. bundle/env.sh
export NCCL_NVLS_ENABLE=0
M=$W/q8
(bundle/bin/draftline mkmodel --config qwen3-8b --out "$M" > "$W/mkmodel.txt" 2>&1
 echo "mkmodel rc=$? $(el)" > "$W/mkmodel.rc") &
MK=$!
: > "$OUT/tests.txt"
for t in gpu_test_ops_cuda gpu_test_drafter_cuda gpu_test_carryover_cuda gpu_test_pipeline_gpu; do
    if [ -x "bundle/tests/$t" ]; then
        lim=120; [ $t = gpu_test_pipeline_gpu ] && lim=240
        echo "=== $t" >> "$OUT/tests.txt"
        DL_TEST_DLC=$DLC timeout $lim "bundle/tests/$t" > "$W/$t.txt" 2>&1
        rc=$?
        cat "$W/$t.txt" >> "$OUT/tests.txt"
        echo "$t rc=$rc $(el)"
        grep -E "PASSED|FAILED" "$W/$t.txt" | head -4
    else
        echo "$t: not in the bundle"
    fi
done
if [ -z "${QUICK:-}" ]; then
    timeout 120 bundle/bench/bench_ops --quick > "$OUT/bench_ops.txt" 2>&1
    echo "bench_ops rc=$? $(el)"
    grep -iE "qk norm|block attention|rmsnorm|xent" "$OUT/bench_ops.txt"
fi
timeout 90 bundle/bench/bench_drafter --reps 3 --profile > "$OUT/bench_drafter.txt" 2>&1
echo "bench_drafter rc=$? $(el)"
grep -E "^step|variant|GiB|attention|rmsnorm|rope" "$OUT/bench_drafter.txt" | head -12
for k in ${CHUNKS:-}; do   # other loss chunks (blocks), appended to bench_drafter.txt
    echo "=== --loss-chunk $k" >> "$OUT/bench_drafter.txt"
    timeout 90 bundle/bench/bench_drafter --reps 3 --loss-chunk "$k" >> "$OUT/bench_drafter.txt" 2>&1
    echo "bench_drafter --loss-chunk $k rc=$? $(el)"
    grep -A1 "^=== --loss-chunk $k" -A30 "$OUT/bench_drafter.txt" | grep -E "^step|GiB"
done
if [ -z "${VS:-}" ]; then
    for mode in "" "oflag=direct" ; do
        rm -f "$W/dd.bin"; sync
        echo "disk, 1 stream ${mode:-buffered}: $(dd if=/dev/zero of="$W/dd.bin" bs=64M count=64 $mode conv=fsync 2>&1 | tail -1)"
    done
    rm -f "$W"/dd*.bin; sync
    t0=$(date +%s.%N)
    dds=""
    for k in 1 2 3 4; do dd if=/dev/zero of="$W/dd$k.bin" bs=64M count=16 oflag=direct conv=fsync 2>/dev/null & dds="$dds $!"; done
    wait $dds
    python3 -c "import sys; t=float(sys.argv[2])-float(sys.argv[1]); print('disk, 4 O_DIRECT streams: 4 GiB in %.2f s, %.2f GB/s' % (t, 4*2**30/t/1e9))" "$t0" "$(date +%s.%N)"
    rm -f "$W"/dd*.bin
fi
wait $MK
cat "$W/mkmodel.rc"
if [ -n "${VS:-}" ]; then   # the PyTorch comparison on the model made above (its own draftline run)
    mkdir -p "$OUT/vs"
    MODEL=$M OUT=$OUT/vs W=$W/vs LONG=$LONG BUDGET_S=${VS_BUDGET_S:-330} bash bench/vs_pytorch.sh
    echo "vs_pytorch rc=$? $(el)"
    echo "total $(el)"
    exit 0
fi
R="--target-model $M --data $LONG --target-gpus 0 --drafter-gpus 0 --threads 8 --inbox-gb 6"
R="$R --token-budget 32768 --max-len 4096 --num-anchors 512 --block-size 16 --drafter-layers 5"
R="$R --micro-batches-per-step 1 --max-steps 40 --epochs 2 --progress-every 5"
rm -rf "$W/ref40"
timeout 260 bundle/bin/draftline run $R --out "$W/ref40" > "$OUT/ref40.out" 2>&1
echo "ref40 rc=$? $(el)"
grep -E "^summary|^checkpoint" "$OUT/ref40.out"
grep -h "start-up\|loaded in\| dead\|micro-batches computed\|the first" "$W"/ref40/logs/*.log | cut -c1-230 | head -9
(cd "$W/ref40" && tar czf "$OUT/ref40.logs.tgz" logs steps.jsonl run.json 2>/dev/null)
echo "total $(el)"
