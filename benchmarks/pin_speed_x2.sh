#!/usr/bin/env bash
# Issue 21: is the tune's pinned winner slower than the process's own compile? On a host of 2 alike
# GPUs, benchmarks/pin_speed.py for scripts/train.py gpt_small (bf16, global batch 64, remat none,
# fraction 0.0706): GPU 0 the row that ran 4-7 % slow pinned (8 x 8), GPU 1 a row that matched its
# grid point (4 x 16), each 3 pairs of plain and pinned fresh processes, alternating. From the
# repository root on the GPU machine (wheels carried in .whl):
#   OUT=$OUT bash benchmarks/pin_speed_x2.sh
set -uo pipefail
FINAL=${OUT:-/tmp/pin-speed}
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt
mkdir -p /tmp/ps
CUDA_VISIBLE_DEVICES=0 timeout 480 python3 benchmarks/pin_speed.py --out /tmp/ps/accum8 --accum 8 >/tmp/ps/accum8.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 480 python3 benchmarks/pin_speed.py --out /tmp/ps/accum4 --accum 4 >/tmp/ps/accum4.log 2>&1 &
wait  # the two sides (never pgrep for them: the call's own command line names them)
tail -3 /tmp/ps/accum8.log /tmp/ps/accum4.log
tar czf "$FINAL/all.tgz" -C /tmp ps
