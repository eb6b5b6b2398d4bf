"""What a fit answers: :class:`FitResult` (with every :class:`Candidate` it compiled), for people
(:mod:`jaxfit.cli.output`) and machines (:meth:`FitResult.to_dict`, the ``--json`` object)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from jaxfit.fit import budget as budget_mod
from jaxfit.fit.compiler import CompileOutcome
from jaxfit.versions import jaxfit_version

FitMode = Literal["batch", "fraction"]
"""``batch``: the largest batch under a fraction; ``fraction``: the smallest fraction for a batch."""
Outcome = Literal["boundary", "max", "fraction"]
"""``boundary``: the next batch was compiled and does not fit; ``max``: ``--max-batch`` fits;
``fraction``: a fraction fit."""


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
    next_input_bytes: int = 0
    """On a GPU, the next batch the loop holds beside the step (:func:`jaxfit.fit.memory.next_input_bytes`):
    ``fits`` is ``peak + next_input <= budget``."""
    lower_seconds: float = 0.0
    """The part of ``compile_seconds`` spent tracing and lowering the step."""
    start_up_oom: str | None = None
    """A script's start-up ran out of memory under this fraction, before its step (its line): the
    fraction is too small whatever the step needs (``peak_bytes`` is ``None``)."""

    @classmethod
    def of(cls, outcome: CompileOutcome, budget_bytes: int, **extra: Any) -> Candidate:
        m = outcome.memory
        peak = m.peak_bytes if m else None
        return cls(
            batch_size=outcome.batch_size,
            peak_bytes=peak,
            argument_bytes=m.argument_bytes if m else None,
            output_bytes=m.output_bytes if m else None,
            alias_bytes=m.alias_bytes if m else None,
            temp_bytes=m.temp_bytes if m else None,
            fits=m is not None and m.need_bytes <= budget_bytes,
            next_input_bytes=m.next_input_bytes if m else 0,
            compile_seconds=round(outcome.compile_seconds, 3),
            lower_seconds=round(outcome.lower_seconds, 3),
            cached=outcome.cached,
            autotuned=outcome.autotuned,
            oom=outcome.oom,
            flops=m.flops if m else None,
            start_up_oom=outcome.start_up_oom,
            **extra,
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
      breakdown: The peak by component (:mod:`jaxfit.fit.breakdown`): parameters, optimizer
        state, other state, batch, gradients, activations and workspace, adding up to
        ``peak_bytes``; empty when the arguments are not known.
      device_count: Devices the step runs on (its mesh); every byte count above is per device.
      mesh: The step's mesh, ``{axis: size}`` (``{"batch": 2, "fsdp": 2}``); empty for one device.
      timing: With ``FitOptions.time_steps``: the answer's program run in the compile process
        (``ok``, ``step_seconds``, ``first_call_seconds``, or ``error``); None otherwise.
      untuned_timings: With ``FitOptions.rank_steps``: each listed batch up to the answer whose
        untuned program fits, run in the compile process (``batch``, ``ok``, ``step_seconds`` or
        ``error``), largest batch first; empty otherwise.
      phases: Where the wall time went: ``start_seconds`` (the compile process, or the script's
        probe up to its step), ``search_seconds``/``search_rounds`` (rounds of the search: untuned
        compiles on a GPU), ``proof_seconds``/``proof_rounds`` (autotuned rounds that prove the
        answer on a GPU), ``lower_seconds`` (of all rounds, the time spent tracing and lowering
        the step, one batch after another), ``pin_seconds``; empty for a cached answer and a
        fraction fit.
    """

    mode: FitMode
    batch_size: int
    multiple_of: int
    mem_fraction: float
    limit_bytes: int
    headroom_bytes: int
    budget_bytes: int
    peak_bytes: int
    outcome: Outcome
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
    breakdown: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    device_count: int = 1
    mesh: dict[str, int] = dataclasses.field(default_factory=dict)
    timing: dict[str, Any] | None = None
    untuned_timings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    phases: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def pinned(self) -> bool:
        """Whether the proven program is stored for the training process."""
        return self.pin is not None

    @property
    def stopped_at_max_batch(self) -> bool:
        """Whether the answer is the top of a window of batches the fit searched (``--max-batch``
        fits, larger batches were not tried), not a proved boundary. A fit of one batch only (a
        ``--global-batch`` run's, whose bounds are that batch) asked no such question."""
        return self.outcome == "max" and any(c.batch_size != self.batch_size for c in self.candidates)

    @property
    def step_name(self) -> str | None:
        """The name of the jitted function that was proven (None when the workload does not say)."""
        name = self.workload.get("description", {}).get("step_name") or self.workload.get("name")
        return str(name) if name else None

    @property
    def step(self) -> dict[str, Any]:
        """Which function was proven and how it was chosen: ``name``; ``chosen`` (``named``: by
        ``--step-name`` or the default ``train_step``; ``found``: by what it does; ``workload``: an
        example's or entry's own step); ``updates_state`` (it returns the state it is given
        updated, as a train step does; None when not known); ``why``; ``called`` (a probed script's
        jitted functions before the step, with call counts, and ``called_kinds``: what each does)."""
        description = self.workload.get("description", {})
        found = str(description.get("step_found") or "")
        kind = description.get("step_kind") or {}
        return {
            "name": self.step_name,
            "chosen": "found" if found.startswith("found") else "named" if found else "workload",
            "updates_state": kind.get("updates_state") if kind else None,
            "why": kind.get("why") or (found.partition(": ")[2] if found.startswith("found") else None),
            "called": description.get("called", {}),
            "called_kinds": description.get("called_kinds", {}),
        }

    def step_phrase(self) -> str:
        """``step '_update' (found: it returns argument 0 updated ...)``: which function was proven, in words."""
        step = self.step
        if step["name"] is None:
            return "step unknown"
        how = "the workload's step" if step["chosen"] == "workload" else step["chosen"]
        why = f": {step['why']}" if step["chosen"] == "found" and step["why"] else ""
        warn = (
            "; note: it returns no updated state, so it looks like an evaluation, not the train step"
            if step["updates_state"] is False
            else ""
        )
        return f"step {step['name']!r} ({how}{why}{warn})"

    @property
    def process_fraction(self) -> float:
        """The ``XLA_PYTHON_CLIENT_MEM_FRACTION`` that gives this answer's limit on the GPU that fitted
        it: ``mem_fraction``, except for a card planned with ``--device-memory`` that is not this
        GPU's size: 0.9 of a 48 GiB card is 0.54 of an 80 GiB GPU, and 0.9 of an 80 GiB card is
        0.909 of an H100, whose CUDA total is 79.18 GiB (the fit compiled under that card's limit,
        so the run gets that limit: 0.9 of this GPU would be 0.74 GiB less than the proof's, and
        pi0-FAST's and pi0.5's proven programs ran out of memory in their first step under it,
        benchmarks/JOURNAL.md section 19)."""
        gpu = self.device.get("gpu_total_bytes")
        card = self.device.get("total_bytes")
        if not gpu or not card or card == gpu:
            return self.mem_fraction
        return float(f"{self.mem_fraction * card / gpu:.6g}")

    def run_env(self) -> dict[str, str]:
        """The environment that runs the proven program in a user's own shell
        (:func:`jaxfit.fit.pin.run_environment`); prepend its PYTHONPATH to your own."""
        from jaxfit.fit.pin import Pin, run_environment

        return run_environment(Pin.from_dict(self.pin) if self.pin else None, self.mem_fraction)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the documented ``--json`` object), with ``env`` (:meth:`run_env`)."""
        data = dataclasses.asdict(self)
        data["env"] = self.run_env()
        data["step_name"] = self.step_name
        data["step"] = self.step
        return data

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FitResult:
        fields = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in d.items() if k in fields}  # ``env`` and ``step`` are derived, not stored
        data["candidates"] = [Candidate(**c) for c in d["candidates"]]
        return cls(**data)


def fitting_above(candidates: list[Candidate], answer: int, *, tuned_only: bool) -> list[int]:
    """Batches above ``answer`` that were compiled and fit: pockets of a non-monotone peak curve.

    The search answers the first boundary (``peak(answer) <= budget < peak(answer + step)``), as
    the trial search does; on a GPU the peak can dip again further up (measured: an MLP on an H100
    ran at 2252 and 2468 but not at 2253). With ``tuned_only`` untuned compiles are ignored, since
    near the limit they can fit where the real (autotuned) program does not.
    """
    return sorted(
        {c.batch_size for c in candidates if c.fits and c.batch_size > answer and (c.autotuned or not tuned_only)}
    )


NEAR_BUDGET = 0.03
"""On a GPU, an answer whose peak is closer than this share of the budget gets a note: autotuning
picks kernels by timing them, and another process can pick others (H100, gpt-small at batch 13:
17,388,497,252 B in jaxfit's compile, 17,830,671,972 B in the training process, 2.5 % more)."""


def near_budget_note(peak_bytes: int, budget_bytes: int) -> str:
    """A note for the message when the autotuned peak leaves less than :data:`NEAR_BUDGET` spare."""
    spare = (budget_bytes - peak_bytes) / budget_bytes
    if spare >= NEAR_BUDGET:
        return ""
    return (
        f"; note: only {spare:.1%} of the budget is spare and the program is not pinned, so autotuning in the "
        f"training process can pick kernels that need more (measured: 2.5% more near the limit); --headroom "
        f"{budget_mod.format_bytes(int(NEAR_BUDGET * budget_bytes))} keeps a margin"
    )
