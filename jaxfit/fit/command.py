"""Command lines of training scripts: find, set and check the batch flag, without a shell.

Part of the fit layer (``jaxfit fit --script`` checks the flag as ``jaxfit run``, ``tune`` and
``schedule`` do); it imports nothing above :mod:`jaxfit.errors`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence

from jaxfit.errors import ConfigError

DEFAULT_BATCH_FLAG = "--batch-size"
"""The batch flag of openpi-style scripts and scripts/train.py."""


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


def check_batch_flag(command: list[str], flag: str, timeout: float = 120.0, fix: str | None = None) -> None:
    """Fail early when the command would not accept ``flag`` (a script whose flag differs).

    A flag already on the command line is accepted by definition; otherwise the command's
    ``--help`` must mention it (scripts whose flags ``--help`` does not list, such as absl's
    ``--config.batch_size``, pass by carrying the flag).

    The help text is asked for once per command in a process (a script's start-up can take
    seconds); a fit asks only before it probes, so an answer from the cache starts nothing.

    Raises:
      ConfigError: the flag is absent from the help text.
    """
    if batch_value(command, flag) is not None:
        return
    try:
        text = _help_text(tuple(command), timeout)
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"`{shlex.join(command)} --help` did not finish in {timeout:.0f} s, so jaxfit cannot "
            f"check that it takes {flag}; put {flag}=N in the command"
        ) from None
    if flag not in text:
        if fix is None and flag == DEFAULT_BATCH_FLAG:
            fix = f"pass --batch-flag=<its batch flag> (e.g. --batch-flag=--bs), or put {flag}=N in the command"
        elif fix is None:
            fix = (
                f"check the spelling of {flag}, or, if the script takes it without listing it in --help (absl "
                f"config flags), put {flag}=N in the command"
            )
        raise ConfigError(f"the command's --help does not mention {flag}; {fix}")


_HELP_TEXTS: dict[tuple[str, ...], str] = {}


def _help_text(command: tuple[str, ...], timeout: float) -> str:
    """What ``command --help`` prints (stdout and stderr), asked for once per command.

    Raises:
      subprocess.TimeoutExpired: it did not finish in ``timeout`` seconds.
    """
    if command not in _HELP_TEXTS:
        env = dict(os.environ, WANDB_MODE="disabled")
        proc = subprocess.run(
            [*command, "--help"], capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )
        _HELP_TEXTS[command] = proc.stdout + proc.stderr
    return _HELP_TEXTS[command]
