"""The schedule timeline PNG: drawn from a real state file, written atomically, readable back."""

from __future__ import annotations

import os
import sys

import pytest

from jaxfit.errors import ConfigError
from jaxfit.schedule.state import Attempt, ExperimentRecord, Sample, StateStore
from jaxfit.schedule.timeline import draw_timeline

GIB = 1 << 30
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T0 = 1_700_000_000.0


def _record(name: str, position: int, gpu: int, need_gib: float, state: str) -> ExperimentRecord:
    return ExperimentRecord(
        name=name,
        position=position,
        gpu=gpu,
        mem_fraction=0.4,
        batch_size=32,
        grad_accum_steps=1,
        need_bytes=int(need_gib * GIB),
        command=("python", "train.py"),
        env={},
        retries=1,
        timeout=None,
        state=state,
    )


def _attempt(name: str, n: int, start: float, end: float | None, outcome: str | None) -> Attempt:
    return Attempt(
        name=name,
        attempt=n,
        batch_size=32 // n,
        grad_accum_steps=n,
        pid=1000 + n,
        started_at=T0 + start,
        ended_at=None if end is None else T0 + end,
        exit_code=None if outcome is None else (0 if outcome == "done" else 1),
        outcome=outcome,
        log_path=f"logs/{name}.{n}.log",
    )


@pytest.fixture
def store(tmp_path):
    """Two GPUs, three experiments: ``b`` runs out of memory and is retried; ``c`` is still running."""
    s = StateStore(tmp_path / "state" / "state.sqlite")
    s.add_experiments(
        [
            _record("a", 0, 0, 30, "done"),
            _record("b", 1, 0, 40, "running"),
            _record("c", 2, 1, 60, "running"),
        ]
    )
    for attempt in [
        _attempt("a", 1, 0, 120, "done"),
        _attempt("b", 1, 5, 40, "oom"),
        _attempt("b", 2, 45, None, None),
        _attempt("c", 1, 10, None, None),
    ]:
        s.start_attempt(attempt)
    samples = []
    for k in range(0, 150, 5):
        t = T0 + k
        used0 = (28 if k < 120 else 0) + (38 if 5 <= k < 40 or k >= 45 else 0)
        samples += [
            Sample(t=t, gpu=0, used_bytes=used0 * GIB, total_bytes=80 * GIB, utilization=50.0),
            Sample(t=t, gpu=1, used_bytes=(55 if k >= 10 else 1) * GIB, total_bytes=80 * GIB),
            Sample(t=t, gpu=1, used_bytes=(55 if k >= 10 else 1) * GIB, name="c", pid=1001),
        ]
    s.add_samples(samples)
    yield s
    s.close()


def _check_png(path, min_bytes: int = 10_000) -> tuple[int, ...]:
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > min_bytes
    shape = matplotlib.image.imread(str(path)).shape
    assert len(shape) == 3 and shape[2] in (3, 4)
    return shape


def test_draws_two_gpus_with_a_retry(store, tmp_path):
    out = tmp_path / "pictures"
    out.mkdir()
    path = draw_timeline(
        out / "timeline.png",
        store.experiments(),
        store.attempts(),
        store.samples(),
        [(0, 80 * GIB, 76 * GIB), (1, 80 * GIB, 76 * GIB)],
        title="queue.yaml",
    )
    assert path == out / "timeline.png"
    height, width, _ = _check_png(path)
    assert 800 <= width <= 2000 and 400 <= height <= 1200  # 12 x 6 inches at 100 dpi, give or take
    assert os.listdir(out) == ["timeline.png"]  # no temporary file left behind
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)

    # Drawing again replaces the file in place.
    again = draw_timeline(
        str(path),
        store.experiments(),
        store.attempts(),
        store.samples(),
        [(0, 80 * GIB, 76 * GIB), (1, 80 * GIB, 76 * GIB)],
    )
    assert again == path and os.listdir(out) == ["timeline.png"]


def test_one_experiment_and_no_samples(tmp_path):
    """A CPU schedule: logical GPU, nothing measured; also a GPU lane where nothing ran."""
    path = draw_timeline(
        tmp_path / "new" / "sub" / "t.png",
        [_record("only", 0, 0, 8, "done")],
        [_attempt("only", 1, 0, 3, "done")],
        [],
        [(0, 16 * GIB, 15 * GIB), (1, 16 * GIB, 15 * GIB)],
    )
    _check_png(path)
    assert os.listdir(path.parent) == ["t.png"]


def test_nothing_ran_yet(tmp_path):
    path = draw_timeline(tmp_path / "t.png", [_record("a", 0, 0, 8, "pending")], [], [], [(0, 16 * GIB, 15 * GIB)])
    _check_png(path, min_bytes=2_000)


def test_lanes_for_gpus_not_listed(store, tmp_path):
    """GPU 1 is used but not passed: it gets a lane without total and capacity lines."""
    path = draw_timeline(
        tmp_path / "t.png", store.experiments(), store.attempts(), store.samples(), [(0, 80 * GIB, 76 * GIB)]
    )
    height, _, _ = _check_png(path)
    assert height >= 500  # two lanes


def test_pyplot_is_left_alone(store, tmp_path):
    before = "matplotlib.pyplot" in sys.modules
    draw_timeline(
        tmp_path / "t.png",
        store.experiments(),
        store.attempts(),
        store.samples(),
        [(0, 80 * GIB, 76 * GIB), (1, 80 * GIB, 76 * GIB)],
    )
    assert ("matplotlib.pyplot" in sys.modules) == before


def test_unwritable_paths_are_config_errors(store, tmp_path):
    args = (store.experiments(), store.attempts(), store.samples(), [(0, 80 * GIB, 76 * GIB)])
    with pytest.raises(ConfigError, match="is a folder") as info:
        draw_timeline(tmp_path, *args)
    assert "\n" not in str(info.value)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="cannot write the timeline") as info:
        draw_timeline(blocker / "t.png", *args)
    assert "\n" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["file", "state"]  # no temporary file left behind
