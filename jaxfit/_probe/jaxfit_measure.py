"""Timing the train step inside a training process, for ``jaxfit tune``.

With ``$JAXFIT_MEASURE`` set to ``WARMUP,STEPS``, jaxfit's start-up hook wraps the script's jitted
train step (the pinned one when there is a pin): each call waits for its outputs
(``jax.block_until_ready``), so the step's wall time is measured alone, and the time the script
spends between two calls (its data loading, logging) is measured too. After ``WARMUP`` calls that
are not counted (the first one compiles or loads the program) and ``STEPS`` timed ones, the times
are written as JSON to ``$JAXFIT_MEASURE_REPORT`` and the process ends: a measurement never trains
longer than it needs. With ``$JAXFIT_MEASURE_GIVE_UP`` set to ``LOOK,SECONDS``, it ends after the
first ``LOOK`` timed calls already when they took more than ``SECONDS`` a step on average (the step
and the time before it): a candidate clearly slower than the best one measured so far is not
measured longer (the report says ``stopped_early``). With ``$JAXFIT_MEASURE_INPUT`` set to ``N``,
the timed steps are followed by ``N + 1`` calls that do not run the step (each returns the last
step's outputs at once), and the time the script spends between them is its input pipeline
alone (``input_seconds``; the first gap, whose batch the loader could prepare during a real
step, is not counted): what the loader delivers when no step hides it. Standard library + jax
only (it runs in the script's environment).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional

MEASURE_ENV = "JAXFIT_MEASURE"
REPORT_ENV = "JAXFIT_MEASURE_REPORT"
GIVE_UP_ENV = "JAXFIT_MEASURE_GIVE_UP"
INPUT_ENV = "JAXFIT_MEASURE_INPUT"


def plan() -> "Optional[tuple[int, int]]":
    """``(warmup, steps)`` from ``$JAXFIT_MEASURE``, or None when not measuring."""
    text = os.environ.get(MEASURE_ENV)
    if not text:
        return None
    warmup, _, steps = text.partition(",")
    return max(0, int(warmup)), max(1, int(steps))


def give_up() -> "Optional[tuple[int, float]]":
    """``(look, seconds)`` from ``$JAXFIT_MEASURE_GIVE_UP``, or None: measure every step asked for."""
    text = os.environ.get(GIVE_UP_ENV)
    if not text:
        return None
    look, _, seconds = text.partition(",")
    return max(1, int(look)), float(seconds)


def input_steps() -> int:
    """Loader-only gaps to time after the steps, from ``$JAXFIT_MEASURE_INPUT`` (0: none)."""
    text = os.environ.get(INPUT_ENV)
    return max(0, int(text)) if text else 0


def too_slow(step_seconds: "List[float]", outside_seconds: "List[float]", look: int, seconds: float) -> bool:
    """Whether the first ``look`` timed steps (each with the time before it) took more than
    ``seconds`` a step on average: the test that ends a measurement early."""
    if len(step_seconds) != look:
        return False
    return (sum(step_seconds) + sum(outside_seconds[:look])) / look > seconds


class MeasuredStep:
    """Stands in for the train step while ``jaxfit tune`` measures it (module docstring)."""

    def __init__(
        self,
        step: Any,
        warmup: int,
        steps: int,
        report_path: Optional[str],
        give_up_after: "Optional[tuple[int, float]]" = None,
        input_steps: int = 0,
    ) -> None:
        self._step = step
        self._warmup, self._steps = warmup, steps
        self._give_up_after = give_up_after
        self._input_steps = input_steps
        self._input_seconds: List[float] = []
        self._loader_calls = 0
        self._last_out: Any = None
        self._report_path = report_path
        self._step_seconds: List[float] = []
        self._outside_seconds: List[float] = []
        self._last_end: Optional[float] = None
        self._calls = 0
        self._first_call_seconds: Optional[float] = None
        self._started = time.time()
        self._lock = threading.Lock()
        try:
            import functools

            functools.update_wrapper(self, step, updated=())
        except (AttributeError, TypeError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._step, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import jax

        start = time.perf_counter()
        if self._loader_calls:  # the steps are timed: the input pipeline alone, the step skipped
            return self._without_the_step(start)
        out = self._step(*args, **kwargs)
        jax.block_until_ready(out)
        end = time.perf_counter()
        with self._lock:
            self._calls += 1
            if self._calls == 1:
                self._first_call_seconds = end - start
            elif self._calls > self._warmup:
                self._step_seconds.append(end - start)
                if self._last_end is not None:
                    self._outside_seconds.append(start - self._last_end)
            self._last_end = end
            done = len(self._step_seconds) >= self._steps
            stop = not done and self._give_up_after is not None
            stop = stop and too_slow(self._step_seconds, self._outside_seconds, *self._give_up_after)
        if done and not stop and self._input_steps:
            self._write_report(stopped_early=False)  # the steps stand even if the script ends now
            self._last_out, self._loader_calls = out, 1  # the next calls time the loader alone
            return out
        if done or stop:
            self._finish(stopped_early=stop)
        return out

    def _without_the_step(self, start: float) -> Any:
        """A call after the timed steps: the step is not run (the last outputs are returned, the
        state unchanged), and the time since the call before it is the input pipeline's alone."""
        with self._lock:
            self._loader_calls += 1
            if self._loader_calls > 2 and self._last_end is not None:  # the first gap overlapped a real step
                self._input_seconds.append(start - self._last_end)
            self._last_end = time.perf_counter()
            done = len(self._input_seconds) >= self._input_steps
        if done:
            self._finish()
        return self._last_out

    def _finish(self, stopped_early: bool = False) -> None:
        self._write_report(stopped_early)
        print(
            "jaxfit: measured %d steps after %d warm-up calls%s; stopping the run%s"
            % (
                len(self._step_seconds),
                self._warmup,
                " and the input alone over %d" % len(self._input_seconds) if self._input_seconds else "",
                " (slower than the best candidate measured so far)" if stopped_early else "",
            ),
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(0)

    def _write_report(self, stopped_early: bool) -> None:
        report: Dict[str, Any] = {
            "stopped_early": stopped_early,
            "step_seconds": self._step_seconds,
            "outside_step_seconds": self._outside_seconds,
            "first_call_seconds": self._first_call_seconds,
            "input_seconds": self._input_seconds,
            "warmup": self._warmup,
            "seconds_to_done": time.time() - self._started,
        }
        if self._report_path:
            tmp = "%s.%d.tmp" % (self._report_path, os.getpid())
            with open(tmp, "w") as f:
                json.dump(report, f)
            os.replace(tmp, self._report_path)
