"""Where a workload comes from: a built-in example, a user's ``module:function`` factory, or a
training script whose jitted step is probed.

A source is a small frozen dataclass that travels as JSON to the compile child (which builds the
workload after JAX has initialised under the target fraction): :class:`ExampleSource`,
:class:`EntrySource` or :class:`ScriptSource`, together :data:`Source`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from jaxfit.errors import ConfigError, WorkloadError, first_line
from jaxfit.fit.command import DEFAULT_BATCH_FLAG, batch_value, check_command
from jaxfit.fit.mesh import MeshSpec, shard_workload
from jaxfit.fit.workload import Workload

DEFAULT_ACCUM_FLAG = "--grad-accum-steps"


@dataclasses.dataclass(frozen=True)
class ExampleSource:
    """A built-in example (``configs/*.yaml``), with config overrides (``--set KEY=VALUE``), on the
    devices of ``mesh`` (default one)."""

    name: str
    overrides: tuple[tuple[str, str], ...] = ()
    mesh: MeshSpec = dataclasses.field(default_factory=MeshSpec)
    stacked_to: int | None = None
    """A global batch: every batch size is a micro-batch of it, accumulated in one step
    (:func:`jaxfit.examples.training.workload_from_config`); ``jaxfit tune`` ranks on these."""
    kind: ClassVar[Literal["example"]] = "example"

    def identity(self) -> dict[str, Any]:
        """The example's config and the hash of jaxfit's example code (the answer cache's key)."""
        from jaxfit.examples import load_config

        code = hashlib.sha256()
        for file in sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py")):
            code.update(file.read_bytes())
        config = load_config(self.name, dict(self.overrides))
        identity: dict[str, Any] = {"kind": self.kind, "config": repr(config), "code": code.hexdigest()}
        if self.stacked_to is not None:
            identity["stacked_to"] = self.stacked_to
        return _with_mesh(identity, self.mesh)

    def build(self) -> Workload:
        from jaxfit.examples import build_workload

        return shard_workload(build_workload(self.name, dict(self.overrides), self.stacked_to), self.mesh)


@dataclasses.dataclass(frozen=True)
class EntrySource:
    """A user factory ``package.module:function`` that returns a :class:`Workload`, imported from
    ``path`` (the working folder), on the devices of ``mesh`` (default one)."""

    entry: str
    path: str
    mesh: MeshSpec = dataclasses.field(default_factory=MeshSpec)
    kind: ClassVar[Literal["entry"]] = "entry"

    def identity(self) -> dict[str, Any] | None:
        """The hash of the entry's module file, or None when it cannot be found.

        Code the entry imports from elsewhere is not covered: use ``--no-cache`` after changing it
        (the per-compile cache, keyed by the lowered program, still protects every compile).
        """
        module_name = self.entry.partition(":")[0]
        added = bool(self.path) and self.path not in sys.path
        if added:
            sys.path.insert(0, self.path)
        try:
            spec = importlib.util.find_spec(module_name)
        except Exception:
            spec = None
        finally:
            if added:
                sys.path.remove(self.path)
        if spec is None or not spec.origin or not os.path.isfile(spec.origin):
            return None
        digest = hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()
        return _with_mesh({"kind": self.kind, "entry": self.entry, "file": spec.origin, "code": digest}, self.mesh)

    def build(self) -> Workload:
        module_name, _, func_name = self.entry.partition(":")
        if self.path and self.path not in sys.path:
            sys.path.insert(0, self.path)
        try:
            module = importlib.import_module(module_name)
        except Exception as e:
            raise WorkloadError(
                f"--entry {self.entry}: cannot import {module_name!r} ({type(e).__name__}: {e}); "
                "check the module path and that it imports from the current directory"
            ) from None
        factory = getattr(module, func_name, None)
        if not callable(factory):
            raise WorkloadError(f"--entry {self.entry}: {module_name!r} has no function {func_name!r}")
        try:
            workload = factory()
        except Exception as e:
            raise WorkloadError(
                f"--entry {self.entry}: the factory raised {type(e).__name__}: {first_line(e)}"
            ) from None
        if not isinstance(workload, Workload):
            raise WorkloadError(
                f"--entry {self.entry}: the factory returned {type(workload).__name__}, not a jaxfit.Workload; "
                "return jaxfit.Workload(...) or jaxfit.from_state(...)"
            )
        return shard_workload(workload, self.mesh)


def _with_mesh(identity: dict[str, Any], mesh: MeshSpec) -> dict[str, Any]:
    """``identity`` with the mesh when it is more than one device (keys of one device unchanged)."""
    if mesh.sharded:
        identity["mesh"] = dataclasses.asdict(mesh)
    return identity


@dataclasses.dataclass(frozen=True)
class ScriptSource:
    """An unmodified training script, run up to its first call of the jitted step.

    Attributes:
      command: The command the probe runs: :attr:`run_command` and the probe-only arguments.
      run_command: The command that trains, as the user gave it.
      step_name: The jitted train step's name (``None``: ``train_step``, or one found).
      batch_flag: The script's batch flag.
      accum_flag: The script's gradient-accumulation flag.
      batch_size: The batch the command line gives (identifies the batch among the step's
        arguments), or None.
      batch_arg: Which positional argument of the step is the batch (None: found by shape).
      cwd: The folder the command runs in.
      env: Environment variables set for the script on top of jaxfit's own (``jaxfit plan
        --script`` gives each device count its devices: CUDA_VISIBLE_DEVICES on GPUs, host devices
        through XLA_FLAGS on a CPU).
    """

    command: tuple[str, ...]
    run_command: tuple[str, ...]
    step_name: str | None = None
    batch_flag: str = DEFAULT_BATCH_FLAG
    accum_flag: str = DEFAULT_ACCUM_FLAG
    batch_size: int | None = None
    batch_arg: int | None = None
    cwd: str = "."
    env: tuple[tuple[str, str], ...] = ()
    kind: ClassVar[Literal["script"]] = "script"

    def identity(self) -> dict[str, Any]:
        """What can change the script's step before it runs: the command and the probe's settings,
        the working folder, the program the command starts (resolved on PATH) and the environment
        variables that reach XLA, JAX, CUDA and Python (:func:`script_environment`).

        The rest (the files the script imported and read) is only known by running it: the probe
        records it and a cached answer is reused only when it is unchanged
        (:mod:`jaxfit._probe.jaxfit_manifest`, which says what is covered and what is not).
        """
        program = self.command[0] if self.command else ""
        if os.sep not in program:
            program = shutil.which(program) or program
        return {
            "kind": self.kind,
            **dataclasses.asdict(self),
            "cwd": os.path.realpath(self.cwd),
            "program": os.path.realpath(os.path.join(self.cwd, program)) if program else "",
            "env": {**script_environment(), **dict(self.env)},
        }

    def with_command(self, run_command: list[str] | tuple[str, ...], batch_size: int | None) -> ScriptSource:
        """The same source with another training command (the probe-only arguments kept)."""
        extra = self.command[len(self.run_command) :]
        return dataclasses.replace(
            self, command=tuple(run_command) + extra, run_command=tuple(run_command), batch_size=batch_size
        )


SCRIPT_ENV_PREFIXES = (
    "XLA_",
    "JAX_",
    "TF_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "TPU_",
    "LIBTPU",
    "ROCR_",
    "HIP_",
    "PYTHON",
    "FLAX_",
    "NNX_",
    "EQX_",
    "EQUINOX_",
    "GRAIN_",
)
"""Environment variables that reach the compiled step or what a script imports: in a script's key.
The libraries' own switches count: ``NNX_GRAPH_UPDATES=false`` traces another program than flax's
default, and an answer fitted with it must not answer the command without it."""
SCRIPT_ENV_NAMES = (
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "UV_PROJECT_ENVIRONMENT",
    "UV_PYTHON",
)
NOT_SCRIPT_ENV = (
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "TF_CPP_MIN_LOG_LEVEL",
    "PYTHONUNBUFFERED",
)
"""Set by jaxfit for every probe (the fraction is the question's), or logging only."""


def script_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``env`` (default this process's) that a script fit's answer depends on:
    XLA_*, JAX_*, TF_*, CUDA_*, NVIDIA_*, NCCL_*, PYTHON*, the library path and the selected
    environment; not jaxfit's own (``JAXFIT_*``) nor those jaxfit sets for the probe."""
    env = os.environ if env is None else env
    return {
        k: v
        for k, v in sorted(env.items())
        if (k.startswith(SCRIPT_ENV_PREFIXES) or k in SCRIPT_ENV_NAMES) and k not in NOT_SCRIPT_ENV
    }


Source = ExampleSource | EntrySource | ScriptSource
"""Any workload source."""

_KINDS: dict[str, type[ExampleSource] | type[EntrySource] | type[ScriptSource]] = {
    "example": ExampleSource,
    "entry": EntrySource,
    "script": ScriptSource,
}


def to_json(source: Source) -> str:
    """The source as JSON (``kind`` and its fields), as the compile child receives it."""
    return json.dumps({"kind": source.kind, **dataclasses.asdict(source)})


def from_json(text: str) -> Source:
    """Inverse of :func:`to_json`.

    Raises:
      ConfigError: not a source.
    """
    data = json.loads(text)
    cls = _KINDS.get(data.pop("kind", None))
    if cls is None:
        raise ConfigError(f"not a workload source: {text[:200]}")
    fields = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
    if isinstance(fields.get("mesh"), dict):
        fields["mesh"] = MeshSpec(**fields["mesh"])
    for name in ("overrides", "command", "run_command", "env"):
        if name in fields:
            fields[name] = tuple(tuple(x) if isinstance(x, list) else x for x in fields[name])
    return cls(**fields)


def example_source(name: str, overrides: dict[str, str] | None = None, mesh: MeshSpec | None = None) -> ExampleSource:
    """The source of a built-in example (validated now, so bad names fail before any child starts).

    Args:
      name: The example's name or YAML file.
      overrides: Config overrides.
      mesh: The devices to fit it on (default one; see :mod:`jaxfit.fit.mesh`).

    Raises:
      ConfigError: an unknown example or config key, or a bad mesh (one line).
    """
    from jaxfit.examples import load_config

    load_config(name, overrides)
    return ExampleSource(name, tuple((overrides or {}).items()), (mesh or MeshSpec()).validate())


def entry_source(entry: str, path: str | None = None, mesh: MeshSpec | None = None) -> EntrySource:
    """The source of a user factory ``package.module:function`` that returns a :class:`Workload`.

    Args:
      entry: ``package.module:function``.
      path: The folder it is imported from (default the current one).
      mesh: The devices to fit it on (default one): the batch argument is split over all of
        them and the other arguments sharded FSDP-style (:func:`jaxfit.fit.mesh.shard_workload`).

    Raises:
      ConfigError: ``entry`` does not look like ``package.module:function``, or a bad mesh.
    """
    module, sep, func = entry.partition(":")
    if not sep or not module or not func.isidentifier():
        raise ConfigError(f"--entry {entry!r} must look like package.module:function")
    return EntrySource(entry, path or os.getcwd(), (mesh or MeshSpec()).validate())


def script_source(
    command: list[str] | tuple[str, ...],
    step_name: str | None = None,
    batch_flag: str = DEFAULT_BATCH_FLAG,
    batch_arg: int | None = None,
    probe_args: list[str] | tuple[str, ...] | None = None,
    accum_flag: str = DEFAULT_ACCUM_FLAG,
) -> ScriptSource:
    """The source of an unmodified training script, whose jitted train step is intercepted.

    Args:
      command: The command that starts training, e.g. ``["uv", "run", "scripts/train.py", "debug",
        "--exp-name=x"]``. It runs in its own environment; jaxfit need not be installed there.
      step_name: The name of the jitted train step (looked up through ``functools.partial``);
        ``None``: ``train_step``, or else the first jitted function that looks like a train step
        (it donates an argument and takes a batch, or is called a second time with one).
      batch_flag: The script's batch-size flag; its value in ``command`` (if any) identifies the
        batch among the step's arguments.
      batch_arg: Which positional argument of the step is the batch (default: found by shape).
      probe_args: Arguments added to the command for the probe only, e.g.
        ``["--checkpoint-base-dir=/tmp/probe"]``.
      accum_flag: The script's gradient-accumulation flag (``--global-batch`` sets it).

    Raises:
      ConfigError: no command, a program that is not found, a bad step name or flag.
    """
    if step_name is not None and not step_name.isidentifier():
        raise ConfigError(f"--step-name {step_name!r} is not a Python function name")
    for name, flag in (("--batch-flag", batch_flag), ("--accum-flag", accum_flag)):
        if not re.fullmatch(r"--?[A-Za-z0-9][\w.-]*", flag):
            example = flag.lstrip("-") if re.fullmatch(r"[\w.-]+", flag.lstrip("-")) else "bs"
            raise ConfigError(
                f"{name} {flag!r} must be a flag name (dashes, letters, digits, '_', '.', '-'), e.g. {name}=--{example}"
            )
    run_command = tuple(check_command(command))
    return ScriptSource(
        command=run_command + tuple(probe_args or ()),
        run_command=run_command,
        step_name=step_name,
        batch_flag=batch_flag,
        accum_flag=accum_flag,
        batch_size=batch_value(command, batch_flag),
        batch_arg=batch_arg,
        cwd=os.getcwd(),
    )


def build_workload(source: Source) -> Workload:
    """Build the workload a source describes (in the compile child, after JAX initialised).

    Raises:
      ConfigError: an unknown example or config key, or a script source (probed, not built).
      WorkloadError: an entry that does not import, fails, or returns something else.
    """
    if isinstance(source, ScriptSource):
        raise ConfigError("a training script is probed in its own process, not built here")
    return source.build()
