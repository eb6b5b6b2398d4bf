#!/usr/bin/env bash
# openpi on a machine without a GPU, for deviceless estimates (`jaxfit fit --script --gpu MODEL`):
#   bash benchmarks/openpi/cpu_setup.sh [VENV]      (default VENV: /work/openpi-env; needs Python 3.12)
# then, in each shell:  source VENV/activate-openpi.sh
# Makes VENV with cpu_requirements.txt, the patched openpi copy ($OPENPI_DIR, /tmp/openpi) from .openpi/
# (prepare.sh), and VENV/activate-openpi.sh: PYTHONPATH with the lerobot stub, openpi and this
# repository, JAX_PLATFORMS=cpu, WANDB_MODE=disabled. About 7 GB (torch and its CUDA libraries).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${1:-/work/openpi-env}
OPENPI_DIR=${OPENPI_DIR:-/tmp/openpi}
PY312=${PYTHON312:-$(command -v python3.12 || ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1 || true)}
[ -n "$PY312" ] || { echo "cpu_setup: error: no python3.12 (jax 0.11.2 needs it); set PYTHON312" >&2; exit 2; }
[ -d "$REPO/.openpi" ] || { echo "cpu_setup: error: no .openpi/ here; run benchmarks/openpi/prepare.sh first" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || "$PY312" -m venv "$VENV"
"$VENV/bin/pip" install -q --no-cache-dir -r "$REPO/benchmarks/openpi/cpu_requirements.txt"
"$VENV/bin/python" "$REPO/benchmarks/openpi/patch_openpi.py" "$REPO/.openpi" "$OPENPI_DIR"
cat >"$VENV/activate-openpi.sh" <<ACT
export OPENPI_DIR=$OPENPI_DIR
export PYTHONPATH=$REPO/benchmarks/openpi/stubs:$OPENPI_DIR/packages/openpi-client/src:$OPENPI_DIR/src:$REPO
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 JAX_PLATFORMS=cpu WANDB_MODE=disabled
ACT
echo "cpu_setup: ready; source $VENV/activate-openpi.sh"
