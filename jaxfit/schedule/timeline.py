"""The timeline of a schedule as a PNG: what the plan charged each GPU over time, and what was measured.

:func:`draw_timeline` draws one lane per GPU, all on one time axis (seconds since the first attempt
started). In each lane

- every attempt of an experiment on that GPU is a band of the experiment's planned need
  (:attr:`ExperimentRecord.need_bytes <jaxfit.schedule.state.ExperimentRecord.need_bytes>`) from its
  start to its end (an attempt still running reaches the last timestamp known), stacked on the
  attempts running beside it, so the top of the stack is what the plan charged the GPU at each
  moment. One colour per experiment (the legend names them); attempts that ended other than
  ``done`` (out of memory, crashed, timed out, interrupted) are hatched with a dark outline, and
  they and retries are labelled ``name #attempt [outcome]`` inside their band;
- the measured used memory of the GPU (the monitor's rows with ``name`` None) is a black line;
- the GPU's total memory is a grey line and the capacity the plan may fill a dashed red one.

Design: matplotlib is imported only when a timeline is drawn (it is not a dependency of the tuner
itself), and only through :class:`matplotlib.figure.Figure` with the Agg canvas, never
``pyplot``: a caller's pyplot state, backend and open figures are left alone, and nothing needs a
display. The PNG is written to a temporary file beside the target and moved over it with
:func:`os.replace`, so a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxfit.errors import ConfigError
from jaxfit.schedule.state import Attempt, ExperimentRecord, Sample

GIB = float(1 << 30)

_LANE_HEIGHT = 2.6  # inches per GPU lane
_WIDTH = 12.0  # inches
_DPI = 100
_MIN_SPAN = 1.0  # seconds: the x range of a timeline where nothing lasted


def _bad(attempt: Attempt) -> bool:
    """Whether the attempt ended other than ``done`` (a running one has neither an end nor an outcome)."""
    if attempt.ended_at is None and attempt.outcome is None:
        return False
    return attempt.outcome != "done"


def _steps(intervals: Sequence[tuple[float, float, float]], xs: Sequence[float]) -> list[float]:
    """The summed height of ``(start, end, height)`` intervals on each ``[xs[i], xs[i+1])`` step."""
    return [sum(h for start, end, h in intervals if start <= x < end) for x in xs]


def draw_timeline(
    path: str | Path,
    experiments: Sequence[ExperimentRecord],
    attempts: Sequence[Attempt],
    samples: Sequence[Sample],
    gpus: Sequence[tuple[int, int, int]],
    title: str = "",
    run_gpus: Mapping[str, Sequence[int]] | None = None,
) -> Path:
    """Draw the timeline of a schedule to the PNG ``path`` and return it.

    Args:
      path: The PNG to write (its folder is created; an existing file is replaced atomically).
      experiments: The experiments (their GPU, planned need and plan order).
      attempts: Their attempts; those of experiments not in ``experiments`` are left out.
      samples: The monitor's readings (may be empty: then no measured line).
      gpus: ``(plan GPU index, total bytes, capacity bytes)`` of each GPU, one lane each, in this
        order. A GPU an experiment or a sample names but ``gpus`` does not gets a lane of its own,
        without total and capacity lines.
      title: The figure's title.
      run_gpus: Every GPU of a run that takes several (``gpus: N``): its bar is drawn on each
        lane; other runs are on their experiment's GPU.

    Raises:
      ConfigError: matplotlib is missing, ``path`` is a folder, or it cannot be written.
    """
    path = Path(path)
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        raise ConfigError("drawing the timeline needs matplotlib; pip install matplotlib") from None
    if path.is_dir():
        raise ConfigError(f"timeline {str(path)!r} is a folder; give a file name such as timeline.png")

    by_name = {e.name: e for e in experiments}
    runs = [a for a in attempts if a.name in by_name]
    lanes_of = {e.name: tuple((run_gpus or {}).get(e.name) or (e.gpu,)) for e in experiments}
    order = {e.name: i for i, e in enumerate(sorted(experiments, key=lambda e: (e.position, e.name)))}

    # Lanes: the given GPUs in order, then any other GPU the data names.
    lanes: list[tuple[int, int | None, int | None]] = [(int(i), int(t), int(c)) for i, t, c in gpus]
    known = {lane[0] for lane in lanes}
    extra = {g for e in experiments for g in lanes_of[e.name]} | {s.gpu for s in samples}
    lanes += [(g, None, None) for g in sorted(extra - known)]

    # The time axis: 0 at the first start; attempts still running reach the last timestamp.
    stamps = [a.started_at for a in runs] + [a.ended_at for a in runs if a.ended_at is not None]
    stamps += [s.t for s in samples]
    t0 = min((a.started_at for a in runs), default=min(stamps, default=0.0))
    t_end = max(stamps, default=t0)
    if t_end - t0 < _MIN_SPAN:
        t_end = t0 + _MIN_SPAN

    colors = matplotlib.colormaps["tab20" if len(order) > 10 else "tab10"]
    n_colors = 20 if len(order) > 10 else 10

    fig = Figure(figsize=(_WIDTH, _LANE_HEIGHT * max(len(lanes), 1) + 0.8), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(len(lanes), 1), 1, sharex=True, squeeze=False)[:, 0]
    if title:
        fig.suptitle(title)

    for ax, (gpu, total, capacity) in zip(axes, lanes):
        lane_runs = sorted(
            (a for a in runs if gpu in lanes_of[a.name]),
            key=lambda a: (a.started_at, order[a.name], a.attempt),
        )
        intervals = [
            (
                a.started_at - t0,
                (t_end if a.ended_at is None else max(a.ended_at, a.started_at)) - t0,
                by_name[a.name].need_bytes / GIB,
            )
            for a in lane_runs
        ]
        xs = sorted({0.0, t_end - t0} | {x for start, end, _ in intervals for x in (start, end)})
        top = 0.0
        handles: dict[str, Any] = {}
        any_bad = False
        for k, a in enumerate(lane_runs):
            below = _steps(intervals[:k], xs)
            mine = _steps(intervals[k : k + 1], xs)
            above = [b + m for b, m in zip(below, mine)]
            top = max(top, *above)
            color = colors(order[a.name] % n_colors)
            bad = _bad(a)
            any_bad = any_bad or bad
            ax.fill_between(
                xs,
                below,
                above,
                step="post",
                facecolor=color,
                alpha=0.55 if bad else 0.8,
                edgecolor="0.15" if bad else color,
                linewidth=1.2 if bad else 0.5,
                hatch="///" if bad else None,
            )
            handles.setdefault(a.name, Patch(facecolor=color, alpha=0.8, label=a.name))
            if bad or a.attempt > 1:  # name retries and failures where they happened
                start, end, need = intervals[k]
                level = max((b for x, b in zip(xs, below) if start <= x < end), default=0.0)
                text = f"{a.name} #{a.attempt}" + (f" {a.outcome or 'lost'}" if bad else "")
                ax.text(
                    (start + end) / 2,
                    level + need / 2,
                    text,
                    ha="center",
                    va="center",
                    fontsize="x-small",
                    clip_on=True,
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.7, "linewidth": 0},
                )

        measured = sorted((s.t - t0, s.used_bytes / GIB) for s in samples if s.gpu == gpu and s.name is None)
        lines: list[Any] = []
        if measured:
            (line,) = ax.plot(
                [x for x, _ in measured], [y for _, y in measured], color="black", linewidth=1.4, label="measured used"
            )
            lines.append(line)
            top = max(top, max(y for _, y in measured))
        if total is not None:
            lines.append(ax.axhline(total / GIB, color="0.45", linewidth=1.2, label=f"total {total / GIB:.1f} GiB"))
            top = max(top, total / GIB)
        if capacity is not None:
            lines.append(
                ax.axhline(
                    capacity / GIB,
                    color="tab:red",
                    linestyle="--",
                    linewidth=1.2,
                    label=f"capacity {capacity / GIB:.1f} GiB",
                )
            )
            top = max(top, capacity / GIB)

        legend = [handles[name] for name in sorted(handles, key=order.__getitem__)]
        if any_bad:
            legend.append(Patch(facecolor="white", edgecolor="0.15", hatch="///", label="ended badly"))
        legend += lines
        if legend:
            ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
        if not lane_runs and not measured:
            ax.text(0.5, 0.5, "nothing ran", transform=ax.transAxes, ha="center", va="center", color="0.5")
        ax.set_ylim(0, top * 1.08 if top > 0 else 1.0)
        ax.set_ylabel(f"GPU {gpu}\nGiB")
        ax.grid(True, axis="both", alpha=0.3)
    axes[-1].set_xlim(min([0.0] + [x for x in (s.t - t0 for s in samples)]), t_end - t0)
    axes[-1].set_xlabel("seconds since the first attempt started")

    _write_atomic(fig, path)
    return path


def _write_atomic(fig: Any, path: Path) -> None:
    """Save ``fig`` as a PNG to a temporary file beside ``path``, then move it over ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise ConfigError(f"cannot write the timeline {str(path)!r}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide the picture from other readers
            fig.savefig(f, format="png")
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ConfigError(f"cannot write the timeline {str(path)!r}: {e.strerror or e}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
