"""Weights & Biases: log a fit as its own run (settings in the config, candidates as a table)."""

from __future__ import annotations

import netrc
import os
from typing import Any, Literal, cast

from jaxfit.fit.results import FitResult

CANDIDATE_COLUMNS: list[str | int] = [
    "batch_size",
    "mem_fraction",
    "limit_bytes",
    "argument_bytes",
    "temp_bytes",
    "output_bytes",
    "alias_bytes",
    "peak_bytes",
    "fits",
    "autotuned",
    "cached",
    "compile_seconds",
]


def has_credentials() -> bool:
    """Whether a W&B API key is configured (environment or ~/.netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


WandbMode = Literal["online", "offline", "disabled"]


def resolve_mode(requested: str | None) -> WandbMode:
    """The wandb mode: as requested, else $WANDB_MODE, else online with credentials, offline without."""
    mode = requested or os.environ.get("WANDB_MODE") or ("online" if has_credentials() else "offline")
    if mode not in ("online", "offline", "disabled"):  # wandb also knows "dryrun", "run": as it reads them
        mode = "offline" if mode == "dryrun" else "online"
    return cast(WandbMode, mode)


def fit_config(result: FitResult) -> dict[str, Any]:
    """The scalar settings of a fit, as they appear in the run's config."""
    return {
        "mode": result.mode,
        "batch_size": result.batch_size,
        "mem_fraction": result.mem_fraction,
        "multiple_of": result.multiple_of,
        "budget_bytes": result.budget_bytes,
        "limit_bytes": result.limit_bytes,
        "headroom_bytes": result.headroom_bytes,
        "peak_bytes": result.peak_bytes,
        "outcome": result.outcome,
        "device": result.device.get("device_kind"),
        "platform": result.device.get("platform"),
        "jax_version": result.device.get("jax_version"),
        "jaxfit_version": result.jaxfit_version,
        "workload": result.workload.get("name"),
        "process_overhead_bytes": result.process_overhead_bytes,
        "compiles": result.compiles,
        "rounds": result.rounds,
        "wall_seconds": result.wall_seconds,
    }


def log_fit(result: FitResult, *, mode: str | None = None, project: str = "jaxfit", name: str | None = None) -> str:
    """Log ``result`` as a W&B run of job type ``jaxfit-fit``; returns where it went (URL or folder)."""
    import wandb

    run = wandb.init(
        project=project,
        name=name or f"fit-{result.workload.get('name', 'workload')}",
        job_type="jaxfit-fit",
        config={"jaxfit": fit_config(result)},
        mode=resolve_mode(mode),
        reinit="finish_previous",
    )
    table = wandb.Table(
        columns=CANDIDATE_COLUMNS, data=[[getattr(c, str(col)) for col in CANDIDATE_COLUMNS] for c in result.candidates]
    )
    run.log({"candidates": table})
    run.summary.update(
        {"batch_size": result.batch_size, "mem_fraction": result.mem_fraction, "peak_bytes": result.peak_bytes}
    )
    where = run.url or run.dir
    run.finish()
    return str(where)
