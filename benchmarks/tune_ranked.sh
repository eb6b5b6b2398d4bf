#!/usr/bin/env bash
# Issue 21 (and an issue-19 check beside it) in one device call, on 4 or 2 alike GPUs (HOST_GPUS=4|2):
#   HOST_GPUS=4: GPU 0 jaxfit tune --measure inline (micro-batches ranked on their untuned programs
#           first); GPU 1 the grid's remat=none half; GPU 2 its remat=full half; GPU 3 openpi
#   HOST_GPUS=2: GPU 0 the tune, then the grid's remat=none half (the tune's winner is one of its
#           points: the same card measures both); GPU 1 openpi; the remat=full half is not run
# openpi: pi05_libero for an 80 GiB card, fit 39-40, the answer run 3 steps pinned, then the plain
# next batch up (benchmarks/openpi/gpu_cells.sh; runs only where .openpi is carried).
# The grid's wall time is the sum of its halves (what it takes on one card). Every side has a
# cold cache. From the repository root on the GPU machine (tyro, wandb wheels carried in .whl):
#   OUT=$OUT HOST_GPUS=2 bash benchmarks/tune_ranked.sh [EXAMPLE GLOBAL_BATCH FRACTION PRECISION]
# default: gpt-small 64 0.0706 bfloat16 (benchmarks/JOURNAL.md section 6's question).
# Returns $OUT/tune.tgz (the tune and grid sides) and $OUT/openpi/all.tgz (the openpi cell).
set -uo pipefail
EXAMPLE=${1:-gpt-small}
GLOBAL=${2:-64}
FRACTION=${3:-0.0706}
PRECISION=${4:-bfloat16}
FINAL=${OUT:-/tmp/tune-ranked}
LIMIT=${LIMIT_S:-545}
OUT=/tmp/tune-ranked-sides
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt, bench_side
mkdir -p "$FINAL"
HOST_GPUS=${HOST_GPUS:-4}  # not GPUS: gpu_run.sh reads that as run --gpus
if [ -d .openpi ]; then
  (OUT="$FINAL/openpi" CELLS_DIR=/tmp/cells BUDGET_S=$((LIMIT - 15)) \
    bash benchmarks/openpi/gpu_cells.sh "$((HOST_GPUS - 1)) run pi05_libero 80GiB 39-40" >"$OUT/openpi-cells.log" 2>&1) &
fi
BENCH_COMMON=(run --example "$EXAMPLE" --global-batch "$GLOBAL" --fraction "$FRACTION" --precision "$PRECISION")
tune=(tune-ranked --remat none,full --skip-grid --tune-arg=--measure=inline --tune-arg=--rank-untuned)
if [ "$HOST_GPUS" = 2 ]; then
  (bench_side 0 "${tune[@]}"; bench_side 0 grid-none --remat none --skip-tune) &
else
  bench_side 0 "${tune[@]}" &
  bench_side 1 grid-none --remat none --skip-tune &
  bench_side 2 grid-full --remat full --skip-tune &
fi
wait
python3 benchmarks/bench_tune.py tune "$OUT/tune-ranked"
python3 benchmarks/bench_tune.py grid "$OUT/grid-none" "$OUT/grid-full"
(cd "$OUT" && tar --exclude='*.png' -czf "$FINAL/tune.tgz" .)
