"""The largest batch under a memory fraction (:func:`fit_batch`).

The flow is ``workload -> compile under the target limit -> memory report -> search``: a compile
child started under the target fraction answers "peak at batch B" (:mod:`jaxfit.fit.compiler`),
the search (:mod:`jaxfit.fit.search`) decides which batches to ask about, this module turns the
fraction into a budget and the answer into a :class:`~jaxfit.fit.results.FitResult`, and the
program that proved it is pinned (:mod:`jaxfit.fit.pin`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from jaxfit.errors import ConfigError, DoesNotFitError, JaxfitError
from jaxfit.fit import budget as budget_mod
from jaxfit.fit import guides
from jaxfit.fit.answers import cached_answer, store_answer
from jaxfit.fit.breakdown import breakdown
from jaxfit.fit.children import release, start_child
from jaxfit.fit.common import (
    TUNED_WIDTH,
    Progress,
    cleaning_probe_leftovers,
    default_width,
    device_dict,
    mesh_facts,
    note_found_step,
    notify,
    raise_compile_error,
)
from jaxfit.fit.compiler import NO_OVERHEAD, CompileChild, CompileOutcome, DeviceInfo
from jaxfit.fit.options import FitOptions
from jaxfit.fit.pin import pin_answer, pins_root
from jaxfit.fit.results import Candidate, FitResult, Outcome, fitting_above, near_budget_note
from jaxfit.fit.search import Bracket, Grid, SearchResult, left_open, prove, search
from jaxfit.fit.sources import Source


class _Rounds:
    """Rounds of compiles in one child under one budget: every outcome kept, as the search asks."""

    def __init__(self, child: CompileChild, info: DeviceInfo, budget: int, progress: Progress | None) -> None:
        self.child, self.info, self.budget, self.progress = child, info, budget, progress
        self.latest: dict[int, CompileOutcome] = {}  # the latest compile of each batch
        self.history: list[CompileOutcome] = []  # every compile, for the candidate table
        self.count = 0
        self.seconds = {"search": 0.0, "proof": 0.0}  # wall time of the rounds, by kind
        self.counts = {"search": 0, "proof": 0}

    def evaluator(self, autotune: bool, threads: int, keep_untuned: bool = False):
        """``batches -> {batch: need - budget}`` (:attr:`MemoryReport.need_bytes`) compiling with or
        without autotuning (``keep_untuned``: the child keeps the untuned programs, to be timed)."""

        kind = "proof" if autotune and self.info.limit_sensitive else "search"

        def evaluate(batches: list[int]) -> dict[int, float]:
            self.count += 1
            self.counts[kind] += 1
            began = time.perf_counter()
            notify(
                self.progress,
                "round",
                round=self.count,
                batches=batches,
                autotune=autotune and self.info.limit_sensitive,
            )
            shown = lambda o: notify(self.progress, "compiled", outcome=o, budget=self.budget)  # noqa: E731
            got = self.child.compile(
                batches, autotune=autotune, threads=threads, on_result=shown, keep_untuned=keep_untuned
            )
            if autotune and self.info.limit_sensitive and min(threads, len(batches)) > 1:
                self._alone(got, shown, keep_untuned)
            for b in batches:
                if got[b].memory is None and not got[b].oom:
                    raise_compile_error(got[b])
                self.latest[b] = got[b]
                self.history.append(got[b])
            self.seconds[kind] += time.perf_counter() - began
            return {b: self._excess(got[b]) for b in batches}

        return evaluate

    def _alone(self, got: dict[int, CompileOutcome], shown, keep_untuned: bool) -> None:
        """Compile again alone, smallest first, each batch whose autotuned compile ran out of
        memory beside others (in ``got``, replaced), until one does so alone too.

        GPU autotuning times candidate kernels in scratch memory of the pool; two such compiles at
        once share it. On an H200, openpi's pi0-FAST at 134 ran out of memory while autotuning
        beside 133, and the training process's own compile of 134 ran (benchmarks/JOURNAL.md
        section 34). Both outcomes stay in the history (the candidate table shows them)."""
        for b in sorted(b for b, o in got.items() if o.memory is None and o.oom):
            self.history.append(got[b])
            notify(self.progress, "alone", batch=b)
            got[b] = self.child.compile([b], autotune=True, threads=1, on_result=shown, keep_untuned=keep_untuned)[b]
            if got[b].memory is None:
                break

    def phases(self, start_seconds: float, pin_seconds: float) -> dict[str, Any]:
        """:attr:`FitResult.phases` of this fit."""
        return {
            "start_seconds": round(start_seconds, 3),
            "search_seconds": round(self.seconds["search"], 3),
            "search_rounds": self.counts["search"],
            "proof_seconds": round(self.seconds["proof"], 3),
            "proof_rounds": self.counts["proof"],
            "lower_seconds": round(sum(o.lower_seconds for o in self.history if not o.cached), 3),
            "pin_seconds": round(pin_seconds, 3),
        }

    def _excess(self, outcome: CompileOutcome) -> float:
        return math.inf if outcome.memory is None else outcome.memory.need_bytes - self.budget

    def candidates(self) -> list[Candidate]:
        return [Candidate.of(o, self.budget) for o in sorted(self.history, key=lambda o: (o.batch_size, o.autotuned))]


def _does_not_fit(rounds: _Rounds, grid: Grid, options: FitOptions, fraction: float, total: int) -> DoesNotFitError:
    """Not even the smallest batch fits: what it needs, and what to do."""
    smallest = rounds.latest[grid.first]
    memory = smallest.memory
    need = memory.need_bytes + options.headroom_bytes if memory else None
    if memory is None or need is None:
        needs = "the compile itself ran out of memory"
    elif need > total:
        needs = (
            f"its compiled peak is {memory.need_words()}, more than the whole device ({budget_mod.format_bytes(total)})"
        )
    else:
        needs = (
            f"its compiled peak is {memory.need_words()}, about fraction "
            f"{budget_mod.fraction_for_bytes(need, total):.2f} of this device"
        )
    hint = (
        "use a larger device, or shrink the model (remat, bf16)"
        if need is not None and need > total
        else "raise --mem-fraction, lower --headroom, or shrink the model (remat, bf16)"
    )
    if grid.first > 1 and grid.first > grid.step:  # smaller batches were not searched: they may fit
        hint = f"lower --min-batch {options.min_batch} (smaller batches were not tried), or {hint}"
    return DoesNotFitError(
        f"not even batch {grid.first} fits the budget of {budget_mod.format_bytes(rounds.budget)} "
        f"(fraction {fraction}): {needs}",
        hint,
    )


def _listed(batches: tuple[int, ...], grid: Grid) -> list[int]:
    """``FitOptions.batches`` on the grid, ascending.

    Raises:
      ConfigError: none of them is.
    """
    listed = sorted({b for b in batches if grid.first <= b <= grid.last and b % grid.step == 0})
    if not listed:
        raise ConfigError(
            f"none of the batches {sorted(set(batches))} is a multiple of {grid.step} in [{grid.first}, {grid.last}]"
        )
    return listed


def _search_listed(
    evaluate: Callable[[list[int]], Mapping[int, float]], listed: list[int], width: int, step: int
) -> tuple[SearchResult, Grid]:
    """The largest of ``listed`` that fits, searched over their positions (a monotone question on
    any ordered set), and the grid of the listed range (for the messages): a tune's divisors of
    its global batch in two rounds of four, where the whole range takes three or four; in one
    round when ``width`` covers them all."""

    def by_position(positions: list[int]) -> dict[int, float]:
        got = evaluate([listed[i] for i in positions])
        return {i: got[listed[i]] for i in positions}

    positions = Grid(0, len(listed) - 1)
    if len(listed) <= width:  # every one in a single round (a GPU's untuned compiles overlap)
        first = by_position(list(range(len(listed))))
        found = search(by_position, positions, width=width, known=first)
        found = dataclasses.replace(found, rounds=found.rounds + 1, evaluations=found.evaluations + len(listed))
    else:
        found = search(by_position, positions, width=width)
    answer = None if found.answer is None else listed[found.answer]
    known = {listed[i]: e for i, e in found.known.items()}
    return SearchResult(answer, found.outcome, found.rounds, found.evaluations, known), Grid(
        listed[0], listed[-1], step
    )


def _lent_points(guide: str | None, budget: int, grid: Grid, progress: Progress | None) -> dict[int, float]:
    """The untuned points earlier fits of this step lend this one's search (:mod:`jaxfit.fit.guides`),
    on its grid; a note says which."""
    if guide is None:
        return {}
    lent = {b: e for b, e in guides.seed(guide, budget).items() if b in grid.between(grid.first - 1, grid.last + 1)}
    if lent:
        notify(
            progress,
            "note",
            text=f"the untuned search starts from {len(lent)} batches an earlier fit of this step compiled far from "
            f"this budget ({', '.join(map(str, sorted(lent)))}); the answer is still proved here",
        )
    return lent


def _time_untuned(
    child: CompileChild,
    rounds: _Rounds,
    batches: list[int],
    steps: tuple[int, int],
    progress: Progress | None,
) -> list[dict[str, Any]]:
    """Each of ``batches`` whose untuned compile fit, run in the child (largest first): the timings
    ``jaxfit tune`` ranks micro-batches by (``FitOptions.rank_steps``)."""
    timings: list[dict[str, Any]] = []
    for batch in sorted(batches, reverse=True):
        outcome = rounds.latest.get(batch)
        if outcome is None or outcome.memory is None or outcome.memory.need_bytes > rounds.budget:
            continue
        reply = child.time(batch, *steps, untuned=True)
        timing: dict[str, Any] = {
            k: reply[k] for k in ("batch", "ok", "step_seconds", "seconds", "error", "oom") if k in reply
        }
        timings.append(timing)
        if reply.get("ok") and reply.get("step_seconds"):
            seconds = statistics.median(reply["step_seconds"])
            notify(progress, "note", text=f"batch {batch} untuned: {seconds * 1e3:.1f} ms a step")
    return timings


@cleaning_probe_leftovers
def fit_batch(source: Source, options: FitOptions = FitOptions(), progress: Progress | None = None) -> FitResult:
    """The largest batch whose compiled peak fits the budget of ``options.mem_fraction``.

    On a GPU the search compiles with autotuning off (cheap, and four run side by side in about
    the time of one) and the answer is then proved on the program as it will really run
    (autotuned): near the limit the two can differ (on the H200, ViT-S at batch 157 under fraction
    0.05 needs 6.96 GiB untuned and 10.89 GiB tuned). The program that proved it is pinned.

    Args:
      source: Where the workload comes from (:func:`jaxfit.example_source`,
        :func:`jaxfit.entry_source` or :func:`jaxfit.script_source`).
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
    options.validate()
    fraction = options.resolved_fraction()
    grid = options.grid()
    question = {
        "mode": "batch",
        "fraction": fraction,
        "headroom": options.headroom_bytes,
        "device_memory": options.device_memory_bytes,
        "grid": [grid.first, grid.last, grid.step],
        "verify": options.verify,
    }
    if options.target is not None:  # another card's program: its config and what the compiler sees
        question["target"] = {"spec": options.target.spec, "squeeze": options.squeeze}
    if options.batches is not None:
        question["batches"] = sorted(set(options.batches))
    key, hit = cached_answer(options, question, source, start, progress)
    if hit is not None and options.time_steps is None and options.rank_steps is None:  # no program to time
        notify(progress, "cached", result=hit)
        return hit

    notify(progress, "starting", fraction=fraction, source=source)
    began = time.perf_counter()
    child, info, total, limit, gpu_total = start_child(source, fraction, options, options.cache_file(), progress)
    start_seconds = time.perf_counter() - began
    try:
        budget = budget_mod.budget_bytes(limit, options.headroom_bytes)
        if budget <= 0:
            if options.headroom_bytes:
                raise ConfigError(
                    f"--headroom {budget_mod.format_bytes(options.headroom_bytes)} leaves no budget out of "
                    f"{budget_mod.format_bytes(limit)}; lower it or raise --mem-fraction"
                )
            raise ConfigError(
                f"--mem-fraction {fraction:g} of {budget_mod.format_bytes(total)} gives a limit of "
                f"{budget_mod.format_bytes(limit)}: no budget for any batch; raise --mem-fraction"
            )
        device_count, mesh = mesh_facts(child.workload_info, info)
        if grid.step % device_count:
            # The batch is split over every device of the mesh: only multiples of the count can run.
            step = math.lcm(grid.step, device_count)
            try:
                grid = Grid(grid.low, grid.high, step)
            except ConfigError:
                raise ConfigError(
                    f"the batch is split over {device_count} devices, and no multiple of {step} lies in "
                    f"[{grid.low}, {grid.high}]; raise --max-batch to {step} or more"
                ) from None
            notify(
                progress,
                "note",
                text=f"batch sizes are multiples of {step}: the batch is split over {device_count} devices",
            )
        note_found_step(progress, child.workload_info)
        width = options.width or default_width(info)
        tuned = info.limit_sensitive and options.verify and info.topology != "target"  # no device, no autotuning
        notify(progress, "start", device=info, limit=limit, budget=budget, width=width)
        rounds = _Rounds(child, info, budget, progress)
        listed = _listed(options.batches, grid) if options.batches is not None else None
        if listed is not None:
            tuned = False  # each listed batch is proved where it is used (jaxfit tune)
        # Untuned on a GPU with verification (the proof follows), else the program as it runs
        # (the CPU compiler has no autotuning; --no-verify takes the untuned answer).
        narrow = tuned and len(grid.between(grid.first - grid.step, grid.last + grid.step)) <= TUNED_WIDTH
        rank = listed is not None and options.rank_steps is not None and info.limit_sensitive
        if listed is not None:
            evaluate = rounds.evaluator(not info.limit_sensitive, width, keep_untuned=rank)
            found, grid = _search_listed(evaluate, listed, width, grid.step)
        elif narrow:  # a window this narrow (a proof of a known answer, tune's exact batches): an untuned
            # round could not narrow it, so it is compiled as it will run at once, every point in one round
            found = search(rounds.evaluator(True, TUNED_WIDTH), grid, width=TUNED_WIDTH)
        else:
            guide = guides.step_key(child.workload_info, dataclasses.asdict(info)) if tuned else None
            lent = _lent_points(guide, budget, grid, progress)
            found = search(
                rounds.evaluator(not info.limit_sensitive, width),
                grid,
                width=width,
                known=lent,
                leave_open=left_open(width, TUNED_WIDTH) if tuned else 0,
            )
            if guide is not None:
                guides.record(
                    guide,
                    budget,
                    {o.batch_size: o.memory.need_bytes for o in rounds.history if o.memory and not o.autotuned},
                )
        if tuned and not narrow and listed is None:
            if found.outcome == "open":
                b = Bracket.of(found.known)
                notify(
                    progress,
                    "note",
                    text=f"untuned: batch {b.lo} fits and {b.hi} does not; the autotuned proof starts where "
                    "the untuned curve crosses the budget between them",
                )
            found = prove(rounds.evaluator(True, TUNED_WIDTH), grid, found, budget, width=TUNED_WIDTH)
        if found.answer is None:
            raise _does_not_fit(rounds, grid, options, fraction, total)
        answer = found.answer
        final = rounds.latest[answer].memory
        assert final is not None
        pin, pin_note = None, None
        began = time.perf_counter()
        if options.pin:
            pin, pin_note = pin_answer(
                child,
                answer,
                key=key,
                info=info,
                proven=final,
                budget_bytes=budget,
                limit_bytes=limit,
                mem_fraction=fraction,
                root=pins_root(options.use_cache),
            )
        pin_seconds = time.perf_counter() - began
        overhead = child.process_overhead() if info.limit_sensitive and info.topology != "target" else NO_OVERHEAD
        timing = child.time(answer, *options.time_steps, give_up=options.time_give_up) if options.time_steps else None
        untuned_timings = (
            _time_untuned(child, rounds, [b for b in listed if b <= answer], options.rank_steps, progress)
            if rank and listed is not None and options.rank_steps is not None
            else []
        )
    except BaseException as e:
        if not isinstance(e, JaxfitError):  # the child is in order after the user's error (nothing fits)
            child.close(polite=isinstance(e, Exception))  # interrupted: at once
        raise
    finally:
        release(child)

    candidates = rounds.candidates()
    outcome: Outcome = "max" if answer == grid.last else "boundary"
    # the batch above the answer: the next on the grid, or the next listed one
    above_answer = next((b for b in listed if b > answer), answer) if listed is not None else answer + grid.step
    neighbour = rounds.latest.get(above_answer)
    above = fitting_above(candidates, answer, tuned_only=tuned)
    message = (
        f"batch {answer} fits: peak {final.need_words()} of a {budget_mod.format_bytes(budget)} budget"
        + (
            f"; batch {above_answer} needs {neighbour.memory.need_words()}"
            if outcome == "boundary" and neighbour is not None and neighbour.memory is not None
            else f"; batch {above_answer} runs out of memory while compiling"
            if outcome == "boundary"
            else ""
        )
        + (f"; --max-batch {grid.last} reached, larger batches may fit too" if outcome == "max" else "")
        + (
            f"; note: batch {', '.join(map(str, above))} also compiled to fit (the peak is not monotone in the "
            "batch here; one boundary is proved, not every pocket)"
            if above
            else ""
        )
        + (near_budget_note(final.peak_bytes, budget) if info.limit_sensitive and pin is None else "")
        + (f"; {pin_note}" if pin_note else "")
        + (f"; {child.restart_note}" if child.restart_note else "")
    )
    result = FitResult(
        mode="batch",
        batch_size=answer,
        multiple_of=grid.step,
        mem_fraction=fraction,
        limit_bytes=limit,
        headroom_bytes=options.headroom_bytes,
        budget_bytes=budget,
        peak_bytes=final.peak_bytes,
        outcome=outcome,
        device=device_dict(info, total, gpu_total),
        workload=child.workload_info,
        compiles=sum(1 for c in candidates if not c.cached),
        rounds=rounds.count,
        wall_seconds=round(time.perf_counter() - start, 3),
        candidates=candidates,
        process_overhead_bytes=overhead.bytes,
        process_overhead_method=overhead.method,
        message=message,
        pin=pin.to_dict() if pin else None,
        pin_note=pin_note,
        timing=timing,
        untuned_timings=untuned_timings,
        breakdown=[c.to_dict() for c in breakdown(final, rounds.latest[answer].components)],
        device_count=device_count,
        mesh=mesh,
        phases=rounds.phases(start_seconds, pin_seconds),
    )
    stored = dataclasses.replace(
        result, timing=None, untuned_timings=[], phases={}
    )  # measurements of this process only
    store_answer(options, key, stored, source=source, manifest=child.manifest)
    notify(progress, "done", result=result)
    return result
