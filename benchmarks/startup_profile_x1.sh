#!/usr/bin/env bash
# Where a fresh process of scripts/train.py gpt_small spends its start-up on a GPU (issue 21: a
# script tune pays it once per probe and measuring process): the imports alone (python -X
# importtime), the device's initialisation, then one plain run of 3 steps at 8 x 8 under fraction
# 0.0706 with JAX_LOG_COMPILES=1, each output line stamped with the seconds since the run started.
# From the repository root on the GPU machine (tyro wheels carried in .whl):
#   OUT=$OUT bash benchmarks/startup_profile_x1.sh
set -uo pipefail
FINAL=${OUT:-/tmp/startup-profile}
OUT=$FINAL/startup
. "$(dirname "$0")/gpu_env.sh"
stamp() { python3 -c 'import sys, time
t0 = time.time()
for line in sys.stdin:
    print("%7.2f %s" % (time.time() - t0, line), end="", flush=True)'; }
python3 -X importtime -c "import jax, flax, optax, orbax.checkpoint, tyro" 2>"$OUT/importtime.txt"
python3 -c "import time; t = time.time(); import jax; a = time.time(); jax.devices(); b = time.time()
print('import jax %.2f s, jax.devices() %.2f s' % (a - t, b - a))" | tee "$OUT/devices.txt"
rm -rf /tmp/startup-ck
XLA_PYTHON_CLIENT_MEM_FRACTION=0.0706 JAX_LOG_COMPILES=1 python3 -u scripts/train.py gpt_small --precision=bfloat16 \
  --exp-name=prof --no-wandb-enabled --num-train-steps=3 --checkpoint-base-dir=/tmp/startup-ck --overwrite \
  --batch-size=64 --grad-accum-steps=8 2>&1 | stamp >"$OUT/run.txt"
grep -E "Finished XLA compilation|step [0-9]|checkpoint_dir|batch_size" "$OUT/run.txt" | head -40
sort -t'|' -k2 -n -r "$OUT/importtime.txt" 2>/dev/null | head -5
