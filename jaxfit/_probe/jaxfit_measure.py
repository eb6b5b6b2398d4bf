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
step, is not counted): what the loader delivers when no step hides it.

**Several programs in one process.** With ``$JAXFIT_MEASURE_PROGRAMS`` naming a JSON file that
lists further pins (``pin.json`` paths of programs proven for the same global batch: another
accumulation of the same setting), each is loaded in turn after the timed steps of the one before
(:meth:`jaxfit_pin.PinnedStep.load_other`: its arguments and outputs must be the running program's)
and timed the same way, in the same training loop, on the state the loop carries: one start-up
for all of them instead of one each. With ``$JAXFIT_MEASURE_DROP_MARGIN`` as ``LOOK,MARGIN``, a
program whose first ``LOOK`` timed steps are more than ``MARGIN`` slower than the fastest program
timed before it in this process stops there (successive halving inside the process). The report's
``programs`` lists each program's times (its top-level fields stay the first program's).
**A process on standby.** With ``$JAXFIT_MEASURE_WAIT`` naming a file that does not exist yet,
the process starts while the programs it will time are still being proven: it imports, builds
its state and reaches the first call of its train step, then waits there (:class:`Standby`) until
the file appears. The file is a JSON object of the environment variables above that the process
could not be given at its start (``JAXFIT_PIN``, ``$JAXFIT_MEASURE_PROGRAMS``, the give-up test,
the deadline), which are set before the step is built as it would have been, or ``{"stop": true}``:
the process ends at once, having run nothing. It ends too when its parent is gone or after
``$JAXFIT_MEASURE_WAIT_SECONDS`` (default :data:`WAIT_SECONDS`) without orders. The start-up is
then paid while the tune proves, not after it.
Standard library + jax only (it runs in the script's environment).
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
PROGRAMS_ENV = "JAXFIT_MEASURE_PROGRAMS"
MARGIN_ENV = "JAXFIT_MEASURE_DROP_MARGIN"
DEADLINE_ENV = "JAXFIT_MEASURE_DEADLINE"
WAIT_ENV = "JAXFIT_MEASURE_WAIT"
WAIT_SECONDS_ENV = "JAXFIT_MEASURE_WAIT_SECONDS"
WAIT_SECONDS = 3600.0
"""How long a process on standby waits for its orders by default before it ends."""
BUDGET_SPENT = "the tune's --budget was spent before it"
"""The ``error`` of a program not loaded because ``$JAXFIT_MEASURE_DEADLINE`` (a Unix time) passed."""


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


def programs() -> "List[str]":
    """Pins to time after the first program, from the JSON list in ``$JAXFIT_MEASURE_PROGRAMS``."""
    path = os.environ.get(PROGRAMS_ENV)
    if not path:
        return []
    with open(path) as f:
        listed = json.load(f)
    return [str(p) for p in listed]


def deadline() -> "Optional[float]":
    """The Unix time after which no further program is loaded (``$JAXFIT_MEASURE_DEADLINE``), or None."""
    text = os.environ.get(DEADLINE_ENV)
    return float(text) if text else None


def drop_margin() -> "Optional[tuple[int, float]]":
    """``(look, margin)`` from ``$JAXFIT_MEASURE_DROP_MARGIN``, or None: no program is cut short for
    being slower than one timed before it here."""
    text = os.environ.get(MARGIN_ENV)
    if not text:
        return None
    look, _, margin = text.partition(",")
    return max(1, int(look)), float(margin)


def give_up_seconds(
    parent: "Optional[tuple[int, float]]", margin: "Optional[tuple[int, float]]", best_seconds: "Optional[float]"
) -> "Optional[tuple[int, float]]":
    """The give-up test of the next program: the parent's (``(look, seconds a step)``: clearly slower
    than the best measured in the tune so far) or, when stricter, ``margin``'s against the fastest
    program timed in this process (``best_seconds``: its step and the time before it)."""
    local = None
    if margin is not None and best_seconds:
        local = (margin[0], best_seconds / (1.0 - margin[1]))
    if parent is None:
        return local
    if local is None:
        return parent
    return (parent[0], min(parent[1], local[1]))


def _stand_in(wrapper: Any, wrapped: Any) -> None:
    """Make ``wrapper`` look like the step it stands in for (name, docs, ``__wrapped__``)."""
    try:
        import functools

        functools.update_wrapper(wrapper, wrapped, updated=())
    except (AttributeError, TypeError):
        pass


def _median(values: "List[float]") -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


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
        more_programs: "Optional[List[str]]" = None,
        margin: "Optional[tuple[int, float]]" = None,
        until: "Optional[float]" = None,
    ) -> None:
        self._step = step
        self._warmup, self._steps = warmup, steps
        self._give_up_after = give_up_after
        self._parent_give_up = give_up_after
        self._margin = margin
        self._more = list(more_programs or [])
        self._until = until
        self._programs: List[Dict[str, Any]] = []  # what each program timed so far gave
        self._pin_path = os.environ.get("JAXFIT_PIN") or None
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
        _stand_in(self, step)

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
            give_up = self._give_up_after
            stop = not done and give_up is not None and too_slow(self._step_seconds, self._outside_seconds, *give_up)
        if not (done or stop):
            return out
        several = bool(self._more or self._programs)
        if several:  # several programs in this process: keep this one's times, load the next
            self._program_done(stop)
            if self._next_program():
                return out
        if self._input_steps and (several or not stop):
            self._write_report(stopped_early=stop)  # the steps stand even if the script ends now
            self._last_out, self._loader_calls = out, 1  # the next calls time the loader alone
            return out
        self._finish(stopped_early=stop)
        return out

    def _result(self, stopped_early: bool) -> Dict[str, Any]:
        return {
            "pin": self._pin_path,
            "stopped_early": stopped_early,
            "step_seconds": list(self._step_seconds),
            "outside_step_seconds": list(self._outside_seconds),
            "first_call_seconds": self._first_call_seconds,
        }

    def _program_done(self, stopped_early: bool) -> None:
        """Keep the times of the program just timed (the report is written, so a later program that
        ends the process leaves them)."""
        self._programs.append(self._result(stopped_early))
        self._write_report()

    def _best_seconds(self) -> "Optional[float]":
        whole = [
            _median(p["step_seconds"]) + (_median(p["outside_step_seconds"]) if p["outside_step_seconds"] else 0.0)
            for p in self._programs
            if p.get("step_seconds") and not p.get("stopped_early")
        ]
        return min(whole) if whole else None

    def _next_program(self) -> bool:
        """Load the next program that loads (one that does not is reported with why) and start
        timing it; False when none is left."""
        if self._until is not None and self._more and time.time() > self._until:
            self._programs += [{"pin": path, "error": BUDGET_SPENT} for path in self._more]
            self._more = []
            self._write_report()
        while self._more:
            path = self._more.pop(0)
            load = getattr(self._step, "load_other", None)
            error = "the step runs no pinned program" if load is None else load(path)
            if error:
                self._programs.append({"pin": path, "error": error})
                self._write_report()
                print("jaxfit: not timed: %s (%s)" % (path, error), file=sys.stderr, flush=True)
                continue
            self._pin_path = path
            self._calls, self._first_call_seconds = 0, None
            self._step_seconds, self._outside_seconds = [], []
            self._last_end = None
            self._warmup = max(1, self._warmup)  # the first call of a loaded program is never timed
            self._give_up_after = give_up_seconds(self._parent_give_up, self._margin, self._best_seconds())
            print("jaxfit: timing the next proven program in this process: %s" % path, file=sys.stderr, flush=True)
            return True
        return False

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

    def _write_report(self, stopped_early: bool = False) -> None:
        """Write what was timed so far (with several programs, ``stopped_early`` and the top-level
        times are the first program's, whatever is passed)."""
        first = self._programs[0] if self._programs else self._result(stopped_early)
        report: Dict[str, Any] = {
            "stopped_early": stopped_early,
            "step_seconds": first.get("step_seconds", []),
            "outside_step_seconds": first.get("outside_step_seconds", []),
            "first_call_seconds": first.get("first_call_seconds"),
            "input_seconds": self._input_seconds,
            "warmup": self._warmup,
            "seconds_to_done": time.time() - self._started,
        }
        if self._programs:  # several programs: the top-level fields are the first one's
            report["stopped_early"] = bool(first.get("stopped_early"))
            report["programs"] = self._programs
        if self._report_path:
            tmp = "%s.%d.tmp" % (self._report_path, os.getpid())
            with open(tmp, "w") as f:
                json.dump(report, f)
            os.replace(tmp, self._report_path)


def wait_for_orders(path: str, limit: float, poll: float = 0.05) -> "Dict[str, str]":
    """The environment variables in the orders file at ``path`` once it exists; the process ends
    here (exit 0, nothing run) on ``{"stop": true}``, when its parent is gone, or after ``limit``
    seconds without orders."""
    parent = os.getppid()
    give_up_at = time.monotonic() + limit
    print("jaxfit: on standby at the first call of the train step, waiting for orders", file=sys.stderr, flush=True)
    while True:
        try:
            with open(path) as f:
                orders = json.load(f)
        except FileNotFoundError:
            orders = None
        except ValueError:  # written whole by os.replace: an unreadable file is not jaxfit's; stop
            orders = {"stop": True, "why": "its orders file %s is not JSON" % path}
        if orders is not None:
            if orders.get("stop"):
                _end_waiting(str(orders.get("why") or "told to stop"))
            return {str(k): str(v) for k, v in dict(orders.get("env") or {}).items()}
        if os.getppid() != parent:
            _end_waiting("the process that started it is gone")
        if time.monotonic() > give_up_at:
            _end_waiting("no orders came in %g s" % limit)
        time.sleep(poll)


def _end_waiting(why: str) -> None:
    print("jaxfit: the process on standby ends before its first step: %s" % why, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(0)


class Standby:
    """Stands in for the train step of a process started before its programs were proven (module
    docstring): its first call waits for the orders, sets them in the environment and builds the
    step with ``build()`` (the pinned, measured step the process would have had), then every call
    goes to that step."""

    def __init__(self, jitted: Any, orders_path: str, build: Any) -> None:
        self._jitted = jitted
        self._path = orders_path
        self._build = build
        self._step: Any = None
        self._lock = threading.Lock()
        _stand_in(self, jitted)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jitted if self._step is None else self._step, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._step is None:
                import jax

                if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs))):
                    return self._jitted(*args, **kwargs)  # traced inside another function: not the loop's call
                text = os.environ.get(WAIT_SECONDS_ENV)
                os.environ.update(wait_for_orders(self._path, float(text) if text else WAIT_SECONDS))
                print("jaxfit: the process on standby has its orders", file=sys.stderr, flush=True)
                self._step = self._build()
        return self._step(*args, **kwargs)
