#!/usr/bin/env bash
# Issue 42, item 4: openpi's start-up with its weights loaded from a checkpoint (openpi's own
# CheckpointWeightLoader) against random init, under a CARD's limit, on one GPU in one device call:
#   bash benchmarks/openpi/gpu_init.sh CARD CONFIG [CONFIG ...]
# e.g. bash benchmarks/openpi/gpu_init.sh 24GiB pi0_libero_low_mem_finetune pi0_fast_libero_low_mem_finetune
# After gpu_setup.sh, for each CONFIG at once (a chain each):
#   random  jaxfit fit --script --device-memory CARD --mem-fraction $FRACTION $PROBE_ARGS
#             -- train_fake.py CONFIG ...            (fake data, random init: openpi's init creates every param)
#   ckpt    make_checkpoint.py CONFIG on the CPU (beside `random`; ROOT/CONFIG/params, the real shapes, random
#           values, openpi's params format), then, once `random` has ended:
#           jaxfit fit ... the same ... -- train_fake.py CONFIG_from_ckpt ...  (CheckpointWeightLoader on it)
# and a third chain, one config after the other: `peak`, train_fake.py CONFIG --num-train-steps=0 alone (no
# jaxfit: random init, no step, exit) under XLA_PYTHON_CLIENT_MEM_FRACTION=$PEAK_FRACTION of this GPU
# (0.38: 30 GiB of an H100, so the two chains' pools, 2 x 0.9 x 24 GiB, and it fit the GPU together):
# the random init's own peak where the card's limit does not cap it.
# Every script writes OPENPI_MEMORY_LOG (train_fake.py): the device's peak_bytes_in_use after the data
# loader's first batch and after openpi's init (the start-up's peak), and the host's max RSS. Each run
# has its own working folder, checkpoint folder, HOME and jaxfit cache. Logs and JSON in $CELLS_DIR
# (/tmp/init-cells), archived into $OUT/all.tgz every 30 s and at the end; $OUT/summary.txt at the end.
# Knobs: FRACTION (0.9), PEAK_FRACTION (0.38), PEAK=0 (no peak runs), PROBE_ARGS (--min-batch 32
# --max-batch 33: after the start-up, whether openpi's default batch 32 fits, proved at once),
# CKPT_DTYPE (bfloat16), TRAIN_ARGS (more train.py flags), OPENPI_CKPT_ROOT (/tmp/openpi-params).
# Everything ends by BUDGET_S (540 s) + 15 s after the script starts.
set -uo pipefail
CARD=${1:?usage: gpu_init.sh CARD CONFIG [CONFIG ...]}
shift
CONFIGS=("${@:?usage: gpu_init.sh CARD CONFIG [CONFIG ...]}")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
FINAL=${OUT:-/tmp/openpi-init-out}
CELLS=${CELLS_DIR:-/tmp/init-cells}
BUDGET_S=${BUDGET_S:-540}
FRACTION=${FRACTION:-0.9}
PEAK_FRACTION=${PEAK_FRACTION:-0.38}
PROBE_ARGS=${PROBE_ARGS:---min-batch 32 --max-batch 33}
CKPT_DTYPE=${CKPT_DTYPE:-bfloat16}
SITE=${SITE:-/tmp/site}
OPENPI_DIR=${OPENPI_DIR:-/tmp/openpi}
export OPENPI_CKPT_ROOT=${OPENPI_CKPT_ROOT:-/tmp/openpi-params}
START=$(date +%s)
rm -rf "$CELLS"  # a warm machine keeps the last call's logs: not this call's
mkdir -p "$FINAL" "$CELLS"
exec > >(tee -a "$CELLS/main.log") 2>&1
cd "$REPO" || exit 2
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
stamp() { echo "== $(date -u +%T) +$(($(date +%s) - START)) s: $*"; }
archive() { tar -czf "$FINAL/all.tgz.part" -C "$CELLS" . 2>/dev/null && mv "$FINAL/all.tgz.part" "$FINAL/all.tgz"; }

stamp "gpu_init $CARD ${CONFIGS[*]} (fraction $FRACTION, peak runs at $PEAK_FRACTION, probe: $PROBE_ARGS) on $(hostname)"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$CELLS/gpus.txt"
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -l 1 >"$CELLS/smi.csv" 2>&1 &
SMI=$!
(while sleep 5; do
  echo "$(($(date +%s) - START)) $(free -m | awk '/^Mem:/ {print $3, $7}')"
done) >"$CELLS/host-mem.txt" 2>&1 &
MEM=$!
finish() {
  kill "$SMI" "$MEM" 2>/dev/null
  python3 "$REPO/benchmarks/openpi/init_summary.py" "$CELLS" >"$CELLS/summary.txt" 2>&1
  cp "$CELLS/summary.txt" "$FINAL/summary.txt"
  archive
  cat "$CELLS/summary.txt"
}
trap finish EXIT
trap 'exit 143' TERM INT  # an outer `timeout` still gets the summary and the last archive

CONFIG=${CONFIGS[0]}
. "$REPO/benchmarks/openpi/gpu_setup.sh" || exit $?
export WANDB_MODE=disabled

# probe NAME CONFIG: jaxfit's probe of openpi's train.py CONFIG under the card's limit
probe() {
  local name=$1 config=$2 dir=/tmp/init-$1 l
  l=$(left)
  if [ "$l" -lt 60 ]; then stamp "$name skipped: $l s left" | tee -a "$CELLS/sides.txt"; return; fi
  rm -rf "$dir/ckpt"  # a leftover of a cut run on a warm machine: openpi refuses an existing checkpoint folder
  mkdir -p "$dir/work" "$dir/home"
  : >"$CELLS/$name.memory.jsonl"  # made before the probe, so jaxfit does not take it away as the probe's leftover
  stamp "start $name ($config, card $CARD, ${l} s left)" | tee -a "$CELLS/sides.txt"
  # shellcheck disable=SC2086  # PROBE_ARGS is split on purpose
  (cd "$dir/work" && HOME="$dir/home" JAXFIT_CACHE_DIR="$dir/cache" OPENPI_MEMORY_LOG="$CELLS/$name.memory.jsonl" \
    exec timeout --signal=TERM --kill-after=15 "$l" python3 -m jaxfit.cli fit --script --mem-fraction "$FRACTION" \
    --device-memory "$CARD" --json "$CELLS/$name.json" --probe-timeout "$l" $PROBE_ARGS \
    -- python3 "$REPO/benchmarks/openpi/train_fake.py" "$config" --exp-name=init \
    --checkpoint-base-dir="$dir/ckpt" --no-wandb-enabled ${TRAIN_ARGS:-}) >"$CELLS/$name.log" 2>&1
  stamp "$name exit $?" | tee -a "$CELLS/sides.txt"
}

# peak NAME CONFIG: openpi's start-up alone, no step (--num-train-steps=0), under PEAK_FRACTION
peak() {
  local name=$1 config=$2 dir=/tmp/init-$1 l
  l=$(left)
  if [ "$l" -lt 60 ]; then stamp "$name skipped: $l s left" | tee -a "$CELLS/sides.txt"; return; fi
  rm -rf "$dir/ckpt"  # a leftover of a cut run on a warm machine: openpi refuses an existing checkpoint folder
  mkdir -p "$dir/work" "$dir/home"
  stamp "start $name ($config, XLA_PYTHON_CLIENT_MEM_FRACTION=$PEAK_FRACTION, no preallocation)" | tee -a "$CELLS/sides.txt"
  # shellcheck disable=SC2086  # TRAIN_ARGS is split on purpose
  (cd "$dir/work" && HOME="$dir/home" OPENPI_MEMORY_LOG="$CELLS/$name.memory.jsonl" XLA_PYTHON_CLIENT_MEM_FRACTION="$PEAK_FRACTION" \
    XLA_PYTHON_CLIENT_PREALLOCATE=false exec timeout --signal=TERM --kill-after=15 "$l" \
    python3 "$REPO/benchmarks/openpi/train_fake.py" "$config" --exp-name=peak --num-train-steps=0 \
    --checkpoint-base-dir="$dir/ckpt" --no-wandb-enabled ${TRAIN_ARGS:-}) >"$CELLS/$name.log" 2>&1
  stamp "$name exit $?" | tee -a "$CELLS/sides.txt"
}

chain() {  # random probe and the checkpoint (at once), then the probe from the checkpoint
  local config=$1
  (JAX_PLATFORMS=cpu nice -n 5 timeout "$(left)" python3 "$REPO/benchmarks/openpi/make_checkpoint.py" "$config" \
    --root "$OPENPI_CKPT_ROOT" --dtype "$CKPT_DTYPE" --no-check >"$CELLS/$config-make_checkpoint.log" 2>&1
  stamp "$config checkpoint exit $?" | tee -a "$CELLS/sides.txt") &
  local writer=$!
  probe "$config-random" "$config"
  wait "$writer"
  if [ -d "$OPENPI_CKPT_ROOT/$config/params" ]; then
    probe "$config-ckpt" "${config}_from_ckpt"
  else
    stamp "$config-ckpt skipped: no checkpoint written" | tee -a "$CELLS/sides.txt"
  fi
}

for config in "${CONFIGS[@]}"; do chain "$config" & done
[ "${PEAK:-1}" = 0 ] || (for config in "${CONFIGS[@]}"; do peak "$config-peak" "$config"; done) &
while jobs -rp | grep -qvx -e "$SMI" -e "$MEM"; do
  sleep 30 & wait $!  # a TERM is handled at once, not after the sleep
  stamp "GPU $(tail -1 "$CELLS/smi.csv" | cut -d, -f2), host $(tail -1 "$CELLS/host-mem.txt" | cut -d' ' -f2,3) MiB used/available"
  archive
done
# no bare `wait` here: it would wait for the monitors and for `tee` (bash waits for the last process
# substitution too), for ever; the loop above ended when the last run did
stamp "done"
