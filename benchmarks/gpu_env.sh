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
