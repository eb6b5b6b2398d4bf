#!/usr/bin/env bash
# Issue 21, the script target, on a host of 2 alike GPUs in one call (cold caches): `jaxfit tune
# --script` of this repository's scripts/train.py gpt_small (bfloat16, global batch 64, fraction
# 0.0706, --axis=--remat=none,full; each candidate measured in a fresh process of the script running
# its pinned program) against the exhaustive grid of plain runs of the same script (every remat x
# every micro-batch dividing 64, each a fresh `scripts/train.py --batch-size 64 --grad-accum-steps
# A --remat R` timed by the same hook):
#   GPU 0: the tune, then the grid's remat=full micro-batches 16..1
#   GPU 1: the grid's remat=none half, then the remat=full half's 64 and 32
# The grid's wall time is the sum of its points (what it takes on one card). From the repository
# root on the GPU machine (tyro and wandb wheels carried in .whl):
#   OUT=$OUT LIMIT_S=470 bash benchmarks/tune_script_x2.sh
# MEASURE=inline: the tune times each proof in the script's probe (--measure inline), then its
# fastest rows in fresh processes of the script (default: process, as --measure auto does).
# REMAT=none: the tune of remat none alone. TUNE_ONLY_GPU=N: only the tune, on GPU N (the grid
# measured in another call, or the other GPU
# busy with other work).
# Returns $OUT/all.tgz (a device call brings back at most 8 files).
set -uo pipefail
FINAL=${OUT:-/tmp/tune-script}
LIMIT=${LIMIT_S:-470}
OUT=/tmp/tune-script-sides
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt, bench_side
mkdir -p "$FINAL"
BENCH_COMMON=(run --script-config gpt_small --global-batch 64 --fraction 0.0706 --precision bfloat16)
TUNE=(tune --remat "${REMAT:-none,full}" --skip-grid --tune-arg="--measure=${MEASURE:-process}")
if [ -n "${TUNE_ONLY_GPU:-}" ]; then
  bench_side "$TUNE_ONLY_GPU" "${TUNE[@]}"
else
  (bench_side 0 "${TUNE[@]}"; bench_side 0 grid-full-a --remat full --skip-tune --grid-micro 16,8,4,2,1) &
  (bench_side 1 grid-none --remat none --skip-tune; bench_side 1 grid-full-b --remat full --skip-tune --grid-micro 64,32) &
  wait
fi
[ -f "$OUT/tune/raw.jsonl" ] && python3 benchmarks/bench_tune.py tune "$OUT/tune"
compgen -G "$OUT/grid-*" >/dev/null && python3 benchmarks/bench_tune.py grid "$OUT"/grid-*
(cd "$OUT" && tar --exclude='*.png' -czf "$FINAL/all.tgz" .)
