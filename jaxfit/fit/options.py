"""How to fit: :class:`FitOptions`, also the ``jaxfit fit`` / ``run`` flags (tyro reads it as is)."""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated

import tyro

from jaxfit.errors import ConfigError
from jaxfit.fit import budget as budget_mod
from jaxfit.fit.cache import default_cache_path, usable_cache
from jaxfit.fit.search import Grid
from jaxfit.fit.targets import Target

DEFAULT_MEM_FRACTION = 0.45
"""The fraction fitted under when neither ``--mem-fraction`` nor $XLA_PYTHON_CLIENT_MEM_FRACTION is set."""
DEFAULT_MAX_BATCH = 65536
BATCH_LIMIT = 2**31 - 1
"""The largest batch-like number jaxfit takes anywhere (a batch, a global batch, a bound): beyond any
batch a device can hold, and what XLA's 32-bit dimensions allow."""


def check_batch_number(value: int, flag: str) -> int:
    """``value`` when it is a batch-like number jaxfit takes (1 to :data:`BATCH_LIMIT`).

    Raises:
      ConfigError: it is not, in one line naming ``flag``.
    """
    if value < 1:
        raise ConfigError(f"{flag} {value} must be at least 1")
    if value > BATCH_LIMIT:
        raise ConfigError(f"{flag} {value} is beyond any batch a device can hold; use at most {BATCH_LIMIT}")
    return value


"""The largest batch bound taken: XLA's dimensions are 64-bit, but a batch beyond 2^31 samples is
no batch a device holds, and a bound of 10^20 once grew the search's memory without end."""
"""The largest batch a fit considers unless told otherwise."""
DEFAULT_START_TIMEOUT = 900.0
"""Seconds a probe waits for a script to reach its train step (data and weight loading first)."""


def default_mem_fraction() -> float:
    """``XLA_PYTHON_CLIENT_MEM_FRACTION`` (or its new spelling ``XLA_CLIENT_MEM_FRACTION``) when set,
    as JAX itself would use, else 0.45.

    Raises:
      ConfigError: the variable is not a fraction in (0, 1]; both spellings are set (jaxlib refuses that).
    """
    legacy, new = budget_mod.FRACTION_VARIABLE, budget_mod.NEW_FRACTION_VARIABLE
    if os.environ.get(legacy) and os.environ.get(new):
        raise ConfigError(f"both {new} and {legacy} are set, which jaxlib refuses on a GPU; unset {legacy}")
    name = budget_mod.fraction_variable()
    text = os.environ.get(name)
    if not text:
        return DEFAULT_MEM_FRACTION
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number; unset it or pass --mem-fraction") from None
    return budget_mod.check_fraction(value, name)


def _size_spec() -> tyro.constructors.PrimitiveConstructorSpec[int]:
    return tyro.constructors.PrimitiveConstructorSpec(
        nargs=1,
        metavar="SIZE",
        instance_from_str=lambda args: budget_mod.parse_size(args[0]),
        is_instance=lambda x: isinstance(x, int) and not isinstance(x, bool),
        str_from_instance=lambda x: [str(x)],
    )


Size = Annotated[int, _size_spec()]
"""Bytes, written as a size on the command line (``2GiB``, ``96GB``, ``512MiB``, or plain bytes)."""


@dataclasses.dataclass(frozen=True)
class FitOptions:
    """How to fit (the same fields are the flags of ``jaxfit fit`` and ``jaxfit run``).

    Attributes:
      mem_fraction: The XLA_PYTHON_CLIENT_MEM_FRACTION to fit under, in (0, 1]; default
        $XLA_PYTHON_CLIENT_MEM_FRACTION, else 0.45. (The inverse fit finds it instead.)
      headroom_bytes: Memory to keep free inside the budget, e.g. 2GiB.
      device_memory_bytes: Plan for a device of this size, e.g. 96GiB (on a GPU the compile runs
        under the limit that fraction of such a card gives; on a CPU it replaces the host RAM).
      min_batch: Smallest batch size to consider.
      max_batch: Largest batch size to consider.
      multiple_of: Only consider multiples of this (e.g. the number of devices, or 8).
      width: Concurrent compiles per search round (default on a GPU: 4, or 8 on a host of 16 cores
        and 96 GiB or more; otherwise up to 4 CPU cores).
      use_cache: Use the answer and compile cache (~/.cache/jaxfit or $JAXFIT_CACHE_DIR); --no-cache
        compiles afresh.
      cache_path: The cache file (default: cache.sqlite3 in the cache folder).
      verify: On a GPU, prove the answer with autotuned compiles (the step as it will run) after
        searching with untuned ones; --no-verify takes the untuned answer (faster, approximate).
      start_timeout: Seconds to wait for a training script to reach its first call of the step (it
        loads its data and model first).
      pin: Write the program that proved the answer for the run to load (:mod:`jaxfit.fit.pin`);
        what-if cells turn it off (they answer for cards and meshes that will not run here).
      time_steps: ``(warmup, steps)``: also run the answer's program in the compile process that
        proved it, on real arguments, and time it (``FitResult.timing``; ``jaxfit tune --measure
        inline``); the answer cache is not read then (it keeps no program to run).
      batches: Only these batch sizes (within the bounds and multiples of ``multiple_of``): ``jaxfit
        tune`` asks for the divisors of its global batch, the only micro-batches it can use. Their
        search is not proved on a GPU (as ``verify=False``): each is proved where it is used.
      time_give_up: ``(look, seconds per sample)`` with ``time_steps``: stop timing after ``look``
        timed steps when they took longer than that per sample of the batch on average (a candidate
        clearly slower than the best one so far; ``FitResult.timing["stopped_early"]``).
      rank_steps: ``(warmup, steps)`` with ``batches`` on a GPU: also run the untuned program of
        each listed batch up to the answer in the compile process, and time it
        (``FitResult.untuned_timings``): ``jaxfit tune`` ranks micro-batches on these before it
        proves any. Those compiles are made even when cached (a cached peak has no program).
      target: A GPU compiled for without it (``--gpu MODEL``, ``--gpu-spec FILE``): the compiles run
        deviceless, on the CPU, for that card; answers are estimates (untuned), never pinned.
      squeeze: With ``target``: let the compiler see the card's limit (it rematerialises to fit it,
        as the card does); off: a compiler with room to spare (:mod:`jaxfit.fit.estimate`).
      lean_start: With --script and --gpu: the jitted functions the script calls before its step
        that make large arrays (its state's init) hand back their shapes instead of running, so its
        start-up on this CPU needs little memory (openpi's pi0: 26-50 GiB otherwise); a script that
        computes with its state before its first step is started again in full by itself.
        --no-lean-start runs its start-up in full from the start.
    """

    mem_fraction: float | None = None
    headroom_bytes: Annotated[Size, tyro.conf.arg(name="headroom")] = 0
    device_memory_bytes: Annotated[Size | None, tyro.conf.arg(name="device-memory")] = None
    min_batch: int = 1
    max_batch: int = DEFAULT_MAX_BATCH
    multiple_of: int = 1
    width: int | None = None
    use_cache: Annotated[bool, tyro.conf.arg(name="cache")] = True
    cache_path: tyro.conf.Suppress[str | None] = None
    verify: bool = True
    start_timeout: Annotated[float, tyro.conf.arg(name="probe-timeout")] = DEFAULT_START_TIMEOUT
    pin: tyro.conf.Suppress[bool] = True
    time_steps: tyro.conf.Suppress[tuple[int, int] | None] = None
    time_give_up: tyro.conf.Suppress[tuple[int, float] | None] = None
    batches: tyro.conf.Suppress[tuple[int, ...] | None] = None
    rank_steps: tyro.conf.Suppress[tuple[int, int] | None] = None
    target: tyro.conf.Suppress[Target | None] = None
    squeeze: tyro.conf.Suppress[bool] = True
    lean_start: bool = True

    def resolved_fraction(self) -> float:
        """The fraction to fit under (:func:`default_mem_fraction` when not given).

        Raises:
          ConfigError: outside (0, 1].
        """
        if self.mem_fraction is None:
            return default_mem_fraction()
        return budget_mod.check_fraction(self.mem_fraction)

    def grid(self) -> Grid:
        """The batches to consider.

        Raises:
          ConfigError: bad bounds.
        """
        if self.min_batch < 1:
            raise ConfigError(f"--min-batch must be at least 1, got {self.min_batch}")
        for flag, value in (("--min-batch", self.min_batch), ("--max-batch", self.max_batch)):
            if value > BATCH_LIMIT:
                raise ConfigError(f"{flag} {value} is beyond any batch a device can hold; use at most {BATCH_LIMIT}")
        if self.multiple_of > BATCH_LIMIT:
            raise ConfigError(f"--multiple-of {self.multiple_of} is beyond any batch; use at most {BATCH_LIMIT}")
        return Grid(self.min_batch, self.max_batch, self.multiple_of)

    def validate(self) -> FitOptions:
        """Check every option (one-line :class:`ConfigError` naming the flag); returns ``self``."""
        self.resolved_fraction()
        if self.width is not None and self.width < 1:
            raise ConfigError(f"--width {self.width} must be at least 1 (compiles per search round)")
        if not self.start_timeout > 0:
            raise ConfigError(f"--probe-timeout {self.start_timeout:g} must be more than 0 seconds")
        if self.headroom_bytes < 0:
            raise ConfigError("--headroom must not be negative")
        return self

    def cache_file(self) -> str | None:
        """The cache file to use, or None (``use_cache`` off, or a cache that cannot be used:
        :func:`jaxfit.fit.cache.usable_cache` warns once and jaxfit runs without it)."""
        if not self.use_cache:
            return None
        return usable_cache(self.cache_path or default_cache_path())
