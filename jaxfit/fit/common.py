"""What the batch fit (:mod:`jaxfit.fit.batch`) and the fraction fit (:mod:`jaxfit.fit.fraction`)
share: progress events, the device description, compile errors, and the cleaning up after probes."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jaxfit.errors import CompileError, JaxfitError
from jaxfit.fit.cache import default_cache_path
from jaxfit.fit.compiler import CompileOutcome, DeviceInfo
from jaxfit.fit.leftovers import cleaned
from jaxfit.fit.pin import pins_root
from jaxfit.fit.results import FitResult
from jaxfit.fit.sources import ScriptSource, Source

Progress = Callable[[str, Mapping[str, Any]], None]
"""``progress(event, data)``: ``starting``, ``start``, ``round``, ``compiled``, ``note``, ``cached``, ``done``."""

TUNED_WIDTH = 2
"""Autotuned compiles per round on a GPU: autotuning keeps the whole machine busy, so more at once
only make each slower (H100, gpt-small: one alone 15.6 s, four at once 50.8 s)."""


def notify(progress: Progress | None, event: str, **data: Any) -> None:
    """Send a progress event, if anyone listens."""
    if progress is not None:
        progress(event, data)


WIDE_UNTUNED = 8
"""The most untuned compiles a round runs on a GPU: on a host of 16 cores or more (a GPU host's
usual), eight at once; below that, four. Measured on recorded openpi curves replayed through the
search (benchmarks/search_replay.py), eight a round cut the search's rounds by about a third."""

HOST_BYTES_PER_COMPILE = 12 << 30
"""Host memory set aside for each compile running at once when the round is widened: a 3B-parameter
train step's compile holds several GiB of the host's memory while it runs."""


def default_width(info: DeviceInfo) -> int:
    """Compiles per round: on a GPU, 4, or up to :data:`WIDE_UNTUNED` where the host has two cores
    and :data:`HOST_BYTES_PER_COMPILE` of memory for each (untuned ones overlap); else up to 4 CPU
    cores.

    A deviceless compile for a card that is not here (``topology == "target"``) runs on this
    host's CPU cores, so it is bounded by them too: on 2 cores, four at once took twice as long as
    two at once for the same answer (mlp-tiny for an RTX A6000: 100 s against 48 s).
    """
    cores = os.cpu_count() or 1
    if info.limit_sensitive and info.topology != "target":
        by_memory = info.host_memory_bytes // HOST_BYTES_PER_COMPILE if info.host_memory_bytes else WIDE_UNTUNED
        return max(4, min(WIDE_UNTUNED, cores // 2, by_memory))
    return max(1, min(4, cores))


def device_dict(info: DeviceInfo, total_bytes: int, gpu_total_bytes: int | None = None) -> dict[str, Any]:
    """The result's ``device`` object: the child's device, the total the fractions are of (the card
    planned with ``--device-memory``, else this device) and, on a GPU, this GPU's own total."""
    d = dataclasses.asdict(info)
    d["total_bytes"] = total_bytes
    d["gpu_total_bytes"] = gpu_total_bytes
    return d


def mesh_facts(workload: Mapping[str, Any], info: DeviceInfo) -> tuple[int, dict[str, int]]:
    """``(device_count, mesh)`` of the step: from its mesh (examples and entries on ``--devices``,
    a script's own mesh), else one device, or every device the child sees for a script that
    places its arguments on none in particular."""
    description = workload.get("description", {})
    mesh = {str(k): int(v) for k, v in (description.get("mesh") or {}).items()}
    if mesh:
        return math.prod(mesh.values()), mesh
    return (info.device_count if "script" in description else 1), {}


def raise_compile_error(outcome: CompileOutcome) -> None:
    """A compile that failed for a reason other than memory ends the fit.

    Raises:
      CompileError: always, with the first line of the compiler's message.
    """
    message = (outcome.error or "unknown error").strip().splitlines()[0]
    raise CompileError(
        f"the step failed to compile at batch {outcome.batch_size} for a reason other than memory: {message[:400]}"
    )


def note_found_step(progress: Progress | None, workload: Mapping[str, Any]) -> None:
    """Say which function a probe took as the train step when it found it itself, and warn when the
    step taken returns no updated state (a named evaluation step)."""
    description = workload.get("description", {})
    found = str(description.get("step_found") or "")
    name = workload.get("name")
    if found.startswith("found"):
        notify(
            progress,
            "note",
            text=f"the probe took {name!r} as the train step ({found}); pass --step-name to choose another",
        )
    if (description.get("step_kind") or {}).get("updates_state") is False:
        notify(
            progress,
            "note",
            text=f"warning: {name!r} returns none of its arguments updated, so it looks like an evaluation "
            "step, not the train step; the answer is for it alone",
        )


def cleaning_probe_leftovers(fit: Callable[..., FitResult]) -> Callable[..., FitResult]:
    """Run a fit of a script inside :func:`jaxfit.fit.leftovers.cleaned`: what its probes' start-up
    created in the working folder is removed (or named) and said in the result's message (or in
    the error's)."""

    @functools.wraps(fit)
    def wrapper(source: Source, *args: Any, progress: Progress | None = None, **kwargs: Any) -> FitResult:
        if not isinstance(source, ScriptSource):
            return fit(source, *args, progress=progress, **kwargs)
        try:
            with cleaned(source.cwd, exclude=(default_cache_path().parent, pins_root(use_cache=False))) as left:
                result = fit(source, *args, progress=progress, **kwargs)
        except JaxfitError as err:
            said = left.message(source.command)
            if said:
                raise type(err)(f"{err}; {said}") from None
            raise
        said = left.message(source.command)
        if said:
            result = dataclasses.replace(result, message=f"{result.message}; {said}")
            notify(progress, "note", text=said)
        return result

    return wrapper


@contextlib.contextmanager
def extra_environment(env: Mapping[str, str]) -> Iterator[None]:
    """Add ``env`` to ``os.environ`` (which the processes started meanwhile inherit) for the
    duration, then restore what was there."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
