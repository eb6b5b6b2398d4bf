#!/usr/bin/env bash
# A cold `jaxfit fit --script` of openpi at one card, with where its time went (issue 44).
# On the GPU machine, from the repository root, with .openpi and .whl carried (prepare.sh made them):
#   OUT=$OUT bash benchmarks/openpi/fit_phases.sh CONFIG CARD WIDTH
# e.g. OUT=$OUT bash benchmarks/openpi/fit_phases.sh pi0_libero 96GiB 8    # the default on a 16-core host
#      OUT=$OUT bash benchmarks/openpi/fit_phases.sh pi0_libero 96GiB 4    # the width before issue 44
# Each run has a cache folder of its own (cold: no answer, no compile is reused) and writes
# $OUT/w$WIDTH/CONFIG-CARD.json (the fit's JSON, with "phases") and .log; summarise with
#   python3 benchmarks/openpi/phases_summary.py $OUT/w*/*.json
set -uo pipefail
CONFIG=${1:?usage: fit_phases.sh CONFIG CARD WIDTH}
CARD=${2:?usage: fit_phases.sh CONFIG CARD WIDTH}
WIDTH=${3:?usage: fit_phases.sh CONFIG CARD WIDTH}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=${OUT:-/tmp/openpi-phases}
CACHE=$(mktemp -d /tmp/jaxfit-cold-XXXXXX)
OUT="$ROOT/w$WIDTH" JAXFIT_CACHE_DIR="$CACHE" JAXFIT_ARGS="--width $WIDTH ${JAXFIT_ARGS:-}" \
  CKPT_DIR="/tmp/ckpt-$CONFIG-$CARD-w$WIDTH" bash "$REPO/benchmarks/openpi/gpu_fit.sh" "$CONFIG" "$CARD"
RC=$?
rm -rf "$CACHE"
exit "$RC"
