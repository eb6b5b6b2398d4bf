#!/usr/bin/env bash
# Autotuned compiles side by side: one process (in turn, in threads) against one process each
# (issue 44; benchmarks/autotune_overlap.py says what each mode is).
#   OUT=$OUT bash benchmarks/overlap_x1.sh [EXAMPLE] [FRACTION]      (defaults: gpt-small 0.3)
# Writes $OUT/EXAMPLE-2.json (batches 19 20, every mode) and $OUT/EXAMPLE-4.json (19-22, procs and
# threads), with their logs.
set -uo pipefail
OUT=${OUT:-/tmp/overlap}
. "$(dirname "$0")/gpu_env.sh"
EXAMPLE=${1:-gpt-small}
FRACTION=${2:-0.3}
cd benchmarks || exit 2
timeout 280 python3 autotune_overlap.py --example "$EXAMPLE" --fraction "$FRACTION" --batches 19 20 \
  --out "$OUT/$EXAMPLE-2.json" 2>"$OUT/$EXAMPLE-2.err" | tee "$OUT/$EXAMPLE-2.log"
for MODE in procs threads; do
  timeout 200 python3 autotune_overlap.py "$MODE" --example "$EXAMPLE" --fraction "$FRACTION" --batches 19 20 21 22 \
    --out "$OUT/$EXAMPLE-4-$MODE.json" 2>"$OUT/$EXAMPLE-4-$MODE.err" | tee "$OUT/$EXAMPLE-4-$MODE.log"
done
