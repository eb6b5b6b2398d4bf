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
    """Samples/s against micro-batch, one line per setting; candidates that do not fit marked x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    settings = list(dict.fromkeys(r.setting for r in result.rows))
    for name in settings:
        mine = sorted((r for r in result.rows if r.setting == name), key=lambda r: r.micro_batch)
        ran = [r for r in mine if r.samples_per_second]
        if ran:
            ax.plot([r.micro_batch for r in ran], [r.samples_per_second or 0.0 for r in ran], marker="o", label=name)
        failed = [r for r in mine if not r.fits or r.status == "out of memory"]
        if failed:
            ax.scatter([r.micro_batch for r in failed], [0] * len(failed), marker="x", color="red")
    if result.best is not None:
        ax.annotate(
            "best",
            (result.best.micro_batch, result.best.samples_per_second or 0),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
        )
    budget = next((r.budget_bytes for r in result.rows if r.budget_bytes), None)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batch (x: does not fit the budget)")
    ax.set_ylabel("samples / s")
    ax.set_title(f"{result.workload}: budget {format_bytes(budget)} (fraction {result.mem_fraction:g})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


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
