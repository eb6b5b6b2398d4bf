"""The order of a tune's proofs in one wave (``--parallel`` over several settings): which floor each
setting is proved above, and what is proved again after the wave (pure logic: the proofs themselves
are recorded, not compiled; the compiling path is tests/test_measure_together.py's)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jaxfit.fit import FitOptions
from jaxfit.tune import engine
from jaxfit.tune.model import Row, TuneOptions, _Leader
from jaxfit.tune.prove import _Proofs, _Searched
from jaxfit.tune.space import script_settings


@dataclasses.dataclass
class _Answer:
    batch_size: int


def _searched(setting: Any, answer: int) -> _Searched:
    return _Searched(setting, _Answer(answer), 1.0, [], {})  # type: ignore[arg-type]


def _run(monkeypatch: pytest.MonkeyPatch, fits: dict[str, list[int]]) -> tuple[list[dict[str, Any]], _Proofs]:
    """The wave over remat none (searched: 8) and full (searched: 32), each proof "fitting" the
    micro-batches ``fits`` gives its setting; returns the recorded calls and the proofs."""
    none, full = script_settings(["--remat=none,full"])
    calls: list[dict[str, Any]] = []

    def prove(
        target, searched, options, tune, leader, progress, proofs, floor=None, parallel=1, slots=None, below=None
    ):
        calls.append({"setting": searched.setting.name, "floor": floor, "below": below})
        for micro in fits[searched.setting.name]:
            if (floor is None or micro > floor[1]) and (below is None or micro <= below):
                proofs.rows.append(Row(searched.setting.name, micro, 64 // micro, 64))
                proofs.fits[(searched.setting.name, micro, 64 // micro)] = object()

    monkeypatch.setattr(engine, "_prove_descending", prove)
    tuning = TuneOptions(global_batch=64, measure="inline", parallel=2)
    early = {none.name: _searched(none, 8), full.name: _searched(full, 32)}
    proofs = _Proofs()
    engine._prove_in_one_wave(
        None,
        [full, none],
        early,
        FitOptions(),
        tuning,
        _Leader(tuning),
        None,
        proofs,
        2,  # type: ignore[arg-type]
    )
    return calls, proofs


def test_a_remat_setting_is_proved_above_its_twins_search_answer_in_the_same_wave(monkeypatch):
    calls, proofs = _run(monkeypatch, {"--remat=none": [8, 4, 2], "--remat=full": [32, 16, 8]})
    assert sorted((c["setting"], c["floor"], c["below"]) for c in calls) == [
        ("--remat=full", ("--remat=none", 8), None),
        ("--remat=none", None, None),
    ]
    # rows: without remat first, as setting after setting gives them
    assert [(r.setting, r.micro_batch) for r in proofs.rows] == [
        ("--remat=none", 8), ("--remat=none", 4), ("--remat=none", 2), ("--remat=full", 32), ("--remat=full", 16),
    ]  # fmt: skip


def test_when_the_twins_proofs_fit_less_than_its_search_the_micro_batches_between_are_proved_after(monkeypatch):
    """remat none's search said 8 fits (untuned), its autotuned proofs fit only 4: remat full is
    then proved again between them (floor 4, up to 8), where it may be the faster."""
    calls, proofs = _run(monkeypatch, {"--remat=none": [4, 2], "--remat=full": [32, 16, 8]})
    assert calls[-1] == {"setting": "--remat=full", "floor": ("--remat=none", 4), "below": 8}
    assert ("--remat=full", 8, 8) in proofs.fits
