# Sourced by gpu_fit.sh and gpu_run.sh on the GPU machine, in the repository root, with CONFIG, SITE,
# OPENPI_DIR and REPO set: the carried wheels into $SITE, openpi patched into $OPENPI_DIR, the
# environment, and a preflight on the CPU backend (versions, imports, the config's abstract sizes).
if [ ! -d "$SITE" ] || [ .whl -nt "$SITE" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || return 3
fi
# JAXFIT_SRC: a folder holding another jaxfit/ (a baseline: `git archive REV jaxfit configs | tar -x -C .before`),
# used instead of the repository's own.
export PYTHONPATH=$SITE:${JAXFIT_SRC:+$JAXFIT_SRC:}$REPO${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 OPENPI_DIR HOME=${OPENPI_HOME:-/tmp/openpi-home} JAXFIT_CACHE_DIR=${JAXFIT_CACHE_DIR:-/tmp/jaxfit-cache}
mkdir -p "$HOME"

python3 benchmarks/openpi/patch_openpi.py .openpi "$OPENPI_DIR" || return 4

echo "== preflight (CPU backend: nothing on the GPU)"
JAX_PLATFORMS=cpu python3 -P - <<'EOF' || return 5  # -P: jaxfit from PYTHONPATH, not the working folder
import importlib.metadata as md
for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "jaxtyping", "numpy", "torch", "transformers",
             "protobuf", "tyro", "wandb", "beartype", "pydantic", "typing_extensions"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} MISSING")
import jaxfit.cli  # noqa: F401  (jaxfit from the repository, or $JAXFIT_SRC)
print(f"  jaxfit from {jaxfit.cli.__file__}")
EOF
JAX_PLATFORMS=cpu timeout 240 python3 benchmarks/openpi/fake_configs.py "$CONFIG" || return 6

