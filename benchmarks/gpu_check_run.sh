#!/usr/bin/env bash
# GPU check of `jaxfit run` (issue 3): fit scripts/train.py's gpt_small config by probing at
# fraction 0.3, train 20 steps at the fitted batch, and compare the run's measured peak with the
# prediction; then run the next batch up, which the fit says does not fit.
# Usage (on the GPU machine, from the repo root): OUT=/some/dir bash benchmarks/gpu_check_run.sh
set -u
OUT=${OUT:-/tmp/jaxfit-gpu-check}
mkdir -p "$OUT"
export JAXFIT_CACHE_DIR="$OUT/cache" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
TRAIN=(scripts/train.py gpt_small --checkpoint-base-dir=/tmp/jaxfit-ck --no-wandb-enabled --save-interval=1000)
$PY -m jaxfit.cli run --mem-fraction 0.3 --json "$OUT/plan.json" --probe-arg=--checkpoint-base-dir=/tmp/jaxfit-probe \
  -- $PY "${TRAIN[@]}" --exp-name=fitted --num-train-steps=20 --log-interval=5 2>&1 | tee "$OUT/run.log"
B=$($PY -c "import json, sys; print(json.load(open(sys.argv[1]))['batch_size'])" "$OUT/plan.json")
$PY -m jaxfit.cli run --mem-fraction 0.3 --batch-size $((B + 1)) \
  -- $PY "${TRAIN[@]}" --exp-name=plus-one --num-train-steps=3 --log-interval=1 > "$OUT/run_plus1.log" 2>&1
echo "batch $((B + 1)) exit code: $?" | tee -a "$OUT/run_plus1.log"
grep -E "RESOURCE_EXHAUSTED|memory:|done:" "$OUT/run_plus1.log" | head -3
