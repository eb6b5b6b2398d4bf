"""Timing the train step inside a training process, for ``jaxfit tune``.

With ``$JAXFIT_MEASURE`` set to ``WARMUP,STEPS``, jaxfit's start-up hook wraps the script's jitted
train step (the pinned one when there is a pin): each call waits for its outputs
(``jax.block_until_ready``), so the step's wall time is measured alone, and the time the script
spends between two calls (its data loading, logging) is measured too. After ``WARMUP`` calls that
are not counted (the first one compiles or loads the program) and ``STEPS`` timed ones, the times
are written as JSON to ``$JAXFIT_MEASURE_REPORT`` and the process ends: a measurement never trains
longer than it needs. Standard library + jax only (it runs in the script's environment).
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


def plan() -> "Optional[tuple[int, int]]":
    """``(warmup, steps)`` from ``$JAXFIT_MEASURE``, or None when not measuring."""
    text = os.environ.get(MEASURE_ENV)
    if not text:
        return None
    warmup, _, steps = text.partition(",")
    return max(0, int(warmup)), max(1, int(steps))


class MeasuredStep:
    """Stands in for the train step while ``jaxfit tune`` measures it (module docstring)."""

    def __init__(self, step: Any, warmup: int, steps: int, report_path: Optional[str]) -> None:
        self._step = step
        self._warmup, self._steps = warmup, steps
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
        if done:
            self._finish(args)
        return out

    def _finish(self, args: tuple) -> None:
        report: Dict[str, Any] = {
            "step_seconds": self._step_seconds,
            "outside_step_seconds": self._outside_seconds,
            "first_call_seconds": self._first_call_seconds,
            "warmup": self._warmup,
            "seconds_to_done": time.time() - self._started,
        }
        if self._report_path:
            tmp = "%s.%d.tmp" % (self._report_path, os.getpid())
            with open(tmp, "w") as f:
                json.dump(report, f)
            os.replace(tmp, self._report_path)
        print(
            "jaxfit: measured %d steps after %d warm-up calls; stopping the run" % (self._steps, self._warmup),
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(0)
