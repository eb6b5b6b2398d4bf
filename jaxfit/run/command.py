"""Command lines of training scripts: find, set and check the batch flag, without a shell."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

from jaxfit.errors import ConfigError


def check_command(command: Sequence[str]) -> list[str]:
    """The command as a list, after checking its program exists.

    Raises:
      ConfigError: no command, or its program is not found.
    """
    if not command:
        raise ConfigError("no command given after --; e.g. jaxfit run -- python scripts/train.py debug --exp-name=x")
    program = command[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise ConfigError(f"command not found: {program!r} is not an executable file")
    elif shutil.which(program) is None:
        raise ConfigError(f"command not found: {program!r} is not on PATH")
    return list(command)


def batch_value(command: Sequence[str], flag: str) -> int | None:
    """The value of ``flag`` in ``command`` (``--flag=N`` or ``--flag N``), or ``None`` if absent.

    Raises:
      ConfigError: the flag is there but its value is not a positive integer.
    """
    for i, arg in enumerate(command):
        value: str | None = None
        if arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
        elif arg == flag and i + 1 < len(command):
            value = command[i + 1]
        if value is not None:
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"{flag} in the command is {value!r}, not a positive integer")
            return int(value)
    return None


def with_batch(command: Sequence[str], flag: str, batch_size: int) -> list[str]:
    """``command`` with ``flag`` set to ``batch_size``: replaced where present, else appended."""
    out: list[str] = []
    skip = False
    replaced = False
    for i, arg in enumerate(command):
        if skip:
            skip = False
            continue
        if arg.startswith(flag + "="):
            out.append(f"{flag}={batch_size}")
            replaced = True
        elif arg == flag and i + 1 < len(command):
            out.append(f"{flag}={batch_size}")
            skip = replaced = True
        else:
            out.append(arg)
    if not replaced:
        out.append(f"{flag}={batch_size}")
    return out
