#!/usr/bin/env bash
# Several openpi cells side by side, each on its own GPU(s) of one host, in one device call:
#   bash benchmarks/openpi/gpu_cells.sh "GPUS MODE CONFIG CARD ARG [train.py flags]" ...
#     GPUS   the CUDA_VISIBLE_DEVICES of the cell (0, 2, 0,1,2,3)
#     MODE   fit: gpu_fit.sh; ARG is extra `jaxfit fit` options in one word joined by commas
#                 (--min-batch,30,--max-batch,80) or `-` for none
#            run: gpu_run.sh; ARG is BATCH or LO-HI (the fit's window, then 3 pinned steps and the
#                 plain run of the next batch up)
#            up:  gpu_run.sh PLAIN_ONLY=1; ARG is the BATCH of a plain run alone (an answer's next
#                 batch up whose answer ran in an earlier call)
# e.g. bash benchmarks/openpi/gpu_cells.sh "0 run pi0_fast_libero 80GiB 41" "1 fit pi0_libero 32GiB -"
# Each cell has its own wheels folder, patched copy, working folder, checkpoint folder and jaxfit
# cache (nothing shared but the host's CPUs). Every cell ends by BUDGET_S (540 s) + 20 s; the logs,
# JSON and nvidia-smi samples are written under /tmp/cells and archived into $OUT/all.tgz every 30
# s and at the end, so a call cut by its limit still returns what the cells wrote (the device
# returns at most 8 files a call: one archive).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
FINAL=${OUT:-/tmp/openpi-cells-out}
CELLS=${CELLS_DIR:-/tmp/cells}
export BUDGET_S=${BUDGET_S:-540}
mkdir -p "$FINAL" "$CELLS"
archive() { tar -czf "$FINAL/all.tgz.part" -C "$CELLS" . 2>/dev/null && mv "$FINAL/all.tgz.part" "$FINAL/all.tgz"; }
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$CELLS/gpus.txt"
nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader -l 2 >"$CELLS/host-smi.csv" 2>&1 &
SMI=$!
trap 'kill $SMI 2>/dev/null; archive' EXIT
pids=()
for spec in "$@"; do
  read -r gpus mode config card arg rest <<<"$spec"
  tag=${config}-${card}-gpu${gpus//,/}
  # the batch multiple of a cell: MULTIPLE if set, else its --fsdp-devices=N (so cells with and
  # without FSDP can share one call), else 1
  mult=${MULTIPLE:-1}
  [ -z "${MULTIPLE:-}" ] && [[ " $rest " =~ --fsdp-devices=([0-9]+) ]] && mult=${BASH_REMATCH[1]}
  common=(env CUDA_VISIBLE_DEVICES="$gpus" MULTIPLE="$mult" OUT="$CELLS" SITE="/tmp/site-$tag" OPENPI_DIR="/tmp/openpi-$tag"
    WORK="/tmp/work-$tag" CKPT_DIR="/tmp/ckpt-$tag" JAXFIT_CACHE_DIR="/tmp/cache-$tag" OPENPI_HOME="/tmp/home-$tag")
  case $mode in
    fit)
      jargs=""; [ "$arg" != "-" ] && jargs=${arg//,/ }
      # shellcheck disable=SC2086  # rest is train.py's flags, split on purpose
      "${common[@]}" JAXFIT_ARGS="$jargs" bash "$REPO/benchmarks/openpi/gpu_fit.sh" "$config" "$card" $rest \
        >"$CELLS/$tag.stdout" 2>&1 &
      ;;
    run | up)
      plain=""; [ "$mode" = up ] && plain=1
      # shellcheck disable=SC2086
      "${common[@]}" TAG="$tag" PLAIN_ONLY="$plain" bash "$REPO/benchmarks/openpi/gpu_run.sh" "$config" "$card" "$arg" $rest \
        >"$CELLS/$tag.stdout" 2>&1 &
      ;;
    *) echo "gpu_cells: unknown mode '$mode' in '$spec' (fit, run or up)"; exit 2 ;;
  esac
  pids+=($!)
  echo "== $(date -u +%T) gpu_cells: started $tag ($mode $arg $rest) as $!"
done
while [ -n "$(jobs -rp | grep -vx "$SMI")" ]; do
  sleep 30
  echo "== $(date -u +%T) used MiB per GPU: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | paste -sd' ')"
  archive
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
for log in "$CELLS"/*.stdout; do
  echo "===== $log"
  grep -E "^== |jaxfit (fit|run)[: ]|answer|ran the proven|RESOURCE_EXHAUSTED|out of memory|Step [0-9]|batch [0-9]+ (fits|does not)|error" "$log" | tail -30
done
exit "$rc"
