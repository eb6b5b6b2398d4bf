#!/usr/bin/env bash
# Issue 21: after the fix (a script's probe times the step on the script's own batch, repeated to
# the program's size), the probe's rate against a fresh pinned process of the same program, for
# three rows of scripts/train.py gpt_small bf16 at fraction 0.0706 (global batch 64): remat none
# 8 x 8 (with the zeros variant: the same state on zero tokens), remat none 4 x 16, remat full
# 16 x 4. One GPU, one call, one row after the other. From the repository root on the GPU machine:
#   OUT=$OUT LIMIT_S=400 bash benchmarks/probe_speed_rows_x1.sh
set -uo pipefail
FINAL=${OUT:-/tmp/probe-speed-rows}
LIMIT=${LIMIT_S:-400}
OUT=/tmp/probe-speed-rows-sides
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt, probe_side
mkdir -p "$FINAL"
probe_side none-8x8 --ways probe,pinned --remat none --accum 8 --variants zeros,again
probe_side none-4x16 --ways probe,pinned --remat none --accum 16
probe_side full-16x4 --ways probe,pinned --remat full --accum 4
(cd "$OUT" && tar -czf "$FINAL/all.tgz" .)
