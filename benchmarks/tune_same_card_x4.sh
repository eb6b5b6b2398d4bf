#!/usr/bin/env bash
# Issue 21 on a host of 4 (or 2) alike GPUs, in one call (every side with a cold cache):
# HOST_GPUS=4 (all at once):
#   GPU 0: jaxfit tune (the default: --measure inline, proofs largest micro-batch first, a remat
#          setting proved only above what its twin without remat fits)
#   GPU 1: the grid's remat=none half          GPU 2: the grid's remat=full half
#   GPU 3: a script target whose loader sleeps 0.3 s a batch (tests/fixtures/shaped_train.py): does
#          the tune name the input as the limit, with --input-steps measured on a GPU; then
#          --rank-untuned with JAXFIT_UNTUNED_COMPILER_OPTIONS='{"xla_gpu_enable_triton_gemm": false}'
#          (do untuned programs with cuBLAS in place of default-tile Triton GEMMs run near the
#          proven ones?) until the call's limit
# HOST_GPUS=2: GPU 0 the tune, then the remat=full half's micro-batches 16..1; GPU 1 the grid's
#   remat=none half, then the remat=full half's 64 and 32: the whole grid and the tune in one call
#   (the slow-loader script ran on 2 H200s on 2026-11-28, results/h200x2/tune-same-card/)
# The grid's wall time is the sum of its two halves (what it takes on one card). From the
# repository root on the GPU machine (tyro and wandb wheels carried in .whl):
#   OUT=$OUT LIMIT_S=545 HOST_GPUS=4 bash benchmarks/tune_same_card_x4.sh
# default question: gpt-small bfloat16, global batch 64, fraction 0.0706 (benchmarks/JOURNAL.md
# section 6). Returns $OUT/all.tgz (a device call brings back at most 8 files).
set -uo pipefail
FINAL=${OUT:-/tmp/tune-same-card}
LIMIT=${LIMIT_S:-545}
HOST_GPUS=${HOST_GPUS:-4}
OUT=/tmp/tune-same-card-sides
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt, bench_side
mkdir -p "$FINAL"
BENCH_COMMON=(run --example gpt-small --global-batch 64 --fraction 0.0706 --precision bfloat16)
slow_loader() {  # GPU: jaxfit tune of a script whose loader sleeps 0.3 s a batch
  local start=$SECONDS
  mkdir -p "$OUT/script-slow-loader"
  (cd "$OUT/script-slow-loader" && CUDA_VISIBLE_DEVICES=$1 timeout --signal=TERM --kill-after=10 $((LIMIT - SECONDS)) \
    python3 -m jaxfit.cli tune --script --micro-batches 2 --max-batch 64 --mem-fraction 0.3 --batch-flag --bs \
    --json tune.json -- python3 "$REPO/tests/fixtures/shaped_train.py" --steps 12 --input-seconds 0.3 \
    >stdout.txt 2>tune.log)
  echo "script-slow-loader exit $? after $((SECONDS - start)) s" | tee -a "$OUT/sides.txt"
}
if [ "$HOST_GPUS" = 2 ]; then
  (bench_side 0 tune --remat none,full --skip-grid; bench_side 0 grid-full-a --remat full --skip-tune --grid-micro 16,8,4,2,1) &
  (bench_side 1 grid-none --remat none --skip-tune; bench_side 1 grid-full-b --remat full --skip-tune --grid-micro 64,32) &
else
  bench_side 0 tune --remat none,full --skip-grid &
  bench_side 1 grid-none --remat none --skip-tune &
  bench_side 2 grid-full --remat full --skip-tune &
  (
    slow_loader 3
    export JAXFIT_UNTUNED_COMPILER_OPTIONS='{"xla_gpu_enable_triton_gemm": false}'
    bench_side 3 tune-ranked-cublas --remat none,full --skip-grid --tune-arg=--rank-untuned
  ) &
fi
wait
for name in tune tune-ranked-cublas; do
  [ -f "$OUT/$name/raw.jsonl" ] && python3 benchmarks/bench_tune.py tune "$OUT/$name"
done
python3 benchmarks/bench_tune.py grid "$OUT"/grid-*
[ -f "$OUT/script-slow-loader/stdout.txt" ] && grep -hE "limited|input" "$OUT/script-slow-loader/stdout.txt" | head -5
(cd "$OUT" && tar --exclude='*.png' -czf "$FINAL/all.tgz" .)
