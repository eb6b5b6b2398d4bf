"""The example project a pip install carries: ``jaxfit examples --copy DIR`` writes it out.

It is the repository's ``scripts/train.py`` (an openpi-style training script of the example models,
shipped as ``jaxfit.scripts``) and its queue files ``configs/queue-*.yaml`` (shipped in
``jaxfit.configs``), laid out as in the repository, so that the README's commands run from ``DIR``
as they run from a clone.
"""

from __future__ import annotations

import importlib.resources
import os
import tempfile
from pathlib import Path

from jaxfit.errors import ConfigError

STARTER_FILES = {
    "scripts/train.py": ("jaxfit.scripts", "train.py"),
    "configs/queue-debug.yaml": ("jaxfit.configs", "queue-debug.yaml"),
    "configs/queue-96gb.yaml": ("jaxfit.configs", "queue-96gb.yaml"),
}
"""Each file written, relative to the destination, and the package resource it comes from."""


def starter_text(relative: str) -> str:
    """The text of one starter file (a key of :data:`STARTER_FILES`)."""
    package, name = STARTER_FILES[relative]
    return importlib.resources.files(package).joinpath(name).read_text(encoding="utf-8")


def copy_starter(destination: str | os.PathLike[str], overwrite: bool = False) -> list[Path]:
    """Write the starter files under ``destination`` (created if missing) and return their paths.

    Nothing is written unless everything can be: a file that exists already (without
    ``overwrite``), a destination that is a file, or a folder that cannot be written is a
    :class:`~jaxfit.errors.ConfigError` before the first file. Each file is written whole (a
    temporary file renamed into place).
    """
    root = Path(destination).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--copy {destination}: is a file, not a folder; name a folder to write the example into")
    targets = {relative: root / relative for relative in STARTER_FILES}
    existing = [str(path) for path in targets.values() if path.exists()]
    if existing and not overwrite:
        raise ConfigError(
            f"--copy {destination}: {', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; "
            "pass --overwrite to replace, or name another folder"
        )
    texts = {relative: starter_text(relative) for relative in STARTER_FILES}
    try:
        for path in targets.values():
            path.parent.mkdir(parents=True, exist_ok=True)
            if not os.access(path.parent, os.W_OK):
                raise PermissionError(str(path.parent))
    except OSError as e:
        raise ConfigError(f"--copy {destination}: cannot write there ({e}); name a folder of yours") from None
    written = []
    for relative, path in targets.items():
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(texts[relative])
            os.chmod(temporary, 0o755 if path.suffix == ".py" else 0o644)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        written.append(path)
    return written
