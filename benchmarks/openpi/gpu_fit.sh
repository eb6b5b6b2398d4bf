#!/usr/bin/env bash
# On the GPU machine, from the repository root (with .openpi and .whl carried; prepare.sh made them):
#   bash benchmarks/openpi/gpu_fit.sh CONFIG CARD [openpi train.py flags ...]
# e.g. bash benchmarks/openpi/gpu_fit.sh pi0_libero 80GiB
#      JAXFIT_ARGS="--batch-size 32" bash benchmarks/openpi/gpu_fit.sh pi0_libero_low_mem_finetune 24GiB
# 1. installs the carried wheels into /tmp/site (no index, no deps),
# 2. copies and patches openpi to /tmp/openpi (patch_openpi.py; .openpi/ stays pristine),
# 3. preflight on the CPU backend: versions, imports, and the config's abstract sizes (eval_shape),
# 4. jaxfit fit --script --mem-fraction ${FRACTION:-0.9} --device-memory CARD --json $OUT/CONFIG-CARD.json
#    -- python benchmarks/openpi/train_fake.py CONFIG --exp-name=fit ... (openpi's own train.py, fake
#    data, random init), inside `timeout` so the whole script ends before ${BUDGET_S:-510} s.
# Logs stream to stdout and to $OUT/CONFIG-CARD.log; jaxfit's JSON to $OUT/CONFIG-CARD.json (2 files a call).
set -uo pipefail
CONFIG=${1:?usage: gpu_fit.sh CONFIG CARD [train.py flags]}
CARD=${2:?usage: gpu_fit.sh CONFIG CARD [train.py flags]}
shift 2
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/openpi-fit}
SITE=${SITE:-/tmp/site}                 # where the wheels are installed
OPENPI_DIR=${OPENPI_DIR:-/tmp/openpi}   # the patched copy
FRACTION=${FRACTION:-0.9}
BUDGET_S=${BUDGET_S:-510}
START=$(date +%s)
mkdir -p "$OUT"
TAG="$CONFIG-$CARD"
LOG="$OUT/$TAG.log"
exec > >(tee -a "$LOG") 2>&1
cd "$REPO" || exit 2

echo "== gpu_fit $TAG: $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

. "$REPO/benchmarks/openpi/gpu_setup.sh" || exit $?
# The script runs in a scratch folder: what its start-up writes in the working folder lands there.
WORK=${WORK:-/tmp/openpi-work}
mkdir -p "$WORK" && cd "$WORK" || exit 2
LEFT=$((BUDGET_S - ($(date +%s) - START)))
echo "== jaxfit fit --script ($CONFIG, card $CARD, fraction $FRACTION; ${LEFT} s left)"
# shellcheck disable=SC2086  # JAXFIT_ARGS is split on purpose
timeout --signal=TERM --kill-after=20 "$LEFT" \
  python3 -m jaxfit.cli fit --script --mem-fraction "$FRACTION" --device-memory "$CARD" --json "$OUT/$TAG.json" \
  --probe-timeout "$LEFT" ${JAXFIT_ARGS:-} \
  -- python3 "$REPO/benchmarks/openpi/train_fake.py" "$CONFIG" --exp-name=fit --checkpoint-base-dir="${CKPT_DIR:-/tmp/openpi-ckpt}" \
  --no-wandb-enabled "$@"
RC=$?
[ "$RC" -eq 124 ] && echo "gpu_fit: stopped by timeout after ${LEFT} s (BUDGET_S=$BUDGET_S)"
echo "== gpu_fit $TAG: exit $RC after $(($(date +%s) - START)) s"
exit "$RC"
