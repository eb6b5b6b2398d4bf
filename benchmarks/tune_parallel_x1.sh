#!/usr/bin/env bash
# Issue 21 on one GPU, in one call (cold caches), one side after the other:
#   1. `jaxfit tune --script` of scripts/train.py gpt_small (bf16, global batch 64, fraction 0.0706,
#      --axis=--remat=none,full, measured in fresh processes) with --parallel=4: the settings'
#      searches and each setting's proofs side by side, several probes of the script on the GPU;
#   2. the grid's two leading points of section 32 (remat none 8 x 8 and 4 x 16), fresh plain
#      runs, for the winner's rate on the same card;
#   3. benchmarks/probe_speed.py: remat none 8 x 8 timed in the script's probe, in a fresh pinned
#      process and in a fresh plain one (PROBE_FLAGS: XLA flags for a second variant of it).
# The whole grid (14 points, 602 s on an H200 in section 32) does not fit in one call beside these.
# From the repository root on the GPU machine (tyro and wandb wheels carried in .whl):
#   OUT=$OUT LIMIT_S=560 bash benchmarks/tune_parallel_x1.sh
set -uo pipefail
FINAL=${OUT:-/tmp/tune-parallel-x1}
LIMIT=${LIMIT_S:-560}
OUT=/tmp/tune-parallel-x1-sides
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt, bench_side
mkdir -p "$FINAL"
BENCH_COMMON=(run --script-config gpt_small --global-batch 64 --fraction 0.0706 --precision bfloat16)
bench_side 0 tune-parallel --remat none,full --skip-grid --tune-arg=--measure=process --tune-arg=--parallel=4
[ -f "$OUT/tune-parallel/raw.jsonl" ] && python3 benchmarks/bench_tune.py tune "$OUT/tune-parallel"
bench_side 0 grid-top --remat none --skip-tune --grid-micro 8,4
compgen -G "$OUT/grid-*" >/dev/null && python3 benchmarks/bench_tune.py grid "$OUT"/grid-*
probe() {  # probe LABEL [XLA flags]: benchmarks/probe_speed.py within the call's limit
  local left=$((LIMIT - SECONDS))
  if [ "$left" -lt 100 ]; then echo "probe $1 skipped: $left s left" | tee -a "$OUT/sides.txt"; return; fi
  timeout --signal=TERM --kill-after=10 "$left" python3 benchmarks/probe_speed.py --out "$OUT/probe" \
    --label "$1" ${2:+--xla-flags="$2"} 2>&1 | tee -a "$OUT/probe.log" | grep -v '^\s*$' | tail -n 4
  echo "probe $1 exit ${PIPESTATUS[0]} after $SECONDS s" | tee -a "$OUT/sides.txt"
}
probe default
[ -n "${PROBE_FLAGS:-}" ] && probe flags "$PROBE_FLAGS"
(cd "$OUT" && tar --exclude='*.png' -czf "$FINAL/all.tgz" .)
