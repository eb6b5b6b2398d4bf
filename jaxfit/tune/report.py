"""Showing a tune: the ranked table for people, a PNG of samples/s against micro-batch, wandb."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from jaxfit.fit.budget import format_bytes
from jaxfit.tune.engine import TuneResult


def tune_table(result: TuneResult) -> Table:
    """Every candidate, the fastest measured first."""
    table = Table(title=f"tune: {result.workload} at fraction {result.mem_fraction:g}", title_justify="left")
    for column, justify in (
        ("#", "right"),
        ("setting", "left"),
        ("micro x accum", "right"),
        ("peak", "right"),
        ("headroom", "right"),
        ("step s", "right"),
        ("samples/s", "right"),
        ("MFU", "right"),
        ("between steps s", "right"),
        ("input alone /s", "right"),
        ("limited by", "left"),
        ("input needed /s", "right"),
        ("status", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for i, r in enumerate(result.rows, 1):
        table.add_row(
            str(i) if r.samples_per_second else "",
            r.setting,
            f"{r.micro_batch} x {r.accum_steps}",
            format_bytes(r.peak_bytes),
            format_bytes(r.headroom_bytes),
            f"{r.step_seconds:.4f}" if r.step_seconds else "-",
            f"{r.samples_per_second:.1f}" if r.samples_per_second else "-",
            f"{r.mfu:.1%}" if r.mfu is not None else "-",
            f"{r.outside_step_seconds:.4f}" if r.outside_step_seconds is not None else "-",
            f"{r.input_samples_per_second:.1f}" if r.input_samples_per_second else "-",
            r.limited_by or "-",
            format_bytes(r.input_bytes_per_second) if r.input_bytes_per_second else "-",
            r.status + (" (cached)" if r.cached else "") + (f": {r.note}" if r.note and r.status != "measured" else ""),
        )
    return table


def draw(result: TuneResult, path: str | Path) -> Path:
    """The tune's speed-vs-memory picture (``--png``): samples/s against each row's proven peak,
    one colour per setting, the budget as a line and the winner marked (:func:`jaxfit.figures.tune_figure`)."""
    from jaxfit.figures import TunePoint, tune_figure

    points = [
        TunePoint(
            setting=r.setting,
            micro_batch=r.micro_batch,
            accum_steps=r.accum_steps,
            peak_bytes=r.peak_bytes,
            samples_per_second=r.samples_per_second,
            status=r.status,
            winner=r is result.best,
        )
        for r in result.rows
    ]
    budget = next((r.budget_bytes for r in result.rows if r.budget_bytes), None)
    device = result.device.get("device_kind") or result.device.get("platform") or "this machine"
    title = (
        f"jaxfit tune of {result.workload}: samples/s against the proven peak\n"
        f"fraction {result.mem_fraction:g}, budget {format_bytes(budget)}, on {device}"
    )
    return tune_figure(points, path, budget_bytes=budget, title=title)


COLUMNS = [
    "setting",
    "micro_batch",
    "accum_steps",
    "global_batch",
    "peak_bytes",
    "fits",
    "status",
    "step_seconds",
    "samples_per_second",
    "mfu",
    "outside_step_seconds",
    "input_samples_per_second",
    "limited_by",
    "input_bytes_per_second",
]


def log_tune(result: TuneResult, *, mode: str | None = None, project: str = "jaxfit") -> str:
    """Log ``result`` as a W&B run (job type ``jaxfit-tune``) with a ``wandb.Table`` of the rows."""
    import wandb

    from jaxfit.run.tracking import resolve_mode

    best: dict[str, Any] = result.best.to_dict() if result.best else {}
    run = wandb.init(
        project=project,
        name=f"tune-{Path(result.workload).name}",
        job_type="jaxfit-tune",
        config={
            "jaxfit": {"mem_fraction": result.mem_fraction, "best": best, "device": result.device.get("device_kind")}
        },
        mode=resolve_mode(mode),
        reinit="finish_previous",
    )
    table = wandb.Table(columns=list(COLUMNS), data=[[getattr(r, c) for c in COLUMNS] for r in result.rows])
    run.log({"candidates": table})
    run.summary.update({k: best.get(k) for k in ("samples_per_second", "mfu", "micro_batch", "accum_steps")})
    where = run.url or run.dir
    run.finish()
    return str(where)
