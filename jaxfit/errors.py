"""Errors that reach users as one line (the CLI prints ``jaxfit: error: <message>`` and exits 2)."""

from __future__ import annotations


def first_line(error: BaseException) -> str:
    """An exception's message, its first line alone ("" for an empty message)."""
    return str(error).splitlines()[0] if str(error) else ""


class JaxfitError(Exception):
    """Base of every error that is the user's to fix. Its message is one line: what is wrong, and how to fix it."""


class ConfigError(JaxfitError):
    """A bad option, config key, config value or file."""


class WorkloadError(JaxfitError):
    """The workload could not be built: an --entry that does not import, or returns no Workload."""


class CompileError(JaxfitError):
    """The step failed to compile for a reason other than memory."""


class DoesNotFitError(JaxfitError):
    """Not even the smallest allowed batch fits the budget.

    Attributes:
      what: What does not fit and what it needs, without the advice.
      hint: What to do about it, in the words of the command that fitted (CLI flags, or queue keys).
    """

    def __init__(self, what: str, hint: str = "") -> None:
        super().__init__(f"{what}; {hint}" if hint else what)
        self.what, self.hint = what, hint


class ErraticCurveError(JaxfitError):
    """The search did not settle: near the limit the compiled peak jumps up and down with the batch."""


class WorkerError(JaxfitError):
    """The compile child process died or answered nonsense."""


_warned: set[str] = set()


def warn(message: str) -> None:
    """Print ``jaxfit: warning: <message>`` to stderr, once per message per process.

    For what does not stop jaxfit but the user should know (a cache that had to be bypassed).
    """
    import sys

    if message in _warned:
        return
    _warned.add(message)
    print(f"jaxfit: warning: {message}", file=sys.stderr, flush=True)
