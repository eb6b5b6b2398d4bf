#!/usr/bin/env bash
# Issue 21: why the script's probe times its proven step slower than a fresh process. One GPU, one
# call, benchmarks/probe_speed.py for scripts/train.py gpt_small bf16, remat none 8 x 8 (global
# batch 64), one variant after the other:
#   1. fraction 0.0706, the probe also timing the program again, reloaded from its serialized
#      form, from a new thread and on noise for every argument; then a fresh pinned process;
#   2. fraction 0.5 (no memory pressure): the probe (again, reloaded), then a fresh plain process;
#   3. fraction 0.0706 without command buffers (--xla_gpu_enable_command_buffer=, no CUDA graphs)
#      in the probe and a fresh plain process.
# From the repository root on the GPU machine (wheels carried in .whl):
#   OUT=$OUT LIMIT_S=540 bash benchmarks/probe_speed_x1.sh
set -uo pipefail
FINAL=${OUT:-/tmp/probe-speed-x1}
LIMIT=${LIMIT_S:-540}
OUT=/tmp/probe-speed-x1-sides
. "$(dirname "$0")/gpu_env.sh"  # the repository root, the carried wheels, $OUT/gpus.txt, probe_side
mkdir -p "$FINAL"
probe_side pressure --ways probe,pinned --variants again,reload,thread,noise
probe_side roomy --fraction 0.5 --ways probe,plain --variants again,reload
probe_side no-graphs --ways probe,plain --xla-flags=--xla_gpu_enable_command_buffer=
(cd "$OUT" && tar -czf "$FINAL/all.tgz" .)
