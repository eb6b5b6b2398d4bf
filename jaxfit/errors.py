"""Errors that reach users as one line (the CLI prints ``jaxfit: error: <message>`` and exits 2)."""

from __future__ import annotations


class JaxfitError(Exception):
    """Base of every error that is the user's to fix. Its message is one line: what is wrong, and how to fix it."""


class ConfigError(JaxfitError):
    """A bad option, config key, config value or file."""


class WorkloadError(JaxfitError):
    """The workload could not be built: an --entry that does not import, or returns no Workload."""


class CompileError(JaxfitError):
    """The step failed to compile for a reason other than memory."""


class DoesNotFitError(JaxfitError):
    """Not even the smallest allowed batch fits the budget."""


class WorkerError(JaxfitError):
    """The compile child process died or answered nonsense."""
