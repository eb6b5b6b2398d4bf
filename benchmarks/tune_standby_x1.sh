#!/usr/bin/env bash
# Issue 21, the script target on one GPU with measuring processes on standby (--standby, the
# default since section 36): `jaxfit tune --script` of scripts/train.py gpt_small (bf16, global
# batch 64, fraction 0.0706, --axis=--remat=none,full), cold caches, then grid points (fresh plain
# runs of the script, timed by the same hook) in the call's time left.
#   SIDES: the tunes to run, in order, of
#     inline   --measure inline --parallel 5 (proofs timed in their probes, one wave; the fastest
#              row confirmed in a fresh process of the script, started on standby),
#     process  --measure process --parallel 4 (each setting's rows in one fresh process, on standby),
#     nostandby  as inline, with --no-standby (the fresh confirmation started after the proofs);
#   GRID: grid parts REMAT:MICRO,MICRO... (e.g. "none:64,32,16,8 full:64,32"), run after the tunes.
# From the repository root on the GPU machine (tyro wheels carried in .whl):
#   OUT=$OUT LIMIT_S=560 SIDES="inline process" GRID="none:8,4" bash benchmarks/tune_standby_x1.sh
set -uo pipefail
FINAL=${OUT:-/tmp/tune-standby-x1}
LIMIT=${LIMIT_S:-560}
OUT=/tmp/tune-standby-x1-sides
rm -rf "$OUT"  # the machine's /tmp may hold another call's files
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt, bench_side
mkdir -p "$FINAL"
# warm the file cache and the driver, so the first side does not pay what the others do not
python3 -c "import jax, flax, optax, orbax.checkpoint, tyro; jax.devices()" 2>&1 | tail -n 2
BENCH_COMMON=(run --script-config gpt_small --global-batch 64 --fraction 0.0706 --precision bfloat16)
INLINE=(--tune-arg=--measure=inline --tune-arg=--parallel=5)
for side in ${SIDES-inline process}; do
  case $side in
    inline) bench_side 0 tune-inline --remat none,full --skip-grid "${INLINE[@]}" ;;
    nostandby) bench_side 0 tune-nostandby --remat none,full --skip-grid "${INLINE[@]}" --tune-arg=--no-standby ;;
    process) bench_side 0 tune-process --remat none,full --skip-grid --tune-arg=--measure=process --tune-arg=--parallel=4 ;;
    *) echo "unknown side $side" | tee -a "$OUT/sides.txt"; continue ;;
  esac
  [ -f "$OUT/tune-$side/raw.jsonl" ] && python3 benchmarks/bench_tune.py tune "$OUT/tune-$side"
done
for part in ${GRID:-}; do
  remat=${part%%:*} micro=${part#*:}
  bench_side 0 "grid-$remat-${micro//,/-}" --remat "$remat" --skip-tune --grid-micro "$micro"
done
compgen -G "$OUT/grid-*" >/dev/null && python3 benchmarks/bench_tune.py grid "$OUT"/grid-*
(cd "$OUT" && tar --exclude='*.png' -czf "$FINAL/all.tgz" .)
