"""fit: the largest batch under a memory fraction, or the smallest fraction for a batch.

The flow is ``workload -> compile under the target limit -> memory report -> search``: a compile
child started under the target fraction answers "peak at batch B" (:mod:`jaxfit.fit.compiler`), the
search (:mod:`jaxfit.fit.search`) decides which batches to ask about, and this module turns fractions
into budgets and answers into a :class:`FitResult`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jaxfit.fit import budget as budget_mod
from jaxfit.fit.cache import AnswerCache, default_cache_path, usable_cache
from jaxfit.fit.compiler import CompileChild, CompileOutcome, DeviceInfo
from jaxfit.errors import CompileError, ConfigError, DoesNotFitError, JaxfitError
from jaxfit.fit.leftovers import cleaned
from jaxfit.fit.pin import Pin, discard_pin, pin_answer, pins_root, rehome
from jaxfit.fit.pin import find as find_pin
from jaxfit.fit.search import Grid, prove, search
from jaxfit.fit.sources import source_identity

DEFAULT_MEM_FRACTION = 0.45
Progress = Callable[[str, Mapping[str, Any]], None]


def jaxfit_version() -> str:
    """The installed jaxfit version."""
    try:
        return importlib.metadata.version("jaxfit")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def default_mem_fraction() -> float:
    """``XLA_PYTHON_CLIENT_MEM_FRACTION`` when set (as JAX itself would use), else 0.45."""
    text = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if not text:
        return DEFAULT_MEM_FRACTION
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"XLA_PYTHON_CLIENT_MEM_FRACTION={text!r} is not a number; unset it or pass --mem-fraction"
        ) from None
    return budget_mod.check_fraction(value, "XLA_PYTHON_CLIENT_MEM_FRACTION")


@dataclasses.dataclass(frozen=True)
class FitOptions:
    """How to fit.

    Attributes:
      mem_fraction: The XLA_PYTHON_CLIENT_MEM_FRACTION to fit under (``None``: the environment's,
        else 0.45). Ignored by :func:`fit_fraction`, which finds it.
      headroom_bytes: Bytes of the budget to keep free.
      device_memory_bytes: Plan for a device of this size instead of the one present (on a GPU the
        compile runs under the equivalent limit; on a CPU it replaces the host RAM).
      min_batch: Smallest batch to consider.
      max_batch: Largest batch to consider.
      multiple_of: Batches are multiples of this (e.g. the device count, or 8).
      width: Compiles per search round (concurrent threads in the child); ``None``: 4 on a GPU,
        ``min(4, cpu count)`` on a CPU.
      use_cache: Read and write the SQLite cache.
      cache_path: The cache file (default :func:`jaxfit.fit.cache.default_cache_path`).
      verify: On a GPU, prove the answer on autotuned compiles (the program as it will really run;
        near the limit the untuned one can need far less memory) after the search on untuned ones;
        off: the untuned answer, faster but approximate.
      start_timeout: Seconds to wait for the compile child to be ready: for a script, until its
        first call of the train step (it loads its data and model first).
    """

    mem_fraction: float | None = None
    headroom_bytes: int = 0
    device_memory_bytes: int | None = None
    min_batch: int = 1
    max_batch: int = 65536
    multiple_of: int = 1
    width: int | None = None
    use_cache: bool = True
    cache_path: str | None = None
    verify: bool = True
    start_timeout: float = 900.0

    def resolved_fraction(self) -> float:
        if self.mem_fraction is None:
            return default_mem_fraction()
        return budget_mod.check_fraction(self.mem_fraction)

    def grid(self) -> Grid:
        if self.min_batch < 1:
            raise ConfigError(f"--min-batch must be at least 1, got {self.min_batch}")
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


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One compiled batch size and what it needs."""

    batch_size: int
    peak_bytes: int | None
    argument_bytes: int | None
    output_bytes: int | None
    alias_bytes: int | None
    temp_bytes: int | None
    fits: bool
    compile_seconds: float
    cached: bool
    autotuned: bool
    oom: bool = False
    flops: float | None = None
    mem_fraction: float | None = None  # set by the fraction search: the fraction compiled under
    limit_bytes: int | None = None  # set by the fraction search: that fraction's limit

    @classmethod
    def of(cls, outcome: CompileOutcome, budget_bytes: int, **extra: Any) -> Candidate:
        m = outcome.memory
        peak = m.peak_bytes if m else None
        return cls(
            batch_size=outcome.batch_size, peak_bytes=peak,
            argument_bytes=m.argument_bytes if m else None, output_bytes=m.output_bytes if m else None,
            alias_bytes=m.alias_bytes if m else None, temp_bytes=m.temp_bytes if m else None,
            fits=peak is not None and peak <= budget_bytes, compile_seconds=round(outcome.compile_seconds, 3),
            cached=outcome.cached, autotuned=outcome.autotuned, oom=outcome.oom,
            flops=m.flops if m else None, **extra,
        )


@dataclasses.dataclass(frozen=True)
class FitResult:
    """The answer of a fit, for people (``jaxfit.cli.output``) and machines (:meth:`to_dict`).

    Attributes:
      mode: ``batch`` (largest batch under a fraction) or ``fraction`` (smallest fraction for a batch).
      batch_size: The largest batch that fits (``batch`` mode) or the batch asked about.
      multiple_of: The batch granularity searched.
      mem_fraction: The fraction fitted under (``batch``) or found (``fraction``).
      limit_bytes: The allocator limit under that fraction.
      headroom_bytes: Bytes kept free.
      budget_bytes: ``limit_bytes - headroom_bytes``: what the step may use.
      peak_bytes: The compiled peak at ``batch_size`` under ``mem_fraction``.
      outcome: ``boundary`` (proved: the next batch does not fit), ``max`` (``--max-batch`` fits;
        larger batches were not tried) or ``fraction`` (fraction mode).
      device: Platform, kind, count, CUDA total (GPU) or host RAM (CPU), jax version.
      workload: Its name and description.
      compiles: Compiles run (cache hits excluded).
      rounds: Concurrent compile rounds.
      wall_seconds: Wall time of the whole fit.
      candidates: Every batch (or fraction) compiled, in order.
      process_overhead_bytes: Device memory a process holds outside the pool (GPU: measured;
        ``None`` when it could not be measured), which co-located processes must add.
      cached: Whether the answer came from the answer cache.
      message: One line for people.
      pin: The proven program, stored for the training process (:mod:`jaxfit.fit.pin`): its
        ``path`` (``pin.json``), ``step_name``, ``batch_size``, ``peak_bytes``... ``None`` when it
        could not be stored (``pin_note`` says why).
      pin_note: Why the program is not pinned, or a remark on the pin; ``None`` when all is well.
    """

    mode: str
    batch_size: int
    multiple_of: int
    mem_fraction: float
    limit_bytes: int
    headroom_bytes: int
    budget_bytes: int
    peak_bytes: int
    outcome: str
    device: dict[str, Any]
    workload: dict[str, Any]
    compiles: int
    rounds: int
    wall_seconds: float
    candidates: list[Candidate]
    process_overhead_bytes: int | None = None
    process_overhead_method: str | None = None
    cached: bool = False
    message: str = ""
    jaxfit_version: str = dataclasses.field(default_factory=jaxfit_version)
    pin: dict[str, Any] | None = None
    pin_note: str | None = None

    @property
    def pinned(self) -> bool:
        """Whether the proven program is stored for the training process."""
        return self.pin is not None

    def run_env(self) -> dict[str, str]:
        """The environment that runs the proven program in a user's own shell
        (:func:`jaxfit.fit.pin.run_environment`); prepend its PYTHONPATH to your own."""
        from jaxfit.fit.pin import Pin, run_environment

        return run_environment(Pin.from_dict(self.pin) if self.pin else None, self.mem_fraction)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the documented ``--json`` object), with ``env`` (:meth:`run_env`)."""
        data = dataclasses.asdict(self)
        data["env"] = self.run_env()
        return data

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FitResult:
        fields = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in d.items() if k in fields}  # ``env`` is derived, not stored
        data["candidates"] = [Candidate(**c) for c in d["candidates"]]
        return cls(**data)


# -- device identity and the answer cache ------------------------------------------------------


def device_identity() -> str:
    """A cheap identity of the device a child would see, without initialising JAX here."""
    platforms = os.environ.get("JAX_PLATFORMS", "") or os.environ.get("JAX_PLATFORM_NAME", "")
    if "cpu" not in platforms.split(",")[:1] and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout.strip()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            return f"gpu:{visible}:{out}"
        except (OSError, subprocess.SubprocessError):
            pass
    from jaxfit._probe.jaxfit_compile_server import host_memory_bytes

    return f"cpu:{host_memory_bytes()}:{os.cpu_count()}"


def _jax_version() -> str:
    try:
        return importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def fitting_above(candidates: list[Candidate], answer: int, *, tuned_only: bool) -> list[int]:
    """Batches above ``answer`` that were compiled and fit: pockets of a non-monotone peak curve.

    The search answers the first boundary (``peak(answer) <= budget < peak(answer + step)``), as
    the trial search does; on a GPU the peak can dip again further up (measured: an MLP on an H100
    ran at 2252 and 2468 but not at 2253). With ``tuned_only`` untuned compiles are ignored, since
    near the limit they can fit where the real (autotuned) program does not.
    """
    return sorted({c.batch_size for c in candidates
                   if c.fits and c.batch_size > answer and (c.autotuned or not tuned_only)})


NEAR_BUDGET = 0.03
"""On a GPU, an answer whose peak is closer than this share of the budget gets a note: autotuning
picks kernels by timing them, and another process can pick others (H100, gpt-small at batch 13:
17,388,497,252 B in jaxfit's compile, 17,830,671,972 B in the training process, 2.5 % more)."""


def near_budget_note(peak_bytes: int, budget_bytes: int) -> str:
    """A note for the message when the autotuned peak leaves less than :data:`NEAR_BUDGET` spare."""
    spare = (budget_bytes - peak_bytes) / budget_bytes
    if spare >= NEAR_BUDGET:
        return ""
    return (f"; note: only {spare:.1%} of the budget is spare and the program is not pinned, so autotuning in the "
            f"training process can pick kernels that need more (measured: 2.5% more near the limit); --headroom "
            f"{budget_mod.format_bytes(int(NEAR_BUDGET * budget_bytes))} keeps a margin")


def _answer_key(question: Mapping[str, Any], source: Mapping[str, Any]) -> str | None:
    identity = source_identity(source)
    if identity is None:
        return None
    parts = {"question": dict(question), "source": identity, "device": device_identity(),
             "jax": _jax_version(), "jaxfit": jaxfit_version()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _cached_answer(options: FitOptions, question: Mapping[str, Any], source: Mapping[str, Any],
                   start: float) -> tuple[str | None, FitResult | None]:
    key = _answer_key(question, source)
    path = options.cache_file()
    if key is None or path is None:
        return key, None
    store = AnswerCache(path)
    try:
        hit = store.get(key)
    finally:
        store.close()
    if hit is None:
        return key, None
    result = FitResult.from_dict(hit)
    if find_pin(key) is None:  # its proven program is gone (pruned, or never stored): fit again to pin one
        return key, None
    return key, dataclasses.replace(result, cached=True, wall_seconds=round(time.perf_counter() - start, 3))


def _store_answer(options: FitOptions, key: str | None, result: FitResult) -> None:
    path = options.cache_file()
    if key is None or path is None:
        return
    store = AnswerCache(path)
    try:
        store.put(key, result.to_dict())
    finally:
        store.close()


# -- helpers -------------------------------------------------------------------------------------


TUNED_WIDTH = 2
"""Autotuned compiles per round on a GPU: autotuning keeps the whole machine busy, so more at once
only make each slower (H100, gpt-small: one alone 15.6 s, four at once 50.8 s)."""


def _default_width(info: DeviceInfo) -> int:
    if info.limit_sensitive:
        return 4
    return max(1, min(4, os.cpu_count() or 1))


def _device_dict(info: DeviceInfo, total_bytes: int) -> dict[str, Any]:
    d = dataclasses.asdict(info)
    d["total_bytes"] = total_bytes
    return d


def _raise_compile_error(outcome: CompileOutcome) -> None:
    message = (outcome.error or "unknown error").strip().splitlines()[0]
    raise CompileError(
        f"the step failed to compile at batch {outcome.batch_size} for a reason other than memory: "
        f"{message[:400]}"
    )


def _notify(progress: Progress | None, event: str, **data: Any) -> None:
    if progress is not None:
        progress(event, data)


def _note_found_step(progress: Progress | None, workload: Mapping[str, Any]) -> None:
    """Say which function a probe took as the train step when it found it itself."""
    found = str(workload.get("description", {}).get("step_found") or "")
    if found.startswith("found"):
        _notify(progress, "note", text=f"the probe took {workload.get('name')!r} as the train step ({found}); "
                                       "pass --step-name to choose another")


# -- fit: the largest batch ------------------------------------------------------------------------


def _with_leftovers_cleaned(fit: Callable[..., FitResult]) -> Callable[..., FitResult]:
    """Run a fit of a script inside :func:`jaxfit.fit.leftovers.cleaned`: what its probes' start-up
    created in the working folder is removed (or named) and said in the result's message."""

    @functools.wraps(fit)
    def wrapper(source: Mapping[str, Any], *args: Any, progress: Progress | None = None, **kwargs: Any) -> FitResult:
        if source.get("kind") != "script":
            return fit(source, *args, progress=progress, **kwargs)
        try:
            with cleaned(source.get("cwd"), exclude=(default_cache_path().parent,)) as left:
                result = fit(source, *args, progress=progress, **kwargs)
        except JaxfitError as err:
            said = left.message()
            if said:
                raise type(err)(f"{err}; {said}") from None
            raise
        said = left.message()
        if said:
            result = dataclasses.replace(result, message=f"{result.message}; {said}")
            _notify(progress, "note", text=said)
        return result

    return wrapper


@_with_leftovers_cleaned
def fit_batch(source: Mapping[str, Any], options: FitOptions = FitOptions(),
              progress: Progress | None = None) -> FitResult:
    """The largest batch whose compiled peak fits the budget of ``options.mem_fraction``.

    Args:
      source: Where the workload comes from (:func:`jaxfit.fit.sources.example_source` or
        :func:`jaxfit.fit.sources.entry_source`).
      options: Fraction, headroom, bounds, cache.
      progress: Called with ``(event, data)`` as the search goes (``starting``, ``start``,
        ``round``, ``compiled``, ``note``, ``cached``, ``done``).

    Returns:
      The result; ``peak(batch_size) <= budget < peak(batch_size + multiple_of)`` when
      ``outcome == "boundary"``.

    Raises:
      ConfigError: bad options.
      DoesNotFitError: not even ``min_batch`` fits (the message says what it would need).
      CompileError: the step fails to compile for a reason other than memory.
      WorkloadError, WorkerError: the workload could not be built, or the child died.
    """
    start = time.perf_counter()
    fraction = options.resolved_fraction()
    grid = options.grid()
    if options.headroom_bytes < 0:
        raise ConfigError("--headroom must not be negative")
    question = {"mode": "batch", "fraction": fraction, "headroom": options.headroom_bytes,
                "device_memory": options.device_memory_bytes, "grid": [grid.first, grid.last, grid.step],
                "verify": options.verify}
    key, hit = _cached_answer(options, question, source, start)
    if hit is not None:
        _notify(progress, "cached", result=hit)
        return hit

    cache_path = options.cache_file()
    child = CompileChild(source, fraction, cache_path=cache_path, start_timeout=options.start_timeout)
    _notify(progress, "starting", fraction=fraction, source=source)
    info = child.start()
    try:
        if info.limit_sensitive and options.device_memory_bytes:
            # Plan for another card: restart under the fraction whose limit equals f x its memory.
            total = round(info.bytes_limit / fraction)
            child_fraction = fraction * options.device_memory_bytes / total
            if child_fraction > 1:
                raise ConfigError(
                    f"--device-memory {budget_mod.format_bytes(options.device_memory_bytes)} at fraction "
                    f"{fraction} needs more than this GPU's {budget_mod.format_bytes(total)}; plan on a "
                    "larger GPU or lower the fraction"
                )
            child.close()
            child = CompileChild(source, child_fraction, cache_path=cache_path, start_timeout=options.start_timeout)
            info = child.start()
            limit = int(info.bytes_limit)
        elif info.limit_sensitive:
            total = round(info.bytes_limit / fraction)
            limit = int(info.bytes_limit)
        else:
            total = options.device_memory_bytes or info.host_memory_bytes
            limit = int(fraction * total)
        if options.device_memory_bytes:
            total = options.device_memory_bytes
        budget = budget_mod.budget_bytes(limit, options.headroom_bytes)
        if budget <= 0:
            raise ConfigError(
                f"--headroom {budget_mod.format_bytes(options.headroom_bytes)} leaves no budget out of "
                f"{budget_mod.format_bytes(limit)}; lower it or raise --mem-fraction"
            )
        if source.get("kind") == "script" and grid.step % info.device_count:
            # The script shards its batch over every device: only multiples of the count can run.
            step = math.lcm(grid.step, info.device_count)
            grid = Grid(grid.low, grid.high, step)
            _notify(progress, "note", text=f"batch sizes are multiples of {step}: the script shards over "
                                            f"{info.device_count} devices")
        _note_found_step(progress, child.workload_info)
        width = options.width or _default_width(info)
        # On a GPU the search compiles with autotuning off (cheap, and four run side by side in
        # about the time of one) and the answer is then proved on the program as it will really
        # run (autotuned): near the limit the two can differ (on the H200, ViT-S at batch 157 under
        # fraction 0.05 needs 6.96 GiB untuned and 10.89 GiB tuned). --no-verify: untuned only.
        tuned = info.limit_sensitive and options.verify
        _notify(progress, "start", device=info, limit=limit, budget=budget, width=width)

        outcomes: dict[int, CompileOutcome] = {}  # the latest compile of each batch
        history: list[CompileOutcome] = []  # every compile, for the candidate table
        rounds = 0

        def excess_of(o: CompileOutcome) -> float:
            return math.inf if o.memory is None else o.memory.peak_bytes - budget

        def evaluator(autotune: bool, threads: int) -> Callable[[list[int]], dict[int, float]]:
            def evaluate(batches: list[int]) -> dict[int, float]:
                nonlocal rounds
                rounds += 1
                _notify(progress, "round", round=rounds, batches=batches, autotune=autotune and info.limit_sensitive)
                got = child.compile(
                    batches, autotune=autotune, threads=threads,
                    on_result=lambda o: _notify(progress, "compiled", outcome=o, budget=budget),
                )
                for b in batches:
                    if got[b].memory is None and not got[b].oom:
                        _raise_compile_error(got[b])
                    outcomes[b] = got[b]
                    history.append(got[b])
                return {b: excess_of(got[b]) for b in batches}
            return evaluate

        # Untuned on a GPU with verification (the proof follows), else the program as it runs
        # (the CPU compiler has no autotuning; --no-verify takes the untuned answer).
        found = search(evaluator(not info.limit_sensitive, width), grid, width=width,
                       leave_open=TUNED_WIDTH - 1 if tuned else 0)
        if tuned:
            found = prove(evaluator(True, TUNED_WIDTH), grid, found, budget, width=TUNED_WIDTH)
        candidates = [Candidate.of(o, budget) for o in sorted(history, key=lambda o: (o.batch_size, o.autotuned))]
        if found.answer is None:
            smallest = outcomes[grid.first]
            need = smallest.memory.peak_bytes + options.headroom_bytes if smallest.memory else None
            if need is None:
                needs = "the compile itself ran out of memory"
            elif need > total:
                needs = (f"its compiled peak is {budget_mod.format_bytes(smallest.memory.peak_bytes)}, more than the "
                         f"whole device ({budget_mod.format_bytes(total)})")
            else:
                needs = (f"its compiled peak is {budget_mod.format_bytes(smallest.memory.peak_bytes)}, about fraction "
                         f"{budget_mod.fraction_for_bytes(need, total):.2f} of this device")
            raise DoesNotFitError(
                f"not even batch {grid.first} fits the budget of {budget_mod.format_bytes(budget)} "
                f"(fraction {fraction}): {needs}", "raise --mem-fraction, lower --headroom, or shrink the model "
                "(remat, bf16)" if need is None or need <= total else "use a larger device, or shrink the model "
                "(remat, bf16)")
        answer = found.answer
        final = outcomes[answer]
        neighbour = outcomes.get(answer + grid.step)
        assert final.memory is not None
        pin, pin_note = pin_answer(child, answer, key=key, info=info, proven=final.memory, budget_bytes=budget,
                                   limit_bytes=limit, mem_fraction=fraction, root=pins_root(options.use_cache))
        overhead = child.process_overhead() if info.limit_sensitive else {"bytes": 0, "method": "not a GPU"}
    finally:
        child.close()

    assert final.memory is not None
    compiles = sum(1 for c in candidates if not c.cached)
    outcome = "max" if answer == grid.last else "boundary"
    above = fitting_above(candidates, answer, tuned_only=info.limit_sensitive and options.verify)
    message = (
        f"batch {answer} fits: peak {budget_mod.format_bytes(final.memory.peak_bytes)} of a "
        f"{budget_mod.format_bytes(budget)} budget"
        + (f"; batch {answer + grid.step} needs {budget_mod.format_bytes(neighbour.memory.peak_bytes)}"
           if outcome == "boundary" and neighbour is not None and neighbour.memory is not None
           else f"; batch {answer + grid.step} runs out of memory while compiling" if outcome == "boundary" else "")
        + (f"; --max-batch {grid.last} reached, larger batches may fit too" if outcome == "max" else "")
        + (f"; note: batch {', '.join(map(str, above))} also compiled to fit (the peak is not monotone in the "
           "batch here; one boundary is proved, not every pocket)" if above else "")
        + (near_budget_note(final.memory.peak_bytes, budget) if info.limit_sensitive and pin is None else "")
        + (f"; {pin_note}" if pin_note else "")
    )
    result = FitResult(
        mode="batch", batch_size=answer, multiple_of=grid.step, mem_fraction=fraction, limit_bytes=limit,
        headroom_bytes=options.headroom_bytes, budget_bytes=budget, peak_bytes=final.memory.peak_bytes,
        outcome=outcome, device=_device_dict(info, total), workload=child.workload_info,
        compiles=compiles, rounds=rounds, wall_seconds=round(time.perf_counter() - start, 3),
        candidates=candidates, process_overhead_bytes=overhead.get("bytes"),
        process_overhead_method=overhead.get("method"), message=message,
        pin=pin.to_dict() if pin else None, pin_note=pin_note,
    )
    _store_answer(options, key, result)
    _notify(progress, "done", result=result)
    return result


# -- fit inverted: the smallest fraction ----------------------------------------------------------

FRACTION_STEPS = 100  # fractions are found to 0.01


@_with_leftovers_cleaned
def fit_fraction(source: Mapping[str, Any], batch_size: int, options: FitOptions = FitOptions(),
                 progress: Progress | None = None) -> FitResult:
    """The smallest fraction (to 0.01) under which ``batch_size`` compiles to a peak that fits.

    On a GPU each fraction tried is compiled in its own child under that fraction, because the
    peak depends on the limit the compiler sees (FACTS.md #2); the per-process memory outside the
    pool is measured and reported, since co-located processes must add it (FACTS.md #5). On a CPU
    the compile does not depend on the limit, so one compile answers.

    Raises:
      ConfigError, DoesNotFitError, CompileError, WorkloadError, WorkerError: as :func:`fit_batch`.
    """
    start = time.perf_counter()
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {batch_size}")
    if options.headroom_bytes < 0:
        raise ConfigError("--headroom must not be negative")
    question = {"mode": "fraction", "batch": batch_size, "headroom": options.headroom_bytes,
                "device_memory": options.device_memory_bytes, "verify": options.verify}
    key, hit = _cached_answer(options, question, source, start)
    if hit is not None:
        _notify(progress, "cached", result=hit)
        return hit
    cache_path = options.cache_file()

    # A first child under the whole device: the least-squeezed peak, the device, the overhead.
    pins: dict[int, Pin | None] = {}  # fraction units -> the program compiled there, written
    notes: dict[int, str | None] = {}
    with CompileChild(source, 1.0, cache_path=cache_path, start_timeout=options.start_timeout) as child:
        info = child.info
        assert info is not None
        gpu_total = int(info.bytes_limit) if info.limit_sensitive else None
        total = options.device_memory_bytes or gpu_total or info.host_memory_bytes
        if gpu_total and total > gpu_total:
            raise ConfigError(
                f"--device-memory {budget_mod.format_bytes(total)} is larger than this GPU's "
                f"{budget_mod.format_bytes(gpu_total)}; plan on a larger GPU"
            )
        _notify(progress, "start", device=info, limit=total, budget=total - options.headroom_bytes, width=1)
        _notify(progress, "round", round=1, batches=[batch_size])
        full = child.compile([batch_size], autotune=not info.limit_sensitive)[batch_size]
        if full.memory is None and not full.oom:
            _raise_compile_error(full)
        overhead = child.process_overhead() if info.limit_sensitive else {"bytes": 0, "method": "not a GPU"}
        workload_info = child.workload_info
        _note_found_step(progress, workload_info)
        if not info.limit_sensitive and full.memory is not None:
            # The CPU compiler ignores the limit: this program is the answer at any fraction.
            units = min(FRACTION_STEPS, math.ceil((full.memory.peak_bytes + options.headroom_bytes) * FRACTION_STEPS
                                                  / total - 1e-9))
            pins[units], notes[units] = pin_answer(
                child, batch_size, key=key, info=info, proven=full.memory, budget_bytes=int(total * units / FRACTION_STEPS)
                - options.headroom_bytes, limit_bytes=int(total * units / FRACTION_STEPS), mem_fraction=units / FRACTION_STEPS,
                root=pins_root(options.use_cache))

    def limit_of(units: int) -> int:
        return int(total * units / FRACTION_STEPS)

    if full.memory is None or full.memory.peak_bytes + options.headroom_bytes > total:
        peak = budget_mod.format_bytes(full.memory.peak_bytes) if full.memory else "more than the device"
        raise DoesNotFitError(
            f"batch {batch_size} does not fit even the whole device ({budget_mod.format_bytes(total)}): "
            f"its compiled peak is {peak}", "use a smaller batch with gradient accumulation, remat or bf16"
        )
    floor = full.memory.argument_bytes + full.memory.output_bytes - full.memory.alias_bytes
    estimate = min(FRACTION_STEPS, math.ceil((full.memory.peak_bytes + options.headroom_bytes) * FRACTION_STEPS / total - 1e-9))
    lowest = max(1, math.floor((floor + options.headroom_bytes) * FRACTION_STEPS / total))
    candidates = [Candidate.of(full, total - options.headroom_bytes, mem_fraction=1.0, limit_bytes=total)]
    compiles = 0 if full.cached else 1
    rounds = 1

    if not info.limit_sensitive:
        # The CPU compiler ignores the limit: the peak is the same at every fraction.
        units = estimate
        peak = full.memory.peak_bytes
        limit = limit_of(units)
    else:
        outcomes: dict[int, tuple[CompileOutcome, int]] = {}
        budget_at = lambda limit: limit - options.headroom_bytes  # noqa: E731

        def compile_at(units_list: list[int], autotune: bool) -> dict[int, tuple[CompileOutcome, int]]:
            nonlocal rounds, compiles
            rounds += 1
            fractions = [u / FRACTION_STEPS for u in units_list]
            _notify(progress, "round", round=rounds, fractions=fractions, autotune=autotune)
            answers = _compile_under_fractions(source, batch_size, fractions, total, gpu_total, cache_path, autotune,
                                               options.start_timeout, key=key, headroom=options.headroom_bytes,
                                               root=pins_root(options.use_cache))
            for u, (outcome, limit, pinned, note) in zip(units_list, answers):
                if outcome.memory is None and not outcome.oom:
                    _raise_compile_error(outcome)
                compiles += 0 if outcome.cached else 1
                _notify(progress, "compiled", outcome=outcome, budget=budget_at(limit), fraction=u / FRACTION_STEPS)
                discard_pin(pins.get(u))
                pins[u], notes[u] = pinned, note
            return {u: (outcome, limit) for u, (outcome, limit, _, _) in zip(units_list, answers)}

        def excess(outcome: CompileOutcome, limit: int) -> float:
            return math.inf if outcome.memory is None else outcome.memory.peak_bytes - budget_at(limit)

        def evaluate(xs: list[int]) -> dict[int, float]:
            # Each fraction in its own child; on a GPU the real (autotuned) program unless --no-verify.
            got = compile_at([-x for x in xs], autotune=options.verify)
            outcomes.update(got)
            return {x: excess(*got[-x]) for x in xs}

        # Search x = -units, so that "the largest x that fits" is the smallest fraction.
        grid = Grid(-FRACTION_STEPS, -lowest, 1)
        known = evaluate(sorted({-estimate, -((lowest + estimate) // 2)}))
        if not options.verify:  # the whole-device compile above was untuned too
            known.setdefault(-FRACTION_STEPS, full.memory.peak_bytes - budget_at(total))
        found = search(evaluate, grid, width=3, known=known)
        if found.answer is None:
            raise DoesNotFitError(f"batch {batch_size} does not fit under any fraction of this device")
        units = -found.answer
        chosen = outcomes.get(units)
        if chosen is None:  # the answer is the whole device, compiled first
            peak, limit = full.memory.peak_bytes, total
            notes[units] = "not pinned: the answer is the whole device, compiled untuned (--no-verify)"
        else:
            assert chosen[0].memory is not None
            peak, limit = chosen[0].memory.peak_bytes, chosen[1]
        for u in sorted(outcomes):
            o, lim = outcomes[u]
            candidates.append(Candidate.of(o, budget_at(lim), mem_fraction=u / FRACTION_STEPS, limit_bytes=lim))

    pin, pin_note = rehome(pins.pop(units, None), key), notes.get(units)
    for other in pins.values():
        discard_pin(other)
    fraction = units / FRACTION_STEPS
    overhead_bytes = overhead.get("bytes")
    message = (
        f"batch {batch_size} needs fraction {fraction:.2f}: peak {budget_mod.format_bytes(peak)} within "
        f"a limit of {budget_mod.format_bytes(limit)}"
        + (f"; add {budget_mod.format_bytes(overhead_bytes)} per process outside the pool when sharing a GPU"
           if overhead_bytes else "")
        + (f"; {pin_note}" if pin_note else "")
    )
    result = FitResult(
        mode="fraction", batch_size=batch_size, multiple_of=1, mem_fraction=fraction, limit_bytes=limit,
        headroom_bytes=options.headroom_bytes, budget_bytes=limit - options.headroom_bytes, peak_bytes=peak,
        outcome="fraction", device=_device_dict(info, total), workload=workload_info, compiles=compiles,
        rounds=rounds, wall_seconds=round(time.perf_counter() - start, 3), candidates=candidates,
        process_overhead_bytes=overhead_bytes, process_overhead_method=overhead.get("method"), message=message,
        pin=pin.to_dict() if pin else None, pin_note=pin_note,
    )
    _store_answer(options, key, result)
    _notify(progress, "done", result=result)
    return result


def _compile_under_fractions(source: Mapping[str, Any], batch_size: int, fractions: list[float], total: int,
                             gpu_total: int | None, cache_path: str | None, autotune: bool, start_timeout: float, *,
                             key: str | None, headroom: int,
                             root: Path) -> list[tuple[CompileOutcome, int, Pin | None, str | None]]:
    """Compile ``batch_size`` once under each fraction of ``total``, one child each, concurrently; each
    child also writes its program as a pin (the one of the answer is kept, the others discarded)."""
    import concurrent.futures

    def one(fraction: float) -> tuple[CompileOutcome, int, Pin | None, str | None]:
        child_fraction = fraction * total / gpu_total if gpu_total else fraction
        with CompileChild(source, child_fraction, cache_path=cache_path, start_timeout=start_timeout) as child:
            assert child.info is not None
            limit = int(child.info.bytes_limit) if child.info.bytes_limit else int(fraction * total)
            outcome = child.compile([batch_size], autotune=autotune)[batch_size]
            pin, note = None, None
            if outcome.memory is not None and outcome.memory.peak_bytes <= limit - headroom:
                pin, note = pin_answer(child, batch_size, key=f"{key}-{round(fraction * 100)}" if key else None,
                                       info=child.info, proven=outcome.memory, budget_bytes=limit - headroom,
                                       limit_bytes=limit, mem_fraction=fraction, root=root)
            return outcome, limit, pin, note

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(fractions)) as pool:
        return list(pool.map(one, fractions))
