"""Pictures of what jaxfit measured: one fit's peak by component, the openpi table, the fit against
the trial search it replaces, and a tune's speed against memory.

Each function draws one figure and writes it to ``path``, a PNG, SVG or PDF by its suffix, whole or
not at all (a temporary file beside it, then renamed), and returns the path. matplotlib is imported
when a figure is drawn, never by ``import jaxfit``, and only through its ``Figure`` on the Agg canvas:
pyplot's global state (and the backend a user chose for it) is left alone.

``jaxfit fit --plot FILE`` writes :func:`breakdown_figure` of its answer;
``benchmarks/make_figures.py`` draws the others from the committed measurements.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from jaxfit.errors import ConfigError
from jaxfit.fit.budget import GiB, MiB, format_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from jaxfit.fit.results import FitResult

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
"""The files a figure can be written to, by suffix."""
DPI = 110
"""Resolution of a PNG: 50-150 KB for the figures of ``docs/images``."""

CATEGORY_COLORS = {
    "parameters": "#4c72b0",
    "optimizer state": "#55a868",
    "other state": "#8c8c8c",
    "batch": "#dd8452",
    "gradients": "#c44e52",
    "activations and workspace": "#8172b3",
}
"""One colour per category of :data:`jaxfit.fit.breakdown.Category`, in its order."""

OpenpiStatus = Literal["ran", "answered", "does not start", "does not fit"]
"""``ran``: the pinned run at the answer ended with exit 0 and no out of memory; ``answered``: the
fit answered, the run did not finish (or was not made); ``does not start``: the script's start-up ran
out of memory before its train step; ``does not fit``: the state alone is larger than the pool."""

OPENPI_COLORS: dict[str, str] = {
    "ran": "#a6dba0",
    "answered": "#fee08b",
    "does not start": "#f4a582",
    "does not fit": "#d9d9d9",
}
OPENPI_LEGEND: dict[str, str] = {
    "ran": "answered; the pinned run at it ran, 0 out of memory",
    "answered": "answered only (its run did not finish)",
    "does not start": "does not start: start-up out of memory",
    "does not fit": "does not fit: the state alone exceeds the pool",
}


@dataclasses.dataclass(frozen=True)
class OpenpiCell:
    """One cell of the openpi table: a config on a card.

    Attributes:
      config: The row: the config's name as it should read (``pi0 LoRA``).
      card: The column: the card (``80 GiB``).
      batch: The answered batch; ``None`` when there is none (``does not start``, ``does not fit``).
      status: What happened (:data:`OpenpiStatus`).
      note: A short line under the batch (the GPU it ran on, steps, why it does not fit).
    """

    config: str
    card: str
    batch: int | None
    status: OpenpiStatus
    note: str = ""


@dataclasses.dataclass(frozen=True)
class SearchRow:
    """One workload of jaxfit's fit against the trial search it replaces.

    Attributes:
      workload: Its name (``gpt-small-fp32``).
      trial_seconds: Wall time of the trial search (a fresh process per trial, real steps).
      jaxfit_seconds: Wall time of the whole ``jaxfit fit`` process, cold caches.
      cached_seconds: The same fit again, answered from the cache; ``None`` when not measured.
      trial_answer: The trial search's largest batch that ran; ``None`` when it did not finish.
      jaxfit_answer: jaxfit's answer.
      trial_seconds_at_least: The trial search was cut: ``trial_seconds`` is a lower bound.
      note: A short line under the answers.
    """

    workload: str
    trial_seconds: float
    jaxfit_seconds: float
    cached_seconds: float | None = None
    trial_answer: int | None = None
    jaxfit_answer: int | None = None
    trial_seconds_at_least: bool = False
    note: str = ""


@dataclasses.dataclass(frozen=True)
class TunePoint:
    """One setting a tune compiled: a micro-batch with a setting (``--remat=none``).

    Attributes:
      setting: The setting's name; one colour per setting.
      micro_batch: The micro-batch.
      accum_steps: Accumulation steps (the global batch is ``micro_batch x accum_steps``).
      peak_bytes: Its proven peak; ``None`` when not compiled (left out of the figure).
      samples_per_second: Its measured speed; ``None`` when not measured (drawn on the x axis).
      status: The tune's status of the row (``measured``, ``dropped``, ``does not fit``...).
      winner: Whether it is the tune's answer.
    """

    setting: str
    micro_batch: int
    accum_steps: int
    peak_bytes: int | None
    samples_per_second: float | None
    status: str = "measured"
    winner: bool = False


def check_figure_path(path: str | os.PathLike[str], flag: str = "--plot") -> Path:
    """Fail early (before a long fit) if a figure could not be written to ``path``: its suffix is not
    one of :data:`FIGURE_SUFFIXES`, or its folder is missing or not writable
    (:func:`jaxfit.files.check_writable`).

    Args:
      path: The file to write.
      flag: The option that named it, for the message.

    Returns:
      ``path`` as a :class:`~pathlib.Path`.

    Raises:
      ConfigError: one line naming ``flag`` and the path.
    """
    from jaxfit.files import check_writable

    p = Path(path)
    if p.suffix.lower() not in FIGURE_SUFFIXES:
        raise ConfigError(
            f"{flag} {path}: a figure is written as {', '.join(FIGURE_SUFFIXES)} by its suffix; "
            f"give a file name such as {p.with_suffix('.png').name}"
        )
    return check_writable(p, flag)


def _figure(width: float, height: float) -> Figure:
    """A matplotlib figure on the Agg canvas (pyplot untouched)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("drawing a figure needs matplotlib; pip install matplotlib") from None
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | os.PathLike[str], flag: str) -> Path:
    """Write ``fig`` to ``path`` in the format of its suffix, atomically.

    Raises:
      ConfigError: the suffix is not a figure's, ``path`` is a folder, or it cannot be written.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in FIGURE_SUFFIXES:
        raise ConfigError(f"{flag} {path}: give a file name ending in {', '.join(FIGURE_SUFFIXES)}")
    if p.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file name such as {p / ('figure' + suffix)}")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write it ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=suffix[1:], dpi=DPI, metadata=_metadata(suffix))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's file is private; a figure is for anyone to read
        os.replace(tmp, p)
    except BaseException as e:
        os.unlink(tmp)
        if isinstance(e, OSError):
            raise ConfigError(f"{flag} {path}: cannot write it ({e.strerror or e})") from None
        raise
    return p


def _umask() -> int:
    """The process's umask (set and restored: there is no call that only reads it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _metadata(suffix: str) -> dict[str, Any]:
    """File metadata without a date, so that the same figure gives the same file."""
    if suffix == ".png":
        return {"Software": "jaxfit"}
    if suffix == ".svg":
        return {"Date": None, "Creator": "jaxfit"}
    return {"CreationDate": None, "ModDate": None, "Creator": "jaxfit"}


def _unit(largest: float) -> tuple[int, str]:
    """The unit (bytes, name) that axis ticks of values up to ``largest`` bytes read best in."""
    return (GiB, "GiB") if largest >= GiB else (MiB, "MiB")


def _device_phrase(device: dict[str, Any], count: int = 1) -> str:
    """``cpu with 23.54 GiB, jax 0.10.2`` or ``4 x NVIDIA H200 with 80.00 GiB, jax 0.11.2`` (the
    memory of one device: its CUDA total, the planned card's size, or the host's RAM)."""
    kind = str(device.get("device_kind") or device.get("platform") or "?")
    jax_version = device.get("jax_version")
    total = device.get("total_bytes")
    where = (f"{count} x {kind}" if count > 1 else kind) + (f" with {format_bytes(total)}" if total else "")
    return where + (f", jax {jax_version}" if jax_version else "")


def _component_label(name: str, category: str) -> str:
    """What a component adds to its category's name: an argument's path (``state.params``), an
    estimate's basis (``estimate: one copy of the parameters``); empty when it adds nothing."""
    head, _, rest = name.partition(" (")
    if rest:
        return rest.rstrip(")")
    return "" if head == category else head


def _share(part: int, whole: int) -> str:
    """``12.3%``, or ``<0.1%`` for a part too small to show."""
    share = part / whole if whole else 0.0
    return "<0.1%" if 0 < share < 0.0005 else f"{share:.1%}"


def _byte_ticks(low: float, high: float, most: int = 7) -> list[float]:
    """Powers of two between ``low`` and ``high`` bytes, evenly spaced on a log axis, at most ``most``."""
    import math

    first, last = math.ceil(math.log2(max(low, 1))), math.floor(math.log2(max(high, 2)))
    step = next((k for k in (1, 2, 3, 4, 5, 10, 20) if (last - first) // k + 1 <= most), 30)
    start = -(-first // step) * step
    return [float(2**k) for k in range(start, last + 1, step)] or [float(2**first)]


def breakdown_figure(result: FitResult, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Draw a fit answer's peak by component (``jaxfit fit --plot``): a stacked bar of the peak,
    one segment per category of :data:`jaxfit.fit.breakdown.Category`, against the budget (a line),
    and below it each category's bytes and share on a log scale. Estimated entries (the split of
    what lies beyond the arguments, ``Component.exact`` false) are hatched and labelled "estimate".

    Args:
      result: The answer; its ``breakdown`` (the peak of ``batch_size`` by component). Without one
        (an answer from jaxfit 0.2's cache) the peak is drawn whole, not split.
      path: The file to write (``.png``, ``.svg`` or ``.pdf``).
      title: The figure's title; default: the workload, the batch and the machine.

    Returns:
      ``path``.

    Raises:
      ConfigError: matplotlib is missing, or ``path`` has another suffix or cannot be written.
    """
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    order = list(CATEGORY_COLORS)
    sizes: dict[str, int] = {}
    estimate: dict[str, bool] = {}
    names: dict[str, list[str]] = {}
    for c in result.breakdown:
        category = str(c["category"])
        sizes[category] = sizes.get(category, 0) + int(c["bytes"])
        estimate[category] = estimate.get(category, False) or not c["exact"]
        names.setdefault(category, []).append(_component_label(str(c["name"]), category))
    split = bool(sizes)
    if not split:
        sizes = {"peak (not split: the step's arguments were not reported)": result.peak_bytes}
        estimate = {next(iter(sizes)): False}
    categories = [k for k in order if k in sizes] + [k for k in sizes if k not in order]
    peak = result.peak_bytes
    budget = result.budget_bytes
    size, unit = _unit(max(peak, budget))

    fig = _figure(9.0, 5.2)
    top, bottom = fig.subplots(2, 1, height_ratios=[1.0, max(2.0, 0.55 * len(categories))])
    left = 0.0
    for category in categories:
        width = sizes[category] / size
        top.barh(
            0,
            width,
            left=left,
            height=0.6,
            color=CATEGORY_COLORS.get(category, "#bbbbbb"),
            hatch="//" if estimate[category] else None,
            edgecolor="white",
            linewidth=0.8,
        )
        if width >= 0.12 * max(peak, budget) / size:
            top.text(
                left + width / 2,
                0,
                f"{category}{' (estimate)' if estimate[category] else ''}\n{format_bytes(sizes[category])}",
                ha="center",
                va="center",
                fontsize=8,
                color="white",
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "#00000055", "edgecolor": "none"},
            )
        left += width
    top.axvline(budget / size, color="black", linestyle="--", linewidth=1.2)
    top.annotate(
        f"budget {format_bytes(budget)}",
        (budget / size, 0.42),
        xytext=(-4, 0),
        textcoords="offset points",
        ha="right",
        va="center",
        fontsize=8,
    )
    top.set_ylim(-0.55, 0.55)
    top.set_yticks([0])
    top.set_yticklabels([f"peak\n{format_bytes(peak)}"], fontsize=8)
    top.set_xlim(0, max(peak, budget) / size * 1.04)
    top.set_xlabel(f"bytes on one device ({unit})" if result.device_count <= 1 else f"bytes per device ({unit})")
    top.grid(True, axis="x", alpha=0.3)
    top.set_axisbelow(True)

    ys = list(range(len(categories)))
    for y, category in zip(ys, categories):
        bottom.barh(
            y,
            max(sizes[category], 1),
            height=0.62,
            color=CATEGORY_COLORS.get(category, "#bbbbbb"),
            hatch="//" if estimate[category] else None,
            edgecolor="white",
        )
    smallest = max(min(max(v, 1) for v in sizes.values()), 1)
    bottom.set_xscale("log")
    bottom.set_xlim(smallest / 4, max(peak, budget) * 2)
    bottom.xaxis.set_major_locator(FixedLocator(_byte_ticks(smallest / 4, max(peak, budget) * 2)))
    bottom.xaxis.set_minor_locator(NullLocator())
    bottom.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_bytes(v).replace(".00 ", " ")))
    bottom.set_yticks(ys)
    bottom.set_yticklabels(
        [
            category + (f"\n({', '.join(n for n in names[category] if n)})" if any(names.get(category, [])) else "")
            for category in categories
        ],
        fontsize=8,
    )
    bottom.invert_yaxis()
    bottom.set_xlabel("bytes (log scale)")
    bottom.grid(True, axis="x", alpha=0.3)
    bottom.set_axisbelow(True)
    right = bottom.twinx()
    right.set_ylim(bottom.get_ylim())
    right.set_yticks(ys)
    right.set_yticklabels(
        [
            f"{format_bytes(sizes[c])}  {_share(sizes[c], peak)}" + ("  estimate" if estimate[c] else "")
            for c in categories
        ],
        fontsize=8,
    )
    right.tick_params(length=0)

    workload = str(result.workload.get("name") or "workload")
    fig.suptitle(
        title
        or (
            f"{workload}: peak at batch {result.batch_size} by component, "
            f"{format_bytes(peak)} of a {format_bytes(budget)} budget (fraction {result.mem_fraction:g})\n"
            f"jaxfit fit on {_device_phrase(result.device, result.device_count)}; "
            "hatched: estimates (XLA gives the total beyond the arguments, not its split)"
        ),
        fontsize=9,
    )
    return _save(fig, path, "--plot")


def openpi_figure(cells: Sequence[OpenpiCell], path: str | os.PathLike[str], *, title: str = "") -> Path:
    """Draw the openpi table: configs (rows) by cards (columns), each cell its answered batch,
    coloured by what happened (:data:`OpenpiStatus`), with its note under it.

    Args:
      cells: The cells; rows and columns in the order they first appear. A config and card with
        no cell is left blank.
      path: The file to write (``.png``, ``.svg`` or ``.pdf``).
      title: The figure's title (name the machine and the fraction).

    Returns:
      ``path``.

    Raises:
      ConfigError: matplotlib is missing, or ``path`` has another suffix or cannot be written.
    """
    from matplotlib.patches import Patch, Rectangle

    configs = list(dict.fromkeys(c.config for c in cells))
    cards = list(dict.fromkeys(c.card for c in cells))
    at = {(c.config, c.card): c for c in cells}
    fig = _figure(max(6.0, 1.26 * len(cards) + 2.4), 0.78 * len(configs) + 1.6)
    ax: Axes = fig.subplots()
    for row, config in enumerate(configs):
        for column, card in enumerate(cards):
            cell = at.get((config, card))
            if cell is None:
                continue
            ax.add_patch(
                Rectangle(
                    (column, row),
                    1,
                    1,
                    facecolor=OPENPI_COLORS.get(cell.status, "#ffffff"),
                    edgecolor="white",
                    linewidth=2,
                )
            )
            if cell.batch is not None:
                ax.text(column + 0.5, row + 0.34, str(cell.batch), ha="center", va="center", fontsize=12, weight="bold")
                ax.text(column + 0.5, row + 0.72, cell.note, ha="center", va="center", fontsize=6.5)
            else:
                ax.text(
                    column + 0.5,
                    row + 0.5,
                    cell.status + (f"\n{cell.note}" if cell.note else ""),
                    ha="center",
                    va="center",
                    fontsize=6.5,
                )
    ax.set_xlim(0, len(cards))
    ax.set_ylim(len(configs), 0)
    ax.set_xticks([i + 0.5 for i in range(len(cards))])
    ax.set_xticklabels(cards, fontsize=9)
    ax.xaxis.tick_top()
    ax.set_yticks([i + 0.5 for i in range(len(configs))])
    ax.set_yticklabels(configs, fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    shown = [s for s in OPENPI_COLORS if any(c.status == s for c in cells)]
    fig.legend(
        handles=[Patch(facecolor=OPENPI_COLORS[s], label=OPENPI_LEGEND[s]) for s in shown],
        loc="outside lower center",
        ncol=2,
        fontsize=7.5,
        frameon=False,
    )
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path, "openpi figure")


def search_figure(rows: Sequence[SearchRow], path: str | os.PathLike[str], *, title: str = "") -> Path:
    """Draw jaxfit's fit against the trial search it replaces: per workload the wall time of the
    trial search, of jaxfit (cold) and of jaxfit answered from its cache (grouped bars, labelled
    in seconds, jaxfit's share of the trial time above its bar), the answers of both under it.

    Args:
      rows: The workloads, in the order drawn.
      path: The file to write (``.png``, ``.svg`` or ``.pdf``).
      title: The figure's title (name the machine).

    Returns:
      ``path``.

    Raises:
      ConfigError: matplotlib is missing, or ``path`` has another suffix or cannot be written.
    """
    from matplotlib.patches import Patch

    fig = _figure(max(6.5, 2.2 * len(rows) + 1.5), 4.8)
    ax: Axes = fig.subplots()
    width = 0.27
    colors = {"trial": "#9e9e9e", "jaxfit": "#1f77b4", "cached": "#9ecae1"}
    top = max([max(r.trial_seconds, r.jaxfit_seconds) for r in rows] or [1.0])
    for i, r in enumerate(rows):
        ax.bar(
            i - width,
            r.trial_seconds,
            width,
            color=colors["trial"],
            hatch="//" if r.trial_seconds_at_least else None,
            edgecolor="white",
        )
        trial_label = f"≥ {r.trial_seconds:.0f} s\n(cut)" if r.trial_seconds_at_least else f"{r.trial_seconds:.0f} s"
        ax.text(i - width, r.trial_seconds + top * 0.01, trial_label, ha="center", va="bottom", fontsize=7.5)
        ax.bar(i, r.jaxfit_seconds, width, color=colors["jaxfit"])
        share = r.jaxfit_seconds / r.trial_seconds if r.trial_seconds else 0.0
        ax.text(
            i,
            r.jaxfit_seconds + top * 0.01,
            f"{r.jaxfit_seconds:.0f} s\n{'≤ ' if r.trial_seconds_at_least else ''}{share:.3f}x",
            ha="center",
            va="bottom",
            fontsize=7.5,
        )
        if r.cached_seconds is not None:
            ax.bar(i + width, r.cached_seconds, width, color=colors["cached"])
            ax.text(
                i + width,
                r.cached_seconds + top * 0.01,
                f"{r.cached_seconds:.2f} s",
                ha="center",
                va="bottom",
                fontsize=7,
            )
    labels = []
    for r in rows:
        trial = str(r.trial_answer) if r.trial_answer is not None else "-"
        mine = str(r.jaxfit_answer) if r.jaxfit_answer is not None else "-"
        labels.append(f"{r.workload}\nanswer: trials {trial}, jaxfit {mine}" + (f"\n{r.note}" if r.note else ""))
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7.5)
    ax.set_ylabel("wall time (s)")
    ax.set_ylim(0, top * 1.18)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(
        handles=[
            Patch(facecolor=colors["trial"], label="trial search: a fresh process per batch, real steps"),
            Patch(facecolor=colors["jaxfit"], label="jaxfit fit, cold caches (share of the trial time)"),
            Patch(facecolor=colors["cached"], label="jaxfit fit again, from its cache"),
        ],
        fontsize=7.5,
        loc="upper right",
    )
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path, "search figure")


def tune_figure(
    points: Sequence[TunePoint],
    path: str | os.PathLike[str],
    *,
    budget_bytes: int | None = None,
    title: str = "",
) -> Path:
    """Draw a tune's speed against memory: samples/s against the proven peak of each setting
    (micro-batch x accumulation, one colour per setting), the budget as a vertical line and the
    winner marked. A point not measured sits on the x axis (x); one never compiled is left out.

    Args:
      points: The tune's rows.
      path: The file to write (``.png``, ``.svg`` or ``.pdf``).
      budget_bytes: The budget every row had to fit; ``None``: no line.
      title: The figure's title (name the machine and the workload).

    Returns:
      ``path``.

    Raises:
      ConfigError: matplotlib is missing, or ``path`` has another suffix or cannot be written.
    """
    from matplotlib.lines import Line2D

    drawn = [p for p in points if p.peak_bytes is not None]
    largest = max([p.peak_bytes or 0 for p in drawn] + [budget_bytes or 0] + [1])
    size, unit = _unit(largest)
    fig = _figure(8.0, 4.8)
    ax: Axes = fig.subplots()
    settings = list(dict.fromkeys(p.setting for p in points))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    fastest = max([p.samples_per_second or 0.0 for p in drawn] + [1.0])
    for k, setting in enumerate(settings):
        color = palette[k % len(palette)]
        mine = sorted((p for p in drawn if p.setting == setting), key=lambda p: p.peak_bytes or 0)
        ran = [p for p in mine if p.samples_per_second]
        ax.plot(
            [(p.peak_bytes or 0) / size for p in ran],
            [p.samples_per_second or 0.0 for p in ran],
            color=color,
            alpha=0.35,
            linewidth=1,
        )
        for p in ran:
            measured = p.status == "measured"
            ax.scatter(
                (p.peak_bytes or 0) / size,
                p.samples_per_second or 0.0,
                s=46,
                color=color if measured else "white",
                edgecolors=color,
                linewidths=1.5,
                zorder=3,
            )
            ax.annotate(
                f"{p.micro_batch} x {p.accum_steps}",
                ((p.peak_bytes or 0) / size, p.samples_per_second or 0.0),
                xytext=(0, -13),
                textcoords="offset points",
                ha="center",
                fontsize=7.5,
                color=color,
            )
        failed = [p for p in mine if not p.samples_per_second]
        if failed:
            ax.scatter([(p.peak_bytes or 0) / size for p in failed], [0] * len(failed), marker="x", color=color)
    winners = [p for p in drawn if p.winner and p.samples_per_second]
    for p in winners:
        ax.scatter(
            (p.peak_bytes or 0) / size,
            p.samples_per_second or 0.0,
            s=260,
            marker="*",
            color="gold",
            edgecolors="black",
            linewidths=0.8,
            zorder=4,
        )
        ax.annotate(
            f"winner: {p.setting} {p.micro_batch} x {p.accum_steps}\n"
            f"{p.samples_per_second:.1f} samples/s, peak {format_bytes(p.peak_bytes)}",
            ((p.peak_bytes or 0) / size, p.samples_per_second or 0.0),
            xytext=(-12, 10),
            textcoords="offset points",
            ha="right",
            fontsize=8,
        )
    if budget_bytes:
        ax.axvline(budget_bytes / size, color="black", linestyle="--", linewidth=1.2)
        ax.annotate(
            f"budget\n{format_bytes(budget_bytes)}",
            (budget_bytes / size, fastest * 0.08),
            xytext=(-4, 0),
            textcoords="offset points",
            ha="right",
            fontsize=8,
        )
    ax.set_xlim(0, largest / size * 1.08)
    ax.set_ylim(0, fastest * 1.18)
    ax.set_xlabel(f"proven peak ({unit})")
    ax.set_ylabel("samples / s")
    ax.grid(True, alpha=0.3)
    handles = [
        Line2D([], [], marker="o", linestyle="", color=palette[k % len(palette)], label=s)
        for k, s in enumerate(settings)
    ]
    for status in dict.fromkeys(p.status for p in drawn if p.status != "measured" and p.samples_per_second):
        label = "dropped: clearly slower after a short look" if status == "dropped" else status
        handles.append(Line2D([], [], marker="o", linestyle="", color="gray", markerfacecolor="white", label=label))
    ax.legend(handles=handles, fontsize=8, loc="lower left", title="setting (label: micro x accum)", title_fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path, "tune figure")
