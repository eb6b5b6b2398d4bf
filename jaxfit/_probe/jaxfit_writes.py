"""What a probed script creates on disk: recorded in the probe by an audit hook, read by jaxfit.

A probe runs the script's start-up for real, and the start-up writes: a checkpoint folder (in the
working folder or anywhere else: a trainer's ``--config.workdir``), a ``wandb_id.txt`` in it, a
step-0 checkpoint. The start-up hook (:mod:`sitecustomize`) calls :func:`install` in a probe
(``$JAXFIT_PROBE_WRITES`` names a folder): a :func:`sys.addaudithook` hook then appends one line per
path the process *creates* (it did not exist just before) to ``<folder>/writes-<pid>.jsonl``:

- ``["dir", path]``: ``os.mkdir`` (``os.makedirs`` and ``pathlib``'s ``mkdir`` go through it, one
  event per folder);
- ``["file", path]``: ``open``/``os.open`` with a write, create or append flag (``shutil.copyfile``
  and ``tempfile`` open their files so too), ``os.symlink``, ``os.link``;
- ``["rename", src, dst, dst_existed]``: ``os.rename``/``os.replace`` (an atomic checkpoint write
  renames its temporary folder);
- ``["remove", path]``: ``os.remove``/``os.unlink``, ``os.rmdir``, ``shutil.rmtree``.

Forked children (data-loader workers) inherit the hook and its descriptor (each line is one
``O_APPEND`` write); spawned ones import ``sitecustomize`` again and record into their own file.
Writes made outside Python (tensorstore, TF's event writer, a shell) raise no audit event: jaxfit's
listing of the working folder remains the net for those (:mod:`jaxfit.fit.leftovers`).

The hook is called for every audit event of the process, so it returns at once for the others, and
it never raises (an exception in an audit hook would fail the script's own call). Standard library
only, Python 3.9+: it runs in the script's environment. :func:`created` is jaxfit's reading of the
record.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Optional, Tuple

VARIABLE = "JAXFIT_PROBE_WRITES"
"""The folder the record goes to; set only for a probe."""
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_EVENTS = frozenset(
    {"open", "os.mkdir", "os.rename", "os.symlink", "os.link", "os.remove", "os.rmdir", "shutil.rmtree"}
)
_installed: "list[str]" = []


def _path(path: Any, dir_fd: Any = None) -> Optional[str]:
    """The absolute path of an event's path argument (None for a descriptor or a bad argument)."""
    if isinstance(path, int):
        return None
    path = os.fsdecode(os.fspath(path))
    if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(path):
        base = os.readlink("/proc/self/fd/%d" % dir_fd)  # Linux; elsewhere the event is not recorded
        return os.path.normpath(os.path.join(base, path))
    return os.path.abspath(path)


def install(folder: str) -> None:
    """Record what this process creates into ``folder`` (once per process; forks inherit it)."""
    if _installed:
        return
    folder = os.path.abspath(folder)
    try:
        fd = os.open(
            os.path.join(folder, "writes-%d.jsonl" % os.getpid()),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
        )
    except OSError:  # no record (jaxfit's folder gone): the script runs all the same
        return
    _installed.append(folder)
    skip = folder + os.sep
    events = _EVENTS
    write_flags = _WRITE_FLAGS
    lexists = os.path.lexists

    def record(*item: Any) -> None:
        if not item[1].startswith(skip):
            os.write(fd, (json.dumps(item) + "\n").encode("utf-8", "surrogatepass"))

    def hook(event: str, args: Tuple[Any, ...]) -> None:
        if event not in events:
            return
        try:
            if event == "open":
                flags = args[2]
                if not flags or not flags & write_flags:
                    return
                path = _path(args[0])
                if path is not None and not lexists(path):
                    record("file", path)
            elif event == "os.mkdir":
                path = _path(args[0], args[2])
                if path is not None and not lexists(path):
                    record("dir", path)
            elif event == "os.rename":
                src, dst = _path(args[0], args[2]), _path(args[1], args[3])
                if src is not None and dst is not None:
                    record("rename", src, dst, lexists(dst))
            elif event in ("os.symlink", "os.link"):
                path = _path(args[1], args[2] if event == "os.symlink" else args[3])
                if path is not None and not lexists(path):
                    record("file", path)
            elif len(args) < 2 or args[1] is None or args[1] == -1:  # removals inside rmtree use a dir_fd
                path = _path(args[0])
                if path is not None:
                    record("remove", path)
        except Exception:  # never fail the script's own call
            pass

    sys.addaudithook(hook)


def created(folder: str) -> "Dict[str, str]":
    """What the probe's processes created and did not take away, from the record in ``folder``:
    ``{absolute path: "dir" | "file"}``. A renamed path takes its created contents along; a path
    renamed from something the probe did not create, or onto something that existed, is not the
    probe's. Each process's lines are read in their order, the processes one after another."""
    out: "Dict[str, str]" = {}
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("writes-"))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8", errors="surrogatepass") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                item = json.loads(line)
            except ValueError:  # a line cut short when the probe was killed
                continue
            op, path = item[0], item[1]
            if op in ("dir", "file"):
                out[path] = op
            elif op == "remove":
                _drop(out, path)
            elif op == "rename" and len(item) == 4:
                src, dst, existed = path, item[2], item[3]
                moved = {p: k for p, k in out.items() if p == src or p.startswith(src + os.sep)}
                _drop(out, src)
                _drop(out, dst)
                for p, kind in moved.items():
                    if p != src or not existed:
                        out[dst + p[len(src) :]] = kind
    return out


def _drop(paths: "Dict[str, str]", path: str) -> None:
    """Forget ``path`` and everything below it."""
    for p in [p for p in paths if p == path or p.startswith(path + os.sep)]:
        del paths[p]
