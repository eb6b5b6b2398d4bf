"""What a probe's start-up leaves behind, and taking it away before the real run starts.

A probe runs the training script up to its first step, so the script's start-up runs for real: it
may create its checkpoint folder (openpi and ``scripts/train.py`` do, and then refuse to start
again without ``--overwrite``), write an evaluation or a step-0 checkpoint, or an experiment folder.
The real run would find them: one restored the probe's step-0 checkpoint. So around a fit of a
script, the working folder is listed before the first probe starts and after the last one ended.
What appeared in between and holds no data (empty folders and files, as the checkpoint folder a
script creates at start-up) is removed. What holds data is named, never deleted: jaxfit cannot
tell a probe's step-0 checkpoint from one another run in the same folder wrote meanwhile, and a
lost checkpoint is worse than a warning; the note says how to point the probe's outputs elsewhere
(``--probe-arg``). Only the working folder is looked at, without following links, skipping folders
no script writes its outputs to (``.git``, virtual environments, caches); a folder too large to list
is left alone, and said so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        "env",
        "node_modules",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".nox",
        ".cache",
        ".ipynb_checkpoints",
    }
)
"""Folder names never listed (and never removed): version control, environments, caches."""
MAX_ENTRIES = 200_000
"""Entries listed at most; a larger working folder is not checked."""
REDIRECT_HINT = "--probe-arg=--checkpoint-base-dir=/tmp/jaxfit-probe"


@dataclasses.dataclass
class Leftovers:
    """What the probes of one fit left in the working folder.

    Attributes:
      removed: Paths (relative to the folder) they created that hold no data, removed.
      kept: Paths they created that hold data, left in place.
      note: Why nothing was checked (a folder too large), or None.
    """

    removed: list[str] = dataclasses.field(default_factory=list)
    kept: list[str] = dataclasses.field(default_factory=list)
    note: str | None = None

    def message(self) -> str:
        """One clause for the fit's message ('' when there is nothing to say)."""
        parts = []
        if self.removed:
            parts.append(
                f"removed what the probe's start-up created: {', '.join(self.removed[:6])}"
                + (f" and {len(self.removed) - 6} more" if len(self.removed) > 6 else "")
            )
        if self.kept:
            parts.append(
                f"while the probe ran, {', '.join(self.kept[:6])} appeared with data in it and was left in "
                f"place: the real run may find it (remove it if the probe wrote it, and point the script's "
                f"outputs elsewhere while probing, e.g. {REDIRECT_HINT})"
            )
        if self.note:
            parts.append(self.note)
        return "; ".join(parts)


def listing(root: Path, exclude: frozenset[str] = frozenset()) -> set[str] | None:
    """Every path below ``root`` (relative, folders too), or None when there are too many.

    ``exclude``: absolute paths of folders not to list (jaxfit's own cache)."""
    found: set[str] = set()
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [
            d
            for d in dirs
            if d not in SKIP_DIRS and not d.endswith(".egg-info") and os.path.join(folder, d) not in exclude
        ]
        rel = os.path.relpath(folder, root)
        for name in dirs + files:
            found.add(name if rel == "." else os.path.join(rel, name))
        if len(found) > MAX_ENTRIES:
            return None
    return found


def holds_data(path: Path) -> bool:
    """Whether ``path`` is, or holds, a non-empty file or a link (links are not followed)."""
    if path.is_symlink():
        return True
    if not path.is_dir():
        return path.stat().st_size > 0
    for folder, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            file = os.path.join(folder, name)
            if os.path.islink(file) or os.lstat(file).st_size > 0:
                return True
        if any(os.path.islink(os.path.join(folder, d)) for d in _dirs):
            return True
    return False


def tops(paths: set[str]) -> list[str]:
    """The outermost of ``paths`` (a created folder stands for everything in it)."""
    out: list[str] = []
    for path in sorted(paths):
        if not any(path.startswith(top + os.sep) for top in out):
            out.append(path)
    return out


@contextlib.contextmanager
def cleaned(
    root: str | os.PathLike[str] | None, exclude: tuple[str | os.PathLike[str], ...] = ()
) -> Iterator[Leftovers]:
    """List ``root`` before the body (the probes) and remove what appeared by its end (module docstring).

    ``exclude``: folders jaxfit itself writes to meanwhile (its cache), never listed."""
    result = Leftovers()
    folder = Path(root or os.getcwd()).resolve()
    skip = frozenset(str(Path(p).resolve()) for p in exclude)
    before = listing(folder, skip)
    if before is None:
        result.note = f"{folder} is too large to check for what the probe created"
    try:
        yield result
    finally:
        if before is not None:
            after = listing(folder, skip)
            created = tops((after or set()) - before)
            for rel in created:
                path = folder / rel
                if rel.endswith(".pyc"):
                    continue
                try:
                    if holds_data(path):
                        result.kept.append(rel)
                        continue
                    if path.is_dir():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
                    result.removed.append(rel)
                except FileNotFoundError:
                    continue
                except OSError:
                    result.kept.append(rel)
