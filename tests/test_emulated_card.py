"""A smaller card planned with --device-memory on a larger GPU: the run gets that card's limit."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO

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


def test_a_run_at_the_fits_max_batch_says_larger_batches_were_not_tried() -> None:
    """pi0 with --fsdp-devices 4 on four H200s: the cell asked for 732 and 736 only, both fit, and
    the run's line said "batch 736 (fitted, ...)" as if 736 were the largest that fits."""
    path = REPO / "benchmarks/results/h200x4/openpi/call8/pi0_libero-80GiB-gpu0123-run.json"
    fit = FitResult.from_dict(json.loads(path.read_text())["fit"])
    assert fit.outcome == "max" and fit.batch_size == 736
    plan = _plan(["python", "train.py", "--batch-size=736"], 0.9, 736, fit, FitOptions(), "--grad-accum-steps")
    assert "batch 736 (fitted: --max-batch, larger batches were not tried" in plan.summary()
    bounded = FitResult.from_dict({**fit.to_dict(), "outcome": "boundary"})
    plan = _plan(["python", "train.py", "--batch-size=736"], 0.9, 736, bounded, FitOptions(), "--grad-accum-steps")
    assert "batch 736 (fitted, predicted peak" in plan.summary()
    # a fit of the one batch asked for (a --global-batch run's) searched no window: no --max-batch
    only = [c for c in fit.to_dict()["candidates"] if c["batch_size"] == 736]
    single = FitResult.from_dict({**fit.to_dict(), "candidates": only})
    assert single.outcome == "max" and not single.stopped_at_max_batch
    plan = _plan(["python", "train.py", "--batch-size=736"], 0.9, 736, single, FitOptions(), "--grad-accum-steps")
    assert "batch 736 (fitted, predicted peak" in plan.summary()


H100_CUDA_TOTAL = 85_018_542_080  # what JAX's allocator counts on an H100 80GB HBM3 (79.18 GiB)


def test_a_card_a_little_larger_than_the_gpu_runs_under_that_cards_limit() -> None:
    """An 80 GiB card planned on an H100 (79.18 GiB as JAX counts it): the fit compiled under 0.9 x
    80 GiB = 72.00 GiB, so the run gets 72.00 GiB (0.909 of the H100), not 0.9 of the H100 (71.26
    GiB): under that, pi0-FAST's and pi0.5's proven programs (71.54 and 71.99 GiB) ran out of
    memory in their first step on four H100s."""
    path = REPO / "benchmarks/results/h100x4/openpi/call3/pi05_libero-80GiB-gpu1-run.json"
    fit = FitResult.from_dict(json.loads(path.read_text())["fit"])
    assert fit.device["total_bytes"] == 80 * GIB and fit.device["gpu_total_bytes"] == H100_CUDA_TOTAL
    here = fit.process_fraction
    assert here > 0.9 and abs(here * H100_CUDA_TOTAL - 0.9 * 80 * GIB) < 1 << 20
    assert fit.peak_bytes <= here * H100_CUDA_TOTAL  # the proven program fits the pool it gets
    plan = _plan(["python", "train.py", "--batch-size=40"], 0.9, 40, fit, FitOptions(), "--grad-accum-steps")
    assert plan.mem_fraction == here and plan.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == f"{here:g}"


def test_a_plain_run_on_a_card_of_another_size_gets_that_cards_limit_or_one_line(monkeypatch) -> None:
    """``jaxfit run --batch-size N --device-memory CARD``: nothing fitted, the same rule: the limit of
    that card, as long as this GPU holds it."""
    from jaxfit.errors import ConfigError

    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(H100_CUDA_TOTAL))
    command = ["python", "train.py", "--batch-size=41"]
    larger = _plan(command, 0.9, 41, None, FitOptions(device_memory_bytes=80 * GIB), "--grad-accum-steps")
    assert abs(larger.mem_fraction * H100_CUDA_TOTAL - 0.9 * 80 * GIB) < 1 << 20
    smaller = _plan(command, 0.9, 41, None, FitOptions(device_memory_bytes=48 * GIB), "--grad-accum-steps")
    assert 0.54 < smaller.mem_fraction < 0.56
    with pytest.raises(ConfigError, match=r"--device-memory 96.00 GiB at fraction 0.9 needs more than this GPU's"):
        _plan(command, 0.9, 41, None, FitOptions(device_memory_bytes=96 * GIB), "--grad-accum-steps")


@pytest.mark.slow
def test_a_proven_program_is_not_started_in_a_pool_smaller_than_its_peak(tmp_path, run_cli, monkeypatch) -> None:
    """On an emulated 64 MiB GPU: ``jaxfit run`` of a 70 MiB card at 0.9 (a card a little larger
    than the GPU) runs the proven program under that card's limit; the same pinned program started
    by hand under a smaller fraction (a pasted line, an edited fraction) is stopped before its
    first step with one line, instead of running out of memory in it."""
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(64 << 20))
    command = [sys.executable, str(FIXTURES / "shaped_train.py"), "--steps", "2"]
    proc = run_cli(
        "run", "--device-memory", "70MiB", "--mem-fraction", "0.9", "--json", "plan.json", "--wandb-mode",
        "disabled", "--", *command,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["mem_fraction"] == 0.984375  # 0.9 x 70 / 64
    assert plan["run"]["program_pinned"] is True, plan["run"]

    fit = plan["fit"]
    low = 0.5 * fit["peak_bytes"] / (64 << 20)  # a pool of half the proven peak
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXFIT_")}
    env.update(fit["env"], XLA_PYTHON_CLIENT_MEM_FRACTION=f"{low:.4f}", JAXFIT_EMULATE_GPU_TOTAL=str(64 << 20))
    env["JAXFIT_PIN_REPORT"] = str(tmp_path / "report.json")
    by_hand = subprocess.run(
        [*command, f"--batch-size={fit['batch_size']}"], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=300,
    )  # fmt: skip
    assert by_hand.returncode == 76, by_hand.stderr[-3000:]
    lines = [line for line in by_hand.stderr.splitlines() if line.startswith("jaxfit: error:")]
    assert len(lines) == 1 and "smaller than the proven program's peak" in lines[0], by_hand.stderr[-2000:]
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.984375 on this GPU" in lines[0]
    # the loop's next batch is part of what the pool must hold (the step donates its state)
    pinned = json.loads(Path(fit["pin"]["path"]).read_text())
    assert pinned["next_input_bytes"] > 0 and "and its next batch of" in lines[0], lines[0]
    assert "Traceback" not in by_hand.stderr and "step 0" not in by_hand.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["stopped"] is True and report["stopped_for"] == "cap" and report["program_pinned"] is False


@pytest.mark.slow  # real compiles
def test_the_smallest_fraction_of_a_card_a_little_larger_than_the_gpu_is_searched_up_to_what_the_gpu_holds(
    monkeypatch,
) -> None:
    """``fit --batch-size N --device-memory CARD`` for a card larger than this GPU used to be refused;
    now the fractions of the card the GPU can give are searched (0.88 of a 9 MiB card on an 8 MiB
    GPU), and a batch that needs more says so in one error."""
    import jaxfit

    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(8 << 20))
    options = FitOptions(device_memory_bytes=9 << 20, use_cache=False)
    found = jaxfit.fit_fraction(jaxfit.example_source("mlp-tiny"), 1024, options)
    assert found.limit_bytes == int(found.mem_fraction * (9 << 20)) and found.peak_bytes <= found.budget_bytes
    assert found.process_fraction == float(f"{found.mem_fraction * 9 / 8:.6g}")  # that limit, on this GPU
    with pytest.raises(
        jaxfit.DoesNotFitError, match=r"does not fit even fraction 0.88 of the card .* the most this GPU"
    ):
        jaxfit.fit_fraction(jaxfit.example_source("mlp-tiny"), 2048, options)


@pytest.mark.slow  # real compiles
def test_on_a_gpu_an_answer_leaves_room_for_the_loops_next_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """openpi's train.py dispatches step N, then fetches batch N + 1 onto the device while the step
    runs. pi0.5 at batch 40 (peak 71.99 GiB of 72.00, 6.5 MB to spare, 72.3 MB of inputs a batch)
    ran two steps on an H200 and ran out of memory in the third. On a GPU (emulated here: real CPU
    compiles) a batch fits when its peak and its next batch fit the budget: with the budget set
    between batch 8's peak and that sum, 8 is refused and the message says why."""
    import jaxfit
    from jaxfit.errors import DoesNotFitError
    from jaxfit.fit.sources import example_source

    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(2_000_000_000))
    source = example_source("gpt-tiny", {"n_layers": "1"})
    exact = FitOptions(mem_fraction=0.5, min_batch=8, max_batch=8, use_cache=False, pin=False)
    first = jaxfit.fit_batch(source, exact)
    eight = next(c for c in first.candidates if c.batch_size == 8 and c.autotuned)
    assert eight.next_input_bytes == 8 * 257 * 4  # the tokens of a batch: the inputs it does not donate
    assert eight.peak_bytes is not None and eight.fits
    headroom = first.limit_bytes - (eight.peak_bytes + eight.next_input_bytes // 2)
    squeezed = dataclasses.replace(exact, headroom_bytes=headroom)
    assert eight.peak_bytes <= first.limit_bytes - headroom  # the step alone would fit
    with pytest.raises(DoesNotFitError, match=r"283\.98 MiB \+ 8\.03 KiB for the next batch"):
        jaxfit.fit_batch(source, squeezed)
    answer = jaxfit.fit_batch(source, dataclasses.replace(squeezed, min_batch=1))
    assert answer.batch_size == 7
    assert "batch 8 needs" in answer.message and "for the next batch" in answer.message
