#!/usr/bin/env bash
# A real run of openpi's train.py at a fitted answer, and the next batch up, on the GPU machine:
#   bash benchmarks/openpi/gpu_run.sh CONFIG CARD BATCH|LO-HI [openpi train.py flags ...]
# e.g. bash benchmarks/openpi/gpu_run.sh pi0_libero_low_mem_finetune 48GiB 118
#      GPUS=1 bash benchmarks/openpi/gpu_run.sh pi0_libero 80GiB 51      (the run sees one GPU of the host)
#      bash benchmarks/openpi/gpu_run.sh pi0_libero_low_mem_finetune card 219-221   (CARD "card": the GPU as itself,
#                                                                                  no --device-memory)
#      MULTIPLE=2 TAG=pi0_libero-80GiB-fsdp2 bash benchmarks/openpi/gpu_run.sh pi0_libero 80GiB 256-448 --fsdp-devices=2
# 1. set-up as gpu_fit.sh (wheels, patched openpi, preflight: gpu_setup.sh);
# 2. jaxfit run --device-memory CARD --mem-fraction $FRACTION --min-batch LO --max-batch HI (BATCH alone:
#    LO=BATCH, HI=BATCH+MULTIPLE): the fit proves the answer (untuned, then autotuned), pins its
#    program, and runs openpi's train.py at it for ${STEPS:-3} steps under the limit of the planned
#    card (on a larger GPU: the fraction of it that gives that limit); JSON: $OUT/CONFIG-CARD-run.json;
#    MULTIPLE (1) is --multiple-of (the device count under FSDP), GPUS (unset) is run's --gpus N;
# 3. jaxfit run --batch-size ANSWER+MULTIPLE --mem-fraction $FRACTION --device-memory CARD (nothing
#    fitted, nothing pinned: the plain run of the next batch up); JSON: $OUT/CONFIG-CARD-up.json;
#    PLAIN_ONLY=1: step 3 alone, at BATCH (the next batch up of an answer run in an earlier call);
# nvidia-smi samples each GPU's used memory every second into $OUT/CONFIG-CARD-smi.csv throughout.
set -uo pipefail
CONFIG=${1:?usage: gpu_run.sh CONFIG CARD BATCH [train.py flags]}
CARD=${2:?usage: gpu_run.sh CONFIG CARD BATCH [train.py flags]}
BATCH=${3:?usage: gpu_run.sh CONFIG CARD BATCH|LO-HI [train.py flags]}
shift 3
MULTIPLE=${MULTIPLE:-1}
if [[ $BATCH == *-* ]]; then LO=${BATCH%-*} HI=${BATCH#*-}; else LO=$BATCH HI=$((BATCH + MULTIPLE)); fi
GPU_ARGS=()
[ -n "${GPUS:-}" ] && GPU_ARGS=(--gpus "$GPUS")
[ "$CARD" != card ] && GPU_ARGS+=(--device-memory "$CARD")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/openpi-fit}
SITE=${SITE:-/tmp/site}
OPENPI_DIR=${OPENPI_DIR:-/tmp/openpi}
FRACTION=${FRACTION:-0.9}
BUDGET_S=${BUDGET_S:-560}
STEPS=${STEPS:-3}
START=$(date +%s)
mkdir -p "$OUT"
TAG=${TAG:-$CONFIG-$CARD}
exec > >(tee -a "$OUT/$TAG-run.log") 2>&1
cd "$REPO" || exit 2
echo "== gpu_run $TAG batch $BATCH: $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
. "$REPO/benchmarks/openpi/gpu_setup.sh" || exit $?
nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv,noheader -l 1 >"$OUT/$TAG-smi.csv" 2>&1 &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
WORK=${WORK:-/tmp/openpi-work}
mkdir -p "$WORK" && cd "$WORK" || exit 2
openpi=(python3 "$REPO/benchmarks/openpi/train_fake.py" "$CONFIG" --checkpoint-base-dir="${CKPT_DIR:-/tmp/openpi-ckpt}"
  --no-wandb-enabled --num-train-steps="$STEPS" --overwrite "$@")

if [ -n "${PLAIN_ONLY:-}" ]; then
  ANSWER=$((BATCH - MULTIPLE)) RC=0
else
  LEFT=$((BUDGET_S - ($(date +%s) - START)))
  echo "== $(date -u +%T) jaxfit run: fit $LO..$HI then run $STEPS steps ($CONFIG, card $CARD, fraction $FRACTION; ${LEFT} s left)"
  timeout --signal=TERM --kill-after=20 "$LEFT" \
    python3 -m jaxfit.cli run --mem-fraction "$FRACTION" --min-batch "$LO" --max-batch "$HI" \
    --multiple-of "$MULTIPLE" "${GPU_ARGS[@]}" --probe-timeout "$LEFT" --json "$OUT/$TAG-run.json" \
    --probe-arg=--checkpoint-base-dir=/tmp/openpi-probe-ckpt -- "${openpi[@]}" --exp-name=run
  RC=$?
  echo "== $(date -u +%T) fitted run: exit $RC after $(($(date +%s) - START)) s"

  ANSWER=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["batch_size"] or "")' "$OUT/$TAG-run.json" 2>/dev/null)
  if [ -z "$ANSWER" ]; then echo "== no fitted answer in $TAG-run.json: no next batch up to run"; exit "$RC"; fi
fi
UP=$((ANSWER + MULTIPLE))
LEFT=$((BUDGET_S - ($(date +%s) - START)))
if [ "$LEFT" -lt 60 ]; then echo "== only ${LEFT} s left of BUDGET_S: the next batch up ($UP) is not run"; exit "$RC"; fi
echo "== $(date -u +%T) jaxfit run --batch-size $UP (plain, the answer $ANSWER + $MULTIPLE; ${LEFT} s left)"
timeout --signal=TERM --kill-after=20 "$LEFT" \
  python3 -m jaxfit.cli run --batch-size "$UP" --mem-fraction "$FRACTION" "${GPU_ARGS[@]}" \
  --json "$OUT/$TAG-up.json" -- "${openpi[@]}" --exp-name=up
RC=$?
echo "== $(date -u +%T) next batch up: exit $RC after $(($(date +%s) - START)) s"
