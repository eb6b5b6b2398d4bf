#!/usr/bin/env bash
# Four and eight untuned compiles a round, side by side on one GPU (issue 44): a cold `jaxfit fit` of
# a built-in example at each width, one after the other, each with a cache folder of its own.
#   OUT=$OUT bash benchmarks/width_x1.sh [EXAMPLE] [FRACTION]      (defaults: gpt-small 0.3)
# Writes $OUT/EXAMPLE-wW.json (the fit's JSON, with "phases") and .log for W in 4 8.
set -uo pipefail
OUT=${OUT:-/tmp/width}
. "$(dirname "$0")/gpu_env.sh"
EXAMPLE=${1:-gpt-small}
FRACTION=${2:-0.3}
for W in 4 8; do
  CACHE=$(mktemp -d /tmp/jaxfit-cold-XXXXXX)
  JAXFIT_CACHE_DIR=$CACHE timeout 280 python3 -m jaxfit.cli fit --example "$EXAMPLE" --mem-fraction "$FRACTION" \
    --width "$W" --json "$OUT/$EXAMPLE-w$W.json" > "$OUT/$EXAMPLE-w$W.log" 2>&1
  echo "width $W: exit $?"
  grep -E "round|compiles in" "$OUT/$EXAMPLE-w$W.log"
  rm -rf "$CACHE"
done
