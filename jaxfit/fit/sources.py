"""Where a workload comes from: a built-in example or a user's ``module:function`` factory.

A *source* is a small JSON-able dict, so the parent can describe the workload to the compile child
(which builds it after JAX has initialised under the target fraction):

- ``{"kind": "example", "name": "gpt-tiny", "overrides": {"n_layers": "2"}}``
- ``{"kind": "entry", "entry": "my_pkg.fit:make_workload", "path": "/dir/added/to/sys.path"}``
- ``{"kind": "script", "command": [...], "step_name": "train_step", "batch_size": 32, ...}``: the
  training script itself, probed (see :mod:`jaxfit._probe.sitecustomize`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxfit.errors import ConfigError, WorkloadError
from jaxfit.fit.workload import Workload


def example_source(name: str, overrides: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The source of a built-in example (validated now, so bad names fail before any child starts)."""
    from jaxfit.examples import load_config

    load_config(name, overrides)  # raises ConfigError with a one-line message
    return {"kind": "example", "name": name, "overrides": dict(overrides or {})}


def entry_source(entry: str, path: str | None = None) -> dict[str, Any]:
    """The source of a user factory ``package.module:function`` that returns a :class:`Workload`."""
    module, sep, func = entry.partition(":")
    if not sep or not module or not func.isidentifier():
        raise ConfigError(f"--entry {entry!r} must look like package.module:function")
    return {"kind": "entry", "entry": entry, "path": path or os.getcwd()}


def script_source(
    command: list[str],
    step_name: str | None = None,
    batch_flag: str = "--batch-size",
    batch_arg: int | None = None,
    probe_args: list[str] | None = None,
    accum_flag: str = "--grad-accum-steps",
) -> dict[str, Any]:
    """The source of an unmodified training script, whose jitted ``step_name`` is intercepted.

    Args:
      command: The command that starts training, e.g. ``["uv", "run", "scripts/train.py", "debug",
        "--exp-name=x"]``. It runs in its own environment; jaxfit need not be installed there.
      step_name: The name of the jitted train step (looked up through ``functools.partial``);
        ``None``: ``train_step``, or else the first jitted function that looks like a train step
        (it donates an argument and takes a batch, or is called a second time with one).
      batch_flag: The script's batch-size flag; its value in ``command`` (if any) identifies the
        batch among the step's arguments.
      batch_arg: Which positional argument of the step is the batch (default: found by shape).
      accum_flag: The script's gradient-accumulation flag (``--global-batch`` sets it).
      probe_args: Arguments added to the command for the probe only, e.g.
        ``["--checkpoint-base-dir=/tmp/probe"]`` so that the probe's start-up (which may create the
        run's checkpoint folder, as openpi's does) leaves nothing where the real run will look.
    """
    from jaxfit.run.command import batch_value, check_command

    if step_name is not None and not step_name.isidentifier():
        raise ConfigError(f"--step-name {step_name!r} is not a Python function name")
    for name, flag in (("--batch-flag", batch_flag), ("--accum-flag", accum_flag)):
        if not flag.startswith("-") or "=" in flag or " " in flag:
            raise ConfigError(f"{name} {flag!r} must be a flag name, e.g. {name}=--{flag.lstrip('-') or 'bs'}")
    run_command = check_command(command)
    return {"kind": "script", "command": run_command + list(probe_args or []), "run_command": run_command,
            "step_name": step_name,
            "batch_flag": batch_flag, "accum_flag": accum_flag, "batch_size": batch_value(command, batch_flag),
            "batch_arg": batch_arg, "cwd": os.getcwd()}


def build_workload(source: Mapping[str, Any]) -> Workload:
    """Build the workload a source describes (in the compile child, after JAX initialised).

    Raises:
      ConfigError: an unknown example or config key.
      WorkloadError: an entry that does not import, fails, or returns something else.
    """
    kind = source.get("kind")
    if kind == "example":
        from jaxfit.examples import build_workload as build_example

        return build_example(source["name"], source.get("overrides") or {})
    if kind == "entry":
        return _build_entry(source["entry"], source.get("path"))
    raise ConfigError(f"unknown workload source kind {kind!r}")


def _build_entry(entry: str, path: str | None) -> Workload:
    module_name, _, func_name = entry.partition(":")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise WorkloadError(
            f"--entry {entry}: cannot import {module_name!r} ({type(e).__name__}: {e}); "
            "check the module path and that it imports from the current directory"
        ) from None
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise WorkloadError(f"--entry {entry}: {module_name!r} has no function {func_name!r}")
    try:
        workload = factory()
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise WorkloadError(f"--entry {entry}: the factory raised {type(e).__name__}: {first}") from None
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"--entry {entry}: the factory returned {type(workload).__name__}, not a jaxfit.Workload; "
            "return jaxfit.Workload(...) or jaxfit.fit.workload.from_state(...)"
        )
    return workload


def source_identity(source: Mapping[str, Any]) -> dict[str, Any] | None:
    """What identifies a source's program for the answer cache, or ``None`` if it cannot be known.

    Examples are identified by their config and the hash of jaxfit's example code; entries by the
    hash of their module's file. Code the entry imports from elsewhere is not covered: use
    ``--no-cache`` after changing it (the per-compile cache, keyed by the lowered program, still
    protects every compile).
    """
    kind = source.get("kind")
    if kind == "example":
        from jaxfit.examples import load_config

        code = hashlib.sha256()
        for file in sorted((Path(__file__).parent / "examples").glob("*.py")):
            code.update(file.read_bytes())
        config = load_config(source["name"], source.get("overrides") or {})
        return {"kind": kind, "config": repr(config), "code": code.hexdigest()}
    if kind == "entry":
        module_name = source["entry"].partition(":")[0]
        path = source.get("path")
        added = bool(path) and path not in sys.path
        if added:
            sys.path.insert(0, path)
        try:
            spec = importlib.util.find_spec(module_name)
        except Exception:
            spec = None
        finally:
            if added:
                sys.path.remove(path)
        if spec is None or not spec.origin or not os.path.isfile(spec.origin):
            return None
        digest = hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()
        return {"kind": kind, "entry": source["entry"], "file": spec.origin, "code": digest}
    return None
