"""``jaxfit plan``: what-if cells of cards x meshes, each a real fit on host devices."""

from __future__ import annotations

import json

import pytest
from helpers import error_line

from jaxfit.errors import ConfigError
from jaxfit.fit.mesh import MeshSpec, meshes_for
from jaxfit.fit.sources import example_source
from jaxfit.plan.whatif import DEFAULT_CARDS, Card, parse_card, what_if


def test_cards_and_meshes():
    assert parse_card("L4=24GB").total_bytes == 24 * 10**9
    assert parse_card(" 4090 = 24564MiB ").name == "4090"
    assert parse_card("h100") == Card("H100", 81_080 * 2**20)  # CUDA's total on an H100 80GB HBM3, measured
    assert [c.name for c in DEFAULT_CARDS] == ["24GB", "32GB", "48GB", "80GB", "96GB", "141GB"]
    assert meshes_for([1, 2, 4], None) == [
        MeshSpec(1, 1),
        MeshSpec(2, 1),
        MeshSpec(2, 2),
        MeshSpec(4, 1),
        MeshSpec(4, 4),
    ]
    assert meshes_for([4], [1, 2, 3]) == [MeshSpec(4, 1), MeshSpec(4, 2)]
    for bad, message in (("L4", "must look like NAME=SIZE"), ("L4=lots", "--card 'L4=lots'")):
        with pytest.raises(ConfigError, match=message):
            parse_card(bad)
    with pytest.raises(ConfigError, match="no --fsdp size of \\[3\\] divides 4 devices"):
        meshes_for([4], [3])


def test_an_fsdp_size_below_one_is_refused_not_divided_by():
    for sizes in ([0], [2, 0], [-1]):
        with pytest.raises(ConfigError, match=f"--fsdp {min(sizes)} must be at least 1"):
            meshes_for([2, 4], sizes)


def test_counts_and_sizes_that_leave_no_mesh_are_refused():
    with pytest.raises(ConfigError, match="--devices names no device count"):
        meshes_for([], None)
    with pytest.raises(ConfigError, match="--fsdp names no size"):
        meshes_for([1, 2], [])
    with pytest.raises(
        ConfigError, match=r"no --fsdp size of \[3\] divides 2 devices; add 1 or a divisor of 2 \(1, 2\)"
    ):
        meshes_for([2], [3])
    with pytest.raises(ConfigError, match="no mesh to plan"):
        what_if(lambda mesh: example_source("mlp-tiny", mesh=mesh), list(DEFAULT_CARDS), [])


@pytest.mark.slow
def test_plan_table_cells_are_real_fits(run_cli, tmp_path):
    out = tmp_path / "plan.json"
    proc = run_cli(
        "plan", "--example", "mlp", "--set", "hidden_dim=1024", "--no-default-cards", "--card", "small=256MiB",
        "--card", "big=1GiB", "--devices", "1", "4", "--fsdp", "1", "4", "--max-batch", "512", "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cells = {(c["card"], c["devices"], c["fsdp"]): c for c in json.loads(out.read_text())["cells"]}
    assert len(cells) == 6  # 1 device x fsdp 1, 4 x 1, 4 x 4 on two cards
    small_one, big_one = cells[("small", 1, 1)], cells[("big", 1, 1)]
    assert small_one["status"] == "cpu" and small_one["peak_bytes"] <= small_one["budget_bytes"]
    assert small_one["budget_bytes"] == int(0.45 * 256 * 2**20)
    assert big_one["batch_size"] >= small_one["batch_size"]
    fsdp = cells[("small", 4, 4)]
    assert fsdp["batch_size"] % 4 == 0 and fsdp["parameter_bytes"] < small_one["parameter_bytes"] / 2
    assert fsdp["batch_size"] > small_one["batch_size"]  # the state no longer crowds out the batch
    assert "small" in proc.stdout and "fsdp" in proc.stdout


@pytest.mark.slow
def test_a_card_larger_than_this_gpu_is_not_available(run_cli, tmp_path, monkeypatch, isolated_cache):
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(2**30))  # behave as a 1 GiB GPU
    out = tmp_path / "plan.json"
    proc = run_cli(
        "plan", "--example", "mlp-tiny", "--no-default-cards", "--card", "tiny=64MiB", "--card", "huge=8GiB",
        "--devices", "1", "--max-batch", "64", "--mem-fraction", "0.5", "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cells = {c["card"]: c for c in json.loads(out.read_text())["cells"]}
    assert cells["tiny"]["status"] == "gpu" and cells["tiny"]["batch_size"] == 64
    assert cells["huge"]["status"] == "not available" and "needs more than this GPU" in cells["huge"]["note"]
    # A cell plans a card, it is not run here: no program is pinned, and the answer is cached as it is.
    assert not (isolated_cache / "pins").exists() and cells["tiny"]["cached"] is False
    again = run_cli(
        "plan", "--example", "mlp-tiny", "--no-default-cards", "--card", "tiny=64MiB",
        "--devices", "1", "--max-batch", "64", "--mem-fraction", "0.5", "--json", str(out),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads(out.read_text())["cells"][0]["cached"] is True


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,message",
    [
        (["--card", "L4"], "--card 'L4' must look like NAME=SIZE"),
        (["--no-default-cards"], "no cards to plan for"),
        (["--devices", "4", "--fsdp", "3"], "no --fsdp size of [3] divides 4 devices"),
        (["--fsdp", "0"], "--fsdp 0 must be at least 1"),
        (["--devices", "2", "--fsdp", "3"], "no --fsdp size of [3] divides 2 devices; add 1 or a divisor of 2 (1, 2)"),
        (["--devices"], "--devices names no device count; give at least one, e.g. --devices 1 2 4"),
        (["--fsdp"], "--fsdp names no size"),
        (["--device-memory", "8GiB"], "--device-memory is set per card by plan"),
        (["--example", "nosuch"], "nosuch"),
    ],
)
def test_bad_plans_are_one_line(run_cli, args, message):
    assert message in error_line(run_cli("plan", *args))
