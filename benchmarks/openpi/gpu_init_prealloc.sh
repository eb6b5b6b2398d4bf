#!/usr/bin/env bash
# Issue 42, item 4, follow-up: openpi's random init under a 24 GiB card's limit, as users run it
# (XLA's default preallocation: one pool of the whole fraction) against preallocation off (jaxfit's
# probe runs so). No jaxfit: train_fake.py CONFIG --num-train-steps=0 (start-up, init, exit), each
# run at once on one GPU, under XLA_PYTHON_CLIENT_MEM_FRACTION=$FRACTION:
#   OUT=$OUT bash benchmarks/openpi/gpu_init_prealloc.sh
# FRACTION defaults to 0.272797, the fraction jaxfit set for `--device-memory 24GiB --mem-fraction 0.9`
# on an H100 80GB HBM3 (a 21.60 GiB limit). Writes $OUT/NAME.log and $OUT/NAME.memory.jsonl per run.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/init-prealloc}
SITE=${SITE:-/tmp/site}
OPENPI_DIR=${OPENPI_DIR:-/tmp/openpi}
FRACTION=${FRACTION:-0.272797}
CONFIG=pi0_libero_low_mem_finetune
mkdir -p "$OUT"
cd "$REPO" || exit 2
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
. "$REPO/benchmarks/openpi/gpu_setup.sh" >"$OUT/setup.log" 2>&1 || { tail "$OUT/setup.log"; exit 3; }
export WANDB_MODE=disabled
# one NAME CONFIG PREALLOCATE: openpi's start-up alone
one() {
  local name=$1 config=$2 prealloc=$3 dir=/tmp/prealloc-$1
  rm -rf "$dir" && mkdir -p "$dir/work" "$dir/home"
  (cd "$dir/work" && HOME="$dir/home" OPENPI_MEMORY_LOG="$OUT/$name.memory.jsonl" XLA_PYTHON_CLIENT_MEM_FRACTION="$FRACTION" \
    XLA_PYTHON_CLIENT_PREALLOCATE="$prealloc" exec timeout --signal=TERM --kill-after=10 200 \
    python3 "$REPO/benchmarks/openpi/train_fake.py" "$config" --exp-name=prealloc --num-train-steps=0 \
    --checkpoint-base-dir="$dir/ckpt" --no-wandb-enabled) >"$OUT/$name.log" 2>&1
  echo "$name (XLA_PYTHON_CLIENT_PREALLOCATE=$prealloc, fraction $FRACTION): exit $?" | tee -a "$OUT/exits.txt"
}
one pi0-lora-prealloc pi0_libero_low_mem_finetune true &
one pi0-fast-lora-prealloc pi0_fast_libero_low_mem_finetune true &
one pi0-lora-growth pi0_libero_low_mem_finetune false &
wait
for f in "$OUT"/*.memory.jsonl; do echo "== $f"; cat "$f"; done
grep -h -o "Out of memory while trying to allocate [0-9.]*GiB" "$OUT"/*.log
