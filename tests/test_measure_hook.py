"""The measuring hook's loader phase: the script's loop timed with the step skipped (pure logic on
a Python step; no training process)."""

from __future__ import annotations

import json
import time

import pytest

from jaxfit._probe.jaxfit_measure import MeasuredStep


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
    assert len(data["step_seconds"]) == 2 and all(s >= 0.05 for s in data["step_seconds"])
    assert len(data["input_seconds"]) == 2
    assert all(0.02 <= s < 0.05 for s in data["input_seconds"]), data["input_seconds"]


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
