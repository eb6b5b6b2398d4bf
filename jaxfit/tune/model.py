"""What a tune is: its options, a candidate's row, the result, the target and the best rate so far."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Literal

from jaxfit.fit.command import with_batch
from jaxfit.fit.options import check_batch_number
from jaxfit.fit.sources import ExampleSource, ScriptSource
from jaxfit.run.accumulation import accumulated_command
from jaxfit.tune.space import Setting
from jaxfit.versions import jaxfit_version

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
        (no start-up per candidate; the step alone; for a script, its probe, on the state the
        script built and the script's own batch, and then rows again in a fresh process of the
        script, which sees its input pipeline, by :mod:`jaxfit.tune.confirm`'s rule; on an H200
        the probe rates are within 3 % of a fresh process's since they run on the script's batch
        instead of zero tokens, benchmarks/JOURNAL.md section 35); ``auto``: inline
        for a built-in example on a GPU (on an H100 it found the grid's winner in 0.40x of the
        grid's time against 0.63x, its rates within 1 % of a fresh process's:
        benchmarks/JOURNAL.md section 15), fresh processes otherwise (a script; a CPU, where
        inline timing ranked two settings 2 % apart the wrong way round, section 12).
      drop_margin: Stop measuring a candidate after :attr:`look_steps` timed steps when its rate is
        more than this share below the best measured so far (its row says ``dropped``); None:
        measure every candidate fully.
      input_steps: With fresh-process measuring, the script's loop is then timed this many
        iterations with the step skipped: its input pipeline's own rate (0: not measured).
      one_process: With fresh-process measuring, a setting's proven programs (its accumulations
        of one global batch) are timed one after another in one fresh process, each loaded in turn
        into the same training loop (:func:`jaxfit.tune.measure._measure_together`): one start-up
        a setting instead of one a row. False: a process for each.
      parallel: A script's settings' searches, and then every setting's proofs in one wave, run
        this many probes of the script at once (each a process of the script under the fraction;
        on a GPU at most as many as 0.95 / fraction). Timed inline, each probe times its proof
        alone on the GPU (:mod:`jaxfit.fit.gpu_turns`). 1: one at a time. Measured on an H200
        (benchmarks/JOURNAL.md section 35): with fresh-process measuring and 4, the tune took
        246.9 s instead of 376.4 s, and its winner, proved beside two other autotuned compiles,
        ran 3.0 % below the plain run of the same setting (one proved alone: 0.8 %); inline with
        5, the five proofs took 94 s in one wave, each compile twice as long as three at once.
        With ``standby`` and ``share_compile_cache`` (section 36): 109.1 s inline with 5 and
        136.3 s with fresh-process measuring and 4, 0.16x and 0.20x of the grid of plain runs.
      standby: A script measured in fresh processes: as soon as a setting's search has answered,
        start the fresh process of the micro-batch it proves first, which waits at its first
        step until that program is proved and then measures it (:mod:`jaxfit.tune.standby`): its
        start-up is paid beside the proofs instead of after them. On a GPU each waiting process
        holds its pool, so no more start than fit beside the probes under 0.95 of the card.
      share_compile_cache: A script: its processes (probes, measuring processes) share a JAX
        compilation cache in a temporary folder, so what the script compiles before its train
        step (its state's init: 21.5 s of a 25 s start-up for gpt-small on an H200) is compiled
        once (:mod:`jaxfit.fit.jax_cache`; the step never comes from it). Off when
        ``$JAX_COMPILATION_CACHE_DIR`` is set: the user's cache is left alone.
      rank_untuned: Experimental, GPU with ``measure="inline"`` and a global batch: run every
        micro-batch's untuned program (compiled by the search, accumulated to the global batch)
        a few steps, prove fastest first, and leave out what is ``drop_margin`` below the best
        proved (:mod:`jaxfit.tune.ranking`). Off by default: on an H200 the untuned programs of
        gpt-small ran about 12x slower than the proven ones, so ranking took 217 s where the
        proofs it saved cost about 70 s (benchmarks/JOURNAL.md section 21).
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
    input_steps: int = 3
    one_process: bool = True
    parallel: int = 1
    standby: bool = True
    share_compile_cache: bool = True

    @property
    def look_steps(self) -> int:
        """Timed steps after which a clearly slower candidate is dropped: a quarter of them (none
        is dropped when fewer than 4 steps are timed: one step is too noisy a look to judge by)."""
        return max(1, self.steps // 4)

    def validate(self) -> TuneOptions:
        from jaxfit.errors import ConfigError

        if self.global_batch is not None:
            check_batch_number(self.global_batch, "--global-batch")
        if self.warmup < 1 or self.steps < 1:
            raise ConfigError("--warmup and --steps must be at least 1 (the first step loads the program)")
        if self.budget_seconds is not None and not self.budget_seconds > 0:
            raise ConfigError(f"--budget {self.budget_seconds} must be more than 0 seconds")
        if self.input_steps < 0:
            raise ConfigError(f"--input-steps {self.input_steps} must be 0 or more (0: the loader is not timed alone)")
        if self.parallel < 1:
            raise ConfigError(f"--parallel {self.parallel} must be at least 1 (1: one probe at a time)")
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
    input_seconds: float | None = None
    """The script's loop without the step (``--input-steps``): its time per batch, median, when the
    step is skipped, so no step hides the loader; None when not measured."""
    input_samples_per_second: float | None = None
    """The input pipeline alone: the global batch over :attr:`input_seconds`."""
    limited_by: str | None = None
    """``step`` or ``input``: the slower of the step alone and the input pipeline alone (without
    the latter, of the step and the time between steps); None when not measured."""
    flops_per_step: float | None = None
    model_flops_per_step: float | None = None
    mfu: float | None = None
    mfu_source: str = ""
    bytes_per_sample: int | None = None
    input_bytes_per_second: float | None = None
    cached: bool = False
    measured_in: str = ""
    """``process`` (a fresh training process) or ``compile process`` (``--measure inline``)."""
    measured_together: int | None = None
    """How many proven programs the fresh process that measured this row timed, one after another
    (``--one-process``); None: it ran alone."""
    standby_seconds: float | None = None
    """Seconds the fresh process that measured this row had been started before it was told to
    measure (``--standby``: its start-up ran beside the proofs); None: started to measure it."""
    pin: str | None = None
    precision: str = ""
    remat: bool = False
    untuned_samples_per_second: float | None = None
    """The micro-batch's untuned plain step, run in the compile process, as samples per second:
    what proofs are ranked by on a GPU (:mod:`jaxfit.tune.ranking`); not the candidate's speed."""
    inline_samples_per_second: float | None = None
    """A script's row timed in its probe (``--measure inline``: the step alone, on the script's
    state) and then measured in a fresh process of the script (its loop and input too): the first
    rate, beside :attr:`samples_per_second`, the second."""
    prove_seconds: float | None = None
    """What proving this row cost, wall time: loading its workload into the compile process, its
    compiles, its pin and (inline) its timing; None when it was not proved (or came with its search)."""
    prove_started_at: float | None = None
    """When its proof started (Unix time): proofs side by side (``--parallel``) overlap."""
    compile_seconds: float | None = None
    """Of :attr:`prove_seconds`, the compiles (the sum over the proof's compiles, which may overlap)."""
    timing_seconds: float | None = None
    """Of :attr:`prove_seconds`, the inline timing: real arguments made, warm-up and timed steps."""

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
    """The command that trains the best row (:meth:`Target.train_command`): a script's own, or for a
    built-in example ``jaxfit run`` of its ``scripts/train.py`` config; None when no script trains
    the example as tuned (the best row's settings are the answer)."""
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
    shared_cache_entries: int | None = None
    """Programs a script's processes shared in the tune's JAX compilation cache
    (``share_compile_cache``; None: no such cache)."""

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
            "shared_cache_entries": self.shared_cache_entries,
            "jaxfit_version": jaxfit_version(),
        }


# -- the sources of a setting ---------------------------------------------------------------------


EXAMPLE_SCRIPT_CONFIGS = {
    "gpt-small": "gpt_small",
    "vit-small": "vit_small",
    "gpt-medium-bf16-remat": "gpt_medium_bf16_remat",
}
"""Built-in examples that ``scripts/train.py`` (``jaxfit examples --copy DIR``) trains as they are,
and the name of its config for each (``tests/test_tune_space.py`` holds them against the script)."""


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

    def train_command(self, setting: Setting, micro: int, accum: int, fraction: float) -> list[str] | None:
        """The command a user trains ``setting`` at ``micro x accum`` with: a script's own command with
        its flags; for a built-in example that ``scripts/train.py`` has a config of (and no ``--set``
        of the user's own), ``jaxfit run`` of that config, which proves the script's own step at
        these settings before it trains; otherwise None (the settings alone are the answer)."""
        if self.script is not None:
            return self.command(setting, micro, accum)
        assert self.example is not None
        config = EXAMPLE_SCRIPT_CONFIGS.get(self.example.name)
        if config is None or self.example.overrides:
            return None
        overrides = dict(setting.overrides)
        remat = "none" if overrides.get("remat") != "true" else overrides.get("remat_policy", "full")
        remat = "full" if remat == "nothing" else remat
        command = ["jaxfit", "run", f"--mem-fraction={fraction:g}", f"--batch-size={micro}"]
        if accum > 1:
            command.append(f"--global-batch={micro * accum}")
        command += ["--", "python", "scripts/train.py", config, "--exp-name=tuned", f"--remat={remat}"]
        if "dtype" in overrides:
            command.append(f"--precision={overrides['dtype']}")
        return command

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
