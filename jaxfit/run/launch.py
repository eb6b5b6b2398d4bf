"""run: launch a training command with the fitted fraction and batch, and carry them into its wandb run."""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jaxfit.errors import ConfigError
from jaxfit.files import write_json
from jaxfit.fit import FitOptions, FitResult, fit_batch, fit_fraction
from jaxfit.fit.budget import fraction_variable, overlay_environment
from jaxfit.fit.cache import default_cache_path
from jaxfit.fit.command import batch_value, check_batch_flag, hooked_pythonpath, with_batch
from jaxfit.fit.common import Progress
from jaxfit.fit.compiler import HOOK_VARIABLES
from jaxfit.fit.devices import visible_device_count
from jaxfit.fit.options import check_batch_number
from jaxfit.fit.pin import Pin, hook_environment, pool_environment, read_report
from jaxfit.fit.sources import ScriptSource
from jaxfit.run.accumulation import ACCUM_FLAG, accumulated_command, fit_accumulated
from jaxfit.run.tracking import resolve_mode
from jaxfit.versions import jaxfit_version


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What ``jaxfit run`` will start.

    Attributes:
      command: The training command with the batch flag set.
      env: Environment variables added for it.
      mem_fraction: The fraction it runs under.
      batch_size: The batch it runs at.
      settings: What reaches its wandb config under the key ``jaxfit``.
      fit: The fit that chose them (``None`` when both were given).
    """

    command: list[str]
    env: dict[str, str]
    mem_fraction: float
    batch_size: int
    settings: dict[str, Any]
    fit: FitResult | None

    @property
    def pin(self) -> Pin | None:
        """The proven program the run loads (None when nothing was fitted, or it could not be stored)."""
        return Pin.from_dict(self.fit.pin) if self.fit is not None and self.fit.pin else None

    def summary(self) -> str:
        how = "fitted" if self.fit else "as given"
        if self.fit is not None and self.fit.stopped_at_max_batch:
            how = "fitted: --max-batch, larger batches were not tried"
        peak = self.settings.get("predicted_peak_bytes")
        from jaxfit.fit.budget import format_bytes

        steps = int(self.settings.get("grad_accum_steps") or 1)
        accumulated = f" as {steps} x {self.batch_size // steps}" if steps > 1 else ""
        if self.pin is not None:
            pinned = "; the proven program is pinned"
        elif self.fit is not None:
            pinned = f"; {self.fit.pin_note or 'not pinned'}"
        else:
            pinned = "; not pinned: nothing was fitted"
        card = self.settings.get("card_mem_fraction")
        emulated = f" (fraction {card:g} of the planned card, on this GPU)" if card is not None else ""
        return (
            f"XLA_PYTHON_CLIENT_MEM_FRACTION={self.mem_fraction:g}{emulated}, batch {self.batch_size}{accumulated} ({how}"
            + (
                f", predicted peak {format_bytes(peak)} of {format_bytes(self.settings['budget_bytes'])}"
                if peak
                else ""
            )
            + f"){pinned}"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the command, the environment that runs it as planned (the pin and
        jaxfit's start-up hook included, as :meth:`describe` prints it), the settings, the pin and the fit."""
        from jaxfit.fit.pin import run_environment

        return {
            "command": self.command,
            "env": {**self.env, **run_environment(self.pin, self.mem_fraction)},
            "mem_fraction": self.mem_fraction,
            "batch_size": self.batch_size,
            "settings": self.settings,
            "pin": self.pin.to_dict() if self.pin else None,
            "fit": self.fit.to_dict() if self.fit else None,
        }

    def describe(self) -> str:
        """The command line that runs this plan in a shell, the pin included when there is one (a
        pasted line runs the proven program, as the plan says)."""
        from jaxfit.fit.pin import env_words, run_environment

        env = {**self.env, **run_environment(self.pin, self.mem_fraction)}
        return f"{' '.join(env_words(env))} {shlex.join(self.command)}"


def run_settings(
    fit: FitResult | None, mem_fraction: float, batch_size: int, command: list[str], accum_flag: str = ACCUM_FLAG
) -> dict[str, Any]:
    """The settings a run is started with, as they are logged (wandb config key ``jaxfit``)."""
    accum = batch_value(command, accum_flag)
    settings: dict[str, Any] = {
        "mem_fraction": mem_fraction,
        "batch_size": batch_size,
        "grad_accum_steps": accum if accum is not None else 1,
        "jaxfit_version": jaxfit_version(),
        "fitted": fit is not None,
    }
    if fit is not None:
        settings.update(
            predicted_peak_bytes=fit.peak_bytes,
            budget_bytes=fit.budget_bytes,
            limit_bytes=fit.limit_bytes,
            headroom_bytes=fit.headroom_bytes,
            device=fit.device.get("device_kind"),
            device_count=fit.device.get("device_count"),
            process_overhead_bytes=fit.process_overhead_bytes,
            fit_outcome=fit.outcome,
            candidates=[
                {
                    "batch_size": c.batch_size,
                    "mem_fraction": c.mem_fraction,
                    "peak_bytes": c.peak_bytes,
                    "fits": c.fits,
                    "autotuned": c.autotuned,
                }
                for c in fit.candidates
            ],
        )
    return settings


def plan_run(
    source: ScriptSource,
    options: FitOptions,
    *,
    batch_size: int | None = None,
    fraction_given: bool = True,
    global_batch: int | None = None,
    progress: Progress | None = None,
) -> RunPlan:
    """Decide the fraction and batch of a training command (fitting what was not given).

    Args:
      source: A script source (:func:`jaxfit.fit.sources.script_source`).
      options: Fit options; ``mem_fraction`` is the fraction to run under.
      batch_size: The batch to run at; ``None`` fits the largest.
      fraction_given: Whether the user chose the fraction; with a batch and no fraction, the
        smallest fraction for that batch is fitted.
      global_batch: Samples per optimizer step to keep: the command runs with the batch flag at
        this value and ``--grad-accum-steps`` splitting it into micro-batches of at most the given
        (or fitted) batch; the accumulated step is compiled to prove it fits
        (:func:`jaxfit.run.accumulation.fit_accumulated`).
      progress: Fit progress events.

    Raises:
      ConfigError: a batch that does not divide by the device count, and every fit error.
    """
    command = list(source.run_command)
    if batch_size is not None and fraction_given:  # nothing is fitted (a fit's probe checks it before it starts)
        check_batch_flag(command, source.batch_flag)
    if global_batch is not None:
        return _plan_accumulated(source, options, command, global_batch, batch_size, fraction_given, progress)
    fit: FitResult | None = None
    if batch_size is None:
        fit = fit_batch(source, options, progress=progress)
        batch, fraction = fit.batch_size, fit.mem_fraction
    else:
        _check_device_multiple("--batch-size", batch_size)
        if fraction_given:
            batch, fraction = batch_size, options.resolved_fraction()
        else:
            fit = fit_fraction(source, batch_size, options, progress=progress)
            batch, fraction = batch_size, fit.mem_fraction
    final = with_batch(command, source.batch_flag, batch)
    return _plan(final, fraction, batch, fit, options, source.accum_flag)


def _check_device_multiple(flag: str, value: int) -> None:
    """A batch the command shards over every visible device must be a positive multiple of their count."""
    if value < 1:
        raise ConfigError(f"{flag} {value} must be at least 1")
    devices = visible_device_count()
    if value % devices:
        raise ConfigError(
            f"{flag} {value} does not divide by the {devices} visible devices; use a multiple of {devices}"
        )


def _plan_accumulated(
    source: ScriptSource,
    options: FitOptions,
    command: list[str],
    global_batch: int,
    batch_size: int | None,
    fraction_given: bool,
    progress: Progress | None,
) -> RunPlan:
    """:func:`plan_run` with ``--global-batch``: the batch flag at the global batch, accumulated."""
    check_batch_number(global_batch, "--global-batch")
    _check_device_multiple("--global-batch", global_batch)
    accum_flag = source.accum_flag
    if batch_size is not None:
        check_batch_number(batch_size, "--batch-size")
    if batch_size is not None and global_batch % batch_size:
        raise ConfigError(
            f"--global-batch {global_batch} is not a multiple of --batch-size {batch_size}; make it "
            "one, so that every optimizer step sees the same number of samples"
        )
    check_batch_flag(
        command,
        accum_flag,
        fix="--global-batch needs a script that accumulates gradients with it "
        "(as openpi-style scripts and scripts/train.py do); name the script's "
        "own flag with --accum-flag, or put it in the command",
    )
    hint = "raise --mem-fraction, or leave it out to fit the smallest fraction"
    fit: FitResult | None = None
    if batch_size is not None and fraction_given:
        steps, fraction = global_batch // batch_size, options.resolved_fraction()
    elif batch_size is not None:
        steps, fit = fit_accumulated(
            source, global_batch, options, fraction=None, micro_limit=batch_size, progress=progress, hint=hint
        )
        fraction = fit.mem_fraction
    else:
        fraction = options.resolved_fraction()
        micro = fit_batch(source, options, progress=progress)
        steps, fit = fit_accumulated(
            source, global_batch, options, fraction=fraction, micro_limit=micro.batch_size, progress=progress, hint=hint
        )
    final = accumulated_command(command, global_batch, steps, source.batch_flag, accum_flag)
    return _plan(final, fraction, global_batch, fit, options, accum_flag)


def _plan(
    command: list[str], fraction: float, batch: int, fit: FitResult | None, options: FitOptions, accum_flag: str
) -> RunPlan:
    """The plan of ``command`` at ``fraction`` of the card: on a GPU of another size than a card
    planned with ``--device-memory``, the process runs under the fraction of this GPU that gives
    that card's limit (0.9 of 48 GiB is 0.54 of an 80 GiB GPU; 0.9 of 80 GiB is 0.909 of an H100's
    79.18 GiB), so a run here is the run on that card, as long as this GPU holds that limit."""
    settings = run_settings(fit, fraction, batch, command, accum_flag)
    here = fraction
    if fit is not None:
        here = fit.process_fraction
    elif options.device_memory_bytes is not None:
        from jaxfit.fit.devices import cuda_total_bytes

        total = cuda_total_bytes()  # what the fraction is a share of, as the fit would have read it
        if total and options.device_memory_bytes != total:  # that card's limit, on this GPU
            from jaxfit.fit.budget import planned_fraction

            here = float(f"{planned_fraction(fraction, options.device_memory_bytes, total):.6g}")
    if here != fraction:
        settings.update(card_mem_fraction=fraction, process_mem_fraction=here, mem_fraction=here)
    env = {fraction_variable(): f"{here:g}"}  # never both spellings: jaxlib refuses that
    return RunPlan(command, env, here, batch, settings, fit)


def _run_files(settings: Mapping[str, Any]) -> tuple[Path, Path]:
    """Keep the settings of this run on disk (the wandb hook reads them; users may too), and name
    the file the start-up hook reports the pinned program to."""
    folder = default_cache_path().parent / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path = Path(f"{stem}.json")
    write_json(path, settings)
    return path, Path(f"{stem}.pin-report.json")


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How ``jaxfit run``'s command went.

    Attributes:
      exit_code: The command's exit code (128 + n when killed by signal n).
      program_pinned: Whether the train step ran the program the fit proved: the pinned function
        ran the pinned executable, it updates the state (it is a train step, not an evaluation),
        and no other function that updates the state ran (the hook stops one before it runs).
      pinned_peak_bytes: That program's compiled peak (None when nothing is pinned).
      program_peak_bytes: The peak of the program the step ran (the pinned one, or its own compile).
      reason: Why it is not the pinned program, when it is not.
      stopped: Whether jaxfit's guard stopped it before its first step (its own program did not fit,
        or another function than the pinned one was about to train: ``stopped_for``).
      pinned_step: The function the pin covers.
      step_updates_state: Whether that function returned the state updated (None: never called).
      step_calls: How often the training loop called it (counted to 2: ``step_repeated``).
      step_repeated: Whether the loop called it more than once.
      other_train_steps: Other functions that were about to update the state (the run stopped).
      stopped_for: ``budget`` (its own program over the budget), ``step`` (another train step) or
        ``cap`` (its GPU pool is not the one jaxfit set, or is smaller than the proven program's peak).
    """

    exit_code: int
    program_pinned: bool
    pinned_peak_bytes: int | None
    program_peak_bytes: int | None
    reason: str | None
    stopped: bool = False
    pinned_step: str | None = None
    step_updates_state: bool | None = None
    step_calls: int = 0
    step_repeated: bool = False
    other_train_steps: tuple[str, ...] = ()
    stopped_for: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["other_train_steps"] = list(self.other_train_steps)
        return data

    def summary(self) -> str:
        """One line for people."""
        from jaxfit.fit.budget import format_bytes

        step = f" {self.pinned_step!r}" if self.pinned_step else ""
        if self.program_pinned:
            calls = f", called {'repeatedly' if self.step_repeated else 'once'}" if self.step_calls else ""
            return f"the train step{step} ran the proven program (peak {format_bytes(self.pinned_peak_bytes)}{calls})"
        if self.stopped and self.stopped_for == "step":
            return f"stopped before it trained unchecked: {self.reason}"
        if self.stopped and self.stopped_for == "cap":
            return f"stopped before its first step: {self.reason}"
        if self.stopped:
            return (
                f"stopped before its first step: its own program needs {format_bytes(self.program_peak_bytes)}, "
                f"over the budget ({self.reason})"
            )
        return f"not pinned: {self.reason}" + (
            f" (its own program: peak {format_bytes(self.program_peak_bytes)})" if self.program_peak_bytes else ""
        )


def outcome_of(
    exit_code: int, plan_pin: Pin | None, report: Mapping[str, Any] | None, *, not_pinned: str | None
) -> RunOutcome:
    """A run's :class:`RunOutcome` from the hook's report (``jaxfit.fit.pin.read_report``)."""
    step = plan_pin.step_name if plan_pin else None
    if report is None:
        reason = not_pinned or (
            f"the train step {step!r} was never called" if plan_pin is not None else "nothing was pinned"
        )
        return RunOutcome(exit_code, False, plan_pin.peak_bytes if plan_pin else None, None, reason, pinned_step=step)
    stopped = bool(report.get("stopped"))
    return RunOutcome(
        exit_code,
        bool(report.get("program_pinned")),
        report.get("pinned_peak_bytes"),
        report.get("program_peak_bytes"),
        report.get("reason"),
        stopped,
        pinned_step=report.get("step_name") or step,
        step_updates_state=report.get("step_updates_state"),
        step_calls=int(report.get("step_calls") or 0),
        step_repeated=bool(report.get("step_repeated")),
        other_train_steps=tuple(report.get("other_train_steps") or ()),
        stopped_for=report.get("stopped_for") or ("budget" if stopped else None),
    )


DEFAULT_GRACE_SECONDS = 30.0
"""Seconds a command has to end after jaxfit forwarded it a signal, before it is killed."""
PR_SET_PDEATHSIG = 1


def _dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when jaxfit dies (Linux's
    ``prctl(PR_SET_PDEATHSIG)``), bound before the fork; None where there is no such call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    kill = signal.SIGKILL

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, kill, 0, 0, 0)

    return arm


def execute(
    plan: RunPlan, *, wandb_mode: str | None = None, grace_seconds: float = DEFAULT_GRACE_SECONDS
) -> RunOutcome:
    """Run the planned command; stream its output, forward Ctrl-C and SIGTERM; say how it went.

    The command runs in its own process session, so a signal jaxfit forwards reaches all of it
    (data-loader workers included), and it is never left running when jaxfit ends: a command that
    has not ended ``grace_seconds`` after the first signal jaxfit forwarded (a trainer that traps
    SIGTERM to write a last checkpoint) is killed, with its process group, as it is at a second
    Ctrl-C; and it is killed by the kernel when jaxfit itself dies, even by SIGKILL (Linux's
    parent-death signal). The start-up hook loads the pinned program at the step's first call (or
    checks the step's own against the budget) and reports it (:mod:`jaxfit._probe.jaxfit_pin`).
    """
    env = overlay_environment({k: v for k, v in os.environ.items() if k not in HOOK_VARIABLES}, plan.env)
    settings_path, report_path = _run_files(plan.settings)
    env["JAXFIT_WANDB_CONFIG"] = str(settings_path)
    env.update(hook_environment(plan.pin, str(report_path)))
    from jaxfit.fit.devices import cuda_total_bytes

    env.update(pool_environment(plan.mem_fraction, cuda_total_bytes()))  # checked before the first step
    env["PYTHONPATH"] = hooked_pythonpath()
    env["WANDB_MODE"] = resolve_mode(wandb_mode)  # offline without credentials, unless asked otherwise
    try:
        proc = subprocess.Popen(plan.command, env=env, start_new_session=True, preexec_fn=_dies_with_parent())
    except OSError as e:
        raise ConfigError(f"cannot start {plan.command[0]!r}: {e.strerror}") from None
    signalled: list[float] = []  # when jaxfit forwarded its first signal

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def forward(signum: int, _frame: Any) -> None:
        if signalled:  # a second Ctrl-C or SIGTERM: no more grace
            kill()
            return
        signalled.append(time.monotonic())
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if signalled and time.monotonic() - signalled[0] > grace_seconds:
                    print(
                        f"jaxfit run: the command had not ended {grace_seconds:g} s after the signal; killed",
                        file=sys.stderr,
                        flush=True,
                    )
                    kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        try:  # what the command started (data-loader workers) ends with it
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    report = read_report(report_path)
    try:
        report_path.unlink()
    except OSError:
        pass
    not_pinned = None if plan.pin else (plan.fit.pin_note if plan.fit else "nothing was fitted")
    return outcome_of(code if code >= 0 else 128 - code, plan.pin, report, not_pinned=not_pinned)
