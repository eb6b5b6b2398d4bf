"""``jaxfit plan --script``: an unmodified script planned per card x device count x FSDP size, each
cell a real probe of the script with its devices (host devices here) and its FSDP flag."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import FIXTURES, REPO, error_line, processes_with

from jaxfit.fit.mesh import MeshSpec
from jaxfit.fit.sources import script_source
from jaxfit.plan.script import CellUnavailable, deviceless_environment, script_meshes, source_for_mesh
from jaxfit.plan.whatif import Card, what_if

TRAIN = str(REPO / "scripts" / "train.py")
SHAPED = str(FIXTURES / "shaped_train.py")
DEBUG = [sys.executable, TRAIN, "debug", "--exp-name=plan"]


def test_script_meshes_and_the_environment_of_each_cell(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    source = script_source([*DEBUG, "--fsdp-devices=2"])
    # without --fsdp: the command's own FSDP size, on the counts it divides
    assert script_meshes(source, [1, 2, 4], None, "--fsdp-devices") == [MeshSpec(2, 2), MeshSpec(4, 2)]
    assert script_meshes(source, [4], [1, 4], "--fsdp-devices") == [MeshSpec(4, 1), MeshSpec(4, 4)]
    cell = source_for_mesh(source, MeshSpec(4, 4), "--fsdp-devices", set_fsdp=True)
    assert cell.run_command[-1] == "--fsdp-devices=4" and "--fsdp-devices=2" not in cell.run_command
    assert dict(cell.env)["XLA_FLAGS"].endswith("--xla_force_host_platform_device_count=4")
    assert cell.identity() != source_for_mesh(source, MeshSpec(2, 2), "--fsdp-devices", True).identity()
    with pytest.raises(Exception, match="divides none of --devices 1 3"):
        script_meshes(source, [1, 3], None, "--fsdp-devices")
    with pytest.raises(Exception, match="--fsdp-flag 'fsdp' must be a flag name"):
        script_meshes(source, [1], None, "fsdp")


def test_a_gpu_model_cell_runs_the_script_on_host_devices(monkeypatch):
    """A cell for a GPU model that is not here: one device is the command as ``fit --script --gpu``
    probes it (the same cached question); N devices are N host devices on the CPU, GPUs here or not."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    source = script_source(DEBUG)
    one = source_for_mesh(source, MeshSpec(1, 1), "--fsdp-devices", set_fsdp=False, deviceless=True)
    assert one == source and one.identity() == source.identity()
    two = source_for_mesh(source, MeshSpec(2, 2), "--fsdp-devices", set_fsdp=True, deviceless=True)
    assert dict(two.env) == {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    assert two.run_command[-1] == "--fsdp-devices=2"
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4")
    assert deviceless_environment(1)["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=1"


def test_a_plan_whose_cells_are_all_unavailable_has_nothing_computed():
    def unavailable(mesh: MeshSpec):
        raise CellUnavailable(f"{mesh.devices} GPUs: this machine shows 1")

    result = what_if(unavailable, [Card("A", 2**30)], [MeshSpec(2, 1)])
    assert not result.computed and result.cells[0].status == "not available"
    assert result.cells[0].note == "2 GPUs: this machine shows 1"


@pytest.mark.slow
def test_plan_script_writes_table_json_and_markdown_and_agrees_with_fit(run_cli, tmp_path, isolated_cache):
    out, page = tmp_path / "plan.json", tmp_path / "HARDWARE.md"
    proc = run_cli(
        "plan", "--script", "--no-default-cards", "--card", "small=4MiB",
        "--devices", "1", "2", "--max-batch", "64", "--json", str(out), "--markdown", str(page),
        "--", *DEBUG,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    cells = {(c["card"], c["devices"]): c for c in data["cells"]}
    # (one card: two cards of a plan are tested on a built-in example, tests/test_plan.py)
    assert set(cells) == {("small", 1), ("small", 2)}
    small, small2 = cells[("small", 1)], cells[("small", 2)]
    assert small["status"] == "cpu" and small["peak_bytes"] <= small["budget_bytes"] == int(0.45 * 4 * 2**20)
    assert small2["batch_size"] % 2 == 0 and small2["batch_size"] >= small["batch_size"]
    assert small["breakdown"]["parameters"] > 0 and small["breakdown"]["optimizer state"] > 0
    assert small["fraction_batch"] is None and "## Smallest fraction" not in page.read_text()  # no --batch-size
    assert data["step"]["name"] == "train_step" and "small" in proc.stdout
    text = page.read_text()
    assert text.startswith("# Hardware requirements: `") and "scripts/train.py debug" in text
    assert "| small (4.00 MiB) |" in text and f"**{small['batch_size']}" in text and "## Reproduce" in text
    assert "Compiled for CPU devices" in text and "train step `train_step`" in text
    # the same card, fitted alone, gives the same answer
    fit = tmp_path / "fit.json"
    alone = run_cli("fit", "--script", "--device-memory", "4MiB", "--max-batch", "64", "--json", str(fit), "--", *DEBUG)
    assert alone.returncode == 0, alone.stderr
    assert json.loads(fit.read_text())["batch_size"] == small["batch_size"]


@pytest.mark.slow
def test_plan_script_gives_the_smallest_fraction_of_each_cell_for_a_batch(run_cli, tmp_path, isolated_cache):
    """--batch-size 8: each cell also says the smallest fraction of its card that holds batch 8 (a
    second probe of the script, under that fraction), in the JSON and in a section of the page."""
    out, page = tmp_path / "plan.json", tmp_path / "HW.md"
    proc = run_cli(
        "plan", "--script", "--no-default-cards", "--card", "c=1MiB", "--max-batch", "32", "--batch-size", "8",
        "--batch-flag", "--bs", "--json", str(out), "--markdown", str(page), "--", sys.executable, SHAPED,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["fraction_batch"] == 8 and 0 < cell["fraction"] <= 1, cell
    assert f"batch 8 needs fraction {cell['fraction']:g}" in " ".join(proc.stderr.split())
    text = page.read_text()
    assert "## Smallest fraction for batch 8" in text and f"| c | {cell['fraction']:g} |" in text


@pytest.mark.slow
def test_plan_script_on_an_openpi_shaped_script(run_cli, tmp_path, isolated_cache):
    """Type-checked state and step, spawned data-loader workers, --bs as the batch flag."""
    page = tmp_path / "HW.md"
    proc = run_cli(
        "plan", "--script", "--no-default-cards", "--card", "c=64MiB", "--max-batch", "32", "--batch-flag", "--bs",
        "--markdown", str(page), "--quiet", "--", sys.executable, SHAPED, "--typecheck", "--workers", "spawn",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "### c, 1 device: fits batch" in page.read_text()


@pytest.mark.slow
def test_a_plan_with_no_cell_computable_here_is_one_line(run_cli, tmp_path, monkeypatch, isolated_cache):
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(2**30))  # behave as a 1 GiB GPU
    page = tmp_path / "HW.md"
    proc = run_cli(
        "plan", "--script", "--no-default-cards", "--card", "huge=8GiB", "--markdown", str(page), "--quiet",
        "--", sys.executable, SHAPED,
    )  # fmt: skip
    assert proc.returncode == 2 and error_line(proc).startswith(
        "jaxfit: error: no cell of the plan can be computed here"
    )
    assert not page.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,message",
    [
        (["--card", "A=lots"], "--card 'A=lots'"),
        (["--card", "A=1GiB", "--card", "A=2GiB"], "--card A is given twice"),
        (["--fsdp-flag", "fsdp", "--fsdp", "1"], "--fsdp-flag 'fsdp' must be a flag name"),
        (["--batch-size", "0"], "--batch-size 0 must be at least 1"),
        (["--example", "mlp"], "give one of --example, --entry or --script"),
        (["--gpu", "gtx-980"], "--gpu 'gtx-980' is no model jaxfit knows"),
        (["--gpu-spec", "missing.txtpb"], "--gpu-spec missing.txtpb: cannot read it"),
    ],
)
def test_bad_script_plans_are_one_line(run_cli, args, message):
    proc = run_cli("plan", "--script", *args, "--", sys.executable, SHAPED)
    assert proc.returncode == 2 and message in error_line(proc), proc.stderr


MINI = [sys.executable, str(FIXTURES / "mini_train.py"), "--steps", "1"]
# A tiny share of each card and a coarse grid: a boundary in one or two rounds of compiles.
TINY = ["--mem-fraction", "0.00025", "--min-batch", "2048", "--max-batch", "6144", "--multiple-of", "2048"]


@pytest.mark.slow
def test_plan_script_for_gpu_models_gives_what_fit_script_gpu_gives(run_cli, tmp_path, isolated_cache):
    """``plan --script --gpu A --gpu B``: a card column per GPU model, each cell a deviceless
    estimate (safe and squeezed, never pinned) that is ``fit --script --gpu``'s own answer: fit's
    answer is the plan's cell, and the plan's cell is what fit answers after it; a repeat is cached."""
    fit_a = run_cli("fit", "--script", "--gpu", "rtx-4090", *TINY, "--json", "a.json", "--", *MINI)
    assert fit_a.returncode == 0, fit_a.stderr[-3000:]
    # the script starts once: the safe search compiles in the squeezed search's probe
    assert " ".join(fit_a.stderr.split()).count("in the probe already started (no new start-up)") == 1
    plan = run_cli(
        "plan", "--script", "--gpu", "rtx-4090", "--gpu", "rtx-a6000", *TINY,
        "--json", "plan.json", "--markdown", "hw.md", "--", *MINI,
    )  # fmt: skip
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert " ".join(plan.stderr.split()).count("in the probe already started (no new start-up)") == 1  # the A6000
    fit_b = run_cli("fit", "--script", "--gpu", "rtx-a6000", *TINY, "--json", "b.json", "--", *MINI)
    assert fit_b.returncode == 0, fit_b.stderr[-3000:]
    data = json.loads((tmp_path / "plan.json").read_text())
    cells = {c["card"]: c for c in data["cells"]}
    assert list(cells) == ["rtx-4090", "rtx-a6000"] and {(c["devices"], c["fsdp"]) for c in cells.values()} == {(1, 1)}
    assert data["device_kind"] == "this machine's CPU (deviceless)"
    for name, fitted in (("rtx-4090", "a.json"), ("rtx-a6000", "b.json")):
        cell, fit = cells[name], json.loads((tmp_path / fitted).read_text())
        assert cell["status"] == "estimate" and fit["estimate"] is True and fit["safe"]["pin"] is None
        assert (cell["batch_size"], cell["squeezed_batch_size"], cell["peak_bytes"], cell["note"]) == (
            fit["batch_size"], fit["squeezed_batch_size"], fit["safe"]["peak_bytes"], fit["summary"],
        ), name  # fmt: skip
        assert cell["budget_bytes"] == fit["safe"]["limit_bytes"] and cell["outcome"] == "boundary"
        assert "An estimate of an untuned program" in cell["note"]
    # the same question both ways: the plan reads fit's answer, and fit then reads the plan's
    assert cells["rtx-4090"]["cached"] is True and cells["rtx-a6000"]["cached"] is False
    fitted_a, fitted_b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert not fitted_a["safe"]["cached"] and fitted_b["safe"]["cached"] and fitted_b["squeezed"]["cached"]
    assert cells["rtx-a6000"]["batch_size"] > cells["rtx-4090"]["batch_size"]  # twice the memory
    out = " ".join(plan.stdout.split())
    assert out.count("(est.)") >= 4 and f"rtx-4090 x 1 (safe {cells['rtx-4090']['batch_size']}, squeezed" in out
    page = (tmp_path / "hw.md").read_text()
    assert "**Estimates for GPU models that were not here**" in page and "| rtx-a6000 (" in page
    assert not list(isolated_cache.parent.rglob("pin.json"))  # estimates are never pinned
    again = run_cli(
        "plan", "--script", "--gpu", "rtx-4090", "--gpu", "rtx-a6000", *TINY, "--json", "again.json", "--quiet",
        "--", *MINI,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    repeat = json.loads((tmp_path / "again.json").read_text())
    assert all(c["cached"] for c in repeat["cells"]) and [c["batch_size"] for c in repeat["cells"]] == [
        c["batch_size"] for c in data["cells"]
    ]
    assert repeat["wall_seconds"] < cells["rtx-a6000"]["seconds"] / 3


@pytest.mark.slow
def test_a_plan_for_two_gpu_models_starts_the_script_once(run_cli, tmp_path, isolated_cache):
    """Two GPU models, nothing cached: four deviceless searches (safe and squeezed for each model)
    in one probe, switched from card to card: the script's start-up runs once, and each cell's
    answer is the one its own ``fit --script --gpu`` gives (here the A6000's, after the plan, from
    the cache the plan filled; its safe program's peak equal to the byte)."""
    plan = run_cli(
        "plan", "--script", "--gpu", "rtx-4090", "--gpu", "rtx-a6000", *TINY, "--json", "plan.json", "--", *MINI,
    )  # fmt: skip
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert " ".join(plan.stderr.split()).count("in the probe already started (no new start-up)") == 3
    cells = {c["card"]: c for c in json.loads((tmp_path / "plan.json").read_text())["cells"]}
    assert all(c["status"] == "estimate" and not c["cached"] for c in cells.values())
    assert cells["rtx-a6000"]["batch_size"] > cells["rtx-4090"]["batch_size"]
    fresh = run_cli("fit", "--script", "--gpu", "rtx-a6000", *TINY, "--no-cache", "--json", "b.json", "--", *MINI)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    alone = json.loads((tmp_path / "b.json").read_text())
    assert (alone["batch_size"], alone["squeezed_batch_size"], alone["safe"]["peak_bytes"]) == (
        cells["rtx-a6000"]["batch_size"], cells["rtx-a6000"]["squeezed_batch_size"], cells["rtx-a6000"]["peak_bytes"],
    )  # fmt: skip


@pytest.mark.slow
def test_a_config_the_script_does_not_have_is_one_line(run_cli, isolated_cache):
    proc = run_cli("plan", "--script", "--no-default-cards", "--card", "c=64MiB", "--", sys.executable, TRAIN, "nosuch")
    assert proc.returncode == 2 and "the script has no 'nosuch': its --help lists debug" in error_line(proc), (
        proc.stderr
    )


@pytest.mark.slow
def test_a_plan_cut_by_ctrl_c_keeps_its_finished_cells(tmp_path, isolated_cache):
    """Ctrl-C after the first cell: exit 130, no process of the probe left, and the next plan
    takes that cell from the cache."""
    marker = f"JAXFIT_TEST_MARKER={tmp_path.name}"
    env = dict(os.environ, JAXFIT_TEST_MARKER=tmp_path.name)
    cards = ["--card", "a=16MiB", "--card", "b=32MiB", "--card", "c=48MiB"]
    command = [sys.executable, "-m", "jaxfit.cli", "plan", "--script", "--no-default-cards", *cards]
    command += ["--max-batch", "32", "--json", str(tmp_path / "p.json"), "--", sys.executable, SHAPED]
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("[1/3]"):
                break
        else:
            pytest.fail(f"no first cell: {proc.communicate(timeout=30)}")
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
        assert proc.returncode == 130, rest
        assert "Traceback" not in rest and not (tmp_path / "p.json").exists()
        deadline = time.monotonic() + 3
        while (live := processes_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not live, "a probe outlived jaxfit"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    again = subprocess.run(
        [*command[:6], "--card", "a=16MiB", "--max-batch", "32", "--json", str(tmp_path / "p.json"), "--",
         sys.executable, SHAPED],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "p.json").read_text())["cells"][0]["cached"] is True


def test_the_requirements_page_says_what_to_change_from_the_plans_own_numbers():
    from jaxfit.plan.markdown import advice, requirements_page
    from jaxfit.plan.whatif import Cell, PlanResult

    gib = 2**30
    state = {"parameters": 12 * gib, "optimizer state": 24 * gib, "other state": 12 * gib}
    fits = Cell("80GB", 80 * gib, 1, 1, "gpu", batch_size=51, peak_bytes=71 * gib, budget_bytes=72 * gib,
                outcome="boundary", breakdown={**state, "activations and workspace": 20 * gib})  # fmt: skip
    small = Cell("48GB", 48 * gib, 1, 1, "does not fit", note="not even batch 1 fits the budget")
    sharded = Cell("48GB", 48 * gib, 2, 2, "gpu", batch_size=20, peak_bytes=40 * gib, budget_bytes=43 * gib)
    result = PlanResult("pi0", 0.9, "NVIDIA H100 80GB HBM3", [fits, small, sharded], 1.0, {"name": "train_step"})
    said = advice(result, small)
    assert said[0] == "on 2 devices, FSDP 2 it fits: batch 20 (40.00 GiB per device)"
    assert "the state alone is 48.00 GiB per device, over the 43.20 GiB" in said[1]
    assert "FSDP over at least 2 devices" in said[1] and said[-1] == "why: not even batch 1 fits the budget"
    page = requirements_page(result, what="train.py pi0", command=["jaxfit", "plan"], when=0)
    assert "| 48GB (48.00 GiB) | does not fit | **20** (40.00 GiB) |" in page
    assert "1970-01-01 00:00 UTC" in page and "train step `train_step`" in page
    assert "**Nominal sizes** (48GB, 80GB): a real card gives JAX less than its name says" in page
    measured = PlanResult("pi0", 0.9, "NVIDIA H100 80GB HBM3", [dataclasses.replace(fits, card="H100")], 1.0, {})
    assert "Nominal sizes" not in requirements_page(measured, what="train.py pi0", command=["jaxfit"], when=0)
