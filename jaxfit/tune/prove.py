"""Fitting each candidate of a tune: each setting's search for its largest micro-batch, then the
proofs of the micro-batches to measure (largest first, or ranked on untuned programs)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

from jaxfit.errors import DoesNotFitError, JaxfitError
from jaxfit.fit import FitOptions, FitResult, fit_batch
from jaxfit.fit.common import Progress, notify
from jaxfit.fit.devices import cuda_total_bytes
from jaxfit.tune.measure import _apply, _timed_inline
from jaxfit.tune.model import SEARCH_WIDTH, Row, Target, TuneOptions, _Leader
from jaxfit.tune.ranking import Candidate, Rung, proof_order, untuned_rates
from jaxfit.tune.space import Setting, micro_batches
from jaxfit.tune.standby import without_standbys_on_failure

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


def _row(target: Target, setting: Setting, micro: int, accum: int, **fields: Any) -> Row:
    """The row of ``setting`` at ``micro x accum``, with its precision and remat."""
    return Row(
        setting.name,
        micro,
        accum,
        micro * accum,
        precision=_dtype_of(setting, target),
        remat=setting.remat,
        **fields,
    )


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


def _micro_batches_to_prove(tune: TuneOptions, largest: FitResult, below: int | None = None) -> list[int]:
    """Micro-batches to compile as they run, largest first, until ``tune.micro_batches`` of them
    fit: the divisors of the global batch up to the search's answer (untuned on a GPU: when the
    proof of one fails, the next one down takes its place), and up to ``below`` when given.
    Without a global batch: the search's answer, proved by the search itself."""
    if tune.global_batch is None:
        return [largest.batch_size]
    top = largest.batch_size if below is None else min(below, largest.batch_size)
    return micro_batches(
        tune.global_batch, top, multiple_of=largest.multiple_of, most=tune.global_batch
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
    # a micro-batch is at most the global batch, and at most --max-batch when one is given
    cap = min(tune.global_batch, options.max_batch) if tune.global_batch else options.max_batch
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
    probed = source or target.source(setting, 1, None)
    try:
        largest = without_standbys_on_failure(lambda: fit_batch(probed, searched, progress=progress))
    except DoesNotFitError as err:
        g = tune.global_batch or 1
        row = _row(target, setting, 1, g, fits=False, status="does not fit", note=err.what)
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
    beside_others: bool = False,
) -> tuple[Row, FitResult | None]:
    """Prove ``searched.setting`` at ``micro`` accumulated to the global batch (and, inline, time
    it where it was compiled, dropped early when clearly slower than the ``leader``): its row, and
    its fit when it fits. ``beside_others`` (a proof side by side with others): a probe that fails
    for another reason than not fitting raises, so that it is proved again alone."""
    setting, largest = searched.setting, searched.largest
    assert largest is not None
    inline = tune.measure == "inline"
    accum = (tune.global_batch or micro) // micro
    row = _row(target, setting, micro, accum, untuned_samples_per_second=searched.rates.get(micro))
    if inline:
        options = dataclasses.replace(options, time_steps=(tune.warmup, tune.steps), time_give_up=leader.give_up())
    began = time.perf_counter()
    row.prove_started_at = time.time()
    try:
        fit = without_standbys_on_failure(lambda: _prove(target, setting, micro, accum, largest, options, progress))
    except JaxfitError as err:
        if beside_others and not isinstance(err, DoesNotFitError):
            raise
        row.status = "does not fit"
        if isinstance(err, DoesNotFitError):  # "not even batch G fits": G is the global batch, accumulated
            row.note = err.what.replace(f"not even batch {micro * accum} fits", f"{micro} x {accum} does not fit", 1)
        else:
            row.note = str(err).split(";")[0]
        row.prove_seconds = round(time.perf_counter() - began, 3)
        return row, None
    if fit is not largest:  # its own proof (the search's answer, when it is the program, cost nothing more)
        row.prove_seconds = round(time.perf_counter() - began, 3)
        row.compile_seconds = round(sum(c.compile_seconds for c in fit.candidates), 3)
        timed = (fit.timing or {}).get("seconds")
        row.timing_seconds = round(float(timed), 3) if timed is not None else None
        notify(
            progress,
            "note",
            text=f"tune: {setting.name} at {micro} x {accum}: proved in {row.prove_seconds:.1f} s (compiles "
            f"{row.compile_seconds:.1f} s" + (f", timing {row.timing_seconds:.1f} s)" if timed is not None else ")"),
        )
    batch_bytes = next((c["bytes"] for c in fit.breakdown if c["name"] == "batch"), None)
    row.peak_bytes, row.budget_bytes, row.fits = fit.peak_bytes, fit.budget_bytes, True
    row.flops_per_step = _flops_per_step(micro, accum, fit, largest)
    row.bytes_per_sample = batch_bytes // row.global_batch if batch_bytes else None
    row.pin = fit.pin["path"] if fit.pin else None
    if inline:
        _apply(row, _timed_inline(fit))
        if row.status == "out of memory":
            # The compile process holds more than a fresh one (every program it compiled, a pool
            # its compiles have cut up; a script's probe, what the script built): the proof is for
            # a fresh process, which measures it.
            row.status, row.note = "not run", "the compile process could not hold it; measured in a fresh process"
        elif row.status not in ("measured", "dropped"):  # e.g. a script's step called with keywords
            why = row.note or "it could not be run there"
            row.status, row.note = "not run", f"not timed in the compile process ({why}); measured in a fresh process"
        else:
            row.measured_in = "compile process"
            leader.record(row)
    return row, fit


def _no_divisor_row(target: Target, searched: _Searched, tune: TuneOptions) -> Row:
    largest = searched.largest
    assert largest is not None
    return _row(
        target,
        searched.setting,
        largest.batch_size,
        1,
        status="does not fit",
        note=f"no micro-batch up to {largest.batch_size} divides the global batch {tune.global_batch}",
    )


def _prove_descending(
    target: Target,
    searched: _Searched,
    options: FitOptions,
    tune: TuneOptions,
    leader: _Leader,
    progress: Progress | None,
    proofs: _Proofs,
    floor: tuple[str, int] | None = None,
    parallel: int = 1,
    slots: threading.BoundedSemaphore | None = None,
    below: int | None = None,
) -> None:
    """Prove one setting's micro-batches largest first, until ``tune.micro_batches`` of them fit
    or (inline, not a script) one ran slower than the one above it (``parallel`` > 1: that many
    at once, :func:`_prove_side_by_side`, each taking one of ``slots`` when given: probes shared
    with other settings proving meanwhile). ``floor``: ``(twin, micro-batch)``, the
    largest micro-batch the setting's twin without remat was proved to fit
    (:func:`jaxfit.tune.space.plain_twin`): this one is proved only above it. ``below``: only
    micro-batches up to this one (those above it were proved before)."""
    largest = searched.largest
    assert largest is not None
    if parallel > 1:
        _prove_side_by_side(target, searched, options, tune, leader, progress, proofs, floor, parallel, slots, below)
        return
    rows: list[Row] = []
    proven = 0
    for micro in _micro_batches_to_prove(tune, largest, below):
        if proven >= tune.micro_batches:
            break
        if floor is not None and micro <= floor[1]:
            why = _floor_note(floor)
            notify(progress, "note", text=f"tune: {searched.setting.name}: {why}")
            if not rows:  # nothing of this setting can win: one row says so
                accum = (tune.global_batch or micro) // micro
                rows.append(_row(target, searched.setting, micro, accum, status="cannot win", note=why))
            break
        # (a script's proofs are each timed in a probe of their own, whose rates once ran slow by
        # an excess per micro-step on an H200: they are not compared here, jaxfit.tune.confirm)
        slower = _past_the_peak(rows) if tune.measure == "inline" and target.script is None else None
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


def _floor_note(floor: tuple[str, int]) -> str:
    return (
        f"{floor[0]} fits micro-batch {floor[1]}, and at a micro-batch remat only adds work: "
        "micro-batches up to it are not tried"
    )


def _prove_side_by_side(
    target: Target,
    searched: _Searched,
    options: FitOptions,
    tune: TuneOptions,
    leader: _Leader,
    progress: Progress | None,
    proofs: _Proofs,
    floor: tuple[str, int] | None,
    parallel: int,
    slots: threading.BoundedSemaphore | None = None,
    below: int | None = None,
) -> None:
    """:func:`_prove_descending` with ``parallel`` proofs at once (each a probe of the script of its
    own, holding one of ``slots`` when given): the largest ``tune.micro_batches`` micro-batches
    above ``floor`` start together, and one that does not fit gives way to the next one down, as
    one at a time. Rows come largest first."""
    largest = searched.largest
    assert largest is not None
    micros = _micro_batches_to_prove(tune, largest, below)
    if floor is not None and any(m <= floor[1] for m in micros):
        notify(progress, "note", text=f"tune: {searched.setting.name}: {_floor_note(floor)}")
        above = [m for m in micros if m > floor[1]]
        if not above:
            accum = (tune.global_batch or micros[0]) // micros[0]
            proofs.rows.append(
                _row(target, searched.setting, micros[0], accum, status="cannot win", note=_floor_note(floor))
            )
            return
        micros = above
    done: dict[int, tuple[Row, FitResult | None]] = {}
    again: list[int] = []
    waiting = list(micros)
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        running: dict[concurrent.futures.Future, int] = {}

        def start_more() -> None:
            fitted = sum(1 for _row_, fit in done.values() if fit is not None)
            while waiting and len(running) < parallel and fitted + len(running) + len(again) < tune.micro_batches:
                micro = waiting.pop(0)
                context = contextvars.copy_context()
                future = pool.submit(
                    context.run, _prove_in_slot, slots, target, searched, micro, tune, options, leader, progress
                )
                running[future] = micro

        start_more()
        while running:
            finished, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                micro = running.pop(future)
                try:
                    done[micro] = future.result()
                except JaxfitError as err:  # e.g. two probes' start-ups on one output folder
                    again.append(micro)
                    notify(
                        progress,
                        "note",
                        text=f"tune: {searched.setting.name} at {micro} x {(tune.global_batch or micro) // micro}: its "
                        "probe failed beside the others "
                        f"({str(err).splitlines()[0][:160]}); it is proved again alone",
                    )
            start_more()
    for micro in again:  # alone, as --parallel 1 proves
        done[micro] = _prove_row(target, searched, micro, tune, options, leader, progress)
    for micro in sorted(done, reverse=True):
        row, fit = done[micro]
        proofs.rows.append(row)
        if fit is not None:
            proofs.fits[(row.setting, row.micro_batch, row.accum_steps)] = fit
    if not done:
        proofs.rows.append(_no_divisor_row(target, searched, tune))


def _prove_in_slot(
    slots: threading.BoundedSemaphore | None,
    target: Target,
    searched: _Searched,
    micro: int,
    tune: TuneOptions,
    options: FitOptions,
    leader: _Leader,
    progress: Progress | None,
) -> tuple[Row, FitResult | None]:
    """:func:`_prove_row` beside others, in one of ``slots`` (probes shared by settings) when given."""
    with slots if slots is not None else contextlib.nullcontext():
        return _prove_row(target, searched, micro, tune, options, leader, progress, True)


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
                _row(
                    target,
                    searched.setting,
                    c.micro_batch,
                    accum,
                    status="ranked out",
                    note=rung.why(c),
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
