#!/usr/bin/env bash
# Two fits side by side on one GPU (each compile child runs with preallocation off, so each holds
# only what its script's start-up allocates; the pair must fit the GPU together):
#   bash benchmarks/openpi/gpu_pair.sh "CONFIG_A CARD_A [JAXFIT_ARGS_A]" "CONFIG_B CARD_B [JAXFIT_ARGS_B]"
# e.g. bash benchmarks/openpi/gpu_pair.sh "pi05_libero 80GiB --min-batch 16 --max-batch 80" \
#        "pi0_fast_libero_low_mem_finetune 24GiB"
# Each runs gpu_fit.sh with its own wheels folder, patched copy, working folder, checkpoint folder
# and jaxfit cache (nothing shared but the GPU, the CPU cores and $OUT), within BUDGET_S (560 s).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/openpi-fit}
export OUT BUDGET_S=${BUDGET_S:-560}
mkdir -p "$OUT"
pids=()
for spec in "$@"; do
  read -r config card args <<<"$spec"
  tag=${config}-${card}
  SITE=/tmp/site-$tag OPENPI_DIR=/tmp/openpi-$tag WORK=/tmp/work-$tag CKPT_DIR=/tmp/ckpt-$tag \
    JAXFIT_CACHE_DIR=/tmp/cache-$tag JAXFIT_ARGS="${args:-}" \
    bash "$REPO/benchmarks/openpi/gpu_fit.sh" "$config" "$card" >/dev/null 2>&1 &
  pids+=($!)
  echo "== gpu_pair: started $tag (${args:-no extra jaxfit args}) as $!"
done
while [ -n "$(jobs -rp)" ]; do
  sleep 30
  echo "== $(date -u +%T) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null) used"
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
for log in "$OUT"/*.log; do echo "===== $log"; grep -v "^\s*$" "$log" | tail -45; done
exit "$rc"
