"""The queue file of ``jaxfit schedule``: which training runs share which GPUs.

A queue file is YAML::

    gpus: all            # "all" (default), an int N (the first N visible GPUs), or a list [0, 2]
    reserve: 2GiB        # memory kept free on every GPU (default 0)
    device_memory: 96GiB # optional: the memory of each GPU, to plan without GPUs
    process_overhead: 618MiB   # optional: per-process memory outside the pool (default: measure)
    experiments:
      - name: pi0-a                    # required, unique, [A-Za-z0-9_.-]+
        command: [python, scripts/train.py, debug, --exp-name=a]   # a list, or a shell string
        batch: auto                    # "auto" or a positive int (default auto)
        fraction: auto                 # "auto" or a float in (0, 1] (default auto)
        global_batch: 64               # optional: keep this global batch with gradient accumulation
        retries: 1                     # optional int >= 0 (default 1)
        priority: 0                    # optional int; higher starts first (default 0)
        timeout: 2h                    # optional: seconds, or 90s, 30m, 2h, 1h30m (default none)
        env: {KEY: value}              # optional extra environment
        gpus: 2                        # optional: GPUs the run takes at once (default 1): a
                                       # sharded run, the same fraction on each, its batch global

Sizes are read by :func:`jaxfit.fit.budget.parse_size` (``96GiB``, ``80GB``, ``618MiB``, bytes).
A queue file must not have a top-level ``family:`` key: queue files may live in ``configs/`` next
to the example model configs, and ``family:`` is what marks a YAML file there as an example.

Every problem raises :class:`jaxfit.errors.ConfigError` with one line that names the file, the
experiment (by name, or by its index when it has no usable name) and the bad key and value, and
says how to fix it. This module only reads and checks the file; it starts nothing.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from jaxfit.errors import ConfigError
from jaxfit.fit.budget import FRACTION_VARIABLE, NEW_FRACTION_VARIABLE, format_bytes, parse_size
from jaxfit.fit.options import BATCH_LIMIT

GpuSelection = Literal["all"] | int | tuple[int, ...]
"""Which GPUs a queue uses: ``"all"`` visible ones, the first ``N``, or these indices."""

TOP_LEVEL_KEYS: tuple[str, ...] = ("gpus", "reserve", "device_memory", "process_overhead", "experiments")
"""The keys a queue file may have at its top level."""

EXPERIMENT_KEYS: tuple[str, ...] = (
    "name",
    "command",
    "batch",
    "fraction",
    "global_batch",
    "retries",
    "priority",
    "timeout",
    "env",
    "gpus",
)
"""The keys one experiment of a queue file may have."""

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")
"""What an experiment name may contain (it names log files and checkpoint folders)."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION_UNITS: dict[str, float] = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
_DURATION_PART = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)")
_ZERO_SIZE = re.compile(r"^\s*0*\.?0+\s*([a-zA-Z]*)\s*$")
_DURATION_HINT = "write seconds (5400) or e.g. 90s, 30m, 2h, 1h30m"


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One training run of a queue.

    Attributes:
      name: Unique name of the run (letters, digits, ``_``, ``.``, ``-``).
      command: The command line, as separate arguments (a string in the file is split with shlex).
      batch: The batch size to run at (with ``global_batch``: the micro-batch of one accumulation
        step), or None for ``auto`` (the scheduler fits it).
      fraction: The ``XLA_PYTHON_CLIENT_MEM_FRACTION`` to run under, or None for ``auto`` (the
        scheduler picks it from the run's measured need).
      global_batch: Samples per optimizer step: the run gets ``--batch-size=global_batch`` and
        ``--grad-accum-steps`` to split it into micro-batches of at most ``batch`` (as
        scripts/train.py does), or None to train at ``batch`` itself.
      retries: How many times a crashed run is started again (0: never; out-of-memory restarts
        with more accumulation do not count).
      priority: Higher starts first; equal priorities keep no particular order.
      timeout: Seconds after which the run is stopped, or None for no limit.
      env: Extra environment variables for the run (read-only mapping of strings).
      gpus: GPUs the run takes at once (its script shards over all it sees; each gets the same
        fraction).
      index: Position of the experiment in the file's ``experiments`` list (0-based).
    """

    name: str
    command: tuple[str, ...]
    batch: int | None = None
    fraction: float | None = None
    global_batch: int | None = None
    retries: int = 1
    priority: int = 0
    timeout: float | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}), hash=False)
    index: int = 0
    gpus: int = 1

    @property
    def auto_batch(self) -> bool:
        """Whether the batch is left to the scheduler (``batch: auto``)."""
        return self.batch is None

    @property
    def auto_fraction(self) -> bool:
        """Whether the memory fraction is left to the scheduler (``fraction: auto``)."""
        return self.fraction is None

    def to_dict(self) -> dict[str, Any]:
        """The experiment as JSON-ready data (``auto`` where the scheduler decides; ``env`` lists the
        variables it sets, not their values, which may be API keys)."""
        return {
            "name": self.name,
            "command": list(self.command),
            "batch": "auto" if self.batch is None else self.batch,
            "fraction": "auto" if self.fraction is None else self.fraction,
            "global_batch": self.global_batch,
            "retries": self.retries,
            "priority": self.priority,
            "timeout": self.timeout,
            "env": sorted(self.env),  # which variables are set, never their values (they may be secrets)
            "gpus": self.gpus,
        }


@dataclasses.dataclass(frozen=True)
class Queue:
    """A validated queue file.

    Attributes:
      source: Where the queue came from (the file path), used in messages.
      experiments: The runs, in file order (never empty; names are unique).
      gpus: ``"all"`` visible GPUs, the first ``N``, or a tuple of GPU indices.
      reserve_bytes: Memory kept free on every GPU (0: none).
      device_memory_bytes: The memory of each GPU when planning without GPUs, or None to use the
        GPUs' own totals.
      process_overhead_bytes: Per-process device memory outside the XLA pool (CUDA context), or
        None to measure it on the GPU.
    """

    source: str
    experiments: tuple[Experiment, ...]
    gpus: GpuSelection = "all"
    reserve_bytes: int = 0
    device_memory_bytes: int | None = None
    process_overhead_bytes: int | None = None

    def experiment(self, name: str) -> Experiment:
        """The experiment called ``name``.

        Raises:
          ConfigError: no experiment has that name.
        """
        for experiment in self.experiments:
            if experiment.name == name:
                return experiment
        names = ", ".join(e.name for e in self.experiments)
        raise ConfigError(f"{self.source}: no experiment named {name!r}; the queue has: {names}")

    def select_gpus(self, available: int) -> tuple[int, ...]:
        """The GPU indices this queue uses when ``available`` GPUs are visible.

        With no GPU visible and ``device_memory`` set, the queue plans on *logical* GPUs of that
        size: the first ``N`` for ``gpus: N``, the listed indices, or one GPU for ``gpus: all``.

        Raises:
          ConfigError: the queue asks for more GPUs, or for an index, that is not there.
        """
        if available <= 0 and self.device_memory_bytes is not None:
            if self.gpus == "all":
                return (0,)
            return tuple(range(self.gpus)) if isinstance(self.gpus, int) else self.gpus
        if available <= 0:
            raise ConfigError(f"{self.source}: no GPU is visible; set device_memory to plan without GPUs")
        if self.gpus == "all":
            return tuple(range(available))
        if isinstance(self.gpus, int):
            if self.gpus > available:
                raise ConfigError(
                    f"{self.source}: gpus: {self.gpus} asks for {self.gpus} GPUs but {available} "
                    f"are visible; use gpus: {available} or fewer"
                )
            return tuple(range(self.gpus))
        missing = [i for i in self.gpus if i >= available]
        if missing:
            raise ConfigError(
                f"{self.source}: gpus: {list(self.gpus)} names GPU {missing[0]} but only "
                f"{available} are visible (0..{available - 1}); list visible indices only"
            )
        return self.gpus

    def to_dict(self) -> dict[str, Any]:
        """The queue as JSON-ready data."""
        return {
            "source": self.source,
            "gpus": list(self.gpus) if isinstance(self.gpus, tuple) else self.gpus,
            "reserve_bytes": self.reserve_bytes,
            "device_memory_bytes": self.device_memory_bytes,
            "process_overhead_bytes": self.process_overhead_bytes,
            "experiments": [e.to_dict() for e in self.experiments],
        }


def _one_line(text: object) -> str:
    """Collapse ``text`` to one line (error messages are one line)."""
    return " ".join(str(text).split())


def _is_int(value: Any) -> bool:
    """Whether ``value`` is an int and not a bool (YAML ``yes`` is a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float and not a bool."""
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def parse_duration(text: str | int | float) -> float:
    """Parse a duration into seconds: a number (seconds), or ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m``.

    Units: ``s``/``sec``/``seconds``, ``m``/``min``/``minutes``, ``h``/``hr``/``hours``,
    ``d``/``days`` (case-insensitive); a bare number is seconds; parts add up (``1h 30m``).

    Raises:
      ConfigError: the text is not a positive duration.
    """
    if isinstance(text, bool):
        raise ConfigError(f"cannot read {text!r} as a duration; {_DURATION_HINT}")
    if _is_number(text):
        seconds = float(text)
    elif isinstance(text, str) and text.strip():
        seconds, pos, body = 0.0, 0, text.strip()
        while pos < len(body):
            m = _DURATION_PART.match(body, pos)
            unit = m.group(2).lower() if m else ""
            if m is None or m.end() == pos or unit not in _DURATION_UNITS:
                raise ConfigError(f"cannot read {text!r} as a duration; {_DURATION_HINT}")
            seconds += float(m.group(1)) * _DURATION_UNITS[unit]
            pos = m.end()
            while pos < len(body) and body[pos] in " ,":
                pos += 1
    else:
        raise ConfigError(f"cannot read {text!r} as a duration; {_DURATION_HINT}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"duration {text!r} must be positive; {_DURATION_HINT}")
    return seconds


def _size(value: Any, where: str, key: str, *, zero_ok: bool) -> int:
    """A size value of the file, in bytes (``zero_ok``: 0 is allowed)."""
    if isinstance(value, bool) or not (_is_number(value) or isinstance(value, str)):
        raise ConfigError(f"{where}: {key}={value!r} is not a memory size; write e.g. {key}: 2GiB")
    if zero_ok:
        if _is_number(value) and value == 0:
            return 0
        if (_is_number(value) and value < 0) or (isinstance(value, str) and value.strip().startswith("-")):
            raise ConfigError(f"{where}: {key}={value!r} must be 0 or more; write e.g. {key}: 2GiB")
        m = _ZERO_SIZE.match(value) if isinstance(value, str) else None
        if m is not None:
            _size(f"1{m.group(1)}", where, key, zero_ok=False)  # the unit must be valid
            return 0
    try:
        return parse_size(value if isinstance(value, (int, str)) else repr(value))
    except ConfigError as err:
        raise ConfigError(f"{where}: {key}={value!r}: {err}") from None


def _parse_gpus(value: Any, where: str) -> GpuSelection:
    """The ``gpus:`` value: ``all``, a positive int, or a non-empty list of distinct indices."""
    hint = "write gpus: all, gpus: 2 (the first two) or gpus: [0, 2]"
    if isinstance(value, str) and value.strip().lower() == "all":
        return "all"
    if _is_int(value):
        if value < 1:
            raise ConfigError(f"{where}: gpus={value!r} must be at least 1; {hint}")
        return value
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{where}: gpus=[] lists no GPU; {hint}")
        bad = [v for v in value if not _is_int(v) or v < 0]
        if bad:
            raise ConfigError(f"{where}: gpus={value!r} has {bad[0]!r}, not a GPU index (an int >= 0); {hint}")
        duplicates = sorted({v for v in value if value.count(v) > 1})
        if duplicates:
            raise ConfigError(f"{where}: gpus={value!r} lists GPU {duplicates[0]} twice; list each GPU once")
        return tuple(value)
    raise ConfigError(f"{where}: gpus={value!r} is not a GPU selection; {hint}")


def _parse_command(value: Any, where: str) -> tuple[str, ...]:
    """The ``command:`` value: a non-empty list of arguments, or a string split with shlex."""
    hint = "write e.g. command: [python, scripts/train.py, debug, --exp-name=a]"
    if isinstance(value, str):
        try:
            args = shlex.split(value)
        except ValueError as err:
            raise ConfigError(
                f"{where}: command={value!r} cannot be split ({_one_line(err)}); fix its quoting or {hint}"
            ) from None
    elif isinstance(value, list):
        args = []
        for arg in value:
            if isinstance(arg, str):
                args.append(arg)
            elif _is_number(arg):
                args.append(str(arg))
            else:
                raise ConfigError(f"{where}: command has {arg!r}, not a string; quote each argument, {hint}")
    else:
        raise ConfigError(f"{where}: command={value!r} is not a list or a string; {hint}")
    if not args or not args[0].strip():
        raise ConfigError(f"{where}: command is empty; {hint}")
    return tuple(args)


def _parse_batch(value: Any, where: str, key: str, *, auto_ok: bool = True) -> int | None:
    """A batch value: a positive int, or ``auto`` (None) when ``auto_ok``."""
    if auto_ok and isinstance(value, str) and value.strip().lower() == "auto":
        return None
    if not _is_int(value) or value < 1:
        what = "'auto' or a positive integer" if auto_ok else "a positive integer"
        raise ConfigError(f"{where}: {key}={value!r} must be {what}; write e.g. {key}: 32")
    if value > BATCH_LIMIT:
        raise ConfigError(f"{where}: {key}={value} is beyond any batch a device can hold; use at most {BATCH_LIMIT}")
    return value


def _parse_fraction(value: Any, where: str) -> float | None:
    """A ``fraction:`` value: ``auto`` (None) or a number in (0, 1]."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    if not _is_number(value) or not 0 < value <= 1:
        raise ConfigError(f"{where}: fraction={value!r} must be 'auto' or a number in (0, 1]; write e.g. fraction: 0.3")
    return float(value)


def _parse_int(value: Any, where: str, key: str, minimum: int | None) -> int:
    """An integer value, at least ``minimum`` when given."""
    if not _is_int(value) or (minimum is not None and value < minimum):
        need = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ConfigError(f"{where}: {key}={value!r} must be {need}; write e.g. {key}: {max(minimum or 0, 1)}")
    return value


SCHEDULER_VARIABLES = {
    "CUDA_VISIBLE_DEVICES": "the plan places each run on its GPUs (gpus: N asks for more)",
    "NVIDIA_VISIBLE_DEVICES": "the plan places each run on its GPUs (gpus: N asks for more)",
    "ROCR_VISIBLE_DEVICES": "the plan places each run on its GPUs (gpus: N asks for more)",
    "HIP_VISIBLE_DEVICES": "the plan places each run on its GPUs (gpus: N asks for more)",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "each run holds the pool the plan gave it, preallocated, so the runs beside it fit",
    "JAX_PLATFORMS": "a run goes to the platform the plan is for",
}
"""Variables a queue's ``env:`` may not set (with why): a run's placement and pool are the plan's.
``PYTHONPATH`` may be set: it is appended after the start-up hook's folder."""


class _DuplicateKey(Exception):
    """A mapping of the queue file gives one key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (``name: a`` then ``name: b``,
    which YAML itself resolves silently to the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: YAML's own error follows
                continue
            if first is not None:
                raise _DuplicateKey(
                    f"line {key_node.start_mark.line + 1}: {key!r} is given twice (first on line {first})"
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _parse_env(value: Any, where: str) -> Mapping[str, str]:
    """The ``env:`` value: a mapping of variable names to strings (numbers are written out)."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: env={value!r} is not a mapping; write e.g. env: {{WANDB_MODE: offline}}")
    env: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ConfigError(
                f"{where}: env key {key!r} is not a variable name (letters, digits, _; "
                "not starting with a digit); rename it"
            )
        if isinstance(item, str):
            env[key] = item
        elif _is_number(item):
            env[key] = str(item)
        else:
            raise ConfigError(f'{where}: env {key}={item!r} is not a string; quote it, e.g. {key}: "1"')
        if key in (FRACTION_VARIABLE, NEW_FRACTION_VARIABLE):
            raise ConfigError(
                f"{where}: env {key} is the scheduler's to set (each run's fraction is planned, and jax given both "
                f"spellings starts on the CPU); write fraction: {env[key]} instead"
            )
        owned = SCHEDULER_VARIABLES.get(key) or (
            "jaxfit's own (the pin, its report and the start-up hook's orders)" if key.startswith("JAXFIT_") else None
        )
        if owned:
            raise ConfigError(f"{where}: env {key} is the scheduler's to set: {owned}; remove it from env")
        if key == "XLA_PYTHON_CLIENT_ALLOCATOR" and env[key].strip().lower() == "platform":
            raise ConfigError(
                f"{where}: env XLA_PYTHON_CLIENT_ALLOCATOR=platform gives the run an allocator without a limit, so "
                "its fraction is no cap and runs beside it can run out of memory; remove it"
            )
    return types.MappingProxyType(env)


def _unknown_keys(data: Mapping[Any, Any], valid: Sequence[str], where: str, what: str) -> None:
    """Raise for the first key of ``data`` that is not in ``valid``."""
    for key in data:
        if key not in valid:
            hint = " (a queue file has no family: key; that marks an example model config)" if key == "family" else ""
            raise ConfigError(f"{where}: unknown {what} key {key!r}{hint}; valid keys: {', '.join(valid)}")


def _parse_experiment(data: Any, index: int, source: str) -> Experiment:
    """One entry of ``experiments:``."""
    where = f"{source}: experiments[{index}]"
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{where} is {type(data).__name__}, not a mapping; write '- name: a' with 'command: [...]' under it"
        )
    name = data.get("name")
    if isinstance(name, str) and NAME_PATTERN.match(name):
        where = f"{source}: experiment {name!r}"
    _unknown_keys(data, EXPERIMENT_KEYS, where, "experiment")
    if "name" not in data or name is None:
        raise ConfigError(f"{where} has no name; add e.g. name: run-{index}")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ConfigError(
            f"{where}: name={name!r} must be a string of letters, digits, _, . and - "
            f"(quote numbers); e.g. name: run-{index}"
        )
    if "command" not in data or data["command"] is None:
        raise ConfigError(
            f"{where} has no command; add e.g. command: [python, scripts/train.py, debug, --exp-name={name}]"
        )
    command = _parse_command(data["command"], where)
    batch = _parse_batch(data.get("batch", "auto"), where, "batch")
    fraction = _parse_fraction(data.get("fraction", "auto"), where)
    global_batch = None
    if data.get("global_batch") is not None:
        global_batch = _parse_batch(data["global_batch"], where, "global_batch", auto_ok=False)
        assert global_batch is not None
        if batch is not None and global_batch % batch:
            raise ConfigError(
                f"{where}: global_batch={global_batch} is not a multiple of batch={batch}, so "
                "gradient accumulation cannot keep it; use a multiple of the batch, or batch: auto"
            )
    retries = _parse_int(data.get("retries", 1), where, "retries", 0)
    priority = _parse_int(data.get("priority", 0), where, "priority", None)
    timeout = None
    if data.get("timeout") is not None:
        try:
            timeout = parse_duration(data["timeout"])
        except ConfigError as err:
            raise ConfigError(f"{where}: timeout={data['timeout']!r}: {err}") from None
    env = _parse_env(data["env"], where) if data.get("env") is not None else types.MappingProxyType({})
    gpus = _parse_int(data.get("gpus", 1), where, "gpus", 1)
    return Experiment(
        name=name,
        command=command,
        batch=batch,
        fraction=fraction,
        global_batch=global_batch,
        retries=retries,
        priority=priority,
        timeout=timeout,
        env=env,
        index=index,
        gpus=gpus,
    )


def parse_queue(data: Mapping[str, Any], source: str) -> Queue:
    """Validate parsed YAML ``data`` as a queue; ``source`` names it in messages.

    Raises:
      ConfigError: anything is wrong (one line: file, experiment, key and value, and the fix).
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: a queue file must be a mapping with an experiments: list, got "
            f"{type(data).__name__}; see configs/queue-debug.yaml"
        )
    _unknown_keys(data, TOP_LEVEL_KEYS, source, "top-level")
    gpus = _parse_gpus(data["gpus"], source) if data.get("gpus") is not None else "all"
    reserve = _size(data["reserve"], source, "reserve", zero_ok=True) if data.get("reserve") is not None else 0
    device_memory = (
        _size(data["device_memory"], source, "device_memory", zero_ok=False)
        if data.get("device_memory") is not None
        else None
    )
    overhead = (
        _size(data["process_overhead"], source, "process_overhead", zero_ok=True)
        if data.get("process_overhead") is not None
        else None
    )
    if device_memory is not None and reserve >= device_memory:
        raise ConfigError(
            f"{source}: reserve={format_bytes(reserve)} leaves nothing of "
            f"device_memory={format_bytes(device_memory)}; lower the reserve"
        )
    raw = data.get("experiments")
    if raw is None or raw == []:
        raise ConfigError(
            f"{source}: no experiments; add an experiments: list with at least one '- name: ...' and 'command: [...]'"
        )
    if not isinstance(raw, list):
        raise ConfigError(
            f"{source}: experiments={_one_line(repr(raw))[:60]} is not a list; write each run as "
            "'- name: ...' under experiments:"
        )
    experiments = tuple(_parse_experiment(item, i, source) for i, item in enumerate(raw))
    seen: dict[str, int] = {}
    for experiment in experiments:
        if experiment.name in seen:
            raise ConfigError(
                f"{source}: experiment {experiment.name!r} appears twice (experiments"
                f"[{seen[experiment.name]}] and [{experiment.index}]); give each run its own name"
            )
        seen[experiment.name] = experiment.index
    return Queue(
        source=source,
        experiments=experiments,
        gpus=gpus,
        reserve_bytes=reserve,
        device_memory_bytes=device_memory,
        process_overhead_bytes=overhead,
    )


def load_queue(path: str | Path) -> Queue:
    """Read and validate the queue file at ``path``.

    Raises:
      ConfigError: the file cannot be read, is not YAML, or is not a valid queue (one line).
    """
    source = str(path)
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise ConfigError(f"cannot read queue file {source!r} ({_one_line(reason)}); check the path") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except _DuplicateKey as err:
        raise ConfigError(f"{source}: {err}; keep one of them") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ConfigError(f"{source}: not valid YAML{at}: {_one_line(problem)}; fix the syntax") from None
    if data is None:
        raise ConfigError(f"{source}: the file is empty; add an experiments: list")
    return parse_queue(data, source)
