#!/usr/bin/env bash
# Issue 21, the script target, on a host of 4 alike GPUs in one call (cold caches): section 25's
# question (`jaxfit tune --script` of scripts/train.py gpt_small, bfloat16, global batch 64,
# fraction 0.0706, --axis=--remat=none,full) with each setting's proven programs timed in one fresh
# process (--one-process, the default), against the same tune with a process per row
# (--no-one-process) and the exhaustive grid of plain runs, all in the same call:
#   GPU 0: the tune (--one-process)
#   GPU 1: the tune with --no-one-process
#   GPU 2: the grid's remat=none half (7 points); GPU 3: its remat=full half (7 points)
# The grid's wall time is the sum of its points (what it takes on one card). From the repository
# root on the GPU machine (tyro and wandb wheels carried in .whl):
#   OUT=$OUT LIMIT_S=540 bash benchmarks/tune_script_x4.sh
# SECOND_NAME=tune-parallel SECOND_ARG=--parallel=4: GPU 1 runs the tune with that option instead.
# Returns $OUT/all.tgz (a device call brings back at most 8 files).
set -uo pipefail
FINAL=${OUT:-/tmp/tune-script-x4}
LIMIT=${LIMIT_S:-540}
OUT=/tmp/tune-script-x4-sides
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt, bench_side
mkdir -p "$FINAL"
SECOND_NAME=${SECOND_NAME:-tune-apart}
SECOND_ARG=${SECOND_ARG:---no-one-process}
BENCH_COMMON=(run --script-config gpt_small --global-batch 64 --fraction 0.0706 --precision bfloat16)
bench_side 0 tune --remat none,full --skip-grid --tune-arg=--measure=process &
bench_side 1 "$SECOND_NAME" --remat none,full --skip-grid --tune-arg=--measure=process --tune-arg="$SECOND_ARG" &
bench_side 2 grid-none --remat none --skip-tune &
bench_side 3 grid-full --remat full --skip-tune &
wait
for side in tune "$SECOND_NAME"; do
  [ -f "$OUT/$side/raw.jsonl" ] && python3 benchmarks/bench_tune.py tune "$OUT/$side"
done
compgen -G "$OUT/grid-*" >/dev/null && python3 benchmarks/bench_tune.py grid "$OUT"/grid-*
(cd "$OUT" && tar --exclude='*.png' -czf "$FINAL/all.tgz" .)
