#!/usr/bin/env bash
# Issue 21: is the tune's pinned winner slower than the process's own compile?
# benchmarks/pin_speed.py for scripts/train.py gpt_small (bf16, global batch 64, remat none,
# fraction 0.0706): the row that ran 4-7 % slow pinned (micro-batch 8 x 8 accumulations) and a
# row that matched its grid point (4 x 16: --accum 16), each in pairs of plain and pinned fresh
# processes, alternating. On a host of 2 alike GPUs the two rows run side by side (GPU 0, GPU 1; 3
# pairs each); on one GPU one after the other (8 x 8: 3 pairs, then 4 x 16: 1 pair in the time
# left). Section 33 of benchmarks/JOURNAL.md has its one-GPU run. From the repository root on the GPU
# machine (wheels carried in .whl):
#   OUT=$OUT bash benchmarks/pin_speed_x2.sh
set -uo pipefail
FINAL=${OUT:-/tmp/pin-speed}
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt
mkdir -p /tmp/ps
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 480 python3 benchmarks/pin_speed.py --out /tmp/ps/accum8 --accum 8 >/tmp/ps/accum8.log 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 480 python3 benchmarks/pin_speed.py --out /tmp/ps/accum16 --accum 16 >/tmp/ps/accum16.log 2>&1 &
  wait  # the two sides (never pgrep for them: the call's own command line names them)
else
  timeout "${FIRST_S:-380}" python3 benchmarks/pin_speed.py --out /tmp/ps/accum8 --accum 8 >/tmp/ps/accum8.log 2>&1
  timeout "${SECOND_S:-170}" python3 benchmarks/pin_speed.py --out /tmp/ps/accum16 --accum 16 --pairs 1 >/tmp/ps/accum16.log 2>&1
fi
tail -n 3 /tmp/ps/accum8.log /tmp/ps/accum16.log
tar czf "$FINAL/all.tgz" -C /tmp ps
