"""A smaller card planned with --device-memory on a larger GPU: the run gets that card's limit."""

from __future__ import annotations

import json

from helpers import REPO

from jaxfit.fit import FitOptions, FitResult
from jaxfit.run.launch import _plan

GIB = 1 << 30
H100_TOTAL = 81559 << 20  # nvidia-smi's memory.total of an H100 80GB HBM3


def _openpi_lora_48() -> FitResult:
    """The committed fit of openpi's LoRA config for a 48 GiB card, made on an H100, with the GPU's
    own total (what fits now record) added."""
    path = REPO / "benchmarks/results/h100/openpi/pi0_libero_low_mem_finetune-48GiB.json"
    data = json.loads(path.read_text())
    data["device"]["gpu_total_bytes"] = H100_TOTAL
    return FitResult.from_dict(data)


def test_process_fraction_gives_the_planned_cards_limit() -> None:
    fit = _openpi_lora_48()
    assert fit.mem_fraction == 0.9 and fit.device["total_bytes"] == 48 * GIB
    here = fit.process_fraction
    assert 0.54 < here < 0.56  # 0.9 x 48 GiB / 79.65 GiB
    assert abs(here * H100_TOTAL - 0.9 * 48 * GIB) < 1 << 20
    # the line for the user's own 48 GiB card keeps the card's fraction
    assert fit.run_env()["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9"


def test_process_fraction_is_the_fraction_on_the_card_itself() -> None:
    fit = _openpi_lora_48()
    same = FitResult.from_dict({**fit.to_dict(), "device": {**fit.device, "gpu_total_bytes": 48 * GIB}})
    assert same.process_fraction == 0.9
    cpu = FitResult.from_dict({**fit.to_dict(), "device": {**fit.device, "gpu_total_bytes": None}})
    assert cpu.process_fraction == 0.9


def test_run_plan_runs_under_the_emulated_cards_limit() -> None:
    fit = _openpi_lora_48()
    plan = _plan(["python", "train.py", "--batch-size=118"], 0.9, 118, fit, FitOptions(), "--grad-accum-steps")
    assert plan.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == f"{fit.process_fraction:g}"
    assert plan.mem_fraction == fit.process_fraction
    assert plan.settings["card_mem_fraction"] == 0.9
    assert "of the planned card" in plan.summary()
