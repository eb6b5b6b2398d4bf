"""Files jaxfit writes for people and machines: written whole or not at all, checked before long work."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxfit.errors import ConfigError


def _suffix_for(flag: str) -> str:
    """The file suffix a flag's file takes (``--markdown`` a ``.md``, ``--plot`` a ``.png``)."""
    return {"--markdown": ".md", "--plot": ".png", "--png": ".png", "--timeline": ".png"}.get(flag, ".json")


def check_writable(path: str | os.PathLike[str], flag: str = "--json") -> Path:
    """Fail early (before a long fit) if ``path`` could not be written: its folder is missing, not a
    folder or not writable (tried for real: a file is created there and removed), or it is a folder.

    Raises:
      ConfigError: one line naming ``flag`` and the path.
    """
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file name such as {p / ('out' + _suffix_for(flag))}")
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: folder {folder} does not exist; create it or choose another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".check", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: folder {folder} is not writable ({e.strerror or e})") from None
    return p


def write_text(path: str | os.PathLike[str], text: str, flag: str = "--json") -> None:
    """Write ``text`` atomically: the file is either the whole new text or untouched (a full disk
    leaves no half-written file).

    Raises:
      ConfigError: it could not be written (one line naming ``flag``, the path and why).
    """
    p = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write it ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException as e:
        os.unlink(tmp)
        if isinstance(e, OSError):
            raise ConfigError(f"{flag} {path}: cannot write it ({e.strerror or e})") from None
        raise


def write_json(path: str | os.PathLike[str], data: Mapping[str, Any], flag: str = "--json") -> None:
    """Write ``data`` as JSON atomically (:func:`write_text`)."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n", flag)
