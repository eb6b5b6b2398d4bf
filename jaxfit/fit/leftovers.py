"""What a probe's start-up leaves behind, and taking it away before the real run starts.

A probe runs the training script up to its first step, so the script's start-up runs for real: it
may create its checkpoint folder and write in it (openpi writes ``wandb_id.txt`` there even with
wandb disabled, and then refuses to start again without ``--overwrite``), write an evaluation or a
step-0 checkpoint, in the working folder or anywhere else (a trainer's ``--config.workdir``). The
real run would find them: one restored the probe's step-0 checkpoint. A probe must leave the
script's output folders as it found them, so around a fit of a script (:func:`cleaned`):

1. **What the probe created, wherever it is.** Each probe records the paths its processes create
   (:mod:`jaxfit._probe.jaxfit_writes`, a Python audit hook the start-up hook installs when
   ``$JAXFIT_PROBE_WRITES`` names the record's folder; data-loader workers too). When a probe
   ends and no other probe of the fit is alive (so a fit's next probe finds the folders as the
   first did: openpi refuses to start over its checkpoint folder), and again when the fit ends,
   every path they created that still exists is removed, data or not. A folder the probe created
   goes as a whole, with what libraries wrote in it from C++ (orbax's arrays through tensorstore,
   TF's event writer: no audit event tells of them), unless something wrote in it after the probes
   ended or a live process holds a file in it open: then it is cleaned entry by entry, and what the
   probe did not create stays, named. A file changed after the probes ended stays, named. A folder that existed before keeps what it held; only what the probe added
   goes. Nothing the probe did not create is removed, links are never followed, and what the
   probe fetched into a cache (``.cache``, ``$HF_HOME`` and the like, :data:`CACHE_VARIABLES`),
   jaxfit's own folders, environments and compiled Python are left alone, unsaid.
2. **The working folder, listed.** The net for writes no audit event tells of: it is listed before
   the first probe starts and after the last one ended; what appeared in between and holds no data
   is removed (unless another user owns it or another live process holds it open), what holds data is named, never deleted (jaxfit cannot tell it from what another
   run in the same folder wrote meanwhile, and a lost checkpoint is worse than a warning); the note
   says how to point the probe's outputs elsewhere (``--probe-arg``). The listing does not follow
   links and skips folders no script writes its outputs to (``.git``, virtual environments,
   caches); a folder too large to list is left alone, and said so, and so is a shared (sticky)
   folder such as ``/tmp``, where other programs' files and folders come and go.

The fit's message says what was removed and what was kept (paths in the working folder relative
to it, others absolute).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from jaxfit._probe import jaxfit_writes

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
PROBE_OUTPUTS = "/tmp/jaxfit-probe"
"""Where the advice points a probe's outputs."""
NEVER_REMOVED = frozenset(
    {".cache", "__pycache__", "site-packages", "dist-packages", ".git", ".hg", ".svn", "node_modules"}
)
"""Folder names below which nothing a probe created is removed, anywhere: caches and downloads,
installed packages, version control."""
CACHE_VARIABLES = (
    "XDG_CACHE_HOME",
    "HF_HOME",
    "HF_DATASETS_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "TORCH_HOME",
    "TFDS_DATA_DIR",
    "OPENPI_DATA_HOME",
    "JAX_COMPILATION_CACHE_DIR",
)
"""Variables naming cache and download folders: what a probe's start-up fetched there stays."""
_records_lock = threading.RLock()


@dataclasses.dataclass
class Leftovers:
    """What the probes of one fit left behind, and what was taken away.

    Paths in the working folder are relative to it; those elsewhere are absolute.

    Attributes:
      removed: What the probes created (and nothing else wrote into), removed.
      kept: What appeared with data that jaxfit cannot tell is the probe's alone, left in place.
      note: Why the working folder was not listed (too large), or None.
    """

    removed: list[str] = dataclasses.field(default_factory=list)
    kept: list[str] = dataclasses.field(default_factory=list)
    note: str | None = None

    def message(self, command: Sequence[str] = ()) -> str:
        """One clause for the fit's message ('' when there is nothing to say). ``command``: the
        script's command, whose own output flag the advice names when a kept path is below its value."""
        parts = []
        if self.removed:
            parts.append(
                f"removed what the probe's start-up created: {', '.join(self.removed[:6])}"
                + (f" and {len(self.removed) - 6} more" if len(self.removed) > 6 else "")
            )
        if self.kept:
            parts.append(
                f"while the probe ran, {', '.join(self.kept[:6])}"
                + (f" and {len(self.kept) - 6} more" if len(self.kept) > 6 else "")
                + " appeared with data in it and was left in place: the real run may find it (remove it if the "
                f"probe wrote it, {redirect_advice(command, self.kept)})"
            )
        if self.note:
            parts.append(self.note)
        return "; ".join(parts)


def redirect_advice(command: Sequence[str], kept: Sequence[str]) -> str:
    """How to keep a probe's outputs out of the real run's way, in the script's own words: its flag
    whose value holds a kept path (``--config.workdir=/w`` and ``/w/0/state`` kept:
    ``--probe-arg=--config.workdir=/tmp/jaxfit-probe``); without one, no flag is named."""
    kept_paths = [os.path.realpath(p) for p in kept]
    for i, word in enumerate(command):
        flag, sep, value = word.partition("=")
        if not sep and i + 1 < len(command) and word.startswith("-") and not command[i + 1].startswith("-"):
            value = command[i + 1]
        if not flag.startswith("-") or not value or value.isdigit():
            continue
        where = os.path.realpath(value)
        if any(p == where or p.startswith(where + os.sep) for p in kept_paths):
            return f"and point its outputs elsewhere while probing: --probe-arg={flag}={PROBE_OUTPUTS}"
    return "and point the script's outputs elsewhere while probing, with --probe-arg and its own output flag"


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


def shared(folder: Path) -> bool:
    """Whether ``folder`` is a shared one, sticky as ``/tmp`` is: every program makes its files and
    folders there, so what appeared in it during a probe is no sign the probe made it (an empty
    folder that another program had just made, pytest's for its next test among them, was taken
    from under it)."""
    try:
        return bool(folder.stat().st_mode & stat.S_ISVTX)
    except OSError:
        return False


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


@dataclasses.dataclass(eq=False)
class _Recording:
    """One :func:`cleaned` block's record of its probes' writes, and the probes alive now."""

    folder: str
    root: Path
    skip: frozenset[str]
    result: Leftovers
    live: int = 0
    named: set[str] = dataclasses.field(default_factory=set)

    def clean(self) -> None:
        """Take away what the record holds so far, then drop the record (:func:`_clean_recorded`)."""
        kept = _clean_recorded(self.folder, self.root, self.skip, time.time(), self.result)
        self.named.update(_shown(p, self.root) for p in kept)
        with contextlib.suppress(FileNotFoundError):  # its block has ended and taken the folder: nothing is left
            for name in os.listdir(self.folder):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.folder, name))


_records: list[_Recording] = []
"""The records of the :func:`cleaned` blocks now open, innermost last."""


def probe_environment() -> dict[str, str]:
    """What a probe started now gets in its environment to record what it creates: the record
    folder of the innermost :func:`cleaned` block (``{}`` outside one)."""
    with _records_lock:
        return {jaxfit_writes.VARIABLE: _records[-1].folder} if _records else {}


def probe_started(environment: dict[str, str]) -> _Recording | None:
    """A probe started with ``environment`` (:func:`probe_environment`) is alive: the record it writes
    to, for :func:`probe_ended`."""
    with _records_lock:
        for recording in _records:
            if recording.folder == environment.get(jaxfit_writes.VARIABLE):
                recording.live += 1
                return recording
    return None


def probe_ended(recording: _Recording | None) -> None:
    """A probe (its whole session) has ended: when no other probe of its block is alive, what they
    created is taken away now, so the next probe's start-up finds the folders as the first one did
    (openpi refuses to start over its own checkpoint folder)."""
    if recording is None:
        return
    with _records_lock:
        recording.live -= 1
        if recording.live == 0 and recording in _records:
            recording.clean()


def _shown(path: str, root: Path) -> str:
    """``path`` as the message gives it: relative to the working folder when inside it."""
    rel = os.path.relpath(path, root)
    return path if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def _protected_test(root: Path, exclude: frozenset[str]) -> Callable[[str], bool]:
    """Whether a path the probe created is left alone, and not said: compiled Python, jaxfit's own
    folders, caches and downloads (``.cache``, :data:`CACHE_VARIABLES`), environments and version
    control, ``/dev``, ``/proc``, ``/sys``, ``/run``; in the working folder, what its listing skips."""
    roots = set(exclude)
    for variable in CACHE_VARIABLES:
        value = os.environ.get(variable)
        if value:
            roots.add(os.path.realpath(value))

    def protected(path: str) -> bool:
        if path.endswith((".pyc", ".pyo")) or any(path == r or path.startswith(r + os.sep) for r in roots):
            return True
        parts = Path(path).parts
        if len(parts) > 1 and parts[1] in ("dev", "proc", "sys", "run"):
            return True
        if NEVER_REMOVED.intersection(parts):
            return True
        rel = os.path.relpath(path, root)
        if rel.startswith(os.pardir):
            return False
        return any(p in SKIP_DIRS or p.endswith(".egg-info") for p in Path(rel).parts)

    return protected


def _clean(
    path: str,
    created: dict[str, str],
    ended: float,
    protected: Callable[[str], bool],
    removed: list[str],
    kept: list[str],
) -> bool:
    """Take ``path`` away with what the probe alone put in it; whether it is gone.

    A path the probe did not create (a writer the audit hook cannot see, or another process) goes
    only when it holds no data, else it stays, in ``kept``; a file the probe created stays when it
    changed after the probes ended (``ended``); a folder goes when nothing in it stays. Links are
    never followed. In a folder that stays, what went is added to ``removed``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    try:
        if path not in created:
            if holds_data(Path(path)):
                kept.append(path)
                return False
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            return True
        if not stat.S_ISDIR(st.st_mode):
            if st.st_mtime > ended:
                kept.append(path)
                return False
            os.unlink(path)
            return True
        if _whole(path, ended):  # a folder the probe made, nothing written in it since: it goes, data and all
            shutil.rmtree(path)
            return True
        with os.scandir(path) as entries:
            children = sorted(entry.path for entry in entries)
        gone = []
        for child in children:
            if not protected(child) and _clean(child, created, ended, protected, removed, kept):
                gone.append(child)
        if len(gone) == len(children):
            os.rmdir(path)
            return True
        removed.extend(child for child in gone if child in created)
        return False
    except FileNotFoundError:
        return True
    except OSError:
        kept.append(path)
        return False


def _whole(folder: str, ended: float) -> bool:
    """Whether a folder the probe created goes as a whole, with what is in it, whoever wrote it: the
    probe's Python records its own writes, but not what libraries write from C++ (orbax's arrays
    through tensorstore, TensorFlow's event files), and a checkpoint with its metadata removed and its
    arrays left is a checkpoint the real run restores and crashes on. It stays, to be cleaned entry by
    entry, when anything in it changed after the probes ended or a live process holds a file in it
    open (another process writes there)."""
    for where, _dirs, files in os.walk(folder, followlinks=False):
        for name in [*files, *_dirs]:
            try:
                if os.lstat(os.path.join(where, name)).st_mtime > ended:
                    return False
            except FileNotFoundError:
                continue
    return not _open_by_others(folder)


def _open_by_others(folder: str, exact: bool = False) -> bool:
    """Whether a live process other than this one has a file below ``folder`` (``exact``: or
    ``folder`` itself, a file) open (Linux's /proc; elsewhere: False)."""
    prefix = folder.rstrip(os.sep) + os.sep
    whole = folder.rstrip(os.sep)
    mine = str(os.getpid())
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and p != mine]
    except OSError:
        return False
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or not ours to look at
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefix) or (exact and target == whole):
                return True
    return False


def _clean_recorded(record: str, root: Path, exclude: frozenset[str], ended: float, result: Leftovers) -> list[str]:
    """Take away what the probes' record says they created (:func:`_clean`); what stayed with data,
    as absolute paths."""
    protected = _protected_test(root, exclude)
    created: dict[str, str] = {}
    for path, kind in jaxfit_writes.created(record).items():
        real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        if not protected(real):
            created[real] = kind
    removed: list[str] = []
    kept: list[str] = []
    for top in tops(set(created)):
        existed = os.path.lexists(top)
        if _clean(top, created, ended, protected, removed, kept) and existed:
            removed.append(top)
    result.removed.extend(_shown(p, root) for p in removed)
    result.kept.extend(_shown(p, root) for p in kept)
    return kept


@contextlib.contextmanager
def cleaned(
    root: str | os.PathLike[str] | None, exclude: tuple[str | os.PathLike[str], ...] = ()
) -> Iterator[Leftovers]:
    """Record what the body's probes create, and list ``root`` around the body; at its end, take
    away what they left (module docstring).

    ``exclude``: folders jaxfit itself writes to meanwhile (its cache), never listed nor touched."""
    result = Leftovers()
    folder = Path(root or os.getcwd()).resolve()
    skip = frozenset(str(Path(p).resolve()) for p in exclude)
    record = _Recording(tempfile.mkdtemp(prefix="jaxfit-writes-"), folder, skip, result)
    is_shared = shared(folder)
    before = None if is_shared else listing(folder, skip)
    if is_shared:
        result.note = (
            f"{folder} is a shared folder (sticky, as /tmp): only what the probe's own processes created in it "
            "is taken away, not what appeared there meanwhile"
        )
    elif before is None:
        result.note = f"{folder} is too large to check for what the probe created"
    with _records_lock:
        _records.append(record)
    try:
        yield result
    finally:
        with _records_lock:
            _records.remove(record)
        try:
            record.clean()
        finally:
            shutil.rmtree(record.folder, ignore_errors=True)
        if before is not None:
            _clean_listed(folder, skip, before, record.named, result)
        result.removed = list(dict.fromkeys(result.removed))
        result.kept = list(dict.fromkeys(result.kept))


def _clean_listed(folder: Path, skip: frozenset[str], before: set[str], named: set[str], result: Leftovers) -> None:
    """The net for writes no audit event tells of: what appeared in the working folder and holds no
    data is removed, what holds data is named (unless it already is, or is in what is)."""
    after = listing(folder, skip)
    for rel in tops((after or set()) - before):
        if rel.endswith(".pyc") or any(
            rel == n or n.startswith(rel + os.sep) or rel.startswith(n + os.sep) for n in named
        ):
            continue
        path = folder / rel
        try:
            if path.lstat().st_uid != os.getuid() or _open_by_others(str(path), exact=True):
                continue  # another user's, or in use by another process: not the probe's to take away
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
