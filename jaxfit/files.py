"""Files jaxfit writes for people and machines: written whole or not at all, checked before long work."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxfit.errors import ConfigError


def check_writable(path: str | os.PathLike[str], flag: str = "--json") -> Path:
    """Fail early (before a long fit) if ``path`` could not be written: its folder is missing, not a
    folder or not writable (tried for real: a file is created there and removed), or it is a folder.

    Raises:
      ConfigError: one line naming ``flag`` and the path.
    """
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file name such as {p / ('out' + (p.suffix or '.json'))}")
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: folder {folder} does not exist; create it or choose another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".check", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: folder {folder} is not writable ({e.strerror or e})") from None
    return p


def write_json(path: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON atomically: the file is either the whole new object or untouched."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        os.unlink(tmp)
        raise
