# Sourced (not run) by the GPU benchmark scripts, after they set OUT: go to the repository root,
# install the wheels carried in .whl (tyro, wandb...: the GPU image lacks them) into /tmp/site
# unless they import already, put /tmp/site and the repository on PYTHONPATH, make $OUT and record
# the GPUs in $OUT/gpus.txt.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
if [ -d .whl ] && ! python3 -c "import tyro, wandb" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
fi
export PYTHONPATH=/tmp/site:$REPO${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"

# bench_side GPU NAME ARGS...: one side of a benchmark, `python3 benchmarks/bench_tune.py run
# $BENCH_COMMON --out $OUT/NAME ARGS...` on CUDA device GPU, ended by the call's LIMIT (seconds
# since the script started: bash's SECONDS); skipped with under 30 s left; its exit is appended
# to $OUT/sides.txt. Set BENCH_COMMON (an array) and LIMIT before calling it.
bench_side() {
  local gpu=$1 name=$2 left=$((LIMIT - SECONDS))
  shift 2
  mkdir -p "$OUT/$name"
  if [ "$left" -lt 30 ]; then echo "$name skipped: $left s left" | tee -a "$OUT/sides.txt"; return; fi
  CUDA_VISIBLE_DEVICES=$gpu timeout --signal=TERM --kill-after=10 "$left" \
    python3 benchmarks/bench_tune.py "${BENCH_COMMON[@]}" --out "$OUT/$name" "$@" >"$OUT/$name/bench.log" 2>&1
  echo "$name exit $? after $SECONDS s" | tee -a "$OUT/sides.txt"
}

# probe_side LABEL ARGS...: one run of `python3 benchmarks/probe_speed.py --out $OUT/probe --label
# LABEL ARGS...` within the call's LIMIT (seconds since the script started), its output in
# $OUT/LABEL.log and its summary lines printed; skipped with under 80 s left; its exit is appended
# to $OUT/sides.txt.
probe_side() {
  local label=$1 left=$((LIMIT - SECONDS))
  shift
  if [ "$left" -lt 80 ]; then echo "$label skipped: $left s left" | tee -a "$OUT/sides.txt"; return; fi
  timeout --signal=TERM --kill-after=10 "$left" python3 benchmarks/probe_speed.py --out "$OUT/probe" \
    --label "$label" "$@" >"$OUT/$label.log" 2>&1
  echo "$label exit $? after $SECONDS s" | tee -a "$OUT/sides.txt"
  grep -E "^$label " "$OUT/$label.log"
}
