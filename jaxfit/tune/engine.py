"""``jaxfit tune``: the fastest settings that fit, proven by compiling and measured by running.

For each setting (remat and precision of a built-in example, or a script's own flags):

1. **Fit** (:func:`jaxfit.fit_batch`): its largest micro-batch under the fraction (on a GPU with
   a global batch, searched on untuned compiles and not proved: it only says where to start);
   then each micro-batch ``m`` that divides the global batch ``G`` (the largest few that fit) is
   compiled as it will run, accumulated over ``G / m`` steps, to prove it fits (one autotuned
   compile each on a GPU; one that does not fit gives way to the next divisor down); each proof
   pins its program. For a
   built-in example every fit of the tune runs in one compile process, which switches workloads
   (:func:`jaxfit.fit.batch.shared_compile_process`); a script is probed in its own process each time.
   With ``--rank-untuned`` (experimental; a GPU with ``--measure inline``), the search's untuned
   program of every micro-batch is run a few steps first, and the proofs go in the order of those
   rates across all settings: a micro-batch more than ``--drop-margin`` below the best one proved
   to fit is not proved (``ranked out``; :mod:`jaxfit.tune.ranking`).
2. **Prune**: a candidate whose compiled FLOPs at the device's peak rate cannot beat the best
   samples/s measured so far is not run (a bound, not a guess: without a known peak nothing is
   pruned); ``--budget`` stops measuring when that much time was spent measuring (fitting, which
   comes first, is not counted).
3. **Measure**: a fresh training process under the fraction loads the candidate's pinned program,
   runs warm-up steps, then timed steps (jaxfit's start-up hook times each step, and the time the
   script spends between steps), and is stopped (:mod:`jaxfit._probe.jaxfit_measure`); or, with
   ``--measure inline``, the compile process that proved the program times it. **Candidates that
   are clearly slower stop early**: after the first quarter of the timed steps (of 4 or more), a candidate more
   than ``--drop-margin`` (10 %) below the best rate measured so far is dropped (successive
   halving in its asynchronous form: each candidate is compared with the best so far as it runs,
   so no candidate pays a second start-up to be measured longer). Measurements are cached by the
   program's fingerprint, the fraction, the device and the versions (whole ones only).
4. **Rank** by samples per second, with the compiled peak and headroom, step time, MFU (model
   FLOPs from the compiled cost analysis of the same step without remat, where it was compiled;
   else the program's own FLOPs, recompute included, and the row says so) and the input bandwidth
   the rate needs (bytes per sample x samples/s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from jaxfit.errors import DoesNotFitError, JaxfitError
from jaxfit.fit import FitOptions, FitResult, fit_batch
from jaxfit.fit.answers import device_identity
from jaxfit.fit.batch import shared_compile_process
from jaxfit.fit.budget import format_bytes, set_fraction
from jaxfit.fit.cache import JsonStore, default_cache_path
from jaxfit.fit.command import hooked_pythonpath, with_batch
from jaxfit.fit.common import Progress, notify
from jaxfit.fit.compiler import HOOK_VARIABLES
from jaxfit.fit.devices import cuda_total_bytes
from jaxfit.fit.leftovers import cleaned, probe_environment
from jaxfit.fit.pin import Pin, hook_environment, pool_environment, run_environment
from jaxfit.fit.sources import ExampleSource, ScriptSource
from jaxfit.run.accumulation import accumulated_command
from jaxfit.tune.peaks import peak_flops
from jaxfit.tune.ranking import Candidate, Rung, proof_order, untuned_rates
from jaxfit.tune.space import Setting, micro_batches, upper_bound_samples_per_second
from jaxfit.versions import jax_version, jaxfit_version

Status = Literal[
    "measured",
    "does not fit",
    "out of memory",
    "crashed",
    "ended early",
    "timed out",
    "cannot win",
    "budget spent",
    "dropped",
    "ranked out",
    "not run",
]

SEARCH_WIDTH = 8
"""Untuned compiles in the one round of a tune's search on a GPU (the divisors of the global
batch; more than this take two rounds)."""
DROP_MARGIN = 0.10
"""By default a candidate is dropped when its first timed steps run this much slower than the best
rate measured so far: far outside the noise of a step's time (a few per cent), and far from the
3 % within which candidates count as equally fast."""


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    """How to tune.

    Attributes:
      global_batch: Samples per optimizer step to keep (None: each setting's largest batch).
      warmup: Steps run before timing (the first loads the program).
      steps: Steps timed; the median is the step time.
      budget_seconds: Stop measuring once measuring has taken this long (the fits before it are not
        counted; None: no limit).
      peak_tflops: The device's peak TFLOP/s for MFU and pruning (None: from a table of GPUs).
      micro_batches: Micro-batches proved per setting, largest first (ranked on a GPU inline:
        fastest untuned first).
      measure_timeout: Seconds a measuring process may take.
      use_cache: Reuse measurements of the same program, fraction, device and versions.
      measure: ``process``: each candidate trains in a fresh process with its pinned program (the
        step and the time between steps, the script's data loading included); ``inline``: the
        program is run where it was proven, in the compile process, on real arguments of its shapes
        (no start-up per candidate; the step alone; built-in examples only so far); ``auto``: inline
        for a built-in example on a GPU (on an H100 it found the grid's winner in 0.40x of the
        grid's time against 0.63x, its rates within 1 % of a fresh process's:
        benchmarks/README.md section 15), fresh processes otherwise (a script; a CPU, where
        inline timing ranked two settings 2 % apart the wrong way round, section 12).
      drop_margin: Stop measuring a candidate after :attr:`look_steps` timed steps when its rate is
        more than this share below the best measured so far (its row says ``dropped``); None:
        measure every candidate fully.
      rank_untuned: Experimental, GPU with ``measure="inline"`` and a global batch: run every
        micro-batch's untuned program (compiled by the search, accumulated to the global batch)
        a few steps, prove fastest first, and leave out what is ``drop_margin`` below the best
        proved (:mod:`jaxfit.tune.ranking`). Off by default: on an H200 the untuned programs of
        gpt-small ran about 12x slower than the proven ones, so ranking took 217 s where the
        proofs it saved cost about 70 s (benchmarks/README.md section 21).
    """

    global_batch: int | None = None
    warmup: int = 2
    steps: int = 5
    budget_seconds: float | None = None
    peak_tflops: float | None = None
    micro_batches: int = 3
    measure_timeout: float = 900.0
    use_cache: bool = True
    measure: Literal["auto", "process", "inline"] = "auto"
    drop_margin: float | None = DROP_MARGIN
    rank_untuned: bool = False

    @property
    def look_steps(self) -> int:
        """Timed steps after which a clearly slower candidate is dropped: a quarter of them (none
        is dropped when fewer than 4 steps are timed: one step is too noisy a look to judge by)."""
        return max(1, self.steps // 4)

    def validate(self) -> TuneOptions:
        from jaxfit.errors import ConfigError

        if self.global_batch is not None and self.global_batch < 1:
            raise ConfigError(f"--global-batch {self.global_batch} must be at least 1")
        if self.warmup < 1 or self.steps < 1:
            raise ConfigError("--warmup and --steps must be at least 1 (the first step loads the program)")
        if self.budget_seconds is not None and not self.budget_seconds > 0:
            raise ConfigError(f"--budget {self.budget_seconds} must be more than 0 seconds")
        if self.micro_batches < 1:
            raise ConfigError(f"--micro-batches {self.micro_batches} must be at least 1")
        if self.measure not in ("auto", "process", "inline"):
            raise ConfigError(f"--measure {self.measure!r} is not one of auto, process, inline")
        if self.drop_margin is not None and not 0 <= self.drop_margin < 1:
            raise ConfigError(
                f"--drop-margin {self.drop_margin} must be in [0, 1) (0.1: drop a candidate 10% slower than the best "
                "after its first steps); None measures every candidate fully"
            )
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ConfigError(f"--peak-tflops {self.peak_tflops} must be positive")
        return self


@dataclasses.dataclass
class Row:
    """One candidate: a setting at a micro-batch, what it needs, and how fast it ran."""

    setting: str
    micro_batch: int
    accum_steps: int
    global_batch: int
    peak_bytes: int | None = None
    budget_bytes: int | None = None
    fits: bool = False
    status: Status = "not run"
    note: str = ""
    step_seconds: float | None = None
    timed_steps: int | None = None
    """Steps timed (fewer than ``--steps`` for a dropped row)."""
    samples_per_second: float | None = None
    """What training gets: the global batch over the step's time and the time between two steps
    (the script's data loading, logging); the step's own time alone when that was not measured."""
    step_samples_per_second: float | None = None
    """The step alone: the global batch over its time."""
    outside_step_seconds: float | None = None
    limited_by: str | None = None
    """``step`` or ``input`` (the time between steps, the script's data loader above all, is the
    larger); None when not measured."""
    flops_per_step: float | None = None
    model_flops_per_step: float | None = None
    mfu: float | None = None
    mfu_source: str = ""
    bytes_per_sample: int | None = None
    input_bytes_per_second: float | None = None
    cached: bool = False
    measured_in: str = ""
    """``process`` (a fresh training process) or ``compile process`` (``--measure inline``)."""
    pin: str | None = None
    precision: str = ""
    remat: bool = False
    untuned_samples_per_second: float | None = None
    """The micro-batch's untuned plain step, run in the compile process, as samples per second:
    what proofs are ranked by on a GPU (:mod:`jaxfit.tune.ranking`); not the candidate's speed."""

    @property
    def headroom_bytes(self) -> int | None:
        return None if self.peak_bytes is None or self.budget_bytes is None else self.budget_bytes - self.peak_bytes

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["headroom_bytes"] = self.headroom_bytes
        return data


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """What ``jaxfit tune`` found: every row (measured fastest first), and the best one."""

    rows: list[Row]
    best: Row | None
    workload: str
    mem_fraction: float
    device: dict[str, Any]
    peak_flops: float | None
    peak_source: str
    wall_seconds: float
    command: list[str] | None
    breakdown: list[dict[str, Any]]
    message: str
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """The environment that trains the best row in a user's own shell: the fraction and, when its
    proven program is still stored, the start-up hook and the pin (:func:`winner_environment`)."""
    phase_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    """Wall time of each phase: ``search`` (each setting's largest micro-batch, untuned on a GPU),
    ``rank`` (running those untuned programs to order the proofs, GPU inline only), ``prove`` (an
    autotuned fit of each accumulated candidate, with its inline timing; its compiled FLOPs are also
    the bounds) and ``measure`` (the candidates' training processes)."""

    @property
    def pinned(self) -> bool:
        """Whether :attr:`env` loads the best row's proven program."""
        return "JAXFIT_PIN" in self.env

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": [r.to_dict() for r in self.rows],
            "best": self.best.to_dict() if self.best else None,
            "workload": self.workload,
            "mem_fraction": self.mem_fraction,
            "device": self.device,
            "peak_flops": self.peak_flops,
            "peak_source": self.peak_source,
            "wall_seconds": self.wall_seconds,
            "command": self.command,
            "breakdown": self.breakdown,
            "message": self.message,
            "env": self.env,
            "phase_seconds": self.phase_seconds,
            "jaxfit_version": jaxfit_version(),
        }


# -- the sources of a setting ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    """What is tuned: a built-in example (config overrides) or a script (flags), and how to run it."""

    example: ExampleSource | None = None
    script: ScriptSource | None = None

    @property
    def name(self) -> str:
        if self.example is not None:
            return self.example.name
        assert self.script is not None
        return " ".join(self.script.run_command)

    def source(self, setting: Setting, accum: int, batch: int | None) -> ExampleSource | ScriptSource:
        """The source of ``setting`` accumulated over ``accum`` micro-batches (at ``batch``, for scripts)."""
        if self.example is not None:
            overrides = dict(self.example.overrides) | dict(setting.overrides)
            if accum > 1:
                overrides["grad_accum_steps"] = str(accum)
            return ExampleSource(self.example.name, tuple(overrides.items()))
        assert self.script is not None
        command = list(self.script.run_command) + list(setting.flags)
        if accum > 1:
            command = accumulated_command(
                command, batch or accum, accum, self.script.batch_flag, self.script.accum_flag
            )
        return self.script.with_command(command, batch)

    def stacked_source(self, setting: Setting, global_batch: int) -> ExampleSource:
        """A built-in example's ``setting`` with every micro-batch of ``global_batch`` as one
        workload (batch size = micro-batch, accumulated to ``global_batch``): what micro-batches are
        ranked on (:mod:`jaxfit.tune.ranking`)."""
        source = self.source(setting, 1, None)
        assert isinstance(source, ExampleSource)
        return dataclasses.replace(source, stacked_to=global_batch)

    def command(self, setting: Setting, micro: int, accum: int, *, measuring: bool = False) -> list[str]:
        """The command that trains ``setting`` at ``micro x accum``; ``measuring``: with the probe's
        own arguments (``--probe-arg``: where a short run's outputs go), as it is measured."""
        if self.example is not None:
            source = self.source(setting, accum, None)
            assert isinstance(source, ExampleSource)
            sets = [f"--set={k}={v}" for k, v in source.overrides]
            return [
                sys.executable,
                "-m",
                "jaxfit.tune.trial",
                "--example",
                source.name,
                *sets,
                "--batch",
                str(micro * accum),
            ]
        assert self.script is not None
        source = self.source(setting, accum, micro * accum)
        assert isinstance(source, ScriptSource)
        return with_batch(
            list(source.command if measuring else source.run_command), self.script.batch_flag, micro * accum
        )


# -- the best so far, and when a candidate is dropped --------------------------------------------


@dataclasses.dataclass
class _Leader:
    """The best rate measured so far (whole measurements only), and the give-up test the next
    candidate is measured under."""

    tuning: TuneOptions
    rate: float = 0.0

    def record(self, row: Row) -> None:
        if row.status == "measured" and row.samples_per_second:
            self.rate = max(self.rate, row.samples_per_second)

    def give_up(self) -> tuple[int, float] | None:
        """``(look, seconds per sample)``: a candidate whose first ``look`` timed steps take longer
        than that per sample is more than the margin below the best so far; None before anything
        was measured, without a margin, or with fewer than 4 timed steps."""
        margin, look = self.tuning.drop_margin, self.tuning.look_steps
        if margin is None or not self.rate or self.tuning.steps < 4:
            return None
        return look, 1.0 / (self.rate * (1 - margin))


# -- fitting each candidate ------------------------------------------------------------------------


def _dtype_of(setting: Setting, target: Target) -> str:
    for key, value in setting.overrides:
        if key == "dtype":
            return value
    for flag in setting.flags:
        if "bfloat16" in flag or "bf16" in flag:
            return "bfloat16"
    if target.example is not None:
        from jaxfit.examples import load_config

        return str(load_config(target.example.name, dict(target.example.overrides)).dtype)
    return "float32"


def _prove(
    target: Target,
    setting: Setting,
    micro: int,
    accum: int,
    largest: FitResult | None,
    options: FitOptions,
    progress: Progress | None,
) -> FitResult:
    """The fit that proves ``setting`` at ``micro x accum`` fits (and pins its program): the
    search's own answer when that is this very program, compiled as it runs, and pinned."""
    if (
        largest is not None
        and accum == 1
        and largest.batch_size == micro
        and largest.pin
        and _compiled_as_run(largest)
        and (options.time_steps is None or largest.timing)
    ):
        return largest
    batch = micro * accum
    exact = dataclasses.replace(options, min_batch=batch, max_batch=batch, multiple_of=accum)
    return fit_batch(target.source(setting, accum, batch), exact, progress=progress)


def _compiled_as_run(fit: FitResult) -> bool:
    """Whether ``fit``'s answer was compiled as the program runs: autotuned on a GPU (a search
    without its proof is not), always on a CPU (which has no autotuning)."""
    if not fit.device.get("limit_sensitive"):
        return True
    return any(c.autotuned and c.batch_size == fit.batch_size and c.fits for c in fit.candidates)


def _flops_per_step(micro: int, accum: int, fit: FitResult, largest: FitResult) -> float | None:
    """FLOPs of one optimizer step of ``micro x accum``.

    XLA's cost analysis counts the body of a loop once, so the compiled FLOPs of an accumulated
    step (a scan over ``accum`` micro-batches) are those of one micro-batch: the count of a plain
    step at ``micro`` (compiled while searching the largest micro-batch) times ``accum`` is taken,
    else the program's own count (no accumulation), else the largest plain step's FLOPs per sample
    times the global batch. The search's count comes first even without accumulation: on a GPU it
    is untuned, and an autotuned program's count misses what runs in the library calls autotuning
    chose (on an H100, vit-small remat full: 2.0 GFLOPs per sample autotuned at batch 128 against
    30.5 untuned at 64, where ViT-S/16's forward pass alone is ~9.2; gpt-small's untuned count was
    2 % from the analytic one).
    """
    plain = {c.batch_size: c.flops for c in largest.candidates if c.flops}
    if micro in plain:
        return plain[micro] * accum
    if accum == 1:
        own = next((c.flops for c in fit.candidates if c.batch_size == micro and c.flops), None)
        if own:
            return own
    widest = max(plain, default=None)
    return plain[widest] / widest * micro * accum if widest else None


def _micro_batches_to_prove(tune: TuneOptions, largest: FitResult) -> list[int]:
    """Micro-batches to compile as they run, largest first, until ``tune.micro_batches`` of them
    fit: the divisors of the global batch up to the search's answer (untuned on a GPU: when the
    proof of one fails, the next one down takes its place). Without a global batch: the search's
    answer, proved by the search itself."""
    if tune.global_batch is None:
        return [largest.batch_size]
    return micro_batches(
        tune.global_batch, largest.batch_size, multiple_of=largest.multiple_of, most=tune.global_batch
    )  # every divisor: no more of them than the global batch


RANK_STEPS = (1, 3)
"""``(warmup, steps)`` of each untuned program timed to rank micro-batches (:mod:`jaxfit.tune.ranking`)."""


@dataclasses.dataclass
class _Searched:
    """A setting's search for its largest micro-batch: the answer (None: not even one fits, and
    ``rows`` says so), its seconds, and the untuned rates of its micro-batches (ranking only)."""

    setting: Setting
    largest: FitResult | None
    seconds: float
    rows: list[Row]
    rates: dict[int, float]
    rank_seconds: float = 0.0


@dataclasses.dataclass
class _Proofs:
    """What proving candidates gave: a row each, and the fit of each that fits."""

    rows: list[Row] = dataclasses.field(default_factory=list)
    fits: dict[tuple[str, int, int], FitResult] = dataclasses.field(default_factory=dict)


def _ranks(target: Target, tune: TuneOptions) -> bool:
    """Whether micro-batches are ranked on their untuned programs before any is proved: asked for
    (``rank_untuned``), with inline measuring of a built-in example on one GPU, a global batch and
    a drop margin (without a margin every candidate is measured in full, as asked)."""
    return (
        tune.rank_untuned
        and tune.measure == "inline"
        and target.example is not None
        and target.example.mesh.devices == 1
        and tune.global_batch is not None
        and tune.drop_margin is not None
        and cuda_total_bytes() is not None
    )


def _search_setting(
    target: Target,
    setting: Setting,
    options: FitOptions,
    tune: TuneOptions,
    leader: _Leader,
    progress: Progress | None,
) -> _Searched:
    """A setting's largest micro-batch (and, when ranking, the untuned rates of those below it)."""
    cap = tune.global_batch or options.max_batch
    inline = tune.measure == "inline"
    ranks = _ranks(target, tune)
    notify(progress, "note", text=f"tune: {setting.name}: the largest micro-batch up to {cap}")
    # On a GPU with a global batch, searched but not proved: its untuned answer only says where
    # to start, since every micro-batch measured is then compiled as it runs (autotuned,
    # accumulated) to prove it. Otherwise its answer may be a candidate: proved, and timed.
    candidate = tune.global_batch is None or cuda_total_bytes() is None
    # only the divisors of the global batch can be micro-batches: the search asks about them alone
    divisors = tuple(m for m in range(1, cap + 1) if tune.global_batch % m == 0) if tune.global_batch else None
    searched = dataclasses.replace(
        options,
        max_batch=cap,
        verify=options.verify and candidate,
        pin=options.pin and candidate,  # an untuned program is not what runs: nothing to pin
        batches=divisors,
        # untuned GPU compiles overlap (they run nothing): all the divisors in one round
        width=options.width or (min(len(divisors), SEARCH_WIDTH) if divisors and not candidate else None),
        rank_steps=RANK_STEPS if ranks else None,
    )
    if inline and candidate:
        searched = dataclasses.replace(searched, time_steps=(tune.warmup, tune.steps), time_give_up=leader.give_up())
    # Ranking: each micro-batch compiled and timed as its accumulation to the global batch (one
    # workload, micro-batches stacked), not as a plain step at the micro-batch, which would update
    # the parameters once per micro-batch and understate the small ones.
    source = target.stacked_source(setting, tune.global_batch) if ranks and tune.global_batch else None
    began = time.perf_counter()
    try:
        largest = fit_batch(source or target.source(setting, 1, None), searched, progress=progress)
    except DoesNotFitError as err:
        g = tune.global_batch or 1
        row = Row(
            setting.name,
            1,
            g,
            g,
            fits=False,
            status="does not fit",
            note=err.what,
            precision=_dtype_of(setting, target),
            remat=setting.remat,
        )
        return _Searched(setting, None, time.perf_counter() - began, [row], {})
    rank_seconds = sum(float(t.get("seconds") or 0) for t in largest.untuned_timings)
    return _Searched(
        setting,
        largest,
        time.perf_counter() - began,
        [],
        untuned_rates(largest.untuned_timings, tune.global_batch) if tune.global_batch else {},
        rank_seconds,
    )


def _prove_row(
    target: Target,
    searched: _Searched,
    micro: int,
    tune: TuneOptions,
    options: FitOptions,
    leader: _Leader,
    progress: Progress | None,
) -> tuple[Row, FitResult | None]:
    """Prove ``searched.setting`` at ``micro`` accumulated to the global batch (and, inline, time
    it where it was compiled, dropped early when clearly slower than the ``leader``): its row, and
    its fit when it fits."""
    setting, largest = searched.setting, searched.largest
    assert largest is not None
    inline = tune.measure == "inline"
    accum = (tune.global_batch or micro) // micro
    row = Row(
        setting.name,
        micro,
        accum,
        micro * accum,
        precision=_dtype_of(setting, target),
        remat=setting.remat,
        untuned_samples_per_second=searched.rates.get(micro),
    )
    if inline:
        options = dataclasses.replace(options, time_steps=(tune.warmup, tune.steps), time_give_up=leader.give_up())
    try:
        fit = _prove(target, setting, micro, accum, largest, options, progress)
    except DoesNotFitError as err:  # "not even batch G fits": G is the global batch, accumulated
        row.status, row.note = (
            "does not fit",
            err.what.replace(f"not even batch {micro * accum} fits", f"{micro} x {accum} does not fit", 1),
        )
        return row, None
    except JaxfitError as err:
        row.status, row.note = "does not fit", str(err).split(";")[0]
        return row, None
    batch_bytes = next((c["bytes"] for c in fit.breakdown if c["name"] == "batch"), None)
    row.peak_bytes, row.budget_bytes, row.fits = fit.peak_bytes, fit.budget_bytes, True
    row.flops_per_step = _flops_per_step(micro, accum, fit, largest)
    row.bytes_per_sample = batch_bytes // row.global_batch if batch_bytes else None
    row.pin = fit.pin["path"] if fit.pin else None
    if inline:
        _apply(row, _timed_inline(fit))
        if row.status == "out of memory":
            # The compile process holds more than a fresh one (every program it compiled, a pool
            # its compiles have cut up): the proof is for a fresh process, which measures it.
            row.status, row.note = "not run", "the compile process could not hold it; measured in a fresh process"
        else:
            row.measured_in = "compile process"
            leader.record(row)
    return row, fit


def _no_divisor_row(target: Target, searched: _Searched, tune: TuneOptions) -> Row:
    largest = searched.largest
    assert largest is not None
    return Row(
        searched.setting.name,
        largest.batch_size,
        1,
        largest.batch_size,
        status="does not fit",
        note=f"no micro-batch up to {largest.batch_size} divides the global batch {tune.global_batch}",
        precision=_dtype_of(searched.setting, target),
        remat=searched.setting.remat,
    )


def _prove_descending(
    target: Target,
    searched: _Searched,
    options: FitOptions,
    tune: TuneOptions,
    leader: _Leader,
    progress: Progress | None,
    proofs: _Proofs,
) -> None:
    """Prove one setting's micro-batches largest first, until ``tune.micro_batches`` of them fit
    or (inline) one ran slower than the one above it."""
    largest = searched.largest
    assert largest is not None
    rows: list[Row] = []
    proven = 0
    for micro in _micro_batches_to_prove(tune, largest):
        if proven >= tune.micro_batches:
            break
        slower = _past_the_peak(rows) if tune.measure == "inline" else None
        if slower is not None:
            notify(
                progress,
                "note",
                text=f"tune: {searched.setting.name}: {slower.micro_batch} x {slower.accum_steps} ran slower than the "
                "micro-batch above it; smaller ones are not tried",
            )
            break
        row, fit = _prove_row(target, searched, micro, tune, options, leader, progress)
        rows.append(row)
        if fit is not None:
            proven += 1
            proofs.fits[(row.setting, row.micro_batch, row.accum_steps)] = fit
    proofs.rows.extend(rows or [_no_divisor_row(target, searched, tune)])


def _prove_ranked(
    target: Target,
    searches: Sequence[_Searched],
    options: FitOptions,
    tune: TuneOptions,
    leader: _Leader,
    progress: Progress | None,
    proofs: _Proofs,
) -> None:
    """Prove the micro-batches of every setting in the order of their untuned rates, leaving out
    those more than the drop margin below the best proved to fit (:mod:`jaxfit.tune.ranking`); at
    most ``tune.micro_batches`` proved to fit per setting."""
    assert tune.global_batch is not None and tune.drop_margin is not None
    by_name = {s.setting.name: s for s in searches}
    candidates = []
    for s in searches:
        if s.largest is None:
            continue
        micros = _micro_batches_to_prove(tune, s.largest)
        if not micros:
            proofs.rows.append(_no_divisor_row(target, s, tune))
        candidates += [Candidate(s.setting.name, m, s.rates.get(m)) for m in micros]
    rung = Rung(tune.drop_margin)
    proven: dict[str, int] = {}
    for c in proof_order(candidates):
        searched = by_name[c.setting]
        if proven.get(c.setting, 0) >= tune.micro_batches:
            continue
        if rung.left_out(c):
            accum = tune.global_batch // c.micro_batch
            proofs.rows.append(
                Row(
                    c.setting,
                    c.micro_batch,
                    accum,
                    tune.global_batch,
                    status="ranked out",
                    note=rung.why(c),
                    precision=_dtype_of(searched.setting, target),
                    remat=searched.setting.remat,
                    untuned_samples_per_second=c.untuned_rate,
                )
            )
            continue
        notify(
            progress,
            "note",
            text=f"tune: proving {c.setting} at {c.micro_batch} x {tune.global_batch // c.micro_batch}"
            + (f" (untuned {c.untuned_rate:.1f} samples/s)" if c.untuned_rate else ""),
        )
        row, fit = _prove_row(target, searched, c.micro_batch, tune, options, leader, progress)
        proofs.rows.append(row)
        if fit is not None:
            proven[c.setting] = proven.get(c.setting, 0) + 1
            rung.proved(c)
            proofs.fits[(row.setting, row.micro_batch, row.accum_steps)] = fit


def _past_the_peak(rows: Sequence[Row]) -> Row | None:
    """The micro-batch of a setting that shows its micro-batches, measured largest first, have
    passed their fastest: the last one measured (inline) when it ran slower than the one measured
    before it; else None. The rate of a fixed global batch rises as the micro-batch shrinks away
    from the memory limit (more room for the compiler) and falls once it is too small to fill the
    device, so the smaller ones are not proved or measured (on an H100, gpt-small bf16: remat none
    4 x 16 197 samples/s, 2 x 32 175, 1 x 64 154)."""
    measured = [r for r in rows if r.samples_per_second and r.measured_in == "compile process"]
    if len(measured) < 2:
        return None
    before, last = measured[-2], measured[-1]
    return last if (last.samples_per_second or 0) < (before.samples_per_second or 0) else None


# -- measuring ------------------------------------------------------------------------------------


def _measure_key(row: Row, fit: FitResult, command: Sequence[str], tune: TuneOptions) -> str | None:
    if not fit.pin:
        return None
    parts = {
        "fingerprint": fit.pin["fingerprint"],
        "fraction": fit.mem_fraction,
        "device": device_identity(),
        "jax": jax_version(),
        "jaxfit": jaxfit_version(),
        "warmup": tune.warmup,
        "steps": tune.steps,
        "command": list(command[1:]),
        "batch": row.global_batch,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _measure(
    target: Target,
    setting: Setting,
    row: Row,
    fit: FitResult,
    tune: TuneOptions,
    cache: JsonStore | None,
    give_up: tuple[int, float] | None = None,
) -> dict[str, Any]:
    """Run the candidate in a fresh process with its pinned program; what the hook measured
    (``give_up``: :meth:`_Leader.give_up`, a candidate clearly slower is stopped after its look).

    What a script's start-up creates in its folder and holds no data is removed after each run, so
    the next one starts as this one did (a checkpoint folder would otherwise stop it)."""
    command = target.command(setting, row.micro_batch, row.accum_steps, measuring=True)
    key = _measure_key(row, fit, command, tune)
    if cache is not None and key is not None:
        hit = cache.get(key)
        if hit is not None:
            return dict(hit, cached=True)
    folder = Path(tempfile.mkdtemp(prefix="jaxfit-tune-"))
    try:
        per_step = (give_up[0], give_up[1] * row.global_batch) if give_up else None
        measured = _measure_in(folder, target, fit, tune, command, per_step)
    finally:  # the log, the reports: read by now, kept by no one
        shutil.rmtree(folder, ignore_errors=True)
    if cache is not None and key is not None and "step_seconds" in measured and not measured.get("stopped_early"):
        cache.put(key, measured)
    return dict(measured, cached=False)


def _measure_in(
    folder: Path,
    target: Target,
    fit: FitResult,
    tune: TuneOptions,
    command: list[str],
    give_up: tuple[int, float] | None,
) -> dict[str, Any]:
    """Run ``command`` measuring its steps, with its log and reports in ``folder`` (``give_up``:
    ``(look, seconds per step)``); what it creates (its checkpoint folder, wandb's temporary
    folders) is taken away after it."""
    report = folder / "measure.json"
    env = {k: v for k, v in os.environ.items() if k not in HOOK_VARIABLES}
    env.update(
        {
            "PYTHONPATH": hooked_pythonpath(),
            "JAXFIT_MEASURE": f"{tune.warmup},{tune.steps}",
            "JAXFIT_MEASURE_REPORT": str(report),
            "JAXFIT_MEASURE_STEP_NAME": str(fit.workload.get("description", {}).get("step_name") or "train_step"),
            "WANDB_MODE": "disabled",
        }
    )
    set_fraction(env, f"{fit.process_fraction:g}")  # a planned smaller card, emulated
    env.update(pool_environment(fit.process_fraction, cuda_total_bytes()))  # checked before its first step
    if give_up is not None:
        env["JAXFIT_MEASURE_GIVE_UP"] = f"{give_up[0]},{give_up[1]!r}"
    pin = Pin.from_dict(fit.pin) if fit.pin else None
    env.update(hook_environment(pin, str(folder / "pin-report.json")))
    cwd = target.script.cwd if target.script is not None else None
    log = folder / "log.txt"
    # jaxfit's own files (its cache, this folder with the reports) are not the run's to take away
    tidy = cleaned(cwd, exclude=(default_cache_path().parent, folder)) if cwd else contextlib.nullcontext()
    with tidy, open(log, "wb") as out:
        env.update(probe_environment())  # what it creates outside its folder too (wandb's temp folders)
        proc = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=tune.measure_timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    text = log.read_text(errors="replace")
    measured: dict[str, Any] = {"exit_code": code, "log_tail": "\n".join(text.strip().splitlines()[-5:])}
    if report.exists():
        measured.update(json.loads(report.read_text()))
    pinned = folder / "pin-report.json"
    if pinned.exists():
        measured["program_pinned"] = json.loads(pinned.read_text()).get("program_pinned")
    return measured


def _timed_inline(fit: FitResult) -> dict[str, Any]:
    """What the proof's compile process measured of its program (``FitOptions.time_steps``), in the
    shape of a fresh process's report."""
    timing = fit.timing or {}
    if timing.get("ok"):
        return {
            "step_seconds": timing["step_seconds"],
            "first_call_seconds": timing.get("first_call_seconds"),
            "stopped_early": bool(timing.get("stopped_early")),
        }
    error = str(timing.get("error") or "the compile process did not time it")
    tail = f"RESOURCE_EXHAUSTED: {error}" if timing.get("oom") else error
    return {"exit_code": 1, "log_tail": tail}


def _apply(row: Row, measured: Mapping[str, Any]) -> None:
    steps = measured.get("step_seconds") or []
    if steps:
        row.status = "dropped" if measured.get("stopped_early") else "measured"
        row.timed_steps = len(steps)
        row.step_seconds = statistics.median(steps)
        row.step_samples_per_second = row.global_batch / row.step_seconds
        outside = measured.get("outside_step_seconds") or []
        row.outside_step_seconds = statistics.median(outside) if outside else None
        between = row.outside_step_seconds or 0.0
        row.samples_per_second = row.global_batch / (row.step_seconds + between)
        if row.outside_step_seconds is not None:  # not known when only the step was run (inline)
            row.limited_by = "input" if between > row.step_seconds else "step"
        if row.bytes_per_sample:  # what the input must deliver for the step, not the input, to set the pace
            row.input_bytes_per_second = row.bytes_per_sample * row.step_samples_per_second
        row.cached = bool(measured.get("cached"))
        if measured.get("program_pinned") is False:
            row.note = "ran its own program, not the pinned one"
        if row.status == "dropped":
            row.note = (  # the table shows it after the status: "dropped: after 1 timed step: ..."
                f"after {len(steps)} timed step{'s' if len(steps) > 1 else ''}: "
                f"{row.samples_per_second:.1f} samples/s, clearly below the best measured before it"
            )
        return
    tail = str(measured.get("log_tail") or "")
    if measured.get("exit_code") is None:
        row.status, row.note = "timed out", "the measuring process did not finish in time"
    elif "RESOURCE_EXHAUSTED" in tail or "does not fit the budget" in tail:
        row.status, row.note = "out of memory", tail.splitlines()[-1][:200] if tail else ""
    elif measured.get("exit_code") == 0:
        row.status = "ended early"
        row.note = (
            "the script exited 0 before the measured steps ran (does it train fewer than --warmup + --steps steps?)"
        )
        if tail:
            row.note += f"; its last line: {tail.splitlines()[-1][:200]}"
    else:
        row.status, row.note = "crashed", (tail.splitlines()[-1][:200] if tail else f"exit {measured.get('exit_code')}")


def _mfu(rows: Sequence[Row], peaks: Callable[[str], float | None]) -> None:
    """MFU of every measured row: model FLOPs (the same step without remat when compiled) per
    second over the peak for its precision."""
    plain = {
        (r.precision, r.micro_batch, r.accum_steps): r.flops_per_step for r in rows if not r.remat and r.flops_per_step
    }
    for r in rows:
        if r.samples_per_second is None or not r.flops_per_step or not r.step_seconds:
            continue
        model = plain.get((r.precision, r.micro_batch, r.accum_steps))
        if model is not None:
            r.model_flops_per_step, r.mfu_source = model, "compiled FLOPs of the step without remat"
        else:
            r.model_flops_per_step = r.flops_per_step
            r.mfu_source = "compiled FLOPs of this program (remat's recompute counted)" if r.remat else "compiled FLOPs"
        peak = peaks(r.precision)
        r.mfu = r.model_flops_per_step / r.step_seconds / peak if peak else None


def tune(
    target: Target,
    settings: Sequence[Setting],
    options: FitOptions,
    tuning: TuneOptions,
    progress: Progress | None = None,
) -> TuneResult:
    """The fastest of ``settings`` that fits (module docstring).

    Raises:
      ConfigError: bad options. A setting that does not fit, a run that crashes or runs out of
        memory while measured is a row of the result, not an error.
    """
    start = time.perf_counter()
    options.validate()
    tuning.validate()
    if tuning.measure == "auto":
        on_gpu = cuda_total_bytes() is not None
        tuning = dataclasses.replace(tuning, measure="inline" if target.script is None and on_gpu else "process")
    fraction = options.resolved_fraction()
    by_name = {s.name: s for s in settings}
    context = (
        cleaned(target.script.cwd, exclude=(default_cache_path().parent,))
        if target.script
        else contextlib.nullcontext()
    )
    device: dict[str, Any] = {}
    leader = _Leader(tuning)
    # Timed where they are proved: the compile process holds its whole pool from the start, as
    # the training process would (a pool that grows can fail a program that fits).
    preallocate = tuning.measure == "inline" and cuda_total_bytes() is not None
    with context:
        with shared_compile_process(preallocate=preallocate):  # one compile process for every setting and accumulation
            proofs, searches = _Proofs(), []
            if _ranks(target, tuning):  # every setting's rates first, then the proofs fastest first
                searches = [_search_setting(target, s, options, tuning, leader, progress) for s in settings]
                proofs.rows += [r for s in searches for r in s.rows]
                _prove_ranked(target, searches, options, tuning, leader, progress, proofs)
            else:  # setting by setting, so that each is timed against the best of those before it
                for setting in settings:
                    searched = _search_setting(target, setting, options, tuning, leader, progress)
                    searches.append(searched)
                    proofs.rows += searched.rows
                    if searched.largest is not None:
                        _prove_descending(target, searched, options, tuning, leader, progress, proofs)
            search_seconds = sum(s.seconds for s in searches)
            rank_seconds = sum(s.rank_seconds for s in searches)
            rows, fits = proofs.rows, proofs.fits
            for f in fits.values():
                device = f.device
        proved = time.perf_counter()
        kind = str(device.get("device_kind") or "")
        peak_cache: dict[str, tuple[float | None, str]] = {}

        def peak_of(dtype: str) -> float | None:
            if dtype not in peak_cache:
                peak_cache[dtype] = peak_flops(kind, dtype, tuning.peak_tflops)
            return peak_cache[dtype][0]

        store = _measurements(options) if tuning.use_cache else None
        try:

            def bound(r: Row) -> float:
                return upper_bound_samples_per_second(r.global_batch, r.flops_per_step, peak_of(r.precision))

            # The most promising first: the highest bound; without one, the fewest FLOPs per sample
            # and the largest micro-batch.
            # (--measure inline: the proofs measured them already.)
            order = sorted(
                (r for r in rows if r.fits and r.status == "not run"),
                key=lambda r: (-bound(r), (r.flops_per_step or 0) / r.global_batch, -r.micro_batch),
            )
            measuring = time.perf_counter()  # --budget covers measuring; the fits before it are not counted
            for row in order:
                bound_row = bound(row)
                if bound_row < leader.rate:
                    row.status = "cannot win"
                    row.note = f"at most {bound_row:.1f} samples/s at the device's peak; {leader.rate:.1f} was measured"
                    continue
                if tuning.budget_seconds is not None and time.perf_counter() - measuring > tuning.budget_seconds:
                    row.status, row.note = (
                        "budget spent",
                        f"--budget {tuning.budget_seconds:g} s of measuring was spent",
                    )
                    continue
                notify(progress, "note", text=f"tune: measuring {row.setting} at {row.micro_batch} x {row.accum_steps}")
                fit = fits[(row.setting, row.micro_batch, row.accum_steps)]
                measured = _measure(target, by_name[row.setting], row, fit, tuning, store, leader.give_up())
                _apply(row, measured)
                row.measured_in = "process"
                leader.record(row)
                if row.samples_per_second:
                    notify(
                        progress,
                        "note",
                        text=f"tune:   {row.samples_per_second:.1f} samples/s"
                        + (" (cached)" if row.cached else "")
                        + (
                            f" in {row.timed_steps} step(s): dropped, clearly slower" if row.status == "dropped" else ""
                        ),
                    )
        finally:
            if store is not None:
                store.close()
    phases = {
        "search": round(search_seconds - rank_seconds, 2),
        "rank": round(rank_seconds, 2),
        "prove": round(proved - start - search_seconds, 2),
        "measure": round(time.perf_counter() - proved, 2),
    }
    _mfu(rows, peak_of)
    # Whole measurements first, then the dropped (their short look), then the rest.
    rows.sort(key=lambda r: (r.status != "measured", r.samples_per_second is None, -(r.samples_per_second or 0)))
    best_row = next((r for r in rows if r.status == "measured"), None)
    command = (
        target.command(by_name[best_row.setting], best_row.micro_batch, best_row.accum_steps) if best_row else None
    )
    best_fit = fits.get((best_row.setting, best_row.micro_batch, best_row.accum_steps)) if best_row else None
    message = _message(best_row, rows, tuning) + (
        f" (search {phases['search']:.0f} s"
        + (f", rank {phases['rank']:.0f} s" if phases["rank"] else "")
        + f", prove {phases['prove']:.0f} s"
        + (" with inline timing" if tuning.measure == "inline" else "")
        + f", measure {phases['measure']:.0f} s)"
    )
    return TuneResult(
        rows=rows,
        best=best_row,
        workload=target.name,
        mem_fraction=fraction,
        device=device,
        peak_flops=peak_of(best_row.precision) if best_row else None,
        peak_source=peak_flops(kind, best_row.precision if best_row else "float32", tuning.peak_tflops)[1],
        wall_seconds=round(time.perf_counter() - start, 3),
        command=command,
        breakdown=best_fit.breakdown if best_fit else [],
        message=message,
        env=winner_environment(best_fit.pin if best_fit else None, fraction) if command else {},
        phase_seconds=phases,
    )


def winner_environment(pin: Mapping[str, Any] | None, mem_fraction: float) -> dict[str, str]:
    """What trains the winner as it was proved, in a user's own shell (as ``fit``'s run-with line):
    the fraction, and the start-up hook and ``JAXFIT_PIN`` only when its pin is still stored (not
    written, or pruned since: the fraction alone, claiming no pin)."""
    stored = Pin.from_dict(pin) if pin else None
    return run_environment(stored if stored is not None and stored.usable() else None, mem_fraction)


def _measurements(options: FitOptions) -> JsonStore | None:
    path = options.cache_file()
    return JsonStore(path, "measurements") if path else None


def _message(best: Row | None, rows: Sequence[Row], tuning: TuneOptions) -> str:
    measured = sum(1 for r in rows if r.status == "measured")
    dropped = sum(1 for r in rows if r.status == "dropped")
    dropped_words = f", {dropped} dropped after {tuning.look_steps} timed step(s) as clearly slower" if dropped else ""
    ranked = sum(1 for r in rows if r.status == "ranked out")
    if ranked:
        dropped_words += f", {ranked} not proved as clearly slower untuned"
    if best is None:
        closest = max((r for r in rows if r.fits), key=lambda r: r.micro_batch, default=None)
        reason = "no candidate fits" if closest is None else "no candidate could be measured"
        return f"{reason} ({len(rows)} candidates, {measured} measured)" + (
            f"; the global batch {tuning.global_batch} may need more accumulation or a larger fraction"
            if tuning.global_batch and closest is None
            else ""
        )
    mfu = f", MFU {best.mfu:.1%}" if best.mfu is not None else ""
    limit = ""
    if best.limited_by == "input" and best.outside_step_seconds is not None:
        need = f", {format_bytes(best.input_bytes_per_second)}/s of input" if best.input_bytes_per_second else ""
        limit = (
            f"; limited by its input: {best.outside_step_seconds:.3f} s between steps against {best.step_seconds:.3f} s "
            f"in the step (the step alone would give {best.step_samples_per_second:.1f} samples/s{need})"
        )
    return (
        f"fastest: {best.setting} at {best.micro_batch} x {best.accum_steps} (global batch {best.global_batch}): "
        f"{best.samples_per_second:.1f} samples/s, step {best.step_seconds:.3f} s{mfu}{limit}; "
        f"{measured} of {len(rows)} candidates measured{dropped_words}"
    )
