"""``jaxfit version`` (and ``jaxfit --version``): what is installed, and what JAX sees here."""

from __future__ import annotations

import contextlib
import json as json_module
import logging
import os
import platform
import sys
from collections.abc import Iterator
from typing import Any

from jaxfit.cli.app import app, no_command, parsed
from jaxfit.errors import first_line
from jaxfit.versions import installed_version, jaxfit_version

PLUGINS = ("jax-cuda13-plugin", "jax-cuda12-plugin", "jax-rocm-plugin", "libtpu")
"""The accelerator plugins whose versions are reported when installed."""


def environment_report() -> dict[str, Any]:
    """jaxfit's, Python's, jax's, jaxlib's and the accelerator plugins' versions, the default XLA
    backend and its devices. Initialises a JAX backend in this process, with preallocation off
    unless the environment already says otherwise, so that asking takes no GPU memory."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    report: dict[str, Any] = {
        "jaxfit": jaxfit_version(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "jax": installed_version("jax", "not installed"),
        "jaxlib": installed_version("jaxlib", "not installed"),
        "plugins": {name: v for name in PLUGINS if (v := installed_version(name, "")) != ""},
    }
    with _backend_warnings() as warnings:
        try:
            import jax

            devices = jax.devices()
            report["backend"] = jax.default_backend()
            report["devices"] = [f"{d.platform}:{d.id} {getattr(d, 'device_kind', '')}".strip() for d in devices]
        except Exception as e:  # a broken backend is what this command is asked to show
            report["backend"] = f"unavailable: {type(e).__name__}: {first_line(e)}".rstrip(": ")
            report["devices"] = []
    report["warnings"] = warnings
    return report


class _Collector(logging.Handler):
    """Keeps the warnings jax logs while it starts its backends, as one line each."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage().splitlines()[0]
        if record.exc_info and record.exc_info[1] is not None:
            line = f"{line}: {first_line(record.exc_info[1])}"
        self.lines.append(line)


@contextlib.contextmanager
def _backend_warnings() -> Iterator[list[str]]:
    """Within it, what jax's backend start-up logs (e.g. a CUDA plugin that is installed for --gpu
    but cannot start on a machine without a GPU, which jax prints as a traceback) is collected as
    lines for the report instead of printed."""
    logger = logging.getLogger("jax._src.xla_bridge")
    collector, propagate = _Collector(), logger.propagate
    logger.addHandler(collector)
    logger.propagate = False
    try:
        yield collector.lines
    finally:
        logger.removeHandler(collector)
        logger.propagate = propagate


@app.command(name="version")
def version_command(json: bool = False) -> int:
    """Print jaxfit's version, the versions of Python, jax, jaxlib and the accelerator plugins, and
    the XLA backend and devices JAX sees here (jaxfit --version prints jaxfit's version alone).

    Args:
      json: Print the report as one JSON object instead of lines.
    """
    parsed()
    no_command("version")
    report = environment_report()
    if json:
        print(json_module.dumps(report, indent=2))
        return 0
    print(f"jaxfit {report['jaxfit']}")
    print(f"python {report['python']} ({report['executable']})")
    print(f"jax {report['jax']}, jaxlib {report['jaxlib']}")
    for name, version in report["plugins"].items():
        print(f"{name} {version}")
    print(f"backend {report['backend']}")
    for device in report["devices"]:
        print(f"  {device}")
    for warning in report["warnings"]:
        print(f"note: {warning}")
    if report["backend"] == "cpu" and any("xla_cuda" in w for w in report["warnings"]):
        print(
            "note: jax's CUDA plugin is installed but cannot start here, so jax runs on the CPU; --gpu MODEL estimates still work"
        )
    return 0
