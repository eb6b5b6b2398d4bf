#!/usr/bin/env bash
# Issue 42, item 3, for openpi on one GPU as itself (no --device-memory), in one device call:
#   bash benchmarks/openpi/gpu_deviceless.sh CONFIG [DEVICELESS_ONLY_CONFIG ...]
# e.g. CARD_ARGS="--min-batch 51 --max-batch 53" DL_MODE=sequential DL_ARGS="--min-batch 24 --max-batch 80" \
#        bash benchmarks/openpi/gpu_deviceless.sh pi0_libero
# 1. gpu_setup.sh: the carried wheels into $SITE, openpi patched into $OPENPI_DIR, preflight of CONFIG;
# 2. `jaxfit gpus capture`: this card's own target config ($OUT/card.txtpb);
# 3. at the same time, each side in its own working folder, checkpoint folder, HOME (openpi's jax
#    compilation cache) and jaxfit cache, all on openpi's own train.py (train_fake.py: fake data,
#    random init) with the same command line:
#    card        jaxfit fit --script --mem-fraction $FRACTION $CARD_ARGS   (untuned search, autotuned proof)
#    deviceless  nice -n 10 jaxfit fit --script --gpu-spec card.txtpb --mem-fraction $FRACTION $DL_ARGS
#                (the script's start-up on the CPU: jaxfit runs its probe with JAX_PLATFORMS=cpu; the
#                step exported for CUDA and compiled for the card's config on the host's cores).
#                DL_MODE=halves (default): its two searches at once, squeezed and safe, in two
#                processes (deviceless_half.py; each its own CPU start-up: about 25 GiB of host memory
#                each for a LoRA config, about 55 GiB for a full fine-tune); DL_MODE=sequential: the
#                safe one (the answer), then the squeezed one (one start-up at a time); DL_MODE=safe or
#                squeezed: that one alone; DL_MODE=cli: the one `jaxfit fit --gpu-spec` process users
#                run (squeezed, then safe); DL_MODE=none: the card side alone;
#    and, for each DEVICELESS_ONLY_CONFIG, its deviceless side only (`jaxfit fit --gpu-spec`, nice -n
#    15, $EXTRA_DL_ARGS).
# Each side's script writes OPENPI_MEMORY_LOG (train_fake.py): device and host memory after its
# start-up's first batch and after openpi's init.
# TRAIN_ARGS: more flags for openpi's train.py on every side (none by default). CARD_SPEC: a target
# config to use instead of capturing one (to check this script off the GPU).
# Everything ends by BUDGET_S (540 s) + 15 s after the script starts. Logs, JSON, nvidia-smi and host
# memory samples go to $CELLS_DIR (/tmp/dl-cells) and are archived into $OUT/all.tgz every 30 s and at
# the end (a call cut by its limit still returns them); at the end $OUT holds summary.txt (one line a
# side and the peaks both sides compiled at the same batch), card.txtpb, all.tgz and one JSON per side:
# 6 files for one config in halves mode, 7 with one DEVICELESS_ONLY_CONFIG (the device returns 8 at most).
set -uo pipefail
CONFIG=${1:?usage: gpu_deviceless.sh CONFIG [DEVICELESS_ONLY_CONFIG ...]}
shift
EXTRA=("$@")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
FINAL=${OUT:-/tmp/openpi-deviceless-out}
CELLS=${CELLS_DIR:-/tmp/dl-cells}
BUDGET_S=${BUDGET_S:-540}
FRACTION=${FRACTION:-0.9}
SITE=${SITE:-/tmp/site}
OPENPI_DIR=${OPENPI_DIR:-/tmp/openpi}
case ${DL_MODE:=halves} in
  halves | sequential | safe | squeezed | cli | none) ;;
  *) echo "gpu_deviceless: DL_MODE is halves, sequential, safe, squeezed, cli or none, not '$DL_MODE'" >&2; exit 2 ;;
esac
START=$(date +%s)
rm -rf "$CELLS"  # a warm machine keeps the last call's logs: not this call's
mkdir -p "$FINAL" "$CELLS"
exec > >(tee -a "$CELLS/main.log") 2>&1
cd "$REPO" || exit 2
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
stamp() { echo "== $(date -u +%T) +$(($(date +%s) - START)) s: $*"; }
archive() { tar -czf "$FINAL/all.tgz.part" -C "$CELLS" . 2>/dev/null && mv "$FINAL/all.tgz.part" "$FINAL/all.tgz"; }

stamp "gpu_deviceless $CONFIG ${EXTRA[*]:-} (fraction $FRACTION, BUDGET_S $BUDGET_S) on $(hostname), $(nproc) cores"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$CELLS/gpus.txt"
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -l 2 >"$CELLS/smi.csv" 2>&1 &
SMI=$!
# host memory (MiB used, available) and the 3 largest processes (RSS MiB), every 5 s
(while sleep 5; do
  echo "$(($(date +%s) - START)) $(free -m | awk '/^Mem:/ {print $3, $7}') $(ps -eo rss=,comm= --sort=-rss | head -3 | awk '{printf "%s:%d ", $2, $1 / 1024}')"
done) >"$CELLS/host-mem.txt" 2>&1 &
MEM=$!

summary() {
  python3 "$REPO/benchmarks/openpi/deviceless_summary.py" "$CELLS" >"$CELLS/summary.txt" 2>&1
  cp "$CELLS/summary.txt" "$FINAL/summary.txt"
  for j in "$CELLS"/*.json; do [ -f "$j" ] && cp "$j" "$FINAL/"; done
  [ -f "$CELLS/card.txtpb" ] && cp "$CELLS/card.txtpb" "$FINAL/card.txtpb"
}
finish() {
  kill "$SMI" "$MEM" 2>/dev/null
  summary
  archive
  cat "$CELLS/summary.txt"
}
trap finish EXIT
trap 'exit 143' TERM INT  # an outer `timeout` still gets the summary and the last archive

. "$REPO/benchmarks/openpi/gpu_setup.sh" || exit $?
export WANDB_MODE=disabled

if [ -n "${CARD_SPEC:-}" ]; then  # a target config given instead of captured (a check of this script off the GPU)
  cp "$CARD_SPEC" "$CELLS/card.txtpb" || exit 3
else
  stamp "capture"
  timeout 120 python3 -m jaxfit.cli gpus capture --out "$CELLS/card.txtpb" >"$CELLS/capture.log" 2>&1 || {
    cat "$CELLS/capture.log"
    exit 3
  }
fi
head -3 "$CELLS/card.txtpb"
grep -E "device_memory_size|core_count" "$CELLS/card.txtpb"

# side NAME NICENESS CONFIG RUNNER [jaxfit fit options]: one fit of openpi's train.py CONFIG, logged to
# $CELLS/NAME.log, its JSON $CELLS/NAME.json, its exit appended to $CELLS/sides.txt. RUNNER: `fit` (the
# jaxfit command, `python3 -m jaxfit.cli fit`) or `squeezed` / `safe` (deviceless_half.py: that search
# of `fit --gpu-spec` only).
side() {
  local name=$1 niceness=$2 config=$3 runner=$4 dir=/tmp/dl-$1 l
  local home=${SIDE_HOME:-$dir/home}  # openpi's jax compilation cache is ~/.cache/jax
  shift 4
  local prog=(python3 -m jaxfit.cli fit)
  [ "$runner" != fit ] && prog=(python3 "$REPO/benchmarks/openpi/deviceless_half.py" "$runner")
  l=$(left)
  if [ "$l" -lt 90 ]; then stamp "$name skipped: $l s left" | tee -a "$CELLS/sides.txt"; return; fi
  rm -rf "$dir/ckpt"  # a leftover of a cut run on a warm machine: openpi refuses an existing checkpoint folder
  mkdir -p "$dir/work" "$home"
  : >"$CELLS/$name.memory.jsonl"  # made before the probe, so jaxfit does not take it away as the probe's leftover
  stamp "start $name ($config; ${prog[*]} $*; nice $niceness; ${l} s left)" | tee -a "$CELLS/sides.txt"
  # a deviceless side (niceness > 0) is the one the kernel kills first if host memory runs out, not the card's
  # shellcheck disable=SC2086  # TRAIN_ARGS is split on purpose
  (cd "$dir/work" && { [ "$niceness" -eq 0 ] || echo 1000 >/proc/self/oom_score_adj; } 2>/dev/null
    HOME="$home" JAXFIT_CACHE_DIR="$dir/cache" OPENPI_MEMORY_LOG="$CELLS/$name.memory.jsonl" \
    exec nice -n "$niceness" timeout --signal=TERM --kill-after=15 "$l" "${prog[@]}" --script --mem-fraction "$FRACTION" \
    --json "$CELLS/$name.json" --probe-timeout "$l" "$@" \
    -- python3 "$REPO/benchmarks/openpi/train_fake.py" "$config" --exp-name=fit \
    --checkpoint-base-dir="$dir/ckpt" --no-wandb-enabled ${TRAIN_ARGS:-}) >"$CELLS/$name.log" 2>&1
  local rc=$?
  stamp "$name exit $rc" | tee -a "$CELLS/sides.txt"
}

SPEC=(--gpu-spec "$CELLS/card.txtpb")
# shellcheck disable=SC2086  # the ARGS are split on purpose
side "$CONFIG-card" 0 "$CONFIG" fit ${CARD_ARGS:-} &
case $DL_MODE in
  halves)  # the two searches of `fit --gpu-spec` at once, in two processes (two CPU start-ups side by side)
    # shellcheck disable=SC2086
    side "$CONFIG-deviceless-squeezed" 10 "$CONFIG" squeezed "${SPEC[@]}" ${DL_ARGS:-} &
    # shellcheck disable=SC2086
    side "$CONFIG-deviceless-safe" 10 "$CONFIG" safe "${SPEC[@]}" ${DL_ARGS:-} &
    ;;
  sequential)  # the safe search (the answer), then the squeezed one, each its own process (one start-up at a
    # time; the second reuses the first's compiled CPU init from openpi's jax compilation cache in their HOME)
    # shellcheck disable=SC2086
    (export SIDE_HOME=/tmp/dl-$CONFIG-deviceless-home
    side "$CONFIG-deviceless-safe" 10 "$CONFIG" safe "${SPEC[@]}" ${DL_ARGS:-}
    side "$CONFIG-deviceless-squeezed" 10 "$CONFIG" squeezed "${SPEC[@]}" ${DL_ARGS:-}) &
    ;;
  safe | squeezed)  # that search alone
    # shellcheck disable=SC2086
    side "$CONFIG-deviceless-$DL_MODE" 10 "$CONFIG" "$DL_MODE" "${SPEC[@]}" ${DL_ARGS:-} &
    ;;
  cli)  # `jaxfit fit --gpu-spec` as users run it: the squeezed search, then the safe one, in one process
    # shellcheck disable=SC2086
    side "$CONFIG-deviceless" 10 "$CONFIG" fit "${SPEC[@]}" ${DL_ARGS:-} &
    ;;
  none) ;;
esac
for extra in "${EXTRA[@]}"; do
  # shellcheck disable=SC2086
  side "$extra-deviceless" 15 "$extra" fit "${SPEC[@]}" ${EXTRA_DL_ARGS:-} &
done
while jobs -rp | grep -qvx -e "$SMI" -e "$MEM"; do
  sleep 30 & wait $!  # a TERM is handled at once, not after the sleep
  stamp "GPU $(tail -1 "$CELLS/smi.csv" | cut -d, -f2), host $(tail -1 "$CELLS/host-mem.txt" | cut -d' ' -f2,3) MiB used/available;" \
    "$(for f in "$CELLS"/*-card.log "$CELLS"/*-deviceless*.log; do [ -f "$f" ] && printf '%s: %s; ' "$(basename "$f" .log)" "$(grep -E '^round|^  batch' "$f" | tail -1)"; done)"
  archive
done
# no bare `wait` here: it would wait for the monitors and for `tee` (bash waits for the last process
# substitution too), for ever; the loop above ended when the last run did
stamp "done"
