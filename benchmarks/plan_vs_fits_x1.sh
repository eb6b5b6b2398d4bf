#!/usr/bin/env bash
# A plan of one example on three cards against the single fits it stands for (issue 44), cold, on one GPU:
# `jaxfit plan` of the cards, then `jaxfit fit --device-memory CARD` of each card, each with an empty cache
# folder of its own, one after the other.
#   OUT=$OUT bash benchmarks/plan_vs_fits_x1.sh [EXAMPLE] [FRACTION] [CARD ...]
#   (defaults: gpt-small 0.9 16GiB 24GiB 32GiB; each card at the fraction must fit this GPU)
#   ONLY=plan or ONLY=fits runs one side (two calls where both would not fit one call's 600 s; then
#   summarise both calls' folders with plan_vs_fits_summary.py after fetching them).
# Writes $OUT/EXAMPLE/plan.json and .log, fit-CARD.json and .log, and summary.md (wall times, answers).
set -uo pipefail
OUT=${OUT:-/tmp/plan-vs-fits}
. "$(dirname "$0")/gpu_env.sh"
EXAMPLE=${1:-gpt-small}
FRACTION=${2:-0.9}
shift $(($# < 2 ? $# : 2))
CARDS=("$@")
[ ${#CARDS[@]} -gt 0 ] || CARDS=(16GiB 24GiB 32GiB)
DIR=$OUT/$EXAMPLE
mkdir -p "$DIR"
now() { date +%s.%N; }
cold() {  # cold NAME ARGS...: one jaxfit command with an empty cache; its wall seconds into $DIR/NAME.seconds
  local name=$1 cache began
  shift
  cache=$(mktemp -d /tmp/jaxfit-cold-XXXXXX)
  began=$(now)
  JAXFIT_CACHE_DIR=$cache timeout 590 python3 -m jaxfit.cli "$@" >"$DIR/$name.log" 2>&1
  echo "$name: exit $?" | tee -a "$DIR/exits.txt"
  python3 -c "print(round($(now) - $began, 1))" >"$DIR/$name.seconds"
  rm -rf "$cache"
}
card_args=()
for c in "${CARDS[@]}"; do card_args+=(--card "$c=$c"); done
[ "${ONLY:-plan}" = plan ] && cold plan plan --example "$EXAMPLE" --mem-fraction "$FRACTION" --no-default-cards "${card_args[@]}" --devices 1 \
  --json "$DIR/plan.json"
[ "${ONLY:-fits}" = fits ] && for c in "${CARDS[@]}"; do
  cold "fit-$c" fit --example "$EXAMPLE" --mem-fraction "$FRACTION" --device-memory "$c" --json "$DIR/fit-$c.json"
done
python3 "$(dirname "$0")/plan_vs_fits_summary.py" "$DIR" "${CARDS[@]}" | tee "$DIR/summary.md"
