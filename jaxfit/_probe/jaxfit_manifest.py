"""What a probed training script ran: the files it imported and read, so a repeat of ``jaxfit fit
--script`` can tell that nothing changed and answer from the cache without starting it.

The probe records a *manifest* in the process itself at the moment the train step is taken
(:func:`collect`, called by the start-up hook's ``_serve``); jaxfit stores it with the answer, and
a repeat of the same command re-checks it (:func:`check`) before reusing the answer and its pin.
The command, working folder, interpreter path and the environment variables that reach XLA and
JAX are part of the cache key itself (:meth:`jaxfit.fit.sources.ScriptSource.identity`).

Covered:

- every module in ``sys.modules`` that has a file, but those the run wrote itself (TensorFlow's
  autograph converts functions into ``/tmp/__autograph_generated_file*.py`` modules, made again by
  every run, which the probe's clean-up removes): Python sources (and ``.pyc``-only modules,
  data files imported as modules) by SHA-256 of their content; binary extension modules
  (``.so``, ``.pyd``, ``.dylib``) by size and ``mtime_ns``, since hashing a 300 MB jaxlib on
  every repeat would be too slow (a reinstalled wheel rewrites the file, so its mtime changes);
- the interpreter (``sys.executable``, its real file by size and ``mtime_ns``) and
  ``sys.version``;
- files under the working folder that the script opened *for reading* (``open()``,
  ``io.open_code``, ``os.open`` without a write flag), seen through an audit hook installed at
  start-up (:func:`watch_reads`): a YAML config, a JSON of normalisation statistics. Those of at
  most :data:`HASH_LIMIT` bytes are hashed, larger ones compared by size and ``mtime_ns``; a file
  that did not exist when it was opened must still not exist.

Not covered (use ``--no-cache`` after changing them):

- a file the script only tested for (``os.path.exists``: no audit event) before opening it,
  and files that it reads only at times (a resumed checkpoint);
- files read from outside the working folder (a dataset or config under ``~/.cache`` or
  ``/data``), and files read by native code (a C++ data loader opens files without Python's
  audit events);
- environment variables other than those of XLA, JAX, CUDA, NCCL, TF and Python
  (the parent's key), e.g. ``MY_MODEL_SIZE`` read by the script;
- anything the script reads over the network, or the time and random state it starts from;
- shared libraries loaded by other means than an import (CUDA's own libraries through
  ``dlopen``): a changed CUDA or driver is the device identity's and the jax version's business.

Standard library only, Python 3.9+, no jaxfit imports: it runs in the script's own environment.
"""

import hashlib
import os
import sys
import time
from typing import Any, Dict, List, Optional

FORMAT = 1
HASH_LIMIT = 1 << 20
"""Files read from the working folder up to this size are hashed, larger ones compared by stat."""
BINARY_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_reads: "Dict[str, None]" = {}  # absolute paths opened for reading under the folder (ordered set)
_folder: "List[str]" = []  # the working folder at start-up, once watched
_started: "List[int]" = []  # when watching started (ns): files written since are the script's output


def _binary(path: str) -> bool:
    name = os.path.basename(path)
    return name.endswith(BINARY_SUFFIXES) or ".so." in name


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def _by_content(path: str) -> "List[Any]":
    return ["sha256", _sha256(path)]


def _by_stat(path: str) -> "List[Any]":
    st = os.stat(path)
    return ["stat", st.st_size, st.st_mtime_ns]


def _entry(path: str, kind: str) -> "List[Any]":
    """How ``path`` is recorded now: ``kind`` is ``sha256``, ``stat`` or ``missing``; a file that
    cannot be read is recorded as missing (so it differs from any readable one)."""
    try:
        if kind == "sha256":
            return _by_content(path)
        if kind == "stat":
            return _by_stat(path)
    except OSError:
        pass
    return ["missing"] if not os.path.exists(path) else ["unreadable"]


def _module_files() -> "List[str]":
    files = []
    for module in list(sys.modules.values()):
        try:
            path = getattr(module, "__file__", None)
        except Exception:  # a lazy module whose attribute access imports (and fails)
            continue
        if isinstance(path, str) and path:
            files.append(os.path.abspath(path))
    return files


def _on_audit(event: str, args: tuple) -> None:
    """Notes files under the working folder opened for reading (audit event ``open``)."""
    if event != "open" or not _folder:
        return
    try:
        path, mode, flags = args
        if isinstance(mode, str):
            if any(c in mode for c in "wax+"):
                return
        elif isinstance(flags, int) and flags & _WRITE_FLAGS:
            return
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str) or path.endswith((".pyc", ".pyo")):
            return
        path = os.path.abspath(path)
        if path.startswith(_folder[0]) and path not in _reads:
            _reads[path] = None
    except Exception:  # never break the script over the manifest
        pass


def watch_reads() -> None:
    """Start noting files under the working folder the script opens for reading (once; audit hooks
    cannot be removed, and this one returns at once for every other event)."""
    if _folder or not hasattr(sys, "addaudithook"):
        return
    _folder.append(os.path.join(os.path.abspath(os.getcwd()), ""))
    _started.append(time.time_ns())
    sys.addaudithook(_on_audit)


def _written_here(path: str) -> bool:
    """Whether ``path`` was written since this process started: the script's own output (a file
    its start-up wrote and read back), not an input (the probe's leftovers are removed after it)."""
    try:
        return bool(_started) and os.stat(path).st_mtime_ns >= _started[0]
    except OSError:
        return False


def collect() -> "Optional[Dict[str, Any]]":
    """The manifest of this process now (None when it cannot be made, then nothing is cached).

    ``{"format", "python", "executable", "folder", "files": {path: entry}}``, an entry being
    ``["sha256", hex]``, ``["stat", size, mtime_ns]`` or ``["missing"]``.
    """
    try:
        files: "Dict[str, List[Any]]" = {}
        for path in _module_files():
            if _written_here(path):  # generated by the run itself (TensorFlow's autograph writes modules to
                continue  # /tmp): made again by every run, and no source of the script
            if path not in files and os.path.isfile(path):
                files[path] = _entry(path, "stat" if _binary(path) else "sha256")
        for path in list(_reads):
            if path in files or os.path.isdir(path) or _written_here(path):
                continue
            if not os.path.exists(path):
                files[path] = ["missing"]
            elif _binary(path) or os.path.getsize(path) > HASH_LIMIT:
                files[path] = _entry(path, "stat")
            else:
                files[path] = _entry(path, "sha256")
        executable = os.path.realpath(sys.executable) if sys.executable else ""
        if executable:
            files[executable] = _entry(executable, "stat")
        return {
            "format": FORMAT,
            "python": sys.version,
            "executable": sys.executable,
            "folder": _folder[0] if _folder else None,
            "files": files,
        }
    except Exception:
        return None


def check(manifest: "Dict[str, Any]") -> "Optional[str]":
    """None when every file of ``manifest`` is as it was, else the first difference, in words
    (``"train.py changed"``). Python sources are hashed again, binaries stat'ed."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return "no manifest of the files the script ran"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return "no manifest of the files the script ran"
    for path, recorded in files.items():
        kind = recorded[0] if isinstance(recorded, list) and recorded else "?"
        if kind == "missing":
            if os.path.exists(path):
                return "%s appeared" % path
            continue
        now = _entry(path, kind)
        if now != recorded:
            return "%s %s" % (path, "is gone" if now == ["missing"] else "changed")
    return None
