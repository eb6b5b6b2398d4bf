#!/usr/bin/env bash
# On one GPU, in one device call: a cold `jaxfit fit --example EXAMPLE --mem-fraction FRACTION --width 8`
# with this tree's jaxfit and with a baseline's (.before/, carried: `git archive REV jaxfit configs | tar -x -C .before`),
# one run each (this tree first), each with a cache folder of its own.
#   OUT=$OUT REV=825d286 bash benchmarks/before_after_x1.sh [EXAMPLE] [FRACTION] [RUNS]   (gpt-small 0.3 1)
# Writes $OUT/before-after/{after,before}-N.{json,log}, rows.jsonl and prints the table.
set -uo pipefail
OUT=${OUT:-/tmp/before-after-x1}
. "$(dirname "$0")/gpu_env.sh"
EXAMPLE=${1:-gpt-small}
FRACTION=${2:-0.3}
RUNS=${3:-1}
python3 benchmarks/before_after.py "${REV:?set REV to the baseline revision}" --runs "$RUNS" --before-src .before \
  --out "$OUT/before-after" -- --example "$EXAMPLE" --mem-fraction "$FRACTION" --width 8
