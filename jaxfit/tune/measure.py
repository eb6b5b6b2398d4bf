"""Measuring a tune's candidates: in a fresh training process with the pinned program, or what the
compile process timed inline; a measurement applied to its row; the measurement cache."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from jaxfit._probe.jaxfit_measure import BUDGET_SPENT
from jaxfit._probe.jaxfit_pin import REPORT_ENV
from jaxfit.fit import FitOptions, FitResult
from jaxfit.fit.answers import device_identity
from jaxfit.fit.budget import set_fraction
from jaxfit.fit.cache import JsonStore, default_cache_path
from jaxfit.fit.command import hooked_pythonpath
from jaxfit.fit.compiler import HOOK_VARIABLES
from jaxfit.fit.devices import cuda_total_bytes
from jaxfit.fit.leftovers import cleaned, probe_environment
from jaxfit.fit.pin import Pin, hook_environment, pool_environment
from jaxfit.tune.model import Row, Target, TuneOptions
from jaxfit.tune.space import Setting
from jaxfit.versions import jax_version, jaxfit_version


class WaitingProcess(Protocol):
    """A measuring process already started and waiting for its orders
    (:class:`jaxfit.tune.standby.Standby`, which is built on this module)."""

    def measure(
        self,
        fit: FitResult,
        tune: TuneOptions,
        give_up: tuple[int, float] | None,
        more: Sequence[str] = (),
        deadline: float | None = None,
    ) -> dict[str, Any] | None: ...


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
        "input_steps": tune.input_steps,
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
    standby: WaitingProcess | None = None,
) -> dict[str, Any]:
    """Run the candidate in a fresh process with its pinned program (``standby``'s, when it waits
    for this row); what the hook measured (``give_up``: :meth:`_Leader.give_up`, a candidate
    clearly slower is stopped after its look).

    What a script's start-up creates in its folder and holds no data is removed after each run, so
    the next one starts as this one did (a checkpoint folder would otherwise stop it)."""
    command = target.command(setting, row.micro_batch, row.accum_steps, measuring=True)
    key = _measure_key(row, fit, command, tune)
    if cache is not None and key is not None:
        hit = cache.get(key)
        if hit is not None:
            return dict(hit, cached=True)
    measured = _measure_in_a_folder(target, fit, tune, command, give_up, row.global_batch, standby=standby)
    _keep_whole(cache, key, measured)
    return dict(measured, cached=False)


def _keep_whole(cache: JsonStore | None, key: str | None, measured: Mapping[str, Any]) -> None:
    """Cache a whole measurement (its steps timed, not stopped early) under ``key``."""
    if cache is not None and key is not None and measured.get("step_seconds") and not measured.get("stopped_early"):
        cache.put(key, {k: v for k, v in measured.items() if k not in ("cached", "standby_seconds")})


def _measure_in_a_folder(
    target: Target,
    fit: FitResult,
    tune: TuneOptions,
    command: list[str],
    give_up: tuple[int, float] | None,
    global_batch: int,
    more: Sequence[str] = (),
    deadline: float | None = None,
    standby: WaitingProcess | None = None,
) -> dict[str, Any]:
    """:func:`_measure_in` in a temporary folder of its own, removed after it (the log, the
    reports: read by then, kept by no one), or in ``standby`` when it is still alive (it started
    with ``command``); ``give_up`` per sample, as :meth:`_Leader.give_up`."""
    per_step = (give_up[0], give_up[1] * global_batch) if give_up else None
    if standby is not None:
        measured = standby.measure(fit, tune, per_step, more, deadline)
        if measured is not None:
            return measured
    folder = Path(tempfile.mkdtemp(prefix="jaxfit-tune-"))
    try:
        return _measure_in(folder, target, fit, tune, command, per_step, more, deadline)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _measure_together(
    target: Target,
    setting: Setting,
    rows: Sequence[Row],
    fits: Sequence[FitResult],
    tune: TuneOptions,
    cache: JsonStore | None,
    give_up: tuple[int, float] | None = None,
    deadline: float | None = None,
    standby: WaitingProcess | None = None,
) -> list[dict[str, Any]]:
    """Measure ``rows`` (one setting's proven programs, one global batch; ``fits``: their proofs)
    in one fresh process: the first row's command runs with its pin, and the hook loads and times
    each other program after it in the same loop (:mod:`jaxfit._probe.jaxfit_measure`), one
    start-up for all. What each gave, in the order of ``rows``. A row answered from the cache is
    not run; one whose program could not be timed there (other arguments, the process ended
    before it) is measured in a process of its own, as :func:`_measure` does. ``deadline`` (a Unix
    time: ``--budget``): no program is started after it; those rows give ``{"budget_spent": True}``.
    ``standby``: a process already started with ``rows[0]``'s command (:mod:`jaxfit.tune.standby`),
    used for it when it is measured first."""
    results: list[dict[str, Any] | None] = [None] * len(rows)
    keys: list[str | None] = []
    for i, (row, fit) in enumerate(zip(rows, fits, strict=True)):
        key = _measure_key(row, fit, target.command(setting, row.micro_batch, row.accum_steps, measuring=True), tune)
        keys.append(key)
        hit = cache.get(key) if cache is not None and key is not None else None
        if hit is not None:
            results[i] = dict(hit, cached=True)
    todo = [i for i in range(len(rows)) if results[i] is None and fits[i].pin]
    if len(todo) >= 2:
        first = rows[todo[0]]
        command = target.command(setting, first.micro_batch, first.accum_steps, measuring=True)
        more = [str(fits[i].pin["path"]) for i in todo[1:]]  # type: ignore[index]
        waiting = standby if standby is not None and todo[0] == 0 else None  # it started as rows[0]
        measured = _measure_in_a_folder(
            target, fits[todo[0]], tune, command, give_up, first.global_batch, more, deadline, waiting
        )
        programs = list(measured.get("programs") or [])
        by_pin = {str(p.get("pin")): p for p in programs[1:]}
        for n, i in enumerate(todo):
            entry = programs[0] if n == 0 and programs else by_pin.get(more[n - 1]) if n else None
            if n == 0 and not programs:  # the first program did not finish its steps: what the process said
                results[i] = dict(measured, cached=False)
            elif entry is not None and entry.get("error") == BUDGET_SPENT:
                results[i] = {"budget_spent": True}
            elif entry is not None and entry.get("step_seconds"):
                results[i] = {
                    "step_seconds": entry["step_seconds"],
                    "outside_step_seconds": entry.get("outside_step_seconds") or [],
                    "first_call_seconds": entry.get("first_call_seconds"),
                    "stopped_early": bool(entry.get("stopped_early")),
                    "input_seconds": measured.get("input_seconds") or [],  # the loop's, after the last program
                    "program_pinned": measured.get("program_pinned"),
                    "exit_code": measured.get("exit_code"),
                    "together": len(todo),
                    "standby_seconds": measured.get("standby_seconds"),
                    "cached": False,
                }
            done = results[i]
            if done is not None:
                _keep_whole(cache, keys[i], done)
    for i, row in enumerate(rows):  # alone: not pinned, not reached, or another interface
        if results[i] is None:
            spent = deadline is not None and time.time() > deadline
            waiting = standby if standby is not None and i == 0 else None
            results[i] = (
                {"budget_spent": True}
                if spent
                else _measure(target, setting, row, fits[i], tune, cache, give_up, waiting)
            )
    return [r for r in results if r is not None]


def _measure_in(
    folder: Path,
    target: Target,
    fit: FitResult,
    tune: TuneOptions,
    command: list[str],
    give_up: tuple[int, float] | None,
    more: Sequence[str] = (),
    deadline: float | None = None,
) -> dict[str, Any]:
    """Run ``command`` measuring its steps, with its log and reports in ``folder`` (``give_up``:
    ``(look, seconds per step)``; ``more``: further pins to time after the first in the same
    process); what it creates (its checkpoint folder, wandb's temporary folders) is taken away
    after it."""
    env = _start_environment(folder, tune, fit.process_fraction, _step_name(fit))
    env.update(_orders(folder, fit, tune, give_up, more, deadline))
    cwd = target.script.cwd if target.script is not None else None
    # jaxfit's own files (its cache, this folder with the reports) are not the run's to take away
    tidy = cleaned(cwd, exclude=(default_cache_path().parent, folder)) if cwd else contextlib.nullcontext()
    with tidy, open(folder / "log.txt", "wb") as out:
        env.update(probe_environment())  # what it creates outside its folder too (wandb's temp folders)
        proc = _launch(command, env, cwd, out)
        return _finish(folder, proc, tune.measure_timeout * (1 + len(more)))


def _step_name(fit: FitResult) -> str:
    """The name of the train step ``fit`` proved (the hook times the function of that name)."""
    return str(fit.workload.get("description", {}).get("step_name") or "train_step")


def _start_environment(folder: Path, tune: TuneOptions, process_fraction: float, step_name: str) -> dict[str, str]:
    """The environment a measuring process starts with, its reports in ``folder``: all but its
    orders (:func:`_orders`), so a process on standby (:mod:`jaxfit.tune.standby`) can start
    before its program is proven."""
    env = {k: v for k, v in os.environ.items() if k not in HOOK_VARIABLES}
    env.update(
        {
            "PYTHONPATH": hooked_pythonpath(),
            "JAXFIT_MEASURE": f"{tune.warmup},{tune.steps}",
            "JAXFIT_MEASURE_INPUT": str(tune.input_steps),
            "JAXFIT_MEASURE_REPORT": str(folder / "measure.json"),
            "JAXFIT_MEASURE_STEP_NAME": step_name,
            REPORT_ENV: str(folder / "pin-report.json"),
            "WANDB_MODE": "disabled",
        }
    )
    set_fraction(env, f"{process_fraction:g}")  # a planned smaller card, emulated
    env.update(pool_environment(process_fraction, cuda_total_bytes()))  # checked before its first step
    return env


def _orders(
    folder: Path,
    fit: FitResult,
    tune: TuneOptions,
    give_up: tuple[int, float] | None,
    more: Sequence[str],
    deadline: float | None,
) -> dict[str, str]:
    """What a measuring process is told of the programs it times: the pin of ``fit`` first, then
    ``more`` (listed in ``folder``), the give-up test, the drop margin inside the process, the
    deadline."""
    env: dict[str, str] = {}
    if give_up is not None:
        env["JAXFIT_MEASURE_GIVE_UP"] = f"{give_up[0]},{give_up[1]!r}"
    if more:
        listed = folder / "programs.json"
        listed.write_text(json.dumps(list(more)))
        env["JAXFIT_MEASURE_PROGRAMS"] = str(listed)
        if tune.drop_margin is not None and tune.steps >= 4:  # successive halving inside the process
            env["JAXFIT_MEASURE_DROP_MARGIN"] = f"{tune.look_steps},{tune.drop_margin!r}"
        if deadline is not None:
            env["JAXFIT_MEASURE_DEADLINE"] = repr(deadline)
    pin = Pin.from_dict(fit.pin) if fit.pin else None
    env.update(hook_environment(pin, str(folder / "pin-report.json")))
    return env


def _launch(command: Sequence[str], env: Mapping[str, str], cwd: str | None, out: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start a measuring process in a session of its own (so that it and its children can be killed)."""
    return subprocess.Popen(
        list(command),
        env=dict(env),
        cwd=cwd,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _finish(folder: Path, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """Wait up to ``timeout`` seconds for a measuring process, kill its session, and read what it
    reported in ``folder``: its times, exit code, log tail and whether it ran the pinned program."""
    try:
        code: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    text = (folder / "log.txt").read_text(errors="replace")
    measured: dict[str, Any] = {"exit_code": code, "log_tail": "\n".join(text.strip().splitlines()[-5:])}
    report = folder / "measure.json"
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


def _input_unmeasured_note(row: Row, tune: TuneOptions) -> str | None:
    """The note of a row measured in a fresh process whose input alone was asked for
    (``--input-steps``) and not timed: the script ended first. The hook
    (:mod:`jaxfit._probe.jaxfit_measure`) needs warm-up + timed steps, one loop iteration that
    overlaps the last step, then the input steps."""
    if row.status != "measured" or not tune.input_steps or row.input_seconds is not None:
        return None
    calls = tune.warmup + tune.steps + 1 + tune.input_steps
    return (
        f"its input alone was not measured: the script ended before {tune.input_steps} loop "
        f"iterations after the timed steps (it needs {calls} steps or more; or --input-steps 0)"
    )


def _ran_out_of_memory(measured: Mapping[str, Any]) -> bool:
    """Whether a measuring process's log ends in running out of memory, or in the pin's guard
    stopping a program over the budget."""
    tail = str(measured.get("log_tail") or "")
    return "RESOURCE_EXHAUSTED" in tail or "does not fit the budget" in tail


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
        alone = measured.get("input_seconds") or []
        if alone:  # the loop with the step skipped: the input pipeline's own rate
            row.input_seconds = statistics.median(alone)
            row.input_samples_per_second = row.global_batch / row.input_seconds if row.input_seconds else None
            row.limited_by = "input" if row.input_seconds > row.step_seconds else "step"
        elif row.outside_step_seconds is not None:  # not known when only the step was run (inline)
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
    elif _ran_out_of_memory(measured):
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


def _measurements(options: FitOptions) -> JsonStore | None:
    path = options.cache_file()
    return JsonStore(path, "measurements") if path else None
