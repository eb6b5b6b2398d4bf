#!/usr/bin/env bash
# Prepare (on a machine with PyPI and the openpi mirror) what the GPU machine needs to run real openpi:
#   .openpi/  openpi's source at OPENPI_COMMIT (git archive of a bare mirror; no .git), pristine
#   .whl/     wheels for the Python packages openpi's train.py and jaxfit import that the GPU image lacks
# then checks that everything that travels (the working tree's tracked and untracked-not-ignored
# files, .openpi/ and .whl/) stays under LIMIT_MIB. Both folders must be ignored by git (this repo's
# .gitignore lists /.openpi/ and /.whl/; in another checkout add them to .gitignore or
# .git/info/exclude). Usage, from anywhere:
#   bash benchmarks/openpi/prepare.sh [OPENPI_GIT_DIR]
# OPENPI_GIT_DIR: a bare git directory of github:Physical-Intelligence/openpi (the search tool's
# fetch gives /work/.mirror/Physical-Intelligence+openpi/repo, the default).
set -euo pipefail

REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$REPO"
GIT_DIR_OPENPI=${1:-${OPENPI_GIT_DIR:-/work/.mirror/Physical-Intelligence+openpi/repo}}
OPENPI_COMMIT=${OPENPI_COMMIT:-15a9616}
LIMIT_MIB=${LIMIT_MIB:-60}
PY=${PYTHON:-python3}

for d in .openpi .whl; do
  if ! git check-ignore -q "$d/x"; then
    echo "prepare: error: $d/ is not ignored by git here; add '/$d/' to .gitignore or .git/info/exclude" >&2
    exit 2
  fi
done

# 1. openpi's source, without .git.
[ -d "$GIT_DIR_OPENPI" ] || { echo "prepare: error: no openpi git dir at $GIT_DIR_OPENPI (fetch github:Physical-Intelligence/openpi)" >&2; exit 2; }
if git --git-dir="$GIT_DIR_OPENPI" cat-file -e "$OPENPI_COMMIT^{commit}" 2>/dev/null; then
  REV=$OPENPI_COMMIT
else
  REV=$(git --git-dir="$GIT_DIR_OPENPI" rev-parse HEAD)
  echo "prepare: warning: commit $OPENPI_COMMIT is not in $GIT_DIR_OPENPI; using its newest commit $REV" >&2
fi
FULL=$(git --git-dir="$GIT_DIR_OPENPI" rev-parse "$REV^{commit}")
rm -rf .openpi && mkdir .openpi
git --git-dir="$GIT_DIR_OPENPI" archive "$FULL" | tar -x -C .openpi
echo "$FULL" > .openpi/COMMIT
echo "openpi: $(git --git-dir="$GIT_DIR_OPENPI" log -1 --format='%h %s' "$FULL") -> .openpi/ ($(du -sh .openpi | cut -f1))"

# 2. Wheels (Python 3.12, manylinux x86_64; --no-deps: every needed dependency is named here).
# What openpi 15a9616's scripts/train.py imports (fake data, random init) and the GPU image lacks:
#   tyro (+ docstring-parser, shtab, typeguard), wandb (+ gitpython, gitdb, smmap, sentry-sdk,
#   platformdirs, pydantic), beartype, augmax, ml-collections, numpydantic (+ pydantic, pydantic-core,
#   annotated-types, typing-inspection), tqdm-loggable.
# Not carried (never imported on this path): polars, gcsfs (only gs:// downloads), dm-tree and
# websockets (openpi-client modules train.py does not import), lerobot (a stand-in, stubs/),
# openpi and openpi-client themselves (put on sys.path from the patched copy).
# jaxfit itself needs tyro, wandb, rich, pyyaml, matplotlib, nvidia-ml-py: the last four are on the image.
# Versions: openpi's uv.lock, except wandb 0.27.2 (0.19.11 needs protobuf < 7; 0.27.2 takes 4.22-7.x
# and needs no setproctitle/docker-pycreds).
WHEELS=(
  tyro==0.9.22 docstring-parser==0.16 shtab==1.7.2 typeguard==4.4.2
  wandb==0.27.2 gitpython==3.1.44 gitdb==4.0.12 smmap==5.0.2 sentry-sdk==2.29.1 platformdirs==4.3.8
  beartype==0.19.0 augmax==0.4.1 ml-collections==1.0.0 tqdm-loggable==0.2
  numpydantic==1.6.9 pydantic==2.11.5 pydantic-core==2.33.2 annotated-types==0.7.0 typing-inspection==0.4.1
)
rm -rf .whl && mkdir .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}" 2>&1 | grep -v "is ignored" || true
n=$(ls .whl/*.whl | wc -l)
[ "$n" -eq "${#WHEELS[@]}" ] || { echo "prepare: error: $n wheels in .whl/, expected ${#WHEELS[@]}" >&2; ls .whl >&2; exit 1; }
echo "wheels: $n in .whl/ ($(du -sh .whl | cut -f1))"
ls -l .whl | awk 'NR > 1 {printf "  %9d  %s\n", $5, $9}'

# 3. What travels: the working tree (tracked + untracked-not-ignored) plus the two carried folders.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
openpi_bytes=$(find .openpi -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
whl_bytes=$(find .whl -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
total=$((tree_bytes + openpi_bytes + whl_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "travels: working tree $(mib "$tree_bytes") + .openpi $(mib "$openpi_bytes") + .whl $(mib "$whl_bytes") = $(mib "$total") (limit ${LIMIT_MIB} MiB of the device's 64)"
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "prepare: error: more than ${LIMIT_MIB} MiB would travel" >&2
  exit 1
fi
echo "prepare: ready; on the GPU machine: bash benchmarks/openpi/gpu_fit.sh CONFIG CARD (carry .openpi and .whl)"
