#!/usr/bin/env python3
"""Copy an openpi checkout to a scratch folder and patch the copy for the GPU image's newer versions.

openpi at commit 15a9616 pins jax 0.5.3, flax 0.10.2, jaxtyping 0.2.36 and orbax 0.11.13; the GPU
machines have jax 0.11.2, flax 0.12.10, jaxtyping 0.3.11 and orbax 0.12.4. Four things break there
(``/work/shared/openpi-env.md``); each change below is the smallest one that gets past it. None of
them touches what the train step computes or the shapes, dtypes and shardings of its inputs and
outputs, so none can change the memory XLA plans for it (each change's ``why`` says why).

    python benchmarks/openpi/patch_openpi.py SRC DEST      # e.g. .openpi /tmp/openpi

SRC is never written. DEST is replaced when it holds an earlier patched copy (the marker file
``.jaxfit-patches.json``); any other existing DEST is refused. Every change is printed; a target text
that is missing (or found more than once) stops the script with exit code 1 and nothing is left at DEST.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

MARKER = ".jaxfit-patches.json"


@dataclasses.dataclass(frozen=True)
class Patch:
    name: str
    path: str  # relative to the openpi checkout
    old: str
    new: str
    why: str


# 1. jaxtyping 0.3 removed the private hook openpi replaces (import fails).
_HOOK_OLD = (
    "_original_check_dataclass_annotations = jaxtyping._decorator._check_dataclass_annotations  # noqa: SLF001\n"
)
_HOOK_NEW = (
    "_original_check_dataclass_annotations = getattr(  # noqa: SLF001\n"
    '    jaxtyping._decorator, "_check_dataclass_annotations", None  # jaxfit patch: gone in jaxtyping 0.3\n'
    ")\n"
)

# 2. openpi skips its run-time checks of TrainState/Observation while jax rebuilds a pytree (the
#    rebuilt fields hold ShapeDtypeStructs, shardings or sentinels, not arrays). With jaxtyping 0.3
#    the hook it used for that is gone and jax 0.11 rebuilds pytrees from jax._src.flattree too, so
#    the same rule is applied by wrapping the checked __init__ of the classes openpi decorates.
_SKIP_OLD = (
    '        frame.frame.f_globals.get("__name__") in {"jax._src.tree_util", "flax.nnx.transforms.compilation"}\n'
)
_SKIP_NEW = (
    '        frame.frame.f_globals.get("__name__") in _PYTREE_REBUILD_MODULES  # jaxfit patch: + jax._src.flattree\n'
)

_TYPECHECK_OLD = """def typecheck(t: T) -> T:
    return cast(T, ft.partial(jaxtyped, typechecker=beartype.beartype)(t))
"""
_TYPECHECK_NEW = """def _in_pytree_rebuild() -> bool:  # jaxfit patch
    frame = sys._getframe(1)  # noqa: SLF001
    while frame is not None:
        if frame.f_globals.get("__name__") in _PYTREE_REBUILD_MODULES:
            return True
        frame = frame.f_back
    return False


def typecheck(t: T) -> T:
    # jaxfit patch: jaxtyping >= 0.3 has no dataclass hook to skip checks while jax rebuilds a pytree;
    # keep openpi's rule (check on construction, skip on rebuild) by wrapping the checked __init__.
    if _original_check_dataclass_annotations is None and inspect.isclass(t) and dataclasses.is_dataclass(t):
        unchecked_init = t.__init__
        checked = jaxtyped(t, typechecker=beartype.beartype)
        checked_init = checked.__init__

        @ft.wraps(unchecked_init)
        def __init__(self, *args, **kwargs):  # noqa: N807
            if _in_pytree_rebuild():
                return unchecked_init(self, *args, **kwargs)
            return checked_init(self, *args, **kwargs)

        checked.__init__ = __init__
        return cast(T, checked)
    return cast(T, ft.partial(jaxtyped, typechecker=beartype.beartype)(t))
"""
_IMPORTS_OLD = "import contextlib\nimport functools as ft\nimport inspect\n"
_IMPORTS_NEW = "import contextlib\nimport dataclasses\nimport functools as ft\nimport inspect\nimport sys\n"
_MODULES_OLD = "# Redefine Array to include both JAX arrays and PyTorch tensors\n"
_MODULES_NEW = (
    "# jaxfit patch: where jax (0.5: tree_util; 0.11: flattree too) and flax nnx rebuild pytrees.\n"
    '_PYTREE_REBUILD_MODULES = {"jax._src.tree_util", "jax._src.flattree", "flax.nnx.transforms.compilation"}\n'
    + _MODULES_OLD
)

_NO_MEMORY_CHECKS = (
    "run-time type checks are Python code that runs while the step is traced; they add no operation to "
    "the traced program, so the compiled step (and its memory) is the same with or without them"
)

PATCHES = [
    Patch(
        "jaxtyping-private-hook",
        "src/openpi/shared/array_typing.py",
        _HOOK_OLD,
        _HOOK_NEW,
        "jaxtyping 0.3 has no _decorator._check_dataclass_annotations: read it with getattr (import-time only)",
    ),
    Patch(
        "jaxtyping-imports",
        "src/openpi/shared/array_typing.py",
        _IMPORTS_OLD,
        _IMPORTS_NEW,
        "imports the typecheck wrapper below needs",
    ),
    Patch(
        "jaxtyping-rebuild-modules",
        "src/openpi/shared/array_typing.py",
        _MODULES_OLD,
        _MODULES_NEW,
        "jax 0.11 rebuilds pytrees (eval_shape, jit, grad) from jax._src.flattree as well as jax._src.tree_util",
    ),
    Patch(
        "jaxtyping-rebuild-skip-list",
        "src/openpi/shared/array_typing.py",
        _SKIP_OLD,
        _SKIP_NEW,
        "openpi's own hook (jaxtyping 0.2) uses the same module list; " + _NO_MEMORY_CHECKS,
    ),
    Patch(
        "jaxtyping-dataclass-rebuild",
        "src/openpi/shared/array_typing.py",
        _TYPECHECK_OLD,
        _TYPECHECK_NEW,
        "TypeCheckError TrainState.__init__ 'step' / Observation.__init__ 'images' while jax rebuilds them; "
        "construction is still checked, rebuilding is skipped as openpi intends; " + _NO_MEMORY_CHECKS,
    ),
    Patch(
        "mesh-axis-types-auto",
        "src/openpi/training/sharding.py",
        "    return jax.make_mesh(mesh_shape, (BATCH_AXIS, FSDP_AXIS))\n",
        "    return jax.make_mesh(  # jaxfit patch: Auto axes, as jax.make_mesh made them in openpi's jax 0.5\n"
        "        mesh_shape, (BATCH_AXIS, FSDP_AXIS), axis_types=(jax.sharding.AxisType.Auto,) * 2\n"
        "    )\n",
        "jax 0.11's make_mesh makes Explicit axes (augmax's vmap then fails: 'Mapped away dimension ... sharded "
        "the same'); Auto axes are the sharding mode openpi was written for (jax 0.5.3 had no other), so the "
        "step is partitioned as openpi intends",
    ),
    Patch(
        "nnx-flat-state-paths",
        "src/openpi/shared/nnx_utils.py",
        "    filtered_keys = set(state.filter(filter).flat_state())\n",
        "    flat = state.filter(filter).flat_state()\n"
        '    filtered_keys = set(getattr(flat, "paths", flat))  # jaxfit patch: flax 0.12 FlatState is (path, leaf) pairs\n',
        "flax 0.12's State.flat_state() is a sequence of (path, leaf) pairs, not flax 0.10's dict of paths "
        "(TypeError: unhashable type: 'Param' in every config with a freeze filter, i.e. LoRA); the same set of "
        "paths is read, so exactly the params openpi freezes are cast to bfloat16, as openpi intends",
    ),
    Patch(
        "orbax-step-metadata",
        "src/openpi/models/model.py",
        '        item = {"params": metadata["params"]}\n',
        '        item = {"params": getattr(metadata, "item_metadata", metadata)["params"]}  # jaxfit patch: orbax 0.12\n',
        "orbax 0.12 returns StepMetadata from metadata(); only checkpoint loading reads it (random-init fits never "
        "do), and it is read before the step exists",
    ),
]


def apply(src: Path, dest: Path, skip: tuple[str, ...] = ()) -> list[dict[str, str]]:
    if not (src / "scripts" / "train.py").is_file() or not (src / "src" / "openpi").is_dir():
        sys.exit(f"patch_openpi: error: {src} is not an openpi checkout (no scripts/train.py, src/openpi)")
    if dest.exists():
        if not (dest / MARKER).is_file():
            sys.exit(
                f"patch_openpi: error: {dest} exists and is not a patched copy (no {MARKER}); refusing to replace it"
            )
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc"))
    applied = []
    try:
        for patch in PATCHES:
            if patch.name in skip:
                print(f"skipped {patch.path} [{patch.name}] (--skip)")
                continue
            path = tmp / patch.path
            text = path.read_text()
            count = text.count(patch.old)
            if count != 1:
                raise SystemExit(
                    f"patch_openpi: error: {patch.name}: target text found {count} times in {patch.path} "
                    f"(expected once; is this openpi 15a9616?):\n{patch.old}"
                )
            path.write_text(text.replace(patch.old, patch.new))
            print(f"patched {patch.path} [{patch.name}]: {patch.why}")
            applied.append({"name": patch.name, "path": patch.path, "why": patch.why})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    commit = (src / "COMMIT").read_text().strip() if (src / "COMMIT").is_file() else "unknown"
    (tmp / MARKER).write_text(json.dumps({"source": str(src), "commit": commit, "patches": applied}, indent=1))
    tmp.rename(dest)
    return applied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="pristine openpi checkout (read only)")
    parser.add_argument("dest", type=Path, help="scratch folder for the patched copy")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=[p.name for p in PATCHES],
        help="leave this change out (controls)",
    )
    args = parser.parse_args()
    applied = apply(args.src.resolve(), args.dest.resolve(), tuple(args.skip))
    print(f"patch_openpi: {len(applied)} changes applied; patched copy at {args.dest}")


if __name__ == "__main__":
    main()
