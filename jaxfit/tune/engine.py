"""``jaxfit tune``: the fastest settings that fit, proven by compiling and measured by running.

For each setting (remat and precision of a built-in example, or a script's own flags):

1. **Fit** (:func:`jaxfit.fit_batch`): its largest micro-batch under the fraction (on a GPU with
   a global batch, searched on untuned compiles and not proved: it only says where to start);
   then each micro-batch ``m`` that divides the global batch ``G`` (the largest few that fit) is
   compiled as it will run, accumulated over ``G / m`` steps, to prove it fits (one autotuned
   compile each on a GPU; one that does not fit gives way to the next divisor down); each proof
   pins its program. A remat setting (an example's, or a script's ``--remat``) is proved only at micro-batches larger
   than the largest its twin without remat was proved to fit (settings without remat go first):
   at one micro-batch remat does the same work and a recompute (:func:`jaxfit.tune.space.plain_twin`). For a
   built-in example every fit of the tune runs in one compile process, which switches workloads
   (:func:`jaxfit.fit.children.shared_compile_process`); a script is probed in its own process each time.
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
   script spends between steps; then ``--input-steps`` iterations of the script's loop with the
   step skipped: the input pipeline's own rate), and is stopped (:mod:`jaxfit._probe.jaxfit_measure`,
   :mod:`jaxfit.tune.measure`); or, with
   ``--measure inline``, the compile process that proved the program times it. **Candidates that
   are clearly slower stop early**: after the first quarter of the timed steps (of 4 or more), a candidate more
   than ``--drop-margin`` (10 %) below the best rate measured so far is dropped (successive
   halving in its asynchronous form: each candidate is compared with the best so far as it runs,
   so no candidate pays a second start-up to be measured longer). Measurements are cached by the
   program's fingerprint, the fraction, the device and the versions (whole ones only).
4. **Rank** by samples per second, with the compiled peak and headroom, step time, MFU (model
   FLOPs from the compiled cost analysis of the same step without remat, where it was compiled;
   else the program's own FLOPs, recompute included, and the row says so), the input bandwidth
   the rate needs (bytes per sample x samples/s), and whether the step or the input limits it.

Implementation: :mod:`jaxfit.tune.model` (options, rows, result), :mod:`jaxfit.tune.prove` (step 1),
:mod:`jaxfit.tune.measure` (step 3); this module runs them in order and ranks.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxfit.errors import JaxfitError
from jaxfit.fit import FitOptions
from jaxfit.fit.budget import format_bytes
from jaxfit.fit.cache import JsonStore, default_cache_path
from jaxfit.fit.children import shared_compile_process
from jaxfit.fit.common import Progress, notify
from jaxfit.fit.devices import cuda_total_bytes
from jaxfit.fit.jax_cache import shared_compile_cache
from jaxfit.fit.leftovers import cleaned
from jaxfit.fit.pin import Pin, run_environment
from jaxfit.tune.confirm import Calibration, fastest_first
from jaxfit.tune.measure import (
    _apply,
    _input_unmeasured_note,
    _measure,
    _measure_together,
    _measurements,
    _ran_out_of_memory,
)
from jaxfit.tune.model import DROP_MARGIN, SEARCH_WIDTH, Row, Status, Target, TuneOptions, TuneResult, _Leader
from jaxfit.tune.peaks import peak_flops
from jaxfit.tune.prove import (
    _micro_batches_to_prove,
    _Proofs,
    _prove_descending,
    _prove_ranked,
    _ranks,
    _row,
    _search_setting,
    _Searched,
)
from jaxfit.tune.space import Setting, plain_twin, upper_bound_samples_per_second
from jaxfit.tune.standby import Standby, Standbys, allowed, stand_down

__all__ = [
    "DROP_MARGIN",
    "SEARCH_WIDTH",
    "Row",
    "Status",
    "Target",
    "TuneOptions",
    "TuneResult",
    "tune",
    "winner_environment",
]


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


def _twin_floor(setting: Setting, proofs: _Proofs) -> tuple[str, int] | None:
    """``(twin, micro-batch)``: the largest micro-batch proved to fit of ``setting``'s twin without
    remat (:func:`jaxfit.tune.space.plain_twin`), below which ``setting`` cannot be the faster;
    None when it has no twin or the twin fitted none."""
    twin = plain_twin(setting)
    fitted = [micro for (name, micro, _), _fit in proofs.fits.items() if name == twin]
    return (twin, max(fitted)) if twin is not None and fitted else None


def _whole_batch_row(target: Target, setting: Setting, floor: tuple[str, int], progress: Progress | None) -> Row:
    """The ``cannot win`` row of a remat setting whose twin fits ``floor[1]``, the whole global
    batch at once: nothing is left to search (the progress says so too)."""
    why = (
        f"{floor[0]} fits micro-batch {floor[1]}, the whole global batch, and at a "
        "micro-batch remat only adds work: not searched"
    )
    notify(progress, "note", text=f"tune: {setting.name}: {why}")
    return _row(target, setting, floor[1], 1, status="cannot win", note=why)


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
    # A script timed inline: each proof in a probe process of its own, whose rates once ran slow
    # (on zero tokens, fixed) by an excess per micro-step on an H200, so none drops a row (no
    # margin); jaxfit.tune.confirm decides what runs again in a fresh process.
    script_inline = target.script is not None and tuning.measure == "inline"
    proving = _Leader(dataclasses.replace(tuning, drop_margin=None)) if script_inline else leader
    # Timed where they are proved: the compile process holds its whole pool from the start, as
    # the training process would (a pool that grows can fail a program that fits).
    preallocate = tuning.measure == "inline" and cuda_total_bytes() is not None
    parallel = _probes_at_once(target, tuning, options)
    standbys = Standbys(target, tuning, allowed(target, tuning, fraction, parallel, len(settings)), progress)
    # the processes of a script share what it compiles before its step (its state's init)
    startup_cache = shared_compile_cache(target.script is not None and tuning.share_compile_cache)
    with startup_cache as shared, context, contextlib.closing(standbys):
        with shared_compile_process(preallocate=preallocate):  # one compile process for every setting and accumulation
            proofs, searches = _Proofs(), []
            early: dict[str, _Searched] = {}
            early_seconds = 0.0
            if _ranks(target, tuning):  # every setting's rates first, then the proofs fastest first
                searches = [_search_setting(target, s, options, tuning, leader, progress) for s in settings]
                proofs.rows += [r for s in searches for r in s.rows]
                _prove_ranked(target, searches, options, tuning, leader, progress, proofs)
            else:  # setting by setting, so that each is timed against the best of those before it
                # (those without remat first: a remat setting is then proved only at micro-batches
                # its twin without remat cannot hold, where it can be the faster)
                began = time.perf_counter()
                early = _search_side_by_side(target, settings, options, tuning, proving, progress, parallel)
                early_seconds = time.perf_counter() - began if early else 0.0
                if parallel > 1 and len(early) == len(settings) > 1:  # every setting's proofs side by side
                    for setting in sorted(settings, key=lambda s: s.remat):
                        _start_standby(standbys, tuning, early[setting.name], _search_floor(setting, early))
                    _prove_in_one_wave(target, settings, early, options, tuning, proving, progress, proofs, parallel)
                    searches = [early[s.name] for s in settings]
                else:
                    for setting in sorted(settings, key=lambda s: s.remat):
                        floor = _twin_floor(setting, proofs)
                        if floor is not None and tuning.global_batch is not None and floor[1] >= tuning.global_batch:
                            proofs.rows.append(_whole_batch_row(target, setting, floor, progress))
                            continue
                        searched = early.get(setting.name) or _search_setting(
                            target, setting, options, tuning, proving, progress
                        )
                        searches.append(searched)
                        proofs.rows += searched.rows
                        _start_standby(standbys, tuning, searched, floor)
                        if searched.largest is not None:
                            _prove_descending(
                                target, searched, options, tuning, proving, progress, proofs, floor, parallel
                            )
            # (searches side by side count their wall time, not the sum of theirs)
            search_seconds = early_seconds + sum(s.seconds for s in searches if s.setting.name not in early)
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

            def can_run(row: Row) -> bool:
                bound_row = bound(row)
                if bound_row < leader.rate:
                    row.status = "cannot win"
                    row.note = f"at most {bound_row:.1f} samples/s at the device's peak; {leader.rate:.1f} was measured"
                    return False
                if tuning.budget_seconds is not None and time.perf_counter() - measuring > tuning.budget_seconds:
                    row.status, row.note = (
                        "budget spent",
                        f"--budget {tuning.budget_seconds:g} s of measuring was spent",
                    )
                    return False
                return True

            pending = list(order)
            while pending:
                row = pending.pop(0)
                if not can_run(row):
                    continue
                # one fresh process for the setting's rows (--one-process): the rest of them come along
                group = [row]
                if tuning.one_process and tuning.measure == "process":
                    group += [r for r in pending if r.setting == row.setting and can_run(r)]
                    pending = [r for r in pending if r.setting != row.setting]
                notify(
                    progress,
                    "note",
                    text="tune: measuring "
                    + (
                        f"{row.setting} at {row.micro_batch} x {row.accum_steps}"
                        if len(group) == 1
                        else f"{row.setting} at "
                        + ", ".join(f"{r.micro_batch} x {r.accum_steps}" for r in group)
                        + " in one process"
                    ),
                )
                deadline = None
                if tuning.budget_seconds is not None:  # no program of the group starts after it
                    deadline = time.time() + tuning.budget_seconds - (time.perf_counter() - measuring)
                _measure_fresh(target, by_name, group, fits, tuning, store, leader.give_up(), deadline, standbys)
                for done in group:
                    leader.record(done)
                    if done.samples_per_second:
                        notify(
                            progress,
                            "note",
                            text=f"tune:   {done.micro_batch} x {done.accum_steps}: {done.samples_per_second:.1f} samples/s"
                            + (" (cached)" if done.cached else "")
                            + (
                                f" in {done.timed_steps} step(s): dropped, clearly slower"
                                if done.status == "dropped"
                                else ""
                            ),
                        )
            if script_inline:
                _confirm_in_fresh_processes(target, by_name, rows, fits, tuning, store, progress, standbys)
        finally:
            if store is not None:
                store.close()
        shared_programs = shared.entries()
    phases = {
        "search": round(search_seconds - rank_seconds, 2),
        "rank": round(rank_seconds, 2),
        "prove": round(proved - start - search_seconds, 2),
        "measure": round(time.perf_counter() - proved, 2),
    }
    _mfu(rows, peak_of)
    # Whole measurements first (of a script tuned inline, those in a fresh process of the script
    # before the steps timed alone in its probe), then the dropped (their short look), then the rest.
    rows.sort(
        key=lambda r: (
            r.status != "measured",
            script_inline and r.measured_in != "process",
            r.samples_per_second is None,
            -(r.samples_per_second or 0),
        )
    )
    best_row = next((r for r in rows if r.status == "measured"), None)
    command = (
        target.train_command(by_name[best_row.setting], best_row.micro_batch, best_row.accum_steps, fraction)
        if best_row
        else None
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
        env=winner_environment(best_fit.pin if best_fit else None, fraction) if command and target.script else {},
        phase_seconds=phases,
        shared_cache_entries=shared_programs,
    )


def _probes_at_once(target: Target, tuning: TuneOptions, options: FitOptions) -> int:
    """How many probes of a script run at once (``--parallel``): only for a script (timed inline,
    each probe times what it proved alone on the GPU: :mod:`jaxfit.fit.gpu_turns`), and on a GPU
    no more than fit side by side under the fraction, each holding at most its own pool."""
    if target.script is None or tuning.parallel <= 1:
        return 1
    if cuda_total_bytes() is None:
        return tuning.parallel
    return max(1, min(tuning.parallel, int(0.95 / options.resolved_fraction())))


def _search_floor(setting: Setting, early: Mapping[str, _Searched]) -> tuple[str, int] | None:
    """``(twin, micro-batch)``: the search answer of ``setting``'s twin without remat, above which
    it is proved in one wave (None: no twin, or its search fitted none)."""
    twin = plain_twin(setting)
    twin_search = early.get(twin) if twin is not None else None
    return (twin, twin_search.largest.batch_size) if twin and twin_search and twin_search.largest else None


def _start_standby(standbys: Standbys, tuning: TuneOptions, searched: _Searched, floor: tuple[str, int] | None) -> None:
    """Start the measuring process of the micro-batch ``searched``'s setting proves first (the
    largest to prove above ``floor``), to wait on standby (:mod:`jaxfit.tune.standby`)."""
    if searched.largest is None:
        return
    first = next((m for m in _micro_batches_to_prove(tuning, searched.largest) if floor is None or m > floor[1]), None)
    if first is not None:
        accum = (tuning.global_batch or first) // first
        standbys.start(searched.setting, first, accum, searched.largest)


def _search_side_by_side(
    target: Target,
    settings: Sequence[Setting],
    options: FitOptions,
    tuning: TuneOptions,
    leader: _Leader,
    progress: Progress | None,
    parallel: int,
) -> dict[str, _Searched]:
    """Every setting's search, ``parallel`` probes at once (none when ``parallel`` is 1: each is
    searched in turn, just before it is proved). A remat setting whose twin turns out to hold the
    whole global batch was searched for nothing, side by side with the others."""
    if parallel <= 1 or len(settings) < 2:
        return {}
    found: dict[str, _Searched] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {
            s.name: pool.submit(
                contextvars.copy_context().run, _search_setting, target, s, options, tuning, leader, progress
            )
            for s in settings
        }
        for name, future in futures.items():
            try:
                found[name] = future.result()
            except JaxfitError as err:  # e.g. two probes' start-ups on one output folder: alone later
                notify(
                    progress,
                    "note",
                    text=f"tune: {name}: its search failed beside the others ({str(err).splitlines()[0][:160]}); "
                    "it is searched again alone",
                )
    return found


@dataclasses.dataclass
class _Wave:
    """One setting's part of :func:`_prove_in_one_wave`: its search, the floor it is proved above
    (its twin's search answer), whether the twin's answer left it nothing, and its own proofs."""

    setting: Setting
    searched: _Searched
    floor: tuple[str, int] | None
    cannot_win: bool
    proofs: _Proofs


def _prove_in_one_wave(
    target: Target,
    settings: Sequence[Setting],
    early: Mapping[str, _Searched],
    options: FitOptions,
    tuning: TuneOptions,
    leader: _Leader,
    progress: Progress | None,
    proofs: _Proofs,
    parallel: int,
) -> None:
    """Every setting's proofs side by side, ``parallel`` probes in all, instead of one setting's
    after another's (the settings were searched side by side: ``early``). A remat setting is then
    proved above its twin's *search* answer, as the twin's proofs are not known yet; when those
    fit less than that (an autotuned program needs more than the untuned search's), the remat
    setting's micro-batches between the two are proved after the wave. Rows come setting by
    setting, those without remat first, as one setting after another gives them."""
    slots = threading.BoundedSemaphore(parallel)
    waves: list[_Wave] = []
    for setting in sorted(settings, key=lambda s: s.remat):
        searched = early[setting.name]
        floor = _search_floor(setting, early)
        whole = floor is not None and tuning.global_batch is not None and floor[1] >= tuning.global_batch
        waves.append(_Wave(setting, searched, floor, whole, _Proofs(rows=list(searched.rows))))
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(waves)) as pool:
        futures = [
            pool.submit(
                contextvars.copy_context().run,
                _prove_descending,
                target,
                w.searched,
                options,
                tuning,
                leader,
                progress,
                w.proofs,
                w.floor,
                parallel,
                slots,
            )
            for w in waves
            if w.searched.largest is not None and not w.cannot_win
        ]
        for future in futures:
            future.result()
    fitted = _Proofs(fits={key: fit for w in waves for key, fit in w.proofs.fits.items()})
    for w in waves:
        if w.floor is None or w.searched.largest is None:
            continue
        proved = _twin_floor(w.setting, fitted)  # what the twin's autotuned proofs fit
        if proved is not None and proved[1] >= w.floor[1]:
            if w.cannot_win:
                w.proofs.rows = [_whole_batch_row(target, w.setting, proved, progress)]
            continue
        notify(
            progress,
            "note",
            text=f"tune: {w.setting.name}: its twin's proofs fit "
            + (f"micro-batch {proved[1]}" if proved else "none")
            + f", less than the {w.floor[1]} its search found: the micro-batches between are proved now",
        )
        w.proofs.rows = [r for r in w.proofs.rows if r.status != "cannot win"]
        _prove_descending(
            target, w.searched, options, tuning, leader, progress, w.proofs, proved, parallel, slots, below=w.floor[1]
        )
    for w in waves:
        proofs.rows += w.proofs.rows
        proofs.fits.update(w.proofs.fits)


def _measure_fresh(
    target: Target,
    by_name: Mapping[str, Setting],
    rows: Sequence[Row],
    fits: Mapping[tuple[str, int, int], Any],
    tuning: TuneOptions,
    store: JsonStore | None,
    give_up: tuple[int, float] | None,
    deadline: float | None = None,
    standbys: Standbys | None = None,
) -> None:
    """Measure ``rows`` (one setting's) in a fresh training process running their pinned programs,
    one after another when there are several (:func:`jaxfit.tune.measure._measure_together`;
    ``give_up``: :meth:`_Leader.give_up`, as :func:`jaxfit.tune.measure._measure` takes it) and
    apply each to its row, with the note of an input that was asked for and not timed. A process
    on standby for one of the rows (:mod:`jaxfit.tune.standby`) measures it first."""
    waiting = None
    for i, r in enumerate(rows):
        waiting = standbys.take(r.setting, r.micro_batch, r.accum_steps) if standbys is not None else None
        if waiting is not None:
            rows = [r, *rows[:i], *rows[i + 1 :]]
            break
    setting = by_name[rows[0].setting]
    proofs = [fits[(r.setting, r.micro_batch, r.accum_steps)] for r in rows]

    def measured_now(waiting: Standby | None) -> list[dict[str, Any]]:
        if len(rows) == 1:
            return [_measure(target, setting, rows[0], proofs[0], tuning, store, give_up, waiting)]
        return _measure_together(target, setting, rows, proofs, tuning, store, give_up, deadline, waiting)

    results = measured_now(waiting)
    failed = [m for m in results if not m.get("step_seconds") and m.get("exit_code") not in (0, None)]
    if failed and not any(_ran_out_of_memory(m) for m in failed) and stand_down():
        results = measured_now(None)  # it may have refused to start beside a process on standby: again without
    for row, measured in zip(rows, results, strict=True):
        if measured.get("budget_spent"):
            row.status, row.note = "budget spent", f"--budget {tuning.budget_seconds:g} s of measuring was spent"
            continue
        _apply(row, measured)
        row.measured_in = "process"
        if measured.get("together"):
            row.measured_together = int(measured["together"])
        if measured.get("standby_seconds") is not None:
            row.standby_seconds = float(measured["standby_seconds"])
        row.note = row.note or _input_unmeasured_note(row, tuning) or ""


def _confirm_in_fresh_processes(
    target: Target,
    by_name: Mapping[str, Setting],
    rows: Sequence[Row],
    fits: Mapping[tuple[str, int, int], Any],
    tuning: TuneOptions,
    store: JsonStore | None,
    progress: Progress | None,
    standbys: Standbys | None = None,
) -> None:
    """A script tuned with ``--measure inline`` had each proof timed in its probe: the step alone,
    in a probe process of its own. What trains is the script's loop, its input pipeline included,
    and probe rates are not a fresh process's, so rows run again in a fresh process of the script
    with their pinned program by :mod:`jaxfit.tune.confirm`'s rule: the fastest, then those the
    calibration says may win. Each keeps both rates
    (``inline_samples_per_second``, ``samples_per_second``)."""
    probed = [r for r in rows if r.status == "measured" and r.measured_in == "compile process"]
    calibration = Calibration()

    def confirm(row: Row) -> None:
        rate = row.samples_per_second
        notify(
            progress,
            "note",
            text=f"tune: measuring {row.setting} at {row.micro_batch} x {row.accum_steps} in a fresh process "
            f"of the script (its step alone ran {rate:.1f} samples/s in the probe)",
        )
        _measure_fresh(target, by_name, [row], fits, tuning, store, None, None, standbys)
        row.inline_samples_per_second = rate
        row.note = row.note or f"its step alone ran {rate:.1f} samples/s in the probe"
        if row.status == "measured" and row.samples_per_second:
            calibration.record(row, rate, row.samples_per_second)
            notify(progress, "note", text=f"tune:   {row.samples_per_second:.1f} samples/s in a fresh process")

    for row in fastest_first(probed):
        confirm(row)
    left = [r for r in probed if r.measured_in == "compile process"]
    fresh = [r.samples_per_second or 0 for r in rows if r.status == "measured" and r.measured_in == "process"]
    for row in calibration.more(left, max(fresh, default=0.0)):
        confirm(row)
    for row in left:
        if row.measured_in == "compile process":
            row.note = row.note or calibration.note(row)


def winner_environment(pin: Mapping[str, Any] | None, mem_fraction: float) -> dict[str, str]:
    """What trains the winner as it was proved, in a user's own shell (as ``fit``'s run-with line):
    the fraction, and the start-up hook and ``JAXFIT_PIN`` only when its pin is still stored (not
    written, or pruned since: the fraction alone, claiming no pin)."""
    stored = Pin.from_dict(pin) if pin else None
    return run_environment(stored if stored is not None and stored.usable() else None, mem_fraction)


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
        alone = (
            f"; its input alone gives {best.input_samples_per_second:.1f} samples/s"
            if best.input_samples_per_second
            else ""
        )
        limit = (
            f"; limited by its input: {best.outside_step_seconds:.3f} s between steps against {best.step_seconds:.3f} s "
            f"in the step (the step alone would give {best.step_samples_per_second:.1f} samples/s{need}){alone}"
        )
    return (
        f"fastest: {best.setting} at {best.micro_batch} x {best.accum_steps} (global batch {best.global_batch}): "
        f"{best.samples_per_second:.1f} samples/s, step {best.step_seconds:.3f} s{mfu}{limit}; "
        f"{measured} of {len(rows)} candidates measured{dropped_words}"
    )
