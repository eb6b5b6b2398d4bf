#!/usr/bin/env bash
# Deviceless estimates of one openpi config for several GPU models, one `jaxfit fit --script --gpu MODEL`
# after another, on this machine's CPU (no GPU needed; cpu_setup.sh first):
#   OUT=benchmarks/results/cpu/openpi-cards CONFIG=pi0_libero_low_mem_finetune \
#     bash benchmarks/openpi/cpu_cards.sh rtx-4090 rtx-a6000 a100-80gb rtx-pro-6000
#   FIT_ARGS="--device-memory 141GB" TAG=-141GB ... bash benchmarks/openpi/cpu_cards.sh h200
# Each fit (FRACTION 0.9, lean start-up, jaxfit's cache on: a later `jaxfit plan --script --gpu ...` of
# the same models is answered from it) writes $OUT/$CONFIG-MODEL.json and .log; a fit cut off leaves
# the others. JAXFIT: the jaxfit command (default: this repository's .venv). VENV: cpu_setup.sh's.
# FIT_ARGS: more `jaxfit fit` options (e.g. `--device-memory 141GB`), TAG: a suffix for the files' names.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${VENV:-/work/openpi-env}
OUT=$(realpath -m "${OUT:?set OUT}")  # the fits run in /tmp/cpu-cards
CONFIG=${CONFIG:-pi0_libero_low_mem_finetune}
FRACTION=${FRACTION:-0.9}
JAXFIT=${JAXFIT:-$REPO/.venv/bin/python -m jaxfit.cli}
# shellcheck disable=SC1091
source "$VENV/activate-openpi.sh"
mkdir -p "$OUT" /tmp/cpu-cards
cd /tmp/cpu-cards || exit 2
for model in "$@"; do
  rm -rf /tmp/cpu-cards/ckpt
  echo "== $(date -u +%T) $CONFIG on $model"
  # shellcheck disable=SC2086  # JAXFIT is a command line, FIT_ARGS options
  /usr/bin/time -v $JAXFIT fit --script --gpu "$model" --mem-fraction "$FRACTION" ${FIT_ARGS:-} --json "$OUT/$CONFIG-$model${TAG:-}.json" \
    -- "$VENV/bin/python" "$REPO/benchmarks/openpi/train_fake.py" "$CONFIG" --exp-name=fit \
    --checkpoint-base-dir=/tmp/cpu-cards/ckpt --no-wandb-enabled >"$OUT/$CONFIG-$model${TAG:-}.log" 2>&1
  echo "   exit $?: $(grep -E '^estimate for' "$OUT/$CONFIG-$model${TAG:-}.log" | head -1 | cut -c1-160)"
done
