"""The measuring hook's loader phase: the script's loop timed with the step skipped (pure logic on
a Python step; no training process). Time is a test clock that moves only when a step or the
loader "takes" its seconds, so a loaded machine cannot stretch one program past another."""

from __future__ import annotations

import json
import time  # replaced by the test clock in every test (the fixture below)

import pytest

from jaxfit._probe import jaxfit_measure
from jaxfit._probe.jaxfit_measure import MeasuredStep


class _Clock:
    """The hook's and the tests' ``time``: ``sleep`` moves it, nothing else does."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter
    time = perf_counter


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(jaxfit_measure, "time", fake)
    monkeypatch.setitem(globals(), "time", fake)  # this module's sleeps: the steps' and the loader's seconds
    return fake


class _Finished(Exception):
    pass


class _Kept(MeasuredStep):
    """Ends by raising instead of ending the process."""

    def _finish(self, stopped_early: bool = False) -> None:
        self._write_report(stopped_early)
        raise _Finished


def _loop(step: MeasuredStep, loader_seconds: float, calls: int) -> int:
    """A training loop: fetch a batch (a sleep), call the step, pass its state on."""
    state = 0
    for i in range(calls):
        time.sleep(loader_seconds)
        try:
            state = step(state)
        except _Finished:
            return i + 1
    return calls


def test_after_the_timed_steps_the_loop_is_timed_without_the_step(tmp_path):
    runs: list[int] = []

    def step(state: int) -> int:
        runs.append(state)
        time.sleep(0.05)  # the step: 50 ms
        return state + 1

    report = tmp_path / "measure.json"
    hook = _Kept(step, warmup=1, steps=2, report_path=str(report), input_steps=2)
    calls = _loop(hook, 0.02, 20)
    # 1 warm-up + 2 timed steps ran the step; then 3 calls without it (the first gap overlaps a step)
    assert runs == [0, 1, 2] and calls == 6
    data = json.loads(report.read_text())
    assert data["step_seconds"] == pytest.approx([0.05, 0.05])
    assert data["input_seconds"] == pytest.approx([0.02, 0.02])  # the loader alone, the step skipped


def test_the_steps_are_reported_before_the_loader_phase_in_case_the_script_ends():
    """A script that trains exactly warm-up + steps steps ends before the loader is timed: its steps
    still stand (the report is written when they are done)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "measure.json"
        hook = _Kept(lambda s: s + 1, warmup=1, steps=2, report_path=str(report), input_steps=3)
        assert _loop(hook, 0.0, 3) == 3  # the loop ends by itself
        data = json.loads(report.read_text())
        assert len(data["step_seconds"]) == 2 and data["input_seconds"] == []


def test_without_input_steps_the_hook_ends_after_the_steps():
    hook = _Kept(lambda s: s + 1, warmup=1, steps=2, report_path=None)
    with pytest.raises(_Finished):
        for _ in range(5):
            hook(0)


class _Programs:
    """A step whose program can be swapped (as :meth:`jaxfit_pin.PinnedStep.load_other` does): each
    program sleeps its own seconds and adds its own increment to the state."""

    def __init__(self, programs: dict[str, tuple[float, int]], first: str) -> None:
        self.programs, self.current, self.ran = programs, first, []

    def __call__(self, state: int) -> int:
        seconds, increment = self.programs[self.current]
        self.ran.append(self.current)
        time.sleep(seconds)
        return state + increment

    def load_other(self, path: str) -> str | None:
        if path not in self.programs:
            return "it takes other arguments"
        self.current = path
        return None


def test_several_programs_are_timed_in_turn_on_the_state_the_loop_carries(tmp_path):
    step = _Programs({"a": (0.01, 1), "b": (0.03, 10), "c": (0.02, 100)}, "a")
    report = tmp_path / "measure.json"
    hook = _Kept(step, warmup=1, steps=2, report_path=str(report), more_programs=["b", "other", "c"])
    state = 0
    with pytest.raises(_Finished):
        for _ in range(20):
            state = hook(state)
    # each program: one warm-up call (a loaded program's first call is never timed) and 2 timed
    assert step.ran == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert state == 3 * 1 + 3 * 10 + 2 * 100  # the state went through every program (the last call ends it)
    data = json.loads(report.read_text())
    programs = data["programs"]
    assert [p["pin"] for p in programs] == [None, "b", "other", "c"]
    assert programs[2] == {"pin": "other", "error": "it takes other arguments"}
    assert programs[1]["step_seconds"] == pytest.approx([0.03, 0.03]) and len(programs[3]["step_seconds"]) == 2
    assert max(programs[0]["step_seconds"]) < min(programs[1]["step_seconds"])
    assert data["step_seconds"] == programs[0]["step_seconds"]  # the top level stays the first program's


def test_a_program_clearly_slower_than_one_timed_before_it_in_the_process_stops_after_its_look(tmp_path):
    """Successive halving inside one process: with a margin, the next program is compared with
    the fastest timed before it; a slow one stops after its look and the next is timed."""
    step = _Programs({"fast": (0.01, 1), "slow": (0.3, 1), "last": (0.01, 1)}, "fast")
    report = tmp_path / "measure.json"
    hook = _Kept(step, warmup=1, steps=4, report_path=str(report), more_programs=["slow", "last"], margin=(1, 0.1))
    with pytest.raises(_Finished):
        for _ in range(30):
            hook(0)
    programs = json.loads(report.read_text())["programs"]
    assert [len(p["step_seconds"]) for p in programs] == [4, 1, 4]
    assert [p["stopped_early"] for p in programs] == [False, True, False]
    assert step.ran.count("slow") == 2  # its warm-up call and one timed step, not five


def test_the_input_alone_is_timed_once_after_the_last_program(tmp_path):
    step = _Programs({"a": (0.02, 1), "b": (0.02, 1)}, "a")
    report = tmp_path / "measure.json"
    hook = _Kept(step, warmup=1, steps=2, report_path=str(report), input_steps=2, more_programs=["b"])
    calls = _loop(hook, 0.01, 30)
    assert step.ran == ["a"] * 3 + ["b"] * 3 and calls == 6 + 3
    data = json.loads(report.read_text())
    assert len(data["input_seconds"]) == 2 and len(data["programs"]) == 2
