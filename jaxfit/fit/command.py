"""Command lines of training scripts: find, set and check the batch flag, without a shell.

Part of the fit layer (``jaxfit fit --script`` checks the flag as ``jaxfit run``, ``tune`` and
``schedule`` do); it imports nothing above :mod:`jaxfit.errors`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from jaxfit.errors import ConfigError

DEFAULT_BATCH_FLAG = "--batch-size"
"""The batch flag of openpi-style scripts and scripts/train.py."""
PROBE_DIR = str(Path(__file__).resolve().parents[1] / "_probe")
"""jaxfit's start-up hook (``sitecustomize``), put first on a script's PYTHONPATH."""
HELP_CHECK_ENV = "JAXFIT_HELP_CHECK"
HELP_CHECK_EXIT = 97
"""Exit code of a script that went on working under ``--help`` and was stopped at its first jitted call."""


def hooked_pythonpath() -> str:
    """PYTHONPATH with the start-up hook's folder first (``sitecustomize`` is imported from there)."""
    path = os.environ.get("PYTHONPATH")
    return PROBE_DIR + (os.pathsep + path if path else "")


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
    if text is None:
        raise ConfigError(
            f"`{shlex.join(command)} --help` printed no help and went on to work (jaxfit stopped it at its first "
            f"jitted call), so jaxfit cannot check that it takes {flag}; put {flag}=N in the command"
        )
    output, code = text
    if flag not in output:
        crashed = "Traceback (most recent call last)" in output or (code not in (0, 1) and "error" in output.lower())
        if code != 0 and crashed:  # absl's --help exits 1; an uncaught exception too, with a traceback
            said = _telling_line(output)
            raise ConfigError(
                f"`{shlex.join(command)} --help` failed (exit code {code}) before printing a help text: {said}; "
                "check that the command runs"
            )
        unknown = _unknown_choice(command, output)
        if unknown:
            raise ConfigError(unknown)
        carried = batch_like_flags(command)
        if fix is None and carried:
            fix = f"the command carries {carried[0]}: pass --batch-flag={carried[0]}"
        elif fix is None and flag == DEFAULT_BATCH_FLAG:
            fix = f"pass --batch-flag=<its batch flag> (e.g. --batch-flag=--bs), or put {flag}=N in the command"
        elif fix is None:
            fix = (
                f"check the spelling of {flag}, or, if the script takes it without listing it in --help (absl "
                f"config flags), put {flag}=N in the command"
            )
        raise ConfigError(f"the command's --help does not mention {flag}; {fix}")


BATCH_LIKE = re.compile(r"^(--?[\w.-]*(?:batch[_-]?size|bsz|(?<![\w])bs)[\w.-]*)(?:=(\d+))?$", re.IGNORECASE)
"""A flag that names a batch size (``--config.batch_size``, ``--train-batch-size``, ``--bs``)."""


def batch_like_flags(command: Sequence[str]) -> list[str]:
    """The flags of ``command`` that look like its batch size and carry a whole number
    (``--config.batch_size=2`` or ``--config.batch_size 2``): what its batch flag probably is."""
    found = []
    for i, word in enumerate(command):
        m = BATCH_LIKE.match(word)
        if not m:
            continue
        value = m.group(2) or (command[i + 1] if i + 1 < len(command) else "")
        if value.isdigit() and m.group(1) not in found:
            found.append(m.group(1))
    return found


def _unknown_choice(command: Sequence[str], output: str) -> str | None:
    """When the help lists the script's choices (``{debug,pi0_libero,...}``: tyro subcommands, as
    openpi's config names are) and the command names none of them, say so: such a script prints
    its top-level help, without the config's flags, for a name it does not have."""
    positional = [
        m
        for m in re.finditer(r"\{([\w.-]+(?:,[\w.-]+)+)\}", output)
        if not re.search(r"-[\w-]+[ =]?$", output[: m.start()])  # not a flag's choices (--workers {a,b})
    ]
    if not positional:
        return None
    choices = positional[0].group(1).split(",")
    script = next((i for i, a in enumerate(command) if a.endswith(".py")), None)
    if script is None or script + 1 >= len(command) or command[script + 1].startswith("-"):
        return None
    word = command[script + 1]
    if word in choices:
        return None
    shown = ", ".join(choices[:8]) + (f" and {len(choices) - 8} more" if len(choices) > 8 else "")
    return f"the script has no {word!r}: its --help lists {shown}; check the name in the command"


def _telling_line(output: str) -> str:
    """The line of a failed command's output that says what went wrong (the last with 'error' in it,
    else the last line)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["no output"])[-1][:300]


_HELP_TEXTS: dict[tuple[str, ...], tuple[str, int] | None] = {}


def _help_text(command: tuple[str, ...], timeout: float) -> tuple[str, int] | None:
    """``(output, exit code)`` of ``command --help`` (stdout and stderr), asked for once per command; None when the
    script does not stop at ``--help`` (it parses no flags): jaxfit's start-up hook stops it at its
    first jitted call, so a help check never trains.

    Raises:
      subprocess.TimeoutExpired: it did not finish in ``timeout`` seconds.
    """
    if command not in _HELP_TEXTS:
        env = dict(os.environ, WANDB_MODE="disabled", PYTHONPATH=hooked_pythonpath(), **{HELP_CHECK_ENV: "1"})
        proc = subprocess.run(
            [*command, "--help"], capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )
        stopped = proc.returncode == HELP_CHECK_EXIT
        _HELP_TEXTS[command] = None if stopped else (proc.stdout + proc.stderr, proc.returncode)
    return _HELP_TEXTS[command]
