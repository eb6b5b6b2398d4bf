#!/usr/bin/env bash
# Issue 21 on a host of 4 alike GPUs, in one call: `jaxfit tune` against the exhaustive grid of
# plain runs, each side alone on a GPU of its own, all four at once:
#   GPU 0: jaxfit tune with fresh measuring processes (--measure process)
#   GPU 1: jaxfit tune --measure inline (timed in the compile process that proved the program)
#   GPU 2: the grid's remat=none half       GPU 3: the grid's remat=full half
# The grid's wall time is the sum of its two halves (what it takes on one card); each tune's is its
# own. Every side has a cold cache. Usage, from the repository root on the GPU machine (wheels of
# tyro and wandb carried in .whl):
#   OUT=$OUT bash benchmarks/tune_vs_grid_x4.sh [EXAMPLE GLOBAL_BATCH FRACTION PRECISION]
# default: gpt-small 64 0.0706 bfloat16 (benchmarks/JOURNAL.md section 6's question).
# Everything it writes ends up in $OUT/all.tgz (a device call brings back at most 8 files).
set -uo pipefail
EXAMPLE=${1:-gpt-small}
GLOBAL=${2:-64}
FRACTION=${3:-0.0706}
PRECISION=${4:-bfloat16}
OUT=${OUT:-/tmp/tune-x4}
LIMIT=${LIMIT_S:-560}
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt
common=(run --example "$EXAMPLE" --global-batch "$GLOBAL" --fraction "$FRACTION" --precision "$PRECISION")
side() {  # GPU NAME ARGS...
  local gpu=$1 name=$2
  shift 2
  mkdir -p "$OUT/$name"
  (CUDA_VISIBLE_DEVICES=$gpu timeout --signal=TERM --kill-after=10 "$LIMIT" \
    python3 benchmarks/bench_tune.py "${common[@]}" --out "$OUT/$name" "$@" >"$OUT/$name/bench.log" 2>&1
   echo "$name exit $? after $SECONDS s" | tee -a "$OUT/sides.txt") &
}
side 0 tune-process --remat none,full --skip-grid --tune-arg=--measure=process
side 1 tune-inline --remat none,full --skip-grid --tune-arg=--measure=inline
side 2 grid-none --remat none --skip-tune
side 3 grid-full --remat full --skip-tune
wait
for name in tune-process tune-inline; do
  python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).read().splitlines()[-1]); t=r.get("tune") or {}; b=t.get("best") or {}; print(sys.argv[2], "wall", r.get("tune_wall_s"), "phases", t.get("phase_seconds"), "best", b.get("setting"), b.get("micro_batch"), "x", b.get("accum_steps"), round(b.get("samples_per_second") or 0, 1))' "$OUT/$name/raw.jsonl" "$name" 2>&1
done
python3 benchmarks/bench_tune.py grid "$OUT/grid-none" "$OUT/grid-full"
# At most 8 files come back from a device call: everything goes back as one archive (PNGs left out).
(cd "$OUT" && tar --exclude='*.png' -czf /tmp/tune-x4.tgz . && find . -mindepth 1 -delete && mv /tmp/tune-x4.tgz all.tgz)
