"""The smallest memory fraction a batch needs (:func:`fit_fraction`), to 0.01.

On a GPU each fraction tried is compiled in its own child under that fraction, because the peak
depends on the limit the compiler sees (docs/guides/facts.md #2); each child writes its program, and the
one of the answer is kept as the pin. On a CPU the compile does not depend on the limit, so one
compile answers.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path

from jaxfit.errors import ConfigError, DoesNotFitError
from jaxfit.fit import budget as budget_mod
from jaxfit.fit.answers import cached_answer, store_answer
from jaxfit.fit.breakdown import breakdown
from jaxfit.fit.common import (
    Progress,
    cleaning_probe_leftovers,
    device_dict,
    mesh_facts,
    note_found_step,
    notify,
    raise_compile_error,
)
from jaxfit.fit.compiler import NO_OVERHEAD, CompileChild, CompileOutcome
from jaxfit.fit.options import FitOptions, check_batch_number
from jaxfit.fit.pin import Pin, discard_pin, pin_answer, pins_root, rehome
from jaxfit.fit.results import Candidate, FitResult
from jaxfit.fit.search import Grid, SearchResult, search
from jaxfit.fit.sources import Source

FRACTION_STEPS = 100  # fractions are found to 0.01

AIMED_ROUNDS = 2
"""Rounds of the fraction search aimed by the compiled peaks themselves (:func:`aimed_units`)
before it bisects."""


def search_fraction(
    evaluate: Callable[[list[int]], dict[int, float]],
    peaks: Callable[[], dict[int, int]],
    estimate: int,
    lowest: int,
    total: int,
    headroom: int,
    whole_device: float | None = None,
    highest: int = FRACTION_STEPS,
) -> SearchResult:
    """The smallest fraction that fits, in hundredths, searched as ``x = -units`` (so that "the
    largest x that fits" is the smallest fraction): the estimate and a point below it, up to
    :data:`AIMED_ROUNDS` rounds aimed by the compiled peaks (:func:`aimed_units`), then the
    bisecting :func:`search`, three fractions a round.

    Args:
      evaluate: Compiles under ``-x`` hundredths for each ``x``; the excess of each.
      peaks: Units -> compiled peak of every fraction compiled so far.
      estimate: The first guess (from the whole-device compile).
      lowest: The smallest fraction that could fit (arguments and outputs alone).
      total: The device's bytes.
      headroom: Bytes kept free under the limit.
      whole_device: The excess under the whole device, when that compile counts as a search point.
      highest: The largest fraction this GPU can give (hundredths of ``total``): below 100 for a
        card planned a little larger than the GPU (98 for 80 GiB on an H100's 79.18).
    """
    grid = Grid(-highest, -lowest, 1)
    known = evaluate(sorted({-estimate, -((lowest + estimate) // 2)}))
    if whole_device is not None:
        known.setdefault(-highest, whole_device)
    for _ in range(AIMED_ROUNDS):
        aimed = aimed_units(known, peaks(), total, headroom)
        if not aimed:
            break
        known.update(evaluate([-u for u in aimed]))
    return search(evaluate, grid, width=3, known=known)


def aimed_units(known: dict[int, float], peaks: dict[int, int], total: int, headroom: int, width: int = 3) -> list[int]:
    """The fractions (in hundredths) to compile next where the peaks already compiled say the
    answer is: the peak of the largest fraction that did not fit, as a share of the device, and
    its neighbours, inside the interval still open. Empty when that interval is closed or holds
    none of them.

    Under a limit too small, XLA rematerializes towards it and stops at what the program needs;
    that peak is the best guess of the limit it needs. An autotuned FSDP program on two H100s
    (gpt-small bf16 remat, batch 64) peaked at 14.26 GiB under 0.10 of 79.18 GiB while its untuned
    compile had said 0.10 would do; bisection then spent five more rounds of three autotuned
    compiles between 0.16 and 1.00 (benchmarks/JOURNAL.md section 14). The aim there is 0.18-0.20.

    Args:
      known: Search points (minus the units) and their excess, as the fraction search keeps them.
      peaks: Units -> compiled peak bytes of every fraction compiled.
      total: The device's bytes (fraction 1.0).
      headroom: Bytes kept free under the limit.
    """
    fails = [-x for x, e in known.items() if e > 0 and math.isfinite(e)]
    fits = [-x for x, e in known.items() if e <= 0]
    if not fails:
        return []
    top_fail = max(fails)
    ceiling = min([u for u in fits if u > top_fail], default=FRACTION_STEPS + 1)
    if top_fail not in peaks or ceiling - top_fail <= 1:
        return []
    aim = math.ceil((peaks[top_fail] + headroom) * FRACTION_STEPS / total - 1e-9)
    aim = min(max(aim, top_fail + 1), ceiling - 1)
    chosen = [u for u in (aim, aim + 1, aim - 1, aim + 2) if top_fail < u < ceiling and -u not in known]
    return sorted(chosen[:width])


@cleaning_probe_leftovers
def fit_fraction(
    source: Source, batch_size: int, options: FitOptions = FitOptions(), progress: Progress | None = None
) -> FitResult:
    """The smallest fraction (to 0.01) under which ``batch_size`` compiles to a peak that fits.

    On a GPU each fraction tried is compiled in its own child under that fraction, because the
    peak depends on the limit the compiler sees (docs/guides/facts.md #2); the per-process memory outside the
    pool is measured and reported, since co-located processes must add it (docs/guides/facts.md #5). On a CPU
    the compile does not depend on the limit, so one compile answers.

    Raises:
      ConfigError, DoesNotFitError, CompileError, WorkloadError, WorkerError: as :func:`fit_batch`.
    """
    start = time.perf_counter()
    check_batch_number(batch_size, "--batch-size")
    options.validate()
    question = {
        "mode": "fraction",
        "batch": batch_size,
        "headroom": options.headroom_bytes,
        "device_memory": options.device_memory_bytes,
        "verify": options.verify,
    }
    key, hit = cached_answer(options, question, source, start, progress)
    if hit is not None:
        notify(progress, "cached", result=hit)
        return hit
    cache_path = options.cache_file()

    # A first child under the whole device: the least-squeezed peak, the device, the overhead.
    pins: dict[int, Pin | None] = {}  # fraction units -> the program compiled there, written
    notes: dict[int, str | None] = {}
    with CompileChild(source, 1.0, cache_path=cache_path, start_timeout=options.start_timeout) as child:
        info = child.info
        assert info is not None
        gpu_total = int(info.bytes_limit) if info.limit_sensitive and info.bytes_limit else None
        start_up_note = child.restart_note
        total = options.device_memory_bytes or gpu_total or info.host_memory_bytes
        # A card a little larger than this GPU (80 GiB on an H100's 79.18): only the fractions of it
        # this GPU can give are searched.
        highest = min(FRACTION_STEPS, math.floor(FRACTION_STEPS * gpu_total / total)) if gpu_total else FRACTION_STEPS
        if highest < 1:
            raise ConfigError(
                f"--device-memory {budget_mod.format_bytes(total)} is more than 100 times this GPU's "
                f"{budget_mod.format_bytes(gpu_total)}; plan on a larger GPU"
            )
        device_count, mesh = mesh_facts(child.workload_info, info)
        if batch_size % device_count:
            raise ConfigError(
                f"--batch-size {batch_size} does not split over the {device_count} devices of the mesh; "
                f"use a multiple of {device_count}"
            )
        notify(progress, "start", device=info, limit=total, budget=total - options.headroom_bytes, width=1)
        notify(progress, "round", round=1, batches=[batch_size])
        full = child.compile([batch_size], autotune=not info.limit_sensitive)[batch_size]
        if full.memory is None and not full.oom:
            raise_compile_error(full)
        overhead = child.process_overhead() if info.limit_sensitive else NO_OVERHEAD
        # A script's start-up that only ran preallocated is started so under every fraction (not
        # twice each); its peak or its pools, and what a process holds outside its pool, bound how
        # many such processes the GPU holds at once.
        start_up = StartUp(
            info.start_peak_bytes,
            preallocated=child.restarted_preallocated is not None,
            outside_bytes=overhead.bytes or 0,
        )
        workload_info = child.workload_info
        note_found_step(progress, workload_info)
        if not info.limit_sensitive and full.memory is not None:
            # The CPU compiler ignores the limit: this program is the answer at any fraction.
            units = min(
                FRACTION_STEPS,
                math.ceil((full.memory.peak_bytes + options.headroom_bytes) * FRACTION_STEPS / total - 1e-9),
            )
            pins[units], notes[units] = pin_answer(
                child,
                batch_size,
                key=key,
                info=info,
                proven=full.memory,
                budget_bytes=int(total * units / FRACTION_STEPS) - options.headroom_bytes,
                limit_bytes=int(total * units / FRACTION_STEPS),
                mem_fraction=units / FRACTION_STEPS,
                root=pins_root(options.use_cache),
            )

    def limit_of(units: int) -> int:
        return int(total * units / FRACTION_STEPS)

    if full.memory is None or full.memory.need_bytes + options.headroom_bytes > limit_of(highest):
        shown = full.memory.need_words() if full.memory else "more than the device"
        where = (
            f"even the whole device ({budget_mod.format_bytes(total)})"
            if highest == FRACTION_STEPS
            else f"even fraction {highest / FRACTION_STEPS:.2f} of the card ({budget_mod.format_bytes(limit_of(highest))}), "
            f"the most this GPU of {budget_mod.format_bytes(gpu_total or 0)} can give"
        )
        raise DoesNotFitError(
            f"batch {batch_size} does not fit {where}: its compiled peak is {shown}",
            "use a smaller batch with gradient accumulation, remat or bf16"
            + ("" if highest == FRACTION_STEPS else ", or plan on a larger GPU"),
        )
    floor = full.memory.argument_bytes + full.memory.output_bytes - full.memory.alias_bytes
    estimate = min(
        highest, math.ceil((full.memory.need_bytes + options.headroom_bytes) * FRACTION_STEPS / total - 1e-9)
    )
    lowest = max(1, math.floor((floor + options.headroom_bytes) * FRACTION_STEPS / total))
    candidates = [Candidate.of(full, total - options.headroom_bytes, mem_fraction=1.0, limit_bytes=total)]
    compiles = 0 if full.cached else 1
    rounds = 1

    answered = full  # the compile whose program is the answer
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
            notify(progress, "round", round=rounds, fractions=fractions, autotune=autotune)
            answers = _compile_under_fractions(
                source,
                batch_size,
                fractions,
                total,
                gpu_total,
                cache_path,
                autotune,
                options.start_timeout,
                key=key,
                headroom=options.headroom_bytes,
                root=pins_root(options.use_cache),
                start_up=start_up,
            )
            for u, (outcome, limit, pinned, note) in zip(units_list, answers):
                if outcome.memory is None and not outcome.oom:
                    raise_compile_error(outcome)
                compiles += 0 if outcome.cached else 1
                notify(progress, "compiled", outcome=outcome, budget=budget_at(limit), fraction=u / FRACTION_STEPS)
                discard_pin(pins.get(u))
                pins[u], notes[u] = pinned, note
            return {u: (outcome, limit) for u, (outcome, limit, _, _) in zip(units_list, answers)}

        def excess(outcome: CompileOutcome, limit: int) -> float:
            return math.inf if outcome.memory is None else outcome.memory.need_bytes - budget_at(limit)

        def evaluate(xs: list[int]) -> dict[int, float]:
            # Each fraction in its own child; on a GPU the real (autotuned) program unless --no-verify.
            got = compile_at([-x for x in xs], autotune=options.verify)
            outcomes.update(got)
            return {x: excess(*got[-x]) for x in xs}

        found = search_fraction(
            evaluate,
            lambda: {u: o.memory.need_bytes for u, (o, _) in outcomes.items() if o.memory is not None},
            estimate,
            lowest,
            total,
            options.headroom_bytes,
            # Untuned, the whole-device compile above bounds the search too (when it is a fraction of the card).
            whole_device=None
            if options.verify or highest < FRACTION_STEPS
            else full.memory.need_bytes - budget_at(total),
            highest=highest,
        )
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
            answered = chosen[0]
        for u in sorted(outcomes):
            o, lim = outcomes[u]
            candidates.append(Candidate.of(o, budget_at(lim), mem_fraction=u / FRACTION_STEPS, limit_bytes=lim))

    pin, pin_note = rehome(pins.pop(units, None), key), notes.get(units)
    for other in pins.values():
        discard_pin(other)
    fraction = units / FRACTION_STEPS
    overhead_bytes = overhead.bytes
    message = (
        f"batch {batch_size} needs fraction {fraction:.2f}: peak {budget_mod.format_bytes(peak)} within "
        f"a limit of {budget_mod.format_bytes(limit)}"
        + (
            f"; add {budget_mod.format_bytes(overhead_bytes)} per process outside the pool when sharing a GPU"
            if overhead_bytes
            else ""
        )
        + (f"; {pin_note}" if pin_note else "")
        + (f"; {start_up_note}" if start_up_note else "")
        + _startup_note(candidates, fraction)
    )
    result = FitResult(
        mode="fraction",
        batch_size=batch_size,
        multiple_of=1,
        mem_fraction=fraction,
        limit_bytes=limit,
        headroom_bytes=options.headroom_bytes,
        budget_bytes=limit - options.headroom_bytes,
        peak_bytes=peak,
        outcome="fraction",
        device=device_dict(info, total, gpu_total),
        workload=workload_info,
        compiles=compiles,
        rounds=rounds,
        wall_seconds=round(time.perf_counter() - start, 3),
        candidates=candidates,
        process_overhead_bytes=overhead_bytes,
        process_overhead_method=overhead.method,
        message=message,
        pin=pin.to_dict() if pin else None,
        pin_note=pin_note,
        breakdown=[c.to_dict() for c in breakdown(answered.memory, answered.components)] if answered.memory else [],
        device_count=device_count,
        mesh=mesh,
    )
    store_answer(options, key, result, source=source, manifest=child.manifest)
    notify(progress, "done", result=result)
    return result


def _startup_note(candidates: list[Candidate], fraction: float) -> str:
    """For the answer's message: the largest fraction below the answer that the script's start-up
    did not fit ('' when none), which, more than the step, bounds the answer from below."""
    below = [c for c in candidates if c.start_up_oom and c.mem_fraction is not None and c.mem_fraction < fraction]
    if not below:
        return ""
    nearest = max(below, key=lambda c: c.mem_fraction or 0.0)
    return (
        f"; under fraction {nearest.mem_fraction:.2f} the script's start-up ran out of memory before its step "
        f"({nearest.start_up_oom}): the start-up, not the step, sets this fraction"
    )


@dataclasses.dataclass(frozen=True)
class StartUp:
    """What the first child of a fraction fit learnt of the workload's start-up.

    Attributes:
      peak_bytes: The device memory it held at most when ready (a script's start-up peak), or None.
      preallocated: Its start-up ran out of a pool that grows and ran preallocated.
      outside_bytes: What a process holds on the GPU outside its pool (CUDA context, libraries).
    """

    peak_bytes: int | None = None
    preallocated: bool = False
    outside_bytes: int = 0


GPU_SHARE = 0.95
"""The share of the GPU the children of one round may hold together (their start-ups, or their
preallocated pools): past it they are started fewer at a time."""


def side_by_side(footprints: list[int], gpu_total: int | None) -> int:
    """How many children of a round run at once: all, unless their footprints (each child's start-up
    peak, or its pool when preallocated) together pass :data:`GPU_SHARE` of the GPU; then as many
    of the largest as fit, at least one."""
    if not gpu_total or not footprints:
        return max(1, len(footprints))
    held, count = 0, 0
    for size in sorted(footprints, reverse=True):
        if count and held + size > GPU_SHARE * gpu_total:
            break
        held, count = held + size, count + 1
    return count


def _compile_under_fractions(
    source: Source,
    batch_size: int,
    fractions: list[float],
    total: int,
    gpu_total: int | None,
    cache_path: str | None,
    autotune: bool,
    start_timeout: float,
    *,
    key: str | None,
    headroom: int,
    root: Path,
    start_up: StartUp = StartUp(),
) -> list[tuple[CompileOutcome, int, Pin | None, str | None]]:
    """Compile ``batch_size`` once under each fraction of ``total``, one child each, concurrently (as
    many at once as the GPU holds their start-ups: :func:`side_by_side`); each child also writes its
    program as a pin (the one of the answer is kept, the others discarded)."""

    def one(fraction: float) -> tuple[CompileOutcome, int, Pin | None, str | None]:
        child_fraction = fraction * total / gpu_total if gpu_total else fraction
        started = time.perf_counter()
        child = CompileChild(
            source,
            child_fraction,
            cache_path=cache_path,
            start_timeout=start_timeout,
            preallocate=start_up.preallocated,
        )
        try:
            child.start()
        except DoesNotFitError:
            if child.start_out_of_memory is None:
                raise
            # A script's start-up (its train state, its init) that does not fit this fraction's pool:
            # the fraction is too small, whatever the step needs.
            failed = CompileOutcome(
                batch_size,
                None,
                time.perf_counter() - started,
                oom=True,
                error=f"the script's start-up ran out of memory ({child.start_out_of_memory})",
                start_up_oom=child.start_out_of_memory,
            )
            return failed, int(fraction * total), None, None
        with child:
            assert child.info is not None
            limit = int(child.info.bytes_limit) if child.info.bytes_limit else int(fraction * total)
            outcome = child.compile([batch_size], autotune=autotune)[batch_size]
            pin, note = None, None
            if outcome.memory is not None and outcome.memory.need_bytes <= limit - headroom:
                pin, note = pin_answer(
                    child,
                    batch_size,
                    key=f"{key}-{round(fraction * 100)}" if key else None,
                    info=child.info,
                    proven=outcome.memory,
                    budget_bytes=limit - headroom,
                    limit_bytes=limit,
                    mem_fraction=fraction,
                    root=root,
                )
                if child.restart_note:
                    note = f"{note}; {child.restart_note}" if note else child.restart_note
            return outcome, limit, pin, note

    footprints = [  # a preallocated child's pool is the fraction of the card; else its start-up's peak
        (int(f * total) if start_up.preallocated and gpu_total else start_up.peak_bytes or 0) + start_up.outside_bytes
        for f in fractions
    ]
    with concurrent.futures.ThreadPoolExecutor(max_workers=side_by_side(footprints, gpu_total)) as pool:
        return list(pool.map(one, fractions))
